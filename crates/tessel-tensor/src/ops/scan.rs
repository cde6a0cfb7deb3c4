//! Scans along one axis: `cumsum`, `cumprod`, `cummax`, `cummin` and `logcumsumexp`.
//!
//! Every scan is a composition of existing ops, so it runs on every backend and fuses:
//!
//! * An axis of `n <= 256` elements is scanned through a triangular window: the axis is
//!   expanded to `[.., n, n]`, the entries `j > i` are replaced by the operation's identity
//!   with `where`, and the last axis is reduced. That is `n²` work per row, in one kernel.
//! * An axis of up to 2048 elements (16384 for `logcumsumexp`) is split in two levels, as
//!   tinygrad does: it is padded to `a·b` with `b = ceil(√n)`, scanned within blocks of `b`
//!   (`a·b²` work), the block totals are scanned exclusively (`a²` work), and each block is
//!   combined with the total before it: about `2·n·√n` work in two or three kernels.
//! * A longer axis is scanned in `ceil(log2(n))` steps (Hillis–Steele): step `k` combines
//!   every element with the one `2^k` before it (the identity padded in where there is
//!   none). That is `n·log2(n)` work and parallel, so it suits GPUs; the kernelizer fuses a
//!   few steps per kernel (it materializes a step's result once recomputing it would cost
//!   more than its limit), about one kernel per 5–6 steps for `cumsum`, one or two steps
//!   per kernel for the indexed `cummax`/`cummin`.
//!
//! Measured on the CPU backend (release build, 2 cores, kernels compiled): `cumsum` of one
//! row of 2^20 `f32` takes about 80 ms in log steps (590 ms in two levels), `cummax` about
//! 160 ms, `logcumsumexp` about 550 ms. The thresholds are where the two forms cross there.
//!
//! Result dtypes follow `PyTorch`: `cumsum` and `cumprod` of `bool` and integers give `i64`,
//! floats keep their dtype (`f16`/`bf16` accumulate in `f32`); `cummax` and `cummin` keep
//! the dtype and add `i64` indices; `logcumsumexp` is for floats only.

use tessel_graph::{Op, ReduceOp};
use tessel_shape::{DType, Dim, Scalar, Shape, rules};

use super::movement::pad_axis;
use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

/// Axes longer than this are scanned in two levels (see the module docs).
const TWO_LEVEL_ABOVE: usize = 256;

/// Axes longer than this are scanned in `log2(n)` steps (see the module docs).
const LOG_STEP_ABOVE: usize = 2048;

/// The same for `logcumsumexp`, whose steps recompute an `exp` and a `log` for every
/// element each fused step reads, so the two levels stay faster for longer.
const LOG_STEP_ABOVE_LOGSUMEXP: usize = 16384;

/// What a scan combines.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sum,
    Prod,
    Max,
    Min,
    LogSumExp,
}

