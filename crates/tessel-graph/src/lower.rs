//! Lowering one kernel: a materialized node evaluated at symbolic coordinates.
//!
//! The kernel runs one invocation per output element. The invocation index `gid` becomes a
//! symbolic variable; output coordinates are `Expr`s of it, and every movement op maps
//! coordinates to its operand's coordinates symbolically, so by the time a load is emitted
//! its index is one simplified expression (`tessel_shape::Expr`), lowered by the builder.
//! Pads guard their operand with an `If` on the validity condition and select the pad
//! value through a register. A reduction is a loop with a register accumulator;
//! reductions nested in its body that don't depend on its loop variable are computed
//! before the loop (the max of softmax inside its sum).
//!
//! Values are memoized per (node, coordinates) within the block that computed them, so a
//! node used twice at the same coordinates is computed once.

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_ir::{Access, Buf, KernelBuilder, Mem, Value};
use tessel_shape::{BinaryOp, DType, Dim, Expr, ExprView, Scalar, Shape, Var};

use crate::graph::{Graph, LeafId, NodeId, Op, ReduceOp};
use crate::kernelize::{KernelizeError, ScheduledKernel, Slot};
use crate::tune::Knobs;

mod memo;
mod rows;
mod scatter;
mod sort;
mod tile;

pub(crate) use memo::{Cone, LowerMemo};
pub(crate) use tile::lower_tiled_kernel;

/// Invocations per workgroup of a kernel computing one output (or `upcast` outputs) each,
/// unless [`Knobs::local`] says otherwise.
const LOCAL_SIZE: i64 = 128;

/// Most invocations a cooperative reduction gives one output element.
const MAX_LANES: i64 = 256;

/// Below this many elements per output, a reduction stays one invocation's loop.
pub(crate) const MIN_COOPERATIVE_EXTENT: i64 = 256;

/// A workgroup per output element stops paying once there are this many invocations: a
/// reduction with millions of outputs (a matrix product) keeps every core busy with one
/// invocation each.
const MAX_COOPERATIVE_INVOCATIONS: i64 = 1 << 26;

/// How a kernel spreads its work over invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One invocation per output element.
    Serial,
    /// A workgroup per output element when the kernel's reductions are long.
    Cooperative,
    /// A workgroup per row of the output (every axis but the last): the reductions the row
    /// reads (its statistics, broadcast along it) are computed once, cooperatively, then
    /// the invocations stride along the row computing its elements. Softmax in one kernel.
    /// A reduction root is lowered as in `Cooperative`.
    Rows,
}

struct Lowerer<'g> {
    graph: &'g Graph,
    kb: KernelBuilder,
    idx: DType,
    root: NodeId,
    root_coords: Vec<Expr>,
    /// Where the root's output index lives (for absorbed outputs).
    out_index: Value,
    materialized: &'g FxHashSet<NodeId>,
    absorbable: &'g FxHashSet<NodeId>,
    leaf_slot: &'g FxHashMap<LeafId, usize>,
    /// Buffer parameters by slot.
    params: FxHashMap<Slot, Buf>,
    args: Vec<Slot>,
    writes: Vec<NodeId>,
    /// (node, coordinates) → value, one map per open block.
    memo: Vec<FxHashMap<(NodeId, Vec<Expr>), Value>>,
    /// Open loops and conditionals inside the kernel's tail guard: absorbed outputs are
    /// only computed where every invocation computes them (depth 0).
    depth: usize,
    /// Reduction loops opened so far, naming their variables.
    n_reduces: usize,
    /// Gathered coordinates bound so far, naming their variables.
    n_gathers: usize,
    /// Absorbable nodes that were also needed at other coordinates: absorbing them would
    /// read a buffer this kernel writes.
    conflicts: Vec<NodeId>,
    /// For a cooperative kernel (one workgroup per output element): the workgroup size
    /// and the invocation's index in it.
    lanes: Option<(i64, Value)>,
    /// Inside a row kernel's loop along the row.
    in_row_loop: bool,
    /// Reductions computed inside that loop (per element: a row kernel must have none).
    row_loop_reductions: usize,
    /// A tiled kernel's staged read: the buffer, the element index (in the space's
    /// variables) and the value read from the tile in its place.
    staged: Option<(Slot, Expr, Value)>,
}

/// The result of lowering one kernel.
pub(crate) enum Lowering {
    /// The kernel.
    Done(Box<ScheduledKernel>),
    /// Lower again without absorbing these nodes.
    Retry(Vec<NodeId>),
    /// The kernel cannot be lowered in the mode asked for (a row kernel whose reductions
    /// depend on the position along the row), and why.
    Unsuitable(NodeId, String),
}

