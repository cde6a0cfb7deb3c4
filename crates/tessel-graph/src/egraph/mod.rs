//! The e-graph: every equivalent form of a value, side by side in one class.
//!
//! An [`EGraph`] is a set of e-classes ([`EClass`], named by [`ClassId`]); a class holds
//! e-nodes ([`ENode`]), each an [`Op`] whose operands are *classes*, so one class stands for
//! every form its value can take. Rewrites ([`Rewrite`], the built-in table in [`rules()`])
//! add forms and merge classes; [`Extraction`] picks the cheapest form of each class and
//! writes it back into a [`Graph`]; [`simplify()`] does all of it for a graph's targets.
//!
//! **E-nodes reuse the graph's [`Op`].** An e-node is a [`Node`] (op, dtype, shape) whose
//! operand ids are read as class ids: `NodeId(k)` in an e-node's op means `ClassId(k)`
//! ([`ClassId::operand`] spells it). A separate op enum generic over its id type would
//! duplicate all fifteen variants and their payloads (axes, pads, values) and change what
//! the kernelizer and lowering match on; the one vocabulary keeps the e-graph's forms
//! exactly the graph's. The reinterpretation is confined to [`ENode`]: its constructor
//! documents it, [`ENode::children`] returns [`ClassId`]s, and [`Op::map_children`]
//! converts at the two boundaries ([`EGraph::from_graph`], [`Extraction::to_graph`]).
//!
//! **Invariants** (egg's, restored by [`EGraph::rebuild`]; [`EGraph::add`] and
//! [`EGraph::union`] may break the last four until then):
//! - *union-find*: every id ever made names a class through [`EGraph::find`]; a class is
//!   stored only under its canonical id;
//! - *types*: every e-node of a class has the class's dtype and shape; [`EGraph::union`]
//!   refuses classes of different dtypes or shapes (a bug in a rule: `debug_assert`ed);
//! - *leaves never merge*: each [`Op::Leaf`] (a realized buffer) keeps its own class, and
//!   no class ever holds two leaves, because placement, refcounts and cache keys depend on
//!   a buffer's identity; constants, in contrast, merge by value (bitwise, per dtype and
//!   shape), like the graph's hash-consing;
//! - *canonical e-nodes*: a class's e-nodes name only canonical classes, without repeats;
//! - *hash-consing*: the memo maps every canonical e-node to its class, so no e-node is in
//!   two classes;
//! - *congruence*: e-nodes with equal ops over equal classes are in one class (it follows
//!   from the previous two: equal canonical e-nodes are one memo entry);
//! - *analysis*: each class's data (its constant value, whether it is known sign-clear,
//!   its leaf) is the join of what its e-nodes say about it.
//!
//! Rebuilding is egg's deferred worklist: a union only records the e-nodes that used the
//! absorbed class; [`EGraph::rebuild`] re-canonicalizes them, and an e-node that lands on
//! an existing memo entry merges the two classes (congruence), which may record more.
//!
//! **Analysis.** *Sign-clear* means every element is `+0`, positive, `+inf` or NaN: no
//! negative value and no `-0`. It is what `exp(log x) == x` needs (`exp(log +0) ==
//! exp(-inf) == +0`), and what makes `x + 0.0 == x` exact (only `-0 + 0` breaks it). It is
//! proven from constants, `exp`, `exp2`, `abs`, casts of unsigned values, and ops that keep
//! it (see `sign_clear` in this file).

mod dot;
mod forms;
mod rewrite;
mod rules;
mod saturate;
mod term;

use std::fmt;

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_shape::{BinaryOp, DType, Scalar, Shape, TernaryOp, UnaryOp};
use tracing::debug;

use crate::graph::{Graph, LeafId, Node, NodeId, Op, ReduceOp};

pub use forms::{Form, Forms, forms};
pub use rewrite::{Condition, Match, Rewrite, RewriteError, Subst};
pub use rules::rules;
pub use saturate::{Budget, SaturationReport, StopReason};
pub use term::{Extraction, Simplified, simplify, static_cost};

