//! An attention's backward pass, found in the graph as autograd records it.
//!
//! For an attention `out = dropout(softmax(x)) @ v` (see `attention.rs`; `x` the scaled,
//! masked scores), `tessel-tensor`'s autograd records the gradient in flash attention's
//! form, where `dO` is the output's gradient:
//!
//! ```text
//! dp    = dO @ vᵀ                                (a product reading v transposed)
//! dp    = where(keep, dp · c, 0)                 (with dropout; f32)
//! lse   = max + log(sum)                         (the softmax's detached row max, row sum)
//! delta = sum(dO · out, -1)
//! ds    = exp(x - lse) · (dp - delta) · scale    (f32; rounded for half products)
//! dq    = ds @ k      dkᵀ = qᵀ @ ds      dv = pᵀ @ dO
//!                     (or dk = dsᵀ @ q, where extraction merged the transpose)
//! ```
//!
//! [`find_backward`] describes `lse`, `dq`, `dkᵀ` and `dv`, the three gradients together,
//! and the forward's output together with `lse`, as [`VendorOp::AttentionBackward`]s over
//! the forward's buffers and `dO`, `lse`, `delta`: alternatives that recompute the
//! probabilities tile by tile instead of reading the `[l, s]` matrices the composition
//! stores, measured against it like any candidate. A value gradient is matched only where
//! a query or key gradient shows `lse` and `delta`.

use rustc_hash::FxHashMap;
use tessel_ir::{AttentionBackward, AttentionPart, Matmul, VendorOp};
use tessel_shape::{BinaryOp, DType, TernaryOp, UnaryOp};

use crate::attention::{AttentionNodes, plain_products};
use crate::graph::{Graph, NodeId, Op};
use crate::vendor::{VendorMatch, swaps_last_two};

/// The inputs of an attention's gradient besides the forward's: `dO`, `lse`, `delta`.
#[derive(Clone, Copy)]
struct Inputs {
    d_out: NodeId,
    lse: NodeId,
    delta: NodeId,
}

/// The backward pieces of the attentions `found` among `matmuls`.
pub(crate) fn find_backward(
    graph: &Graph,
    matmuls: &[VendorMatch],
    found: &[AttentionNodes],
) -> Vec<VendorMatch> {
    let products = plain_products(matmuls);
    let mut out = Vec::new();
    let mut inputs: Vec<Option<Inputs>> = vec![None; found.len()];
    // Per attention, the first match of `dq`, `dkᵀ` and `dv` in `out`.
    let mut gradients: Vec<[Option<usize>; 3]> = vec![[None; 3]; found.len()];
    let mut values = Vec::new();
    for m in matmuls {
        let VendorOp::Matmul(op) = &m.op else {
            continue;
        };
        if !op.epilogue.is_none() {
            continue;
        }
        let both_transposed = op.rhs_transposed && op.lhs_transposed;
        let [lhs, rhs] = [m.operands[0], m.operands[1]];
        for (n, a) in found.iter().enumerate() {
            if op.dtype != a.op.dtype {
                continue;
            }
            // `dkᵀ = qᵀ·ds` as autograd records it, or `dk = dsᵀ·q` where extraction merged
            // the transpose into the product.
            let (part, ds, key_rows) = if both_transposed {
                if !reads(graph, rhs, true, a.factors[0], false) {
                    continue;
                }
                (AttentionPart::Key, lhs, true)
            } else if op.lhs_transposed && lhs == a.factors[2] {
                values.push((n, m));
                continue;
            } else if op.lhs_transposed && lhs == a.factors[0] {
                (AttentionPart::Key, rhs, false)
            } else if op.lhs_transposed && reads(graph, rhs, false, a.factors[0], false) {
                (AttentionPart::Key, lhs, true)
            } else if !op.lhs_transposed
                && reads(graph, rhs, op.rhs_transposed, a.factors[1], false)
            {
                (AttentionPart::Query, lhs, false)
            } else {
                continue;
            };
            let Some(found_inputs) = backward_inputs(graph, &products, ds, a) else {
                continue;
            };
            inputs[n] = Some(found_inputs);
            gradients[n][usize::from(part == AttentionPart::Key)].get_or_insert(out.len());
            out.push(gradient(graph, a, part, key_rows, found_inputs, m));
        }
    }
    for (n, m) in values {
        let d_out = m.operands[1];
        let a = &found[n];
        let contiguous = graph.node(d_out).shape.numel() == a.op.batch * a.op.l * a.op.ev;
        if let Some(found_inputs) = inputs[n]
            && contiguous
        {
            let with_own = Inputs {
                d_out,
                ..found_inputs
            };
            gradients[n][2].get_or_insert(out.len());
            out.push(gradient(graph, a, AttentionPart::Value, false, with_own, m));
        }
    }
    for (a, pieces) in found.iter().zip(&gradients) {
        if let [Some(dq), Some(dk), Some(dv)] = *pieces {
            out.push(all_gradients(graph, a, [&out[dq], &out[dk], &out[dv]]));
        }
    }
    for (a, found_inputs) in found.iter().zip(&inputs) {
        let Some(Inputs { lse, .. }) = *found_inputs else {
            continue;
        };
        let operands: Vec<NodeId> = a.operands[..2].iter().copied().chain(a.mask).collect();
        out.push(VendorMatch {
            op: VendorOp::AttentionBackward(AttentionBackward {
                forward: a.op.clone(),
                part: AttentionPart::LogSumExp,
                key_rows: false,
            }),
            materialize: to_materialize(graph, &operands, lse),
            operands,
            writes: vec![lse],
            also_writes: Vec::new(),
        });
        out.push(output_and_lse(graph, a, lse));
    }
    out
}

