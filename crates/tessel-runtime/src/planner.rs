//! Planning a realize: candidate programs for each value, measured, and the cheapest
//! closed set of them chosen.
//!
//! 1. [`partition`] (under the runtime lock, pure CPU work): the e-graph's forms of the
//!    subgraph ([`egraph::forms`]: the simplified one, and where a product reads an operand
//!    through a permute, one reading it transposed), each partitioned below. Every value
//!    is named by its e-class, so programs of different forms are alternatives for the
//!    same values, and the chosen plan may combine them.
//!    In the simplified form: the default partition from
//!    the kernelizer, and where the graph holds matrix products ([`find_matmuls`]), a
//!    second partition with each product materialized on its own plus a library routine
//!    ([`VendorOp`]) that can write it, and where the default partition materializes
//!    values that one fuses away, a partition materializing both; where two products make an attention
//!    ([`find_attention`]), a routine that writes the second from the operands of the
//!    first. Every kernel and routine is a [`Candidate`] that
//!    writes some values (graph positions) and reads others.
//!    On a GPU, where the graph has long reductions, a third partition lowers them
//!    cooperatively (a workgroup per output element, partial results combined in local
//!    memory; [`kernelize_cooperative`]).
//!    Where a value shared by several consumers is inlined into each, the shared
//!    partition computes it once instead ([`kernelize_shared`]); where pads or reshapes
//!    of computed views fuse into their readers, the split partition copies them out
//!    once ([`views_to_split`]).
//!    On a GPU the rows partition also fuses row statistics into their readers
//!    ([`kernelize_rows`]: softmax in one kernel). The other forms add their products'
//!    partitions (the routine one, and on a GPU the rows one) and routines.
//! 2. [`compile`] (no lock): each candidate compiled for every device the realize may use:
//!    its own (the *home* device) and those [`set_placement`] adds. A backend without the
//!    routine offers none; a candidate that fails to compile is dropped with a warning
//!    (unless it is the default partition's, on the home device), never failing the
//!    realize.
//! 3. [`choose`](crate::measure::choose): where some value has more than one producer,
//!    every program is measured (see `measure.rs`) and
//!    [`tessel_graph::placement::place`] picks the cheapest closed set of programs and
//!    copies between devices.
//!
//! Without alternatives (no product, no routine on this backend, one device) the default
//! partition is the plan, and nothing is measured.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};
use std::time::Duration;

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_graph::egraph::{self, Budget as RewriteBudget, Form, StopReason};
use tessel_graph::extract::ClassId;
use tessel_graph::placement::Step;
use tessel_graph::{
    Graph, KernelizeError, LeafId, Lowerings, NodeId, Op, SHARED_MIN_OPS, Schedule, Slot,
    find_attention, find_matmuls, materialized_for, signature, views_to_split,
};
use tessel_ir::attention::{attention_decode_kernel, attention_kernel};
use tessel_ir::attention_backward::attention_backward_kernel;
use tessel_ir::cache::Fnv128;
use tessel_ir::{Backend, BackendError, Kernel, ProgramId, ProgramOrigin, VendorOp};
use tessel_shape::{DType, Dim};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::plan_cache::StoredPlan;
use crate::precision::Float32MatmulPrecision;
use crate::program::{Program, program};
use crate::tuning::{self, TuneTag, Tuner, Tuning};

/// A device a plan uses, with its backend. Index 0 of a plan's devices is its home.
pub(crate) type PlanDevice = (Device, Arc<dyn Backend>);

/// A compiled schedule, replayable on any leaves with the same signature.
pub(crate) struct Plan {
    /// The devices the plan uses; the first is home (inputs and outputs live there).
    pub(crate) devices: Vec<PlanDevice>,
    /// Launches and copies, in order.
    pub(crate) steps: Vec<PlanStep>,
    /// The buffers the plan allocates: a value on a device, with dtype and element count.
    pub(crate) buffers: Vec<(Place, DType, Dim)>,
    /// Plan input `k` is the realize's leaf `inputs[k]` (in its signature order): rewrites
    /// may drop or reorder leaves.
    pub(crate) inputs: Vec<usize>,
    /// `(position, k)`: the buffer at `position` holds the realize's target `k`.
    pub(crate) outputs: Vec<(usize, usize)>,
    /// The runner-up of the measured choice, run if this plan fails at execution.
    pub(crate) fallback: Option<Arc<Plan>>,
    /// What the plan was chosen from, for `tessel_tensor::inspect::plan_to_dot`.
    pub(crate) view: Option<Arc<PlanView>>,
    /// Names the plan's launches for [`tessel_ir::Backend::launch_sequence`].
    pub(crate) sequence: tessel_ir::SequenceId,
}

