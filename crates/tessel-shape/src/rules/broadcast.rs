//! Broadcasting, expansion, reductions and matrix products.

use super::{axes_in, check_size, is_one};
use crate::{Dim, Shape, ShapeError};

/// The broadcast of two dims, if provable: equal dims, or either of them the constant 1.
fn broadcast_dim(a: Dim, b: Dim) -> Option<Dim> {
    if a == b || is_one(b) {
        Some(a)
    } else if is_one(a) {
        Some(b)
    } else {
        None
    }
}

/// Broadcasts two dim lists right-aligned; errors report `lhs` and `rhs` and count the axis
/// from the right, shifted by `offset` (for matmul's batch dims).
pub(super) fn broadcast_dims(
    op: &'static str,
    a: &[Dim],
    b: &[Dim],
    (lhs, rhs): (&Shape, &Shape),
    offset: isize,
) -> Result<Vec<Dim>, ShapeError> {
    let n = a.len().max(b.len());
    let one = Dim::constant(1);
    let mut out = vec![one; n];
    for i in 0..n {
        let da = if i < a.len() { a[a.len() - 1 - i] } else { one };
        let db = if i < b.len() { b[b.len() - 1 - i] } else { one };
        out[n - 1 - i] = broadcast_dim(da, db).ok_or_else(|| ShapeError::Broadcast {
            op,
            lhs: lhs.clone(),
            rhs: rhs.clone(),
            axis: offset - 1 - i as isize,
            lhs_dim: da,
            rhs_dim: db,
        })?;
    }
    Ok(out)
}

/// The broadcast of two shapes under `NumPy` rules, as in every `PyTorch` elementwise op.
///
/// Shapes are aligned on the right; missing leading dims count as 1; each pair of dims must
/// be equal or one of them 1, and the result takes the other. Symbolic dims broadcast only
/// when provably compatible: `[b, 3]` with `[1, 3]` gives `[b, 3]`, but `[b, 3]` with
/// `[c, 3]` is an error since `b` and `c` might differ.
///
/// ```
/// use tessel_shape::{Shape, rules::broadcast};
/// let out = broadcast("add", &Shape::from([4, 1, 3]), &Shape::from([2, 1])).unwrap();
/// assert_eq!(out, Shape::from([4, 2, 3]));
/// ```
pub fn broadcast(op: &'static str, lhs: &Shape, rhs: &Shape) -> Result<Shape, ShapeError> {
    broadcast_dims(op, lhs, rhs, (lhs, rhs), 0).map(Shape::new)
}

/// The broadcast of any number of shapes (`torch.broadcast_shapes`); `[]` for no shapes.
///
/// On a conflict the error names the two input shapes that disagree.
pub fn broadcast_all(op: &'static str, shapes: &[&Shape]) -> Result<Shape, ShapeError> {
    let n = shapes.iter().map(|s| s.ndim()).max().unwrap_or(0);
    let mut out = vec![Dim::constant(1); n];
    for i in 0..n {
        // The dim so far and the index of the shape it came from.
        let mut current: Option<(Dim, usize)> = None;
        for (j, s) in shapes.iter().enumerate() {
            let Some(&d) = s.len().checked_sub(i + 1).map(|k| &s[k]) else {
                continue;
            };
            current = match current {
                None => Some((d, j)),
                Some((c, cj)) if c == d || is_one(d) => Some((c, cj)),
                Some((c, _)) if is_one(c) => Some((d, j)),
                Some((c, cj)) => {
                    return Err(ShapeError::Broadcast {
                        op,
                        lhs: shapes[cj].clone(),
                        rhs: (*s).clone(),
                        axis: -1 - i as isize,
                        lhs_dim: c,
                        rhs_dim: d,
                    });
                }
            };
        }
        if let Some((d, _)) = current {
            out[n - 1 - i] = d;
        }
    }
    Ok(Shape::new(out))
}

