//! Every `unsafe` call this crate makes, in one place: creating buffers, transfers, kernel
//! arguments and kernel launches.
//!
//! `opencl3` marks these calls unsafe because the driver reads or writes through raw
//! pointers and sizes the caller vouches for; each function here takes safe Rust values
//! (slices, owned `opencl3` objects) and establishes those conditions itself. Transfers use
//! the raw `cl3` entry points that `opencl3` re-exports, since its typed wrappers want
//! `&mut Buffer` for what is, to OpenCL, a shared handle on an internally synchronized
//! object.
//!
//! [`Handle`] wraps the objects created per operation (buffers, events, kernel objects):
//! `opencl3`'s own `Drop` panics when the driver fails to release one, and a backend must
//! not panic on a driver failure, so their release is checked here and logged instead.
//! Programs, contexts and queues keep `opencl3`'s `Drop`: they hold more than a handle (a
//! `ManuallyDrop` would leak it), and are released only when a program leaves the cache or
//! the backend is dropped.
//!
//! [`Queue`]s are finished when the process exits ([`finish_queues_at_exit`]): PoCL compiles
//! a kernel's work-group function on its worker threads when a launch runs, and a process
//! that exits with launches in flight tears LLVM down under those threads (a segfault after
//! `main` returned).

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::ptr;
use std::sync::{Mutex, PoisonError};

use opencl3::command_queue::{
    CommandQueue, enqueue_copy_buffer, enqueue_fill_buffer, enqueue_nd_range_kernel,
    enqueue_read_buffer, enqueue_write_buffer, finish,
};
use opencl3::context::Context;
use opencl3::error_codes::ClError;
use opencl3::event::{Event, release_event};
use opencl3::kernel::{Kernel, release_kernel, set_kernel_arg};
use opencl3::memory::{Buffer, CL_MEM_READ_WRITE, ClMem, release_mem_object};
use opencl3::types::{CL_BLOCKING, cl_command_queue, cl_int, cl_mem, cl_uint};

/// An `opencl3` object that only holds a driver handle, released without panicking.
pub(crate) trait Release {
    /// What the object is, for the log.
    const WHAT: &'static str;

    /// Releases the driver object.
    ///
    /// # Safety
    ///
    /// Called once, after which the object is never used (nor dropped: that would release
    /// it again).
    unsafe fn release(&self) -> Result<(), cl_int>;
}

impl Release for Buffer<u8> {
    const WHAT: &'static str = "buffer";

    unsafe fn release(&self) -> Result<(), cl_int> {
        // SAFETY: the caller's contract: this is the last use of the handle.
        unsafe { release_mem_object(self.get()) }
    }
}

impl Release for Event {
    const WHAT: &'static str = "event";

    unsafe fn release(&self) -> Result<(), cl_int> {
        // SAFETY: the caller's contract: this is the last use of the handle.
        unsafe { release_event(self.get()) }
    }
}

impl Release for Kernel {
    const WHAT: &'static str = "kernel object";

    unsafe fn release(&self) -> Result<(), cl_int> {
        // SAFETY: the caller's contract: this is the last use of the handle.
        unsafe { release_kernel(self.get()) }
    }
}

/// Owns an `opencl3` object and releases it on drop, logging a failure rather than
/// panicking as the object's own `Drop` would.
pub(crate) struct Handle<T: Release>(ManuallyDrop<T>);

impl<T: Release> Handle<T> {
    pub(crate) fn new(object: T) -> Self {
        Handle(ManuallyDrop::new(object))
    }
}

impl<T: Release> Deref for Handle<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Release> Drop for Handle<T> {
    fn drop(&mut self) {
        // SAFETY: this is the object's last use: it is never dropped (it is in a
        // `ManuallyDrop`, and holds nothing but the handle, so nothing leaks).
        if let Err(code) = unsafe { self.0.release() } {
            tracing::warn!(
                "tessel-opencl: releasing a{} {} failed: {}",
                if T::WHAT.starts_with(['a', 'e', 'i', 'o', 'u']) {
                    "n"
                } else {
                    ""
                },
                T::WHAT,
                ClError(code)
            );
        }
    }
}

/// The handles (as addresses) of the queues not yet released, finished at process exit.
static LIVE_QUEUES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

