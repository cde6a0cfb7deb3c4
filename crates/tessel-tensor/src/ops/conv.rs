//! Convolution, composed from movement, elementwise and reduce ops.
//!
//! Every op here first builds a *window view* of its (padded) input, `[.., o1..on, k1..kn]`,
//! in the manner of tinygrad's `Tensor._pool`: each spatial axis of size `i` is repeated
//! (an expand, no copy), cut to `k * (i + d)` elements and reshaped to `[k, i + d]`, so row
//! `j` starts `j * d` elements further into the input; a strided slice of each row then
//! picks the `o` window starts. All of it is index arithmetic, so a convolution (window
//! view × weights, summed) or a pooling (max or mean over the window axes) is one fused
//! reduce kernel, with no im2col buffer.

use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

/// How a convolution pads its input (`padding=` of `torch.nn.functional.conv2d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Padding<const N: usize> {
    /// No padding (`padding="valid"`, or `0`).
    #[default]
    Valid,
    /// Pad so that the output has the input's size (`padding="same"`); only for stride 1,
    /// as in `PyTorch`. An odd total goes to the end (right/bottom), as in `PyTorch`.
    Same,
    /// This many zeros on both sides of each spatial dim (`padding=(ph, pw)`).
    Explicit([usize; N]),
}

/// Options of a convolution (`stride`, `padding`, `dilation`, `groups` of
/// `torch.nn.functional.conv2d`); `Default` is `PyTorch`'s defaults: stride 1, no padding,
/// dilation 1, one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvOptions<const N: usize> {
    /// Step between windows, per spatial dim.
    pub stride: [usize; N],
    /// Padding of the input.
    pub padding: Padding<N>,
    /// Spacing between kernel taps, per spatial dim.
    pub dilation: [usize; N],
    /// Number of channel groups; input and output channels must both be multiples of it.
    pub groups: usize,
}

impl<const N: usize> Default for ConvOptions<N> {
    fn default() -> Self {
        ConvOptions {
            stride: [1; N],
            padding: Padding::Valid,
            dilation: [1; N],
            groups: 1,
        }
    }
}

/// Options of [`Tensor::conv1d`].
pub type Conv1dOptions = ConvOptions<1>;
/// Options of [`Tensor::conv2d`].
pub type Conv2dOptions = ConvOptions<2>;
/// Options of [`Tensor::conv3d`].
pub type Conv3dOptions = ConvOptions<3>;

pub(super) fn invalid(op: &'static str, reason: String) -> Error {
    Error::InvalidArgument { op, reason }
}

impl Tensor {
    /// 1-d convolution (`torch.nn.functional.conv1d`; cross-correlation, as in `PyTorch`):
    /// input `[N, C_in, L]` (or unbatched `[C_in, L]`), weight `[C_out, C_in / groups, K]`,
    /// optional bias `[C_out]`. See [`Tensor::conv2d`].
    ///
    /// ```
    /// # use tessel_tensor::{Conv1dOptions, Padding, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 1, 4])?;
    /// let w = Tensor::from_vec(vec![1.0f32, -1.0], [1, 1, 2])?;
    /// let y = x.conv1d(&w, None, &Conv1dOptions { padding: Padding::Explicit([1]), ..Conv1dOptions::default() })?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![-1.0, -1.0, -1.0, -1.0, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn conv1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv1dOptions,
    ) -> Result<Tensor> {
        conv_nd(self, weight, bias, opts, "conv1d")
    }

    /// 2-d convolution (`torch.nn.functional.conv2d`; cross-correlation, as in `PyTorch`):
    /// input `[N, C_in, H, W]` (or unbatched `[C_in, H, W]`), weight
    /// `[C_out, C_in / groups, kH, kW]`, optional bias `[C_out]`; the result is
    /// `[N, C_out, H_out, W_out]` with `H_out = (H + pads - dH * (kH - 1) - 1) / sH + 1`.
    /// Input, weight and bias must share one float dtype. One fused kernel.
    ///
    /// ```
    /// # use tessel_tensor::{Conv2dOptions, Padding, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), [1, 1, 4, 4])?;
    /// let w = Tensor::ones([2, 1, 3, 3], tessel_tensor::DType::F32);
    /// let y = x.conv2d(&w, None, &Conv2dOptions { stride: [2, 2], padding: Padding::Explicit([1, 1]), ..Conv2dOptions::default() })?;
    /// assert_eq!(y.dims(), vec![1, 2, 2, 2]);
    /// assert_eq!(y.to_vec::<f32>()?[..4], [10.0, 24.0, 51.0, 90.0]);
    /// assert!(x.conv2d(&Tensor::ones([1, 2, 3, 3], tessel_tensor::DType::F32), None, &Conv2dOptions::default()).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
    ) -> Result<Tensor> {
        conv_nd(self, weight, bias, opts, "conv2d")
    }

    /// 3-d convolution (`torch.nn.functional.conv3d`): input `[N, C_in, D, H, W]` (or
    /// unbatched), weight `[C_out, C_in / groups, kD, kH, kW]`. See [`Tensor::conv2d`].
    ///
    /// ```
    /// # use tessel_tensor::{Conv3dOptions, DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::ones([1, 2, 3, 3, 3], DType::F32);
    /// let w = Tensor::ones([1, 2, 2, 2, 2], DType::F32);
    /// let y = x.conv3d(&w, None, &Conv3dOptions::default())?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![16.0; 8]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn conv3d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv3dOptions,
    ) -> Result<Tensor> {
        conv_nd(self, weight, bias, opts, "conv3d")
    }
}

