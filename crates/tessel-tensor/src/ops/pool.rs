//! Pooling: max and average over the window view that `conv.rs` builds (see there), and
//! adaptive average pooling, each one fused reduce kernel (with its divisor folded in); and
//! nearest / linear resampling (`interpolate`), one masked-sum kernel per resized dim.

use tessel_graph::Op;
use tessel_shape::{DType, Scalar, Shape};

use super::conv::{
    batched, check_float, check_positive, invalid, out_size, to_i64, to_i64s, windows,
};
use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

/// Options of a pooling op (`torch.nn.functional.max_pool2d` / `avg_pool2d`). Build one
/// with [`PoolOptions::new`] from the kernel size, then set fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolOptions<const N: usize> {
    /// Window size, per spatial dim.
    pub kernel: [usize; N],
    /// Step between windows; `None` is the kernel size, as in `PyTorch`.
    pub stride: Option<[usize; N]>,
    /// Implicit padding on both sides, at most half the (dilated) kernel: `-inf` for max
    /// pooling, zeros for average pooling.
    pub padding: [usize; N],
    /// Spacing between window taps (max pooling only, as in `PyTorch`).
    pub dilation: [usize; N],
    /// Round the output size up instead of down (windows starting in the right padding are
    /// still dropped, as in `PyTorch`).
    pub ceil_mode: bool,
    /// Average pooling: count the padding zeros in the divisor (`PyTorch`'s default,
    /// `true`). Ignored by max pooling.
    pub count_include_pad: bool,
}

impl<const N: usize> PoolOptions<N> {
    /// Options for a `kernel`-sized window with `PyTorch`'s defaults: stride = kernel, no
    /// padding, dilation 1, floor mode, padding counted in averages.
    #[must_use]
    pub fn new(kernel: [usize; N]) -> Self {
        PoolOptions {
            kernel,
            stride: None,
            padding: [0; N],
            dilation: [1; N],
            ceil_mode: false,
            count_include_pad: true,
        }
    }
}

