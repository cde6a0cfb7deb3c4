//! Lowered kernels by the structure of what they compute, so that a model's repeated
//! layers are lowered once per kernelization instead of once per layer.
//!
//! Lowering a kernel reads nothing of the graph but its *cone*: the root, and every node it
//! evaluates in place (not materialized, or absorbable beside the root), down to the
//! buffers it loads (other materialized nodes and leaves), whose dtypes and shapes it
//! needs. Two kernels whose cones are equal up to node ids (the nodes in the same
//! depth-first order, each op's operands renumbered by position) with the same mode and
//! knobs lower to the same kernel up to which slots it reads and writes; so one lowering
//! serves both, its arguments and outputs moved over from one cone to the other by
//! position. Only finished kernels are kept: a retry or an unsuitable mode names nodes of
//! its own cone and is cheap to find again.

use std::sync::{Mutex, PoisonError};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::graph::{Graph, LeafId, Node, NodeId, Op};
use crate::kernelize::{KernelizeError, ScheduledKernel, Slot, renumber};
use crate::tune::Knobs;

/// One node of a cone, its operands renumbered by their position in the walk.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ConeNode {
    /// Evaluated by the kernel.
    Computed { node: Node, absorbable: bool },
    /// Loaded from a buffer: a materialized node, or a leaf.
    Loaded {
        dtype: tessel_shape::DType,
        shape: tessel_shape::Shape,
        leaf: bool,
    },
}

/// A cone's structure plus what else decides the lowering (mode, knobs, what is asked).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    cone: Vec<ConeNode>,
    /// The lowering asked for: mode, knobs or search, as the caller spells them.
    what: String,
}

/// A cone's nodes in walk order, and its key.
pub(crate) struct Cone {
    order: Vec<NodeId>,
    key: Key,
}

impl Cone {
    /// The cone of the kernel computing `root`, for the lowering `what` names.
    pub(crate) fn new(
        graph: &Graph,
        root: NodeId,
        materialized: &FxHashSet<NodeId>,
        absorbable: &FxHashSet<NodeId>,
        what: String,
    ) -> Cone {
        let computed = |n: NodeId| {
            n == root
                || (!matches!(graph.node(n).op, Op::Leaf(_))
                    && (!materialized.contains(&n) || absorbable.contains(&n)))
        };
        let mut pos: FxHashMap<NodeId, u32> = FxHashMap::default();
        let mut order = Vec::new();
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            if pos.contains_key(&n) {
                continue;
            }
            pos.insert(n, order.len() as u32);
            order.push(n);
            if computed(n) {
                // Reversed, so operands are numbered in their own order.
                stack.extend(graph.node(n).op.children().into_iter().rev());
            }
        }
        let cone = order
            .iter()
            .map(|&n| {
                let node = graph.node(n);
                if computed(n) {
                    ConeNode::Computed {
                        node: Node {
                            op: renumber(&node.op, |c| NodeId(pos[c])),
                            dtype: node.dtype,
                            shape: node.shape.clone(),
                        },
                        absorbable: n != root && absorbable.contains(&n),
                    }
                } else {
                    ConeNode::Loaded {
                        dtype: node.dtype,
                        shape: node.shape.clone(),
                        leaf: matches!(node.op, Op::Leaf(_)),
                    }
                }
            })
            .collect();
        Cone {
            order,
            key: Key { cone, what },
        }
    }
}

/// A lowering kept for its cone: the kernels, and the cone's nodes and leaf slots by
/// position, to move the kernels' slots to another cone of the same structure.
struct Kept {
    order: Vec<NodeId>,
    slots: Vec<Option<usize>>,
    kernels: Vec<(Knobs, ScheduledKernel)>,
}

/// Lowerings of one kernelization, by cone (see the module docs). Shared by the kernels
/// of one [`crate::kernelize`] call and their tuning variants.
#[derive(Default)]
pub(crate) struct LowerMemo {
    kept: Mutex<FxHashMap<Key, Kept>>,
}

impl std::fmt::Debug for LowerMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LowerMemo")
    }
}

impl LowerMemo {
    /// The kernels `lower` makes for `cone`, from an earlier lowering of an equal cone
    /// where there was one. `lower` returns `None` for what is not to be kept.
    pub(crate) fn get_or_lower(
        &self,
        graph: &Graph,
        leaf_slot: &FxHashMap<LeafId, usize>,
        cone: Cone,
        lower: impl FnOnce() -> Result<Option<Vec<(Knobs, ScheduledKernel)>>, KernelizeError>,
    ) -> Result<Option<Vec<(Knobs, ScheduledKernel)>>, KernelizeError> {
        let slots: Vec<Option<usize>> = cone
            .order
            .iter()
            .map(|&n| match graph.node(n).op {
                Op::Leaf(leaf) => leaf_slot.get(&leaf).copied(),
                _ => None,
            })
            .collect();
        let found = {
            let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            kept.get(&cone.key)
                .and_then(|k| moved(k, &cone.order, &slots))
        };
        if let Some(kernels) = found {
            return Ok(Some(kernels));
        }
        let kernels = lower()?;
        if let Some(kernels) = &kernels {
            let kept = Kept {
                order: cone.order,
                slots,
                kernels: kernels.clone(),
            };
            self.kept
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(cone.key, kept);
        }
        Ok(kernels)
    }
}

/// `kept`'s kernels with their slots moved to the cone `order` (leaf slots `slots`);
/// `None` where a slot has no counterpart (never, for equal keys).
fn moved(
    kept: &Kept,
    order: &[NodeId],
    slots: &[Option<usize>],
) -> Option<Vec<(Knobs, ScheduledKernel)>> {
    let nodes: FxHashMap<NodeId, NodeId> = kept
        .order
        .iter()
        .copied()
        .zip(order.iter().copied())
        .collect();
    let inputs: FxHashMap<usize, usize> = kept
        .slots
        .iter()
        .zip(slots)
        .filter_map(|(a, b)| Some(((*a)?, (*b)?)))
        .collect();
    let slot = |s: &Slot| match s {
        Slot::Node(n) => nodes.get(n).map(|&m| Slot::Node(m)),
        Slot::Input(i) => inputs.get(i).map(|&j| Slot::Input(j)),
    };
    kept.kernels
        .iter()
        .map(|(knobs, k)| {
            let k = ScheduledKernel {
                kernel: k.kernel.clone(),
                args: k.args.iter().map(slot).collect::<Option<_>>()?,
                writes: k
                    .writes
                    .iter()
                    .map(|w| nodes.get(w).copied())
                    .collect::<Option<_>>()?,
                cooperative: k.cooperative,
                recipe: None,
            };
            Some((*knobs, k))
        })
        .collect()
}
