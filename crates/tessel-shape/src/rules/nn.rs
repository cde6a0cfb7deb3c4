//! Convolution and pooling output shapes.

use super::{invalid, to_i64};
use crate::{Dim, Shape, ShapeError};

/// A sliding window along one spatial dim.
#[derive(Clone, Copy)]
struct Window {
    kernel: Dim,
    stride: i64,
    padding: i64,
    dilation: i64,
}

/// The number of window positions along `shape[axis]` (`input`):
/// `floor((input + 2p - d(k-1) - 1 [+ s-1 in ceil mode]) / s) + 1`, and in ceil mode one
/// fewer if the last window would start past the input and its left padding (`PyTorch`'s
/// rule). Fails on a non-positive stride, dilation or kernel and on a provably
/// non-positive output.
fn out_dim(
    op: &'static str,
    shape: &Shape,
    axis: usize,
    input: Dim,
    w: Window,
    ceil_mode: bool,
) -> Result<Dim, ShapeError> {
    let Window {
        kernel: k,
        stride: s,
        padding: p,
        dilation: d,
    } = w;
    if s < 1 {
        return Err(invalid(op, shape, format!("stride {s} must be positive")));
    }
    if d < 1 {
        return Err(invalid(op, shape, format!("dilation {d} must be positive")));
    }
    if k.bounds().lo < 1 {
        let how = if k.is_const() {
            "is not"
        } else {
            "can't be proven"
        };
        return Err(invalid(
            op,
            shape,
            format!("kernel size {k} along dim {axis} {how} positive"),
        ));
    }
    let overflow = || {
        invalid(
            op,
            shape,
            format!("window arithmetic along dim {axis} overflows i64"),
        )
    };
    let extra = if ceil_mode { s - 1 } else { 0 };
    let (out, extent) = if let (Some(n), Some(kc)) = (input.as_const(), k.as_const()) {
        let extent = d.checked_mul(kc - 1).and_then(|x| x.checked_add(1));
        let out = extent.and_then(|e| {
            let span = n
                .checked_add(p.checked_mul(2)?)?
                .checked_sub(e)?
                .checked_add(extra)?;
            let mut out = span.div_euclid(s).checked_add(1)?;
            if ceil_mode && (out - 1).checked_mul(s)? >= n.checked_add(p)? {
                out -= 1;
            }
            Some(out)
        });
        match (out, extent) {
            (Some(out), Some(e)) => (Dim::constant(out), Dim::constant(e)),
            _ => return Err(overflow()),
        }
    } else {
        let two_p = p.checked_mul(2).ok_or_else(overflow)?;
        let extent = (k - 1) * d + 1;
        let mut out = (input + two_p - extent + extra) / s + 1;
        if ceil_mode {
            out -= ((out - 1) * s).cmp_ge(input + p);
        }
        (out, extent)
    };
    if out.bounds().hi < 1 {
        return Err(invalid(
            op,
            shape,
            format!(
                "the output size along dim {axis} would be {out}: the input ({input}) padded by \
                 {p} on each side is smaller than the kernel's extent {extent} (kernel {k}, \
                 dilation {d})"
            ),
        ));
    }
    Ok(out)
}

/// Checks `PyTorch`'s pooling rule that padding is at most half the kernel.
fn check_pool_padding(
    op: &'static str,
    shape: &Shape,
    axis: usize,
    kernel: i64,
    padding: i64,
) -> Result<(), ShapeError> {
    if padding > kernel / 2 {
        return Err(invalid(
            op,
            shape,
            format!(
                "padding {padding} along dim {axis} must be at most half the kernel size {kernel}"
            ),
        ));
    }
    Ok(())
}

