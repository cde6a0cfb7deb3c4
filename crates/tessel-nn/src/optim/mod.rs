//! Optimizers and learning-rate schedules, with PyTorch's update formulas and defaults.
//!
//! A training step is one cached plan: [`Optimizer::step`] records the gradients and every
//! update lazily, then computes the loss, the new parameters and the new optimizer state
//! in one [`Tensor::realize_all`] and [`Tensor::assign`]s them. Everything that changes
//! from step to step (the learning rate, Adam's bias corrections) enters the graph as a
//! small tensor made from data each step, never as a constant, so the second step's graph
//! has the first step's structure and replays its plan: nothing compiles after step 1.
//!
//! State (momentum, moment averages) lives on each parameter's device in its dtype. For
//! `f16`/`bf16` parameters the update is computed in `f32` and rounded once when stored,
//! like PyTorch's fused optimizers.
//!
//! ```
//! use tessel_nn::optim::{Optimizer, Sgd, SgdConfig};
//! use tessel_tensor::Tensor;
//! # fn main() -> tessel_tensor::Result<()> {
//! let w = Tensor::from_vec(vec![1.0f32, 2.0], [2])?;
//! let mut opt = Sgd::new(vec![w.clone()], SgdConfig { lr: 0.5, ..Default::default() })?;
//! // A gradient from elsewhere (clipped, accumulated, ...): `apply` instead of `step`.
//! let g = Tensor::from_vec(vec![0.2f32, -0.4], [2])?;
//! opt.apply(&[g], &[])?;
//! assert_eq!(w.to_vec::<f32>()?, vec![0.9, 2.2]);
//! # Ok(())
//! # }
//! ```

mod adam;
mod compiled;
mod schedule;
mod sgd;

pub use adam::{Adam, AdamConfig, AdamW, AdamWConfig};
pub use compiled::CompiledStep;
pub use schedule::{
    ConstantLr, CosineAnnealingLr, LinearLr, LrSchedule, LrScheduler, SequentialLr, StepLr,
};
pub use sgd::{Sgd, SgdConfig};

use tessel_tensor::{DType, Device, Error, Result, Tensor, bf16, f16};

/// An optimizer: updates a fixed list of parameters from their gradients.
///
/// Implementors provide [`Optimizer::record_update`]; [`Optimizer::apply`] and
/// [`Optimizer::step`] follow.
pub trait Optimizer {
    /// The parameters, in the order gradients are given.
    fn params(&self) -> &[Tensor];

    /// The learning rate the next step uses.
    fn lr(&self) -> f64;

    /// Sets the learning rate of the following steps (what a schedule calls). It is
    /// checked at the next step: it must be finite and non-negative.
    fn set_lr(&mut self, lr: f64);

    /// How many steps have been taken.
    fn steps(&self) -> u64;

    /// Low level: advances the step count and sets the values that change from step to
    /// step (the learning rate, bias corrections) for the update of that step, without
    /// recording it. Errors (changing nothing) if a hyperparameter became invalid.
    fn advance(&mut self) -> Result<()>;

    /// Low level: records the update of the step [`Optimizer::advance`] set, lazily, and
    /// returns `(tensor, new value)` pairs for every parameter and state tensor. Nothing
    /// is computed or assigned, and the step count stays.
    fn record_current(&mut self, grads: &[Tensor]) -> Result<Vec<(Tensor, Tensor)>>;

    /// Low level: every tensor an update reads besides the gradients (parameters, state,
    /// the per-step values), as it holds them now: what a [`CompiledStep`] binds on each
    /// call.
    fn update_inputs(&mut self) -> Result<Vec<Tensor>>;

    /// Low level: records one update lazily and returns `(tensor, new value)` pairs for
    /// every parameter and state tensor, advancing the step count. Nothing is computed
    /// or assigned; [`Optimizer::apply`] does both, and is what callers want.
    fn record_update(&mut self, grads: &[Tensor]) -> Result<Vec<(Tensor, Tensor)>> {
        // Checked before advancing: a refused call changes nothing.
        check_grads("Optimizer::apply", self.params(), grads)?;
        self.advance()?;
        self.record_current(grads)
    }