impl Tensor {
    /// The cumulative sum along `dim` (`torch.cumsum`): element `i` is the sum of elements
    /// `0..=i`. `bool` and integer inputs give `i64`; floats keep their dtype.
    ///
    /// Costs `n²` work per row for an axis of `n <= 256`, about `2·n·√n` up to 2048 and
    /// `n·log2(n)` beyond (see the module docs).
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [2, 3])?;
    /// let c = t.cumsum(1)?;
    /// assert_eq!(c.dtype(), DType::I64);
    /// assert_eq!(c.to_vec::<i64>()?, vec![1, 3, 6, 4, 9, 15]);
    /// assert!(t.cumsum(2).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn cumsum(&self, dim: i64) -> Result<Tensor> {
        Ok(scan(self, "cumsum", dim, Kind::Sum)?.0)
    }

    /// The cumulative product along `dim` (`torch.cumprod`); dtypes as [`Tensor::cumsum`].
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4])?;
    /// assert_eq!(t.cumprod(0)?.to_vec::<f32>()?, vec![1.0, 2.0, 6.0, 24.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn cumprod(&self, dim: i64) -> Result<Tensor> {
        Ok(scan(self, "cumprod", dim, Kind::Prod)?.0)
    }

    /// The running maximum along `dim` and its `i64` index (`torch.cummax`), for every
    /// dtype. As in `PyTorch`'s kernel (`x >= best || isnan(x)` replaces the best), a tie
    /// gives the **latest** index, and once a NaN is seen the value stays NaN with the index
    /// of the latest NaN.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i64, 3, 2, 3, 5], [5])?;
    /// let (v, i) = t.cummax(0)?;
    /// assert_eq!(v.to_vec::<i64>()?, vec![1, 3, 3, 3, 5]);
    /// assert_eq!(i.to_vec::<i64>()?, vec![0, 1, 1, 3, 4]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn cummax(&self, dim: i64) -> Result<(Tensor, Tensor)> {
        let (v, i) = scan(self, "cummax", dim, Kind::Max)?;
        Ok((v, i.ok_or_else(|| internal("cummax"))?))
    }

    /// The running minimum along `dim` and its `i64` index (`torch.cummin`); ties and NaN
    /// as in [`Tensor::cummax`].
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![2.0f32, 1.0, 1.0, 3.0], [4])?;
    /// let (v, i) = t.cummin(0)?;
    /// assert_eq!(v.to_vec::<f32>()?, vec![2.0, 1.0, 1.0, 1.0]);
    /// assert_eq!(i.to_vec::<i64>()?, vec![0, 1, 2, 2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn cummin(&self, dim: i64) -> Result<(Tensor, Tensor)> {
        let (v, i) = scan(self, "cummin", dim, Kind::Min)?;
        Ok((v, i.ok_or_else(|| internal("cummin"))?))
    }

    /// `log(cumsum(exp(x)))` along `dim`, computed stably (`torch.logcumsumexp`): each
    /// prefix subtracts its own running maximum (0 where that maximum is infinite, as
    /// `torch.logsumexp` does). Floats only; `f16`/`bf16` compute in `f32`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1000.0f32, 1000.0], [2])?;
    /// let r = t.logcumsumexp(0)?.to_vec::<f32>()?;
    /// assert!((r[1] - (1000.0 + 2f32.ln())).abs() < 1e-3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn logcumsumexp(&self, dim: i64) -> Result<Tensor> {
        Ok(scan(self, "logcumsumexp", dim, Kind::LogSumExp)?.0)
    }
}

// === Shared helpers (also used by sorting) ===

/// A bug report for a branch that cannot happen.
fn internal(op: &str) -> Error {
    Error::Internal(format!("{op}: the scan produced no indices"))
}

/// The normalized axis and its constant length; a 0-d tensor accepts `0`/`-1`, as in
/// `PyTorch`, and has an axis of length 1 (`None` for the axis).
pub(super) fn axis_len(x: &Tensor, op: &'static str, dim: i64) -> Result<(Option<usize>, usize)> {
    x.check_size(op)?;
    if x.ndim() == 0 {
        rules::normalize_axis(op, dim, &Shape::new(vec![Dim::constant(1)]))?;
        return Ok((None, 1));
    }
    let a = rules::normalize_axis(op, dim, x.shape())?;
    let n = x.shape()[a]
        .as_const()
        .ok_or_else(|| Error::InvalidArgument {
            op,
            reason: format!(
                "dim {a} of shape {} is symbolic; {op} needs a known length",
                x.shape()
            ),
        })?;
    let n = usize::try_from(n).map_err(|_| Error::Internal(format!("{op}: negative dim")))?;
    Ok((Some(a), n))
}

/// `x` with `axis` moved last (a transpose, its own inverse); 0-d becomes `[1]`.
pub(super) fn to_last(x: &Tensor, axis: Option<usize>) -> Result<Tensor> {
    match axis {
        None => Ok(x.reshape_to(Shape::new(vec![Dim::constant(1)]))),
        Some(a) => x.transpose(a as i64, -1),
    }
}

/// The inverse of [`to_last`], given the original tensor's shape.
pub(super) fn from_last(y: &Tensor, axis: Option<usize>, like: &Shape) -> Result<Tensor> {
    match axis {
        None => Ok(y.reshape_to(like.clone())),
        Some(a) => y.transpose(a as i64, -1),
    }
}

