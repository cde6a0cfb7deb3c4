//! `Dropout`: random zeroing in training, identity in evaluation.

use std::sync::atomic::{AtomicBool, Ordering};

use tessel_tensor::{Result, Tensor};

use super::{impl_forward, invalid};
use crate::{Module, Visitor};

/// Zeroes each element with probability `p` and scales the rest by `1 / (1 - p)` while
/// training (`torch.nn.Dropout`); the identity in evaluation mode ([`Module::eval`]).
///
/// [`Tensor::dropout`] does the work: the mask is Philox bits from the process-wide
/// generator behind [`Tensor::rand`] ([`Tensor::manual_seed`] makes it reproducible),
/// computed inside the kernel that applies it. Each call is a new draw whose 16-byte key
/// is the plan's only new input, so a training step's plan is still cached.
///
/// ```
/// # use tessel_nn::{Dropout, Module};
/// # use tessel_tensor::{DType, Tensor};
/// # fn main() -> tessel_tensor::Result<()> {
/// let drop = Dropout::new(0.5)?;
/// let x = Tensor::ones([1000], DType::F32);
/// let kept = drop.forward(&x)?.to_vec::<f32>()?;
/// assert!(kept.iter().all(|&v| v == 0.0 || v == 2.0));
/// drop.eval();
/// assert_eq!(drop.forward(&x)?.to_vec::<f32>()?, vec![1.0; 1000]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Dropout {
    p: f64,
    training: AtomicBool,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1]`, in training mode.
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(invalid(
                "Dropout::new",
                format!("the probability must be in [0, 1], got {p}"),
            ));
        }
        Ok(Dropout {
            p,
            training: AtomicBool::new(true),
        })
    }

    /// The drop probability.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }

    /// `x` with dropout applied (training) or `x` itself (evaluation).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !x.dtype().is_float() {
            return Err(invalid(
                "Dropout",
                format!("the input must be a float tensor, got {}", x.dtype()),
            ));
        }
        if !self.is_training() || self.p == 0.0 {
            return Ok(x.clone());
        }
        x.dropout(self.p)
    }
}

impl Module for Dropout {
    fn visit(&self, _: &mut Visitor<'_>) {}

    fn set_training_local(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
    }
}

impl_forward!(Dropout);
