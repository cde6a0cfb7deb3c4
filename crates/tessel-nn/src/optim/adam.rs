//! [`Adam`] and [`AdamW`] (`torch.optim.Adam`, `torch.optim.AdamW`).

use tessel_tensor::{Error, Result, Tensor};

use super::{
    Optimizer, StepValues, check_at_least, check_grads, check_params, narrow, widen, zeros_state,
};

/// [`Adam`]'s hyperparameters; the defaults are PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Learning rate (default `1e-3`).
    pub lr: f64,
    /// Decay rates of the first and second moment averages (default `(0.9, 0.999)`).
    pub betas: (f64, f64),
    /// Added to the denominator for stability (default `1e-8`).
    pub eps: f64,
    /// L2 penalty added to the gradient, `g + weight_decay · p` (default `0`).
    pub weight_decay: f64,
    /// Divide by the running maximum of the second moment (`AMSGrad`; default `false`).
    pub amsgrad: bool,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
        }
    }
}

/// [`AdamW`]'s hyperparameters; the defaults are PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate (default `1e-3`).
    pub lr: f64,
    /// Decay rates of the first and second moment averages (default `(0.9, 0.999)`).
    pub betas: (f64, f64),
    /// Added to the denominator for stability (default `1e-8`).
    pub eps: f64,
    /// Decoupled weight decay, `p ← p · (1 − lr · weight_decay)` (default `1e-2`).
    pub weight_decay: f64,
    /// Divide by the running maximum of the second moment (`AMSGrad`; default `false`).
    pub amsgrad: bool,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            amsgrad: false,
        }
    }
}

/// What [`Adam`] and [`AdamW`] share; they differ only in how weight decay enters.
struct AdamCore {
    op: &'static str,
    params: Vec<Tensor>,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    amsgrad: bool,
    /// `AdamW`'s decay of the parameter instead of Adam's L2 term in the gradient.
    decoupled: bool,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Empty unless `amsgrad`.
    max_exp_avg_sq: Vec<Tensor>,
    steps: u64,
    /// Step size, the square root of the second bias correction, decoupled decay.
    values: StepValues,
}

impl AdamCore {
    #[allow(clippy::too_many_arguments)] // The two configs' fields, spelled out once.
    fn new(
        op: &'static str,
        params: Vec<Tensor>,
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
        amsgrad: bool,
        decoupled: bool,
    ) -> Result<AdamCore> {
        check_params(op, &params)?;
        check_at_least(op, "lr", lr, 0.0)?;
        check_at_least(op, "eps", eps, 0.0)?;
        check_at_least(op, "weight_decay", weight_decay, 0.0)?;
        for (name, beta) in [("betas.0", betas.0), ("betas.1", betas.1)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(Error::InvalidArgument {
                    op,
                    reason: format!("{name} must be in [0, 1), got {beta}"),
                });
            }
        }
        let zeros = |ps: &[Tensor]| ps.iter().map(zeros_state).collect::<Result<Vec<_>>>();
        Ok(AdamCore {
            op,
            exp_avg: zeros(&params)?,
            exp_avg_sq: zeros(&params)?,
            max_exp_avg_sq: if amsgrad { zeros(&params)? } else { Vec::new() },
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            decoupled,
            steps: 0,
            values: StepValues::new(vec![0.0; 3]),
        })
    }

    /// One step of `torch.optim.Adam`'s single-tensor update (`AdamW`'s when `decoupled`):
    ///
    /// ```text
    /// t ← t + 1
    /// p ← p · (1 − lr · λ)                      (AdamW)
    /// g ← g + λ · p                             (Adam with weight decay)
    /// m ← lerp(m, g, 1 − β1)
    /// v ← β2 · v + (1 − β2) · g²
    /// v̂ ← max(v̂, v)                            (AMSGrad; used for v below)
    /// p ← p − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + ε)
    /// ```
    ///
    /// `f16`/`bf16` parameters compute this in `f32` and store `p`, `m`, `v` rounded.
    fn advance(&mut self) -> Result<()> {
        check_at_least(self.op, "lr", self.lr, 0.0)?;
        let (beta1, beta2) = self.betas;
        let t = self.steps + 1;
        // Step counts beyond i32 only make β^t underflow to 0, as it does long before.
        let exponent = t.min(i32::MAX as u64) as i32;
        let bias_correction1 = 1.0 - beta1.powi(exponent);
        let bias_correction2 = 1.0 - beta2.powi(exponent);
        let step_size = self.lr / bias_correction1;
        let decay = 1.0 - self.lr * self.weight_decay;
        self.values
            .set(vec![step_size, bias_correction2.sqrt(), decay])?;
        self.steps = t;
        Ok(())
    }

    fn update_inputs(&mut self) -> Result<Vec<Tensor>> {
        let mut inputs = self.params.clone();
        inputs.extend(self.exp_avg.iter().cloned());
        inputs.extend(self.exp_avg_sq.iter().cloned());
        inputs.extend(self.max_exp_avg_sq.iter().cloned());
        inputs.extend(self.values.tensors(&self.params)?);
        Ok(inputs)
    }

    fn record(&mut self, grads: &[Tensor]) -> Result<Vec<(Tensor, Tensor)>> {
        let op = self.op;
        check_grads(op, &self.params, grads)?;
        let (beta1, beta2) = self.betas;
        let values = &mut self.values;
        let weight = 1.0 - beta1;
        let mut updates = Vec::with_capacity(self.params.len() * 4);
        for (i, (param, g)) in self.params.iter().zip(grads).enumerate() {
            let p = widen(param);
            let v = values.for_param(&p)?;
            let (step_size, bc2_sqrt, decay) = (&v[0], &v[1], &v[2]);
            let mut p_new = p.clone();
            let mut g = widen(g);
            if self.weight_decay != 0.0 {
                if self.decoupled {
                    p_new = p.mul(decay)?;
                } else {
                    g = g.add(&p.mul(self.weight_decay)?)?;
                }
            }
            let (m, sq) = (&self.exp_avg[i], &self.exp_avg_sq[i]);
            let m_old = widen(m);
            // `torch.lerp`'s two forms, chosen by the weight as PyTorch does, so the
            // rounding matches.
            let m_new = if weight < 0.5 {
                m_old.add(&g.sub(&m_old)?.mul(weight)?)?
            } else {
                g.sub(&g.sub(&m_old)?.mul(1.0 - weight)?)?
            };
            let sq_new = widen(sq).mul(beta2)?.add(&g.mul(1.0 - beta2)?.mul(&g)?)?;
            let second = if self.amsgrad {
                let max = &self.max_exp_avg_sq[i];
                let max_new = widen(max).maximum(&sq_new)?;
                updates.push((max.clone(), narrow(max_new.clone(), max)));
                max_new
            } else {
                sq_new.clone()
            };
            let denom = second.sqrt().div(bc2_sqrt)?.add(self.eps)?;
            p_new = p_new.sub(&m_new.mul(step_size)?.div(&denom)?)?;
            updates.push((m.clone(), narrow(m_new, m)));
            updates.push((sq.clone(), narrow(sq_new, sq)));
            updates.push((param.clone(), narrow(p_new, param)));
        }
        Ok(updates)
    }
}

