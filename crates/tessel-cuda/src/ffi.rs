//! Every call into the CUDA driver, NVRTC, cuBLAS ([`cublas`]) and the dynamic loader: all
//! of this crate's `unsafe` is here, each block with the reason it is sound.
//!
//! The wrappers own their handles (a context, a stream, a module, an event, pinned host
//! memory) and release them on drop. Driver handles are raw pointers, which Rust treats as
//! neither `Send` nor `Sync`; the CUDA driver API is thread-safe (any thread may use any
//! handle once the owning context is current on it), so the wrappers are both, and every
//! method makes the context current first.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::Path;

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;
use cudarc::nvrtc::result as nv;
use cudarc::nvrtc::sys as nvsys;

pub(crate) mod cublas;
pub(crate) mod cublaslt;

/// Driver entry points this crate calls (directly or inside cudarc), checked before first
/// use: cudarc panics on a missing symbol, and an old driver lacks the newer `_v2` ones.
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuStreamCreate",
    "cuStreamSynchronize",
    "cuStreamDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpy2DAsync_v2",
    "cuMemsetD8Async",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuFuncGetAttribute",
    "cuLaunchKernel",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventQuery",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuGetErrorString",
    "cuGetErrorName",
];

/// Loads the driver library and checks it has every entry point used; `Err` says why not.
pub(crate) fn load_driver() -> Result<(), String> {
    // SAFETY: `is_culib_present` dlopens libcuda by its usual names and closes it again;
    // loading the driver runs only its own initializers, as any CUDA program does.
    if !unsafe { sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so.1) is not on the loader path".into());
    }
    // SAFETY: `is_culib_present` just found a loadable library, so `culib` (which panics
    // when none loads) returns it.
    let lib = unsafe { sys::culib() };
    match missing_symbol(lib, DRIVER_SYMBOLS) {
        Some(name) => Err(format!(
            "the CUDA driver lacks `{name}`: it is older than CUDA 13.0; update the driver"
        )),
        None => Ok(()),
    }
}

/// The first of `symbols` that `lib` does not export: cudarc panics on calling one.
pub(crate) fn missing_symbol<'a>(
    lib: &libloading::Library,
    symbols: &[&'a str],
) -> Option<&'a str> {
    symbols.iter().copied().find(|name| {
        // SAFETY: the symbol is only looked up, never called through this pointer type.
        unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err()
    })
}

/// `cuInit(0)`.
pub(crate) fn init() -> Result<(), DriverError> {
    cu::init()
}

/// The CUDA version the driver supports, as `1000 * major + 10 * minor`.
pub(crate) fn driver_version() -> Result<i32, DriverError> {
    let mut version: c_int = 0;
    // SAFETY: writes one int through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&raw mut version) }.result()?;
    Ok(version)
}

/// The number of CUDA devices.
pub(crate) fn device_count() -> Result<usize, DriverError> {
    cu::device::get_count().map(|n| usize::try_from(n).unwrap_or(0))
}

/// A device's primary context, retained for as long as this lives.
pub(crate) struct Context {
    device: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: a CUDA context may be made current on, and used from, any thread.
unsafe impl Send for Context {}
// SAFETY: as above; the driver synchronizes concurrent calls into one context.
unsafe impl Sync for Context {}

impl Context {
    /// Retains device `ordinal`'s primary context.
    pub(crate) fn new(ordinal: usize) -> Result<Context, DriverError> {
        let device = cu::device::get(ordinal as c_int)?;
        // SAFETY: `device` is a valid device handle from `cuDeviceGet`.
        let ctx = unsafe { cu::primary_ctx::retain(device) }?;
        Ok(Context { device, ctx })
    }

    /// Makes the context current on the calling thread; every other method calls this.
    pub(crate) fn bind(&self) -> Result<(), DriverError> {
        // SAFETY: `ctx` is a retained, live context.
        unsafe { cu::ctx::set_current(self.ctx) }
    }

    /// The device's name.
    pub(crate) fn name(&self) -> Result<String, DriverError> {
        cu::device::get_name(self.device)
    }

    /// The device's global memory, in bytes.
    pub(crate) fn total_memory(&self) -> Result<usize, DriverError> {
        // SAFETY: `device` is a valid device handle.
        unsafe { cu::device::total_mem(self.device) }
    }

