//! Vector memory access: scalar loads (stores) of consecutive elements of one buffer
//! merged into one load (store) of a vector.
//!
//! A kernel that computes several consecutive outputs per invocation (lowering's upcast)
//! loads `b[i], b[i + 1], ..., b[i + w - 1]` and stores `out[j], ..., out[j + w - 1]` one
//! element at a time. A GPU issues each of those as its own memory instruction; one
//! 16-byte access moves the same bytes in one instruction, which is what keeps a narrow
//! (`bf16`) memory-bound kernel near bandwidth. The merged access starts at a multiple of
//! its width (a [vector access](crate::Inst::Load) must), proved from the index arithmetic:
//! `mul(x, 8)` is a multiple of 8, sums and remainders of multiples keep the smallest.

use rustc_hash::{FxHashMap, FxHashSet};
use tessel_shape::{BinaryOp, DType, TernaryOp};

use super::{Rewriter, int_value};
use crate::kernel::{Inst, Kernel, Mem, Value};

/// Merges runs of scalar loads (and stores) of consecutive elements of one global buffer,
/// starting at a proven multiple of the run's length, into single vector accesses of at
/// most `max_bytes` bytes (widths 2, 4 or 8).
///
/// Only straight-line code is merged: the scalar accesses of a run lie in one block with
/// no loop, condition or barrier between them. Loads move up to the run's first load, so no
/// store to global memory may lie between them (parameters may alias); stores move down to
/// the run's last store, so no global load or atomic may lie between those. `bool` buffers
/// keep their scalar accesses.
pub fn vectorize(kernel: &Kernel, max_bytes: usize) -> Kernel {
    let plan = Plan::of(kernel, max_bytes);
    if plan.is_empty() {
        return kernel.clone();
    }
    let mut rw = Rewriter::new(kernel);
    let mut vectors: FxHashMap<usize, Value> = FxHashMap::default();
    for (i, inst) in kernel.insts.iter().enumerate() {
        let old = Value(i as u32);
        if let Some(&width) = plan.load_lead.get(&i) {
            let Inst::Load { mem, index, .. } = *inst else {
                rw.copy(old);
                continue;
            };
            let index = rw.value(index);
            let vector = rw.push(Inst::Load { mem, index, width });
            vectors.insert(i, vector);
            let lane = rw.push(Inst::Extract(vector, 0));
            rw.set(old, lane);
        } else if let Some((&vector, lane)) = plan
            .load_lane
            .get(&i)
            .and_then(|&(lead, lane)| Some((vectors.get(&lead)?, lane)))
        {
            let value = rw.push(Inst::Extract(vector, lane));
            rw.set(old, value);
        } else if let Some(stores) = plan.store_last.get(&i) {
            let lanes: Vec<Value> = stores
                .iter()
                .filter_map(|&s| match kernel.insts[s] {
                    Inst::Store { value, .. } => Some(rw.value(value)),
                    _ => None,
                })
                .collect();
            let Inst::Store { mem, index, .. } = kernel.insts[stores[0]] else {
                rw.copy(old);
                continue;
            };
            let index = rw.value(index);
            let value = rw.push(Inst::Vectorize(lanes));
            rw.push(Inst::Store { mem, index, value });
        } else if !plan.store_dropped.contains(&i) {
            rw.copy(old);
        }
    }
    rw.finish()
}

/// Which instructions [`vectorize`] merges.
#[derive(Default)]
struct Plan {
    /// A run's first load (of its lane 0), widened to this width.
    load_lead: FxHashMap<usize, u8>,
    /// Every other load of a run: its lead and its lane.
    load_lane: FxHashMap<usize, (usize, u8)>,
    /// A run's last store, with the run's stores in lane order.
    store_last: FxHashMap<usize, Vec<usize>>,
    /// The run's other stores, written by the last.
    store_dropped: FxHashSet<usize>,
}

/// A global access by instruction `at`: its buffer, the index as a base value plus a
/// constant offset, and whether it stores.
#[derive(Clone, Copy)]
struct Access {
    at: usize,
    param: usize,
    base: Value,
    offset: i128,
}

impl Plan {
    fn is_empty(&self) -> bool {
        self.load_lead.is_empty() && self.store_last.is_empty()
    }

