//! Plans kept for replays on new arguments: [`Runtime::capture`] and [`Runtime::replay`].
//!
//! A realize records its ops, finds its plan by the graph's signature and turns its
//! targets into leaves. A captured plan skips all of that on later calls: its inputs are
//! bound from the arguments given (or from the leaves it held since the capture), its
//! launches replay, and its outputs become new leaves. What the host does per call is
//! binding buffers and launching; recording, lookup and the graph's bookkeeping are paid
//! once.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use tessel_graph::{LeafId, Node, NodeId, Op, Walk};
use tessel_ir::BufferId;
use tessel_shape::{Bindings, DType, Shape};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::execute::free_temps;
use crate::planner::{Place, Plan, PlanSlot};
use crate::runtime::{LeafData, RealizeReport, Runtime, runtime};

/// A plan kept for replays ([`Runtime::capture`]). Dropping it releases the leaves it holds.
pub struct Captured {
    plan: Arc<Plan>,
    device: Device,
    /// Each leaf the plan reads, in signature order: the argument bound to it, or a node
    /// held since the capture (one count) whose data every replay reads.
    sources: Vec<Source>,
    /// Each target's dtype and shape.
    outputs: Vec<(DType, Shape)>,
}

enum Source {
    Arg(usize),
    Held(NodeId),
}

impl Drop for Captured {
    fn drop(&mut self) {
        for source in &self.sources {
            if let Source::Held(node) = source {
                runtime().release(*node);
            }
        }
    }
}

impl Captured {
    /// Kernels one replay launches.
    pub fn launches(&self) -> usize {
        self.plan.launches()
    }
}

impl Runtime {
    /// The plan computing `targets` (computed nodes, not leaves) on `device`, kept for
    /// [`Runtime::replay`] with `args` (leaves) as its arguments: the plan cache's plan, or
    /// a new one (planned, compiled and measured now). Every other leaf the targets read is
    /// held, and replays read its data as it is now. Nothing runs yet.
    ///
    /// Errors if the graph reads a dynamic dim (a replay binds no values) or draws random
    /// numbers from a key that is not an argument (a replay would draw the same ones again).
    pub fn capture(
        &self,
        targets: &[NodeId],
        args: &[NodeId],
        device: Device,
    ) -> Result<(Captured, RealizeReport)> {
        {
            let st = self.lock();
            let walk = Walk::new(&st.graph, targets);
            for &n in walk.order() {
                let node = st.graph.node(n);
                if let Op::Random(key, _) = node.op
                    && !args.contains(&key)
                {
                    return Err(Error::InvalidArgument {
                        op: "compile",
                        reason: "random numbers drawn from a key that is not an argument (every call would draw the same values); bind each draw's key as an argument".into(),
                    });
                }
                if node.shape.iter().any(|d| !d.vars().is_empty()) {
                    return Err(Error::InvalidArgument {
                        op: "compile",
                        reason: format!(
                            "dynamic shapes inside a compiled function are not supported (found {}); compile it for concrete shapes",
                            node.shape
                        ),
                    });
                }
            }
        }
        let mut report = RealizeReport::default();
        let (mut st, plan, leaves, _) =
            self.plan_for(targets, device, &Bindings::default(), &mut report, true)?;
        let leaf_of = |st: &crate::runtime::State, n: NodeId| match st.graph.node(n).op {
            Op::Leaf(leaf) => Some(leaf),
            _ => None,
        };
        let arg_of: FxHashMap<LeafId, usize> = args
            .iter()
            .enumerate()
            .filter_map(|(i, &n)| Some((leaf_of(&st, n)?, i)))
            .collect();
        let walk = Walk::new(&st.graph, targets);
        let node_of: FxHashMap<LeafId, NodeId> = walk
            .order()
            .iter()
            .filter_map(|&n| Some((leaf_of(&st, n)?, n)))
            .collect();
        let mut sources = Vec::with_capacity(leaves.len());
        for leaf in &leaves {
            sources.push(match (arg_of.get(leaf), node_of.get(leaf)) {
                (Some(&i), _) => Source::Arg(i),
                (None, Some(&n)) => Source::Held(n),
                (None, None) => {
                    return Err(Error::Internal(format!(
                        "the captured plan reads {leaf:?}, which its graph does not hold"
                    )));
                }
            });
        }
        // Held only once every source is known, so an error leaves no count behind.
        for source in &sources {
            if let Source::Held(n) = source {
                st.graph.retain(*n);
            }
        }
        let outputs = targets
            .iter()
            .map(|&t| {
                let n = st.graph.node(t);
                (n.dtype, n.shape.clone())
            })
            .collect();
        drop(st);
        let captured = Captured {
            plan,
            device,
            sources,
            outputs,
        };
        Ok((captured, report))
    }

