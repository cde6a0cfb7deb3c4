//! Hand-written kernels on tensors: [`CustomOp`] and [`Tensor::custom`].
//!
//! A kernel written with `tessel_ir::KernelBuilder` becomes a graph node: its buffer
//! parameters bind, in order, to the inputs' values (row-major; an input that is a view or
//! an expression is computed into a buffer first) and then to the output. The planner
//! schedules it like any kernel, on the inputs' device, and every backend compiles it
//! through `tessel_ir::backend::prepare`, which guards each access the verifier cannot
//! prove in bounds: a kernel reads zeros outside its buffers and drops stores outside them,
//! so no kernel reaches memory it does not own.

use std::sync::Arc;

use tessel_graph::{CustomKernel, Op};
use tessel_ir::{Access, Kernel, Param};
use tessel_runtime::{Device, Error, Result};
use tessel_shape::{DType, Expr, Shape, Var};

use crate::tensor::Tensor;

/// The backward of a custom kernel: given the inputs, the output and the output's gradient,
/// each input's gradient (`None` for an input that gets none, such as indices).
pub type CustomBackward =
    dyn Fn(&[Tensor], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync;

/// What a custom node carries for autograd.
pub(crate) struct Backward(pub(crate) Box<CustomBackward>);

/// A verified hand-written kernel, ready to run on tensors, with an optional backward.
///
/// Build it once and [`apply`](CustomOp::apply) it every step: plans are cached by the
/// kernel and its backward, so a new `CustomOp` each step plans again.
///
/// ```
/// use tessel_ir::{Access, KernelBuilder};
/// use tessel_tensor::{CustomOp, DType, Tensor};
/// # fn main() -> tessel_tensor::Result<()> {
/// // out[i] = 2 * x[i] for 4 elements.
/// let mut kb = KernelBuilder::new("twice");
/// let x = kb.buffer("x", DType::F32, 4, Access::Read);
/// let out = kb.buffer("out", DType::F32, 4, Access::Write);
/// kb.grid([1, 1, 1], [4, 1, 1]);
/// let i = kb.local_id(0, DType::I32);
/// let v = kb.load(x, i);
/// let v = kb.add(v, v);
/// kb.store(out, i, v);
/// let twice = CustomOp::new(kb.build().unwrap())?
///     .with_backward(|_inputs, _out, g| Ok(vec![Some((g * 2.0)?)]));
/// let x = Tensor::from([1.0f32, 2.0, 3.0, 4.0]);
/// let y = twice.apply(&[&x], [4], DType::F32)?;
/// let g = tessel_tensor::grad(&y.sum_all()?, &[&x])?.remove(0);
/// assert_eq!(y.to_vec::<f32>()?, vec![2.0, 4.0, 6.0, 8.0]);
/// assert_eq!(g.to_vec::<f32>()?, vec![2.0; 4]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct CustomOp {
    call: Arc<CustomKernel>,
}

impl CustomOp {
    /// Verifies `kernel`; an invalid one is an `InvalidArgument` with the verifier's
    /// message. Without [`with_backward`](CustomOp::with_backward), a gradient through
    /// the kernel is an error.
    pub fn new(kernel: Kernel) -> Result<CustomOp> {
        tessel_ir::verify(&kernel).map_err(|e| Error::InvalidArgument {
            op: "custom",
            reason: format!("the kernel does not verify: {e}"),
        })?;
        Ok(CustomOp {
            call: Arc::new(CustomKernel::new(kernel, None)),
        })
    }