    fn of(kernel: &Kernel, max_bytes: usize) -> Plan {
        let multiples = multiples(kernel);
        let mut plan = Plan::default();
        let mut segment: Vec<usize> = Vec::new();
        for (i, inst) in kernel.insts.iter().enumerate() {
            let boundary = matches!(
                inst,
                Inst::Range { .. }
                    | Inst::EndRange(_)
                    | Inst::If(_)
                    | Inst::EndIf(_)
                    | Inst::Barrier
            );
            if boundary {
                plan.segment(kernel, &segment, &multiples, max_bytes);
                segment.clear();
            } else {
                segment.push(i);
            }
        }
        plan.segment(kernel, &segment, &multiples, max_bytes);
        plan
    }

    /// Finds the runs of one straight-line stretch of instructions.
    fn segment(&mut self, kernel: &Kernel, insts: &[usize], multiples: &[u64], max_bytes: usize) {
        let widths = widths(kernel);
        let (mut loads, mut stores) = (Vec::new(), Vec::new());
        for &i in insts {
            let (list, mem, index) = match kernel.insts[i] {
                Inst::Load {
                    mem,
                    index,
                    width: 1,
                } => (&mut loads, mem, index),
                Inst::Store { mem, index, value } if widths.get(value.index()) == Some(&1) => {
                    (&mut stores, mem, index)
                }
                _ => continue,
            };
            let Mem::Global(param) = mem else { continue };
            let (base, offset) = split_offset(kernel, index);
            list.push(Access {
                at: i,
                param,
                base,
                offset,
            });
        }
        let global_store_at: Vec<usize> = insts
            .iter()
            .copied()
            .filter(|&i| {
                matches!(
                    kernel.insts[i],
                    Inst::Store {
                        mem: Mem::Global(_),
                        ..
                    } | Inst::Atomic {
                        mem: Mem::Global(_),
                        ..
                    }
                )
            })
            .collect();
        let global_at: Vec<usize> = insts
            .iter()
            .copied()
            .filter(|&i| {
                matches!(
                    kernel.insts[i],
                    Inst::Load {
                        mem: Mem::Global(_),
                        ..
                    } | Inst::Store {
                        mem: Mem::Global(_),
                        ..
                    } | Inst::Atomic {
                        mem: Mem::Global(_),
                        ..
                    }
                )
            })
            .collect();
        let between = |list: &[usize], lo: usize, hi: usize| list.iter().any(|&i| lo < i && i < hi);
        for run in runs(kernel, &loads, multiples, max_bytes) {
            let (first, last) = (
                run[0].at,
                run.iter().map(|a| a.at).max().unwrap_or(run[0].at),
            );
            // The vector load sits at lane 0's place: lane 0 must come first, and no store
            // may come between it and the lanes it reads early.
            if run.iter().any(|a| a.at < first) || between(&global_store_at, first, last) {
                continue;
            }
            self.load_lead.insert(first, run.len() as u8);
            for (lane, a) in run.iter().enumerate().skip(1) {
                self.load_lane.insert(a.at, (first, lane as u8));
            }
        }
        for run in runs(kernel, &stores, multiples, max_bytes) {
            let first = run.iter().map(|a| a.at).min().unwrap_or(run[0].at);
            let last = run.iter().map(|a| a.at).max().unwrap_or(run[0].at);
            // The vector store sits at the last store's place: lane 0's index and every
            // lane's value are defined by then (their stores use them), and no other
            // global access may come between the first store and the last.
            let own: FxHashSet<usize> = run.iter().map(|a| a.at).collect();
            if global_at
                .iter()
                .any(|&i| first < i && i < last && !own.contains(&i))
            {
                continue;
            }
            self.store_last
                .insert(last, run.iter().map(|a| a.at).collect());
            for a in &run {
                if a.at != last {
                    self.store_dropped.insert(a.at);
                }
            }
        }
    }
}

