//! Tessel's OpenCL backend: kernels rendered in OpenCL C ([`tessel_ir::codegen::OPENCL`])
//! and run on every OpenCL device the system has (GPUs from any vendor, CPUs through PoCL,
//! accelerators).
//!
//! ```no_run
//! use tessel_ir::{Backend, samples};
//! use tessel_opencl::OpenClBackend;
//! use tessel_shape::{Bindings, DType};
//!
//! let cl = OpenClBackend::new();
//! if cl.devices().is_empty() {
//!     return Ok(()); // no OpenCL driver here
//! }
//! let kernel = samples::vector_add(DType::F32, 1024, 64)?;
//! let program = cl.compile(0, &kernel)?;
//! let [a, b, out] = [0; 3].map(|_| cl.alloc(0, 4096).unwrap());
//! cl.write(a, 0, &[0; 4096])?;
//! cl.write(b, 0, &[0; 4096])?;
//! cl.launch(program, &[a, b, out], &Bindings::new())?;
//! let mut result = vec![0u8; 4096];
//! cl.read(out, 0, &mut result)?; // waits for the launch
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Installing and choosing devices
//!
//! Nothing links against OpenCL at build time: `opencl3`'s `dynamic` feature opens
//! `libOpenCL.so.1` (the ICD loader) on first use, so this crate builds anywhere. At run
//! time it needs a loader and at least one driver (an ICD); on Debian and Ubuntu
//! `ocl-icd-libopencl1` plus `pocl-opencl-icd` give a CPU device. Without a loader or a
//! driver the backend has **zero devices**, logged at debug level; it never panics.
//!
//! | Variable | Effect |
//! |---|---|
//! | `TESSEL_OPENCL_DEVICE` | restricts the devices: an index into the list below, or a case-insensitive substring of the platform's or device's name, vendor or version (`pocl`, `h200`) |
//! | `OPENCL_DYLIB_PATH` | the loader library to open instead of `libOpenCL.so.1` (read by `opencl3`) |
//! | `OCL_ICD_VENDORS` | a directory of `.icd` files naming the drivers (read by the ocl-icd loader) |
//! | `POCL_CACHE_DIR` | where PoCL caches built kernels (default `~/.cache/pocl/kcache`) |
//!
//! Devices are listed over every platform, GPUs first, then accelerators, then CPUs, each
//! group in the driver's order. Devices that are unavailable, have no compiler, are
//! big-endian or compile OpenCL C older than 1.2 are skipped with a log line.
//!
//! # How it runs
//!
//! - **Per device**: one context and one in-order queue with profiling. Every command goes
//!   to that queue, so commands on one device run in submission order.
//! - **Memory**: one `cl_mem` per buffer (`Buffer<u8>`). [`Backend::write`] and
//!   [`Backend::read`] block until the host data is copied (a read therefore waits for
//!   every earlier launch); [`Backend::copy`] is queued and returns at once.
//! - **Programs**: each kernel is rendered in the device's dialect ([`OPENCL`], or
//!   [`OPENCL_NO_FP64`] without `cl_khr_fp64`), built with
//!   `-cl-fp32-correctly-rounded-divide-sqrt` where supported (and never with fast-math),
//!   and cached by device and source (bounded, [`OpenClConfig::program_cache`]).
//!   [`Backend::compile_many`] builds the kernels it is given as one program, paying the
//!   driver's fixed cost per build once (PoCL parses clang's whole `opencl-c.h` for every
//!   program); if that build fails, each kernel is built alone. A failed
//!   build is [`BackendError::Compile`] with the source and the driver's build log; a kernel
//!   the device cannot express (an `f64` op without `cl_khr_fp64`, too much local memory, too
//!   large a workgroup) is [`BackendError::Unsupported`] naming the op and dtype.
//! - **Launches** check every buffer against the kernel's parameters
//!   ([`tessel_ir::LaunchArgs`]), then queue the kernel with global size `groups * local`
//!   and local size `local` and return without waiting; [`Backend::synchronize`] waits.
//!   [`Backend::time`] waits for its launch and reports the device's profiling timer
//!   (`CL_PROFILING_COMMAND_START` to `END`).
//!
//! # Numerics
//!
//! Results are bit-identical to the reference interpreter for every op except the
//! OpenCL built-in transcendentals (`exp`, `exp2`, `log`, `log2`, `sin`, `cos`, `tan`,
//! `tanh`, `pow`, and `erf` through its `exp`), which are within the OpenCL specification's
//! ulp bounds. `f16`/`bf16` compute in `float` and round after every op, as the reference
//! does, whether or not the device has `cl_khr_fp16`. See [`tessel_ir::codegen`].
//!
//! # Verified
//!
//! The crate's tests (`tests/opencl.rs`, `tests/ops.rs`) passed on:
//!
//! - PoCL 3.1 on Debian 12 (LLVM 15, CPU device, OpenCL C 1.2, `cl_khr_fp64`, no
//!   `cl_khr_fp16`), the CI configuration;
//! - an NVIDIA H200 (driver 580.159.04, "OpenCL 3.0 CUDA", OpenCL C 1.2, `cl_khr_fp64`, no
//!   `cl_khr_fp16`) and PoCL 5.0 on the same Ubuntu 24.04 host, where CUDA's
//!   `libOpenCL.so.1` lists both with no ICD file or variable set.
//!
//! That is: every sample kernel against values computed in Rust (vector add on all 13
//! dtypes, the tiled matmul and the reductions bit for bit); every unary, binary and ternary
//! op, cast and bitcast on every dtype against the interpreter, on random and special
//! values, bitwise except the transcendentals listed above (PoCL's are within 2 ulps of
//! glibc's); an unfused `a * b + c`; barriers in loops, vectors, symbolic local sizes; and
//! the error paths (build log, too-small buffers, unbound dims, `f64` without `cl_khr_fp64`
//! through [`OpenClConfig::disable_f64`], no platform).