/// Checks that `t` has a float dtype, for `op`'s `what` argument.
pub(super) fn check_float(t: &Tensor, op: &'static str) -> Result<()> {
    if t.dtype().is_float() && !t.dtype().is_float8() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op,
            dtype: t.dtype(),
            hint: super::float8_hint(
                t.dtype(),
                "convolution and pooling need a float dtype; cast with .cast(DType::F32)",
            ),
        })
    }
}

/// Checks that every entry of `v` (the `what` option) is at least 1.
pub(super) fn check_positive(op: &'static str, what: &str, v: &[usize]) -> Result<()> {
    if v.contains(&0) {
        return Err(invalid(
            op,
            format!("{what} must be at least 1 in every dim, got {v:?}"),
        ));
    }
    Ok(())
}

/// `x` batched: `x` itself if it has `n + 2` dims, `x` with a leading size-1 dim if it has
/// `n + 1` (an unbatched input, as `PyTorch` accepts), and whether a dim was added.
pub(super) fn batched(
    x: &Tensor,
    n: usize,
    op: &'static str,
    layout: &str,
) -> Result<(Tensor, bool)> {
    x.check_size(op)?;
    if x.ndim() == n + 2 {
        Ok((x.clone(), false))
    } else if x.ndim() == n + 1 {
        Ok((x.unsqueeze(0)?, true))
    } else {
        Err(invalid(
            op,
            format!(
                "expected a {}-d input {layout} or a {}-d unbatched one, got shape {}",
                n + 2,
                n + 1,
                x.shape()
            ),
        ))
    }
}

