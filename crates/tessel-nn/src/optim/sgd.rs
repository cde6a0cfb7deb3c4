//! [`Sgd`]: stochastic gradient descent with momentum (`torch.optim.SGD`).

use tessel_tensor::{Error, Result, Tensor};

use super::{
    Optimizer, StepValues, check_at_least, check_grads, check_params, narrow, widen, zeros_state,
};

/// [`Sgd`]'s hyperparameters; the defaults are PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate (default `1e-3`).
    pub lr: f64,
    /// Momentum factor (default `0`: plain SGD, no state).
    pub momentum: f64,
    /// Dampening of the gradient added to the momentum (default `0`).
    pub dampening: f64,
    /// L2 penalty added to the gradient, `g + weight_decay * p` (default `0`).
    pub weight_decay: f64,
    /// Nesterov momentum (default `false`; needs `momentum > 0` and `dampening == 0`).
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

/// Stochastic gradient descent, `torch.optim.SGD`: with gradient `g` of parameter `p`,
///
/// ```text
/// g ← g + weight_decay · p
/// b ← g                               (first step)
/// b ← momentum · b + (1 − dampening) · g   (later steps)
/// g ← g + momentum · b  (nesterov)  or  g ← b
/// p ← p − lr · g
/// ```
///
/// (the momentum lines only when `momentum != 0`).
pub struct Sgd {
    params: Vec<Tensor>,
    config: SgdConfig,
    /// One momentum buffer per parameter when `momentum != 0`.
    momentum: Vec<Tensor>,
    steps: u64,
    /// The learning rate and the gradient's factor.
    values: StepValues,
}

impl Sgd {
    /// An optimizer for `params` (usually `model.parameters()`).
    pub fn new(params: Vec<Tensor>, config: SgdConfig) -> Result<Sgd> {
        const OP: &str = "Sgd::new";
        check_params(OP, &params)?;
        check_at_least(OP, "lr", config.lr, 0.0)?;
        check_at_least(OP, "momentum", config.momentum, 0.0)?;
        if !config.dampening.is_finite() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("dampening must be finite, got {}", config.dampening),
            });
        }
        check_at_least(OP, "weight_decay", config.weight_decay, 0.0)?;
        if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "Nesterov momentum needs momentum > 0 and dampening == 0 (got momentum {}, dampening {})",
                    config.momentum, config.dampening
                ),
            });
        }
        let momentum = if config.momentum == 0.0 {
            Vec::new()
        } else {
            params.iter().map(zeros_state).collect::<Result<_>>()?
        };
        Ok(Sgd {
            params,
            config,
            momentum,
            steps: 0,
            values: StepValues::new(vec![0.0; 2]),
        })
    }

    /// The hyperparameters (with the current learning rate).
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    /// The momentum buffers, one per parameter (empty without momentum).
    pub fn momentum_buffers(&self) -> &[Tensor] {
        &self.momentum
    }
}

impl Optimizer for Sgd {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn lr(&self) -> f64 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.config.lr = lr;
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    fn advance(&mut self) -> Result<()> {
        let c = self.config;
        check_at_least("Sgd::step", "lr", c.lr, 0.0)?;
        // The buffers start at zero, so `momentum · 0 + k · g` is the first step's `b = g`
        // when the gradient's factor `k` is 1 on the first step and `1 − dampening` after:
        // both steps share one graph.
        let first = self.steps == 0;
        let grad_factor = if first { 1.0 } else { 1.0 - c.dampening };
        self.values.set(vec![c.lr, grad_factor])?;
        self.steps += 1;
        Ok(())
    }

    fn update_inputs(&mut self) -> Result<Vec<Tensor>> {
        let mut inputs = self.params.clone();
        inputs.extend(self.momentum.iter().cloned());
        inputs.extend(self.values.tensors(&self.params)?);
        Ok(inputs)
    }

    fn record_current(&mut self, grads: &[Tensor]) -> Result<Vec<(Tensor, Tensor)>> {
        const OP: &str = "Sgd::step";
        let c = self.config;
        check_grads(OP, &self.params, grads)?;
        let dampened = c.dampening != 0.0;
        let values = &mut self.values;
        let mut updates = Vec::with_capacity(self.params.len() * 2);
        for (i, (param, g)) in self.params.iter().zip(grads).enumerate() {
            let p = widen(param);
            let v = values.for_param(&p)?;
            let (lr, k) = (&v[0], &v[1]);
            let mut g = widen(g);
            if c.weight_decay != 0.0 {
                g = g.add(&p.mul(c.weight_decay)?)?;
            }
            if c.momentum != 0.0 {
                let buf = &self.momentum[i];
                let scaled = if dampened { g.mul(k)? } else { g.clone() };
                let new_buf = widen(buf).mul(c.momentum)?.add(&scaled)?;
                g = if c.nesterov {
                    g.add(&new_buf.mul(c.momentum)?)?
                } else {
                    new_buf.clone()
                };
                updates.push((buf.clone(), narrow(new_buf, buf)));
            }
            updates.push((param.clone(), narrow(p.sub(&g.mul(lr)?)?, param)));
        }
        Ok(updates)
    }
}