    /// One device attribute.
    pub(crate) fn attribute(&self, attribute: sys::CUdevice_attribute) -> Result<i32, DriverError> {
        // SAFETY: `device` is a valid device handle; the attribute is an enum value.
        unsafe { cu::device::get_attribute(self.device, attribute) }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `new`; nothing of this context is used afterwards
        // (its owner drops every module, stream and allocation first).
        if let Err(e) = unsafe { cu::primary_ctx::release(self.device) } {
            tracing::warn!("tessel-cuda: releasing a primary context failed: {e}");
        }
    }
}

/// A non-blocking stream: it never synchronizes implicitly with the legacy default stream.
pub(crate) struct Stream(sys::CUstream);

// SAFETY: streams may be used from any thread with their context current.
unsafe impl Send for Stream {}
// SAFETY: the driver serializes concurrent submissions to one stream.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream in the current context.
    pub(crate) fn new(ctx: &Context) -> Result<Stream, DriverError> {
        ctx.bind()?;
        cu::stream::create(cu::stream::StreamKind::NonBlocking).map(Stream)
    }

    /// Waits for everything submitted to the stream.
    pub(crate) fn synchronize(&self, ctx: &Context) -> Result<(), DriverError> {
        ctx.bind()?;
        // SAFETY: the stream is live.
        unsafe { cu::stream::synchronize(self.0) }
    }

    /// Destroys the stream, after `ctx` is bound (by the owner's drop).
    pub(crate) fn destroy(&mut self) {
        if self.0.is_null() {
            return;
        }
        // SAFETY: the stream is live and destroyed once (the handle is cleared); work still
        // queued on it completes first, as the driver guarantees.
        if let Err(e) = unsafe { cu::stream::destroy(self.0) } {
            tracing::warn!("tessel-cuda: destroying a stream failed: {e}");
        }
        self.0 = std::ptr::null_mut();
    }
}

/// Allocates `bytes` of device memory in `ctx`.
pub(crate) fn malloc(ctx: &Context, bytes: usize) -> Result<u64, DriverError> {
    ctx.bind()?;
    // SAFETY: a plain allocation; the pointer is owned by the caller's pool.
    unsafe { cu::malloc_sync(bytes) }
}

/// Frees device memory from [`malloc`]; the caller has synchronized every stream using it.
pub(crate) fn free(ctx: &Context, ptr: u64) -> Result<(), DriverError> {
    ctx.bind()?;
    // SAFETY: `ptr` came from `malloc` in this context and is freed once (the pool hands
    // each pointer out to one owner and frees it only when no owner holds it).
    unsafe { cu::free_sync(ptr) }
}

/// Queues a host-to-device copy of `src` to `dst` on `stream`. The driver reads `src`
/// after this returns, so it must be pinned memory that stays untouched until the copy
/// completes (the staging buffer's event says when).
pub(crate) fn copy_to_device(
    ctx: &Context,
    stream: &Stream,
    dst: u64,
    src: &Pinned,
    len: usize,
) -> Result<(), DriverError> {
    ctx.bind()?;
    let len = len.min(src.len);
    // SAFETY: `src.ptr..+len` is pinned memory this process owns; the caller keeps it alive
    // and unmodified until the copy's event completes. `dst..+len` lies in a live
    // allocation (checked by the caller against the buffer's size).
    unsafe {
        let bytes = std::slice::from_raw_parts(src.ptr.cast::<u8>(), len);
        cu::memcpy_htod_async(dst, bytes, stream.0)
    }
}

/// Copies pageable `data` to `dst` after the work queued on `stream`, and waits for it
/// (the fallback when no pinned memory can be had).
pub(crate) fn copy_to_device_and_wait(
    ctx: &Context,
    stream: &Stream,
    dst: u64,
    data: &[u8],
) -> Result<(), DriverError> {
    ctx.bind()?;
    // SAFETY: `dst..+len` lies in a live allocation (checked by the caller); `data` stays
    // borrowed until the stream is synchronized, so the driver has finished reading it.
    unsafe {
        cu::memcpy_htod_async(dst, data, stream.0)?;
        cu::stream::synchronize(stream.0)
    }
}

/// Copies `out.len()` bytes from `src` into `out`, after all work queued on `stream`, and
/// waits for the copy.
pub(crate) fn copy_to_host(
    ctx: &Context,
    stream: &Stream,
    src: u64,
    out: &mut [u8],
) -> Result<(), DriverError> {
    ctx.bind()?;
    // SAFETY: `src..+len` lies in a live allocation (checked by the caller); `out` is
    // borrowed mutably until the stream is synchronized below, so the driver's writes into
    // it are finished before the borrow ends.
    unsafe {
        cu::memcpy_dtoh_async(out, src, stream.0)?;
        cu::stream::synchronize(stream.0)
    }
}