pub(super) fn to_i64(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn to_i64s(v: &[usize]) -> Vec<i64> {
    v.iter().copied().map(to_i64).collect()
}

/// The window view of `x`, whose last `kernel.len()` dims are already padded:
/// `[.., i1..in]` becomes `[.., o1..on, k1..kn]`, element `[.., p, j]` being input element
/// `p * stride + j * dilation` along each spatial dim. Every padded size must hold one
/// dilated kernel (checked by the callers). A view: no copy, no kernel.
pub(super) fn windows(
    x: &Tensor,
    kernel: &[usize],
    stride: &[usize],
    dilation: &[usize],
) -> Result<Tensor> {
    let n = kernel.len();
    let lead = x.ndim() - n;
    let mut t = x.clone();
    for a in 0..n {
        // Earlier spatial dims have already been split into [k, o] pairs.
        let axis = lead + 2 * a;
        let i = t.dims()[axis];
        let (k, s, d) = (kernel[a], stride[a], dilation[a]);
        let o = (i - d * (k - 1) - 1) / s + 1;
        // k rows of i + d elements of the input repeated end to end: row j starts at
        // element j * (i + d) ≡ j * d (mod i), so it is the input shifted by j * d, and the
        // window starts p * s never wrap around (d * (k - 1) + (o - 1) * s < i).
        let row = i + d;
        let mut reps = vec![1; t.ndim()];
        reps[axis] = (k * row).div_ceil(i);
        let mut dims = to_i64s(&t.dims());
        t = t.repeat(&reps)?.narrow(to_i64(axis), 0, to_i64(k * row))?;
        dims.splice(axis..=axis, [to_i64(k), to_i64(row)]);
        t = t.reshape(&dims)?.slice(
            to_i64(axis + 1),
            Some(0),
            Some(to_i64((o - 1) * s + 1)),
            to_i64(s),
        )?;
    }
    let perm: Vec<i64> = (0..lead)
        .chain((0..n).map(|a| lead + 2 * a + 1))
        .chain((0..n).map(|a| lead + 2 * a))
        .map(to_i64)
        .collect();
    t.permute(&perm)
}

/// The output size of a window of `eff` (dilated) elements sliding by `s` over `span`
/// elements (already checked to hold one window).
pub(super) fn out_size(span: usize, eff: usize, s: usize) -> usize {
    (span - eff) / s + 1
}

fn conv_nd<const N: usize>(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &ConvOptions<N>,
    op: &'static str,
) -> Result<Tensor> {
    let (xb, unbatched) = batched(x, N, op, "[batch, channels, *spatial]")?;
    x.same_device(weight, op)?;
    check_float(x, op)?;
    if weight.dtype() != x.dtype() {
        return Err(invalid(
            op,
            format!(
                "input is {} but weight is {}; cast one with .cast(DType::...) so they match",
                x.dtype(),
                weight.dtype()
            ),
        ));
    }
    if weight.ndim() != N + 2 {
        return Err(invalid(
            op,
            format!(
                "weight must be {}-d [out_channels, in_channels / groups, *kernel], got shape {}",
                N + 2,
                weight.shape()
            ),
        ));
    }
    check_positive(op, "stride", &opts.stride)?;
    check_positive(op, "dilation", &opts.dilation)?;
    let g = opts.groups;
    let xd = xb.dims();
    let wd = weight.dims();
    let (nb, cin, cout, cg) = (xd[0], xd[1], wd[0], wd[1]);
    let kernel = &wd[2..];
    if g == 0 || cin % g != 0 || cout % g != 0 {
        return Err(invalid(
            op,
            format!(
                "groups={g} must be at least 1 and divide both the input channels ({cin}, input {}) and the output channels ({cout}, weight {})",
                x.shape(),
                weight.shape()
            ),
        ));
    }
    if cin / g != cg {
        return Err(invalid(
            op,
            format!(
                "input {} has {cin} channels, so with groups={g} the weight's dim 1 must be {}, but weight is {}",
                x.shape(),
                cin / g,
                weight.shape()
            ),
        ));
    }
    check_positive(op, "the kernel size (weight dims 2..)", kernel)?;
    let pads: Vec<(usize, usize)> = match opts.padding {
        Padding::Valid => vec![(0, 0); N],
        Padding::Explicit(p) => p.iter().map(|&p| (p, p)).collect(),
        Padding::Same => {
            if opts.stride.iter().any(|&s| s != 1) {
                return Err(invalid(
                    op,
                    format!(
                        "padding Same needs stride 1 (as in PyTorch), got stride {:?}; use Padding::Explicit",
                        opts.stride
                    ),
                ));
            }
            (0..N)
                .map(|a| {
                    let total = opts.dilation[a] * (kernel[a] - 1);
                    (total / 2, total - total / 2)
                })
                .collect()
        }
    };
    let mut outs = Vec::with_capacity(N);
    for a in 0..N {
        let span = xd[2 + a] + pads[a].0 + pads[a].1;
        let eff = opts.dilation[a] * (kernel[a] - 1) + 1;
        if span < eff {
            return Err(invalid(
                op,
                format!(
                    "the kernel (weight {}, dilation {:?}) spans {eff} elements in spatial dim {a}, more than the padded input's {span} (input {}, padding {pads:?}); use a smaller kernel or more padding",
                    weight.shape(),
                    opts.dilation,
                    x.shape()
                ),
            ));
        }
        outs.push(out_size(span, eff, opts.stride[a]));
    }
    let ipads: Vec<(i64, i64)> = pads.iter().map(|&(l, r)| (to_i64(l), to_i64(r))).collect();
    let win = windows(&xb.pad(&ipads, 0.0)?, kernel, &opts.stride, &opts.dilation)?;
    // A matrix product per group: [N, G, P, K] × [G, K, O/G] with P the output positions
    // and K = C/G × kernel taps, so the window view fuses into one kernel and a library
    // matmul may compute it instead (reading a materialized im2col), whichever measures
    // faster.
    let positions: usize = outs.iter().product();
    let taps = cg * kernel.iter().product::<usize>();
    let mut wdims = vec![nb, g, cg];
    wdims.extend(&outs);
    wdims.extend(kernel);
    let win = win.reshape(&to_i64s(&wdims))?;
    // [N, G, C/G, *o, *k] → [N, G, *o, C/G, *k].
    let perm: Vec<usize> = [0, 1]
        .into_iter()
        .chain(3..3 + N)
        .chain([2])
        .chain(3 + N..3 + 2 * N)
        .collect();
    let cols = win.permute(&to_i64s(&perm))?;
    let w = weight
        .reshape(&to_i64s(&[g, cout / g, taps]))?
        .transpose(1, 2)?;
    let prod = if g == 1 {
        // One group: [N, P, K] × [K, O], so the weight is one matrix for every batch.
        let cols = cols.reshape(&to_i64s(&[nb, positions, taps]))?;
        cols.matmul(&w.squeeze(Some(&[0]))?)?
    } else {
        let cols = cols.reshape(&to_i64s(&[nb, g, positions, taps]))?;
        cols.matmul(&w)?
    };
    // [N, (G,) P, O/G] → [N, (G,) O/G, P] → [N, O, *o].
    let prod = prod.transpose(-1, -2)?;
    let mut out_dims = vec![nb, cout];
    out_dims.extend(&outs);
    let mut out = prod.reshape(&to_i64s(&out_dims))?;
    if let Some(b) = bias {
        x.same_device(b, op)?;
        if b.dtype() != x.dtype() || b.dims() != [cout] {
            return Err(invalid(
                op,
                format!(
                    "bias must be a 1-d {} tensor of the {cout} output channels, got {} {}",
                    x.dtype(),
                    b.dtype(),
                    b.shape()
                ),
            ));
        }
        let mut bdims = vec![to_i64(cout)];
        bdims.extend([1; N]);
        out = out.add(&b.reshape(&bdims)?)?;
    }
    if unbatched {
        out = out.squeeze(Some(&[0]))?;
    }
    Ok(out)
}

impl Tensor {
    /// Sliding local blocks as columns (`torch.nn.functional.unfold`, "im2col"; named so
    /// because `Tensor::unfold` is `PyTorch`'s other, 1-d op): input `[N, C, H, W]` (or
    /// unbatched `[C, H, W]`) becomes `[N, C * kH * kW, L]`, `L` being the number of
    /// window positions, row `c * kH * kW + i * kW + j` holding tap `(i, j)` of channel
    /// `c`. Padding is zeros. Any dtype. A view until realized.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec((0..6).collect::<Vec<i32>>(), [1, 1, 2, 3])?;
    /// let cols = x.im2col([2, 2], [1, 1], [0, 0], [1, 1])?;
    /// assert_eq!(cols.dims(), vec![1, 4, 2]);
    /// assert_eq!(cols.to_vec::<i32>()?, vec![0, 1, 1, 2, 3, 4, 4, 5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn im2col(
        &self,
        kernel: [usize; 2],
        dilation: [usize; 2],
        padding: [usize; 2],
        stride: [usize; 2],
    ) -> Result<Tensor> {
        const OP: &str = "im2col";
        let (xb, unbatched) = batched(self, 2, OP, "[batch, channels, height, width]")?;
        check_positive(OP, "kernel", &kernel)?;
        check_positive(OP, "dilation", &dilation)?;
        check_positive(OP, "stride", &stride)?;
        let xd = xb.dims();
        let mut outs = [0; 2];
        for a in 0..2 {
            let span = xd[2 + a] + 2 * padding[a];
            let eff = dilation[a] * (kernel[a] - 1) + 1;
            if span < eff {
                return Err(invalid(
                    OP,
                    format!(
                        "the block ({kernel:?}, dilation {dilation:?}) spans {eff} elements in spatial dim {a}, more than the padded input's {span} (input {}, padding {padding:?}); use a smaller kernel or more padding",
                        self.shape()
                    ),
                ));
            }
            outs[a] = out_size(span, eff, stride[a]);
        }
        let pads = padding.map(|p| (to_i64(p), to_i64(p)));
        let win = windows(&xb.pad(&pads, 0)?, &kernel, &stride, &dilation)?;
        let (nb, c) = (xd[0], xd[1]);
        let cols = win.permute(&[0, 1, 4, 5, 2, 3])?.reshape(&to_i64s(&[
            nb,
            c * kernel[0] * kernel[1],
            outs[0] * outs[1],
        ]))?;
        if unbatched {
            return cols.squeeze(Some(&[0]));
        }
        Ok(cols)
    }

    /// Transposed 1-d convolution (`torch.nn.functional.conv_transpose1d`). See
    /// [`Tensor::conv_transpose2d`].
    ///
    /// ```
    /// # use tessel_tensor::{Conv1dOptions, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [1, 1, 2])?;
    /// let w = Tensor::from_vec(vec![1.0f32, 10.0], [1, 1, 2])?;
    /// let y = x.conv_transpose1d(&w, None, &Conv1dOptions { stride: [2], ..Conv1dOptions::default() }, [0])?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 10.0, 2.0, 20.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn conv_transpose1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv1dOptions,
        output_padding: [usize; 1],
    ) -> Result<Tensor> {
        conv_transpose_nd(self, weight, bias, opts, output_padding, "conv_transpose1d")
    }

    /// Transposed 2-d convolution (`torch.nn.functional.conv_transpose2d`, the gradient of
    /// [`Tensor::conv2d`] with respect to its input): input `[N, C_in, H, W]` (or
    /// unbatched), weight `[C_in, C_out / groups, kH, kW]`, optional bias `[C_out]`;
    /// `H_out = (H - 1) * sH - 2 * pH + dH * (kH - 1) + output_padding + 1`. `opts.padding`
    /// must be explicit (or valid); `output_padding` must be smaller than the stride or
    /// the dilation. Built as a stride-1 convolution of the zero-stuffed, padded input with
    /// the flipped, transposed weight.
    ///
    /// ```
    /// # use tessel_tensor::{Conv2dOptions, DType, Padding, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::ones([1, 2, 3, 3], DType::F32);
    /// let w = Tensor::ones([2, 4, 3, 3], DType::F32);
    /// let opts = Conv2dOptions { stride: [2, 2], padding: Padding::Explicit([1, 1]), ..Conv2dOptions::default() };
    /// assert_eq!(x.conv_transpose2d(&w, None, &opts, [1, 1])?.dims(), vec![1, 4, 6, 6]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv2dOptions,
        output_padding: [usize; 2],
    ) -> Result<Tensor> {
        conv_transpose_nd(self, weight, bias, opts, output_padding, "conv_transpose2d")
    }

    /// Transposed 3-d convolution (`torch.nn.functional.conv_transpose3d`). See
    /// [`Tensor::conv_transpose2d`].
    ///
    /// ```
    /// # use tessel_tensor::{Conv3dOptions, DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::ones([1, 1, 2, 2, 2], DType::F32);
    /// let w = Tensor::ones([1, 3, 2, 2, 2], DType::F32);
    /// let y = x.conv_transpose3d(&w, None, &Conv3dOptions { stride: [2, 2, 2], ..Conv3dOptions::default() }, [0; 3])?;
    /// assert_eq!(y.dims(), vec![1, 3, 4, 4, 4]);
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.0; 192]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn conv_transpose3d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: &Conv3dOptions,
        output_padding: [usize; 3],
    ) -> Result<Tensor> {
        conv_transpose_nd(self, weight, bias, opts, output_padding, "conv_transpose3d")
    }
}

