//! The built-in rule set, one table; each rule says why it is sound and for which dtypes.
//!
//! "Exact" means the rewritten form computes the same bits as the original on every input
//! (NaN payloads aside), as [`Scalar`] defines the ops. Two rules are exact only in real
//! arithmetic and are flagged: `exp-log` and the `sum-*` pair on floats.

use std::sync::LazyLock;

use tessel_shape::{BinaryOp, DType, Dim, Scalar, Shape, TernaryOp, UnaryOp};

use super::rewrite::is_permutation;
use super::{ClassId, Condition, EGraph, ENode, Match, Rewrite, RewriteError};
use crate::graph::{NodeId, Op, ReduceOp};

static RULES: LazyLock<Vec<Rewrite>> = LazyLock::new(build);

/// The built-in rewrites, each sound for the dtypes it fires on:
///
/// | rule                 | rewrite                          | fires on                      |
/// |----------------------|----------------------------------|-------------------------------|
/// | `mul-one`, `one-mul` | `x * 1`, `1 * x` → `x`           | every dtype                   |
/// | `add-zero`, `zero-add` | `x + 0`, `0 + x` → `x`         | not floats, or `x` sign-clear |
/// | `add-neg-zero`, `neg-zero-add` | `x + -0`, `-0 + x` → `x` | floats                  |
/// | `sub-zero`           | `x - 0` → `x`                    | every dtype `sub` supports    |
/// | `sub-self`           | `x - x` → `0`                    | integers                      |
/// | `neg-neg`            | `-(-x)` → `x`                    | every dtype `neg` supports    |
/// | `exp-log`            | `exp(log x)` → `x`               | floats, `x` sign-clear (\*)   |
/// | `permute-id`         | identity permute → operand       | every dtype                   |
/// | `permute-permute`    | two permutes → one, or operand   | every dtype                   |
/// | `reshape-reshape`    | two reshapes → one               | every dtype                   |
/// | `reshape-id`, `expand-id` | to the operand's shape → operand | every dtype              |
/// | `sum-add`, `sum-split` | `sum a + sum b` ↔ `sum (a + b)` | every dtype (\*)            |
/// | `matmul-transpose`   | `(A·B)ᵀ` → `Bᵀ·Aᵀ`               | every dtype                   |
/// | `const-fold`         | an op on constants → its value   | where devices match `Scalar`  |
///
/// (\*) Exact on integers and bool; on floats exact in real arithmetic only (rounding).
/// Sign-clear is the e-class analysis described in [`egraph`](crate::egraph).
pub fn rules() -> &'static [Rewrite] {
    &RULES
}

type Built = Result<Rewrite, RewriteError>;

fn rw(name: &'static str, lhs: &'static str, rhs: &'static str, when: &[Condition]) -> Built {
    Rewrite::new(name, lhs, rhs, when)
}

fn rw_fn(
    name: &'static str,
    lhs: &'static str,
    rhs: fn(&mut EGraph, &Match) -> Option<ClassId>,
) -> Built {
    Rewrite::with_fn(name, lhs, rhs, &[])
}

