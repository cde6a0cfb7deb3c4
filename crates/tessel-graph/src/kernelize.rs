//! The kernelizer: partitions the graph needed by a realize into kernels and lowers each to
//! kernel IR.
//!
//! **Where values are materialized** (written to a buffer) — everything else is fused and
//! recomputed inside its consumers' kernels:
//! - the realize targets;
//! - a value that contains an unmaterialized reduction and is broadcast (`Expand`) into a
//!   larger iteration space, since recomputing it per broadcast element would repeat the
//!   reduction;
//! - a value that contains a reduction and has several consumers;
//! - a value that contains a reduction and is reduced again (nested, the outer reduction
//!   would add up every inner sum serially per output: a sum split into blocks of rows
//!   would run as one loop again);
//! - a value with several consumers whose computation inlines more than
//!   `MAX_INLINE_OPS` (64) ops, so sharing stays linear in the graph's size, or reads 4
//!   distinct buffers of its own size or more (`SHARED_LOADS`: a residual stream's sums),
//!   so no layer's kernels read every earlier layer's output again. Where a
//!   shared value costs 16 ops or more, [`kernelize_shared`] makes the alternative
//!   partition that materializes it, for measurement to choose.
//!
//! Elementwise chains and movement ops never materialize: movement folds into the index
//! arithmetic of loads (with validity masks for pads), so views cost nothing.
//!
//! **Multi-output kernels.** A materialized value `m` that a kernel evaluates at exactly its
//! own output coordinates (the max inside softmax's sum pass, the mean inside a variance
//! pass) is stored by that kernel as a second output instead of getting a kernel of its
//! own. That is how softmax comes out as two kernels and mean/variance as one.
//!
//! **Lowering** (`src/lower.rs`) evaluates a node at symbolic coordinates: one invocation
//! per output element, coordinates derived from the invocation index, a loop with a register
//! accumulator per reduction.

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_ir::Kernel;
use tessel_shape::{DType, Dim};

use crate::consumers::Consumers;
use crate::graph::{Graph, LeafId, NodeId, Op};
use crate::lower::{Cone, LowerMemo, Lowering, MIN_COOPERATIVE_EXTENT, Mode, lower_kernel};
use crate::signature::signature;
use crate::tune::{Knobs, Recipe};

/// Where a kernel argument comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    /// The `k`-th leaf of the realized subgraph, in [`Signature`](crate::Signature) order.
    Input(usize),
    /// The value of a materialized node, written by one kernel of the schedule.
    Node(NodeId),
}

/// One kernel and the slots its buffer parameters bind to, in parameter order.
#[derive(Clone, Debug)]
pub struct ScheduledKernel {
    /// The kernel.
    pub kernel: Kernel,
    /// One slot per buffer parameter.
    pub args: Vec<Slot>,
    /// The nodes this kernel writes.
    pub writes: Vec<NodeId>,
    /// A workgroup computes each output (a cooperative reduction) or each row (a row
    /// kernel) together, rather than one invocation each output.
    pub cooperative: bool,
    /// How to lower it again with other [`Knobs`] (see [`ScheduledKernel::variants`]);
    /// `None` for kernels without knobs (scatters, sorts).
    pub(crate) recipe: Option<Arc<Recipe>>,
}

/// Kernels in an order that respects their dependencies, and the buffers they need.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// The kernels, producers first.
    pub kernels: Vec<ScheduledKernel>,
    /// Every materialized node: its dtype and number of elements.
    pub buffers: Vec<(NodeId, DType, Dim)>,
}

