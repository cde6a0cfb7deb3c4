//! Symbolic integer expressions: dimensions and index arithmetic.
//!
//! An [`Expr`] is a handle to a hash-consed node in one process-wide interner, so equal
//! expressions are the same handle: comparing and hashing cost a word. Constants live in
//! the handle itself and never touch the interner, which keeps shape checks on concrete
//! tensors lock-free.
//!
//! Every constructor returns a canonical form, which is what makes `==` meaningful:
//! - sums and products are polynomials: a constant plus `coefficient·monomial` terms, each
//!   monomial a sorted product of *atoms* (variables, divisions, moduli, min/max,
//!   comparisons); products distribute over sums, so `2*(b + 1) == 2*b + 2`;
//! - division and modulo are floor-based (Python's `//` and `%`); by a constant they pull out
//!   every multiple of the divisor (`(x*a + y) / a == x + y / a`), cancel common factors,
//!   drop a remainder smaller than a factor of the divisor, and fold to a constant or to
//!   the dividend when variable bounds decide (`(x % 8) / 8 == 0`);
//! - `min`, `max` and comparisons fold whenever the bounds of the difference decide them.
//!
//! Terms are ordered structurally (by kind, then variable names, then children), never
//! by interning order, so the text form is the same in every process and thread.
//!
//! Interned nodes live for the life of the process. Index and shape expressions repeat
//! across realizations, so the interner stays small in practice.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Rem, Sub, SubAssign};
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use rustc_hash::FxHashMap;

use crate::ShapeError;

mod eval;
mod parse;
mod simplify;

use eval::EvalFailure;
use simplify::{floor_div, floor_mod};

/// A symbolic integer expression, canonical and hash-consed.
///
/// Arithmetic operators build new expressions; `/` and `%` are **floor** division and
/// modulo (Python's semantics), which agree with C's truncating ones whenever the dividend
/// is non-negative. Like Rust's integer division, `/` and `%` panic on a constant zero
/// divisor; [`Expr::checked_div`] and [`Expr::checked_rem`] return `None` instead.
///
/// ```
/// use tessel_shape::{Expr, Var};
/// let b = Expr::from(Var::new("b", 1, 32).unwrap());
/// assert_eq!(2 * (b + 1), b * 2 + 2);
/// assert_eq!((b * 4 + 3) / 4, b);
/// assert_eq!(b.max(0), b);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Expr(Repr);

/// The dimension of a tensor: a symbolic expression, most often a constant.
pub type Dim = Expr;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Repr {
    Const(i64),
    Node(NodeId),
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct NodeId(u32);

/// A named integer variable with inclusive bounds, such as a dynamic batch size.
///
/// Variables are interned by name *and* bounds: two `Var::new("n", 1, 8)` calls give the
/// same variable, while `Var::new("n", 1, 16)` is a different one that prints the same.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Var(u32);

/// The top-level structure of an [`Expr`], as [`Expr::view`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExprView {
    /// An integer constant.
    Const(i64),
    /// A variable.
    Var(Var),
    /// `constant + Σ coefficient·term`.
    Sum {
        /// The constant term.
        constant: i64,
        /// Each term with its non-zero coefficient.
        terms: Vec<(Expr, i64)>,
    },
    /// The product of two or more factors.
    Prod(Vec<Expr>),
    /// Floor division.
    Div(Expr, Expr),
    /// Floor modulo (the result has the divisor's sign).
    Mod(Expr, Expr),
    /// The smaller value.
    Min(Expr, Expr),
    /// The larger value.
    Max(Expr, Expr),
    /// `lhs < rhs`, as 0 or 1.
    Lt(Expr, Expr),
    /// `lhs == rhs`, as 0 or 1.
    Eq(Expr, Expr),
}

/// An inclusive interval `lo..=hi` that contains every value an expression can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// The smallest possible value.
    pub lo: i64,
    /// The largest possible value.
    pub hi: i64,
}

impl Bounds {
    /// Whether `value` lies in the interval.
    pub fn contains(self, value: i64) -> bool {
        self.lo <= value && value <= self.hi
    }
}

/// Values for variables, used by [`Expr::eval`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bindings {
    values: FxHashMap<Var, i64>,
}

impl Bindings {
    /// No variable bound.
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds `var` to `value`, replacing an earlier binding. Bounds are checked at eval.
    pub fn set(&mut self, var: Var, value: i64) -> &mut Self {
        self.values.insert(var, value);
        self
    }