/// Lowers the kernel computing materialized node `root` (and any node of `absorbable` it
/// evaluates at its own coordinates).
///
/// In `Mode::Cooperative`, a kernel whose reductions are long gives each output element a
/// workgroup instead of one invocation: the invocations stride through each top-level
/// reduction together (adjacent invocations read adjacent elements) and combine their
/// partial results through local memory; the first invocation stores the root and the
/// outputs absorbed beside it (a softmax's max and sum next to its log-sum-exp). See [`Mode`]
/// for `Mode::Rows`. `knobs` overrides the launch shape the heuristics below pick (scatters
/// and sorts have no knobs).
pub(crate) fn lower_kernel(
    graph: &Graph,
    root: NodeId,
    materialized: &FxHashSet<NodeId>,
    absorbable: &FxHashSet<NodeId>,
    leaf_slot: &FxHashMap<LeafId, usize>,
    mode: Mode,
    knobs: Knobs,
) -> Result<Lowering, KernelizeError> {
    if let Op::Scatter(op, index, src, axis) = graph.node(root).op {
        return scatter::lower_scatter_kernel(
            graph,
            root,
            (op, index, src, axis),
            materialized,
            leaf_slot,
        );
    }
    if let Op::Argsort(keys) = graph.node(root).op {
        return sort::lower_argsort_kernel(graph, root, keys, materialized, leaf_slot);
    }
    if let Op::Custom(..) = graph.node(root).op {
        return crate::custom::lower_custom_kernel(graph, root, leaf_slot);
    }
    let quarter = if mode == Mode::Serial {
        None
    } else {
        cooperative_lanes(graph, root, materialized, absorbable)
    };
    if let Some(quarter) = quarter
        && let Some(row) = row_lanes(graph, root, mode, quarter)
        && let Some(lowering) = rows::lower_row_kernel(
            graph,
            root,
            materialized,
            leaf_slot,
            knobs.lanes.unwrap_or(row),
        )?
    {
        return Ok(lowering);
    }
    let lanes = quarter.map(|l| knobs.lanes.unwrap_or(l));
    let outputs = graph.node(root).shape.numel().bounds().hi;
    let lanes = lanes.filter(|&l| outputs.saturating_mul(l) <= MAX_COOPERATIVE_INVOCATIONS);
    let cooperative = lanes.is_some();
    let node = graph.node(root);
    let shape = node.shape.clone();
    let numel = shape.numel();
    let idx = index_dtype(graph, root, materialized);
    let name = kernel_name(graph, root, materialized, absorbable);
    let mut kb = KernelBuilder::new(&if lanes.is_some() {
        format!("{name}_g")
    } else {
        name
    });
    // Outputs per invocation: one, or `upcast` consecutive ones along the last axis.
    let upcast = if lanes.is_none() && absorbable.is_empty() {
        upcast(graph, root, materialized, knobs.upcast)
    } else {
        None
    };
    let per = upcast.unwrap_or(1);
    // The invocations' shape: the output's, its last axis divided by `per`.
    let mut grid_shape = shape.dims().to_vec();
    if per > 1
        && let Some(last) = grid_shape.last_mut()
        && let Some(len) = last.as_const()
    {
        *last = Dim::constant(len / per);
    }
    let grid_shape = Shape::new(grid_shape);
    let invocations = grid_shape.numel();
    let local_size = knobs.local.unwrap_or(LOCAL_SIZE);
    let local = match (lanes, invocations.as_const()) {
        (Some(l), _) => l,
        (None, Some(n)) if n < local_size => n.max(1),
        _ => local_size,
    };
    let (gid_value, lane) = if lanes.is_some() {
        kb.grid([numel, Dim::constant(1), Dim::constant(1)], [local, 1, 1]);
        let group = kb.group_id(0, idx);
        (group, Some((local, kb.local_id(0, idx))))
    } else {
        kb.grid(
            [
                invocations.ceil_div(local),
                Dim::constant(1),
                Dim::constant(1),
            ],
            [local, 1, 1],
        );
        (kb.global_id(0, idx), None)
    };
    let gid_var = loop_var("gid", invocations);
    kb.bind(gid_var, gid_value, idx);
    let gid = Expr::from(gid_var);
    let strides = grid_shape.contiguous_strides();
    let grid_coords: Vec<Expr> = grid_shape
        .iter()
        .zip(&strides)
        .map(|(&d, &s)| coordinate(gid, s, d))
        .collect();
    // Output `j` of an invocation: its last coordinate times `per`, plus `j`.
    let coords_of = |j: i64| -> Vec<Expr> {
        let mut c = grid_coords.clone();
        if per > 1
            && let Some(last) = c.last_mut()
        {
            *last = *last * Expr::constant(per) + Expr::constant(j);
        }
        c
    };
    let root_coords = coords_of(0);

    let mut lw = Lowerer::new(
        graph,
        kb,
        idx,
        root,
        (root_coords.clone(), gid_value),
        materialized,
        leaf_slot,
    );
    lw.absorbable = absorbable;
    lw.lanes = lane;
    let out = lw.param(Slot::Node(root), node.dtype, numel, Access::Write);
    // Guard the tail when the grid over-covers (a cooperative grid never does).
    let exact = lane.is_some() || invocations.as_const().is_some_and(|n| n % local == 0);
    let guard = if exact {
        None
    } else {
        let n = lw.kb.expr(invocations, idx);
        let ok = lw.kb.lt(gid_value, n);
        let open = lw.open_if(ok);
        lw.depth = 0;
        Some(open)
    };
    if per > 1 {
        // The loads of every output first, then the stores: independent loads in flight
        // together is the point of computing several outputs per invocation.
        let mut values = Vec::new();
        for j in 0..per {
            values.push(lw.eval_node(root, &coords_of(j), true)?);
        }
        for (j, value) in (0..per).zip(values) {
            let at = lw.ix(gid * Expr::constant(per) + Expr::constant(j));
            lw.kb.store(out, at, value);
        }
    } else {
        let value = lw.eval_node(root, &root_coords, true)?;
        lw.store_output(out, value);
    }
    if let Some(open) = guard {
        lw.close_if(open);
    }
    lw.finish(cooperative)
}

/// Outputs per invocation for an elementwise kernel computing `root`: 8 for elements of
/// at most 2 bytes, 4 otherwise, where the output's last axis is a constant multiple of
/// that and there is enough work; `None` for kernels with a reduction (each output's loop)
/// or a scatter. One output per invocation leaves a single load in flight per invocation,
/// which holds a short memory-bound kernel far below bandwidth (a 12 MB head copy ran at
/// 0.57 TB/s on the H200). `chosen` (a tuning knob) replaces that width, and the minimum
/// amount of work, where the last axis is a multiple of it.
fn upcast(
    graph: &Graph,
    root: NodeId,
    materialized: &FxHashSet<NodeId>,
    chosen: Option<i64>,
) -> Option<i64> {
    let node = graph.node(root);
    let last = node.shape.dims().last()?.as_const()?;
    let per = match chosen {
        Some(per) if per > 1 && last % per == 0 => per,
        Some(_) => return None,
        None => {
            let per = if node.dtype.size_bytes() <= 2 { 8 } else { 4 };
            if last % per != 0 || node.shape.numel().bounds().hi < per * LOCAL_SIZE * 64 {
                return None;
            }
            per
        }
    };
    let mut seen = FxHashSet::default();
    let mut stack = vec![root];
    while let Some(n) = stack.pop() {
        if !seen.insert(n) || (n != root && materialized.contains(&n)) {
            continue;
        }
        let op = &graph.node(n).op;
        if matches!(op, Op::Reduce(..)) || op.runs_alone() {
            return None;
        }
        stack.extend(op.children());
    }
    Some(per)
}

