//! Vendor patterns: values of the graph that a library routine can compute.
//!
//! `Tensor::matmul` records `sum(expand(a) * expand(b))` over an iteration space
//! `[..batch, m, k, n]`, reducing `k`. [`find_matmuls`] recognizes that shape in the graph
//! and describes it as a [`VendorOp::Matmul`] over buffers: each operand is a leaf read
//! as it is stored (row-major, or transposed when it is a `permute` swapping the last two
//! axes of a leaf or of a node materialized for it), or a node that must be materialized
//! first. The match is an
//! *alternative*: the runtime asks each backend for the routine, and the generated kernel
//! stays a candidate; measurement decides. Elementwise work above a product that the
//! routine can do before storing it (a bias, `relu`, GELU) is matched too, as a further
//! alternative (see `epilogue.rs`).

use tessel_ir::{Matmul, VendorOp};
use tessel_shape::{DType, Dim, Shape};

use crate::consumers::Consumers;
use crate::epilogue::epilogues;
use crate::graph::{Graph, NodeId, Op, ReduceOp};

/// A library routine found in the graph: a matrix product, an attention or a piece of an
/// attention's backward pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VendorMatch {
    /// The routine.
    pub op: VendorOp,
    /// The nodes whose contiguous buffers the routine reads: `[lhs, rhs]`, then the bias
    /// where its [`Epilogue`](tessel_ir::Epilogue) adds one.
    pub operands: Vec<NodeId>,
    /// The nodes the routine can write, each holding the product's bytes in row-major
    /// order: the reduction itself and the reshapes stacked on it.
    pub writes: Vec<NodeId>,
    /// The further results of a routine with several (bound after the first, in order),
    /// one node each; empty for most.
    pub also_writes: Vec<NodeId>,
    /// Nodes to materialize so the routine can run: the non-leaf operands, and the
    /// topmost of `writes` (so a fused consumer reads the product instead of absorbing it)
    /// and `also_writes`.
    pub materialize: Vec<NodeId>,
}

/// Every matrix product among `order` (a topological order of the realized subgraph).
pub fn find_matmuls(graph: &Graph, order: &[NodeId]) -> Vec<VendorMatch> {
    matmuls_in(graph, order, true)
}

/// [`find_matmuls`] without the products' epilogues: all that
/// [`attention_nodes`](crate::attention_nodes) reads, for less work (autograd looks for
/// attentions on every `grad`).
pub fn find_plain_matmuls(graph: &Graph, order: &[NodeId]) -> Vec<VendorMatch> {
    matmuls_in(graph, order, false)
}

fn matmuls_in(graph: &Graph, order: &[NodeId], with_epilogues: bool) -> Vec<VendorMatch> {
    let consumers = Consumers::of(graph, order);
    let mut found = Vec::new();
    for &n in order {
        if let Some(plain) = match_matmul(graph, n, &consumers) {
            if with_epilogues {
                found.extend(epilogues(graph, &plain, &consumers));
            }
            found.push(plain);
        }
    }
    found
}