/// `x` with a size-1 dim inserted at `at` (a non-negative position) and broadcast to `dims`.
pub(super) fn spread(x: &Tensor, at: usize, dims: &[Dim]) -> Tensor {
    let mut kept = x.shape().clone().into_dims();
    kept.insert(at, Dim::constant(1));
    x.reshape_to(Shape::new(kept))
        .broadcast_to_shape(&Shape::new(dims.to_vec()))
}

/// The `i64` coordinate along `axis` of every element of a tensor of `dims`.
pub(super) fn index(like: &Tensor, axis: usize, dims: &[Dim]) -> Tensor {
    Tensor::record_on(
        like.device(),
        Op::Index(axis),
        DType::I64,
        Shape::new(dims.to_vec()),
    )
}

/// A constant `value` of `dtype` in `like`'s shape.
pub(super) fn filled(like: &Tensor, value: Scalar, dtype: DType) -> Tensor {
    like.full_like_scalar(value, dtype)
}

// === Implementation ===

/// The dtype `kind` computes in for an input of `dtype`, and the result dtype.
fn dtypes(kind: Kind, op: &'static str, dtype: DType) -> Result<(DType, DType)> {
    let wide = |d: DType| match d {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    };
    match kind {
        Kind::Sum | Kind::Prod if dtype.is_float() => Ok((wide(dtype), dtype)),
        Kind::Sum | Kind::Prod => Ok((DType::I64, DType::I64)),
        // Comparisons on bool are done on 0/1 bytes.
        Kind::Max | Kind::Min if dtype.is_bool() => Ok((DType::U8, DType::Bool)),
        Kind::Max | Kind::Min => Ok((dtype, dtype)),
        Kind::LogSumExp if dtype.is_float() => Ok((wide(dtype), dtype)),
        Kind::LogSumExp => Err(Error::UnsupportedDType {
            op,
            dtype,
            hint: "it needs a floating-point input, as in PyTorch; cast first, e.g. .cast(DType::F32)",
        }),
    }
}

fn scan(x: &Tensor, op: &'static str, dim: i64, kind: Kind) -> Result<(Tensor, Option<Tensor>)> {
    let (compute, out) = dtypes(kind, op, x.dtype())?;
    let (axis, n) = axis_len(x, op, dim)?;
    let indexed = matches!(kind, Kind::Max | Kind::Min);
    if x.shape().iter().any(|d| d.as_const() == Some(0)) {
        // Nothing to scan; no kernel needs to read the empty input.
        let idx = indexed.then(|| filled(x, Scalar::I64(0), DType::I64));
        return Ok((filled(x, Scalar::zero(out), out), idx));
    }
    let last = to_last(&x.cast_to(compute), axis)?;
    let log_above = if kind == Kind::LogSumExp {
        LOG_STEP_ABOVE_LOGSUMEXP
    } else {
        LOG_STEP_ABOVE
    };
    let (values, idx) = if n > log_above {
        log_step(&last, kind, n)?
    } else if n > TWO_LEVEL_ABOVE {
        two_level(&last, kind, n)?
    } else {
        let pos = index(&last, last.ndim() - 1, last.shape().dims());
        triangular(&last, kind, false, indexed.then_some(&pos))?
    };
    let values = from_last(&values.cast_to(out), axis, x.shape())?;
    let idx = idx.map(|i| from_last(&i, axis, x.shape())).transpose()?;
    Ok((values, idx))
}

/// The identity of `kind` in `dtype` (for `LogSumExp`, the `-inf` of its maximum).
fn identity(kind: Kind, dtype: DType) -> Scalar {
    match kind {
        Kind::Sum => ReduceOp::Sum.identity(dtype),
        Kind::Prod => ReduceOp::Prod.identity(dtype),
        Kind::Max | Kind::LogSumExp => ReduceOp::Max.identity(dtype),
        Kind::Min => ReduceOp::Min.identity(dtype),
    }
}

