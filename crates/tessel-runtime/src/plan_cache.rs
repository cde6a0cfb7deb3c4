//! Chosen plans on disk, so that a second process measures nothing it already chose.
//!
//! A plan is stored under a hash of everything its choice depends on: the realize's
//! candidates (each program's text, the values it reads and writes), the devices (backend,
//! device name, driver, vendor library), the dynamic dims' values, the `f32` product
//! precision and determinism, and this crate's version. What is stored is the choice itself: for each step,
//! the candidate, the device and the routine's variant (or the value copied and between
//! which devices), with the step's measured time for `tessel_tensor::inspect`, and the runner-up
//! the same way. A process that finds its plan compiles only the programs the plan runs
//! and skips measurement; a stored step that no longer builds (a routine's variant gone, a
//! kernel that fails to compile) makes it plan from scratch.
//!
//! The files live in `$TESSEL_CACHE_DIR/plans/` (see [`tessel_ir::cache::default_root`]);
//! `TESSEL_PLAN_CACHE=0` turns the cache off. A file that cannot be read or parsed is
//! ignored (and replaced by the next plan made for its key).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::LazyLock;

use tessel_graph::placement::Step;
use tessel_ir::cache::{Fnv128, read_keyed, write_keyed};
use tessel_shape::Bindings;

use crate::determinism::Numerics;
use crate::measure::{device_identity, dims_identity};
use crate::planner::{Compiled, Partitions, PlanDevice, PlanSlot};

/// One step of a stored plan, by what it runs rather than by program index.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum StoredStep {
    Run {
        candidate: usize,
        device: usize,
        variant: String,
        time: Option<f64>,
    },
    Copy {
        slot: PlanSlot,
        from: usize,
        to: usize,
    },
}

/// A plan as stored: its steps and its runner-up's.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StoredPlan {
    pub(crate) steps: Vec<StoredStep>,
    pub(crate) runner_up: Option<Vec<StoredStep>>,
}

impl StoredPlan {
    /// The plan `steps` (and `runner_up`) of `compiled`, with the programs' `times`.
    pub(crate) fn new(
        compiled: &Compiled,
        times: &[Option<f64>],
        steps: &[Step],
        runner_up: Option<&[Step]>,
    ) -> StoredPlan {
        let convert = |steps: &[Step]| {
            steps
                .iter()
                .map(|step| match *step {
                    Step::Run(k) => {
                        let b = &compiled.programs[k];
                        StoredStep::Run {
                            candidate: b.candidate,
                            device: b.device,
                            variant: b.variant.clone(),
                            time: times.get(k).copied().flatten(),
                        }
                    }
                    Step::Copy { class, from, to } => StoredStep::Copy {
                        slot: compiled.slot(class),
                        from,
                        to,
                    },
                })
                .collect()
        };
        StoredPlan {
            steps: convert(steps),
            runner_up: runner_up.map(convert),
        }
    }