/// Queues a device-to-device copy of `bytes` bytes.
pub(crate) fn copy_on_device(
    ctx: &Context,
    stream: &Stream,
    dst: u64,
    src: u64,
    bytes: usize,
) -> Result<(), DriverError> {
    ctx.bind()?;
    // SAFETY: both ranges lie in live allocations of this context (checked by the caller);
    // the pool keeps them allocated while work on the stream may use them.
    unsafe { cu::memcpy_dtod_async(dst, src, bytes, stream.0) }
}

/// Queues copying `height` rows of `width` bytes from `src`, whose rows start `src_pitch`
/// bytes apart, to `dst`, whose rows start `dst_pitch` bytes apart.
pub(crate) fn copy_rows(
    ctx: &Context,
    stream: &Stream,
    [dst, dst_pitch]: [u64; 2],
    [src, src_pitch]: [u64; 2],
    [width, height]: [usize; 2],
) -> Result<(), DriverError> {
    ctx.bind()?;
    let copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch as usize,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch as usize,
        WidthInBytes: width,
        Height: height,
    };
    // SAFETY: both row sets lie in live allocations of this context (checked by the
    // caller); the descriptor is read before the call returns; the pool keeps both
    // allocations while work on the stream may use them.
    unsafe { sys::cuMemcpy2DAsync_v2(&raw const copy, stream.0) }.result()
}

/// Queues setting `bytes` bytes at `dst` to `value`.
pub(crate) fn fill(
    ctx: &Context,
    stream: &Stream,
    dst: u64,
    value: u8,
    bytes: usize,
) -> Result<(), DriverError> {
    ctx.bind()?;
    // SAFETY: `dst..+bytes` lies in a live allocation of this context (checked by the
    // caller); the pool keeps it allocated while work on the stream may use it.
    unsafe { cu::memset_d8_async(dst, value, bytes, stream.0) }
}

/// Page-locked host memory, for staging host-to-device copies.
pub(crate) struct Pinned {
    ptr: *mut c_void,
    pub(crate) len: usize,
}

// SAFETY: plain host memory; access is serialized by the owner's mutex.
unsafe impl Send for Pinned {}

impl Pinned {
    /// `len` bytes of pinned memory.
    pub(crate) fn new(ctx: &Context, len: usize) -> Result<Pinned, DriverError> {
        ctx.bind()?;
        // SAFETY: allocates host memory; it is only written as bytes, so its initial
        // contents do not matter.
        let ptr = unsafe { cu::malloc_host(len, 0) }?;
        Ok(Pinned { ptr, len })
    }

    /// Copies `data` to the start of the buffer; `data` fits. The caller has waited for any
    /// copy still reading the buffer.
    pub(crate) fn fill(&mut self, data: &[u8]) {
        let len = data.len().min(self.len);
        // SAFETY: `ptr..+self.len` is this allocation, exclusively borrowed through
        // `&mut self`, and no queued copy still reads it (the caller's contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<u8>(), self.len) };
        dst[..len].copy_from_slice(&data[..len]);
    }

    /// Frees the memory, with its context bound; no copy may still read it.
    pub(crate) fn free(&mut self, ctx: &Context) {
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: allocated by `malloc_host`, freed once (the pointer is cleared).
        let result = ctx.bind().and_then(|()| unsafe { cu::free_host(self.ptr) });
        if let Err(e) = result {
            tracing::warn!("tessel-cuda: freeing pinned memory failed: {e}");
        }
        self.ptr = std::ptr::null_mut();
    }
}

/// A loaded module and its one kernel function.
pub(crate) struct Module {
    handle: sys::CUmodule,
    function: sys::CUfunction,
    ctx: sys::CUcontext,
}

