//! Pooling layers: parameter-free wrappers of the Tensor pooling ops.

use tessel_tensor::{PoolOptions, Result, Tensor};

use super::{check_rank, impl_forward, invalid};
use crate::{Module, Visitor};

/// Checks pooling options the way PyTorch's constructors and `F.*_pool*d` do.
fn check_options<const N: usize>(op: &'static str, opts: &PoolOptions<N>) -> Result<()> {
    let stride = opts.stride.unwrap_or(opts.kernel);
    if opts.kernel.contains(&0) || stride.contains(&0) || opts.dilation.contains(&0) {
        return Err(invalid(
            op,
            format!(
                "kernel_size {:?}, stride {stride:?} and dilation {:?} must all be positive",
                opts.kernel, opts.dilation
            ),
        ));
    }
    for i in 0..N {
        if opts.padding[i] * 2 > opts.kernel[i] {
            return Err(invalid(
                op,
                format!(
                    "padding {:?} must be at most half the kernel size {:?}",
                    opts.padding, opts.kernel
                ),
            ));
        }
    }
    Ok(())
}

macro_rules! pool_layer {
    ($(#[$doc:meta])* $name:ident, $n:literal, $method:ident, $input:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name {
            opts: PoolOptions<$n>,
        }

        impl $name {
            /// A pooling layer of window `kernel_size` with PyTorch's defaults (stride =
            /// kernel size, no padding, dilation 1, floor mode, padding counted in averages).
            pub fn new(kernel_size: [usize; $n]) -> Result<$name> {
                $name::with_options(PoolOptions::new(kernel_size))
            }

            /// A pooling layer with the given options.
            pub fn with_options(opts: PoolOptions<$n>) -> Result<$name> {
                check_options(concat!(stringify!($name), "::new"), &opts)?;
                Ok($name { opts })
            }

            /// The layer's options.
            pub fn options(&self) -> &PoolOptions<$n> {
                &self.opts
            }

            #[doc = concat!("The pooling of `x`, ", $input, ".")]
            pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
                check_rank(stringify!($name), x, &[$n + 1, $n + 2], $input)?;
                x.$method(&self.opts)
            }
        }

        impl Module for $name {
            fn visit(&self, _: &mut Visitor<'_>) {}
        }

        impl_forward!($name);
    };
}

pool_layer!(
    /// 1-d max pooling (`torch.nn.MaxPool1d`); padding counts as `-inf`.
    MaxPool1d,
    1,
    max_pool1d,
    "[N, C, L] or [C, L]"
);
pool_layer!(
    /// 2-d max pooling (`torch.nn.MaxPool2d`); padding counts as `-inf`.
    ///
    /// ```
    /// # use tessel_nn::MaxPool2d;
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), [1, 1, 4, 4])?;
    /// let y = MaxPool2d::new([2, 2])?.forward(&x)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![5.0, 7.0, 13.0, 15.0]);
    /// # Ok(())
    /// # }
    /// ```
    MaxPool2d,
    2,
    max_pool2d,
    "[N, C, H, W] or [C, H, W]"
);
pool_layer!(
    /// 1-d average pooling (`torch.nn.AvgPool1d`).
    AvgPool1d,
    1,
    avg_pool1d,
    "[N, C, L] or [C, L]"
);
pool_layer!(
    /// 2-d average pooling (`torch.nn.AvgPool2d`); padding zeros count in the divisor
    /// unless `count_include_pad` is off.
    AvgPool2d,
    2,
    avg_pool2d,
    "[N, C, H, W] or [C, H, W]"
);
