//! Running a kernel: checking a launch's arguments, and calling the compiled entry point
//! on the worker threads.

use std::ffi::c_void;
use std::ptr;

use rayon::ThreadPool;
use rayon::prelude::*;
use tessel_ir::{BackendError, BufferId, Kernel, Param};
use tessel_shape::{Bindings, DType, Expr};

/// The stack of each worker thread. Generated code keeps a workgroup's local memory, and
/// the per-invocation arrays that carry values across barriers, on the stack.
pub(crate) const STACK_BYTES: usize = 16 << 20;

/// The C signature of a [`Launch::Serial`](tessel_ir::codegen::Launch::Serial) kernel:
/// `(bufs, dims, grid, group_begin, group_end)`.
pub(crate) type KernelFn =
    unsafe extern "C" fn(*const *mut c_void, *const i64, *const i64, i64, i64);

/// A launch's arguments, evaluated with its bindings and checked against the buffers.
#[derive(Debug)]
pub(crate) struct Args {
    /// `groups[0..3]` then `local[0..3]`.
    pub(crate) grid: [i64; 6],
    /// The values of the kernel's `Param::Dim`s, in parameter order.
    pub(crate) dims: Vec<i64>,
    /// The number of workgroups.
    pub(crate) groups: i64,
}

fn invalid(kernel: &Kernel, reason: impl std::fmt::Display) -> BackendError {
    BackendError::InvalidArgument(format!("kernel `{}`: {reason}", kernel.name))
}

/// Evaluates the grid and dims and checks every buffer: `sizes[j]` is the size in bytes of
/// the buffer bound to the `j`-th buffer parameter, `ids[j]` its id.
pub(crate) fn evaluate(
    kernel: &Kernel,
    ids: &[BufferId],
    sizes: &[usize],
    bindings: &Bindings,
) -> Result<Args, BackendError> {
    let eval = |what: &str, e: Expr| {
        e.eval(bindings)
            .map_err(|err| invalid(kernel, format!("cannot evaluate {what} `{e}`: {err}")))
    };
    let mut grid = [0i64; 6];
    let axes = kernel.grid.groups.iter().chain(&kernel.grid.local);
    for (k, dim) in axes.enumerate() {
        let what = if k < 3 {
            format!("the workgroup count along axis {k}")
        } else {
            format!("the local size along axis {}", k - 3)
        };
        let value = eval(&what, *dim)?;
        if value < 0 {
            return Err(invalid(
                kernel,
                format!("{what} `{dim}` is {value}, which is negative"),
            ));
        }
        grid[k] = value;
    }
    let groups = grid[..3]
        .iter()
        .try_fold(1i64, |acc, &g| acc.checked_mul(g))
        .ok_or_else(|| {
            invalid(
                kernel,
                format!("the workgroup count {:?} overflows i64", &grid[..3]),
            )
        })?;

    let mut dims = Vec::new();
    let mut buffer = 0;
    for (p, param) in kernel.params.iter().enumerate() {
        match param {
            Param::Dim { var, dtype } => {
                let value = eval(&format!("dim parameter {p}"), Expr::from(*var))?;
                if !fits(value, *dtype) {
                    return Err(invalid(
                        kernel,
                        format!("dim `{var}` = {value} does not fit its parameter's dtype {dtype}"),
                    ));
                }
                dims.push(value);
            }
            Param::Buffer {
                name, dtype, len, ..
            } => {
                let (Some(&id), Some(&size)) = (ids.get(buffer), sizes.get(buffer)) else {
                    return Err(buffer_count(kernel, ids.len()));
                };
                buffer += 1;
                let elements = eval(&format!("the length of buffer `{name}`"), *len)?;
                let needed = usize::try_from(elements)
                    .ok()
                    .and_then(|n| n.checked_mul(dtype.size_bytes()))
                    .ok_or_else(|| {
                        invalid(
                            kernel,
                            format!("buffer `{name}` has an unusable length {elements}"),
                        )
                    })?;
                if size < needed {
                    return Err(invalid(
                        kernel,
                        format!(
                            "buffer `{name}` (parameter {p}) needs {elements} elements of {dtype} = \
                             {needed} bytes, but buffer {} has {size} bytes",
                            id.0
                        ),
                    ));
                }
            }
        }
    }
    if buffer != ids.len() {
        return Err(buffer_count(kernel, ids.len()));
    }
    Ok(Args { grid, dims, groups })
}

fn buffer_count(kernel: &Kernel, passed: usize) -> BackendError {
    let expected = kernel
        .params
        .iter()
        .filter(|p| matches!(p, Param::Buffer { .. }))
        .count();
    invalid(
        kernel,
        format!(
            "takes {expected} buffers (one per buffer parameter, in order), but {passed} were passed"
        ),
    )
}

/// Whether `value` is representable in the integer `dtype`.
fn fits(value: i64, dtype: DType) -> bool {
    match dtype {
        // `to_i64` of u64::MAX wraps, but every non-negative i64 fits a u64.
        DType::U64 => value >= 0,
        _ => dtype.min_value().to_i64() <= value && value <= dtype.max_value().to_i64(),
    }
}

/// Runs `entry` over every workgroup of `args`, split into contiguous ranges across `pool`.
///
/// `addrs[j]` is the address of the storage of the buffer bound to the `j`-th buffer
/// parameter. Addresses (with exposed provenance) rather than pointers cross the threads,
/// since raw pointers are not `Send`; each task turns them back into pointers.
pub(crate) fn run(
    pool: &ThreadPool,
    threads: usize,
    entry: KernelFn,
    addrs: &[usize],
    args: &Args,
) {
    if args.groups == 0 {
        return;
    }
    // A few ranges per thread, so that a slow range (a busy core) is balanced by stealing.
    let total = args.groups;
    let chunks = total.min(i64::try_from(threads.max(1) * 4).unwrap_or(i64::MAX));
    // `total * c / chunks` in i128 cannot overflow.
    let bound = |c: i64| (i128::from(total) * i128::from(c) / i128::from(chunks)) as i64;
    pool.install(|| {
        (0..chunks).into_par_iter().for_each(|c| {
            let bufs: Vec<*mut c_void> = addrs
                .iter()
                .map(|&a| ptr::with_exposed_provenance_mut(a))
                .collect();
            // SAFETY: `entry` is the function `codegen::render` emitted for this kernel with
            // the `Launch::Serial` signature `KernelFn` spells, from a library that the
            // caller keeps loaded for the whole call. `bufs` holds one pointer per buffer
            // parameter, each to storage of at least the parameter's declared length
            // (`evaluate` checked), locked by the caller for the whole call: exclusively
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
        });
    });
}
