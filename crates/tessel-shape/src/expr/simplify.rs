//! Canonicalization: every constructor of [`Expr`](super::Expr) lands here.

use std::cmp::Ordering;

use rustc_hash::FxHashMap;

use super::{Expr, Interner, Node, Repr, Var};

#[derive(Clone, Default)]
pub(super) struct Poly {
    constant: i64,
    terms: Vec<(Vec<Expr>, i64)>,
}

impl Poly {
    pub(super) fn constant(c: i64) -> Self {
        Self {
            constant: c,
            terms: Vec::new(),
        }
    }

    pub(super) fn scaled(mut self, k: i64) -> Self {
        self.constant = self.constant.wrapping_mul(k);
        for (_, c) in &mut self.terms {
            *c = c.wrapping_mul(k);
        }
        self
    }

    pub(super) fn coeff_gcd(&self) -> i64 {
        self.terms.iter().fold(0, |g, &(_, c)| gcd(g, c))
    }
}

pub(super) fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a as i64
}

pub(super) fn floor_div(a: i64, b: i64) -> Option<i64> {
    let q = a.checked_div(b)?;
    Some(if a % b != 0 && (a < 0) != (b < 0) {
        q - 1
    } else {
        q
    })
}

pub(super) fn floor_mod(a: i64, b: i64) -> Option<i64> {
    Some(a.wrapping_sub(b.wrapping_mul(floor_div(a, b)?)))
}

impl Interner {
    // -- polynomials -------------------------------------------------------------------

    pub(super) fn poly(&self, e: Expr) -> Poly {
        match e.0 {
            Repr::Const(c) => Poly::constant(c),
            Repr::Node(id) => match self.node(id) {
                Node::Sum { constant, terms } => Poly {
                    constant: *constant,
                    terms: terms.iter().map(|&(t, c)| (self.factors(t), c)).collect(),
                },
                _ => Poly {
                    constant: 0,
                    terms: vec![(self.factors(e), 1)],
                },
            },
        }
    }

    /// The atoms of a monomial expression.
    pub(super) fn factors(&self, e: Expr) -> Vec<Expr> {
        match e.0 {
            Repr::Node(id) => match self.node(id) {
                Node::Prod(fs) => fs.to_vec(),
                _ => vec![e],
            },
            Repr::Const(_) => unreachable!("a monomial is never constant"),
        }
    }

    pub(super) fn build_poly(&mut self, mut p: Poly) -> Expr {
        for (m, _) in &mut p.terms {
            m.sort_by(|&a, &b| self.cmp(a, b));
        }
        p.terms.sort_by(|a, b| self.cmp_monomials(&a.0, &b.0));
        let mut terms: Vec<(Vec<Expr>, i64)> = Vec::with_capacity(p.terms.len());
        for (m, c) in p.terms {
            match terms.last_mut() {
                Some((last, lc)) if *last == m => *lc = lc.wrapping_add(c),
                _ => terms.push((m, c)),
            }
        }
        terms.retain(|&(_, c)| c != 0);
        if let Some(p) = self.recombine_div_mod(&terms, p.constant) {
            return self.build_poly(p);
        }
        if terms.is_empty() {
            return Expr::constant(p.constant);
        }
        let terms: Vec<(Expr, i64)> = terms
            .into_iter()
            .map(|(m, c)| (self.monomial(m), c))
            .collect();
        if p.constant == 0 && terms.len() == 1 && terms[0].1 == 1 {
            return terms[0].0;
        }
        self.intern(Node::Sum {
            constant: p.constant,
            terms: terms.into(),
        })
    }

