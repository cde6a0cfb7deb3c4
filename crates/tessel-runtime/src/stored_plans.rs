//! Whole plans on disk, keyed by what they compute, so that a warm process runs a realize
//! it planned in an earlier run without planning it again.
//!
//! [`crate::plan_cache`] stores the *choice* among a realize's candidates under a hash of
//! the candidates: finding it needs the candidates, so a warm process still simplifies
//! the graph and partitions it (a model's first call spends most of its warm time there).
//! This cache stores the chosen plan itself (every program's kernel text or routine
//! record, the launches, copies and buffers) under a hash of the graph's structure
//! ([`Signature::stable_hash`]), the devices (backend, name, driver, vendor library), the
//! `f32` product precision and determinism, the tuning mode and the build of the program: a planner
//! change needs a new build, and a new build plans anew. A process that finds its plan
//! parses the kernels, compiles them (the backends' program caches make that a load) and
//! runs, without touching the e-graph.
//!
//! Dynamic dims are stored as the variables they are (name and bounds) and sizes as
//! expressions of them, so a plan with dynamic dims replays for any of their values, as a
//! cached plan does in memory. A plan is stored only where every kernel, routine and size
//! reads back exactly. Files live in
//! `$TESSEL_CACHE_DIR/whole-plans/`; `TESSEL_PLAN_CACHE=0` turns this cache off with the
//! other. A file that cannot be read, or whose programs no longer build, is ignored and
//! replaced by the next plan made for its key. `TESSEL_WHOLE_PLANS=0` turns off this cache
//! alone (a warm process then plans and finds its choice in [`crate::plan_cache`]).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use rustc_hash::FxHashMap;
use tessel_graph::Signature;
use tessel_ir::cache::{Fnv128, read_keyed, write_keyed};
use tessel_ir::{Kernel, ProgramOrigin, VendorOp};
use tessel_shape::{DType, Dim, Var};

use crate::determinism::Numerics;
use crate::measure::device_identity;
use crate::planner::{self, Compiled, Origins, Place, Plan, PlanDevice, PlanSlot, PlanStep, Work};
use crate::program::{Program, program};
use crate::tuning::Tuning;

/// Whether whole plans are read and written (see the module docs).
pub(crate) fn enabled() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| {
        crate::plan_cache::enabled()
            && std::env::var("TESSEL_WHOLE_PLANS").map_or(true, |v| v.trim() != "0")
    });
    *ON
}

/// The key of the plan for `signature` on `devices`, or `None` where the signature has no
/// stable hash (see [`Signature::stable_hash`]).
pub(crate) fn key(
    signature: &Signature,
    devices: &[PlanDevice],
    numerics: Numerics,
    tuning: Tuning,
) -> Option<u128> {
    let structure = signature.stable_hash()?;
    let mut h = Fnv128::new();
    h.field(b"tessel-whole-plan-v1");
    h.field(env!("CARGO_PKG_VERSION").as_bytes());
    h.field(BUILD.as_bytes());
    h.field(numerics.name().as_bytes());
    h.field(format!("{tuning:?}").as_bytes());
    for (device, backend) in devices {
        device_identity(&mut h, &**backend, *device);
        h.field(backend.vendor_library(device.ordinal).as_bytes());
    }
    h.bytes(&structure.to_le_bytes());
    Some(h.finish())
}

/// The running executable's size and modification time: plans made by one build of the
/// planner are not reused by another.
static BUILD: LazyLock<String> = LazyLock::new(|| {
    std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|m| {
            let modified = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            format!("{} {modified}", m.len())
        })
        .unwrap_or_default()
});

fn dir() -> PathBuf {
    tessel_ir::cache::default_root().join("whole-plans")
}

/// Stores `plan`, whose programs are among `compiled`'s, under `key`; does nothing where a
/// program has no exact text (a symbolic size, a kernel that does not read back).
pub(crate) fn store(key: u128, plan: &Plan, compiled: &Compiled) {
    let Some(text) = to_text(plan, compiled) else {
        tracing::debug!(target: "tessel::plan", "the plan {key:032x} has programs without an exact text; not stored whole");
        return;
    };
    let dir = dir();
    // A cache that cannot be written costs planning next time, nothing else.
    if let Err(e) = write_keyed(&dir, key, &text) {
        tracing::debug!(target: "tessel::plan", "cannot store a plan in {}: {e}", dir.display());
    }
    PRUNED.call_once(|| tessel_ir::cache::keep_newest(&dir, KEEP));
}

