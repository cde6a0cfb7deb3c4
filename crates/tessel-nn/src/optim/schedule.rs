//! Learning-rate schedules (`torch.optim.lr_scheduler`): pure functions of the base rate
//! and the step, plus [`LrScheduler`], which feeds one to an optimizer.

use std::f64::consts::PI;

use tessel_tensor::{Error, Result};

use super::Optimizer;

/// A learning rate as a function of the base rate and the step (or epoch) count.
///
/// Schedules are closed forms, so they can be evaluated at any step, combined with
/// [`SequentialLr`], and resumed without replaying history.
pub trait LrSchedule {
    /// The learning rate at `step` (0 is the start) for an optimizer whose initial rate
    /// is `base_lr`.
    fn lr_at(&self, base_lr: f64, step: u64) -> f64;
}

/// The base rate at every step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ConstantLr;

impl LrSchedule for ConstantLr {
    fn lr_at(&self, base_lr: f64, _step: u64) -> f64 {
        base_lr
    }
}

/// Decays the rate by `gamma` every `step_size` steps (`torch.optim.lr_scheduler.StepLR`):
/// `base_lr · gamma^⌊step / step_size⌋`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepLr {
    step_size: u64,
    gamma: f64,
}

impl StepLr {
    /// Decay by `gamma` (PyTorch's default is `0.1`) every `step_size` steps.
    pub fn new(step_size: u64, gamma: f64) -> Result<StepLr> {
        if step_size == 0 {
            return Err(Error::InvalidArgument {
                op: "StepLr::new",
                reason: "step_size must be at least 1".into(),
            });
        }
        if !gamma.is_finite() || gamma < 0.0 {
            return Err(Error::InvalidArgument {
                op: "StepLr::new",
                reason: format!("gamma must be a finite number >= 0, got {gamma}"),
            });
        }
        Ok(StepLr { step_size, gamma })
    }
}

impl LrSchedule for StepLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let k = (step / self.step_size).min(i32::MAX as u64) as i32;
        base_lr * self.gamma.powi(k)
    }
}

/// Cosine annealing from the base rate down to `eta_min` over `t_max` steps
/// (`torch.optim.lr_scheduler.CosineAnnealingLR`, closed form):
/// `eta_min + (base_lr − eta_min) · (1 + cos(π · step / t_max)) / 2`. Past `t_max` the
/// cosine continues, rising again, as PyTorch's does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineAnnealingLr {
    t_max: u64,
    eta_min: f64,
}

impl CosineAnnealingLr {
    /// Anneal to `eta_min` (PyTorch's default is `0`) over `t_max` steps.
    pub fn new(t_max: u64, eta_min: f64) -> Result<CosineAnnealingLr> {
        if t_max == 0 {
            return Err(Error::InvalidArgument {
                op: "CosineAnnealingLr::new",
                reason: "t_max must be at least 1".into(),
            });
        }
        if !eta_min.is_finite() {
            return Err(Error::InvalidArgument {
                op: "CosineAnnealingLr::new",
                reason: format!("eta_min must be finite, got {eta_min}"),
            });
        }
        Ok(CosineAnnealingLr { t_max, eta_min })
    }
}

impl LrSchedule for CosineAnnealingLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let phase = PI * step as f64 / self.t_max as f64;
        self.eta_min + (base_lr - self.eta_min) * (1.0 + phase.cos()) / 2.0
    }
}

/// Scales the base rate by a factor moving linearly from `start_factor` to `end_factor`
/// over `total_iters` steps, then holding (`torch.optim.lr_scheduler.LinearLR`): the
/// usual linear warmup with `start_factor` small and `end_factor = 1`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearLr {
    start_factor: f64,
    end_factor: f64,
    total_iters: u64,
}

impl LinearLr {
    /// A factor going from `start_factor` (in `(0, 1]`) to `end_factor` (in `[0, 1]`) over
    /// `total_iters` steps (PyTorch's defaults: `1/3`, `1`, `5`).
    pub fn new(start_factor: f64, end_factor: f64, total_iters: u64) -> Result<LinearLr> {
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(Error::InvalidArgument {
                op: "LinearLr::new",
                reason: format!("start_factor must be in (0, 1], got {start_factor}"),
            });
        }
        if !(0.0..=1.0).contains(&end_factor) {
            return Err(Error::InvalidArgument {
                op: "LinearLr::new",
                reason: format!("end_factor must be in [0, 1], got {end_factor}"),
            });
        }
        Ok(LinearLr {
            start_factor,
            end_factor,
            total_iters,
        })
    }

    /// Linear warmup from `base_lr / warmup_steps` up to `base_lr` over `warmup_steps`
    /// steps (at least 1).
    pub fn warmup(warmup_steps: u64) -> Result<LinearLr> {
        let n = warmup_steps.max(1);
        LinearLr::new(1.0 / n as f64, 1.0, n)
    }
}