    /// Finds `k·c·(x / c) + k·(x % c)` among the terms and rewrites it to `k·x`: the
    /// identity that undoes splitting a flat index into coordinates.
    pub(super) fn recombine_div_mod(
        &self,
        terms: &[(Vec<Expr>, i64)],
        constant: i64,
    ) -> Option<Poly> {
        for (i, (m, k)) in terms.iter().enumerate() {
            let [Expr(Repr::Node(id))] = m.as_slice() else {
                continue;
            };
            let Node::Mod(x, c) = *self.node(*id) else {
                continue;
            };
            let Some(&div_id) = self.ids.get(&Node::Div(x, c)) else {
                continue;
            };
            let div = Expr(Repr::Node(div_id));
            let Some(cv) = c.as_const() else { continue };
            let Some(j) = terms
                .iter()
                .position(|(m2, k2)| m2.as_slice() == [div] && *k2 == k.wrapping_mul(cv))
            else {
                continue;
            };
            let mut out = self.poly(x).scaled(*k);
            out.constant = out.constant.wrapping_add(constant);
            out.terms.extend(
                terms
                    .iter()
                    .enumerate()
                    .filter(|&(n, _)| n != i && n != j)
                    .map(|(_, t)| t.clone()),
            );
            return Some(out);
        }
        None
    }

    pub(super) fn monomial(&mut self, factors: Vec<Expr>) -> Expr {
        debug_assert!(!factors.is_empty());
        if factors.len() == 1 {
            factors[0]
        } else {
            self.intern(Node::Prod(factors.into()))
        }
    }

    pub(super) fn add(&mut self, a: Expr, b: Expr) -> Expr {
        let (mut pa, pb) = (self.poly(a), self.poly(b));
        pa.constant = pa.constant.wrapping_add(pb.constant);
        pa.terms.extend(pb.terms);
        self.build_poly(pa)
    }

    pub(super) fn mul(&mut self, a: Expr, b: Expr) -> Expr {
        let (pa, pb) = (self.poly(a), self.poly(b));
        let mut out = Poly::constant(pa.constant.wrapping_mul(pb.constant));
        for (m, c) in &pa.terms {
            out.terms.push((m.clone(), c.wrapping_mul(pb.constant)));
        }
        for (m, c) in &pb.terms {
            out.terms.push((m.clone(), c.wrapping_mul(pa.constant)));
        }
        for (ma, ca) in &pa.terms {
            for (mb, cb) in &pb.terms {
                let mut m = ma.clone();
                m.extend_from_slice(mb);
                out.terms.push((m, ca.wrapping_mul(*cb)));
            }
        }
        self.build_poly(out)
    }

    pub(super) fn scale(&mut self, a: Expr, k: i64) -> Expr {
        let p = self.poly(a).scaled(k);
        self.build_poly(p)
    }

    pub(super) fn sub(&mut self, a: Expr, b: Expr) -> Expr {
        let nb = self.scale(b, -1);
        self.add(a, nb)
    }

    // -- division and modulo -----------------------------------------------------------

    /// Floor division; `None` when the divisor is the constant 0.
    pub(super) fn div(&mut self, a: Expr, b: Expr) -> Option<Expr> {
        match b.as_const() {
            Some(0) => None,
            Some(c) if c < 0 => {
                // a / -c == (-a) / c exactly, so the floor agrees.
                let na = self.scale(a, -1);
                Some(self.div_const(na, -c))
            }
            Some(c) => Some(self.div_const(a, c)),
            None => Some(self.div_symbolic(a, b)),
        }
    }

    pub(super) fn div_const(&mut self, a: Expr, c: i64) -> Expr {
        debug_assert!(c > 0);
        if c == 1 {
            return a;
        }
        if let Some(x) = a.as_const() {
            return Expr::constant(floor_div(x, c).unwrap_or(x));
        }
        // Pull out every multiple of c: floor((c·q + r)/c) == q + floor(r/c).
        let p = self.poly(a);
        let mut quotient = Poly::constant(p.constant.div_euclid(c));
        let mut rest = Poly::constant(p.constant.rem_euclid(c));
        for (m, k) in p.terms {
            if k % c == 0 {
                quotient.terms.push((m, k / c));
            } else {
                rest.terms.push((m, k));
            }
        }
        let q = self.build_poly(quotient);
        let r = self.div_rest(rest, c);
        self.add(q, r)
    }

