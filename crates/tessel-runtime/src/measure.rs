//! Measuring a realize's programs and choosing its plan.
//!
//! Every program runs on the realize's own inputs, in dependency order, on its device.
//! Values a program reads on another device are copied there first (untimed); a program
//! whose value has already been produced writes scratch buffers and must match that
//! reference (the default partition's, on the home device, where there is one) before its
//! time counts. Times are device-timer medians. Copies between the home device and each
//! other device are timed too, per value size, on the host clock (they go through host
//! memory). Times are cached on disk by backend, device, driver, program text and
//! dynamic-dim values (copies: both devices and the size), so a second process measures
//! nothing it already knows. [`tessel_graph::placement::place`] then picks the cheapest
//! closed set of programs and copies.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_graph::extract::{Budget, ExtractError};
use tessel_graph::placement::{self, PlacedCandidate, Placement, Transfer};
use tessel_ir::cache::{Fnv128, read_keyed, write_keyed};
use tessel_ir::{Backend, BufferId, ProgramId, compare};
use tessel_shape::{Bindings, DType, Dim};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::plan_cache::StoredPlan;
use crate::planner::{Compiled, Place, Plan, PlanSlot, Work};

/// Measures every program on the realize's leaves (`leaves`, on the home device, in
/// signature order) with the dynamic dims `dims`, and returns the plan of the cheapest
/// closed set of programs and copies.
/// Returns it also as [`crate::plan_cache`] stores it.
pub(crate) fn choose(
    compiled: &Compiled,
    leaves: &[BufferId],
    dims: &Bindings,
) -> Result<(Plan, StoredPlan)> {
    let inputs: Vec<BufferId> = compiled.inputs.iter().map(|&i| leaves[i]).collect();
    let mut m = Measurer::new(compiled, dims);
    let outcome = m
        .run(&inputs)
        .and_then(|times| {
            crate::tuning::record(compiled, &times, m.planned.as_ref());
            Ok((times, m.transfers()?))
        })
        .and_then(|(times, transfers)| pick(&mut m, &times, transfers));
    m.free();
    outcome
}

/// Extracts the plan from the measured `times` and `transfers`, and checks it whole: run
/// as planned, it must give the default partition's targets, else the default partition
/// is the plan.
fn pick(
    m: &mut Measurer<'_>,
    times: &[Option<f64>],
    transfers: Vec<Transfer>,
) -> Result<(Plan, StoredPlan)> {
    let compiled = m.compiled;
    let fastest = crate::tuning::fastest(compiled, times);
    let problem = placement_problem(compiled, times, transfers, |k| {
        !crate::tuning::lost(compiled, &fastest, k)
    });
    // The default partition is a valid plan by construction: the search starts from it
    // (so it never returns worse), and a search that found no plan within its budget
    // (greedy plans that write a value twice, too many alternatives) falls back to it
    // rather than failing the realize (where a default program lost and was left out).
    let default: Vec<usize> = default_steps(compiled)
        .iter()
        .filter_map(|s| match *s {
            placement::Step::Run(k) => Some(k),
            placement::Step::Copy { .. } => None,
        })
        .collect();
    let placed = match placement::place_from(&problem, Budget::default(), &default) {
        Ok(placed) => placed,
        Err(ExtractError::NoValidPlan {
            exhausted: true, ..
        }) => {
            tracing::warn!(target: "tessel::plan", "{}: no plan found within the search budget; using the default partition", compiled.devices[0].0);
            return Ok(default_plan(compiled, times));
        }
        Err(e) => return Err(Error::Internal(format!("choosing a plan: {e}"))),
    };
    let view = Arc::new(compiled.view(times, &placed.steps));
    if tracing::enabled!(target: "tessel::plan", tracing::Level::INFO) {
        tracing::info!(target: "tessel::plan", "{}: plan of {} programs, chosen cost {:.1} µs:\n{}", compiled.devices[0].0, compiled.programs.len(), placed.cost * 1e6, view.to_text());
    }
    // Each program was checked against references on its own; the plan combines programs
    // of different partitions, so it is run once as a whole and checked too.
    if let Some(why) = m.check_plan(&placed.steps)? {
        tracing::warn!(target: "tessel::plan", "{}: the measured plan gives wrong values ({why}); using the default partition", compiled.devices[0].0);
        return Ok(default_plan(compiled, times));
    }
    let mut plan = compiled.plan(&placed.steps);
    plan.view = Some(view);
    let runner_up = placed.runner_up.as_ref().map(|(steps, _)| steps.as_slice());
    if let Some(runner_up) = runner_up {
        plan.fallback = Some(Arc::new(compiled.plan(runner_up)));
    }
    let stored = StoredPlan::new(compiled, times, &placed.steps, runner_up);
    Ok((plan, stored))
}

/// The default partition's programs on the home device.
fn default_steps(compiled: &Compiled) -> Vec<placement::Step> {
    compiled
        .programs
        .iter()
        .enumerate()
        .filter(|(_, b)| b.device == 0 && compiled.candidates[b.candidate].default)
        .map(|(k, _)| placement::Step::Run(k))
        .collect()
}

/// The default partition's programs on the home device, as a plan.
fn default_plan(compiled: &Compiled, times: &[Option<f64>]) -> (Plan, StoredPlan) {
    let default = default_steps(compiled);
    let mut plan = compiled.plan(&default);
    plan.view = Some(Arc::new(compiled.view(times, &default)));
    (plan, StoredPlan::new(compiled, times, &default, None))
}

