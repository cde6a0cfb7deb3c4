//! Several equivalent forms of one subgraph, extracted from one saturated e-graph, each
//! node labelled with its e-class: the identity a value keeps in every form.
//!
//! The planner kernelizes every form and names each kernel's inputs and outputs by class,
//! so programs made from different forms are alternatives for the same values and the
//! measured extraction may combine them (a product from one form, the softmax reading it
//! from another). [`forms`] returns:
//!
//! 1. `simplified`: the cheapest form under [`static_cost`] (what [`simplify`] returns);
//! 2. `transposed`, where some matrix product reads a computed operand through a
//!    permute that is not a plain transpose (attention's `k.transpose(-2, -1)` after the
//!    head split composes into one `[0, 2, 3, 1]` permute): the rule `transpose-split`,
//!    `permute(x, p) = transpose(permute(x, p∘swap))`, adds the operand's other layout to
//!    its class, and extraction prefers it there. A library routine then reads the
//!    materialized `permute(x, p∘swap)` transposed (a flag of the GEMM) instead of a
//!    materialized `permute(x, p)`. The split is made where its copy reads `x` along
//!    `x`'s last axis and the original's does not (`p[n-2] == n-1`: attention's `k`, not
//!    its `q` or `v`); which layout is faster is measured, never assumed. In the same form,
//!    a product read transposed, `(A·B)ᵀ`, is computed as `Bᵀ·Aᵀ` (`matmul-transpose`), so
//!    the routine writes the layout its consumer reads.
//!
//! [`simplify`]: super::simplify

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_shape::Shape;
use tracing::debug;

use super::rules::transposed_product;
use super::{Budget, ClassId, EGraph, ENode, Extraction, SaturationReport, rules, static_cost};
use crate::graph::{Graph, NodeId, Op};
use crate::signature::signature;
use crate::vendor::{find_matmuls, swaps_last_two};

/// One form of the subgraph: a graph whose every node names its e-class.
pub struct Form {
    /// What the form is for (`simplified`, `transposed`), for logs.
    pub name: &'static str,
    /// The form's own graph (leaves keep their ids).
    pub graph: Graph,
    /// The targets' ids in `graph`, in order, each holding one count.
    pub targets: Vec<NodeId>,
    /// The canonical class of every node of `graph`.
    pub classes: FxHashMap<NodeId, ClassId>,
}

impl std::fmt::Debug for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Form")
            .field("name", &self.name)
            .field("nodes", &self.graph.len())
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

/// The forms of a subgraph; the first is the cheapest under [`static_cost`].
#[derive(Debug)]
pub struct Forms {
    /// The forms, `simplified` first.
    pub forms: Vec<Form>,
    /// What saturation did.
    pub report: SaturationReport,
}

/// Builds the e-graph of `targets`, saturates it with the built-in [`rules()`] within
/// `budget` (`iterations: 0` keeps the graph as recorded), and extracts its forms (see
/// the module docs).
pub fn forms(graph: &Graph, targets: &[NodeId], budget: Budget) -> Forms {
    let (mut egraph, classes) = EGraph::from_graph(graph, targets);
    let report = egraph.saturate(rules(), budget);
    let mut forms = vec![extract("simplified", &Extraction::new(&egraph), &classes)];
    let preferred = split_transposes(&mut egraph, &forms[0]);
    if !preferred.is_empty() {
        let cost = |node: &ENode| {
            if preferred.contains(node) {
                0.0
            } else {
                static_cost(node)
            }
        };
        let form = extract(
            "transposed",
            &Extraction::with_cost(&egraph, cost),
            &classes,
        );
        let same = signature(&form.graph, &form.targets).0
            == signature(&forms[0].graph, &forms[0].targets).0;
        if !same {
            forms.push(form);
        }
    }
    // Splitting merged classes: name every value by its class as it is now.
    for form in &mut forms {
        for class in form.classes.values_mut() {
            *class = egraph.find(*class);
        }
    }
    debug!(target: "tessel::egraph", forms = forms.len(), "forms extracted");
    Forms { forms, report }
}

fn extract(name: &'static str, extraction: &Extraction<'_>, targets: &[ClassId]) -> Form {
    let mut graph = Graph::new();
    let (ids, classes) = extraction.to_graph_with_classes(targets, &mut graph);
    Form {
        name,
        graph,
        targets: ids,
        classes,
    }
}

/// `transpose-split` on the classes of matrix products' operands in `form` that are read
/// through a permute other than a transpose of the last two axes, and `matmul-transpose`
/// on the products `form` reads transposed. `transpose-split` adds
/// `transpose(permute(x, p∘swap))` to the class of `permute(x, p)`. Returns the e-nodes
/// added, for extraction to prefer. `p∘swap` is `p` with its last two entries
/// exchanged: `permute(permute(x, q), swap)` reads axis `q[swap[k]]` of `x` at axis `k`.
fn split_transposes(egraph: &mut EGraph, form: &Form) -> FxHashSet<ENode> {
    let graph = &form.graph;
    let order = graph.toposort(&form.targets);
    let mut preferred = FxHashSet::default();
    for m in find_matmuls(graph, &order) {
        for operand in m.operands {
            let node = graph.node(operand);
            let Op::Permute(inner, perm) = &node.op else {
                continue;
            };
            // Only where the split's copy reads its source along the source's last axis
            // (`p[n-2] == n-1`), which the original's copy then does not: the other
            // operands keep their layout, so this one form serves every product.
            let n = perm.len();
            if n < 2 || swaps_last_two(perm) || perm[n - 2] != n - 1 {
                continue;
            }
            let mut split: Box<[usize]> = perm.clone();
            split.swap(n - 2, n - 1);
            let mut swap: Box<[usize]> = (0..n).collect();
            swap.swap(n - 2, n - 1);
            let mut dims = node.shape.dims().to_vec();
            dims.swap(n - 2, n - 1);
            let x = egraph.find(form.classes[inner]);
            let permuted = ENode::new(
                Op::Permute(x.operand(), split),
                node.dtype,
                Shape::from(dims),
            );
            let inner_class = egraph.add(permuted.clone());
            let transposed = ENode::new(
                Op::Permute(inner_class.operand(), swap),
                node.dtype,
                node.shape.clone(),
            );
            let outer = egraph.add(transposed.clone());
            egraph.union(outer, form.classes[&operand]);
            preferred.insert(permuted);
            preferred.insert(transposed);
        }
    }
    // Products read transposed, computed transposed instead (`matmul-transpose`: the
    // routine writes `Bᵀ·Aᵀ` where a consumer reads `(A·B)ᵀ`). Searching needs the
    // invariants back after the unions above.
    if !preferred.is_empty() {
        egraph.rebuild();
    }
    // Only where this form reads a product through a permute.
    let used: FxHashSet<ClassId> = form
        .classes
        .iter()
        .filter(|(n, _)| matches!(graph.node(**n).op, Op::Permute(..)))
        .map(|(_, &c)| egraph.find(c))
        .collect();
    if let Some(rule) = rules().iter().find(|r| r.name() == "matmul-transpose") {
        for m in rule.search(egraph) {
            if !used.contains(&egraph.find(m.class)) {
                continue;
            }
            if let Some((class, nodes)) = transposed_product(egraph, &m) {
                egraph.union(class, m.class);
                preferred.extend(nodes);
            }
        }
    }
    if !preferred.is_empty() {
        egraph.rebuild();
    }
    // Rebuilding may have canonicalized the e-nodes' operands.
    preferred
        .into_iter()
        .map(|node| node.map_children(|c| egraph.find(c)))
        .collect()
}
