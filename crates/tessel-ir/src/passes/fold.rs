//! Constant folding and exact algebraic simplification.

use tessel_shape::{BinaryOp, DType, Scalar, TernaryOp, UnaryOp};

use super::{Rewriter, block_ends};
use crate::kernel::{Inst, Kernel, Special, Value};

/// Folds constants and applies algebraic identities that are exact for every input.
///
/// - An ALU op, cast or bitcast whose operands are all constants becomes the constant
///   [`Scalar`] computes; an op whose evaluation fails (a bitcast of `2u8` to `bool`) is
///   left alone.
/// - Identities hold bit for bit, so most apply to integers (and `bool`) only: `x + 0`,
///   `x * 1`, `x * 0`, `x - x`, ... are not exact on floats, where NaN, `-0.0` and
///   signaling NaNs tell them apart. Identities that return one of two equal operands
///   (`min(x, x)`, `where(c, x, x)`) and same-dtype casts hold for every dtype.
/// - `If` with a constant condition: `true` inlines the body, `false` drops the block.
/// - A `Range` whose constant start is at or past its constant end is dropped.
/// - A built-in index along an axis of constant extent 1 is the constant 0.
///
/// Folding creates constants without deduplicating them; [`cse`](super::cse) merges them.
pub fn fold(kernel: &Kernel) -> Kernel {
    let ends = block_ends(&kernel.insts);
    let mut rw = Rewriter::new(kernel);
    // The `EndIf`s of `If`s whose bodies were inlined.
    let mut inlined = vec![false; kernel.insts.len()];
    let mut i = 0;
    while i < kernel.insts.len() {
        let old = Value(i as u32);
        match &kernel.insts[i] {
            Inst::If(cond) => match rw.constant(rw.value(*cond)) {
                // if true { body } -> body
                Some(Scalar::Bool(true)) => {
                    if let Some(end) = inlined.get_mut(ends[i]) {
                        *end = true;
                    }
                }
                // if false { body } -> nothing
                Some(Scalar::Bool(false)) => {
                    i = ends[i] + 1;
                    continue;
                }
                _ => {
                    rw.copy(old);
                }
            },
            Inst::EndIf(_) if inlined[i] => {}
            Inst::Range { start, end } => {
                let (start, end) = (rw.constant(rw.value(*start)), rw.constant(rw.value(*end)));
                // range s, e with s >= e -> nothing (the body never runs)
                if let (Some(s), Some(e)) = (start, end)
                    && s.binary(BinaryOp::Ge, e) == Ok(Scalar::Bool(true))
                {
                    i = ends[i] + 1;
                    continue;
                }
                rw.copy(old);
            }
            inst if inst.is_pure() => {
                let renamed = rw.renamed(old);
                let new = simplify(&mut rw, renamed);
                rw.set(old, new);
            }
            _ => {
                rw.copy(old);
            }
        }
        i += 1;
    }
    rw.finish()
}

/// What a pure instruction simplifies to.
enum Rewrite {
    /// An existing value.
    Value(Value),
    /// A new constant.
    Const(Scalar),
    /// A simpler instruction, itself simplified in turn.
    Inst(Inst),
}

/// Emits `inst` (operands are new values) in its simplest form and returns its value.
fn simplify(rw: &mut Rewriter<'_>, inst: Inst) -> Value {
    match rewrite(rw, &inst) {
        Some(Rewrite::Value(v)) => v,
        Some(Rewrite::Const(c)) => rw.push(Inst::Const(c)),
        // Only `mad` rewrites to an instruction, a binary one, so this recursion ends.
        Some(Rewrite::Inst(simpler)) => simplify(rw, simpler),
        None => rw.push(inst),
    }
}