fn conv_transpose_nd<const N: usize>(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &ConvOptions<N>,
    output_padding: [usize; N],
    op: &'static str,
) -> Result<Tensor> {
    let (xb, unbatched) = batched(x, N, op, "[batch, channels, *spatial]")?;
    x.same_device(weight, op)?;
    check_float(x, op)?;
    check_positive(op, "stride", &opts.stride)?;
    check_positive(op, "dilation", &opts.dilation)?;
    if weight.dtype() != x.dtype() || weight.ndim() != N + 2 {
        return Err(invalid(
            op,
            format!(
                "weight must be a {}-d {} tensor [in_channels, out_channels / groups, *kernel], got {} {}",
                N + 2,
                x.dtype(),
                weight.dtype(),
                weight.shape()
            ),
        ));
    }
    let padding = match opts.padding {
        Padding::Valid => [0; N],
        Padding::Explicit(p) => p,
        Padding::Same => {
            return Err(invalid(
                op,
                "padding Same is not defined for transposed convolutions (as in PyTorch); use Padding::Explicit".to_owned(),
            ));
        }
    };
    let g = opts.groups;
    let xd = xb.dims();
    let wd = weight.dims();
    let (cin, cog) = (xd[1], wd[1]);
    let kernel = &wd[2..];
    check_positive(op, "the kernel size (weight dims 2..)", kernel)?;
    if g == 0 || cin % g != 0 || wd[0] != cin {
        return Err(invalid(
            op,
            format!(
                "the weight's dim 0 must equal the input's {cin} channels and groups={g} must divide it, got input {} and weight {}",
                x.shape(),
                weight.shape()
            ),
        ));
    }
    let mut t = xb;
    let mut pads = Vec::with_capacity(N);
    for a in 0..N {
        let (i, k, s, d, p, op_) = (
            xd[2 + a],
            kernel[a],
            opts.stride[a],
            opts.dilation[a],
            padding[a],
            output_padding[a],
        );
        if op_ >= s.max(d) {
            return Err(invalid(
                op,
                format!(
                    "output_padding {output_padding:?} must be smaller than the stride {:?} or the dilation {:?} in every dim",
                    opts.stride, opts.dilation
                ),
            ));
        }
        let full = (i.max(1) - 1) * s + d * (k - 1) + op_ + 1;
        if i == 0 || full <= 2 * p {
            return Err(invalid(
                op,
                format!(
                    "the output would have no elements in spatial dim {a} (input {}, weight {}, padding {padding:?}); reduce the padding",
                    x.shape(),
                    weight.shape()
                ),
            ));
        }
        // Zero-stuffing: [.., i, ..] -> [.., i, s, ..] padded with s - 1 zeros -> merged,
        // cut after the last input element.
        let axis = 2 + a;
        if s > 1 {
            let mut dims = to_i64s(&t.dims());
            let mut split = dims.clone();
            split.insert(axis + 1, 1);
            let mut zeros = vec![(0, 0); split.len() - axis - 1];
            zeros[0] = (0, to_i64(s - 1));
            dims[axis] = to_i64(i * s);
            t = t.reshape(&split)?.pad(&zeros, 0)?.reshape(&dims)?.narrow(
                to_i64(axis),
                0,
                to_i64((i - 1) * s + 1),
            )?;
        }
        let edge = to_i64(d * (k - 1)) - to_i64(p);
        pads.push((edge, edge + to_i64(op_)));
    }
    // [C_in, C_out/G, *k] -> [C_out, C_in/G, *k], kernel flipped.
    let mut split = vec![g, cin / g, cog];
    split.extend(kernel);
    let mut perm: Vec<i64> = vec![0, 2, 1];
    perm.extend((3..3 + N).map(to_i64));
    let mut wdims = vec![cog * g, cin / g];
    wdims.extend(kernel);
    let flip: Vec<i64> = (2..2 + N).map(to_i64).collect();
    let w = weight
        .reshape(&to_i64s(&split))?
        .permute(&perm)?
        .reshape(&to_i64s(&wdims))?
        .flip(&flip)?;
    let conv = ConvOptions {
        stride: [1; N],
        padding: Padding::Valid,
        dilation: opts.dilation,
        groups: g,
    };
    let out = conv_nd(&t.pad(&pads, 0)?, &w, bias, &conv, op)?;
    if unbatched {
        return out.squeeze(Some(&[0]));
    }
    Ok(out)
}