/// The forward of `a` writing its log-sum-exps `lse` as well.
fn output_and_lse(graph: &Graph, a: &AttentionNodes, lse: NodeId) -> VendorMatch {
    let mut m = crate::attention::forward(graph, a);
    m.op = VendorOp::AttentionBackward(AttentionBackward {
        forward: a.op.clone(),
        part: AttentionPart::OutputAndLogSumExp,
        key_rows: false,
    });
    m.also_writes.push(lse);
    m.materialize.push(lse);
    m
}

/// The match of gradient `part` written by the product `m` (for the key gradient, as rows
/// or transposed as `key_rows` says).
fn gradient(
    graph: &Graph,
    a: &AttentionNodes,
    part: AttentionPart,
    key_rows: bool,
    inputs: Inputs,
    m: &VendorMatch,
) -> VendorMatch {
    let operands: Vec<NodeId> = a
        .operands
        .iter()
        .copied()
        .chain([inputs.d_out, inputs.lse, inputs.delta])
        .collect();
    let top = *m.writes.last().unwrap_or(&m.operands[0]);
    VendorMatch {
        op: VendorOp::AttentionBackward(AttentionBackward {
            forward: a.op.clone(),
            part,
            key_rows,
        }),
        materialize: to_materialize(graph, &operands, top),
        operands,
        writes: m.writes.clone(),
        also_writes: Vec::new(),
    }
}

/// The three gradients of `a` computed together, from the matches of each: the operands
/// of `dq`'s, writing `dq`'s nodes, then the topmost of `dk`'s (in its layout) and of
/// `dv`'s.
fn all_gradients(
    graph: &Graph,
    a: &AttentionNodes,
    [dq, dk, dv]: [&VendorMatch; 3],
) -> VendorMatch {
    let tops: Vec<NodeId> = [dk, dv]
        .iter()
        .map(|m| *m.writes.last().unwrap_or(&m.operands[0]))
        .collect();
    let mut materialize = to_materialize(
        graph,
        &dq.operands,
        *dq.writes.last().unwrap_or(&dq.operands[0]),
    );
    materialize.extend(&tops);
    let key_rows = matches!(&dk.op, VendorOp::AttentionBackward(b) if b.key_rows);
    VendorMatch {
        op: VendorOp::AttentionBackward(AttentionBackward {
            forward: a.op.clone(),
            part: AttentionPart::Gradients,
            key_rows,
        }),
        operands: dq.operands.clone(),
        writes: dq.writes.clone(),
        also_writes: tops,
        materialize,
    }
}

/// The non-leaf operands, then `top`.
fn to_materialize(graph: &Graph, operands: &[NodeId], top: NodeId) -> Vec<NodeId> {
    operands
        .iter()
        .copied()
        .filter(|&o| !matches!(graph.node(o).op, Op::Leaf(_)))
        .chain([top])
        .collect()
}

/// Whether a product operand read from `base` (`transposed` or not) is the matrix `node`
/// stores, read transposed where `want_transposed`: `base` itself, or the transpose of
/// `node` (or of a reshape of it: the same bytes) read the other way.
fn reads(
    graph: &Graph,
    base: NodeId,
    transposed: bool,
    node: NodeId,
    want_transposed: bool,
) -> bool {
    if base == node {
        return transposed == want_transposed;
    }
    let &Op::Permute(mut inner, ref perm) = &graph.node(base).op else {
        return false;
    };
    while inner != node
        && let Op::Reshape(below) = graph.node(inner).op
    {
        inner = below;
    }
    inner == node && swaps_last_two(perm) && transposed != want_transposed
}

