//! The runtime: the one graph, the backends, leaf buffers, and realization.
//!
//! One process-wide [`Runtime`] holds the lazy graph and the map from leaves to their data
//! (host bytes not yet uploaded, or a device buffer) behind one mutex. The lock is held
//! while nodes are added or released and while a realize kernelizes and binds buffers; it
//! is **not** held while kernels compile or run, so other threads keep recording ops.
//!
//! Realizing some tensors: the subgraph behind them gets a structural [`Signature`](tessel_graph::Signature); a
//! cached [`Plan`] for that signature (kernels compiled for the device, buffer slots)
//! replays with no kernelization and no compilation. Outputs become leaves, so the graph
//! never grows with history. Plans are evicted first in, first out beyond
//! [`PLAN_CACHE_LIMIT`], releasing their programs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use rustc_hash::FxHashMap;
use tessel_graph::{Graph, LeafId, Node, NodeId, Op, Walk};
use tessel_ir::{Backend, BufferId};
use tessel_shape::{Bindings, DType, Shape};

use crate::determinism::Numerics;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::host::HostBytes;
use crate::measure;
use crate::plan_cache::{self, StoredPlan};
use crate::planner::{self, Plan};
use crate::plans::{PlanKey, Plans};
use crate::stored_plans;
use crate::tuning::tuning;

/// Plans kept per runtime before the oldest is evicted.
pub const PLAN_CACHE_LIMIT: usize = 512;

pub(crate) enum LeafData {
    /// Bytes waiting for their first use on a device.
    Host(HostBytes),
    /// A device buffer of `bytes` bytes.
    Device {
        device: Device,
        buffer: BufferId,
        bytes: usize,
    },
}

/// The runtime's state behind its one lock: the graph and what its leaves hold.
pub struct State {
    /// The process-wide lazy graph every tensor records into.
    pub graph: Graph,
    pub(crate) leaves: FxHashMap<LeafId, LeafData>,
    next_leaf: u64,
    pub(crate) plans: Plans,
    /// The recorded structure of realized one-element float tensors (losses), keeping their
    /// operands alive, so that a loss read before its gradient is taken is still
    /// differentiable (`tessel_tensor::grad` starts from it). Dropped with the leaf.
    pub(crate) history: FxHashMap<LeafId, Node>,
}

impl State {
    /// A new leaf holding `data`.
    pub(crate) fn new_leaf(&mut self, data: LeafData) -> LeafId {
        let leaf = LeafId(self.next_leaf);
        self.next_leaf += 1;
        self.leaves.insert(leaf, data);
        leaf
    }
}

/// [`Runtime::plan_for`]'s plan, with the lock it was checked under, the leaves it reads
/// and its key.
pub(crate) type Planned<'a> = (MutexGuard<'a, State>, Arc<Plan>, Vec<LeafId>, PlanKey);

/// What one realize did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RealizeReport {
    /// Kernels launched.
    pub kernels: usize,
    /// Kernels the device's compiler built (0 when a cached plan replayed).
    pub compiled: usize,
    /// Kernels of a new plan whose programs a backend's cache of built programs had (on
    /// disk or in memory), so nothing was compiled for them.
    pub cached: usize,
    /// Kernels of a new plan left to the reference interpreter (the CPU backend without a
    /// C compiler): neither compiled nor cached.
    pub interpreted: usize,
    /// Values copied between devices by a plan that places work on several devices (see
    /// [`set_placement`](crate::set_placement)).
    pub copies: usize,
    /// Kernels whose launch shapes a new plan searched (see [`set_tuning`](crate::set_tuning)):
    /// the tuning cache had no winner for them, so their other shapes were candidates,
    /// compiled and measured where measurement found it worth it, and the fastest was
    /// stored. A kernel left outside the plan, whose shapes were never measured, stores
    /// nothing and does not count. 0 when the tuning cache knew every winner. Shapes
    /// compiled count in `compiled`.
    pub tuned: usize,
}

impl RealizeReport {
    /// Kernels a new plan got programs for, compiled, cached or interpreted: 0 when a
    /// cached plan replayed.
    pub fn kernels_prepared(&self) -> usize {
        self.compiled + self.cached + self.interpreted
    }
}

/// Counters over the life of the process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Kernels launched.
    pub kernels_launched: u64,
    /// Kernels the device's compiler built.
    pub kernels_compiled: u64,
    /// Kernels whose programs came from a backend's cache of built programs (on disk or
    /// in memory).
    pub kernels_cached: u64,
    /// Kernels left to the reference interpreter (the CPU backend without a C compiler).
    pub kernels_interpreted: u64,
    /// Kernels whose launch shapes were searched and the winner stored (see
    /// [`RealizeReport::tuned`]).
    pub kernels_tuned: u64,
    /// Live graph nodes.
    pub graph_nodes: usize,
    /// Cached plans.
    pub plans: usize,
    /// Live data buffers: realized tensors and uploaded inputs, on the host or a device.
    pub buffers: usize,
}