/// Whether this process bounded the folder yet: once per process, since a folder of many
/// files takes a while to list.
static PRUNED: std::sync::Once = std::sync::Once::new();

/// Whole plans kept on disk (beyond those one process adds): each build of a program keys
/// its plans anew, so the oldest go.
const KEEP: usize = 1024;

/// The plan stored under `key`, its programs built for `devices` (counted in `origins`),
/// or `None` (nothing stored, unreadable, or a program that no longer builds).
pub(crate) fn load(key: u128, devices: &[PlanDevice], origins: &mut Origins) -> Option<Plan> {
    let text = read_keyed(&dir(), key)?;
    let plan = from_text(&text, devices, origins);
    if plan.is_none() {
        tracing::debug!(target: "tessel::plan", "the stored whole plan {key:032x} does not build here; planning again");
    }
    plan
}

const HEADER: &str = "tessel-whole-plan-v1";

fn to_text(plan: &Plan, compiled: &Compiled) -> Option<String> {
    let by_program: FxHashMap<*const Program, usize> = compiled
        .programs
        .iter()
        .enumerate()
        .map(|(k, b)| (Arc::as_ptr(&b.program), k))
        .collect();
    // Programs in order of first use, each written once.
    let mut numbers: FxHashMap<usize, usize> = FxHashMap::default();
    // The dynamic dims routines and buffer sizes name, declared before the programs.
    let mut vars: Vec<Var> = Vec::new();
    let mut out = String::new();
    let mut sections = Vec::new();
    let mut next = Some(plan);
    while let Some(p) = next {
        let mut section = String::new();
        for step in &p.steps {
            match step {
                PlanStep::Launch {
                    program,
                    device,
                    args,
                } => {
                    let k = *by_program.get(&Arc::as_ptr(program))?;
                    let fresh = numbers.len();
                    let number = *numbers.entry(k).or_insert(fresh);
                    if number == fresh {
                        let built = &compiled.programs[k];
                        match &compiled.candidates[built.candidate].work {
                            Work::Kernel(kernel) => {
                                let text = kernel.to_string();
                                if Kernel::parse(&text).ok().as_ref() != Some(kernel) {
                                    return None;
                                }
                                let lines = text.lines().count();
                                let _ = writeln!(
                                    out,
                                    "kernel {} {lines}\n{}",
                                    built.device,
                                    text.trim_end()
                                );
                            }
                            Work::Vendor(op) => {
                                let record = op.record();
                                let op_vars = op.vars();
                                if VendorOp::from_record(&record, &op_vars).as_ref() != Some(op) {
                                    return None;
                                }
                                vars.extend(op_vars);
                                let _ = writeln!(
                                    out,
                                    "routine {} {}\n{record}",
                                    built.device, built.variant
                                );
                            }
                        }
                    }
                    let _ = write!(section, "launch {number} {device}");
                    for a in args {
                        let _ = write!(section, " {}", place_text(*a));
                    }
                    section.push('\n');
                }
                PlanStep::Copy { from, to } => {
                    let _ = writeln!(section, "copy {} {}", place_text(*from), place_text(*to));
                }
            }
        }
        for (place, dtype, numel) in &p.buffers {
            vars.extend(numel.vars());
            let _ = writeln!(section, "buffer {} {dtype} {numel}", place_text(*place));
        }
        let inputs: Vec<String> = p.inputs.iter().map(usize::to_string).collect();
        let _ = writeln!(section, "inputs {}", inputs.join(" "));
        let outputs: Vec<String> = p
            .outputs
            .iter()
            .map(|(pos, k)| format!("{pos}:{k}"))
            .collect();
        let _ = writeln!(section, "outputs {}", outputs.join(" "));
        sections.push(section);
        next = p.fallback.as_deref();
    }
    for (i, section) in sections.iter().enumerate() {
        out.push_str(if i == 0 { "plan\n" } else { "fallback\n" });
        out.push_str(section);
    }
    vars.sort_unstable_by_key(|v| v.name());
    vars.dedup();
    // Sizes name their variables by name alone.
    if vars.windows(2).any(|w| w[0].name() == w[1].name()) {
        return None;
    }
    let mut head = format!("{HEADER}\n");
    for v in &vars {
        let b = v.bounds();
        let _ = writeln!(head, "var {} {} {}", v.name(), b.lo, b.hi);
    }
    // Every size must read back as itself (two variables may share a name).
    let sizes_read_back = plan_and_fallbacks(plan).all(|p| {
        p.buffers
            .iter()
            .all(|(_, _, n)| size_of(&n.to_string(), &vars) == Some(*n))
    });
    sizes_read_back.then(|| head + &out)
}

