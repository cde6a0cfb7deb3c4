//! The lazy tensor graph: hash-consed, reference-counted nodes.
//!
//! Every tensor op adds a [`Node`]: an [`Op`] with its dtype and symbolic shape, both
//! checked when the node is made. Adding a node structurally equal to a live one returns
//! the existing id (common subexpressions merge for free); constants merge by value;
//! leaves — realized buffers — never merge, because each carries its own [`LeafId`].
//!
//! Ids are reference counted: a user handle and each parent hold one count. When a count
//! drops to zero the node is removed and its slot reused, so a loop that builds and
//! realizes the same computation keeps the graph the same size. Realizing a node turns it
//! into a leaf in place and drops its children, so the graph never grows with history.

use std::fmt;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use tessel_ir::AtomicOp;
use tessel_shape::{BinaryOp, DType, Dim, Scalar, Shape, TernaryOp, UnaryOp};

use crate::custom::CustomKernel;
use crate::random::Words;

/// A node in the graph.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// A realized buffer's identity; the runtime maps it to device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeafId(pub u64);

/// How a reduction combines values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (logical or on `bool`).
    Sum,
    /// Product (logical and on `bool`).
    Prod,
    /// Maximum; NaN wins.
    Max,
    /// Minimum; NaN wins.
    Min,
}

impl ReduceOp {
    /// The binary op that combines two partial results.
    pub const fn binary(self) -> BinaryOp {
        match self {
            ReduceOp::Sum => BinaryOp::Add,
            ReduceOp::Prod => BinaryOp::Mul,
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::Min => BinaryOp::Min,
        }
    }

    /// The value a reduction over nothing yields.
    pub fn identity(self, dtype: DType) -> Scalar {
        match self {
            ReduceOp::Sum => Scalar::zero(dtype),
            ReduceOp::Prod => Scalar::one(dtype),
            ReduceOp::Max if dtype.is_float() => Scalar::F64(f64::NEG_INFINITY).cast(dtype),
            ReduceOp::Min if dtype.is_float() => Scalar::F64(f64::INFINITY).cast(dtype),
            ReduceOp::Max => dtype.min_value(),
            ReduceOp::Min => dtype.max_value(),
        }
    }
}

