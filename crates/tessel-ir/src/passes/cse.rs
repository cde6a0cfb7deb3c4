//! Common subexpression elimination.

use rustc_hash::FxHashMap;
use tessel_shape::{BinaryOp, DType, Scalar, TernaryOp, UnaryOp};

use super::Rewriter;
use crate::kernel::{Inst, Kernel, Special, Value};

/// Replaces each pure instruction that repeats an earlier one still in scope (the same
/// opcode on the same operands) by that earlier one.
///
/// Only [pure](Inst::is_pure) instructions merge: two loads of one address may see
/// different memory. A value defined in a block is forgotten when the block ends, so a
/// duplicate after the block keeps its own instruction. Operands of commutative ops are
/// compared in either order on integers and `bool`, but not on floats, where `a + b` and
/// `b + a` may differ in which NaN payload they return.
pub fn cse(kernel: &Kernel) -> Kernel {
    let mut rw = Rewriter::new(kernel);
    let mut seen: FxHashMap<Key, Value> = FxHashMap::default();
    // The keys first seen in each open block (the kernel's top level first), forgotten
    // when the block ends.
    let mut scopes: Vec<Vec<Key>> = vec![Vec::new()];
    for (i, inst) in kernel.insts.iter().enumerate() {
        let old = Value(i as u32);
        match inst {
            Inst::Range { .. } | Inst::If(_) => {
                rw.copy(old);
                scopes.push(Vec::new());
            }
            Inst::EndRange(_) | Inst::EndIf(_) => {
                if scopes.len() > 1
                    && let Some(keys) = scopes.pop()
                {
                    for key in keys {
                        seen.remove(&key);
                    }
                }
                rw.copy(old);
            }
            _ => {
                let renamed = rw.renamed(old);
                let Some(key) = Key::of(&rw, &renamed) else {
                    rw.copy(old);
                    continue;
                };
                if let Some(&earlier) = seen.get(&key) {
                    rw.set(old, earlier);
                } else {
                    let new = rw.push(renamed);
                    rw.set(old, new);
                    if let Some(scope) = scopes.last_mut() {
                        scope.push(key.clone());
                    }
                    seen.insert(key, new);
                }
            }
        }
    }
    rw.finish()
}

/// A pure instruction's identity: its opcode and (new) operands, with commutative operands
/// in a canonical order where that is exact.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Key {
    Const(Scalar),
    DimParam(usize),
    Special(Special, DType),
    Unary(UnaryOp, Value),
    Binary(BinaryOp, Value, Value),
    Ternary(TernaryOp, Value, Value, Value),
    Cast(Value, DType),
    Bitcast(Value, DType),
    Vectorize(Vec<Value>),
    Extract(Value, u8),
}

impl Key {
    /// The key of `inst` (operands are new values), or `None` if it is not pure.
    fn of(rw: &Rewriter<'_>, inst: &Inst) -> Option<Key> {
        Some(match inst {
            Inst::Const(c) => Key::Const(*c),
            Inst::DimParam(p) => Key::DimParam(*p),
            Inst::Special(s, d) => Key::Special(*s, *d),
            Inst::Unary(op, a) => Key::Unary(*op, *a),
            Inst::Binary(op, a, b) => {
                // a op b == b op a, bit for bit, for commutative ops on integers and bool.
                let exact = op.is_commutative() && rw.ty(*a).is_some_and(|t| !t.dtype.is_float());
                if exact && b < a {
                    Key::Binary(*op, *b, *a)
                } else {
                    Key::Binary(*op, *a, *b)
                }
            }
            Inst::Ternary(op, a, b, c) => Key::Ternary(*op, *a, *b, *c),
            Inst::Cast(a, d) => Key::Cast(*a, *d),
            Inst::Bitcast(a, d) => Key::Bitcast(*a, *d),
            Inst::Vectorize(lanes) => Key::Vectorize(lanes.clone()),
            Inst::Extract(v, lane) => Key::Extract(*v, *lane),
            Inst::Range { .. }
            | Inst::EndRange(_)
            | Inst::If(_)
            | Inst::EndIf(_)
            | Inst::DefineLocal { .. }
            | Inst::DefineReg { .. }
            | Inst::Load { .. }
            | Inst::Store { .. }
            | Inst::Atomic { .. }
            | Inst::Barrier => return None,
        })
    }
}