/// What `inst` (operands are new values) simplifies to, if anything. May emit constants
/// that the simplified form uses.
fn rewrite(rw: &mut Rewriter<'_>, inst: &Inst) -> Option<Rewrite> {
    match *inst {
        Inst::Special(special, dtype) => {
            let grid = &rw.kernel().grid;
            let extent = match special {
                Special::GroupId(axis) => grid.groups.get(axis as usize),
                Special::LocalId(axis) => grid.local.get(axis as usize),
            };
            // group_id.a -> 0 and local_id.a -> 0 when axis a has extent 1
            (dtype.is_int() && extent?.as_const() == Some(1))
                .then(|| Rewrite::Const(Scalar::zero(dtype)))
        }
        Inst::Unary(op, a) => unary(rw, op, a),
        Inst::Binary(op, a, b) => binary(rw, op, a, b),
        Inst::Ternary(op, a, b, c) => ternary(rw, op, a, b, c),
        Inst::Cast(a, dtype) => {
            if let Some(c) = rw.constant(a) {
                // cast(c) -> c'
                return Some(Rewrite::Const(c.cast(dtype)));
            }
            // cast(x: d, d) -> x (a same-dtype cast keeps the bits)
            (rw.ty(a)?.dtype == dtype).then_some(Rewrite::Value(a))
        }
        Inst::Bitcast(a, dtype) => {
            if let Some(c) = rw.constant(a) {
                // bitcast(c) -> c', unless the bits are no valid value of the dtype
                return c.bitcast(dtype).ok().map(Rewrite::Const);
            }
            // bitcast(x: d, d) -> x
            (rw.ty(a)?.dtype == dtype).then_some(Rewrite::Value(a))
        }
        Inst::Extract(v, lane) => match rw.inst(v)? {
            // extract(vec(x0, .., xn), i) -> xi
            Inst::Vectorize(lanes) => lanes.get(lane as usize).copied().map(Rewrite::Value),
            // extract(x, 0) -> x for a scalar x
            _ => (lane == 0 && rw.ty(v)?.width == 1).then_some(Rewrite::Value(v)),
        },
        _ => None,
    }
}

/// The dtype classes the identities depend on.
#[derive(Clone, Copy)]
struct Class {
    /// An integer dtype: two's complement arithmetic, wrapping.
    int: bool,
    /// An integer dtype or `bool`: every op is exact, and `bool`'s `add`/`mul` are `or`/`and`.
    logic: bool,
    /// A scalar (identities that create a constant need one, since constants are scalars).
    scalar: bool,
}

fn class(rw: &Rewriter<'_>, v: Value) -> Option<(DType, Class)> {
    let ty = rw.ty(v)?;
    let int = ty.dtype.is_int();
    Some((
        ty.dtype,
        Class {
            int,
            logic: int || ty.dtype.is_bool(),
            scalar: ty.width == 1,
        },
    ))
}

fn unary(rw: &Rewriter<'_>, op: UnaryOp, a: Value) -> Option<Rewrite> {
    if let Some(c) = rw.constant(a) {
        // op(c) -> c'
        return c.unary(op).ok().map(Rewrite::Const);
    }
    let (_, k) = class(rw, a)?;
    let inner = rw.inst(a);
    match (op, inner) {
        // not(not(x)) -> x on integers and bool
        (UnaryOp::Not, Some(&Inst::Unary(UnaryOp::Not, x))) if k.logic => Some(Rewrite::Value(x)),
        // neg(neg(x)) -> x on integers (wrapping negation is an involution)
        (UnaryOp::Neg, Some(&Inst::Unary(UnaryOp::Neg, x))) if k.int => Some(Rewrite::Value(x)),
        // floor(x) -> x, ceil(x) -> x, round(x) -> x, trunc(x) -> x on integers
        (UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc, _) if k.int => {
            Some(Rewrite::Value(a))
        }
        _ => None,
    }
}

