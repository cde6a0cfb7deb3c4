//! Extraction: the cheapest structural form of each class, written back into a [`Graph`].
//!
//! **Cost model** ([`static_cost`]): an e-node costs its own op plus its operands' best
//! costs (a tree cost: a shared operand counts once per use, which favours forms that do
//! less work along every path):
//!
//! | op                                         | cost |
//! |--------------------------------------------|------|
//! | leaf, const, index                         | 0    |
//! | movement (reshape, permute, expand, pad, shrink, flip), bitcast | 0.1 |
//! | unary, binary, ternary, cast, random (elementwise) | 1 |
//! | reduce                                     | 4    |
//!
//! Movement is nearly free because the kernelizer folds it into load indices; a reduction
//! is a loop. Measured kernel times will replace this model once kernels sit in classes.
//!
//! An operand adds at most `OPERAND_COST_CAP` (10⁹). Counted once per path, the costs of
//! a deep graph grow geometrically (a 12-layer GPT-2 training step reached 10^17 by its
//! fifth layer, about a thousand times more each layer after), and an `f64` that large
//! drops the 0.1 a movement costs: forms differing by one permute tied, and the order
//! classes settled chose between them (the transposed form kept a merged permute in 7 of
//! 12 layers, whose attentions then went unmatched). Capped, an e-node's cost stays exact
//! far below 0.1, so a difference in its own op decides at every depth (one further down
//! is lost where the operand holding it costs more than the cap, and such costs are no
//! longer superior: a class past the cap may settle before a cheaper form of it is ready).
//! Graphs whose costs stay under the cap are extracted as before.
//!
//! **Algorithm.** Knuth's generalization of Dijkstra to e-graphs (superior functions): a
//! class is settled, cheapest first, once one of its e-nodes has all operands settled, and
//! that e-node becomes its choice. So it computes the least fixpoint of the costs
//! bottom-up, never needs iterating, and handles cycles (`x * 1` in `x`'s own class):
//! an e-node whose operands include its own class is never ready before that class is
//! settled. The settling order is a topological order of the choices, so the written graph
//! is acyclic by construction, whatever the costs (ties, infinities) are.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use rustc_hash::{FxHashMap, FxHashSet};
use tracing::debug;

use super::{Budget, ClassId, EGraph, ENode, SaturationReport, rules};
use crate::graph::{Graph, Node, NodeId, Op};

/// The most one operand adds to an e-node's cost (see the module docs).
const OPERAND_COST_CAP: f64 = 1e9;

/// The cost of an e-node's own op, by the table in this module's docs.
pub fn static_cost(node: &ENode) -> f64 {
    match node.op() {
        Op::Leaf(_) | Op::Const(_) | Op::Index(_) => 0.0,
        Op::Reduce(..) => 4.0,
        Op::Bitcast(_) => 0.1,
        op if op.is_movement() => 0.1,
        _ => 1.0,
    }
}

/// A cost ordered totally (`f64::total_cmp`), for the heap.
#[derive(Clone, Copy, Debug)]
struct Cost(f64);

impl PartialEq for Cost {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Cost {}

impl PartialOrd for Cost {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Cost {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The chosen e-node of every class, with its cost.
#[derive(Debug)]
pub struct Extraction<'a> {
    egraph: &'a EGraph,
    /// By canonical class id: the chosen e-node's index in the class, its cost, and when
    /// the class was settled (operands settle first).
    best: FxHashMap<ClassId, (usize, f64, usize)>,
}

impl<'a> Extraction<'a> {
    /// The cheapest forms under [`static_cost`].
    pub fn new(egraph: &'a EGraph) -> Self {
        Self::with_cost(egraph, static_cost)
    }