impl LrSchedule for LinearLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let done = if self.total_iters == 0 {
            1.0
        } else {
            step.min(self.total_iters) as f64 / self.total_iters as f64
        };
        base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)
    }
}

/// Runs schedules one after another (`torch.optim.lr_scheduler.SequentialLR`): schedule
/// `i + 1` takes over at `milestones[i]`, restarting its own count at 0.
pub struct SequentialLr {
    schedules: Vec<Box<dyn LrSchedule + Send + Sync>>,
    milestones: Vec<u64>,
}

impl SequentialLr {
    /// `schedules.len() - 1` strictly increasing `milestones` separate the schedules.
    pub fn new(
        schedules: Vec<Box<dyn LrSchedule + Send + Sync>>,
        milestones: Vec<u64>,
    ) -> Result<SequentialLr> {
        if schedules.is_empty() || milestones.len() + 1 != schedules.len() {
            return Err(Error::InvalidArgument {
                op: "SequentialLr::new",
                reason: format!(
                    "{} schedules need {} milestones, got {}",
                    schedules.len(),
                    schedules.len().saturating_sub(1),
                    milestones.len()
                ),
            });
        }
        if milestones.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::InvalidArgument {
                op: "SequentialLr::new",
                reason: format!("milestones must increase strictly, got {milestones:?}"),
            });
        }
        Ok(SequentialLr {
            schedules,
            milestones,
        })
    }

    /// Linear warmup over `warmup_steps`, then cosine annealing to `eta_min` at
    /// `total_steps`: the usual transformer schedule.
    pub fn warmup_cosine(warmup_steps: u64, total_steps: u64, eta_min: f64) -> Result<Self> {
        if total_steps <= warmup_steps {
            return Err(Error::InvalidArgument {
                op: "SequentialLr::warmup_cosine",
                reason: format!(
                    "total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps})"
                ),
            });
        }
        let warmup = LinearLr::warmup(warmup_steps)?;
        let cosine = CosineAnnealingLr::new(total_steps - warmup_steps, eta_min)?;
        SequentialLr::new(vec![Box::new(warmup), Box::new(cosine)], vec![warmup_steps])
    }
}

impl LrSchedule for SequentialLr {
    fn lr_at(&self, base_lr: f64, step: u64) -> f64 {
        let i = self.milestones.partition_point(|&m| m <= step);
        let start = if i == 0 { 0 } else { self.milestones[i - 1] };
        self.schedules[i].lr_at(base_lr, step - start)
    }
}

/// Drives an optimizer's learning rate from a schedule, like a PyTorch scheduler: it
/// takes the optimizer's current rate as the base, sets the step-0 rate at once, and each
/// [`LrScheduler::step`] advances one step (call it after `opt.step`).
///
/// ```
/// use tessel_nn::optim::{CosineAnnealingLr, LrScheduler, Optimizer, Sgd, SgdConfig};
/// use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let w = Tensor::from_vec(vec![1.0f32], [1])?;
/// let mut opt = Sgd::new(vec![w], SgdConfig { lr: 0.1, ..Default::default() })?;
/// let mut sched = LrScheduler::new(CosineAnnealingLr::new(10, 0.0)?, &mut opt);
/// for _ in 0..5 {
///     // ... opt.step(&loss)? ...
///     sched.step(&mut opt);
/// }
/// assert!((opt.lr() - 0.05).abs() < 1e-12);
/// # Ok(())
/// # }
/// ```
pub struct LrScheduler<S> {
    schedule: S,
    base_lr: f64,
    step: u64,
}

impl<S: LrSchedule> LrScheduler<S> {
    /// Starts `schedule` from `opt`'s current rate, setting the rate of step 0.
    pub fn new(schedule: S, opt: &mut dyn Optimizer) -> Self {
        let base_lr = opt.lr();
        opt.set_lr(schedule.lr_at(base_lr, 0));
        LrScheduler {
            schedule,
            base_lr,
            step: 0,
        }
    }

    /// Advances one step and sets `opt`'s rate for it.
    pub fn step(&mut self, opt: &mut dyn Optimizer) {
        self.step += 1;
        opt.set_lr(self.schedule.lr_at(self.base_lr, self.step));
    }

    /// The steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The rate the schedule gives for the current step.
    pub fn lr(&self) -> f64 {
        self.schedule.lr_at(self.base_lr, self.step)
    }

    /// The base rate the schedule scales.
    pub fn base_lr(&self) -> f64 {
        self.base_lr
    }
}
