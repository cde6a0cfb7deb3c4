//! The key property: random graphs, and a deep stack of blocks, compute the same values
//! before and after `simplify`, in every form the e-graph extracts and every partition.

use rustc_hash::FxHashMap;
use tessel_graph::egraph::StopReason;
use tessel_graph::egraph::forms;
use tessel_graph::{
    NodeId, Op, ReduceOp, Search, find_matmuls, kernelize, kernelize_cooperative, kernelize_rows,
    kernelize_shared, kernelize_with, materialized_for, signature, simplify, views_to_split,
};
use tessel_shape::{BinaryOp, DType, Dim, Scalar, Shape, UnaryOp};

use super::support::{Env, Lcg, assert_same, realize, run};
use super::{F32, I32, budget};

/// A value of a random graph, with a bound on the magnitude of everything it was computed
/// from (floats; integers wrap and are compared exactly).
#[derive(Clone, Copy)]
struct Val {
    id: NodeId,
    bound: f64,
}

impl Val {
    fn new(id: NodeId, bound: f64) -> Self {
        Val { id, bound }
    }
}

/// Builds random graphs over a few leaves, full of the patterns the rules look for.
struct Gen {
    env: Env,
    rng: Lcg,
    dtype: DType,
    pool: Vec<Val>,
}

impl Gen {
    fn new(seed: u64, dtype: DType) -> Self {
        let mut g = Gen {
            env: Env::new(),
            rng: Lcg(seed),
            dtype,
            pool: Vec::new(),
        };
        for _ in 0..=g.rng.below(3) {
            let rank = 1 + g.rng.below(3);
            let dims: Vec<usize> = (0..rank).map(|_| 1 + g.rng.below(4)).collect();
            let id = g.env.leaf(dtype, &dims);
            g.pool.push(Val { id, bound: 2.0 });
        }
        g
    }

    fn float(&self) -> bool {
        self.dtype == DType::F32
    }

    fn dims(&self, v: Val) -> Vec<usize> {
        self.env.dims(v.id)
    }

    /// A pool value, usually a recent one.
    fn pick(&mut self) -> Val {
        let n = self.pool.len();
        if self.rng.chance(2) {
            self.pool[n - 1 - self.rng.below(n.min(3))]
        } else {
            self.pool[self.rng.below(n)]
        }
    }

    /// A value of `v`'s shape: another pool value, a constant, or `v` itself.
    fn partner(&mut self, v: Val) -> Val {
        let dims = self.dims(v);
        let same: Vec<Val> = self
            .pool
            .iter()
            .copied()
            .filter(|p| p.id != v.id && self.env.dims(p.id) == dims)
            .collect();
        match self.rng.below(4) {
            0 => v,
            1 => {
                let c = self.random_scalar(5, 2);
                Val {
                    id: self.env.constant(c, v.id),
                    bound: 2.0,
                }
            }
            _ if same.is_empty() => v,
            _ => same[self.rng.below(same.len())],
        }
    }

    /// A constant in `-offset..span - offset`.
    fn random_scalar(&mut self, span: usize, offset: i32) -> Scalar {
        let v = self.rng.below(span) as i32 - offset;
        self.scalar(v)
    }

    fn scalar(&self, v: i32) -> Scalar {
        Scalar::I32(v).cast(self.dtype)
    }

    fn unary(&mut self, op: UnaryOp, v: Val, bound: f64) -> Val {
        let id = self.env.unary(op, v.id);
        Val::new(id, bound)
    }

    fn binary(&mut self, op: BinaryOp, a: Val, b: Val) -> Val {
        let bound = match op {
            BinaryOp::Mul => a.bound * b.bound,
            BinaryOp::Add | BinaryOp::Sub => a.bound + b.bound,
            _ => a.bound.max(b.bound),
        };
        let id = self.env.binary(op, a.id, b.id);
        Val::new(id, bound)
    }