impl Tensor {
    /// 1-d max pooling (`torch.nn.functional.max_pool1d`) of `[N, C, L]` or `[C, L]`.
    /// See [`Tensor::max_pool2d`].
    ///
    /// ```
    /// # use tessel_tensor::{PoolOptions, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 2.0, 4.0, 3.0], [1, 5])?;
    /// let y = x.max_pool1d(&PoolOptions { ceil_mode: true, ..PoolOptions::new([2]) })?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![5.0, 4.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_pool1d(&self, opts: &PoolOptions<1>) -> Result<Tensor> {
        Ok(pool_nd(self, opts, None, false, "max_pool1d")?.0)
    }

    /// 2-d max pooling (`torch.nn.functional.max_pool2d`) of `[N, C, H, W]` or `[C, H, W]`:
    /// the maximum of each window (NaN if the window holds one), padding counting as
    /// `-inf`. Float dtypes only.
    ///
    /// ```
    /// # use tessel_tensor::{PoolOptions, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), [1, 4, 4])?;
    /// let y = x.max_pool2d(&PoolOptions::new([2, 2]))?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![5.0, 7.0, 13.0, 15.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_pool2d(&self, opts: &PoolOptions<2>) -> Result<Tensor> {
        Ok(pool_nd(self, opts, None, false, "max_pool2d")?.0)
    }

    /// 1-d average pooling (`torch.nn.functional.avg_pool1d`) of `[N, C, L]` or `[C, L]`.
    /// See [`Tensor::avg_pool2d`].
    ///
    /// ```
    /// # use tessel_tensor::{PoolOptions, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 5.0, 7.0], [1, 4])?;
    /// let y = x.avg_pool1d(&PoolOptions::new([2]))?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![2.0, 6.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn avg_pool1d(&self, opts: &PoolOptions<1>) -> Result<Tensor> {
        Ok(pool_nd(
            self,
            opts,
            Some(opts.count_include_pad),
            false,
            "avg_pool1d",
        )?
        .0)
    }

    /// 2-d average pooling (`torch.nn.functional.avg_pool2d`) of `[N, C, H, W]` or
    /// `[C, H, W]`: the mean of each window. The divisor is the window size clipped to the
    /// padded input with `count_include_pad` (`PyTorch`'s default), else the number of
    /// input elements in the window. Float dtypes only; dilation must be 1.
    ///
    /// ```
    /// # use tessel_tensor::{PoolOptions, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 2, 2])?;
    /// let opts = PoolOptions { padding: [1, 1], count_include_pad: false, ..PoolOptions::new([2, 2]) };
    /// assert_eq!(x.avg_pool2d(&opts)?.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn avg_pool2d(&self, opts: &PoolOptions<2>) -> Result<Tensor> {
        Ok(pool_nd(
            self,
            opts,
            Some(opts.count_include_pad),
            false,
            "avg_pool2d",
        )?
        .0)
    }

    /// Adaptive 1-d average pooling (`torch.nn.functional.adaptive_avg_pool1d`) of
    /// `[N, C, L]` or `[C, L]`. See [`Tensor::adaptive_avg_pool2d`].
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0], [1, 5])?;
    /// assert_eq!(x.adaptive_avg_pool1d([2])?.to_vec::<f32>()?, vec![2.0, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn adaptive_avg_pool1d(&self, output_size: [usize; 1]) -> Result<Tensor> {
        adaptive_avg(self, output_size, "adaptive_avg_pool1d")
    }

    /// Adaptive 2-d average pooling (`torch.nn.functional.adaptive_avg_pool2d`) of
    /// `[N, C, H, W]` or `[C, H, W]` to `output_size`: output `i` along a dim of size `n`
    /// averages input elements `floor(i * n / out) .. ceil((i + 1) * n / out)`, as in
    /// `PyTorch`. One fused kernel (a masked sum over the whole input per output, so
    /// `O(out × in)` work: fine for the usual small outputs, slow for large ones).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec((0..6).map(|v| v as f32).collect(), [1, 2, 3])?;
    /// assert_eq!(x.adaptive_avg_pool2d([1, 2])?.to_vec::<f32>()?, vec![2.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn adaptive_avg_pool2d(&self, output_size: [usize; 2]) -> Result<Tensor> {
        adaptive_avg(self, output_size, "adaptive_avg_pool2d")
    }

    /// `torch.nn.functional.interpolate(x, size, mode="nearest")`: input
    /// `[N, C, *spatial]` with 1 to 3 spatial dims resized to `size`; output element `i`
    /// along a dim takes input element `min(floor(i * in / out), in - 1)` (the scale in
    /// `f32`, as `PyTorch` computes it). Any dtype; values are selected, never computed.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec(vec![1i32, 2, 3], [1, 1, 3])?;
    /// assert_eq!(x.interpolate_nearest(&[5])?.to_vec::<i32>()?, vec![1, 1, 2, 2, 3]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn interpolate_nearest(&self, size: &[usize]) -> Result<Tensor> {
        const OP: &str = "interpolate_nearest";
        let spatial = check_resize(self, size, OP)?;
        let mut out = self.clone();
        for (a, (&n, &m)) in spatial.iter().zip(size).enumerate() {
            let idx = host_table(m, |i| nearest_index(i, n, m))?;
            out = select_along(&out, 2 + a, n, &idx)?;
        }
        Ok(out)
    }

    /// `torch.nn.functional.interpolate(x, size, mode=..., align_corners=...)` with
    /// `mode` `"linear"`, `"bilinear"` or `"trilinear"` by the number of spatial dims of
    /// `[N, C, *spatial]` (1 to 3), separably per dim with `PyTorch`'s source index: with
    /// `align_corners`, `i * (in - 1) / (out - 1)`; without, `(i + 0.5) * in / out - 0.5`
    /// clamped at 0. Float dtypes only.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec(vec![0.0f32, 4.0], [1, 1, 2])?;
    /// assert_eq!(x.interpolate_linear(&[3], true)?.to_vec::<f32>()?, vec![0.0, 2.0, 4.0]);
    /// assert_eq!(x.interpolate_linear(&[4], false)?.to_vec::<f32>()?, vec![0.0, 1.0, 3.0, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn interpolate_linear(&self, size: &[usize], align_corners: bool) -> Result<Tensor> {
        const OP: &str = "interpolate_linear";
        let spatial = check_resize(self, size, OP)?;
        check_float(self, OP)?;
        let wide = self.dtype() == DType::F64;
        let mut out = self.clone();
        for (a, (&n, &m)) in spatial.iter().zip(size).enumerate() {
            let taps = host_table(m, |i| linear_taps(i, n, m, align_corners, wide))?;
            let lo: Vec<usize> = taps.iter().map(|t| t.0).collect();
            let hi: Vec<usize> = taps.iter().map(|t| t.1).collect();
            let mut wdims = vec![m];
            wdims.extend(vec![1; spatial.len() - a - 1]);
            let w1: Vec<f64> = taps.iter().map(|t| t.2).collect();
            let w0: Vec<f64> = w1.iter().map(|l| 1.0 - l).collect();
            let g0 = select_along(&out, 2 + a, n, &lo)?;
            let g1 = select_along(&out, 2 + a, n, &hi)?;
            out = g0
                .mul(&weights_like(&w0, &wdims, self)?)?
                .add(&g1.mul(&weights_like(&w1, &wdims, self)?)?)?;
        }
        Ok(out)
    }

    /// 3-d max pooling (`torch.nn.functional.max_pool3d`) of `[N, C, D, H, W]` or
    /// `[C, D, H, W]`. See [`Tensor::max_pool2d`].
    ///
    /// ```
    /// # use tessel_tensor::{PoolOptions, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec((0..8).map(|v| v as f32).collect(), [1, 2, 2, 2])?;
    /// assert_eq!(x.max_pool3d(&PoolOptions::new([2, 2, 2]))?.to_vec::<f32>()?, vec![7.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_pool3d(&self, opts: &PoolOptions<3>) -> Result<Tensor> {
        Ok(pool_nd(self, opts, None, false, "max_pool3d")?.0)
    }

    /// 3-d average pooling (`torch.nn.functional.avg_pool3d`) of `[N, C, D, H, W]` or
    /// `[C, D, H, W]`. See [`Tensor::avg_pool2d`].
    ///
    /// ```
    /// # use tessel_tensor::{PoolOptions, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec((0..8).map(|v| v as f32).collect(), [1, 2, 2, 2])?;
    /// assert_eq!(x.avg_pool3d(&PoolOptions::new([2, 2, 2]))?.to_vec::<f32>()?, vec![3.5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn avg_pool3d(&self, opts: &PoolOptions<3>) -> Result<Tensor> {
        Ok(pool_nd(
            self,
            opts,
            Some(opts.count_include_pad),
            false,
            "avg_pool3d",
        )?
        .0)
    }

    /// [`Tensor::max_pool1d`] and the position of each maximum
    /// (`max_pool1d(..., return_indices=True)`). See [`Tensor::max_pool2d_with_indices`].
    ///
    /// ```
    /// # use tessel_tensor::{PoolOptions, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 4.0, 2.0], [1, 4])?;
    /// let (v, i) = x.max_pool1d_with_indices(&PoolOptions::new([2]))?;
    /// assert_eq!((v.to_vec::<f32>()?, i.to_vec::<i64>()?), (vec![5.0, 4.0], vec![1, 2]));
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_pool1d_with_indices(&self, opts: &PoolOptions<1>) -> Result<(Tensor, Tensor)> {
        with_indices(pool_nd(self, opts, None, true, "max_pool1d")?)
    }

    /// [`Tensor::max_pool2d`] and, as `i64`, the flat position `h * W + w` in its input
    /// plane of each maximum (`max_pool2d(..., return_indices=True)`): the first maximum
    /// in window order; for NaN the first NaN (`PyTorch`'s CPU kernel takes the last one
    /// when a window holds several).
    ///
    /// ```
    /// # use tessel_tensor::{PoolOptions, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 4.0, 2.0], [1, 2, 2])?;
    /// let (v, i) = x.max_pool2d_with_indices(&PoolOptions::new([2, 2]))?;
    /// assert_eq!((v.to_vec::<f32>()?, i.to_vec::<i64>()?), (vec![5.0], vec![1]));
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_pool2d_with_indices(&self, opts: &PoolOptions<2>) -> Result<(Tensor, Tensor)> {
        with_indices(pool_nd(self, opts, None, true, "max_pool2d")?)
    }
}

