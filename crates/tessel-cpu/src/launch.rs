//! Running a kernel: calling the compiled entry point on the worker threads, with
//! arguments [`LaunchArgs::evaluate`] checked.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rayon::ThreadPool;
use rayon::prelude::*;
use tessel_ir::LaunchArgs;

/// The stack of each worker thread. Generated code keeps a workgroup's local memory, and
/// the per-invocation arrays that carry values across barriers, on the stack.
pub(crate) const STACK_BYTES: usize = 16 << 20;

/// The C signature of a [`Launch::Serial`](tessel_ir::codegen::Launch::Serial) kernel:
/// `(bufs, dims, grid, group_begin, group_end)`.
pub(crate) type KernelFn =
    unsafe extern "C" fn(*const *mut c_void, *const i64, *const i64, i64, i64);

/// Runs `entry` over every workgroup of `args`, split into contiguous ranges across `pool`.
/// With a `deadline`, the ranges are smaller and those not started by then are skipped:
/// returns whether every workgroup ran.
///
/// `addrs[j]` is the address of the storage of the buffer bound to the `j`-th buffer
/// parameter. Addresses (with exposed provenance) rather than pointers cross the threads,
/// since raw pointers are not `Send`; each task turns them back into pointers.
pub(crate) fn run(
    pool: &ThreadPool,
    threads: usize,
    entry: KernelFn,
    addrs: &[usize],
    args: &LaunchArgs,
    deadline: Option<Instant>,
) -> bool {
    if args.groups == 0 {
        return true;
    }
    // A few ranges per thread, so that a slow range (a busy core) is balanced by stealing;
    // many more under a deadline, so that giving up comes soon after it.
    let total = args.groups;
    let per_thread = if deadline.is_some() { 64 } else { 4 };
    let chunks = total.min(i64::try_from(threads.max(1) * per_thread).unwrap_or(i64::MAX));
    let skipped = AtomicBool::new(false);
    // `total * c / chunks` in i128 cannot overflow.
    let bound = |c: i64| (i128::from(total) * i128::from(c) / i128::from(chunks)) as i64;
    let run_range = |c: i64| {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            skipped.store(true, Ordering::Relaxed);
            return;
        }
        let bufs: Vec<*mut c_void> = addrs
            .iter()
            .map(|&a| ptr::with_exposed_provenance_mut(a))
            .collect();
        // SAFETY: `entry` is the function `codegen::render` emitted for this kernel with
        // the `Launch::Serial` signature `KernelFn` spells, from a library that the
        // caller keeps loaded for the whole call. `bufs` holds one pointer per buffer
        // parameter, each to storage of at least the parameter's declared length
        // (`LaunchArgs::evaluate` checked), locked by the caller for the whole call: exclusively
        // where the kernel may write. `dims` and `grid` have the lengths the signature
        // documents. The ranges are disjoint, and a well-formed kernel's workgroups
        // write disjoint elements, as on any GPU. The kernel stays inside its buffers'
        // declared lengths: the verifier proves it for kernels of constant size, and
        // Tessel's kernel generation guarantees it for symbolic ones (the interpreter
        // checks it, and the tests compare both).
        unsafe {
            entry(
                bufs.as_ptr(),
                args.dims.as_ptr(),
                args.grid.as_ptr(),
                bound(c),
                bound(c + 1),
            );
        }
    };
    // One range (a single workgroup, say) runs on the caller: handing it to the pool costs
    // more than most small kernels take.
    if chunks == 1 {
        run_range(0);
    } else {
        pool.install(|| (0..chunks).into_par_iter().for_each(run_range));
    }
    !skipped.load(Ordering::Relaxed)
}
