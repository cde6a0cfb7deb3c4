//! Attention as one routine: `softmax(q kᵀ · scale [masked causally]) v` found in the graph.
//!
//! `scaled_dot_product_attention` (and user code written the same way) records two matrix
//! products around a softmax along the last axis:
//!
//! ```text
//! scores = q @ kᵀ                       (a product reading k transposed)
//! x      = scores * scale               (a constant; absent means 1)
//! x      = x + mask                     (optional; a float mask, read in place)
//! x      = where(hidden, -inf, x)       (optional; `hidden` is `j > i` over the axes
//!                                        (causal) or a bool mask read in place)
//! e      = exp(x - max(x, -1))          (the max detached: a bitcast)
//! p      = e / sum(e, -1)
//! p      = where(bits >= t, p · c, 0)   (optional: `Tensor::dropout`, bits of one draw)
//! out    = p @ v
//! ```
//!
//! In half precision the products are recorded between casts (see `vendor.rs`) and the
//! softmax runs in `f32` between a cast of the scores up and a cast of the probabilities
//! down. [`find_attention`] describes each such value as a [`VendorOp::Attention`] over the
//! buffers of `q`, `k` and `v` (grouped-query heads that `repeat_interleave` repeated for the
//! products read unrepeated), writing the output of the second product: an alternative
//! the backends may offer a fused kernel for, measured against the composition like every
//! other candidate.

use rustc_hash::FxHashMap;
use tessel_ir::{Attention, AttentionDropout, AttentionLayout, AttentionMask, Matmul, VendorOp};
use tessel_shape::{BinaryOp, DType, Dim, Scalar, TernaryOp, UnaryOp};

use crate::graph::{Graph, NodeId, Op, ReduceOp};
use crate::random::Words;
use crate::vendor::VendorMatch;

/// The nodes of one attention as the graph records it: what the forward routine reads and
/// writes, and what autograd and [`find_attention`]'s backward matcher need of it.
#[derive(Clone, Debug)]
pub struct AttentionNodes {
    /// The fused routine.
    pub op: Attention,
    /// What the routine reads: `[q, k, v, mask?, key?]` (`k` and `v` unrepeated).
    pub operands: Vec<NodeId>,
    /// The nodes holding the output (the second product and the reshapes on it).
    pub writes: Vec<NodeId>,
    /// The reduce nodes of the products `q kᵀ` and `p v` (below a half output's cast).
    pub products: [NodeId; 2],
    /// The buffers the products read: `q`, `k` (repeated for grouped heads), the
    /// probabilities (after dropout, in the products' dtype), and `v` (repeated).
    pub factors: [NodeId; 4],
    /// The softmax's input: the scaled, masked scores (in `f32` for half products).
    pub scores: NodeId,
    /// The softmax's row max as its shift reads it (detached), `[.., l, 1]`.
    pub row_max: NodeId,
    /// The softmax's row sum, `[.., l, 1]`.
    pub row_sum: NodeId,
    /// Dropout's keep condition (bool, the probabilities' shape) and factor.
    pub keep: Option<(NodeId, Scalar)>,
    /// The mask's buffer.
    pub mask: Option<NodeId>,
}

/// Every attention whose second product is among `matmuls` (what
/// [`find_matmuls`](crate::find_matmuls) found among `order`, a topological order of the
/// realized subgraph), each writing that product's nodes; where its operands are views of
/// wider values (heads split out of a projection) or its output is read with its heads
/// merged back, also one reading and writing those rows in place (see `in_place`) unless
/// it is being differentiated; and the pieces of each one's backward pass that autograd
/// recorded (see `attention_backward.rs`).
pub fn find_attention(
    graph: &Graph,
    order: &[NodeId],
    matmuls: &[VendorMatch],
) -> Vec<VendorMatch> {
    let found = attention_nodes(graph, matmuls);
    let mut matches: Vec<VendorMatch> = found.iter().map(|a| forward(graph, a)).collect();
    let backward = crate::attention_backward::find_backward(graph, matmuls, &found);
    // An attention being differentiated keeps its contiguous operands: the backward pieces
    // read `q`, `k` and `v` contiguous, so their copies are made anyway, and reading them
    // in place in the forward made GPT-2's bf16 training step slower on an H100 (907
    // launches instead of 836, 22.9 ms of them instead of 22.1).
    let trained = |a: &AttentionNodes| {
        backward
            .iter()
            .any(|m| matches!(&m.op, VendorOp::AttentionBackward(b) if b.forward == a.op))
    };
    if found.iter().any(|a| !trained(a)) {
        let views = view_consumers(graph, order);
        matches.extend(
            found
                .iter()
                .filter(|a| !trained(a))
                .filter_map(|a| in_place(graph, a, &views)),
        );
    }
    matches.extend(backward);
    matches
}

