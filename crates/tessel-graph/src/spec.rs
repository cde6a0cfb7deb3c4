//! The kernel spec: what a fused kernel computes, before any decision about how.
//!
//! A [`KernelSpec`] is the kernelizer's fusion group seen as an iteration space (the root's
//! shape, one variable per axis), whether each element loops (a reduction in the body),
//! and every buffer it reads as an index expression of those variables, with the movement
//! ops between the root and the buffer already folded in. The schedule is a set of
//! [`Knobs`], each a transformation of how that space maps onto invocations; a knob is
//! checked against the spec ([`KernelSpec::check`]) before anything is lowered, and the
//! checks read the accesses: upcasting needs an elementwise body, tiling through local
//! memory a read that walks the buffer along another axis than the output's last.
//! Lowering the spec with its knobs gives the linear IR (`lower.rs`, `lower/tile.rs`).

use std::fmt;

use rustc_hash::FxHashSet;
use tessel_shape::{DType, Dim, Expr, Var};

use crate::graph::{Graph, NodeId, Op};
use crate::kernelize::{ScheduledKernel, Slot};
use crate::lower::{map_coords, space_var};
use crate::tune::{Knobs, Recipe};

/// A fused kernel before scheduling: its iteration space and what it reads.
// Four independent facts about the kernel, each read by the checks on its own.
#[allow(clippy::struct_excessive_bools)]
#[derive(Clone, Debug)]
pub struct KernelSpec {
    /// The value the kernel computes.
    pub root: NodeId,
    /// The root's dtype.
    pub dtype: DType,
    /// The iteration space: the root's shape, and the variable naming each axis's
    /// coordinate in [`SpecAccess::index`].
    pub space: Vec<(Var, Dim)>,
    /// Some element loops: the body has a reduction.
    pub reduces: bool,
    /// The body gathers (an index read from data).
    pub gathers: bool,
    /// Every buffer read, once per distinct index.
    pub accesses: Vec<SpecAccess>,
    /// The kernel's default lowering is cooperative (a workgroup per output or row).
    pub cooperative: bool,
    /// Values computed into buffers of their own besides the root (absorbed outputs).
    pub absorbs: bool,
}

/// One buffer read of a [`KernelSpec`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecAccess {
    /// The buffer.
    pub slot: Slot,
    /// Its elements' dtype.
    pub dtype: DType,
    /// Its number of elements.
    pub len: Dim,
    /// The element read: an index expression of the space's variables (and of a
    /// reduction's, inside one); `None` where it depends on data (a gather's source).
    pub index: Option<Expr>,
    /// Read only where a pad's mask holds.
    pub masked: bool,
}

impl SpecAccess {
    /// How far the element read moves when coordinate `var` steps by one, where that is a
    /// constant.
    pub fn stride(&self, var: Var) -> Option<i64> {
        let index = self.index?;
        let next = index.substitute(&[(var, Expr::from(var) + 1)]);
        (next - index).as_const()
    }
}

/// Why a knob does not apply to a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleError {
    /// The knobs checked.
    pub knobs: Knobs,
    /// What rules them out.
    pub reason: String,
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "knobs `{}` do not apply: {}", self.knobs, self.reason)
    }
}

impl std::error::Error for ScheduleError {}

/// Workgroup sizes a knob may ask for.
const LOCAL_RANGE: std::ops::RangeInclusive<i64> = 32..=1024;

/// Tile edges local-memory tiling may use (a tile's `edge²` invocations form one
/// workgroup).
pub const TILE_EDGES: [i64; 3] = [8, 16, 32];