#[rustfmt::skip]
fn build() -> Vec<Rewrite> {
    use Condition::{IdentityPerm, Integer, NotNegZero, SameShape, SignClear};
    let table: Vec<Built> = vec![
        // x * 1 = x: exact on every dtype (NaN * 1 = NaN, -0 * 1 = -0; bool: x and true).
        rw("mul-one",         "(mul ?x 1)",      "?x", &[]),
        rw("one-mul",         "(mul 1 ?x)",      "?x", &[]),
        // x + 0 = x: exact on integers and bool (x or false); on floats only where x has
        // no -0 (-0 + +0 = +0), i.e. sign-clear x.
        rw("add-zero",        "(add ?x 0)",      "?x", &[NotNegZero("?x")]),
        rw("zero-add",        "(add 0 ?x)",      "?x", &[NotNegZero("?x")]),
        // x + -0 = x: exact on floats, the only dtypes with a -0.
        rw("add-neg-zero",    "(add ?x -0)",     "?x", &[]),
        rw("neg-zero-add",    "(add -0 ?x)",     "?x", &[]),
        // x - 0 = x: exact on every dtype sub supports (-0 - +0 = -0).
        rw("sub-zero",        "(sub ?x 0)",      "?x", &[]),
        // x - x = 0: integers only (wrapping). Floats: inf - inf and NaN - NaN are NaN;
        // sub is not defined on bool.
        rw("sub-self",        "(sub ?x ?x)",     "0",  &[Integer("?x")]),
        // -(-x) = x: exact on floats (two sign flips) and integers (wrapping: -MIN = MIN).
        rw("neg-neg",         "(neg (neg ?x))",  "?x", &[]),
        // exp(log x) = x for sign-clear x (floats only: exp and log are): log +0 = -inf
        // and exp -inf = +0, NaN stays NaN, +inf stays +inf. FLAGGED: for positive x exact
        // in real arithmetic only; the rewritten form skips two roundings (and the
        // original's overflow to inf for x within an ulp of the dtype's max).
        rw("exp-log",         "(exp (log ?x))",  "?x", &[SignClear("?x")]),
        // Movement composition: exact on every dtype (only coordinates change).
        rw("permute-id",      "(permute $p ?x)", "?x", &[IdentityPerm("$p")]),
        rw_fn("permute-permute", "(permute $q (permute $p ?x))", compose_permutes),
        rw("reshape-reshape", "(reshape (reshape ?x))", "(reshape ?x)", &[]),
        rw("reshape-id",      "(reshape ?x)",    "?x", &[SameShape("?x", "root")]),
        rw("expand-id",       "(expand ?x)",     "?x", &[SameShape("?x", "root")]),
        // sum a + sum b = sum (a + b), same axes and operand shapes, both ways: exact on
        // integers (wrapping addition is associative) and bool (or). FLAGGED: floats up to
        // rounding (the additions are reassociated).
        rw("sum-add",   "(add (reduce-sum $ax ?a) (reduce-sum $ax ?b))",
                        "(reduce-sum $ax (add ?a ?b))",                   &[SameShape("?a", "?b")]),
        rw("sum-split", "(reduce-sum $ax (add ?a ?b))",
                        "(add (reduce-sum $ax ?a) (reduce-sum $ax ?b))",  &[]),
        // (A·B)ᵀ = Bᵀ·Aᵀ: a product read transposed is the product of the transposed
        // operands, in the other order. Exact on every dtype: each element sums the same
        // products (multiplication commutes exactly) over k in the same order.
        rw_fn("matmul-transpose",
              "(permute $p (reshape (reduce-sum $ax (mul (expand ?a) (expand ?b)))))",
              |egraph, m| Some(transposed_product(egraph, m)?.0)),
        // Constant folding through Scalar: see `folded`.
        Ok(Rewrite::custom("const-fold", |egraph, class, node| {
            egraph.class(class).constant().is_none() && folded(egraph, node).is_some()
        }, fold)),
    ];
    table
        .into_iter()
        .filter_map(|rule| {
            rule.map_err(|e| {
                debug_assert!(false, "{e}");
                tracing::error!(target: "tessel::egraph", "built-in {e}");
            })
            .ok()
        })
        .collect()
}

/// `permute(permute(x, p), q)`: axis `k` of the result is axis `q[k]` of the inner
/// permute, which is axis `p[q[k]]` of `x`. The identity composition is `x` itself.
fn compose_permutes(egraph: &mut EGraph, m: &Match) -> Option<ClassId> {
    let (q, p, x) = (
        m.subst.axes("$q")?,
        m.subst.axes("$p")?,
        m.subst.class("?x")?,
    );
    let composed: Box<[usize]> = q
        .iter()
        .map(|&k| p.get(k).copied())
        .collect::<Option<_>>()?;
    if !is_permutation(&composed, composed.len()) {
        return None;
    }
    if composed.iter().enumerate().all(|(i, &a)| i == a) {
        return Some(x);
    }
    let (root, inner) = (egraph.class(m.class), egraph.class(x));
    let (dtype, shape) = (root.dtype(), root.shape().clone());
    let shape_ok = composed
        .iter()
        .zip(shape.iter())
        .all(|(&a, d)| inner.shape().get(a) == Some(d));
    debug_assert!(shape_ok, "permute composition {composed:?} of {:?}", m.node);
    shape_ok.then(|| egraph.add(ENode::new(Op::Permute(x.operand(), composed), dtype, shape)))
}