/// Max pooling for `avg == None`, else average pooling with `avg == Some(count_include_pad)`.
/// With `indices` (max pooling only), also the flat input position of each maximum.
fn pool_nd<const N: usize>(
    x: &Tensor,
    opts: &PoolOptions<N>,
    avg: Option<bool>,
    indices: bool,
    op: &'static str,
) -> Result<(Tensor, Option<Tensor>)> {
    let (xb, unbatched) = batched(x, N, op, "[batch, channels, *spatial]")?;
    check_float(x, op)?;
    let kernel = opts.kernel;
    let stride = opts.stride.unwrap_or(kernel);
    check_positive(op, "kernel", &kernel)?;
    check_positive(op, "stride", &stride)?;
    check_positive(op, "dilation", &opts.dilation)?;
    if avg.is_some() && opts.dilation.iter().any(|&d| d != 1) {
        return Err(invalid(
            op,
            format!(
                "average pooling has no dilation (as in PyTorch), got {:?}; leave it at 1",
                opts.dilation
            ),
        ));
    }
    let xd = xb.dims();
    let mut pads = Vec::with_capacity(N);
    let mut outs = Vec::with_capacity(N);
    for a in 0..N {
        let (i, k, s, d, p) = (
            xd[2 + a],
            kernel[a],
            stride[a],
            opts.dilation[a],
            opts.padding[a],
        );
        let eff = d * (k - 1) + 1;
        if 2 * p > eff {
            return Err(invalid(
                op,
                format!(
                    "padding {:?} must be at most half the (dilated) kernel {kernel:?} in every dim; reduce the padding",
                    opts.padding
                ),
            ));
        }
        let span = i + 2 * p;
        if span < eff {
            return Err(invalid(
                op,
                format!(
                    "the window ({kernel:?}, dilation {:?}) spans {eff} elements in spatial dim {a}, more than the padded input's {span} (input {}, padding {:?}); use a smaller kernel",
                    opts.dilation,
                    x.shape(),
                    opts.padding
                ),
            ));
        }
        let mut o = if opts.ceil_mode {
            (span - eff).div_ceil(s) + 1
        } else {
            out_size(span, eff, s)
        };
        // As in PyTorch, the last window must start inside the input or its left padding.
        if opts.ceil_mode && (o - 1) * s >= i + p {
            o -= 1;
        }
        // Ceil mode may need elements past the right padding; they never count.
        let extra = ((o - 1) * s + eff).saturating_sub(span);
        pads.push((p, extra));
        outs.push(o);
    }
    let full: Vec<(i64, i64)> = pads
        .iter()
        .map(|&(p, e)| (to_i64(p), to_i64(p + e)))
        .collect();
    let axes: Vec<i64> = (0..N).map(|a| to_i64(2 + N + a)).collect();
    let mut index = None;
    let mut out = if let Some(include_pad) = avg {
        let win = windows(&xb.pad(&full, 0.0)?, &kernel, &stride, &opts.dilation)?;
        let sums = win.sum(&axes, false)?;
        // The divisor of each window: the same window sum over ones where elements count.
        let ones = Tensor::record_on(
            x.device(),
            Op::Const(Scalar::F64(1.0).cast(x.dtype())),
            x.dtype(),
            Shape::from(&xd[2..]),
        );
        let counted = if include_pad {
            let inner: Vec<(i64, i64)> = opts
                .padding
                .iter()
                .map(|&p| (to_i64(p), to_i64(p)))
                .collect();
            let rest: Vec<(i64, i64)> = pads.iter().map(|&(_, e)| (0, to_i64(e))).collect();
            ones.pad(&inner, 1.0)?.pad(&rest, 0.0)?
        } else {
            ones.pad(&full, 0.0)?
        };
        let count_axes: Vec<i64> = (0..N).map(|a| to_i64(N + a)).collect();
        let counts =
            windows(&counted, &kernel, &stride, &opts.dilation)?.sum(&count_axes, false)?;
        sums.div(&counts)?
    } else {
        let win = windows(
            &xb.pad(&full, f64::NEG_INFINITY)?,
            &kernel,
            &stride,
            &opts.dilation,
        )?;
        if indices {
            let mut idx = max_indices(&win, &xd[2..], &full, &kernel, &stride, &opts.dilation)?;
            if unbatched {
                idx = idx.squeeze(Some(&[0]))?;
            }
            index = Some(idx);
        }
        win.max(&axes, false)?
    };
    debug_assert_eq!(out.dims()[2..], outs[..]);
    if unbatched {
        out = out.squeeze(Some(&[0]))?;
    }
    Ok((out, index))
}