    /// Builder form of [`Bindings::set`].
    #[must_use]
    pub fn with(mut self, var: Var, value: i64) -> Self {
        self.set(var, value);
        self
    }

    /// The value bound to `var`, if any.
    pub fn get(&self, var: Var) -> Option<i64> {
        self.values.get(&var).copied()
    }

    /// Every binding, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Var, i64)> + '_ {
        self.values.iter().map(|(&var, &value)| (var, value))
    }

    /// Whether no variable is bound.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl FromIterator<(Var, i64)> for Bindings {
    fn from_iter<I: IntoIterator<Item = (Var, i64)>>(iter: I) -> Self {
        Self {
            values: iter.into_iter().collect(),
        }
    }
}

/// Why an expression could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// A variable has no value in the bindings.
    #[error("variable `{name}` is not bound; bind it before evaluating `{expr}`")]
    Unbound {
        /// The variable's name.
        name: String,
        /// The expression being evaluated.
        expr: String,
    },
    /// A bound value lies outside the variable's declared bounds.
    #[error("variable `{name}` = {value} is outside its bounds {lo}..={hi}")]
    OutOfBounds {
        /// The variable's name.
        name: String,
        /// The value it was bound to.
        value: i64,
        /// Its declared lower bound.
        lo: i64,
        /// Its declared upper bound.
        hi: i64,
    },
    /// A divisor evaluated to zero.
    #[error("division by zero while evaluating `{expr}`")]
    DivisionByZero {
        /// The expression being evaluated.
        expr: String,
    },
    /// An intermediate value does not fit in `i64`.
    #[error("integer overflow while evaluating `{expr}`")]
    Overflow {
        /// The expression being evaluated.
        expr: String,
    },
}

// ---------------------------------------------------------------------------------------
// The interner
// ---------------------------------------------------------------------------------------

/// A node's structure. Children are canonical expressions; see the module docs for the
/// invariants each variant keeps.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Node {
    Var(Var),
    /// `constant + Σ coeff·monomial`: monomials are atoms or `Prod`s, sorted structurally,
    /// unique, with non-zero coefficients; never a bare constant or a bare monomial.
    Sum {
        constant: i64,
        terms: Box<[(Expr, i64)]>,
    },
    /// At least two atoms (never sums, products or constants), sorted; repeats allowed.
    Prod(Box<[Expr]>),
    /// Floor division; a constant divisor is always > 1.
    Div(Expr, Expr),
    /// Floor modulo; a constant divisor is always > 1.
    Mod(Expr, Expr),
    Min(Expr, Expr),
    Max(Expr, Expr),
    /// `lhs < rhs` as 0 or 1: one side is a constant, the other has no constant term and
    /// a positive leading coefficient.
    Lt(Expr, Expr),
    /// `lhs == rhs` as 0 or 1; `rhs` is a constant and `lhs` has no constant term.
    Eq(Expr, Expr),
}

struct VarInfo {
    name: Arc<str>,
    lo: i64,
    hi: i64,
}

#[derive(Default)]
struct Interner {
    /// Node structure and its bounds, indexed by `NodeId`.
    nodes: Vec<(Node, Bounds)>,
    /// Node structure → its id: the hash-consing table.
    ids: FxHashMap<Node, NodeId>,
    /// Variable name and bounds, indexed by `Var`.
    vars: Vec<VarInfo>,
    /// `(name, lo, hi)` → variable.
    var_ids: HashMap<(Arc<str>, i64, i64), Var>,
}

static INTERNER: LazyLock<RwLock<Interner>> = LazyLock::new(RwLock::default);

// The interner is only mutated by appending fully built nodes, so a panic elsewhere while
// the lock is held cannot leave it inconsistent: a poisoned lock is safe to reuse.
fn read<R>(f: impl FnOnce(&Interner) -> R) -> R {
    f(&INTERNER.read().unwrap_or_else(PoisonError::into_inner))
}

fn write<R>(f: impl FnOnce(&mut Interner) -> R) -> R {
    f(&mut INTERNER.write().unwrap_or_else(PoisonError::into_inner))
}

/// The polynomial working form: `constant + Σ coeff·Π atoms`.
fn kind_rank(node: &Node) -> u8 {
    match node {
        Node::Var(_) => 0,
        Node::Prod(_) => 1,
        Node::Sum { .. } => 2,
        Node::Div(..) => 3,
        Node::Mod(..) => 4,
        Node::Min(..) => 5,
        Node::Max(..) => 6,
        Node::Lt(..) => 7,
        Node::Eq(..) => 8,
    }
}