/// `matmul-transpose`'s right-hand side for a match of its searcher: `Tensor::matmul`
/// records `reshape(sum_k(expand(a) * expand(b)))` over a space `[..batch, m, k, n]`, with
/// `a: [.., m, k, 1]`, `b: [.., 1, k, n]`; read through a permute swapping its last two
/// axes it equals the same recording over `[..batch, n, k, m]` with operands
/// `rev(b): [.., n, k, 1]` and `rev(a): [.., 1, k, m]`, `rev` reversing the last three axes.
/// Returns the new form's class and its e-nodes, outermost first (the transposed form
/// prefers them).
pub(super) fn transposed_product(egraph: &mut EGraph, m: &Match) -> Option<(ClassId, Vec<ENode>)> {
    let (p, ax) = (m.subst.axes("$p")?, m.subst.axes("$ax")?);
    let (a, b) = (m.subst.class("?a")?, m.subst.class("?b")?);
    let (root, dtype) = (
        egraph.class(m.class).shape().clone(),
        egraph.class(m.class).dtype(),
    );
    let (sa, sb) = (
        egraph.class(a).shape().clone(),
        egraph.class(b).shape().clone(),
    );
    let rank = sa.ndim().checked_sub(3)?;
    let one = Dim::constant(1);
    let (dm, dk, dn) = (sa[rank], sa[rank + 1], sb[rank + 2]);
    let is_swap = p.len() >= 2
        && p[..p.len() - 2].iter().enumerate().all(|(i, &x)| i == x)
        && p[p.len() - 2..] == [p.len() - 1, p.len() - 2];
    if !is_swap
        || ax != [rank + 1]
        || sb.ndim() != rank + 3
        || sa[rank + 2] != one
        || sb[rank] != one
        || sb[rank + 1] != dk
        || root.ndim() < 2
        || root[root.ndim() - 2..] != [dn, dm]
        || egraph.class(a).dtype() != dtype
        || egraph.class(b).dtype() != dtype
    {
        return None;
    }
    // The batch: each axis `a`'s size unless `a` broadcasts it.
    let batch: Vec<Dim> = (0..rank)
        .map(|i| if sa[i] == one { sb[i] } else { sa[i] })
        .collect();
    let non_unit = |d: &[Dim]| d.iter().filter(|d| **d != one).copied().collect::<Vec<_>>();
    if non_unit(&batch) != non_unit(&root[..root.ndim() - 2]) {
        return None;
    }
    let rev: Box<[usize]> = (0..rank).chain([rank + 2, rank + 1, rank]).collect();
    let reversed = |s: &Shape| -> Shape { rev.iter().map(|&i| s[i]).collect() };
    let space: Shape = batch.iter().copied().chain([dn, dk, dm]).collect();
    let mut nodes = Vec::new();
    let mut add = |egraph: &mut EGraph, node: ENode| {
        nodes.push(node.clone());
        egraph.add(node)
    };
    let mut operand = |egraph: &mut EGraph, c: ClassId, s: &Shape| {
        let permuted = add(
            egraph,
            ENode::new(Op::Permute(c.operand(), rev.clone()), dtype, reversed(s)),
        );
        if reversed(s) == space {
            permuted
        } else {
            add(
                egraph,
                ENode::new(Op::Expand(permuted.operand()), dtype, space.clone()),
            )
        }
    };
    let (lhs, rhs) = (operand(egraph, b, &sb), operand(egraph, a, &sa));
    let product = ENode::new(
        Op::Binary(BinaryOp::Mul, lhs.operand(), rhs.operand()),
        dtype,
        space.clone(),
    );
    let product = add(egraph, product);
    let kept: Shape = batch.iter().copied().chain([dn, one, dm]).collect();
    let sum = ENode::new(
        Op::Reduce(ReduceOp::Sum, product.operand(), ax.into()),
        dtype,
        kept,
    );
    let sum = add(egraph, sum);
    let out = add(egraph, ENode::new(Op::Reshape(sum.operand()), dtype, root));
    nodes.reverse();
    Some((out, nodes))
}