    /// `floor(rest / c)` where no term of `rest` is a multiple of `c`.
    pub(super) fn div_rest(&mut self, rest: Poly, c: i64) -> Expr {
        if rest.terms.is_empty() {
            return Expr::constant(floor_div(rest.constant, c).unwrap_or(0));
        }
        // Cancel a common factor: floor(g·x / g·m) == floor(x / m).
        let g = gcd(gcd(rest.coeff_gcd(), rest.constant), c);
        if g > 1 {
            let reduced = Poly {
                constant: rest.constant / g,
                terms: rest.terms.into_iter().map(|(m, k)| (m, k / g)).collect(),
            };
            return self.div_rest(reduced, c / g);
        }
        let r = self.build_poly(rest.clone());
        let b = self.bounds(r);
        if let (Some(lo), Some(hi)) = (floor_div(b.lo, c), floor_div(b.hi, c))
            && lo == hi
        {
            return Expr::constant(lo);
        }
        // Drop a small remainder: floor((g·x + s)/c) == floor(x/(c/g)) if g | c, 0 <= s < g.
        if let Some((big, _, g)) = self.split_small_remainder(&rest, c) {
            let x = self.build_poly(big);
            return self.div_const(x, c / g);
        }
        // Nested division: floor(floor(x/c1)/c) == floor(x/(c1·c)).
        if let Repr::Node(id) = r.0
            && let Node::Div(x, d) = *self.node(id)
            && let Some(c1) = d.as_const()
            && let Some(cc) = c1.checked_mul(c)
        {
            return self.div_const(x, cc);
        }
        self.intern(Node::Div(r, Expr::constant(c)))
    }

    /// Splits `p` into `g·x + s` with `g | c`, `1 < g < c` and `0 <= s < g`, trying the
    /// terms with the largest coefficients as `g·x`; returns `x`, `s` and `g`.
    pub(super) fn split_small_remainder(&mut self, p: &Poly, c: i64) -> Option<(Poly, Poly, i64)> {
        let mut terms = p.terms.clone();
        terms.sort_by_key(|&(_, k)| std::cmp::Reverse(k.unsigned_abs()));
        for n_big in 1..=terms.len() {
            let g = terms[..n_big].iter().fold(c, |g, &(_, k)| gcd(g, k));
            if g <= 1 || g >= c {
                continue;
            }
            let small = Poly {
                constant: p.constant,
                terms: terms[n_big..].to_vec(),
            };
            let s = self.build_poly(small.clone());
            let b = self.bounds(s);
            if b.lo >= 0 && b.hi < g {
                let big = Poly {
                    constant: 0,
                    terms: terms[..n_big]
                        .iter()
                        .map(|(m, k)| (m.clone(), k / g))
                        .collect(),
                };
                return Some((big, small, g));
            }
        }
        None
    }

    pub(super) fn div_symbolic(&mut self, a: Expr, b: Expr) -> Expr {
        let bb = self.bounds(b);
        if bb.lo > 0 || bb.hi < 0 {
            if let Some(q) = self.exact_quotient(a, b) {
                return q;
            }
            let ba = self.bounds(a);
            if bb.lo > 0 && ba.lo >= 0 && ba.hi < bb.lo {
                return Expr::constant(0);
            }
        }
        self.intern(Node::Div(a, b))
    }

    /// `a / b` when `b` is a single monomial that divides every term of `a` exactly.
    pub(super) fn exact_quotient(&mut self, a: Expr, b: Expr) -> Option<Expr> {
        let pb = self.poly(b);
        let [(bm, bk)] = pb.terms.as_slice() else {
            return None;
        };
        if pb.constant != 0 {
            return None;
        }
        let pa = self.poly(a);
        if pa.constant != 0 {
            return None;
        }
        let mut q = Poly::default();
        for (m, k) in pa.terms {
            if k % bk != 0 {
                return None;
            }
            let mut rest = m;
            for f in bm {
                let pos = rest.iter().position(|x| x == f)?;
                rest.remove(pos);
            }
            if rest.is_empty() {
                q.constant += k / bk;
            } else {
                q.terms.push((rest, k / bk));
            }
        }
        Some(self.build_poly(q))
    }