impl Interner {
    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize].0
    }

    fn bounds(&self, e: Expr) -> Bounds {
        match e.0 {
            Repr::Const(c) => Bounds { lo: c, hi: c },
            Repr::Node(id) => self.nodes[id.0 as usize].1,
        }
    }

    fn intern(&mut self, node: Node) -> Expr {
        if let Some(&id) = self.ids.get(&node) {
            return Expr(Repr::Node(id));
        }
        let bounds = self.node_bounds(&node);
        let id = NodeId(u32::try_from(self.nodes.len()).expect("more than 2^32 symbolic nodes"));
        self.nodes.push((node.clone(), bounds));
        self.ids.insert(node, id);
        Expr(Repr::Node(id))
    }

    fn var(&mut self, name: &str, lo: i64, hi: i64) -> Var {
        let name: Arc<str> = name.into();
        if let Some(&v) = self.var_ids.get(&(name.clone(), lo, hi)) {
            return v;
        }
        let v = Var(u32::try_from(self.vars.len()).expect("more than 2^32 variables"));
        self.vars.push(VarInfo {
            name: name.clone(),
            lo,
            hi,
        });
        self.var_ids.insert((name, lo, hi), v);
        v
    }

    // -- structural order --------------------------------------------------------------

    fn cmp(&self, a: Expr, b: Expr) -> Ordering {
        if a == b {
            return Ordering::Equal;
        }
        let (ia, ib) = match (a.0, b.0) {
            (Repr::Const(x), Repr::Const(y)) => return x.cmp(&y),
            // Constants last, so `min(x, 5)` and `x < 5` read naturally.
            (Repr::Const(_), Repr::Node(_)) => return Ordering::Greater,
            (Repr::Node(_), Repr::Const(_)) => return Ordering::Less,
            (Repr::Node(x), Repr::Node(y)) => (x, y),
        };
        let (na, nb) = (self.node(ia), self.node(ib));
        kind_rank(na)
            .cmp(&kind_rank(nb))
            .then_with(|| match (na, nb) {
                (Node::Var(x), Node::Var(y)) => {
                    let (x, y) = (&self.vars[x.0 as usize], &self.vars[y.0 as usize]);
                    (&x.name, x.lo, x.hi).cmp(&(&y.name, y.lo, y.hi))
                }
                (
                    Node::Sum {
                        constant: ca,
                        terms: ta,
                    },
                    Node::Sum {
                        constant: cb,
                        terms: tb,
                    },
                ) => self.cmp_slices(ta, tb, |&(t, c)| (t, c)).then(ca.cmp(cb)),
                (Node::Prod(fa), Node::Prod(fb)) => self.cmp_slices(fa, fb, |&f| (f, 0)),
                (Node::Div(a0, a1), Node::Div(b0, b1))
                | (Node::Mod(a0, a1), Node::Mod(b0, b1))
                | (Node::Min(a0, a1), Node::Min(b0, b1))
                | (Node::Max(a0, a1), Node::Max(b0, b1))
                | (Node::Lt(a0, a1), Node::Lt(b0, b1))
                | (Node::Eq(a0, a1), Node::Eq(b0, b1)) => {
                    self.cmp(*a0, *b0).then_with(|| self.cmp(*a1, *b1))
                }
                _ => unreachable!("nodes of equal rank have equal kinds"),
            })
    }

    fn cmp_slices<T>(&self, a: &[T], b: &[T], key: impl Fn(&T) -> (Expr, i64)) -> Ordering {
        for (x, y) in a.iter().zip(b) {
            let ((ex, cx), (ey, cy)) = (key(x), key(y));
            let ord = self.cmp(ex, ey).then(cx.cmp(&cy));
            if ord != Ordering::Equal {
                return ord;
            }
        }
        a.len().cmp(&b.len())
    }

    fn cmp_monomials(&self, a: &[Expr], b: &[Expr]) -> Ordering {
        self.cmp_slices(a, b, |&f| (f, 0))
    }
}

// ---------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------