mod device;
mod ffi;
mod programs;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opencl3::error_codes::{
    CL_INVALID_BUFFER_SIZE, CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_HOST_MEMORY,
    CL_OUT_OF_RESOURCES, ClError,
};
use opencl3::event::Event;
use opencl3::memory::Buffer;
use tessel_ir::codegen::{self, CodegenError};
#[cfg(doc)]
use tessel_ir::codegen::{OPENCL, OPENCL_NO_FP64};
use tessel_ir::handles::{self, check_range, lock};
use tessel_ir::{
    Backend, BackendError, BufferId, DeviceInfo, Handles, Kernel, LaunchArgs, Param, ProgramId,
    ProgramOrigin,
};
use tessel_shape::Bindings;

use crate::device::ClDevice;
pub use crate::device::OpenClDeviceDetails;
use crate::ffi::{Arg, Handle};
use crate::programs::{Built, ProgramCache};

/// The default number of built programs kept for reuse ([`OpenClConfig::program_cache`]).
/// Programs of live `ProgramId`s stay alive regardless.
pub const PROGRAM_CACHE: usize = 256;

/// How an [`OpenClBackend`] is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenClConfig {
    /// Which devices to use: `None` for all; else an index into the discovered list (GPUs
    /// first), or a case-insensitive substring of a device's platform or device name,
    /// vendor or version. See the [crate docs](crate).
    pub device: Option<String>,
    /// Built programs kept for reuse, over all devices.
    pub program_cache: usize,
    /// Treats every device as lacking `cl_khr_fp64`: `f64` kernels are then
    /// [`BackendError::Unsupported`]. For tests of that path on devices that have doubles.
    pub disable_f64: bool,
}

impl Default for OpenClConfig {
    /// Every device, [`PROGRAM_CACHE`] programs, doubles where the device has them; no
    /// environment variable is read.
    fn default() -> Self {
        OpenClConfig {
            device: None,
            program_cache: PROGRAM_CACHE,
            disable_f64: false,
        }
    }
}

impl OpenClConfig {
    /// The default configuration, with [`device`](Self::device) from
    /// `$TESSEL_OPENCL_DEVICE` when set and non-empty.
    pub fn from_env() -> OpenClConfig {
        OpenClConfig {
            device: std::env::var("TESSEL_OPENCL_DEVICE")
                .ok()
                .filter(|v| !v.trim().is_empty()),
            ..OpenClConfig::default()
        }
    }
}