/// The extraction problem over the programs with a time that `keep` keeps.
fn placement_problem(
    compiled: &Compiled,
    times: &[Option<f64>],
    transfers: Vec<Transfer>,
    keep: impl Fn(usize) -> bool,
) -> Placement {
    Placement {
        devices: compiled.devices.len(),
        candidates: compiled
            .programs
            .iter()
            .enumerate()
            .filter(|&(k, _)| keep(k))
            .filter_map(|(k, b)| {
                let c = &compiled.candidates[b.candidate];
                Some(PlacedCandidate {
                    id: k,
                    device: b.device,
                    writes: c
                        .writes
                        .iter()
                        .map(|&w| compiled.class(PlanSlot::Node(w)))
                        .collect(),
                    reads: c.reads().map(|r| compiled.class(r)).collect(),
                    cost: times[k]?,
                })
            })
            .collect(),
        transfers,
        available: (0..compiled.inputs.len())
            .map(|i| compiled.class(PlanSlot::Input(i)))
            .chain(
                compiled
                    .empty
                    .iter()
                    .map(|&p| compiled.class(PlanSlot::Node(p))),
            )
            .collect(),
        targets: compiled
            .targets
            .iter()
            .map(|&p| compiled.class(PlanSlot::Node(p)))
            .collect(),
    }
}

/// Runs programs to validate and time them.
struct Measurer<'c> {
    compiled: &'c Compiled,
    /// A buffer holding each value, per device it has been produced on or copied to.
    real: FxHashMap<Place, BufferId>,
    /// Every buffer allocated (with its device), freed at the end.
    owned: Vec<(usize, BufferId)>,
    /// The dynamic dims' values for this measurement.
    dims: Bindings,
    /// [`CANDIDATE_TOLERANCE`], or the rounding of the narrowest float the realize holds.
    precision: f64,
    /// [`Measurer::magnitude`]'s answers.
    magnitudes: FxHashMap<PlanSlot, f64>,
    /// Each program's time, once measured (or found in the cache) and checked.
    times: Vec<Option<f64>>,
    /// The programs of the plan extracted from every program but the other launch shapes
    /// of kernels, made before the first of those runs (every program where no plan was
    /// found).
    planned: Option<FxHashSet<usize>>,
}

/// Timed runs after the first (validating) one; fewer for slow candidates.
const RUNS: usize = 5;

/// How many times slower than the fastest program writing the same values a program may
/// become before its checking run is stopped (where the backend can stop one): it would
/// never be chosen. A naive generated 2048³ product on a CPU took 35 s to lose to `gemm`'s
/// 0.1 s.
const HOPELESS: f64 = 8.0;

/// A checking run is never stopped before this: stopping saves nothing worth losing the
/// program as a runner-up for.
const HOPELESS_AFTER: Duration = Duration::from_millis(100);

/// How far a candidate's output may be from the reference computed from the same inputs,
/// relative to the largest reference magnitude, when every value is f32 or wider. Where
/// the realize holds narrower floats, the tolerance is that of their rounding
/// ([`Measurer::precision`]): two candidates rounding an f32 product to bf16 at different
/// points differ by bf16's 2^-8, and with 1e-3 every library product of a bf16 model was
/// dropped for it.
const CANDIDATE_TOLERANCE: f64 = 1e-3;

/// The candidates' tolerance where `f32` products may run in TF32
/// ([`crate::set_float32_matmul_precision`]).
const TF32_TOLERANCE: f64 = 1e-2;

/// The same for a whole plan's targets, as a multiple of the candidates' tolerance.
/// Rounding differences of every program add up along the plan and some steps amplify
/// them (an Adam update divides a gradient by its own magnitude); a program wired to the
/// wrong values is off by the values' own size.
const PLAN_TOLERANCE: f64 = 10.0;

impl<'c> Measurer<'c> {
    fn new(compiled: &'c Compiled, dims: &Bindings) -> Self {
        Measurer {
            compiled,
            real: FxHashMap::default(),
            owned: Vec::new(),
            dims: dims.clone(),
            precision: Self::precision(compiled),
            magnitudes: FxHashMap::default(),
            times: Vec::new(),
            planned: None,
        }
    }

    /// How far two correct programs of this realize may disagree: 1e-3 in f32 and wider,
    /// 5e-2 where a half-precision value is stored, 1e-1 for float8, at least 1e-2 where a
    /// product may run in TF32. Partitions round to
    /// half precision at different points (a fused kernel keeps f32 where a materialized
    /// value is rounded), and in a 12-layer residual stream the two roundings of bf16
    /// drift apart by a few percent of the largest value.
    fn precision(compiled: &Compiled) -> f64 {
        let dtypes = compiled.input_sizes.iter().chain(compiled.buffers.values());
        let stored = dtypes
            .map(|&(dtype, _)| match dtype {
                d if d.is_float8() => 1e-1,
                DType::F16 | DType::BF16 => 5e-2,
                _ => CANDIDATE_TOLERANCE,
            })
            .fold(CANDIDATE_TOLERANCE, f64::max);
        // TF32 rounds operands to an 11-bit significand (2^-11 ≈ 5e-4 each): a product's
        // error against full f32 is a few of those, more where a softmax amplifies it.
        let tf32 = compiled.candidates.iter().any(
            |c| matches!(&c.work, Work::Vendor(tessel_ir::VendorOp::Matmul(m)) if m.allow_tf32),
        );
        if tf32 {
            stored.max(TF32_TOLERANCE)
        } else {
            stored
        }
    }

    fn backend(&self, device: usize) -> &Arc<dyn Backend> {
        &self.compiled.devices[device].1
    }

    fn device(&self, device: usize) -> Device {
        self.compiled.devices[device].0
    }

    /// Bytes of a slot's value under this measurement's dims.
    fn bytes(&self, slot: PlanSlot) -> Result<usize> {
        let (dtype, numel) = self.compiled.size(slot);
        Ok(eval(numel, &self.dims)? * dtype.size_bytes())
    }