/// A plan and its fallbacks, in order.
fn plan_and_fallbacks(plan: &Plan) -> impl Iterator<Item = &Plan> {
    std::iter::successors(Some(plan), |p| p.fallback.as_deref())
}

/// A size's text read back, its variables among `vars`.
fn size_of(text: &str, vars: &[Var]) -> Option<Dim> {
    Dim::parse(text, |name| {
        vars.iter().copied().find(|v| &*v.name() == name)
    })
}

fn place_text(p: Place) -> String {
    match p.slot {
        PlanSlot::Input(i) => format!("i{i}@{}", p.device),
        PlanSlot::Node(n) => format!("n{n}@{}", p.device),
    }
}

fn place_of(text: &str) -> Option<Place> {
    let (slot, device) = text.split_once('@')?;
    let slot = match slot.split_at_checked(1)? {
        ("i", i) => PlanSlot::Input(i.parse().ok()?),
        ("n", n) => PlanSlot::Node(n.parse().ok()?),
        _ => return None,
    };
    Some(Place {
        slot,
        device: device.parse().ok()?,
    })
}

/// A program of the text, before it is built.
enum Source {
    Kernel(Kernel),
    Routine { op: VendorOp, variant: String },
}

fn from_text(text: &str, devices: &[PlanDevice], origins: &mut Origins) -> Option<Plan> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    let mut sources: Vec<(usize, Source)> = Vec::new();
    let mut vars: Vec<Var> = Vec::new();
    let mut line = lines.next()?;
    loop {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "var" => {
                let mut words = rest.split(' ');
                let name = words.next()?;
                let lo = words.next()?.parse().ok()?;
                let hi = words.next()?.parse().ok()?;
                vars.push(Var::new(name, lo, hi).ok()?);
            }
            "kernel" => {
                let (device, count) = rest.split_once(' ')?;
                let count: usize = count.parse().ok()?;
                let body: Vec<&str> = lines.by_ref().take(count).collect();
                let kernel = Kernel::parse(&body.join("\n")).ok()?;
                sources.push((device.parse().ok()?, Source::Kernel(kernel)));
            }
            "routine" => {
                let (device, variant) = rest.split_once(' ').unwrap_or((rest, ""));
                let op = VendorOp::from_record(lines.next()?, &vars)?;
                let variant = variant.to_owned();
                sources.push((device.parse().ok()?, Source::Routine { op, variant }));
            }
            _ => break,
        }
        line = lines.next()?;
    }
    let programs = build(&sources, devices, origins)?;
    // The plan, then its fallbacks, each ending where the next begins.
    let mut plans: Vec<Plan> = Vec::new();
    let mut current: Option<Plan> = None;
    for line in std::iter::once(line).chain(lines) {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        let mut words = rest.split(' ').filter(|w| !w.is_empty());
        match kind {
            "plan" | "fallback" => {
                plans.extend(current.take());
                current = Some(Plan {
                    devices: devices.to_vec(),
                    steps: Vec::new(),
                    buffers: Vec::new(),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                    fallback: None,
                    view: None,
                    sequence: tessel_ir::SequenceId::new(),
                });
            }
            "launch" => {
                let program = programs.get(words.next()?.parse::<usize>().ok()?)?.clone();
                let device = words.next()?.parse().ok()?;
                let args = words.map(place_of).collect::<Option<Vec<_>>>()?;
                current.as_mut()?.steps.push(PlanStep::Launch {
                    program,
                    device,
                    args,
                });
            }
            "copy" => {
                let from = place_of(words.next()?)?;
                let to = place_of(words.next()?)?;
                current.as_mut()?.steps.push(PlanStep::Copy { from, to });
            }
            "buffer" => {
                let mut parts = rest.splitn(3, ' ');
                let place = place_of(parts.next()?)?;
                let dtype: DType = parts.next()?.parse().ok()?;
                let numel = size_of(parts.next()?, &vars)?;
                current.as_mut()?.buffers.push((place, dtype, numel));
            }
            "inputs" => {
                current.as_mut()?.inputs = words.map(|w| w.parse().ok()).collect::<Option<_>>()?;
            }
            "outputs" => {
                current.as_mut()?.outputs = words
                    .map(|w| {
                        let (pos, k) = w.split_once(':')?;
                        Some((pos.parse().ok()?, k.parse().ok()?))
                    })
                    .collect::<Option<_>>()?;
            }
            _ => return None,
        }
    }
    plans.extend(current);
    // Steps may only name the plan's devices.
    let valid = |p: &Plan| {
        p.steps.iter().all(|s| match s {
            PlanStep::Launch { device, args, .. } => {
                *device < devices.len() && args.iter().all(|a| a.device < devices.len())
            }
            PlanStep::Copy { from, to } => from.device < devices.len() && to.device < devices.len(),
        })
    };
    if plans.is_empty() || !plans.iter().all(valid) {
        return None;
    }
    let mut plan = None;
    for mut p in plans.into_iter().rev() {
        p.fallback = plan.map(Arc::new);
        plan = Some(p);
    }
    plan
}