    /// One random step: a new value computed from pool values.
    fn step(&mut self) -> Val {
        let v = self.pick();
        let float = self.float();
        match self.rng.below(14) {
            0 => {
                let ops: &[UnaryOp] = if float {
                    &[UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Tanh, UnaryOp::Exp]
                } else {
                    &[UnaryOp::Neg, UnaryOp::Abs]
                };
                match ops[self.rng.below(ops.len())] {
                    UnaryOp::Tanh => self.unary(UnaryOp::Tanh, v, 1.0),
                    UnaryOp::Exp if v.bound <= 4.0 => self.unary(UnaryOp::Exp, v, v.bound.exp()),
                    UnaryOp::Exp => self.unary(UnaryOp::Tanh, v, 1.0),
                    op => self.unary(op, v, v.bound),
                }
            }
            1 => {
                let n = self.unary(UnaryOp::Neg, v, v.bound);
                self.unary(UnaryOp::Neg, n, v.bound)
            }
            2 if float => {
                // exp(log(y)) for a sign-clear y (exp, abs) or, rarely, any y.
                let inner = match self.rng.below(5) {
                    0 | 1 if v.bound <= 4.0 => self.unary(UnaryOp::Exp, v, v.bound.exp()),
                    0..=3 => self.unary(UnaryOp::Abs, v, v.bound),
                    _ => v,
                };
                let l = self.unary(UnaryOp::Log, inner, inner.bound.ln().abs() + 20.0);
                self.unary(UnaryOp::Exp, l, inner.bound)
            }
            3 | 2 => {
                let ops = [
                    BinaryOp::Add,
                    BinaryOp::Sub,
                    BinaryOp::Mul,
                    BinaryOp::Max,
                    BinaryOp::Min,
                ];
                let op = ops[self.rng.below(ops.len())];
                let p = self.partner(v);
                let op = if op == BinaryOp::Mul && v.bound * p.bound > 1e4 {
                    BinaryOp::Add
                } else {
                    op
                };
                self.binary(op, v, p)
            }
            4 => self.identity(v),
            5 => {
                // (c1 op c2) op v: folds to one constant.
                let (c1, c2) = (self.random_scalar(5, 2), self.scalar(3));
                let c1 = Val::new(self.env.constant(c1, v.id), 2.0);
                let c2 = Val::new(self.env.constant(c2, v.id), 3.0);
                let op = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Max][self.rng.below(3)];
                let c = self.binary(op, c1, c2);
                let c = if self.rng.chance(2) {
                    self.unary(UnaryOp::Neg, c, c.bound)
                } else {
                    c
                };
                self.binary(BinaryOp::Mul, c, v)
            }
            6 => {
                let r = self.reduce(v);
                if self.rng.chance(2) {
                    let dims = self.dims(v);
                    let id = self.env.expand(r.id, &dims);
                    Val::new(id, r.bound)
                } else {
                    r
                }
            }
            7 | 8 => {
                // sum(v, ax) + sum(w, ax), or sum(v + w, ax).
                let w = self.partner(v);
                let axes = self.axes(&self.dims(v));
                let n: usize = axes.iter().map(|&a| self.dims(v)[a]).product();
                let bound = (v.bound + w.bound) * n as f64;
                let id = if self.rng.chance(2) {
                    let a = self.env.reduce(ReduceOp::Sum, v.id, &axes);
                    let b = self.env.reduce(ReduceOp::Sum, w.id, &axes);
                    self.env.binary(BinaryOp::Add, a, b)
                } else {
                    let s = self.env.binary(BinaryOp::Add, v.id, w.id);
                    self.env.reduce(ReduceOp::Sum, s, &axes)
                };
                Val::new(id, bound)
            }
            9 => {
                let mut id = v.id;
                for _ in 0..=self.rng.below(3) {
                    let perm = self.perm(self.env.dims(id).len());
                    id = self.env.permute(id, &perm);
                }
                Val::new(id, v.bound)
            }
            10 => {
                let mut id = v.id;
                for _ in 0..=self.rng.below(3) {
                    let dims = self.reshaped(&self.env.dims(id));
                    id = self.env.reshape(id, &dims);
                }
                Val::new(id, v.bound)
            }
            11 => self.expand(v),
            12 if float => self.matmul(v),
            _ => self.view(v),
        }
    }

    /// `v @ w` over `v`'s last two axes (`[.., m, k]`), recorded as `Tensor::matmul` does:
    /// the sum over `k` of `expand(v[.., m, k, 1]) * expand(w[.., 1, k, n])`. `w` is a new
    /// leaf read as stored, through a transpose, or a computed value through a rotation
    /// of its axes (what the transposed form splits).
    fn matmul(&mut self, v: Val) -> Val {
        let dims = self.dims(v);
        if dims.len() < 2 {
            return v;
        }
        let r = dims.len() - 2;
        let (m, k, n) = (dims[r], dims[r + 1], 1 + self.rng.below(4));
        let batch = &dims[..r];
        let with = |tail: &[usize]| -> Vec<usize> { batch.iter().chain(tail).copied().collect() };
        let w = match self.rng.below(3) {
            0 => self.env.leaf(F32, &with(&[k, n])),
            1 => {
                let leaf = self.env.leaf(F32, &with(&[n, k]));
                let mut swap: Vec<usize> = (0..r + 2).collect();
                swap.swap(r, r + 1);
                self.env.permute(leaf, &swap)
            }
            _ => {
                // y: [n, ..batch, k]; w = y permuted to [..batch, k, n].
                let y_dims: Vec<usize> = [n].iter().chain(batch).chain(&[k]).copied().collect();
                let y = self.env.leaf(F32, &y_dims);
                let y = self.env.unary(UnaryOp::Neg, y);
                let perm: Vec<usize> = (1..=r + 1).chain([0]).collect();
                self.env.permute(y, &perm)
            }
        };
        let a = self.env.reshape(v.id, &with(&[m, k, 1]));
        let b = self.env.reshape(w, &with(&[1, k, n]));
        let space = with(&[m, k, n]);
        let a = self.env.expand(a, &space);
        let b = self.env.expand(b, &space);
        let p = self.env.binary(BinaryOp::Mul, a, b);
        let sum = self.env.reduce(ReduceOp::Sum, p, &[r + 1]);
        let mut id = self.env.reshape(sum, &with(&[m, n]));
        if self.rng.chance(3) {
            // Read transposed: `matmul-transpose` computes it as the transposed product.
            let mut swap: Vec<usize> = (0..r + 2).collect();
            swap.swap(r, r + 1);
            id = self.env.permute(id, &swap);
        }
        Val::new(id, v.bound * 2.0 * k as f64)
    }

    /// `v` combined with an identity element: x*1, 1*x, x+0, 0+x, x+(-0), (-0)+x, x-0, x-x.
    fn identity(&mut self, v: Val) -> Val {
        let (one, zero) = (self.scalar(1), self.scalar(0));
        let c = |g: &mut Gen, s| Val::new(g.env.constant(s, v.id), 1.0);
        match self.rng.below(8) {
            0 => {
                let one = c(self, one);
                self.binary(BinaryOp::Mul, v, one)
            }
            1 => {
                let one = c(self, one);
                self.binary(BinaryOp::Mul, one, v)
            }
            2 => {
                let zero = c(self, zero);
                self.binary(BinaryOp::Add, v, zero)
            }
            3 => {
                let zero = c(self, zero);
                self.binary(BinaryOp::Add, zero, v)
            }
            4 if self.float() => {
                let neg_zero = c(self, Scalar::F32(-0.0));
                self.binary(BinaryOp::Add, v, neg_zero)
            }
            5 if self.float() => {
                let neg_zero = c(self, Scalar::F32(-0.0));
                self.binary(BinaryOp::Add, neg_zero, v)
            }
            6 => {
                let zero = c(self, zero);
                self.binary(BinaryOp::Sub, v, zero)
            }
            _ => self.binary(BinaryOp::Sub, v, v),
        }
    }

    fn reduce(&mut self, v: Val) -> Val {
        let dims = self.dims(v);
        let axes = self.axes(&dims);
        let n: usize = axes.iter().map(|&a| dims[a]).product();
        if self.rng.chance(2) {
            Val::new(self.env.reduce(ReduceOp::Max, v.id, &axes), v.bound)
        } else {
            Val::new(
                self.env.reduce(ReduceOp::Sum, v.id, &axes),
                v.bound * n as f64,
            )
        }
    }

    /// A non-empty random subset of the axes, increasing.
    fn axes(&mut self, dims: &[usize]) -> Vec<usize> {
        let picked: Vec<usize> = (0..dims.len()).filter(|_| self.rng.chance(2)).collect();
        if picked.is_empty() {
            vec![self.rng.below(dims.len())]
        } else {
            picked
        }
    }

    fn perm(&mut self, rank: usize) -> Vec<usize> {
        let mut perm: Vec<usize> = (0..rank).collect();
        for i in (1..rank).rev() {
            perm.swap(i, self.rng.below(i + 1));
        }
        perm
    }

    /// Another shape with as many elements: split, merge or keep.
    fn reshaped(&mut self, dims: &[usize]) -> Vec<usize> {
        let n: usize = dims.iter().product();
        match self.rng.below(4) {
            0 => dims.to_vec(),
            1 => vec![n],
            2 => {
                let mut out = dims.to_vec();
                out.insert(self.rng.below(dims.len() + 1), 1);
                out
            }
            _ => {
                let d = (2..=n)
                    .find(|&d| n.is_multiple_of(d) && self.rng.chance(2))
                    .unwrap_or(1);
                vec![d, n / d]
            }
        }
    }

    /// `v` broadcast along a size-1 axis (made by a reshape if needed), or to its own shape.
    fn expand(&mut self, v: Val) -> Val {
        let mut dims = self.dims(v);
        if self.rng.chance(3) {
            let id = self.env.expand(v.id, &dims);
            return Val::new(id, v.bound);
        }
        let mut id = v.id;
        if !dims.contains(&1) {
            dims.insert(self.rng.below(dims.len() + 1), 1);
            id = self.env.reshape(id, &dims);
        }
        let ones: Vec<usize> = (0..dims.len()).filter(|&a| dims[a] == 1).collect();
        let mut to = dims.clone();
        to[ones[self.rng.below(ones.len())]] = 2 + self.rng.below(2);
        Val::new(self.env.expand(id, &to), v.bound)
    }

    /// A flip, pad or shrink of `v`.
    fn view(&mut self, v: Val) -> Val {
        let dims = self.dims(v);
        let dtype = self.dtype;
        let c = |x: usize| Dim::constant(x as i64);
        let id = match self.rng.below(3) {
            0 => {
                let axes = self.axes(&dims);
                let shape = self.env.shape(v.id);
                self.env.node(Op::Flip(v.id, axes.into()), dtype, shape)
            }
            1 => {
                let pads: Vec<(usize, usize)> = dims
                    .iter()
                    .map(|_| (self.rng.below(2), self.rng.below(2)))
                    .collect();
                let out: Vec<usize> = dims.iter().zip(&pads).map(|(d, p)| d + p.0 + p.1).collect();
                let pads: Box<[(Dim, Dim)]> = pads.iter().map(|&(a, b)| (c(a), c(b))).collect();
                let value = self.random_scalar(3, 1);
                self.env
                    .node(Op::Pad(v.id, pads, value), dtype, Shape::from(out))
            }
            _ => {
                let mut ranges = Vec::new();
                let mut out = Vec::new();
                for &d in &dims {
                    let start = self.rng.below(d);
                    let step = 1 + self.rng.below(2);
                    ranges.push((c(start), c(step)));
                    out.push((d - start).div_ceil(step));
                }
                self.env
                    .node(Op::Shrink(v.id, ranges.into()), dtype, Shape::from(out))
            }
        };
        Val::new(id, v.bound.max(1.0))
    }
}

