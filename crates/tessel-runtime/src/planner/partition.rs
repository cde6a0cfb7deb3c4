//! Step 1 of planning: the forms of a realize's subgraph partitioned into candidate
//! kernels and routines (see the module above).

use std::sync::LazyLock;
use std::time::Duration;

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_graph::egraph::{self, Budget as RewriteBudget, Form, StopReason};
use tessel_graph::exact::{compared_sums, sums_computed_by};
use tessel_graph::{
    Graph, KernelizeError, LeafId, Lowerings, NodeId, Op, SHARED_MIN_OPS, Schedule, Slot,
    find_attention, find_matmuls, materialized_for, signature, views_to_split,
};
use tessel_ir::attention::{attention_decode_kernel, attention_kernel};
use tessel_ir::attention_backward::attention_backward_kernel;
use tessel_ir::cache::Fnv128;
use tessel_ir::{Kernel, VendorOp};
use tessel_shape::{DType, Dim};

use crate::determinism::Numerics;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tuning::{self, TuneTag, Tuner, Tuning};

use super::{PlanSlot, cooperative_workgroups};

/// What a candidate runs.
pub(crate) enum Work {
    Kernel(Kernel),
    Vendor(VendorOp),
}

impl Work {
    /// The program's text: its identity for the timing cache and the logs.
    pub(crate) fn text(&self) -> String {
        match self {
            Work::Kernel(k) => k.to_string(),
            Work::Vendor(op) => op.to_string(),
        }
    }

    pub(crate) fn name(&self) -> String {
        match self {
            Work::Kernel(k) => k.name.clone(),
            Work::Vendor(op) => op.to_string(),
        }
    }
}

/// A program that could run: the values it writes and reads, by value number (the
/// e-class's, see [`Numbering`]; the simplified form's topological positions).
pub(crate) struct Candidate {
    pub(crate) work: Work,
    pub(crate) args: Vec<PlanSlot>,
    pub(crate) writes: Vec<usize>,
    /// From the default partition: the reference others are checked against.
    pub(crate) default: bool,
    /// From the partition made for library routines: worth compiling only if the backend
    /// has one.
    pub(super) for_routine: bool,
    /// From a partition whose workgroups cooperate through local memory: compiled only
    /// for devices with `Features::cooperative_workgroups`.
    pub(super) cooperative: bool,
    /// A kernel whose launch shapes are searched: which kernel, and which shape this is.
    pub(crate) tuning: Option<TuneTag>,
    /// A portable kernel standing in for the routine of candidate `k`: compiled for a
    /// device only where its backend offers no program for that routine.
    pub(super) stands_in_for: Option<usize>,
    /// The float sums it computes for itself that a plan must compute only once (see
    /// `tessel_graph::exact`), by value number.
    pub(crate) computes: Vec<usize>,
}

impl Candidate {
    /// Whether `other` runs the same work on the same values.
    fn same_as(&self, other: &Candidate) -> bool {
        self.writes == other.writes
            && self.args == other.args
            && match (&self.work, &other.work) {
                (Work::Kernel(a), Work::Kernel(b)) => a == b,
                (Work::Vendor(a), Work::Vendor(b)) => a == b,
                _ => false,
            }
    }

    /// The values it reads, then those it writes.
    pub(crate) fn touched(&self) -> impl Iterator<Item = PlanSlot> + '_ {
        self.reads()
            .chain(self.writes.iter().map(|&w| PlanSlot::Node(w)))
    }

    /// The values it reads (inputs included), each once.
    pub(crate) fn reads(&self) -> impl Iterator<Item = PlanSlot> + '_ {
        let mut seen = Vec::new();
        self.args.iter().copied().filter(move |a| {
            let fresh =
                !matches!(a, PlanSlot::Node(p) if self.writes.contains(p)) && !seen.contains(a);
            if fresh {
                seen.push(*a);
            }
            fresh
        })
    }
}