pub(crate) fn renumber(op: &Op, f: impl Fn(&NodeId) -> NodeId) -> Op {
    match op {
        Op::Leaf(_) | Op::Const(_) | Op::Index(_) => op.clone(),
        Op::Random(key, word) => Op::Random(f(key), *word),
        Op::Custom(call, inputs) => Op::Custom(Arc::clone(call), inputs.iter().map(&f).collect()),
        Op::Unary(u, a) => Op::Unary(*u, f(a)),
        Op::Binary(b, x, y) => Op::Binary(*b, f(x), f(y)),
        Op::Ternary(t, x, y, z) => Op::Ternary(*t, f(x), f(y), f(z)),
        Op::Cast(a) => Op::Cast(f(a)),
        Op::Bitcast(a) => Op::Bitcast(f(a)),
        Op::Reshape(a) => Op::Reshape(f(a)),
        Op::Permute(a, p) => Op::Permute(f(a), p.clone()),
        Op::Expand(a) => Op::Expand(f(a)),
        Op::Pad(a, p, v) => Op::Pad(f(a), p.clone(), *v),
        Op::Shrink(a, s) => Op::Shrink(f(a), s.clone()),
        Op::Flip(a, axes) => Op::Flip(f(a), axes.clone()),
        Op::Reduce(r, a, axes) => Op::Reduce(*r, f(a), axes.clone()),
        Op::Gather(a, i, axis) => Op::Gather(f(a), f(i), *axis),
        Op::Scatter(op, i, a, axis) => Op::Scatter(*op, f(i), f(a), *axis),
        Op::Argsort(a) => Op::Argsort(f(a)),
    }
}

/// Why kernelization failed. Every failure here is a bug in Tessel, reported as a value so
/// a realize fails cleanly instead of panicking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelizeError(pub String);

impl std::fmt::Display for KernelizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "internal error while building kernels: {}", self.0)
    }
}

impl std::error::Error for KernelizeError {}

/// Lowered kernels by the structure of what they compute, shared by the kernelizations
/// made through one handle: a model's layers repeat their kernels, and the planner's
/// alternative partitions of one graph (default, shared values, rows, routines) repeat
/// most of each other's. The free functions ([`kernelize`] and the rest) each use a fresh
/// one.
#[derive(Clone, Debug, Default)]
pub struct Lowerings(Arc<LowerMemo>);

impl Lowerings {
    /// [`kernelize`] with these lowerings.
    pub fn kernelize(&self, graph: &Graph, targets: &[NodeId]) -> Result<Schedule, KernelizeError> {
        self.kernelize_with(graph, targets, &[])
    }

    /// [`kernelize_with`] with these lowerings.
    pub fn kernelize_with(
        &self,
        graph: &Graph,
        targets: &[NodeId],
        separate: &[NodeId],
    ) -> Result<Schedule, KernelizeError> {
        kernelize_impl(
            graph,
            targets,
            separate,
            Mode::Serial,
            MAX_INLINE_OPS + 1,
            &self.0,
        )
    }

    /// [`kernelize_cooperative`] with these lowerings.
    pub fn kernelize_cooperative(
        &self,
        graph: &Graph,
        targets: &[NodeId],
    ) -> Result<Schedule, KernelizeError> {
        kernelize_impl(
            graph,
            targets,
            &[],
            Mode::Cooperative,
            MAX_INLINE_OPS + 1,
            &self.0,
        )
    }

    /// [`kernelize_rows`] with these lowerings.
    pub fn kernelize_rows(
        &self,
        graph: &Graph,
        targets: &[NodeId],
        separate: &[NodeId],
    ) -> Result<Option<Schedule>, KernelizeError> {
        let order = graph.toposort(targets);
        let materialized =
            choose_materialized(graph, &order, targets, separate, MAX_INLINE_OPS + 1);
        let mut stats = row_statistics(graph, &order, &materialized, targets);
        let (_, leaves) = signature(graph, targets);
        let leaf_slot: FxHashMap<LeafId, usize> =
            leaves.iter().enumerate().map(|(i, &l)| (l, i)).collect();
        while !stats.is_empty() {
            let fused: FxHashSet<NodeId> = materialized.difference(&stats).copied().collect();
            match build(
                (graph, &order),
                &fused,
                separate,
                &leaf_slot,
                false,
                Mode::Rows,
                &self.0,
            ) {
                Ok(Built {
                    kernels,
                    empty,
                    order: Some(sorted),
                }) => return Ok(Some(schedule(graph, kernels, &empty, sorted))),
                Ok(_) => return Ok(None),
                Err(Unsuitable::Mode(root, why)) => {
                    tracing::debug!(target: "tessel::kernels", "not a row kernel: {why}");
                    // Its statistics go back to buffers of their own.
                    let before = stats.len();
                    for n in graph.toposort(&[root]) {
                        stats.remove(&n);
                    }
                    if stats.len() == before {
                        return Ok(None);
                    }
                }
                Err(Unsuitable::Error(e)) => return Err(e),
            }
        }
        Ok(None)
    }