    /// The cheapest forms under `cost`, the cost of an e-node's own op (non-negative; an
    /// e-node costs that plus its operands' costs).
    pub fn with_cost(egraph: &'a EGraph, cost: impl Fn(&ENode) -> f64) -> Self {
        // Every e-node as (class, index), the e-nodes using each class (once per use), and
        // how many operand uses of each e-node are not settled yet.
        let mut refs: Vec<(ClassId, usize)> = Vec::new();
        let mut users: FxHashMap<ClassId, Vec<usize>> = FxHashMap::default();
        let mut waiting: Vec<usize> = Vec::new();
        let mut heap = BinaryHeap::new();
        for class in egraph.classes() {
            for (i, node) in class.nodes().iter().enumerate() {
                let r = refs.len();
                refs.push((class.id(), i));
                let mut n = 0;
                for child in node.children() {
                    users.entry(egraph.find(child)).or_default().push(r);
                    n += 1;
                }
                waiting.push(n);
                if n == 0 {
                    heap.push(Reverse((Cost(cost(node).max(0.0)), class.id(), i)));
                }
            }
        }
        let mut best: FxHashMap<ClassId, (usize, f64, usize)> = FxHashMap::default();
        while let Some(Reverse((Cost(c), class, i))) = heap.pop() {
            if best.contains_key(&class) {
                continue;
            }
            best.insert(class, (i, c, best.len()));
            for &r in users.get(&class).map_or(&[][..], Vec::as_slice) {
                waiting[r] -= 1;
                if waiting[r] > 0 {
                    continue;
                }
                let (user_class, j) = refs[r];
                if best.contains_key(&user_class) {
                    continue;
                }
                let node = &egraph.class(user_class).nodes()[j];
                let total = node.children().fold(cost(node).max(0.0), |acc, child| {
                    acc + best
                        .get(&egraph.find(child))
                        .map_or(f64::INFINITY, |b| b.1.min(OPERAND_COST_CAP))
                });
                heap.push(Reverse((Cost(total), user_class, j)));
            }
        }
        debug_assert_eq!(best.len(), egraph.n_classes(), "every class has a form");
        Extraction { egraph, best }
    }

    /// The cost of `class`'s cheapest form (`None` only for a class with no acyclic form,
    /// which [`EGraph::add`] never makes).
    pub fn cost(&self, class: ClassId) -> Option<f64> {
        self.best.get(&self.egraph.find(class)).map(|b| b.1)
    }

    /// The e-node chosen for `class`.
    pub fn node(&self, class: ClassId) -> Option<&'a ENode> {
        let class = self.egraph.find(class);
        self.egraph.class(class).nodes().get(self.index(class)?)
    }

    /// The index in its class of the e-node chosen for `class`.
    pub(super) fn index(&self, class: ClassId) -> Option<usize> {
        self.best.get(&self.egraph.find(class)).map(|b| b.0)
    }

    /// Writes the chosen forms of `targets` into `graph` (a new one or one in use: leaves
    /// keep their [`LeafId`](crate::LeafId)s, equal nodes hash-cons with the graph's own)
    /// and returns their ids, holding one count per returned id for the caller.
    pub fn to_graph(&self, targets: &[ClassId], graph: &mut Graph) -> Vec<NodeId> {
        self.to_graph_with_classes(targets, graph).0
    }

