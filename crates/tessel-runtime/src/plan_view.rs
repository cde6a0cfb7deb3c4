//! A plan's programs and copies as text (for logs) and as Graphviz DOT (for
//! `tessel_tensor::inspect::plan_to_dot`).

use std::fmt::Write as _;

use crate::planner::{PlanSlot, PlanView};

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

    /// Graphviz DOT: every value (ellipses; inputs as boxes, the targets bold) and every
    /// program (boxes, library routines as components) with its measured time; the chosen
    /// programs filled with solid edges, the alternatives dashed.
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