/// An e-class, or an e-node's id: ids of merged classes [`find`](EGraph::find) one
/// canonical id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(pub u32);

impl ClassId {
    /// How an e-node's [`Op`] names this class as an operand (see the module docs).
    pub const fn operand(self) -> NodeId {
        NodeId(self.0)
    }

    /// The class an e-node's operand id names.
    pub const fn of_operand(id: NodeId) -> ClassId {
        ClassId(id.0)
    }

    const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for ClassId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

impl fmt::Display for ClassId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// An e-node: an op over classes, with the dtype and shape of its value.
///
/// The op's operand ids are class ids (`NodeId(k)` means `ClassId(k)`; build them with
/// [`ClassId::operand`]). Equality and hashing are structural, so an e-node over canonical
/// classes is its own hash-consing key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ENode(Node);

impl ENode {
    /// An e-node computing `op` on the classes its operand ids name.
    pub fn new(op: Op, dtype: DType, shape: Shape) -> Self {
        ENode(Node { op, dtype, shape })
    }

    /// The op; its operand ids are class ids.
    pub fn op(&self) -> &Op {
        &self.0.op
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.0.shape
    }

    /// The operand classes, in order (repeats included).
    pub fn children(&self) -> impl Iterator<Item = ClassId> + use<> {
        self.0.op.children().into_iter().map(ClassId::of_operand)
    }

    /// The same e-node with every operand class `c` replaced by `f(c)`.
    #[must_use]
    pub fn map_children(&self, mut f: impl FnMut(ClassId) -> ClassId) -> ENode {
        ENode::new(
            self.0
                .op
                .map_children(|c| f(ClassId::of_operand(c)).operand()),
            self.0.dtype,
            self.0.shape.clone(),
        )
    }
}

impl fmt::Debug for ENode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")?;
        let children: Vec<ClassId> = self.children().collect();
        if !children.is_empty() {
            write!(f, "{children:?}")?;
        }
        write!(f, ": {}{}", self.dtype(), self.shape())
    }
}

impl fmt::Display for ENode {
    /// The op with its payload, without operands: `mul`, `const 1.0`, `permute [1, 0]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op() {
            Op::Leaf(leaf) => write!(f, "leaf {}", leaf.0),
            Op::Const(value) => write!(f, "const {value}"),
            Op::Index(axis) => write!(f, "index {axis}"),
            Op::Random(_, words) => write!(f, "random {words:?}"),
            Op::Permute(_, perm) => write!(f, "permute {perm:?}"),
            Op::Pad(_, pads, value) => {
                f.write_str("pad [")?;
                for (i, (before, after)) in pads.iter().enumerate() {
                    let sep = if i > 0 { ", " } else { "" };
                    write!(f, "{sep}({before}, {after})")?;
                }
                write!(f, "] {value}")
            }
            Op::Shrink(_, ranges) => {
                f.write_str("shrink [")?;
                for (i, (start, step)) in ranges.iter().enumerate() {
                    let sep = if i > 0 { ", " } else { "" };
                    write!(f, "{sep}{start}:{step}")?;
                }
                f.write_str("]")
            }
            Op::Flip(_, axes) => write!(f, "flip {axes:?}"),
            Op::Reduce(op, _, axes) => {
                write!(f, "reduce-{} {axes:?}", format!("{op:?}").to_lowercase())
            }
            op => f.write_str(op.name()),
        }
    }
}

/// What a class's e-nodes prove about its value (the e-class analysis).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Data {
    /// The constant every element equals, when the class holds an [`Op::Const`].
    constant: Option<Scalar>,
    /// Whether every element is known sign-clear (see the module docs); floats only.
    sign_clear: bool,
    /// The buffer, when the class holds an [`Op::Leaf`].
    leaf: Option<LeafId>,
}

