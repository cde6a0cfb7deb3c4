//! Planning a realize: candidate programs for each value, measured, and the cheapest
//! closed set of them chosen.
//!
//! 1. [`partition`] (under the runtime lock, pure CPU work): the default partition from
//!    the kernelizer, and where the graph holds matrix products ([`find_matmuls`]), a
//!    second partition with each product materialized on its own plus a library routine
//!    ([`VendorOp`]) that can write it. Every kernel and routine is a [`Candidate`] that
//!    writes some values (graph positions) and reads others.
//!    On a GPU, where the graph has long reductions, a third partition lowers them
//!    cooperatively (a workgroup per output element, partial results combined in local
//!    memory; [`kernelize_cooperative`]).
//! 2. [`compile`] (no lock): each candidate compiled for the device. A backend without
//!    the routine offers none; a candidate outside the default partition that fails to
//!    compile is dropped with a warning, never failing the realize.
//! 3. [`choose`]: where some value has more than one producer, every candidate runs on the
//!    realize's own inputs in dependency order. A candidate whose value has already been
//!    produced writes scratch buffers and must match that reference (the default
//!    partition's kernel) before its time counts. Times are device-timer medians, cached
//!    on disk by backend, device and program text, so a second process measures nothing
//!    it already knows. [`tessel_graph::extract`] then picks the cheapest closed set.
//!
//! Without alternatives (no product, or no routine on this backend) the default partition
//! is the plan, and nothing is measured.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_graph::egraph::Budget as RewriteBudget;
use tessel_graph::extract::{self, Budget, ClassId, Problem};
use tessel_graph::{
    Graph, LeafId, NodeId, Op, Schedule, Simplified, Slot, find_matmuls, kernelize,
    kernelize_cooperative, kernelize_rows, kernelize_with, signature, simplify,
};
use tessel_ir::cache::{Fnv128, temp_suffix};
use tessel_ir::{Backend, BufferId, Kernel, ProgramId, VendorOp};
use tessel_shape::{Bindings, DType, Dim};

use crate::device::Device;
use crate::error::{Error, Result};

/// A compiled schedule, replayable on any leaves with the same signature.
pub(crate) struct Plan {
    pub(crate) device: Device,
    pub(crate) backend: Arc<dyn Backend>,
    /// Launches in order.
    pub(crate) kernels: Vec<PlanKernel>,
    /// Materialized nodes by topological position, with dtype and element count.
    pub(crate) buffers: Vec<(usize, DType, Dim)>,
    /// Plan input `k` is the realize's leaf `inputs[k]` (in its signature order): rewrites
    /// may drop or reorder leaves.
    pub(crate) inputs: Vec<usize>,
    /// `(position, k)`: the buffer at `position` holds the realize's target `k`.
    pub(crate) outputs: Vec<(usize, usize)>,
    /// The runner-up of the measured choice, run if this plan fails at execution.
    pub(crate) fallback: Option<Arc<Plan>>,
}

/// A compiled program, released when the last plan holding it is dropped.
pub(crate) struct Program {
    pub(crate) id: ProgramId,
    backend: Arc<dyn Backend>,
    device: Device,
}

impl Program {
    /// A program id the backend never handed out: launching it fails. For tests of what
    /// happens when a plan fails at execution.
    #[cfg(test)]
    pub(crate) fn unbuilt(backend: Arc<dyn Backend>, device: Device) -> Program {
        Program {
            id: ProgramId(u64::MAX),
            backend,
            device,
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        if let Err(e) = self.backend.release(self.id) {
            tracing::warn!("releasing a program on {}: {e}", self.device);
        }
    }
}

pub(crate) struct PlanKernel {
    pub(crate) program: Arc<Program>,
    /// Per buffer parameter: a leaf (by signature order) or a buffer (by position).
    pub(crate) args: Vec<PlanSlot>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PlanSlot {
    Input(usize),
    Node(usize),
}

/// What a candidate runs.
enum Work {
    Kernel(Kernel),
    Vendor(VendorOp),
}

impl Work {
    /// The program's text: its identity for the timing cache and the logs.
    fn text(&self) -> String {
        match self {
            Work::Kernel(k) => k.to_string(),
            Work::Vendor(op) => op.to_string(),
        }
    }

