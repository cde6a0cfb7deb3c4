//! The shape rule of every tensor op, with `PyTorch` semantics.
//!
//! Each rule takes the input [`Shape`]s and the op's arguments, checks them, and returns the
//! output shape or a [`ShapeError`] naming the op, the shapes and the rule broken. Axes are
//! `i64` and may be negative, counting from the end as in Python.
//!
//! Dims may be symbolic. A rule accepts a symbolic input only when it can *prove* the
//! condition it checks: two dims are known equal when they are the same canonical
//! [`Expr`](crate::Expr), a dim is known to be 1 when it is the constant 1, and a dim is
//! known non-negative when its lower bound is. Otherwise the rule fails with an error saying
//! which dims can't be proven compatible. Output dims are [`Expr`](crate::Expr) formulas
//! (`cat` sums dims, convolutions use floor division).
//!
//! | Rule | `PyTorch` |
//! |---|---|
//! | [`broadcast`], [`broadcast_all`] | implicit broadcasting, `torch.broadcast_shapes` |
//! | [`expand`] | `Tensor.expand` |
//! | [`reduce`] | `sum`, `mean`, `amax`, ... with `dim` and `keepdim` |
//! | [`matmul`] | `torch.matmul` |
//! | [`reshape`] | `Tensor.reshape` / `view` with one `-1` |
//! | [`permute`], [`transpose`] | `Tensor.permute`, `Tensor.transpose` |
//! | [`squeeze`], [`unsqueeze`] | `Tensor.squeeze`, `Tensor.unsqueeze` |
//! | [`flatten`] | `Tensor.flatten` |
//! | [`pad`] | `torch.nn.functional.pad` (constant), pairs in natural dim order |
//! | [`narrow`] | `Tensor.narrow` |
//! | [`slice()`] | `t[start:stop:step]` on one axis |
//! | [`flip`] | `Tensor.flip` |
//! | [`repeat`] | `Tensor.repeat` |
//! | [`cat`], [`stack`] | `torch.cat`, `torch.stack` |
//! | [`split`], [`split_sizes`], [`chunk`] | `torch.split` (int or list), `torch.chunk` |
//! | [`conv_out_dim`], [`conv`] | `torch.nn.functional.conv1d/2d/3d` |
//! | [`pool_out_dim`], [`pool`] | `max_pool1d/2d/3d`, `avg_pool` (with `dilation` 1) |
//!
//! As in `PyTorch`, [`reduce`], [`squeeze`], [`flip`], [`transpose`] and [`flatten`] treat a
//! 0-d shape as having the one axis `0` (alias `-1`); every other rule rejects axes on a
//! 0-d shape.

mod broadcast;
mod join;
mod movement;
mod nn;

pub use broadcast::{broadcast, broadcast_all, expand, matmul, reduce};
pub use join::{cat, chunk, split, split_sizes, stack};
pub use movement::{
    flatten, flip, narrow, pad, permute, repeat, reshape, slice, squeeze, transpose, unsqueeze,
};
pub use nn::{conv, conv_out_dim, pool, pool_out_dim};

use crate::{Dim, Shape, ShapeError};

/// The axis `axis` of `shape` as an index in `0..ndim`; negative axes count from the end.
///
/// ```
/// use tessel_shape::{Shape, rules::normalize_axis};
/// let s = Shape::from([2, 3, 4]);
/// assert_eq!(normalize_axis("sum", -1, &s), Ok(2));
/// assert!(normalize_axis("sum", 3, &s).is_err());
/// ```
pub fn normalize_axis(op: &'static str, axis: i64, shape: &Shape) -> Result<usize, ShapeError> {
    axis_in(op, axis, shape.ndim(), shape)
}

/// The axes `axes` of `shape` as indices in `0..ndim`, in the order given.
///
/// Fails if an axis is out of range or two of them name the same axis.
pub fn normalize_axes(
    op: &'static str,
    axes: &[i64],
    shape: &Shape,
) -> Result<Vec<usize>, ShapeError> {
    axes_in(op, axes, shape.ndim(), shape)
}

/// Normalizes `axis` against `n` valid axes (`-n..n`); `shape` is only for the error.
pub(crate) fn axis_in(
    op: &'static str,
    axis: i64,
    n: usize,
    shape: &Shape,
) -> Result<usize, ShapeError> {
    let len = i64::try_from(n).unwrap_or(i64::MAX);
    let wrapped = if axis < 0 { axis + len } else { axis };
    if (0..len).contains(&wrapped) {
        Ok(wrapped as usize)
    } else {
        Err(ShapeError::AxisOutOfRange {
            op,
            axis,
            ndim: n,
            shape: shape.clone(),
        })
    }
}

/// Normalizes every axis against `n` valid axes and rejects duplicates.
pub(crate) fn axes_in(
    op: &'static str,
    axes: &[i64],
    n: usize,
    shape: &Shape,
) -> Result<Vec<usize>, ShapeError> {
    let mut out: Vec<usize> = Vec::with_capacity(axes.len());
    for &axis in axes {
        let a = axis_in(op, axis, n, shape)?;
        // A handful of axes: a scan costs less than a table (every reduction and permute
        // records through here).
        if out.contains(&a) {
            return Err(ShapeError::DuplicateAxis {
                op,
                axis: a,
                axes: axes.to_vec(),
                shape: shape.clone(),
            });
        }
        out.push(a);
    }
    Ok(out)
}

/// Whether `d` is provably 1.
pub(crate) fn is_one(d: Dim) -> bool {
    d.as_const() == Some(1)
}

/// Whether `d` is provably non-negative.
pub(crate) fn non_negative(d: Dim) -> bool {
    d.bounds().lo >= 0
}

/// An [`ShapeError::InvalidArgument`].
pub(crate) fn invalid(op: &'static str, shape: &Shape, reason: impl Into<String>) -> ShapeError {
    ShapeError::InvalidArgument {
        op,
        shape: shape.clone(),
        reason: reason.into(),
    }
}

/// Checks that a requested size is provably non-negative; `what` describes it for the error.
pub(crate) fn check_size(
    op: &'static str,
    shape: &Shape,
    d: Dim,
    what: impl FnOnce() -> String,
) -> Result<(), ShapeError> {
    if non_negative(d) {
        Ok(())
    } else if d.is_const() {
        Err(invalid(op, shape, format!("{} is negative", what())))
    } else {
        Err(invalid(
            op,
            shape,
            format!("{} can't be proven non-negative", what()),
        ))
    }
}

/// A `usize` argument as `i64`, failing (not panicking) above `i64::MAX`.
pub(crate) fn to_i64(
    op: &'static str,
    shape: &Shape,
    what: &str,
    v: usize,
) -> Result<i64, ShapeError> {
    i64::try_from(v).map_err(|_| invalid(op, shape, format!("{what} {v} exceeds i64::MAX")))
}

/// Why two dims that should be equal aren't: a certain mismatch or an unprovable one.
pub(crate) fn unequal(a: Dim, b: Dim) -> String {
    if a.is_const() && b.is_const() {
        format!("{a} != {b}")
    } else {
        format!("{a} and {b} can't be proven equal")
    }
}
