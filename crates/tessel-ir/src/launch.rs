//! A launch's arguments, evaluated and checked the same way by every backend.
//!
//! A launch binds a kernel's parameters positionally (see [`crate::backend`]): the grid and
//! the dims are symbolic in the kernel's variables, and each buffer must hold at least its
//! parameter's declared length. [`LaunchArgs::evaluate`] turns the bindings into numbers
//! and rejects a launch that does not fit, with [`BackendError::InvalidArgument`] naming the
//! kernel, the parameter and the sizes, so that no backend hands a kernel too small a
//! buffer.

use tessel_shape::{Bindings, DType, Expr};

use crate::backend::{BackendError, BufferId};
use crate::kernel::{Access, Kernel, Param};

/// A launch's arguments, evaluated with its bindings and checked against its buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchArgs {
    /// `groups[0..3]` then `local[0..3]`, each non-negative.
    pub grid: [i64; 6],
    /// The values of the kernel's `Param::Dim`s, in parameter order, each within its
    /// parameter's dtype.
    pub dims: Vec<i64>,
    /// The number of workgroups: the product of `grid[0..3]`.
    pub groups: i64,
    /// `(j, bytes)`: the `j`-th buffer is an [`Access::Accumulate`] parameter, whose first
    /// `bytes` the backend must zero before the kernel runs (every launch, timed ones
    /// included).
    pub zeroed: Vec<(usize, usize)>,
}

impl LaunchArgs {
    /// Evaluates the grid and dims of `kernel` with `bindings`, and checks every buffer:
    /// `ids[j]` and `sizes[j]` (in bytes) are the buffer bound to the `j`-th buffer
    /// parameter. Fails when a variable is unbound, a grid size is negative, a dim does
    /// not fit its dtype, the number of buffers is wrong, or a buffer is too small.
    pub fn evaluate(
        kernel: &Kernel,
        ids: &[BufferId],
        sizes: &[usize],
        bindings: &Bindings,
    ) -> Result<LaunchArgs, BackendError> {
        // What an expression is, for error messages: only formatted when one fails, since
        // this runs on every launch.
        let eval = |what: &dyn Fn() -> String, e: Expr| {
            e.eval(bindings)
                .map_err(|err| invalid(kernel, format!("cannot evaluate {} `{e}`: {err}", what())))
        };
        let mut grid = [0i64; 6];
        let axes = kernel.grid.groups.iter().chain(&kernel.grid.local);
        for (k, dim) in axes.enumerate() {
            let what = || {
                if k < 3 {
                    format!("the workgroup count along axis {k}")
                } else {
                    format!("the local size along axis {}", k - 3)
                }
            };
            let value = eval(&what, *dim)?;
            if value < 0 {
                return Err(invalid(
                    kernel,
                    format!("{} `{dim}` is {value}, which is negative", what()),
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
        let mut zeroed = Vec::new();
        let mut buffer = 0;
        for (p, param) in kernel.params.iter().enumerate() {
            match param {
                Param::Dim { var, dtype } => {
                    let value = eval(&|| format!("dim parameter {p}"), Expr::from(*var))?;
                    if !fits(value, *dtype) {
                        return Err(invalid(
                            kernel,
                            format!(
                                "dim `{var}` = {value} does not fit its parameter's dtype {dtype}"
                            ),
                        ));
                    }
                    dims.push(value);
                }
                Param::Buffer {
                    name,
                    dtype,
                    len,
                    access,
                } => {
                    let (Some(&id), Some(&size)) = (ids.get(buffer), sizes.get(buffer)) else {
                        return Err(buffer_count(kernel, ids.len()));
                    };
                    buffer += 1;
                    let elements = eval(&|| format!("the length of buffer `{name}`"), *len)?;
                    let needed = usize::try_from(elements)
                        .ok()
                        .and_then(|n| n.checked_mul(dtype.size_bytes()))
                        .ok_or_else(|| {
                            invalid(
                                kernel,
                                format!("buffer `{name}` has an unusable length {elements}"),
                            )
                        })?;
                    if *access == Access::Accumulate {
                        zeroed.push((buffer - 1, needed));
                    }
                    if size < needed {
                        return Err(invalid(
                            kernel,
                            format!(
                                "buffer `{name}` (parameter {p}) needs {elements} elements of \
                                 {dtype} = {needed} bytes, but buffer {} has {size} bytes",
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
        Ok(LaunchArgs {
            grid,
            dims,
            groups,
            zeroed,
        })
    }
}

fn invalid(kernel: &Kernel, reason: impl std::fmt::Display) -> BackendError {
    BackendError::InvalidArgument(format!("kernel `{}`: {reason}", kernel.name))
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

#[cfg(test)]
mod tests {
    use tessel_shape::{Bindings, DType, Var};

    use super::LaunchArgs;
    use crate::backend::{BackendError, BufferId};
    use crate::samples;

    #[test]
    fn evaluates_and_checks() {
        let n = Var::new("n", 1, 1 << 20).unwrap();
        let kernel = samples::dynamic_vector_add(n, 64).unwrap();
        let ids = [BufferId(1), BufferId(2), BufferId(3)];
        let bindings = Bindings::new().with(n, 100);
        let args = LaunchArgs::evaluate(&kernel, &ids, &[400; 3], &bindings).unwrap();
        assert_eq!(args.grid, [2, 1, 1, 64, 1, 1]);
        assert_eq!((args.dims.as_slice(), args.groups), (&[100][..], 2));
        let err = LaunchArgs::evaluate(&kernel, &ids, &[400, 399, 400], &bindings).unwrap_err();
        let BackendError::InvalidArgument(msg) = err else {
            panic!("{err:?}")
        };
        assert!(msg.contains("`b`") && msg.contains("399 bytes"), "{msg}");
        assert!(LaunchArgs::evaluate(&kernel, &ids, &[400; 3], &Bindings::new()).is_err());
        assert!(LaunchArgs::evaluate(&kernel, &ids[..2], &[400; 2], &bindings).is_err());
        let fixed = samples::vector_add(DType::U8, 10, 4).unwrap();
        assert!(LaunchArgs::evaluate(&fixed, &ids, &[10; 3], &Bindings::new()).is_ok());
    }
}
