//! Attention as one routine: `softmax(q kᵀ · scale [masked causally]) v` found in the graph.
//!
//! `scaled_dot_product_attention` (and user code written the same way) records two matrix
//! products around a softmax along the last axis:
//!
//! ```text
//! scores = q @ kᵀ                       (a product reading k transposed)
//! x      = scores * scale               (a constant; absent means 1)
//! x      = where(causal, -inf, x)       (optional; `causal` is `j > i` over the axes)
//! e      = exp(x - max(x, -1))          (the max detached: a bitcast)
//! p      = e / sum(e, -1)
//! out    = p @ v
//! ```
//!
//! In half precision the products are recorded between casts (see `vendor.rs`) and the
//! softmax runs in `f32` between a cast of the scores up and a cast of the probabilities
//! down. [`find_attention`] describes each such value as a [`VendorOp::Attention`] over the
//! buffers of `q`, `k` and `v`, writing the output of the second product: an alternative
//! the backends may offer a fused kernel for, measured against the composition like every
//! other candidate.

use rustc_hash::FxHashMap;
use tessel_ir::{Attention, Matmul, VendorOp};
use tessel_shape::{BinaryOp, DType, Scalar, TernaryOp, UnaryOp};

use crate::graph::{Graph, NodeId, Op, ReduceOp};
use crate::vendor::VendorMatch;

/// Every attention whose second product is among `matmuls` (what
/// [`find_matmuls`](crate::find_matmuls) found in the same graph), each writing that
/// product's nodes.
pub fn find_attention(graph: &Graph, matmuls: &[VendorMatch]) -> Vec<VendorMatch> {
    // Which plain product writes each node.
    let mut products: FxHashMap<NodeId, (&Matmul, &VendorMatch)> = FxHashMap::default();
    for m in matmuls {
        if let VendorOp::Matmul(op) = &m.op
            && op.epilogue.is_none()
        {
            for &w in &m.writes {
                products.insert(w, (op, m));
            }
        }
    }
    let mut found = Vec::new();
    for m in matmuls {
        let VendorOp::Matmul(pv) = &m.op else {
            continue;
        };
        if !pv.epilogue.is_none() || pv.lhs_transposed || pv.rhs_transposed {
            continue;
        }
        let Some(softmax) = softmax_rows(graph, m.operands[0], pv.dtype) else {
            continue;
        };
        let Some(&(qk, scores)) = products.get(&softmax.scores) else {
            continue;
        };
        // `q @ kᵀ` with k read transposed, over the same pairs, rows and keys.
        if qk.dtype != pv.dtype
            || qk.lhs_transposed
            || !qk.rhs_transposed
            || qk.batch != pv.batch
            || qk.m != pv.m
            || qk.n != pv.k
        {
            continue;
        }
        let [q, k, v] = [scores.operands[0], scores.operands[1], m.operands[1]];
        let mut materialize: Vec<NodeId> = [q, k, v]
            .into_iter()
            .filter(|&o| !matches!(graph.node(o).op, Op::Leaf(_)))
            .collect();
        materialize.push(*m.writes.last().unwrap_or(&m.operands[0]));
        found.push(VendorMatch {
            op: VendorOp::Attention(Attention {
                dtype: pv.dtype,
                batch: pv.batch,
                l: pv.m,
                s: pv.k,
                e: qk.k,
                ev: pv.n,
                q_batch_stride: qk.lhs_batch_stride,
                k_batch_stride: qk.rhs_batch_stride,
                v_batch_stride: pv.rhs_batch_stride,
                scale: softmax.scale,
                causal: softmax.causal,
            }),
            operands: vec![q, k, v],
            writes: m.writes.clone(),
            materialize,
        });
    }
    found
}

/// A softmax over the last axis of `scale · scores`, optionally masked causally.
struct SoftmaxRows {
    /// The node holding the product `q kᵀ` (in the product's dtype).
    scores: NodeId,
    scale: Scalar,
    causal: bool,
}