/// Counters of what an [`OpenClBackend`] did, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenClStats {
    /// Programs built by the driver.
    pub builds: u64,
    /// Compiles answered from the program cache.
    pub cache_hits: u64,
    /// Kernel launches queued.
    pub launches: u64,
}

#[derive(Default)]
struct Counters {
    builds: AtomicU64,
    cache_hits: AtomicU64,
    launches: AtomicU64,
}

/// A live buffer.
struct DeviceBuffer {
    device: usize,
    /// The size asked for; the `cl_mem` has at least one byte (OpenCL has no empty buffers).
    bytes: usize,
    mem: Handle<Buffer<u8>>,
}

/// A compiled kernel.
struct Program {
    /// The IR, against which launches are checked.
    kernel: Kernel,
    device: usize,
    /// Setting arguments and enqueueing must not interleave between two launches of one
    /// kernel object, so launches hold this lock for both.
    cl: Mutex<Handle<opencl3::kernel::Kernel>>,
    /// Keeps the OpenCL program alive while its kernel object is (fields drop in order).
    _built: Arc<Built>,
    /// The largest workgroup this kernel may run on its device.
    max_workgroup: u64,
    origin: ProgramOrigin,
    /// Whether a launch was queued and waited for (see [`OpenClBackend::enqueue`]).
    launched: AtomicBool,
}

/// The OpenCL backend. See the [crate docs](crate).
pub struct OpenClBackend {
    config: OpenClConfig,
    devices: Vec<ClDevice>,
    infos: Vec<DeviceInfo>,
    buffers: Handles<BufferId, DeviceBuffer>,
    programs: Handles<ProgramId, Program>,
    cache: Mutex<ProgramCache>,
    counters: Counters,
}

impl Default for OpenClBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenClBackend {
    /// A backend configured from the environment ([`OpenClConfig::from_env`]).
    pub fn new() -> Self {
        Self::with_config(OpenClConfig::from_env())
    }

