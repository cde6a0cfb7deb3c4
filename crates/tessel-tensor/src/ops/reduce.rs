//! Reductions: `sum`, `mean`, `prod`, `max`, `min`, `argmax`, `argmin`, `var`, `std`, `any`,
//! `all`, `logsumexp`, `softmax` and `log_softmax`.
//!
//! Every reduction comes in two forms: over listed axes with `keepdim` (`sum(&[0, -1],
//! false)`), and over the whole tensor with an `_all` suffix (`sum_all()`, a 0-d result).
//! Axes are `i64` and may be negative; a 0-d tensor accepts the axis `0` (or `-1`), as in
//! `PyTorch`. An empty axis list reduces nothing (`NumPy`'s `axis=()`), unlike `PyTorch`'s
//! legacy `dim=[]`, which reduces everything: use the `_all` form for that.
//!
//! Result dtypes follow `PyTorch`:
//!
//! | op | input | result |
//! |---|---|---|
//! | `sum`, `prod` | `bool`, integers | `i64` (like `torch.sum(int32)`; `u64` wraps) |
//! | `sum`, `prod` | floats | the input dtype (`f16`/`bf16` accumulate in `f32`) |
//! | `max`, `min` | any | the input dtype |
//! | `argmax`, `argmin` | any | `i64` |
//! | `any`, `all` | any | `bool` |
//! | `mean`, `var`, `std`, `softmax`, `log_softmax` | floats only | the input dtype |
//! | `logsumexp` | any | floats keep theirs; `bool` and integers give `f32` |
//!
//! `f16` and `bf16` inputs of `mean`, `var`, `std`, `logsumexp`, `softmax` and
//! `log_softmax` are computed in `f32` and rounded once at the end.
//!
//! Over an axis of size 0, `sum`, `prod`, `any` and `all` give their identity (0, 1,
//! `false`, `true`), `mean` and `var` NaN, `logsumexp` `-inf`; `max`, `min`, `argmax` and
//! `argmin` have no value there and return an error, as `PyTorch` raises.

use tessel_graph::{Op, ReduceOp};
use tessel_shape::{BinaryOp, DType, Dim, Scalar, Shape, ShapeError, TernaryOp, UnaryOp, rules};

use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

const FLOAT_ONLY: &str =
    "it needs a floating-point input, as in PyTorch; cast first, e.g. .cast(DType::F32)";

/// A checked reduction: the normalized axes (sorted) and the result shapes with the reduced
/// dims kept as 1 and as requested.
struct Plan {
    name: &'static str,
    axes: Vec<usize>,
    kept: Shape,
    out: Shape,
}

impl Tensor {
    // === Sum, product, mean ===