    fn name(&self) -> String {
        match self {
            Work::Kernel(k) => k.name.clone(),
            Work::Vendor(op) => op.to_string(),
        }
    }
}

/// A program that could run: what it writes and reads, by topological position.
struct Candidate {
    work: Work,
    args: Vec<PlanSlot>,
    writes: Vec<usize>,
    /// From the default partition: the reference others are checked against.
    default: bool,
    /// From the partition made for library routines: worth compiling only if the backend
    /// has one.
    for_routine: bool,
}

impl Candidate {
    fn reads(&self) -> impl Iterator<Item = usize> + '_ {
        self.args.iter().filter_map(|a| match a {
            PlanSlot::Node(p) if !self.writes.contains(p) => Some(*p),
            _ => None,
        })
    }
}

/// The candidates of one realize, before compilation.
pub(crate) struct Partitions {
    candidates: Vec<Candidate>,
    /// Dtype and element count of every value some candidate writes, and of empty targets.
    buffers: FxHashMap<usize, (DType, Dim)>,
    /// Zero-element targets: a buffer, no kernel.
    empty: Vec<usize>,
    targets: Vec<usize>,
    inputs: Vec<usize>,
    outputs: Vec<(usize, usize)>,
}

/// Whether the e-graph rewrites run (`TESSEL_REWRITES=0` turns them off, for debugging).
fn rewrites_enabled() -> bool {
    static ON: LazyLock<bool> =
        LazyLock::new(|| std::env::var("TESSEL_REWRITES").map_or(true, |v| v.trim() != "0"));
    *ON
}

/// Builds the candidates for `targets`, whose subgraph reads `leaves` (in signature
/// order), after simplifying it with the e-graph's rewrites (see the module docs), for
/// `device`.
pub(crate) fn partition(
    graph: &Graph,
    targets: &[NodeId],
    leaves: &[LeafId],
    device: Device,
) -> Result<Partitions> {
    let simplified = rewrites_enabled().then(|| {
        let size = graph.toposort(targets).len();
        let budget = RewriteBudget {
            iterations: 16,
            nodes: 4 * size + 256,
            time: Duration::from_millis(50),
        };
        simplify(graph, targets, budget)
    });
    // A target that became a leaf, or the same node as another target, would need a copy
    // the plan does not make: such a realize runs its graph as recorded.
    let usable = |s: &Simplified| {
        let distinct: FxHashSet<NodeId> = s.targets.iter().copied().collect();
        distinct.len() == s.targets.len()
            && s.targets
                .iter()
                .all(|&t| !matches!(s.graph.node(t).op, Op::Leaf(_)))
    };
    let (graph, targets) = match &simplified {
        Some(s) if usable(s) => (&s.graph, s.targets.as_slice()),
        _ => (graph, targets),
    };
    let order = graph.toposort(targets);
    let order = order.as_slice();
    let (_, own_leaves) = signature(graph, targets);
    let inputs = own_leaves
        .iter()
        .map(|l| leaves.iter().position(|x| x == l))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| Error::Internal("rewriting the graph invented a leaf".into()))?;
    let pos: FxHashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let internal = |e: tessel_graph::KernelizeError| Error::Internal(e.to_string());
    let default = kernelize(graph, targets).map_err(internal)?;
    let mut parts = Partitions {
        candidates: Vec::new(),
        buffers: FxHashMap::default(),
        empty: Vec::new(),
        targets: targets.iter().map(|t| pos[t]).collect(),
        inputs,
        outputs: targets
            .iter()
            .enumerate()
            .map(|(k, t)| (pos[t], k))
            .collect(),
    };
    add_schedule(&mut parts, &default, &pos, true, false);
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

    // On a GPU, long reductions may run faster with a workgroup per output; the CPU runs a
    // workgroup's invocations one after another, where that only adds barriers.
    if device.backend != "cpu" {
        let cooperative = kernelize_cooperative(graph, targets).map_err(internal)?;
        if cooperative
            .kernels
            .iter()
            .any(|k| k.kernel.name.ends_with("_g"))
        {
            add_schedule(&mut parts, &cooperative, &pos, false, false);
        }
        // And row statistics fused into the kernels reading them (one-kernel softmax).
        if let Some(rows) = kernelize_rows(graph, targets).map_err(internal)? {
            add_schedule(&mut parts, &rows, &pos, false, false);
        }
    }