    /// The same kernel with `backward` as its vector-Jacobian product: called with the
    /// inputs, the output and the output's gradient, it returns one gradient per input (of
    /// the input's shape and dtype) or `None`.
    #[must_use]
    pub fn with_backward(
        self,
        backward: impl Fn(&[Tensor], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>>
        + Send
        + Sync
        + 'static,
    ) -> CustomOp {
        let extra: Arc<dyn std::any::Any + Send + Sync> = Arc::new(Backward(Box::new(backward)));
        CustomOp {
            call: Arc::new(CustomKernel::new(self.call.kernel().clone(), Some(extra))),
        }
    }

    /// The kernel.
    pub fn kernel(&self) -> &Kernel {
        self.call.kernel()
    }

    /// The kernel run on `inputs`, giving an output of `shape` and `dtype` (lazily, like
    /// every op). The kernel must have one buffer parameter per input, reading (`Read`)
    /// exactly the input's dtype and element count, then one for the output, writing it
    /// (`Write` or `Accumulate`) with the output's dtype and element count. Its dim
    /// parameters must be dynamic dims of the inputs' shapes. Inputs share one device;
    /// with no inputs the kernel runs on the default device.
    pub fn apply(
        &self,
        inputs: &[&Tensor],
        shape: impl Into<Shape>,
        dtype: DType,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let kernel = self.call.kernel();
        let device = inputs.first().map_or_else(Device::default, |t| t.device());
        for t in inputs {
            if t.device() != device {
                return Err(Error::DeviceMismatch {
                    op: "custom",
                    lhs: device.to_string(),
                    rhs: t.device().to_string(),
                });
            }
        }
        let buffers: Vec<(String, DType, Expr, Access)> = kernel
            .params
            .iter()
            .filter_map(|p| match p {
                Param::Buffer {
                    name,
                    dtype,
                    len,
                    access,
                } => Some((name.clone(), *dtype, *len, *access)),
                Param::Dim { .. } => None,
            })
            .collect();
        let wrong = |reason: String| Error::InvalidArgument {
            op: "custom",
            reason: format!("kernel `{}`: {reason}", kernel.name),
        };
        if buffers.len() != inputs.len() + 1 {
            return Err(wrong(format!(
                "it has {} buffer parameters, but {} inputs and one output need {}",
                buffers.len(),
                inputs.len(),
                inputs.len() + 1
            )));
        }
        let expect = |k: usize, what: &str, want: (DType, Expr), access_ok: bool| {
            let (name, dtype, len, access) = &buffers[k];
            if !access_ok {
                return Err(wrong(format!(
                    "buffer `{name}` binds the {what} but is declared {access:?}"
                )));
            }
            if (*dtype, *len) != want {
                return Err(wrong(format!(
                    "buffer `{name}` is {len} elements of {dtype}, but the {what} is {} \
                     elements of {}",
                    want.1, want.0
                )));
            }
            Ok(())
        };
        let mut vars: Vec<Var> = Vec::new();
        for (k, t) in inputs.iter().enumerate() {
            let numel = t.shape().numel();
            vars.extend(t.shape().iter().flat_map(|d| d.vars()));
            let what = format!("input {k} (shape {})", t.shape());
            expect(k, &what, (t.dtype(), numel), buffers[k].3 == Access::Read)?;
        }
        let out_access = buffers[inputs.len()].3;
        expect(
            inputs.len(),
            &format!("output (shape {shape})"),
            (dtype, shape.numel()),
            matches!(out_access, Access::Write | Access::Accumulate),
        )?;
        for var in kernel
            .dim_vars()
            .into_iter()
            .chain(shape.iter().flat_map(|d| d.vars()))
        {
            if !vars.contains(&var) {
                return Err(wrong(format!(
                    "`{var}` is not a dynamic dim of any input, so nothing gives it a value \
                     at launch (mark an input's dim dynamic with it)"
                )));
            }
        }
        let op = Op::Custom(
            Arc::clone(&self.call),
            inputs.iter().map(|t| t.node()).collect(),
        );
        Ok(match inputs.split_first() {
            Some((first, rest)) => first.record_with(rest, op, dtype, shape),
            None => Tensor::record_on(device, op, dtype, shape),
        })
    }
}

impl Tensor {
    /// Runs the hand-written `kernel` on `inputs`, giving an output of `shape` and `dtype`:
    /// [`CustomOp::new`] then [`CustomOp::apply`] (see there for the rules). For a kernel
    /// used every step, or one with a backward, keep a [`CustomOp`].
    pub fn custom(
        kernel: &Kernel,
        inputs: &[&Tensor],
        shape: impl Into<Shape>,
        dtype: DType,
    ) -> Result<Tensor> {
        CustomOp::new(kernel.clone())?.apply(inputs, shape, dtype)
    }
}
