//! Launch-shape knobs of a kernel, and the variants a tuner measures.
//!
//! Lowering picks each kernel's launch shape by fixed heuristics: 128 invocations per
//! workgroup, 4 or 8 consecutive outputs per invocation for elementwise kernels on wide
//! enough rows, a cooperative workgroup covering a quarter of its longest reduction (a row
//! kernel over many rows: about 12 elements per invocation). What is
//! fastest depends on the device, so each heuristic is a knob ([`Knobs`]), and
//! [`ScheduledKernel::variants`] lowers a kernel again with other values: the same
//! parameters, the same values written, another launch shape. The runtime compiles them,
//! checks each against the default kernel's output and keeps the fastest (its tuner and
//! tuning cache live in `tessel-tensor`).

use std::fmt;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::graph::{Graph, LeafId, NodeId};
use crate::kernelize::ScheduledKernel;
use crate::lower::{
    Cone, LowerMemo, Lowering, Mode, default_lanes, lower_kernel, lower_tiled_kernel,
};
use crate::spec::{KernelSpec, TILE_EDGES};

/// Overrides of the launch-shape heuristics; `None` keeps the heuristic's choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Knobs {
    /// Invocations per workgroup of a kernel whose invocations work alone.
    pub local: Option<i64>,
    /// Consecutive outputs along the last axis per invocation (1 turns upcasting off) of
    /// an elementwise kernel; kept only where the last axis is a multiple of it.
    pub upcast: Option<i64>,
    /// Invocations per workgroup of a cooperative or row kernel (a power of two).
    pub lanes: Option<i64>,
    /// The edge of the square tiles (8, 16 or 32) through which an elementwise kernel
    /// reads an input it walks along another axis than the output's last (a transpose):
    /// see `lower/tile.rs`.
    pub tile: Option<i64>,
}

impl fmt::Display for Knobs {
    /// `l256_u8`, `w512`, `t32`, or `default`: short, for kernel names and the tuning
    /// cache.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            ('l', self.local),
            ('u', self.upcast),
            ('w', self.lanes),
            ('t', self.tile),
        ]
        .into_iter()
        .filter_map(|(tag, v)| v.map(|v| format!("{tag}{v}")))
        .collect();
        if parts.is_empty() {
            f.write_str("default")
        } else {
            f.write_str(&parts.join("_"))
        }
    }
}

/// How many launch shapes a tuner tries per kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Search {
    /// A few shapes around the heuristics' (at most 3 per kernel).
    Default,
    /// Every combination of the knobs' values (up to 30 per kernel).
    Exhaustive,
}

/// What [`ScheduledKernel::variants`] needs to lower a kernel again: the kernelizer's
/// decisions for it.
#[derive(Debug)]
pub(crate) struct Recipe {
    pub(crate) root: NodeId,
    pub(crate) materialized: Arc<FxHashSet<NodeId>>,
    pub(crate) absorbable: FxHashSet<NodeId>,
    pub(crate) leaf_slot: Arc<FxHashMap<LeafId, usize>>,
    pub(crate) mode: Mode,
    /// The kernelization's lowerings by cone (see `lower::memo`).
    pub(crate) memo: Arc<LowerMemo>,
}

const LOCAL_SIZES: [i64; 6] = [32, 64, 128, 256, 512, 1024];
const UPCASTS: [i64; 4] = [1, 2, 4, 8];

