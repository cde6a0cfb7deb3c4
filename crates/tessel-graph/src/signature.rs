//! Structural keys of realized subgraphs: what the plan cache is keyed by.
//!
//! A [`Signature`] holds the subgraph behind some targets with operands renumbered by
//! position and leaves by first appearance, so two realizes of the same computation on
//! different data get equal signatures. Every realize needs one, and most find their plan
//! cached, so the lookup is built not to copy the subgraph: a [`Walk`] orders the nodes,
//! hashes them and lists the leaves in one pass, and [`Walk::matches`] compares a stored
//! signature against the live graph node by node. Only a miss builds an owned
//! [`Signature`] ([`Walk::signature`]).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rustc_hash::FxHasher;

use crate::graph::{Graph, LeafId, Node, NodeId, Op};
use crate::kernelize::renumber;

/// [`Walk`]'s mark of a node not reached yet.
const UNSEEN: u32 = u32::MAX;
/// [`Walk`]'s mark of a node whose operands are being placed.
const OPEN: u32 = u32::MAX - 1;

/// A structural key of the subgraph behind some targets: equal keys mean the same
/// computation on (possibly) different leaf data, so a cached schedule can be replayed.
/// Hashing it costs one word: the hash of its structure is computed once, by the
/// [`Walk`] that built it.
#[derive(Clone, Debug, Eq)]
pub struct Signature {
    /// Each node with operands renumbered by position and leaves by first appearance
    /// (shared: a cached plan's key is cloned on every replay).
    nodes: Arc<[Node]>,
    /// Positions of the targets.
    targets: Arc<[u32]>,
    /// [`Walk::hash`] of the walk it was built from.
    hash: u64,
}

impl PartialEq for Signature {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.targets == other.targets && self.nodes == other.nodes
    }
}

impl Hash for Signature {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl Signature {
    /// The structural hash ([`Walk::hash`]).
    pub fn structure_hash(&self) -> u64 {
        self.hash
    }

    /// A 128-bit hash of the structure that every process computes alike, for keys on
    /// disk; `None` where the subgraph holds a custom kernel (known by identity within one
    /// process). Dynamic dims count by name and bounds (what makes a variable), not by
    /// value: a plan binds their values at launch.
    pub fn stable_hash(&self) -> Option<u128> {
        let mut h = tessel_ir::cache::Fnv128::new();
        let mut text = String::new();
        for node in self.nodes.iter() {
            if matches!(node.op, Op::Custom(..)) {
                return None;
            }
            text.clear();
            for d in node.shape.dims().iter().filter(|d| !d.is_const()) {
                let _ = std::fmt::Write::write_fmt(&mut text, format_args!("{:?}", d.vars()));
            }
            // Every part of a node prints exactly (ops and dtypes by name, sizes as
            // integers, float constants as their shortest exact decimals), except a NaN
            // constant's payload, which no plan depends on.
            let _ = std::fmt::Write::write_fmt(&mut text, format_args!("{node:?}"));
            h.field(text.as_bytes());
        }
        for t in self.targets.iter() {
            h.bytes(&t.to_le_bytes());
        }
        Some(h.finish())
    }
}

/// The subgraph behind some targets, walked once: operands before users, each node's
/// position, the leaves in the order [`Slot::Input`](crate::Slot::Input) numbers them, and
/// a hash of the structure that equal [`Signature`]s share.
#[derive(Clone, Debug)]
pub struct Walk {
    order: Vec<NodeId>,
    /// Each walked node's position in `order`, indexed by id.
    position: Vec<u32>,
    targets: Vec<u32>,
    leaves: Vec<LeafId>,
    hash: u64,
}

impl Walk {
    /// Walks the live nodes `targets` depend on.
    pub fn new(graph: &Graph, targets: &[NodeId]) -> Walk {
        // `Graph::toposort`'s iterative post-order, with the position table (indexed by
        // id: cheaper than hashing, per node of a replay) as its visited set, each node
        // hashed as it is placed.
        let mut position = vec![UNSEEN; graph.id_bound()];
        let mut order = Vec::new();
        let mut leaves = Vec::new();
        let mut h = FxHasher::default();
        let mut stack: Vec<(NodeId, bool)> = targets.iter().rev().map(|&t| (t, false)).collect();
        while let Some((id, expanded)) = stack.pop() {
            let node = graph.node(id);
            if expanded {
                if let Op::Leaf(leaf) = node.op {
                    leaves.push(leaf);
                }
                h.write_u64(graph.form_hash(id));
                for c in node.op.operands() {
                    h.write_u32(position[c.0 as usize]);
                }
                position[id.0 as usize] = order.len() as u32;
                order.push(id);
                continue;
            }
            if position[id.0 as usize] != UNSEEN {
                continue;
            }
            position[id.0 as usize] = OPEN;
            stack.push((id, true));
            let first = stack.len();
            for c in node.op.operands() {
                if position[c.0 as usize] == UNSEEN {
                    stack.push((c, false));
                }
            }
            stack[first..].reverse();
        }
        let targets: Vec<u32> = targets.iter().map(|t| position[t.0 as usize]).collect();
        targets.hash(&mut h);
        Walk {
            order,
            position,
            targets,
            leaves,
            hash: h.finish(),
        }
    }

    /// The nodes, operands before users.
    pub fn order(&self) -> &[NodeId] {
        &self.order
    }

    /// The leaves, in the order [`Slot::Input`](crate::Slot::Input) numbers them.
    pub fn leaves(&self) -> &[LeafId] {
        &self.leaves
    }

