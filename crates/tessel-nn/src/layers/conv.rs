//! `Conv1d` and `Conv2d`: learned filters over the Tensor convolution ops.

use tessel_tensor::{ConvOptions, Padding, Result, Tensor};

use super::{check_dtype, check_rank, impl_forward, invalid};
use crate::init::{ParamOptions, fan_in_uniform};
use crate::{Module, Visitor};

/// Checks the channel counts, kernel and options shared by every convolution layer.
fn check_config<const N: usize>(
    op: &'static str,
    in_channels: usize,
    out_channels: usize,
    kernel: [usize; N],
    conv: &ConvOptions<N>,
) -> Result<()> {
    let bad = |reason: String| Err(invalid(op, reason));
    if in_channels == 0 || out_channels == 0 {
        return bad(format!(
            "in_channels and out_channels must be positive, got {in_channels} and {out_channels}"
        ));
    }
    if conv.groups == 0
        || !in_channels.is_multiple_of(conv.groups)
        || !out_channels.is_multiple_of(conv.groups)
    {
        return bad(format!(
            "groups = {} must be positive and divide both in_channels = {in_channels} and out_channels = {out_channels}",
            conv.groups
        ));
    }
    if kernel.contains(&0) || conv.stride.contains(&0) || conv.dilation.contains(&0) {
        return bad(format!(
            "kernel_size {kernel:?}, stride {:?} and dilation {:?} must all be positive",
            conv.stride, conv.dilation
        ));
    }
    if conv.padding == Padding::Same && conv.stride.iter().any(|&s| s != 1) {
        return bad(format!(
            "padding = Same needs stride 1 (as in PyTorch), got stride {:?}; pad explicitly instead",
            conv.stride
        ));
    }
    Ok(())
}

macro_rules! conv_layer {
    ($(#[$doc:meta])* $name:ident, $n:literal, $method:ident, $input:literal) => {
        $(#[$doc])*
        pub struct $name {
            weight: Tensor,
            bias: Option<Tensor>,
            conv: ConvOptions<$n>,
        }

        impl $name {
            /// A layer with a bias and PyTorch's default options (stride 1, no padding,
            /// dilation 1, one group), `f32` on the default device.
            pub fn new(
                in_channels: usize,
                out_channels: usize,
                kernel_size: [usize; $n],
            ) -> Result<$name> {
                $name::with_options(
                    in_channels,
                    out_channels,
                    kernel_size,
                    ConvOptions::default(),
                    true,
                    &ParamOptions::default(),
                )
            }

            /// A layer with the given stride, padding, dilation and groups, with or without
            /// a bias, parameters of `opts`' dtype and device. The weight is
            /// `[out_channels, in_channels / groups, kernel...]`; weight and bias are drawn
            /// from `U(-1/sqrt(fan_in), 1/sqrt(fan_in))` with
            /// `fan_in = in_channels / groups * prod(kernel_size)`, as in PyTorch.
            pub fn with_options(
                in_channels: usize,
                out_channels: usize,
                kernel_size: [usize; $n],
                conv: ConvOptions<$n>,
                bias: bool,
                opts: &ParamOptions,
            ) -> Result<$name> {
                check_config(
                    concat!(stringify!($name), "::new"),
                    in_channels,
                    out_channels,
                    kernel_size,
                    &conv,
                )?;
                let per_group = in_channels / conv.groups;
                let fan_in = per_group * kernel_size.iter().product::<usize>();
                let mut shape = vec![out_channels, per_group];
                shape.extend_from_slice(&kernel_size);
                let weight = fan_in_uniform(&shape, fan_in, opts)?;
                let bias = if bias {
                    Some(fan_in_uniform(&[out_channels], fan_in, opts)?)
                } else {
                    None
                };
                Ok($name { weight, bias, conv })
            }

            /// The weight, `[out_channels, in_channels / groups, kernel...]`.
            pub fn weight(&self) -> &Tensor {
                &self.weight
            }

            /// The bias, `[out_channels]`, if the layer has one.
            pub fn bias(&self) -> Option<&Tensor> {
                self.bias.as_ref()
            }

            /// Stride, padding, dilation and groups.
            pub fn options(&self) -> &ConvOptions<$n> {
                &self.conv
            }

            #[doc = concat!("The convolution of `x`, ", $input, ".")]
            pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
                const OP: &str = stringify!($name);
                check_rank(OP, x, &[$n + 1, $n + 2], $input)?;
                let channels = x.dims()[x.ndim() - $n - 1];
                let expected = self.weight.dims()[1] * self.conv.groups;
                if channels != expected {
                    return Err(invalid(
                        OP,
                        format!(
                            "the layer takes {expected} input channels, got input {} with {channels}",
                            x.shape()
                        ),
                    ));
                }
                check_dtype(OP, x, self.weight.dtype())?;
                x.$method(&self.weight, self.bias.as_ref(), &self.conv)
            }
        }

        impl Module for $name {
            fn visit(&self, v: &mut Visitor<'_>) {
                v.param("weight", &self.weight);
                if let Some(b) = &self.bias {
                    v.param("bias", b);
                }
            }
        }

        impl_forward!($name);
    };
}

conv_layer!(
    /// A 1-d convolution layer (`torch.nn.Conv1d`) over `[N, C_in, L]` (or unbatched
    /// `[C_in, L]`), with zero padding.
    ///
    /// ```
    /// # use tessel_nn::Conv1d;
    /// # use tessel_tensor::{ConvOptions, DType, Padding, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let conv = Conv1d::new(2, 4, [3])?;
    /// assert_eq!(conv.forward(&Tensor::ones([1, 2, 8], DType::F32))?.dims(), vec![1, 4, 6]);
    /// # Ok(())
    /// # }
    /// ```
    Conv1d,
    1,
    conv1d,
    "[N, C_in, L] or [C_in, L]"
);

conv_layer!(
    /// A 2-d convolution layer (`torch.nn.Conv2d`) over `[N, C_in, H, W]` (or unbatched
    /// `[C_in, H, W]`), with zero padding.
    ///
    /// ```
    /// # use tessel_nn::{Conv2d, ParamOptions};
    /// # use tessel_tensor::{ConvOptions, DType, Padding, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let opts = ConvOptions { stride: [2, 2], padding: Padding::Explicit([1, 1]), ..ConvOptions::default() };
    /// let conv = Conv2d::with_options(3, 8, [3, 3], opts, true, &ParamOptions::default())?;
    /// let y = conv.forward(&Tensor::ones([2, 3, 8, 8], DType::F32))?;
    /// assert_eq!(y.dims(), vec![2, 8, 4, 4]);
    /// assert_eq!(conv.weight().dims(), vec![8, 3, 3, 3]);
    /// # Ok(())
    /// # }
    /// ```
    Conv2d,
    2,
    conv2d,
    "[N, C_in, H, W] or [C_in, H, W]"
);
