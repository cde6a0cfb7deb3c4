//! Tessel's CUDA backend: kernels rendered in CUDA C++ ([`tessel_ir::codegen::CUDA`]),
//! compiled by NVRTC to CUBIN for the device's exact architecture, and run through the CUDA
//! driver API on every NVIDIA GPU the system has; float matrix products can also run on
//! cuBLAS ([`Backend::vendor`]).
//!
//! ```no_run
//! use tessel_cuda::CudaBackend;
//! use tessel_ir::{Backend, samples};
//! use tessel_shape::{Bindings, DType};
//!
//! let cuda = CudaBackend::new();
//! if cuda.devices().is_empty() {
//!     return Ok(()); // no driver or no GPU here
//! }
//! let kernel = samples::vector_add(DType::F32, 1024, 64)?;
//! let program = cuda.compile(0, &kernel)?;
//! let [a, b, out] = [0; 3].map(|_| cuda.alloc(0, 4096).unwrap());
//! cuda.write(a, 0, &[0; 4096])?;
//! cuda.write(b, 0, &[0; 4096])?;
//! cuda.launch(program, &[a, b, out], &Bindings::new())?;
//! let mut result = vec![0u8; 4096];
//! cuda.read(out, 0, &mut result)?; // waits for the launch
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Installing and choosing devices
//!
//! Nothing links against CUDA at build time: cudarc's `dynamic-loading` opens the driver
//! (`libcuda.so.1`) and NVRTC on first use, so this crate builds anywhere. Without a driver,
//! with a driver older than CUDA 13.0, or without a GPU the backend has **zero devices**,
//! logged at debug level; it never panics. A driver without NVRTC still lists its devices,
//! and [`Backend::compile`] then fails with [`BackendError::Unsupported`] naming every place
//! searched.
//!
//! NVRTC is found on the loader path (`LD_LIBRARY_PATH`, `ldconfig`), else in
//! `$CUDA_PATH/lib64` (and `$CUDA_HOME`, `$CUDA_ROOT`), `/usr/local/cuda/lib64`, the
//! system library folders, and the Python wheels' `site-packages/nvidia/cu13/lib` and
//! `site-packages/nvidia/cuda_nvrtc/lib` (of `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `~/.local`
//! and the system's Pythons), where there is only a versioned `libnvrtc.so.13`. It is
//! opened by absolute path, after its `libnvrtc-builtins`, and kept open.
//!
//! cuBLAS is optional. cudarc opens it by bare name through the loader path only
//! (`LD_LIBRARY_PATH`, `ldconfig`; no folders are searched): `libcublas.so.13` is the one
//! meant, but cudarc tries the unversioned `libcublas.so` first, then older sonames
//! (`libcublas.so.12`, `.11`, ...). `libcublas` finds its `libcublasLt` the same way.
//! Without cuBLAS, or with one that lacks an entry point used, [`Backend::vendor`] answers
//! `Ok(None)` (logged once, at info level) and generated kernels run every product.
//!
//! | Variable | Effect |
//! |---|---|
//! | `TESSEL_CUDA_DEVICE` | uses only the device of this ordinal (`0`, `1`, ...) |
//! | `TESSEL_NVRTC_PATH` | the NVRTC library, or the folder holding it, to use instead of searching |
//! | `TESSEL_CUDA_GRAPHS` | `off` launches every kernel on its own (default `on`: repeated plans replay as CUDA graphs) |
//! | `TESSEL_CACHE_DIR` | the cache root: compiled kernels go to its `cuda/` folder (default `$XDG_CACHE_HOME/tessel/cuda`, else `~/.cache/tessel/cuda`) |
//! | `CUDA_PATH`, `CUDA_HOME` | CUDA toolkit roots searched for NVRTC |
//!
//! # How it runs
//!
//! - **Per device**: its primary context and one non-blocking stream. Every command goes to
//!   that stream, so commands on one device run in submission order.
//! - **Memory**: a caching allocator: blocks are rounded to size classes and freed blocks are
//!   kept per device for reuse (safe without waiting, since the one stream orders every
//!   use). When the driver runs out of memory the cache is returned to it and the
//!   allocation retried once; then [`BackendError::OutOfMemory`]. [`Backend::write`] copies
//!   the data into pinned staging memory and returns while the device copies it;
//!   [`Backend::read`] waits for earlier work and the copy; [`Backend::copy`] is queued.
//! - **Programs**: rendered with [`CUDA`], compiled by NVRTC with
//!   `--gpu-architecture=sm_XY --fmad=false --ftz=false --prec-div=true --prec-sqrt=true
//!   --std=c++17` to CUBIN (no PTX, so a newer NVRTC than the driver is fine), and cached in
//!   memory and on disk, keyed by the source, the options, NVRTC's and the driver's versions
//!   and this crate's version. A failed compile is [`BackendError::Compile`] with NVRTC's
//!   log.
//! - **Launches** check every buffer against the kernel's parameters
//!   ([`tessel_ir::LaunchArgs`]) and the grid against the device's limits, then queue the
//!   kernel with `groups` blocks of `local` threads, the buffers' device pointers and then
//!   the dims by value as arguments, and return; [`Backend::synchronize`] waits.
//!   [`Backend::time`] brackets its launch with CUDA events on the stream.
//! - **CUDA graphs** (on by default, [`CudaConfig::graphs`]): [`Backend::launch_sequence`] (a
//!   cached plan's launches) launches
//!   plainly on a call with buffers and dims it has not seen lately; the next call with the
//!   same ones records the launches from the stream (cuBLAS calls and fills included) into
//!   a graph, and later calls with them replay it with one `cuGraphLaunch`. A recording is keyed by every
//!   buffer's device pointer and size and the dims' values, so a replay runs exactly what
//!   plain launches would; up to four recordings are kept per sequence. A capture the
//!   driver refuses, or buffers that change on every call, leave the sequence on plain
//!   launches. The stream is shared by every thread, so work is queued under a gate that a
//!   capture holds exclusively. [`CudaStats::graph_launches`] counts replays.
//! - **Vendor matmul**: [`Backend::vendor`] gives float [`Matmul`](tessel_ir::Matmul)s a program that calls
//!   cuBLAS (`cublas{S,D}gemm`, `cublas{S,D}gemmStridedBatched` when `batch > 1`; for
//!   `f16`/`bf16`, `cublasGemmEx`/`cublasGemmStridedBatchedEx` with `CUBLAS_COMPUTE_32F`,
//!   which runs on tensor cores; a batch stride of 0 broadcasts). The row-major product is run as the
//!   column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`, so no operand is copied or transposed first. Each
//!   device gets one cuBLAS handle with a 32 MiB workspace, made by its first vendor
//!   program and bound to its stream, so cuBLAS calls are ordered with kernels and copies,
//!   and [`Backend::time`] brackets them with the same events. Sizes are evaluated at each
//!   launch; buffers are checked against [`tessel_ir::MatmulSizes::min_elements`] (and the
//!   output may not be an operand) before cuBLAS is called; sizes past cuBLAS's 32-bit
//!   `int` are [`BackendError::Unsupported`]. `k == 0` zeroes the output; an empty output
//!   runs nothing. Integer dtypes get no program. A matmul with an
//!   [`Epilogue`](tessel_ir::Epilogue) (bias, `relu`, GELU's tanh form) runs on cuBLASLt
//!   instead (its own handle and workspace per device); f64 epilogues, the erf GELU and
//!   `k == 0` with one get no cuBLAS program. Half-precision outputs with rows not a
//!   multiple of 8 elements run split into parts writing rows padded to 16 bytes, then
//!   copied into place (`matmul::padded`).
//! - **Generated tensor-core matmul** (`mma.cu`, configured by `mma.rs`): products with
//!   constant sizes, operand rows of a multiple of 16 bytes and even output rows, on
//!   compute capability 8.0 and up, as CUDA C of our own: `f16`/`bf16` on
//!   `mma.sync.m16n8k16` with `f32` accumulation and `ldmatrix` fragments; `f32` as 3xTF32
//!   (each operand split into two TF32 parts, three `mma.sync.m16n8k8` per product); a 3–4
//!   stage `cp.async` pipeline, fragments double-buffered, the epilogue (bias, activation,
//!   rounding) on the accumulators and the output stored in 16-byte row chunks through
//!   shared memory. One program per tile shape (half: 128×256, 128×128, 64×64; f32:
//!   128×128, 128×64, 64×64), each measured. Offered where cuBLAS does not run the
//!   product, next to it for full-precision `f32` products (cuBLAS runs those on the CUDA
//!   cores), and next to it for every product with [`GeneratedMatmul::Always`].
//!
//! # Numerics
//!
//! Bit-identical to the reference interpreter for every op except CUDA's built-in
//! transcendentals (`exp`, `exp2`, `log`, `log2`, `sin`, `cos`, `tan`, `tanh`, `pow`, and
//! `erf` through `exp`), which are within the CUDA Programming Guide's ulp bounds. `f16` and
//! `bf16` compute in `float` and round after every op, as the reference does.
//!
//! cuBLAS matmuls sum in their dtype (`f32` for `f16`/`bf16`, rounded once at the end, as
//! the generated kernels accumulate), in an order of cuBLAS's choosing, so they differ from
//! the generated kernel by rounding only. The handle keeps cuBLAS's default math mode
//! (`CUBLAS_DEFAULT_MATH`): `f32` products use full `f32` arithmetic, never TF32 tensor cores
//! (PyTorch's default for matmul too). The generated kernel's 3xTF32 `f32` products hold
//! each operand to within 2⁻²² of its size in two TF32 parts and leave out only the product
//! of the two small parts (at most 2⁻²² of each term), so each term is within about 2⁻²⁰
//! of its exact value (2⁻²⁴ in full `f32`; up to 2⁻¹⁰ with one TF32 product), summed in
//! `f32`: far inside the `f32` matmul tolerance.

