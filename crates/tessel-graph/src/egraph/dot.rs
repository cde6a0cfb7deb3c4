//! Graphviz DOT of an e-graph, for looking at what saturation found.

use std::fmt::{self, Write as _};

use rustc_hash::FxHashSet;

use super::{ClassId, EGraph, Extraction};

impl EGraph {
    /// The e-graph in Graphviz DOT: each class a cluster labelled with its id, dtype and
    /// shape; each e-node a box inside it, named `"c<class>.<index>"`, with an edge to
    /// (the first e-node of) each operand class, clipped at that class's cluster and
    /// numbered when the op has several operands. The classes in `highlight` are drawn
    /// bold, and the e-nodes [`Extraction::new`] chooses for them (transitively) filled.
    ///
    /// Render with `dot -Tsvg`.
    pub fn to_dot(&self, highlight: &[ClassId]) -> String {
        let mut out = String::new();
        // Writing to a `String` cannot fail.
        let _ = self.write_dot(&mut out, highlight);
        out
    }

    fn write_dot(&self, out: &mut String, highlight: &[ClassId]) -> fmt::Result {
        let extraction = Extraction::new(self);
        let targets: FxHashSet<ClassId> = highlight.iter().map(|&c| self.find(c)).collect();
        let mut chosen = FxHashSet::default();
        let mut stack: Vec<ClassId> = targets.iter().copied().collect();
        while let Some(class) = stack.pop() {
            if let (Some(i), Some(node)) = (extraction.index(class), extraction.node(class))
                && chosen.insert((class, i))
            {
                stack.extend(node.children().map(|c| self.find(c)));
            }
        }
        writeln!(out, "digraph egraph {{")?;
        writeln!(out, "  compound=true;")?;
        writeln!(out, "  node [shape=box, fontname=\"monospace\"];")?;
        for class in self.classes() {
            let id = class.id();
            writeln!(out, "  subgraph cluster_{} {{", id.0)?;
            let label = format!("{id}: {}{}", class.dtype(), class.shape());
            writeln!(out, "    label=\"{}\";", escape(&label))?;
            if targets.contains(&id) {
                writeln!(out, "    penwidth=2; color=blue;")?;
            }
            for (i, node) in class.nodes().iter().enumerate() {
                let style = if chosen.contains(&(id, i)) {
                    ", style=filled, fillcolor=lightblue"
                } else {
                    ""
                };
                let label = escape(&node.to_string());
                writeln!(out, "    \"{id}.{i}\" [label=\"{label}\"{style}];")?;
            }
            writeln!(out, "  }}")?;
        }
        for class in self.classes() {
            for (i, node) in class.nodes().iter().enumerate() {
                let children: Vec<ClassId> = node.children().map(|c| self.find(c)).collect();
                for (k, child) in children.iter().enumerate() {
                    let label = if children.len() > 1 {
                        format!(", label=\"{k}\"")
                    } else {
                        String::new()
                    };
                    writeln!(
                        out,
                        "  \"{}.{i}\" -> \"{child}.0\" [lhead=cluster_{}{label}];",
                        class.id(),
                        child.0
                    )?;
                }
            }
        }
        writeln!(out, "}}")
    }
}

/// `text` as the inside of a DOT string.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}
