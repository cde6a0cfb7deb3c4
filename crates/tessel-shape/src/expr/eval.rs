//! Bounds, evaluation and the text form of expressions.

use std::cmp::Ordering;
use std::fmt;

use super::simplify::{floor_div, floor_mod};
use super::{Bindings, Bounds, Expr, Interner, Node, Repr, Var};

impl Interner {
    // -- bounds ------------------------------------------------------------------------

    pub(super) fn node_bounds(&self, node: &Node) -> Bounds {
        match node {
            Node::Var(v) => {
                let info = &self.vars[v.0 as usize];
                Bounds {
                    lo: info.lo,
                    hi: info.hi,
                }
            }
            Node::Sum { constant, terms } => terms.iter().fold(
                Bounds {
                    lo: *constant,
                    hi: *constant,
                },
                |acc, &(t, c)| {
                    let b = scale_bounds(self.bounds(t), c);
                    Bounds {
                        lo: acc.lo.saturating_add(b.lo),
                        hi: acc.hi.saturating_add(b.hi),
                    }
                },
            ),
            Node::Prod(factors) => factors
                .iter()
                .map(|&f| self.bounds(f))
                .reduce(mul_bounds)
                .unwrap_or(Bounds { lo: 1, hi: 1 }),
            Node::Div(a, b) => div_bounds(self.bounds(*a), self.bounds(*b)),
            Node::Mod(a, b) => mod_bounds(self.bounds(*a), self.bounds(*b)),
            Node::Min(a, b) => {
                let (a, b) = (self.bounds(*a), self.bounds(*b));
                Bounds {
                    lo: a.lo.min(b.lo),
                    hi: a.hi.min(b.hi),
                }
            }
            Node::Max(a, b) => {
                let (a, b) = (self.bounds(*a), self.bounds(*b));
                Bounds {
                    lo: a.lo.max(b.lo),
                    hi: a.hi.max(b.hi),
                }
            }
            Node::Lt(..) | Node::Eq(..) => Bounds { lo: 0, hi: 1 },
        }
    }
    pub(super) fn collect_vars(&self, e: Expr, out: &mut Vec<Var>) {
        let Repr::Node(id) = e.0 else { return };
        match self.node(id) {
            Node::Var(v) => {
                if !out.contains(v) {
                    out.push(*v);
                }
            }
            Node::Sum { terms, .. } => terms.iter().for_each(|&(t, _)| self.collect_vars(t, out)),
            Node::Prod(fs) => fs.iter().for_each(|&f| self.collect_vars(f, out)),
            Node::Div(a, b)
            | Node::Mod(a, b)
            | Node::Min(a, b)
            | Node::Max(a, b)
            | Node::Lt(a, b)
            | Node::Eq(a, b) => {
                self.collect_vars(*a, out);
                self.collect_vars(*b, out);
            }
        }
    }

    pub(super) fn eval(&self, e: Expr, bindings: &Bindings) -> Result<i64, EvalFailure> {
        let id = match e.0 {
            Repr::Const(c) => return Ok(c),
            Repr::Node(id) => id,
        };
        let ev = |x: Expr| self.eval(x, bindings);
        let overflow = EvalFailure::Overflow;
        Ok(match self.node(id) {
            Node::Var(v) => {
                let info = &self.vars[v.0 as usize];
                let value = bindings.get(*v).ok_or(EvalFailure::Unbound(*v))?;
                if value < info.lo || value > info.hi {
                    return Err(EvalFailure::OutOfBounds(*v, value));
                }
                value
            }
            Node::Sum { constant, terms } => {
                let mut acc = *constant;
                for &(t, c) in terms {
                    let term = ev(t)?.checked_mul(c).ok_or(overflow)?;
                    acc = acc.checked_add(term).ok_or(overflow)?;
                }
                acc
            }
            Node::Prod(fs) => {
                let mut acc = 1i64;
                for &f in fs {
                    acc = acc.checked_mul(ev(f)?).ok_or(overflow)?;
                }
                acc
            }
            Node::Div(a, b) => {
                let (a, b) = (ev(*a)?, ev(*b)?);
                if b == 0 {
                    return Err(EvalFailure::DivisionByZero);
                }
                floor_div(a, b).ok_or(overflow)?
            }
            Node::Mod(a, b) => {
                let (a, b) = (ev(*a)?, ev(*b)?);
                if b == 0 {
                    return Err(EvalFailure::DivisionByZero);
                }
                floor_mod(a, b).ok_or(overflow)?
            }
            Node::Min(a, b) => ev(*a)?.min(ev(*b)?),
            Node::Max(a, b) => ev(*a)?.max(ev(*b)?),
            Node::Lt(a, b) => i64::from(ev(*a)? < ev(*b)?),
            Node::Eq(a, b) => i64::from(ev(*a)? == ev(*b)?),
        })
    }
    // -- text form ---------------------------------------------------------------------