/// `dO`, `lse` and `delta` where `ds` (the operand of a gradient product) is the
/// attention `a`'s `ds` as the module docs record it.
fn backward_inputs(
    graph: &Graph,
    products: &FxHashMap<NodeId, (&Matmul, &VendorMatch)>,
    ds: NodeId,
    a: &AttentionNodes,
) -> Option<Inputs> {
    let half = matches!(a.op.dtype, DType::F16 | DType::BF16);
    let mut ds = if half { widest(graph, ds)? } else { ds };
    while let Op::Reshape(inner) = graph.node(ds).op {
        ds = inner;
    }
    let scale = a.op.scale.to_f64();
    let dx = match graph.node(ds).op {
        Op::Binary(BinaryOp::Mul, x, c) if constant(graph, c) == Some(scale) => x,
        Op::Binary(BinaryOp::Mul, c, x) if constant(graph, c) == Some(scale) => x,
        _ if scale == 1.0 => ds,
        _ => return None,
    };
    let Op::Binary(BinaryOp::Mul, x, y) = graph.node(dx).op else {
        return None;
    };
    let (lse, diff) = match (recomputed(graph, x, a), recomputed(graph, y, a)) {
        (Some(lse), _) => (lse, y),
        (_, Some(lse)) => (lse, x),
        _ => return None,
    };
    let Op::Binary(BinaryOp::Sub, dp, delta) = graph.node(diff).op else {
        return None;
    };
    let delta = below_expand(graph, delta);
    let stats = a.op.batch * a.op.l;
    if graph.node(delta).dtype != DType::F32 || graph.node(delta).shape.numel() != stats {
        return None;
    }
    let dp = match a.keep {
        Some((keep, factor)) => {
            let Op::Ternary(TernaryOp::Where, k, scaled, zero) = graph.node(dp).op else {
                return None;
            };
            let Op::Binary(BinaryOp::Mul, dp, c) = graph.node(scaled).op else {
                return None;
            };
            let same = k == keep
                && constant(graph, zero) == Some(0.0)
                && constant(graph, c) == Some(factor.to_f64());
            same.then_some(dp)?
        }
        None => dp,
    };
    let dp = if half {
        match graph.node(dp).op {
            Op::Cast(inner) if graph.node(inner).dtype == a.op.dtype => inner,
            _ => return None,
        }
    } else {
        dp
    };
    // `dO @ vᵀ`.
    let &(op, m) = products.get(&dp)?;
    let plain = op.dtype == a.op.dtype
        && !op.lhs_transposed
        && reads(graph, m.operands[1], op.rhs_transposed, a.factors[3], true);
    let d_out = m.operands[0];
    let contiguous = graph.node(d_out).shape.numel() == stats * a.op.ev;
    (plain && contiguous).then_some(Inputs { d_out, lse, delta })
}

/// The `lse` node where `node` is `exp(x - lse)` for the attention's scores `x`, with
/// `lse = max + log(sum)` of its softmax.
fn recomputed(graph: &Graph, node: NodeId, a: &AttentionNodes) -> Option<NodeId> {
    let Op::Unary(UnaryOp::Exp, shifted) = graph.node(node).op else {
        return None;
    };
    let Op::Binary(BinaryOp::Sub, x, lse) = graph.node(shifted).op else {
        return None;
    };
    let lse = below_expand(graph, lse);
    let Op::Binary(BinaryOp::Add, max, log) = graph.node(lse).op else {
        return None;
    };
    let sums = matches!(graph.node(log).op, Op::Unary(UnaryOp::Log, t) if t == a.row_sum);
    (x == a.scores && max == a.row_max && sums).then_some(lse)
}

/// The `f32` value a half-precision `node` rounds.
fn widest(graph: &Graph, node: NodeId) -> Option<NodeId> {
    match graph.node(node).op {
        Op::Cast(inner) if graph.node(inner).dtype == DType::F32 => Some(inner),
        _ => None,
    }
}

fn below_expand(graph: &Graph, node: NodeId) -> NodeId {
    match graph.node(node).op {
        Op::Expand(inner) => inner,
        _ => node,
    }
}

fn constant(graph: &Graph, node: NodeId) -> Option<f64> {
    match graph.node(node).op {
        Op::Const(c) => Some(c.to_f64()),
        _ => None,
    }
}