    /// Updates the parameters from user-supplied gradients (one per parameter, in
    /// [`Optimizer::params`] order, each of its parameter's shape, dtype and device),
    /// computing `also_realize` (a loss, a metric) in the same plan.
    ///
    /// Buffers that forward passes updated since the last step (`BatchNorm`'s running
    /// statistics in training mode) are computed in the same plan too.
    fn apply(&mut self, grads: &[Tensor], also_realize: &[&Tensor]) -> Result<()> {
        let updates = self.record_update(grads)?;
        let buffers = crate::pending::take();
        let mut outputs: Vec<&Tensor> = also_realize.to_vec();
        outputs.extend(&buffers);
        outputs.extend(updates.iter().map(|(_, value)| value));
        Tensor::realize_all(&outputs)?;
        for (target, value) in &updates {
            target.assign(value)?;
        }
        Ok(())
    }

    /// One training step on a scalar `loss`: its gradients with respect to
    /// [`Optimizer::params`], then [`Optimizer::apply`]. The loss is computed in the same
    /// plan, so reading it afterwards costs nothing.
    fn step(&mut self, loss: &Tensor) -> Result<()> {
        self.step_with(loss, &[])
    }

    /// [`Optimizer::step`], also computing `also_realize` (a metric) in the same plan.
    /// Buffers a forward pass updated (`BatchNorm`'s running statistics) need not be listed:
    /// every step realizes them.
    fn step_with(&mut self, loss: &Tensor, also_realize: &[&Tensor]) -> Result<()> {
        check_loss("Optimizer::step", loss)?;
        let wrt: Vec<&Tensor> = self.params().iter().collect();
        let grads = loss.backward(&wrt)?;
        let mut outputs = vec![loss];
        outputs.extend_from_slice(also_realize);
        self.apply(&grads, &outputs)
    }
}

/// Checks that a loss is one value, as gradients of it are defined.
fn check_loss(op: &'static str, loss: &Tensor) -> Result<()> {
    if loss.numel() != 1 {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "the loss must be a single value, but it has shape {}; reduce it with .mean_all() or .sum_all() first",
                loss.shape()
            ),
        });
    }
    Ok(())
}

/// Checks a parameter list: non-empty, float, concrete shapes.
fn check_params(op: &'static str, params: &[Tensor]) -> Result<()> {
    if params.is_empty() {
        return Err(Error::InvalidArgument {
            op,
            reason: "the parameter list is empty; pass model.parameters()".into(),
        });
    }
    for (i, p) in params.iter().enumerate() {
        if !p.dtype().is_float() {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "parameter {i} is {} {}; only floating-point tensors can be optimized",
                    p.shape(),
                    p.dtype()
                ),
            });
        }
        if p.shape().as_usizes().is_none() {
            return Err(Error::InvalidArgument {
                op,
                reason: format!("parameter {i} has the symbolic shape {}", p.shape()),
            });
        }
    }
    Ok(())
}

/// Checks gradients against parameters: one each, same shape, dtype and device.
fn check_grads(op: &'static str, params: &[Tensor], grads: &[Tensor]) -> Result<()> {
    if grads.len() != params.len() {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "{} gradients were given for {} parameters; give one gradient per parameter, in params() order",
                grads.len(),
                params.len()
            ),
        });
    }
    for (i, (p, g)) in params.iter().zip(grads).enumerate() {
        if g.shape() != p.shape() || g.dtype() != p.dtype() {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "gradient {i} is {} {} but its parameter is {} {}; the gradient needs the parameter's shape and dtype",
                    g.shape(),
                    g.dtype(),
                    p.shape(),
                    p.dtype()
                ),
            });
        }
        if g.device() != p.device() {
            return Err(Error::DeviceMismatch {
                op,
                lhs: p.device().to_string(),
                rhs: g.device().to_string(),
            });
        }
    }
    Ok(())
}

/// Checks a hyperparameter is finite and at least `min`.
fn check_at_least(op: &'static str, name: &str, value: f64, min: f64) -> Result<()> {
    if value.is_finite() && value >= min {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            op,
            reason: format!("{name} must be a finite number >= {min}, got {value}"),
        })
    }
}

