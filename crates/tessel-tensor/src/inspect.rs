//! Looking inside: the graph behind some tensors, as a standalone copy or as the
//! e-graph's Graphviz DOT, and the measured plan a realize runs ([`plan_to_dot`]).
//!
//! `TESSEL_LOG=tessel::plan=info` logs each new plan's candidates with their measured
//! times and the chosen ones; `tessel::egraph=debug` logs saturation; these functions show
//! the same structures on demand.

use rustc_hash::FxHashMap;
use tessel_graph::egraph::Budget;
use tessel_graph::{EGraph, Graph, Node, NodeId, rules};

use crate::dynamic::DimValues;
use crate::tensor::Tensor;
use tessel_runtime::runtime;
use tessel_runtime::{Error, Result};

/// A copy of the graph behind `tensors`: every node they depend on (realized tensors are
/// leaves), and one id per tensor, in order. The copy shares no state with the runtime:
/// passes of `tessel_graph` (rewrites, kernelization, vendor matching) can run on it.
pub fn graph_of(tensors: &[&Tensor]) -> (Graph, Vec<NodeId>) {
    let rt = runtime();
    let st = rt.lock();
    let roots: Vec<NodeId> = tensors.iter().map(|t| t.node()).collect();
    let mut copy = Graph::new();
    let mut ids: FxHashMap<NodeId, NodeId> = FxHashMap::default();
    for n in st.graph.toposort(&roots) {
        let node = st.graph.node(n);
        let id = copy.add(Node {
            op: node.op.map_children(|c| ids[&c]),
            dtype: node.dtype,
            shape: node.shape.clone(),
        });
        ids.insert(n, id);
    }
    let targets = roots.iter().map(|r| ids[r]).collect();
    (copy, targets)
}

/// The e-graph of the computation behind `tensors`, saturated with the built-in rewrites,
/// in Graphviz DOT (render with `dot -Tsvg`): each class a cluster of its equivalent
/// forms, the tensors' classes bold and the forms a realize would run filled.
///
/// ```
/// # use tessel_tensor::{DType, Tensor, inspect};
/// # fn main() -> tessel_tensor::Result<()> {
/// let x = Tensor::randn([4], DType::F32)?;
/// let y = x.mul(1.0)?.neg()?.neg()?;
/// let dot = inspect::to_dot(&[&y]);
/// assert!(dot.starts_with("digraph"));
/// # Ok(())
/// # }
/// ```
pub fn to_dot(tensors: &[&Tensor]) -> String {
    let (graph, targets) = graph_of(tensors);
    let (mut egraph, classes) = EGraph::from_graph(&graph, &targets);
    egraph.saturate(rules(), Budget::default());
    let classes: Vec<_> = classes.iter().map(|&c| egraph.find(c)).collect();
    egraph.to_dot(&classes)
}

/// The plan a realize of `tensors` runs, in Graphviz DOT: every value (ellipses; inputs
/// as boxes, the tensors' own values bold) and every program compiled for it (boxes,
/// library routines as components) with its measured time, from every form and partition
/// the planner made. Programs writing the same value are the alternatives measurement
/// chose between; the chosen ones are filled and their edges solid, the rest dashed.
///
/// Plans the tensors' computation as a realize would (compiling and measuring where no
/// plan is cached; the plan is then cached for the realize) without running it. `None`
/// when every tensor is already realized.
///
/// ```
/// # use tessel_tensor::{DType, Tensor, inspect};
/// # fn main() -> tessel_tensor::Result<()> {
/// let a = Tensor::randn([64, 32], DType::F32)?;
/// let b = Tensor::randn([32, 16], DType::F32)?;
/// let y = a.matmul(&b)?.relu();
/// let dot = inspect::plan_to_dot(&[&y])?.expect("y is not realized");
/// assert!(dot.starts_with("digraph plan"));
/// # Ok(())
/// # }
/// ```
pub fn plan_to_dot(tensors: &[&Tensor]) -> Result<Option<String>> {
    let Some(first) = tensors.first() else {
        return Ok(None);
    };
    let device = first.device();
    if let Some(other) = tensors.iter().find(|t| t.device() != device) {
        return Err(Error::InvalidArgument {
            op: "plan_to_dot",
            reason: format!(
                "tensors on {device} and {}: one plan runs on one device; inspect each \
                 device's tensors separately",
                other.device()
            ),
        });
    }
    let mut values = DimValues::default();
    for t in tensors {
        values = values.merge(t.dim_values(), "plan_to_dot")?;
    }
    let nodes: Vec<NodeId> = tensors.iter().map(|t| t.node()).collect();
    runtime().plan_to_dot(&nodes, device, &values.bindings())
}