/// The inclusive (or, with `strict`, exclusive) scan of `x` along its last axis through an
/// `[.., n, n]` window. With `pos` (the position of every element, `i64`), also the
/// position of the chosen element for `Max`/`Min`: the latest one equal to the result or
/// NaN (`-1` for an empty exclusive prefix).
fn triangular(
    x: &Tensor,
    kind: Kind,
    strict: bool,
    pos: Option<&Tensor>,
) -> Result<(Tensor, Option<Tensor>)> {
    let nd = x.ndim();
    let mut win = x.shape().clone().into_dims();
    win.insert(nd - 1, x.shape()[nd - 1]);
    // Row i (axis nd - 1) reads the elements j (axis nd) of the prefix it ends.
    let xj = spread(x, nd - 1, &win);
    let (i, j) = (index(x, nd - 1, &win), index(x, nd, &win));
    let mask = if strict { j.lt(&i)? } else { j.le(&i)? };
    let reduced = |t: &Tensor, op: Kind| -> Result<Tensor> {
        let masked = Tensor::where_cond(&mask, t, filled(t, identity(op, t.dtype()), t.dtype()))?;
        match op {
            Kind::Sum => masked.sum(&[-1], false),
            Kind::Prod => masked.prod(&[-1], false),
            Kind::Max | Kind::LogSumExp => masked.max(&[-1], false),
            Kind::Min => masked.min(&[-1], false),
        }
    };
    if kind == Kind::LogSumExp {
        let max = reduced(&xj, Kind::Max)?;
        // As torch.logsumexp: an infinite maximum is replaced by 0, so inf - inf never
        // appears and the result is that infinity.
        let safe = Tensor::where_cond(&max.isinf(), 0.0, &max)?;
        let shifted = xj.sub(spread(&safe, nd, &win))?.exp();
        let sum = Tensor::where_cond(&mask, &shifted, 0.0)?.sum(&[-1], false)?;
        return Ok((sum.log().add(&safe)?, None));
    }
    let values = reduced(&xj, kind)?;
    let Some(pos) = pos else {
        return Ok((values, None));
    };
    let mut hit = xj.eq(spread(&values, nd, &win))?;
    if x.dtype().is_float() {
        // NaN wins and equals nothing, so NaNs mark themselves.
        hit = hit.logical_or(xj.isnan())?;
    }
    let hit = mask.logical_and(&hit)?;
    let idx = Tensor::where_cond(&hit, spread(pos, nd - 1, &win), -1i64)?.max(&[-1], false)?;
    Ok((values, Some(idx)))
}

/// The scan of a long last axis in two levels (see the module docs).
fn two_level(x: &Tensor, kind: Kind, n: usize) -> Result<(Tensor, Option<Tensor>)> {
    let indexed = matches!(kind, Kind::Max | Kind::Min);
    let b = n.isqrt() + usize::from(n.isqrt() * n.isqrt() < n);
    let a = n.div_ceil(b);
    let nd = x.ndim();
    // The padding sits after every real element, so it never reaches a real prefix.
    let padded = x.pad(&[(0, (a * b - n) as i64)], 0)?;
    let mut blocks = padded.shape().clone().into_dims();
    blocks[nd - 1] = Dim::from(a);
    blocks.push(Dim::from(b));
    let xb = padded.reshape_to(Shape::new(blocks.clone()));
    let pos = index(x, nd, &blocks).add(&index(x, nd - 1, &blocks).mul(b as i64)?)?;
    let (inner, inner_idx) = triangular(&xb, kind, false, indexed.then_some(&pos))?;
    let last_of = |t: &Tensor| -> Result<Tensor> {
        let mut dims = t.shape().clone().into_dims();
        dims.pop();
        Ok(t.narrow(-1, b as i64 - 1, 1)?.reshape_to(Shape::new(dims)))
    };
    let totals = last_of(&inner)?;
    let total_idx = inner_idx.as_ref().map(last_of).transpose()?;
    let (before, before_idx) = triangular(&totals, kind, true, total_idx.as_ref())?;
    let before = spread(&before, nd, &blocks);
    let (values, idx) = match kind {
        Kind::Sum => (inner.add(&before)?, None),
        Kind::Prod => (inner.mul(&before)?, None),
        Kind::LogSumExp => {
            let max = inner.maximum(&before)?;
            let safe = Tensor::where_cond(&max.isinf(), 0.0, &max)?;
            let sum = inner.sub(&safe)?.exp().add(before.sub(&safe)?.exp())?;
            (sum.log().add(&safe)?, None)
        }
        Kind::Max | Kind::Min => {
            // The block's own running extremum wins ties (it is later), and NaN wins.
            let better = if kind == Kind::Max {
                inner.ge(&before)?
            } else {
                inner.le(&before)?
            };
            let take = if x.dtype().is_float() {
                inner
                    .isnan()
                    .logical_or(&before.isnan().logical_not().logical_and(&better)?)?
            } else {
                better
            };
            let before_idx = before_idx.ok_or_else(|| internal("two-level scan"))?;
            let inner_idx = inner_idx.ok_or_else(|| internal("two-level scan"))?;
            let idx = Tensor::where_cond(&take, &inner_idx, spread(&before_idx, nd, &blocks))?;
            (Tensor::where_cond(&take, &inner, &before)?, Some(idx))
        }
    };
    let unblock = |t: Tensor| -> Result<Tensor> {
        t.reshape_to(padded.shape().clone()).narrow(-1, 0, n as i64)
    };
    Ok((unblock(values)?, idx.map(unblock).transpose()?))
}