impl Var {
    /// A variable named `name` taking values in `lo..=hi`.
    ///
    /// ```
    /// let batch = tessel_shape::Var::new("batch", 1, 4096).unwrap();
    /// assert_eq!(&*batch.name(), "batch");
    /// assert!(tessel_shape::Var::new("n", 5, 4).is_err());
    /// ```
    pub fn new(name: &str, lo: i64, hi: i64) -> Result<Var, ShapeError> {
        if lo > hi {
            return Err(ShapeError::InvalidVarBounds {
                name: name.to_owned(),
                lo,
                hi,
            });
        }
        Ok(write(|i| i.var(name, lo, hi)))
    }

    /// The variable's name.
    pub fn name(self) -> Arc<str> {
        read(|i| i.vars[self.0 as usize].name.clone())
    }

    /// The variable's declared bounds.
    pub fn bounds(self) -> Bounds {
        read(|i| {
            let v = &i.vars[self.0 as usize];
            Bounds { lo: v.lo, hi: v.hi }
        })
    }
}

impl Expr {
    /// The constant `v`.
    pub const fn constant(v: i64) -> Expr {
        Expr(Repr::Const(v))
    }

    /// The value, if the expression is a constant.
    pub const fn as_const(self) -> Option<i64> {
        match self.0 {
            Repr::Const(c) => Some(c),
            Repr::Node(_) => None,
        }
    }

    /// Whether the expression is a constant.
    pub const fn is_const(self) -> bool {
        matches!(self.0, Repr::Const(_))
    }

    /// The expression's top-level structure, for lowering it into code.
    ///
    /// ```
    /// use tessel_shape::{Expr, ExprView, Var};
    /// let n = Expr::from(Var::new("n", 0, 9).unwrap());
    /// assert!(matches!((n % 4).view(), ExprView::Mod(a, b) if a == n && b == Expr::constant(4)));
    /// ```
    pub fn view(self) -> ExprView {
        let Repr::Node(id) = self.0 else {
            return ExprView::Const(self.as_const().unwrap_or_default());
        };
        read(|i| match i.node(id) {
            Node::Var(v) => ExprView::Var(*v),
            Node::Sum { constant, terms } => ExprView::Sum {
                constant: *constant,
                terms: terms.to_vec(),
            },
            Node::Prod(fs) => ExprView::Prod(fs.to_vec()),
            Node::Div(a, b) => ExprView::Div(*a, *b),
            Node::Mod(a, b) => ExprView::Mod(*a, *b),
            Node::Min(a, b) => ExprView::Min(*a, *b),
            Node::Max(a, b) => ExprView::Max(*a, *b),
            Node::Lt(a, b) => ExprView::Lt(*a, *b),
            Node::Eq(a, b) => ExprView::Eq(*a, *b),
        })
    }

    /// The variable, if the expression is exactly one variable.
    pub fn as_var(self) -> Option<Var> {
        let Repr::Node(id) = self.0 else { return None };
        read(|i| match i.node(id) {
            Node::Var(v) => Some(*v),
            _ => None,
        })
    }

    /// Floor division, `None` when `rhs` is the constant 0.
    pub fn checked_div(self, rhs: impl Into<Expr>) -> Option<Expr> {
        let rhs = rhs.into();
        match (self.0, rhs.0) {
            (_, Repr::Const(0)) => None,
            (Repr::Const(a), Repr::Const(b)) => floor_div(a, b).map(Expr::constant),
            _ => write(|i| i.div(self, rhs)),
        }
    }

    /// Floor modulo (the result has the divisor's sign), `None` when `rhs` is the constant 0.
    pub fn checked_rem(self, rhs: impl Into<Expr>) -> Option<Expr> {
        let rhs = rhs.into();
        match (self.0, rhs.0) {
            (_, Repr::Const(0)) => None,
            (Repr::Const(a), Repr::Const(b)) => floor_mod(a, b).map(Expr::constant),
            _ => write(|i| i.rem(self, rhs)),
        }
    }

    /// Floor division; the same as `/`.
    pub fn floor_div(self, rhs: impl Into<Expr>) -> Expr {
        self / rhs.into()
    }

    /// Ceiling division, `(self + rhs - 1) / rhs` for a positive `rhs`.
    pub fn ceil_div(self, rhs: impl Into<Expr>) -> Expr {
        let rhs = rhs.into();
        match rhs.as_const() {
            // The form that reads best and lowers cheapest.
            Some(c) if c > 0 => (self + (c - 1)) / rhs,
            _ => -((-self) / rhs),
        }
    }