/// The index dtype for a kernel computing `root`: 32-bit unless some value it reads,
/// computes or writes may exceed it. The walk stops at materialized nodes (buffers the
/// kernel loads): what produced them (a matrix product's `[m, k, n]` iteration space) is
/// another kernel's concern, and 64-bit index math costs a memory-bound kernel dearly.
fn index_dtype(graph: &Graph, root: NodeId, materialized: &FxHashSet<NodeId>) -> DType {
    let mut seen = FxHashSet::default();
    let mut stack = vec![root];
    let mut max_elems = 0;
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        let node = graph.node(n);
        max_elems = max_elems.max(node.shape.numel().bounds().hi);
        if n == root || !materialized.contains(&n) {
            stack.extend(node.op.children());
        }
    }
    if max_elems < i64::from(i32::MAX) {
        DType::I32
    } else {
        DType::I64
    }
}

/// `r_7_13` (a reduction producing 7×13) or `e_64` (elementwise): the shape, not a
/// counter, so equal kernels get equal names and hit the compile caches. `r` where the
/// kernel itself reduces: its walk stops at the buffers it loads, as lowering's does, so
/// the name depends only on what the kernel computes (see `memo`).
fn kernel_name(
    graph: &Graph,
    root: NodeId,
    materialized: &FxHashSet<NodeId>,
    absorbable: &FxHashSet<NodeId>,
) -> String {
    let node = graph.node(root);
    let mut seen = FxHashSet::default();
    let mut stack = vec![root];
    let mut reduces = false;
    while let Some(n) = stack.pop() {
        if !seen.insert(n) || (n != root && materialized.contains(&n) && !absorbable.contains(&n)) {
            continue;
        }
        let op = &graph.node(n).op;
        if matches!(op, Op::Reduce(..)) {
            reduces = true;
            break;
        }
        stack.extend(op.children());
    }
    let dims: Vec<String> = node
        .shape
        .iter()
        .map(|d| {
            d.as_const()
                .map_or_else(|| "n".to_owned(), |c| c.to_string())
        })
        .collect();
    let prefix = if reduces { "r" } else { "e" };
    format!(
        "{prefix}_{}",
        if dims.is_empty() {
            "1".to_owned()
        } else {
            dims.join("_")
        }
    )
}

/// Rows at least this many make a row kernel's workgroups many enough to fill a GPU at
/// [`ROW_ELEMENTS_PER_LANE`] elements per invocation.
const MANY_ROWS: i64 = 1024;

/// Elements of its row each invocation of a row kernel over [`MANY_ROWS`] rows computes:
/// fewer invocations per row mean fewer levels of the combining tree (a barrier each) and
/// more workgroups resident at once; up to 16 per invocation stay unrolled. Measured on an
/// H100 for layer norms of 768-element `bf16` rows: 64 lanes 10.8 µs, 32 lanes 15.2 µs,
/// 128 lanes 14.0 µs, 256 (a quarter of the row) 17.8 µs.
const ROW_ELEMENTS_PER_LANE: i64 = 12;

/// The workgroup size lowering gives `root` without a [`Knobs::lanes`] where it may be a
/// row kernel ([`Mode::Rows`], not a reduction, rows longer than 1): over many rows of a
/// constant length, a power of two covering [`ROW_ELEMENTS_PER_LANE`] elements per
/// invocation (between a warp's 32 and `quarter`), else `quarter` (what
/// [`cooperative_lanes`] gives).
fn row_lanes(graph: &Graph, root: NodeId, mode: Mode, quarter: i64) -> Option<i64> {
    let node = graph.node(root);
    let len = *node.shape.dims().last()?;
    if mode != Mode::Rows || matches!(node.op, Op::Reduce(..)) || len.as_const() == Some(1) {
        return None;
    }
    let rows = node.shape.numel().bounds().lo / len.bounds().hi.max(1);
    match len.as_const() {
        Some(n) if rows >= MANY_ROWS => {
            let per = (n + ROW_ELEMENTS_PER_LANE - 1) / ROW_ELEMENTS_PER_LANE;
            let pow2 = 1i64 << (64 - (per.max(2) - 1).leading_zeros()).min(62);
            Some(pow2.clamp(32, quarter.max(32)))
        }
        _ => Some(quarter),
    }
}

/// The workgroup size lowering gives `root` in `mode` without a [`Knobs::lanes`] (the
/// center of the lanes a tuner tries), or `None` where it is not cooperative.
pub(crate) fn default_lanes(
    graph: &Graph,
    root: NodeId,
    materialized: &FxHashSet<NodeId>,
    absorbable: &FxHashSet<NodeId>,
    mode: Mode,
) -> Option<i64> {
    if mode == Mode::Serial {
        return None;
    }
    let quarter = cooperative_lanes(graph, root, materialized, absorbable)?;
    Some(row_lanes(graph, root, mode, quarter).unwrap_or(quarter))
}

/// The workgroup size for a cooperative kernel computing `root`: a power of two covering
/// a quarter of its longest reduction (at most [`MAX_LANES`]), or `None` if it has no
/// reduction of at least [`MIN_COOPERATIVE_EXTENT`] elements per output.
fn cooperative_lanes(
    graph: &Graph,
    root: NodeId,
    materialized: &FxHashSet<NodeId>,
    absorbable: &FxHashSet<NodeId>,
) -> Option<i64> {
    let mut longest = 0;
    let mut stack = vec![root];
    let mut seen = FxHashSet::default();
    while let Some(n) = stack.pop() {
        // Absorbed outputs (a softmax's max and sum, written beside its log-sum-exp) are
        // computed here, so their reductions count.
        if !seen.insert(n) || (n != root && materialized.contains(&n) && !absorbable.contains(&n)) {
            continue;
        }
        let node = graph.node(n);
        if let Op::Reduce(_, a, axes) = &node.op {
            let inner = &graph.node(*a).shape;
            let extent: Dim = axes.iter().map(|&ax| inner[ax]).product();
            longest = longest.max(extent.bounds().hi);
        }
        stack.extend(node.op.children());
    }
    // At least 4 elements per invocation: each level of the combining tree costs a
    // barrier, which short rows (attention's 512) cannot amortize over more lanes.
    (longest >= MIN_COOPERATIVE_EXTENT).then(|| {
        let per_lane = (longest + 3) / 4;
        let pow2 = 1i64 << (64 - (per_lane - 1).leading_zeros()).min(62);
        pow2.min(MAX_LANES)
    })
}

