//! Tessel's wgpu backend: kernels rendered as WGSL ([`tessel_ir::codegen::render_wgsl`]) and
//! run as compute shaders on every GPU wgpu reaches: through Vulkan (Linux, Windows,
//! Android), Metal (macOS, iOS) and DX12 (Windows).
//!
//! ```no_run
//! use tessel_ir::{Backend, samples};
//! use tessel_shape::{Bindings, DType};
//! use tessel_wgpu::WgpuBackend;
//!
//! let gpu = WgpuBackend::new();
//! if gpu.devices().is_empty() {
//!     return Ok(()); // no GPU driver here
//! }
//! let kernel = samples::vector_add(DType::F32, 1024, 64)?;
//! let program = gpu.compile(0, &kernel)?;
//! let [a, b, out] = [0; 3].map(|_| gpu.alloc(0, 4096).unwrap());
//! gpu.write(a, 0, &[0; 4096])?;
//! gpu.write(b, 0, &[0; 4096])?;
//! gpu.launch(program, &[a, b, out], &Bindings::new())?;
//! let mut result = vec![0u8; 4096];
//! gpu.read(out, 0, &mut result)?; // waits for the launch
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Installing and choosing devices
//!
//! wgpu loads the graphics API at run time (`libvulkan.so.1`, Metal, `d3d12.dll`), so this
//! crate builds anywhere. At run time it needs a driver: on Linux a Vulkan ICD, e.g. Mesa's
//! `mesa-vulkan-drivers`, whose lavapipe (`llvmpipe`) runs on the CPU. Without a driver the
//! backend has **zero devices**, logged at debug level; it never panics. GL/GLES is not
//! built in: its compute support is too uneven to be worth the dependency.
//!
//! | Variable | Effect |
//! |---|---|
//! | `TESSEL_WGPU_ADAPTER` | restricts the adapters: an index into the list below, or a case-insensitive substring of an adapter's name, API (`vulkan`, `metal`, `dx12`), driver, driver version or type (`cpu`, `discretegpu`) |
//! | `WGPU_BACKEND` | the APIs to look in, comma-separated (`vulkan`, `metal`, `dx12`); read by wgpu |
//! | `WGPU_VALIDATION`, `WGPU_DEBUG` | `1` turns on the API's validation layers and debug labels (off by default in every build profile); read by wgpu |
//! | `VK_ICD_FILENAMES` | the Vulkan drivers to load (read by the Vulkan loader) |
//!
//! Adapters are listed discrete GPUs first, then integrated, virtual, other and CPU ones,
//! each group in wgpu's order; adapters without compute shaders are skipped. A GPU that two
//! APIs expose (Vulkan and DX12 on Windows) is listed once, through the first API, unless
//! `TESSEL_WGPU_ADAPTER` names the other.
//!
//! # How it runs
//!
//! - **Per device**: one wgpu device and queue, requested with the adapter's own limits (not
//!   wgpu's conservative defaults) and the features it has among `SHADER_F64`,
//!   `SHADER_INT64`, `TIMESTAMP_QUERY`, `SHADER_F16` and `SUBGROUP`. Errors wgpu reports
//!   outside a call's own error scopes are logged and returned by the next call on the
//!   device; a lost device is [`BackendError::DeviceLost`] from then on.
//! - **Memory**: one storage buffer per tensor buffer, its size rounded up to a multiple of
//!   4 bytes (wgpu copies whole words, and shaders pack 8- and 16-bit elements into words);
//!   a launch binds exactly those bytes. Buffers come from a caching pool per device, as in
//!   `tessel-cuda`: a freed buffer goes to a free list by size class (the size rounded up
//!   to a sixteenth of its next power of two, so at most an eighth is wasted) and serves
//!   the next allocation of its class, since creating a buffer is slow for large sizes (the
//!   driver allocates and maps the memory, and wgpu clears a new buffer before its first
//!   use). At most [`WgpuConfig::pool_bytes`] (default [`POOL_BYTES`], 4 GiB) are kept per
//!   device; an allocation that runs out of memory drops the cached buffers, waits for the
//!   queue and tries once more; [`WgpuBackend::trim`] drops them on demand. Reuse is
//!   ordered after the queued work of the old owner (one in-order queue per device), and a
//!   reused buffer is not cleared: allocations have unspecified contents (new ones read as
//!   zeros). [`Backend::write`] is queued; [`Backend::read`] waits for earlier work and maps a
//!   staging buffer; [`Backend::copy`] is queued. A transfer whose ends are not 4-byte
//!   aligned reads the boundary words back and merges them on the host (a round trip).
//!   A buffer larger than the device's `max_buffer_size`, or memory the driver refuses, is
//!   [`BackendError::OutOfMemory`].
//! - **Programs**: each kernel is rendered as WGSL for the device (with `f64` and 64-bit
//!   integers only where it has them) and built into a compute pipeline with an explicit
//!   layout, cached by device and source (bounded, [`WgpuConfig::pipeline_cache`]). WGSL
//!   that wgpu rejects is [`BackendError::Compile`] with the source and naga's diagnostic; a
//!   kernel the device cannot express (an `f64` op without `SHADER_F64`, more buffers than
//!   `max_storage_buffers_per_shader_stage`, too large a workgroup) is
//!   [`BackendError::Unsupported`].
//!   A kernel with symbolic local sizes gets one pipeline per local size it is launched
//!   with, built at its first launch (WGSL's `@workgroup_size` is a constant).
//! - **Launches** check every buffer against the kernel's parameters
//!   ([`tessel_ir::LaunchArgs`]) and against `max_storage_buffer_binding_size`, bind the
//!   dims and grid as a small uniform buffer, encode one compute pass and submit it
//!   without waiting. A uniform buffer is never written after it is created, and each
//!   pipeline keeps the last 16 by contents, so launches repeating a grid and dims (a tensor
//!   program realized again) share one, even while queued, and create no buffer; [`Backend::synchronize`] waits. [`Backend::time`] waits for its launch
//!   and reports the pass's own device timestamps where the device has `TIMESTAMP_QUERY`,
//!   and otherwise the host's clock from submission to completion (earlier work is waited
//!   for first), which includes the submission's overhead.
//!
//! # Limits
//!
//! wgpu has no query for a device's memory or compute units: [`DeviceInfo::memory_bytes`]
//! is the largest buffer the device allows (`max_buffer_size`, which may exceed what is
//! free), and [`DeviceInfo::compute_units`] is 0 (unknown). [`DeviceInfo::features`] has
//! `f64` only where the device has both `SHADER_F64` and `SHADER_INT64` (the WGSL emitter
//! works on a double's bits as a 64-bit integer); [`WgpuBackend::details`] has the raw
//! features and the buffer limits. [`DeviceInfo::features`] also always has
//! `subnormals_may_flush`: WGSL lets a device flush `f32` subnormals in float arithmetic,
//! NVIDIA's Vulkan driver does, and wgpu cannot query a driver's float controls. The WGSL
//! emitter keeps what it cheaply can exact regardless (negation, `abs`, `max`/`min`,
//! conversions between float types, on the bits), and never lets a driver fuse a product
//! with a sum (see `tessel_ir::codegen`'s WGSL section).