    /// Floor modulo; `None` when the divisor is the constant 0.
    pub(super) fn rem(&mut self, a: Expr, b: Expr) -> Option<Expr> {
        match b.as_const() {
            Some(0) => None,
            Some(c) if c < 0 => {
                // a mod -c == -((-a) mod c) under floor semantics.
                let na = self.scale(a, -1);
                let m = self.rem_const(na, -c);
                Some(self.scale(m, -1))
            }
            Some(c) => Some(self.rem_const(a, c)),
            None => Some(self.rem_symbolic(a, b)),
        }
    }

    pub(super) fn rem_const(&mut self, a: Expr, c: i64) -> Expr {
        debug_assert!(c > 0);
        if c == 1 {
            return Expr::constant(0);
        }
        if let Some(x) = a.as_const() {
            return Expr::constant(floor_mod(x, c).unwrap_or(0));
        }
        // (x + c·k) mod c == x mod c.
        let p = self.poly(a);
        let rest = Poly {
            constant: p.constant.rem_euclid(c),
            terms: p.terms.into_iter().filter(|&(_, k)| k % c != 0).collect(),
        };
        self.rem_rest(rest, c)
    }

    pub(super) fn rem_rest(&mut self, rest: Poly, c: i64) -> Expr {
        if rest.terms.is_empty() {
            return Expr::constant(rest.constant);
        }
        // (g·x) mod (g·m) == g·(x mod m).
        let g = gcd(gcd(rest.coeff_gcd(), rest.constant), c);
        if g > 1 {
            let reduced = Poly {
                constant: rest.constant / g,
                terms: rest.terms.into_iter().map(|(m, k)| (m, k / g)).collect(),
            };
            let inner = self.rem_rest(reduced, c / g);
            return self.scale(inner, g);
        }
        let r = self.build_poly(rest.clone());
        let b = self.bounds(r);
        if let (Some(lo), Some(hi)) = (floor_div(b.lo, c), floor_div(b.hi, c))
            && lo == hi
        {
            let shift = Expr::constant(lo.wrapping_mul(c));
            return self.sub(r, shift);
        }
        // (g·x + s) mod c == g·(x mod (c/g)) + s if g | c and 0 <= s < g.
        if let Some((big, small, g)) = self.split_small_remainder(&rest, c) {
            let x = self.build_poly(big);
            let inner = self.rem_const(x, c / g);
            let scaled = self.scale(inner, g);
            let s = self.build_poly(small);
            return self.add(scaled, s);
        }
        // Nested modulo: (x mod k·c) mod c == x mod c.
        if let Repr::Node(id) = r.0
            && let Node::Mod(x, d) = *self.node(id)
            && let Some(c1) = d.as_const()
            && c1 % c == 0
        {
            return self.rem_const(x, c);
        }
        self.intern(Node::Mod(r, Expr::constant(c)))
    }

    pub(super) fn rem_symbolic(&mut self, a: Expr, b: Expr) -> Expr {
        let bb = self.bounds(b);
        if bb.lo > 0 || bb.hi < 0 {
            if self.exact_quotient(a, b).is_some() {
                return Expr::constant(0);
            }
            let ba = self.bounds(a);
            if bb.lo > 0 && ba.lo >= 0 && ba.hi < bb.lo {
                return a;
            }
        }
        self.intern(Node::Mod(a, b))
    }

    // -- min, max, comparisons ---------------------------------------------------------

