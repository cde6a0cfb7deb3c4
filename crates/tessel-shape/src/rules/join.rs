//! Joining and splitting: cat, stack, split and chunk.

use super::{axis_in, check_size, invalid, normalize_axis, to_i64, unequal};
use crate::{Dim, Shape, ShapeError};

/// `torch.cat(tensors, axis)`: the shapes joined along `axis`.
///
/// All shapes need the same ndim (at least 1) and provably equal dims except along `axis`,
/// where the result is the (symbolic) sum. As in `PyTorch`, 1-d shapes `[0]` are legacy
/// placeholders and are skipped.
///
/// ```
/// use tessel_shape::{Shape, rules::cat};
/// let out = cat(&[&Shape::from([2, 3]), &Shape::from([2, 5])], -1).unwrap();
/// assert_eq!(out, Shape::from([2, 8]));
/// ```
pub fn cat(shapes: &[&Shape], axis: i64) -> Result<Shape, ShapeError> {
    const OP: &str = "cat";
    let legacy_empty = |s: &Shape| s.ndim() == 1 && s[0].as_const() == Some(0);
    let Some(&first_shape) = shapes.first() else {
        return Err(ShapeError::Empty { op: OP });
    };
    let Some(first_index) = shapes.iter().position(|s| !legacy_empty(s)) else {
        normalize_axis(OP, axis, first_shape)?;
        return Ok(first_shape.clone());
    };
    let first = shapes[first_index];
    if first.ndim() == 0 {
        return Err(ShapeError::RankMismatch {
            op: OP,
            shape: first.clone(),
            expected: "at least 1 (0-d tensors can't be concatenated; stack them instead)"
                .to_owned(),
        });
    }
    let a = normalize_axis(OP, axis, first)?;
    let mut dims = first.clone().into_dims();
    for (index, &other) in shapes.iter().enumerate().skip(first_index + 1) {
        if legacy_empty(other) {
            continue;
        }
        let mismatch = |reason: String| ShapeError::ConcatMismatch {
            op: OP,
            first_index,
            first: first.clone(),
            index,
            other: other.clone(),
            reason,
        };
        if other.ndim() != first.ndim() {
            return Err(mismatch(format!(
                "all tensors need the same number of dims ({} != {})",
                other.ndim(),
                first.ndim()
            )));
        }
        for (i, (&x, &y)) in first.iter().zip(other.iter()).enumerate() {
            if i != a && x != y {
                return Err(mismatch(format!(
                    "dim {i}: {}; all dims except the cat axis {a} must match",
                    unequal(x, y)
                )));
            }
        }
        dims[a] += other[a];
    }
    Ok(Shape::new(dims))
}

/// `torch.stack(tensors, axis)`: equal shapes joined along a new axis at `axis`.
///
/// `axis` ranges over `-ndim-1..=ndim`; the new dim is the number of shapes.
pub fn stack(shapes: &[&Shape], axis: i64) -> Result<Shape, ShapeError> {
    const OP: &str = "stack";
    let Some(&first) = shapes.first() else {
        return Err(ShapeError::Empty { op: OP });
    };
    let a = axis_in(OP, axis, first.ndim() + 1, first)?;
    for (index, &other) in shapes.iter().enumerate().skip(1) {
        if other != first {
            let differing = first
                .iter()
                .zip(other.iter())
                .enumerate()
                .find(|(_, (x, y))| x != y);
            let reason = match differing {
                Some((i, (&x, &y))) if other.ndim() == first.ndim() => {
                    format!("dim {i}: {}; stack needs equal shapes", unequal(x, y))
                }
                _ => format!(
                    "stack needs equal shapes, but they have {} and {} dims",
                    first.ndim(),
                    other.ndim()
                ),
            };
            return Err(ShapeError::ConcatMismatch {
                op: OP,
                first_index: 0,
                first: first.clone(),
                index,
                other: other.clone(),
                reason,
            });
        }
    }
    let mut dims = first.clone().into_dims();
    dims.insert(a, Dim::from(shapes.len()));
    Ok(Shape::new(dims))
}

/// The constant size of `shape`'s axis `a`, for splits whose piece count must be static.
fn const_dim(op: &'static str, shape: &Shape, a: usize) -> Result<i64, ShapeError> {
    let d = shape[a];
    match d.as_const() {
        Some(len) if len >= 0 => Ok(len),
        Some(len) => Err(invalid(op, shape, format!("dim {a} is negative ({len})"))),
        None => Err(invalid(
            op,
            shape,
            format!("dim {a} is symbolic ({d}), so the number of pieces isn't known"),
        )),
    }
}

/// The most pieces one `split` or `chunk` returns: each is a tensor (a graph node and a
/// handle) recorded one by one, so 2²⁰ of them already take seconds, and 2²⁴ took the
/// fuzzer's minute without running out of memory.
const MAX_PIECES: usize = 1 << 20;

