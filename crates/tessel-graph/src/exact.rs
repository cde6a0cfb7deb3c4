//! Float sums that a plan must compute once.
//!
//! A float sum (or product) computed by two kernels, each adding in its own order (a
//! library routine and a fused loop, two tile sizes), differs in its last bits between the
//! two. Most consumers cannot tell, but a comparison whose two sides both derive from the
//! sum can: `x == max(x)` over a product `x` computed once for the maximum and once for the
//! comparison may find no element equal to the maximum, and a radix select's `key == kth`
//! may find no key equal to the one it selected. [`compared_sums`] finds such sums in a
//! graph; [`sums_computed_by`] lists the sums a kernel computes for itself. The planner
//! hands both to extraction ([`crate::extract::Candidate::computes`]), which then never
//! mixes two computations of one such sum in a plan.

use rustc_hash::FxHashSet;

use crate::graph::{Graph, NodeId, Op, ReduceOp};

/// Whether `n` is a reduction whose result depends on the order it adds in.
fn is_float_sum(graph: &Graph, n: NodeId) -> bool {
    let node = graph.node(n);
    matches!(node.op, Op::Reduce(ReduceOp::Sum | ReduceOp::Prod, ..)) && node.dtype.is_float()
}

/// The float sums and products among `order`'s nodes (a topological order) that both sides
/// of some comparison derive from.
pub fn compared_sums(graph: &Graph, order: &[NodeId]) -> Vec<NodeId> {
    let mut above_sum: FxHashSet<NodeId> = FxHashSet::default();
    for &n in order {
        if is_float_sum(graph, n) || graph.node(n).op.operands().any(|c| above_sum.contains(&c)) {
            above_sum.insert(n);
        }
    }
    let mut found: FxHashSet<NodeId> = FxHashSet::default();
    let mut left: FxHashSet<NodeId> = FxHashSet::default();
    for &n in order {
        let Op::Binary(op, a, b) = graph.node(n).op else {
            continue;
        };
        if !op.is_comparison() || !above_sum.contains(&a) || !above_sum.contains(&b) {
            continue;
        }
        left.clear();
        walk(graph, a, &above_sum, &mut left);
        let mut right = FxHashSet::default();
        walk(graph, b, &above_sum, &mut right);
        found.extend(
            left.intersection(&right)
                .copied()
                .filter(|&s| is_float_sum(graph, s)),
        );
    }
    let mut found: Vec<NodeId> = found.into_iter().collect();
    found.sort_unstable();
    found
}

/// Adds to `seen` the nodes of `from`'s cone that lie above a float sum.
fn walk(graph: &Graph, from: NodeId, above_sum: &FxHashSet<NodeId>, seen: &mut FxHashSet<NodeId>) {
    let mut stack = vec![from];
    while let Some(n) = stack.pop() {
        if above_sum.contains(&n) && seen.insert(n) {
            stack.extend(graph.node(n).op.operands());
        }
    }
}

/// The float sums and products a kernel that writes `writes`, reading the buffers of
/// `reads`, computes for itself: those between the two, other than what it writes.
pub fn sums_computed_by(graph: &Graph, writes: &[NodeId], reads: &[NodeId]) -> Vec<NodeId> {
    let mut seen: FxHashSet<NodeId> = reads.iter().copied().collect();
    let mut stack: Vec<NodeId> = writes.to_vec();
    let mut sums = Vec::new();
    while let Some(n) = stack.pop() {
        for c in graph.node(n).op.operands() {
            if seen.insert(c) {
                if is_float_sum(graph, c) && !writes.contains(&c) {
                    sums.push(c);
                }
                stack.push(c);
            }
        }
    }
    sums.sort_unstable();
    sums
}

#[cfg(test)]
mod tests {
    use tessel_shape::{BinaryOp, DType, Shape};

    use super::{compared_sums, sums_computed_by};
    use crate::graph::{Graph, LeafId, Node, NodeId, Op, ReduceOp};

    fn node(g: &mut Graph, op: Op, dtype: DType, dims: &[usize]) -> NodeId {
        g.add(Node {
            op,
            dtype,
            shape: Shape::from(dims),
        })
    }

    /// `x = a @ b` ([2, 3] by [3, 4]) as recorded: the sum over `k` of an expanded product.
    fn product(g: &mut Graph, dtype: DType) -> NodeId {
        let a = node(g, Op::Leaf(LeafId(0)), dtype, &[2, 3, 1]);
        let b = node(g, Op::Leaf(LeafId(1)), dtype, &[1, 3, 4]);
        let ae = node(g, Op::Expand(a), dtype, &[2, 3, 4]);
        let be = node(g, Op::Expand(b), dtype, &[2, 3, 4]);
        let p = node(g, Op::Binary(BinaryOp::Mul, ae, be), dtype, &[2, 3, 4]);
        let r = node(
            g,
            Op::Reduce(ReduceOp::Sum, p, vec![1].into()),
            dtype,
            &[2, 1, 4],
        );
        node(g, Op::Reshape(r), dtype, &[2, 4])
    }

    /// `x == max(x, -1)` broadcast back, and `x > 0`.
    fn compare(g: &mut Graph, x: NodeId, dtype: DType) -> (NodeId, NodeId) {
        let max = node(
            g,
            Op::Reduce(ReduceOp::Max, x, vec![1].into()),
            dtype,
            &[2, 1],
        );
        let wide = node(g, Op::Expand(max), dtype, &[2, 4]);
        let eq = node(g, Op::Binary(BinaryOp::Eq, x, wide), DType::Bool, &[2, 4]);
        let zero = node(g, Op::Const(tessel_shape::Scalar::zero(dtype)), dtype, &[]);
        let zeros = node(g, Op::Expand(zero), dtype, &[2, 4]);
        let gt = node(g, Op::Binary(BinaryOp::Gt, x, zeros), DType::Bool, &[2, 4]);
        (eq, gt)
    }

    #[test]
    fn a_float_sum_on_both_sides_of_a_comparison_is_found() {
        let mut g = Graph::new();
        let x = product(&mut g, DType::F32);
        let Op::Reshape(sum) = g.node(x).op else {
            unreachable!()
        };
        let (eq, gt) = compare(&mut g, x, DType::F32);
        assert_eq!(compared_sums(&g, &g.toposort(&[eq])), [sum]);
        // One side constant: the comparison sees one computation.
        assert_eq!(compared_sums(&g, &g.toposort(&[gt])), []);
        // A kernel computing the comparison from the leaves computes the sum; one reading
        // `x` computes none; the kernel writing the sum computes it, but writes it.
        assert_eq!(sums_computed_by(&g, &[eq], &[]), [sum]);
        assert_eq!(sums_computed_by(&g, &[eq], &[x]), []);
        assert_eq!(sums_computed_by(&g, &[sum], &[]), []);
        assert_eq!(sums_computed_by(&g, &[x, eq], &[]), [sum]);
    }

    #[test]
    fn integer_sums_are_exact() {
        let mut g = Graph::new();
        let x = product(&mut g, DType::I32);
        let (eq, _) = compare(&mut g, x, DType::I32);
        assert_eq!(compared_sums(&g, &g.toposort(&[eq])), []);
        assert_eq!(sums_computed_by(&g, &[eq], &[]), []);
    }
}
