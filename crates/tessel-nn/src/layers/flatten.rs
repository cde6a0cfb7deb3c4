//! `Flatten`: merges a range of dims, as between the convolutions and the dense layers
//! of a CNN.

use tessel_tensor::{Result, Tensor};

use super::impl_forward;
use crate::{Module, Visitor};

/// Flattens dims `start_dim..=end_dim` into one (`torch.nn.Flatten`); the default,
/// `Flatten::new()`, keeps the batch dim: `start_dim = 1, end_dim = -1`.
///
/// ```
/// # use tessel_nn::Flatten;
/// # use tessel_tensor::{DType, Tensor};
/// # fn main() -> tessel_tensor::Result<()> {
/// let y = Flatten::new().forward(&Tensor::ones([2, 3, 4, 5], DType::F32))?;
/// assert_eq!(y.dims(), vec![2, 60]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flatten {
    start_dim: i64,
    end_dim: i64,
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten::new()
    }
}

impl Flatten {
    /// Flattens every dim but the first.
    pub fn new() -> Flatten {
        Flatten {
            start_dim: 1,
            end_dim: -1,
        }
    }

    /// Flattens `start_dim..=end_dim` (negative dims count from the end).
    pub fn with_dims(start_dim: i64, end_dim: i64) -> Flatten {
        Flatten { start_dim, end_dim }
    }

    /// `x` with the dims merged.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten(self.start_dim, self.end_dim)
    }
}

impl Module for Flatten {
    fn visit(&self, _: &mut Visitor<'_>) {}
}

impl_forward!(Flatten);
