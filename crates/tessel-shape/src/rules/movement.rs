//! Movement ops: reshape, permute, squeeze, pad, slice, repeat and friends.

use super::{axes_in, axis_in, check_size, invalid, is_one, non_negative, normalize_axis, to_i64};
use crate::{Dim, Shape, ShapeError};

/// `Tensor.reshape(spec)` / `view`: the same elements in a new shape.
///
/// One entry of `spec` may be `-1` (as an `i64`, or `Dim::constant(-1)`), inferred as the
/// element count divided by the product of the other entries; the division must be exact,
/// which for symbolic dims means `product * inferred == numel` after canonicalization.
/// Without a `-1`, the element counts must be provably equal. As in `PyTorch`, a `-1` is
/// ambiguous (an error) when the other entries multiply to 0.
///
/// ```
/// use tessel_shape::{Dim, Shape, Var, rules::reshape};
/// assert_eq!(reshape(&Shape::from([2, 6]), &[-1, 4]).unwrap(), Shape::from([3, 4]));
///
/// let b = Dim::from(Var::new("b", 1, 64).unwrap());
/// let s = Shape::new(vec![b, Dim::from(6)]);
/// let out = reshape(&s, &[Dim::from(-1), Dim::from(3)]).unwrap();
/// assert_eq!(out, Shape::new(vec![b * 2, Dim::from(3)]));
/// ```
pub fn reshape<D: Copy + Into<Dim>>(shape: &Shape, spec: &[D]) -> Result<Shape, ShapeError> {
    const OP: &str = "reshape";
    let mut out: Vec<Dim> = spec.iter().map(|&d| d.into()).collect();
    let to = Shape::new(out.clone());
    let infer_err = |reason: String| ShapeError::ReshapeInfer {
        op: OP,
        from: shape.clone(),
        to: to.clone(),
        reason,
    };
    let mut infer = None;
    let mut known = Dim::constant(1);
    for (i, &d) in out.iter().enumerate() {
        if d.as_const() == Some(-1) {
            if infer.replace(i).is_some() {
                return Err(infer_err("only one dim can be -1".to_owned()));
            }
        } else {
            check_size(OP, shape, d, || format!("size {d} at position {i} of {to}"))?;
            known *= d;
        }
    }
    let numel = shape.numel();
    let Some(i) = infer else {
        if known == numel {
            return Ok(to);
        }
        return Err(ShapeError::ReshapeNumel {
            op: OP,
            from: shape.clone(),
            to,
            from_numel: numel,
            to_numel: known,
        });
    };
    if known.as_const() == Some(0) {
        return Err(infer_err(if numel.as_const() == Some(0) {
            "the tensor has 0 elements and the other dims multiply to 0, so any size would fit"
                .to_owned()
        } else {
            format!("{numel} elements can't fill dims whose product is 0")
        }));
    }
    if known.bounds().lo < 1 {
        return Err(infer_err(format!(
            "the product of the other dims, {known}, can't be proven non-zero"
        )));
    }
    let inferred = numel.checked_div(known).filter(|&q| q * known == numel);
    let Some(inferred) = inferred else {
        return Err(infer_err(if numel.is_const() && known.is_const() {
            format!("{numel} elements are not divisible by {known}, the product of the other dims")
        } else {
            format!(
                "{numel} elements can't be proven divisible by {known}, the product of the other dims"
            )
        }));
    };
    out[i] = inferred;
    Ok(Shape::new(out))
}

/// `Tensor.permute(axes)`: dim `i` of the result is dim `axes[i]` of the input.
///
/// `axes` must name every axis exactly once.
pub fn permute(shape: &Shape, axes: &[i64]) -> Result<Shape, ShapeError> {
    const OP: &str = "permute";
    if axes.len() != shape.ndim() {
        return Err(ShapeError::InvalidPermutation {
            op: OP,
            shape: shape.clone(),
            perm: axes.to_vec(),
        });
    }
    let perm = axes_in(OP, axes, shape.ndim(), shape)?;
    Ok(perm.into_iter().map(|a| shape[a]).collect())
}

/// `Tensor.transpose(a, b)`: the shape with axes `a` and `b` swapped.
///
/// A 0-d shape accepts the axes 0 and -1 and stays 0-d, as in `PyTorch`.
pub fn transpose(shape: &Shape, a: i64, b: i64) -> Result<Shape, ShapeError> {
    const OP: &str = "transpose";
    let n = shape.ndim().max(1);
    let (a, b) = (axis_in(OP, a, n, shape)?, axis_in(OP, b, n, shape)?);
    let mut dims = shape.clone().into_dims();
    if !dims.is_empty() {
        dims.swap(a, b);
    }
    Ok(Shape::new(dims))
}