    pub(super) fn min_max(&mut self, a: Expr, b: Expr, is_min: bool) -> Expr {
        let d = self.sub(a, b);
        let bd = self.bounds(d);
        if bd.hi <= 0 {
            return if is_min { a } else { b };
        }
        if bd.lo >= 0 {
            return if is_min { b } else { a };
        }
        let (a, b) = if self.cmp(a, b) == Ordering::Greater {
            (b, a)
        } else {
            (a, b)
        };
        self.intern(if is_min {
            Node::Min(a, b)
        } else {
            Node::Max(a, b)
        })
    }

    pub(super) fn lt(&mut self, a: Expr, b: Expr) -> Expr {
        let d = self.sub(a, b);
        let bd = self.bounds(d);
        if bd.hi < 0 {
            return Expr::constant(1);
        }
        if bd.lo >= 0 {
            return Expr::constant(0);
        }
        let (lhs, rhs) = self.split_constant(d);
        // `-p < k` is stored as `-k < p`, so the variable side never starts with a minus.
        let p = self.poly(lhs);
        if p.terms.first().is_some_and(|&(_, k)| k < 0) {
            let (lhs, rhs) = (self.scale(rhs, -1), self.scale(lhs, -1));
            return self.intern(Node::Lt(lhs, rhs));
        }
        self.intern(Node::Lt(lhs, rhs))
    }

    pub(super) fn eq(&mut self, a: Expr, b: Expr) -> Expr {
        let d = self.sub(a, b);
        let bd = self.bounds(d);
        if bd.lo == 0 && bd.hi == 0 {
            return Expr::constant(1);
        }
        if !bd.contains(0) {
            return Expr::constant(0);
        }
        let (lhs, rhs) = self.split_constant(d);
        self.intern(Node::Eq(lhs, rhs))
    }

    /// `d` as `lhs - rhs` with `rhs` constant and `lhs` free of a constant term.
    pub(super) fn split_constant(&mut self, d: Expr) -> (Expr, Expr) {
        let mut p = self.poly(d);
        let k = std::mem::take(&mut p.constant);
        (self.build_poly(p), Expr::constant(k.wrapping_neg()))
    }
    // -- traversal ---------------------------------------------------------------------

    pub(super) fn substitute(&mut self, e: Expr, map: &FxHashMap<Var, Expr>) -> Expr {
        let Repr::Node(id) = e.0 else { return e };
        match self.node(id).clone() {
            Node::Var(v) => map.get(&v).copied().unwrap_or(e),
            Node::Sum { constant, terms } => {
                terms.iter().fold(Expr::constant(constant), |acc, &(t, c)| {
                    let t = self.substitute(t, map);
                    let t = self.scale(t, c);
                    self.add(acc, t)
                })
            }
            Node::Prod(fs) => fs.iter().fold(Expr::constant(1), |acc, &f| {
                let f = self.substitute(f, map);
                self.mul(acc, f)
            }),
            // A substituted divisor that becomes 0 keeps the division symbolic, so
            // evaluation reports it instead of a constructor panicking.
            Node::Div(a, b) => {
                let (a, b) = (self.substitute(a, map), self.substitute(b, map));
                self.div(a, b)
                    .unwrap_or_else(|| self.intern(Node::Div(a, b)))
            }
            Node::Mod(a, b) => {
                let (a, b) = (self.substitute(a, map), self.substitute(b, map));
                self.rem(a, b)
                    .unwrap_or_else(|| self.intern(Node::Mod(a, b)))
            }
            Node::Min(a, b) | Node::Max(a, b) => {
                let is_min = matches!(self.node(id), Node::Min(..));
                let (a, b) = (self.substitute(a, map), self.substitute(b, map));
                self.min_max(a, b, is_min)
            }
            Node::Lt(a, b) => {
                let (a, b) = (self.substitute(a, map), self.substitute(b, map));
                self.lt(a, b)
            }
            Node::Eq(a, b) => {
                let (a, b) = (self.substitute(a, map), self.substitute(b, map));
                self.eq(a, b)
            }
        }
    }
}
