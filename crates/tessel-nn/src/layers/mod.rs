//! Layers: structs holding their parameters, each a [`Module`] with an inherent
//! `forward`, and [`Forward`] for those with one input so that [`Sequential`] can chain
//! them.

mod activation;
mod attention;
mod batch_norm;
mod conv;
mod dropout;
mod embedding;
mod flatten;
mod linear;
mod norm;
mod pool;
mod sequential;

pub use activation::{GELU, GeluApproximate, ReLU, SiLU, Sigmoid, Tanh};
pub use attention::{
    AttentionMasks, MultiHeadAttention, MultiheadAttention, scaled_dot_product_attention,
};
pub use batch_norm::{BatchNorm1d, BatchNorm2d, BatchNormOptions, batch_norm};
pub use conv::{Conv1d, Conv2d};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use flatten::Flatten;
pub use linear::Linear;
pub use norm::{LayerNorm, RMSNorm, layer_norm, rms_norm};
pub use pool::{AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d};
pub use sequential::Sequential;

use tessel_tensor::{DType, Error, Result, Tensor};

use crate::Module;

/// A layer with one input and one output, so it can sit in a [`Sequential`].
///
/// Every single-input layer of this crate implements it by calling its inherent
/// `forward`; layers are `Send + Sync`, so a `Box<dyn Forward>` can cross threads.
pub trait Forward: Module + Send + Sync {
    /// The layer applied to `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
}

/// Implements [`Forward`] by the type's inherent `forward`.
macro_rules! impl_forward {
    ($($ty:ty),* $(,)?) => {$(
        impl $crate::layers::Forward for $ty {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                <$ty>::forward(self, x)
            }
        }
    )*};
}
pub(crate) use impl_forward;

/// An `InvalidArgument` error of `op`.
pub(crate) fn invalid(op: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        reason: reason.into(),
    }
}

/// Checks that a layer's input has the dtype of its parameters, so a mix-up is an error
/// rather than a silent promotion.
pub(crate) fn check_dtype(op: &'static str, x: &Tensor, param: DType) -> Result<()> {
    if x.dtype() == param {
        Ok(())
    } else {
        Err(invalid(
            op,
            format!(
                "the input is {} but the layer's parameters are {param}; cast the input with .cast(DType::{param:?}) or build the layer with ParamOptions::dtype(DType::{:?})",
                x.dtype(),
                x.dtype()
            ),
        ))
    }
}

/// Checks that `x` has one of the ranks in `ranks` (described as `what`).
pub(crate) fn check_rank(op: &'static str, x: &Tensor, ranks: &[usize], what: &str) -> Result<()> {
    if ranks.contains(&x.ndim()) {
        Ok(())
    } else {
        Err(invalid(
            op,
            format!("expected the input as {what}, got shape {}", x.shape()),
        ))
    }
}

/// `shape` as the `i64` dims `reshape` takes.
pub(crate) fn dims_i64(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}