#[test]
fn random_graphs_compute_the_same_values_after_simplify() {
    let mut applied: FxHashMap<&'static str, usize> = FxHashMap::default();
    let mut changed = 0;
    let mut partitions: FxHashMap<&'static str, usize> = FxHashMap::default();
    let cases = 1000;
    for case in 0..cases {
        let dtype = if case % 3 == 2 { I32 } else { F32 };
        let mut g = Gen::new(case + 1, dtype);
        for _ in 0..4 + g.rng.below(10) {
            let v = g.step();
            // Squash values that grew large, so reassociated float sums stay accurate.
            let v = if g.float() && v.bound > 1e4 {
                g.unary(UnaryOp::Tanh, v, 1.0)
            } else {
                v
            };
            g.pool.push(v);
        }
        let last = g.pool[g.pool.len() - 1];
        let mut targets = vec![last];
        if g.rng.chance(2) {
            targets.push(g.pick());
        }
        let ids: Vec<NodeId> = targets.iter().map(|t| t.id).collect();
        let s = forms(&g.env.g, &ids, budget());
        assert_eq!(s.report.stop_reason, StopReason::Saturated, "case {case}");
        for &(name, n) in &s.report.applied {
            *applied.entry(name).or_default() += n;
        }
        let simplified = &s.forms[0];
        changed += usize::from(
            signature(&simplified.graph, &simplified.targets) != signature(&g.env.g, &ids),
        );
        let want = realize(&g.env.g, &g.env.data, &ids);
        // Every form computes the same values, as its default partition and as the
        // partition made for library routines (products materialized).
        for form in &s.forms {
            *partitions.entry(form.name).or_default() += 1;
            let (graph, ids) = (&form.graph, &form.targets);
            let separate = materialized_for(&find_matmuls(graph, &graph.toposort(ids)));
            let routine = kernelize_with(graph, ids, &separate).unwrap();
            let got = [
                realize(graph, &g.env.data, ids),
                run(graph, &g.env.data, ids, &routine),
            ];
            for (got, partition) in got.iter().zip(["default", "routine"]) {
                for (i, t) in targets.iter().enumerate() {
                    let dtype = g.env.dtype(t.id);
                    let what = format!(
                        "case {case} ({dtype}), {} form, {partition}, target {i}",
                        form.name
                    );
                    assert_same(&what, dtype, &got[i], &want[i], t.bound);
                }
            }
        }
        // The alternative partitions compute the same values.
        let graph = &g.env.g;
        let alternatives = [
            (
                "cooperative",
                Some(kernelize_cooperative(graph, &ids).unwrap()),
            ),
            ("rows", kernelize_rows(graph, &ids, &[]).unwrap()),
            ("shared", kernelize_shared(graph, &ids, 4).unwrap()),
            ("split views", {
                let split = views_to_split(graph, &graph.toposort(&ids));
                (!split.is_empty()).then(|| kernelize_with(graph, &ids, &split).unwrap())
            }),
        ];
        // A random launch shape per kernel (see `tessel_graph::tune`) computes the same.
        let mut tuned = kernelize(graph, &ids).unwrap();
        let mut retuned = 0;
        for k in &mut tuned.kernels {
            let mut variants = k.variants(graph, Search::Exhaustive);
            if !variants.is_empty() {
                *k = variants.swap_remove(g.rng.below(variants.len())).1;
                retuned += 1;
            }
        }
        let alternatives = alternatives
            .into_iter()
            .chain([("tuned", (retuned > 0).then_some(tuned))]);
        for (name, schedule) in alternatives {
            let Some(schedule) = schedule else {
                continue;
            };
            *partitions.entry(name).or_default() += 1;
            let got = run(graph, &g.env.data, &ids, &schedule);
            for (i, t) in targets.iter().enumerate() {
                let dtype = g.env.dtype(t.id);
                let what = format!("case {case} ({dtype}), {name} partition, target {i}");
                assert_same(&what, dtype, &got[i], &want[i], t.bound);
            }
        }
    }
    for (name, at_least) in [
        ("shared", 10),
        ("split views", 10),
        ("transposed", 10),
        ("tuned", 200),
    ] {
        assert!(
            partitions.get(name).copied().unwrap_or(0) >= at_least,
            "partitions and forms: {partitions:?}"
        );
    }
    for rule in tessel_graph::rules() {
        let n = applied.get(rule.name()).copied().unwrap_or(0);
        assert!(
            n > 0,
            "{} never fired in {cases} random graphs",
            rule.name()
        );
    }
    assert!(
        changed > cases as usize / 2,
        "only {changed} graphs simplified"
    );
}