/// The candidates of one realize, before compilation.
pub(crate) struct Partitions {
    pub(super) candidates: Vec<Candidate>,
    /// Dtype and element count of every value some candidate writes, and of empty targets.
    pub(super) buffers: FxHashMap<usize, (DType, Dim)>,
    /// Dtype and element count of each input, in signature order.
    pub(super) input_sizes: Vec<(DType, Dim)>,
    /// Zero-element targets: a buffer, no kernel.
    pub(super) empty: Vec<usize>,
    pub(super) targets: Vec<usize>,
    pub(super) inputs: Vec<usize>,
    pub(super) outputs: Vec<(usize, usize)>,
    /// The level the variants were made for, which decides where they compile.
    pub(super) tuning: Tuning,
    /// Whether only routines that repeat their results bit for bit may be built
    /// ([`crate::use_deterministic_algorithms`]).
    pub(super) deterministic: bool,
    /// The candidates by the values they write: a new candidate is compared only with
    /// those writing the same ones (a scan of them all made adding quadratic).
    by_writes: FxHashMap<Vec<usize>, Vec<usize>>,
}

impl Partitions {
    /// Whether a candidate equal to `c` is present.
    fn contains(&self, c: &Candidate) -> bool {
        self.by_writes
            .get(&c.writes)
            .is_some_and(|same| same.iter().any(|&i| self.candidates[i].same_as(c)))
    }

    fn push(&mut self, c: Candidate) {
        self.by_writes
            .entry(c.writes.clone())
            .or_default()
            .push(self.candidates.len());
        self.candidates.push(c);
    }

    /// Hashes everything a plan chosen from these candidates depends on (see
    /// [`crate::plan_cache`]).
    pub(crate) fn fingerprint(&self, h: &mut Fnv128) {
        for c in &self.candidates {
            h.field(c.work.text().as_bytes());
            h.field(
                format!(
                    "{:?} {:?} {} {} {} {:?} {:?}",
                    c.args,
                    c.writes,
                    c.default,
                    c.for_routine,
                    c.cooperative,
                    c.stands_in_for,
                    c.computes
                )
                .as_bytes(),
            );
        }
        let mut buffers: Vec<_> = self.buffers.iter().collect();
        buffers.sort_unstable_by_key(|(p, _)| **p);
        h.field(
            format!(
                "{buffers:?} {:?} {:?} {:?} {:?} {:?}",
                self.input_sizes, self.empty, self.targets, self.inputs, self.outputs
            )
            .as_bytes(),
        );
    }
}

/// The longest a realize's e-graph saturation may run: far past what the iteration and
/// e-node budgets allow on the graphs measured (a 2-layer GPT-2 training step saturates in
/// 5 iterations, 12 ms on a 2-core development machine).
const SATURATION_GUARD: Duration = Duration::from_secs(2);

/// Whether the e-graph rewrites run (`TESSEL_REWRITES=0` turns them off, for debugging).
fn rewrites_enabled() -> bool {
    static ON: LazyLock<bool> =
        LazyLock::new(|| std::env::var("TESSEL_REWRITES").map_or(true, |v| v.trim() != "0"));
    *ON
}