    /// A backend with an explicit configuration (tests use this: environment variables are
    /// process-wide, so tests that set them race).
    pub fn with_config(config: OpenClConfig) -> Self {
        let devices = device::discover(config.device.as_deref(), config.disable_f64);
        let infos = devices.iter().map(|d| d.info.clone()).collect();
        OpenClBackend {
            cache: Mutex::new(programs::program_cache(config.program_cache)),
            config,
            devices,
            infos,
            buffers: Handles::new("opencl"),
            programs: Handles::new("opencl"),
            counters: Counters::default(),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &OpenClConfig {
        &self.config
    }

    /// What the backend has done so far.
    pub fn stats(&self) -> OpenClStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OpenClStats {
            builds: get(&self.counters.builds),
            cache_hits: get(&self.counters.cache_hits),
            launches: get(&self.counters.launches),
        }
    }

    /// The driver's description of device `device` (platform, versions, rounding), if it
    /// exists.
    pub fn details(&self, device: usize) -> Option<&OpenClDeviceDetails> {
        self.devices.get(device).map(|d| &d.details)
    }

    /// The OpenCL C source `compile` would build for `kernel` on `device`.
    pub fn source(&self, device: usize, kernel: &Kernel) -> Result<String, BackendError> {
        let dev = self.device(device)?;
        render(dev, kernel)
    }

    /// Builds OpenCL C `source` on `device` without running it, through the same build
    /// options and program cache as [`Backend::compile`]: for checking hand-written or
    /// modified kernels. A failure is [`BackendError::Compile`] with the driver's build log,
    /// attributed to `name`.
    pub fn build_source(
        &self,
        device: usize,
        name: &str,
        source: &str,
    ) -> Result<(), BackendError> {
        let dev = self.device(device)?;
        self.built(device, dev, name, source).map(drop)
    }

    fn device(&self, device: usize) -> Result<&ClDevice, BackendError> {
        handles::device("opencl", &self.devices, device)
    }

    /// The built program for `source` on `device`, from the cache or the driver.
    fn built(
        &self,
        device: usize,
        dev: &ClDevice,
        name: &str,
        source: &str,
    ) -> Result<(Arc<Built>, ProgramOrigin), BackendError> {
        if let Some(built) = self.cached(device, source) {
            return Ok((built, ProgramOrigin::Cached));
        }
        // No lock is held while the driver builds, which may take a second.
        let built = Arc::new(programs::build(dev, name, source)?);
        self.counters.builds.fetch_add(1, Ordering::Relaxed);
        lock(&self.cache).insert(device, Arc::clone(&built));
        Ok((built, ProgramOrigin::Compiled))
    }

    /// The cached program built from `source` on `device`, if any.
    fn cached(&self, device: usize, source: &str) -> Option<Arc<Built>> {
        let built = lock(&self.cache).get(device, source)?;
        self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
        Some(built)
    }

    /// The program of prepared `kernel` (rendered as `source`) from its built program.
    fn program(
        &self,
        device: usize,
        dev: &ClDevice,
        (kernel, source): (Kernel, String),
        (built, origin): (Arc<Built>, ProgramOrigin),
    ) -> Result<ProgramId, BackendError> {
        let entry = built
            .entry
            .clone()
            .unwrap_or_else(|| codegen::entry_name(&kernel));
        let cl = opencl3::kernel::Kernel::create(&built.program, &entry).map_err(|e| {
            BackendError::Compile {
                kernel: kernel.name.clone(),
                code: source,
                log: format!("clCreateKernel(`{entry}`) failed: {e}"),
            }
        })?;
        let max_workgroup = cl
            .get_work_group_size(dev.device.id())
            .map_or(u64::from(dev.info.max_workgroup_size), |n| n as u64);
        Ok(self.programs.insert(Program {
            kernel,
            device,
            cl: Mutex::new(Handle::new(cl)),
            _built: built,
            max_workgroup,
            origin,
            launched: AtomicBool::new(false),
        }))
    }

    /// Checks a launch and queues it; returns its event and device, or `None` when the
    /// grid is empty (nothing to run).
    fn enqueue(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<Option<(Handle<Event>, &ClDevice)>, BackendError> {
        let program = self.programs.get(program)?;
        let kernel = &program.kernel;
        let dev = self.device(program.device)?;
        let bound = self.buffers.get_all(buffers)?;
        handles::check_launch_devices(
            "opencl",
            &kernel.name,
            program.device,
            buffers,
            bound.iter().map(|b| b.device),
        )?;
        let sizes: Vec<usize> = bound.iter().map(|b| b.bytes).collect();
        let args = LaunchArgs::evaluate(kernel, buffers, &sizes, dims)?;
        // Accumulated buffers start at zero (`Access::Accumulate`), in queue order.
        for &(j, bytes) in &args.zeroed {
            ffi::fill(&dev.queue, &bound[j].mem, 0, bytes).map_err(|e| BackendError::Launch {
                kernel: kernel.name.clone(),
                reason: format!("clEnqueueFillBuffer failed: {e}"),
            })?;
        }
        let Some((global, local)) = launch_sizes(&program, dev, &args)? else {
            return Ok(None);
        };
        // The dims' values as their parameters' OpenCL types, in parameter order.
        let scalars: Vec<Vec<u8>> = kernel
            .params
            .iter()
            .filter_map(|p| match p {
                Param::Dim { dtype, .. } => Some(dtype.size_bytes()),
                Param::Buffer { .. } => None,
            })
            .zip(&args.dims)
            .map(|(size, &value)| scalar_bytes(value, size))
            .collect();
        let (mut next_buffer, mut next_scalar) = (bound.iter(), scalars.iter());
        let cl_args: Vec<Arg<'_>> = kernel
            .params
            .iter()
            .filter_map(|p| match p {
                Param::Buffer { .. } => next_buffer.next().map(|b| Arg::Buffer(&b.mem)),
                Param::Dim { .. } => next_scalar.next().map(|s| Arg::Scalar(s)),
            })
            .collect();
        let event = {
            let cl = lock(&program.cl);
            ffi::launch(&dev.queue, &cl, &cl_args, global, local)
        }
        .map_err(|e| BackendError::Launch {
            kernel: kernel.name.clone(),
            reason: format!("clEnqueueNDRangeKernel failed: {e}"),
        })?;
        self.counters.launches.fetch_add(1, Ordering::Relaxed);
        if !program.launched.swap(true, Ordering::Relaxed) {
            // A driver may compile at a kernel's first launch (PoCL builds its work-group
            // function then), first using statics whose destructors run at exit: waiting
            // for it, then registering the exit hook anew, has queues finish before those
            // destructors run.
            event.wait().map_err(|e| lost(dev, "clWaitForEvents", &e))?;
            ffi::finish_queues_at_exit();
        }
        Ok(Some((event, dev)))
    }
}

/// A launch's global and local work sizes, per axis.
type WorkSizes = ([usize; 3], [usize; 3]);

/// The work sizes of a launch, or `None` when it runs nothing.
fn launch_sizes(
    program: &Program,
    dev: &ClDevice,
    args: &LaunchArgs,
) -> Result<Option<WorkSizes>, BackendError> {
    let name = &program.kernel.name;
    if args.groups == 0 || args.grid[3..].contains(&0) {
        return Ok(None);
    }
    let too_large = |what: String| BackendError::Launch {
        kernel: name.clone(),
        reason: what,
    };
    let mut global = [0usize; 3];
    let mut local = [0usize; 3];
    for axis in 0..3 {
        let (g, l) = (args.grid[axis], args.grid[3 + axis]);
        if l > i64::from(dev.info.max_local_size[axis]) {
            return Err(too_large(format!(
                "the local size {l} along axis {axis} exceeds the device's limit of {}",
                dev.info.max_local_size[axis]
            )));
        }
        local[axis] = usize::try_from(l).unwrap_or(usize::MAX);
        global[axis] = g
            .checked_mul(l)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                too_large(format!(
                    "{g} workgroups of {l} along axis {axis} overflow the global size"
                ))
            })?;
    }
    let invocations = args.grid[3..].iter().product::<i64>();
    if invocations as u64 > program.max_workgroup {
        return Err(too_large(format!(
            "workgroups of {invocations} invocations exceed this kernel's limit of {} on {}",
            program.max_workgroup, dev.info.name
        )));
    }
    Ok(Some((global, local)))
}