    /// A buffer of `bytes` filled with `0xff` (NaN in every float dtype), so a program
    /// that reads an element nothing wrote fails its check instead of passing on whatever
    /// a reused allocation held.
    fn alloc(&mut self, device: usize, bytes: usize) -> Result<BufferId> {
        let ordinal = self.device(device).ordinal;
        let b = self.backend(device).alloc(ordinal, bytes.max(1))?;
        self.owned.push((device, b));
        self.backend(device).fill(b, 0xff, bytes.max(1))?;
        Ok(b)
    }

    fn free(&mut self) {
        for (d, b) in std::mem::take(&mut self.owned) {
            let _ = self.backend(d).free(b);
        }
    }

    /// Frees one buffer of [`Self::owned`] before the end.
    fn release(&mut self, device: usize, buffer: BufferId) {
        if let Some(i) = self
            .owned
            .iter()
            .position(|&(d, b)| d == device && b == buffer)
        {
            self.owned.swap_remove(i);
            let _ = self.backend(device).free(buffer);
        }
    }

    /// Copies `bytes` from `src` on device `from` to `dst` on device `to`, through the host.
    fn copy(
        &self,
        from: usize,
        src: BufferId,
        to: usize,
        dst: BufferId,
        bytes: usize,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let mut host = vec![0u8; bytes];
        self.backend(from).synchronize(self.device(from).ordinal)?;
        self.backend(from).read(src, 0, &mut host)?;
        self.backend(to).write(dst, 0, &host)?;
        Ok(())
    }

    /// A buffer holding `slot`'s value on `device`, copying it from another device if it
    /// has not been there yet; `None` if no device has it.
    fn on_device(&mut self, slot: PlanSlot, device: usize) -> Result<Option<BufferId>> {
        let here = Place { slot, device };
        if let Some(&b) = self.real.get(&here) {
            return Ok(Some(b));
        }
        let Some((&from, &src)) = self.real.iter().find(|(p, _)| p.slot == slot) else {
            return Ok(None);
        };
        let bytes = self.bytes(slot)?;
        let dst = self.alloc(device, bytes)?;
        self.copy(from.device, src, device, dst, bytes)?;
        self.real.insert(here, dst);
        Ok(Some(dst))
    }

