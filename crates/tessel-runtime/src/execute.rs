//! Running plans: [`Runtime::realize`] (the plan looked up or made, inputs bound,
//! temporaries allocated, launches, outputs kept as leaves), [`Runtime::run_plan`] with its
//! runner-up on failure, the device buffers of leaves (uploaded on first use), and
//! [`Runtime::read`] back to the host.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rustc_hash::FxHashMap;
use tessel_graph::{LeafId, NodeId, Op};
use tessel_ir::{Backend, BufferId};
use tessel_shape::{Bindings, DType};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::host::HostBytes;
use crate::planner::{Place, Plan, PlanSlot, PlanStep};
use crate::runtime::{LeafData, RealizeReport, Runtime, State};
#[cfg(test)]
use crate::{runtime::runtime, tuning::tuning};

impl Runtime {
    /// Computes `nodes` on `device`, turning each into a leaf; `dims` holds the values of
    /// the dynamic dims their shapes and inputs name.
    pub fn realize(
        &self,
        nodes: &[NodeId],
        device: Device,
        dims: &Bindings,
    ) -> Result<RealizeReport> {
        let backend = self.backend(device)?;
        let targets = self.to_compute(nodes);
        if targets.is_empty() {
            return Ok(RealizeReport::default());
        }
        let mut report = RealizeReport::default();
        let started = std::time::Instant::now();
        let (mut st, plan, leaves, key) =
            self.plan_for(&targets, device, dims, &mut report, true)?;
        let planned = started.elapsed();

        // Bind inputs, uploading host leaves on first use.
        let mut bound = Vec::with_capacity(leaves.len());
        for leaf in &leaves {
            bound.push(self.device_buffer(&mut st, *leaf, device, &backend)?);
        }
        drop(st);
        let inputs: Vec<BufferId> = plan.inputs.iter().map(|&i| bound[i]).collect();

        // Buffers by value and device, with their sizes in bytes.
        let mut temps: FxHashMap<Place, (BufferId, usize)> = FxHashMap::default();
        let mut plan = plan;
        let bound_at = started.elapsed();
        let mut result = self.run_plan(&plan, &inputs, dims, &mut temps);
        let ran = started.elapsed();
        // A dynamic dim with no value fails some launch; say which and how to fix it (the
        // walk costs nothing on the path that succeeds).
        if result.is_err()
            && let Some(unbound) = self.unbound_dim(&targets, dims)
        {
            free_temps(&plan, temps.drain());
            return Err(unbound);
        }
        if let Err(e) = &result
            && let Some(fallback) = plan.fallback.clone()
        {
            tracing::warn!(target: "tessel::plan", "{device}: the chosen plan failed ({e}); running the runner-up");
            free_temps(&plan, temps.drain());
            let inputs: Vec<BufferId> = fallback.inputs.iter().map(|&i| bound[i]).collect();
            result = self.run_plan(&fallback, &inputs, dims, &mut temps);
            if result.is_ok() {
                let mut st = self.lock();
                if st.plans.get(&key).is_some_and(|p| Arc::ptr_eq(p, &plan)) {
                    st.plans.insert(key, fallback.clone());
                }
            }
            plan = fallback;
        }
        report.kernels = plan.launches();
        report.copies = plan.steps.len() - report.kernels;

        let mut st = self.lock();
        if let Err(e) = result {
            free_temps(&plan, temps.into_iter());
            return Err(e);
        }
        let mut rest = Vec::new();
        // Each output's target, by value (a training step keeps hundreds among its temps).
        let outputs: FxHashMap<usize, usize> = plan.outputs.iter().copied().collect();
        for (place, (buffer, bytes)) in temps {
            let output = match place {
                Place {
                    slot: PlanSlot::Node(p),
                    device: 0,
                } => outputs.get(&p),
                _ => None,
            };
            if let Some(&k) = output {
                let node = targets[k];
                let leaf = st.new_leaf(LeafData::Device {
                    device,
                    buffer,
                    bytes,
                });
                // A loss keeps what it was computed from, for `grad` (see `history`).
                let n = st.graph.node(node);
                let kept = (n.dtype.is_float()
                    && n.shape.numel().as_const() == Some(1)
                    && !matches!(n.op, Op::Leaf(_)))
                .then(|| n.clone());
                if let Some(n) = &kept {
                    for c in n.op.operands() {
                        st.graph.retain(c);
                    }
                }
                let freed = st.graph.make_leaf(node, leaf);
                if let Some(n) = kept {
                    st.history.insert(leaf, n);
                }
                self.free_leaves(&mut st, freed);
            } else {
                rest.push((place, (buffer, bytes)));
            }
        }
        drop(st);
        free_temps(&plan, rest.into_iter());
        // Where a replay's host time goes (DESIGN.md: 10 µs plus 2 µs per kernel).
        tracing::debug!(
            target: "tessel::replay",
            "{device}: {} targets, {} inputs, {} launches: plan lookup {:.0} µs (includes planning on a miss), inputs bound {:.0} µs, launched {:.0} µs, outputs kept {:.0} µs",
            targets.len(),
            leaves.len(),
            report.kernels,
            planned.as_secs_f64() * 1e6,
            bound_at.saturating_sub(planned).as_secs_f64() * 1e6,
            ran.saturating_sub(bound_at).as_secs_f64() * 1e6,
            started.elapsed().saturating_sub(ran).as_secs_f64() * 1e6
        );
        Ok(report)
    }