/// Builds the candidates for `targets`, whose subgraph reads `leaves` (in signature
/// order), for `devices`: the partitions of the e-graph's forms (see the module docs),
/// every value named by its e-class, so programs of different forms are alternatives for
/// the same values.
pub(crate) fn partition(
    graph: &Graph,
    targets: &[NodeId],
    leaves: &[LeafId],
    devices: &[Device],
    numerics: Numerics,
    tuning: Tuning,
) -> Result<Partitions> {
    let tuner = Tuner::new(tuning, devices);
    // One set of lowerings for every partition of every form: they repeat most kernels.
    let lowerings = Lowerings::default();
    let size = graph.toposort(targets).len();
    // The iterations and e-nodes bound the search; the clock is only a guard. The forms
    // must not depend on how fast this host saturates: the candidates they give are the
    // stored plan's key. With a 50 ms cut, warm processes sometimes planned GPT-2's
    // training step anew (31 s instead of 3 s) on a loaded host: the only wall-clock
    // input to the key, and a 2-layer step already takes 12 ms to saturate here.
    let saturated = RewriteBudget {
        iterations: 16,
        nodes: 4 * size + 256,
        time: SATURATION_GUARD,
    };
    let as_recorded = RewriteBudget {
        iterations: 0,
        ..saturated
    };
    // A target that became a leaf, or the same node as another target, would need a copy
    // the plan does not make: such a realize runs its graph as recorded.
    let usable = |f: &Form| {
        let distinct: FxHashSet<NodeId> = f.targets.iter().copied().collect();
        distinct.len() == f.targets.len()
            && f.targets
                .iter()
                .all(|&t| !matches!(f.graph.node(t).op, Op::Leaf(_)))
    };
    let mut forms = if rewrites_enabled() {
        let forms = egraph::forms(graph, targets, saturated);
        if forms.report.stop_reason == StopReason::TimeLimit {
            tracing::warn!(target: "tessel::plan", "rewriting {size} nodes stopped after {:?}: another process may rewrite them further and not find this plan in the plan cache", SATURATION_GUARD);
        }
        forms.forms
    } else {
        Vec::new()
    };
    if forms.first().is_none_or(|f| !usable(f)) {
        forms = egraph::forms(graph, targets, as_recorded).forms;
        forms.truncate(1);
    }
    let internal = |e: tessel_graph::KernelizeError| Error::Internal(e.to_string());
    let mut numbering = Numbering::default();
    let mut parts: Option<Partitions> = None;
    // The float sums some form compares on both sides, by value number.
    let mut compared: FxHashSet<usize> = FxHashSet::default();
    // The nodes the default partition materializes (form 0's graph).
    let mut default_materialized: Vec<NodeId> = Vec::new();
    for (f, form) in forms.iter().enumerate() {
        let (graph, targets) = (&form.graph, form.targets.as_slice());
        let order = graph.toposort(targets);
        let slots = numbering.number(form, &order, leaves)?;
        compared.extend(compared_sums(graph, &order).iter().map(|n| slots.pos[n]));
        let parts = parts.get_or_insert_with(|| {
            let pos = |t: &NodeId| slots.pos[t];
            Partitions {
                candidates: Vec::new(),
                buffers: FxHashMap::default(),
                input_sizes: Vec::new(),
                empty: Vec::new(),
                targets: targets.iter().map(pos).collect(),
                inputs: Vec::new(),
                outputs: targets
                    .iter()
                    .enumerate()
                    .map(|(k, t)| (pos(t), k))
                    .collect(),
                tuning,
                deterministic: numerics.deterministic,
                by_writes: FxHashMap::default(),
            }
        });
        let add = |parts: &mut Partitions, schedule: &Schedule, origin: Origin| {
            add_schedule(parts, schedule, &slots, origin, (graph, &tuner));
        };
        let mut matches = find_matmuls(graph, &order);
        matches.extend(find_attention(graph, &order, &matches));
        let separate = materialized_for(&matches);
        // This form's partitions, kernelized concurrently on a large graph (each lowers
        // hundreds of kernels; they share `lowerings`), then added in this order, on which
        // the candidates' numbering and so the plan cache's key depend.
        let split = if f == 0 {
            views_to_split(graph, &order)
        } else {
            Vec::new()
        };
        let mut jobs: Vec<Job<'_>> = Vec::new();
        if f == 0 {
            jobs.push((
                Origin::Default,
                Box::new(|| lowerings.kernelize(graph, targets).map(Some)),
            ));
            // Shared values computed once instead of inlined into each consumer.
            jobs.push((
                Origin::Shared,
                Box::new(|| lowerings.kernelize_shared(graph, targets, SHARED_MIN_OPS)),
            ));
            // Pads and costly reshapes copied out once instead of fused into each reader.
            if !split.is_empty() {
                jobs.push((
                    Origin::Shared,
                    Box::new(|| lowerings.kernelize_with(graph, targets, &split).map(Some)),
                ));
            }
        }
        // Where a workgroup's invocations run concurrently (GPUs), long reductions may run
        // faster with a workgroup per output; elsewhere that only adds barriers.
        if devices.iter().any(|d| cooperative_workgroups(*d)) {
            if f == 0 {
                jobs.push((
                    Origin::Cooperative,
                    Box::new(|| {
                        let cooperative = lowerings.kernelize_cooperative(graph, targets)?;
                        Ok(cooperative
                            .kernels
                            .iter()
                            .any(|k| k.cooperative)
                            .then_some(cooperative))
                    }),
                ));
            }
            // And row statistics fused into the kernels reading them (one-kernel softmax),
            // between matrix products materialized for the library routines.
            jobs.push((
                Origin::Cooperative,
                Box::new(|| lowerings.kernelize_rows(graph, targets, &separate)),
            ));
        }
        if !matches.is_empty() {
            jobs.push((
                Origin::Routine,
                Box::new(|| {
                    lowerings
                        .kernelize_with(graph, targets, &separate)
                        .map(Some)
                }),
            ));
        }
        let mut alternative = None;
        for (origin, schedule) in run_jobs(jobs, size >= CONCURRENT_MIN_NODES) {
            let Some(schedule) = schedule.map_err(internal)? else {
                continue;
            };
            add(parts, &schedule, origin);
            match origin {
                Origin::Default => {
                    default_materialized = schedule.buffers.iter().map(|b| b.0).collect();
                    let written: FxHashSet<usize> = parts
                        .candidates
                        .iter()
                        .flat_map(|c| c.writes.iter().copied())
                        .collect();
                    parts.empty = parts
                        .buffers
                        .keys()
                        .copied()
                        .filter(|p| !written.contains(p))
                        .collect();
                }
                Origin::Routine => alternative = Some(schedule),
                Origin::Cooperative | Origin::Shared => {}
            }
        }
        // The routine partition exists exactly where the graph holds products.
        let Some(alternative) = alternative else {
            continue;
        };
        // A value the default partition materializes and the routine one fuses away may be
        // read by a chosen kernel of another partition; its only producer would then be
        // the default kernel computing a product inline (GPT-2's MLP output with its
        // residual: a naive matmul, 10 ms against cuBLAS's 0.4 ms). Materializing both
        // partitions' values gives each a producer reading the routines' products.
        if f == 0 {
            let routine: FxHashSet<NodeId> = alternative.buffers.iter().map(|b| b.0).collect();
            if default_materialized.iter().any(|n| !routine.contains(n)) {
                let mut both = separate.clone();
                both.extend(default_materialized.iter().filter(|n| !routine.contains(n)));
                both.sort_unstable();
                both.dedup();
                let union = lowerings
                    .kernelize_with(graph, targets, &both)
                    .map_err(internal)?;
                add(parts, &union, Origin::Routine);
            }
        }
        for m in &matches {
            for &w in &m.writes {
                // The values it writes: this alias of the first result, then the others.
                let written: Vec<NodeId> = std::iter::once(w)
                    .chain(m.also_writes.iter().copied())
                    .collect();
                for &n in &written {
                    let node = graph.node(n);
                    parts
                        .buffers
                        .insert(slots.pos[&n], (node.dtype, node.shape.numel()));
                }
                let candidate = Candidate {
                    work: Work::Vendor(match &m.op {
                        VendorOp::Matmul(op) => {
                            VendorOp::Matmul(numerics.precision.apply(op.clone()))
                        }
                        op @ (VendorOp::Attention(_) | VendorOp::AttentionBackward(_)) => {
                            op.clone()
                        }
                    }),
                    args: m
                        .operands
                        .iter()
                        .map(|o| slots.slot(*o))
                        .chain(written.iter().map(|n| PlanSlot::Node(slots.pos[n])))
                        .collect(),
                    writes: written.iter().map(|n| slots.pos[n]).collect(),
                    default: false,
                    for_routine: true,
                    cooperative: false,
                    tuning: None,
                    stands_in_for: None,
                    computes: sums_computed_by(graph, &written, &m.operands)
                        .iter()
                        .map(|n| slots.pos[n])
                        .collect(),
                };
                if parts.contains(&candidate) {
                    continue;
                }
                // Portable attention kernels: the row kernel where the backend has no fused
                // kernel of its own, and for a few queries (decoding) the kernel splitting
                // the keys among a workgroup's invocations, measured on every device whose
                // invocations run concurrently (on a CPU they run one after another, and
                // the composition's library products win).
                // The backward pieces of an attention get their portable kernels where no
                // backend offers one.
                let mut portable: Vec<(Kernel, bool)> = Vec::new();
                let lens: Vec<Dim> = m
                    .operands
                    .iter()
                    .chain(&written)
                    .map(|&n| graph.node(n).shape.numel())
                    .collect();
                let built = match &m.op {
                    VendorOp::Attention(op) => vec![
                        (attention_kernel(op, &lens), true),
                        (attention_decode_kernel(op, &lens), false),
                    ],
                    VendorOp::AttentionBackward(op) => {
                        vec![(attention_backward_kernel(op, &lens), true)]
                    }
                    VendorOp::Matmul(_) => Vec::new(),
                };
                for (kernel, stand_in) in built {
                    match kernel {
                        Ok(kernel) => portable.push((kernel, stand_in)),
                        Err(why) => {
                            tracing::trace!(target: "tessel::plan", "no portable kernel for {}: {why}", m.op);
                        }
                    }
                }
                let routine = parts.candidates.len();
                let (args, writes) = (candidate.args.clone(), candidate.writes.clone());
                let computes = candidate.computes.clone();
                parts.push(candidate);
                for (kernel, stand_in) in portable {
                    parts.push(Candidate {
                        work: Work::Kernel(kernel),
                        args: args.clone(),
                        writes: writes.clone(),
                        default: false,
                        for_routine: true,
                        cooperative: !stand_in,
                        tuning: None,
                        stands_in_for: stand_in.then_some(routine),
                        computes: computes.clone(),
                    });
                }
            }
        }
    }
    let mut parts = parts.ok_or_else(|| Error::Internal("the e-graph gave no form".into()))?;
    if !compared.is_empty() {
        tracing::debug!(target: "tessel::plan", "{} float sums compared with themselves: each computed once", compared.len());
    }
    for c in &mut parts.candidates {
        c.computes.retain(|p| compared.contains(p));
    }
    parts.inputs = numbering.inputs;
    parts.input_sizes = numbering.input_sizes;
    Ok(parts)
}