/// What a plan was chosen from: every program that was compiled, with its measured time
/// where it was measured, the chosen ones marked, and the chosen copies.
pub(crate) struct PlanView {
    pub(crate) devices: Vec<Device>,
    pub(crate) programs: Vec<ProgramView>,
    /// `(value, from device, to device)`.
    pub(crate) copies: Vec<(PlanSlot, usize, usize)>,
    /// The realize's targets, in order.
    pub(crate) targets: Vec<usize>,
    /// Dtype and element count of every value.
    pub(crate) sizes: Vec<(PlanSlot, DType, Dim)>,
}

/// One program of a [`PlanView`].
pub(crate) struct ProgramView {
    pub(crate) name: String,
    /// A library routine (else a generated kernel).
    pub(crate) routine: bool,
    pub(crate) device: usize,
    pub(crate) reads: Vec<PlanSlot>,
    pub(crate) writes: Vec<usize>,
    /// Median seconds; `None` where it was not measured (a plan without alternatives) or
    /// its output disagreed with the reference.
    pub(crate) time: Option<f64>,
    pub(crate) chosen: bool,
}

impl Plan {
    /// Kernel launches (not copies).
    pub(crate) fn launches(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, PlanStep::Launch { .. }))
            .count()
    }
}

/// One step of a plan.
pub(crate) enum PlanStep {
    /// A program on its device; one buffer per parameter, all on that device.
    Launch {
        program: Arc<Program>,
        device: usize,
        args: Vec<Place>,
    },
    /// A value copied between devices (through the host).
    Copy { from: Place, to: Place },
}

/// A leaf (by signature order) or a buffer (by topological position).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum PlanSlot {
    Input(usize),
    Node(usize),
}

/// A value on one of a plan's devices (an index into [`Plan::devices`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Place {
    pub(crate) slot: PlanSlot,
    pub(crate) device: usize,
}

/// Devices a realize may also run kernels on, besides its own: see [`set_placement`].
static PLACEMENT: RwLock<Vec<Device>> = RwLock::new(Vec::new());

/// Lets realizes also place kernels on `devices`: every kernel is then compiled and
/// measured there too, and a plan may run parts of the work on them, copying values
/// between devices (each copy measured like a kernel) only where a producer and its
/// consumer end up apart. Inputs and outputs stay on the tensors' own device. Off (empty)
/// by default, because compiling and measuring every kernel on every device makes each new
/// plan slower to build; `TESSEL_PLACEMENT=cpu,wgpu:0` sets it at startup.
///
/// ```
/// # fn main() -> tessel_runtime::Result<()> {
/// use tessel_runtime::{Device, set_placement};
/// set_placement(&[Device::cpu()])?;
/// set_placement(&[])?; // off again
/// # Ok(())
/// # }
/// ```
pub fn set_placement(devices: &[Device]) -> Result<()> {
    for d in devices {
        crate::runtime::runtime().backend(*d)?;
    }
    *PLACEMENT
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = devices.to_vec();
    // Plans made for other devices would keep running as they were chosen.
    crate::runtime::runtime().clear_plans();
    Ok(())
}