    /// The sum over `axes` (negative axes count from the end), keeping them as size-1 dims
    /// when `keepdim`. `bool` and integer inputs sum as `i64`, like `torch.sum`; a sum over
    /// an empty axis is 0.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [2, 3])?;
    /// let s = t.sum(&[-1], false)?;
    /// assert_eq!(s.dtype(), DType::I64);
    /// assert_eq!(s.to_vec::<i64>()?, vec![6, 15]);
    /// assert_eq!(t.sum(&[0], true)?.dims(), vec![1, 3]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn sum(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        sum_or_prod(self, ReduceOp::Sum, "sum", Some(axes), keepdim)
    }

    /// The sum of every element, as a 0-d tensor (see [`Tensor::sum`] for dtypes).
    pub fn sum_all(&self) -> Result<Tensor> {
        sum_or_prod(self, ReduceOp::Sum, "sum", None, false)
    }

    /// The product over `axes`, with `keepdim` (see [`Tensor::sum`]); a product over an empty
    /// axis is 1. `bool` and integer inputs multiply as `i64`, like `torch.prod`.
    pub fn prod(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        sum_or_prod(self, ReduceOp::Prod, "prod", Some(axes), keepdim)
    }

    /// The product of every element, as a 0-d tensor.
    pub fn prod_all(&self) -> Result<Tensor> {
        sum_or_prod(self, ReduceOp::Prod, "prod", None, false)
    }

    /// The mean over `axes`, with `keepdim`. Floats only, like `torch.mean`: an integer
    /// tensor is an error suggesting `.cast(DType::F32)`. A mean over an empty axis is NaN.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
    /// assert_eq!(t.mean(&[1], false)?.to_vec::<f32>()?, vec![1.5, 3.5]);
    /// assert!(Tensor::from_vec(vec![1i32, 2], [2])?.mean_all().is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn mean(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        mean_impl(self, Some(axes), keepdim)
    }

    /// The mean of every element, as a 0-d tensor (floats only).
    pub fn mean_all(&self) -> Result<Tensor> {
        mean_impl(self, None, false)
    }

    // === Max, min and their indices ===

    /// The maximum over `axes`, with `keepdim`, in the input's dtype — `torch.amax`; for the
    /// indices use [`Tensor::argmax`]. NaN wins, as in `PyTorch`. Reducing an axis of size 0
    /// is an error: an empty maximum has no value.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![3i64, 7, -1, 5], [2, 2])?;
    /// assert_eq!(t.max(&[0], false)?.to_vec::<i64>()?, vec![3, 7]);
    /// assert_eq!(t.max_all()?.item::<i64>()?, 7);
    /// # Ok(())
    /// # }
    /// ```
    pub fn max(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        extremum(self, ReduceOp::Max, "max", Some(axes), keepdim)
    }

    /// The maximum of every element, as a 0-d tensor (an error for an empty tensor).
    pub fn max_all(&self) -> Result<Tensor> {
        extremum(self, ReduceOp::Max, "max", None, false)
    }

    /// The minimum over `axes`, with `keepdim` — `torch.amin` (see [`Tensor::max`]).
    pub fn min(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        extremum(self, ReduceOp::Min, "min", Some(axes), keepdim)
    }

    /// The minimum of every element, as a 0-d tensor (an error for an empty tensor).
    pub fn min_all(&self) -> Result<Tensor> {
        extremum(self, ReduceOp::Min, "min", None, false)
    }

    /// The index of the maximum along `axis`, as `i64`, with `keepdim`. Ties give the first
    /// index and NaN counts as the maximum, as in `torch.argmax`; on `bool` the first `true`
    /// (or 0). An axis of size 0 is an error.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1.0f32, 5.0, 5.0, 2.0, f32::NAN, 0.0], [2, 3])?;
    /// assert_eq!(t.argmax(1, false)?.to_vec::<i64>()?, vec![1, 1]);
    /// assert_eq!(t.argmax_all()?.item::<i64>()?, 4);
    /// # Ok(())
    /// # }
    /// ```
    pub fn argmax(&self, axis: i64, keepdim: bool) -> Result<Tensor> {
        arg_extremum(self, ReduceOp::Max, "argmax", axis, keepdim)
    }

    /// The index of the maximum of the flattened tensor, as a 0-d `i64` tensor.
    pub fn argmax_all(&self) -> Result<Tensor> {
        check_nonempty(self, &plan(self, "argmax", None, false)?)?;
        arg_extremum(&flat(self, "argmax")?, ReduceOp::Max, "argmax", 0, false)
    }

    /// The index of the minimum along `axis`, as `i64`, with `keepdim`: the first on ties,
    /// NaN counts as the minimum (see [`Tensor::argmax`]).
    pub fn argmin(&self, axis: i64, keepdim: bool) -> Result<Tensor> {
        arg_extremum(self, ReduceOp::Min, "argmin", axis, keepdim)
    }

    /// The index of the minimum of the flattened tensor, as a 0-d `i64` tensor.
    pub fn argmin_all(&self) -> Result<Tensor> {
        check_nonempty(self, &plan(self, "argmin", None, false)?)?;
        arg_extremum(&flat(self, "argmin")?, ReduceOp::Min, "argmin", 0, false)
    }

    // === Variance and standard deviation ===

    /// The sample variance over `axes`, with `keepdim`, and Bessel's correction (divides by
    /// `N - 1`), `torch.var`'s default; see [`Tensor::var_correction`] for others. Floats
    /// only. With `N <= 1` the result is NaN or infinite, as in `PyTorch`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [4])?;
    /// assert!((t.var(&[0], false)?.item::<f64>()? - 5.0 / 3.0).abs() < 1e-12);
    /// assert_eq!(t.var_correction(Some(&[0]), 0, false)?.item::<f64>()?, 1.25);
    /// # Ok(())
    /// # }
    /// ```
    pub fn var(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        var_impl(self, "var", Some(axes), 1, keepdim, false)
    }

    /// The sample variance of every element (correction 1), as a 0-d tensor.
    pub fn var_all(&self) -> Result<Tensor> {
        var_impl(self, "var", None, 1, false, false)
    }

    /// The variance over `axes` (every axis for `None`), dividing the sum of squared
    /// deviations by `max(0, N - correction)`: `torch.var(correction=...)`. `correction` 0 is
    /// the population variance.
    pub fn var_correction(
        &self,
        axes: Option<&[i64]>,
        correction: usize,
        keepdim: bool,
    ) -> Result<Tensor> {
        var_impl(self, "var", axes, correction, keepdim, false)
    }

    /// The standard deviation over `axes`, with `keepdim` and correction 1 (`torch.std`):
    /// the square root of [`Tensor::var`]. Floats only.
    pub fn std(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        var_impl(self, "std", Some(axes), 1, keepdim, true)
    }

    /// The standard deviation of every element (correction 1), as a 0-d tensor.
    pub fn std_all(&self) -> Result<Tensor> {
        var_impl(self, "std", None, 1, false, true)
    }

    /// The standard deviation with an explicit `correction` (see [`Tensor::var_correction`]).
    pub fn std_correction(
        &self,
        axes: Option<&[i64]>,
        correction: usize,
        keepdim: bool,
    ) -> Result<Tensor> {
        var_impl(self, "std", axes, correction, keepdim, true)
    }

    // === Logical reductions ===

    /// Whether any element over `axes` is non-zero (`true`), with `keepdim`; a `bool` result
    /// for every dtype (NaN counts as non-zero). `any` over an empty axis is `false`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![0i32, 0, 0, 3], [2, 2])?;
    /// assert_eq!(t.any(&[1], false)?.to_vec::<bool>()?, vec![false, true]);
    /// assert!(!t.all_all()?.item::<bool>()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn any(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        logical(self, ReduceOp::Max, "any", Some(axes), keepdim)
    }

    /// Whether any element is non-zero, as a 0-d `bool` tensor.
    pub fn any_all(&self) -> Result<Tensor> {
        logical(self, ReduceOp::Max, "any", None, false)
    }

    /// Whether every element over `axes` is non-zero, with `keepdim`; `bool` for every
    /// dtype. `all` over an empty axis is `true`.
    pub fn all(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        logical(self, ReduceOp::Min, "all", Some(axes), keepdim)
    }

    /// Whether every element is non-zero, as a 0-d `bool` tensor.
    pub fn all_all(&self) -> Result<Tensor> {
        logical(self, ReduceOp::Min, "all", None, false)
    }

    // === Log-sum-exp and softmax ===

    /// `log(sum(exp(x)))` over `axes`, with `keepdim`, computed stably like
    /// `torch.logsumexp`: the maximum is subtracted first, and an infinite maximum is
    /// replaced by 0 so that all `-inf` gives `-inf` and a `+inf` gives `+inf`. `bool` and
    /// integer inputs give `f32`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1000.0f32, 1000.0], [2])?;
    /// let r = t.logsumexp(&[0], false)?.item::<f32>()?;
    /// assert!((r - (1000.0 + 2f32.ln())).abs() < 1e-3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn logsumexp(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        logsumexp_impl(self, Some(axes), keepdim)
    }

    /// `log(sum(exp(x)))` over every element, as a 0-d tensor.
    pub fn logsumexp_all(&self) -> Result<Tensor> {
        logsumexp_impl(self, None, false)
    }

    /// `exp(x - max) / sum(exp(x - max))` along `axis` (`torch.softmax`). Floats only, like
    /// `PyTorch`. It runs as at most two kernels: one pass computes the maximum and the sum,
    /// the next normalizes.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1.0f32, 1.0, 2.0, 2.0], [2, 2])?;
    /// assert_eq!(t.softmax(-1)?.to_vec::<f32>()?, vec![0.5; 4]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn softmax(&self, axis: i64) -> Result<Tensor> {
        softmax_impl(&crate::full_precision_operand(self), "softmax", axis, false)
    }

    /// `x - max - log(sum(exp(x - max)))` along `axis` (`torch.log_softmax`). Floats only.
    pub fn log_softmax(&self, axis: i64) -> Result<Tensor> {
        softmax_impl(
            &crate::full_precision_operand(self),
            "log_softmax",
            axis,
            true,
        )
    }
}

