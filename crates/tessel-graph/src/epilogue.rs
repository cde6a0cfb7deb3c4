//! Matmul epilogues: the elementwise work above a matrix product that a library routine
//! can do before it stores the product (cuBLASLt's bias and activation epilogues).
//!
//! Above a product `x`, a user's code records a bias add and an activation as many small
//! ops (GELU's tanh approximation is eleven, with casts around them in half precision), and
//! rewrites may reorder them. So an epilogue is recognized by what it computes, not by how
//! it is written: [`epilogues`] collects the elementwise nodes of the product's shape above
//! `x` whose leaves are `x`, constants and at most one bias (a vector of `n` elements
//! broadcast along the rows), evaluates each such node's function `f(x, b)` in `f64` at
//! fixed points, and keeps the nodes where `f` is one of the [`Epilogue`]s a routine offers
//! (`act(x + b)` or `act(x)`), within the rounding of `f32` constants. Casts count as exact
//! there: the routine rounds once, at the end, where the recorded form may round between
//! steps, which is what a half-precision tolerance allows. Measurement still checks every
//! routine's output against the generated kernels before its time counts.

use rustc_hash::FxHashMap;
use tessel_ir::{Activation, Epilogue, VendorOp};
use tessel_shape::{DType, Dim, Scalar};

use crate::consumers::Consumers;
use crate::graph::{Graph, NodeId, Op};
use crate::vendor::{VendorMatch, with_reshapes};

/// Nodes looked at above one product; an epilogue is a handful of ops.
const REGION_MAX: usize = 64;

/// Points where a candidate function is compared with each epilogue: both signs, zero,
/// GELU's curved part and its tails.
const XS: [f64; 9] = [-3.1, -1.7, -0.55, -0.05, 0.0, 0.13, 0.8, 2.2, 4.5];
const BIASES: [f64; 3] = [0.0, 0.37, -1.2];

/// Relative agreement with an epilogue's definition: `f32` constants (√(2/π), 0.044715) are
/// within 1e-7 of theirs, while GELU's erf form differs from its tanh form by 1e-4 or more
/// at these points.
const AGREEMENT: f64 = 1e-6;

/// The matches of `plain`'s product (a [`VendorOp::Matmul`] with no epilogue) followed by
/// an epilogue, one per node above it that computes one. Each reads the operands and the
/// bias (a leaf, or a node to materialize) and writes the epilogue's value.
pub(crate) fn epilogues(
    graph: &Graph,
    plain: &VendorMatch,
    consumers: &Consumers,
) -> Vec<VendorMatch> {
    let VendorOp::Matmul(op) = &plain.op else {
        return Vec::new();
    };
    let Some(&x) = plain.writes.last() else {
        return Vec::new();
    };
    let shape = &graph.node(x).shape;
    if !matches!(op.dtype, DType::F32 | DType::F16 | DType::BF16)
        || shape.dims().last() != Some(&op.n)
    {
        return Vec::new();
    }
    let mut region = Region {
        graph,
        x,
        n: op.n,
        dtype: op.dtype,
        terms: FxHashMap::default(),
    };
    let mut found = Vec::new();
    for y in above(graph, x, consumers) {
        if graph.node(y).dtype != op.dtype || region.term(y).is_none() {
            continue;
        }
        let Some((epilogue, bias)) = region.recognize(y) else {
            continue;
        };
        let writes = with_reshapes(graph, y, consumers);
        let mut operands = plain.operands.clone();
        let mut materialize: Vec<NodeId> = plain
            .materialize
            .iter()
            .copied()
            .filter(|m| !plain.writes.contains(m))
            .collect();
        if let Some(b) = bias {
            operands.push(b);
            if !matches!(graph.node(b).op, Op::Leaf(_)) {
                materialize.push(b);
            }
        }
        let mut with = op.clone();
        with.epilogue = epilogue;
        found.push(VendorMatch {
            op: VendorOp::Matmul(with),
            operands,
            writes,
            also_writes: Vec::new(),
            materialize,
        });
    }
    found
}

/// The elementwise nodes of `x`'s shape reachable upward from `x`, at most [`REGION_MAX`].
fn above(graph: &Graph, x: NodeId, consumers: &Consumers) -> Vec<NodeId> {
    let shape = &graph.node(x).shape;
    let mut seen = vec![x];
    let mut next = 0;
    while next < seen.len() && seen.len() < REGION_MAX {
        let n = seen[next];
        next += 1;
        for &c in consumers.get(n) {
            let node = graph.node(c);
            let elementwise = matches!(
                node.op,
                Op::Unary(..) | Op::Binary(..) | Op::Ternary(..) | Op::Cast(_)
            );
            if elementwise && node.dtype.is_float() && node.shape == *shape && !seen.contains(&c) {
                seen.push(c);
            }
        }
    }
    seen.split_off(1)
}

/// What a node is, as a function of the product `x` and the bias `b`.
#[derive(Clone, Copy, Debug)]
enum Term {
    /// The product.
    X,
    /// The same value everywhere.
    Const(f64),
    /// The bias vector (this node), broadcast along the rows.
    Bias(NodeId),
    /// An elementwise op on other terms.
    Op,
}

struct Region<'g> {
    graph: &'g Graph,
    x: NodeId,
    /// The product's row length: the bias's length.
    n: Dim,
    /// The product's dtype, which a bias must have.
    dtype: DType,
    /// Each node classified so far (`None`: not a function of `x` and one bias).
    terms: FxHashMap<NodeId, Option<Term>>,
}