/// A zeroed state tensor like `p` (shape, dtype, device). It holds data rather than being
/// a constant, so the first step's graph already has the structure of every later step.
fn zeros_state(p: &Tensor) -> Result<Tensor> {
    let dims = p.dims();
    let n = p.numel();
    let t = match p.dtype() {
        DType::F64 => Tensor::from_vec(vec![0f64; n], dims)?,
        DType::F32 => Tensor::from_vec(vec![0f32; n], dims)?,
        DType::F16 => Tensor::from_vec(vec![f16::ZERO; n], dims)?,
        DType::BF16 => Tensor::from_vec(vec![bf16::ZERO; n], dims)?,
        other => {
            return Err(Error::UnsupportedDType {
                op: "optimizer state",
                dtype: other,
                hint: "only floating-point parameters can be optimized",
            });
        }
    };
    t.to(&p.device())
}

/// The dtype an update computes in: `f16` and `bf16` updates compute in `f32` and round
/// once when stored (as PyTorch's fused optimizers do), so rounding does not compound
/// through the update's chain of ops.
fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// `t` in its compute dtype.
fn widen(t: &Tensor) -> Tensor {
    let dtype = compute_dtype(t.dtype());
    if dtype == t.dtype() {
        t.clone()
    } else {
        t.cast(dtype)
    }
}

/// A computed `value` rounded to the dtype of the tensor `like` it replaces.
fn narrow(value: Tensor, like: &Tensor) -> Tensor {
    if value.dtype() == like.dtype() {
        value
    } else {
        value.cast(like.dtype())
    }
}

/// The values that change from step to step (learning rate, bias corrections, ...), held
/// by one tensor per compute dtype and device among the parameters, read as 0-d views.
///
/// They are tensors made from data, not constants: a constant's value is part of a plan's
/// cache key, so a changing one would compile a new plan every step. Each step assigns
/// new data to the same tensors, so a [`CompiledStep`] binds them as arguments.
struct StepValues {
    values: Vec<f64>,
    made: Vec<(DType, Device, Tensor)>,
}

impl StepValues {
    fn new(values: Vec<f64>) -> StepValues {
        StepValues {
            values,
            made: Vec::new(),
        }
    }

    /// Sets the values the next recorded update reads.
    fn set(&mut self, values: Vec<f64>) -> Result<()> {
        for (dtype, device, all) in &self.made {
            all.assign(&holding(&values, *dtype, *device)?)?;
        }
        self.values = values;
        Ok(())
    }

    /// The tensors holding the values, one per dtype and device of `params` (each in its
    /// compute dtype), made where missing.
    fn tensors(&mut self, params: &[Tensor]) -> Result<Vec<Tensor>> {
        for p in params {
            self.holder(compute_dtype(p.dtype()), p.device())?;
        }
        Ok(self.made.iter().map(|(_, _, all)| all.clone()).collect())
    }

    /// The values as 0-d tensors of `like`'s dtype and device (`like` is already in its
    /// compute dtype).
    fn for_param(&mut self, like: &Tensor) -> Result<Vec<Tensor>> {
        let all = self.holder(like.dtype(), like.device())?;
        (0..self.values.len())
            .map(|i| all.narrow(0, i as i64, 1)?.reshape(&[]))
            .collect()
    }

    /// The tensor holding the values in `dtype` on `device`, made if missing.
    fn holder(&mut self, dtype: DType, device: Device) -> Result<Tensor> {
        if let Some((_, _, all)) =
            (self.made.iter()).find(|(d, dev, _)| *d == dtype && *dev == device)
        {
            return Ok(all.clone());
        }
        let all = holding(&self.values, dtype, device)?;
        self.made.push((dtype, device, all.clone()));
        Ok(all)
    }
}

/// One tensor holding `values` in `dtype` on `device`, so a step uploads one buffer per
/// dtype and device (on a GPU each upload is a copy of its own).
fn holding(values: &[f64], dtype: DType, device: Device) -> Result<Tensor> {
    let v = values;
    let all = match dtype {
        DType::F64 => Tensor::from_vec(v.to_vec(), [v.len()])?,
        DType::F32 => Tensor::from_vec(v.iter().map(|&x| x as f32).collect(), [v.len()])?,
        DType::F16 => Tensor::from_vec(v.iter().map(|&x| f16::from_f64(x)).collect(), [v.len()])?,
        DType::BF16 => Tensor::from_vec(v.iter().map(|&x| bf16::from_f64(x)).collect(), [v.len()])?,
        other => {
            return Err(Error::UnsupportedDType {
                op: "optimizer step",
                dtype: other,
                hint: "only floating-point parameters can be optimized",
            });
        }
    }
    .to(&device)?;
    Ok(all)
}