// === Implementation ===

/// Checks a reduction of `x` over `axes` (every axis for `None`).
fn plan(x: &Tensor, name: &'static str, axes: Option<&[i64]>, keepdim: bool) -> Result<Plan> {
    x.check_size(name)?;
    if x.dtype().is_float8() {
        // Storage only, as in PyTorch: no reduction computes on float8.
        return Err(Error::UnsupportedDType {
            op: name,
            dtype: x.dtype(),
            hint: super::float8_hint(x.dtype(), ""),
        });
    }
    let out = rules::reduce(name, x.shape(), axes, keepdim)?;
    let kept = rules::reduce(name, x.shape(), axes, true)?;
    let mut axes = match axes {
        // A 0-d tensor's axis 0 (checked above) reduces nothing.
        _ if x.ndim() == 0 => Vec::new(),
        Some(list) => rules::normalize_axes(name, list, x.shape())?,
        None => (0..x.ndim()).collect(),
    };
    axes.sort_unstable();
    Ok(Plan {
        name,
        axes,
        kept,
        out,
    })
}

/// The reduction of `x` over the plan's axes, with the reduced dims kept as 1.
fn reduce_kept(x: &Tensor, op: ReduceOp, plan: &Plan) -> Tensor {
    if plan.axes.is_empty() {
        return x.reshape_to(plan.kept.clone());
    }
    if x.shape().iter().any(|d| d.as_const() == Some(0)) {
        // Nothing to combine (every output is the identity: 0, 1, -inf, ...), or no output
        // at all; either way no kernel needs to read the empty input.
        return x.record(
            Op::Const(op.identity(x.dtype())),
            x.dtype(),
            plan.kept.clone(),
        );
    }
    let leading = plan.axes.iter().enumerate().all(|(i, &a)| a == i);
    if leading && let Some(total) = leading_in_blocks(x, op, plan.axes.len(), SPLIT_ROWS_MIN) {
        return total.reshape_to(plan.kept.clone());
    }
    x.record(
        Op::Reduce(op, x.node(), plan.axes.clone().into()),
        x.dtype(),
        plan.kept.clone(),
    )
}