    /// The smaller of two expressions.
    pub fn min(self, rhs: impl Into<Expr>) -> Expr {
        let rhs = rhs.into();
        match (self.0, rhs.0) {
            (Repr::Const(a), Repr::Const(b)) => Expr::constant(a.min(b)),
            _ => write(|i| i.min_max(self, rhs, true)),
        }
    }

    /// The larger of two expressions.
    pub fn max(self, rhs: impl Into<Expr>) -> Expr {
        let rhs = rhs.into();
        match (self.0, rhs.0) {
            (Repr::Const(a), Repr::Const(b)) => Expr::constant(a.max(b)),
            _ => write(|i| i.min_max(self, rhs, false)),
        }
    }

    /// `self < rhs` as 0 or 1.
    pub fn cmp_lt(self, rhs: impl Into<Expr>) -> Expr {
        let rhs = rhs.into();
        match (self.0, rhs.0) {
            (Repr::Const(a), Repr::Const(b)) => Expr::constant(i64::from(a < b)),
            _ => write(|i| i.lt(self, rhs)),
        }
    }

    /// `self <= rhs` as 0 or 1.
    pub fn cmp_le(self, rhs: impl Into<Expr>) -> Expr {
        self.cmp_lt(rhs.into() + 1)
    }

    /// `self > rhs` as 0 or 1.
    pub fn cmp_gt(self, rhs: impl Into<Expr>) -> Expr {
        rhs.into().cmp_lt(self)
    }

    /// `self >= rhs` as 0 or 1.
    pub fn cmp_ge(self, rhs: impl Into<Expr>) -> Expr {
        rhs.into().cmp_lt(self + 1)
    }

    /// `self == rhs` as 0 or 1.
    pub fn cmp_eq(self, rhs: impl Into<Expr>) -> Expr {
        let rhs = rhs.into();
        match (self.0, rhs.0) {
            (Repr::Const(a), Repr::Const(b)) => Expr::constant(i64::from(a == b)),
            _ => write(|i| i.eq(self, rhs)),
        }
    }

    /// `self != rhs` as 0 or 1.
    pub fn cmp_ne(self, rhs: impl Into<Expr>) -> Expr {
        1 - self.cmp_eq(rhs)
    }

    /// An interval containing every value the expression takes within its variables' bounds.
    pub fn bounds(self) -> Bounds {
        match self.0 {
            Repr::Const(c) => Bounds { lo: c, hi: c },
            Repr::Node(_) => read(|i| i.bounds(self)),
        }
    }

    /// The value under `bindings`; every variable must be bound within its bounds.
    ///
    /// ```
    /// use tessel_shape::{Bindings, Expr, Var};
    /// let n = Var::new("n", 0, 100).unwrap();
    /// let e = (Expr::from(n) * 3 + 1) % 7;
    /// assert_eq!(e.eval(&Bindings::new().with(n, 5)), Ok(2));
    /// ```
    pub fn eval(self, bindings: &Bindings) -> Result<i64, EvalError> {
        if let Repr::Const(c) = self.0 {
            return Ok(c);
        }
        read(|i| {
            i.eval(self, bindings).map_err(|failure| match failure {
                EvalFailure::Unbound(v) => EvalError::Unbound {
                    name: i.vars[v.0 as usize].name.to_string(),
                    expr: self.to_string_with(i),
                },
                EvalFailure::OutOfBounds(v, value) => {
                    let info = &i.vars[v.0 as usize];
                    EvalError::OutOfBounds {
                        name: info.name.to_string(),
                        value,
                        lo: info.lo,
                        hi: info.hi,
                    }
                }
                EvalFailure::DivisionByZero => EvalError::DivisionByZero {
                    expr: self.to_string_with(i),
                },
                EvalFailure::Overflow => EvalError::Overflow {
                    expr: self.to_string_with(i),
                },
            })
        })
    }

    /// The expression with each variable in `map` replaced, re-canonicalized.
    pub fn substitute(self, map: &[(Var, Expr)]) -> Expr {
        if self.is_const() || map.is_empty() {
            return self;
        }
        let map: FxHashMap<Var, Expr> = map.iter().copied().collect();
        write(|i| i.substitute(self, &map))
    }

    /// The variables the expression mentions, in first-seen order.
    pub fn vars(self) -> Vec<Var> {
        let mut out = Vec::new();
        if !self.is_const() {
            read(|i| i.collect_vars(self, &mut out));
        }
        out
    }

