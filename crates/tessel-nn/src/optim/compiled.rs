//! [`CompiledStep`]: a training step recorded once and replayed on each new batch.

use tessel_tensor::{Compiled, Error, Result, Tensor};

use super::Optimizer;

/// A training step (the loss on a batch, its gradients, the optimizer's update) recorded
/// once and replayed for every later batch: each [`CompiledStep::step`] sets the step's
/// values (learning rate, bias corrections), binds the batch, parameters and state to the
/// cached plan and launches it, without recording the forward pass, taking gradients or
/// looking the plan up. The updates are the ones [`Optimizer::step`] computes.
///
/// As with [`Compiled`], the loss function is traced once: tensors it reads besides the
/// batch and the optimizer's parameters and state (frozen weights, constants) keep their
/// values from when it was compiled, while random numbers it draws (dropout in training
/// mode) are drawn anew every step, as the recorded step would draw them. Not supported
/// yet (an `Err` when compiling): forward passes that update buffers (`BatchNorm` in
/// training mode), dynamic dims.
///
/// ```
/// use tessel_nn::optim::{CompiledStep, Optimizer, Sgd, SgdConfig};
/// use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let w = Tensor::from_vec(vec![1.0f32, 2.0], [2])?;
/// let mut opt = Sgd::new(vec![w.clone()], SgdConfig { lr: 0.5, ..Default::default() })?;
/// let x = Tensor::from_vec(vec![1.0f32, 1.0], [2])?;
/// let step = CompiledStep::new(&mut opt, &[&x], |b| (&b[0] * &w)?.sum_all())?;
/// let loss = step.step(&mut opt, &[&Tensor::from_vec(vec![0.2f32, -0.4], [2])?])?;
/// assert!((loss.item::<f32>()? - -0.6).abs() < 1e-6);
/// assert_eq!(w.to_vec::<f32>()?, vec![0.9, 2.2]); // w − 0.5 · x
/// # Ok(())
/// # }
/// ```
pub struct CompiledStep {
    compiled: Compiled,
    /// What each update output replaces, in output order after the loss.
    targets: Vec<Tensor>,
    /// How many arguments come from the optimizer, before the batch.
    from_optimizer: usize,
    /// The optimizer's parameters, to tell it from another.
    params: Vec<Tensor>,
}

impl CompiledStep {
    /// Records `loss` on `batch` (tensors standing for every later batch: same shapes,
    /// dtypes and device), its gradients with respect to `opt`'s parameters and `opt`'s
    /// update, and plans them (compiled and measured now). Takes no step: the optimizer's
    /// parameters, state and step count are unchanged.
    pub fn new<O: Optimizer + ?Sized>(
        opt: &mut O,
        batch: &[&Tensor],
        loss: impl FnOnce(&[Tensor]) -> Result<Tensor>,
    ) -> Result<CompiledStep> {
        let inputs = opt.update_inputs()?;
        let from_optimizer = inputs.len();
        let params: Vec<Tensor> = opt.params().to_vec();
        let mut args: Vec<&Tensor> = inputs.iter().collect();
        args.extend_from_slice(batch);
        let mut targets = Vec::new();
        let registered = crate::pending::registered_here();
        let compiled = Compiled::new(&args, |a| {
            let loss = loss(&a[from_optimizer..])?;
            if crate::pending::registered_here() != registered {
                return Err(Error::InvalidArgument {
                    op: "CompiledStep::new",
                    reason: "the loss updates buffers in its forward pass (BatchNorm in training mode), which a compiled step does not support yet; use Optimizer::step".into(),
                });
            }
            super::check_loss("CompiledStep::new", &loss)?;
            let wrt: Vec<&Tensor> = params.iter().collect();
            let grads = loss.backward(&wrt)?;
            let updates = opt.record_current(&grads)?;
            let mut outputs = vec![loss];
            for (target, value) in updates {
                targets.push(target);
                outputs.push(value);
            }
            Ok(outputs)
        })?;
        Ok(CompiledStep {
            compiled,
            targets,
            from_optimizer,
            params,
        })
    }

    /// One training step on `batch` (as many tensors as compiled with, each of the same
    /// shape, dtype and device): advances `opt` (the optimizer compiled with) one step,
    /// updates its parameters and state, and returns the loss (computed before the
    /// update, as [`Optimizer::step`] does).
    pub fn step<O: Optimizer + ?Sized>(&self, opt: &mut O, batch: &[&Tensor]) -> Result<Tensor> {
        let params = opt.params();
        if params.len() != self.params.len()
            || params.iter().zip(&self.params).any(|(a, b)| !a.is_same(b))
        {
            return Err(Error::InvalidArgument {
                op: "CompiledStep::step",
                reason: "this optimizer is not the one the step was compiled with; pass the same optimizer to new and step".into(),
            });
        }
        // Everything that can refuse the call is checked before the step count advances.
        let current = opt.update_inputs()?;
        let mut args: Vec<&Tensor> = current.iter().collect();
        args.extend_from_slice(batch);
        self.compiled.check(&args)?;
        Tensor::realize_all(batch)?;
        opt.advance()?;
        let inputs = opt.update_inputs()?;
        if inputs.len() != self.from_optimizer {
            return Err(Error::Internal(format!(
                "the optimizer reads {} tensors in an update, {} when the step was compiled",
                inputs.len(),
                self.from_optimizer
            )));
        }
        let mut args: Vec<&Tensor> = inputs.iter().collect();
        args.extend_from_slice(batch);
        let mut outputs = self.compiled.call(&args)?.into_iter();
        let loss = outputs
            .next()
            .ok_or_else(|| Error::Internal("a compiled step returned no loss".into()))?;
        for (target, value) in self.targets.iter().zip(outputs) {
            target.assign(&value)?;
        }
        Ok(loss)
    }

    /// Kernels one step launches.
    pub fn launches(&self) -> usize {
        self.compiled.launches()
    }
}