/// One block of a transformer-like stack over `h: [8, 16]`, about 60 ops, full of the
/// patterns the rules remove: a normalization, a weighted branch, a residual.
fn block(e: &mut Env, h: NodeId) -> NodeId {
    let k = |e: &mut Env, v: f32, like| e.constant(Scalar::F32(v), like);
    let one = k(e, 1.0, h);
    let a = e.binary(BinaryOp::Mul, h, one);
    let neg_zero = k(e, -0.0, h);
    let a = e.binary(BinaryOp::Add, a, neg_zero);
    let a = e.unary(UnaryOp::Neg, a);
    let a = e.unary(UnaryOp::Neg, a);
    let a = e.permute(a, &[1, 0]);
    let a = e.permute(a, &[1, 0]);
    let a = e.reshape(a, &[128]);
    let a = e.reshape(a, &[4, 32]);
    let x = e.reshape(a, &[8, 16]);
    // Layer norm, with 1/16 as a folded constant.
    let s = e.reduce(ReduceOp::Sum, x, &[1]);
    let half = k(e, 0.5, s);
    let eighth = k(e, 0.125, s);
    let inv_n = e.binary(BinaryOp::Mul, half, eighth);
    let mean = e.binary(BinaryOp::Mul, s, inv_n);
    let mean = e.expand(mean, &[8, 16]);
    let d = e.binary(BinaryOp::Sub, x, mean);
    let d2 = e.binary(BinaryOp::Mul, d, d);
    let ss = e.reduce(ReduceOp::Sum, d2, &[1]);
    let var = e.binary(BinaryOp::Mul, ss, inv_n);
    let eps = k(e, 1e-5, var);
    let var = e.binary(BinaryOp::Add, var, eps);
    let rstd = e.unary(UnaryOp::Rsqrt, var);
    let rstd = e.expand(rstd, &[8, 16]);
    let y = e.binary(BinaryOp::Mul, d, rstd);
    // A gated branch: exp(log(exp(tanh y))), and two column sums that merge.
    let t = e.unary(UnaryOp::Tanh, y);
    let g = e.unary(UnaryOp::Exp, t);
    let g = e.unary(UnaryOp::Log, g);
    let g = e.unary(UnaryOp::Exp, g);
    let w = e.leaf(F32, &[8, 16]);
    let q = e.binary(BinaryOp::Mul, y, w);
    let sq = e.reduce(ReduceOp::Sum, q, &[0]);
    let sg = e.reduce(ReduceOp::Sum, g, &[0]);
    let col = e.binary(BinaryOp::Add, sq, sg);
    let col = e.expand(col, &[8, 16]);
    let o = e.binary(BinaryOp::Add, y, col);
    let o = e.unary(UnaryOp::Tanh, o);
    let zero = k(e, 0.0, o);
    let o = e.binary(BinaryOp::Sub, o, zero);
    let o = e.expand(o, &[8, 16]);
    let o = e.permute(o, &[0, 1]);
    let o = e.reshape(o, &[16, 8]);
    let o = e.reshape(o, &[8, 16]);
    let m = k(e, -0.5, o);
    let o = e.binary(BinaryOp::Max, o, m);
    // Softmax over rows, computed on a transposed copy and transposed back.
    let st = e.permute(o, &[1, 0]);
    let st = e.permute(st, &[1, 0]);
    let mx = e.reduce(ReduceOp::Max, st, &[1]);
    let mx = e.expand(mx, &[8, 16]);
    let sh = e.binary(BinaryOp::Sub, st, mx);
    let ex = e.unary(UnaryOp::Exp, sh);
    let den = e.reduce(ReduceOp::Sum, ex, &[1]);
    let den = e.expand(den, &[8, 16]);
    let sm = e.binary(BinaryOp::Div, ex, den);
    let sm1 = e.constant(Scalar::F32(1.0), sm);
    let sm = e.binary(BinaryOp::Mul, sm1, sm);
    let o = e.binary(BinaryOp::Add, o, sm);
    let o = e.unary(UnaryOp::Neg, o);
    let o = e.unary(UnaryOp::Neg, o);
    // Residual, scaled by (0.25 + 0.25).
    let r = e.binary(BinaryOp::Add, h, o);
    let quarter = k(e, 0.25, r);
    let scale = e.binary(BinaryOp::Add, quarter, quarter);
    e.binary(BinaryOp::Mul, r, scale)
}

