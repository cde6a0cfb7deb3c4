//! Reverse-mode gradients, recorded as ordinary graph nodes.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The gradients of a scalar `loss` with respect to each tensor of `wrt`.
pub fn grad(loss: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
    let _ = (loss, wrt);
    Err(Error::Internal("autograd is being built".into()))
}

impl Tensor {
    /// The gradients of this scalar with respect to each tensor of `wrt` (see [`grad`]).
    pub fn backward(&self, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
        grad(self, wrt)
    }
}
