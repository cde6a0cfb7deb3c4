//! Looking inside: the graph behind some tensors, as a standalone copy or as the
//! e-graph's Graphviz DOT, and the measured plan a realize runs ([`plan_to_dot`]).
//!
//! `TESSEL_LOG=tessel::plan=info` logs each new plan's candidates with their measured
//! times and the chosen ones; `tessel::egraph=debug` logs saturation; these functions show
//! the same structures on demand.

use std::fmt::Write as _;

use rustc_hash::FxHashMap;
use tessel_graph::egraph::Budget;
use tessel_graph::{EGraph, Graph, Node, NodeId, rules};

use crate::dynamic::DimValues;
use crate::error::{Error, Result};
use crate::planner::{PlanSlot, PlanView};
use crate::runtime::runtime;
use crate::tensor::Tensor;

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
    let view = runtime().plan_view(&nodes, device, &values.bindings())?;
    Ok(view.map(|v| v.to_dot()))
}

impl PlanView {
    /// One line per program (`*` marks the chosen ones) and per chosen copy.
    pub(crate) fn to_text(&self) -> String {
        let mut text = String::new();
        for p in &self.programs {
            let _ = writeln!(
                text,
                "  {} {:<40} on {:<8} writes {:?} reads {:?}: {}",
                if p.chosen { "*" } else { " " },
                p.name,
                self.devices[p.device].to_string(),
                p.writes,
                p.reads,
                time_text(p.time),
            );
        }
        for (slot, from, to) in &self.copies {
            let _ = writeln!(
                text,
                "  * copy {} {} -> {}",
                slot_name(*slot),
                self.devices[*from],
                self.devices[*to]
            );
        }
        text
    }

    /// The Graphviz DOT form described at [`plan_to_dot`].
    pub(crate) fn to_dot(&self) -> String {
        let mut out = String::from("digraph plan {\n  node [fontname=\"monospace\"];\n");
        for &(slot, dtype, numel) in &self.sizes {
            let target = matches!(slot, PlanSlot::Node(p) if self.targets.contains(&p));
            let shape = if matches!(slot, PlanSlot::Input(_)) {
                "box"
            } else {
                "ellipse"
            };
            let _ = writeln!(
                out,
                "  {} [shape={shape}, label=\"{}\\n{dtype} × {numel}\"{}];",
                slot_name(slot),
                slot_name(slot),
                if target { ", penwidth=3" } else { "" },
            );
        }
        for (k, p) in self.programs.iter().enumerate() {
            let time = time_text(p.time);
            let _ = writeln!(
                out,
                "  p{k} [shape={}, label=\"{}\\n{}\\n{time}\", style=\"{}\"];",
                if p.routine { "component" } else { "box" },
                p.name.replace('"', "'"),
                self.devices[p.device],
                if p.chosen { "filled,bold" } else { "dashed" },
            );
            let edge = if p.chosen {
                ""
            } else {
                " [style=dashed, color=gray]"
            };
            for &r in &p.reads {
                let _ = writeln!(out, "  {} -> p{k}{edge};", slot_name(r));
            }
            for &w in &p.writes {
                let _ = writeln!(out, "  p{k} -> {}{edge};", slot_name(PlanSlot::Node(w)));
            }
        }
        for (slot, from, to) in &self.copies {
            let _ = writeln!(
                out,
                "  {0} -> {0} [label=\"copy {1} → {2}\", style=bold];",
                slot_name(*slot),
                self.devices[*from],
                self.devices[*to]
            );
        }
        out.push_str("}\n");
        out
    }
}

fn time_text(seconds: Option<f64>) -> String {
    seconds.map_or("not measured".to_string(), |t| format!("{:.1} µs", t * 1e6))
}

fn slot_name(slot: PlanSlot) -> String {
    match slot {
        PlanSlot::Input(i) => format!("in{i}"),
        PlanSlot::Node(p) => format!("v{p}"),
    }
}