/// What a node computes. Operand shapes and dtypes are checked by whoever builds nodes
/// (the tensor layer, through `tessel_shape::rules`); the graph trusts them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// A realized buffer holding the node's value, contiguous in row-major order.
    Leaf(LeafId),
    /// A constant broadcast to the node's shape.
    Const(Scalar),
    /// The coordinate along an axis, as the node's dtype (`arange`, `eye`).
    Index(usize),
    /// A unary op.
    Unary(UnaryOp, NodeId),
    /// A binary op on operands of the node's shape.
    Binary(BinaryOp, NodeId, NodeId),
    /// A ternary op on operands of the node's shape.
    Ternary(TernaryOp, NodeId, NodeId, NodeId),
    /// A dtype conversion to the node's dtype.
    Cast(NodeId),
    /// A bit reinterpretation as the node's dtype.
    Bitcast(NodeId),
    /// The operand's elements in row-major order, in the node's shape.
    Reshape(NodeId),
    /// Axis `k` of the node is axis `perm[k]` of the operand.
    Permute(NodeId, Box<[usize]>),
    /// The operand's size-1 axes repeated to the node's shape.
    Expand(NodeId),
    /// Each axis padded by `(before, after)` elements of the given value.
    Pad(NodeId, Box<[(Dim, Dim)]>, Scalar),
    /// Along each axis, elements `start, start + step, ...` (the node's shape gives how many).
    Shrink(NodeId, Box<[(Dim, Dim)]>),
    /// The listed axes reversed.
    Flip(NodeId, Box<[usize]>),
    /// A reduction over the listed axes, which become size 1 in the node's shape.
    Reduce(ReduceOp, NodeId, Box<[usize]>),
    /// `Gather(src, index, axis)`: at each coordinate `c` of the node (the index's shape),
    /// `src` at `c` with coordinate `axis` replaced by `index[c]`; `0` (`false`) where
    /// `index[c]` lies outside `0..src.size(axis)`. `src` has the node's rank and its sizes
    /// in every other axis; `index` is `i32` or `i64`. A load whose address is data.
    Gather(NodeId, NodeId, usize),
    /// `Scatter(op, index, src, axis)`: zeros of the node's shape, with each `src[c]`
    /// combined by `op` into `c` with coordinate `axis` replaced by `index[c]` (dropped
    /// where that lies outside `0..size(axis)`). `index` and `src` share a shape, the
    /// node's except along `axis`; `index` is `i32` or `i64`; the node's dtype is one `op`
    /// takes ([`AtomicOp::takes`]). Repeated indices add up, or keep the largest (as
    /// unsigned integers), in no fixed order.
    Scatter(AtomicOp, NodeId, NodeId, usize),
    /// `Argsort(keys)`: along the last axis of `keys` (unsigned integers, a row of at most
    /// [`ARGSORT_ROW_MAX`] elements), the position of each row's `c`-th smallest key at
    /// `c`, equal keys in position order (a stable ascending argsort); the node's shape is
    /// the keys', its dtype an integer one. A row is sorted in local memory by one
    /// workgroup.
    Argsort(NodeId),
    /// `Random(key, words)`: random bits. At row-major position `i`, the word [`Words`]
    /// picks of the Philox4x32-10 block of counter `(⌊i / group⌋, stream)` under `seed`
    /// (see [`crate::random`]), where `key` is a `u32` vector of 4 elements, `[seed_lo,
    /// seed_hi, stream_lo, stream_hi]`. The key is an operand rather than a payload so that
    /// a new draw (a new stream) is new data for the same plan. The node's dtype is `u32`.
    Random(NodeId, Words),
    /// `Custom(kernel, inputs)`: a hand-written kernel ([`CustomKernel`]) whose buffer
    /// parameters are the inputs' values (row-major) then the node's, in order. It runs as
    /// written, as a kernel of its own.
    Custom(Arc<CustomKernel>, Box<[NodeId]>),
}

/// The longest row an [`Op::Argsort`] sorts: its keys and positions fit a workgroup's
/// local memory (12 KiB with 64-bit keys, under WGSL's default 16 KiB).
pub const ARGSORT_ROW_MAX: usize = 1024;

impl Op {
    /// The operand nodes, in order.
    pub fn children(&self) -> Vec<NodeId> {
        match self {
            Op::Leaf(_) | Op::Const(_) | Op::Index(_) => vec![],
            Op::Unary(_, a)
            | Op::Cast(a)
            | Op::Bitcast(a)
            | Op::Reshape(a)
            | Op::Permute(a, _)
            | Op::Expand(a)
            | Op::Pad(a, ..)
            | Op::Shrink(a, _)
            | Op::Flip(a, _)
            | Op::Argsort(a)
            | Op::Random(a, _)
            | Op::Reduce(_, a, _) => vec![*a],
            Op::Binary(_, a, b) | Op::Gather(a, b, _) | Op::Scatter(_, a, b, _) => vec![*a, *b],
            Op::Ternary(_, a, b, c) => vec![*a, *b, *c],
            Op::Custom(_, inputs) => inputs.to_vec(),
        }
    }