/// `n` blocks over one input.
fn stack(n: usize) -> (Env, NodeId) {
    let mut env = Env::new();
    let mut h = env.leaf(F32, &[8, 16]);
    for _ in 0..n {
        h = block(&mut env, h);
    }
    (env, h)
}

#[test]
fn a_large_graph_saturates_and_shrinks() {
    let (env, h) = stack(12);
    let before = env.g.toposort(&[h]).len();
    let s = simplify(&env.g, &[h], budget());
    assert_eq!(
        s.report.stop_reason,
        StopReason::Saturated,
        "{:?}",
        s.report
    );
    let after = s.graph.len();
    assert!(after < before * 2 / 3, "{before} nodes became {after}");
    for (rule, n) in &s.report.applied {
        let expected = match *rule {
            "add-zero" | "zero-add" | "neg-zero-add" | "sub-self" | "matmul-transpose" => 0,
            // The constants are shared by all blocks (hash-consing).
            "const-fold" => 2,
            "neg-neg" | "permute-permute" | "reshape-id" => 24,
            "reshape-reshape" => 96,
            _ => 12,
        };
        assert_eq!(*n, expected, "{rule}");
    }
}

#[test]
fn a_stack_of_blocks_computes_the_same_after_simplify() {
    // Four blocks: the kernelizer recomputes the residual stream in every later kernel, so
    // interpreting deeper stacks in a debug build takes long.
    let (env, h) = stack(4);
    let s = simplify(&env.g, &[h], budget());
    let want = realize(&env.g, &env.data, &[h]);
    let got = realize(&s.graph, &env.data, &s.targets);
    assert_same("4 blocks", F32, &got[0], &want[0], 10.0);
}