impl Region<'_> {
    /// Classifies `node` (and, recursively, what it reads).
    fn term(&mut self, node: NodeId) -> Option<Term> {
        if let Some(t) = self.terms.get(&node) {
            return *t;
        }
        // Marked first, so a cycle (there is none in a graph) could not recurse forever.
        self.terms.insert(node, None);
        let t = self.classify(node);
        self.terms.insert(node, t);
        t
    }

    fn classify(&mut self, node: NodeId) -> Option<Term> {
        if node == self.x {
            return Some(Term::X);
        }
        if let Some(c) = constant(self.graph, node) {
            return Some(Term::Const(c));
        }
        let n = self.graph.node(node);
        match &n.op {
            Op::Unary(_, a) | Op::Cast(a) => self.term(*a).map(|_| Term::Op),
            Op::Binary(_, a, b) => {
                let (a, b) = (*a, *b);
                self.term(a)?;
                self.term(b)?;
                Some(Term::Op)
            }
            Op::Ternary(_, a, b, c) => {
                let (a, b, c) = (*a, *b, *c);
                self.term(a)?;
                self.term(b)?;
                self.term(c)?;
                Some(Term::Op)
            }
            Op::Expand(_) => self.bias(node).map(Term::Bias),
            _ => None,
        }
    }

    /// The contiguous vector of `n` elements that `node` (an expand) broadcasts along the
    /// rows: `expand(v)` with `v` of shape `[1, .., 1, n]`, `v` a reshape of the vector.
    fn bias(&self, node: NodeId) -> Option<NodeId> {
        let Op::Expand(v) = self.graph.node(node).op else {
            return None;
        };
        let dims = self.graph.node(v).shape.dims();
        let (last, rows) = dims.split_last()?;
        if *last != self.n || rows.iter().any(|d| *d != Dim::constant(1)) {
            return None;
        }
        let mut base = v;
        while let Op::Reshape(inner) = self.graph.node(base).op {
            base = inner;
        }
        let b = self.graph.node(base);
        (b.dtype == self.dtype && b.shape.numel() == self.n).then_some(base)
    }

    /// The epilogue `y` computes, with the bias it reads, if it is one a routine offers.
    fn recognize(&self, y: NodeId) -> Option<(Epilogue, Option<NodeId>)> {
        let mut biases = Vec::new();
        self.biases(y, &mut biases);
        biases.dedup();
        let bias = match biases.as_slice() {
            [] => None,
            [b] => Some(*b),
            _ => return None,
        };
        let points: &[f64] = if bias.is_some() { &BIASES } else { &[0.0] };
        let candidates = [
            Activation::Identity,
            Activation::Relu,
            Activation::GeluTanh,
            Activation::Gelu,
        ]
        .map(|activation| Epilogue {
            bias: bias.is_some(),
            activation,
        });
        candidates.into_iter().find_map(|epilogue| {
            if epilogue.is_none() {
                return None;
            }
            let agrees = points.iter().all(|&b| {
                XS.iter().all(|&x| {
                    let want = epilogue.apply(x, b);
                    self.eval(y, x, b, &mut FxHashMap::default())
                        .map(Scalar::to_f64)
                        .is_some_and(|got| (got - want).abs() <= AGREEMENT * want.abs().max(1.0))
                })
            });
            agrees.then_some((epilogue, bias))
        })
    }

    /// Every bias node `y` reads (with repeats).
    fn biases(&self, y: NodeId, out: &mut Vec<NodeId>) {
        match self.terms.get(&y).copied().flatten() {
            Some(Term::Bias(b)) => out.push(b),
            Some(Term::Op) => {
                for c in self.graph.node(y).op.children() {
                    self.biases(c, out);
                }
            }
            _ => {}
        }
    }

    /// `y`'s value where the product is `x` and the bias `b`, in `f64` (float casts exact;
    /// comparisons give `bool`s, as in the graph).
    fn eval(
        &self,
        y: NodeId,
        x: f64,
        b: f64,
        memo: &mut FxHashMap<NodeId, Scalar>,
    ) -> Option<Scalar> {
        if let Some(v) = memo.get(&y) {
            return Some(*v);
        }
        let v = match self.terms.get(&y).copied().flatten()? {
            Term::X => Scalar::F64(x),
            Term::Const(c) => Scalar::F64(c),
            Term::Bias(_) => Scalar::F64(b),
            Term::Op => {
                let node = self.graph.node(y);
                let mut arg = |c: NodeId| self.eval(c, x, b, memo);
                match &node.op {
                    Op::Cast(a) if node.dtype.is_float() => arg(*a)?.cast(DType::F64),
                    Op::Cast(a) => arg(*a)?.cast(node.dtype),
                    Op::Unary(op, a) => arg(*a)?.unary(*op).ok()?,
                    Op::Binary(op, a, c) => arg(*a)?.binary(*op, arg(*c)?).ok()?,
                    Op::Ternary(op, a, c, d) => {
                        let (a, c, d) = (arg(*a)?, arg(*c)?, arg(*d)?);
                        Scalar::ternary(*op, a, c, d).ok()?
                    }
                    _ => return None,
                }
            }
        };
        memo.insert(y, v);
        Some(v)
    }
}

/// The value of a constant node seen through movement and casts.
fn constant(graph: &Graph, node: NodeId) -> Option<f64> {
    match &graph.node(node).op {
        Op::Const(s) => Some(s.to_f64()),
        Op::Expand(a) | Op::Reshape(a) | Op::Cast(a) => constant(graph, *a),
        _ => None,
    }
}