/// Values (e-classes) and inputs numbered across forms: a value keeps its number in every
/// form, the first form's values numbered in its topological order.
#[derive(Default)]
struct Numbering {
    values: FxHashMap<egraph::ClassId, usize>,
    /// Plan input `k` is the realize's leaf `inputs[k]`.
    inputs: Vec<usize>,
    /// Dtype and element count of each plan input.
    input_sizes: Vec<(DType, Dim)>,
}

/// One form's nodes in a [`Numbering`].
struct FormSlots {
    /// Each node's value number.
    pos: FxHashMap<NodeId, usize>,
    /// The form's `k`-th leaf (in its signature order) is plan input `inputs[k]`.
    inputs: Vec<usize>,
    /// Each leaf node's plan input.
    leaf_inputs: FxHashMap<NodeId, usize>,
}

impl FormSlots {
    /// Where a routine finds `node`'s buffer.
    fn slot(&self, node: NodeId) -> PlanSlot {
        match self.leaf_inputs.get(&node) {
            Some(&k) => PlanSlot::Input(k),
            None => PlanSlot::Node(self.pos[&node]),
        }
    }
}

impl Numbering {
    fn number(&mut self, form: &Form, order: &[NodeId], leaves: &[LeafId]) -> Result<FormSlots> {
        let graph = &form.graph;
        let mut pos = FxHashMap::default();
        for &n in order {
            let next = self.values.len();
            pos.insert(n, *self.values.entry(form.classes[&n]).or_insert(next));
        }
        let (_, own) = signature(graph, &form.targets);
        // Each leaf's node, for its dtype and size.
        let leaf_nodes: FxHashMap<LeafId, NodeId> = order
            .iter()
            .filter_map(|&n| match graph.node(n).op {
                Op::Leaf(l) => Some((l, n)),
                _ => None,
            })
            .collect();
        let mut by_leaf: FxHashMap<LeafId, usize> = FxHashMap::default();
        for &leaf in &own {
            let realized = leaves
                .iter()
                .position(|x| *x == leaf)
                .ok_or_else(|| Error::Internal("rewriting the graph invented a leaf".into()))?;
            if let Some(k) = self.inputs.iter().position(|&i| i == realized) {
                by_leaf.insert(leaf, k);
                continue;
            }
            let node = leaf_nodes
                .get(&leaf)
                .map(|&n| graph.node(n))
                .ok_or_else(|| Error::Internal("a leaf outside its graph".into()))?;
            self.inputs.push(realized);
            self.input_sizes.push((node.dtype, node.shape.numel()));
            by_leaf.insert(leaf, self.inputs.len() - 1);
        }
        let inputs = own.iter().map(|l| by_leaf[l]).collect();
        let leaf_inputs = order
            .iter()
            .filter_map(|&n| match graph.node(n).op {
                Op::Leaf(l) => Some((n, by_leaf[&l])),
                _ => None,
            })
            .collect();
        Ok(FormSlots {
            pos,
            inputs,
            leaf_inputs,
        })
    }
}