/// The match of `a`'s forward: its operands as they are, writing its output's nodes.
pub(crate) fn forward(graph: &Graph, a: &AttentionNodes) -> VendorMatch {
    let mut materialize: Vec<NodeId> = a
        .operands
        .iter()
        .copied()
        .filter(|&o| !matches!(graph.node(o).op, Op::Leaf(_)))
        .collect();
    materialize.push(*a.writes.last().unwrap_or(&a.products[1]));
    VendorMatch {
        op: VendorOp::Attention(a.op.clone()),
        operands: a.operands.clone(),
        writes: a.writes.clone(),
        also_writes: Vec::new(),
        materialize,
    }
}

/// The permutes and reshapes among `order` reading each node.
fn view_consumers(graph: &Graph, order: &[NodeId]) -> FxHashMap<NodeId, Vec<NodeId>> {
    let mut views: FxHashMap<NodeId, Vec<NodeId>> = FxHashMap::default();
    for &n in order {
        if let Op::Permute(inner, _) | Op::Reshape(inner) = graph.node(n).op {
            views.entry(inner).or_default().push(n);
        }
    }
    views
}

/// The attention `a` reading its operands' rows in place ([`AttentionLayout`]) from the
/// values they are views of, and writing its output with the heads merged back (`[outer,
/// l, heads, ev]`, as `transpose(1, 2)` of it is laid out) where a reader of it permutes
/// it so; `None` where an operand is no such view (rank 4, `[outer, heads, rows, e]`,
/// rows contiguous) or nothing differs from `a`'s contiguous match.
fn in_place(
    graph: &Graph,
    a: &AttentionNodes,
    views: &FxHashMap<NodeId, Vec<NodeId>>,
) -> Option<VendorMatch> {
    let op = &a.op;
    let q_dims = graph.node(a.operands[0]).shape.dims();
    let [outer, heads, l, e] = *q_dims else {
        return None;
    };
    if l != op.l || e != op.e || outer * heads != op.batch {
        return None;
    }
    let zero = Dim::constant(0);
    // `[offset, outer, head, row]` of a rank-4 operand over `base`, size-1 axes
    // broadcast.
    let rows_of = |node: NodeId, rows: Dim, width: Dim| -> Option<(NodeId, [Dim; 4])> {
        let dims = graph.node(node).shape.dims();
        if dims.len() != 4 || dims[2] != rows || dims[3] != width {
            return None;
        }
        let view = crate::view::strided_view(graph, node)?;
        let unit = |a: usize| dims[a] == Dim::constant(1);
        if graph.node(view.base).dtype != op.dtype
            || !(unit(3) || view.strides[3] == Dim::constant(1))
        {
            return None;
        }
        let s = |a: usize| if unit(a) { zero } else { view.strides[a] };
        Some((view.base, [view.offset, s(0), s(1), s(2)]))
    };
    let (q, q_rows) = rows_of(a.operands[0], op.l, op.e)?;
    let (k, k_rows) = rows_of(a.operands[1], op.s, op.e)?;
    let (v, v_rows) = rows_of(a.operands[2], op.s, op.ev)?;
    // Grouped heads: `k` and `v` hold `heads / kv_group` of them (or one, broadcast).
    for kv in [a.operands[1], a.operands[2]] {
        let d = graph.node(kv).shape.dims();
        let kv_heads = d[1] * op.kv_group;
        if (d[0] != outer && d[0] != Dim::constant(1))
            || (kv_heads != heads && d[1] != Dim::constant(1))
        {
            return None;
        }
    }
    // The output: merged back where a reader permutes `[outer, heads, l, ev]` to
    // `[outer, l, heads, ev]`, else contiguous.
    let top = *a.writes.last().unwrap_or(&a.products[1]);
    let ev = op.ev;
    let merged = a.writes.iter().find_map(|&w| {
        let dims = graph.node(w).shape.dims();
        if dims != [outer, heads, l, ev] {
            return None;
        }
        views.get(&w)?.iter().copied().find(
            |&p| matches!(&graph.node(p).op, Op::Permute(_, perm) if perm.as_ref() == [0, 2, 1, 3]),
        )
    });
    let (out_rows, writes) = match merged {
        Some(p) => {
            let mut writes = vec![p];
            let mut i = 0;
            while i < writes.len() {
                for &r in views.get(&writes[i]).into_iter().flatten() {
                    if matches!(graph.node(r).op, Op::Reshape(_)) && !writes.contains(&r) {
                        writes.push(r);
                    }
                }
                i += 1;
            }
            ([zero, l * heads * ev, ev, heads * ev], writes)
        }
        None => ([zero, heads * l * ev, l * ev, ev], a.writes.clone()),
    };
    let bases = [q, k, v];
    if bases == [a.operands[0], a.operands[1], a.operands[2]] && merged.is_none() {
        return None;
    }
    let mut materialize: Vec<NodeId> = bases
        .iter()
        .copied()
        .chain(a.operands[3..].iter().copied())
        .filter(|&o| !matches!(graph.node(o).op, Op::Leaf(_)))
        .collect();
    materialize.sort_unstable();
    materialize.dedup();
    materialize.push(*writes.last().unwrap_or(&top));
    let mut in_place = op.clone();
    in_place.layout = Some(Box::new(AttentionLayout {
        heads,
        q: q_rows,
        k: k_rows,
        v: v_rows,
        out: out_rows,
    }));
    Some(VendorMatch {
        op: VendorOp::Attention(in_place),
        operands: bases
            .into_iter()
            .chain(a.operands[3..].iter().copied())
            .collect(),
        writes,
        also_writes: Vec::new(),
        materialize,
    })
}