/// Rows per block of [`leading_in_blocks`]' first reduction.
const ROW_BLOCK: i64 = 64;

/// The fewest rows a reduction over leading axes is split for (see [`leading_in_blocks`]).
const SPLIT_ROWS_MIN: i64 = 1024;

/// The reduction by `op` of `x`'s first `k` axes (`rows`, their product, over `columns`,
/// the product of the rest) as a `[1, columns]` tensor computed in blocks: sums of
/// [`ROW_BLOCK`] rows first, then of the blocks (again in blocks while there are at least
/// `min_rows`). One pass over all rows gives each invocation a whole column, so a column
/// sum of `[16384, 16384]` ran on 16384 invocations and a full sum on one workgroup; in
/// blocks every output has a short loop and there are `rows / 64` times more of them.
/// Half-precision sums and products run in `f32` and round once at the end. `None` where
/// the shape is not constant or there are fewer than `min_rows` rows.
pub(crate) fn leading_in_blocks(
    x: &Tensor,
    op: ReduceOp,
    k: usize,
    min_rows: i64,
) -> Option<Tensor> {
    let dims = x.shape().dims();
    let constant = |ds: &[Dim]| ds.iter().try_fold(1i64, |n, d| Some(n * d.as_const()?));
    let rows = constant(&dims[..k])?;
    let columns = constant(&dims[k..])?;
    if k == 0 || rows < min_rows.max(2 * ROW_BLOCK) || columns < 1 {
        return None;
    }
    let dtype = x.dtype();
    let widen =
        matches!(dtype, DType::F16 | DType::BF16) && matches!(op, ReduceOp::Sum | ReduceOp::Prod);
    let wide = if widen {
        x.cast_to(DType::F32)
    } else {
        x.clone()
    };
    let c = Dim::constant;
    let mut partial = wide.reshape_to(Shape::new(vec![c(rows), c(columns)]));
    let mut rows = rows;
    while rows >= min_rows.max(2 * ROW_BLOCK) {
        let blocks = (rows + ROW_BLOCK - 1) / ROW_BLOCK;
        if blocks * ROW_BLOCK > rows {
            let identity = op.identity(partial.dtype());
            partial = crate::ops::movement::pad_axis(
                &partial,
                0,
                c(0),
                c(blocks * ROW_BLOCK - rows),
                identity,
            );
        }
        let split = partial.reshape_to(Shape::new(vec![c(blocks), c(ROW_BLOCK), c(columns)]));
        partial = split
            .record(
                Op::Reduce(op, split.node(), Box::new([1])),
                split.dtype(),
                Shape::new(vec![c(blocks), c(1), c(columns)]),
            )
            .reshape_to(Shape::new(vec![c(blocks), c(columns)]));
        rows = blocks;
    }
    let total = partial.record(
        Op::Reduce(op, partial.node(), Box::new([0])),
        partial.dtype(),
        Shape::new(vec![c(1), c(columns)]),
    );
    Some(if widen { total.cast_to(dtype) } else { total })
}