    /// [`kernelize_shared`] with these lowerings.
    pub fn kernelize_shared(
        &self,
        graph: &Graph,
        targets: &[NodeId],
        min_ops: usize,
    ) -> Result<Option<Schedule>, KernelizeError> {
        let order = graph.toposort(targets);
        let default = choose_materialized(graph, &order, targets, &[], MAX_INLINE_OPS + 1);
        let shared = choose_materialized(graph, &order, targets, &[], min_ops);
        if shared == default {
            return Ok(None);
        }
        kernelize_impl(graph, targets, &[], Mode::Serial, min_ops, &self.0).map(Some)
    }
}

/// Builds the schedule that computes `targets`. Targets that are already leaves need no
/// kernel. Leaves appear as [`Slot::Input`]s numbered as [`signature`] numbers them.
pub fn kernelize(graph: &Graph, targets: &[NodeId]) -> Result<Schedule, KernelizeError> {
    Lowerings::default().kernelize(graph, targets)
}

/// [`kernelize`], with the nodes of `separate` also materialized, each by a kernel of its
/// own (never absorbed as a second output of a consumer's kernel): an alternative
/// partition, e.g. one where a library routine can write a product its consumers read.
pub fn kernelize_with(
    graph: &Graph,
    targets: &[NodeId],
    separate: &[NodeId],
) -> Result<Schedule, KernelizeError> {
    Lowerings::default().kernelize_with(graph, targets, separate)
}

/// [`kernelize`], with every kernel whose reductions are long lowered cooperatively: a
/// workgroup per output element, its invocations striding through the reduction together
/// and combining partial results in local memory. On a GPU this reads memory coalesced and
/// keeps every core busy when there are few outputs (a row sum, softmax statistics); on a
/// CPU it is slower. An alternative partition, for measurement to choose.
pub fn kernelize_cooperative(
    graph: &Graph,
    targets: &[NodeId],
) -> Result<Schedule, KernelizeError> {
    Lowerings::default().kernelize_cooperative(graph, targets)
}

/// [`kernelize_cooperative`], with row statistics fused into the kernels that read them:
/// a reduction over the last axis that is only broadcast back along that axis (softmax's
/// max and sum, layer norm's mean and variance) is not materialized; each kernel reading
/// it gets a workgroup per row, computes the row's statistics cooperatively once, then
/// strides along the row. Softmax becomes one kernel reading each row from cache. A
/// kernel that cannot take this form (its reductions depend on the position along the
/// row) keeps its statistics materialized. The nodes of `separate` are materialized too,
/// as in [`kernelize_with`] (the operands and products of library matmuls, so the norms
/// and softmaxes between them are row kernels of their own). `None` when no statistics
/// fuse.
pub fn kernelize_rows(
    graph: &Graph,
    targets: &[NodeId],
    separate: &[NodeId],
) -> Result<Option<Schedule>, KernelizeError> {
    Lowerings::default().kernelize_rows(graph, targets, separate)
}

/// Materialized values that are row statistics: not targets, last dim 1, long reductions
/// inside, and consumed only by `Expand`s that broadcast them along that last dim to at
/// least [`MIN_COOPERATIVE_EXTENT`] elements.
fn row_statistics(
    graph: &Graph,
    order: &[NodeId],
    materialized: &FxHashSet<NodeId>,
    targets: &[NodeId],
) -> FxHashSet<NodeId> {
    let consumers = Consumers::of(graph, order);
    materialized
        .iter()
        .copied()
        .filter(|m| {
            let shape = &graph.node(*m).shape;
            let Some((last, outer)) = shape.dims().split_last() else {
                return false;
            };
            !targets.contains(m)
                && !graph.node(*m).op.runs_alone()
                && last.as_const() == Some(1)
                && !consumers.get(*m).is_empty()
                && consumers.get(*m).iter().all(|&c| {
                    let e = graph.node(c);
                    matches!(e.op, Op::Expand(_))
                        && e.shape.dims().split_last().is_some_and(|(len, o)| {
                            o == outer && len.bounds().hi >= MIN_COOPERATIVE_EXTENT
                        })
                })
        })
        .collect()
}

/// Why [`build`] gave up.
enum Unsuitable {
    /// A kernel (computing the node) cannot take the mode asked for.
    Mode(NodeId, String),
    /// A bug.
    Error(KernelizeError),
}