/// Every attention whose second product is among `matmuls`, as [`AttentionNodes`].
pub fn attention_nodes(graph: &Graph, matmuls: &[VendorMatch]) -> Vec<AttentionNodes> {
    let products = plain_products(matmuls);
    let mut found = Vec::new();
    for m in matmuls {
        let VendorOp::Matmul(pv) = &m.op else {
            continue;
        };
        if !pv.epilogue.is_none() || pv.lhs_transposed || pv.rhs_transposed {
            continue;
        }
        // Dropout of the probabilities, read from the draw's key in the kernel.
        let (probs, dropout, key) = match dropped(graph, m.operands[0]) {
            Some((probs, dropout, key)) => (probs, Some(dropout), Some(key)),
            None => (m.operands[0], None, None),
        };
        let Some(softmax) = softmax_rows(graph, probs, pv.dtype) else {
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
        let [q, k_read, v_read] = [scores.operands[0], scores.operands[1], m.operands[1]];
        // Grouped-query heads repeated for the products are read from the unrepeated
        // buffers, each by its group of query heads.
        let (k, v, kv_group) = match (repeated_heads(graph, k_read), repeated_heads(graph, v_read))
        {
            (Some((k, gk)), Some((v, gv))) if gk == gv => (k, v, gk),
            _ => (k_read, v_read, Dim::constant(1)),
        };
        let mask_node = softmax.mask.as_ref().map(|(node, _)| *node);
        let keep = match (dropout, &graph.node(m.operands[0]).op) {
            (Some(d), Op::Ternary(TernaryOp::Where, keep, ..)) => Some((*keep, d.scale)),
            _ => None,
        };
        // Keys and values shared by every pair fold the pairs into the products' rows (one
        // taller product); the attention still counts query rows within a pair (causality,
        // masks), and `q` is then contiguous.
        let dims = graph.node(softmax.x).shape.dims();
        let l = dims[dims.len() - 2];
        let (batch, q_batch_stride) = if qk.m == l {
            (pv.batch, qk.lhs_batch_stride)
        } else {
            let pairs = dims[..dims.len() - 2]
                .iter()
                .fold(Dim::constant(1), |acc, d| acc * *d);
            (pairs, l * qk.k)
        };
        let reduce_of = |w: NodeId| match graph.node(w).op {
            Op::Cast(inner) => inner,
            _ => w,
        };
        found.push(AttentionNodes {
            op: Attention {
                dtype: pv.dtype,
                batch,
                l,
                s: pv.k,
                e: qk.k,
                ev: pv.n,
                q_batch_stride,
                k_batch_stride: qk.rhs_batch_stride,
                v_batch_stride: pv.rhs_batch_stride,
                kv_group,
                scale: softmax.scale,
                causal: softmax.causal,
                mask: softmax.mask.map(|(_, m)| m),
                dropout,
                layout: None,
            },
            operands: [q, k, v].into_iter().chain(mask_node).chain(key).collect(),
            writes: m.writes.clone(),
            products: [reduce_of(scores.writes[0]), reduce_of(m.writes[0])],
            factors: [q, k_read, m.operands[0], v_read],
            scores: softmax.x,
            row_max: softmax.row_max,
            row_sum: softmax.row_sum,
            keep,
            mask: mask_node,
        });
    }
    found
}

/// Which plain product (no epilogue) among `matmuls` writes each node.
pub(crate) fn plain_products(
    matmuls: &[VendorMatch],
) -> FxHashMap<NodeId, (&Matmul, &VendorMatch)> {
    let mut products = FxHashMap::default();
    for m in matmuls {
        if let VendorOp::Matmul(op) = &m.op
            && op.epilogue.is_none()
        {
            for &w in &m.writes {
                products.insert(w, (op, m));
            }
        }
    }
    products
}

/// `node` as `Tensor::dropout` records it over the probabilities `p`:
/// `where(bits >= threshold, p · scale, 0)` with `bits` one draw's random words at each
/// position of `node`'s own shape: `(p, the dropout, the draw's key)`.
fn dropped(graph: &Graph, node: NodeId) -> Option<(NodeId, AttentionDropout, NodeId)> {
    let Op::Ternary(TernaryOp::Where, keep, scaled, zero) = graph.node(node).op else {
        return None;
    };
    let Op::Binary(BinaryOp::Ge, bits, threshold) = graph.node(keep).op else {
        return None;
    };
    let Op::Random(key, words) = graph.node(bits).op else {
        return None;
    };
    let Op::Binary(BinaryOp::Mul, probs, factor) = graph.node(scaled).op else {
        return None;
    };
    let Some(Scalar::U32(threshold)) = constant(graph, threshold) else {
        return None;
    };
    let same_positions = words == Words::new(4, 1, 0)
        && graph.node(bits).shape.dims() == graph.node(node).shape.dims();
    (same_positions && is_const(graph, zero, 0.0)).then_some(())?;
    let scale = constant(graph, factor)?;
    Some((probs, AttentionDropout { threshold, scale }, key))
}

/// `x` as `repeat_interleave(x0, g, -3)` records it, `expand(reshape(x0))` from
/// `[.., h, s, e]` through `[.., h, 1, s, e]` to `[.., h, g, s, e]`: `(x0, g)`. A product
/// reading the repeat reads `x0`'s matrix `p / g` for pair `p` (the batch stride of one
/// `s × e` matrix is the same).
fn repeated_heads(graph: &Graph, x: NodeId) -> Option<(NodeId, Dim)> {
    let Op::Expand(unit) = graph.node(x).op else {
        return None;
    };
    let Op::Reshape(x0) = graph.node(unit).op else {
        return None;
    };
    let [wide, split, base] = [x, unit, x0].map(|n| graph.node(n).shape.dims().to_vec());
    let rank = base.len();
    if rank < 3 || split.len() != rank + 1 || wide.len() != rank + 1 {
        return None;
    }
    // `split` is `base` with a 1 inserted before its last two axes; `wide` differs from
    // `split` in that axis alone.
    let axis = rank - 2;
    let inserted = split[..axis] == base[..axis]
        && split[axis] == Dim::constant(1)
        && split[axis + 1..] == base[axis..];
    let only_there = (0..=rank).all(|a| a == axis || wide[a] == split[a]);
    (inserted && only_there).then_some((x0, wide[axis]))
}

/// A softmax over the last axis of `scale · scores`, optionally masked causally and by an
/// additive mask.
struct SoftmaxRows {
    /// The node holding the product `q kᵀ` (in the product's dtype).
    scores: NodeId,
    /// The softmax's input, its detached row max and its row sum.
    x: NodeId,
    row_max: NodeId,
    row_sum: NodeId,
    scale: Scalar,
    causal: bool,
    /// The mask's buffer and how it is read.
    mask: Option<(NodeId, AttentionMask)>,
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
    let row_max = expanded(graph, max);
    let mut max = row_max;
    if let Op::Bitcast(inner) = graph.node(max).op
        && graph.node(inner).dtype == graph.node(max).dtype
    {
        max = inner;
    }
    if !is_reduce(graph, max, ReduceOp::Max, x, last) {
        return None;
    }
    // The causal mask or a boolean one, then an additive one, then the scale.
    let shape = graph.node(x).shape.dims();
    let (unmasked, causal, hidden) = match graph.node(x).op {
        Op::Ternary(TernaryOp::Where, hidden, fill, kept)
            if is_const(graph, fill, f64::NEG_INFINITY) =>
        {
            if hides_later_keys(graph, hidden, last) {
                (kept, true, None)
            } else {
                (kept, false, Some(hidden_keys(graph, hidden, shape)?))
            }
        }
        _ => (x, false, None),
    };
    let (scaled, mask) = match graph.node(unmasked).op {
        Op::Binary(BinaryOp::Add, ..) if hidden.is_some() => return None,
        _ if hidden.is_some() => (unmasked, hidden),
        Op::Binary(BinaryOp::Add, a, b) => {
            let shape = graph.node(unmasked).shape.dims();
            match (
                scaled_scores(graph, a, dtype),
                mask_operand(graph, b, shape),
            ) {
                (Some(_), Some(mask)) => (a, Some(mask)),
                _ => (b, Some(mask_operand(graph, a, shape)?)),
            }
        }
        _ => (unmasked, None),
    };
    let (scores, scale) = scaled_scores(graph, scaled, dtype)?;
    Some(SoftmaxRows {
        scores,
        x,
        row_max,
        row_sum: total,
        scale,
        causal,
        mask,
    })
}

/// `scores · scale` (a constant; absent means 1) where `scores` is the product `q kᵀ` in
/// `dtype` (widened to f32 for a half `dtype`): `(scores, scale)`.
fn scaled_scores(graph: &Graph, scaled: NodeId, dtype: DType) -> Option<(NodeId, Scalar)> {
    let (product, scale) = match graph.node(scaled).op {
        Op::Binary(BinaryOp::Mul, a, b) => match (constant(graph, a), constant(graph, b)) {
            (_, Some(c)) => (a, c),
            (Some(c), _) => (b, c),
            _ => return None,
        },
        _ => (scaled, Scalar::one(graph.node(scaled).dtype)),
    };
    let scores = match graph.node(product).op {
        Op::Cast(inner) if dtype != graph.node(product).dtype => {
            (graph.node(inner).dtype == dtype).then_some(inner)?
        }
        _ if graph.node(product).dtype == dtype => product,
        _ => return None,
    };
    Some((scores, scale))
}

/// A boolean mask `hidden` (true hides a key, as `masked_fill(hidden, -inf)` reads it) of
/// the scores' shape, as a buffer read in place: the bool value below one broadcast and
/// reshapes (SDPA's `logical_not` of a mask that marks the keys taking part is that value,
/// materialized).
fn hidden_keys(graph: &Graph, hidden: NodeId, shape: &[Dim]) -> Option<(NodeId, AttentionMask)> {
    let pre = expanded(graph, hidden);
    let mut base = pre;
    while let Op::Reshape(inner) = graph.node(base).op {
        base = inner;
    }
    (graph.node(base).dtype == DType::Bool).then_some(())?;
    read_in_place(graph, base, graph.node(pre).shape.dims(), shape)
}

/// The additive mask `m` (of the scores' shape `[..batch, l, s]`) as a buffer read in
/// place: `m` is a float value below widening casts, reshapes and one broadcast. Casts and
/// reshapes keep row-major order, so the strides of the contiguous buffer below them are
/// those of the shape just below the broadcast, 0 along broadcast axes.
fn mask_operand(graph: &Graph, m: NodeId, shape: &[Dim]) -> Option<(NodeId, AttentionMask)> {
    let widening = |node: NodeId| match graph.node(node).op {
        Op::Cast(inner)
            if graph.node(node).dtype == DType::F32
                && matches!(
                    graph.node(inner).dtype,
                    DType::F32 | DType::F16 | DType::BF16
                ) =>
        {
            Some(inner)
        }
        _ => None,
    };
    let mut top = m;
    while let Some(inner) = widening(top) {
        top = inner;
    }
    let pre = match graph.node(top).op {
        Op::Expand(inner) => inner,
        _ => top,
    };
    let mut base = pre;
    loop {
        base = match graph.node(base).op {
            Op::Reshape(inner) => inner,
            _ => match widening(base) {
                Some(inner) => inner,
                None => break,
            },
        };
    }
    let dtype = graph.node(base).dtype;
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) || graph.node(m).dtype != DType::F32
    {
        return None;
    }
    read_in_place(graph, base, graph.node(pre).shape.dims(), shape)
}