/// The coordinate along an axis of size `d` whose row-major stride is `stride`, from a
/// flat index. Size-1 axes are always 0, and so are empty ones (no invocation reaches
/// them; `% 0` must not be built).
fn coordinate(flat: Expr, stride: Expr, d: Dim) -> Expr {
    match d.as_const() {
        Some(0 | 1) => Expr::constant(0),
        _ if stride.as_const() == Some(0) => Expr::constant(0),
        _ => (flat / stride) % d,
    }
}

/// A loop variable. Names are per kernel (`gid`, `r0`, `r1`, ...), so equal kernels
/// build equal expressions and the interner doesn't grow with every kernelization.
/// Elements per invocation up to which a cooperative reduction or a row kernel's pass is
/// unrolled at lowering time (see [`Lowerer::lane_coordinates`]).
const UNROLLED_STEPS_MAX: i64 = 16;

/// The accumulators of a sequential reduction whose length is a constant multiple of it
/// (at least its square): see [`Lowerer::reduce_split`].
const ACCUMULATORS: i64 = 8;

/// The largest body (in graph nodes) a sequential reduction is split for: the body is
/// written once per accumulator.
const SPLIT_BODY_MAX: usize = 12;

/// The variable of output axis `axis` (of size `extent`) in a kernel spec's indices:
/// `o0`, `o1`, ...
pub(crate) fn space_var(axis: usize, extent: Dim) -> Var {
    loop_var(&format!("o{axis}"), extent)
}

fn loop_var(name: &str, extent: Dim) -> Var {
    let hi = extent.bounds().hi.saturating_sub(1).max(0);
    Var::new(name, 0, hi).expect("0 <= hi by construction")
}

impl<'g> Lowerer<'g> {
    /// A lowerer for the kernel computing `root` in `kb` with index dtype `idx`: the root
    /// evaluated at `at.0` and stored at index `at.1`, the root its only written value so
    /// far; nothing absorbed and no lanes until the caller sets them.
    fn new(
        graph: &'g Graph,
        kb: KernelBuilder,
        idx: DType,
        root: NodeId,
        (root_coords, out_index): (Vec<Expr>, Value),
        materialized: &'g FxHashSet<NodeId>,
        leaf_slot: &'g FxHashMap<LeafId, usize>,
    ) -> Self {
        static NOTHING: std::sync::OnceLock<FxHashSet<NodeId>> = std::sync::OnceLock::new();
        Lowerer {
            graph,
            kb,
            idx,
            root,
            root_coords,
            out_index,
            materialized,
            absorbable: NOTHING.get_or_init(FxHashSet::default),
            leaf_slot,
            params: FxHashMap::default(),
            args: Vec::new(),
            writes: vec![root],
            memo: vec![FxHashMap::default()],
            depth: 0,
            n_reduces: 0,
            n_gathers: 0,
            conflicts: Vec::new(),
            lanes: None,
            in_row_loop: false,
            row_loop_reductions: 0,
            staged: None,
        }
    }
}