/// How many elements each output of the plan reduces, less `correction` (at least 0), as a
/// tensor of `like`'s dtype and (kept) shape. A dynamic count is counted by the kernel: a
/// sum of ones over the reduced axes, which fuses with the reduction it divides.
fn reduced_count(x: &Tensor, plan: &Plan, like: &Tensor, correction: usize) -> Tensor {
    let count: Dim = plan.axes.iter().map(|&a| x.shape()[a]).product();
    if let Some(n) = count.as_const() {
        return constant(like, (n as f64 - correction as f64).max(0.0));
    }
    let ones = x.full_like_scalar(Scalar::F64(1.0), like.dtype());
    let n = reduce_kept(&ones, ReduceOp::Sum, plan);
    if correction == 0 {
        return n;
    }
    n.raw_binary(BinaryOp::Sub, &constant(&n, correction as f64))
        .raw_binary(BinaryOp::Max, &constant(&n, 0.0))
}

/// Fails if the plan reduces a dim of size 0: max, min, argmax and argmin have no identity,
/// and `PyTorch` raises for them too.
fn check_nonempty(x: &Tensor, plan: &Plan) -> Result<()> {
    let Some(a) = plan
        .axes
        .iter()
        .copied()
        .find(|&a| x.shape()[a].as_const() == Some(0))
    else {
        return Ok(());
    };
    Err(Error::Shape(ShapeError::InvalidArgument {
        op: plan.name,
        shape: x.shape().clone(),
        reason: format!(
            "axis {a} has size 0, and an empty {} has no value (PyTorch raises too); reduce a non-empty axis or check the shape first",
            plan.name
        ),
    }))
}