/// The mask `base` (contiguous, of `dims` in row-major order) broadcast to the scores'
/// `shape`: its strides, 0 along broadcast axes, with at most two batch axes after merging
/// those whose strides chain.
fn read_in_place(
    graph: &Graph,
    base: NodeId,
    dims: &[Dim],
    shape: &[Dim],
) -> Option<(NodeId, AttentionMask)> {
    let dtype = graph.node(base).dtype;
    if dims.len() != shape.len() || dims.len() < 2 {
        return None;
    }
    // Row-major strides of `pre`, 0 where it is broadcast (or of size 1).
    let mut strides = vec![Dim::constant(0); dims.len()];
    let mut step = Dim::constant(1);
    for a in (0..dims.len()).rev() {
        if dims[a] != Dim::constant(1) {
            strides[a] = step;
        }
        step *= dims[a];
    }
    let rank = dims.len();
    // Batch axes as (size, stride), merged where one step of the outer axis is a whole
    // run of the inner one.
    let mut batch: Vec<(Dim, Dim)> = Vec::new();
    for a in 0..rank - 2 {
        match batch.last_mut() {
            Some((size, stride)) if *stride == strides[a] * shape[a] => {
                *size *= shape[a];
                *stride = strides[a];
            }
            _ => batch.push((shape[a], strides[a])),
        }
    }
    let zero = Dim::constant(0);
    let (heads, outer, head) = match batch.as_slice() {
        [] => (Dim::constant(1), zero, zero),
        [(_, so)] => (Dim::constant(1), *so, zero),
        [(_, so), (h, sh)] => (*h, *so, *sh),
        _ => return None,
    };
    Some((
        base,
        AttentionMask {
            dtype,
            heads,
            strides: [outer, head, strides[rank - 2], strides[rank - 1]],
        },
    ))
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
