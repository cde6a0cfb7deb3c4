//! The scatter kernel ([`Op::Scatter`](crate::Op::Scatter)): one invocation per source
//! element, combining it atomically into the result.

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_ir::{Access, AtomicOp, KernelBuilder};
use tessel_shape::{Dim, Expr};

use super::{LOCAL_SIZE, Lowerer, Lowering, coordinate, index_dtype, kernel_name, loop_var};
use crate::graph::{Graph, LeafId, NodeId};
use crate::kernelize::{KernelizeError, ScheduledKernel, Slot};

/// Lowers the scatter `root` (see [`Op::Scatter`]): one invocation per source element,
/// each combining its value atomically into the root's buffer, which the launch zeroes
/// first ([`Access::Accumulate`]). The index and the source fuse into it; an index
/// out of range adds nothing.
pub(super) fn lower_scatter_kernel(
    graph: &Graph,
    root: NodeId,
    (op, index, src, axis): (AtomicOp, NodeId, NodeId, usize),
    materialized: &FxHashSet<NodeId>,
    leaf_slot: &FxHashMap<LeafId, usize>,
) -> Result<Lowering, KernelizeError> {
    let node = graph.node(root);
    let space = graph.node(index).shape.clone();
    let numel = space.numel();
    let idx = index_dtype(graph, root, materialized);
    let name = kernel_name(graph, root, materialized, &FxHashSet::default());
    let mut kb = KernelBuilder::new(&format!("s{}", &name[1..]));
    let local = match numel.as_const() {
        Some(n) if n < LOCAL_SIZE => n.max(1),
        _ => LOCAL_SIZE,
    };
    kb.grid(
        [numel.ceil_div(local), Dim::constant(1), Dim::constant(1)],
        [local, 1, 1],
    );
    let gid_value = kb.global_id(0, idx);
    let gid_var = loop_var("gid", numel);
    kb.bind(gid_var, gid_value, idx);
    let gid = Expr::from(gid_var);
    let coords: Vec<Expr> = space
        .iter()
        .zip(&space.contiguous_strides())
        .map(|(&d, &s)| coordinate(gid, s, d))
        .collect();
    let mut lw = Lowerer::new(
        graph,
        kb,
        idx,
        root,
        (coords.clone(), gid_value),
        materialized,
        leaf_slot,
    );
    let out_len = node.shape.numel();
    let out = lw.param(Slot::Node(root), node.dtype, out_len, Access::Accumulate);
    let n = node.shape[axis];
    if numel.as_const() != Some(0) && n.as_const() != Some(0) {
        let exact = numel.as_const().is_some_and(|c| c % local == 0);
        let guard = if exact {
            None
        } else {
            let total = lw.kb.expr(numel, idx);
            let ok = lw.kb.lt(gid_value, total);
            Some(lw.open_if(ok))
        };
        let at = lw.eval_node(index, &coords, false)?;
        let value = lw.eval_node(src, &coords, false)?;
        // The clamp is the identity under the condition; it shows every add lands in the
        // buffer.
        let (inside, at) = lw.index_into(at, graph.node(index).dtype, n);
        let open = lw.open_if(inside);
        // Numbered after the gathers the index and source bound, so that each variable
        // names one coordinate in the kernel.
        let var = loop_var(&format!("g{}", lw.n_gathers), n);
        lw.n_gathers += 1;
        lw.kb.bind(var, at, idx);
        let mut target = coords.clone();
        target[axis] = Expr::from(var);
        let flat: Expr = target
            .iter()
            .zip(node.shape.contiguous_strides())
            .map(|(&c, s)| c * s)
            .sum();
        let flat = lw.ix(flat.max(0).min(out_len - 1));
        lw.kb.atomic(op, out, flat, value);
        lw.close_if(open);
        if let Some(open) = guard {
            lw.close_if(open);
        }
    }
    let Lowerer { kb, args, .. } = lw;
    let kernel = kb.build_with_listing().map_err(|e| {
        KernelizeError(format!("generated scatter kernel failed verification: {e}"))
    })?;
    let kernel = tessel_ir::passes::optimize(&kernel);
    tracing::debug!(target: "tessel::kernels", "scatter kernel for {root:?}:\n{kernel}");
    Ok(Lowering::Done(Box::new(ScheduledKernel {
        kernel,
        args,
        writes: vec![root],
        cooperative: false,
        recipe: None,
    })))
}