impl Data {
    /// The join: whatever either side proves.
    fn join(self, other: Data) -> Data {
        Data {
            constant: self.constant.or(other.constant),
            sign_clear: self.sign_clear || other.sign_clear,
            leaf: self.leaf.or(other.leaf),
        }
    }
}

/// An e-class: equivalent e-nodes, all of one dtype and shape.
#[derive(Clone, Debug)]
pub struct EClass {
    /// The class's canonical id.
    id: ClassId,
    /// Its e-nodes (canonical and distinct after a rebuild).
    nodes: Vec<ENode>,
    /// Ids of the e-nodes that use this class as an operand (keys into `EGraph::nodes`).
    parents: Vec<ClassId>,
    dtype: DType,
    shape: Shape,
    data: Data,
}

impl EClass {
    /// The class's canonical id.
    pub fn id(&self) -> ClassId {
        self.id
    }

    /// The equivalent e-nodes.
    pub fn nodes(&self) -> &[ENode] {
        &self.nodes
    }

    /// The dtype every e-node has.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape every e-node has.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The constant every element equals, if the class holds one (bitwise, as
    /// [`Scalar`]'s equality).
    pub fn constant(&self) -> Option<Scalar> {
        self.data.constant
    }

    /// Whether no element is negative or `-0` (floats; see the module docs).
    pub fn is_sign_clear(&self) -> bool {
        self.data.sign_clear
    }

    /// The buffer this class is, if it holds a leaf (at most one: leaves never merge).
    pub fn leaf(&self) -> Option<LeafId> {
        self.data.leaf
    }
}

/// An e-graph over the graph's ops. See the module docs for its invariants.
#[derive(Clone, Debug, Default)]
pub struct EGraph {
    /// Union-find parent by id; `uf[i] == i` exactly for canonical ids.
    uf: Vec<ClassId>,
    /// The e-node each id was made for, as added (its operands may have been merged
    /// since; canonicalize before use).
    nodes: Vec<ENode>,
    /// Class by id: `Some` exactly for canonical ids.
    classes: Vec<Option<EClass>>,
    /// Canonical e-node → an id of its class. Between rebuilds it may also hold stale keys
    /// (over merged classes), which never equal a canonical e-node.
    memo: FxHashMap<ENode, ClassId>,
    /// Ids of e-nodes whose operand classes were merged since the last rebuild.
    pending: Vec<ClassId>,
    /// Ids of e-nodes whose operand classes' data grew since the last rebuild.
    analysis_pending: Vec<ClassId>,
    /// E-nodes over all classes: exact after a rebuild, an upper bound between.
    n_nodes: usize,
    /// Canonical classes.
    n_classes: usize,
}

impl EGraph {
    /// An empty e-graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// The e-graph of the subgraph `targets` depend on (each graph node one class, so
    /// common subexpressions are already one), and the targets' classes in order.
    pub fn from_graph(graph: &Graph, targets: &[NodeId]) -> (EGraph, Vec<ClassId>) {
        let mut egraph = EGraph::new();
        let mut class_of: FxHashMap<NodeId, ClassId> = FxHashMap::default();
        for id in graph.toposort(targets) {
            let node = graph.node(id);
            // Operands come before users in a toposort.
            let op = node.op.map_children(|c| class_of[&c].operand());
            let class = egraph.add(ENode::new(op, node.dtype, node.shape.clone()));
            class_of.insert(id, class);
        }
        let classes = targets.iter().map(|t| class_of[t]).collect();
        debug!(
            target: "tessel::egraph",
            graph_nodes = class_of.len(),
            classes = egraph.n_classes,
            "e-graph built from the graph"
        );
        (egraph, classes)
    }