    let matches = find_matmuls(graph, order);
    if matches.is_empty() {
        return Ok(parts);
    }
    let mut separate: Vec<NodeId> = matches
        .iter()
        .flat_map(|m| m.materialize.iter().copied())
        .collect();
    separate.sort_unstable();
    separate.dedup();
    let alternative = kernelize_with(graph, targets, &separate).map_err(internal)?;
    add_schedule(&mut parts, &alternative, &pos, false, true);
    for m in &matches {
        for &w in &m.writes {
            let node = graph.node(w);
            parts
                .buffers
                .insert(pos[&w], (node.dtype, node.shape.numel()));
            parts.candidates.push(Candidate {
                work: Work::Vendor(m.op.clone()),
                args: m
                    .operands
                    .iter()
                    .map(|o| operand_slot(graph, *o, &pos))
                    .chain([PlanSlot::Node(pos[&w])])
                    .collect(),
                writes: vec![pos[&w]],
                default: false,
                for_routine: true,
            });
        }
    }
    Ok(parts)
}

fn operand_slot(graph: &Graph, node: NodeId, pos: &FxHashMap<NodeId, usize>) -> PlanSlot {
    match graph.node(node).op {
        // Leaves bind by signature order, which numbers them as the toposort meets them.
        Op::Leaf(_) => PlanSlot::Input(
            pos.iter()
                .filter(|(n, p)| **p < pos[&node] && matches!(graph.node(**n).op, Op::Leaf(_)))
                .count(),
        ),
        _ => PlanSlot::Node(pos[&node]),
    }
}

/// Adds a schedule's kernels (skipping ones already present) and buffers.
fn add_schedule(
    parts: &mut Partitions,
    schedule: &Schedule,
    pos: &FxHashMap<NodeId, usize>,
    default: bool,
    for_routine: bool,
) {
    for (n, dtype, numel) in &schedule.buffers {
        parts.buffers.insert(pos[n], (*dtype, *numel));
    }
    for k in &schedule.kernels {
        let candidate = Candidate {
            args: k
                .args
                .iter()
                .map(|a| match a {
                    Slot::Input(i) => PlanSlot::Input(*i),
                    Slot::Node(n) => PlanSlot::Node(pos[n]),
                })
                .collect(),
            writes: k.writes.iter().map(|w| pos[w]).collect(),
            work: Work::Kernel(k.kernel.clone()),
            default,
            for_routine,
        };
        let duplicate = parts.candidates.iter().any(|c| {
            c.writes == candidate.writes
                && c.args == candidate.args
                && matches!((&c.work, &candidate.work), (Work::Kernel(a), Work::Kernel(b)) if a == b)
        });
        if !duplicate {
            parts.candidates.push(candidate);
        }
    }
}

/// Candidates compiled for one device.
pub(crate) struct Compiled {
    device: Device,
    backend: Arc<dyn Backend>,
    candidates: Vec<(Candidate, Arc<Program>)>,
    buffers: FxHashMap<usize, (DType, Dim)>,
    empty: Vec<usize>,
    targets: Vec<usize>,
    inputs: Vec<usize>,
    outputs: Vec<(usize, usize)>,
    /// Programs compiled (kernels and routines).
    pub(crate) built: usize,
}

/// Compiles every candidate (see the module docs for what failures mean).
pub(crate) fn compile(
    parts: Partitions,
    backend: &Arc<dyn Backend>,
    device: Device,
) -> Result<Compiled> {
    let mut out = Compiled {
        device,
        backend: backend.clone(),
        candidates: Vec::with_capacity(parts.candidates.len()),
        buffers: parts.buffers,
        empty: parts.empty,
        targets: parts.targets,
        inputs: parts.inputs,
        outputs: parts.outputs,
        built: 0,
    };
    // Routines are asked for first: without one, the alternative partition is pointless.
    let (vendors, kernels): (Vec<_>, Vec<_>) = parts
        .candidates
        .into_iter()
        .partition(|c| matches!(c.work, Work::Vendor(_)));
    let mut any_vendor = false;
    for c in vendors {
        let Work::Vendor(op) = &c.work else {
            continue;
        };
        match backend.vendor(device.ordinal, op) {
            Ok(Some(id)) => {
                any_vendor = true;
                out.built += 1;
                out.candidates.push((c, out.program(id)));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(target: "tessel::plan", "{device}: no library routine for {op}: {e}");
            }
        }
    }
    for c in kernels
        .into_iter()
        .filter(|c| c.default || !c.for_routine || any_vendor)
    {
        let Work::Kernel(kernel) = &c.work else {
            continue;
        };
        tracing::debug!(target: "tessel::kernels", "compiling {} on {device}:\n{kernel}", kernel.name);
        match backend.compile(device.ordinal, kernel) {
            Ok(id) => {
                out.built += 1;
                out.candidates.push((c, out.program(id)));
            }
            Err(e) if c.default => return Err(e.into()),
            Err(e) => {
                tracing::warn!(target: "tessel::plan", "{device}: dropping alternative kernel {}: {e}", kernel.name);
            }
        }
    }
    Ok(out)
}

