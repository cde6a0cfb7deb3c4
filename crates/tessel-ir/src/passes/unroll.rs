//! Full unrolling of small constant loops.

use std::ops::Range;

use tessel_shape::Scalar;

use super::{Rewriter, block_ends, int_value};
use crate::kernel::{Inst, Kernel, Value};

/// Replaces each `Range` with constant bounds and at most `max_trip` iterations by that many
/// copies of its body, the loop variable replaced in each by its constant value.
///
/// A loop whose body contains a `Barrier` stays a loop, as do the loops around it: the
/// schedule put the barrier in a loop on purpose (tiles are loaded, synchronized and
/// consumed once per iteration), and replicating it only grows the code. A `DefineReg` in
/// a body is fine to copy: its registers are zeroed each time the definition runs, so
/// no iteration sees another's, and each copy gets its own.
///
/// Each loop is judged on its own, inner loops as well as the loops around them, so a nest
/// of small loops unrolls completely and the copies multiply: `max_trip` bounds each
/// loop's trip count, not the code size. Bounds are read as the copies are made, so an
/// inner loop whose bound is an unrolled outer loop's variable unrolls too. A loop of zero
/// iterations disappears.
///
/// The copies repeat the body's constants and index math; [`fold`](super::fold) and
/// [`cse`](super::cse) clean them up.
pub fn unroll(kernel: &Kernel, max_trip: usize) -> Kernel {
    let ends = block_ends(&kernel.insts);
    let blocked = blocked_loops(kernel, &ends);
    let mut unroller = Unroller {
        rw: Rewriter::new(kernel),
        ends,
        blocked,
        max_trip: max_trip as i128,
    };
    unroller.region(0..kernel.insts.len());
    unroller.rw.finish()
}

/// For each `Range`, whether its body holds a barrier, which keeps it a loop.
fn blocked_loops(kernel: &Kernel, ends: &[usize]) -> Vec<bool> {
    let n = kernel.insts.len();
    // `Range`s open at each point, innermost last; a barrier marks all of them.
    let mut open: Vec<usize> = Vec::new();
    let mut blocked = vec![false; n];
    for (i, inst) in kernel.insts.iter().enumerate() {
        match inst {
            Inst::Range { .. } => open.push(i),
            Inst::EndRange(v) if open.last() == Some(&v.index()) => {
                open.pop();
            }
            Inst::Barrier => {
                for &r in &open {
                    blocked[r] = true;
                }
            }
            _ => {}
        }
    }
    // A loop never closed (malformed) is never unrolled.
    for (i, inst) in kernel.insts.iter().enumerate() {
        if matches!(inst, Inst::Range { .. }) && ends[i] >= n {
            blocked[i] = true;
        }
    }
    blocked
}

struct Unroller<'k> {
    rw: Rewriter<'k>,
    ends: Vec<usize>,
    blocked: Vec<bool>,
    max_trip: i128,
}

impl Unroller<'_> {
    /// Emits the input instructions in `range`, unrolling the loops it holds.
    fn region(&mut self, range: Range<usize>) {
        let mut i = range.start;
        while i < range.end {
            let old = Value(i as u32);
            if let Inst::Range { start, end } = self.rw.kernel().insts[i]
                && let Some(values) = self.trip_values(i, start, end)
            {
                let body = i + 1..self.ends[i];
                // range k0..kn { body(k) } -> body(k0); ..; body(kn - 1)
                for k in values {
                    let value = self.rw.push(Inst::Const(k));
                    self.rw.set(old, value);
                    self.region(body.clone());
                }
                i = self.ends[i] + 1;
            } else {
                self.rw.copy(old);
                i += 1;
            }
        }
    }

    /// The loop variable's values, if the `Range` at `i` is to be unrolled.
    fn trip_values(&self, i: usize, start: Value, end: Value) -> Option<Vec<Scalar>> {
        if self.blocked[i] {
            return None;
        }
        let first = self.rw.constant(self.rw.value(start))?;
        let last = self.rw.constant(self.rw.value(end))?;
        let dtype = first.dtype();
        let (first, last) = (int_value(first)?, int_value(last)?);
        if last.saturating_sub(first) > self.max_trip {
            return None;
        }
        // Every k lies between two values of the dtype, so the wrapping cast is exact.
        Some(
            (first..last)
                .map(|k| Scalar::U64(k as u64).cast(dtype))
                .collect(),
        )
    }
}