    /// Adds an e-node over existing classes and returns its class: the class already
    /// holding an equal e-node (hash-consing; constants compare by value), or a new one.
    ///
    /// # Panics
    /// If an operand id was not made by this e-graph.
    pub fn add(&mut self, node: ENode) -> ClassId {
        let canonical = self.canonicalize(&node);
        let node = if canonical == node { node } else { canonical };
        if let Some(&id) = self.memo.get(&node) {
            return self.find(id);
        }
        let id = ClassId(u32::try_from(self.uf.len()).expect("fewer than 2^32 e-nodes"));
        let data = self.make(&node);
        let mut children: Vec<ClassId> = node.children().collect();
        children.sort_unstable();
        children.dedup();
        for child in children {
            self.class_mut(child).parents.push(id);
        }
        self.uf.push(id);
        self.nodes.push(node.clone());
        self.classes.push(Some(EClass {
            id,
            nodes: vec![node.clone()],
            parents: Vec::new(),
            dtype: node.dtype(),
            shape: node.shape().clone(),
            data,
        }));
        self.memo.insert(node, id);
        self.n_nodes += 1;
        self.n_classes += 1;
        id
    }

    /// The class holding an e-node equal to `node` (operands canonicalized), if any.
    pub fn lookup(&self, node: &ENode) -> Option<ClassId> {
        let node = self.canonicalize(node);
        self.memo.get(&node).map(|&id| self.find(id))
    }

    /// The canonical id of `id`'s class.
    ///
    /// # Panics
    /// If `id` was not made by this e-graph.
    pub fn find(&self, mut id: ClassId) -> ClassId {
        loop {
            let parent = self.uf[id.index()];
            if parent == id {
                return id;
            }
            id = parent;
        }
    }

    /// [`find`](Self::find), halving the path it walks.
    fn find_mut(&mut self, mut id: ClassId) -> ClassId {
        loop {
            let parent = self.uf[id.index()];
            if parent == id {
                return id;
            }
            let grandparent = self.uf[parent.index()];
            self.uf[id.index()] = grandparent;
            id = grandparent;
        }
    }

    /// `id`'s class.
    ///
    /// # Panics
    /// If `id` was not made by this e-graph.
    pub fn class(&self, id: ClassId) -> &EClass {
        self.classes[self.find(id).index()]
            .as_ref()
            .expect("canonical ids have classes")
    }

    fn class_mut(&mut self, id: ClassId) -> &mut EClass {
        let id = self.find_mut(id);
        self.classes[id.index()]
            .as_mut()
            .expect("canonical ids have classes")
    }

    /// The classes, by increasing id.
    pub fn classes(&self) -> impl Iterator<Item = &EClass> {
        self.classes.iter().flatten()
    }

    /// The number of classes.
    pub fn n_classes(&self) -> usize {
        self.n_classes
    }

    /// The number of e-nodes over all classes (exact after [`rebuild`](Self::rebuild), an
    /// upper bound before).
    pub fn n_nodes(&self) -> usize {
        self.n_nodes
    }

    /// Merges the classes of `a` and `b`, recording what [`rebuild`](Self::rebuild) must
    /// repair. Returns whether they were different classes and are now one.
    ///
    /// Refuses (returns `false`) to merge classes of different dtypes or shapes, or two
    /// leaves: both would be a bug in whoever claimed the values equal, so debug builds
    /// panic.
    pub fn union(&mut self, a: ClassId, b: ClassId) -> bool {
        let (a, b) = (self.find_mut(a), self.find_mut(b));
        if a == b {
            return false;
        }
        let (class_a, class_b) = (self.class(a), self.class(b));
        if class_a.dtype != class_b.dtype || class_a.shape != class_b.shape {
            debug_assert!(
                false,
                "merging {a:?} ({}{}) with {b:?} ({}{})",
                class_a.dtype, class_a.shape, class_b.dtype, class_b.shape
            );
            return false;
        }
        if let (Some(x), Some(y)) = (class_a.data.constant, class_b.data.constant) {
            debug_assert!(
                x == y || (x.is_nan() && y.is_nan()),
                "merging constants {x} and {y} ({a:?}, {b:?})"
            );
        }
        if let (Some(leaf_a), Some(leaf_b)) = (class_a.data.leaf, class_b.data.leaf) {
            debug_assert!(false, "leaves {leaf_a:?} and {leaf_b:?} never merge");
            return false;
        }
        // Keep the class with more users: only the absorbed class's users change form.
        let (root, absorbed) = if class_a.parents.len() >= class_b.parents.len() {
            (a, b)
        } else {
            (b, a)
        };
        let Some(absorbed_class) = self.classes[absorbed.index()].take() else {
            return false;
        };
        self.uf[absorbed.index()] = root;
        self.n_classes -= 1;
        self.pending.extend_from_slice(&absorbed_class.parents);
        let root_class = self.class_mut(root);
        let data = root_class.data.join(absorbed_class.data);
        let root_grew = data != root_class.data;
        root_class.data = data;
        root_class.nodes.extend(absorbed_class.nodes);
        let root_parents = root_grew.then(|| root_class.parents.clone());
        root_class
            .parents
            .extend_from_slice(&absorbed_class.parents);
        if let Some(parents) = root_parents {
            self.analysis_pending.extend(parents);
        }
        if data != absorbed_class.data {
            self.analysis_pending.extend(absorbed_class.parents);
        }
        true
    }