    /// The leaves, taken.
    pub fn into_leaves(self) -> Vec<LeafId> {
        self.leaves
    }

    /// The structural hash: equal for walks whose signatures are equal.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// Whether `sig` is this walk's signature, compared without building it.
    pub fn matches(&self, graph: &Graph, sig: &Signature) -> bool {
        if sig.hash != self.hash
            || *sig.targets != *self.targets
            || sig.nodes.len() != self.order.len()
        {
            return false;
        }
        self.order.iter().zip(sig.nodes.iter()).all(|(&id, kept)| {
            let node = graph.node(id);
            node.dtype == kept.dtype
                && node.shape == kept.shape
                && node.op.payload() == kept.op.payload()
                && node
                    .op
                    .operands()
                    .map(|c| self.position[c.0 as usize])
                    .eq(kept.op.operands().map(|c| c.0))
        })
    }

    /// The owned signature (what a new plan is stored under).
    pub fn signature(&self, graph: &Graph) -> Signature {
        let mut leaf = 0;
        let nodes = self
            .order
            .iter()
            .map(|&id| {
                let node = graph.node(id);
                let op = match &node.op {
                    Op::Leaf(_) => {
                        leaf += 1;
                        Op::Leaf(LeafId(leaf - 1))
                    }
                    other => renumber(other, |c| NodeId(self.position[c.0 as usize])),
                };
                Node {
                    op,
                    dtype: node.dtype,
                    shape: node.shape.clone(),
                }
            })
            .collect();
        Signature {
            nodes,
            targets: self.targets.as_slice().into(),
            hash: self.hash,
        }
    }
}

/// The signature of `targets`, and the leaves in the order [`Slot::Input`](crate::Slot::Input)
/// numbers them.
pub fn signature(graph: &Graph, targets: &[NodeId]) -> (Signature, Vec<LeafId>) {
    let walk = Walk::new(graph, targets);
    (walk.signature(graph), walk.into_leaves())
}

#[cfg(test)]
mod tests {
    use tessel_shape::{BinaryOp, DType, Shape};

    use super::{Walk, signature};
    use crate::graph::{Graph, LeafId, Node, NodeId, Op};

    fn leaf(g: &mut Graph, id: u64, dims: &[usize]) -> NodeId {
        g.add(Node {
            op: Op::Leaf(LeafId(id)),
            dtype: DType::F32,
            shape: Shape::from(dims),
        })
    }

    fn add(g: &mut Graph, a: NodeId, b: NodeId, dims: &[usize]) -> NodeId {
        g.add(Node {
            op: Op::Binary(BinaryOp::Add, a, b),
            dtype: DType::F32,
            shape: Shape::from(dims),
        })
    }

    #[test]
    fn a_walk_matches_the_same_structure_on_other_leaves_only() {
        let mut g = Graph::new();
        let (a, b) = (leaf(&mut g, 0, &[4]), leaf(&mut g, 1, &[4]));
        let ab = add(&mut g, a, b, &[4]);
        let (sig, leaves) = signature(&g, &[ab]);
        assert_eq!(leaves, [LeafId(0), LeafId(1)]);

        // The same computation on new leaves: equal, found in place.
        let (c, d) = (leaf(&mut g, 2, &[4]), leaf(&mut g, 3, &[4]));
        let cd = add(&mut g, c, d, &[4]);
        let walk = Walk::new(&g, &[cd]);
        assert!(walk.matches(&g, &sig));
        assert_eq!(walk.hash(), sig.structure_hash());
        assert_eq!(walk.leaves(), [LeafId(2), LeafId(3)]);
        assert_eq!(walk.signature(&g), sig);

        // One leaf read twice is another computation.
        let cc = add(&mut g, c, c, &[4]);
        let twice = Walk::new(&g, &[cc]);
        assert!(!twice.matches(&g, &sig));
        assert_ne!(twice.signature(&g), sig);

        // So is another shape, or the same nodes as two targets.
        let (e, f) = (leaf(&mut g, 4, &[2, 2]), leaf(&mut g, 5, &[2, 2]));
        let ef = add(&mut g, e, f, &[2, 2]);
        assert!(!Walk::new(&g, &[ef]).matches(&g, &sig));
        assert!(!Walk::new(&g, &[c, cd]).matches(&g, &sig));
    }

    #[test]
    fn hash_consing_survives_release_and_make_leaf() {
        let mut g = Graph::new();
        let (a, b) = (leaf(&mut g, 0, &[4]), leaf(&mut g, 1, &[4]));
        let ab = add(&mut g, a, b, &[4]);
        assert_eq!(add(&mut g, a, b, &[4]), ab, "equal nodes merge");
        assert!(g.release(ab).is_empty());
        let freed = g.make_leaf(ab, LeafId(7));
        assert!(freed.is_empty(), "a and b are still held");
        // The computed node is a leaf now: the sum is recorded anew, the leaf found as is.
        let again = add(&mut g, a, b, &[4]);
        assert_ne!(again, ab);
        let len = g.len();
        assert_eq!(
            g.add(Node {
                op: Op::Leaf(LeafId(7)),
                dtype: DType::F32,
                shape: Shape::from(&[4usize][..]),
            }),
            ab
        );
        assert_eq!(g.len(), len);
        assert!(g.release(again).is_empty());
        assert_eq!(g.release(ab), [] as [LeafId; 0]);
        assert_eq!(g.release(ab), [LeafId(7)]);
        assert_eq!(g.release(a), [LeafId(0)]);
        assert_eq!(g.release(b), [LeafId(1)]);
        assert!(g.is_empty());
    }
}
