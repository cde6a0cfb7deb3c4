//! Activation modules: parameter-free wrappers of the Tensor activations, so they can
//! sit in a [`Sequential`](super::Sequential).

use tessel_tensor::{Result, Tensor};

use super::impl_forward;
use crate::{Module, Visitor};

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => |$x:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name;

        impl $name {
            /// The activation applied elementwise to `x`.
            pub fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                Ok($body)
            }
        }

        impl Module for $name {
            fn visit(&self, _: &mut Visitor<'_>) {}
        }

        impl_forward!($name);
    )*};
}

activation! {
    /// `max(x, 0)` (`torch.nn.ReLU`).
    ReLU => |x| x.relu();
    /// `x * sigmoid(x)` (`torch.nn.SiLU`).
    SiLU => |x| x.silu();
    /// The hyperbolic tangent (`torch.nn.Tanh`).
    Tanh => |x| x.tanh();
    /// `1 / (1 + e^-x)` (`torch.nn.Sigmoid`).
    Sigmoid => |x| x.sigmoid();
}

/// Which form of GELU to compute (`approximate=` of `torch.nn.GELU`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GeluApproximate {
    /// The exact form, `x * Φ(x)` with the normal CDF (`approximate="none"`).
    #[default]
    None,
    /// The tanh approximation (`approximate="tanh"`).
    Tanh,
}

/// The Gaussian error linear unit (`torch.nn.GELU`); `GELU::default()` is the exact form.
///
/// ```
/// # use tessel_nn::{GELU, GeluApproximate};
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let y = GELU::new(GeluApproximate::Tanh).forward(&Tensor::from([0.0f32, 1.0]))?;
/// assert!((y.to_vec::<f32>()?[1] - 0.841192).abs() < 1e-5);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GELU {
    approximate: GeluApproximate,
}

impl GELU {
    /// A GELU of the given form.
    pub fn new(approximate: GeluApproximate) -> GELU {
        GELU { approximate }
    }

    /// GELU applied elementwise to `x`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self.approximate {
            GeluApproximate::None => x.gelu(),
            GeluApproximate::Tanh => x.gelu_tanh(),
        })
    }
}

impl Module for GELU {
    fn visit(&self, _: &mut Visitor<'_>) {}
}

impl_forward!(GELU);