/// A partition to kernelize, with the kind it is.
type Job<'a> = (
    Origin,
    Box<dyn FnOnce() -> std::result::Result<Option<Schedule>, KernelizeError> + Send + 'a>,
);

/// Graphs of at least this many nodes kernelize their partitions on several threads: below
/// it the threads' start costs more than the lowering they share.
const CONCURRENT_MIN_NODES: usize = 256;

/// Each job's schedule, in the jobs' order: the first on this thread and the others on
/// threads of their own where `concurrent` is set, else one after another.
fn run_jobs(
    jobs: Vec<Job<'_>>,
    concurrent: bool,
) -> Vec<(
    Origin,
    std::result::Result<Option<Schedule>, KernelizeError>,
)> {
    if !concurrent || jobs.len() < 2 {
        return jobs.into_iter().map(|(o, job)| (o, job())).collect();
    }
    std::thread::scope(|scope| {
        let mut jobs = jobs.into_iter();
        let first = jobs.next();
        let spawned: Vec<_> = jobs.map(|(o, job)| (o, scope.spawn(job))).collect();
        let mut out: Vec<_> = first.into_iter().map(|(o, job)| (o, job())).collect();
        for (o, handle) in spawned {
            let schedule = handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            out.push((o, schedule));
        }
        out
    })
}