macro_rules! adam_optimizer {
    ($(#[$doc:meta])* $name:ident, $config:ident, $op:literal, $decoupled:literal) => {
        $(#[$doc])*
        pub struct $name(AdamCore);

        impl $name {
            /// An optimizer for `params` (usually `model.parameters()`).
            pub fn new(params: Vec<Tensor>, config: $config) -> Result<$name> {
                let $config { lr, betas, eps, weight_decay, amsgrad } = config;
                AdamCore::new($op, params, lr, betas, eps, weight_decay, amsgrad, $decoupled)
                    .map($name)
            }

            /// The hyperparameters (with the current learning rate).
            pub fn config(&self) -> $config {
                let c = &self.0;
                $config {
                    lr: c.lr,
                    betas: c.betas,
                    eps: c.eps,
                    weight_decay: c.weight_decay,
                    amsgrad: c.amsgrad,
                }
            }

            /// The first-moment averages (`exp_avg`), one per parameter.
            pub fn exp_avg(&self) -> &[Tensor] {
                &self.0.exp_avg
            }

            /// The second-moment averages (`exp_avg_sq`), one per parameter.
            pub fn exp_avg_sq(&self) -> &[Tensor] {
                &self.0.exp_avg_sq
            }

            /// `AMSGrad`'s running maxima (`max_exp_avg_sq`); empty without `amsgrad`.
            pub fn max_exp_avg_sq(&self) -> &[Tensor] {
                &self.0.max_exp_avg_sq
            }
        }

        impl Optimizer for $name {
            fn params(&self) -> &[Tensor] {
                &self.0.params
            }

            fn lr(&self) -> f64 {
                self.0.lr
            }

            fn set_lr(&mut self, lr: f64) {
                self.0.lr = lr;
            }

            fn steps(&self) -> u64 {
                self.0.steps
            }

            fn advance(&mut self) -> Result<()> {
                self.0.advance()
            }

            fn record_current(&mut self, grads: &[Tensor]) -> Result<Vec<(Tensor, Tensor)>> {
                self.0.record(grads)
            }

            fn update_inputs(&mut self) -> Result<Vec<Tensor>> {
                self.0.update_inputs()
            }
        }
    };
}

adam_optimizer!(
    /// Adam (`torch.optim.Adam`): adaptive moment estimation, with weight decay as an L2
    /// term added to the gradient. See [`AdamW`] for decoupled weight decay.
    ///
    /// ```text
    /// g ← g + weight_decay · p
    /// m ← β1 · m + (1 − β1) · g
    /// v ← β2 · v + (1 − β2) · g²
    /// p ← p − lr / (1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + eps)
    /// ```
    Adam,
    AdamConfig,
    "Adam::step",
    false
);

adam_optimizer!(
    /// `AdamW` (`torch.optim.AdamW`): Adam with decoupled weight decay, which shrinks the
    /// parameter directly instead of adding an L2 term to the gradient.
    ///
    /// ```text
    /// p ← p · (1 − lr · weight_decay)
    /// m ← β1 · m + (1 − β1) · g
    /// v ← β2 · v + (1 − β2) · g²
    /// p ← p − lr / (1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + eps)
    /// ```
    ///
    /// ```
    /// use tessel_nn::optim::{AdamW, AdamWConfig, Optimizer};
    /// use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let w = Tensor::from_vec(vec![1.0f64, -1.0], [2])?;
    /// let mut opt = AdamW::new(vec![w.clone()], AdamWConfig { lr: 0.1, ..Default::default() })?;
    /// opt.apply(&[Tensor::from_vec(vec![0.5f64, -2.0], [2])?], &[])?;
    /// // The first step moves each weight by about lr against its gradient's sign.
    /// let w1 = w.to_vec::<f64>()?;
    /// assert!((w1[0] - (1.0 * (1.0 - 0.1 * 0.01) - 0.1)).abs() < 1e-6);
    /// assert!((w1[1] - (-1.0 * (1.0 - 0.1 * 0.01) + 0.1)).abs() < 1e-6);
    /// # Ok(())
    /// # }
    /// ```
    AdamW,
    AdamWConfig,
    "AdamW::step",
    true
);