mod attention;
mod attention_backward;
mod attention_decode;
mod device;
mod ffi;
mod graphs;
mod matmul;
mod memory;
mod mma;

/// The helpers of f32 products on TF32 tensor cores (3xTF32), prepended to the text of the
/// kernels that compute so (the f32 generated matmul, the 3xTF32 attention forward).
const TF32_HELPERS: &str = include_str!("tf32.cu");

/// The text a kernel's source starts with: the TF32 helpers where it computes on TF32
/// tensor cores, nothing otherwise.
fn tf32_helpers(on_tf32: bool) -> &'static str {
    if on_tf32 { TF32_HELPERS } else { "" }
}

mod nvrtc;
mod routine;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::result::DriverError;
use rustc_hash::FxHashMap;
use tessel_ir::codegen::{self, CUDA, CodegenError};
use tessel_ir::handles::{self, check_range, lock};
use tessel_ir::{
    AttentionPart, Backend, BackendError, BufferId, DeviceInfo, Handles, Kernel, LaunchArgs, Param,
    ProgramId, ProgramOrigin, VendorOp, VendorProgram,
};
use tessel_shape::Bindings;

use crate::device::CudaDevice;
use crate::ffi::{ArgSlot, Event, Module};
use crate::routine::MatmulProgram;

pub use crate::graphs::CudaGraphs;

