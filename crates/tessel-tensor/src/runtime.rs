//! The runtime: the one graph, the backends, leaf buffers, and realization.
//!
//! One process-wide [`Runtime`] holds the lazy graph and the map from leaves to their data
//! (host bytes not yet uploaded, or a device buffer) behind one mutex. The lock is held
//! while nodes are added or released and while a realize kernelizes and binds buffers; it
//! is **not** held while kernels compile or run, so other threads keep recording ops.
//!
//! Realizing some tensors: the subgraph behind them gets a structural [`Signature`]; a
//! cached [`Plan`] for that signature (kernels compiled for the device, buffer slots)
//! replays with no kernelization and no compilation. Outputs become leaves, so the graph
//! never grows with history. Plans are evicted first in, first out beyond
//! [`PLAN_CACHE_LIMIT`], releasing their programs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use rustc_hash::FxHashMap;
use tessel_graph::{Graph, LeafId, Node, NodeId, Op, Signature, signature};
use tessel_ir::{Backend, BufferId};
use tessel_shape::{Bindings, DType, Shape};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::planner::{self, Plan, PlanSlot};

/// Plans kept per runtime before the oldest is evicted.
pub const PLAN_CACHE_LIMIT: usize = 512;

pub(crate) enum LeafData {
    /// Bytes waiting for their first use on a device.
    Host(Arc<Vec<u8>>),
    /// A device buffer of `bytes` bytes.
    Device {
        device: Device,
        buffer: BufferId,
        bytes: usize,
    },
}

pub(crate) struct State {
    pub(crate) graph: Graph,
    leaves: FxHashMap<LeafId, LeafData>,
    next_leaf: u64,
    plans: FxHashMap<(Signature, Device), Arc<Plan>>,
    plan_order: VecDeque<(Signature, Device)>,
}

/// What one realize did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RealizeReport {
    /// Kernels launched.
    pub kernels: usize,
    /// Kernels compiled (0 when a cached plan replayed).
    pub compiled: usize,
}

/// Counters over the life of the process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Kernels launched.
    pub kernels_launched: u64,
    /// Kernels compiled.
    pub kernels_compiled: u64,
    /// Live graph nodes.
    pub graph_nodes: usize,
    /// Cached plans.
    pub plans: usize,
    /// Live data buffers: realized tensors and uploaded inputs, on the host or a device.
    pub buffers: usize,
}

pub(crate) struct Runtime {
    state: Mutex<State>,
    backends: Vec<Arc<dyn Backend>>,
    launched: AtomicU64,
    compiled: AtomicU64,
}

static RUNTIME: LazyLock<Runtime> = LazyLock::new(Runtime::new);

/// The process-wide runtime.
pub(crate) fn runtime() -> &'static Runtime {
    &RUNTIME
}

/// Counters of the process-wide runtime.
pub fn stats() -> RuntimeStats {
    let rt = runtime();
    let st = rt.lock();
    RuntimeStats {
        kernels_launched: rt.launched.load(Ordering::Relaxed),
        kernels_compiled: rt.compiled.load(Ordering::Relaxed),
        graph_nodes: st.graph.len(),
        plans: st.plans.len(),
        buffers: st.leaves.len(),
    }
}

impl Runtime {
    fn new() -> Runtime {
        let backends: Vec<Arc<dyn Backend>> = vec![
            #[cfg(feature = "cpu")]
            Arc::new(tessel_cpu::CpuBackend::new()),
            // Reports zero devices (never fails) when no OpenCL driver is installed.
            #[cfg(feature = "opencl")]
            Arc::new(tessel_opencl::OpenClBackend::new()),
            #[cfg(feature = "cuda")]
            Arc::new(tessel_cuda::CudaBackend::new()),
            #[cfg(feature = "wgpu")]
            Arc::new(tessel_wgpu::WgpuBackend::new()),
        ];
        Runtime {
            state: Mutex::new(State {
                graph: Graph::new(),
                leaves: FxHashMap::default(),
                next_leaf: 0,
                plans: FxHashMap::default(),
                plan_order: VecDeque::new(),
            }),
            backends,
            launched: AtomicU64::new(0),
            compiled: AtomicU64::new(0),
        }
    }

    // A panic while the lock is held leaves the graph consistent: every mutation is a
    // single call on `Graph` that completes or does nothing.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The compiled-in backends, in registration order.
    pub(crate) fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    pub(crate) fn backend(&self, device: Device) -> Result<Arc<dyn Backend>> {
        let backend = self
            .backends
            .iter()
            .find(|b| b.name() == device.backend)
            .ok_or_else(|| Error::NoDevice {
                device: device.to_string(),
                reason: format!(
                    "the `{}` backend is not compiled in; enable tessel's `{}` feature",
                    device.backend, device.backend
                ),
            })?;
        if device.ordinal >= backend.devices().len() {
            return Err(Error::NoDevice {
                device: device.to_string(),
                reason: format!(
                    "the {} backend found {} device(s)",
                    device.backend,
                    backend.devices().len()
                ),
            });
        }
        Ok(backend.clone())
    }