/// The devices a realize on `home` may use: `home` first, then the placement devices.
pub(crate) fn placement_devices(home: Device) -> Vec<Device> {
    static FROM_ENV: LazyLock<()> = LazyLock::new(|| {
        let Ok(text) = std::env::var("TESSEL_PLACEMENT") else {
            return;
        };
        let parsed: Result<Vec<Device>> = text
            .split(',')
            .filter(|t| !t.trim().is_empty())
            .map(Device::parse)
            .collect();
        match parsed.and_then(|d| set_placement(&d)) {
            Ok(()) => {}
            Err(e) => tracing::warn!("ignoring TESSEL_PLACEMENT: {e}"),
        }
    });
    LazyLock::force(&FROM_ENV);
    let extra = PLACEMENT
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    std::iter::once(home)
        .chain(extra.into_iter().filter(|d| *d != home))
        .collect()
}

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
    for_routine: bool,
    /// From a partition whose workgroups cooperate through local memory: compiled only
    /// for devices with `Features::cooperative_workgroups`.
    cooperative: bool,
    /// A kernel whose launch shapes are searched: which kernel, and which shape this is.
    pub(crate) tuning: Option<TuneTag>,
    /// A portable kernel standing in for the routine of candidate `k`: compiled for a
    /// device only where its backend offers no program for that routine.
    stands_in_for: Option<usize>,
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
    candidates: Vec<Candidate>,
    /// Dtype and element count of every value some candidate writes, and of empty targets.
    buffers: FxHashMap<usize, (DType, Dim)>,
    /// Dtype and element count of each input, in signature order.
    input_sizes: Vec<(DType, Dim)>,
    /// Zero-element targets: a buffer, no kernel.
    empty: Vec<usize>,
    targets: Vec<usize>,
    inputs: Vec<usize>,
    outputs: Vec<(usize, usize)>,
    /// The level the variants were made for, which decides where they compile.
    tuning: Tuning,
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
                    "{:?} {:?} {} {} {} {:?}",
                    c.args, c.writes, c.default, c.for_routine, c.cooperative, c.stands_in_for
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
    precision: Float32MatmulPrecision,
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
    // The nodes the default partition materializes (form 0's graph).
    let mut default_materialized: Vec<NodeId> = Vec::new();
    for (f, form) in forms.iter().enumerate() {
        let (graph, targets) = (&form.graph, form.targets.as_slice());
        let order = graph.toposort(targets);
        let slots = numbering.number(form, &order, leaves)?;
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
                let node = graph.node(w);
                parts
                    .buffers
                    .insert(slots.pos[&w], (node.dtype, node.shape.numel()));
                let candidate = Candidate {
                    work: Work::Vendor(match &m.op {
                        VendorOp::Matmul(op) => VendorOp::Matmul(precision.apply(op.clone())),
                        op @ (VendorOp::Attention(_) | VendorOp::AttentionBackward(_)) => {
                            op.clone()
                        }
                    }),
                    args: m
                        .operands
                        .iter()
                        .map(|o| slots.slot(*o))
                        .chain([PlanSlot::Node(slots.pos[&w])])
                        .collect(),
                    writes: vec![slots.pos[&w]],
                    default: false,
                    for_routine: true,
                    cooperative: false,
                    tuning: None,
                    stands_in_for: None,
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
                    .chain([&w])
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
                    });
                }
            }
        }
    }
    let mut parts = parts.ok_or_else(|| Error::Internal("the e-graph gave no form".into()))?;
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

/// A candidate compiled for one device.
pub(crate) struct Built {
    /// Index into [`Compiled::candidates`].
    pub(crate) candidate: usize,
    /// Index into [`Compiled::devices`].
    pub(crate) device: usize,
    pub(crate) program: Arc<Program>,
    /// Which of a routine's programs this is ([`tessel_ir::VendorProgram::variant`]);
    /// empty for kernels.
    pub(crate) variant: String,
}

/// Candidates compiled for the realize's devices.
pub(crate) struct Compiled {
    pub(crate) devices: Vec<PlanDevice>,
    pub(crate) candidates: Vec<Candidate>,
    /// Every program, home device first, then in candidate order.
    pub(crate) programs: Vec<Built>,
    pub(crate) buffers: FxHashMap<usize, (DType, Dim)>,
    pub(crate) input_sizes: Vec<(DType, Dim)>,
    pub(crate) empty: Vec<usize>,
    pub(crate) targets: Vec<usize>,
    pub(crate) inputs: Vec<usize>,
    outputs: Vec<(usize, usize)>,
    /// Kernels by where their programs came from (routines are not counted).
    pub(crate) origins: Origins,
    /// Kernels whose launch shapes are searched, with the device (see [`tuning::Winners`]).
    pub(crate) searches: Vec<(u128, usize)>,
    /// The level the candidates were made at.
    pub(crate) tuning: Tuning,
    /// Deferred programs measurement built, by origin.
    pub(crate) built_later: Mutex<Origins>,
    /// Searched kernels whose fastest shape measurement stored in the tuning cache.
    pub(crate) winners_stored: AtomicUsize,
}

/// Kernels counted by [`ProgramOrigin`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Origins {
    pub(crate) compiled: usize,
    pub(crate) cached: usize,
    pub(crate) interpreted: usize,
}

impl Origins {
    pub(crate) fn count(&mut self, origin: ProgramOrigin) {
        match origin {
            ProgramOrigin::Compiled => self.compiled += 1,
            ProgramOrigin::Cached => self.cached += 1,
            ProgramOrigin::Interpreted => self.interpreted += 1,
        }
    }
}