/// Fails unless `x` holds floats.
fn require_float(x: &Tensor, name: &'static str) -> Result<()> {
    if x.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op: name,
            dtype: x.dtype(),
            hint: FLOAT_ONLY,
        })
    }
}

/// `x` in the dtype it computes in: `f16` and `bf16` widen to `f32`.
fn widened(x: &Tensor) -> Tensor {
    match x.dtype() {
        DType::F16 | DType::BF16 => x.cast_to(DType::F32),
        _ => x.clone(),
    }
}

/// A constant of `value` in `like`'s shape and dtype.
fn constant(like: &Tensor, value: f64) -> Tensor {
    like.full_like_scalar(Scalar::F64(value), like.dtype())
}

/// `mask ? a : b`, all of one shape.
fn select(mask: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
    mask.record_with(
        &[a, b],
        Op::Ternary(TernaryOp::Where, mask.node(), a.node(), b.node()),
        a.dtype(),
        a.shape().clone(),
    )
}

/// `lhs op rhs` for operands of one dtype, where `rhs` has `lhs`'s shape or is a keepdim
/// reduction of it (broadcast by `Expand`).
fn ew(lhs: &Tensor, op: BinaryOp, rhs: &Tensor, name: &'static str) -> Result<Tensor> {
    let rhs = rhs.broadcast_to_shape(lhs.shape());
    lhs.binary_aligned(&rhs, op, name, "")
}

/// `x` as 1-d (`[1]` for a 0-d tensor), for the `_all` index reductions.
fn flat(x: &Tensor, name: &'static str) -> Result<Tensor> {
    let n = x.shape().numel();
    if n.as_const().is_none() {
        return Err(Error::InvalidArgument {
            op: name,
            reason: format!("shape {} has a symbolic element count", x.shape()),
        });
    }
    Ok(x.reshape_to(Shape::new(vec![n])))
}

fn sum_or_prod(
    x: &Tensor,
    op: ReduceOp,
    name: &'static str,
    axes: Option<&[i64]>,
    keepdim: bool,
) -> Result<Tensor> {
    let plan = plan(x, name, axes, keepdim)?;
    let acc = if x.dtype().is_float() {
        x.clone()
    } else {
        x.cast_to(DType::I64)
    };
    Ok(reduce_kept(&acc, op, &plan).reshape_to(plan.out))
}

fn mean_impl(x: &Tensor, axes: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
    require_float(x, "mean")?;
    let plan = plan(x, "mean", axes, keepdim)?;
    let sum = reduce_kept(&widened(x), ReduceOp::Sum, &plan);
    let n = reduced_count(x, &plan, &sum, 0);
    let mean = sum.binary_aligned(&n, BinaryOp::Div, "mean", "")?;
    Ok(mean.cast_to(x.dtype()).reshape_to(plan.out))
}

fn extremum(
    x: &Tensor,
    op: ReduceOp,
    name: &'static str,
    axes: Option<&[i64]>,
    keepdim: bool,
) -> Result<Tensor> {
    let plan = plan(x, name, axes, keepdim)?;
    check_nonempty(x, &plan)?;
    Ok(reduce_kept(x, op, &plan).reshape_to(plan.out))
}

