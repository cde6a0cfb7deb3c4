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

/// The backward of a custom kernel: given the inputs, the outputs and the outputs'
/// gradients (zeros for an output the loss does not reach), each input's gradient (`None`
/// for an input that gets none, such as indices).
pub type CustomBackward =
    dyn Fn(&[Tensor], &[Tensor], &[Tensor]) -> Result<Vec<Option<Tensor>>> + Send + Sync;

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
///     .with_backward(|_inputs, _outputs, g| Ok(vec![Some((&g[0] * 2.0)?)]));
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
    /// inputs, the outputs and the outputs' gradients, it returns one gradient per input
    /// (of the input's shape and dtype) or `None`.
    #[must_use]
    pub fn with_backward(
        self,
        backward: impl Fn(&[Tensor], &[Tensor], &[Tensor]) -> Result<Vec<Option<Tensor>>>
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
        Ok(self.apply_many(inputs, &[(shape.into(), dtype)])?.remove(0))
    }

    /// The kernel run on `inputs`, giving one output per entry of `outputs` (their buffer
    /// parameters follow the inputs', in order; see [`CustomOp::apply`] for the rules).
    /// Several outputs share a dtype and an access: the kernel writes them into one buffer
    /// (`tessel_ir::passes::merge_buffers`) of which each output is a view, so realizing
    /// them together runs the kernel once.
    pub fn apply_many(
        &self,
        inputs: &[&Tensor],
        outputs: &[(Shape, DType)],
    ) -> Result<Vec<Tensor>> {
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
        if outputs.is_empty() {
            return Err(wrong("a kernel call needs at least one output".into()));
        }
        if buffers.len() != inputs.len() + outputs.len() {
            return Err(wrong(format!(
                "it has {} buffer parameters, but {} inputs and {} outputs need {}",
                buffers.len(),
                inputs.len(),
                outputs.len(),
                inputs.len() + outputs.len()
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
        for (k, (shape, dtype)) in outputs.iter().enumerate() {
            let at = inputs.len() + k;
            expect(
                at,
                &format!("output {k} (shape {shape})"),
                (*dtype, shape.numel()),
                matches!(buffers[at].3, Access::Write | Access::Accumulate),
            )?;
        }
        let out_vars = outputs
            .iter()
            .flat_map(|(s, _)| s.iter().flat_map(|d| d.vars()));
        for var in kernel.dim_vars().into_iter().chain(out_vars) {
            if !vars.contains(&var) {
                return Err(wrong(format!(
                    "`{var}` is not a dynamic dim of any input, so nothing gives it a value \
                     at launch (mark an input's dim dynamic with it)"
                )));
            }
        }
        let nodes: Box<[_]> = inputs.iter().map(|t| t.node()).collect();
        let record = |call: Arc<CustomKernel>, shape: Shape, dtype: DType| {
            let op = Op::Custom(call, nodes.clone());
            match inputs.split_first() {
                Some((first, rest)) => first.record_with(rest, op, dtype, shape),
                None => Tensor::record_on(device, op, dtype, shape),
            }
        };
        if let [(shape, dtype)] = outputs {
            return Ok(vec![record(Arc::clone(&self.call), shape.clone(), *dtype)]);
        }
        let merged =
            tessel_ir::passes::merge_buffers(kernel, inputs.len(), outputs.len(), "outputs")
                .map_err(|e| wrong(format!("its outputs cannot share one buffer: {e}")))?;
        let shapes: Vec<Shape> = outputs.iter().map(|(s, _)| s.clone()).collect();
        let total: Expr = shapes.iter().map(Shape::numel).sum();
        let call = Arc::new(self.call.with_outputs(merged, shapes.clone()));
        let all = record(call, Shape::new(vec![total]), outputs[0].1);
        Ok(split_outputs(&all, &shapes))
    }
}

/// The outputs a merged custom node holds one after another, as views of it.
pub(crate) fn split_outputs(all: &Tensor, shapes: &[Shape]) -> Vec<Tensor> {
    let mut start = Expr::constant(0);
    shapes
        .iter()
        .map(|shape| {
            let n = shape.numel();
            let flat =
                super::movement::shrink(all, vec![(start, Expr::constant(1))], Shape::new(vec![n]));
            start += n;
            flat.record(Op::Reshape(flat.node()), flat.dtype(), shape.clone())
        })
        .collect()
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