impl Lowerer<'_> {
    /// The lowered kernel, verified and optimized, or the nodes to lower again without
    /// absorbing.
    fn finish(self, cooperative: bool) -> Result<Lowering, KernelizeError> {
        if !self.conflicts.is_empty() {
            return Ok(Lowering::Retry(self.conflicts));
        }
        let Lowerer {
            kb,
            args,
            writes,
            root,
            ..
        } = self;
        let kernel = kb
            .build_with_listing()
            .map_err(|e| KernelizeError(format!("generated kernel failed verification: {e}")))?;
        let kernel = tessel_ir::passes::optimize(&kernel);
        tracing::debug!(target: "tessel::kernels", "kernel for {root:?}:\n{kernel}");
        Ok(Lowering::Done(Box::new(ScheduledKernel {
            kernel,
            args,
            writes,
            cooperative,
            recipe: None,
        })))
    }

    fn param(&mut self, slot: Slot, dtype: DType, len: Dim, access: Access) -> Buf {
        if let Some(&b) = self.params.get(&slot) {
            return b;
        }
        // By position, not node id or input number: equal cones must print equal source,
        // whichever of them was lowered (the lowering memo moves kernels between them).
        let name = match &slot {
            Slot::Input(_) => format!("in{}", self.args.len()),
            Slot::Node(_) => format!("buf{}", self.args.len()),
        };
        let b = self.kb.buffer(&name, dtype, len, access);
        self.params.insert(slot.clone(), b);
        self.args.push(slot);
        b
    }

    fn open_if(&mut self, cond: Value) -> Value {
        self.memo.push(FxHashMap::default());
        self.depth += 1;
        self.kb.begin_if(cond)
    }

    fn close_if(&mut self, open: Value) {
        self.memo.pop();
        self.depth = self.depth.saturating_sub(1);
        self.kb.end_if(open);
    }

    fn ix(&mut self, e: Expr) -> Value {
        self.kb.expr(e, self.idx)
    }

    /// A `bool` value for a 0/1 expression, as a comparison where possible so the
    /// verifier can narrow indices under it.
    fn cond(&mut self, e: Expr) -> Value {
        match e.view() {
            ExprView::Lt(a, b) => {
                let (a, b) = (self.ix(a), self.ix(b));
                self.kb.binary(BinaryOp::Lt, a, b)
            }
            ExprView::Eq(a, b) => {
                let (a, b) = (self.ix(a), self.ix(b));
                self.kb.binary(BinaryOp::Eq, a, b)
            }
            ExprView::Const(c) => self.kb.constant(c != 0),
            _ => {
                let v = self.ix(e);
                let zero = self.kb.constant_as(0, self.idx);
                self.kb.binary(BinaryOp::Ne, v, zero)
            }
        }
    }

    fn memo_get(&self, n: NodeId, coords: &[Expr]) -> Option<Value> {
        let key = (n, coords.to_vec());
        self.memo.iter().rev().find_map(|m| m.get(&key)).copied()
    }

    /// Stores `value` of an output at the root's index: in a cooperative kernel every
    /// invocation of the workgroup holds it, and the first stores it.
    fn store_output(&mut self, buf: Buf, value: Value) {
        if let Some((_, lane)) = self.lanes {
            let zero = self.kb.constant_as(0, self.idx);
            let first = self.kb.binary(BinaryOp::Eq, lane, zero);
            let open = self.kb.begin_if(first);
            self.kb.store(buf, self.out_index, value);
            self.kb.end_if(open);
        } else {
            self.kb.store(buf, self.out_index, value);
        }
    }

    /// The value of node `n` at `coords`. `top` is true only for the kernel's root.
    fn eval_node(
        &mut self,
        n: NodeId,
        coords: &[Expr],
        top: bool,
    ) -> Result<Value, KernelizeError> {
        if let Some(v) = self.memo_get(n, coords) {
            return Ok(v);
        }
        let node = self.graph.node(n).clone();
        let stored = !top && self.materialized.contains(&n);
        let absorbable = stored && self.absorbable.contains(&n);
        let absorb = absorbable
            && self.depth == 0
            && coords == self.root_coords.as_slice()
            && !self.params.contains_key(&Slot::Node(n));
        if absorbable && !absorb && self.writes.contains(&n) {
            self.conflicts.push(n);
        }
        let v = if let Op::Leaf(leaf) = node.op {
            let slot = *self.leaf_slot.get(&leaf).ok_or_else(|| {
                KernelizeError(format!("leaf {leaf:?} missing from the signature"))
            })?;
            self.load(Slot::Input(slot), &node.shape, node.dtype, coords)
        } else if stored && !absorb {
            if absorbable && self.writes.contains(&n) {
                self.conflicts.push(n);
            }
            self.load(Slot::Node(n), &node.shape, node.dtype, coords)
        } else {
            let v = self.compute(n, coords)?;
            if absorb {
                let len = node.shape.numel();
                let buf = self.param(Slot::Node(n), node.dtype, len, Access::Write);
                self.store_output(buf, v);
                self.writes.push(n);
            }
            v
        };
        self.memo
            .last_mut()
            .expect("the kernel scope is never popped")
            .insert((n, coords.to_vec()), v);
        Ok(v)
    }

    fn load(&mut self, slot: Slot, shape: &Shape, dtype: DType, coords: &[Expr]) -> Value {
        let flat: Expr = coords
            .iter()
            .zip(shape.contiguous_strides())
            .map(|(&c, s)| c * s)
            .sum();
        if let Some((staged, index, value)) = &self.staged
            && *staged == slot
            && *index == flat
        {
            return *value;
        }
        let buf = self.param(slot, dtype, shape.numel(), Access::Read);
        // Every index a correct kernel computes is in bounds, but interval analysis can't
        // always see it through simplified div/mod chains. The clamp folds away wherever
        // the bounds prove it; elsewhere it costs two ops and makes every load provably
        // in bounds, for the verifier and for the memory safety of compiled kernels.
        let numel = shape.numel();
        let flat = if numel.as_const() == Some(0) {
            flat
        } else {
            flat.max(0).min(numel - 1)
        };
        let index = self.ix(flat);
        self.kb.load(buf, index)
    }

    fn compute(&mut self, n: NodeId, coords: &[Expr]) -> Result<Value, KernelizeError> {
        let node = self.graph.node(n).clone();
        let child_shape = |c: NodeId| self.graph.node(c).shape.clone();
        Ok(match &node.op {
            Op::Leaf(_) => unreachable!("leaves are loaded by eval_node"),
            Op::Const(s) => self.kb.constant(s.cast(node.dtype)),
            Op::Index(axis) => {
                let c = self.ix(coords[*axis]);
                if node.dtype == self.idx {
                    c
                } else {
                    self.kb.cast(c, node.dtype)
                }
            }
            Op::Random(key, words) => {
                let mut k = Vec::with_capacity(4);
                for j in 0..4 {
                    k.push(self.eval_node(*key, &[Expr::constant(j)], false)?);
                }
                let flat: Expr = coords
                    .iter()
                    .zip(node.shape.contiguous_strides())
                    .map(|(&c, s)| c * s)
                    .sum();
                let group = i64::from(words.group());
                let block = self.ix(flat.floor_div(group));
                let lane = self.ix(flat - flat.floor_div(group) * group);
                let key = [k[0], k[1], k[2], k[3]];
                crate::random::emit_word(&mut self.kb, (block, lane, self.idx), key, *words)
            }
            Op::Unary(op, a) => {
                let a = self.eval_node(*a, coords, false)?;
                self.kb.unary(*op, a)
            }
            Op::Binary(op, a, b) => {
                let a = self.eval_node(*a, coords, false)?;
                let b = self.eval_node(*b, coords, false)?;
                self.kb.binary(*op, a, b)
            }
            Op::Ternary(op, a, b, c) => {
                let a = self.eval_node(*a, coords, false)?;
                let b = self.eval_node(*b, coords, false)?;
                let c = self.eval_node(*c, coords, false)?;
                self.kb.ternary(*op, a, b, c)
            }
            Op::Cast(a) => {
                let v = self.eval_node(*a, coords, false)?;
                self.kb.cast(v, node.dtype)
            }
            Op::Bitcast(a) => {
                let v = self.eval_node(*a, coords, false)?;
                self.kb.bitcast(v, node.dtype)
            }
            Op::Pad(a, pads, value) => {
                let inner = child_shape(*a);
                let pad = value.cast(node.dtype);
                if inner.iter().any(|d| d.as_const() == Some(0)) {
                    // Padding an empty tensor: every element is padding.
                    return Ok(self.kb.constant(pad));
                }
                let mut mapped = Vec::with_capacity(coords.len());
                let mut valid = Expr::constant(1);
                for ((&c, &(before, _)), &d) in coords.iter().zip(pads.iter()).zip(inner.iter()) {
                    let x = c - before;
                    valid *= x.cmp_ge(0) * x.cmp_lt(d);
                    // Under the mask the clamp is the identity; it lets the verifier (and a
                    // reader) see every index the padded operand is read at in bounds.
                    mapped.push(x.max(0).min(d - 1));
                }
                self.masked(*a, &mapped, valid, pad, node.dtype)?
            }
            Op::Reduce(op, a, axes) => self.reduce(*op, *a, axes, coords, node.dtype)?,
            Op::Gather(src, index, axis) => self.gather(*src, *index, *axis, coords, node.dtype)?,
            op if op.is_movement() => {
                let (child, mapped) = map_coords(self.graph, &node.op, &node.shape, coords);
                self.eval_node(child, &mapped, false)?
            }
            op => return Err(KernelizeError(format!("no lowering for {}", op.name()))),
        })
    }

    /// `src` at `coords` with coordinate `axis` taken from `index` there: a load whose
    /// address is data. The index is clamped into the axis before it becomes a coordinate
    /// (a variable bounded by the axis, so every load stays provably in bounds) and the
    /// value of an out-of-range index is replaced by zero.
    fn gather(
        &mut self,
        src: NodeId,
        index: NodeId,
        axis: usize,
        coords: &[Expr],
        dtype: DType,
    ) -> Result<Value, KernelizeError> {
        let n = self.graph.node(src).shape[axis];
        let zero = self.kb.constant(Scalar::zero(dtype));
        if n.as_const() == Some(0) {
            return Ok(zero);
        }
        let at = self.eval_node(index, coords, false)?;
        let (inside, clamped) = self.index_into(at, self.graph.node(index).dtype, n);
        let var = loop_var(&format!("g{}", self.n_gathers), n);
        self.n_gathers += 1;
        self.kb.bind(var, clamped, self.idx);
        let mut mapped = coords.to_vec();
        mapped[axis] = Expr::from(var);
        let v = self.eval_node(src, &mapped, false)?;
        Ok(self.kb.select(inside, v, zero))
    }

    /// Whether index value `at` (of the integer dtype `ity`) lies in `0..n`, and `at`
    /// clamped into that range, in the kernel's index dtype. Compared and clamped in the
    /// index's own dtype: an `i64` index narrowed first could wrap into range.
    fn index_into(&mut self, at: Value, ity: DType, n: Dim) -> (Value, Value) {
        let lo = self.kb.constant_as(0, ity);
        let hi = self.kb.expr(n - 1, ity);
        let len = self.kb.expr(n, ity);
        let above = self.kb.binary(BinaryOp::Ge, at, lo);
        let below = self.kb.lt(at, len);
        let inside = self.kb.binary(BinaryOp::And, above, below);
        let clamped = self.kb.binary(BinaryOp::Max, at, lo);
        let clamped = self.kb.binary(BinaryOp::Min, clamped, hi);
        let clamped = if ity == self.idx {
            clamped
        } else {
            self.kb.cast(clamped, self.idx)
        };
        (inside, clamped)
    }

    /// `valid ? child[mapped] : pad`, evaluating the child only where valid.
    fn masked(
        &mut self,
        child: NodeId,
        mapped: &[Expr],
        valid: Expr,
        pad: Scalar,
        dtype: DType,
    ) -> Result<Value, KernelizeError> {
        match valid.as_const() {
            Some(0) => return Ok(self.kb.constant(pad)),
            Some(_) => return self.eval_node(child, mapped, false),
            None => {}
        }
        // Each factor of the product is one comparison; `and` them as bools.
        let factors = match valid.view() {
            ExprView::Prod(fs) => fs,
            _ => vec![valid],
        };
        let mut cond = None;
        for f in factors {
            let c = self.cond(f);
            cond = Some(match cond {
                Some(prev) => self.kb.binary(BinaryOp::And, prev, c),
                None => c,
            });
        }
        let cond = cond.expect("a non-constant condition has factors");
        let Mem::Reg(reg) = self.kb.reg(dtype, 1) else {
            unreachable!("reg() returns registers")
        };
        let zero = self.kb.constant_as(0, self.idx);
        let pad_v = self.kb.constant(pad);
        self.kb.store(Mem::Reg(reg), zero, pad_v);
        let open = self.open_if(cond);
        let v = self.eval_node(child, mapped, false)?;
        self.kb.store(Mem::Reg(reg), zero, v);
        self.close_if(open);
        Ok(self.kb.load(Mem::Reg(reg), zero))
    }

    fn reduce(
        &mut self,
        op: ReduceOp,
        child: NodeId,
        axes: &[usize],
        coords: &[Expr],
        dtype: DType,
    ) -> Result<Value, KernelizeError> {
        if self.in_row_loop {
            self.row_loop_reductions += 1;
        }
        let inner = self.graph.node(child).shape.clone();
        // Half-precision sums accumulate in f32 (DESIGN.md).
        let acc_dtype = if matches!(dtype, DType::F16 | DType::BF16) {
            DType::F32
        } else {
            dtype
        };
        let rsize: Dim = axes.iter().map(|&a| inner[a]).product();
        if rsize.as_const() == Some(0) {
            // A reduction over nothing is its identity; no loop, no reads.
            return Ok(self.kb.constant(op.identity(dtype)));
        }
        let loop_var = loop_var(&format!("r{}", self.n_reduces), rsize);
        self.n_reduces += 1;
        // Coordinates of the operand: reduced axes walk the loop variable, in row-major
        // order over the reduced axes; the rest stay.
        let mut mapped = coords.to_vec();
        let mut stride = Expr::constant(1);
        for &a in axes.iter().rev() {
            let d = inner[a];
            mapped[a] = coordinate(Expr::from(loop_var), stride, d);
            // An empty axis empties the loop; keep the stride usable for the others.
            if d.as_const() != Some(0) {
                stride *= d;
            }
        }
        // Reductions inside the body that don't depend on this loop run before it.
        let mut hoist = Vec::new();
        self.invariant_reductions(child, &mapped, loop_var, &mut hoist, false);
        for (n, c) in hoist {
            self.eval_node(n, &c, false)?;
        }
        // Cooperatively only outside loops and conditionals, where every invocation of
        // the workgroup reaches the barriers.
        let lanes = self.lanes.filter(|_| self.depth == 0);
        if let Some((l, lane)) = lanes
            && let Some(n) = rsize.as_const()
            && n % l == 0
            && n / l <= UNROLLED_STEPS_MAX
        {
            // A few elements per invocation: unrolled here, at the top level, so their
            // values stay in registers and a later pass over the same elements (softmax's
            // sum and output, a layer norm's variance) reuses them instead of loading
            // and computing them again. The same order as the loop: the same roundings.
            let at = self.lane_coordinates(l, lane, n / l);
            let mut total = self.kb.constant(op.identity(acc_dtype));
            for element in at {
                let coords: Vec<Expr> = mapped
                    .iter()
                    .map(|e| e.substitute(&[(loop_var, element)]))
                    .collect();
                let v = self.eval_node(child, &coords, false)?;
                let v = self.cast_between(v, dtype, acc_dtype);
                total = self.kb.binary(op.binary(), total, v);
            }
            let total = self.combine_lanes(op, acc_dtype, total, l, lane);
            return Ok(self.cast_between(total, acc_dtype, dtype));
        }
        if lanes.is_none()
            && let Some(n) = rsize.as_const()
            && n % ACCUMULATORS == 0
            && n >= ACCUMULATORS * ACCUMULATORS
            && self.body_size(child) <= SPLIT_BODY_MAX
        {
            return self.reduce_split(op, child, &mapped, loop_var, n, acc_dtype, dtype);
        }
        let Mem::Reg(acc) = self.kb.reg(acc_dtype, 1) else {
            unreachable!("reg() returns registers")
        };
        let zero = self.kb.constant_as(0, self.idx);
        let init = self.kb.constant(op.identity(acc_dtype));
        self.kb.store(Mem::Reg(acc), zero, init);
        let start = self.kb.constant_as(0, self.idx);
        let end = match lanes {
            Some((l, _)) => self.ix(rsize.ceil_div(l)),
            None => self.ix(rsize),
        };
        let r = self.kb.begin_range(start, end);
        self.memo.push(FxHashMap::default());
        self.depth += 1;
        // Invocation `lane` of a workgroup takes elements lane, lane + l, lane + 2l, ...
        let mut guard = None;
        if let Some((l, lane)) = lanes {
            let l_v = self.kb.constant_as(l, self.idx);
            let element = self
                .kb
                .ternary(tessel_shape::TernaryOp::MulAdd, r, l_v, lane);
            if rsize.as_const().is_none_or(|n| n % l != 0) {
                let n = self.ix(rsize);
                let inside = self.kb.lt(element, n);
                guard = Some(self.kb.begin_if(inside));
            }
            self.kb.bind(loop_var, element, self.idx);
        } else {
            self.kb.bind(loop_var, r, self.idx);
        }
        let v = self.eval_node(child, &mapped, false)?;
        let v = self.cast_between(v, dtype, acc_dtype);
        self.accumulate(op, acc, zero, v);
        if let Some(open) = guard {
            self.kb.end_if(open);
        }
        self.memo.pop();
        self.depth -= 1;
        self.kb.end_range(r);
        let mut total = self.kb.load(Mem::Reg(acc), zero);
        if let Some((l, lane)) = lanes {
            total = self.combine_lanes(op, acc_dtype, total, l, lane);
        }
        Ok(self.cast_between(total, acc_dtype, dtype))
    }

    /// A sequential reduction of `n` elements (`n` a multiple of [`ACCUMULATORS`]) into
    /// that many accumulators: step `r` adds elements `r·A .. r·A + A` to accumulators
    /// `0 .. A`, which are combined pairwise after the loop. Consecutive elements then go to
    /// independent registers, so a C compiler turns a step into one vector operation (and
    /// a GPU has `A` loads in flight); the order is fixed by the IR, so every backend and
    /// the interpreter round alike.
    #[allow(clippy::too_many_arguments)]
    fn reduce_split(
        &mut self,
        op: ReduceOp,
        child: NodeId,
        mapped: &[Expr],
        element_var: Var,
        n: i64,
        acc_dtype: DType,
        dtype: DType,
    ) -> Result<Value, KernelizeError> {
        let a = ACCUMULATORS;
        let Mem::Reg(acc) = self.kb.reg(acc_dtype, a as usize) else {
            unreachable!("reg() returns registers")
        };
        let init = self.kb.constant(op.identity(acc_dtype));
        let slots: Vec<Value> = (0..a).map(|j| self.kb.constant_as(j, self.idx)).collect();
        for &slot in &slots {
            self.kb.store(Mem::Reg(acc), slot, init);
        }
        let start = self.kb.constant_as(0, self.idx);
        let end = self.kb.constant_as(n / a, self.idx);
        let r = self.kb.begin_range(start, end);
        self.memo.push(FxHashMap::default());
        self.depth += 1;
        let step = loop_var(&format!("{element_var}s"), Dim::constant(n / a));
        self.kb.bind(step, r, self.idx);
        for (j, &slot) in slots.iter().enumerate() {
            let element = Expr::from(step) * a + j as i64;
            let coords: Vec<Expr> = mapped
                .iter()
                .map(|e| e.substitute(&[(element_var, element)]))
                .collect();
            let v = self.eval_node(child, &coords, false)?;
            let v = self.cast_between(v, dtype, acc_dtype);
            self.accumulate(op, acc, slot, v);
        }
        self.memo.pop();
        self.depth -= 1;
        self.kb.end_range(r);
        let mut partial: Vec<Value> = slots
            .iter()
            .map(|&slot| self.kb.load(Mem::Reg(acc), slot))
            .collect();
        while partial.len() > 1 {
            partial = partial
                .chunks(2)
                .map(|pair| self.kb.binary(op.binary(), pair[0], pair[1]))
                .collect();
        }
        let total = partial[0];
        Ok(self.cast_between(total, acc_dtype, dtype))
    }

    /// `v` of dtype `from` as `to` (itself where they are the same).
    fn cast_between(&mut self, v: Value, from: DType, to: DType) -> Value {
        if from == to { v } else { self.kb.cast(v, to) }
    }

    /// Combines `v` by `op` into register `acc`'s element `slot`.
    fn accumulate(&mut self, op: ReduceOp, acc: Value, slot: Value, v: Value) {
        let prev = self.kb.load(Mem::Reg(acc), slot);
        let next = self.kb.binary(op.binary(), prev, v);
        self.kb.store(Mem::Reg(acc), slot, next);
    }

    /// The number of unmaterialized nodes under `n` (at most [`SPLIT_BODY_MAX`] + 1): how
    /// much code one step of a reduction over `n` is.
    fn body_size(&self, n: NodeId) -> usize {
        let mut seen = FxHashSet::default();
        let mut stack = vec![n];
        while let Some(m) = stack.pop() {
            if seen.len() > SPLIT_BODY_MAX || !seen.insert(m) {
                continue;
            }
            if !self.materialized.contains(&m) {
                stack.extend(self.graph.node(m).op.children());
            }
        }
        seen.len()
    }

    /// The coordinates `lane, lane + l, ..., lane + (steps - 1)·l` of an invocation's
    /// elements along a strided axis, in a variable bound to the invocation's index, so
    /// that every pass over the axis names the same elements alike (and memoizes them).
    fn lane_coordinates(&mut self, l: i64, lane: Value, steps: i64) -> Vec<Expr> {
        let lane_var = loop_var("lane", Dim::constant(l));
        self.kb.bind(lane_var, lane, self.idx);
        (0..steps).map(|c| Expr::from(lane_var) + c * l).collect()
    }

    /// The workgroup's `l` partial results combined by a tree through local memory; every
    /// invocation gets the total.
    fn combine_lanes(
        &mut self,
        op: ReduceOp,
        dtype: DType,
        partial: Value,
        l: i64,
        lane: Value,
    ) -> Value {
        // Lanes store to neighbouring slots at once, so the slots are 32-bit words at
        // least: WGSL packs narrower types into shared words. Widening is exact (wrapping
        // sums and products agree modulo the narrow width, order is kept); `bool`'s
        // or/and become max/min of 0/1.
        let (wide, op) = match dtype {
            DType::Bool => (
                DType::U32,
                match op {
                    ReduceOp::Sum | ReduceOp::Max => ReduceOp::Max,
                    ReduceOp::Prod | ReduceOp::Min => ReduceOp::Min,
                },
            ),
            DType::U8 | DType::U16 => (DType::U32, op),
            DType::I8 | DType::I16 => (DType::I32, op),
            _ => (dtype, op),
        };
        let partial = if wide == dtype {
            partial
        } else {
            self.kb.cast(partial, wide)
        };
        let total = self.tree(op, wide, partial, l, lane);
        if wide == dtype {
            total
        } else {
            self.kb.cast(total, dtype)
        }
    }

    /// [`Lowerer::combine_lanes`] in `dtype`.
    fn tree(&mut self, op: ReduceOp, dtype: DType, partial: Value, l: i64, lane: Value) -> Value {
        let shared = self.kb.local(dtype, l as usize);
        self.kb.store(shared, lane, partial);
        self.kb.barrier();
        let mut half = l / 2;
        while half >= 1 {
            let half_v = self.kb.constant_as(half, self.idx);
            let active = self.kb.lt(lane, half_v);
            let open = self.kb.begin_if(active);
            let other = self.kb.add(lane, half_v);
            let a = self.kb.load(shared, lane);
            let b = self.kb.load(shared, other);
            let c = self.kb.binary(op.binary(), a, b);
            self.kb.store(shared, lane, c);
            self.kb.end_if(open);
            self.kb.barrier();
            half /= 2;
        }
        let first = self.kb.constant_as(0, self.idx);
        self.kb.load(shared, first)
    }

    /// Unmaterialized reductions under `n` (at `coords`) whose coordinates don't mention
    /// `loop_var`. Pads are not crossed: under a pad, coordinates may be out of range.
    /// `top` is set for the kernel's root, which is materialized but computed here.
    fn invariant_reductions(
        &self,
        n: NodeId,
        coords: &[Expr],
        loop_var: Var,
        out: &mut Vec<(NodeId, Vec<Expr>)>,
        top: bool,
    ) {
        let node = self.graph.node(n);
        if !top && self.materialized.contains(&n) {
            // A producer this kernel can absorb is computed (and stored) before the loop.
            if self.absorbable.contains(&n)
                && coords == self.root_coords.as_slice()
                && !out.iter().any(|(m, _)| *m == n)
            {
                out.push((n, coords.to_vec()));
            }
            return;
        }
        debug_assert!(
            top || n != self.root,
            "the root is never inside its own reduction"
        );
        match &node.op {
            // A random node's key is read at fixed coordinates, and is materialized if it reduces.
            Op::Leaf(_) | Op::Const(_) | Op::Index(_) | Op::Random(..) | Op::Pad(..) => {}
            // The source is read at coordinates that are data: nothing under it is
            // invariant. (A source with reductions is materialized anyway.)
            Op::Gather(_, index, _) => {
                self.invariant_reductions(*index, coords, loop_var, out, false);
            }
            Op::Reduce(..) => {
                if coords.iter().all(|c| !c.vars().contains(&loop_var))
                    && !out.iter().any(|(m, c)| *m == n && c == coords)
                {
                    out.push((n, coords.to_vec()));
                }
            }
            op if op.is_movement() => {
                let (child, mapped) = map_coords(self.graph, op, &node.shape, coords);
                self.invariant_reductions(child, &mapped, loop_var, out, false);
            }
            op => {
                for c in op.children() {
                    self.invariant_reductions(c, coords, loop_var, out, false);
                }
            }
        }
    }
}

