//! Rewrites as data: a searcher that finds matches, conditions, and an applier that builds
//! the equivalent form, which saturation merges into the matched class.
//!
//! Patterns are s-expressions over the graph's op names, checked when the rule is built:
//!
//! ```text
//! ?x              any class (a repeated variable matches one class)
//! 0  1  -0        a class holding this constant of its own dtype (`-0`: floats only)
//! (mul ?x 1)      any unary, binary or ternary op by its IR name (neg, exp, add, where...)
//! (reshape ?x)    reshape, expand: the shape is the matched class's (appliers: root only)
//! (permute $p ?x) a permute; `$p` binds its axes
//! (reduce-sum $ax ?x)  reduce-sum, -prod, -max, -min; `$ax` binds the reduced axes
//! ```
//!
//! A rule whose right-hand side needs computing (composing two permutes) gives a function
//! as its applier; one matching any e-node (constant folding) gives functions for both.

use std::fmt;

use tessel_shape::{BinaryOp, DType, Dim, Scalar, Shape, TernaryOp, UnaryOp};

use super::{ClassId, EClass, EGraph, ENode};
use crate::graph::{Op, ReduceOp};

/// A rule that could not be built; the message names the rule and repeats the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RewriteError {
    /// The rule's name.
    pub rule: &'static str,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for RewriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rewrite {}: {}", self.rule, self.message)
    }
}

impl std::error::Error for RewriteError {}