    /// Restores the invariants (see the module docs) after [`add`](Self::add) and
    /// [`union`](Self::union): re-canonicalizes the users of merged classes, merging
    /// classes whose e-nodes became equal (congruence), and propagates analysis data.
    /// Returns the number of merges congruence made.
    pub fn rebuild(&mut self) -> usize {
        let mut n_unions = 0;
        while !self.pending.is_empty() || !self.analysis_pending.is_empty() {
            while let Some(id) = self.pending.pop() {
                let node = self.canonicalize(&self.nodes[id.index()]);
                if let Some(existing) = self.memo.insert(node, id) {
                    n_unions += usize::from(self.union(existing, id));
                }
            }
            while let Some(id) = self.analysis_pending.pop() {
                let node = self.canonicalize(&self.nodes[id.index()]);
                let made = self.make(&node);
                let class = self.class_mut(id);
                let data = class.data.join(made);
                if data != class.data {
                    class.data = data;
                    let parents = class.parents.clone();
                    self.analysis_pending.extend(parents);
                }
            }
        }
        self.rebuild_classes();
        debug_assert_eq!(self.check_invariants(), Ok(()));
        n_unions
    }

    /// Canonicalizes and dedups every class's e-nodes and users, drops stale memo keys.
    fn rebuild_classes(&mut self) {
        let mut classes = std::mem::take(&mut self.classes);
        let mut n_nodes = 0;
        for class in classes.iter_mut().flatten() {
            let mut seen = FxHashSet::default();
            let nodes = std::mem::take(&mut class.nodes);
            class.nodes = nodes
                .iter()
                .map(|n| self.canonicalize(n))
                .filter(|n| seen.insert(n.clone()))
                .collect();
            n_nodes += class.nodes.len();
            class.parents.sort_unstable();
            class.parents.dedup();
        }
        self.classes = classes;
        self.n_nodes = n_nodes;
        let uf = &self.uf;
        let is_canonical = |c: ClassId| uf[c.index()] == c;
        self.memo
            .retain(|node, _| node.children().all(is_canonical));
        for id in self.memo.values_mut() {
            *id = find_in(uf, *id);
        }
    }

    /// `node` with canonical operands, and a constant's value in the node's dtype (what
    /// the kernel computes), so equal constants are equal e-nodes.
    fn canonicalize(&self, node: &ENode) -> ENode {
        match node.op() {
            Op::Const(value) if value.dtype() != node.dtype() => ENode::new(
                Op::Const(value.cast(node.dtype())),
                node.dtype(),
                node.shape().clone(),
            ),
            _ => node.map_children(|c| self.find(c)),
        }
    }

    /// What one e-node proves about its class.
    fn make(&self, node: &ENode) -> Data {
        Data {
            constant: match node.op() {
                Op::Const(value) => Some(*value),
                _ => None,
            },
            sign_clear: node.dtype().is_float() && self.sign_clear(node),
            leaf: match node.op() {
                Op::Leaf(leaf) => Some(*leaf),
                _ => None,
            },
        }
    }