/// Whether `device` runs a workgroup's invocations concurrently
/// ([`Features::cooperative_workgroups`](tessel_ir::Features::cooperative_workgroups)).
fn cooperative_workgroups(device: Device) -> bool {
    device
        .info()
        .is_ok_and(|info| info.features.cooperative_workgroups)
}

/// Compiles every candidate for every device (see the module docs for what failures mean).
///
/// Kernels compile on several threads (NVRTC, the C compiler and the GPU drivers are
/// thread-safe, and a model's first realize compiles hundreds of kernels); each distinct
/// kernel is compiled once, and its repeats then hit the backend's program cache.
///
/// With `only`, just those `(candidate, device)` pairs are built (a stored plan's programs,
/// see [`crate::plan_cache`]).
pub(crate) fn compile(
    parts: Partitions,
    devices: Vec<PlanDevice>,
    only: Option<&[(usize, usize)]>,
) -> Result<Compiled> {
    let mut out = Compiled {
        devices,
        candidates: parts.candidates,
        programs: Vec::new(),
        buffers: parts.buffers,
        input_sizes: parts.input_sizes,
        empty: parts.empty,
        targets: parts.targets,
        inputs: parts.inputs,
        outputs: parts.outputs,
        origins: Origins::default(),
        searches: Vec::new(),
        tuning: parts.tuning,
        built_later: Mutex::new(Origins::default()),
        winners_stored: AtomicUsize::new(0),
    };
    let mut winners = tuning::Winners::new(parts.tuning);
    for d in 0..out.devices.len() {
        let (device, backend) = out.devices[d].clone();
        // Routines are asked for first: without one, the alternative partition is pointless.
        let mut any_vendor = false;
        // Routines the backend offers programs for (their portable stand-ins are skipped).
        let mut offered: FxHashSet<usize> = FxHashSet::default();
        let mut built = Vec::new();
        let wanted = |i: usize| only.is_none_or(|o| o.binary_search(&(i, d)).is_ok());
        for (i, c) in out.candidates.iter().enumerate() {
            let Work::Vendor(op) = &c.work else {
                continue;
            };
            if !wanted(i) {
                continue;
            }
            match backend.vendor(device.ordinal, op) {
                Ok(programs) => {
                    if !programs.is_empty() {
                        any_vendor = true;
                        offered.insert(i);
                    }
                    built.extend(programs.into_iter().map(|p| (i, p.program, p.variant)));
                }
                Err(e) => {
                    tracing::warn!(target: "tessel::plan", "{device}: no library routine for {op}: {e}");
                }
            }
        }
        let stand_in = |c: &Candidate| c.stands_in_for.is_some_and(|r| !offered.contains(&r));
        any_vendor |= out
            .candidates
            .iter()
            .enumerate()
            .any(|(i, c)| wanted(i) && stand_in(c));
        let mut deferred: Vec<(usize, &Kernel)> = Vec::new();
        let wanted: Vec<(usize, &Kernel)> = out
            .candidates
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match &c.work {
                Work::Kernel(kernel)
                    if wanted(i)
                        && (c.stands_in_for.is_none() || only.is_some() || stand_in(c))
                        && (only.is_some() || c.default || !c.for_routine || any_vendor)
                        && (!c.cooperative || cooperative_workgroups(device)) =>
                {
                    let build = match (&c.tuning, only) {
                        (Some(tag), None) => winners.wants(tag, kernel, (d, device, &*backend)),
                        _ => tuning::Build::Now,
                    };
                    match build {
                        tuning::Build::Now => Some((i, kernel)),
                        tuning::Build::Later => {
                            deferred.push((i, kernel));
                            None
                        }
                        tuning::Build::No => None,
                    }
                }
                _ => None,
            })
            .collect();
        for ((i, kernel), result) in wanted.iter().zip(compile_all(&*backend, device, &wanted)) {
            let c = &out.candidates[*i];
            match result {
                Ok(id) => {
                    // `id` was just made, so the backend knows it.
                    let origin = backend.origin(id).unwrap_or(ProgramOrigin::Compiled);
                    out.origins.count(origin);
                    built.push((*i, id, String::new()));
                }
                Err(e) if c.default && d == 0 => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(target: "tessel::plan", "{device}: dropping kernel {}: {e}", kernel.name);
                }
            }
        }
        for (candidate, id, variant) in built {
            out.programs.push(Built {
                candidate,
                device: d,
                program: program(&backend, device, id),
                variant,
            });
        }
        for (candidate, kernel) in deferred {
            out.programs.push(Built {
                candidate,
                device: d,
                program: Arc::new(Program::deferred(backend.clone(), device, kernel.clone())),
                variant: String::new(),
            });
        }
    }
    out.searches = winners.searches;
    Ok(out)
}