/// argmax/argmin: the smallest index whose value equals the extremum (or is NaN).
fn arg_extremum(
    x: &Tensor,
    op: ReduceOp,
    name: &'static str,
    axis: i64,
    keepdim: bool,
) -> Result<Tensor> {
    let plan = plan(x, name, Some(&[axis]), keepdim)?;
    check_nonempty(x, &plan)?;
    let Some(&a) = plan.axes.first() else {
        // A 0-d tensor: its one element is at index 0.
        return Ok(x
            .full_like_scalar(Scalar::I64(0), DType::I64)
            .reshape_to(plan.out));
    };
    let keyed = matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && x.shape()[a].bounds().hi <= i64::from(u32::MAX);
    if keyed {
        return keyed_arg_extremum(x, op, name, a, &plan);
    }
    let best = reduce_kept(x, op, &plan);
    let mut mask = ew(x, BinaryOp::Eq, &best, name)?;
    if x.dtype().is_float() {
        // NaN wins the reduction and equals nothing, so NaNs mark themselves.
        let nan = x.unary_op(UnaryOp::IsNan, name, "")?;
        mask = mask.binary_aligned(&nan, BinaryOp::Or, name, "")?;
    }
    let index = x.record(Op::Index(a), DType::I64, x.shape().clone());
    // Every slice has at least one marked element, so the filler never wins.
    let filler = index.full_like_scalar(Scalar::I64(i64::MAX), DType::I64);
    let candidates = select(&mask, &index, &filler);
    Ok(reduce_kept(&candidates, ReduceOp::Min, &plan).reshape_to(plan.out))
}

/// [`arg_extremum`] of an `f32`, `f16` or `bf16` tensor along axis `a` as one reduction over
/// keys: each element's bits made order-preserving as an `i32` (NaN above every value for the
/// maximum, below for the minimum, as `torch.argmax`/`argmin`; -0.0 as +0.0) in the high half
/// of an `i64`, its index in the low half (inverted for the maximum, so the first of equal
/// values wins either way). Comparing `x` with its reduced maximum instead needs every kernel
/// that computes `x` to produce the same bits, which a plan computing `x` in two kernels (a
/// matrix product summed in two orders) does not.
fn keyed_arg_extremum(
    x: &Tensor,
    op: ReduceOp,
    name: &'static str,
    a: usize,
    plan: &Plan,
) -> Result<Tensor> {
    let int = |like: &Tensor, v: i64, dtype: DType| like.full_like_scalar(Scalar::I64(v), dtype);
    let bits = x.cast_to(DType::F32).bitcast(DType::I32)?;
    // -0.0 orders as +0.0; negative values' magnitude bits flip, so larger floats are larger
    // integers.
    let negative_zero = ew(
        &bits,
        BinaryOp::Eq,
        &int(&bits, i64::from(i32::MIN), DType::I32),
        name,
    )?;
    let bits = select(&negative_zero, &int(&bits, 0, DType::I32), &bits);
    let negative = ew(&bits, BinaryOp::Lt, &int(&bits, 0, DType::I32), name)?;
    let flipped = ew(
        &bits,
        BinaryOp::Xor,
        &int(&bits, i64::from(i32::MAX), DType::I32),
        name,
    )?;
    let key = select(&negative, &flipped, &bits);
    let nan_key = if op == ReduceOp::Max {
        i32::MAX
    } else {
        i32::MIN
    };
    let key = select(&x.isnan(), &int(&key, i64::from(nan_key), DType::I32), &key);
    let high = ew(
        &key.cast_to(DType::I64),
        BinaryOp::Shl,
        &int(&bits, 32, DType::I64),
        name,
    )?;
    let low_bits = int(&high, i64::from(u32::MAX), DType::I64);
    let index = x.record(Op::Index(a), DType::I64, x.shape().clone());
    let low = if op == ReduceOp::Max {
        ew(&low_bits, BinaryOp::Sub, &index, name)?
    } else {
        index
    };
    let packed = ew(&high, BinaryOp::Or, &low, name)?;
    let best = reduce_kept(&packed, op, plan);
    let low = ew(
        &best,
        BinaryOp::And,
        &int(&best, i64::from(u32::MAX), DType::I64),
        name,
    )?;
    let index = if op == ReduceOp::Max {
        ew(
            &int(&low, i64::from(u32::MAX), DType::I64),
            BinaryOp::Sub,
            &low,
            name,
        )?
    } else {
        low
    };
    Ok(index.reshape_to(plan.out.clone()))
}

