//! Step 2 of planning: every candidate compiled for each device the realize may use (see
//! the module above).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_graph::extract::ClassId;
use tessel_graph::placement::Step;
use tessel_ir::{Backend, BackendError, Kernel, ProgramId, ProgramOrigin};
use tessel_shape::{DType, Dim};

use crate::device::Device;
use crate::error::Result;
use crate::plan_cache::StoredPlan;
use crate::program::{Program, program};
use crate::tuning::{self, Tuning};

use super::partition::{Candidate, Partitions, Work};
use super::{
    Place, Plan, PlanDevice, PlanSlot, PlanStep, PlanView, ProgramView, cooperative_workgroups,
};

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
    let deterministic = parts.deterministic;
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
                Ok(mut programs) => {
                    if deterministic {
                        let varying;
                        (programs, varying) = programs.into_iter().partition(|p| p.deterministic);
                        for p in varying {
                            tracing::debug!(target: "tessel::plan", "{device}: {op} by {} left out: its results vary run to run (deterministic algorithms are on)", p.variant);
                            if let Err(e) = backend.release(p.program) {
                                tracing::warn!(target: "tessel::plan", "{device}: releasing {}: {e}", p.variant);
                            }
                        }
                    }
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
pub(crate) fn compile_all(
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
    pub(crate) fn default_plan(&self) -> Plan {
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