    /// Every `(candidate, device)` the plan and its runner-up run.
    pub(crate) fn programs(&self) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = self
            .steps
            .iter()
            .chain(self.runner_up.iter().flatten())
            .filter_map(|s| match s {
                StoredStep::Run {
                    candidate, device, ..
                } => Some((*candidate, *device)),
                StoredStep::Copy { .. } => None,
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The steps as placement steps of `compiled` with the programs' times, or `None` where
    /// a step's program was not built.
    pub(crate) fn resolve(
        steps: &[StoredStep],
        compiled: &Compiled,
        times: &mut [Option<f64>],
    ) -> Option<Vec<Step>> {
        steps
            .iter()
            .map(|s| match s {
                StoredStep::Run {
                    candidate,
                    device,
                    variant,
                    time,
                } => {
                    let k = compiled.programs.iter().position(|b| {
                        b.candidate == *candidate && b.device == *device && b.variant == *variant
                    })?;
                    times[k] = *time;
                    Some(Step::Run(k))
                }
                StoredStep::Copy { slot, from, to } => (*from < compiled.devices.len()
                    && *to < compiled.devices.len())
                .then(|| Step::Copy {
                    class: compiled.class(*slot),
                    from: *from,
                    to: *to,
                }),
            })
            .collect()
    }

    fn to_text(&self) -> String {
        let mut out = String::from("tessel-plan-v1\n");
        let mut section = |name: &str, steps: &[StoredStep]| {
            let _ = writeln!(out, "{name}");
            for step in steps {
                let _ = match step {
                    StoredStep::Run {
                        candidate,
                        device,
                        variant,
                        time,
                    } => {
                        let time = time.map_or("-".to_owned(), |t| format!("{t:e}"));
                        writeln!(out, "run {candidate} {device} {time} {variant}")
                    }
                    StoredStep::Copy { slot, from, to } => {
                        let slot = match slot {
                            PlanSlot::Input(i) => format!("i{i}"),
                            PlanSlot::Node(p) => format!("n{p}"),
                        };
                        writeln!(out, "copy {slot} {from} {to}")
                    }
                };
            }
        };
        section("plan", &self.steps);
        if let Some(runner_up) = &self.runner_up {
            section("runner-up", runner_up);
        }
        out
    }

    fn parse(text: &str) -> Option<StoredPlan> {
        let mut lines = text.lines();
        if lines.next()? != "tessel-plan-v1" || lines.next()? != "plan" {
            return None;
        }
        let mut plan = StoredPlan {
            steps: Vec::new(),
            runner_up: None,
        };
        for line in lines {
            if line == "runner-up" {
                plan.runner_up = Some(Vec::new());
                continue;
            }
            let (kind, rest) = line.split_once(' ')?;
            let step = match kind {
                "run" => {
                    let mut parts = rest.splitn(4, ' ');
                    let candidate = parts.next()?.parse().ok()?;
                    let device = parts.next()?.parse().ok()?;
                    let time = match parts.next()? {
                        "-" => None,
                        t => Some(t.parse::<f64>().ok().filter(|t| t.is_finite())?),
                    };
                    StoredStep::Run {
                        candidate,
                        device,
                        time,
                        variant: parts.next().unwrap_or("").to_owned(),
                    }
                }
                "copy" => {
                    let mut parts = rest.split(' ');
                    let slot = parts.next()?;
                    let slot = match slot.split_at_checked(1)? {
                        ("i", i) => PlanSlot::Input(i.parse().ok()?),
                        ("n", p) => PlanSlot::Node(p.parse().ok()?),
                        _ => return None,
                    };
                    StoredStep::Copy {
                        slot,
                        from: parts.next()?.parse().ok()?,
                        to: parts.next()?.parse().ok()?,
                    }
                }
                _ => return None,
            };
            match &mut plan.runner_up {
                Some(runner_up) => runner_up.push(step),
                None => plan.steps.push(step),
            }
        }
        Some(plan)
    }
}

/// Whether plans are read from and written to disk (`TESSEL_PLAN_CACHE=0` says no).
pub(crate) fn enabled() -> bool {
    static ON: LazyLock<bool> =
        LazyLock::new(|| std::env::var("TESSEL_PLAN_CACHE").map_or(true, |v| v.trim() != "0"));
    *ON
}

/// The key of the plan chosen from `parts` on `devices`.
pub(crate) fn key(
    parts: &Partitions,
    devices: &[PlanDevice],
    dims: &Bindings,
    numerics: Numerics,
) -> u128 {
    let mut h = Fnv128::new();
    h.field(b"tessel-plan-v1");
    h.field(env!("CARGO_PKG_VERSION").as_bytes());
    h.field(numerics.name().as_bytes());
    dims_identity(&mut h, dims);
    for (device, backend) in devices {
        device_identity(&mut h, &**backend, *device);
        h.field(backend.vendor_library(device.ordinal).as_bytes());
    }
    parts.fingerprint(&mut h);
    h.finish()
}

fn dir() -> PathBuf {
    tessel_ir::cache::default_root().join("plans")
}

pub(crate) fn load(key: u128) -> Option<StoredPlan> {
    let text = read_keyed(&dir(), key)?;
    let plan = StoredPlan::parse(&text);
    if plan.is_none() {
        tracing::debug!(target: "tessel::plan", "ignoring the unreadable stored plan {key:032x}");
    }
    plan
}

pub(crate) fn store(key: u128, plan: &StoredPlan) {
    let dir = dir();
    // A cache that cannot be written costs a measurement next time, nothing else.
    if let Err(e) = write_keyed(&dir, key, &plan.to_text()) {
        tracing::debug!(target: "tessel::plan", "cannot store a plan in {}: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_plans_read_back() {
        let plan = StoredPlan {
            steps: vec![
                StoredStep::Run {
                    candidate: 3,
                    device: 0,
                    variant: "cublasLt bias gelu".into(),
                    time: Some(1.5e-4),
                },
                StoredStep::Copy {
                    slot: PlanSlot::Node(7),
                    from: 1,
                    to: 0,
                },
                StoredStep::Run {
                    candidate: 4,
                    device: 1,
                    variant: String::new(),
                    time: None,
                },
            ],
            runner_up: Some(vec![StoredStep::Copy {
                slot: PlanSlot::Input(2),
                from: 0,
                to: 1,
            }]),
        };
        assert_eq!(StoredPlan::parse(&plan.to_text()), Some(plan));
        assert_eq!(
            StoredPlan::parse("tessel-plan-v1\nplan\nrun 1 x - \n"),
            None
        );
        assert_eq!(StoredPlan::parse("garbage"), None);
    }
}