    /// The same op with every operand `c` replaced by `f(c)`, in operand order; payloads
    /// (axes, pads, values) are kept.
    #[must_use]
    pub fn map_children(&self, mut f: impl FnMut(NodeId) -> NodeId) -> Op {
        match self {
            Op::Leaf(_) | Op::Const(_) | Op::Index(_) => self.clone(),
            Op::Unary(u, a) => Op::Unary(*u, f(*a)),
            Op::Binary(b, x, y) => {
                let x = f(*x);
                Op::Binary(*b, x, f(*y))
            }
            Op::Ternary(t, x, y, z) => {
                let (x, y) = (f(*x), f(*y));
                Op::Ternary(*t, x, y, f(*z))
            }
            Op::Cast(a) => Op::Cast(f(*a)),
            Op::Bitcast(a) => Op::Bitcast(f(*a)),
            Op::Reshape(a) => Op::Reshape(f(*a)),
            Op::Permute(a, perm) => Op::Permute(f(*a), perm.clone()),
            Op::Expand(a) => Op::Expand(f(*a)),
            Op::Pad(a, pads, value) => Op::Pad(f(*a), pads.clone(), *value),
            Op::Shrink(a, ranges) => Op::Shrink(f(*a), ranges.clone()),
            Op::Flip(a, axes) => Op::Flip(f(*a), axes.clone()),
            Op::Reduce(r, a, axes) => Op::Reduce(*r, f(*a), axes.clone()),
            Op::Gather(src, index, axis) => {
                let src = f(*src);
                Op::Gather(src, f(*index), *axis)
            }
            Op::Argsort(keys) => Op::Argsort(f(*keys)),
            Op::Random(key, word) => Op::Random(f(*key), *word),
            Op::Custom(call, inputs) => {
                Op::Custom(Arc::clone(call), inputs.iter().map(|&c| f(c)).collect())
            }
            Op::Scatter(op, index, src, axis) => {
                let index = f(*index);
                Op::Scatter(*op, index, f(*src), *axis)
            }
        }
    }

    /// Whether the op always runs as a kernel of its own, never fused into a reader: a
    /// scatter runs over its sources, a sort over its rows, a custom kernel as written.
    pub fn runs_alone(&self) -> bool {
        matches!(self, Op::Scatter(..) | Op::Argsort(_) | Op::Custom(..))
    }

    /// Whether the op only moves elements (its value at a coordinate is the operand's value
    /// at another coordinate, or a pad constant).
    pub fn is_movement(&self) -> bool {
        matches!(
            self,
            Op::Reshape(_)
                | Op::Permute(..)
                | Op::Expand(_)
                | Op::Pad(..)
                | Op::Shrink(..)
                | Op::Flip(..)
        )
    }

    /// A short name for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Leaf(_) => "leaf",
            Op::Const(_) => "const",
            Op::Index(_) => "index",
            Op::Unary(op, _) => op.name(),
            Op::Binary(op, ..) => op.name(),
            Op::Ternary(op, ..) => op.name(),
            Op::Cast(_) => "cast",
            Op::Bitcast(_) => "bitcast",
            Op::Reshape(_) => "reshape",
            Op::Permute(..) => "permute",
            Op::Expand(_) => "expand",
            Op::Pad(..) => "pad",
            Op::Shrink(..) => "shrink",
            Op::Flip(..) => "flip",
            Op::Reduce(..) => "reduce",
            Op::Gather(..) => "gather",
            Op::Scatter(AtomicOp::Add, ..) => "scatter_add",
            Op::Scatter(AtomicOp::Max, ..) => "scatter_max",
            Op::Argsort(_) => "argsort",
            Op::Random(..) => "random",
            Op::Custom(..) => "custom",
        }
    }
}

/// A node: what it computes, its element dtype and its shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// The element dtype.
    pub dtype: DType,
    /// The shape.
    pub shape: Shape,
}

struct Slot {
    node: Node,
    /// Handles plus parents holding this node.
    refs: u32,
}