unsafe extern "C" {
    /// The C library's exit hook.
    fn atexit(handler: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn finish_live_queues() {
    let queues = LIVE_QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
    for &queue in queues.iter() {
        // Errors are moot while the process exits.
        let _ = finish(queue as cl_command_queue);
    }
}

/// Has every live queue finished when the process exits, before the destructors of the
/// driver's statics built so far run: exit handlers run in reverse order of registration,
/// and a driver registers the destructor of a static when it first uses it (LLVM does so
/// inside its first compile), so this is called again after each program's first launch.
pub(crate) fn finish_queues_at_exit() {
    // SAFETY: `finish_live_queues` is a plain `extern "C"` function that never unwinds (it
    // takes a poisoned lock as is, and ignores errors).
    if unsafe { atexit(finish_live_queues) } != 0 {
        tracing::warn!("tessel-opencl: cannot register the exit hook that finishes queues");
    }
}

/// A device's command queue, finished when the process exits with commands in it.
pub(crate) struct Queue(CommandQueue);

impl Queue {
    /// Takes `queue` into the set finished at exit, and registers the exit hook after the
    /// driver that created `queue` was loaded.
    pub(crate) fn new(queue: CommandQueue) -> Self {
        finish_queues_at_exit();
        LIVE_QUEUES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(queue.get() as usize);
        Queue(queue)
    }
}

impl Deref for Queue {
    type Target = CommandQueue;

    fn deref(&self) -> &CommandQueue {
        &self.0
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // Out of the set before `CommandQueue`'s own drop releases the handle.
        let handle = self.0.get() as usize;
        LIVE_QUEUES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&q| q != handle);
    }
}

/// A new device buffer of `bytes` bytes (at least 1), contents unspecified.
pub(crate) fn create_buffer(
    context: &Context,
    bytes: usize,
) -> Result<Handle<Buffer<u8>>, ClError> {
    // SAFETY: no host pointer is passed (and no flag asks to use one), so the driver
    // allocates the storage itself; `bytes` is the size of `u8` elements, so no overflow.
    let buffer =
        unsafe { Buffer::<u8>::create(context, CL_MEM_READ_WRITE, bytes, ptr::null_mut()) }?;
    Ok(Handle::new(buffer))
}

/// Copies `data` into `buffer` at byte `offset`; returns when `data` may be reused.
///
/// The caller checked `offset + data.len()` against the buffer's size.
pub(crate) fn write(
    queue: &CommandQueue,
    buffer: &Buffer<u8>,
    offset: usize,
    data: &[u8],
) -> Result<(), ClError> {
    // SAFETY: the write is blocking, so the driver is done reading `data` (valid for
    // `data.len()` bytes for the whole call) when this returns; the range lies within the
    // buffer (the caller checked it; the driver checks it again). No wait list is passed.
    let event = unsafe {
        enqueue_write_buffer(
            queue.get(),
            buffer.get(),
            CL_BLOCKING,
            offset,
            data.len(),
            data.as_ptr().cast::<c_void>(),
            0,
            ptr::null(),
        )
    }?;
    drop(Handle::new(Event::new(event)));
    Ok(())
}

/// Fills `out` from `buffer` at byte `offset`, after all work queued before it.
///
/// The caller checked `offset + out.len()` against the buffer's size.
pub(crate) fn read(
    queue: &CommandQueue,
    buffer: &Buffer<u8>,
    offset: usize,
    out: &mut [u8],
) -> Result<(), ClError> {
    // SAFETY: the read is blocking, so the driver has finished writing `out` (valid and
    // exclusively borrowed for `out.len()` bytes) when this returns; the range lies within
    // the buffer. No wait list is passed.
    let event = unsafe {
        enqueue_read_buffer(
            queue.get(),
            buffer.get(),
            CL_BLOCKING,
            offset,
            out.len(),
            out.as_mut_ptr().cast::<c_void>(),
            0,
            ptr::null(),
        )
    }?;
    drop(Handle::new(Event::new(event)));
    Ok(())
}

/// Queues a copy of the first `bytes` of `src` into `dst` (distinct buffers of the queue's
/// context); returns without waiting.
pub(crate) fn copy(
    queue: &CommandQueue,
    src: &Buffer<u8>,
    dst: &Buffer<u8>,
    bytes: usize,
) -> Result<(), ClError> {
    // SAFETY: both handles are live buffers of the queue's context, at least `bytes` long
    // (the caller checked) and distinct, so the regions cannot overlap. The command keeps
    // its own references to the buffers, so it may outlive them. No wait list is passed.
    let event = unsafe {
        enqueue_copy_buffer(
            queue.get(),
            src.get(),
            dst.get(),
            0,
            0,
            bytes,
            0,
            ptr::null(),
        )
    }?;
    drop(Handle::new(Event::new(event)));
    Ok(())
}

/// Queues setting the first `bytes` of `buffer` (a buffer of the queue's context) to
/// `value`; returns without waiting.
pub(crate) fn fill(
    queue: &CommandQueue,
    buffer: &Buffer<u8>,
    value: u8,
    bytes: usize,
) -> Result<(), ClError> {
    // SAFETY: the handle is a live buffer of the queue's context at least `bytes` long (the
    // caller checked); the one-byte pattern is read before the call returns (OpenCL 1.2,
    // 5.2.2), and the command keeps its own reference to the buffer. No wait list.
    let event = unsafe {
        enqueue_fill_buffer(
            queue.get(),
            buffer.get(),
            ptr::from_ref(&value).cast::<c_void>(),
            1,
            0,
            bytes,
            0,
            ptr::null(),
        )
    }?;
    drop(Handle::new(Event::new(event)));
    Ok(())
}

/// One kernel argument.
pub(crate) enum Arg<'a> {
    /// A `__global` buffer.
    Buffer(&'a Buffer<u8>),
    /// A scalar, as the bytes of its value in host order (1, 2, 4 or 8 of them).
    Scalar(&'a [u8]),
}

/// Sets `kernel`'s arguments and queues it over `global` work-items in workgroups of
/// `local`; returns the launch's event without waiting.
///
/// The caller holds `kernel` exclusively (setting arguments and enqueueing must not
/// interleave with another launch of the same kernel object), passes one argument per
/// kernel parameter of the matching kind and size (the kernel was generated from the IR
/// whose parameters the arguments were checked against), every buffer at least as large as
/// the kernel accesses, and `global` a multiple of `local` on each axis.
pub(crate) fn launch(
    queue: &CommandQueue,
    kernel: &Kernel,
    args: &[Arg<'_>],
    global: [usize; 3],
    local: [usize; 3],
) -> Result<Handle<Event>, ClError> {
    for (index, arg) in args.iter().enumerate() {
        let index = cl_uint::try_from(index)
            .map_err(|_| ClError(opencl3::error_codes::CL_INVALID_ARG_INDEX))?;
        match *arg {
            Arg::Buffer(buffer) => {
                let mem: cl_mem = buffer.get();
                // SAFETY: a buffer argument is set from a `cl_mem` handle, read by the
                // driver for `size_of::<cl_mem>()` bytes during the call; the handle is a
                // live buffer of the kernel's context.
                unsafe {
                    set_kernel_arg(
                        kernel.get(),
                        index,
                        size_of::<cl_mem>(),
                        (&raw const mem).cast::<c_void>(),
                    )
                }?;
            }
            Arg::Scalar(bytes) => {
                // SAFETY: `bytes` is valid for `bytes.len()` bytes during the call, and its
                // length is the size of the parameter's OpenCL type.
                unsafe {
                    set_kernel_arg(
                        kernel.get(),
                        index,
                        bytes.len(),
                        bytes.as_ptr().cast::<c_void>(),
                    )
                }?;
            }
        }
    }
    // SAFETY: every argument is set (above); `global` and `local` are arrays of
    // `work_dim = 3` sizes, read during the call; no offset and no wait list are passed.
    // The queued command holds its own references to the kernel and its buffer arguments,
    // so they may be released before it runs.
    let event = unsafe {
        enqueue_nd_range_kernel(
            queue.get(),
            kernel.get(),
            3,
            ptr::null(),
            global.as_ptr(),
            local.as_ptr(),
            0,
            ptr::null(),
        )
    }?;
    Ok(Handle::new(Event::new(event)))
}