impl KernelSpec {
    /// The spec of the kernel `recipe` lowers, in `graph`.
    pub(crate) fn new(graph: &Graph, recipe: &Recipe, cooperative: bool) -> KernelSpec {
        let node = graph.node(recipe.root);
        let space: Vec<(Var, Dim)> = node
            .shape
            .iter()
            .enumerate()
            .map(|(axis, &d)| (space_var(axis, d), d))
            .collect();
        let mut walk = Walk {
            graph,
            recipe,
            seen: FxHashSet::default(),
            spec: KernelSpec {
                root: recipe.root,
                dtype: node.dtype,
                space: space.clone(),
                reduces: false,
                gathers: false,
                accesses: Vec::new(),
                cooperative,
                absorbs: false,
            },
            reduce_vars: 0,
        };
        let coords: Vec<Expr> = space.iter().map(|&(v, _)| Expr::from(v)).collect();
        walk.visit(recipe.root, &coords, false, false, true);
        walk.spec
    }

    /// The read that tiling through local memory would stage: the first unmasked read
    /// whose index steps by 1 along some axis other than the last (the axis returned) and
    /// by neither 0 nor 1 along the last, so that neighbouring outputs read far-apart
    /// elements.
    pub fn transposed_read(&self) -> Option<(&SpecAccess, usize)> {
        let (&(last_var, _), rest) = self.space.split_last()?;
        self.accesses.iter().find_map(|a| {
            if a.masked || !matches!(a.stride(last_var), Some(s) if s != 0 && s != 1) {
                return None;
            }
            let axis = rest.iter().position(|&(v, _)| a.stride(v) == Some(1))?;
            Some((a, axis))
        })
    }

    /// Checks that every knob of `knobs` applies to this kernel: the transformations are
    /// then sound to lower (each variant is still checked against the default kernel's
    /// output before it is used).
    pub fn check(&self, knobs: Knobs) -> Result<(), ScheduleError> {
        let fail = |reason: String| Err(ScheduleError { knobs, reason });
        if let Some(l) = knobs.local {
            if self.cooperative {
                return fail("a cooperative kernel's workgroup is its lanes".into());
            }
            if !LOCAL_RANGE.contains(&l) || !(l as u64).is_power_of_two() {
                return fail(format!(
                    "a workgroup of {l} invocations is not a power of two in {LOCAL_RANGE:?}"
                ));
            }
        }
        if let Some(u) = knobs.upcast
            && u != 1
        {
            let last = self.space.last().and_then(|&(_, d)| d.as_const());
            if self.reduces || self.gathers || self.absorbs || self.cooperative {
                return fail("only an elementwise kernel writing one value computes several outputs per invocation".into());
            }
            if !matches!(u, 2 | 4 | 8) || last.is_none_or(|n| n % u != 0) {
                return fail(format!(
                    "{u} outputs per invocation need a constant last axis that is a multiple of it (2, 4 or 8)"
                ));
            }
        }
        if let Some(l) = knobs.lanes {
            if !self.cooperative {
                return fail("lanes are for cooperative kernels".into());
            }
            if !LOCAL_RANGE.contains(&l) || !(l as u64).is_power_of_two() {
                return fail(format!(
                    "{l} lanes is not a power of two in {LOCAL_RANGE:?}"
                ));
            }
        }
        if let Some(t) = knobs.tile {
            if knobs.local.is_some() || knobs.upcast.is_some() {
                return fail("a tiled kernel's workgroup is its tile".into());
            }
            if self.reduces || self.gathers || self.absorbs || self.cooperative {
                return fail("only an elementwise kernel writing one value is tiled".into());
            }
            if !TILE_EDGES.contains(&t) {
                return fail(format!("tiles are {TILE_EDGES:?} elements on a side"));
            }
            if self.space.iter().any(|&(_, d)| d.as_const().is_none()) {
                return fail("tiling needs constant sizes".into());
            }
            if self.transposed_read().is_none() {
                return fail(
                    "no read walks its buffer along another axis than the output's last".into(),
                );
            }
        }
        Ok(())
    }
}

impl ScheduledKernel {
    /// The spec of this kernel, `graph` being the graph it was kernelized from; `None` for
    /// kernels without knobs (scatters, sorts).
    pub fn spec(&self, graph: &Graph) -> Option<KernelSpec> {
        let recipe = self.recipe.as_ref()?;
        Some(KernelSpec::new(graph, recipe, self.cooperative))
    }
}