fn var_impl(
    x: &Tensor,
    name: &'static str,
    axes: Option<&[i64]>,
    correction: usize,
    keepdim: bool,
    sqrt: bool,
) -> Result<Tensor> {
    require_float(x, name)?;
    let plan = plan(x, name, axes, keepdim)?;
    let wide = widened(x);
    let sum = reduce_kept(&wide, ReduceOp::Sum, &plan);
    let mean = sum.binary_aligned(&reduced_count(x, &plan, &sum, 0), BinaryOp::Div, name, "")?;
    let dev = ew(&wide, BinaryOp::Sub, &mean, name)?;
    let sq = dev.binary_aligned(&dev, BinaryOp::Mul, name, "")?;
    let ss = reduce_kept(&sq, ReduceOp::Sum, &plan);
    let denom = reduced_count(x, &plan, &ss, correction);
    let mut var = ss.binary_aligned(&denom, BinaryOp::Div, name, "")?;
    if sqrt {
        var = var.unary_op(UnaryOp::Sqrt, name, "")?;
    }
    Ok(var.cast_to(x.dtype()).reshape_to(plan.out))
}

fn logical(
    x: &Tensor,
    op: ReduceOp,
    name: &'static str,
    axes: Option<&[i64]>,
    keepdim: bool,
) -> Result<Tensor> {
    let plan = plan(x, name, axes, keepdim)?;
    let truth = if x.dtype().is_bool() {
        x.clone()
    } else {
        let zero = x.full_like_scalar(Scalar::Bool(false), x.dtype());
        x.binary_aligned(&zero, BinaryOp::Ne, name, "")?
    };
    Ok(reduce_kept(&truth, op, &plan).reshape_to(plan.out))
}

fn logsumexp_impl(x: &Tensor, axes: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
    const NAME: &str = "logsumexp";
    let plan = plan(x, NAME, axes, keepdim)?;
    let out_dtype = if x.dtype().is_float() {
        x.dtype()
    } else {
        DType::F32
    };
    let wide = widened(&x.to_float());
    // The shift cancels in value; detached, it also stays out of the gradient, which is
    // then exactly softmax (through the max it would add `1 - Σ softmax`, a rounding error
    // of the sum, at each row's maximum: 10% of the gradient there over 50 257 classes).
    let max = reduce_kept(&wide, ReduceOp::Max, &plan).detach();
    // As torch does: maxima that are ±inf are replaced by 0, so inf - inf never appears.
    let inf = max.unary_op(UnaryOp::IsInf, NAME, "")?;
    let safe = select(&inf, &constant(&max, 0.0), &max);
    let shifted = ew(&wide, BinaryOp::Sub, &safe, NAME)?;
    let exp = shifted.unary_op(UnaryOp::Exp, NAME, "")?;
    let log = reduce_kept(&exp, ReduceOp::Sum, &plan).unary_op(UnaryOp::Log, NAME, "")?;
    let res = log.binary_aligned(&safe, BinaryOp::Add, NAME, "")?;
    Ok(res.cast_to(out_dtype).reshape_to(plan.out))
}

fn softmax_impl(x: &Tensor, name: &'static str, axis: i64, log: bool) -> Result<Tensor> {
    require_float(x, name)?;
    let plan = plan(x, name, Some(&[axis]), true)?;
    let wide = widened(x);
    // The standard formula with the max broadcast by `Expand`: the kernelizer computes the
    // max inside the sum's pass, so this is two kernels. The max is detached, as in
    // `logsumexp`: the gradient is the closed form, without a rounding error at the max.
    let max = reduce_kept(&wide, ReduceOp::Max, &plan).detach();
    let shifted = ew(&wide, BinaryOp::Sub, &max, name)?;
    let exp = shifted.unary_op(UnaryOp::Exp, name, "")?;
    let sum = reduce_kept(&exp, ReduceOp::Sum, &plan);
    let res = if log {
        let log_sum = sum.unary_op(UnaryOp::Log, name, "")?;
        ew(&shifted, BinaryOp::Sub, &log_sum, name)?
    } else {
        ew(&exp, BinaryOp::Div, &sum, name)?
    };
    Ok(res.cast_to(x.dtype()))
}