    /// Runs `captured`'s plan on `args` (realized nodes of the shapes and dtypes it was
    /// captured with, which the caller checks) and returns a new leaf per target, each with
    /// one count held by the caller.
    pub fn replay(&self, captured: &Captured, args: &[NodeId]) -> Result<Vec<NodeId>> {
        let device = captured.device;
        let backend = self.backend(device)?;
        let mut st = self.lock();
        let mut bound = Vec::with_capacity(captured.sources.len());
        for source in &captured.sources {
            let node = match *source {
                Source::Arg(i) => *args.get(i).ok_or_else(|| {
                    Error::Internal(format!("a replay given {} arguments", args.len()))
                })?,
                Source::Held(n) => n,
            };
            let Op::Leaf(leaf) = st.graph.node(node).op else {
                return Err(Error::Internal(
                    "a replay's argument is not realized".into(),
                ));
            };
            bound.push(self.device_buffer(&mut st, leaf, device, &backend)?);
        }
        drop(st);
        let dims = Bindings::default();
        let mut plan = captured.plan.clone();
        let inputs: Vec<BufferId> = plan.inputs.iter().map(|&i| bound[i]).collect();
        let mut temps: FxHashMap<Place, (BufferId, usize)> = FxHashMap::default();
        let mut result = self.run_plan(&plan, &inputs, &dims, &mut temps);
        if let Err(e) = &result
            && let Some(fallback) = plan.fallback.clone()
        {
            tracing::warn!(target: "tessel::plan", "{device}: the captured plan failed ({e}); running the runner-up");
            free_temps(&plan, temps.drain());
            let inputs: Vec<BufferId> = fallback.inputs.iter().map(|&i| bound[i]).collect();
            result = self.run_plan(&fallback, &inputs, &dims, &mut temps);
            plan = fallback;
        }
        if let Err(e) = result {
            free_temps(&plan, temps.into_iter());
            return Err(e);
        }
        // Targets by the position holding them (equal targets share one).
        let mut targets_at: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
        for &(position, k) in &plan.outputs {
            targets_at.entry(position).or_default().push(k);
        }
        let mut outputs: Vec<Option<NodeId>> = vec![None; captured.outputs.len()];
        let mut rest = Vec::new();
        let mut st = self.lock();
        for (place, (buffer, bytes)) in temps {
            let ks = match place {
                Place {
                    slot: PlanSlot::Node(p),
                    device: 0,
                } => targets_at.get(&p),
                _ => None,
            };
            let Some(ks) = ks.filter(|ks| !ks.is_empty()) else {
                rest.push((place, (buffer, bytes)));
                continue;
            };
            let leaf = st.new_leaf(LeafData::Device {
                device,
                buffer,
                bytes,
            });
            let (dtype, shape) = captured.outputs[ks[0]].clone();
            let node = st.graph.add(Node {
                op: Op::Leaf(leaf),
                dtype,
                shape,
            });
            for (i, &k) in ks.iter().enumerate() {
                if i > 0 {
                    st.graph.retain(node);
                }
                outputs[k] = Some(node);
            }
        }
        drop(st);
        free_temps(&plan, rest.into_iter());
        let missing = outputs.iter().position(Option::is_none);
        let outputs: Vec<NodeId> = outputs.into_iter().flatten().collect();
        if let Some(k) = missing {
            for &node in &outputs {
                self.release(node);
            }
            return Err(Error::Internal(format!(
                "the captured plan wrote no buffer for output {k}"
            )));
        }
        Ok(outputs)
    }
}