/// The walk from the root to the buffers, as lowering evaluates it.
struct Walk<'g> {
    graph: &'g Graph,
    recipe: &'g Recipe,
    seen: FxHashSet<(NodeId, Vec<Expr>, bool)>,
    spec: KernelSpec,
    reduce_vars: usize,
}

impl Walk<'_> {
    fn visit(&mut self, n: NodeId, coords: &[Expr], masked: bool, data: bool, top: bool) {
        if !self.seen.insert((n, coords.to_vec(), masked || data)) {
            return;
        }
        let node = self.graph.node(n);
        let stored = !top && self.recipe.materialized.contains(&n);
        let at_root = coords
            .iter()
            .zip(&self.spec.space)
            .all(|(&c, &(v, _))| c == Expr::from(v));
        let absorbed = stored && self.recipe.absorbable.contains(&n) && at_root;
        if absorbed {
            self.spec.absorbs = true;
        }
        let slot = match node.op {
            Op::Leaf(leaf) => self.recipe.leaf_slot.get(&leaf).map(|&s| Slot::Input(s)),
            _ if stored && !absorbed => Some(Slot::Node(n)),
            _ => None,
        };
        if let Some(slot) = slot {
            let index = (!data).then(|| {
                coords
                    .iter()
                    .zip(node.shape.contiguous_strides())
                    .map(|(&c, s)| c * s)
                    .sum()
            });
            let access = SpecAccess {
                slot,
                dtype: node.dtype,
                len: node.shape.numel(),
                index,
                masked,
            };
            if !self.spec.accesses.contains(&access) {
                self.spec.accesses.push(access);
            }
            return;
        }
        let op = node.op.clone();
        match &op {
            Op::Leaf(_) | Op::Const(_) | Op::Index(_) => {}
            Op::Random(key, _) => {
                for j in 0..4 {
                    self.visit(*key, &[Expr::constant(j)], masked, data, false);
                }
            }
            Op::Unary(_, a) | Op::Cast(a) | Op::Bitcast(a) => {
                self.visit(*a, coords, masked, data, false);
            }
            Op::Binary(_, a, b) => {
                self.visit(*a, coords, masked, data, false);
                self.visit(*b, coords, masked, data, false);
            }
            Op::Ternary(_, a, b, c) => {
                for x in [a, b, c] {
                    self.visit(*x, coords, masked, data, false);
                }
            }
            Op::Pad(a, pads, _) => {
                let mapped: Vec<Expr> = coords
                    .iter()
                    .zip(pads.iter())
                    .map(|(&c, &(before, _))| c - before)
                    .collect();
                self.visit(*a, &mapped, true, data, false);
            }
            Op::Reduce(_, a, axes) => {
                self.spec.reduces = true;
                let inner = self.graph.node(*a).shape.clone();
                let mut mapped = coords.to_vec();
                for &axis in axes {
                    let var = reduce_var(self.reduce_vars, inner[axis]);
                    self.reduce_vars += 1;
                    mapped[axis] = Expr::from(var);
                }
                self.visit(*a, &mapped, masked, data, false);
            }
            Op::Gather(src, index, _) => {
                self.spec.gathers = true;
                self.visit(*index, coords, masked, data, false);
                self.visit(*src, coords, masked, true, false);
            }
            Op::Scatter(..) | Op::Argsort(_) | Op::Custom(..) => {}
            op if op.is_movement() => {
                let (child, mapped) = map_coords(self.graph, op, &node.shape.clone(), coords);
                self.visit(child, &mapped, masked, data, false);
            }
            _ => {}
        }
    }
}

/// The variable of a reduction's axis in a spec's indices (`s0`, `s1`, ...).
fn reduce_var(k: usize, extent: Dim) -> Var {
    let hi = extent.bounds().hi.saturating_sub(1).max(0);
    Var::new(&format!("s{k}"), 0, hi).expect("0 <= hi by construction")
}