// SAFETY: modules and functions may be used from any thread with their context current.
unsafe impl Send for Module {}
// SAFETY: launching one function from several threads at once is allowed by the driver.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a CUBIN image and looks up `entry` in it.
    pub(crate) fn load(ctx: &Context, image: &[u8], entry: &str) -> Result<Module, String> {
        ctx.bind().map_err(|e| e.to_string())?;
        let entry = CString::new(entry).map_err(|e| e.to_string())?;
        // `cuModuleLoadData` finds the image's length from its ELF header; copying it into
        // a buffer aligned for that header costs little next to the load.
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        for (word, chunk) in aligned.iter_mut().zip(image.chunks(8)) {
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(bytes);
        }
        if image.len() < 64 || !image.starts_with(b"\x7fELF") {
            return Err("the CUBIN image is not an ELF file".into());
        }
        // SAFETY: `aligned` holds a complete ELF image (checked header magic; NVRTC wrote
        // it, or the disk cache returned what NVRTC wrote) and outlives the call.
        let module = unsafe { cu::module::load_data(aligned.as_ptr().cast()) }
            .map_err(|e| format!("cuModuleLoadData failed: {e}"))?;
        // SAFETY: `module` was just loaded.
        match unsafe { cu::module::get_function(module, entry) } {
            Ok(function) => Ok(Module {
                handle: module,
                function,
                ctx: ctx.ctx,
            }),
            Err(e) => {
                // SAFETY: unloads the module loaded above, once.
                let _ = unsafe { cu::module::unload(module) };
                Err(format!("cuModuleGetFunction failed: {e}"))
            }
        }
    }

    /// The most threads per block this kernel can run with (registers may limit it below
    /// the device's limit).
    pub(crate) fn max_threads_per_block(&self) -> Result<i32, DriverError> {
        // SAFETY: the function belongs to this live module.
        unsafe {
            cu::function::get_function_attribute(
                self.function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            )
        }
    }

    /// Lets the kernel launch with up to `bytes` of dynamic shared memory (past the 48 KiB
    /// every kernel may use); fails where the device has less.
    pub(crate) fn allow_shared(&self, bytes: u32) -> Result<(), DriverError> {
        let bytes = i32::try_from(bytes).unwrap_or(i32::MAX);
        // SAFETY: the function belongs to this live module; the attribute takes an `int`.
        unsafe {
            cu::function::set_function_attribute(
                self.function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
        }
    }

    /// Queues the kernel on `stream` with `grid` blocks of `block` threads and `shared`
    /// bytes of dynamic shared memory. `args` holds one slot per kernel parameter, in order,
    /// each holding the parameter's value in its first bytes (a device pointer, or a dim in
    /// its dtype).
    pub(crate) fn launch(
        &self,
        ctx: &Context,
        stream: &Stream,
        [grid, block]: [[u32; 3]; 2],
        shared: u32,
        args: &mut [ArgSlot],
    ) -> Result<(), DriverError> {
        ctx.bind()?;
        let mut params: Vec<*mut c_void> = args
            .iter_mut()
            .map(|slot| slot.0.as_mut_ptr().cast::<c_void>())
            .collect();
        // SAFETY: the function was compiled from source whose parameters are exactly
        // `args` in order (the emitter writes one parameter per IR parameter, `mma.cu` has
        // the parameters `MatmulProgram::launch_generated` fills, and the caller fills one
        // slot per parameter with a value of that parameter's size); the driver copies the
        // values before returning. Every device pointer is a live allocation at least as
        // large as the kernel reads or writes through it (checked by
        // `LaunchArgs::evaluate`, or for matmuls by `matmul::plan`), and the pool keeps it
        // allocated until work queued on this stream before its reuse is done. `shared`
        // was allowed by `allow_shared` where it exceeds the default.
        unsafe {
            cu::launch_kernel(
                self.function,
                (grid[0], grid[1], grid[2]),
                (block[0], block[1], block[2]),
                shared,
                stream.0,
                &mut params,
            )
        }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the context outlives every module (the backend drops programs and its
        // module cache before its devices); the module is unloaded once.
        let result = unsafe {
            cu::ctx::set_current(self.ctx).and_then(|()| cu::module::unload(self.handle))
        };
        if let Err(e) = result {
            tracing::debug!("tessel-cuda: unloading a module failed: {e}");
        }
    }
}

/// One kernel argument: up to 8 bytes, aligned for any parameter type.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(8))]
pub(crate) struct ArgSlot(pub(crate) [u8; 8]);

/// A timing event.
pub(crate) struct Event(sys::CUevent);

// SAFETY: events may be used from any thread with their context current.
unsafe impl Send for Event {}

impl Event {
    /// A new event in `ctx`, with timing when `timing` holds.
    pub(crate) fn new(ctx: &Context, timing: bool) -> Result<Event, DriverError> {
        ctx.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        cu::event::create(flags).map(Event)
    }

    /// Records the event at the current end of `stream`.
    pub(crate) fn record(&self, ctx: &Context, stream: &Stream) -> Result<(), DriverError> {
        ctx.bind()?;
        // SAFETY: both handles are live and belong to `ctx`.
        unsafe { cu::event::record(self.0, stream.0) }
    }

    /// Waits until the work before the event's record is done.
    pub(crate) fn synchronize(&self, ctx: &Context) -> Result<(), DriverError> {
        ctx.bind()?;
        // SAFETY: the event is live.
        unsafe { cu::event::synchronize(self.0) }
    }

    /// Whether the work before the event's record is done (without waiting).
    pub(crate) fn is_done(&self, ctx: &Context) -> Result<bool, DriverError> {
        ctx.bind()?;
        // SAFETY: the event is live.
        match unsafe { cu::event::query(self.0) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Milliseconds from `self` to `end`, both recorded and complete.
    pub(crate) fn elapsed_ms(&self, ctx: &Context, end: &Event) -> Result<f32, DriverError> {
        ctx.bind()?;
        // SAFETY: both events are live timing events of one context.
        unsafe { cu::event::elapsed(self.0, end.0) }
    }

    /// Destroys the event with its context bound.
    pub(crate) fn destroy(self, ctx: &Context) {
        // SAFETY: the event is live and destroyed once (`self` is consumed).
        let result = ctx
            .bind()
            .and_then(|()| unsafe { cu::event::destroy(self.0) });
        if let Err(e) = result {
            tracing::debug!("tessel-cuda: destroying an event failed: {e}");
        }
    }
}

/// Whether NVRTC can be loaded by its usual names through the loader path.
pub(crate) fn nvrtc_on_loader_path() -> bool {
    // SAFETY: dlopens and closes NVRTC by name; its initializers are side-effect free.
    unsafe { nvsys::is_culib_present() }
}

/// Opens a shared library by absolute path, globally, so that a later `dlopen` of its
/// soname (cudarc's, or NVRTC's own of its builtins) finds it.
pub(crate) fn open_library(path: &Path) -> Result<libloading::Library, String> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        // SAFETY: opening NVRTC or its builtins runs their initializers, which only set up
        // their own state; the handle is kept for the whole process, so nothing from it
        // is ever unloaded while in use.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
            .map(Into::into)
            .map_err(|e| e.to_string())
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above.
        unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())
    }
}