/// Every node some match needs materialized, sorted and without repeats: the `separate`
/// argument of [`kernelize_with`](crate::kernelize_with) and
/// [`kernelize_rows`](crate::kernelize_rows) for the partition library routines run in.
pub fn materialized_for(matches: &[VendorMatch]) -> Vec<NodeId> {
    let mut nodes: Vec<NodeId> = matches
        .iter()
        .flat_map(|m| m.materialize.iter().copied())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

fn match_matmul(graph: &Graph, reduce: NodeId, consumers: &Consumers) -> Option<VendorMatch> {
    let node = graph.node(reduce);
    let Op::Reduce(ReduceOp::Sum, product, axes) = &node.op else {
        return None;
    };
    let space = graph.node(*product).shape.dims().to_vec();
    let rank = space.len().checked_sub(3)?;
    if axes.as_ref() != [rank + 1] || !node.dtype.is_float() {
        return None;
    }
    let Op::Binary(tessel_shape::BinaryOp::Mul, x, y) = graph.node(*product).op else {
        return None;
    };
    let (batch, m, k, n) = (
        &space[..rank],
        space[rank],
        space[rank + 1],
        space[rank + 2],
    );
    // lhs varies over (batch, m, k) and is broadcast along n; rhs over (batch, k, n).
    let factors = |widened_from: Option<DType>| {
        Some((
            operand(
                graph,
                x,
                rank,
                [rank, rank + 1],
                rank + 2,
                batch,
                widened_from,
            )?,
            operand(
                graph,
                y,
                rank,
                [rank + 1, rank + 2],
                rank,
                batch,
                widened_from,
            )?,
        ))
    };
    // A half-precision product is recorded in `f32` between casts, `cast(sum(cast(a) ·
    // cast(b)))`: each product of two halves is exact in `f32`, and the sum runs in `f32` and
    // is rounded once, which is what a half GEMM with `f32` accumulation computes. Matched
    // as that GEMM, it reads the half operands and writes the narrowed value, so no `f32`
    // copy of either operand or of the product is made.
    if let Some((narrowed, half)) = narrowed_output(graph, reduce, consumers)
        && let Some((lhs, rhs)) = factors(Some(half))
    {
        return Some(routine(
            graph,
            half,
            narrowed,
            [lhs, rhs],
            batch,
            [m, k, n],
            consumers,
        ));
    }
    let (lhs, rhs) = factors(None)?;
    Some(routine(
        graph,
        node.dtype,
        reduce,
        [lhs, rhs],
        batch,
        [m, k, n],
        consumers,
    ))
}

/// The cast of `reduce` (an `f32` sum) to `f16` or `bf16` when that is its only consumer,
/// with the half dtype.
fn narrowed_output(
    graph: &Graph,
    reduce: NodeId,
    consumers: &Consumers,
) -> Option<(NodeId, DType)> {
    if graph.node(reduce).dtype != DType::F32 {
        return None;
    }
    let &[cast] = consumers.get(reduce) else {
        return None;
    };
    let node = graph.node(cast);
    (matches!(node.op, Op::Cast(_)) && matches!(node.dtype, DType::F16 | DType::BF16))
        .then_some((cast, node.dtype))
}

/// The match of a product in `dtype` whose row-major bytes `product` holds, from its two
/// factors and its `[batch, [m, k, n]]` sizes.
fn routine(
    graph: &Graph,
    dtype: DType,
    product: NodeId,
    [lhs, rhs]: [Operand; 2],
    batch: &[Dim],
    [m, k, n]: [Dim; 3],
    consumers: &Consumers,
) -> VendorMatch {
    let batch_len = batch.iter().fold(Dim::constant(1), |acc, d| acc * *d);
    // The product's bytes are also every pure reshape stacked on it.
    let writes = with_reshapes(graph, product, consumers);
    let top = *writes.last().unwrap_or(&product);
    let mut materialize: Vec<NodeId> = [lhs.node, rhs.node]
        .into_iter()
        .filter(|&o| !matches!(graph.node(o).op, Op::Leaf(_)))
        .collect();
    materialize.push(top);
    // A row-major lhs batch times one shared rhs is one taller product: its rows are
    // contiguous across the batch, and so are the output's (a linear layer over
    // [batch, seq, in]). One large GEMM runs faster than a batch of small ones.
    let fold = lhs.batched && !lhs.transposed && !rhs.batched;
    let (batch_len, m) = if fold {
        (Dim::constant(1), batch_len * m)
    } else {
        (batch_len, m)
    };
    VendorMatch {
        op: VendorOp::Matmul(Matmul {
            dtype,
            batch: batch_len,
            m,
            n,
            k,
            lhs_transposed: lhs.transposed,
            rhs_transposed: rhs.transposed,
            lhs_batch_stride: if lhs.batched && !fold {
                m * k
            } else {
                Dim::constant(0)
            },
            rhs_batch_stride: if rhs.batched { k * n } else { Dim::constant(0) },
            allow_tf32: false,
            epilogue: tessel_ir::Epilogue::NONE,
        }),
        operands: vec![lhs.node, rhs.node],
        writes,
        also_writes: Vec::new(),
        materialize,
    }
}

/// `node` and the chain of reshapes stacked on it (each its producer's only consumer), in
/// order: the nodes holding `node`'s bytes in row-major order.
pub(crate) fn with_reshapes(graph: &Graph, node: NodeId, consumers: &Consumers) -> Vec<NodeId> {
    let mut nodes = vec![node];
    let mut top = node;
    while let [parent] = consumers.get(top)
        && matches!(graph.node(*parent).op, Op::Reshape(_))
    {
        nodes.push(*parent);
        top = *parent;
    }
    nodes
}

/// How the routine reads one operand.
struct Operand {
    /// The node whose contiguous buffer holds it.
    node: NodeId,
    /// Stored as the transpose of the matrix the product needs.
    transposed: bool,
    /// One matrix per batch (else one matrix broadcast to every batch).
    batched: bool,
}

/// Resolves the factor `x` of the product: `x` is `expand(v)` (or `v` itself where
/// nothing is broadcast) with `v` of shape `[..batch or 1s, rows/cols, 1 at unit_axis]`.
/// With `widened_from`, the factor must be a cast from that dtype (below or among its
/// views), and the operand is the value before the cast.
fn operand(
    graph: &Graph,
    x: NodeId,
    rank: usize,
    matrix_axes: [usize; 2],
    unit_axis: usize,
    batch: &[Dim],
    widened_from: Option<DType>,
) -> Option<Operand> {
    let v = match graph.node(x).op {
        Op::Expand(v) => v,
        _ => x,
    };
    let shape = &graph.node(v).shape;
    if shape.ndim() != rank + 3 || shape[unit_axis] != Dim::constant(1) {
        return None;
    }
    let own_batch = &shape.dims()[..rank];
    let batched = if own_batch == batch {
        true
    } else if own_batch.iter().all(|d| *d == Dim::constant(1)) {
        false
    } else {
        // Broadcast along some batch axes only: no single stride describes it.
        return None;
    };
    let rows_cols = [shape[matrix_axes[0]], shape[matrix_axes[1]]];

    // Reshapes, and permutes that only move size-1 axes, keep row-major order: they never
    // change which bytes are read. One permute swapping the matrix's two axes is a
    // transpose, a flag of the routine: it reads the transposed value's buffer, a leaf's or
    // one materialized for it (`q @ k.t()` never copies `k` into a transpose).
    let logical = non_unit(shape);
    let is_matrix = logical.ends_with(&rows_cols);
    let mut base = v;
    let mut transposed = false;
    let mut widened = false;
    loop {
        match &graph.node(base).op {
            Op::Reshape(inner) => base = *inner,
            Op::Cast(inner) if !widened && widened_from == Some(graph.node(*inner).dtype) => {
                widened = true;
                base = *inner;
            }
            Op::Permute(inner, perm) => match layout(&graph.node(*inner).shape, perm) {
                Some(Layout::Same) => base = *inner,
                Some(Layout::Swapped)
                    if !transposed && is_matrix && non_unit(&graph.node(base).shape) == logical =>
                {
                    transposed = true;
                    base = *inner;
                }
                _ => break,
            },
            _ => break,
        }
    }
    if widened_from.is_some() && !widened {
        return None;
    }
    // A leaf is read in place; anything else (a cast, an elementwise op, another view) is
    // materialized contiguously, as the value the routine reads.
    Some(Operand {
        node: base,
        transposed,
        batched,
    })
}

/// How a permute orders its operand's elements, size-1 axes (which carry no stride)
/// ignored.
enum Layout {
    /// In the operand's order: a reshape.
    Same,
    /// In the operand's order but for its last two axes, exchanged: a transpose.
    Swapped,
}

/// The layout of `permute(x, perm)` for `x` of shape `shape`, if it is one of [`Layout`].
fn layout(shape: &Shape, perm: &[usize]) -> Option<Layout> {
    let mut order: Vec<usize> = perm
        .iter()
        .copied()
        .filter(|&a| shape.get(a) != Some(&Dim::constant(1)))
        .collect();
    let sorted = |o: &[usize]| o.windows(2).all(|w| w[0] < w[1]);
    if sorted(&order) {
        return Some(Layout::Same);
    }
    let n = order.len();
    order.swap(n - 2, n - 1);
    sorted(&order).then_some(Layout::Swapped)
}

/// The dims of `shape` other than constant 1s, in order.
fn non_unit(shape: &Shape) -> Vec<Dim> {
    shape
        .iter()
        .copied()
        .filter(|d| *d != Dim::constant(1))
        .collect()
}

/// Whether `perm` exchanges the last two axes and keeps the others.
pub(crate) fn swaps_last_two(perm: &[usize]) -> bool {
    let n = perm.len();
    n >= 2
        && perm[..n - 2].iter().enumerate().all(|(i, &p)| i == p)
        && perm[n - 2] == n - 1
        && perm[n - 1] == n - 2
}