/// How a [`CudaBackend`] is set up.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CudaConfig {
    /// Only the device of this ordinal; `None` for all.
    pub device: Option<usize>,
    /// Where compiled kernels are cached on disk; `None` keeps them in memory only.
    pub cache_dir: Option<PathBuf>,
    /// The NVRTC library (or its folder) to load instead of searching. NVRTC is loaded once
    /// per process: only the first backend to compile decides.
    pub nvrtc_path: Option<PathBuf>,
    /// Which products get the generated tensor-core matmul as well.
    pub generated_matmul: GeneratedMatmul,
    /// Whether repeated launch sequences run as CUDA graphs (default: on).
    pub graphs: CudaGraphs,
}

/// Which products the generated tensor-core matmul (`mma.cu`) is offered for, as programs
/// the planner measures (`$TESSEL_CUDA_GENERATED_MATMUL`: `fallback`, `always`, `never`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GeneratedMatmul {
    /// Those cuBLAS does not run here (no cuBLAS installed, or an epilogue cuBLASLt has no
    /// routine for), and full-precision `f32` products (TF32 not allowed), where cuBLAS
    /// runs on the CUDA cores and the 3xTF32 kernel on tensor cores: on the H100 its best
    /// tile took 0.65–0.84 of cuBLAS's time on GPT-2's products and at 4096³. For
    /// `f16`/`bf16`, measured on the H200, cuBLAS is 1.4–3× faster on every product tried,
    /// so compiling the kernel next to it would only cost first-call time.
    #[default]
    Fallback,
    /// Every product it can run, next to cuBLAS: each tile is measured against it.
    Always,
    /// None.
    Never,
}

impl CudaConfig {
    /// The configuration from the environment: `$TESSEL_CUDA_DEVICE`, `$TESSEL_NVRTC_PATH`,
    /// `$TESSEL_CUDA_GENERATED_MATMUL`, `$TESSEL_CUDA_GRAPHS`, and the disk cache in
    /// `$TESSEL_CACHE_DIR/cuda` (else `$XDG_CACHE_HOME/tessel/cuda`, else
    /// `$HOME/.cache/tessel/cuda`, else the temporary directory's `tessel/cuda`).
    pub fn from_env() -> CudaConfig {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let root = tessel_ir::cache::default_root();
        let device = std::env::var("TESSEL_CUDA_DEVICE").ok().and_then(|v| {
            let v = v.trim();
            if v.is_empty() {
                return None;
            }
            let parsed = v.parse().ok();
            if parsed.is_none() {
                tracing::warn!(
                    "tessel-cuda: TESSEL_CUDA_DEVICE={v} is not an ordinal; using every device"
                );
            }
            parsed
        });
        let generated_matmul = match std::env::var("TESSEL_CUDA_GENERATED_MATMUL") {
            Ok(v) if v.trim() == "always" => GeneratedMatmul::Always,
            Ok(v) if v.trim() == "never" => GeneratedMatmul::Never,
            Ok(v) if !matches!(v.trim(), "" | "fallback") => {
                tracing::warn!(
                    "tessel-cuda: TESSEL_CUDA_GENERATED_MATMUL={v} is not fallback, always or \
                     never; using fallback"
                );
                GeneratedMatmul::Fallback
            }
            _ => GeneratedMatmul::Fallback,
        };
        let graphs = match std::env::var("TESSEL_CUDA_GRAPHS") {
            Ok(v) if matches!(v.trim(), "off" | "0") => CudaGraphs::Off,
            Ok(v) if !matches!(v.trim(), "" | "on" | "1") => {
                tracing::warn!("tessel-cuda: TESSEL_CUDA_GRAPHS={v} is not on or off; using on");
                CudaGraphs::On
            }
            _ => CudaGraphs::On,
        };
        CudaConfig {
            device,
            cache_dir: Some(root.join("cuda")),
            nvrtc_path: var("TESSEL_NVRTC_PATH"),
            generated_matmul,
            graphs,
        }
    }
}