    /// Median seconds per program; `None` for one that failed or disagreed.
    fn run(&mut self, inputs: &[BufferId]) -> Result<Vec<Option<f64>>> {
        let compiled = self.compiled;
        let n = compiled.programs.len();
        self.times = vec![None; n];
        let keys: Vec<u128> = compiled
            .programs
            .iter()
            .map(|b| {
                let (device, backend) = &compiled.devices[b.device];
                let work = &compiled.candidates[b.candidate].work;
                timing_key(&**backend, *device, work, &b.variant, &self.dims)
            })
            .collect();
        // Cached times spare the timing runs, never the checking run: a program is only
        // as right as the slots it is wired to in this realize.
        let cached: Vec<Option<f64>> = keys.iter().map(|&k| load_timing(k)).collect();
        for (i, &b) in inputs.iter().enumerate() {
            self.real.insert(
                Place {
                    slot: PlanSlot::Input(i),
                    device: 0,
                },
                b,
            );
        }
        for &p in &compiled.empty {
            let b = self.alloc(0, 1)?;
            self.real.insert(
                Place {
                    slot: PlanSlot::Node(p),
                    device: 0,
                },
                b,
            );
        }
        // Default candidates on the home device first, so references come from them;
        // before each, a library routine writing the same values, so that a generated
        // product can be stopped once it has lost to the routine (`HOPELESS`).
        let defaults: FxHashSet<&[usize]> = compiled
            .candidates
            .iter()
            .filter(|c| c.default)
            .map(|c| c.writes.as_slice())
            .collect();
        // Other launch shapes of kernels last: by then the plan without them is known, and
        // only the shapes of kernels in it are worth measuring (`not_worth_tuning`).
        let mut pending: Vec<usize> = (0..n).collect();
        pending.sort_by_key(|&k| {
            let b = &compiled.programs[k];
            let c = &compiled.candidates[b.candidate];
            let routine = matches!(c.work, Work::Vendor(_));
            let twin = routine && defaults.contains(c.writes.as_slice());
            (self.is_shape(k), !(c.default || twin), b.device, !routine)
        });
        // A value's reference is kept while a program that has not run yet reads it or
        // writes it (and is checked against it), and to the end for targets: a training
        // step's candidates write many gigabytes in all.
        let mut uses: FxHashMap<PlanSlot, usize> = FxHashMap::default();
        for b in &compiled.programs {
            let c = &compiled.candidates[b.candidate];
            for slot in c.touched() {
                *uses.entry(slot).or_default() += 1;
            }
        }
        // Targets, and what their producers read, are compared again by `check_plan`.
        let mut final_inputs: FxHashSet<usize> = compiled.targets.iter().copied().collect();
        for b in &compiled.programs {
            let c = &compiled.candidates[b.candidate];
            if c.writes.iter().any(|w| compiled.targets.contains(w)) {
                final_inputs.extend(c.reads().filter_map(|r| match r {
                    PlanSlot::Node(p) => Some(p),
                    PlanSlot::Input(_) => None,
                }));
            }
        }
        let mut measured: FxHashMap<u128, f64> = FxHashMap::default();
        let bar = crate::progress::bar(n, "tessel: measuring programs");
        while !pending.is_empty() {
            if let Some(bar) = &bar {
                bar.set_position((n - pending.len()) as u64);
            }
            let Some(at) = pending.iter().position(|&k| {
                let c = &compiled.candidates[compiled.programs[k].candidate];
                c.reads().all(|r| self.real.keys().any(|p| p.slot == r))
            }) else {
                // What is left reads values nobody could produce: never chosen.
                break;
            };
            let k = pending.remove(at);
            let b = &compiled.programs[k];
            let c = &compiled.candidates[b.candidate];
            let known = cached[k].or(measured.get(&keys[k]).copied());
            match self.measure(k, known) {
                Ok(Some(Timed::Median(t))) => {
                    self.times[k] = Some(t);
                    if cached[k].is_none() && measured.insert(keys[k], t).is_none() {
                        store_timing(keys[k], t);
                    }
                }
                // Good enough to rank a loser here, not to cache: a first run can carry
                // one-time costs (a library loading its kernel on first use took a 45 µs
                // cuBLAS product to 4.6 ms, and the cached 4.6 ms kept GPT-2 off cuBLAS
                // in every later process).
                Ok(Some(Timed::FirstRun(t))) => self.times[k] = Some(t),
                Ok(None) => {}
                Err(e) if c.default && b.device == 0 => return Err(e),
                Err(e) => {
                    tracing::warn!(target: "tessel::plan", "{}: dropping {}: {e}", self.device(b.device), c.work.name());
                }
            }
            for slot in c.touched() {
                let left = uses.get_mut(&slot).map(|n| {
                    *n -= 1;
                    *n
                });
                let kept = match slot {
                    PlanSlot::Node(p) => final_inputs.contains(&p) || compiled.empty.contains(&p),
                    PlanSlot::Input(_) => true,
                };
                if left == Some(0) && !kept {
                    let places: Vec<(usize, BufferId)> = self
                        .real
                        .iter()
                        .filter(|(p, _)| p.slot == slot)
                        .map(|(p, &b)| (p.device, b))
                        .collect();
                    for (d, buffer) in places {
                        self.real.remove(&Place { slot, device: d });
                        self.release(d, buffer);
                    }
                }
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        Ok(self.times.clone())
    }

    /// Runs program `k`: the first run produces (or checks) its values, then times it
    /// unless `known` already holds its time.
    fn measure(&mut self, k: usize, known: Option<f64>) -> Result<Option<Timed>> {
        let compiled = self.compiled;
        let b = &compiled.programs[k];
        let c = &compiled.candidates[b.candidate];
        let d = b.device;
        // A program whose time is already known (the same text measured earlier in this
        // realize or cached on disk) to be hopeless against the fastest program writing
        // the same values is not run at all: GPT-2's forward repeats its naive generated
        // products in every layer, and each ran for tens of milliseconds.
        let checked = c
            .writes
            .iter()
            .all(|&w| self.reference(PlanSlot::Node(w)).is_some());
        if checked
            && let Some(t) = known
            && let Some(best) = self.fastest_twin(k)
            && t > best * HOPELESS
        {
            tracing::debug!(target: "tessel::measure", "{}: {} {}: skipped, its known {:.3} ms is over {HOPELESS} times the fastest program writing the same values", self.device(d), c.work.name(), b.variant, t * 1e3);
            return Ok(None);
        }
        if self.is_shape(k) && self.planned.is_none() {
            self.planned = Some(self.plan_without_shapes());
            self.build_shapes_worth_measuring();
        }
        if let Some(why) = self.not_worth_tuning(k) {
            tracing::debug!(target: "tessel::measure", "{}: {}: not measured, {why}", self.device(d), c.work.name());
            return Ok(None);
        }
        let mut checks = Vec::new();
        let mut args = Vec::with_capacity(c.args.len());
        for &a in &c.args {
            let written = matches!(a, PlanSlot::Node(p) if c.writes.contains(&p));
            let buffer = if written {
                let bytes = self.bytes(a)?;
                let fresh = self.alloc(d, bytes)?;
                if let Some((&reference, &buffer)) = self.reference(a) {
                    checks.push((a, reference.device, buffer, fresh));
                } else {
                    self.real.insert(Place { slot: a, device: d }, fresh);
                }
                fresh
            } else {
                self.on_device(a, d)?.ok_or_else(|| {
                    Error::Internal(format!("{a:?} is read before anything produced it"))
                })?
            };
            args.push(buffer);
        }
        let backend = self.backend(d).clone();
        let program = b.program.id()?;
        // A program checked against references for everything it writes may be stopped
        // once it is `HOPELESS` times slower than the fastest program writing the same
        // values on this device.
        let limit = (checks.len() == c.writes.len())
            .then(|| self.fastest_twin(k))
            .flatten()
            .map(|t| Duration::from_secs_f64(t * HOPELESS).max(HOPELESS_AFTER));
        let first = match limit {
            Some(limit) => backend.time_within(program, &args, &self.dims, limit)?,
            None => Some(backend.time(program, &args, &self.dims)?),
        };
        let Some(first) = first else {
            tracing::debug!(target: "tessel::measure", "{}: {} {}: stopped after {:.3} ms, {HOPELESS} times the fastest program writing the same values", self.device(d), c.work.name(), b.variant, limit.unwrap_or_default().as_secs_f64() * 1e3);
            for (_, _, _, fresh) in checks {
                self.release(d, fresh);
            }
            return Ok(None);
        };
        // In half precision a value computed by cancellation (a mean, a difference) is
        // small against the rounding of the values it came from: tolerances scale with
        // those too.
        let mut floor = 0.0f64;
        if self.precision > CANDIDATE_TOLERANCE && !checks.is_empty() {
            for slot in c.reads() {
                floor = floor.max(self.magnitude(slot)?);
            }
        }
        let mut agrees = true;
        for &(slot, ref_device, reference, fresh) in &checks {
            let (reference, fresh) = ((ref_device, reference), (d, fresh));
            if let Some(why) = self.disagreement(slot, reference, fresh, self.precision, floor)? {
                tracing::warn!(target: "tessel::plan", "{}: dropping {} {}: its output differs from the reference ({why})", self.device(d), c.work.name(), b.variant);
                agrees = false;
                break;
            }
        }
        let timed = match known {
            _ if !agrees => None,
            Some(t) => Some(Timed::Median(t)),
            None => Some(self.time(k, &args, first)?),
        };
        tracing::debug!(target: "tessel::measure", "{}: {} {}: checking run {:.3} ms, time {:?}{}", self.device(d), c.work.name(), b.variant, first.as_secs_f64() * 1e3, timed, if known.is_some() { " (cached)" } else { "" });
        // What was checked against a reference is not needed after this program.
        for (_, _, _, fresh) in checks {
            self.release(d, fresh);
        }
        Ok(timed)
    }

    /// Whether program `k` is another launch shape of a kernel (not the kernel itself).
    fn is_shape(&self, k: usize) -> bool {
        let c = &self.compiled.candidates[self.compiled.programs[k].candidate];
        c.tuning.as_ref().is_some_and(|t| !t.is_default())
    }

    /// The programs of the cheapest plan of those measured so far that are not other
    /// launch shapes; every program where there is none (copies between devices are not
    /// timed yet).
    fn plan_without_shapes(&self) -> FxHashSet<usize> {
        let compiled = self.compiled;
        let problem = placement_problem(compiled, &self.times, Vec::new(), |k| !self.is_shape(k));
        match placement::place(&problem, Budget::default()) {
            Ok(placed) => placed
                .steps
                .iter()
                .filter_map(|s| match *s {
                    placement::Step::Run(k) => Some(k),
                    placement::Step::Copy { .. } => None,
                })
                .collect(),
            Err(_) => (0..compiled.programs.len()).collect(),
        }
    }

    /// Builds, on several threads, the deferred programs (other launch shapes) that
    /// [`Measurer::not_worth_tuning`] lets through, counting them into
    /// `Compiled::built_later`.
    fn build_shapes_worth_measuring(&self) {
        let compiled = self.compiled;
        let wanted: Vec<usize> = (0..compiled.programs.len())
            .filter(|&k| {
                self.is_shape(k)
                    && !compiled.programs[k].program.is_built()
                    && self.not_worth_tuning(k).is_none()
            })
            .collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(wanted.len());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    while let Some(&k) =
                        wanted.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                    {
                        let b = &compiled.programs[k];
                        if let Ok(id) = b.program.id() {
                            let backend = &compiled.devices[b.device].1;
                            let origin = backend
                                .origin(id)
                                .unwrap_or(tessel_ir::ProgramOrigin::Compiled);
                            if let Ok(mut later) = compiled.built_later.lock() {
                                later.count(origin);
                            }
                        }
                    }
                });
            }
        });
    }

    /// Why measuring program `k`, another launch shape of a kernel, cannot pay, if it
    /// cannot: the kernel is not in the plan chosen from the other programs, its own shape
    /// is too fast to gain much, or it is much slower than another program writing its
    /// values (a generated product against the library routine). Exhaustive tuning
    /// measures every shape.
    fn not_worth_tuning(&self, k: usize) -> Option<String> {
        let compiled = self.compiled;
        let b = &compiled.programs[k];
        let tag = compiled.candidates[b.candidate].tuning.as_ref()?;
        if tag.is_default() || compiled.tuning == crate::Tuning::Exhaustive {
            return None;
        }
        let (base, _) = compiled.programs.iter().enumerate().find(|(_, o)| {
            o.device == b.device
                && compiled.candidates[o.candidate]
                    .tuning
                    .as_ref()
                    .is_some_and(|t| t.group == tag.group && t.is_default())
        })?;
        if let Some(plan) = &self.planned
            && !plan.contains(&base)
        {
            return Some("its kernel is not in the plan chosen from the other programs".into());
        }
        let time = self.times[base]?;
        let best = self.fastest_twin(k).unwrap_or(time);
        crate::tuning::hopeless(compiled.tuning, time, best)
    }

    /// The best time measured so far of a program on `k`'s device that writes exactly the
    /// values `k` writes.
    fn fastest_twin(&self, k: usize) -> Option<f64> {
        let compiled = self.compiled;
        let b = &compiled.programs[k];
        let writes = &compiled.candidates[b.candidate].writes;
        compiled
            .programs
            .iter()
            .zip(&self.times)
            .filter(|(o, _)| {
                o.device == b.device && compiled.candidates[o.candidate].writes == *writes
            })
            .filter_map(|(_, t)| *t)
            .min_by(f64::total_cmp)
    }

    /// The time of program `k` on `args`, after a first run of `first`: the median of
    /// several runs ([`Timed::Median`]), or the first run alone for a candidate that loses
    /// anyway ([`Timed::FirstRun`]).
    fn time(&self, k: usize, args: &[BufferId], first: Duration) -> Result<Timed> {
        let backend = self.backend(self.compiled.programs[k].device);
        let program = self.compiled.programs[k].program.id()?;
        // A candidate slower than a second, or `HOPELESS` times slower than the fastest
        // program writing the same values, is timed by its checking run alone: it loses
        // anyway.
        let hopeless = self
            .fastest_twin(k)
            .is_some_and(|best| first.as_secs_f64() > best * HOPELESS);
        if hopeless || first > Duration::from_secs(1) {
            return Ok(Timed::FirstRun(first.as_secs_f64()));
        }
        let runs = if first > Duration::from_millis(50) {
            2
        } else {
            RUNS
        };
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            samples.push(backend.time(program, args, &self.dims)?.as_secs_f64());
        }
        Ok(Timed::Median(median(samples)))
    }

    /// Runs `steps` on fresh buffers (inputs shared) and says why its targets differ from
    /// the references, if they do.
    fn check_plan(&mut self, steps: &[placement::Step]) -> Result<Option<String>> {
        let compiled = self.compiled;
        let mut bufs: FxHashMap<Place, BufferId> = self
            .real
            .iter()
            .filter(|(p, _)| p.device == 0 && matches!(p.slot, PlanSlot::Input(_)))
            .map(|(&p, &b)| (p, b))
            .collect();
        for &p in &compiled.empty {
            let place = Place {
                slot: PlanSlot::Node(p),
                device: 0,
            };
            let b = self.alloc(0, 1)?;
            bufs.insert(place, b);
        }
        for step in steps {
            match *step {
                placement::Step::Run(k) => {
                    let b = &compiled.programs[k];
                    let c = &compiled.candidates[b.candidate];
                    let mut args = Vec::with_capacity(c.args.len());
                    for &a in &c.args {
                        let place = Place {
                            slot: a,
                            device: b.device,
                        };
                        let buffer = if let Some(&buffer) = bufs.get(&place) {
                            buffer
                        } else {
                            let bytes = self.bytes(a)?;
                            let fresh = self.alloc(b.device, bytes)?;
                            bufs.insert(place, fresh);
                            fresh
                        };
                        args.push(buffer);
                    }
                    self.backend(b.device)
                        .time(b.program.id()?, &args, &self.dims)?;
                }
                placement::Step::Copy { class, from, to } => {
                    let slot = compiled.slot(class);
                    let src = bufs[&Place { slot, device: from }];
                    let bytes = self.bytes(slot)?;
                    let dst = self.alloc(to, bytes)?;
                    self.copy(from, src, to, dst, bytes)?;
                    bufs.insert(Place { slot, device: to }, dst);
                }
            }
        }
        for &t in &compiled.targets {
            let place = Place {
                slot: PlanSlot::Node(t),
                device: 0,
            };
            let (Some(&got), Some(&want)) = (bufs.get(&place), self.real.get(&place)) else {
                continue;
            };
            let Some(why) = self.disagreement(
                place.slot,
                (0, want),
                (0, got),
                PLAN_TOLERANCE * self.precision,
                0.0,
            )?
            else {
                continue;
            };
            // The program writing the target was checked on the reference inputs on its
            // own; if its inputs here match those, it amplified rounding (an Adam update
            // of a gradient that cancels to nothing, such as a key bias's) and the plan's
            // wiring is right.
            let producer = steps.iter().find_map(|s| match *s {
                placement::Step::Run(k)
                    if compiled.programs[k].device == 0
                        && compiled.candidates[compiled.programs[k].candidate]
                            .writes
                            .contains(&t) =>
                {
                    Some(&compiled.candidates[compiled.programs[k].candidate])
                }
                _ => None,
            });
            let Some(producer) = producer else {
                return Ok(Some(format!("target at {t}: {why}")));
            };
            for slot in producer.reads() {
                let place = Place { slot, device: 0 };
                let (Some(&got), Some(&want)) = (bufs.get(&place), self.real.get(&place)) else {
                    return Ok(Some(format!("target at {t}: {why}")));
                };
                if let Some(inner) = self.disagreement(
                    slot,
                    (0, want),
                    (0, got),
                    PLAN_TOLERANCE * self.precision,
                    0.0,
                )? {
                    return Ok(Some(format!(
                        "target at {t}: {why}; its input {slot:?}: {inner}"
                    )));
                }
            }
            tracing::debug!(target: "tessel::plan", "target at {t} differs from the reference ({why}), but the inputs of the program writing it agree");
        }
        Ok(None)
    }

    /// The buffer holding `slot`'s reference value: on the home device if it is there.
    fn reference(&self, slot: PlanSlot) -> Option<(&Place, &BufferId)> {
        let home = Place { slot, device: 0 };
        self.real
            .get_key_value(&home)
            .or_else(|| self.real.iter().find(|(p, _)| p.slot == slot))
    }

    /// Measured copies of every value between the home device and each other device
    /// (cached on disk by the two devices and the size).
    fn transfers(&mut self) -> Result<Vec<Transfer>> {
        let compiled = self.compiled;
        if compiled.devices.len() < 2 {
            return Ok(Vec::new());
        }
        let slots = compiled
            .buffers
            .keys()
            .map(|&p| PlanSlot::Node(p))
            .chain((0..compiled.inputs.len()).map(PlanSlot::Input));
        let mut by_size: FxHashMap<(usize, usize, usize), f64> = FxHashMap::default();
        let mut out = Vec::new();
        for slot in slots {
            let bytes = self.bytes(slot)?;
            for other in 1..compiled.devices.len() {
                for (from, to) in [(0, other), (other, 0)] {
                    let cost = if let Some(&t) = by_size.get(&(from, to, bytes)) {
                        t
                    } else {
                        let t = self.copy_time(from, to, bytes)?;
                        by_size.insert((from, to, bytes), t);
                        t
                    };
                    out.push(Transfer {
                        class: compiled.class(slot),
                        from,
                        to,
                        cost,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Median seconds to copy `bytes` from device `from` to device `to` through the host.
    fn copy_time(&mut self, from: usize, to: usize, bytes: usize) -> Result<f64> {
        let key = copy_key(
            (&**self.backend(from), self.device(from)),
            (&**self.backend(to), self.device(to)),
            bytes,
        );
        if let Some(t) = load_timing(key) {
            return Ok(t);
        }
        let src = self.alloc(from, bytes)?;
        let dst = self.alloc(to, bytes)?;
        let mut samples = Vec::with_capacity(RUNS);
        for _ in 0..=RUNS {
            let start = Instant::now();
            self.copy(from, src, to, dst, bytes)?;
            self.backend(to).synchronize(self.device(to).ordinal)?;
            samples.push(start.elapsed().as_secs_f64());
        }
        samples.remove(0); // warm-up
        let t = median(samples);
        store_timing(key, t);
        Ok(t)
    }

    /// The largest finite magnitude of `slot`'s reference value (0 for other dtypes),
    /// read once.
    fn magnitude(&mut self, slot: PlanSlot) -> Result<f64> {
        if let Some(&m) = self.magnitudes.get(&slot) {
            return Ok(m);
        }
        let (dtype, _) = self.compiled.size(slot);
        let (Some(decode), Some((place, &buffer))) = (float_decoder(dtype), self.reference(slot))
        else {
            return Ok(0.0);
        };
        let len = self.bytes(slot)?;
        if let Some(found) = self.on_device_differences(place.device, dtype, buffer, buffer, len) {
            self.magnitudes.insert(slot, found.largest);
            return Ok(found.largest);
        }
        let mut bytes = vec![0u8; len];
        if !bytes.is_empty() {
            self.backend(place.device).read(buffer, 0, &mut bytes)?;
        }
        let m = largest_magnitude(&bytes, dtype.size_bytes(), decode, 0.0);
        self.magnitudes.insert(slot, m);
        Ok(m)
    }

    /// Why two buffers holding `slot`'s value disagree beyond `tolerance` (relative to the
    /// largest reference magnitude: a different summation order moves every element by
    /// about the same absolute amount), if they do; other dtypes compare exactly.
    fn disagreement(
        &self,
        slot: PlanSlot,
        reference: (usize, BufferId),
        other: (usize, BufferId),
        tolerance: f64,
        floor: f64,
    ) -> Result<Option<String>> {
        let start = std::time::Instant::now();
        let found = self.compare(slot, reference, other, tolerance, floor);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(target: "tessel::measure", "compared {slot:?} with its reference in {ms:.1} ms");
        found
    }

    /// [`Measurer::disagreement`], untimed.
    fn compare(
        &self,
        slot: PlanSlot,
        reference: (usize, BufferId),
        other: (usize, BufferId),
        tolerance: f64,
        floor: f64,
    ) -> Result<Option<String>> {
        let (dtype, _) = self.compiled.size(slot);
        let len = self.bytes(slot)?;
        if reference.0 == other.0
            && let Some(found) =
                self.on_device_differences(reference.0, dtype, reference.1, other.1, len)
            && found.worst <= tolerance * found.largest.max(floor)
        {
            return Ok(None);
        }
        // Compared on the host: small buffers, other dtypes, and a disagreement, whose
        // first element the message names.
        let mut x = vec![0u8; len];
        let mut y = vec![0u8; len];
        if len > 0 {
            self.backend(reference.0).read(reference.1, 0, &mut x)?;
            self.backend(other.0).read(other.1, 0, &mut y)?;
        }
        let Some(decode) = float_decoder(dtype) else {
            return Ok((x != y).then(|| "the bytes differ".to_string()));
        };
        let width = dtype.size_bytes();
        let scale = largest_magnitude(&x, width, decode, floor);
        let tolerance = tolerance * scale;
        let first = in_parallel(x.len() / width, |range| {
            range.into_iter().find_map(|i| {
                let at = i * width..(i + 1) * width;
                let (p, q) = (decode(&x[at.clone()]), decode(&y[at]));
                let same = (p.is_nan() && q.is_nan()) || p == q || (p - q).abs() <= tolerance;
                (!same).then_some((i, p, q))
            })
        });
        Ok(first
            .into_iter()
            .flatten()
            .next()
            .map(|(i, p, q)| format!("element {i}: {q} instead of {p}")))
    }
}

impl Measurer<'_> {
    /// [`tessel_ir::compare::differences`] of two `dtype` buffers of `bytes` on `device`,
    /// run there: `None` for buffers under [`DEVICE_COMPARISON_MIN`], other dtypes, and
    /// where the device refuses the kernel (the host compares then).
    fn on_device_differences(
        &self,
        device: usize,
        dtype: DType,
        reference: BufferId,
        other: BufferId,
        bytes: usize,
    ) -> Option<compare::Differences> {
        let n = bytes / dtype.size_bytes().max(1);
        if bytes < DEVICE_COMPARISON_MIN
            || !matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
            || n > compare::MAX_LEN
        {
            return None;
        }
        let backend = self.backend(device);
        let ordinal = self.device(device).ordinal;
        let program = difference_program(backend, ordinal, dtype)?;
        let summary_bytes = 2 * compare::GROUPS * compare::summary_dtype(dtype).size_bytes();
        let run = || -> std::result::Result<compare::Differences, tessel_ir::BackendError> {
            let summary = backend.alloc(ordinal, summary_bytes)?;
            let dims = Bindings::new().with(compare::length(), n as i64);
            let mut out = vec![0u8; summary_bytes];
            let done = backend
                .launch(program, &[reference, other, summary], &dims)
                .and_then(|()| backend.read(summary, 0, &mut out));
            let _ = backend.free(summary);
            done.map(|()| compare::Differences::read(&out, dtype))
        };
        run()
            .inspect_err(|e| tracing::debug!(target: "tessel::measure", "comparing on {} failed ({e}); comparing on the host", backend.name()))
            .ok()
    }
}

/// Buffers from this size on are compared on their device
/// ([`Measurer::on_device_differences`]); smaller ones on the host, where reading them
/// costs less than a launch.
const DEVICE_COMPARISON_MIN: usize = 8 << 20;

/// The [`compare::differences`] program of `dtype` on device `ordinal` of `backend`,
/// compiled once per process (`None` where the device refused it or would interpret it).
fn difference_program(
    backend: &Arc<dyn Backend>,
    ordinal: usize,
    dtype: DType,
) -> Option<ProgramId> {
    type Programs = FxHashMap<(usize, usize, DType), Option<ProgramId>>;
    static PROGRAMS: std::sync::Mutex<Option<Programs>> = std::sync::Mutex::new(None);
    // Backends live as long as the process: the address names one.
    let key = (Arc::as_ptr(backend).cast::<u8>() as usize, ordinal, dtype);
    let lock = || {
        PROGRAMS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    if let Some(&known) = lock().as_ref().and_then(|m| m.get(&key)) {
        return known;
    }
    // Compiled outside the lock; a racing thread's duplicate is released.
    let compiled = compare::differences(dtype)
        .map_err(|e| e.to_string())
        .and_then(|kernel| backend.compile(ordinal, &kernel).map_err(|e| e.to_string()))
        .inspect_err(|e| tracing::debug!(target: "tessel::measure", "{}: no device comparison of {dtype}: {e}", backend.name()))
        .ok()
        // An interpreted comparison is slower than the host's.
        .filter(|&p| {
            let interpreted = matches!(backend.origin(p), Ok(tessel_ir::ProgramOrigin::Interpreted));
            if interpreted {
                let _ = backend.release(p);
            }
            !interpreted
        });
    let mut programs = lock();
    let programs = programs.get_or_insert_with(FxHashMap::default);
    if let Some(&known) = programs.get(&key) {
        if let Some(p) = compiled {
            let _ = backend.release(p);
        }
        return known;
    }
    programs.insert(key, compiled);
    compiled
}

fn eval(numel: Dim, dims: &Bindings) -> Result<usize> {
    let n = numel.eval(dims).map_err(Error::from_eval)?;
    Ok(n.max(0) as usize)
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// `f` on contiguous ranges of `0..elements`, one per available core for large ranges,
/// at once, in range order: a first call compares outputs of hundreds of megabytes on the
/// host (a cross-entropy's gradient over a vocabulary), which one core does in seconds.
fn in_parallel<R: Send>(elements: usize, f: impl Fn(std::ops::Range<usize>) -> R + Sync) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let threads = cores.min(elements.div_ceil(1 << 18)).max(1);
    if threads == 1 {
        return vec![f(0..elements)];
    }
    let per = elements.div_ceil(threads);
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = (0..threads)
            .map(|t| scope.spawn(move || f(t * per..((t + 1) * per).min(elements))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// The largest finite magnitude among `bytes`' elements, and `floor`.
fn largest_magnitude(bytes: &[u8], width: usize, decode: fn(&[u8]) -> f64, floor: f64) -> f64 {
    in_parallel(bytes.len() / width, |range| {
        bytes[range.start * width..range.end * width]
            .chunks_exact(width)
            .map(decode)
            .filter(|v| v.is_finite())
            .fold(floor, |m, v| m.max(v.abs()))
    })
    .into_iter()
    .fold(floor, f64::max)
}

/// How to read one element of a float dtype as f64, `None` for other dtypes.
fn float_decoder(dtype: DType) -> Option<fn(&[u8]) -> f64> {
    Some(match dtype {
        DType::F32 => |b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::F64 => |b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        DType::F16 => |b| half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        _ => return None,
    })
}

/// The disk timing cache: one small file per (backend, device, driver, program text,
/// dynamic-dim values), or per copy (both devices, size).
fn timing_dir() -> PathBuf {
    tessel_ir::cache::default_root().join("timings")
}

/// Hashes the dynamic dims' values (a program takes as long as the sizes it runs at), in
/// name order.
pub(crate) fn dims_identity(h: &mut Fnv128, dims: &Bindings) {
    let mut values: Vec<(String, i64)> = dims.iter().map(|(v, n)| (v.to_string(), n)).collect();
    values.sort_unstable();
    for (name, value) in values {
        h.field(format!("{name}={value}").as_bytes());
    }
}

/// Hashes a backend's device identity: backend, device name and driver.
pub(crate) fn device_identity(h: &mut Fnv128, backend: &dyn Backend, device: Device) {
    h.field(backend.name().as_bytes());
    if let Some(info) = backend.devices().get(device.ordinal) {
        h.field(info.name.as_bytes());
        h.field(info.driver.as_bytes());
    }
}

/// A measured time and how it was taken.
#[derive(Clone, Copy, Debug)]
enum Timed {
    /// The median of several runs: what the timing cache keeps.
    Median(f64),
    /// One checking run of a program that loses anyway: an upper bound.
    FirstRun(f64),
}

fn timing_key(
    backend: &dyn Backend,
    device: Device,
    work: &Work,
    variant: &str,
    dims: &Bindings,
) -> u128 {
    let mut h = Fnv128::new();
    // v3: v2 caches could hold first-run times of losing candidates.
    h.field(b"tessel-timing-v3");
    // A program with dynamic dims takes as long as the sizes it runs at.
    dims_identity(&mut h, dims);
    device_identity(&mut h, backend, device);
    if let Work::Vendor(_) = work {
        h.field(backend.vendor_library(device.ordinal).as_bytes());
        h.field(variant.as_bytes());
    }
    h.field(work.text().as_bytes());
    h.finish()
}

fn copy_key(from: (&dyn Backend, Device), to: (&dyn Backend, Device), bytes: usize) -> u128 {
    let mut h = Fnv128::new();
    h.field(b"tessel-copy-v1");
    device_identity(&mut h, from.0, from.1);
    device_identity(&mut h, to.0, to.1);
    h.field(&bytes.to_le_bytes());
    h.finish()
}

fn load_timing(key: u128) -> Option<f64> {
    let text = read_keyed(&timing_dir(), key)?;
    text.trim()
        .parse()
        .ok()
        .filter(|t: &f64| t.is_finite() && *t >= 0.0)
}

fn store_timing(key: u128, seconds: f64) {
    let dir = timing_dir();
    // A cache that cannot be written costs a measurement next time, nothing else.
    if let Err(e) = write_keyed(&dir, key, &format!("{seconds:e}\n")) {
        tracing::debug!(target: "tessel::plan", "cannot cache a timing in {}: {e}", dir.display());
    }
}
