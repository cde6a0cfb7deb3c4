//! Hand-written kernels as graph nodes ([`Op::Custom`]): the kernel runs as written, as one
//! kernel of the schedule, reading its inputs' buffers and writing the node's.
//!
//! A custom node's operands are materialized (row-major buffers), so the kernel's buffer
//! parameters bind positionally to the operands' buffers, then the node's own. The kernel
//! has no knobs: it is compiled as is (through `tessel_ir::backend::prepare`, which guards
//! whatever the verifier cannot prove in bounds), never retuned or fused into another.

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHashMap;
use tessel_ir::Kernel;
use tessel_shape::Shape;

use crate::graph::{Graph, LeafId, NodeId, Op};
use crate::kernelize::{KernelizeError, ScheduledKernel, Slot};
use crate::lower::Lowering;

/// A user's kernel, and what the tensor layer attached to it (a backward function, opaque
/// here). Two are equal when their kernels and output layouts are, and they carry the same
/// attachment.
pub struct CustomKernel {
    kernel: Kernel,
    /// The shapes of several outputs the node holds one after another (their kernel
    /// parameters merged into one, see `tessel_ir::passes::merge_buffers`); empty when the
    /// node is the kernel's one output.
    outputs: Box<[Shape]>,
    /// A hash of the kernel's text and the layout, for `Hash`.
    fingerprint: u128,
    /// An attachment and its identity.
    extra: Option<(u64, Arc<dyn Any + Send + Sync>)>,
}

impl CustomKernel {
    /// Wraps `kernel` with an optional attachment (the tensor layer keeps a backward
    /// function there; each attachment gets its own identity).
    pub fn new(kernel: Kernel, extra: Option<Arc<dyn Any + Send + Sync>>) -> CustomKernel {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let extra = extra.map(|e| (NEXT.fetch_add(1, Ordering::Relaxed), e));
        CustomKernel::build(kernel, Box::new([]), extra)
    }

    /// `kernel` (this one's with its outputs merged) holding `outputs` one after another,
    /// with this one's attachment and its identity.
    pub fn with_outputs(&self, kernel: Kernel, outputs: Vec<Shape>) -> CustomKernel {
        CustomKernel::build(kernel, outputs.into(), self.extra.clone())
    }

    fn build(
        kernel: Kernel,
        outputs: Box<[Shape]>,
        extra: Option<(u64, Arc<dyn Any + Send + Sync>)>,
    ) -> CustomKernel {
        let mut hash = tessel_ir::cache::Fnv128::new();
        hash.field(kernel.to_string().as_bytes());
        for shape in &outputs {
            hash.field(shape.to_string().as_bytes());
        }
        CustomKernel {
            fingerprint: hash.finish(),
            kernel,
            outputs,
            extra,
        }
    }

    /// The kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The shapes of the outputs the node holds one after another, or none when the node
    /// is the one output.
    pub fn outputs(&self) -> &[Shape] {
        &self.outputs
    }

    /// The attachment given to [`CustomKernel::new`].
    pub fn extra(&self) -> Option<&Arc<dyn Any + Send + Sync>> {
        self.extra.as_ref().map(|(_, e)| e)
    }

    fn identity(&self) -> (u128, Option<u64>) {
        (self.fingerprint, self.extra.as_ref().map(|(id, _)| *id))
    }
}

impl PartialEq for CustomKernel {
    fn eq(&self, other: &Self) -> bool {
        self.identity() == other.identity()
            && self.kernel == other.kernel
            && self.outputs == other.outputs
    }
}

impl Eq for CustomKernel {}

impl Hash for CustomKernel {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.identity().hash(state);
    }
}

impl fmt::Debug for CustomKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "custom `{}`", self.kernel.name)
    }
}

/// Lowers custom node `root`: its kernel as written, bound to its operands' buffers and
/// its own.
pub(crate) fn lower_custom_kernel(
    graph: &Graph,
    root: NodeId,
    leaf_slot: &FxHashMap<LeafId, usize>,
) -> Result<Lowering, KernelizeError> {
    let Op::Custom(call, inputs) = &graph.node(root).op else {
        unreachable!("only custom nodes are lowered here")
    };
    let mut args = Vec::with_capacity(inputs.len() + 1);
    for &input in inputs {
        args.push(match graph.node(input).op {
            Op::Leaf(leaf) => Slot::Input(*leaf_slot.get(&leaf).ok_or_else(|| {
                KernelizeError(format!(
                    "{root:?}: custom kernel input {input:?} has no slot"
                ))
            })?),
            // Materialized by `choose_materialized`.
            _ => Slot::Node(input),
        });
    }
    args.push(Slot::Node(root));
    Ok(Lowering::Done(Box::new(ScheduledKernel {
        kernel: call.kernel.clone(),
        args,
        writes: vec![root],
        cooperative: false,
        recipe: None,
    })))
}