/// Compiles `kernels` on `device`, first occurrences in parallel (in batches of the
/// backend's [`Backend::compile_batch`]), repeats after them.
fn compile_all(
    backend: &dyn Backend,
    device: Device,
    kernels: &[(usize, &Kernel)],
) -> Vec<std::result::Result<ProgramId, BackendError>> {
    let mut seen: FxHashSet<String> = FxHashSet::default();
    let unique: Vec<usize> = (0..kernels.len())
        .filter(|&k| seen.insert(kernels[k].1.to_string()))
        .collect();
    let bar = crate::progress::bar(kernels.len(), "tessel: compiling kernels");
    let compile = |batch: &[usize]| {
        for &k in batch {
            let kernel = kernels[k].1;
            tracing::debug!(target: "tessel::kernels", "compiling {} on {device}:\n{kernel}", kernel.name);
        }
        let batch_kernels: Vec<&Kernel> = batch.iter().map(|&k| kernels[k].1).collect();
        let built = backend.compile_many(device.ordinal, &batch_kernels);
        debug_assert_eq!(
            built.len(),
            batch.len(),
            "compile_many gives one result per kernel"
        );
        if let Some(bar) = &bar {
            bar.inc(batch.len() as u64);
        }
        batch.iter().copied().zip(built).collect::<Vec<_>>()
    };
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let batch = backend.compile_batch(unique.len(), threads).max(1);
    let batches: Vec<&[usize]> = unique.chunks(batch).collect();
    let threads = threads.min(batches.len());
    let mut results: Vec<Option<std::result::Result<ProgramId, BackendError>>> =
        (0..kernels.len()).map(|_| None).collect();
    let done: Vec<(usize, std::result::Result<ProgramId, BackendError>)> = if threads <= 1 {
        batches.iter().flat_map(|b| compile(b)).collect()
    } else {
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        while let Some(b) = batches.get(next.fetch_add(1, Ordering::Relaxed)) {
                            mine.extend(compile(b));
                        }
                        mine
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| {
                    w.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        })
    };
    for (k, result) in done {
        results[k] = Some(result);
    }
    let results = results
        .into_iter()
        .zip(kernels)
        .map(|(result, (_, kernel))| {
            result.unwrap_or_else(|| backend.compile(device.ordinal, kernel))
        })
        .collect();
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    results
}

impl Compiled {
    /// Whether some value has more than one producer.
    fn has_alternatives(&self) -> bool {
        let mut seen = FxHashSet::default();
        self.programs
            .iter()
            .flat_map(|b| &self.candidates[b.candidate].writes)
            .any(|w| !seen.insert(*w))
    }

    /// The extraction class of a slot: positions for values, then inputs.
    pub(crate) fn class(&self, slot: PlanSlot) -> ClassId {
        match slot {
            PlanSlot::Node(p) => ClassId(p as u32),
            PlanSlot::Input(i) => ClassId((self.positions() + i) as u32),
        }
    }

    /// The slot of an extraction class.
    pub(crate) fn slot(&self, class: ClassId) -> PlanSlot {
        let c = class.0 as usize;
        if c < self.positions() {
            PlanSlot::Node(c)
        } else {
            PlanSlot::Input(c - self.positions())
        }
    }

    /// One more than the largest position any value has.
    fn positions(&self) -> usize {
        self.buffers.keys().max().map_or(0, |&p| p + 1)
    }

    /// The dtype and element count of a slot's value.
    pub(crate) fn size(&self, slot: PlanSlot) -> (DType, Dim) {
        match slot {
            PlanSlot::Node(p) => self.buffers[&p],
            PlanSlot::Input(i) => self.input_sizes[i],
        }
    }