/// `Tensor.squeeze(axes)`: the shape without the given size-1 dims.
///
/// `None` removes every dim that is provably 1 (a symbolic dim that might be 1 stays).
/// With `Some(axes)`, each named axis is removed if it is 1 and kept otherwise: as in
/// `PyTorch`, squeezing a dim that isn't 1 is a no-op, not an error. Axes must not repeat.
pub fn squeeze(shape: &Shape, axes: Option<&[i64]>) -> Result<Shape, ShapeError> {
    const OP: &str = "squeeze";
    let mut named = vec![axes.is_none(); shape.ndim()];
    if let Some(axes) = axes {
        for a in axes_in(OP, axes, shape.ndim().max(1), shape)? {
            if let Some(flag) = named.get_mut(a) {
                *flag = true;
            }
        }
    }
    let dims = shape
        .iter()
        .zip(named)
        .filter(|&(&d, named)| !(named && is_one(d)));
    Ok(dims.map(|(&d, _)| d).collect())
}

/// `Tensor.unsqueeze(axis)`: the shape with a size-1 dim inserted before `axis`.
///
/// `axis` ranges over `-ndim-1..=ndim`; `-1` appends.
pub fn unsqueeze(shape: &Shape, axis: i64) -> Result<Shape, ShapeError> {
    let a = axis_in("unsqueeze", axis, shape.ndim() + 1, shape)?;
    let mut dims = shape.clone().into_dims();
    dims.insert(a, Dim::constant(1));
    Ok(Shape::new(dims))
}

/// `Tensor.flatten(start, end)`: dims `start..=end` merged into one (their product).
///
/// A 0-d shape flattens to `[1]`, as in `PyTorch`. `start` must not come after `end`.
pub fn flatten(shape: &Shape, start: i64, end: i64) -> Result<Shape, ShapeError> {
    const OP: &str = "flatten";
    let n = shape.ndim().max(1);
    let (s, e) = (axis_in(OP, start, n, shape)?, axis_in(OP, end, n, shape)?);
    if shape.ndim() == 0 {
        return Ok(Shape::from([1]));
    }
    if s > e {
        return Err(invalid(
            OP,
            shape,
            format!("start axis {start} comes after end axis {end}"),
        ));
    }
    let merged = shape[s..=e]
        .iter()
        .fold(Dim::constant(1), |acc, &d| acc * d);
    let mut dims = shape[..s].to_vec();
    dims.push(merged);
    dims.extend_from_slice(&shape[e + 1..]);
    Ok(Shape::new(dims))
}

/// The shape padded by `(before, after)` pairs for the **last** `pads.len()` dims, in natural
/// dim order (`pads[0]` applies to dim `ndim - pads.len()`). Note that this is the reverse of
/// `torch.nn.functional.pad`'s flat list, which starts at the last dim.
///
/// Negative pads crop; every result dim must be provably non-negative.
pub fn pad(shape: &Shape, pads: &[(i64, i64)]) -> Result<Shape, ShapeError> {
    const OP: &str = "pad";
    let Some(first) = shape.ndim().checked_sub(pads.len()) else {
        return Err(ShapeError::RankMismatch {
            op: OP,
            shape: shape.clone(),
            expected: format!("at least {} (one per pad pair)", pads.len()),
        });
    };
    let mut dims = shape.clone().into_dims();
    for (k, &(before, after)) in pads.iter().enumerate() {
        let axis = first + k;
        let d = dims[axis];
        let padded = before
            .checked_add(after)
            .and_then(|total| checked_add(d, total))
            .ok_or_else(|| {
                invalid(
                    OP,
                    shape,
                    format!("padding ({before}, {after}) of dim {axis} overflows i64"),
                )
            })?;
        if !non_negative(padded) {
            let why = if padded.is_const() {
                "a negative size"
            } else {
                "which can't be proven non-negative"
            };
            return Err(invalid(
                OP,
                shape,
                format!("padding dim {axis} ({d}) by ({before}, {after}) gives {padded}, {why}"),
            ));
        }
        dims[axis] = padded;
    }
    Ok(Shape::new(dims))
}

