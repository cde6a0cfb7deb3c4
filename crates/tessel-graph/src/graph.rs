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
use std::hash::{Hash, Hasher};
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

/// The operands of an [`Op`], in order ([`Op::operands`]).
#[derive(Clone, Debug)]
pub struct Operands<'a> {
    fixed: [NodeId; 3],
    len: u8,
    next: u8,
    rest: std::slice::Iter<'a, NodeId>,
}

impl Iterator for Operands<'_> {
    type Item = NodeId;

    fn next(&mut self) -> Option<NodeId> {
        if self.next < self.len {
            self.next += 1;
            return Some(self.fixed[usize::from(self.next - 1)]);
        }
        self.rest.next().copied()
    }
}

/// An [`Op`] without its operands ([`Op::payload`]): one variant per variant of `Op`,
/// named alike, holding what that variant holds besides operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Payload<'a> {
    Leaf,
    Const(&'a Scalar),
    Index(usize),
    Unary(UnaryOp),
    Binary(BinaryOp),
    Ternary(TernaryOp),
    Cast,
    Bitcast,
    Reshape,
    Permute(&'a [usize]),
    Expand,
    Pad(&'a [(Dim, Dim)], &'a Scalar),
    Shrink(&'a [(Dim, Dim)]),
    Flip(&'a [usize]),
    Reduce(ReduceOp, &'a [usize]),
    Gather(usize),
    Scatter(AtomicOp, usize),
    Argsort,
    Random(Words),
    Custom(&'a Arc<CustomKernel>),
}

/// The longest row an [`Op::Argsort`] sorts: its keys and positions fit a workgroup's
/// local memory (12 KiB with 64-bit keys, under WGSL's default 16 KiB).
pub const ARGSORT_ROW_MAX: usize = 1024;

impl Op {
    /// The operand nodes, in order.
    pub fn children(&self) -> Vec<NodeId> {
        self.operands().collect()
    }

    /// The operand nodes, in order, without allocating (the recording and replay paths
    /// walk every node).
    pub fn operands(&self) -> Operands<'_> {
        let none = NodeId(0);
        let (fixed, len, rest): ([NodeId; 3], u8, &[NodeId]) = match self {
            Op::Leaf(_) | Op::Const(_) | Op::Index(_) => ([none; 3], 0, &[]),
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
            | Op::Reduce(_, a, _) => ([*a, none, none], 1, &[]),
            Op::Binary(_, a, b) | Op::Gather(a, b, _) | Op::Scatter(_, a, b, _) => {
                ([*a, *b, none], 2, &[])
            }
            Op::Ternary(_, a, b, c) => ([*a, *b, *c], 3, &[]),
            Op::Custom(_, inputs) => ([none; 3], 0, inputs),
        };
        Operands {
            fixed,
            len,
            next: 0,
            rest: rest.iter(),
        }
    }

    /// What the op is apart from its operands: two nodes with equal payloads, dtypes and
    /// shapes, whose operands are equal in turn, compute the same value. A leaf's payload
    /// leaves out which buffer it is.
    pub fn payload(&self) -> Payload<'_> {
        match self {
            Op::Leaf(_) => Payload::Leaf,
            Op::Const(v) => Payload::Const(v),
            Op::Index(axis) => Payload::Index(*axis),
            Op::Unary(u, _) => Payload::Unary(*u),
            Op::Binary(b, ..) => Payload::Binary(*b),
            Op::Ternary(t, ..) => Payload::Ternary(*t),
            Op::Cast(_) => Payload::Cast,
            Op::Bitcast(_) => Payload::Bitcast,
            Op::Reshape(_) => Payload::Reshape,
            Op::Permute(_, perm) => Payload::Permute(perm),
            Op::Expand(_) => Payload::Expand,
            Op::Pad(_, pads, value) => Payload::Pad(pads, value),
            Op::Shrink(_, ranges) => Payload::Shrink(ranges),
            Op::Flip(_, axes) => Payload::Flip(axes),
            Op::Reduce(r, _, axes) => Payload::Reduce(*r, axes),
            Op::Gather(.., axis) => Payload::Gather(*axis),
            Op::Scatter(op, .., axis) => Payload::Scatter(*op, *axis),
            Op::Argsort(_) => Payload::Argsort,
            Op::Random(_, words) => Payload::Random(*words),
            Op::Custom(call, _) => Payload::Custom(call),
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
    /// The node's hash: its key in `dedup`.
    hash: u64,
    /// [`Graph::form_hash`].
    form: u64,
}

/// The live ids whose nodes share one hash: one, unless hashes collide.
enum Ids {
    One(NodeId),
    Many(Vec<NodeId>),
}

impl Ids {
    fn iter(&self) -> impl Iterator<Item = NodeId> + '_ {
        let (one, many): (Option<NodeId>, &[NodeId]) = match self {
            Ids::One(id) => (Some(*id), &[]),
            Ids::Many(ids) => (None, ids),
        };
        one.into_iter().chain(many.iter().copied())
    }
}

/// A node's form hash (payload, dtype, shape: see [`Graph::form_hash`]) and its hash-consing
/// key, which adds the operands' ids and a leaf's buffer, so that equal nodes share both.
fn hashes_of(node: &Node) -> (u64, u64) {
    let mut h = rustc_hash::FxHasher::default();
    node.op.payload().hash(&mut h);
    node.dtype.hash(&mut h);
    node.shape.hash(&mut h);
    let form = h.finish();
    let mut h = rustc_hash::FxHasher::default();
    h.write_u64(form);
    for c in node.op.operands() {
        h.write_u32(c.0);
    }
    if let Op::Leaf(leaf) = node.op {
        h.write_u64(leaf.0);
    }
    (form, h.finish())
}

/// The graph. See the module docs for its invariants:
/// - every live node's hash maps to its id in `dedup` (leaves included: their
///   `LeafId`s are unique, so they never merge);
/// - a node's count equals its handles plus the live nodes naming it as an operand.
#[derive(Default)]
pub struct Graph {
    /// Nodes by id; `None` marks a free slot.
    slots: Vec<Option<Slot>>,
    /// Free slot ids, reused before the vector grows.
    free: Vec<u32>,
    /// Node hash → the live ids with that hash: the hash-consing table. Keyed by hash so
    /// that removing a node neither hashes nor copies it.
    dedup: FxHashMap<u64, Ids>,
    /// [`Graph::release`]'s walk, empty between calls (kept for its allocation).
    release_stack: Vec<NodeId>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a node (or finds the equal live one) and returns it with one new count held by
    /// the caller.
    pub fn add(&mut self, node: Node) -> NodeId {
        let (form, hash) = hashes_of(&node);
        if let Some(id) = self.find(hash, &node) {
            self.retain(id);
            return id;
        }
        for child in node.op.operands() {
            self.retain(child);
        }
        let slot = Slot {
            node,
            refs: 1,
            hash,
            form,
        };
        let id = if let Some(i) = self.free.pop() {
            self.slots[i as usize] = Some(slot);
            NodeId(i)
        } else {
            self.slots.push(Some(slot));
            NodeId(u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 live nodes"))
        };
        self.index(hash, id);
        id
    }

    /// The live node equal to `node`, whose hash is `hash`.
    fn find(&self, hash: u64, node: &Node) -> Option<NodeId> {
        self.dedup
            .get(&hash)?
            .iter()
            .find(|&id| self.node(id) == node)
    }

    fn index(&mut self, hash: u64, id: NodeId) {
        match self.dedup.entry(hash) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Ids::One(id));
            }
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let ids = e.get_mut();
                match ids {
                    Ids::One(other) => *ids = Ids::Many(vec![*other, id]),
                    Ids::Many(v) => v.push(id),
                }
            }
        }
    }

    fn unindex(&mut self, hash: u64, id: NodeId) {
        let std::collections::hash_map::Entry::Occupied(mut e) = self.dedup.entry(hash) else {
            debug_assert!(false, "node {id:?} was not indexed");
            return;
        };
        match e.get_mut() {
            Ids::One(_) => {
                e.remove();
            }
            Ids::Many(v) => {
                v.retain(|&other| other != id);
                if let [last] = v[..] {
                    e.insert(Ids::One(last));
                }
            }
        }
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

    /// A hash of a live node's payload, dtype and shape, leaving out which nodes its
    /// operands are and which buffer a leaf holds: what [`crate::Walk`] hashes per node
    /// (kept from [`Graph::add`], so a plan lookup never rehashes a shape).
    ///
    /// # Panics
    /// If `id` is not live (see [`Graph::node`]).
    pub fn form_hash(&self, id: NodeId) -> u64 {
        self.slots[id.0 as usize]
            .as_ref()
            .expect("a held node id is live")
            .form
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
        // Most releases drop a count that others still hold: no walk, no allocation.
        match self.slots[id.0 as usize].as_mut() {
            Some(slot) if slot.refs > 1 => {
                slot.refs -= 1;
                return freed;
            }
            Some(_) => {}
            None => {
                debug_assert!(false, "released a dead node {id:?}");
                return freed;
            }
        }
        // The walk's stack is kept between calls (dropping a recorded forward removes
        // thousands of nodes, a release per tensor).
        let mut stack = std::mem::take(&mut self.release_stack);
        stack.push(id);
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
                self.unindex(slot.hash, id);
                self.free.push(id.0);
                if let Op::Leaf(leaf) = slot.node.op {
                    freed.push(leaf);
                }
                stack.extend(slot.node.op.operands());
            }
        }
        self.release_stack = stack;
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
        let old_hash = slot.hash;
        let new_hash;
        (slot.form, new_hash) = hashes_of(&slot.node);
        slot.hash = new_hash;
        // The old structure would name operands that may now die and whose ids get reused.
        self.unindex(old_hash, id);
        self.index(new_hash, id);
        let mut freed = Vec::new();
        for c in old.operands() {
            freed.extend(self.release(c));
        }
        freed
    }

    /// One past the largest id a live node may have: a bound for tables indexed by id.
    pub fn id_bound(&self) -> usize {
        self.slots.len()
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
        // One bit per slot: cheaper than hashing every id (`grad` sorts the whole forward).
        let mut seen = vec![0u64; self.slots.len().div_ceil(64)];
        let is_seen = |seen: &[u64], id: NodeId| seen[id.0 as usize / 64] >> (id.0 % 64) & 1 == 1;
        // Iterative post-order: (node, children pushed yet).
        let mut stack: Vec<(NodeId, bool)> = roots.iter().rev().map(|&r| (r, false)).collect();
        while let Some((id, expanded)) = stack.pop() {
            if expanded {
                order.push(id);
                continue;
            }
            if is_seen(&seen, id) {
                continue;
            }
            seen[id.0 as usize / 64] |= 1 << (id.0 % 64);
            stack.push((id, true));
            let first = stack.len();
            for child in self.node(id).op.operands() {
                if !is_seen(&seen, child) {
                    stack.push((child, false));
                }
            }
            stack[first..].reverse();
        }
        order
    }
}