/// The inclusive scan of the last axis of `x` (`n` long) in `ceil(log2(n))` steps
/// (Hillis–Steele): step `k` combines every element with the one `2^k` before it (the
/// identity where there is none), so after the last step element `i` covers `0..=i`.
/// Every combine keeps the exact semantics of the one-kernel forms: sums and products
/// (reassociated, as any parallel scan), the later element winning ties and NaN for
/// `Max`/`Min`, and a stable log-add-exp.
fn log_step(x: &Tensor, kind: Kind, n: usize) -> Result<(Tensor, Option<Tensor>)> {
    let nd = x.ndim();
    let dtype = x.dtype();
    let id = identity(kind, dtype);
    let indexed = matches!(kind, Kind::Max | Kind::Min);
    let mut values = x.clone();
    let mut idx = indexed.then(|| index(x, nd - 1, x.shape().dims()));
    let earlier = |t: &Tensor, shift: usize, fill: Scalar| -> Result<Tensor> {
        pad_axis(t, nd - 1, Dim::from(shift), Dim::constant(0), fill).narrow(-1, 0, n as i64)
    };
    let mut shift = 1;
    while shift < n {
        let before = earlier(&values, shift, id)?;
        (values, idx) = match kind {
            Kind::Sum => (values.add(&before)?, None),
            Kind::Prod => (values.mul(&before)?, None),
            Kind::LogSumExp => {
                let max = values.maximum(&before)?;
                let safe = Tensor::where_cond(&max.isinf(), 0.0, &max)?;
                let sum = values.sub(&safe)?.exp().add(before.sub(&safe)?.exp())?;
                (sum.log().add(&safe)?, None)
            }
            Kind::Max | Kind::Min => {
                let prev_idx = earlier(
                    idx.as_ref().ok_or_else(|| internal("log-step scan"))?,
                    shift,
                    Scalar::I64(-1),
                )?;
                let (take_value, take_index) = later_wins(&values, &before, kind)?;
                let i = idx.as_ref().ok_or_else(|| internal("log-step scan"))?;
                (
                    take_value.raw_where(&values, &before),
                    Some(take_index.raw_where(i, &prev_idx)),
                )
            }
        };
        shift *= 2;
    }
    Ok((values, idx))
}

/// Whether the running extremum `later` (of a later segment) replaces `earlier`: it is
/// NaN, or neither is NaN and it is at least as good (`>=` for `Max`, `<=` for `Min`).
/// Returned twice, in two equivalent forms, one for the values and one for the indices:
/// one mask shared by both would be materialized on its own, and the scanned values,
/// which the next step reads twice, recomputed there instead.
fn later_wins(later: &Tensor, earlier: &Tensor, kind: Kind) -> Result<(Tensor, Tensor)> {
    let (better, worse) = if kind == Kind::Max {
        (later.ge(earlier)?, later.lt(earlier)?)
    } else {
        (later.le(earlier)?, later.gt(earlier)?)
    };
    if !later.dtype().is_float() {
        return Ok((better, worse.logical_not()));
    }
    let (nan_later, nan_earlier) = (later.isnan(), earlier.isnan());
    let take = nan_later.logical_or(&nan_earlier.logical_not().logical_and(&better)?)?;
    let same = nan_later.logical_or(nan_earlier.logical_or(&worse)?.logical_not())?;
    Ok((take, same))
}