/// Builds every program on its device: kernels compiled together (the backends' program
/// caches make that a load in a warm process), routines by their variant.
fn build(
    sources: &[(usize, Source)],
    devices: &[PlanDevice],
    origins: &mut Origins,
) -> Option<Vec<Arc<Program>>> {
    let mut programs: Vec<Option<Arc<Program>>> = vec![None; sources.len()];
    let mut complete = true;
    for (d, (device, backend)) in devices.iter().enumerate() {
        let kernels: Vec<(usize, &Kernel)> = sources
            .iter()
            .enumerate()
            .filter_map(|(i, (on, s))| match s {
                Source::Kernel(k) if *on == d => Some((i, k)),
                _ => None,
            })
            .collect();
        let built = planner::compile_all(&**backend, *device, &kernels);
        for ((i, kernel), built) in kernels.iter().zip(built) {
            match built {
                Ok(id) => {
                    origins.count(backend.origin(id).unwrap_or(ProgramOrigin::Compiled));
                    programs[*i] = Some(program(backend, *device, id));
                }
                Err(e) => {
                    tracing::debug!(target: "tessel::plan", "{device}: a stored kernel {} does not build: {e}", kernel.name);
                    complete = false;
                }
            }
        }
        for (i, (on, s)) in sources.iter().enumerate() {
            let Source::Routine { op, variant } = s else {
                continue;
            };
            if *on != d {
                continue;
            }
            // Every offered program is wrapped, so those not chosen are released.
            for offered in backend.vendor(device.ordinal, op).ok()? {
                let built = program(backend, *device, offered.program);
                if offered.variant == *variant {
                    programs[i] = Some(built);
                }
            }
        }
    }
    if !complete {
        return None;
    }
    programs.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use tessel_shape::Bindings;

    use super::*;
    use crate::runtime::runtime;
    use crate::test_graph::{matmul, node, random_leaf, values};
    use crate::tuning::tuning;

    fn launches(plan: &Plan) -> Vec<(usize, Vec<Place>)> {
        plan.steps
            .iter()
            .filter_map(|s| match s {
                PlanStep::Launch { device, args, .. } => Some((*device, args.clone())),
                PlanStep::Copy { .. } => None,
            })
            .collect()
    }

    /// A measured CPU plan (a library matmul against generated kernels, with a runner-up)
    /// is stored whole, reads back as the same launches, buffers, inputs and outputs, and
    /// computes the same values when it replaces the planned one.
    #[test]
    fn a_plan_stored_whole_reads_back_and_runs() {
        let cpu = crate::Device::cpu();
        let a = random_leaf(21, &[24, 40]);
        let b = random_leaf(22, &[40, 32]);
        let product = matmul(a, b, &[], 24, 40, 32);
        let out = node(
            tessel_graph::Op::Unary(tessel_shape::UnaryOp::Exp2, product),
            &[24, 32],
        );
        let want = values(out, cpu);

        let again = node(
            tessel_graph::Op::Unary(tessel_shape::UnaryOp::Exp2, matmul(a, b, &[], 24, 40, 32)),
            &[24, 32],
        );
        let numerics = Numerics::current();
        let (key, planned) = {
            let st = runtime().lock();
            let key = (
                tessel_graph::signature(&st.graph, &[again]).0,
                cpu,
                numerics,
                tuning(),
            );
            let plan = st.plans.get(&key).expect("the plan just realized").clone();
            (key, plan)
        };
        let devices: Vec<PlanDevice> = planner::placement_devices(cpu)
            .into_iter()
            .map(|d| (d, runtime().backend(d).expect("a backend")))
            .collect();
        let whole = super::key(&key.0, &devices, numerics, key.3).expect("a static graph");
        let mut origins = Origins::default();
        let loaded = load(whole, &devices, &mut origins).expect("the plan was stored whole");
        assert_eq!(launches(&loaded), launches(&planned));
        assert_eq!(loaded.buffers, planned.buffers);
        assert_eq!(loaded.inputs, planned.inputs);
        assert_eq!(loaded.outputs, planned.outputs);
        assert_eq!(loaded.fallback.is_some(), planned.fallback.is_some());
        assert!(origins.compiled + origins.cached + origins.interpreted >= 1);

        runtime().lock().plans.insert(key, Arc::new(loaded));
        runtime()
            .realize(&[again], cpu, &Bindings::default())
            .expect("the loaded plan runs");
        assert_eq!(values(again, cpu), want);
    }
}