//!
//! # Verified
//!
//! The crate's tests (`tests/wgpu.rs`: the shared `tessel-testkit` conformance checks and
//! this backend's own) ran on Mesa 22.3.6's lavapipe (`llvmpipe (LLVM 15.0.6, 256 bits)`,
//! Vulkan, a CPU device with `SHADER_F64`, `SHADER_INT64`, `SHADER_F16`, `SUBGROUP` and
//! `TIMESTAMP_QUERY`) on Debian 12, with `WGPU_BACKEND=vulkan`.

mod device;
mod launch;
mod memory;
mod programs;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustc_hash::FxHashMap;
use tessel_ir::codegen::{self, CodegenError, WgslShader};
use tessel_ir::handles::{self, check_range, lock};
use tessel_ir::{
    Backend, BackendError, BufferId, DeviceInfo, Handles, Kernel, LaunchArgs, ProgramId,
    ProgramOrigin,
};
use tessel_shape::{Bindings, Expr};

use crate::device::GpuDevice;
pub use crate::device::WgpuDeviceDetails;
use crate::launch::Submitted;
use crate::memory::{DeviceBuffer, Pool, SharedPool};
use crate::programs::{Pipeline, PipelineCache};

/// The default number of built pipelines kept for reuse ([`WgpuConfig::pipeline_cache`]).
/// Pipelines of live `ProgramId`s stay alive regardless.
pub const PIPELINE_CACHE: usize = 256;

/// The default cap on the bytes of freed buffers kept for reuse per device
/// ([`WgpuConfig::pool_bytes`]): 4 GiB.
pub const POOL_BYTES: u64 = 4 << 30;