    pub(crate) fn run_plan(
        &self,
        plan: &Plan,
        inputs: &[BufferId],
        dims: &Bindings,
        temps: &mut FxHashMap<Place, (BufferId, usize)>,
    ) -> Result<()> {
        let bytes_of = |dtype: DType, numel: tessel_shape::Dim| -> Result<usize> {
            let n = numel.eval(dims).map_err(Error::from_eval)?;
            usize::try_from(n.max(0))
                .ok()
                .and_then(|n| n.checked_mul(dtype.size_bytes()))
                .ok_or_else(|| {
                    Error::Backend(tessel_ir::BackendError::OutOfMemory {
                        device: plan.devices[0].0.to_string(),
                        requested: usize::MAX,
                    })
                })
        };
        for &(place, dtype, numel) in &plan.buffers {
            let (device, backend) = &plan.devices[place.device];
            let bytes = bytes_of(dtype, numel)?;
            temps.insert(place, (backend.alloc(device.ordinal, bytes.max(1))?, bytes));
        }
        let buffer = |p: &Place| match p.slot {
            PlanSlot::Input(i) if p.device == 0 => inputs[i],
            _ => temps[p].0,
        };
        if let [(_, backend)] = &plan.devices[..] {
            // One device and launches only (no copy between devices): one sequence, which
            // a backend may replay in one submission.
            let mut args = Vec::new();
            let mut ranges = Vec::with_capacity(plan.steps.len());
            for step in &plan.steps {
                let PlanStep::Launch {
                    program, args: a, ..
                } = step
                else {
                    return Err(Error::Internal(
                        "a copy between devices in a one-device plan".into(),
                    ));
                };
                let start = args.len();
                args.extend(a.iter().map(buffer));
                ranges.push((program.id()?, start..args.len()));
            }
            let launches: Vec<tessel_ir::SequenceLaunch<'_>> = ranges
                .iter()
                .map(|(program, range)| (*program, &args[range.clone()]))
                .collect();
            backend.launch_sequence(plan.sequence, &launches, dims)?;
            self.launched
                .fetch_add(launches.len() as u64, Ordering::Relaxed);
            // Queued, not waited for (as a `Compiled` call): every backend runs a device's
            // work in submission order, reads wait for it, and freed buffers are reused only
            // by later submissions, so the temporaries can go back to the pools now.
            return Ok(());
        }
        for step in &plan.steps {
            match step {
                PlanStep::Launch {
                    program,
                    device,
                    args,
                } => {
                    let args: Vec<BufferId> = args.iter().map(buffer).collect();
                    plan.devices[*device].1.launch(program.id()?, &args, dims)?;
                    self.launched.fetch_add(1, Ordering::Relaxed);
                }
                PlanStep::Copy { from, to } => {
                    let (src_device, src) = &plan.devices[from.device];
                    let dst = &plan.devices[to.device].1;
                    let bytes = match from.slot {
                        PlanSlot::Input(_) => temps[to].1,
                        PlanSlot::Node(_) => temps[from].1,
                    };
                    if bytes > 0 {
                        // Through the host: the two devices' backends share no memory.
                        src.synchronize(src_device.ordinal)?;
                        let mut host = vec![0u8; bytes];
                        src.read(buffer(from), 0, &mut host)?;
                        dst.write(buffer(to), 0, &host)?;
                    }
                }
            }
        }
        for (device, backend) in &plan.devices {
            backend.synchronize(device.ordinal)?;
        }
        Ok(())
    }