/// NVRTC's version, `(major, minor)`.
pub(crate) fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: writes two ints through valid pointers; NVRTC was found before this is called.
    unsafe { nvsys::nvrtcVersion(&raw mut major, &raw mut minor) }
        .result()
        .map_err(|e| e.to_string())?;
    Ok((major, minor))
}

/// What NVRTC made of a source.
pub(crate) struct Compiled {
    /// The CUBIN image, or the failure.
    pub(crate) cubin: Result<Vec<u8>, String>,
    /// NVRTC's log (warnings on success, errors on failure).
    pub(crate) log: String,
}

/// Compiles `source` (named `name` in diagnostics) to CUBIN with `options`.
pub(crate) fn nvrtc_compile(source: &str, name: &str, options: &[String]) -> Compiled {
    let fail = |why: String| Compiled {
        cubin: Err(why),
        log: String::new(),
    };
    let (Ok(src), Ok(name)) = (CString::new(source), CString::new(format!("{name}.cu"))) else {
        return fail("the source or the kernel name contains a NUL byte".into());
    };
    if options.iter().any(|o| o.contains('\0')) {
        return fail("an NVRTC option contains a NUL byte".into());
    }
    let prog = match nv::create_program(&src, Some(&name)) {
        Ok(prog) => prog,
        Err(e) => return fail(format!("nvrtcCreateProgram failed: {e}")),
    };
    // SAFETY: `prog` is live until destroyed at the end of this block; `src` and `name`
    // outlive it. The options contain no NUL (checked above), so cudarc's conversion of
    // them does not panic.
    unsafe {
        let compiled = nv::compile_program(prog, options);
        let log = nv::get_program_log(prog)
            .map(|chars| c_chars_to_string(&chars))
            .unwrap_or_default();
        let cubin = match compiled {
            Err(e) => Err(format!("nvrtcCompileProgram failed: {e}")),
            Ok(()) => get_cubin(prog),
        };
        if let Err(e) = nv::destroy_program(prog) {
            tracing::debug!("tessel-cuda: nvrtcDestroyProgram failed: {e}");
        }
        Compiled { cubin, log }
    }
}