/// The values and indices of a max pooling with `indices`.
fn with_indices((values, indices): (Tensor, Option<Tensor>)) -> Result<(Tensor, Tensor)> {
    let indices =
        indices.ok_or_else(|| Error::Internal("max pooling returned no indices".to_owned()))?;
    Ok((values, indices))
}

/// For max pooling's window view `win` (`[N, C, *o, *k]`) of an input of spatial dims
/// `spatial` padded by `pads`: the flat spatial position (`i64`, row-major over `spatial`)
/// of each window's maximum, as `PyTorch`'s `return_indices`: the first maximum in window
/// order, or the first NaN; a window of only `-inf` gives its first input position.
fn max_indices(
    win: &Tensor,
    spatial: &[usize],
    pads: &[(i64, i64)],
    kernel: &[usize],
    stride: &[usize],
    dilation: &[usize],
) -> Result<Tensor> {
    let n = spatial.len();
    let taps: usize = kernel.iter().product();
    let numel: usize = spatial.iter().product();
    let positions: Vec<i64> = (0..numel).map(to_i64).collect();
    let pos = Tensor::from_vec(positions, Shape::from(spatial))?.to(&win.device())?;
    // [*o, K] views of the positions, padding reading as `fill`.
    let outs = &win.dims()[2..2 + n];
    let mut flat = to_i64s(outs);
    flat.push(to_i64(taps));
    let pos_win = |fill: i64| -> Result<Tensor> {
        windows(&pos.pad(pads, fill)?, kernel, stride, dilation)?.reshape(&flat)
    };
    let mut wflat = to_i64s(&win.dims()[..2 + n]);
    wflat.push(to_i64(taps));
    let arg = win.reshape(&wflat)?.argmax(-1, true)?;
    let tap =
        Tensor::from_vec((0..taps).map(to_i64).collect::<Vec<i64>>(), [taps])?.to(&win.device())?;
    // The position of the arg-max tap; padding (-1) only if the maximum is a padding -inf,
    // when PyTorch reports the window's first input position instead.
    let chosen = Tensor::where_cond(&tap.eq(&arg)?, &pos_win(-1)?, i64::MIN)?.max(&[-1], false)?;
    let first = pos_win(i64::MAX)?.min(&[-1], false)?;
    Tensor::where_cond(&chosen.lt(0)?, &first, &chosen)
}