fn binary(rw: &Rewriter<'_>, op: BinaryOp, a: Value, b: Value) -> Option<Rewrite> {
    use BinaryOp as B;
    use Rewrite::{Const, Value as Val};
    let (ca, cb) = (rw.constant(a), rw.constant(b));
    if let (Some(x), Some(y)) = (ca, cb) {
        // c1 op c2 -> c
        return x.binary(op, y).ok().map(Const);
    }
    let (dtype, k) = class(rw, a)?;
    let (zero, one) = (Scalar::zero(dtype), Scalar::one(dtype));
    // All bits set (`true` for bool); only used where `k.logic` holds.
    let ones = zero.unary(UnaryOp::Not).unwrap_or(zero);
    let is = |c: Option<Scalar>, want: Scalar| c == Some(want);
    let either = |want: Scalar| is(ca, want) || is(cb, want);
    let same = a == b;
    Some(match op {
        // x+0 -> x, 0+x -> x (on bool, add is or: x|false -> x)
        B::Add if k.logic && is(cb, zero) => Val(a),
        B::Add if k.logic && is(ca, zero) => Val(b),
        // x|true -> true on bool
        B::Add if dtype.is_bool() && k.scalar && either(one) => Const(one),
        // x-0 -> x
        B::Sub if k.int && is(cb, zero) => Val(a),
        // x-x -> 0
        B::Sub if k.int && k.scalar && same => Const(zero),
        // x*1 -> x, 1*x -> x (on bool, mul is and: x&true -> x)
        B::Mul if k.logic && is(cb, one) => Val(a),
        B::Mul if k.logic && is(ca, one) => Val(b),
        // x*0 -> 0, 0*x -> 0 (integers only: NaN*0 is NaN and -1.0*0 is -0.0)
        B::Mul if k.logic && k.scalar && either(zero) => Const(zero),
        // x/1 -> x
        B::Div if k.int && is(cb, one) => Val(a),
        // x%1 -> 0
        B::Rem if k.int && k.scalar && is(cb, one) => Const(zero),
        // x&0 -> 0, 0&x -> 0
        B::And if k.logic && k.scalar && either(zero) => Const(zero),
        // x&!0 -> x, !0&x -> x
        B::And if k.logic && is(cb, ones) => Val(a),
        B::And if k.logic && is(ca, ones) => Val(b),
        // x|0 -> x, 0|x -> x, x^0 -> x, 0^x -> x
        B::Or | B::Xor if k.logic && is(cb, zero) => Val(a),
        B::Or | B::Xor if k.logic && is(ca, zero) => Val(b),
        // x|!0 -> !0, !0|x -> !0
        B::Or if k.logic && k.scalar && either(ones) => Const(ones),
        // x&x -> x, x|x -> x
        B::And | B::Or if k.logic && same => Val(a),
        // x^x -> 0
        B::Xor if k.logic && k.scalar && same => Const(zero),
        // x<<0 -> x, x>>0 -> x
        B::Shl | B::Shr if k.int && is(cb, zero) => Val(a),
        // 0<<x -> 0, 0>>x -> 0
        B::Shl | B::Shr if k.int && k.scalar && is(ca, zero) => Const(zero),
        // max(x, x) -> x, min(x, x) -> x (any dtype: the result is one of two equal operands)
        B::Max | B::Min if same => Val(a),
        // x==x -> true, x<=x -> true, x>=x -> true (integers and bool; NaN != NaN)
        B::Eq | B::Le | B::Ge if k.logic && k.scalar && same => Const(Scalar::Bool(true)),
        // x!=x -> false, x<x -> false, x>x -> false
        B::Ne | B::Lt | B::Gt if k.logic && k.scalar && same => Const(Scalar::Bool(false)),
        _ => return None,
    })
}

fn ternary(rw: &mut Rewriter<'_>, op: TernaryOp, a: Value, b: Value, c: Value) -> Option<Rewrite> {
    let consts = (rw.constant(a), rw.constant(b), rw.constant(c));
    if let (Some(x), Some(y), Some(z)) = consts {
        // op(c1, c2, c3) -> c
        return Scalar::ternary(op, x, y, z).ok().map(Rewrite::Const);
    }
    match op {
        TernaryOp::Where => match consts.0 {
            // where(true, x, y) -> x, where(false, x, y) -> y
            Some(Scalar::Bool(cond)) => Some(Rewrite::Value(if cond { b } else { c })),
            // where(cond, x, x) -> x
            _ => (b == c).then_some(Rewrite::Value(b)),
        },
        TernaryOp::MulAdd => {
            let (dtype, k) = class(rw, a)?;
            if !k.logic {
                return None;
            }
            let (zero, one) = (Scalar::zero(dtype), Scalar::one(dtype));
            let is = |x: Option<Scalar>, want: Scalar| x == Some(want);
            Some(if is(consts.0, zero) || is(consts.1, zero) {
                // mad(0, y, z) -> z, mad(x, 0, z) -> z
                Rewrite::Value(c)
            } else if is(consts.0, one) {
                // mad(1, y, z) -> y + z
                Rewrite::Inst(Inst::Binary(BinaryOp::Add, b, c))
            } else if is(consts.1, one) {
                // mad(x, 1, z) -> x + z
                Rewrite::Inst(Inst::Binary(BinaryOp::Add, a, c))
            } else if is(consts.2, zero) {
                // mad(x, y, 0) -> x * y
                Rewrite::Inst(Inst::Binary(BinaryOp::Mul, a, b))
            } else if let (Some(x), Some(y)) = (consts.0, consts.1)
                && let Ok(product) = x.binary(BinaryOp::Mul, y)
            {
                // mad(c1, c2, z) -> (c1 * c2) + z (not on floats, where mad rounds once)
                let product = rw.push(Inst::Const(product));
                Rewrite::Inst(Inst::Binary(BinaryOp::Add, product, c))
            } else {
                return None;
            })
        }
    }
}