/// The CUBIN of a compiled program.
///
/// # Safety
/// `prog` is a live, successfully compiled program.
unsafe fn get_cubin(prog: nvsys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: `prog` is live and compiled (the caller's contract); writes one `usize`.
    unsafe { nvsys::nvrtcGetCUBINSize(prog, &raw mut size) }
        .result()
        .map_err(|e| format!("nvrtcGetCUBINSize failed: {e}"))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the size NVRTC reported.
    unsafe { nvsys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| format!("nvrtcGetCUBIN failed: {e}"))?;
    Ok(cubin)
}

/// A NUL-terminated C string's bytes as text.
fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_owned()
}

/// Whether a driver error means memory ran out.
pub(crate) fn is_out_of_memory(e: DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// Starts recording `stream`: until [`end_capture`], work queued on it is added to a graph
/// instead of running. Relaxed mode: other threads may make calls the global mode forbids
/// while a capture is open (allocating, loading modules), since none of them touches this
/// stream (the caller holds the device's submission gate).
pub(crate) fn begin_capture(ctx: &Context, stream: &Stream) -> Result<(), DriverError> {
    ctx.bind()?;
    // SAFETY: the stream is live and not capturing (captures are serialized by the gate).
    unsafe {
        cu::stream::begin_capture(
            stream.0,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    }
}

/// Ends the capture [`begin_capture`] opened on `stream`: the graph of what was queued, or
/// the error that invalidated the capture. The stream runs work again either way.
pub(crate) fn end_capture(ctx: &Context, stream: &Stream) -> Result<Graph, DriverError> {
    ctx.bind()?;
    // SAFETY: the stream is live and capturing; on success the graph is new and owned here.
    unsafe { cu::stream::end_capture(stream.0) }.map(Graph)
}

/// A graph recorded from a stream, not yet instantiated.
pub(crate) struct Graph(sys::CUgraph);

impl Drop for Graph {
    fn drop(&mut self) {
        if self.0.is_null() {
            return;
        }
        // SAFETY: the graph is live and destroyed once; an executable graph made from it
        // does not depend on it.
        if let Err(e) = unsafe { cu::graph::destroy(self.0) } {
            tracing::debug!("tessel-cuda: destroying a graph failed: {e}");
        }
    }
}

/// An executable graph: recorded launches replayed with one `cuGraphLaunch`.
pub(crate) struct GraphExec {
    exec: sys::CUgraphExec,
    ctx: sys::CUcontext,
}

// SAFETY: executable graphs may be launched and destroyed from any thread with their
// context current.
unsafe impl Send for GraphExec {}
// SAFETY: the driver orders concurrent launches of one executable graph (each launch runs
// after the previous one).
unsafe impl Sync for GraphExec {}

impl GraphExec {
    /// Instantiates `graph` in `ctx`.
    pub(crate) fn new(ctx: &Context, graph: &Graph) -> Result<GraphExec, DriverError> {
        ctx.bind()?;
        // SAFETY: the graph is live; the executable copies what it needs from it.
        let exec = unsafe { cu::graph::instantiate(graph.0, sys::CUgraphInstantiate_flags(0)) }?;
        Ok(GraphExec { exec, ctx: ctx.ctx })
    }

    /// Queues the recorded work on `stream`.
    pub(crate) fn launch(&self, ctx: &Context, stream: &Stream) -> Result<(), DriverError> {
        ctx.bind()?;
        // SAFETY: both are live and belong to `ctx`. The recorded launches name device
        // pointers that the owner keeps allocated for every replay (it replays only with
        // the very buffers it recorded, and holds any scratch memory the recording used)
        // and functions whose modules it keeps loaded.
        unsafe { cu::graph::launch(self.exec, stream.0) }
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: the context outlives the backend's graphs (dropped with its devices'
        // state, before the contexts); the executable is destroyed once, and one still
        // running is freed by the driver when it completes.
        let result = unsafe {
            cu::ctx::set_current(self.ctx).and_then(|()| cu::graph::exec_destroy(self.exec))
        };
        if let Err(e) = result {
            tracing::debug!("tessel-cuda: destroying an executable graph failed: {e}");
        }
    }
}
