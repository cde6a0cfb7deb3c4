//! The in-memory plan cache: plans by the structure of what they compute, the device, the
//! `f32` matmul precision and determinism, the tuning mode, evicted first in, first out beyond
//! [`PLAN_CACHE_LIMIT`].
//!
//! A realize that finds its plan here is the common case, so a lookup takes a [`Walk`] of
//! the live graph and compares it with the stored [`Signature`]s of its hash's bucket in
//! place ([`Walk::matches`]) instead of building a signature to look up.

use std::collections::VecDeque;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use tessel_graph::{Graph, Signature, Walk};

use crate::determinism::Numerics;
use crate::device::Device;
use crate::planner::Plan;
use crate::runtime::PLAN_CACHE_LIMIT;
use crate::tuning::Tuning;

/// A plan's cache key: the graph's structure, the device it runs on, the `f32` matmul
/// precision and determinism, and the tuning mode (its routines and launch shapes differ
/// with them).
pub(crate) type PlanKey = (Signature, Device, Numerics, Tuning);

/// [`PlanKey`] with the signature reduced to its hash: a bucket.
type Bucket = (u64, Device, Numerics, Tuning);

fn bucket(key: &PlanKey) -> Bucket {
    (key.0.structure_hash(), key.1, key.2, key.3)
}

/// Cached plans; see the module docs.
#[derive(Default)]
pub(crate) struct Plans {
    /// Plans by bucket; a bucket holds more than one only when structures' hashes collide.
    buckets: FxHashMap<Bucket, Vec<(Signature, Arc<Plan>)>>,
    /// Keys, oldest first.
    order: VecDeque<PlanKey>,
}

impl Plans {
    /// The plan stored for `walk`'s structure, with its key.
    pub(crate) fn find(
        &self,
        graph: &Graph,
        walk: &Walk,
        device: Device,
        numerics: Numerics,
        tuning: Tuning,
    ) -> Option<(PlanKey, Arc<Plan>)> {
        let entries = self.buckets.get(&(walk.hash(), device, numerics, tuning))?;
        let (sig, plan) = entries.iter().find(|(sig, _)| walk.matches(graph, sig))?;
        Some(((sig.clone(), device, numerics, tuning), Arc::clone(plan)))
    }

    /// The plan stored under `key`.
    pub(crate) fn get(&self, key: &PlanKey) -> Option<&Arc<Plan>> {
        self.buckets
            .get(&bucket(key))?
            .iter()
            .find(|(sig, _)| *sig == key.0)
            .map(|(_, plan)| plan)
    }

    /// Stores `plan` under `key`, replacing the plan stored there; a new key evicts the
    /// oldest beyond [`PLAN_CACHE_LIMIT`].
    pub(crate) fn insert(&mut self, key: PlanKey, plan: Arc<Plan>) {
        let entries = self.buckets.entry(bucket(&key)).or_default();
        if let Some(entry) = entries.iter_mut().find(|(sig, _)| *sig == key.0) {
            entry.1 = plan;
            return;
        }
        entries.push((key.0.clone(), plan));
        self.order.push_back(key);
        if self.order.len() > PLAN_CACHE_LIMIT
            && let Some(old) = self.order.pop_front()
        {
            self.remove(&old);
        }
    }

    fn remove(&mut self, key: &PlanKey) {
        let b = bucket(key);
        if let Some(entries) = self.buckets.get_mut(&b) {
            entries.retain(|(sig, _)| *sig != key.0);
            if entries.is_empty() {
                self.buckets.remove(&b);
            }
        }
    }

    /// The number of plans stored.
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// Drops every plan.
    pub(crate) fn clear(&mut self) {
        self.buckets.clear();
        self.order.clear();
    }
}