/// The output size of a convolution along one spatial dim, as `torch.nn.Conv*d` computes it:
/// `floor((input + 2·padding - dilation·(kernel - 1) - 1) / stride) + 1`.
///
/// Fails if `stride`, `dilation` or `kernel` is 0, or if the output is provably
/// non-positive (the kernel doesn't fit the padded input). A symbolic `input` gives a
/// symbolic result; one that is only possibly non-positive is accepted.
///
/// ```
/// use tessel_shape::{Dim, rules::conv_out_dim};
/// assert_eq!(conv_out_dim(Dim::from(32), 3, 2, 1, 1).unwrap(), Dim::from(16));
/// ```
pub fn conv_out_dim(
    input: Dim,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Result<Dim, ShapeError> {
    const OP: &str = "conv";
    let shape = Shape::new(vec![input]);
    let w = Window {
        kernel: Dim::constant(to_i64(OP, &shape, "kernel size", kernel)?),
        stride: to_i64(OP, &shape, "stride", stride)?,
        padding: to_i64(OP, &shape, "padding", padding)?,
        dilation: to_i64(OP, &shape, "dilation", dilation)?,
    };
    out_dim(OP, &shape, 0, input, w, false)
}

/// The output size of a pooling window along one spatial dim, as `torch.nn.MaxPool*d`
/// computes it.
///
/// Like [`conv_out_dim`], but in `ceil_mode` the division rounds up, and then the last window
/// is dropped if it would start past the input and its left padding. `padding` must be at
/// most `kernel / 2`, as `PyTorch` requires.
///
/// ```
/// use tessel_shape::{Dim, rules::pool_out_dim};
/// assert_eq!(pool_out_dim(Dim::from(5), 2, 2, 0, 1, true).unwrap(), Dim::from(3));
/// assert_eq!(pool_out_dim(Dim::from(5), 2, 2, 1, 1, true).unwrap(), Dim::from(3));
/// ```
pub fn pool_out_dim(
    input: Dim,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    ceil_mode: bool,
) -> Result<Dim, ShapeError> {
    const OP: &str = "pool";
    let shape = Shape::new(vec![input]);
    let kernel = to_i64(OP, &shape, "kernel size", kernel)?;
    let padding = to_i64(OP, &shape, "padding", padding)?;
    check_pool_padding(OP, &shape, 0, kernel, padding)?;
    let w = Window {
        kernel: Dim::constant(kernel),
        stride: to_i64(OP, &shape, "stride", stride)?,
        padding,
        dilation: to_i64(OP, &shape, "dilation", dilation)?,
    };
    out_dim(OP, &shape, 0, input, w, ceil_mode)
}

/// One value of a per-spatial-dim parameter for each of `k` dims: `default` for none, one
/// value for all, or exactly `k` values.
fn per_dim(
    op: &'static str,
    shape: &Shape,
    name: &str,
    values: &[usize],
    k: usize,
    default: i64,
) -> Result<Vec<i64>, ShapeError> {
    match values.len() {
        0 => Ok(vec![default; k]),
        n if n == 1 || n == k => (0..k)
            .map(|i| to_i64(op, shape, name, values[if n == 1 { 0 } else { i }]))
            .collect(),
        n => Err(invalid(
            op,
            shape,
            format!("{name} has {n} values {values:?}; expected 1 or {k} (one per spatial dim)"),
        )),
    }
}

/// The output shape of `torch.nn.functional.conv1d/2d/3d`.
///
/// `input` is `[N, C, spatial...]` (or unbatched `[C, spatial...]`), `weight` is
/// `[O, C / groups, kernel...]` with 1, 2 or 3 spatial dims; the result is
/// `[N, O, out...]` (or `[O, out...]`), each `out` from [`conv_out_dim`]. `stride`,
/// `padding` and `dilation` give one value per spatial dim, or one for all, or none for the
/// defaults 1, 0 and 1. `C` must equal `weight[1] * groups` and `O` be divisible by `groups`.
///
/// ```
/// use tessel_shape::{Shape, rules::conv};
/// let out = conv(&Shape::from([8, 3, 32, 32]), &Shape::from([16, 3, 3, 3]), &[2], &[1], &[], 1);
/// assert_eq!(out.unwrap(), Shape::from([8, 16, 16, 16]));
/// ```
pub fn conv(
    input: &Shape,
    weight: &Shape,
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Result<Shape, ShapeError> {
    const OP: &str = "conv";
    let mismatch = |reason: String| ShapeError::ConvMismatch {
        op: OP,
        input: input.clone(),
        weight: weight.clone(),
        reason,
    };
    if !(3..=5).contains(&weight.ndim()) {
        return Err(ShapeError::RankMismatch {
            op: OP,
            shape: weight.clone(),
            expected: "3, 4 or 5 for a weight [out_channels, in_channels / groups, kernel...]"
                .to_owned(),
        });
    }
    let k = weight.ndim() - 2;
    let batched = match input.ndim() {
        n if n == k + 2 => true,
        n if n == k + 1 => false,
        n => {
            return Err(mismatch(format!(
                "a {k}-d convolution takes a {}-d input [N, C, spatial...] or an unbatched \
                 {}-d one, not {n}-d",
                k + 2,
                k + 1
            )));
        }
    };
    if groups == 0 {
        return Err(mismatch("groups must be positive, got 0".to_owned()));
    }
    let g = to_i64(OP, input, "groups", groups)?;
    let lead = usize::from(batched);
    let (channels, out_channels) = (input[lead], weight[0]);
    let expected = weight[1] * g;
    if channels != expected {
        let why = if channels.is_const() && expected.is_const() {
            String::new()
        } else {
            ", which can't be proven equal".to_owned()
        };
        return Err(mismatch(format!(
            "with groups={g} the input needs weight dim 1 × groups = {expected} channels, but \
             has {channels}{why}"
        )));
    }
    if out_channels.checked_rem(g) != Some(Dim::constant(0)) {
        return Err(mismatch(format!(
            "the weight's {out_channels} output channels are not (provably) divisible by \
             groups={g}"
        )));
    }
    let strides = per_dim(OP, input, "stride", stride, k, 1)?;
    let paddings = per_dim(OP, input, "padding", padding, k, 0)?;
    let dilations = per_dim(OP, input, "dilation", dilation, k, 1)?;
    let mut dims = input[..=lead].to_vec();
    dims[lead] = out_channels;
    for i in 0..k {
        let w = Window {
            kernel: weight[2 + i],
            stride: strides[i],
            padding: paddings[i],
            dilation: dilations[i],
        };
        let axis = lead + 1 + i;
        dims.push(out_dim(OP, input, axis, input[axis], w, false)?);
    }
    Ok(Shape::new(dims))
}

/// The output shape of `max_pool1d/2d/3d` (and `avg_pool*`, with dilation 1).
///
/// The window has `kernel.len()` (1, 2 or 3) spatial dims, the last dims of `input`, which
/// has one or two leading dims (`[C, spatial...]` or `[N, C, spatial...]`); those are kept
/// and each spatial dim becomes [`pool_out_dim`]. `stride` defaults to the kernel,
/// `padding` to 0 and `dilation` to 1; each takes one value for all dims or one per dim.
///
/// ```
/// use tessel_shape::{Shape, rules::pool};
/// let out = pool(&Shape::from([1, 3, 6, 5]), &[3, 2], &[2], &[1, 0], &[], true);
/// assert_eq!(out.unwrap(), Shape::from([1, 3, 4, 3]));
/// ```
pub fn pool(
    input: &Shape,
    kernel: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    ceil_mode: bool,
) -> Result<Shape, ShapeError> {
    const OP: &str = "pool";
    let k = kernel.len();
    if !(1..=3).contains(&k) {
        return Err(invalid(
            OP,
            input,
            format!("kernel {kernel:?} has {k} sizes; pooling supports 1, 2 or 3 spatial dims"),
        ));
    }
    let Some(lead) = input.ndim().checked_sub(k).filter(|l| (1..=2).contains(l)) else {
        return Err(ShapeError::RankMismatch {
            op: OP,
            shape: input.clone(),
            expected: format!(
                "{} or {} for a {k}-d window ([N,] C, spatial...)",
                k + 1,
                k + 2
            ),
        });
    };
    let kernels = per_dim(OP, input, "kernel", kernel, k, 1)?;
    let strides = if stride.is_empty() {
        kernels.clone()
    } else {
        per_dim(OP, input, "stride", stride, k, 1)?
    };
    let paddings = per_dim(OP, input, "padding", padding, k, 0)?;
    let dilations = per_dim(OP, input, "dilation", dilation, k, 1)?;
    let mut dims = input[..lead].to_vec();
    for i in 0..k {
        let axis = lead + i;
        check_pool_padding(OP, input, axis, kernels[i], paddings[i])?;
        let w = Window {
            kernel: Dim::constant(kernels[i]),
            stride: strides[i],
            padding: paddings[i],
            dilation: dilations[i],
        };
        dims.push(out_dim(OP, input, axis, input[axis], w, ceil_mode)?);
    }
    Ok(Shape::new(dims))
}