/// `split_size`-sized pieces of `len` (the last one smaller), as `torch.split` cuts them;
/// an error past [`MAX_PIECES`] (a dim of 2⁶⁰ in pieces of one).
fn pieces(
    op: &'static str,
    shape: &Shape,
    len: i64,
    split_size: i64,
) -> Result<Vec<Dim>, ShapeError> {
    if split_size == 0 {
        return Ok(vec![Dim::constant(len)]);
    }
    let count = (len / split_size + i64::from(len % split_size != 0)).max(1);
    let last = len - split_size * (count - 1);
    if count as usize > MAX_PIECES {
        return Err(too_many(op, shape, count as usize));
    }
    let mut out = Vec::new();
    out.try_reserve_exact(count as usize).map_err(|_| {
        invalid(
            op,
            shape,
            format!("{count} pieces of {split_size} are more than memory can list"),
        )
    })?;
    out.extend(std::iter::repeat_n(
        Dim::constant(split_size),
        count as usize - 1,
    ));
    out.push(Dim::constant(last));
    Ok(out)
}

fn too_many(op: &'static str, shape: &Shape, count: usize) -> ShapeError {
    invalid(
        op,
        shape,
        format!(
            "{count} pieces are more than the {MAX_PIECES} tensors one call returns; take the \
             pieces you need with `narrow`"
        ),
    )
}

/// `torch.split(tensor, split_size, axis)`: the sizes along `axis` of the pieces.
///
/// Pieces have `split_size` elements, the last one fewer if the dim doesn't divide evenly;
/// there is always at least one piece, and `split_size` may be 0 only for a dim of 0. The
/// dim must be a constant, since the number of pieces is static.
///
/// ```
/// use tessel_shape::{Dim, Shape, rules::split};
/// let sizes = split(&Shape::from([5, 2]), 0, 2).unwrap();
/// assert_eq!(sizes, [2, 2, 1].map(Dim::from));
/// ```
pub fn split(shape: &Shape, axis: i64, split_size: usize) -> Result<Vec<Dim>, ShapeError> {
    const OP: &str = "split";
    let a = normalize_axis(OP, axis, shape)?;
    let len = const_dim(OP, shape, a)?;
    let split_size = to_i64(OP, shape, "split size", split_size)?;
    if split_size == 0 && len != 0 {
        return Err(invalid(
            OP,
            shape,
            format!("split size 0 is only allowed for a dim of size 0, but dim {a} is {len}"),
        ));
    }
    pieces(OP, shape, len, split_size)
}

/// `torch.split(tensor, sizes, axis)` with a list: the sizes, checked to be non-negative
/// and to add up (provably) to the dim along `axis`.
pub fn split_sizes<D: Copy + Into<Dim>>(
    shape: &Shape,
    axis: i64,
    sizes: &[D],
) -> Result<Vec<Dim>, ShapeError> {
    const OP: &str = "split";
    let a = normalize_axis(OP, axis, shape)?;
    let sizes: Vec<Dim> = sizes.iter().map(|&d| d.into()).collect();
    for (i, &d) in sizes.iter().enumerate() {
        check_size(OP, shape, d, || format!("split size {d} at position {i}"))?;
    }
    let total: Dim = sizes.iter().copied().sum();
    if total != shape[a] {
        let d = shape[a];
        let why = if total.is_const() && d.is_const() {
            format!("but dim {a} has size {d}")
        } else {
            format!("which can't be proven equal to dim {a}'s size {d}")
        };
        return Err(invalid(
            OP,
            shape,
            format!(
                "split sizes {} add up to {total}, {why}",
                Shape::new(sizes.clone())
            ),
        ));
    }
    Ok(sizes)
}

/// `torch.chunk(tensor, chunks, axis)`: the sizes along `axis` of the chunks.
///
/// Each chunk has `ceil(dim / chunks)` elements, the last one fewer, so there may be fewer
/// than `chunks` chunks (`chunk(6, 4)` gives `[2, 2, 2]`); a dim of 0 gives `chunks` empty
/// chunks. `chunks` must be positive and the dim a constant.
///
/// ```
/// use tessel_shape::{Dim, Shape, rules::chunk};
/// assert_eq!(chunk(&Shape::from([5]), 0, 3).unwrap(), [2, 2, 1].map(Dim::from));
/// ```
pub fn chunk(shape: &Shape, axis: i64, chunks: usize) -> Result<Vec<Dim>, ShapeError> {
    const OP: &str = "chunk";
    let a = normalize_axis(OP, axis, shape)?;
    let len = const_dim(OP, shape, a)?;
    if chunks == 0 {
        return Err(invalid(
            OP,
            shape,
            "the number of chunks must be positive, got 0",
        ));
    }
    let n = to_i64(OP, shape, "chunk count", chunks)?;
    if len == 0 {
        // `chunks` empty pieces, as PyTorch gives; too many is an error.
        if chunks > MAX_PIECES {
            return Err(too_many(OP, shape, chunks));
        }
        let mut out = Vec::new();
        out.try_reserve_exact(chunks).map_err(|_| {
            invalid(
                OP,
                shape,
                format!("{chunks} chunks are more than memory can list"),
            )
        })?;
        out.resize(chunks, Dim::constant(0));
        return Ok(out);
    }
    // ceil(len / n), without overflowing for a huge n.
    let split_size = (len - 1) / n + 1;
    pieces(OP, shape, len, split_size)
}
