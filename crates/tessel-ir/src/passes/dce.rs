//! Dead code elimination.

use super::{Rewriter, block_ends};
use crate::kernel::{Inst, Kernel, Mem, Value};

/// Removes every instruction that cannot affect a global buffer.
///
/// What stays: stores to global buffers, barriers, and everything they depend on. A store
/// to local memory or registers stays only if some load that stays reads that memory, so a
/// `DefineLocal` or `DefineReg` nobody reads goes together with its stores (a workgroup
/// array written and never read, an accumulator whose total is never stored). A block
/// stays if anything inside it stays. Unused pure values and unused loads go (a load has
/// no effect; it is not [pure](Inst::is_pure) only because it may not move past stores).
///
/// Liveness is the least fixpoint: memory starts unread, and each sweep over the kernel
/// (backwards, so one sweep settles every value given which memories are read) may find
/// more memories read, until a sweep finds no new one.
pub fn dce(kernel: &Kernel) -> Kernel {
    let ends = block_ends(&kernel.insts);
    let mut read = vec![false; kernel.insts.len()];
    let live = loop {
        let live = sweep(kernel, &ends, &read);
        let mut now_read = vec![false; kernel.insts.len()];
        for (inst, _) in kernel.insts.iter().zip(&live).filter(|(_, live)| **live) {
            if let Inst::Load {
                mem: Mem::Local(v) | Mem::Reg(v),
                ..
            } = inst
                && let Some(r) = now_read.get_mut(v.index())
            {
                *r = true;
            }
        }
        if now_read == read {
            break live;
        }
        read = now_read;
    };
    let mut rw = Rewriter::new(kernel);
    for (i, _) in live.iter().enumerate().filter(|(_, live)| **live) {
        rw.copy(Value(i as u32));
    }
    rw.finish()
}

/// Which instructions are live, given which memories (by defining instruction) are read.
fn sweep(kernel: &Kernel, ends: &[usize], read: &[bool]) -> Vec<bool> {
    let n = kernel.insts.len();
    let mut live = vec![false; n];
    let mut used = vec![false; n];
    // Live instructions seen so far (from the end), and that count at each block's end,
    // so a block's opener can tell whether anything inside it is live.
    let mut live_count = 0usize;
    let mut count_at_end = vec![0usize; n];
    for i in (0..n).rev() {
        let inst = &kernel.insts[i];
        let is_live = match inst {
            // Decided by the opener: a block's end stays with its start.
            Inst::EndRange(_) | Inst::EndIf(_) => {
                count_at_end[i] = live_count;
                false
            }
            // A block is live when its body is; one never closed (malformed) is kept.
            Inst::Range { .. } | Inst::If(_) => ends[i] >= n || live_count > count_at_end[ends[i]],
            Inst::Store { mem, .. } => match *mem {
                Mem::Global(_) => true,
                Mem::Local(v) | Mem::Reg(v) => read.get(v.index()).copied().unwrap_or(true),
            },
            Inst::Barrier | Inst::Atomic { .. } => true,
            // Pure values, loads and memory definitions live through their users.
            _ => used[i],
        };
        if !is_live {
            continue;
        }
        live[i] = true;
        live_count += 1;
        for op in inst.operands() {
            if let Some(u) = used.get_mut(op.index()) {
                *u = true;
            }
        }
        if matches!(inst, Inst::Range { .. } | Inst::If(_))
            && let Some(end) = live.get_mut(ends[i])
        {
            *end = true;
        }
    }
    live
}
