//! [`Compiled`]: a function of tensors recorded once and replayed on new arguments.

use tessel_runtime::{Captured, Error, Result, runtime};
use tessel_shape::{DType, Shape};

use crate::dynamic::DimValues;
use crate::ops::{collect_keys, fresh_key};
use crate::tensor::Tensor;
use crate::{Device, RealizeReport};

/// A function of tensors recorded once and then replayed on new arguments without
/// recording its ops again, as `torch.compile` with CUDA graphs or `jax.jit` do.
///
/// [`Compiled::new`] calls the function once on its example arguments and plans what it
/// returns like a realize would (the same plan cache, the same measured choice).
/// [`Compiled::call`] binds new arguments of the same shapes, dtypes and device to that
/// plan, launches it (one CUDA graph replay where the backend captures them) and returns
/// the outputs as new realized tensors. A call's host time is binding and launching
/// alone: no op is recorded, no graph is walked, no plan is looked up, so loops of small
/// work (a training step, a decoding step) stop paying for recording them.
///
/// The function is traced, not re-run: **every tensor it reads besides its arguments is
/// fixed at its value when compiled** (a weight captured from the environment stays the
/// value it had; pass what changes as an argument), and host code inside it runs once.
/// Random numbers drawn inside it (`rand`, `randn`, `dropout`) are the exception: each
/// call draws anew from the process's generator, in the order the function drew them, so
/// a call after [`Tensor::manual_seed`] gives what the same code recorded would. Not
/// supported (an `Err` at compile time): dynamic dims, and random numbers on a device
/// without 64-bit integers (whose bits are made on the host).
///
/// ```
/// # use tessel_tensor::{Compiled, Tensor};
/// # fn main() -> tessel_tensor::Result<()> {
/// let b = Tensor::from_vec(vec![1.0f32, 1.0], [2])?; // fixed: not an argument
/// let x = Tensor::from_vec(vec![1.0f32, -2.0], [2])?;
/// let f = Compiled::new(&[&x], |a| Ok(vec![(&a[0] * 2.0)?.add(&b)?.relu()]))?;
/// let y = f.call(&[&Tensor::from_vec(vec![3.0f32, -4.0], [2])?])?;
/// assert_eq!(y[0].to_vec::<f32>()?, vec![7.0, 0.0]);
/// # Ok(())
/// # }
/// ```
pub struct Compiled {
    captured: Captured,
    device: Device,
    /// Draws the function makes: each call binds that many new keys after the arguments.
    draws: usize,
    args: Vec<(Shape, DType)>,
    outputs: Vec<(Shape, DType)>,
    report: RealizeReport,
}