/// For a movement op other than `Pad`: its operand and the operand's coordinates.
pub(crate) fn map_coords(
    graph: &Graph,
    op: &Op,
    shape: &Shape,
    coords: &[Expr],
) -> (NodeId, Vec<Expr>) {
    match op {
        Op::Reshape(a) => {
            let inner = graph.node(*a).shape.clone();
            let flat: Expr = coords
                .iter()
                .zip(shape.contiguous_strides())
                .map(|(&c, s)| c * s)
                .sum();
            let mapped = inner
                .iter()
                .zip(inner.contiguous_strides())
                .map(|(&d, s)| coordinate(flat, s, d))
                .collect();
            (*a, mapped)
        }
        Op::Permute(a, perm) => {
            let mut mapped = vec![Expr::constant(0); perm.len()];
            for (k, &p) in perm.iter().enumerate() {
                mapped[p] = coords[k];
            }
            (*a, mapped)
        }
        Op::Expand(a) => {
            let inner = graph.node(*a).shape.clone();
            let mapped = inner
                .iter()
                .zip(coords)
                .map(|(&d, &c)| {
                    if d.as_const() == Some(1) {
                        Expr::constant(0)
                    } else {
                        c
                    }
                })
                .collect();
            (*a, mapped)
        }
        Op::Shrink(a, ranges) => {
            let mapped = coords
                .iter()
                .zip(ranges.iter())
                .map(|(&c, &(start, step))| start + c * step)
                .collect();
            (*a, mapped)
        }
        Op::Flip(a, axes) => {
            let mut mapped = coords.to_vec();
            for &ax in axes {
                mapped[ax] = shape[ax] - 1 - coords[ax];
            }
            (*a, mapped)
        }
        _ => unreachable!("map_coords is only called on movement ops other than pad"),
    }
}