impl Compiled {
    fn program(&self, id: ProgramId) -> Arc<Program> {
        Arc::new(Program {
            id,
            backend: self.backend.clone(),
            device: self.device,
        })
    }

    /// Whether some value has more than one producer.
    fn has_alternatives(&self) -> bool {
        let mut seen = FxHashSet::default();
        self.candidates
            .iter()
            .flat_map(|(c, _)| &c.writes)
            .any(|w| !seen.insert(*w))
    }

    /// The plan running `chosen` (indices into the candidates) in that order.
    fn plan(&self, chosen: &[usize]) -> Plan {
        let mut kernels = Vec::with_capacity(chosen.len());
        let mut written: Vec<usize> = self.empty.clone();
        for &i in chosen {
            let (c, program) = &self.candidates[i];
            written.extend(&c.writes);
            kernels.push(PlanKernel {
                program: program.clone(),
                args: c.args.clone(),
            });
        }
        written.sort_unstable();
        written.dedup();
        let buffers = written
            .into_iter()
            .map(|p| {
                let (dtype, numel) = self.buffers[&p];
                (p, dtype, numel)
            })
            .collect();
        Plan {
            device: self.device,
            backend: self.backend.clone(),
            kernels,
            buffers,
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            fallback: None,
        }
    }

    /// The default partition's plan: every candidate, in order (without alternatives,
    /// the candidates are exactly the default partition, producers first).
    pub(crate) fn default_plan(self) -> Plan {
        let all: Vec<usize> = (0..self.candidates.len()).collect();
        self.plan(&all)
    }

    /// Whether [`choose`] has anything to decide.
    pub(crate) fn needs_choice(&self) -> bool {
        self.has_alternatives()
    }
}

/// Measures every candidate on the realize's leaves (`leaves`, in signature order) with
/// the dynamic dims `dims`, and returns the plan of the cheapest closed set.
pub(crate) fn choose(compiled: &Compiled, leaves: &[BufferId], dims: &Bindings) -> Result<Plan> {
    let inputs: Vec<BufferId> = compiled.inputs.iter().map(|&i| leaves[i]).collect();
    let mut m = Measurer::new(compiled, dims);
    let outcome = m.run(compiled, &inputs);
    m.free();
    let times = outcome?;
    let problem = Problem {
        candidates: compiled
            .candidates
            .iter()
            .enumerate()
            .filter_map(|(i, (c, _))| {
                Some(extract::Candidate {
                    id: i,
                    writes: c.writes.iter().map(|&w| ClassId(w as u32)).collect(),
                    reads: c.reads().map(|r| ClassId(r as u32)).collect(),
                    cost: times[i]?,
                })
            })
            .collect(),
        available: compiled.empty.iter().map(|&p| ClassId(p as u32)).collect(),
        targets: compiled
            .targets
            .iter()
            .map(|&p| ClassId(p as u32))
            .collect(),
    };
    let extraction = extract::extract(&problem, Budget::default())
        .map_err(|e| Error::Internal(format!("choosing a plan: {e}")))?;
    let chosen: Vec<usize> = extraction
        .chosen
        .iter()
        .map(|&k| problem.candidates[k].id)
        .collect();
    if tracing::enabled!(target: "tessel::plan", tracing::Level::INFO) {
        let mut text = String::new();
        for (i, (c, _)) in compiled.candidates.iter().enumerate() {
            let _ = writeln!(
                text,
                "  {} {:<40} writes {:?} reads {:?}: {}",
                if chosen.contains(&i) { "*" } else { " " },
                c.work.name(),
                c.writes,
                c.reads().collect::<Vec<_>>(),
                times[i].map_or("invalid".to_string(), |t| format!("{:.1} µs", t * 1e6)),
            );
        }
        tracing::info!(target: "tessel::plan", "{}: plan of {} candidates, chosen cost {:.1} µs:\n{text}", compiled.device, compiled.candidates.len(), extraction.cost * 1e6);
    }
    let mut plan = compiled.plan(&chosen);
    if let Some((runner_up, _)) = &extraction.runner_up {
        let ids: Vec<usize> = runner_up
            .iter()
            .map(|&k| problem.candidates[k].id)
            .collect();
        plan.fallback = Some(Arc::new(compiled.plan(&ids)));
    }
    Ok(plan)
}

