//! The argsort kernel ([`Op::Argsort`]): one workgroup sorts one row in local memory.
//!
//! The row's keys are loaded (their expression fused in) into a local array padded to a
//! power of two `p` with the largest key, each with its position in a second local array;
//! a bitonic network of `log2(p)·(log2(p) + 1) / 2` compare-exchange stages, separated by
//! barriers, sorts the pairs by (key, position), which makes the order total and the sort
//! stable; the positions of the row's first `n` pairs are written out. Every invocation
//! handles `p / (2·lanes)` pairs per stage, so the network's shape is fixed by `p` alone.

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_ir::{Access, KernelBuilder};
use tessel_shape::{BinaryOp, DType, Dim, Expr, Scalar, Shape};

use super::{Lowerer, Lowering, coordinate, index_dtype, kernel_name, loop_var};
use crate::graph::{ARGSORT_ROW_MAX, Graph, LeafId, NodeId};
use crate::kernelize::{KernelizeError, ScheduledKernel, Slot};

/// Invocations of a sorting workgroup at most (every backend's minimum limit).
const SORT_LANES: i64 = 256;

/// Lowers the argsort `root` of `keys` (see [`Op::Argsort`](crate::Op::Argsort)).
pub(super) fn lower_argsort_kernel(
    graph: &Graph,
    root: NodeId,
    keys: NodeId,
    materialized: &FxHashSet<NodeId>,
    leaf_slot: &FxHashMap<LeafId, usize>,
) -> Result<Lowering, KernelizeError> {
    let node = graph.node(root);
    let shape = node.shape.clone();
    let key_dtype = graph.node(keys).dtype;
    let Some((&len, outer_dims)) = shape.dims().split_last() else {
        return Err(KernelizeError(format!(
            "{root:?}: an argsort of a 0-d tensor"
        )));
    };
    let n = match len.as_const() {
        Some(n) if (1..=ARGSORT_ROW_MAX as i64).contains(&n) => n,
        _ => {
            return Err(KernelizeError(format!(
                "{root:?}: an argsort of rows of {len} elements (1 to {ARGSORT_ROW_MAX})"
            )));
        }
    };
    let p = (n as u64).next_power_of_two().max(2) as i64;
    let lanes = (p / 2).min(SORT_LANES);
    let outer_shape = Shape::new(outer_dims.to_vec());
    let rows = outer_shape.numel();
    let idx = index_dtype(graph, root, materialized);
    let mut kb = KernelBuilder::new(&format!(
        "{}_sort",
        kernel_name(graph, root, materialized, &FxHashSet::default())
    ));
    kb.grid([rows, Dim::constant(1), Dim::constant(1)], [lanes, 1, 1]);
    let group = kb.group_id(0, idx);
    let lane = kb.local_id(0, idx);
    let row_var = loop_var("gid", rows);
    kb.bind(row_var, group, idx);
    let lane_var = loop_var("lane", Dim::constant(lanes));
    kb.bind(lane_var, lane, idx);
    let row = Expr::from(row_var);
    let outer: Vec<Expr> = outer_shape
        .iter()
        .zip(&outer_shape.contiguous_strides())
        .map(|(&d, &s)| coordinate(row, s, d))
        .collect();
    let mut lw = Lowerer::new(
        graph,
        kb,
        idx,
        root,
        (outer.clone(), group),
        materialized,
        leaf_slot,
    );
    let out = lw.param(Slot::Node(root), node.dtype, shape.numel(), Access::Write);
    let key_mem = lw.kb.local(key_dtype, p as usize);
    let pos_mem = lw.kb.local(DType::I32, p as usize);
    let largest = match key_dtype {
        DType::U64 => Scalar::U64(u64::MAX),
        _ => Scalar::U32(u32::MAX),
    };
    let top = lw.kb.constant(largest);
    let n_v = lw.kb.constant_as(n, idx);
    // Each invocation loads elements lane, lane + lanes, ...; past the row, the largest key
    // (its position, above every real one, sorts it last).
    let element = |c: i64| Expr::from(lane_var) + c * lanes;
    for c in 0..p / lanes {
        let mut coords = outer.clone();
        coords.push(element(c).min(n - 1));
        let key = lw.eval_node(keys, &coords, false)?;
        let e = lw.ix(element(c));
        let inside = lw.kb.lt(e, n_v);
        let key = lw.kb.select(inside, key, top);
        lw.kb.store(key_mem, e, key);
        let position = lw.kb.cast(e, DType::I32);
        lw.kb.store(pos_mem, e, position);
    }
    lw.kb.barrier();
    let mut k = 2;
    while k <= p {
        let mut j = k / 2;
        while j >= 1 {
            for c in 0..p / 2 / lanes {
                // Pair `t` compares element `i` with `i + j`; ascending where bit `k` of `i`
                // is clear.
                let t = element(c);
                let i = (t / j) * (2 * j) + t % j;
                let (first, second) = (lw.ix(i), lw.ix(i + j));
                let up = lw.cond((i / k % 2).cmp_eq(0));
                let (a, b) = (lw.kb.load(key_mem, first), lw.kb.load(key_mem, second));
                let (pa, pb) = (lw.kb.load(pos_mem, first), lw.kb.load(pos_mem, second));
                let less = lw.kb.lt(a, b);
                let equal = lw.kb.binary(BinaryOp::Eq, a, b);
                let earlier = lw.kb.lt(pa, pb);
                let tie = lw.kb.binary(BinaryOp::And, equal, earlier);
                let a_first = lw.kb.binary(BinaryOp::Or, less, tie);
                let swap = lw.kb.binary(BinaryOp::Ne, a_first, up);
                let (lo, hi) = (lw.kb.select(swap, b, a), lw.kb.select(swap, a, b));
                lw.kb.store(key_mem, first, lo);
                lw.kb.store(key_mem, second, hi);
                let (lo, hi) = (lw.kb.select(swap, pb, pa), lw.kb.select(swap, pa, pb));
                lw.kb.store(pos_mem, first, lo);
                lw.kb.store(pos_mem, second, hi);
            }
            lw.kb.barrier();
            j /= 2;
        }
        k *= 2;
    }
    for c in 0..p / lanes {
        let e = lw.ix(element(c));
        let guard = (p > n).then(|| {
            let inside = lw.kb.lt(e, n_v);
            lw.kb.begin_if(inside)
        });
        let position = lw.kb.load(pos_mem, e);
        let position = lw.kb.cast(position, node.dtype);
        // The clamp is the identity under the guard; it shows the store is in bounds.
        let at = lw.ix(row * n + element(c).min(n - 1));
        lw.kb.store(out, at, position);
        if let Some(open) = guard {
            lw.kb.end_if(open);
        }
    }
    let Lowerer { kb, args, .. } = lw;
    let kernel = kb
        .build_with_listing()
        .map_err(|e| KernelizeError(format!("generated sort kernel failed verification: {e}")))?;
    let kernel = tessel_ir::passes::optimize(&kernel);
    tracing::debug!(target: "tessel::kernels", "sort kernel for {root:?}:\n{kernel}");
    Ok(Lowering::Done(Box::new(ScheduledKernel {
        kernel,
        args,
        writes: vec![root],
        // The only form of the sort, on every device (a CPU runs the invocations in turn).
        cooperative: false,
        recipe: None,
    })))
}