/// How a [`WgpuBackend`] is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgpuConfig {
    /// Which adapters to use: `None` for all; else an index into the discovered list
    /// (discrete GPUs first), or a case-insensitive substring of an adapter's name, API,
    /// driver or type. See the [crate docs](crate).
    pub adapter: Option<String>,
    /// Built pipelines kept for reuse, over all devices.
    pub pipeline_cache: usize,
    /// The most bytes of freed buffers each device keeps for reuse (0 disables the pool:
    /// every allocation creates a buffer). See the [crate docs](crate).
    pub pool_bytes: u64,
}

impl Default for WgpuConfig {
    /// Every adapter, [`PIPELINE_CACHE`] pipelines; no Tessel environment variable is read
    /// (wgpu still reads its own, such as `WGPU_BACKEND`).
    fn default() -> Self {
        WgpuConfig {
            adapter: None,
            pipeline_cache: PIPELINE_CACHE,
            pool_bytes: POOL_BYTES,
        }
    }
}

impl WgpuConfig {
    /// The default configuration, with [`adapter`](Self::adapter) from
    /// `$TESSEL_WGPU_ADAPTER` when set and non-empty.
    pub fn from_env() -> WgpuConfig {
        WgpuConfig {
            adapter: std::env::var("TESSEL_WGPU_ADAPTER")
                .ok()
                .filter(|v| !v.trim().is_empty()),
            ..WgpuConfig::default()
        }
    }
}

/// Counters of what a [`WgpuBackend`] did, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WgpuStats {
    /// Pipelines built.
    pub builds: u64,
    /// Compiles answered from the pipeline cache.
    pub cache_hits: u64,
    /// Kernel launches submitted.
    pub launches: u64,
    /// Allocations answered with a freed buffer from the pool.
    pub pool_reuses: u64,
    /// Buffers created (allocations the pool could not answer).
    pub buffers_created: u64,
    /// Bytes of freed buffers kept for reuse now, over all devices.
    pub cached_bytes: u64,
}

#[derive(Default)]
struct Counters {
    builds: AtomicU64,
    cache_hits: AtomicU64,
    launches: AtomicU64,
}

/// A compiled kernel.
struct Program {
    /// The IR, against which launches are checked.
    kernel: Kernel,
    device: usize,
    pipelines: Pipelines,
    /// `Compiled` for symbolic local sizes, whose pipelines are built at their launches.
    origin: ProgramOrigin,
}

/// The pipelines of a program.
enum Pipelines {
    /// One, for a kernel whose local sizes are constants.
    Fixed(Arc<Pipeline>),
    /// One per local size launched with, built on first use, for a kernel whose local
    /// sizes are symbolic: WGSL's `@workgroup_size` must be a constant.
    PerLocal(Mutex<FxHashMap<[i64; 3], Arc<Pipeline>>>),
}

/// `kernel` with its local sizes fixed to `local`.
fn with_local(kernel: &Kernel, local: [i64; 3]) -> Kernel {
    let mut fixed = kernel.clone();
    fixed.grid.local = local.map(Expr::constant);
    fixed
}

/// The wgpu backend. See the [crate docs](crate).
pub struct WgpuBackend {
    config: WgpuConfig,
    devices: Vec<GpuDevice>,
    infos: Vec<DeviceInfo>,
    /// Freed buffers kept for reuse, one pool per device.
    pools: Vec<SharedPool>,
    buffers: Handles<BufferId, DeviceBuffer>,
    programs: Handles<ProgramId, Program>,
    cache: Mutex<PipelineCache>,
    counters: Counters,
}

impl Default for WgpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl WgpuBackend {
    /// A backend configured from the environment ([`WgpuConfig::from_env`]).
    pub fn new() -> Self {
        Self::with_config(WgpuConfig::from_env())
    }

