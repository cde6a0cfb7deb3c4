//! Each node's readers within a set of nodes.

use rustc_hash::{FxBuildHasher, FxHashMap};

use crate::graph::{Graph, NodeId};

/// The consumers of every node among `order`'s nodes, each node's in `order`'s order.
///
/// One list and one index for the whole set rather than a vector per node: pattern
/// matching builds this on every `grad` and every partition, over every recorded node.
pub(crate) struct Consumers {
    /// Node → the start and length of its consumers in `list`.
    ranges: FxHashMap<NodeId, (u32, u32)>,
    list: Vec<NodeId>,
}

impl Consumers {
    /// The consumers among `order` of each node `order`'s nodes read.
    pub(crate) fn of(graph: &Graph, order: &[NodeId]) -> Consumers {
        let mut ranges: FxHashMap<NodeId, (u32, u32)> =
            FxHashMap::with_capacity_and_hasher(order.len(), FxBuildHasher);
        let mut total = 0u32;
        for &n in order {
            for c in graph.node(n).op.operands() {
                ranges.entry(c).or_default().1 += 1;
                total += 1;
            }
        }
        // Counts become starts; each length counts again from zero while placing.
        let mut start = 0;
        for range in ranges.values_mut() {
            let count = range.1;
            *range = (start, 0);
            start += count;
        }
        let mut list = vec![NodeId(0); total as usize];
        for &n in order {
            for c in graph.node(n).op.operands() {
                let range = ranges.get_mut(&c).expect("counted above");
                list[(range.0 + range.1) as usize] = n;
                range.1 += 1;
            }
        }
        Consumers { ranges, list }
    }

    /// The consumers of `node` (empty for a node nothing among the set reads).
    pub(crate) fn get(&self, node: NodeId) -> &[NodeId] {
        self.ranges.get(&node).map_or(&[], |&(start, len)| {
            &self.list[start as usize..(start + len) as usize]
        })
    }
}