/// `kernel` in `dev`'s dialect, with codegen errors as backend errors.
/// `kernel` prepared for `dev` ([`tessel_ir::backend::prepare`]) and its source, the
/// device's limits checked.
fn prepared(dev: &ClDevice, kernel: &Kernel) -> Result<(Kernel, String), BackendError> {
    let kernel = tessel_ir::backend::prepare(kernel)?;
    let source = render(dev, &kernel)?;
    programs::check_limits(dev, &kernel)?;
    Ok((kernel, source))
}

fn render(dev: &ClDevice, kernel: &Kernel) -> Result<String, BackendError> {
    codegen::render(kernel, dev.dialect).map_err(|e| match e {
        CodegenError::Verify(e) => BackendError::Compile {
            kernel: kernel.name.clone(),
            code: kernel.to_string(),
            log: e.to_string(),
        },
        other => BackendError::Unsupported {
            backend: "opencl",
            what: format!("{other} (device {})", dev.info.name),
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

/// A failed transfer or wait: the device is in an unknown state.
fn lost(dev: &ClDevice, call: &str, e: &ClError) -> BackendError {
    BackendError::DeviceLost {
        device: dev.info.name.clone(),
        reason: format!("{call} failed: {e}"),
    }
}

/// Whether a driver error means memory ran out.
fn is_out_of_memory(e: &ClError) -> bool {
    matches!(
        e.0,
        CL_MEM_OBJECT_ALLOCATION_FAILURE
            | CL_OUT_OF_RESOURCES
            | CL_OUT_OF_HOST_MEMORY
            | CL_INVALID_BUFFER_SIZE
    )
}

impl Backend for OpenClBackend {
    fn name(&self) -> &'static str {
        "opencl"
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
        let limit = dev.max_alloc.min(dev.info.memory_bytes);
        if bytes as u64 > limit {
            return Err(oom());
        }
        let mem = ffi::create_buffer(&dev.context, bytes.max(1)).map_err(|e| {
            if is_out_of_memory(&e) {
                oom()
            } else {
                lost(dev, "clCreateBuffer", &e)
            }
        })?;
        let buffer = DeviceBuffer { device, bytes, mem };
        Ok(self.buffers.insert(buffer))
    }

    fn free(&self, buffer: BufferId) -> Result<(), BackendError> {
        // OpenCL defers the release until queued commands using the buffer are done.
        self.buffers.remove(buffer).map(drop)
    }

    fn fill(&self, buffer: BufferId, value: u8, bytes: usize) -> Result<(), BackendError> {
        let b = self.buffers.get(buffer)?;
        check_range("fill", buffer, 0, bytes, b.bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        let dev = self.device(b.device)?;
        ffi::fill(&dev.queue, &b.mem, value, bytes)
            .map_err(|e| lost(dev, "clEnqueueFillBuffer", &e))
    }

    fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        let b = self.buffers.get(buffer)?;
        check_range("write", buffer, offset, data.len(), b.bytes)?;
        if data.is_empty() {
            return Ok(());
        }
        let dev = self.device(b.device)?;
        ffi::write(&dev.queue, &b.mem, offset, data).map_err(|e| {
            if is_out_of_memory(&e) {
                BackendError::OutOfMemory {
                    device: dev.info.name.clone(),
                    requested: b.bytes,
                }
            } else {
                lost(dev, "clEnqueueWriteBuffer", &e)
            }
        })
    }

    fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        let b = self.buffers.get(buffer)?;
        check_range("read", buffer, offset, out.len(), b.bytes)?;
        let dev = self.device(b.device)?;
        if out.is_empty() {
            // Nothing to copy, but the caller may rely on the wait.
            return dev.queue.finish().map_err(|e| lost(dev, "clFinish", &e));
        }
        ffi::read(&dev.queue, &b.mem, offset, out).map_err(|e| lost(dev, "clEnqueueReadBuffer", &e))
    }

    fn copy(&self, src: BufferId, dst: BufferId, bytes: usize) -> Result<(), BackendError> {
        let (from, to) = (self.buffers.get(src)?, self.buffers.get(dst)?);
        check_range("copy source", src, 0, bytes, from.bytes)?;
        check_range("copy destination", dst, 0, bytes, to.bytes)?;
        handles::check_copy_devices("opencl", (src, from.device), (dst, to.device))?;
        // A buffer copied onto itself is unchanged (OpenCL rejects the overlap).
        if src == dst || bytes == 0 {
            return Ok(());
        }
        let dev = self.device(from.device)?;
        ffi::copy(&dev.queue, &from.mem, &to.mem, bytes)
            .map_err(|e| lost(dev, "clEnqueueCopyBuffer", &e))
    }

    fn compile(&self, device: usize, kernel: &Kernel) -> Result<ProgramId, BackendError> {
        let dev = self.device(device)?;
        let prepared = prepared(dev, kernel)?;
        let built = self.built(device, dev, &kernel.name, &prepared.1)?;
        self.program(device, dev, prepared, built)
    }

    /// Enough kernels per program that the driver's fixed cost per build is paid rarely,
    /// few enough that a failed build (then repeated kernel by kernel) costs little.
    /// One program for up to 32 kernels, whatever the threads: two half batches on two
    /// threads would parse the builtin header twice for little gain in latency.
    fn compile_batch(&self, _kernels: usize, _threads: usize) -> usize {
        32
    }

    /// Builds the kernels that are not cached as one program; if that build fails, each
    /// alone, so each error is the kernel's own.
    fn compile_many(
        &self,
        device: usize,
        kernels: &[&Kernel],
    ) -> Vec<Result<ProgramId, BackendError>> {
        let Ok(dev) = self.device(device) else {
            return kernels.iter().map(|k| self.compile(device, k)).collect();
        };
        let mut results: Vec<Option<Result<ProgramId, BackendError>>> =
            kernels.iter().map(|_| None).collect();
        let mut pending = Vec::new();
        for (i, kernel) in kernels.iter().enumerate() {
            match prepared(dev, kernel) {
                Err(e) => results[i] = Some(Err(e)),
                Ok(prepared) => match self.cached(device, &prepared.1) {
                    Some(built) => {
                        let built = (built, ProgramOrigin::Cached);
                        results[i] = Some(self.program(device, dev, prepared, built));
                    }
                    None => pending.push((i, prepared)),
                },
            }
        }
        if pending.len() > 1 {
            let entries: Vec<String> = pending
                .iter()
                .map(|(_, (k, _))| codegen::entry_name(k))
                .collect();
            let parts: Vec<(&str, &str, &str)> = pending
                .iter()
                .zip(&entries)
                .map(|((_, (k, source)), entry)| (k.name.as_str(), source.as_str(), entry.as_str()))
                .collect();
            match programs::build_together(dev, &parts) {
                Ok(builts) => {
                    self.counters.builds.fetch_add(1, Ordering::Relaxed);
                    for ((i, prepared), built) in pending.drain(..).zip(builts) {
                        let built = Arc::new(built);
                        lock(&self.cache).insert(device, Arc::clone(&built));
                        let built = (built, ProgramOrigin::Compiled);
                        results[i] = Some(self.program(device, dev, prepared, built));
                    }
                }
                Err(e) => {
                    tracing::debug!(
                        "tessel-opencl: building {} kernels together failed, building each alone: {e}",
                        pending.len()
                    );
                }
            }
        }
        for (i, prepared) in pending {
            results[i] = Some(
                self.built(device, dev, &prepared.0.name, &prepared.1)
                    .and_then(|built| self.program(device, dev, prepared, built)),
            );
        }
        results
            .into_iter()
            .zip(kernels)
            .map(|(result, kernel)| result.unwrap_or_else(|| self.compile(device, kernel)))
            .collect()
    }

    fn launch(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<(), BackendError> {
        let Some((event, dev)) = self.enqueue(program, buffers, dims)? else {
            return Ok(());
        };
        drop(event);
        // Submit now, so the device starts while the host goes on (some drivers batch
        // queued commands until a flush or a wait).
        dev.queue.flush().map_err(|e| lost(dev, "clFlush", &e))
    }

    fn time(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<Duration, BackendError> {
        let Some((event, dev)) = self.enqueue(program, buffers, dims)? else {
            return Ok(Duration::ZERO);
        };
        event.wait().map_err(|e| lost(dev, "clWaitForEvents", &e))?;
        let start = event
            .profiling_command_start()
            .map_err(|e| lost(dev, "clGetEventProfilingInfo", &e))?;
        let end = event
            .profiling_command_end()
            .map_err(|e| lost(dev, "clGetEventProfilingInfo", &e))?;
        Ok(Duration::from_nanos(end.saturating_sub(start)))
    }

    fn synchronize(&self, device: usize) -> Result<(), BackendError> {
        let dev = self.device(device)?;
        dev.queue.finish().map_err(|e| lost(dev, "clFinish", &e))
    }

    fn release(&self, program: ProgramId) -> Result<(), BackendError> {
        self.programs.remove(program).map(drop)
    }

    fn origin(&self, program: ProgramId) -> Result<ProgramOrigin, BackendError> {
        Ok(self.programs.get(program)?.origin)
    }
}

#[cfg(test)]
mod tests {
    use super::scalar_bytes;

    #[test]
    fn scalars_keep_their_low_bytes() {
        assert_eq!(scalar_bytes(-1, 1), vec![0xff]);
        assert_eq!(scalar_bytes(0x1234, 2), 0x1234u16.to_ne_bytes().to_vec());
        assert_eq!(scalar_bytes(70000, 4), 70000u32.to_ne_bytes().to_vec());
        assert_eq!(scalar_bytes(-2, 8), (-2i64).to_ne_bytes().to_vec());
    }
}