    /// [`to_graph`](Self::to_graph), also returning the canonical class of every node it
    /// wrote: the identity a value keeps across forms extracted from one e-graph.
    pub fn to_graph_with_classes(
        &self,
        targets: &[ClassId],
        graph: &mut Graph,
    ) -> (Vec<NodeId>, FxHashMap<NodeId, ClassId>) {
        // The classes the targets need, written operands first (in settling order).
        let mut needed: Vec<ClassId> = Vec::new();
        let mut seen = FxHashSet::default();
        let mut stack: Vec<ClassId> = targets.iter().map(|&t| self.egraph.find(t)).collect();
        while let Some(class) = stack.pop() {
            if !seen.insert(class) {
                continue;
            }
            needed.push(class);
            if let Some(node) = self.node(class) {
                stack.extend(node.children().map(|c| self.egraph.find(c)));
            }
        }
        needed.sort_by_key(|c| self.best.get(c).map_or(usize::MAX, |b| b.2));
        let mut written: FxHashMap<ClassId, NodeId> = FxHashMap::default();
        for class in needed {
            let node = self.node(class).unwrap_or_else(|| {
                debug_assert!(false, "{class:?} has no acyclic form");
                &self.egraph.class(class).nodes()[0]
            });
            let mut missing = false;
            let op = node.op().map_children(|c| {
                let c = self.egraph.find(ClassId::of_operand(c));
                written.get(&c).copied().unwrap_or_else(|| {
                    missing = true;
                    NodeId(u32::MAX)
                })
            });
            if missing {
                debug_assert!(false, "{class:?}'s operands are not written before it");
                continue;
            }
            let id = graph.add(Node {
                op,
                dtype: node.dtype(),
                shape: node.shape().clone(),
            });
            written.insert(class, id);
        }
        let out: Vec<NodeId> = targets
            .iter()
            .filter_map(|&t| written.get(&self.egraph.find(t)).copied())
            .collect();
        for &id in &out {
            graph.retain(id);
        }
        let mut classes = FxHashMap::default();
        for (class, id) in written {
            classes.insert(id, class);
            let freed = graph.release(id);
            debug_assert!(freed.is_empty(), "written leaves are held by their users");
        }
        (out, classes)
    }
}

impl EGraph {
    /// Writes the cheapest form (under [`static_cost`]) of each of `targets` into `graph`;
    /// see [`Extraction::to_graph`].
    pub fn to_graph(&self, targets: &[ClassId], graph: &mut Graph) -> Vec<NodeId> {
        Extraction::new(self).to_graph(targets, graph)
    }
}

/// A graph simplified by [`simplify()`].
pub struct Simplified {
    /// A new graph holding only the simplified subgraph (leaves keep their ids).
    pub graph: Graph,
    /// The targets' new ids, in order, each holding one count.
    pub targets: Vec<NodeId>,
    /// What saturation did.
    pub report: SaturationReport,
}

impl std::fmt::Debug for Simplified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simplified")
            .field("nodes", &self.graph.len())
            .field("targets", &self.targets)
            .field("report", &self.report)
            .finish()
    }
}

/// Simplifies the subgraph behind `targets`: builds its e-graph, saturates it with the
/// built-in [`rules()`] within `budget`, and writes the cheapest form into a new graph.
///
/// # Example
/// ```
/// use tessel_graph::egraph::Budget;
/// use tessel_graph::{Graph, LeafId, Node, Op, simplify};
/// use tessel_shape::{BinaryOp, DType, Scalar, Shape};
///
/// let mut g = Graph::new();
/// let node = |op| Node { op, dtype: DType::F32, shape: Shape::from([4]) };
/// let x = g.add(node(Op::Leaf(LeafId(7))));
/// let one = g.add(node(Op::Const(Scalar::F32(1.0))));
/// let y = g.add(node(Op::Binary(BinaryOp::Mul, x, one)));
/// let s = simplify(&g, &[y], Budget::default());
/// assert_eq!(s.graph.node(s.targets[0]).op, Op::Leaf(LeafId(7)));
/// assert_eq!(s.report.applied("mul-one"), 1);
/// ```
pub fn simplify(graph: &Graph, targets: &[NodeId], budget: Budget) -> Simplified {
    let nodes_before = graph.toposort(targets).len();
    let (mut egraph, classes) = EGraph::from_graph(graph, targets);
    let report = egraph.saturate(rules(), budget);
    let mut out = Graph::new();
    let extraction = Extraction::new(&egraph);
    let targets = extraction.to_graph(&classes, &mut out);
    debug!(
        target: "tessel::egraph",
        nodes_before,
        nodes_after = out.len(),
        cost = ?classes.iter().map(|&c| extraction.cost(c)).collect::<Vec<_>>(),
        "simplified"
    );
    Simplified {
        graph: out,
        targets,
        report,
    }
}