    /// Adds a node; the caller owns one count.
    pub(crate) fn add(&self, node: Node) -> NodeId {
        self.lock().graph.add(node)
    }

    /// Adds a leaf holding host bytes; the caller owns one count.
    pub(crate) fn add_host_leaf(&self, bytes: Vec<u8>, dtype: DType, shape: Shape) -> NodeId {
        let mut st = self.lock();
        let leaf = LeafId(st.next_leaf);
        st.next_leaf += 1;
        st.leaves.insert(leaf, LeafData::Host(Arc::new(bytes)));
        st.graph.add(Node {
            op: Op::Leaf(leaf),
            dtype,
            shape,
        })
    }

    /// Adds a count to a live node for a new holder.
    pub(crate) fn retain(&self, node: NodeId) {
        self.lock().graph.retain(node);
    }

    pub(crate) fn release(&self, node: NodeId) {
        let mut st = self.lock();
        let freed = st.graph.release(node);
        self.free_leaves(&mut st, freed);
    }

    fn free_leaves(&self, st: &mut State, leaves: Vec<LeafId>) {
        for leaf in leaves {
            if let Some(LeafData::Device { device, buffer, .. }) = st.leaves.remove(&leaf)
                && let Ok(backend) = self.backend(device)
                && let Err(e) = backend.free(buffer)
            {
                tracing::warn!("freeing a buffer on {device}: {e}");
            }
        }
    }

    /// A new leaf holding `node`'s data (realized) with `shape`, which names the same
    /// number of elements under the caller's dynamic-dim values: host data is shared,
    /// device data copied. The caller owns one count of the new node.
    pub(crate) fn relabel_leaf(&self, node: NodeId, shape: Shape) -> Result<NodeId> {
        let mut st = self.lock();
        let n = st.graph.node(node).clone();
        let Op::Leaf(old) = n.op else {
            return Err(Error::Internal("relabelling an unrealized tensor".into()));
        };
        let data = match st.leaves.get(&old) {
            Some(LeafData::Host(bytes)) => LeafData::Host(bytes.clone()),
            Some(&LeafData::Device {
                device,
                buffer,
                bytes,
            }) => {
                let backend = self.backend(device)?;
                let copy = backend.alloc(device.ordinal, bytes.max(1))?;
                if bytes > 0
                    && let Err(e) = backend.copy(buffer, copy, bytes)
                {
                    let _ = backend.free(copy);
                    return Err(e.into());
                }
                LeafData::Device {
                    device,
                    buffer: copy,
                    bytes,
                }
            }
            None => return Err(Error::Internal(format!("leaf {old:?} has no data"))),
        };
        let leaf = LeafId(st.next_leaf);
        st.next_leaf += 1;
        st.leaves.insert(leaf, data);
        Ok(st.graph.add(Node {
            op: Op::Leaf(leaf),
            dtype: n.dtype,
            shape,
        }))
    }