    /// Whether a float e-node's elements are all sign-clear, given its operands' data.
    fn sign_clear(&self, node: &ENode) -> bool {
        let clear = |c: &NodeId| self.class(ClassId::of_operand(*c)).data.sign_clear;
        let value_clear = |v: Scalar| !v.to_f64().is_sign_negative();
        match node.op() {
            Op::Const(value) => value_clear(*value),
            Op::Index(_) | Op::Argsort(_) => true,
            Op::Leaf(_) | Op::Bitcast(_) | Op::Random(..) | Op::Custom(..) => false,
            Op::Unary(op, a) => match op {
                UnaryOp::Exp | UnaryOp::Exp2 | UnaryOp::Abs => true,
                // sqrt(+0) = +0, 1/+0 = +inf; sqrt(-0) = -0 is excluded by the operand.
                UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal => clear(a),
                _ => false,
            },
            Op::Binary(op, a, b) => match op {
                BinaryOp::Add | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Min => {
                    clear(a) && clear(b)
                }
                // At least the sign-clear operand, or NaN; `max(-0, +0) == +0`.
                BinaryOp::Max => clear(a) || clear(b),
                _ => false,
            },
            Op::Ternary(TernaryOp::Where, _, a, b) => clear(a) && clear(b),
            Op::Ternary(TernaryOp::MulAdd, a, b, c) => clear(a) && clear(b) && clear(c),
            Op::Cast(a) => {
                let from = self.class(ClassId::of_operand(*a)).dtype;
                from.is_bool() || (from.is_int() && !from.is_signed()) || clear(a)
            }
            Op::Reshape(a) | Op::Permute(a, _) | Op::Expand(a) => clear(a),
            Op::Shrink(a, _) | Op::Flip(a, _) => clear(a),
            Op::Pad(a, _, value) => clear(a) && value_clear(value.cast(node.dtype())),
            // Empty sums are +0, empty products 1, empty mins +inf; empty maxes are -inf.
            Op::Reduce(op, a, _) => op != &ReduceOp::Max && clear(a),
            // Out-of-range reads and untouched positions are +0.
            Op::Gather(a, ..) | Op::Scatter(_, _, a, _) => clear(a),
        }
    }

    /// Checks every invariant of the module docs; `Err` names the first one broken.
    fn check_invariants(&self) -> Result<(), String> {
        let mut n_nodes = 0;
        for (i, class) in self.classes.iter().enumerate() {
            let Some(class) = class else { continue };
            if class.id.index() != i || self.find(class.id) != class.id {
                return Err(format!("{:?} is stored under c{i}", class.id));
            }
            let mut leaves = 0;
            for node in &class.nodes {
                n_nodes += 1;
                if node.dtype() != class.dtype || node.shape() != &class.shape {
                    return Err(format!("{node:?} in {:?} has another type", class.id));
                }
                if self.canonicalize(node) != *node {
                    return Err(format!("{node:?} in {:?} is not canonical", class.id));
                }
                match self.memo.get(node).map(|&c| self.find(c)) {
                    Some(c) if c == class.id => {}
                    other => {
                        return Err(format!(
                            "{node:?} in {:?} is memoized as {other:?}",
                            class.id
                        ));
                    }
                }
                leaves += usize::from(matches!(node.op(), Op::Leaf(_)));
            }
            if leaves > 1 {
                return Err(format!("{:?} holds {leaves} leaves", class.id));
            }
        }
        if n_nodes != self.n_nodes || self.classes().count() != self.n_classes {
            return Err("node or class counts are stale".into());
        }
        Ok(())
    }
}

/// [`EGraph::find`] on a union-find table alone.
fn find_in(uf: &[ClassId], mut id: ClassId) -> ClassId {
    while uf[id.index()] != id {
        id = uf[id.index()];
    }
    id
}