impl From<KernelizeError> for Unsuitable {
    fn from(e: KernelizeError) -> Self {
        Unsuitable::Error(e)
    }
}

/// The schedule of `kernels` run in `sorted` order.
fn schedule(
    graph: &Graph,
    kernels: Vec<ScheduledKernel>,
    empty: &[NodeId],
    sorted: Vec<usize>,
) -> Schedule {
    let mut kernels: Vec<Option<ScheduledKernel>> = kernels.into_iter().map(Some).collect();
    let kernels: Vec<ScheduledKernel> = sorted
        .into_iter()
        .filter_map(|i| kernels[i].take())
        .collect();
    let buffers = kernels
        .iter()
        .flat_map(|k| &k.writes)
        .chain(empty)
        .map(|&n| {
            let node = graph.node(n);
            (n, node.dtype, node.shape.numel())
        })
        .collect();
    Schedule { kernels, buffers }
}

fn kernelize_impl(
    graph: &Graph,
    targets: &[NodeId],
    separate: &[NodeId],
    mode: Mode,
    share_from: usize,
    memo: &Arc<LowerMemo>,
) -> Result<Schedule, KernelizeError> {
    let order = graph.toposort(targets);
    let (_, leaves) = signature(graph, targets);
    let leaf_slot: FxHashMap<LeafId, usize> =
        leaves.iter().enumerate().map(|(i, &l)| (l, i)).collect();
    let materialized = choose_materialized(graph, &order, targets, separate, share_from);

    // Absorbing producers into their consumers' kernels (multi-output kernels) can tie two
    // kernels in a cycle that no graph dependency shows (each writes a value the other
    // reads); then the schedule is rebuilt with one kernel per materialized value, whose
    // dependencies are the graph's own and so acyclic.
    let build = |absorb| {
        build(
            (graph, &order),
            &materialized,
            separate,
            &leaf_slot,
            absorb,
            mode,
            memo,
        )
        .map_err(|e| match e {
            Unsuitable::Error(e) => e,
            Unsuitable::Mode(_, why) => KernelizeError(format!("unexpectedly unsuitable: {why}")),
        })
    };
    let mut built = build(true)?;
    if built.order.is_none() {
        tracing::debug!(target: "tessel::kernels", "multi-output kernels formed a cycle; one kernel per value instead");
        built = build(false)?;
    }
    let Built {
        kernels,
        empty,
        order: Some(sorted),
    } = built
    else {
        return Err(KernelizeError(
            "kernels depend on each other in a cycle".into(),
        ));
    };
    Ok(schedule(graph, kernels, &empty, sorted))
}