/// `probs` (the first operand of `p @ v` in `dtype`) as a [`SoftmaxRows`].
fn softmax_rows(graph: &Graph, probs: NodeId, dtype: DType) -> Option<SoftmaxRows> {
    // A half product reads the probabilities rounded from the f32 softmax.
    let probs = narrowed_from_f32(graph, probs, dtype)?;
    let node = graph.node(probs);
    let rank = node.shape.ndim();
    if rank < 2 {
        return None;
    }
    let last = rank - 1;
    let Op::Binary(BinaryOp::Div, e, total) = node.op else {
        return None;
    };
    let total = expanded(graph, total);
    if !is_reduce(graph, total, ReduceOp::Sum, e, last) {
        return None;
    }
    let Op::Unary(UnaryOp::Exp, shifted) = graph.node(e).op else {
        return None;
    };
    let Op::Binary(BinaryOp::Sub, x, max) = graph.node(shifted).op else {
        return None;
    };
    let mut max = expanded(graph, max);
    if let Op::Bitcast(inner) = graph.node(max).op
        && graph.node(inner).dtype == graph.node(max).dtype
    {
        max = inner;
    }
    if !is_reduce(graph, max, ReduceOp::Max, x, last) {
        return None;
    }
    // The mask, then the scale.
    let (scaled, causal) = match graph.node(x).op {
        Op::Ternary(TernaryOp::Where, hidden, fill, kept)
            if is_const(graph, fill, f64::NEG_INFINITY)
                && hides_later_keys(graph, hidden, last) =>
        {
            (kept, true)
        }
        _ => (x, false),
    };
    let (product, scale) = match graph.node(scaled).op {
        Op::Binary(BinaryOp::Mul, a, b) => match (constant(graph, a), constant(graph, b)) {
            (_, Some(c)) => (a, c),
            (Some(c), _) => (b, c),
            _ => return None,
        },
        _ => (scaled, Scalar::one(graph.node(scaled).dtype)),
    };
    // A half product's scores are widened to f32 for the softmax.
    let scores = match graph.node(product).op {
        Op::Cast(inner) if dtype != graph.node(product).dtype => {
            (graph.node(inner).dtype == dtype).then_some(inner)?
        }
        _ if graph.node(product).dtype == dtype => product,
        _ => return None,
    };
    Some(SoftmaxRows {
        scores,
        scale,
        causal,
    })
}

/// `node` itself where `dtype` is its dtype; for a half `dtype`, the `f32` value `node`
/// rounds.
fn narrowed_from_f32(graph: &Graph, node: NodeId, dtype: DType) -> Option<NodeId> {
    let n = graph.node(node);
    match (dtype, &n.op) {
        (DType::F16 | DType::BF16, Op::Cast(inner)) if graph.node(*inner).dtype == DType::F32 => {
            Some(*inner)
        }
        (DType::F16 | DType::BF16, _) => None,
        _ => (n.dtype == dtype).then_some(node),
    }
}

/// The operand of `node` where it is an `Expand`, else `node`.
fn expanded(graph: &Graph, node: NodeId) -> NodeId {
    match graph.node(node).op {
        Op::Expand(inner) => inner,
        _ => node,
    }
}

/// Whether `node` is `op` of `operand` over `axis` alone.
fn is_reduce(graph: &Graph, node: NodeId, op: ReduceOp, operand: NodeId, axis: usize) -> bool {
    matches!(&graph.node(node).op, Op::Reduce(o, x, axes) if *o == op && *x == operand && axes.as_ref() == [axis])
}

/// The value of a constant node.
fn constant(graph: &Graph, node: NodeId) -> Option<Scalar> {
    match graph.node(node).op {
        Op::Const(c) => Some(c),
        _ => None,
    }
}

fn is_const(graph: &Graph, node: NodeId, value: f64) -> bool {
    constant(graph, node).is_some_and(|c| c.to_f64() == value)
}

/// Whether the bool `node` is true exactly where the coordinate along `key` (the last
/// axis) exceeds the one along `key - 1` (the query): `triu(ones, 1)`, recorded as
/// `where(j - i >= 1, true, false)`, or `j - i > 0`, `j > i`, `i < j`.
fn hides_later_keys(graph: &Graph, node: NodeId, key: usize) -> bool {
    let query = key - 1;
    let n = graph.node(node);
    if n.dtype != DType::Bool {
        return false;
    }
    let index = |id: NodeId, axis: usize| matches!(graph.node(id).op, Op::Index(a) if a == axis);
    match n.op {
        // `c ? true : false` is `c`.
        Op::Ternary(TernaryOp::Where, c, t, f) => {
            is_true(graph, t) && is_const(graph, f, 0.0) && hides_later_keys(graph, c, key)
        }
        Op::Binary(op @ (BinaryOp::Ge | BinaryOp::Gt), diff, bound) => {
            let at_least = match op {
                BinaryOp::Ge => 1.0,
                _ => 0.0,
            };
            matches!(graph.node(diff).op, Op::Binary(BinaryOp::Sub, j, i) if index(j, key) && index(i, query))
                && is_const(graph, bound, at_least)
                || op == BinaryOp::Gt && index(diff, key) && index(bound, query)
        }
        Op::Binary(BinaryOp::Lt, i, j) => index(i, query) && index(j, key),
        _ => false,
    }
}

/// Whether `node` is a true constant, or a nonzero constant cast to `bool`.
fn is_true(graph: &Graph, node: NodeId) -> bool {
    match graph.node(node).op {
        Op::Const(c) => c.to_f64() != 0.0,
        Op::Cast(inner) => constant(graph, inner).is_some_and(|c| c.to_f64() != 0.0),
        _ => false,
    }
}
