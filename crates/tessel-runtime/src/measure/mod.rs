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

use std::sync::Arc;

use tessel_graph::extract::{Budget, ExtractError};
use tessel_graph::placement::{self, PlacedCandidate, Placement, Transfer};
use tessel_ir::BufferId;
use tessel_shape::Bindings;

use crate::error::{Error, Result};
use crate::plan_cache::StoredPlan;
use crate::planner::{Compiled, Plan, PlanSlot};

mod check;
mod measurer;
mod timings;

use measurer::Measurer;
pub(crate) use timings::{device_identity, dims_identity};

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
                    computes: c
                        .computes
                        .iter()
                        .map(|&v| compiled.class(PlanSlot::Node(v)))
                        .collect(),
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