/// `PyTorch`'s adaptive window of output `i`: `floor(i * n / out) .. ceil((i + 1) * n / out)`.
fn adaptive_range(i: usize, n: usize, out: usize) -> (usize, usize) {
    (i * n / out, ((i + 1) * n).div_ceil(out))
}

fn adaptive_avg<const N: usize>(
    x: &Tensor,
    output_size: [usize; N],
    op: &'static str,
) -> Result<Tensor> {
    let (xb, unbatched) = batched(x, N, op, "[batch, channels, *spatial]")?;
    check_float(x, op)?;
    check_positive(op, "output_size", &output_size)?;
    let xd = xb.dims();
    let spatial = &xd[2..];
    if spatial.contains(&0) {
        return Err(invalid(
            op,
            format!(
                "the input {} has an empty spatial dim; there is nothing to average",
                x.shape()
            ),
        ));
    }
    // [N, C, 1.., *i], selected (not multiplied, so an inf stays in its own windows) by
    // the masks of every dim, [1, 1, .. o_a .., .. i_a ..], and summed over the input dims.
    let mut dims = xd[..2].to_vec();
    dims.extend([1; N]);
    dims.extend(spatial);
    let mut mask: Option<Tensor> = None;
    let mut counts = vec![1i32; output_size.iter().product()];
    for a in 0..N {
        let (n, o) = (spatial[a], output_size[a]);
        let data: Vec<bool> = (0..o * n)
            .map(|f| {
                let (start, end) = adaptive_range(f / n, n, o);
                (start..end).contains(&(f % n))
            })
            .collect();
        let mut mdims = vec![1; 2 + 2 * N];
        mdims[2 + a] = o;
        mdims[2 + N + a] = n;
        let m = Tensor::from_vec(data, Shape::from(mdims.as_slice()))?.to(&x.device())?;
        mask = Some(match mask {
            None => m,
            Some(prev) => prev.logical_and(&m)?,
        });
        // Counts in row-major order over the output dims: axis a's stride.
        let inner: usize = output_size[a + 1..].iter().product();
        for (f, c) in counts.iter_mut().enumerate() {
            let (start, end) = adaptive_range((f / inner) % o, n, o);
            *c *= i32::try_from(end - start).unwrap_or(i32::MAX);
        }
    }
    let mask = mask.ok_or_else(|| invalid(op, "no spatial dims".to_owned()))?;
    let axes: Vec<i64> = (0..N).map(|a| to_i64(2 + N + a)).collect();
    let sums = Tensor::where_cond(&mask, xb.reshape_to(Shape::from(dims.as_slice())), 0.0)?
        .sum(&axes, false)?;
    let counts = Tensor::from_vec(counts, Shape::from(&output_size[..]))?
        .to(&x.device())?
        .cast(x.dtype());
    let out = sums.div(&counts)?;
    if unbatched {
        return out.squeeze(Some(&[0]));
    }
    Ok(out)
}