/// `Tensor.expand(target)`: the shape with size-1 dims stretched to `target`.
///
/// `target` may add leading dims (which must be given, not `-1`); for the existing dims,
/// `-1` keeps the dim, an equal size keeps it too, and only dims of size 1 may change.
///
/// ```
/// use tessel_shape::{Shape, rules::expand};
/// let out = expand(&Shape::from([3, 1]), &[2, -1, 4]).unwrap();
/// assert_eq!(out, Shape::from([2, 3, 4]));
/// ```
pub fn expand<D: Copy + Into<Dim>>(shape: &Shape, target: &[D]) -> Result<Shape, ShapeError> {
    const OP: &str = "expand";
    let target: Shape = target.iter().map(|&d| d.into()).collect();
    if target.ndim() < shape.ndim() {
        return Err(ShapeError::RankMismatch {
            op: OP,
            shape: shape.clone(),
            expected: format!(
                "at most {} (the number of sizes in the target {target})",
                target.ndim()
            ),
        });
    }
    let lead = target.ndim() - shape.ndim();
    let mut out = Vec::with_capacity(target.ndim());
    for (i, &t) in target.iter().enumerate() {
        let keep = t.as_const() == Some(-1);
        if i < lead {
            if keep {
                return Err(super::invalid(
                    OP,
                    shape,
                    format!(
                        "the new leading dim {i} of target {target} can't be -1; give its size"
                    ),
                ));
            }
            check_size(OP, shape, t, || format!("target size {t} at dim {i}"))?;
            out.push(t);
            continue;
        }
        let d = shape[i - lead];
        if keep || t == d {
            out.push(d);
        } else if is_one(d) {
            check_size(OP, shape, t, || format!("target size {t} at dim {i}"))?;
            out.push(t);
        } else {
            return Err(ShapeError::Expand {
                op: OP,
                shape: shape.clone(),
                target,
                axis: i - lead,
                dim: d,
                target_dim: t,
            });
        }
    }
    Ok(Shape::new(out))
}

/// The shape of a reduction (`sum`, `mean`, `amax`, `argmax`, ...) over `axes`.
///
/// `None` reduces every axis; `Some(&[])` reduces none. Reduced axes are dropped, or kept as
/// size 1 when `keepdim`. Axes may be negative and must not repeat. `op` names the reduction
/// in errors.
///
/// ```
/// use tessel_shape::{Shape, rules::reduce};
/// let s = Shape::from([2, 3, 4]);
/// assert_eq!(reduce("sum", &s, Some(&[-1, 0]), false).unwrap(), Shape::from([3]));
/// assert_eq!(reduce("sum", &s, None, true).unwrap(), Shape::from([1, 1, 1]));
/// ```
pub fn reduce(
    op: &'static str,
    shape: &Shape,
    axes: Option<&[i64]>,
    keepdim: bool,
) -> Result<Shape, ShapeError> {
    let one = Dim::constant(1);
    let Some(axes) = axes else {
        let ndim = if keepdim { shape.ndim() } else { 0 };
        return Ok(Shape::new(vec![one; ndim]));
    };
    if shape.ndim() == 0 {
        // PyTorch lets a 0-d tensor be reduced over axis 0 (or -1).
        axes_in(op, axes, 1, shape)?;
        return Ok(Shape::scalar());
    }
    let reduced = axes_in(op, axes, shape.ndim(), shape)?;
    let dims =
        shape
            .iter()
            .enumerate()
            .filter_map(|(i, &d)| match (reduced.contains(&i), keepdim) {
                (false, _) => Some(d),
                (true, true) => Some(one),
                (true, false) => None,
            });
    Ok(dims.collect())
}

/// `torch.matmul(lhs, rhs)`.
///
/// - 1-d · 1-d: the dot product, `[k]·[k] → []`;
/// - 2-d · 2-d: `[n, k]·[k, m] → [n, m]`;
/// - 1-d · n-d: a 1 is prepended to the lhs and removed from the result, `[k]·[.., k, m] → [.., m]`;
/// - n-d · 1-d: a 1 is appended to the rhs and removed from the result, `[.., n, k]·[k] → [.., n]`;
/// - otherwise the batch dims (all but the last two) broadcast: `[5, 1, 2, 3]·[4, 3, 6] → [5, 4, 2, 6]`.
///
/// 0-d inputs are errors, and the contraction dims must be provably equal.
pub fn matmul(lhs: &Shape, rhs: &Shape) -> Result<Shape, ShapeError> {
    const OP: &str = "matmul";
    let rank0 = |s: &Shape| ShapeError::RankMismatch {
        op: OP,
        shape: s.clone(),
        expected: "at least 1 (a 0-d tensor has no dim to contract; use mul)".to_owned(),
    };
    // The contraction dim, the lhs's row dim / rhs's column dim if any, and the batch dims.
    let (lk, lrow, l_batch) = match lhs.dims() {
        [] => return Err(rank0(lhs)),
        [k] => (*k, None, &[][..]),
        [batch @ .., n, k] => (*k, Some(*n), batch),
    };
    let (rk, rcol, r_batch) = match rhs.dims() {
        [] => return Err(rank0(rhs)),
        [k] => (*k, None, &[][..]),
        [batch @ .., k, m] => (*k, Some(*m), batch),
    };
    if lk != rk {
        return Err(ShapeError::MatmulMismatch {
            op: OP,
            lhs: lhs.clone(),
            rhs: rhs.clone(),
            lhs_dim: lk,
            rhs_dim: rk,
        });
    }
    let mut out = broadcast_dims(OP, l_batch, r_batch, (lhs, rhs), -2)?;
    out.extend(lrow);
    out.extend(rcol);
    Ok(Shape::new(out))
}