    /// A backend with an explicit configuration (tests use this: environment variables are
    /// process-wide, so tests that set them race).
    pub fn with_config(config: WgpuConfig) -> Self {
        let devices = device::discover(config.adapter.as_deref());
        let infos = devices.iter().map(|d| d.info.clone()).collect();
        let pools = devices
            .iter()
            .map(|_| Arc::new(Mutex::new(Pool::new(config.pool_bytes))))
            .collect();
        WgpuBackend {
            cache: Mutex::new(programs::pipeline_cache(config.pipeline_cache)),
            config,
            devices,
            infos,
            pools,
            buffers: Handles::new("wgpu"),
            programs: Handles::new("wgpu"),
            counters: Counters::default(),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &WgpuConfig {
        &self.config
    }

    /// What the backend has done so far.
    pub fn stats(&self) -> WgpuStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut stats = WgpuStats {
            builds: get(&self.counters.builds),
            cache_hits: get(&self.counters.cache_hits),
            launches: get(&self.counters.launches),
            ..WgpuStats::default()
        };
        for pool in &self.pools {
            let pool = memory::lock_pool(pool);
            stats.pool_reuses += pool.reuses;
            stats.buffers_created += pool.creates;
            stats.cached_bytes += pool.cached_bytes();
        }
        stats
    }

    /// Drops the freed buffers every device keeps for reuse (wgpu frees their memory once
    /// no queued work uses them); returns the bytes they held.
    pub fn trim(&self) -> u64 {
        self.pools
            .iter()
            .map(|pool| memory::lock_pool(pool).clear())
            .sum()
    }

    /// What wgpu says about device `device` (API, driver, features, buffer limits), if it
    /// exists.
    pub fn details(&self, device: usize) -> Option<&WgpuDeviceDetails> {
        self.devices.get(device).map(|d| &d.details)
    }

    /// The WGSL shader (and its binding ABI) `compile` would build for `kernel` on `device`.
    pub fn shader(&self, device: usize, kernel: &Kernel) -> Result<WgslShader, BackendError> {
        render(self.device(device)?, kernel)
    }

    /// Builds `shader` on `device` for `kernel`, as [`Backend::compile`] does with the shader
    /// it renders: for running hand-written or modified WGSL. `shader` must follow the ABI
    /// of [`tessel_ir::codegen::render_wgsl`] for `kernel` (its launches are checked against
    /// `kernel`'s parameters, and bound as `shader.buffers` says).
    pub fn compile_shader(
        &self,
        device: usize,
        kernel: &Kernel,
        shader: WgslShader,
    ) -> Result<ProgramId, BackendError> {
        let dev = self.device(device)?;
        programs::check_limits(dev, &kernel.name, &shader)?;
        let (pipeline, origin) = self.pipeline(device, dev, &kernel.name, shader)?;
        Ok(self.programs.insert(Program {
            kernel: kernel.clone(),
            device,
            pipelines: Pipelines::Fixed(pipeline),
            origin,
        }))
    }

    fn device(&self, device: usize) -> Result<&GpuDevice, BackendError> {
        handles::device("wgpu", &self.devices, device)
    }

    /// The pipeline for `shader` on `device`, from the cache or built.
    fn pipeline(
        &self,
        device: usize,
        dev: &GpuDevice,
        name: &str,
        shader: WgslShader,
    ) -> Result<(Arc<Pipeline>, ProgramOrigin), BackendError> {
        if let Some(pipeline) = lock(&self.cache).get(device, &shader.source) {
            self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((pipeline, ProgramOrigin::Cached));
        }
        // No lock is held while the driver builds, which may take a while.
        let pipeline = Arc::new(programs::build(dev, name, shader)?);
        self.counters.builds.fetch_add(1, Ordering::Relaxed);
        lock(&self.cache).insert(device, Arc::clone(&pipeline));
        Ok((pipeline, ProgramOrigin::Compiled))
    }

    /// Checks a launch and submits it; `None` when the grid is empty (nothing runs).
    fn submit(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
        timed: bool,
    ) -> Result<Option<Submitted>, BackendError> {
        let program = self.programs.get(program)?;
        let kernel = &program.kernel;
        let dev = self.device(program.device)?;
        let bound = self.buffers.get_all(buffers)?;
        handles::check_launch_devices(
            "wgpu",
            &kernel.name,
            program.device,
            buffers,
            bound.iter().map(|b| b.device),
        )?;
        let sizes: Vec<usize> = bound.iter().map(|b| b.bytes).collect();
        let args = LaunchArgs::evaluate(kernel, buffers, &sizes, dims)?;
        let refs: Vec<&DeviceBuffer> = bound.iter().map(Arc::as_ref).collect();
        let pipeline = match &program.pipelines {
            Pipelines::Fixed(pipeline) => Arc::clone(pipeline),
            Pipelines::PerLocal(_) if args.groups == 0 || args.grid[3..].contains(&0) => {
                return Ok(None);
            }
            Pipelines::PerLocal(built) => {
                let local = [args.grid[3], args.grid[4], args.grid[5]];
                let known = lock(built).get(&local).cloned();
                if let Some(pipeline) = known {
                    pipeline
                } else {
                    // Built without the lock held; a racing launch at most builds it twice.
                    let fixed = with_local(kernel, local);
                    let shader = render(dev, &fixed)?;
                    programs::check_limits(dev, &kernel.name, &shader)?;
                    let (pipeline, _) = self.pipeline(program.device, dev, &kernel.name, shader)?;
                    lock(built).insert(local, Arc::clone(&pipeline));
                    pipeline
                }
            }
        };
        let submitted = launch::submit(dev, &kernel.name, &pipeline, &refs, &args, timed)?;
        if submitted.is_some() {
            self.counters.launches.fetch_add(1, Ordering::Relaxed);
        }
        Ok(submitted)
    }
}

/// `kernel` as WGSL for `dev`, with codegen errors as backend errors.
fn render(dev: &GpuDevice, kernel: &Kernel) -> Result<WgslShader, BackendError> {
    codegen::render_wgsl(kernel, &dev.target).map_err(|e| match e {
        CodegenError::Verify(e) => BackendError::Compile {
            kernel: kernel.name.clone(),
            code: kernel.to_string(),
            log: e.to_string(),
        },
        other => BackendError::Unsupported {
            backend: "wgpu",
            what: format!(
                "{other} (device {}: SHADER_F64 {}, SHADER_INT64 {})",
                dev.info.name, dev.details.shader_f64, dev.details.shader_int64
            ),
        },
    })
}

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.infos
    }

    fn alloc(&self, device: usize, bytes: usize) -> Result<BufferId, BackendError> {
        let dev = self.device(device)?;
        let buffer = memory::alloc(dev, &self.pools[device], device, bytes)?;
        Ok(self.buffers.insert(buffer))
    }

    fn free(&self, buffer: BufferId) -> Result<(), BackendError> {
        // The buffer goes back to its device's pool once no launch holds it; reusing it is
        // ordered after the queued work that uses it (see `memory`).
        self.buffers.remove(buffer).map(drop)
    }

    fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        let b = self.buffers.get(buffer)?;
        check_range("write", buffer, offset, data.len(), b.bytes)?;
        if data.is_empty() {
            return Ok(());
        }
        memory::write(self.device(b.device)?, &b, offset, data)
    }

    fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        let b = self.buffers.get(buffer)?;
        check_range("read", buffer, offset, out.len(), b.bytes)?;
        memory::read(self.device(b.device)?, &b, offset, out)
    }

    fn copy(&self, src: BufferId, dst: BufferId, bytes: usize) -> Result<(), BackendError> {
        let (from, to) = (self.buffers.get(src)?, self.buffers.get(dst)?);
        check_range("copy source", src, 0, bytes, from.bytes)?;
        check_range("copy destination", dst, 0, bytes, to.bytes)?;
        handles::check_copy_devices("wgpu", (src, from.device), (dst, to.device))?;
        // A buffer copied onto itself is unchanged (wgpu rejects the overlap).
        if src == dst || bytes == 0 {
            return Ok(());
        }
        memory::copy(self.device(from.device)?, &from, &to, bytes)
    }

    fn compile(&self, device: usize, kernel: &Kernel) -> Result<ProgramId, BackendError> {
        let dev = self.device(device)?;
        dev.check()?;
        let kernel = &tessel_ir::backend::prepare(kernel)?;
        if kernel.grid.local.iter().all(|l| l.as_const().is_some()) {
            let shader = render(dev, kernel)?;
            return self.compile_shader(device, kernel, shader);
        }
        // Symbolic local sizes: each launch's sizes get their own pipeline. Rendering at the
        // smallest sizes now reports what the device cannot run at compile time.
        let smallest = kernel.grid.local.map(|l| l.bounds().lo.max(1));
        render(dev, &with_local(kernel, smallest))?;
        Ok(self.programs.insert(Program {
            kernel: kernel.clone(),
            device,
            pipelines: Pipelines::PerLocal(Mutex::default()),
            origin: ProgramOrigin::Compiled,
        }))
    }

    fn launch(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<(), BackendError> {
        self.submit(program, buffers, dims, false).map(drop)
    }

    fn time(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<Duration, BackendError> {
        let device = self.programs.get(program)?.device;
        launch::time(self.device(device)?, || {
            self.submit(program, buffers, dims, true)
        })
    }

    fn synchronize(&self, device: usize) -> Result<(), BackendError> {
        self.device(device)?.wait(None)
    }

    fn release(&self, program: ProgramId) -> Result<(), BackendError> {
        self.programs.remove(program).map(drop)
    }

    fn origin(&self, program: ProgramId) -> Result<ProgramOrigin, BackendError> {
        Ok(self.programs.get(program)?.origin)
    }
}