/// Runs candidates to validate and time them.
struct Measurer {
    backend: Arc<dyn Backend>,
    device: Device,
    /// The reference buffer of each value.
    real: FxHashMap<usize, BufferId>,
    /// Every buffer allocated, freed at the end.
    owned: Vec<BufferId>,
    /// The dynamic dims' values for this measurement.
    dims: Bindings,
}

/// Timed runs after the first (validating) one; fewer for slow candidates.
const RUNS: usize = 5;

impl Measurer {
    fn new(compiled: &Compiled, dims: &Bindings) -> Self {
        Measurer {
            backend: compiled.backend.clone(),
            device: compiled.device,
            real: FxHashMap::default(),
            owned: Vec::new(),
            dims: dims.clone(),
        }
    }

    fn alloc(&mut self, compiled: &Compiled, p: usize) -> Result<BufferId> {
        let (dtype, numel) = compiled.buffers[&p];
        let numel = numel
            .eval(&self.dims)
            .map_err(|e| Error::Internal(e.to_string()))?;
        let bytes = (numel.max(0) as usize * dtype.size_bytes()).max(1);
        let b = self.backend.alloc(self.device.ordinal, bytes)?;
        self.owned.push(b);
        Ok(b)
    }

    fn free(&mut self) {
        for b in self.owned.drain(..) {
            let _ = self.backend.free(b);
        }
    }

    /// Median seconds per candidate; `None` for one that failed or disagreed.
    fn run(&mut self, compiled: &Compiled, inputs: &[BufferId]) -> Result<Vec<Option<f64>>> {
        let n = compiled.candidates.len();
        let mut times: Vec<Option<f64>> = vec![None; n];
        let keys: Vec<u128> = compiled
            .candidates
            .iter()
            .map(|(c, _)| timing_key(&*compiled.backend, compiled.device, &c.work, &self.dims))
            .collect();
        let cached: Vec<Option<f64>> = keys.iter().map(|&k| load_timing(k)).collect();
        if cached.iter().all(Option::is_some) {
            return Ok(cached);
        }
        for &p in &compiled.empty {
            let b = self.alloc(compiled, p)?;
            self.real.insert(p, b);
        }
        // Default candidates first, so references come from the default partition.
        let mut pending: Vec<usize> = (0..n).collect();
        pending.sort_by_key(|&i| !compiled.candidates[i].0.default);
        let mut measured: FxHashMap<u128, f64> = FxHashMap::default();
        while !pending.is_empty() {
            let Some(at) = pending.iter().position(|&i| {
                compiled.candidates[i]
                    .0
                    .reads()
                    .all(|r| self.real.contains_key(&r))
            }) else {
                // What is left reads values nobody could produce: never chosen.
                break;
            };
            let i = pending.remove(at);
            let (c, program) = &compiled.candidates[i];
            match self.measure(
                compiled,
                c,
                program.id,
                inputs,
                cached[i].or(measured.get(&keys[i]).copied()),
            ) {
                Ok(Some(t)) => {
                    times[i] = Some(t);
                    if cached[i].is_none() && measured.insert(keys[i], t).is_none() {
                        store_timing(keys[i], t);
                    }
                }
                Ok(None) => {}
                Err(e) if c.default => return Err(e),
                Err(e) => {
                    tracing::warn!(target: "tessel::plan", "{}: dropping {}: {e}", self.device, c.work.name());
                }
            }
        }
        Ok(times)
    }