impl Compiled {
    /// Records `f` on `args` (realized first) and plans its outputs: the plan cache's
    /// plan, or a new one, compiled and measured now. Nothing is computed for the caller:
    /// [`Compiled::call`] computes.
    ///
    /// Errors if the arguments are not all distinct tensors on one device, if `f` fails or
    /// returns no tensor, a tensor on another device, or one it did not compute (an
    /// argument or another realized tensor: return computed values only), and as
    /// [`Compiled`] says.
    pub fn new(
        args: &[&Tensor],
        f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    ) -> Result<Compiled> {
        const OP: &str = "Compiled::new";
        let device = args.first().map_or_else(Device::default, |a| a.device());
        for (i, a) in args.iter().enumerate() {
            if a.device() != device {
                return Err(Error::DeviceMismatch {
                    op: OP,
                    lhs: device.to_string(),
                    rhs: format!("{} (argument {i})", a.device()),
                });
            }
            if !a.dim_values().is_empty() {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "argument {i} has the dynamic shape {}; compile for concrete shapes",
                        a.shape()
                    ),
                });
            }
        }
        Tensor::realize_all(args)?;
        let nodes: Vec<_> = args.iter().map(|a| a.node()).collect();
        for (j, n) in nodes.iter().enumerate() {
            if let Some(i) = nodes[..j].iter().position(|m| m == n) {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "arguments {i} and {j} are the same tensor; pass it once and use it twice inside the function"
                    ),
                });
            }
        }
        let given: Vec<Tensor> = args.iter().map(|&a| a.clone()).collect();
        let (outputs, keys, keyed) = collect_keys(|| f(&given));
        let outputs = outputs?;
        if !keyed || keys.iter().any(|k| k.device() != device) {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "the function draws random numbers whose bits {device} cannot compute (no 64-bit integers: they are made on the host), which a compiled function does not support; draw them outside and pass them as arguments"
                ),
            });
        }
        if outputs.is_empty() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the function returned no tensor; return what it computes".into(),
            });
        }
        for (k, out) in outputs.iter().enumerate() {
            if out.device() != device {
                return Err(Error::DeviceMismatch {
                    op: OP,
                    lhs: device.to_string(),
                    rhs: format!("{} (output {k})", out.device()),
                });
            }
            if Tensor::all_realized(&[out]) {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "output {k} ({} {}) is an argument or another realized tensor, not a value the function computes; return computed values only",
                        out.shape(),
                        out.dtype()
                    ),
                });
            }
        }
        let targets: Vec<_> = outputs.iter().map(Tensor::node).collect();
        let mut bound = nodes;
        bound.extend(keys.iter().map(Tensor::node));
        let (captured, report) = runtime().capture(&targets, &bound, device)?;
        Ok(Compiled {
            captured,
            device,
            draws: keys.len(),
            args: args
                .iter()
                .map(|a| (a.shape().clone(), a.dtype()))
                .collect(),
            outputs: outputs
                .iter()
                .map(|o| (o.shape().clone(), o.dtype()))
                .collect(),
            report,
        })
    }

    /// Whether [`Compiled::call`] accepts `args`: as many as the function was compiled
    /// with, each of the same shape, dtype and device; `Err` names the first that is not.
    pub fn check(&self, args: &[&Tensor]) -> Result<()> {
        const OP: &str = "Compiled::call";
        if args.len() != self.args.len() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "{} arguments given; the function was compiled for {}",
                    args.len(),
                    self.args.len()
                ),
            });
        }
        for (i, (a, (shape, dtype))) in args.iter().zip(&self.args).enumerate() {
            if a.shape() != shape || a.dtype() != *dtype {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "argument {i} is {} {} but the function was compiled for {shape} {dtype}; compile another for new shapes or dtypes",
                        a.shape(),
                        a.dtype()
                    ),
                });
            }
            if a.device() != self.device {
                return Err(Error::DeviceMismatch {
                    op: OP,
                    lhs: self.device.to_string(),
                    rhs: format!("{} (argument {i})", a.device()),
                });
            }
        }
        Ok(())
    }

    /// The function's outputs for `args` (as many as it was compiled with, each of the
    /// same shape, dtype and device; unrealized ones are realized first), as new realized
    /// tensors.
    pub fn call(&self, args: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.check(args)?;
        Tensor::realize_all(args)?;
        let keys: Vec<Tensor> = (0..self.draws).map(|_| fresh_key(self.device)).collect();
        let nodes: Vec<_> = (args.iter().copied().chain(&keys))
            .map(Tensor::node)
            .collect();
        let outputs = runtime().replay(&self.captured, &nodes)?;
        Ok(outputs
            .into_iter()
            .zip(&self.outputs)
            .map(|(node, (shape, dtype))| {
                Tensor::from_node_with(
                    node,
                    shape.clone(),
                    *dtype,
                    self.device,
                    DimValues::default(),
                )
            })
            .collect())
    }

    /// Kernels one call launches.
    pub fn launches(&self) -> usize {
        self.captured.launches()
    }

    /// What planning the function at [`Compiled::new`] did (programs compiled, found in
    /// caches).
    pub fn report(&self) -> RealizeReport {
        self.report
    }
}