impl Knobs {
    /// The knob settings `search` tries on a kernel that is cooperative or not; `lanes_now` is
    /// a cooperative kernel's default workgroup size, which the default search halves and
    /// doubles (twice).
    fn space(search: Search, cooperative: bool, lanes_now: Option<i64>) -> Vec<Knobs> {
        let lanes = |l: i64| Knobs {
            lanes: Some(l),
            ..Knobs::default()
        };
        let local = |l: i64, u: Option<i64>| Knobs {
            local: Some(l),
            upcast: u,
            ..Knobs::default()
        };
        let tile = |t: i64| Knobs {
            tile: Some(t),
            ..Knobs::default()
        };
        let upcast = |u: i64| Knobs {
            upcast: Some(u),
            ..Knobs::default()
        };
        match (search, cooperative) {
            (Search::Default, true) => {
                let now = lanes_now.unwrap_or(256);
                [now / 2, now * 2, now * 4]
                    .into_iter()
                    .filter(|l| LOCAL_SIZES.contains(l))
                    .map(lanes)
                    .collect()
            }
            (Search::Exhaustive, true) => LOCAL_SIZES.map(lanes).to_vec(),
            (Search::Default, false) => vec![
                local(256, None),
                local(512, None),
                upcast(8),
                tile(16),
                tile(32),
            ],
            (Search::Exhaustive, false) => LOCAL_SIZES
                .into_iter()
                .flat_map(|l| {
                    [None]
                        .into_iter()
                        .chain(UPCASTS.map(Some))
                        .map(move |u| local(l, u))
                })
                .chain(TILE_EDGES.map(tile))
                .collect(),
        }
    }
}

impl ScheduledKernel {
    /// This kernel lowered with the knob settings `search` tries, each named by its
    /// [`Knobs`] (also appended to the kernel's name): only those its spec admits
    /// ([`KernelSpec::check`]) that differ from this kernel and from each other, read and
    /// write exactly what it does, and can serve in its place. `graph` must be the graph
    /// it was kernelized from. Scatters and sorts have no variants; nor does a kernel
    /// whose settings change nothing.
    pub fn variants(&self, graph: &Graph, search: Search) -> Vec<(Knobs, ScheduledKernel)> {
        let Some(recipe) = &self.recipe else {
            return Vec::new();
        };
        // Kernels of equal cones (a model's layers) share one lowering of their variants.
        let cone = Cone::new(
            graph,
            recipe.root,
            &recipe.materialized,
            &recipe.absorbable,
            format!("{:?} variants {search:?} {}", recipe.mode, self.cooperative),
        );
        let lowered = recipe
            .memo
            .get_or_lower(graph, &recipe.leaf_slot, cone, || {
                Ok(Some(self.lower_variants(graph, recipe, search)))
            });
        // Variants kept for another kernel of this structure read and write what it does
        // in the same order where this kernel was lowered the same way; others are dropped.
        let mut variants = lowered.ok().flatten().unwrap_or_default();
        variants.retain(|(_, k)| k.args == self.args && k.writes == self.writes);
        for (_, k) in &mut variants {
            k.recipe.clone_from(&self.recipe);
        }
        variants
    }

    fn lower_variants(
        &self,
        graph: &Graph,
        recipe: &Recipe,
        search: Search,
    ) -> Vec<(Knobs, ScheduledKernel)> {
        let spec = KernelSpec::new(graph, recipe, self.cooperative);
        let mut seen = vec![self.kernel.clone()];
        let mut out = Vec::new();
        let lanes_now = default_lanes(
            graph,
            recipe.root,
            &recipe.materialized,
            &recipe.absorbable,
            recipe.mode,
        );
        for knobs in Knobs::space(search, self.cooperative, lanes_now) {
            if spec.check(knobs).is_err() {
                continue;
            }
            let lowered = match knobs.tile {
                Some(edge) => lower_tiled_kernel(graph, recipe, &spec, edge),
                None => lower_kernel(
                    graph,
                    recipe.root,
                    &recipe.materialized,
                    &recipe.absorbable,
                    &recipe.leaf_slot,
                    recipe.mode,
                    knobs,
                ),
            };
            let Ok(Lowering::Done(mut k)) = lowered else {
                continue;
            };
            if k.args != self.args
                || k.writes != self.writes
                || k.cooperative != self.cooperative
                || seen.contains(&k.kernel)
            {
                continue;
            }
            seen.push(k.kernel.clone());
            k.kernel.name = format!("{}_{knobs}", k.kernel.name);
            k.recipe.clone_from(&self.recipe);
            out.push((knobs, *k));
        }
        out
    }
}
