//! Loss scaling for `f16` mixed-precision training: PyTorch's `torch.amp.GradScaler`.
//!
//! Gradients of an `f16` forward (under [`tessel_tensor::autocast`]) can be too small for
//! `f16`'s range and flush to zero. [`GradScaler::step`] multiplies the loss by a scale
//! before differentiating, divides the gradients by it again (in the parameters' dtype,
//! `f32` master weights under autocast), and skips the optimizer step when a gradient is
//! infinite or NaN: the scale then backs off (`× backoff_factor`); after
//! `growth_interval` steps in a row without one it grows (`× growth_factor`). `bf16` has
//! `f32`'s exponent range and needs no scaler.
//!
//! ```
//! use tessel_nn::amp::{GradScaler, GradScalerConfig};
//! use tessel_nn::optim::{Optimizer, Sgd, SgdConfig};
//! use tessel_tensor::Tensor;
//! # fn main() -> tessel_tensor::Result<()> {
//! let w = Tensor::from_vec(vec![1.0f32, 2.0], [2])?;
//! let mut opt = Sgd::new(vec![w.clone()], SgdConfig { lr: 0.5, ..Default::default() })?;
//! let mut scaler = GradScaler::new(GradScalerConfig::default())?;
//! let loss = (&w * &w)?.sum_all()?;
//! assert!(scaler.step(&mut opt, &loss)?); // finite gradients: stepped
//! assert_eq!(w.to_vec::<f32>()?, vec![0.0, 0.0]);
//! # Ok(())
//! # }
//! ```

use tessel_tensor::{DType, Error, Result, Tensor};

use crate::optim::Optimizer;

/// [`GradScaler`]'s settings; `Default` is PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradScalerConfig {
    /// The first scale (PyTorch: 2^16).
    pub init_scale: f64,
    /// The factor the scale grows by after `growth_interval` steps without an infinite
    /// or NaN gradient (2).
    pub growth_factor: f64,
    /// The factor the scale shrinks by when a step is skipped (0.5).
    pub backoff_factor: f64,
    /// Steps in a row without an infinite or NaN gradient before the scale grows (2000).
    pub growth_interval: u64,
    /// `false`: no scaling and no checks; `step` is the optimizer's own.
    pub enabled: bool,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        GradScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
        }
    }
}

/// Dynamic loss scaling; see the module docs.
#[derive(Clone, Debug)]
pub struct GradScaler {
    config: GradScalerConfig,
    scale: f64,
    /// Steps taken since the scale last changed.
    growth_tracker: u64,
}

impl GradScaler {
    /// A scaler starting at `config.init_scale`.
    ///
    /// # Errors
    ///
    /// A scale that is not a positive finite number, a growth factor not above 1, a
    /// backoff factor outside `(0, 1)`, or a growth interval of 0.
    pub fn new(config: GradScalerConfig) -> Result<GradScaler> {
        let bad = |reason: String| Error::InvalidArgument {
            op: "GradScaler::new",
            reason,
        };
        if !(config.init_scale.is_finite() && config.init_scale > 0.0) {
            return Err(bad(format!(
                "init_scale must be a positive finite number, got {}",
                config.init_scale
            )));
        }
        if !(config.growth_factor.is_finite() && config.growth_factor > 1.0) {
            return Err(bad(format!(
                "growth_factor must be a finite number above 1, got {}",
                config.growth_factor
            )));
        }
        if !(config.backoff_factor > 0.0 && config.backoff_factor < 1.0) {
            return Err(bad(format!(
                "backoff_factor must lie strictly between 0 and 1, got {}",
                config.backoff_factor
            )));
        }
        if config.growth_interval == 0 {
            return Err(bad("growth_interval must be at least 1".into()));
        }
        Ok(GradScaler {
            config,
            scale: config.init_scale,
            growth_tracker: 0,
        })
    }

    /// The current scale (`scaler.get_scale()`); 1 when disabled.
    pub fn scale(&self) -> f64 {
        if self.config.enabled { self.scale } else { 1.0 }
    }

    /// One training step on the scalar `loss` (PyTorch's `scaler.scale(loss).backward()`,
    /// `scaler.step(opt)` and `scaler.update()`): the gradients of `loss × scale` with
    /// respect to `opt`'s parameters, divided by the scale; then, if every one is finite,
    /// the optimizer's update with them. Returns whether the optimizer stepped. The loss
    /// is computed in the same plan as the gradients.
    ///
    /// Reads one flag back to the host per step (PyTorch's `step` does too).
    ///
    /// # Errors
    ///
    /// A loss with more than one element; the optimizer's own errors.
    pub fn step<O: Optimizer + ?Sized>(&mut self, opt: &mut O, loss: &Tensor) -> Result<bool> {
        if !self.config.enabled {
            opt.step(loss)?;
            return Ok(true);
        }
        if loss.numel() != 1 {
            return Err(Error::InvalidArgument {
                op: "GradScaler::step",
                reason: format!(
                    "the loss must be a single value, but it has shape {}; reduce it with .mean_all() or .sum_all() first",
                    loss.shape()
                ),
            });
        }
        // The scale enters as data, not a constant: every step replays one plan.
        let device = loss.device();
        let factor = |v: f64, dtype: DType| -> Result<Tensor> {
            Ok(Tensor::scalar(v).to(&device)?.cast(dtype))
        };
        let scaled = (loss * &factor(self.scale, loss.dtype())?)?;
        let wrt: Vec<&Tensor> = opt.params().iter().collect();
        let grads = scaled.backward(&wrt)?;
        let mut unscaled = Vec::with_capacity(grads.len());
        let mut bad: Option<Tensor> = None;
        // One inverse scale per gradient dtype (usually one), not one upload per gradient.
        let mut inverse: Vec<(DType, Tensor)> = Vec::new();
        for g in &grads {
            let inv = if let Some((_, t)) = inverse.iter().find(|(d, _)| *d == g.dtype()) {
                t.clone()
            } else {
                let t = factor(1.0 / self.scale, g.dtype())?;
                inverse.push((g.dtype(), t.clone()));
                t
            };
            let g = (g * &inv)?;
            let here = g.isnan().logical_or(g.isinf())?.any_all()?;
            bad = Some(match bad {
                Some(b) => b.logical_or(&here)?,
                None => here,
            });
            unscaled.push(g);
        }
        let Some(bad) = bad else {
            return Err(Error::InvalidArgument {
                op: "GradScaler::step",
                reason: "the optimizer has no parameters".into(),
            });
        };
        let mut outputs: Vec<&Tensor> = vec![&bad, loss];
        outputs.extend(&unscaled);
        Tensor::realize_all(&outputs)?;
        if bad.item::<bool>()? {
            self.scale *= self.config.backoff_factor;
            self.growth_tracker = 0;
            tracing::debug!(target: "tessel::amp", "an infinite or NaN gradient: step skipped, scale now {}", self.scale);
            return Ok(false);
        }
        opt.apply(&unscaled, &[])?;
        self.growth_tracker += 1;
        if self.growth_tracker == self.config.growth_interval {
            self.scale *= self.config.growth_factor;
            self.growth_tracker = 0;
        }
        Ok(true)
    }
}