/// `d + k`, or `None` if it could overflow `i64`.
fn checked_add(d: Dim, k: i64) -> Option<Dim> {
    let b = d.bounds();
    b.lo.checked_add(k)?;
    b.hi.checked_add(k)?;
    Some(d + k)
}

/// `Tensor.narrow(axis, start, length)`: `length` elements from `start` along `axis`.
///
/// A negative `start` counts from the end; `start + length` must not exceed the dim.
pub fn narrow(shape: &Shape, axis: i64, start: i64, length: i64) -> Result<Shape, ShapeError> {
    const OP: &str = "narrow";
    let a = normalize_axis(OP, axis, shape)?;
    let d = shape[a];
    if length < 0 {
        return Err(invalid(OP, shape, format!("length {length} is negative")));
    }
    let begin = if start < 0 {
        d + start
    } else {
        Dim::constant(start)
    };
    if begin.bounds().lo < 0 {
        return Err(invalid(
            OP,
            shape,
            format!("start {start} is out of range for dim {a} of size {d}"),
        ));
    }
    let end = begin
        .bounds()
        .hi
        .checked_add(length)
        .map(|_| begin + length);
    if end.is_none_or(|end| (d - end).bounds().lo < 0) {
        let how = if d.is_const() {
            "exceeds"
        } else {
            "can't be proven to fit"
        };
        return Err(invalid(
            OP,
            shape,
            format!("start {start} + length {length} {how} dim {a} of size {d}"),
        ));
    }
    let mut dims = shape.clone().into_dims();
    dims[a] = Dim::constant(length);
    Ok(Shape::new(dims))
}

/// `t[start:stop:step]` along `axis`, with Python's slicing semantics.
///
/// `None` means the start (or end) of the dim; negative indices count from the end; indices
/// past either end are clamped. The result length is `max(0, ceil((stop - start) / step))`
/// after clamping, built from [`Expr::min`](crate::Expr::min)/[`max`](crate::Expr::max) for
/// symbolic dims. `step` must be positive, as in `PyTorch` (use [`flip`] to reverse).
///
/// ```
/// use tessel_shape::{Shape, rules::slice};
/// let s = Shape::from([4, 10]);
/// assert_eq!(slice(&s, 1, Some(-7), None, 3).unwrap(), Shape::from([4, 3]));
/// ```
pub fn slice(
    shape: &Shape,
    axis: i64,
    start: Option<i64>,
    stop: Option<i64>,
    step: i64,
) -> Result<Shape, ShapeError> {
    const OP: &str = "slice";
    let a = normalize_axis(OP, axis, shape)?;
    if step <= 0 {
        return Err(invalid(
            OP,
            shape,
            format!("step {step} must be positive; use flip to reverse an axis"),
        ));
    }
    let d = shape[a];
    // Clamp an index into 0..=d, Python-style.
    let clamp = |i: i64| {
        if i < 0 { (d + i).max(0) } else { d.min(i) }
    };
    let begin = start.map_or(Dim::constant(0), clamp);
    let end = stop.map_or(d, clamp);
    // ceil((end - begin) / step) without overflowing for a huge step.
    let len = ((end - begin - 1) / step + 1).max(0);
    let mut dims = shape.clone().into_dims();
    dims[a] = len;
    Ok(Shape::new(dims))
}

/// `Tensor.flip(axes)`: the same shape; the axes are checked (in range, no repeats).
pub fn flip(shape: &Shape, axes: &[i64]) -> Result<Shape, ShapeError> {
    axes_in("flip", axes, shape.ndim().max(1), shape)?;
    Ok(shape.clone())
}

/// `Tensor.repeat(repeats)`: the shape tiled `repeats[i]` times along each dim.
///
/// `repeats` may be longer than the shape, adding leading dims; it can't be shorter.
pub fn repeat(shape: &Shape, repeats: &[usize]) -> Result<Shape, ShapeError> {
    const OP: &str = "repeat";
    let Some(lead) = repeats.len().checked_sub(shape.ndim()) else {
        return Err(ShapeError::RankMismatch {
            op: OP,
            shape: shape.clone(),
            expected: format!(
                "at most {} (the number of repeats {repeats:?})",
                repeats.len()
            ),
        });
    };
    let mut dims = Vec::with_capacity(repeats.len());
    for (i, &r) in repeats.iter().enumerate() {
        let r = to_i64(OP, shape, "repeat count", r)?;
        let d = if i < lead {
            Dim::constant(1)
        } else {
            shape[i - lead]
        };
        dims.push(d * r);
    }
    Ok(Shape::new(dims))
}