    /// Writes `e`, parenthesized if its precedence is below `min_prec`
    /// (0: comparison, 1: sum, 2: product/division, 3: atom).
    pub(super) fn write(&self, f: &mut fmt::Formatter<'_>, e: Expr, min_prec: u8) -> fmt::Result {
        let id = match e.0 {
            Repr::Const(c) if c < 0 && min_prec > 1 => return write!(f, "({c})"),
            Repr::Const(c) => return write!(f, "{c}"),
            Repr::Node(id) => id,
        };
        let node = self.node(id);
        let prec = match node {
            Node::Lt(..) | Node::Eq(..) => 0,
            Node::Sum { .. } => 1,
            Node::Prod(_) | Node::Div(..) | Node::Mod(..) => 2,
            Node::Var(_) | Node::Min(..) | Node::Max(..) => 3,
        };
        if prec < min_prec {
            f.write_str("(")?;
            self.write(f, e, 0)?;
            return f.write_str(")");
        }
        match node {
            Node::Var(v) => f.write_str(&self.vars[v.0 as usize].name),
            Node::Sum { constant, terms } => {
                for (i, &(t, c)) in terms.iter().enumerate() {
                    match (i, c < 0) {
                        (0, true) => f.write_str("-")?,
                        (0, false) => {}
                        (_, true) => f.write_str(" - ")?,
                        (_, false) => f.write_str(" + ")?,
                    }
                    // `(x / 4)*3`, never `x / 4*3`, which C would read as `x / 12`.
                    let is_prod =
                        matches!(t.0, Repr::Node(tid) if matches!(self.node(tid), Node::Prod(_)));
                    // Likewise `-(x % 4)`, since a unary minus binds tighter than `%`.
                    let bare = c == 1 || (c == -1 && i > 0);
                    let prec = if bare || is_prod { 2 } else { 3 };
                    self.write(f, t, prec)?;
                    if c.unsigned_abs() != 1 {
                        write!(f, "*{}", c.unsigned_abs())?;
                    }
                }
                match constant.cmp(&0) {
                    Ordering::Greater => write!(f, " + {constant}"),
                    Ordering::Less => write!(f, " - {}", constant.unsigned_abs()),
                    Ordering::Equal => Ok(()),
                }
            }
            Node::Prod(fs) => {
                for (i, &x) in fs.iter().enumerate() {
                    if i > 0 {
                        f.write_str("*")?;
                    }
                    self.write(f, x, 3)?;
                }
                Ok(())
            }
            Node::Div(a, b) | Node::Mod(a, b) => {
                self.write(f, *a, 3)?;
                f.write_str(if matches!(node, Node::Div(..)) {
                    " / "
                } else {
                    " % "
                })?;
                self.write(f, *b, 3)
            }
            Node::Min(a, b) | Node::Max(a, b) => {
                f.write_str(if matches!(node, Node::Min(..)) {
                    "min("
                } else {
                    "max("
                })?;
                self.write(f, *a, 0)?;
                f.write_str(", ")?;
                self.write(f, *b, 0)?;
                f.write_str(")")
            }
            Node::Lt(a, b) | Node::Eq(a, b) => {
                self.write(f, *a, 1)?;
                f.write_str(if matches!(node, Node::Lt(..)) {
                    " < "
                } else {
                    " == "
                })?;
                self.write(f, *b, 1)
            }
        }
    }
}

#[derive(Clone, Copy)]
pub(super) enum EvalFailure {
    Unbound(Var),
    OutOfBounds(Var, i64),
    DivisionByZero,
    Overflow,
}

pub(super) fn scale_bounds(b: Bounds, k: i64) -> Bounds {
    let (x, y) = (b.lo.saturating_mul(k), b.hi.saturating_mul(k));
    Bounds {
        lo: x.min(y),
        hi: x.max(y),
    }
}

pub(super) fn mul_bounds(a: Bounds, b: Bounds) -> Bounds {
    let c = [
        a.lo.saturating_mul(b.lo),
        a.lo.saturating_mul(b.hi),
        a.hi.saturating_mul(b.lo),
        a.hi.saturating_mul(b.hi),
    ];
    Bounds {
        lo: *c.iter().min().expect("four corners"),
        hi: *c.iter().max().expect("four corners"),
    }
}

pub(super) fn div_bounds(a: Bounds, b: Bounds) -> Bounds {
    if b.lo > 0 || b.hi < 0 {
        // floor(x/y) is monotone in each argument while y keeps its sign: corners suffice.
        let c = [(a.lo, b.lo), (a.lo, b.hi), (a.hi, b.lo), (a.hi, b.hi)]
            .map(|(x, y)| floor_div(x, y).unwrap_or(i64::MAX));
        return Bounds {
            lo: *c.iter().min().expect("four corners"),
            hi: *c.iter().max().expect("four corners"),
        };
    }
    // |floor(x/y)| <= |x| for every non-zero integer y.
    let m =
        a.lo.unsigned_abs()
            .max(a.hi.unsigned_abs())
            .min(i64::MAX as u64) as i64;
    Bounds { lo: -m, hi: m }
}

pub(super) fn mod_bounds(a: Bounds, b: Bounds) -> Bounds {
    if b.lo > 0 {
        if b.lo == b.hi
            && let (Some(qlo), Some(qhi)) = (floor_div(a.lo, b.lo), floor_div(a.hi, b.lo))
            && qlo == qhi
        {
            return Bounds {
                lo: a.lo - qlo * b.lo,
                hi: a.hi - qlo * b.lo,
            };
        }
        let hi = b.hi - 1;
        return Bounds {
            lo: 0,
            hi: if a.lo >= 0 { hi.min(a.hi) } else { hi },
        };
    }
    // The result has the divisor's sign and is smaller than it in magnitude.
    Bounds {
        lo: b.lo.saturating_add(1).min(0),
        hi: b.hi.saturating_sub(1).max(0),
    }
}