/// Counters of what a [`CudaBackend`] did, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaStats {
    /// Kernels compiled by NVRTC.
    pub compiles: u64,
    /// Kernels loaded from the disk cache.
    pub disk_hits: u64,
    /// Kernels whose module was already loaded.
    pub memory_hits: u64,
    /// Kernel launches queued.
    pub launches: u64,
    /// Vendor-program launches that queued work (a cuBLAS call, or zeroing the output of a
    /// matmul with `k == 0`).
    pub vendor_launches: u64,
    /// Allocations answered from the memory cache.
    pub pool_reuses: u64,
    /// Allocations that went to the driver.
    pub driver_allocs: u64,
    /// Launch sequences recorded as CUDA graphs.
    pub graph_recordings: u64,
    /// CUDA graph launches (each runs a whole recorded sequence; its kernels are not
    /// counted in `launches`).
    pub graph_launches: u64,
}

#[derive(Default)]
struct Counters {
    compiles: AtomicU64,
    disk_hits: AtomicU64,
    memory_hits: AtomicU64,
    launches: AtomicU64,
    vendor_launches: AtomicU64,
    graph_recordings: AtomicU64,
    graph_launches: AtomicU64,
}

/// A live buffer; its block returns to its device's pool when the last reference drops.
struct DeviceBuffer {
    device: Arc<CudaDevice>,
    /// The size asked for.
    bytes: usize,
    ptr: u64,
    class: usize,
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        lock(&self.device.pool).release(self.ptr, self.class);
    }
}

/// What a [`ProgramId`] runs.
enum Program {
    Kernel(KernelProgram),
    Matmul(MatmulProgram),
    Attention(attention::AttentionProgram),
    AttentionBackward(attention_backward::AttentionBackwardProgram),
}

impl Program {
    /// The device the program runs on.
    fn device(&self) -> &Arc<CudaDevice> {
        match self {
            Program::Kernel(kernel) => &kernel.device,
            Program::Matmul(matmul) => matmul.device(),
            Program::Attention(attention) => attention.device(),
            Program::AttentionBackward(backward) => backward.device(),
        }
    }
}

/// A compiled kernel.
struct KernelProgram {
    kernel: Kernel,
    device: Arc<CudaDevice>,
    module: Arc<Module>,
    origin: ProgramOrigin,
    /// The most threads per block this kernel runs with.
    max_threads: u32,
}

/// Two timing events queued around a program's work, and their device.
type Timing = (Event, Event, Arc<CudaDevice>);

/// The CUDA backend. See the [crate docs](crate).
pub struct CudaBackend {
    config: CudaConfig,
    infos: Vec<DeviceInfo>,
    driver_version: i32,
    // Fields drop in order: programs, modules and buffers before the devices.
    programs: Handles<ProgramId, Program>,
    modules: Mutex<FxHashMap<(usize, u128), Arc<Module>>>,
    buffers: Handles<BufferId, DeviceBuffer>,
    graphs: graphs::Graphs,
    counters: Counters,
    devices: Vec<Arc<CudaDevice>>,
}

impl Default for CudaBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CudaBackend {
    /// A backend configured from the environment ([`CudaConfig::from_env`]).
    pub fn new() -> Self {
        Self::with_config(CudaConfig::from_env())
    }

    /// A backend with an explicit configuration (tests use this: environment variables are
    /// process-wide, so tests that set them race).
    pub fn with_config(config: CudaConfig) -> Self {
        let found = device::discover(config.device);
        let devices: Vec<Arc<CudaDevice>> = found.devices.into_iter().map(Arc::new).collect();
        CudaBackend {
            infos: devices.iter().map(|d| d.info.clone()).collect(),
            driver_version: found.driver_version,
            config,
            programs: Handles::new("cuda"),
            modules: Mutex::default(),
            buffers: Handles::new("cuda"),
            graphs: graphs::Graphs::default(),
            counters: Counters::default(),
            devices,
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &CudaConfig {
        &self.config
    }

    /// What the backend has done so far.
    pub fn stats(&self) -> CudaStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (mut pool_reuses, mut driver_allocs) = (0, 0);
        for dev in &self.devices {
            let pool = lock(&dev.pool);
            pool_reuses += pool.reuses;
            driver_allocs += pool.driver_allocs;
        }
        CudaStats {
            compiles: get(&self.counters.compiles),
            disk_hits: get(&self.counters.disk_hits),
            memory_hits: get(&self.counters.memory_hits),
            launches: get(&self.counters.launches),
            vendor_launches: get(&self.counters.vendor_launches),
            pool_reuses,
            driver_allocs,
            graph_recordings: get(&self.counters.graph_recordings),
            graph_launches: get(&self.counters.graph_launches),
        }
    }

    /// Device `device`'s compute capability, `(major, minor)`.
    pub fn compute_capability(&self, device: usize) -> Option<(i32, i32)> {
        self.devices.get(device).map(|d| d.capability)
    }

    /// The CUDA version the driver supports (`1000 * major + 10 * minor`), 0 without one.
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// NVRTC's version, loading it if needed; `Err` says where it was looked for.
    pub fn nvrtc_version(&self) -> Result<(i32, i32), BackendError> {
        self.nvrtc().map(|n| n.version)
    }

    /// The CUDA C++ source [`Backend::compile`] would build for `kernel`.
    pub fn source(&self, kernel: &Kernel) -> Result<String, BackendError> {
        render(kernel)
    }

    /// The ordinal the driver gives device `device` (they differ when `TESSEL_CUDA_DEVICE`
    /// selects one).
    pub fn ordinal(&self, device: usize) -> Option<usize> {
        self.devices.get(device).map(|d| d.ordinal)
    }

    /// Where NVRTC was loaded from (`None`: by name, through the loader path), loading it if
    /// needed; `Err` says where it was looked for.
    pub fn nvrtc_path(&self) -> Result<Option<PathBuf>, BackendError> {
        self.nvrtc().map(|n| n.path.clone())
    }

    /// Compiles CUDA C++ `source` for `device` with NVRTC and the same options as
    /// [`Backend::compile`], without loading it: for checking hand-written or modified
    /// kernels. A failure is [`BackendError::Compile`] with NVRTC's log, attributed to
    /// `name`.
    pub fn build_source(
        &self,
        device: usize,
        name: &str,
        source: &str,
    ) -> Result<(), BackendError> {
        let dev = self.device(device)?;
        self.nvrtc()?;
        let options = nvrtc::options(dev.capability);
        let compiled = ffi::nvrtc_compile(source, name, &options);
        compiled
            .cubin
            .map(drop)
            .map_err(|why| BackendError::Compile {
                kernel: name.to_owned(),
                code: source.to_owned(),
                log: format!("{why} (options: {})\n{}", options.join(" "), compiled.log),
            })
    }

    /// Bytes of freed device memory kept for reuse on `device`.
    pub fn cached_bytes(&self, device: usize) -> usize {
        self.devices
            .get(device)
            .map_or(0, |d| lock(&d.pool).cached_bytes)
    }

    /// Returns the freed memory kept for reuse on every device to the driver.
    pub fn trim(&self) -> Result<(), BackendError> {
        for dev in &self.devices {
            let _gate = dev.submit();
            lock(&dev.pool)
                .trim(&dev.ctx, &dev.stream)
                .map_err(|e| dev.lost("cuMemFree", e))?;
        }
        Ok(())
    }

    fn nvrtc(&self) -> Result<&'static nvrtc::Nvrtc, BackendError> {
        nvrtc::nvrtc(self.config.nvrtc_path.as_deref()).map_err(|what| BackendError::Unsupported {
            backend: "cuda",
            what,
        })
    }