/// The kernels computing `materialized` (consumers absorbing producers of their shape when
/// `absorb` is set; lowered in `mode`), the empty values, and the kernels in dependency
/// order (`None` if they form a cycle).
fn build(
    (graph, order): (&Graph, &[NodeId]),
    materialized: &FxHashSet<NodeId>,
    separate: &[NodeId],
    leaf_slot: &FxHashMap<LeafId, usize>,
    absorb: bool,
    mode: Mode,
    memo: &Arc<LowerMemo>,
) -> Result<Built, Unsuitable> {
    // Lower consumers before producers so a consumer can absorb a producer it evaluates at
    // its own coordinates; `absorbed` records who wrote what.
    let mut written_by: FxHashMap<NodeId, usize> = FxHashMap::default();
    let mut below = Reach::new(order);
    let mut kernels: Vec<ScheduledKernel> = Vec::new();
    let mut empty: Vec<NodeId> = Vec::new();
    // Shared by every kernel's recipe, made on the first.
    let mut context = None;
    for &root in order.iter().rev() {
        if !materialized.contains(&root) || written_by.contains_key(&root) {
            continue;
        }
        if graph.node(root).shape.numel().as_const() == Some(0) {
            // Nothing to compute: the buffer exists, no kernel runs.
            empty.push(root);
            continue;
        }
        // The materialized values this kernel may write beside its root: those it reaches
        // through values it computes in place (the only ones lowering can absorb), found by
        // walking its cone rather than by testing every materialized value per kernel, which
        // made a training step's kernelization quadratic.
        let qualifies = |m: NodeId| {
            absorb
                && !separate.contains(&m)
                && !written_by.contains_key(&m)
                && graph.node(m).shape == graph.node(root).shape
                && !graph.node(m).op.runs_alone()
        };
        let mut absorbable: FxHashSet<NodeId> = FxHashSet::default();
        let mut seen: FxHashSet<NodeId> = FxHashSet::default();
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            if !seen.insert(n) {
                continue;
            }
            if n != root && materialized.contains(&n) {
                if !qualifies(n) {
                    continue;
                }
                absorbable.insert(n);
            }
            stack.extend(graph.node(n).op.children());
        }
        let lowered = loop {
            let cone = Cone::new(graph, root, materialized, &absorbable, format!("{mode:?}"));
            let mut not_done = None;
            let done = memo.get_or_lower(graph, leaf_slot, cone, || {
                match lower_kernel(
                    graph,
                    root,
                    materialized,
                    &absorbable,
                    leaf_slot,
                    mode,
                    Knobs::default(),
                )? {
                    Lowering::Done(k) => Ok(Some(vec![(Knobs::default(), *k)])),
                    other => {
                        not_done = Some(other);
                        Ok(None)
                    }
                }
            })?;
            let lowered = match done.and_then(|mut k| k.pop()).map(|(_, k)| k).map_or_else(
                || not_done.ok_or_else(|| KernelizeError("a kept lowering was empty".into())),
                |k| Ok(Lowering::Done(Box::new(k))),
            )? {
                Lowering::Done(k) => *k,
                Lowering::Unsuitable(root, why) => return Err(Unsuitable::Mode(root, why)),
                Lowering::Retry(conflicts) => {
                    for m in conflicts {
                        absorbable.remove(&m);
                    }
                    continue;
                }
            };
            // Absorbing `m` is only sound if no other input of this kernel depends on `m`
            // (that input's kernel would need `m` before this kernel runs).
            let bad: Vec<NodeId> = lowered
                .writes
                .iter()
                .skip(1)
                .copied()
                .filter(|m| {
                    lowered.args.iter().any(|a| matches!(a, Slot::Node(n) if !lowered.writes.contains(n) && below.depends_on(graph, *n, *m)))
                })
                .collect();
            if bad.is_empty() {
                break lowered;
            }
            for m in bad {
                absorbable.remove(&m);
            }
        };
        for &w in &lowered.writes {
            written_by.insert(w, kernels.len());
        }
        let mut lowered = lowered;
        if !graph.node(root).op.runs_alone() {
            let context = context.get_or_insert_with(|| {
                (Arc::new(materialized.clone()), Arc::new(leaf_slot.clone()))
            });
            lowered.recipe = Some(Arc::new(Recipe {
                root,
                materialized: context.0.clone(),
                absorbable,
                leaf_slot: context.1.clone(),
                mode,
                memo: memo.clone(),
            }));
        }
        kernels.push(lowered);
    }

    // Producers first: a kernel runs after every kernel writing a slot it reads.
    let mut done = vec![false; kernels.len()];
    let mut sorted = Vec::with_capacity(kernels.len());
    while sorted.len() < kernels.len() {
        let before = sorted.len();
        for (i, k) in kernels.iter().enumerate() {
            if done[i] {
                continue;
            }
            let ready = k.args.iter().all(|a| match a {
                Slot::Node(n) => written_by.get(n).is_none_or(|&w| w == i || done[w]),
                Slot::Input(_) => true,
            });
            if ready {
                done[i] = true;
                sorted.push(i);
            }
        }
        if sorted.len() == before {
            return Ok(Built {
                kernels,
                empty,
                order: None,
            });
        }
    }
    Ok(Built {
        kernels,
        empty,
        order: Some(sorted),
    })
}

/// What [`build`] made.
struct Built {
    kernels: Vec<ScheduledKernel>,
    /// Zero-element values: a buffer, no kernel.
    empty: Vec<NodeId>,
    /// The kernels in dependency order, `None` if they wait on each other in a cycle.
    order: Option<Vec<usize>>,
}

