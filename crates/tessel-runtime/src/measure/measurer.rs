//! The measurer: every program run on the realize's inputs in dependency order, checked
//! against the reference values, and timed with device timers (or its time found in the
//! timing cache).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_graph::extract::Budget;
use tessel_graph::placement::{self, Transfer};
use tessel_ir::{Backend, BufferId, compare};
use tessel_shape::{Bindings, DType};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::planner::{Compiled, Place, PlanSlot, Work};

use super::check::{
    DEVICE_COMPARISON_MIN, difference_program, eval, float_decoder, in_parallel, largest_magnitude,
    median,
};
use super::placement_problem;
use super::timings::{Timed, copy_key, load_timing, store_timing, timing_key};

/// Runs programs to validate and time them.
pub(super) struct Measurer<'c> {
    pub(super) compiled: &'c Compiled,
    /// A buffer holding each value, per device it has been produced on or copied to.
    pub(super) real: FxHashMap<Place, BufferId>,
    /// Every buffer allocated (with its device), freed at the end.
    pub(super) owned: Vec<(usize, BufferId)>,
    /// The dynamic dims' values for this measurement.
    pub(super) dims: Bindings,
    /// [`CANDIDATE_TOLERANCE`], or the rounding of the narrowest float the realize holds.
    pub(super) precision: f64,
    /// [`Measurer::magnitude`]'s answers.
    pub(super) magnitudes: FxHashMap<PlanSlot, f64>,
    /// Each program's time, once measured (or found in the cache) and checked.
    pub(super) times: Vec<Option<f64>>,
    /// The programs of the plan extracted from every program but the other launch shapes
    /// of kernels, made before the first of those runs (every program where no plan was
    /// found).
    pub(super) planned: Option<FxHashSet<usize>>,
}

/// Timed runs after the first (validating) one; fewer for slow candidates.
pub(super) const RUNS: usize = 5;

/// How many times slower than the fastest program writing the same values a program may
/// become before its checking run is stopped (where the backend can stop one): it would
/// never be chosen. A naive generated 2048³ product on a CPU took 35 s to lose to `gemm`'s
/// 0.1 s.
pub(super) const HOPELESS: f64 = 8.0;

/// A checking run is never stopped before this: stopping saves nothing worth losing the
/// program as a runner-up for.
pub(super) const HOPELESS_AFTER: Duration = Duration::from_millis(100);

/// How far a candidate's output may be from the reference computed from the same inputs,
/// relative to the largest reference magnitude, when every value is f32 or wider. Where
/// the realize holds narrower floats, the tolerance is that of their rounding
/// ([`Measurer::precision`]): two candidates rounding an f32 product to bf16 at different
/// points differ by bf16's 2^-8, and with 1e-3 every library product of a bf16 model was
/// dropped for it.
pub(super) const CANDIDATE_TOLERANCE: f64 = 1e-3;

/// The candidates' tolerance where `f32` products may run in TF32
/// ([`crate::set_float32_matmul_precision`]).
pub(super) const TF32_TOLERANCE: f64 = 1e-2;

/// The same for a whole plan's targets, as a multiple of the candidates' tolerance.
/// Rounding differences of every program add up along the plan and some steps amplify
/// them (an Adam update divides a gradient by its own magnitude); a program wired to the
/// wrong values is off by the values' own size.
pub(super) const PLAN_TOLERANCE: f64 = 10.0;

impl<'c> Measurer<'c> {
    pub(super) fn new(compiled: &'c Compiled, dims: &Bindings) -> Self {
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
    pub(super) fn precision(compiled: &Compiled) -> f64 {
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

    pub(super) fn backend(&self, device: usize) -> &Arc<dyn Backend> {
        &self.compiled.devices[device].1
    }

    pub(super) fn device(&self, device: usize) -> Device {
        self.compiled.devices[device].0
    }

    /// Bytes of a slot's value under this measurement's dims.
    pub(super) fn bytes(&self, slot: PlanSlot) -> Result<usize> {
        let (dtype, numel) = self.compiled.size(slot);
        Ok(eval(numel, &self.dims)? * dtype.size_bytes())
    }

    /// A buffer of `bytes` filled with `0xff` (NaN in every float dtype), so a program
    /// that reads an element nothing wrote fails its check instead of passing on whatever
    /// a reused allocation held.
    pub(super) fn alloc(&mut self, device: usize, bytes: usize) -> Result<BufferId> {
        let ordinal = self.device(device).ordinal;
        let b = self.backend(device).alloc(ordinal, bytes.max(1))?;
        self.owned.push((device, b));
        self.backend(device).fill(b, 0xff, bytes.max(1))?;
        Ok(b)
    }

    pub(super) fn free(&mut self) {
        for (d, b) in std::mem::take(&mut self.owned) {
            let _ = self.backend(d).free(b);
        }
    }

    /// Frees one buffer of [`Self::owned`] before the end.
    pub(super) fn release(&mut self, device: usize, buffer: BufferId) {
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
    pub(super) fn copy(
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
    pub(super) fn on_device(&mut self, slot: PlanSlot, device: usize) -> Result<Option<BufferId>> {
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
    pub(super) fn run(&mut self, inputs: &[BufferId]) -> Result<Vec<Option<f64>>> {
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
    pub(super) fn measure(&mut self, k: usize, known: Option<f64>) -> Result<Option<Timed>> {
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
    pub(super) fn is_shape(&self, k: usize) -> bool {
        let c = &self.compiled.candidates[self.compiled.programs[k].candidate];
        c.tuning.as_ref().is_some_and(|t| !t.is_default())
    }

    /// The programs of the cheapest plan of those measured so far that are not other
    /// launch shapes; every program where there is none (copies between devices are not
    /// timed yet).
    pub(super) fn plan_without_shapes(&self) -> FxHashSet<usize> {
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
    pub(super) fn build_shapes_worth_measuring(&self) {
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
    pub(super) fn not_worth_tuning(&self, k: usize) -> Option<String> {
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
    pub(super) fn fastest_twin(&self, k: usize) -> Option<f64> {
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
    pub(super) fn time(&self, k: usize, args: &[BufferId], first: Duration) -> Result<Timed> {
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
    pub(super) fn check_plan(&mut self, steps: &[placement::Step]) -> Result<Option<String>> {
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
    pub(super) fn reference(&self, slot: PlanSlot) -> Option<(&Place, &BufferId)> {
        let home = Place { slot, device: 0 };
        self.real
            .get_key_value(&home)
            .or_else(|| self.real.iter().find(|(p, _)| p.slot == slot))
    }

    /// Measured copies of every value between the home device and each other device
    /// (cached on disk by the two devices and the size).
    pub(super) fn transfers(&mut self) -> Result<Vec<Transfer>> {
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
    pub(super) fn copy_time(&mut self, from: usize, to: usize, bytes: usize) -> Result<f64> {
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
    pub(super) fn magnitude(&mut self, slot: PlanSlot) -> Result<f64> {
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
    pub(super) fn disagreement(
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
    pub(super) fn compare(
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
    pub(super) fn on_device_differences(
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