    fn device(&self, device: usize) -> Result<&Arc<CudaDevice>, BackendError> {
        handles::device("cuda", &self.devices, device)
    }

    /// The loaded module for `source` on `dev`: from memory, the disk cache, or NVRTC.
    fn module(
        &self,
        dev: &CudaDevice,
        name: &str,
        entry: &str,
        source: &str,
    ) -> Result<(Arc<Module>, ProgramOrigin), BackendError> {
        let nvrtc = self.nvrtc()?;
        let options = nvrtc::options(dev.capability);
        let key = nvrtc::cache_key(source, &options, nvrtc.version, self.driver_version);
        if let Some(module) = lock(&self.modules).get(&(dev.index, key)) {
            self.counters.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((Arc::clone(module), ProgramOrigin::Cached));
        }
        let dir = self.config.cache_dir.as_deref();
        let cached = dir
            .and_then(|d| nvrtc::read_cached(d, key))
            .and_then(|cubin| match Module::load(&dev.ctx, &cubin, entry) {
                Ok(module) => Some(module),
                Err(e) => {
                    tracing::debug!(
                        "tessel-cuda: ignoring a cached kernel that fails to load: {e}"
                    );
                    None
                }
            });
        let (module, origin) = if let Some(module) = cached {
            self.counters.disk_hits.fetch_add(1, Ordering::Relaxed);
            (module, ProgramOrigin::Cached)
        } else {
            // No lock is held while NVRTC compiles, which may take a second.
            let started = std::time::Instant::now();
            let compiled = ffi::nvrtc_compile(source, name, &options);
            let fail = |why: String| BackendError::Compile {
                kernel: name.to_owned(),
                code: source.to_owned(),
                log: why,
            };
            let cubin = compiled.cubin.map_err(|why| {
                fail(format!(
                    "{why} (options: {})\n{}",
                    options.join(" "),
                    compiled.log
                ))
            })?;
            if !compiled.log.is_empty() {
                tracing::debug!(kernel = %name, "tessel-cuda: NVRTC log:\n{}", compiled.log);
            }
            tracing::debug!(kernel = %name, elapsed = ?started.elapsed(), "tessel-cuda: compiled");
            self.counters.compiles.fetch_add(1, Ordering::Relaxed);
            if let Some(dir) = dir {
                nvrtc::write_cached(dir, key, &cubin, source);
            }
            (
                Module::load(&dev.ctx, &cubin, entry).map_err(fail)?,
                ProgramOrigin::Compiled,
            )
        };
        let module = Arc::new(module);
        lock(&self.modules).insert((dev.index, key), Arc::clone(&module));
        Ok((module, origin))
    }

    /// Checks a launch and queues it; the timing events when `timed` and something was
    /// queued (an empty grid or an empty product runs nothing).
    fn enqueue(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
        timed: bool,
    ) -> Result<Option<Timing>, BackendError> {
        let program = self.programs.get(program)?;
        let _gate = program.device().submit();
        self.enqueue_unguarded(&program, buffers, dims, timed)
    }

