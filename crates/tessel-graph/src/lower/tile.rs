//! Tiling through local memory: an elementwise kernel whose output's last axis walks one
//! of its inputs with a large stride (a transpose) reads that input through a tile.
//!
//! One workgroup of `edge²` invocations covers an `edge × edge` tile of the output's axes
//! `k` and last, where `k` is the axis along which the input is contiguous. First every
//! invocation loads one element of the tile *along `k`* (neighbouring invocations read
//! neighbouring elements: coalesced) into local memory; after a barrier each computes the
//! output element at the transposed position, reading its input element from the tile,
//! so neighbouring invocations also write neighbouring outputs. The tile's rows are one
//! element longer than its edge, so the column-wise writes into it hit distinct banks.

use tessel_ir::{Access, KernelBuilder};
use tessel_shape::{Dim, Expr, Var};

use super::{Lowerer, Lowering, coordinate, index_dtype, kernel_name, loop_var};
use crate::graph::Graph;
use crate::kernelize::{KernelizeError, Slot};
use crate::spec::KernelSpec;
use crate::tune::Recipe;

/// Lowers the kernel `recipe` describes (its `spec`) with `edge × edge` tiles; the caller
/// has checked the spec admits them ([`KernelSpec::check`]).
pub(crate) fn lower_tiled_kernel(
    graph: &Graph,
    recipe: &Recipe,
    spec: &KernelSpec,
    edge: i64,
) -> Result<Lowering, KernelizeError> {
    let Some((staged, k)) = spec.transposed_read() else {
        return Err(KernelizeError("tiling: no transposed read".into()));
    };
    let staged = staged.clone();
    let Some(staged_index) = staged.index else {
        return Err(KernelizeError(
            "tiling: the transposed read has no index".into(),
        ));
    };
    let dims: Vec<i64> = spec
        .space
        .iter()
        .map(|&(_, d)| d.as_const().unwrap_or(0))
        .collect();
    let last = dims.len() - 1;
    let root = recipe.root;
    let node = graph.node(root);
    let tiles_last = (dims[last] + edge - 1) / edge;
    let tiles_k = (dims[k] + edge - 1) / edge;
    let others: Vec<usize> = (0..dims.len()).filter(|&a| a != k && a != last).collect();
    let rest: i64 = others.iter().map(|&a| dims[a]).product();
    let groups = tiles_last * tiles_k * rest;
    let idx = index_dtype(graph, root, &recipe.materialized);

    let mut kb = KernelBuilder::new(&kernel_name(
        graph,
        root,
        &recipe.materialized,
        &recipe.absorbable,
    ));
    let invocations = edge * edge;
    kb.grid([groups, 1, 1], [invocations, 1, 1]);
    let (group_var, lane_var) = (
        loop_var("tg", Dim::constant(groups)),
        loop_var("tl", Dim::constant(invocations)),
    );
    let group = kb.group_id(0, idx);
    kb.bind(group_var, group, idx);
    let lane = kb.local_id(0, idx);
    kb.bind(lane_var, lane, idx);
    let (g, l) = (Expr::from(group_var), Expr::from(lane_var));
    let (lx, ly) = (l % edge, l / edge);
    let tile_last = g % tiles_last;
    let tile_k = (g / tiles_last) % tiles_k;
    let p = g / (tiles_last * tiles_k);
    // Coordinates with `along_k` at offset `a` of the tile along `k` and `b` along the last.
    let coords = |a: Expr, b: Expr| -> Vec<Expr> {
        let mut c = vec![Expr::constant(0); dims.len()];
        let mut stride = 1;
        for &axis in others.iter().rev() {
            c[axis] = coordinate(p, Expr::constant(stride), Dim::constant(dims[axis]));
            stride *= dims[axis];
        }
        c[k] = tile_k * edge + a;
        c[last] = tile_last * edge + b;
        c
    };
    // Where the grid over-covers an axis, one comparison each: the verifier narrows the
    // coordinate under a plain comparison, which proves the accesses in bounds.
    let inside = |c: &[Expr]| -> Vec<Expr> {
        [k, last]
            .into_iter()
            .filter(|&axis| dims[axis] % edge != 0)
            .map(|axis| c[axis].cmp_lt(dims[axis]))
            .collect()
    };
    let substitute = |c: &[Expr]| -> Vec<(Var, Expr)> {
        spec.space
            .iter()
            .zip(c)
            .map(|(&(v, _), &e)| (v, e))
            .collect()
    };

    // Stage: invocation (lx, ly) loads the element at (k: lx, last: ly) of the tile.
    let staged_dtype = staged.dtype;
    let staged_len = staged.len;
    let width = edge + 1;
    let tile = kb.local(staged_dtype, (edge * width) as usize);
    let stage = coords(lx, ly);
    let mut lw = Lowerer::new(
        graph,
        kb,
        idx,
        root,
        (Vec::new(), group),
        &recipe.materialized,
        &recipe.leaf_slot,
    );
    // Parameters in the order the untiled kernel binds them: its output, then its reads
    // as its body first reaches them (the spec's order).
    let out_buf = lw.param(
        Slot::Node(root),
        node.dtype,
        node.shape.numel(),
        Access::Write,
    );
    for a in &spec.accesses {
        lw.param(a.slot.clone(), a.dtype, a.len, Access::Read);
    }
    let buf = lw.param(staged.slot.clone(), staged_dtype, staged_len, Access::Read);
    let mut open = Vec::new();
    for ok in inside(&stage) {
        let c = lw.cond(ok);
        open.push(lw.open_if(c));
    }
    let at = staged_index
        .substitute(&substitute(&stage))
        .max(0)
        .min(staged_len - 1);
    let at = lw.ix(at);
    let v = lw.kb.load(buf, at);
    let slot_at = lw.ix(lx * width + ly);
    lw.kb.store(tile, slot_at, v);
    for open in open.into_iter().rev() {
        lw.close_if(open);
    }
    lw.kb.barrier();

    // Compute: invocation (lx, ly) writes the output at (k: ly, last: lx), whose staged
    // element invocation (ly, lx) loaded.
    let out = coords(ly, lx);
    let mut open = Vec::new();
    for ok in inside(&out) {
        let c = lw.cond(ok);
        open.push(lw.open_if(c));
    }
    let mut root_coords = Vec::with_capacity(dims.len());
    for (&(var, _), &e) in spec.space.iter().zip(&out) {
        let value = lw.ix(e);
        lw.kb.bind(var, value, idx);
        root_coords.push(Expr::from(var));
    }
    let read_at = lw.ix(ly * width + lx);
    let value = lw.kb.load(tile, read_at);
    lw.staged = Some((staged.slot.clone(), staged_index, value));
    let strides = node.shape.contiguous_strides();
    let flat: Expr = root_coords.iter().zip(strides).map(|(&c, s)| c * s).sum();
    let out_index = lw.ix(flat);
    lw.root_coords.clone_from(&root_coords);
    lw.out_index = out_index;
    let result = lw.eval_node(root, &root_coords, true)?;
    lw.kb.store(out_buf, out_index, result);
    for open in open.into_iter().rev() {
        lw.close_if(open);
    }
    lw.finish(false)
}