/// Runs of accesses to `base + offset .. base + offset + w` of one buffer, in lane order,
/// with `base + offset` a proven multiple of `w`; each access in at most one run, and
/// none where two accesses share an element (their order would matter).
fn runs(
    kernel: &Kernel,
    accesses: &[Access],
    multiples: &[u64],
    max_bytes: usize,
) -> Vec<Vec<Access>> {
    let mut by_base: FxHashMap<(usize, Value), FxHashMap<i128, Access>> = FxHashMap::default();
    let mut repeated: FxHashSet<(usize, Value)> = FxHashSet::default();
    for &a in accesses {
        if by_base
            .entry((a.param, a.base))
            .or_default()
            .insert(a.offset, a)
            .is_some()
        {
            repeated.insert((a.param, a.base));
        }
    }
    let mut out = Vec::new();
    let mut keys: Vec<_> = by_base.keys().copied().collect();
    keys.sort_unstable_by_key(|&(param, base)| (param, base.index()));
    for key in keys {
        if repeated.contains(&key) {
            continue;
        }
        let Some(dtype) = kernel.params.get(key.0).and_then(|p| match p {
            crate::Param::Buffer { dtype, .. } => Some(*dtype),
            crate::Param::Dim { .. } => None,
        }) else {
            continue;
        };
        if dtype == DType::Bool {
            continue;
        }
        let at = &by_base[&key];
        let base_multiple = multiples.get(key.1.index()).copied().unwrap_or(1);
        let mut offsets: Vec<i128> = at.keys().copied().collect();
        offsets.sort_unstable();
        let mut taken: FxHashSet<i128> = FxHashSet::default();
        for &start in &offsets {
            if taken.contains(&start) {
                continue;
            }
            for width in [8u8, 4, 2] {
                let w = i128::from(width);
                let fits = usize::from(width) * dtype.size_bytes() <= max_bytes
                    && u64::from(width) <= base_multiple
                    && start.rem_euclid(w) == 0
                    && (start..start + w).all(|o| at.contains_key(&o) && !taken.contains(&o));
                if fits {
                    taken.extend(start..start + w);
                    out.push((start..start + w).map(|o| at[&o]).collect());
                    break;
                }
            }
        }
    }
    out
}

/// `index` as a base value plus a constant: `add(base, c)` (either order) gives `(base,
/// c)`, anything else `(index, 0)`.
fn split_offset(kernel: &Kernel, index: Value) -> (Value, i128) {
    let constant = |v: Value| match kernel.insts.get(v.index()) {
        Some(Inst::Const(c)) => int_value(*c),
        _ => None,
    };
    if let Some(Inst::Binary(BinaryOp::Add, a, b)) = kernel.insts.get(index.index()) {
        if let Some(c) = constant(*b) {
            return (*a, c);
        }
        if let Some(c) = constant(*a) {
            return (*b, c);
        }
    }
    (index, 0)
}

/// The vector width of each instruction's value (1 for scalars and non-values).
fn widths(kernel: &Kernel) -> Vec<u8> {
    let mut w = vec![1u8; kernel.insts.len()];
    for (i, inst) in kernel.insts.iter().enumerate() {
        let of = |v: &Value| w.get(v.index()).copied().unwrap_or(1);
        w[i] = match inst {
            Inst::Load { width, .. } => *width,
            Inst::Vectorize(lanes) => lanes.len() as u8,
            Inst::Unary(_, a)
            | Inst::Binary(_, a, _)
            | Inst::Cast(a, _)
            | Inst::Bitcast(a, _)
            | Inst::Ternary(TernaryOp::MulAdd, a, _, _) => of(a),
            Inst::Ternary(TernaryOp::Where, _, b, _) => of(b),
            _ => 1,
        };
    }
    w
}

/// The largest power of two (up to 64) known to divide each integer value: 1 where
/// nothing is known. Wrapping arithmetic keeps these (a power of two up to 2³² divides a
/// wrapped product or sum of multiples of it), and so does truncating to a narrower
/// integer type.
pub(crate) fn multiples(kernel: &Kernel) -> Vec<u64> {
    const CAP: u64 = 64;
    let pow2 = |c: i128| -> u64 {
        if c == 0 {
            CAP
        } else {
            (1u64 << c.trailing_zeros().min(6)).min(CAP)
        }
    };
    let mut m = vec![1u64; kernel.insts.len()];
    for (i, inst) in kernel.insts.iter().enumerate() {
        let of = |v: &Value| m.get(v.index()).copied().unwrap_or(1);
        m[i] = match inst {
            Inst::Const(c) => int_value(*c).map_or(1, pow2),
            Inst::Binary(BinaryOp::Mul, a, b) => of(a).saturating_mul(of(b)).min(CAP),
            Inst::Binary(BinaryOp::Add | BinaryOp::Sub, a, b) => of(a).min(of(b)),
            // `a % b` is `a - b * q`.
            Inst::Binary(BinaryOp::Rem, a, b) => of(a).min(of(b)),
            Inst::Binary(BinaryOp::Shl, a, b) => match kernel.insts.get(b.index()) {
                Some(Inst::Const(c)) => int_value(*c)
                    .filter(|s| (0..6).contains(s))
                    .map_or(of(a), |s| of(a).saturating_mul(1 << s).min(CAP)),
                _ => of(a),
            },
            Inst::Ternary(TernaryOp::MulAdd, a, b, c) => {
                of(a).saturating_mul(of(b)).min(CAP).min(of(c))
            }
            Inst::Cast(a, dtype) if dtype.is_int() => of(a),
            _ => 1,
        };
    }
    m
}