    /// [`Self::enqueue`] without taking the submission gate: for the caller that holds it
    /// exclusively (a capture).
    fn enqueue_unguarded(
        &self,
        program: &Program,
        buffers: &[BufferId],
        dims: &Bindings,
        timed: bool,
    ) -> Result<Option<Timing>, BackendError> {
        match program {
            Program::Kernel(kernel) => self.enqueue_kernel(kernel, buffers, dims, timed),
            Program::Matmul(matmul) => self.enqueue_matmul(matmul, buffers, dims, timed),
            Program::Attention(attention) => {
                self.enqueue_attention(attention, buffers, dims, timed)
            }
            Program::AttentionBackward(backward) => {
                self.enqueue_attention_backward(backward, buffers, dims, timed)
            }
        }
    }

    fn enqueue_kernel(
        &self,
        program: &KernelProgram,
        buffers: &[BufferId],
        dims: &Bindings,
        timed: bool,
    ) -> Result<Option<Timing>, BackendError> {
        let kernel = &program.kernel;
        let dev = &program.device;
        let bound = self.buffers.get_all(buffers)?;
        handles::check_launch_devices(
            "cuda",
            &kernel.name,
            dev.index,
            buffers,
            bound.iter().map(|b| b.device.index),
        )?;
        let sizes: Vec<usize> = bound.iter().map(|b| b.bytes).collect();
        let args = LaunchArgs::evaluate(kernel, buffers, &sizes, dims)?;
        let dims3 = launch_dims(program, &args)?;
        if dims3.is_none() && args.zeroed.is_empty() {
            return Ok(None);
        }
        // One slot per parameter: device pointers, then dims in their dtype's width.
        let (mut next_buffer, mut next_dim) = (bound.iter(), args.dims.iter());
        let mut slots: Vec<ArgSlot> = kernel
            .params
            .iter()
            .map(|p| {
                let mut slot = ArgSlot::default();
                match p {
                    Param::Buffer { .. } => {
                        let ptr = next_buffer.next().map_or(0, |b| b.ptr);
                        slot.0 = ptr.to_ne_bytes();
                    }
                    Param::Dim { dtype, .. } => {
                        let value = next_dim.next().copied().unwrap_or(0);
                        let bytes = scalar_bytes(value, dtype.size_bytes());
                        slot.0[..bytes.len()].copy_from_slice(&bytes);
                    }
                }
                slot
            })
            .collect();
        queue_timed(dev, &kernel.name, timed, || {
            // Accumulated buffers start at zero (`Access::Accumulate`), in stream order.
            for &(j, bytes) in &args.zeroed {
                ffi::fill(&dev.ctx, &dev.stream, bound[j].ptr, 0, bytes)
                    .map_err(|e| dev.lost("cuMemsetD8Async", e))?;
            }
            let Some((grid, block)) = dims3 else {
                return Ok(());
            };
            program
                .module
                .launch(&dev.ctx, &dev.stream, [grid, block], 0, &mut slots)
                .map_err(|e| BackendError::Launch {
                    kernel: kernel.name.clone(),
                    reason: format!("cuLaunchKernel failed: {e}"),
                })?;
            self.counters.launches.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }
}

/// Queues `work` on `dev`'s stream, between two timing events (returned) when `timed`.
/// Failures name the program `name`.
fn queue_timed(
    dev: &Arc<CudaDevice>,
    name: &str,
    timed: bool,
    work: impl FnOnce() -> Result<(), BackendError>,
) -> Result<Option<Timing>, BackendError> {
    if !timed {
        return work().map(|()| None);
    }
    let failed = |call: &str, e: DriverError| BackendError::Launch {
        kernel: name.to_owned(),
        reason: format!("{call} failed: {e}"),
    };
    let start = Event::new(&dev.ctx, true).map_err(|e| failed("cuEventCreate", e))?;
    let end = match Event::new(&dev.ctx, true) {
        Ok(end) => end,
        Err(e) => {
            start.destroy(&dev.ctx);
            return Err(failed("cuEventCreate", e));
        }
    };
    let queued = start
        .record(&dev.ctx, &dev.stream)
        .map_err(|e| failed("cuEventRecord", e))
        .and_then(|()| work())
        .and_then(|()| {
            end.record(&dev.ctx, &dev.stream)
                .map_err(|e| failed("cuEventRecord", e))
        });
    match queued {
        Ok(()) => Ok(Some((start, end, Arc::clone(dev)))),
        Err(e) => {
            start.destroy(&dev.ctx);
            end.destroy(&dev.ctx);
            Err(e)
        }
    }
}

/// A launch's grid (blocks per axis) and block (threads per axis).
type LaunchDims = ([u32; 3], [u32; 3]);

/// A launch's grid and block sizes, or `None` when it runs nothing.
fn launch_dims(
    program: &KernelProgram,
    args: &LaunchArgs,
) -> Result<Option<LaunchDims>, BackendError> {
    if args.groups == 0 || args.grid[3..].contains(&0) {
        return Ok(None);
    }
    let info = &program.device.info;
    let too_large = |reason: String| BackendError::Launch {
        kernel: program.kernel.name.clone(),
        reason,
    };
    let mut grid = [0u32; 3];
    let mut block = [0u32; 3];
    for axis in 0..3 {
        let (g, l) = (args.grid[axis], args.grid[3 + axis]);
        if g as u64 > info.max_groups[axis] {
            return Err(too_large(format!(
                "{g} workgroups along axis {axis} exceed the device's limit of {}",
                info.max_groups[axis]
            )));
        }
        if l > i64::from(info.max_local_size[axis]) {
            return Err(too_large(format!(
                "the local size {l} along axis {axis} exceeds the device's limit of {}",
                info.max_local_size[axis]
            )));
        }
        grid[axis] = g as u32;
        block[axis] = l as u32;
    }
    let threads: i64 = args.grid[3..].iter().product();
    if threads > i64::from(program.max_threads) {
        return Err(too_large(format!(
            "workgroups of {threads} invocations exceed this kernel's limit of {} on {}",
            program.max_threads, info.name
        )));
    }
    Ok(Some((grid, block)))
}

/// `kernel` in CUDA C++, with codegen errors as backend errors.
fn render(kernel: &Kernel) -> Result<String, BackendError> {
    codegen::render(kernel, &CUDA).map_err(|e| match e {
        CodegenError::Verify(e) => BackendError::Compile {
            kernel: kernel.name.clone(),
            code: kernel.to_string(),
            log: e.to_string(),
        },
        other => BackendError::Unsupported {
            backend: "cuda",
            what: other.to_string(),
        },
    })
}

/// The `size` low bytes of `value` in host order: a dim argument of a `size`-byte type.
fn scalar_bytes(value: i64, size: usize) -> Vec<u8> {
    match size {
        1 => (value as u8).to_ne_bytes().to_vec(),
        2 => (value as u16).to_ne_bytes().to_vec(),
        4 => (value as u32).to_ne_bytes().to_vec(),
        _ => (value as u64).to_ne_bytes().to_vec(),
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.infos
    }

    fn alloc(&self, device: usize, bytes: usize) -> Result<BufferId, BackendError> {
        let dev = self.device(device)?;
        let oom = || BackendError::OutOfMemory {
            device: dev.info.name.clone(),
            requested: bytes,
        };
        if bytes as u64 > dev.info.memory_bytes {
            return Err(oom());
        }
        let _gate = dev.submit();
        let (ptr, class) = lock(&dev.pool)
            .alloc(&dev.ctx, &dev.stream, bytes)
            .map_err(|e| {
                if ffi::is_out_of_memory(e) {
                    oom()
                } else {
                    dev.lost("cuMemAlloc", e)
                }
            })?;
        let buffer = DeviceBuffer {
            device: Arc::clone(dev),
            bytes,
            ptr,
            class,
        };
        Ok(self.buffers.insert(buffer))
    }

    fn free(&self, buffer: BufferId) -> Result<(), BackendError> {
        // The block returns to the pool when the last reference (a launch being queued on
        // another thread may hold one) drops.
        self.buffers.remove(buffer).map(drop)
    }

    fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        let b = self.buffers.get(buffer)?;
        check_range("write", buffer, offset, data.len(), b.bytes)?;
        if data.is_empty() {
            return Ok(());
        }
        let dev = &b.device;
        let _gate = dev.submit();
        lock(&dev.staging)
            .write(&dev.ctx, &dev.stream, b.ptr + offset as u64, data)
            .map_err(|e| dev.lost("cuMemcpyHtoDAsync", e))
    }

    fn fill(&self, buffer: BufferId, value: u8, bytes: usize) -> Result<(), BackendError> {
        let b = self.buffers.get(buffer)?;
        check_range("fill", buffer, 0, bytes, b.bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        let dev = &b.device;
        let _gate = dev.submit();
        ffi::fill(&dev.ctx, &dev.stream, b.ptr, value, bytes)
            .map_err(|e| dev.lost("cuMemsetD8Async", e))
    }

    fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        let b = self.buffers.get(buffer)?;
        check_range("read", buffer, offset, out.len(), b.bytes)?;
        let dev = &b.device;
        let _gate = dev.submit();
        if out.is_empty() {
            // Nothing to copy, but the caller may rely on the wait.
            return dev
                .stream
                .synchronize(&dev.ctx)
                .map_err(|e| dev.lost("cuStreamSynchronize", e));
        }
        ffi::copy_to_host(&dev.ctx, &dev.stream, b.ptr + offset as u64, out)
            .map_err(|e| dev.lost("cuMemcpyDtoHAsync", e))
    }

    fn copy(&self, src: BufferId, dst: BufferId, bytes: usize) -> Result<(), BackendError> {
        let (from, to) = (self.buffers.get(src)?, self.buffers.get(dst)?);
        check_range("copy source", src, 0, bytes, from.bytes)?;
        check_range("copy destination", dst, 0, bytes, to.bytes)?;
        if from.device.index != to.device.index {
            return Err(BackendError::InvalidArgument(format!(
                "copy from buffer {} on cuda device {} to buffer {} on device {}: copies stay \
                 on one device; read to the host and write instead",
                src.0, from.device.index, dst.0, to.device.index
            )));
        }
        if src == dst || bytes == 0 {
            return Ok(());
        }
        let dev = &from.device;
        let _gate = dev.submit();
        ffi::copy_on_device(&dev.ctx, &dev.stream, to.ptr, from.ptr, bytes)
            .map_err(|e| dev.lost("cuMemcpyDtoDAsync", e))
    }

    fn compile(&self, device: usize, kernel: &Kernel) -> Result<ProgramId, BackendError> {
        let dev = self.device(device)?;
        let kernel = &tessel_ir::backend::prepare(kernel)?;
        let source = render(kernel)?;
        let entry = codegen::entry_name(kernel);
        let (module, origin) = self.module(dev, &kernel.name, &entry, &source)?;
        let max_threads = module
            .max_threads_per_block()
            .map_or(dev.info.max_workgroup_size, |n| {
                u32::try_from(n).unwrap_or(0)
            });
        Ok(self.programs.insert(Program::Kernel(KernelProgram {
            kernel: kernel.clone(),
            device: Arc::clone(dev),
            module,
            origin,
            max_threads,
        })))
    }

    fn launch(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<(), BackendError> {
        self.enqueue(program, buffers, dims, false).map(drop)
    }

    fn launch_sequence(
        &self,
        sequence: tessel_ir::SequenceId,
        launches: &[tessel_ir::SequenceLaunch<'_>],
        dims: &Bindings,
    ) -> Result<(), BackendError> {
        self.run_sequence(sequence, launches, dims)
    }

    fn time(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<Duration, BackendError> {
        let Some((start, end, dev)) = self.enqueue(program, buffers, dims, true)? else {
            return Ok(Duration::ZERO);
        };
        let gate = dev.submit();
        let result = end
            .synchronize(&dev.ctx)
            .and_then(|()| start.elapsed_ms(&dev.ctx, &end));
        start.destroy(&dev.ctx);
        end.destroy(&dev.ctx);
        drop(gate);
        let ms = result.map_err(|e| dev.lost("cuEventElapsedTime", e))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1000.0))
    }

    fn synchronize(&self, device: usize) -> Result<(), BackendError> {
        let dev = self.device(device)?;
        let _gate = dev.submit();
        dev.stream
            .synchronize(&dev.ctx)
            .map_err(|e| dev.lost("cuStreamSynchronize", e))
    }

    fn release(&self, program: ProgramId) -> Result<(), BackendError> {
        self.programs.remove(program).map(drop)
    }

    fn origin(&self, program: ProgramId) -> Result<ProgramOrigin, BackendError> {
        Ok(match &*self.programs.get(program)? {
            Program::Kernel(kernel) => kernel.origin,
            Program::Matmul(matmul) => matmul.origin(),
            Program::Attention(attention) => attention.origin(),
            Program::AttentionBackward(backward) => backward.origin(),
        })
    }

    /// Float [`Matmul`](tessel_ir::Matmul)s (`f32`, `f64`, and `f16`/`bf16` through `GemmEx` with `f32`
    /// accumulation; `f32` on TF32 tensor cores where the matmul allows it) run on cuBLAS
    /// (variant `"cuBLAS"`); products the generated tensor-core kernel runs
    /// (`mma::supports`: `f16`/`bf16`, and `f32` as 3xTF32) get one more program per tile
    /// shape, compiled here in parallel, where [`CudaConfig::generated_matmul`] asks for
    /// them.
    /// Integers, or no cuBLAS and no generated kernel, are an empty list. The device's
    /// cuBLAS handle is made here, on first use.
    ///
    /// An [`Attention`](tessel_ir::Attention) gets the fused kernel (`attention.rs`) where
    /// its head dim and dtype allow, else nothing; each piece of its backward
    /// ([`AttentionBackward`](tessel_ir::AttentionBackward)) without a mask or dropout,
    /// head dims up to 64, gets the fused kernel of `attention_backward.rs` (f16/bf16: the
    /// log-sum-exps, `dq`, `dkᵀ`, `dv`; f32: the log-sum-exps, the three gradients
    /// together), else nothing (the portable kernels run it); the output with the
    /// log-sum-exps gets the forward's programs writing both.
    fn vendor(&self, device: usize, op: &VendorOp) -> Result<Vec<VendorProgram>, BackendError> {
        match op {
            VendorOp::Matmul(matmul) => self.matmul_programs(device, matmul),
            VendorOp::Attention(attention) => self.attention_programs(device, attention),
            VendorOp::AttentionBackward(piece)
                if piece.part == AttentionPart::OutputAndLogSumExp =>
            {
                self.output_and_lse_programs(device, piece)
            }
            VendorOp::AttentionBackward(piece) => self.attention_backward_programs(device, piece),
        }
    }

    /// The cuBLAS version, the same before and after the device's handle is made (stored
    /// plans are keyed by it).
    fn vendor_library(&self, device: usize) -> String {
        match (self.device(device), ffi::cublas::library_version()) {
            (Ok(_), Some(version)) => format!("cuBLAS {version}"),
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::scalar_bytes;

    #[test]
    fn scalars_keep_their_low_bytes() {
        assert_eq!(scalar_bytes(-1, 1), vec![0xff]);
        assert_eq!(scalar_bytes(0x1234, 2), 0x1234u16.to_ne_bytes().to_vec());
        assert_eq!(scalar_bytes(-2, 8), (-2i64).to_ne_bytes().to_vec());
    }
}