    /// The device buffer of a leaf, uploading host bytes (or copying through the host from
    /// another device) on first use.
    pub(crate) fn device_buffer(
        &self,
        st: &mut State,
        leaf: LeafId,
        device: Device,
        backend: &Arc<dyn Backend>,
    ) -> Result<BufferId> {
        let bytes = match st.leaves.get(&leaf) {
            Some(LeafData::Device {
                device: d, buffer, ..
            }) if *d == device => return Ok(*buffer),
            // A value realized on another device (one node can be recorded for several
            // devices, since the graph merges equal nodes): staged through the host.
            Some(LeafData::Device {
                device: d,
                buffer,
                bytes,
            }) => {
                let mut staged = host_bytes(*bytes)?;
                if *bytes > 0 {
                    self.backend(*d)?.read(*buffer, 0, &mut staged)?;
                }
                HostBytes::from(staged)
            }
            Some(LeafData::Host(bytes)) => bytes.clone(),
            None => return Err(Error::Internal(format!("leaf {leaf:?} has no data"))),
        };
        let buffer = backend.upload(device.ordinal, &bytes)?;
        let held = LeafData::Device {
            device,
            buffer,
            bytes: bytes.len(),
        };
        if let Some(LeafData::Device {
            device: d,
            buffer: old,
            ..
        }) = st.leaves.insert(leaf, held)
            && let Ok(b) = self.backend(d)
        {
            let _ = b.free(old);
        }
        Ok(buffer)
    }