    /// The plan running `steps` (as [`tessel_graph::placement::place`] orders them, with
    /// [`Step::Run`] naming an index into the programs).
    pub(crate) fn plan(&self, steps: &[Step]) -> Plan {
        let mut out = Vec::with_capacity(steps.len());
        let mut written: Vec<Place> = self
            .empty
            .iter()
            .map(|&p| Place {
                slot: PlanSlot::Node(p),
                device: 0,
            })
            .collect();
        for step in steps {
            match *step {
                Step::Run(k) => {
                    let b = &self.programs[k];
                    let c = &self.candidates[b.candidate];
                    let at = |slot| Place {
                        slot,
                        device: b.device,
                    };
                    written.extend(c.writes.iter().map(|&p| at(PlanSlot::Node(p))));
                    out.push(PlanStep::Launch {
                        program: b.program.clone(),
                        device: b.device,
                        args: c.args.iter().map(|&a| at(a)).collect(),
                    });
                }
                Step::Copy { class, from, to } => {
                    let slot = self.slot(class);
                    let to = Place { slot, device: to };
                    written.push(to);
                    out.push(PlanStep::Copy {
                        from: Place { slot, device: from },
                        to,
                    });
                }
            }
        }
        written.sort_unstable();
        written.dedup();
        let buffers = written
            .into_iter()
            .filter(|p| !(p.device == 0 && matches!(p.slot, PlanSlot::Input(_))))
            .map(|p| {
                let (dtype, numel) = self.size(p.slot);
                (p, dtype, numel)
            })
            .collect();
        Plan {
            devices: self.devices.clone(),
            steps: out,
            buffers,
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            fallback: None,
            view: None,
            sequence: tessel_ir::SequenceId::new(),
        }
    }

    /// The plan `stored` describes, with its runner-up and its times, or `None` where one
    /// of its programs was not built.
    pub(crate) fn stored_plan(&self, stored: &StoredPlan) -> Option<Plan> {
        let mut times = vec![None; self.programs.len()];
        let steps = StoredPlan::resolve(&stored.steps, self, &mut times)?;
        let runner_up = match &stored.runner_up {
            Some(r) => Some(StoredPlan::resolve(r, self, &mut times)?),
            None => None,
        };
        let mut plan = self.plan(&steps);
        plan.view = Some(Arc::new(self.view(&times, &steps)));
        plan.fallback = runner_up.map(|r| Arc::new(self.plan(&r)));
        Some(plan)
    }

    /// The default partition's plan on the home device: every program, in order (without
    /// alternatives, the programs are exactly the default partition, producers first).
    pub(crate) fn default_plan(self) -> Plan {
        let all: Vec<Step> = (0..self.programs.len()).map(Step::Run).collect();
        let mut plan = self.plan(&all);
        plan.view = Some(Arc::new(self.view(&vec![None; self.programs.len()], &all)));
        plan
    }

    /// The programs with their `times`, those `steps` run marked chosen.
    pub(crate) fn view(&self, times: &[Option<f64>], steps: &[Step]) -> PlanView {
        let programs = self
            .programs
            .iter()
            .enumerate()
            .map(|(k, b)| {
                let c = &self.candidates[b.candidate];
                let name = c.work.name();
                ProgramView {
                    name: if b.variant.is_empty() {
                        name
                    } else {
                        format!("{name} [{}]", b.variant)
                    },
                    routine: matches!(c.work, Work::Vendor(_)),
                    device: b.device,
                    reads: c.reads().collect(),
                    writes: c.writes.clone(),
                    time: times[k],
                    chosen: steps.contains(&Step::Run(k)),
                }
            })
            .collect();
        let copies = steps
            .iter()
            .filter_map(|s| match *s {
                Step::Copy { class, from, to } => Some((self.slot(class), from, to)),
                Step::Run(_) => None,
            })
            .collect();
        let mut sizes: Vec<(PlanSlot, DType, Dim)> = self
            .buffers
            .iter()
            .map(|(&p, &(dtype, numel))| (PlanSlot::Node(p), dtype, numel))
            .chain(
                self.input_sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &(dtype, numel))| (PlanSlot::Input(i), dtype, numel)),
            )
            .collect();
        sizes.sort_by_key(|s| s.0);
        PlanView {
            devices: self.devices.iter().map(|d| d.0).collect(),
            programs,
            copies,
            targets: self.targets.clone(),
            sizes,
        }
    }

    /// Whether [`crate::measure::choose`] has anything to decide.
    pub(crate) fn needs_choice(&self) -> bool {
        self.has_alternatives()
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

    /// The partitions of `targets`' subgraph for the CPU (default precision and tuning).
    fn cpu_partitions(targets: &[tessel_graph::NodeId]) -> Result<Partitions> {
        let st = runtime().lock();
        let (_, leaves) = signature(&st.graph, targets);
        partition(
            &st.graph,
            targets,
            &leaves,
            &[Device::cpu()],
            crate::Float32MatmulPrecision::Highest,
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