/// Whether materialized node `from` needs `target`'s value (through unmaterialized nodes,
/// or through other materialized nodes, which need it in turn). A walk from `from` down its
/// operands that skips every node placed before `target` in the topological order: such a
/// node's operands come earlier still, so `target` is not among them. Without that bound
/// (a fresh walk per query, or each node's whole set of descendants) a training step's
/// kernelization spent most of its time here.
struct Reach {
    /// Each node's place in the topological order (operands before their users).
    position: FxHashMap<NodeId, usize>,
    seen: FxHashSet<NodeId>,
    stack: Vec<NodeId>,
}

impl Reach {
    fn new(order: &[NodeId]) -> Reach {
        Reach {
            position: order.iter().enumerate().map(|(i, &n)| (n, i)).collect(),
            seen: FxHashSet::default(),
            stack: Vec::new(),
        }
    }

    fn depends_on(&mut self, graph: &Graph, from: NodeId, target: NodeId) -> bool {
        let floor = self.position.get(&target).copied().unwrap_or(0);
        let below = |position: &FxHashMap<NodeId, usize>, n: NodeId| {
            position.get(&n).is_some_and(|&p| p < floor)
        };
        if from == target || below(&self.position, from) {
            return from == target;
        }
        self.seen.clear();
        self.stack.clear();
        self.stack.push(from);
        while let Some(n) = self.stack.pop() {
            for c in graph.node(n).op.operands() {
                if c == target {
                    return true;
                }
                if !below(&self.position, c) && self.seen.insert(c) {
                    self.stack.push(c);
                }
            }
        }
        false
    }
}

/// Above this many inlined ops, a value with several consumers is materialized.
const MAX_INLINE_OPS: usize = 64;

/// The planner's threshold for [`kernelize_shared`]: below 16 ops, recomputing a shared
/// value in each consumer is the obvious choice (memory, not arithmetic, bounds such
/// kernels), and measuring the alternative would only cost compile time.
pub const SHARED_MIN_OPS: usize = 16;

/// A value with several consumers that reads this many distinct buffers of its own size is
/// materialized:
/// each consumer recomputing it reads all of them (`c·k` reads for `c` consumers), against
/// `k` reads, a write and `c` reads once it is a buffer; from 4 on that is less for any
/// `c ≥ 2`.
const SHARED_LOADS: usize = 4;

/// [`kernelize`], with every value that has several consumers and costs at least
/// `min_ops` ops computed once into a buffer instead of inlined into each consumer: the
/// other side of a choice only measurement settles (recomputing costs arithmetic, sharing
/// costs a write and reads). `None` when that changes nothing.
pub fn kernelize_shared(
    graph: &Graph,
    targets: &[NodeId],
    min_ops: usize,
) -> Result<Option<Schedule>, KernelizeError> {
    Lowerings::default().kernelize_shared(graph, targets, min_ops)
}

/// Views whose index arithmetic every consumer's kernel carries per element it reads:
/// pads (a bounds check) and reshapes of permuted, shrunk, flipped, padded or expanded
/// values (divisions and remainders). Given to [`kernelize_with`] as `separate`, each is
/// copied once into a contiguous buffer its consumers read plainly: the split-out
/// alternative to fusing them into their neighbours, for measurement to choose. Views of
/// leaves and constants stay fused: copying one out reads the same bytes the fused
/// kernel would (`cat` of tensors and their views stays one kernel).
pub fn views_to_split(graph: &Graph, order: &[NodeId]) -> Vec<NodeId> {
    let computed = |mut n: NodeId| loop {
        let op = &graph.node(n).op;
        match op.children().as_slice() {
            [inner] if op.is_movement() => n = *inner,
            [] => return false,
            _ => return true,
        }
    };
    order
        .iter()
        .copied()
        .filter(|&n| match &graph.node(n).op {
            Op::Pad(x, ..) => computed(*x),
            Op::Reshape(x) => {
                let inner = graph.node(*x);
                matches!(
                    inner.op,
                    Op::Permute(..) | Op::Shrink(..) | Op::Flip(..) | Op::Pad(..) | Op::Expand(_)
                ) && inner.op.children().into_iter().any(computed)
            }
            _ => false,
        })
        .collect()
}