#[cfg(test)]
mod dynamic_tests {
    use tessel_graph::{Node, Op};
    use tessel_shape::{Bindings, DType, Shape, UnaryOp, Var};

    use super::*;
    use crate::runtime::runtime;
    use crate::test_graph::random_leaf;
    use crate::tuning::tuning;

    /// A plan over a dynamic dim is stored whole with its variable, and the loaded plan
    /// runs for another value of it.
    #[test]
    fn a_plan_with_dynamic_dims_is_stored_whole_and_runs_for_new_values() {
        let cpu = crate::Device::cpu();
        let rows = Var::new("stored_rows", 1, 64).unwrap();
        let shape = Shape::new(vec![rows.into(), tessel_shape::Dim::constant(5)]);
        let exp2_of = |seed: u64, n: usize| {
            let leaf = random_leaf(seed, &[n, 5]);
            let leaf = runtime().relabel_leaf(leaf, shape.clone()).unwrap();
            runtime().add(Node {
                op: Op::Unary(UnaryOp::Exp2, leaf),
                dtype: DType::F32,
                shape: shape.clone(),
            })
        };
        let read = |node, n: i64| -> Vec<f32> {
            let dims = Bindings::new().with(rows, n);
            runtime().realize(&[node], cpu, &dims).unwrap();
            runtime()
                .read(node, &dims)
                .unwrap()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        let want = read(exp2_of(31, 7), 7);

        let again = exp2_of(31, 7);
        let numerics = Numerics::current();
        let key = {
            let st = runtime().lock();
            (
                tessel_graph::signature(&st.graph, &[again]).0,
                cpu,
                numerics,
                tuning(),
            )
        };
        let devices: Vec<PlanDevice> = planner::placement_devices(cpu)
            .into_iter()
            .map(|d| (d, runtime().backend(d).expect("a backend")))
            .collect();
        let whole = super::key(&key.0, &devices, numerics, key.3).expect("no custom kernel");
        let loaded = load(whole, &devices, &mut Origins::default()).expect("stored whole");
        assert!(
            loaded.buffers.iter().any(|(_, _, n)| n.vars() == [rows]) || loaded.buffers.is_empty()
        );
        runtime().lock().plans.insert(key, Arc::new(loaded));
        assert_eq!(read(again, 7), want);
        // Another value of the dim, on the same loaded plan: 2^x of each input.
        let inputs = random_leaf(32, &[3, 5]);
        let inputs: Vec<f32> = runtime()
            .read(inputs, &Bindings::default())
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let got = read(exp2_of(32, 3), 3);
        assert_eq!(got.len(), 15);
        for (g, x) in got.iter().zip(&inputs) {
            assert!((g - x.exp2()).abs() <= 1e-5 * x.exp2(), "{g} vs 2^{x}");
        }
    }
}