/// The graph. See the module docs for its invariants:
/// - every live node's structure maps to its id in `dedup` (leaves included: their
///   `LeafId`s are unique, so they never merge);
/// - a node's count equals its handles plus the live nodes naming it as an operand.
#[derive(Default)]
pub struct Graph {
    /// Nodes by id; `None` marks a free slot.
    slots: Vec<Option<Slot>>,
    /// Free slot ids, reused before the vector grows.
    free: Vec<u32>,
    /// Node structure → id: the hash-consing table.
    dedup: FxHashMap<Node, NodeId>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a node (or finds the equal live one) and returns it with one new count held by
    /// the caller.
    pub fn add(&mut self, node: Node) -> NodeId {
        if let Some(&id) = self.dedup.get(&node) {
            self.retain(id);
            return id;
        }
        for child in node.op.children() {
            self.retain(child);
        }
        let slot = Slot {
            node: node.clone(),
            refs: 1,
        };
        let id = if let Some(i) = self.free.pop() {
            self.slots[i as usize] = Some(slot);
            NodeId(i)
        } else {
            self.slots.push(Some(slot));
            NodeId(u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 live nodes"))
        };
        self.dedup.insert(node, id);
        id
    }

    /// The node behind a live id.
    ///
    /// # Panics
    /// If `id` is not live: ids come only from [`Graph::add`] and stay live while held.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.slots[id.0 as usize]
            .as_ref()
            .expect("a held node id is live")
            .node
    }

    /// Adds a count to a live node.
    pub fn retain(&mut self, id: NodeId) {
        if let Some(slot) = self.slots[id.0 as usize].as_mut() {
            slot.refs += 1;
        }
    }

    /// Drops a count; a node whose count reaches zero is removed, with its operands'
    /// counts dropped in turn. Returns the leaves removed, whose buffers the caller frees.
    #[must_use = "removed leaves own buffers that must be freed"]
    pub fn release(&mut self, id: NodeId) -> Vec<LeafId> {
        let mut freed = Vec::new();
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            let Some(slot) = self.slots[id.0 as usize].as_mut() else {
                debug_assert!(false, "released a dead node {id:?}");
                continue;
            };
            slot.refs -= 1;
            if slot.refs == 0 {
                let slot = self.slots[id.0 as usize]
                    .take()
                    .expect("checked live above");
                self.dedup.remove(&slot.node);
                self.free.push(id.0);
                if let Op::Leaf(leaf) = slot.node.op {
                    freed.push(leaf);
                }
                stack.extend(slot.node.op.children());
            }
        }
        freed
    }

    /// Turns a computed node into a leaf holding its value, releasing its operands.
    /// Returns the leaves removed as a result (`[leaf]` itself if the node already was a
    /// leaf, computed concurrently by someone else).
    #[must_use = "removed leaves own buffers that must be freed"]
    pub fn make_leaf(&mut self, id: NodeId, leaf: LeafId) -> Vec<LeafId> {
        let slot = self.slots[id.0 as usize]
            .as_mut()
            .expect("a held node id is live");
        if matches!(slot.node.op, Op::Leaf(_)) {
            return vec![leaf];
        }
        let old = std::mem::replace(&mut slot.node.op, Op::Leaf(leaf));
        let old_node = Node {
            op: old.clone(),
            dtype: slot.node.dtype,
            shape: slot.node.shape.clone(),
        };
        let new_node = slot.node.clone();
        // The old structure would name operands that may now die and whose ids get reused.
        self.dedup.remove(&old_node);
        self.dedup.insert(new_node, id);
        old.children()
            .into_iter()
            .flat_map(|c| self.release(c))
            .collect()
    }

    /// The number of live nodes.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether no node is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The live nodes `roots` depend on (roots included), operands before users.
    pub fn toposort(&self, roots: &[NodeId]) -> Vec<NodeId> {
        let mut order = Vec::new();
        let mut seen = rustc_hash::FxHashSet::default();
        // Iterative post-order: (node, children pushed yet).
        let mut stack: Vec<(NodeId, bool)> = roots.iter().rev().map(|&r| (r, false)).collect();
        while let Some((id, expanded)) = stack.pop() {
            if expanded {
                order.push(id);
                continue;
            }
            if !seen.insert(id) {
                continue;
            }
            stack.push((id, true));
            for child in self.node(id).op.children().into_iter().rev() {
                if !seen.contains(&child) {
                    stack.push((child, false));
                }
            }
        }
        order
    }
}