/// What a searcher bound: classes for `?x` variables, axes for `$p` variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subst {
    classes: Vec<(&'static str, ClassId)>,
    axes: Vec<(&'static str, Box<[usize]>)>,
}

impl Subst {
    /// The class bound to `?var`.
    pub fn class(&self, var: &str) -> Option<ClassId> {
        self.classes
            .iter()
            .find(|(v, _)| *v == var)
            .map(|&(_, c)| c)
    }

    /// The axes bound to `$var`.
    pub fn axes(&self, var: &str) -> Option<&[usize]> {
        self.axes.iter().find(|(v, _)| *v == var).map(|(_, a)| &**a)
    }

    /// Binds `$var` to `axes`, or checks it is already bound to them.
    fn bind_axes(&mut self, var: &'static str, axes: &[usize]) -> bool {
        if let Some(bound) = self.axes(var) {
            return bound == axes;
        }
        self.axes.push((var, axes.into()));
        true
    }
}

/// One match of a rule's searcher.
#[derive(Clone, Debug)]
pub struct Match {
    /// The matched class.
    pub class: ClassId,
    /// The e-node of that class the searcher's root matched.
    pub node: ENode,
    /// The variables' bindings.
    pub subst: Subst,
}

/// A side condition on a match, checked before the applier runs. Variables are named as
/// in the searcher; `"root"` names the matched class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    /// The class is known sign-clear: no negative element, no `-0` (see the module docs
    /// of [`egraph`](super)).
    SignClear(&'static str),
    /// `x + 0 == x` exactly: the class is not a float, or it is sign-clear (`-0 + 0` is
    /// `+0`).
    NotNegZero(&'static str),
    /// The class's dtype is an integer.
    Integer(&'static str),
    /// The two classes have one shape.
    SameShape(&'static str, &'static str),
    /// The axes variable is the identity permutation.
    IdentityPerm(&'static str),
}

impl Condition {
    fn vars(self) -> Vec<&'static str> {
        match self {
            Condition::SignClear(v)
            | Condition::NotNegZero(v)
            | Condition::Integer(v)
            | Condition::IdentityPerm(v) => vec![v],
            Condition::SameShape(a, b) => vec![a, b],
        }
    }

    fn holds(self, egraph: &EGraph, m: &Match) -> bool {
        let class = |var: &str| -> Option<&EClass> {
            let id = if var == "root" {
                m.class
            } else {
                m.subst.class(var)?
            };
            Some(egraph.class(id))
        };
        match self {
            Condition::SignClear(v) => class(v).is_some_and(|c| c.data.sign_clear),
            Condition::NotNegZero(v) => {
                class(v).is_some_and(|c| !c.dtype.is_float() || c.data.sign_clear)
            }
            Condition::Integer(v) => class(v).is_some_and(|c| c.dtype.is_int()),
            Condition::SameShape(a, b) => match (class(a), class(b)) {
                (Some(a), Some(b)) => a.shape == b.shape,
                _ => false,
            },
            Condition::IdentityPerm(v) => m
                .subst
                .axes(v)
                .is_some_and(|p| p.iter().enumerate().all(|(i, &a)| i == a)),
        }
    }
}

/// A constant in a pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConstAtom {
    Zero,
    NegZero,
    One,
}

impl ConstAtom {
    /// The constant in `dtype`, if it exists there.
    fn value(self, dtype: DType) -> Option<Scalar> {
        match self {
            ConstAtom::Zero => Some(Scalar::zero(dtype)),
            ConstAtom::One => Some(Scalar::one(dtype)),
            ConstAtom::NegZero => dtype.is_float().then(|| Scalar::F64(-0.0).cast(dtype)),
        }
    }
}

/// An op in a pattern, with the names of its payload variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PatOp {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Ternary(TernaryOp),
    Reshape,
    Expand,
    Permute(&'static str),
    Reduce(ReduceOp, &'static str),
}

impl PatOp {
    fn parse(name: &str) -> Option<PatOp> {
        let reduce = |r| PatOp::Reduce(r, "");
        Some(match name {
            "reshape" => PatOp::Reshape,
            "expand" => PatOp::Expand,
            "permute" => PatOp::Permute(""),
            "reduce-sum" => reduce(ReduceOp::Sum),
            "reduce-prod" => reduce(ReduceOp::Prod),
            "reduce-max" => reduce(ReduceOp::Max),
            "reduce-min" => reduce(ReduceOp::Min),
            "where" => PatOp::Ternary(TernaryOp::Where),
            "mad" => PatOp::Ternary(TernaryOp::MulAdd),
            _ => {
                if let Some(u) = UnaryOp::ALL.into_iter().find(|u| u.name() == name) {
                    PatOp::Unary(u)
                } else {
                    PatOp::Binary(BinaryOp::ALL.into_iter().find(|b| b.name() == name)?)
                }
            }
        })
    }

    const fn arity(self) -> usize {
        match self {
            PatOp::Binary(_) => 2,
            PatOp::Ternary(_) => 3,
            _ => 1,
        }
    }
}

/// A parsed pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pat {
    Var(&'static str),
    Const(ConstAtom),
    Op(PatOp, Vec<Pat>),
}

impl Pat {
    /// Parses a whole pattern.
    fn parse(text: &'static str) -> Result<Pat, String> {
        let mut tokens = tokenize(text).into_iter().peekable();
        let pat = Pat::parse_one(&mut tokens)?;
        match tokens.next() {
            None => Ok(pat),
            Some(t) => Err(format!("unexpected `{t}` after the pattern")),
        }
    }

    fn parse_one(
        tokens: &mut std::iter::Peekable<std::vec::IntoIter<&'static str>>,
    ) -> Result<Pat, String> {
        match tokens.next() {
            None => Err("the pattern ends early".into()),
            Some("(") => {
                let name = tokens.next().unwrap_or(")");
                let mut op = PatOp::parse(name).ok_or_else(|| format!("unknown op `{name}`"))?;
                if let PatOp::Permute(var) | PatOp::Reduce(_, var) = &mut op {
                    *var = match tokens.next() {
                        Some(v) if v.len() > 1 && v.starts_with('$') => v,
                        other => {
                            let got = other.unwrap_or("the end");
                            return Err(format!("{name} needs a `$axes` variable, got `{got}`"));
                        }
                    };
                }
                let mut children = Vec::new();
                while tokens.peek().is_some_and(|t| *t != ")") {
                    children.push(Pat::parse_one(tokens)?);
                }
                if tokens.next().is_none() {
                    return Err(format!("`({name}` is never closed"));
                }
                if children.len() != op.arity() {
                    let n = children.len();
                    return Err(format!("{name} takes {} operands, got {n}", op.arity()));
                }
                Ok(Pat::Op(op, children))
            }
            Some(")") => Err("unexpected `)`".into()),
            Some("0") => Ok(Pat::Const(ConstAtom::Zero)),
            Some("-0") => Ok(Pat::Const(ConstAtom::NegZero)),
            Some("1") => Ok(Pat::Const(ConstAtom::One)),
            Some(v) if v.len() > 1 && v.starts_with('?') => Ok(Pat::Var(v)),
            Some(other) => Err(format!(
                "unknown atom `{other}` (variables are `?x`, constants 0, 1, -0)"
            )),
        }
    }

    /// The `?` and `$` variables, in order of first use.
    fn vars(&self, out: &mut Vec<&'static str>) {
        match self {
            Pat::Var(v) => {
                if !out.contains(v) {
                    out.push(v);
                }
            }
            Pat::Const(_) => {}
            Pat::Op(op, children) => {
                if let PatOp::Permute(v) | PatOp::Reduce(_, v) = op
                    && !out.contains(v)
                {
                    out.push(v);
                }
                for c in children {
                    c.vars(out);
                }
            }
        }
    }

    /// Why this pattern cannot be an applier, if it can't: constants need a sibling (or
    /// the root) to give them a dtype and shape, reshapes and expands the root's shape.
    fn applier_problem(&self, is_root: bool) -> Option<String> {
        let Pat::Op(op, children) = self else {
            return None;
        };
        if matches!(op, PatOp::Reshape | PatOp::Expand) && !is_root {
            return Some("an applier's reshape or expand must be its root".into());
        }
        let consts = children
            .iter()
            .filter(|c| matches!(c, Pat::Const(_)))
            .count();
        if consts > 0 && !matches!(op, PatOp::Binary(_)) || consts > 1 {
            return Some("an applier's constant must be one operand of a binary op".into());
        }
        children.iter().find_map(|c| c.applier_problem(false))
    }

    /// Every binding under which this pattern matches `class`, extending `subst`.
    fn search_class(&self, egraph: &EGraph, class: ClassId, subst: &Subst, out: &mut Vec<Subst>) {
        let class = egraph.find(class);
        match self {
            Pat::Var(v) => match subst.class(v) {
                None => {
                    let mut s = subst.clone();
                    s.classes.push((v, class));
                    out.push(s);
                }
                Some(bound) if bound == class => out.push(subst.clone()),
                Some(_) => {}
            },
            Pat::Const(atom) => {
                let c = egraph.class(class);
                if c.data.constant.is_some() && c.data.constant == atom.value(c.dtype) {
                    out.push(subst.clone());
                }
            }
            Pat::Op(..) => {
                for node in &egraph.class(class).nodes {
                    self.search_node(egraph, node, subst, out);
                }
            }
        }
    }

    /// Every binding under which this (op) pattern matches the e-node `node`.
    fn search_node(&self, egraph: &EGraph, node: &ENode, subst: &Subst, out: &mut Vec<Subst>) {
        let Pat::Op(op, children) = self else {
            return;
        };
        // The op first, without copying the bindings: most e-nodes a pattern is tried on
        // are of another op.
        let same_op = match (op, node.op()) {
            (PatOp::Unary(a), Op::Unary(b, _)) => a == b,
            (PatOp::Binary(a), Op::Binary(b, ..)) => a == b,
            (PatOp::Ternary(a), Op::Ternary(b, ..)) => a == b,
            (PatOp::Reduce(a, _), Op::Reduce(b, ..)) => a == b,
            (PatOp::Reshape, Op::Reshape(_))
            | (PatOp::Expand, Op::Expand(_))
            | (PatOp::Permute(_), Op::Permute(..)) => true,
            _ => false,
        };
        if !same_op {
            return;
        }
        let mut s = subst.clone();
        let bound = match (op, node.op()) {
            (PatOp::Permute(v), Op::Permute(_, perm)) => s.bind_axes(v, perm),
            (PatOp::Reduce(_, v), Op::Reduce(_, _, axes)) => s.bind_axes(v, axes),
            _ => true,
        };
        if !bound {
            return;
        }
        let mut partial = vec![s];
        for (pat, class) in children.iter().zip(node.children()) {
            let mut next = Vec::new();
            for s in &partial {
                pat.search_class(egraph, class, s, &mut next);
            }
            if next.is_empty() {
                return;
            }
            partial = next;
        }
        out.extend(partial);
    }

    /// Adds the e-nodes this pattern describes under `subst` and returns the class of the
    /// whole; `expect` is the dtype and shape the value must have, where known (the root,
    /// a constant's sibling). `None` if the types don't work out.
    fn build(
        &self,
        egraph: &mut EGraph,
        subst: &Subst,
        expect: Option<(DType, &Shape)>,
    ) -> Option<ClassId> {
        let (op, children) = match self {
            Pat::Var(v) => return subst.class(v),
            Pat::Const(atom) => {
                let (dtype, shape) = expect?;
                let value = atom.value(dtype)?;
                return Some(egraph.add(ENode::new(Op::Const(value), dtype, shape.clone())));
            }
            Pat::Op(op, children) => (*op, children),
        };
        let mut built = vec![None; children.len()];
        for (slot, child) in built.iter_mut().zip(children) {
            if !matches!(child, Pat::Const(_)) {
                *slot = Some(child.build(egraph, subst, None)?);
            }
        }
        let first = egraph.class(built.iter().flatten().next().copied()?);
        let (dtype, shape) = (first.dtype, first.shape.clone());
        for (slot, child) in built.iter_mut().zip(children) {
            if slot.is_none() {
                *slot = Some(child.build(egraph, subst, Some((dtype, &shape)))?);
            }
        }
        let ids: Vec<ClassId> = built.into_iter().collect::<Option<_>>()?;
        let operand = |i: usize| ids[i].operand();
        let same_type = |ids: &[ClassId]| {
            ids.iter().all(|&c| {
                let c = egraph.class(c);
                c.dtype == dtype && c.shape == shape
            })
        };
        let node = match op {
            PatOp::Unary(u) => ENode::new(Op::Unary(u, operand(0)), u.result_dtype(dtype)?, shape),
            PatOp::Binary(b) => {
                if !same_type(&ids) {
                    return None;
                }
                let op = Op::Binary(b, operand(0), operand(1));
                ENode::new(op, b.result_dtype(dtype)?, shape)
            }
            PatOp::Ternary(t) => {
                let value_dtype = egraph.class(ids[1]).dtype;
                let dtypes_ok = match t {
                    TernaryOp::Where => dtype == DType::Bool && same_type(&ids[1..]),
                    TernaryOp::MulAdd => same_type(&ids),
                };
                let shapes_ok = ids.iter().all(|&c| egraph.class(c).shape == shape);
                if !(dtypes_ok && shapes_ok) {
                    return None;
                }
                let op = Op::Ternary(t, operand(0), operand(1), operand(2));
                ENode::new(op, t.result_dtype(value_dtype)?, shape)
            }
            PatOp::Reshape | PatOp::Expand => {
                let (want_dtype, want_shape) = expect?;
                let op = if op == PatOp::Reshape {
                    Op::Reshape(operand(0))
                } else {
                    Op::Expand(operand(0))
                };
                if want_dtype != dtype {
                    return None;
                }
                ENode::new(op, dtype, want_shape.clone())
            }
            PatOp::Permute(v) => {
                let perm = subst.axes(v)?;
                if !is_permutation(perm, shape.len()) {
                    return None;
                }
                let dims: Vec<Dim> = perm.iter().map(|&p| shape[p]).collect();
                ENode::new(
                    Op::Permute(operand(0), perm.into()),
                    dtype,
                    Shape::new(dims),
                )
            }
            PatOp::Reduce(r, v) => {
                let axes = subst.axes(v)?;
                if axes.iter().any(|&a| a >= shape.len()) {
                    return None;
                }
                let mut dims = shape.dims().to_vec();
                for &a in axes {
                    dims[a] = Dim::constant(1);
                }
                ENode::new(
                    Op::Reduce(r, operand(0), axes.into()),
                    dtype,
                    Shape::new(dims),
                )
            }
        };
        Some(egraph.add(node))
    }
}

/// Whether `perm` is a permutation of `0..rank`.
pub(super) fn is_permutation(perm: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true))
}

/// Splits a pattern into `(`, `)` and atoms.
fn tokenize(text: &'static str) -> Vec<&'static str> {
    let mut tokens = Vec::new();
    let mut start = None;
    for (i, ch) in text.char_indices() {
        let is_paren = ch == '(' || ch == ')';
        if (is_paren || ch.is_whitespace())
            && let Some(s) = start.take()
        {
            tokens.push(&text[s..i]);
        }
        if is_paren {
            tokens.push(&text[i..=i]);
        } else if !ch.is_whitespace() && start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        tokens.push(&text[s..]);
    }
    tokens
}

/// Finds matches: a pattern, or a predicate on single e-nodes.
#[derive(Clone, Debug)]
enum Searcher {
    Pattern(Pat),
    Node(fn(&EGraph, ClassId, &ENode) -> bool),
}

/// Builds the equivalent form of a match: a pattern, or a function.
#[derive(Clone, Debug)]
enum Applier {
    Pattern(Pat),
    Fn(fn(&mut EGraph, &Match) -> Option<ClassId>),
}

/// A rewrite rule: wherever the searcher matches and the conditions hold, the applier's
/// form is equal to the matched class. Built once, checked when built.
#[derive(Clone, Debug)]
pub struct Rewrite {
    name: &'static str,
    searcher: Searcher,
    applier: Applier,
    conditions: Vec<Condition>,
}

impl Rewrite {
    /// A rule from two patterns (see the module docs for the syntax). Fails if a pattern
    /// does not parse, the searcher's root is not an op, or the applier or a condition
    /// uses a variable the searcher never binds.
    pub fn new(
        name: &'static str,
        searcher: &'static str,
        applier: &'static str,
        conditions: &[Condition],
    ) -> Result<Rewrite, RewriteError> {
        let err = |message: String| RewriteError {
            rule: name,
            message,
        };
        let rhs = Pat::parse(applier).map_err(|e| err(format!("{e} in `{applier}`")))?;
        if let Some(problem) = rhs.applier_problem(true) {
            return Err(err(format!("{problem}, in `{applier}`")));
        }
        let rewrite = Rewrite::with_fn(name, searcher, |_, _| None, conditions)?;
        let mut bound = Vec::new();
        if let Searcher::Pattern(lhs) = &rewrite.searcher {
            lhs.vars(&mut bound);
        }
        let mut used = Vec::new();
        rhs.vars(&mut used);
        if let Some(v) = used.iter().find(|v| !bound.contains(v)) {
            return Err(err(format!(
                "`{applier}` uses {v}, which `{searcher}` never binds"
            )));
        }
        Ok(Rewrite {
            applier: Applier::Pattern(rhs),
            ..rewrite
        })
    }

    /// A rule whose applier is a function of the match (for computed right-hand sides).
    pub fn with_fn(
        name: &'static str,
        searcher: &'static str,
        applier: fn(&mut EGraph, &Match) -> Option<ClassId>,
        conditions: &[Condition],
    ) -> Result<Rewrite, RewriteError> {
        let err = |message: String| RewriteError {
            rule: name,
            message,
        };
        let lhs = Pat::parse(searcher).map_err(|e| err(format!("{e} in `{searcher}`")))?;
        if !matches!(lhs, Pat::Op(..)) {
            return Err(err(format!("the searcher `{searcher}` must be an op")));
        }
        let mut bound = vec!["root"];
        lhs.vars(&mut bound);
        for c in conditions {
            if let Some(v) = c.vars().into_iter().find(|v| !bound.contains(v)) {
                return Err(err(format!(
                    "condition {c:?} uses {v}, which `{searcher}` never binds"
                )));
            }
        }
        Ok(Rewrite {
            name,
            searcher: Searcher::Pattern(lhs),
            applier: Applier::Fn(applier),
            conditions: conditions.to_vec(),
        })
    }

    /// A rule matching every e-node `matches` accepts (given its class), whose applier
    /// is a function.
    pub fn custom(
        name: &'static str,
        matches: fn(&EGraph, ClassId, &ENode) -> bool,
        applier: fn(&mut EGraph, &Match) -> Option<ClassId>,
    ) -> Rewrite {
        Rewrite {
            name,
            searcher: Searcher::Node(matches),
            applier: Applier::Fn(applier),
            conditions: Vec::new(),
        }
    }

    /// The rule's name, as reports and logs show it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Every match in the e-graph whose conditions hold, classes in increasing order.
    pub fn search(&self, egraph: &EGraph) -> Vec<Match> {
        let mut out = Vec::new();
        for class in egraph.classes() {
            for node in &class.nodes {
                match &self.searcher {
                    Searcher::Node(matches) => {
                        if matches(egraph, class.id, node) {
                            out.push(Match {
                                class: class.id,
                                node: node.clone(),
                                subst: Subst::default(),
                            });
                        }
                    }
                    Searcher::Pattern(pat) => {
                        let mut substs = Vec::new();
                        pat.search_node(egraph, node, &Subst::default(), &mut substs);
                        out.extend(substs.into_iter().map(|subst| Match {
                            class: class.id,
                            node: node.clone(),
                            subst,
                        }));
                    }
                }
            }
        }
        out.retain(|m| self.conditions.iter().all(|c| c.holds(egraph, m)));
        out
    }

    /// Adds the equivalent form of `m` and returns its class (not yet merged with
    /// `m.class`); `None` where the form cannot be built (types don't work out).
    pub fn apply(&self, egraph: &mut EGraph, m: &Match) -> Option<ClassId> {
        match &self.applier {
            Applier::Fn(f) => f(egraph, m),
            Applier::Pattern(pat) => {
                let root = egraph.class(m.class);
                let (dtype, shape) = (root.dtype, root.shape.clone());
                pat.build(egraph, &m.subst, Some((dtype, &shape)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_bad_rules_are_rejected() {
        assert_eq!(
            Pat::parse("(mul ?x 1)"),
            Ok(Pat::Op(
                PatOp::Binary(BinaryOp::Mul),
                vec![Pat::Var("?x"), Pat::Const(ConstAtom::One)]
            ))
        );
        assert!(Rewrite::new("ok", "(permute $p (permute $q ?x))", "?x", &[]).is_ok());
        let bad = |lhs, rhs, conds: &[Condition]| {
            Rewrite::new("bad", lhs, rhs, conds).unwrap_err().message
        };
        assert!(bad("(mul ?x 1)", "?y", &[]).contains("never binds"));
        assert!(bad("(mull ?x 1)", "?x", &[]).contains("unknown op `mull`"));
        assert!(bad("(neg ?x ?y)", "?x", &[]).contains("takes 1 operands"));
        assert!(bad("(neg ?x", "?x", &[]).contains("never closed"));
        assert!(bad("?x", "?x", &[]).contains("must be an op"));
        assert!(bad("(neg ?x)", "(neg (reshape ?x))", &[]).contains("must be its root"));
        assert!(bad("(neg ?x)", "?x", &[Condition::SignClear("?z")]).contains("never binds"));
        assert!(bad("(permute ?x)", "?x", &[]).contains("`$axes`"));
        assert_eq!(
            bad("(neg ?x) ?y", "?x", &[]),
            "unexpected `?y` after the pattern in `(neg ?x) ?y`"
        );
    }
}