    /// Runs one candidate: the first run produces (or checks) its values, then times it
    /// unless `known` already holds its time.
    fn measure(
        &mut self,
        compiled: &Compiled,
        c: &Candidate,
        program: ProgramId,
        inputs: &[BufferId],
        known: Option<f64>,
    ) -> Result<Option<f64>> {
        let mut checks = Vec::new();
        let mut args = Vec::with_capacity(c.args.len());
        for a in &c.args {
            args.push(match *a {
                PlanSlot::Input(i) => inputs[i],
                PlanSlot::Node(p) if c.writes.contains(&p) => {
                    if let Some(&reference) = self.real.get(&p) {
                        let scratch = self.alloc(compiled, p)?;
                        checks.push((p, reference, scratch));
                        scratch
                    } else {
                        let b = self.alloc(compiled, p)?;
                        self.real.insert(p, b);
                        b
                    }
                }
                PlanSlot::Node(p) => self.real[&p],
            });
        }
        let dims = &self.dims;
        let first = self.backend.time(program, &args, dims)?;
        for (p, reference, scratch) in checks {
            if let Some(why) = self.disagreement(compiled, p, reference, scratch)? {
                tracing::warn!(target: "tessel::plan", "{}: dropping {}: its output differs from the reference ({why})", self.device, c.work.name());
                return Ok(None);
            }
        }
        if let Some(t) = known {
            return Ok(Some(t));
        }
        let runs = if first > Duration::from_millis(50) {
            2
        } else {
            RUNS
        };
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            samples.push(self.backend.time(program, &args, dims)?.as_secs_f64());
        }
        samples.sort_by(f64::total_cmp);
        Ok(Some(samples[samples.len() / 2]))
    }

    /// Why two buffers holding value `p` disagree beyond rounding, if they do. Floats
    /// compare against the largest reference magnitude (a different summation order moves
    /// every element by about the same absolute amount); other dtypes compare exactly.
    fn disagreement(
        &self,
        compiled: &Compiled,
        p: usize,
        reference: BufferId,
        other: BufferId,
    ) -> Result<Option<String>> {
        let (dtype, numel) = compiled.buffers[&p];
        let numel = numel
            .eval(&self.dims)
            .map_err(|e| Error::Internal(e.to_string()))?;
        let len = numel.max(0) as usize * dtype.size_bytes();
        let mut x = vec![0u8; len];
        let mut y = vec![0u8; len];
        if len > 0 {
            self.backend.read(reference, 0, &mut x)?;
            self.backend.read(other, 0, &mut y)?;
        }
        let (Some(xs), Some(ys)) = (floats(dtype, &x), floats(dtype, &y)) else {
            return Ok((x != y).then(|| "the bytes differ".to_string()));
        };
        let scale = xs
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()));
        let tolerance = 1e-3 * scale;
        for (i, (p, q)) in xs.iter().zip(&ys).enumerate() {
            let same = (p.is_nan() && q.is_nan()) || p == q || (p - q).abs() <= tolerance;
            if !same {
                return Ok(Some(format!("element {i}: {q} instead of {p}")));
            }
        }
        Ok(None)
    }
}

/// The values of a float buffer, `None` for other dtypes.
fn floats(dtype: DType, bytes: &[u8]) -> Option<Vec<f64>> {
    let width = dtype.size_bytes();
    let decode: fn(&[u8]) -> f64 = match dtype {
        DType::F32 => |b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::F64 => |b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        DType::F16 => |b| half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        _ => return None,
    };
    Some(bytes.chunks_exact(width).map(decode).collect())
}

/// The disk timing cache: one small file per (backend, device, driver, program text,
/// dynamic-dim values).
fn timing_dir() -> PathBuf {
    tessel_ir::cache::default_root().join("timings")
}

fn timing_key(backend: &dyn Backend, device: Device, work: &Work, dims: &Bindings) -> u128 {
    let mut h = Fnv128::new();
    h.field(b"tessel-timing-v2");
    // A program with dynamic dims takes as long as the sizes it runs at.
    let mut values: Vec<(String, i64)> = dims.iter().map(|(v, n)| (v.to_string(), n)).collect();
    values.sort_unstable();
    for (name, value) in values {
        h.field(format!("{name}={value}").as_bytes());
    }
    h.field(backend.name().as_bytes());
    if let Some(info) = backend.devices().get(device.ordinal) {
        h.field(info.name.as_bytes());
        h.field(info.driver.as_bytes());
    }
    h.field(work.text().as_bytes());
    h.finish()
}

fn load_timing(key: u128) -> Option<f64> {
    let text = std::fs::read_to_string(timing_dir().join(format!("{key:032x}"))).ok()?;
    text.trim()
        .parse()
        .ok()
        .filter(|t: &f64| t.is_finite() && *t >= 0.0)
}

fn store_timing(key: u128, seconds: f64) {
    let dir = timing_dir();
    let path = dir.join(format!("{key:032x}"));
    let temp = dir.join(format!("{key:032x}.{}", temp_suffix()));
    // A cache that cannot be written costs a measurement next time, nothing else.
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&temp, format!("{seconds:e}\n")))
        .and_then(|()| std::fs::rename(&temp, &path));
    if let Err(e) = written {
        tracing::debug!(target: "tessel::plan", "cannot cache a timing in {}: {e}", dir.display());
    }
}
