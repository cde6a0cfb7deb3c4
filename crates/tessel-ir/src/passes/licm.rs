//! Loop-invariant code motion.

use super::{Rewriter, is_speculatable};
use crate::kernel::{Inst, Kernel, Value};

/// Hoists pure instructions whose operands are all defined outside a `Range` to just
/// before that `Range`, as far out as they can go in one step: an instruction invariant in
/// several nested loops leaves all of them.
///
/// Hoisting never crosses an `If`: code moves out of loops only, so it runs under the same
/// conditions as before (one more time at most if the loop body never runs, which pure
/// instructions make harmless). Loads are not pure and never move, and neither does a
/// bitcast to `bool`, the one pure op that can fail, since a loop that never runs would
/// otherwise start failing.
pub fn licm(kernel: &Kernel) -> Kernel {
    let n = kernel.insts.len();
    // The number of blocks around each value's final position (a block's own value counts
    // the block), and the `Range` each hoisted instruction goes in front of.
    let mut level = vec![0usize; n];
    let mut anchor: Vec<Option<usize>> = vec![None; n];
    // The open blocks, outermost first: (opener index, whether it is a `Range`).
    let mut open: Vec<(usize, bool)> = Vec::new();
    for (i, inst) in kernel.insts.iter().enumerate() {
        match inst {
            Inst::Range { .. } | Inst::If(_) => {
                open.push((i, matches!(inst, Inst::Range { .. })));
                level[i] = open.len();
            }
            Inst::EndRange(_) | Inst::EndIf(_) => {
                open.pop();
                level[i] = open.len();
            }
            _ if is_speculatable(inst) => {
                // The outermost level reachable by leaving only `Range`s...
                let floor = open
                    .iter()
                    .rposition(|&(_, is_range)| !is_range)
                    .map_or(0, |at| at + 1);
                // ...that still sees every operand where it ends up.
                let needed = inst
                    .operands()
                    .iter()
                    .map(|v| level.get(v.index()).copied().unwrap_or(usize::MAX))
                    .max()
                    .unwrap_or(0);
                let target = floor.max(needed);
                if target < open.len() {
                    anchor[i] = Some(open[target].0);
                    level[i] = target;
                } else {
                    level[i] = open.len();
                }
            }
            _ => level[i] = open.len(),
        }
    }
    // Instructions hoisted in front of each `Range`, in their original order, which keeps
    // every operand before its users.
    let mut hoisted: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, at) in anchor.iter().enumerate() {
        if let Some(at) = *at {
            hoisted[at].push(i);
        }
    }
    let mut rw = Rewriter::new(kernel);
    for i in 0..n {
        for &h in &hoisted[i] {
            rw.copy(Value(h as u32));
        }
        if anchor[i].is_none() {
            rw.copy(Value(i as u32));
        }
    }
    rw.finish()
}