    fn to_string_with(self, interner: &Interner) -> String {
        struct Show<'a>(&'a Interner, Expr);
        impl fmt::Display for Show<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.write(f, self.1, 0)
            }
        }
        Show(interner, self).to_string()
    }

    fn binary(
        self,
        rhs: Expr,
        konst: fn(i64, i64) -> i64,
        sym: fn(&mut Interner, Expr, Expr) -> Expr,
    ) -> Expr {
        match (self.0, rhs.0) {
            (Repr::Const(a), Repr::Const(b)) => Expr::constant(konst(a, b)),
            _ => write(|i| sym(i, self, rhs)),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Repr::Const(c) => write!(f, "{c}"),
            Repr::Node(_) => read(|i| i.write(f, *self, 0)),
        }
    }
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Debug for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bounds();
        write!(f, "{}∈[{}, {}]", self.name(), b.lo, b.hi)
    }
}

impl From<Var> for Expr {
    fn from(v: Var) -> Expr {
        write(|i| i.intern(Node::Var(v)))
    }
}

impl From<i64> for Expr {
    fn from(v: i64) -> Expr {
        Expr::constant(v)
    }
}

impl From<i32> for Expr {
    fn from(v: i32) -> Expr {
        Expr::constant(v.into())
    }
}

impl From<usize> for Expr {
    /// Saturates at `i64::MAX`: a larger size is impossible anyway, and everything that
    /// sizes memory from a dim checks it (an `Err`, never a panic, reaches the user).
    fn from(v: usize) -> Expr {
        Expr::constant(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl Add for Expr {
    type Output = Expr;
    fn add(self, rhs: Expr) -> Expr {
        self.binary(rhs, i64::wrapping_add, Interner::add)
    }
}

impl Sub for Expr {
    type Output = Expr;
    fn sub(self, rhs: Expr) -> Expr {
        self.binary(rhs, i64::wrapping_sub, Interner::sub)
    }
}

impl Mul for Expr {
    type Output = Expr;
    fn mul(self, rhs: Expr) -> Expr {
        self.binary(rhs, i64::wrapping_mul, Interner::mul)
    }
}

impl Div for Expr {
    type Output = Expr;
    /// Floor division. Panics on a constant zero divisor, like integer division.
    fn div(self, rhs: Expr) -> Expr {
        self.checked_div(rhs)
            .unwrap_or_else(|| panic!("symbolic division of `{self}` by zero"))
    }
}

impl Rem for Expr {
    type Output = Expr;
    /// Floor modulo. Panics on a constant zero divisor, like integer remainder.
    fn rem(self, rhs: Expr) -> Expr {
        self.checked_rem(rhs)
            .unwrap_or_else(|| panic!("symbolic modulo of `{self}` by zero"))
    }
}

impl Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        match self.0 {
            Repr::Const(c) => Expr::constant(c.wrapping_neg()),
            Repr::Node(_) => write(|i| i.scale(self, -1)),
        }
    }
}

macro_rules! scalar_operands {
    ($($trait:ident $method:ident),*) => {$(
        impl $trait<i64> for Expr {
            type Output = Expr;
            fn $method(self, rhs: i64) -> Expr {
                $trait::$method(self, Expr::constant(rhs))
            }
        }
        impl $trait<Expr> for i64 {
            type Output = Expr;
            fn $method(self, rhs: Expr) -> Expr {
                $trait::$method(Expr::constant(self), rhs)
            }
        }
        impl $trait<Var> for Expr {
            type Output = Expr;
            fn $method(self, rhs: Var) -> Expr {
                $trait::$method(self, Expr::from(rhs))
            }
        }
    )*};
}
scalar_operands!(Add add, Sub sub, Mul mul, Div div, Rem rem);

impl AddAssign for Expr {
    fn add_assign(&mut self, rhs: Expr) {
        *self = *self + rhs;
    }
}

impl SubAssign for Expr {
    fn sub_assign(&mut self, rhs: Expr) {
        *self = *self - rhs;
    }
}

impl MulAssign for Expr {
    fn mul_assign(&mut self, rhs: Expr) {
        *self = *self * rhs;
    }
}

impl std::iter::Sum for Expr {
    fn sum<I: Iterator<Item = Expr>>(iter: I) -> Expr {
        iter.fold(Expr::constant(0), |a, b| a + b)
    }
}

impl std::iter::Product for Expr {
    fn product<I: Iterator<Item = Expr>>(iter: I) -> Expr {
        iter.fold(Expr::constant(1), |a, b| a * b)
    }
}