/// Replaces a foldable e-node by its constant (see [`folded`]).
fn fold(egraph: &mut EGraph, m: &Match) -> Option<ClassId> {
    let value = folded(egraph, &m.node)?;
    let node = ENode::new(Op::Const(value), m.node.dtype(), m.node.shape().clone());
    Some(egraph.add(node))
}

/// The constant an e-node over constant classes equals, where every backend computes that
/// value exactly as [`Scalar`] does:
/// - integers and `bool`: every op (`Scalar` defines wrapping, division by zero, shifts
///   past the width, and the emitters guard to match);
/// - floats: ops IEEE 754 rounds correctly on every backend: `neg`, `abs`, `sign`, the
///   rounding ops, `isnan`, `isinf`, `add`, `sub`, `mul`, `max`, `min`, comparisons,
///   `where`, casts (except `f64` to `f16`/`bf16`, which Tessel rounds once and a device
///   may round twice) and bitcasts. Not `div`, `rem`, `pow`, `recip`, `sqrt`, `rsqrt`,
///   the transcendentals or a float `mad`: WGSL and OpenCL allow ulps of error (and
///   unfused `mad`) there, so the device result may differ from Rust's;
/// - movement of a constant (reshape, permute, expand, flip, shrink, and a pad with the
///   same value) is that constant in the new shape.
///
/// Denormals: a device that flushes them may differ from the folded value there.
fn folded(egraph: &EGraph, node: &ENode) -> Option<Scalar> {
    let konst = |c: &NodeId| egraph.class(ClassId::of_operand(*c)).constant();
    let value = match node.op() {
        Op::Unary(op, a) => {
            let a = konst(a)?;
            let exact = matches!(
                op,
                UnaryOp::Neg
                    | UnaryOp::Abs
                    | UnaryOp::Sign
                    | UnaryOp::Floor
                    | UnaryOp::Ceil
                    | UnaryOp::Round
                    | UnaryOp::Trunc
                    | UnaryOp::IsNan
                    | UnaryOp::IsInf
            );
            if a.dtype().is_float() && !exact {
                return None;
            }
            a.unary(*op).ok()?
        }
        Op::Binary(op, a, b) => {
            let (a, b) = (konst(a)?, konst(b)?);
            let exact = op.is_comparison()
                || matches!(
                    op,
                    BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min
                );
            if a.dtype().is_float() && !exact {
                return None;
            }
            a.binary(*op, b).ok()?
        }
        Op::Ternary(op, a, b, c) => {
            let (a, b, c) = (konst(a)?, konst(b)?, konst(c)?);
            if *op == TernaryOp::MulAdd && a.dtype().is_float() {
                return None;
            }
            Scalar::ternary(*op, a, b, c).ok()?
        }
        Op::Cast(a) => {
            let a = konst(a)?;
            if a.dtype() == DType::F64 && matches!(node.dtype(), DType::F16 | DType::BF16) {
                return None;
            }
            a.cast(node.dtype())
        }
        Op::Bitcast(a) => konst(a)?.bitcast(node.dtype()).ok()?,
        Op::Reshape(a) | Op::Permute(a, _) | Op::Expand(a) | Op::Flip(a, _) | Op::Shrink(a, _) => {
            konst(a)?
        }
        Op::Pad(a, _, pad) => {
            let a = konst(a)?;
            if a != pad.cast(node.dtype()) {
                return None;
            }
            a
        }
        Op::Leaf(_)
        | Op::Const(_)
        | Op::Index(_)
        | Op::Random(..)
        | Op::Custom(..)
        | Op::Reduce(..)
        | Op::Gather(..)
        | Op::Scatter(..)
        | Op::Argsort(_) => return None,
    };
    (value.dtype() == node.dtype()).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_rule_builds() {
        let names: Vec<&str> = rules().iter().map(Rewrite::name).collect();
        assert_eq!(names.len(), 19, "{names:?}");
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "rule names are unique");
    }
}
