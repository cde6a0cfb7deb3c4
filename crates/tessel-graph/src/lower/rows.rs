//! Row kernels ([`Mode::Rows`](super::Mode::Rows)): one workgroup per row of the output,
//! the row's statistics computed cooperatively once, then the row.

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_ir::{Access, KernelBuilder};
use tessel_shape::{Dim, Expr, Shape};

use super::{
    Lowerer, Lowering, UNROLLED_STEPS_MAX, coordinate, index_dtype, kernel_name, loop_var,
};
use crate::graph::{Graph, LeafId, NodeId};
use crate::kernelize::{KernelizeError, ScheduledKernel, Slot};

/// Lowers `root` as a row kernel (see [`Mode::Rows`]) with workgroups of `lanes`; `None`
/// when it reads no row statistics (a matrix product's reduction runs along the row):
/// then it is lowered like any other kernel.
pub(super) fn lower_row_kernel(
    graph: &Graph,
    root: NodeId,
    materialized: &FxHashSet<NodeId>,
    leaf_slot: &FxHashMap<LeafId, usize>,
    lanes: i64,
) -> Result<Option<Lowering>, KernelizeError> {
    let node = graph.node(root);
    let shape = node.shape.clone();
    let Some((&len, outer_dims)) = shape.dims().split_last() else {
        return Ok(None);
    };
    let outer_shape = Shape::new(outer_dims.to_vec());
    let rows = outer_shape.numel();
    let idx = index_dtype(graph, root, materialized);
    let mut kb = KernelBuilder::new(&format!(
        "{}_row",
        kernel_name(graph, root, materialized, &FxHashSet::default())
    ));
    kb.grid([rows, Dim::constant(1), Dim::constant(1)], [lanes, 1, 1]);
    let group = kb.group_id(0, idx);
    let lane = kb.local_id(0, idx);
    let row_var = loop_var("gid", rows);
    kb.bind(row_var, group, idx);
    let col_var = loop_var("col", len);
    let row = Expr::from(row_var);
    let mut coords: Vec<Expr> = outer_shape
        .iter()
        .zip(&outer_shape.contiguous_strides())
        .map(|(&d, &s)| coordinate(row, s, d))
        .collect();
    coords.push(Expr::from(col_var));
    let mut lw = Lowerer::new(
        graph,
        kb,
        idx,
        root,
        (coords.clone(), group),
        materialized,
        leaf_slot,
    );
    lw.lanes = Some((lanes, lane));
    let out = lw.param(Slot::Node(root), node.dtype, shape.numel(), Access::Write);
    // The row's statistics first, by the whole workgroup; every invocation gets them.
    let mut stats = Vec::new();
    lw.invariant_reductions(root, &coords, col_var, &mut stats, true);
    if stats.is_empty() {
        return Ok(None);
    }
    for (n, c) in stats {
        lw.eval_node(n, &c, false)?;
    }
    // Then the row: invocation `lane` computes elements lane, lane + lanes, ...; a few
    // per invocation are unrolled, reusing the values the statistics computed.
    if let Some(n) = len.as_const()
        && n % lanes == 0
        && n / lanes <= UNROLLED_STEPS_MAX
    {
        lw.in_row_loop = true;
        for element in lw.lane_coordinates(lanes, lane, n / lanes) {
            let coords: Vec<Expr> = coords
                .iter()
                .map(|e| e.substitute(&[(col_var, element)]))
                .collect();
            let value = lw.eval_node(root, &coords, true)?;
            let at = lw.ix(row * len + element);
            lw.kb.store(out, at, value);
        }
        return lw.finish_row(root);
    }
    let start = lw.kb.constant_as(0, idx);
    let end = lw.ix(len.ceil_div(lanes));
    let r = lw.kb.begin_range(start, end);
    lw.memo.push(FxHashMap::default());
    lw.depth += 1;
    lw.in_row_loop = true;
    let lanes_v = lw.kb.constant_as(lanes, idx);
    let element = lw
        .kb
        .ternary(tessel_shape::TernaryOp::MulAdd, r, lanes_v, lane);
    let guard = if len.as_const().is_some_and(|n| n % lanes == 0) {
        None
    } else {
        let n = lw.ix(len);
        let inside = lw.kb.lt(element, n);
        Some(lw.kb.begin_if(inside))
    };
    lw.kb.bind(col_var, element, idx);
    let value = lw.eval_node(root, &coords, true)?;
    let at = lw.ix(row * len + Expr::from(col_var));
    lw.kb.store(out, at, value);
    if let Some(open) = guard {
        lw.kb.end_if(open);
    }
    lw.memo.pop();
    lw.depth -= 1;
    lw.kb.end_range(r);
    lw.finish_row(root)
}

impl Lowerer<'_> {
    /// The row kernel of `root` built: `Unsuitable` where a reduction depends on the
    /// position along the row.
    fn finish_row(self, root: NodeId) -> Result<Option<Lowering>, KernelizeError> {
        if self.row_loop_reductions > 0 {
            return Ok(Some(Lowering::Unsuitable(
                root,
                format!(
                    "{root:?}: {} reduction(s) depend on the position along the row",
                    self.row_loop_reductions
                ),
            )));
        }
        let Lowerer { kb, args, .. } = self;
        let kernel = kb.build_with_listing().map_err(|e| {
            KernelizeError(format!("generated row kernel failed verification: {e}"))
        })?;
        let kernel = tessel_ir::passes::optimize(&kernel);
        tracing::debug!(target: "tessel::kernels", "row kernel for {root:?}:\n{kernel}");
        Ok(Some(Lowering::Done(Box::new(ScheduledKernel {
            kernel,
            args,
            writes: vec![root],
            cooperative: true,
            recipe: None,
        }))))
    }
}