    /// Fails if some leaf under `targets` holds a different number of bytes than its
    /// shape names under `dims`: tensors with disagreeing dynamic-dim values were combined
    /// by an op that could not check them.
    fn check_leaf_sizes(st: &State, targets: &[NodeId], dims: &Bindings) -> Result<()> {
        for n in st.graph.toposort(targets) {
            let node = st.graph.node(n);
            let Op::Leaf(leaf) = node.op else {
                continue;
            };
            if node.shape.as_usizes().is_some() {
                continue;
            }
            let held = match st.leaves.get(&leaf) {
                Some(LeafData::Host(bytes)) => bytes.len(),
                Some(LeafData::Device { bytes, .. }) => *bytes,
                None => continue,
            };
            let numel = node
                .shape
                .numel()
                .eval(dims)
                .map_err(|e| Error::InvalidArgument {
                    op: "realize",
                    reason: format!("an input of shape {}: {e}", node.shape),
                })?;
            if numel.max(0) as usize * node.dtype.size_bytes() != held {
                return Err(Error::InvalidArgument {
                    op: "realize",
                    reason: format!(
                        "an input of shape {} holds {} elements, but the dynamic dims of the \
                         result give it {numel}; tensors with different values of one dynamic \
                         dim were combined",
                        node.shape,
                        held / node.dtype.size_bytes().max(1)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Computes `nodes` on `device`, turning each into a leaf; `dims` holds the values of
    /// the dynamic dims their shapes and inputs name.
    pub(crate) fn realize(
        &self,
        nodes: &[NodeId],
        device: Device,
        dims: &Bindings,
    ) -> Result<RealizeReport> {
        let backend = self.backend(device)?;
        let mut st = self.lock();
        let targets: Vec<NodeId> = nodes
            .iter()
            .copied()
            .filter(|&n| !matches!(st.graph.node(n).op, Op::Leaf(_)))
            .collect();
        if targets.is_empty() {
            return Ok(RealizeReport::default());
        }
        if !dims.is_empty() {
            Self::check_leaf_sizes(&st, &targets, dims)?;
        }
        let (sig, leaves) = signature(&st.graph, &targets);
        let key = (sig, device);
        let mut report = RealizeReport::default();
        let plan = if let Some(plan) = st.plans.get(&key) {
            plan.clone()
        } else {
            let parts = planner::partition(&st.graph, &targets, &leaves, device)?;
            drop(st);
            // Compile without the lock: other threads keep recording.
            let compiled = planner::compile(parts, &backend, device)?;
            report.compiled += compiled.built;
            self.compiled
                .fetch_add(compiled.built as u64, Ordering::Relaxed);
            let plan = if compiled.needs_choice() {
                // Candidates are measured on this realize's own inputs.
                let mut st = self.lock();
                let mut inputs = Vec::with_capacity(leaves.len());
                for leaf in &leaves {
                    inputs.push(self.device_buffer(&mut st, *leaf, device, &backend)?);
                }
                drop(st);
                planner::choose(&compiled, &inputs, dims)?
            } else {
                compiled.default_plan()
            };
            let plan = Arc::new(plan);
            st = self.lock();
            // Another thread may have realized part of this subgraph meanwhile; the plan is
            // still right for the structure it was built for, but not for the graph now.
            let (sig_now, _) = signature(&st.graph, &targets);
            if sig_now != key.0 {
                drop(st);
                return self.realize(nodes, device, dims);
            }
            if st.plans.len() >= PLAN_CACHE_LIMIT
                && let Some(old) = st.plan_order.pop_front()
            {
                st.plans.remove(&old);
            }
            st.plan_order.push_back(key.clone());
            st.plans.insert(key.clone(), plan.clone());
            plan
        };

        // Bind inputs, uploading host leaves on first use.
        let mut bound = Vec::with_capacity(leaves.len());
        for leaf in &leaves {
            bound.push(self.device_buffer(&mut st, *leaf, device, &backend)?);
        }
        drop(st);
        let inputs: Vec<BufferId> = plan.inputs.iter().map(|&i| bound[i]).collect();

        // Buffers by position, with their sizes in bytes.
        let mut temps: FxHashMap<usize, (BufferId, usize)> = FxHashMap::default();
        let mut plan = plan;
        let mut result = self.run_plan(&plan, &inputs, dims, &mut temps);
        if let Err(e) = &result
            && let Some(fallback) = plan.fallback.clone()
        {
            tracing::warn!(target: "tessel::plan", "{device}: the chosen plan failed ({e}); running the runner-up");
            for (_, (b, _)) in temps.drain() {
                let _ = backend.free(b);
            }
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
        report.kernels = plan.kernels.len();

        let mut st = self.lock();
        if let Err(e) = result {
            for (_, (b, _)) in temps {
                let _ = backend.free(b);
            }
            return Err(e);
        }
        for (&p, &(buffer, bytes)) in &temps {
            if let Some(&(_, k)) = plan.outputs.iter().find(|(q, _)| *q == p) {
                let node = targets[k];
                let leaf = LeafId(st.next_leaf);
                st.next_leaf += 1;
                st.leaves.insert(
                    leaf,
                    LeafData::Device {
                        device,
                        buffer,
                        bytes,
                    },
                );
                let freed = st.graph.make_leaf(node, leaf);
                self.free_leaves(&mut st, freed);
            } else if let Err(e) = backend.free(buffer) {
                tracing::warn!("freeing a temporary on {device}: {e}");
            }
        }
        Ok(report)
    }

    fn run_plan(
        &self,
        plan: &Plan,
        inputs: &[BufferId],
        dims: &Bindings,
        temps: &mut FxHashMap<usize, (BufferId, usize)>,
    ) -> Result<()> {
        let backend = &plan.backend;
        for &(p, dtype, numel) in &plan.buffers {
            let numel = numel
                .eval(dims)
                .map_err(|e| Error::Internal(e.to_string()))?;
            let bytes = numel.max(0) as usize * dtype.size_bytes();
            temps.insert(
                p,
                (backend.alloc(plan.device.ordinal, bytes.max(1))?, bytes),
            );
        }
        for k in &plan.kernels {
            let args: Vec<BufferId> = k
                .args
                .iter()
                .map(|a| match *a {
                    PlanSlot::Input(i) => inputs[i],
                    PlanSlot::Node(p) => temps[&p].0,
                })
                .collect();
            backend.launch(k.program.id, &args, dims)?;
            self.launched.fetch_add(1, Ordering::Relaxed);
        }
        backend.synchronize(plan.device.ordinal)?;
        Ok(())
    }

    /// The device buffer of a leaf, uploading host bytes (or copying through the host from
    /// another device) on first use.
    fn device_buffer(
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
            Some(LeafData::Device { device: d, .. }) => {
                // Only reachable with two backends compiled in; the transfer path arrives
                // with the second backend, and until then this is an error, not a copy.
                return Err(Error::NoDevice {
                    device: device.to_string(),
                    reason: format!("moving data from {d} to {device} is not supported yet"),
                });
            }
            Some(LeafData::Host(bytes)) => bytes.clone(),
            None => return Err(Error::Internal(format!("leaf {leaf:?} has no data"))),
        };
        let buffer = backend.alloc(device.ordinal, bytes.len().max(1))?;
        if !bytes.is_empty() {
            backend.write(buffer, 0, &bytes)?;
        }
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
    pub(crate) fn read(&self, node: NodeId, dims: &Bindings) -> Result<Vec<u8>> {
        let st = self.lock();
        let n = st.graph.node(node);
        let Op::Leaf(leaf) = n.op else {
            return Err(Error::Internal("read of an unrealized tensor".into()));
        };
        let numel = n
            .shape
            .numel()
            .eval(dims)
            .map_err(|e| Error::Internal(e.to_string()))?;
        let len = numel as usize * n.dtype.size_bytes();
        match st.leaves.get(&leaf) {
            Some(LeafData::Host(bytes)) => bytes.get(..len).map(<[u8]>::to_vec).ok_or_else(|| {
                Error::Internal(format!("leaf {leaf:?} holds fewer than {len} bytes"))
            }),
            Some(LeafData::Device { device, buffer, .. }) => {
                let (device, buffer) = (*device, *buffer);
                let backend = self.backend(device)?;
                // The buffer stays alive: the caller holds the node.
                drop(st);
                let mut out = vec![0u8; len];
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
    use crate::planner::{PlanKernel, Program};
    use crate::{DType, Tensor};

    /// A measured plan keeps its runner-up. When running the chosen plan fails (here: its
    /// first program is one the backend never built), the runner-up runs on the same
    /// inputs, gives the right values, and replaces the failed plan in the cache.
    #[test]
    fn a_plan_that_fails_at_execution_falls_back_to_its_runner_up() {
        // On the CPU, whose library matmul makes the plan a measured one, whatever device
        // `TESSEL_DEVICE` names.
        Tensor::manual_seed(9);
        let cpu = crate::Device::cpu();
        let a = Tensor::randn([48, 40], DType::F32)
            .unwrap()
            .to(&cpu)
            .unwrap();
        let b = Tensor::randn([40, 56], DType::F32)
            .unwrap()
            .to(&cpu)
            .unwrap();
        Tensor::realize_all(&[&a, &b]).unwrap();
        let want = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();

        let c = a.matmul(&b).unwrap();
        let device = c.device();
        let key = {
            let st = runtime().lock();
            (signature(&st.graph, &[c.node()]).0, device)
        };
        let (plan, runner_up) = {
            let mut st = runtime().lock();
            let plan = st.plans[&key].clone();
            let runner_up = plan
                .fallback
                .clone()
                .expect("a measured matmul plan keeps its runner-up");
            let mut kernels: Vec<PlanKernel> = plan
                .kernels
                .iter()
                .map(|k| PlanKernel {
                    program: k.program.clone(),
                    args: k.args.clone(),
                })
                .collect();
            kernels[0].program = Arc::new(Program::unbuilt(plan.backend.clone(), device));
            let broken = Plan {
                device,
                backend: plan.backend.clone(),
                kernels,
                buffers: plan.buffers.clone(),
                inputs: plan.inputs.clone(),
                outputs: plan.outputs.clone(),
                fallback: Some(runner_up.clone()),
            };
            st.plans.insert(key.clone(), Arc::new(broken));
            (plan, runner_up)
        };
        // The runner-up may be the other path (generated kernel or library routine), so
        // equal up to rounding.
        let got = c.to_vec::<f32>().unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "the runner-up's product is off by {worst}");
        let st = runtime().lock();
        assert!(
            Arc::ptr_eq(&st.plans[&key], &runner_up),
            "the runner-up replaces the failed plan"
        );
        drop((st, plan));
    }
}