/// The nodes that get buffers, `separate` among them, a value with several consumers once
/// it inlines at least `share_from` ops. See the module docs for the rules; `separate`
/// counts from the start, so a bias added to a product a library routine writes is not
/// taken for a reduction (and materialized for its several consumers).
fn choose_materialized(
    graph: &Graph,
    order: &[NodeId],
    targets: &[NodeId],
    separate: &[NodeId],
    share_from: usize,
) -> FxHashSet<NodeId> {
    let mut out: FxHashSet<NodeId> = targets
        .iter()
        .chain(separate)
        .copied()
        .filter(|&t| !matches!(graph.node(t).op, Op::Leaf(_)))
        .collect();
    let mut consumers: FxHashMap<NodeId, usize> = FxHashMap::default();
    for &n in order {
        for c in graph.node(n).op.children() {
            *consumers.entry(c).or_default() += 1;
        }
    }
    // Whether a node's own kernel would contain a reduction.
    let mut has_reduce: FxHashMap<NodeId, bool> = FxHashMap::default();
    // Ops a kernel evaluates to compute the node, shared operands counted once per use:
    // what recomputing it in each consumer costs.
    let mut inline_ops: FxHashMap<NodeId, usize> = FxHashMap::default();
    // The distinct buffers of the node's size a kernel reads to compute it (leaves and
    // materialized values), up to `SHARED_LOADS` of them: what recomputing it costs in
    // memory traffic.
    let mut inline_loads: FxHashMap<NodeId, Vec<NodeId>> = FxHashMap::default();
    for &n in order {
        let node = graph.node(n);
        let own = match node.op {
            // Ten Philox rounds of wide multiplies and xors.
            Op::Random(..) => crate::random::OPS,
            _ => usize::from(!node.op.is_movement() && !node.op.children().is_empty()),
        };
        let ops = node
            .op
            .children()
            .iter()
            .filter(|c| !out.contains(*c))
            .fold(own, |acc, c| acc.saturating_add(inline_ops[c]));
        // Only reads as large as the value count: small tables (an interpolation's
        // weights) stay in cache however often they are read.
        let numel = node.shape.numel();
        let mut loads: Vec<NodeId> = Vec::new();
        for c in node.op.children() {
            for &b in &inline_loads[&c] {
                if loads.len() < SHARED_LOADS
                    && !loads.contains(&b)
                    && graph.node(b).shape.numel() == numel
                {
                    loads.push(b);
                }
            }
        }
        let shared = consumers.get(&n).copied().unwrap_or(0) > 1;
        // A large value used several times is computed once, not once per use: without
        // this a deep elementwise DAG that reuses values (a residual stream) grows every
        // kernel with the depth. So is one that reads many buffers: a residual stream's
        // sums are few ops each, but recomputed in every layer's kernels they read every
        // earlier layer's output again.
        // A scatter's kernel runs over its sources, adding into its own buffer; a sort's
        // over its rows, in local memory.
        if node.op.runs_alone() || (shared && (ops >= share_from || loads.len() >= SHARED_LOADS)) {
            out.insert(n);
        }
        inline_ops.insert(n, if out.contains(&n) { 0 } else { ops });
        let read_whole = out.contains(&n) || matches!(node.op, Op::Leaf(_));
        inline_loads.insert(n, if read_whole { vec![n] } else { loads });
        // A reduction read at other coordinates than its own would be recomputed per
        // element read: broadcast (`Expand`) or gathered.
        // A custom kernel reads its inputs as row-major buffers.
        if let Op::Custom(_, inputs) = &node.op {
            for &c in inputs {
                if !matches!(graph.node(c).op, Op::Leaf(_)) {
                    out.insert(c);
                }
            }
        }
        if let Op::Expand(child) | Op::Gather(child, ..) | Op::Random(child, _) = node.op
            && has_reduce[&child]
        {
            out.insert(child);
        }
        // A reduction of a value that itself reduces is two kernels: nested in one, every
        // invocation of the outer reduction would add up all its inner sums in turn, which
        // undoes a sum split into blocks of rows (a column sum over many rows as
        // `sum(sum(blocks))`) and leaves one serial loop per output.
        if let Op::Reduce(_, child, _) = node.op
            && has_reduce[&child]
        {
            out.insert(child);
        }

        let inner = node
            .op
            .children()
            .iter()
            .any(|c| has_reduce[c] && !out.contains(c));
        let reduces = matches!(node.op, Op::Reduce(..)) || inner;
        if reduces && consumers.get(&n).copied().unwrap_or(0) > 1 {
            out.insert(n);
        }
        has_reduce.insert(n, reduces);
    }
    out
}