    /// The bytes of a realized node whose dynamic dims have the values `dims`.
    pub fn read(&self, node: NodeId, dims: &Bindings) -> Result<Vec<u8>> {
        let st = self.lock();
        let n = st.graph.node(node);
        let Op::Leaf(leaf) = n.op else {
            return Err(Error::Internal("read of an unrealized tensor".into()));
        };
        // Per dim, checked: the shape's own element count wraps past i64::MAX (a
        // [2^40, 2^40] tensor would read as empty).
        let numel = n
            .shape
            .iter()
            .try_fold(Some(1i64), |acc, d| {
                let d = d.eval(dims).map_err(Error::from_eval)?;
                Ok::<_, Error>(acc.and_then(|a| a.checked_mul(d)))
            })?
            .ok_or_else(|| Error::InvalidArgument {
                op: "read",
                reason: format!(
                    "shape {} holds more than i64::MAX elements; no tensor that large exists",
                    n.shape
                ),
            })?;
        let len = usize::try_from(numel)
            .ok()
            .and_then(|e| e.checked_mul(n.dtype.size_bytes()))
            .ok_or_else(|| Error::InvalidArgument {
                op: "read",
                reason: format!(
                    "{numel} elements of {} do not fit the host's address space; read a slice",
                    n.dtype
                ),
            })?;
        match st.leaves.get(&leaf) {
            Some(LeafData::Host(bytes)) => bytes.get(..len).map(<[u8]>::to_vec).ok_or_else(|| {
                Error::Internal(format!("leaf {leaf:?} holds fewer than {len} bytes"))
            }),
            Some(LeafData::Device { device, buffer, .. }) => {
                let (device, buffer) = (*device, *buffer);
                let backend = self.backend(device)?;
                // The buffer stays alive: the caller holds the node.
                drop(st);
                let mut out = host_bytes(len)?;
                if len > 0 {
                    backend.read(buffer, 0, &mut out)?;
                }
                Ok(out)
            }
            None => Err(Error::Internal(format!("leaf {leaf:?} has no data"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::determinism::Numerics;
    use crate::program::Program;
    use crate::test_graph::{matmul, random_leaf, values};

    /// A measured plan keeps its runner-up. When running the chosen plan fails (here: its
    /// first program is one the backend never built), the runner-up runs on the same
    /// inputs, gives the right values, and replaces the failed plan in the cache.
    #[test]
    fn a_plan_that_fails_at_execution_falls_back_to_its_runner_up() {
        // On the CPU, whose library matmul makes the plan a measured one, whatever device
        // `TESSEL_DEVICE` names.
        let cpu = crate::Device::cpu();
        let a = random_leaf(9, &[48, 40]);
        let b = random_leaf(10, &[40, 56]);
        let want = values(matmul(a, b, &[], 48, 40, 56), cpu);

        let c = matmul(a, b, &[], 48, 40, 56);
        let device = cpu;
        let key = {
            let st = runtime().lock();
            (
                tessel_graph::signature(&st.graph, &[c]).0,
                device,
                Numerics::default(),
                tuning(),
            )
        };
        let (plan, runner_up) = {
            let mut st = runtime().lock();
            let plan = st.plans.get(&key).expect("the plan just realized").clone();
            let runner_up = plan
                .fallback
                .clone()
                .expect("a measured matmul plan keeps its runner-up");
            let mut broken_first = true;
            let steps: Vec<PlanStep> = plan
                .steps
                .iter()
                .map(|step| match step {
                    PlanStep::Launch {
                        program,
                        device: d,
                        args,
                    } => {
                        let program = if std::mem::take(&mut broken_first) {
                            Arc::new(Program::unbuilt(plan.devices[*d].1.clone(), device))
                        } else {
                            program.clone()
                        };
                        PlanStep::Launch {
                            program,
                            device: *d,
                            args: args.clone(),
                        }
                    }
                    PlanStep::Copy { from, to } => PlanStep::Copy {
                        from: *from,
                        to: *to,
                    },
                })
                .collect();
            let broken = Plan {
                devices: plan.devices.clone(),
                steps,
                buffers: plan.buffers.clone(),
                inputs: plan.inputs.clone(),
                outputs: plan.outputs.clone(),
                fallback: Some(runner_up.clone()),
                view: None,
                sequence: tessel_ir::SequenceId::new(),
            };
            st.plans.insert(key.clone(), Arc::new(broken));
            (plan, runner_up)
        };
        // The runner-up may be the other path (generated kernel or library routine), so
        // equal up to rounding.
        let got = values(c, cpu);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "the runner-up's product is off by {worst}");
        let st = runtime().lock();
        assert!(
            Arc::ptr_eq(st.plans.get(&key).expect("a plan"), &runner_up),
            "the runner-up replaces the failed plan"
        );
        drop((st, plan));
    }
}

/// `len` zero bytes of host memory, or `OutOfMemory` naming the size where the host cannot
/// give them (a result read back to the host is sized by the user's shapes).
pub fn host_bytes(len: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| out_of_host_memory(len))?;
    out.resize(len, 0);
    Ok(out)
}

/// The error for `bytes` of host memory the process could not get.
pub fn out_of_host_memory(bytes: usize) -> Error {
    Error::Backend(tessel_ir::BackendError::OutOfMemory {
        device: "host".into(),
        requested: bytes,
    })
}

/// Frees a plan's temporaries, each through its device's backend.
pub(crate) fn free_temps(plan: &Plan, temps: impl Iterator<Item = (Place, (BufferId, usize))>) {
    for (place, (buffer, _)) in temps {
        let (device, backend) = &plan.devices[place.device];
        if let Err(e) = backend.free(buffer) {
            tracing::warn!("freeing a temporary on {device}: {e}");
        }
    }
}

#[cfg(test)]
mod placement_tests {
    use super::*;
    use crate::Tuning;
    use crate::determinism::Numerics;
    use crate::planner::{self, PlanDevice};
    use crate::test_graph::{constant, matmul, node, random_leaf, values};
    use tessel_graph::placement::Step;

    /// A plan that runs every kernel on a second device (another backend when one is
    /// compiled in and present, else the CPU again as a stand-in) with copies in and out:
    /// the inputs move there, the result comes back, and the values match the home
    /// device's.
    #[test]
    fn a_placed_plan_copies_inputs_out_and_results_back() {
        let home = crate::Device::cpu();
        let other = crate::Device::all()
            .into_iter()
            .find(|d| *d != home && d.supports(DType::F32))
            .unwrap_or(home);
        let a = random_leaf(21, &[33, 20]);
        let b = random_leaf(22, &[20, 7]);
        let expr = || {
            let product = matmul(a, b, &[], 33, 20, 7);
            node(
                Op::Binary(
                    tessel_shape::BinaryOp::Mul,
                    product,
                    constant(2.0, &[33, 7]),
                ),
                &[33, 7],
            )
        };
        let want = values(expr(), home);

        let c = expr();
        let rt = runtime();
        let st = rt.lock();
        let targets = [c];
        let (sig, leaves) = tessel_graph::signature(&st.graph, &targets);
        let parts = planner::partition(
            &st.graph,
            &targets,
            &leaves,
            &[home, other],
            Numerics::default(),
            Tuning::Default,
        )
        .unwrap();
        drop(st);
        let devices: Vec<PlanDevice> = [home, other]
            .iter()
            .map(|&d| (d, rt.backend(d).unwrap()))
            .collect();
        let compiled = planner::compile(parts, devices, None).unwrap();
        let mut steps: Vec<Step> = (0..compiled.inputs.len())
            .map(|i| Step::Copy {
                class: compiled.class(PlanSlot::Input(i)),
                from: 0,
                to: 1,
            })
            .collect();
        steps.extend(
            compiled
                .programs
                .iter()
                .enumerate()
                .filter(|(_, p)| p.device == 1 && compiled.candidates[p.candidate].default)
                .map(|(k, _)| Step::Run(k)),
        );
        steps.extend(compiled.targets.iter().map(|&t| Step::Copy {
            class: compiled.class(PlanSlot::Node(t)),
            from: 1,
            to: 0,
        }));
        let plan = compiled.plan(&steps);
        assert!(
            plan.steps
                .iter()
                .any(|s| matches!(s, PlanStep::Launch { device: 1, .. }))
        );
        rt.lock()
            .plans
            .insert((sig, home, Numerics::default(), tuning()), Arc::new(plan));

        let report = rt.realize(&[c], home, &Bindings::default()).unwrap();
        assert_eq!(report.copies, leaves.len() + 1, "{report:?}");
        let got = values(c, home);
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{g} vs {w} on {other}"
            );
        }
    }
}