/// The spatial dims of `x` (`[N, C, *spatial]`), checked against `size`.
fn check_resize(x: &Tensor, size: &[usize], op: &'static str) -> Result<Vec<usize>> {
    x.check_size(op)?;
    if !(1..=3).contains(&size.len()) || x.ndim() != size.len() + 2 {
        return Err(invalid(
            op,
            format!(
                "expected an input [batch, channels, *spatial] with 1 to 3 spatial dims and one size per spatial dim, got input {} and size {size:?}",
                x.shape()
            ),
        ));
    }
    check_positive(op, "size", size)?;
    // The result's element count must be possible (the host tables of one entry per
    // output position are allocated fallibly, by `host_table`).
    let leading: Vec<usize> = x.dims()[..2].to_vec();
    let count = leading.iter().chain(size).try_fold(1i64, |acc, &d| {
        i64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    if count.is_none() {
        return Err(invalid(
            op,
            format!(
                "the result of resizing {} to {size:?} would hold more than i64::MAX elements",
                x.shape()
            ),
        ));
    }
    let spatial = x.dims()[2..].to_vec();
    if spatial.contains(&0) {
        return Err(invalid(
            op,
            format!(
                "the input {} has an empty spatial dim; there is nothing to resample",
                x.shape()
            ),
        ));
    }
    Ok(spatial)
}

/// `f(0), ..., f(m - 1)` in host memory reserved fallibly: `m` is a size the user gave.
fn host_table<T>(m: usize, f: impl Fn(usize) -> T) -> Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(m).map_err(|_| {
        tessel_runtime::out_of_host_memory(m.saturating_mul(std::mem::size_of::<T>()))
    })?;
    out.extend((0..m).map(f));
    Ok(out)
}

/// `PyTorch`'s nearest source index (`nearest_idx`, scale in `f32`).
fn nearest_index(i: usize, n: usize, m: usize) -> usize {
    if m == n {
        i
    } else if m == 2 * n {
        i / 2
    } else {
        // Sizes are small enough that f32 holds them exactly, as PyTorch assumes.
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let src = (i as f32 * (n as f32 / m as f32)).floor() as usize;
        src.min(n - 1)
    }
}

/// `PyTorch`'s two linear taps of output `i` and the weight of the second, computed in
/// `f64` for `f64` inputs and `f32` otherwise, as `PyTorch`'s accumulate type.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
fn linear_taps(
    i: usize,
    n: usize,
    m: usize,
    align_corners: bool,
    wide: bool,
) -> (usize, usize, f64) {
    let round = |v: f64| if wide { v } else { f64::from(v as f32) };
    let scale = if align_corners {
        if m > 1 {
            round((n - 1) as f64 / (m - 1) as f64)
        } else {
            0.0
        }
    } else {
        round(n as f64 / m as f64)
    };
    let src = if align_corners {
        round(scale * i as f64)
    } else {
        round(round(scale * (i as f64 + 0.5)) - 0.5).max(0.0)
    };
    let lo = (src.floor() as usize).min(n - 1);
    let hi = if lo + 1 < n { lo + 1 } else { lo };
    (lo, hi, round(src - lo as f64))
}

/// `x` with `axis` (of size `n`) replaced by elements `idx` of it: the maximum over a
/// one-hot `[m, n]` selection filled with the dtype's lowest value, so values come through
/// exactly (NaN, ±inf and -0.0 included) in every dtype.
fn select_along(x: &Tensor, axis: usize, n: usize, idx: &[usize]) -> Result<Tensor> {
    if idx.len() == n && idx.iter().enumerate().all(|(i, &j)| i == j) {
        return Ok(x.clone());
    }
    let m = idx.len();
    let post = x.ndim() - axis - 1;
    let mut mdims = vec![m, n];
    mdims.extend(vec![1; post]);
    let cells = m.checked_mul(n).ok_or_else(|| {
        invalid(
            "interpolate",
            format!("a selection of {m} from {n} positions is past memory"),
        )
    })?;
    let data = host_table(cells, |f| idx[f / n] == f % n)?;
    let mask = Tensor::from_vec(data, Shape::from(mdims.as_slice()))?.to(&x.device())?;
    let mut dims = x.dims();
    dims.insert(axis, 1);
    let spread = x.reshape_to(Shape::from(dims.as_slice()));
    let dtype = x.dtype();
    let lowest = if dtype.is_float() {
        Scalar::F64(f64::NEG_INFINITY).cast(dtype)
    } else {
        dtype.min_value()
    };
    let fill = spread.full_like_scalar(lowest, dtype);
    Tensor::where_cond(&mask, &spread, &fill)?.max(&[to_i64(axis + 1)], false)
}

/// `values` in `dims` as a tensor of `like`'s dtype on its device (built in `f64` for
/// `f64`, else `f32`, so no device needs a dtype the input doesn't already use).
fn weights_like(values: &[f64], dims: &[usize], like: &Tensor) -> Result<Tensor> {
    let shape = Shape::from(dims);
    let t = if like.dtype() == DType::F64 {
        Tensor::from_vec(values.to_vec(), shape)?
    } else {
        #[allow(clippy::cast_possible_truncation)]
        let v: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        Tensor::from_vec(v, shape)?
    };
    Ok(t.to(&like.device())?.cast(like.dtype()))
}