/// The process-wide runtime (see [`runtime()`]): the graph and its leaves behind one lock,
/// the compiled-in backends, the plan cache and the counters of [`stats`].
pub struct Runtime {
    state: Mutex<State>,
    backends: Vec<Arc<dyn Backend>>,
    pub(crate) launched: AtomicU64,
    compiled: AtomicU64,
    cached: AtomicU64,
    interpreted: AtomicU64,
    tuned: AtomicU64,
}

static RUNTIME: LazyLock<Runtime> = LazyLock::new(Runtime::new);

impl RuntimeStats {
    /// Kernels new plans got programs for, compiled, cached or interpreted.
    pub fn kernels_prepared(&self) -> u64 {
        self.kernels_compiled + self.kernels_cached + self.kernels_interpreted
    }
}

/// The process-wide runtime.
pub fn runtime() -> &'static Runtime {
    &RUNTIME
}

/// Counters of the process-wide runtime.
pub fn stats() -> RuntimeStats {
    let rt = runtime();
    let st = rt.lock();
    RuntimeStats {
        kernels_launched: rt.launched.load(Ordering::Relaxed),
        kernels_compiled: rt.compiled.load(Ordering::Relaxed),
        kernels_cached: rt.cached.load(Ordering::Relaxed),
        kernels_interpreted: rt.interpreted.load(Ordering::Relaxed),
        kernels_tuned: rt.tuned.load(Ordering::Relaxed),
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
                plans: Plans::default(),
                history: FxHashMap::default(),
            }),
            backends,
            launched: AtomicU64::new(0),
            compiled: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            interpreted: AtomicU64::new(0),
            tuned: AtomicU64::new(0),
        }
    }

    /// The graph and leaves, locked. Never hold it across a realize or a read: those lock
    /// it themselves.
    // A panic while the lock is held leaves the graph consistent: every mutation is a
    // single call on `Graph` that completes or does nothing.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The compiled-in backends, in registration order.
    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    /// The backend serving `device`; an error naming the feature to enable or the
    /// devices found when it is not available.
    pub fn backend(&self, device: Device) -> Result<Arc<dyn Backend>> {
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

    /// Drops every cached plan (their programs are released once no realize uses them).
    pub fn clear_plans(&self) {
        let mut st = self.lock();
        st.plans.clear();
    }

    /// Adds a node; the caller owns one count.
    pub fn add(&self, node: Node) -> NodeId {
        self.lock().graph.add(node)
    }

    /// Adds a leaf holding host bytes; the caller owns one count.
    pub fn add_host_leaf(&self, bytes: HostBytes, dtype: DType, shape: Shape) -> NodeId {
        let mut st = self.lock();
        let leaf = st.new_leaf(LeafData::Host(bytes));
        st.graph.add(Node {
            op: Op::Leaf(leaf),
            dtype,
            shape,
        })
    }

    /// Whether `node` computes its values from nothing but constants and element indices
    /// (`arange`, `zeros`, `full` and expressions over them), in dtypes `computes` accepts:
    /// such a value holds no data, so a device that computes those dtypes can compute it,
    /// and moving it there needs no copy. User kernels are left to the copying path, as are
    /// expressions of more than `limit` nodes (the answer must stay cheap).
    pub fn is_data_free(
        &self,
        node: NodeId,
        limit: usize,
        computes: impl Fn(DType) -> bool,
    ) -> bool {
        let st = self.lock();
        let mut stack = vec![node];
        let mut seen = 0;
        while let Some(id) = stack.pop() {
            seen += 1;
            let n = st.graph.node(id);
            if seen > limit || !computes(n.dtype) || matches!(n.op, Op::Leaf(_) | Op::Custom(..)) {
                return false;
            }
            stack.extend(n.op.operands());
        }
        true
    }

    /// Adds a count to a live node for a new holder.
    pub fn retain(&self, node: NodeId) {
        self.lock().graph.retain(node);
    }

    /// The recorded structure of `node` if it is a realized loss that kept it.
    pub fn history(st: &State, node: NodeId) -> Option<Node> {
        match st.graph.node(node).op {
            Op::Leaf(leaf) => st.history.get(&leaf).cloned(),
            _ => None,
        }
    }

    /// Drops one count of `node`, freeing what no one holds any more.
    pub fn release(&self, node: NodeId) {
        let mut st = self.lock();
        let freed = st.graph.release(node);
        self.free_leaves(&mut st, freed);
    }

    pub(crate) fn free_leaves(&self, st: &mut State, mut leaves: Vec<LeafId>) {
        while let Some(leaf) = leaves.pop() {
            if let Some(old) = st.history.remove(&leaf) {
                for c in old.op.children() {
                    leaves.extend(st.graph.release(c));
                }
            }
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
    pub fn relabel_leaf(&self, node: NodeId, shape: Shape) -> Result<NodeId> {
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
        let leaf = st.new_leaf(data);
        Ok(st.graph.add(Node {
            op: Op::Leaf(leaf),
            dtype: n.dtype,
            shape,
        }))
    }

    /// The error for the first dynamic dim under `targets` that `dims` gives no value (a
    /// tensor made from a symbolic shape rather than by `mark_dynamic`), if any.
    pub(crate) fn unbound_dim(&self, targets: &[NodeId], dims: &Bindings) -> Option<Error> {
        let st = self.lock();
        st.graph.toposort(targets).into_iter().find_map(|n| {
            let shape = &st.graph.node(n).shape;
            let var = shape
                .iter()
                .flat_map(|d| d.vars())
                .find(|v| dims.get(*v).is_none())?;
            Some(Error::InvalidArgument {
                op: "realize",
                reason: format!(
                    "shape {shape} names the dynamic dim `{}`, which has no value; make dynamic tensors with mark_dynamic",
                    var.name()
                ),
            })
        })
    }

    /// Fails if some leaf of `walk` holds a different number of bytes than its
    /// shape names under `dims`: tensors with disagreeing dynamic-dim values were combined
    /// by an op that could not check them.
    pub(crate) fn check_leaf_sizes(st: &State, walk: &Walk, dims: &Bindings) -> Result<()> {
        for &n in walk.order() {
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

    /// Counts programs a new plan got into `report` and the process's counters.
    pub(crate) fn count(&self, report: &mut RealizeReport, origins: planner::Origins) {
        report.compiled += origins.compiled;
        report.cached += origins.cached;
        report.interpreted += origins.interpreted;
        for (counter, n) in [
            (&self.compiled, origins.compiled),
            (&self.cached, origins.cached),
            (&self.interpreted, origins.interpreted),
        ] {
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The plan computing `targets` (nodes that are not leaves) on `device`: the cached
    /// one, or a new one (partitioned, compiled without the lock, measured on the
    /// realize's inputs) put in the cache; programs compiled are counted into `report`.
    /// Returns it with the lock held (the graph is as the plan was made for), the leaves
    /// it reads in signature order, and its cache key.
    ///
    /// A new plan is first looked up on disk ([`plan_cache`]) where `stored_ok` allows.
    pub(crate) fn plan_for(
        &self,
        targets: &[NodeId],
        device: Device,
        dims: &Bindings,
        report: &mut RealizeReport,
        stored_ok: bool,
    ) -> Result<Planned<'_>> {
        let backend = self.backend(device)?;
        // `plan_view` wants the candidates, which a stored plan does not compile.
        let mut from_disk = stored_ok && plan_cache::enabled();
        // Whether the whole plan was looked for on disk (once: a miss goes on to planning).
        let mut looked_whole = !from_disk;
        loop {
            let st = self.lock();
            let walk = Walk::new(&st.graph, targets);
            if !dims.is_empty() {
                Self::check_leaf_sizes(&st, &walk, dims)?;
            }
            let numerics = Numerics::current();
            let tuning = tuning();
            if let Some((key, plan)) = st.plans.find(&st.graph, &walk, device, numerics, tuning) {
                return Ok((st, plan, walk.into_leaves(), key));
            }
            let key = (walk.signature(&st.graph), device, numerics, tuning);
            let leaves = walk.into_leaves();
            let devices = planner::placement_devices(device);
            let mut plan_devices = Vec::with_capacity(devices.len());
            for &d in &devices {
                plan_devices.push((d, self.backend(d)?));
            }
            let whole_key = stored_plans::enabled()
                .then(|| stored_plans::key(&key.0, &plan_devices, numerics, tuning))
                .flatten();
            if let Some(whole) = whole_key.filter(|_| !looked_whole) {
                looked_whole = true;
                // Built without the lock: other threads keep recording.
                drop(st);
                let started = Instant::now();
                let mut origins = planner::Origins::default();
                if let Some(plan) = stored_plans::load(whole, &plan_devices, &mut origins) {
                    self.count(report, origins);
                    tracing::info!(
                        target: "tessel::first_call",
                        "{device}: stored plan of {} steps, {} kernels compiled, {} from caches, in {:.2} s",
                        plan.steps.len(),
                        origins.compiled,
                        origins.cached,
                        started.elapsed().as_secs_f64(),
                    );
                    let plan = Arc::new(plan);
                    let mut st = self.lock();
                    if Walk::new(&st.graph, targets).matches(&st.graph, &key.0) {
                        st.plans.insert(key.clone(), plan.clone());
                        return Ok((st, plan, leaves, key));
                    }
                }
                // The graph may have changed without the lock: walk it again.
                continue;
            }
            let started = Instant::now();
            let parts =
                planner::partition(&st.graph, targets, &leaves, &devices, numerics, tuning)?;
            drop(st);
            let partitioned = started.elapsed();
            tracing::debug!(target: "tessel::first_call", "{device}: partitioned in {:.2} s", partitioned.as_secs_f64());
            let disk_key = plan_cache::key(&parts, &plan_devices, dims, numerics);
            let stored = from_disk.then(|| plan_cache::load(disk_key)).flatten();
            let only = stored.as_ref().map(StoredPlan::programs);
            // Compile without the lock: other threads keep recording.
            let started = Instant::now();
            let compiled = planner::compile(parts, plan_devices, only.as_deref())?;
            let compiling = started.elapsed();
            tracing::debug!(target: "tessel::first_call", "{device}: {} programs compiled in {:.2} s", compiled.programs.len(), compiling.as_secs_f64());
            let started = Instant::now();
            let origins = compiled.origins;
            self.count(report, origins);
            let plan = if let Some(stored) = &stored {
                let Some(plan) = compiled.stored_plan(stored) else {
                    tracing::debug!(target: "tessel::plan", "{device}: the stored plan {disk_key:032x} does not build here; planning again");
                    from_disk = false;
                    continue;
                };
                plan
            } else if compiled.needs_choice() {
                // Candidates are measured on this realize's own inputs.
                let mut st = self.lock();
                let mut inputs = Vec::with_capacity(leaves.len());
                for leaf in &leaves {
                    inputs.push(self.device_buffer(&mut st, *leaf, device, &backend)?);
                }
                drop(st);
                let chosen = measure::choose(&compiled, &inputs, dims);
                // Other launch shapes measurement built (see `crate::tuning`).
                let later = compiled.built_later.lock().map(|o| *o).unwrap_or_default();
                self.count(report, later);
                let tuned = compiled.winners_stored.load(Ordering::Relaxed);
                report.tuned += tuned;
                self.tuned.fetch_add(tuned as u64, Ordering::Relaxed);
                let (plan, stored) = chosen?;
                if plan_cache::enabled() {
                    plan_cache::store(disk_key, &stored);
                }
                plan
            } else {
                compiled.default_plan()
            };
            if let Some(whole) = whole_key {
                stored_plans::store(whole, &plan, &compiled);
            }
            tracing::info!(
                target: "tessel::first_call",
                "{device}: new plan of {} steps{}: partitioned in {:.2} s; {} kernels compiled, \
                 {} from caches, {} interpreted in {:.2} s; measured and chosen in {:.2} s",
                plan.steps.len(),
                if stored.is_some() { " (stored)" } else { "" },
                partitioned.as_secs_f64(),
                origins.compiled,
                origins.cached,
                origins.interpreted,
                compiling.as_secs_f64(),
                started.elapsed().as_secs_f64(),
            );
            let plan = Arc::new(plan);
            let mut st = self.lock();
            // Another thread may have realized part of this subgraph meanwhile; the plan is
            // still right for the structure it was built for, but not for the graph now.
            if !Walk::new(&st.graph, targets).matches(&st.graph, &key.0) {
                continue;
            }
            st.plans.insert(key.clone(), plan.clone());
            return Ok((st, plan, leaves, key));
        }
    }

    /// The nodes among `nodes` that are not computed yet (not leaves).
    pub(crate) fn to_compute(&self, nodes: &[NodeId]) -> Vec<NodeId> {
        let st = self.lock();
        nodes
            .iter()
            .copied()
            .filter(|&n| !matches!(st.graph.node(n).op, Op::Leaf(_)))
            .collect()
    }

    /// The plan for `nodes` on `device` and what it was chosen from, in Graphviz DOT
    /// (planning it if no plan is cached, without running it): see `tessel_tensor::inspect::plan_to_dot`.
    pub fn plan_to_dot(
        &self,
        nodes: &[NodeId],
        device: Device,
        dims: &Bindings,
    ) -> Result<Option<String>> {
        let targets = self.to_compute(nodes);
        if targets.is_empty() {
            return Ok(None);
        }
        let (_st, plan, _, _) =
            self.plan_for(&targets, device, dims, &mut RealizeReport::default(), false)?;
        Ok(plan.view.as_ref().map(|v| v.to_dot()))
    }
}