/// Which partition a schedule is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    Default,
    /// Made for library routines.
    Routine,
    /// Cooperative or row kernels, for devices with cooperative workgroups.
    Cooperative,
    /// Shared values or views materialized: on every device, not the reference.
    Shared,
}

/// Adds a schedule's kernels (skipping ones already present), each new one's launch-shape
/// variants where the tuner searches it, and the schedule's buffers.
fn add_schedule(
    parts: &mut Partitions,
    schedule: &Schedule,
    slots: &FormSlots,
    origin: Origin,
    (graph, tuner): (&Graph, &Tuner<'_>),
) {
    for (n, dtype, numel) in &schedule.buffers {
        parts.buffers.insert(slots.pos[n], (*dtype, *numel));
    }
    for k in &schedule.kernels {
        let reads: Vec<NodeId> = k
            .args
            .iter()
            .filter_map(|a| match a {
                Slot::Node(n) if !k.writes.contains(n) => Some(*n),
                Slot::Node(_) | Slot::Input(_) => None,
            })
            .collect();
        let mut candidate = Candidate {
            args: k
                .args
                .iter()
                .map(|a| match a {
                    Slot::Input(i) => PlanSlot::Input(slots.inputs[*i]),
                    Slot::Node(n) => PlanSlot::Node(slots.pos[n]),
                })
                .collect(),
            writes: k.writes.iter().map(|w| slots.pos[w]).collect(),
            work: Work::Kernel(k.kernel.clone()),
            default: origin == Origin::Default,
            for_routine: origin == Origin::Routine,
            cooperative: origin == Origin::Cooperative,
            tuning: None,
            stands_in_for: None,
            computes: sums_computed_by(graph, &k.writes, &reads)
                .iter()
                .map(|n| slots.pos[n])
                .collect(),
        };
        if parts.contains(&candidate) {
            continue;
        }
        let variants = tuner.variants(graph, k);
        // The base's index names the group of shapes that may replace each other.
        let group = parts.candidates.len();
        let kernel = if variants.is_empty() {
            0
        } else {
            let kernel = tuning::kernel_key(&k.kernel);
            candidate.tuning = Some(TuneTag::default_of(kernel, group));
            kernel
        };
        let variants: Vec<Candidate> = variants
            .into_iter()
            .map(|(knobs, variant)| Candidate {
                work: Work::Kernel(variant.kernel),
                args: candidate.args.clone(),
                writes: candidate.writes.clone(),
                default: false,
                for_routine: candidate.for_routine,
                cooperative: candidate.cooperative,
                stands_in_for: None,
                computes: candidate.computes.clone(),
                tuning: Some(TuneTag {
                    kernel,
                    group,
                    knobs: knobs.to_string(),
                }),
            })
            .collect();
        parts.push(candidate);
        for variant in variants {
            parts.push(variant);
        }
    }
}

#[cfg(test)]
mod tests {
    use tessel_graph::{Op, ReduceOp, signature};
    use tessel_ir::VendorOp;
    use tessel_shape::BinaryOp;

    use super::{Partitions, Work, partition};
    use crate::test_graph::{matmul, node, random_leaf};
    use crate::{Device, Result, runtime};

    /// The partitions of `targets`' subgraph for the CPU (default numerics and tuning).
    fn cpu_partitions(targets: &[tessel_graph::NodeId]) -> Result<Partitions> {
        let st = runtime().lock();
        let (_, leaves) = signature(&st.graph, targets);
        partition(
            &st.graph,
            targets,
            &leaves,
            &[Device::cpu()],
            crate::determinism::Numerics::default(),
            crate::Tuning::Default,
        )
    }

    /// Attention scores after a head split: `k.transpose(-2, -1)` composes with the split
    /// into one `[0, 2, 3, 1]` permute. The simplified form materializes that layout for
    /// the product; the transposed form materializes `[0, 2, 1, 3]` and the
    /// routine reads it transposed. Both routines write the scores' class, and so does
    /// the default partition's kernel: three producers of one value, from two forms.
    #[test]
    fn both_layouts_of_a_transposed_operand_are_candidates() -> Result<()> {
        let (b, s, h, d) = (2, 16, 4, 8);
        let qkv = node(
            Op::Reshape(random_leaf(1, &[b, s, 3 * h * d])),
            &[b, s, 3, h, d],
        );
        let heads = |i: usize| {
            let ranges: Vec<_> = [(0, 1), (0, 1), (i, 1), (0, 1), (0, 1)]
                .map(|(start, step)| (start.into(), step.into()))
                .to_vec();
            let one = node(Op::Shrink(qkv, ranges.into()), &[b, s, 1, h, d]);
            let split = node(Op::Reshape(one), &[b, s, h, d]);
            node(Op::Permute(split, vec![0, 2, 1, 3].into()), &[b, h, s, d])
        };
        let k_t = node(
            Op::Permute(heads(1), vec![0, 1, 3, 2].into()),
            &[b, h, d, s],
        );
        let scores = matmul(heads(0), k_t, &[b, h], s, d, s);
        let parts = cpu_partitions(&[scores])?;
        let routines: Vec<(bool, &[usize])> = parts
            .candidates
            .iter()
            .filter_map(|c| match &c.work {
                Work::Vendor(VendorOp::Matmul(m)) => Some((m.rhs_transposed, &c.writes[..])),
                _ => None,
            })
            .collect();
        // Each routine writes the product and the reshape of it the matmul records.
        let writes = |transposed: bool| -> Vec<&[usize]> {
            routines
                .iter()
                .filter(|r| r.0 == transposed)
                .map(|r| r.1)
                .collect()
        };
        assert_eq!(writes(false).len(), 2, "{routines:?}");
        assert_eq!(
            writes(false),
            writes(true),
            "the same classes, two producers each"
        );
        let target = parts.targets[0];
        assert!(
            parts
                .candidates
                .iter()
                .any(|c| c.default && c.writes.contains(&target))
        );
        Ok(())
    }

    /// `x == max(x)` over a product `x`: the kernels computing the product for themselves
    /// list it in `computes`, while a routine writes it, so extraction never chooses both
    /// (two orders of addition would leave no element equal to the maximum). A row sum of
    /// the product compares nothing and lists nothing.
    #[test]
    fn kernels_computing_a_compared_product_list_it() -> Result<()> {
        let (m, k, n) = (8, 16, 12);
        let x = matmul(
            random_leaf(21, &[m, k]),
            random_leaf(22, &[k, n]),
            &[],
            m,
            k,
            n,
        );
        let max = node(Op::Reduce(ReduceOp::Max, x, vec![1].into()), &[m, 1]);
        let wide = node(Op::Expand(max), &[m, n]);
        let eq = runtime().add(tessel_graph::Node {
            op: Op::Binary(BinaryOp::Eq, x, wide),
            dtype: tessel_shape::DType::Bool,
            shape: tessel_shape::Shape::from(&[m, n][..]),
        });
        let parts = cpu_partitions(&[eq])?;
        let computed: Vec<usize> = parts
            .candidates
            .iter()
            .flat_map(|c| c.computes.iter().copied())
            .collect();
        assert!(!computed.is_empty(), "the product is computed inline");
        assert!(
            parts
                .candidates
                .iter()
                .any(|c| c.for_routine && c.writes.iter().any(|w| computed.contains(w))),
            "a routine writes what kernels compute"
        );
        let rows = node(Op::Reduce(ReduceOp::Sum, x, vec![1].into()), &[m, 1]);
        let parts = cpu_partitions(&[rows])?;
        assert!(parts.candidates.iter().all(|c| c.computes.is_empty()));
        Ok(())
    }

    /// `y = x @ w + r` read by a row sum and a column sum: the default partition
    /// materializes `y` (the product computed inline), the routine partition inlines `y`
    /// into both sums. Every value the default partition writes also has a producer of
    /// another partition, so a plan mixing partitions never needs the inline product.
    #[test]
    fn default_values_have_producers_reading_the_routines() -> Result<()> {
        let (m, k, n) = (24, 16, 12);
        let p = matmul(
            random_leaf(11, &[m, k]),
            random_leaf(12, &[k, n]),
            &[],
            m,
            k,
            n,
        );
        let y = node(
            Op::Binary(BinaryOp::Add, p, random_leaf(13, &[m, n])),
            &[m, n],
        );
        let rows = node(Op::Reduce(ReduceOp::Sum, y, vec![1].into()), &[m, 1]);
        let cols = node(Op::Reduce(ReduceOp::Sum, y, vec![0].into()), &[1, n]);
        let parts = cpu_partitions(&[rows, cols])?;
        assert!(
            parts.candidates.iter().any(|c| c.for_routine),
            "the product is matched"
        );
        for c in parts.candidates.iter().filter(|c| c.default) {
            for w in &c.writes {
                assert!(
                    parts.candidates.iter().any(|o| !o.default
                        && matches!(o.work, Work::Kernel(_))
                        && o.writes.contains(w)),
                    "value {w} has only the default partition's producer"
                );
            }
        }
        Ok(())
    }

    /// A stack of layers (`x = x + relu(x @ w + b)`, each with weights of its own) large
    /// enough to kernelize its partitions on several threads: every partition of it gives
    /// the same candidates, in the same order and with the same source, so the plan
    /// cache's key does not depend on which thread lowered a repeated layer's kernel first.
    #[test]
    fn concurrent_partitions_give_the_same_candidates_every_time() -> Result<()> {
        let (rows, width) = (8, 16);
        let mut x = random_leaf(100, &[rows, width]);
        for layer in 0..24 {
            let w = random_leaf(101 + 2 * layer, &[width, width]);
            let b = node(
                Op::Reshape(random_leaf(102 + 2 * layer, &[width])),
                &[1, width],
            );
            let b = node(Op::Expand(b), &[rows, width]);
            let h = node(
                Op::Binary(BinaryOp::Add, matmul(x, w, &[], rows, width, width), b),
                &[rows, width],
            );
            let h = node(
                Op::Binary(
                    BinaryOp::Max,
                    h,
                    crate::test_graph::constant(0.0, &[rows, width]),
                ),
                &[rows, width],
            );
            x = node(Op::Binary(BinaryOp::Add, x, h), &[rows, width]);
        }
        let size = runtime().lock().graph.toposort(&[x]).len();
        assert!(size >= super::CONCURRENT_MIN_NODES, "{size} nodes");
        let key = || -> Result<u128> {
            let mut h = tessel_ir::cache::Fnv128::new();
            cpu_partitions(&[x])?.fingerprint(&mut h);
            Ok(h.finish())
        };
        let first = key()?;
        for _ in 0..3 {
            assert_eq!(key()?, first);
        }
        Ok(())
    }

    /// `(a @ b).t()`: the transposed form computes `bᵀ·aᵀ`, so a routine writes the
    /// target itself (reading both leaves transposed), besides the routine writing the
    /// product that a transposing kernel then copies.
    #[test]
    fn a_transposed_product_is_written_by_a_routine_directly() -> Result<()> {
        let product = matmul(
            random_leaf(1, &[24, 12]),
            random_leaf(2, &[12, 20]),
            &[],
            24,
            12,
            20,
        );
        let y = node(Op::Permute(product, vec![1, 0].into()), &[20, 24]);
        let parts = cpu_partitions(&[y])?;
        let target = parts.targets[0];
        let direct: Vec<_> = parts
            .candidates
            .iter()
            .filter_map(|c| match &c.work {
                Work::Vendor(VendorOp::Matmul(m)) if c.writes == [target] => Some(m),
                _ => None,
            })
            .collect();
        assert_eq!(direct.len(), 1, "{direct:?}");
        assert!(
            direct[0].lhs_transposed && direct[0].rhs_transposed,
            "{direct:?}"
        );
        assert_eq!((direct[0].m, direct[0].n), (20.into(), 24.into()));
        Ok(())
    }
}
