//! The e-graph: each rewrite rule on a minimal graph, the core invariants (leaves never
//! merge, constants do, congruence), saturation budgets, DOT output, and the key property:
//! random graphs compute the same values before and after `simplify`, run on the IR
//! interpreter.

use std::time::Duration;

use rustc_hash::FxHashMap;
use tessel_graph::egraph::Condition;
use tessel_graph::{
    Budget, ClassId, EGraph, ENode, Graph, LeafId, NodeId, Op, ReduceOp, Rewrite, Slot,
    StopReason, kernelize, signature, simplify,
};
use tessel_shape::{BinaryOp, Bindings, DType, Dim, Scalar, Shape, UnaryOp};

/// A seeded linear congruential generator (Knuth's MMIX constants).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    fn below(&mut self, n: usize) -> usize {
        self.next() as usize % n
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    /// A value in [-2, 2), a multiple of 2^-20.
    fn f32(&mut self) -> f32 {
        (self.next() >> 10) as f32 / (1u32 << 20) as f32 - 2.0
    }
}

/// A graph plus its leaves' data (little-endian bytes).
struct Env {
    g: Graph,
    data: FxHashMap<LeafId, Vec<u8>>,
    next_leaf: u64,
}

impl Env {
    fn new() -> Self {
        Env {
            g: Graph::new(),
            data: FxHashMap::default(),
            next_leaf: 0,
        }
    }

    /// A leaf of random data (seeded by its id: the same in every `Env`).
    fn leaf(&mut self, dtype: DType, dims: &[usize]) -> NodeId {
        let id = LeafId(self.next_leaf);
        self.next_leaf += 1;
        let mut rng = Lcg(id.0 * 7919 + 17);
        let n: usize = dims.iter().product();
        let bytes = (0..n)
            .flat_map(|_| match dtype {
                DType::F32 => rng.f32().to_le_bytes(),
                _ => (rng.below(9) as i32 - 4).to_le_bytes(),
            })
            .collect();
        self.data.insert(id, bytes);
        self.node(Op::Leaf(id), dtype, Shape::from(dims))
    }

    fn node(&mut self, op: Op, dtype: DType, shape: Shape) -> NodeId {
        self.g.add(tessel_graph::Node { op, dtype, shape })
    }

    fn dtype(&self, n: NodeId) -> DType {
        self.g.node(n).dtype
    }

    fn shape(&self, n: NodeId) -> Shape {
        self.g.node(n).shape.clone()
    }

    fn dims(&self, n: NodeId) -> Vec<usize> {
        self.shape(n).as_usizes().expect("constant shapes")
    }

    fn unary(&mut self, op: UnaryOp, a: NodeId) -> NodeId {
        let dtype = op.result_dtype(self.dtype(a)).expect("supported");
        let shape = self.shape(a);
        self.node(Op::Unary(op, a), dtype, shape)
    }

    fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        assert_eq!(self.shape(a), self.shape(b));
        let dtype = op.result_dtype(self.dtype(a)).expect("supported");
        let shape = self.shape(a);
        self.node(Op::Binary(op, a, b), dtype, shape)
    }

    fn constant(&mut self, value: Scalar, like: NodeId) -> NodeId {
        let shape = self.shape(like);
        self.node(Op::Const(value), value.dtype(), shape)
    }

    fn reduce(&mut self, op: ReduceOp, a: NodeId, axes: &[usize]) -> NodeId {
        let mut dims = self.shape(a).dims().to_vec();
        for &ax in axes {
            dims[ax] = Dim::constant(1);
        }
        let dtype = self.dtype(a);
        self.node(Op::Reduce(op, a, axes.into()), dtype, Shape::new(dims))
    }

    fn permute(&mut self, a: NodeId, perm: &[usize]) -> NodeId {
        let shape = self.shape(a);
        let dims: Vec<Dim> = perm.iter().map(|&p| shape[p]).collect();
        let dtype = self.dtype(a);
        self.node(Op::Permute(a, perm.into()), dtype, Shape::new(dims))
    }

    fn reshape(&mut self, a: NodeId, dims: &[usize]) -> NodeId {
        let dtype = self.dtype(a);
        self.node(Op::Reshape(a), dtype, Shape::from(dims))
    }

    fn expand(&mut self, a: NodeId, dims: &[usize]) -> NodeId {
        let dtype = self.dtype(a);
        self.node(Op::Expand(a), dtype, Shape::from(dims))
    }
}

/// Runs the schedule of `targets` on the interpreter and returns their bytes.
fn realize(g: &Graph, data: &FxHashMap<LeafId, Vec<u8>>, targets: &[NodeId]) -> Vec<Vec<u8>> {
    let schedule = kernelize(g, targets).unwrap();
    let (_, leaves) = signature(g, targets);
    let mut bufs: FxHashMap<Slot, Vec<u8>> = FxHashMap::default();
    for (i, leaf) in leaves.iter().enumerate() {
        bufs.insert(Slot::Input(i), data[leaf].clone());
    }
    for (n, dtype, numel) in &schedule.buffers {
        let len = numel.as_const().unwrap() as usize * dtype.size_bytes();
        bufs.insert(Slot::Node(*n), vec![0; len]);
    }
    for k in &schedule.kernels {
        let mut taken: Vec<Vec<u8>> = k
            .args
            .iter()
            .map(|a| std::mem::take(bufs.get_mut(a).unwrap()))
            .collect();
        let mut refs: Vec<&mut [u8]> = taken.iter_mut().map(Vec::as_mut_slice).collect();
        tessel_ir::interp::run(&k.kernel, &mut refs, &Bindings::new())
            .unwrap_or_else(|e| panic!("{e}\n{}", k.kernel));
        for (a, b) in k.args.iter().zip(taken) {
            bufs.insert(a.clone(), b);
        }
    }
    targets
        .iter()
        .map(|t| match g.node(*t).op {
            Op::Leaf(l) => data[&l].clone(),
            _ => bufs[&Slot::Node(*t)].clone(),
        })
        .collect()
}

/// Compares two outputs of `dtype`: integers exactly, `f32` within `1e-5` relative plus
/// `1e-5 * scale` absolute (`scale` bounds the magnitudes that went into the value, so
/// reassociated sums may cancel differently), NaN equal to NaN.
#[track_caller]
fn assert_same(what: &str, dtype: DType, got: &[u8], want: &[u8], scale: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if dtype != DType::F32 {
        assert_eq!(got, want, "{what}: {dtype} values differ");
        return;
    }
    for (i, (g, w)) in got.chunks(4).zip(want.chunks(4)).enumerate() {
        let g = f32::from_le_bytes(g.try_into().unwrap());
        let w = f32::from_le_bytes(w.try_into().unwrap());
        let ok = (g.is_nan() && w.is_nan())
            || g == w
            || (f64::from(g) - f64::from(w)).abs()
                <= 1e-5 * f64::from(w).abs() + 1e-5 * scale.max(1.0);
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

fn budget() -> Budget {
    Budget {
        iterations: 30,
        nodes: 10_000,
        time: Duration::from_secs(60),
    }
}

/// Simplifies `input`'s target and checks that `rule` fired, that the result is
/// structurally `expected`'s target, and that it computes the same values.
#[track_caller]
fn check(rule: &str, input: impl Fn(&mut Env) -> NodeId, expected: impl Fn(&mut Env) -> NodeId) {
    let mut a = Env::new();
    let t = input(&mut a);
    let mut b = Env::new();
    let e = expected(&mut b);
    let s = simplify(&a.g, &[t], budget());
    assert!(s.report.applied(rule) > 0, "{rule} never fired: {:?}", s.report);
    assert_eq!(
        signature(&s.graph, &s.targets),
        signature(&b.g, &[e]),
        "{rule}: not the expected form"
    );
    let dtype = a.dtype(t);
    let (got, want) = (realize(&s.graph, &a.data, &s.targets), realize(&a.g, &a.data, &[t]));
    assert_same(rule, dtype, &got[0], &want[0], 100.0);
}

/// Simplifies `input`'s target and checks that nothing changed its form.
#[track_caller]
fn check_unchanged(input: impl Fn(&mut Env) -> NodeId) {
    let mut a = Env::new();
    let t = input(&mut a);
    let s = simplify(&a.g, &[t], budget());
    assert_eq!(signature(&s.graph, &s.targets), signature(&a.g, &[t]));
}

const F32: DType = DType::F32;
const I32: DType = DType::I32;

#[test]
fn identities_fire_and_extract_the_operand() {
    let mul = |op_first: bool| {
        move |e: &mut Env| {
            let x = e.leaf(F32, &[2, 3]);
            let one = e.constant(Scalar::F32(1.0), x);
            let (l, r) = if op_first { (one, x) } else { (x, one) };
            e.binary(BinaryOp::Mul, l, r)
        }
    };
    let leaf = |dtype| move |e: &mut Env| e.leaf(dtype, &[2, 3]);
    check("mul-one", mul(false), leaf(F32));
    check("one-mul", mul(true), leaf(F32));
    let add = |dtype, zero: Scalar, zero_first: bool| {
        move |e: &mut Env| {
            let x = e.leaf(dtype, &[2, 3]);
            let z = e.constant(zero, x);
            let (l, r) = if zero_first { (z, x) } else { (x, z) };
            e.binary(BinaryOp::Add, l, r)
        }
    };
    check("add-zero", add(I32, Scalar::I32(0), false), leaf(I32));
    check("zero-add", add(I32, Scalar::I32(0), true), leaf(I32));
    check("add-neg-zero", add(F32, Scalar::F32(-0.0), false), leaf(F32));
    check("neg-zero-add", add(F32, Scalar::F32(-0.0), true), leaf(F32));
    // A float leaf may hold -0, and -0 + 0 is +0: x + 0 stays.
    check_unchanged(add(F32, Scalar::F32(0.0), false));
    // exp(x) is sign-clear, so exp(x) + 0 is exp(x).
    check(
        "add-zero",
        |e| {
            let x = e.leaf(F32, &[3]);
            let y = e.unary(UnaryOp::Exp, x);
            let z = e.constant(Scalar::F32(0.0), y);
            e.binary(BinaryOp::Add, y, z)
        },
        |e| {
            let x = e.leaf(F32, &[3]);
            e.unary(UnaryOp::Exp, x)
        },
    );
    let sub_zero = |e: &mut Env| {
        let x = e.leaf(F32, &[2, 3]);
        let z = e.constant(Scalar::F32(0.0), x);
        e.binary(BinaryOp::Sub, x, z)
    };
    check("sub-zero", sub_zero, leaf(F32));
    let sub_self = |dtype| {
        move |e: &mut Env| {
            let x = e.leaf(dtype, &[2, 3]);
            e.binary(BinaryOp::Sub, x, x)
        }
    };
    check("sub-self", sub_self(I32), |e| {
        let like = e.leaf(I32, &[2, 3]);
        e.constant(Scalar::I32(0), like)
    });
    // inf - inf and NaN - NaN are NaN: x - x stays on floats.
    check_unchanged(sub_self(F32));
    check(
        "neg-neg",
        |e| {
            let x = e.leaf(I32, &[4]);
            let n = e.unary(UnaryOp::Neg, x);
            e.unary(UnaryOp::Neg, n)
        },
        leaf_1d(I32, 4),
    );
}

fn leaf_1d(dtype: DType, n: usize) -> impl Fn(&mut Env) -> NodeId {
    move |e: &mut Env| e.leaf(dtype, &[n])
}

#[test]
fn exp_log_needs_a_sign_clear_operand() {
    let exp_log = |inner: Option<UnaryOp>| {
        move |e: &mut Env| {
            let x = e.leaf(F32, &[5]);
            let x = inner.map_or(x, |op| e.unary(op, x));
            let l = e.unary(UnaryOp::Log, x);
            e.unary(UnaryOp::Exp, l)
        }
    };
    let expected = |op| {
        move |e: &mut Env| {
            let x = e.leaf(F32, &[5]);
            e.unary(op, x)
        }
    };
    check("exp-log", exp_log(Some(UnaryOp::Exp)), expected(UnaryOp::Exp));
    check("exp-log", exp_log(Some(UnaryOp::Abs)), expected(UnaryOp::Abs));
    // A leaf may be negative: exp(log x) is NaN there, not x.
    check_unchanged(exp_log(None));
    check_unchanged(exp_log(Some(UnaryOp::Neg)));
}

#[test]
fn movement_chains_fold() {
    let x234 = |e: &mut Env| e.leaf(F32, &[2, 3, 4]);
    check(
        "permute-permute",
        |e| {
            let x = x234(e);
            let p = e.permute(x, &[1, 0, 2]);
            e.permute(p, &[0, 2, 1])
        },
        |e| {
            let x = x234(e);
            e.permute(x, &[1, 2, 0])
        },
    );
    check(
        "permute-permute",
        |e| {
            let x = x234(e);
            let p = e.permute(x, &[1, 2, 0]);
            e.permute(p, &[2, 0, 1])
        },
        x234,
    );
    check(
        "permute-id",
        |e| {
            let x = x234(e);
            e.permute(x, &[0, 1, 2])
        },
        x234,
    );
    check(
        "reshape-reshape",
        |e| {
            let x = x234(e);
            let r = e.reshape(x, &[6, 4]);
            let r = e.reshape(r, &[4, 6]);
            e.reshape(r, &[8, 3])
        },
        |e| {
            let x = x234(e);
            e.reshape(x, &[8, 3])
        },
    );
    check(
        "reshape-id",
        |e| {
            let x = x234(e);
            let r = e.reshape(x, &[24]);
            e.reshape(r, &[2, 3, 4])
        },
        x234,
    );
    check(
        "expand-id",
        |e| {
            let x = x234(e);
            e.expand(x, &[2, 3, 4])
        },
        x234,
    );
}

#[test]
fn sums_of_sums_merge_and_sums_of_adds_stay() {
    let two = |e: &mut Env, dtype| (e.leaf(dtype, &[3, 4]), e.leaf(dtype, &[3, 4]));
    for dtype in [F32, I32] {
        check(
            "sum-add",
            |e| {
                let (a, b) = two(e, dtype);
                let sa = e.reduce(ReduceOp::Sum, a, &[1]);
                let sb = e.reduce(ReduceOp::Sum, b, &[1]);
                e.binary(BinaryOp::Add, sa, sb)
            },
            |e| {
                let (a, b) = two(e, dtype);
                let s = e.binary(BinaryOp::Add, a, b);
                e.reduce(ReduceOp::Sum, s, &[1])
            },
        );
        // The split form is found, and the cheaper original extracted.
        let sum_of_add = |e: &mut Env| {
            let (a, b) = two(e, dtype);
            let s = e.binary(BinaryOp::Add, a, b);
            e.reduce(ReduceOp::Sum, s, &[1])
        };
        check("sum-split", sum_of_add, sum_of_add);
    }
    // Different axes: nothing to merge.
    check_unchanged(|e| {
        let (a, b) = (e.leaf(F32, &[3, 3]), e.leaf(F32, &[3, 3]));
        let sa = e.reduce(ReduceOp::Sum, a, &[1]);
        let sb = e.reduce(ReduceOp::Sum, b, &[0]);
        let sb = e.permute(sb, &[1, 0]);
        e.binary(BinaryOp::Add, sa, sb)
    });
}

#[test]
fn constants_fold_where_every_backend_agrees() {
    // (2 + 3) * x -> 5 * x
    check(
        "const-fold",
        |e| {
            let x = e.leaf(F32, &[4]);
            let two = e.constant(Scalar::F32(2.0), x);
            let three = e.constant(Scalar::F32(3.0), x);
            let five = e.binary(BinaryOp::Add, two, three);
            e.binary(BinaryOp::Mul, five, x)
        },
        |e| {
            let x = e.leaf(F32, &[4]);
            let five = e.constant(Scalar::F32(5.0), x);
            e.binary(BinaryOp::Mul, five, x)
        },
    );
    // Integer division by zero is defined (a / 0 == a); casts and movement fold too.
    check(
        "const-fold",
        |e| {
            let x = e.leaf(I32, &[2, 3]);
            let seven = e.constant(Scalar::I32(7), x);
            let zero = e.constant(Scalar::I32(0), x);
            let q = e.binary(BinaryOp::Div, seven, zero);
            let q = e.permute(q, &[1, 0]);
            let q = e.reshape(q, &[6]);
            let q = e.node(Op::Cast(q), F32, Shape::from([6]));
            let x = e.reshape(x, &[6]);
            let x = e.node(Op::Cast(x), F32, Shape::from([6]));
            e.binary(BinaryOp::Add, x, q)
        },
        |e| {
            let x = e.leaf(I32, &[2, 3]);
            let x = e.reshape(x, &[6]);
            let x = e.node(Op::Cast(x), F32, Shape::from([6]));
            let seven = e.constant(Scalar::F32(7.0), x);
            e.binary(BinaryOp::Add, x, seven)
        },
    );
    // Transcendentals and float division may differ by ulps on a device: not folded.
    for op in [UnaryOp::Exp, UnaryOp::Sqrt, UnaryOp::Reciprocal] {
        check_unchanged(|e| {
            let x = e.leaf(F32, &[4]);
            let c = e.constant(Scalar::F32(2.0), x);
            let y = e.unary(op, c);
            e.binary(BinaryOp::Mul, x, y)
        });
    }
    check_unchanged(|e| {
        let x = e.leaf(F32, &[4]);
        let c = e.constant(Scalar::F32(2.0), x);
        let d = e.constant(Scalar::F32(3.0), x);
        let y = e.binary(BinaryOp::Div, c, d);
        e.binary(BinaryOp::Mul, x, y)
    });
}

#[test]
fn leaves_never_merge_and_constants_merge_by_value() {
    let mut env = Env::new();
    let a = env.leaf(F32, &[3]);
    let b = env.leaf(F32, &[3]);
    let one = env.constant(Scalar::F32(1.0), a);
    let ea = env.unary(UnaryOp::Exp, a);
    let eb = env.unary(UnaryOp::Exp, b);
    let (mut eg, c) = EGraph::from_graph(&env.g, &[a, b, one, ea, eb]);
    assert_ne!(c[0], c[1], "equal-looking leaves are distinct classes");
    assert_ne!(c[3], c[4]);
    assert_eq!(eg.class(c[0]).leaf(), Some(LeafId(0)));
    // Constants merge by value: the same value given in another dtype is the same e-node.
    let shape = Shape::from([3]);
    let as_f64 = eg.add(ENode::new(Op::Const(Scalar::F64(1.0)), F32, shape.clone()));
    assert_eq!(as_f64, c[2]);
    let neg_zero = eg.add(ENode::new(Op::Const(Scalar::F32(-0.0)), F32, shape.clone()));
    let zero = eg.add(ENode::new(Op::Const(Scalar::F32(0.0)), F32, shape.clone()));
    assert_ne!(neg_zero, zero, "-0 and +0 are different values");
    let other_shape = eg.add(ENode::new(Op::Const(Scalar::F32(1.0)), F32, Shape::from([1])));
    assert_ne!(other_shape, c[2]);
    assert_eq!(eg.class(c[2]).constant(), Some(Scalar::F32(1.0)));
    // Saturating never merges the leaves, whatever it finds.
    let report = eg.saturate(tessel_graph::rules(), budget());
    assert_eq!(report.stop_reason, StopReason::Saturated);
    assert_ne!(eg.find(c[0]), eg.find(c[1]));
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "never merge")]
fn merging_two_leaves_is_a_bug() {
    let mut env = Env::new();
    let a = env.leaf(F32, &[3]);
    let b = env.leaf(F32, &[3]);
    let (mut eg, c) = EGraph::from_graph(&env.g, &[a, b]);
    eg.union(c[0], c[1]);
}

#[test]
fn rebuild_restores_congruence() {
    // x * 1 = x, found by hand: then exp(x * 1) = exp(x) and neg(exp(x * 1)) = neg(exp(x)).
    let mut env = Env::new();
    let x = env.leaf(F32, &[3]);
    let one = env.constant(Scalar::F32(1.0), x);
    let x1 = env.binary(BinaryOp::Mul, x, one);
    let f_x = env.unary(UnaryOp::Exp, x);
    let f_x1 = env.unary(UnaryOp::Exp, x1);
    let g_x = env.unary(UnaryOp::Neg, f_x);
    let g_x1 = env.unary(UnaryOp::Neg, f_x1);
    let (mut eg, c) = EGraph::from_graph(&env.g, &[x, x1, f_x, f_x1, g_x, g_x1]);
    let before = eg.n_classes();
    assert!(eg.union(c[0], c[1]));
    assert_ne!(eg.find(c[2]), eg.find(c[3]), "congruence waits for rebuild");
    assert_eq!(eg.rebuild(), 2, "two congruent pairs merged");
    assert_eq!(eg.find(c[2]), eg.find(c[3]));
    assert_eq!(eg.find(c[4]), eg.find(c[5]));
    assert_eq!(eg.n_classes(), before - 3);
    // The class of x now holds x * 1, which uses the class itself: extraction copes.
    let mut g = Graph::new();
    let out = eg.to_graph(&[c[5]], &mut g);
    assert_eq!(g.len(), 3, "leaf, exp, neg");
    assert!(matches!(g.node(out[0]).op, Op::Unary(UnaryOp::Neg, _)));
}

#[test]
fn to_graph_writes_into_a_graph_in_use() {
    let mut env = Env::new();
    let x = env.leaf(F32, &[3]);
    let one = env.constant(Scalar::F32(1.0), x);
    let y = env.binary(BinaryOp::Mul, x, one);
    let (mut eg, c) = EGraph::from_graph(&env.g, &[y]);
    eg.saturate(tessel_graph::rules(), budget());
    let out = eg.to_graph(&c, &mut env.g);
    assert_eq!(out, vec![x], "x * 1 is the leaf x, whose node already exists");
    // The caller got one count: releasing it and the original handles frees the leaf.
    assert!(env.g.release(out[0]).is_empty());
    assert!(env.g.release(y).is_empty());
    assert_eq!(env.g.release(x), vec![LeafId(0)]);
    assert!(env.g.release(one).is_empty());
    assert!(env.g.is_empty());
}

/// `x0 + x1 + ... + x(n-1)` as a left-leaning chain.
fn add_chain(env: &mut Env, n: usize) -> NodeId {
    let mut acc = env.leaf(F32, &[2]);
    for _ in 1..n {
        let x = env.leaf(F32, &[2]);
        acc = env.binary(BinaryOp::Add, acc, x);
    }
    acc
}

#[test]
fn saturation_stops_within_its_budget() {
    // Commutativity and associativity: the number of forms of an n-term sum explodes.
    let ac = [
        Rewrite::new("comm", "(add ?a ?b)", "(add ?b ?a)", &[]).unwrap(),
        Rewrite::new("assoc", "(add (add ?a ?b) ?c)", "(add ?a (add ?b ?c))", &[]).unwrap(),
    ];
    let mut env = Env::new();
    let t = add_chain(&mut env, 12);
    let (eg, _) = EGraph::from_graph(&env.g, &[t]);
    let run = |budget: Budget| eg.clone().saturate(&ac, budget);
    let nodes = run(Budget {
        nodes: 2_000,
        ..budget()
    });
    assert_eq!(nodes.stop_reason, StopReason::NodeLimit);
    assert!(nodes.nodes < 2_100, "{nodes:?}");
    let iterations = run(Budget {
        iterations: 2,
        ..budget()
    });
    assert_eq!(iterations.stop_reason, StopReason::IterationLimit);
    assert_eq!(iterations.iterations, 2);
    let time = run(Budget {
        time: Duration::ZERO,
        ..budget()
    });
    assert_eq!(time.stop_reason, StopReason::TimeLimit);
    assert_eq!(time.iterations, 0);
    // A small sum saturates: (2^n - 2) * ... forms, all found.
    let mut env = Env::new();
    let t = add_chain(&mut env, 3);
    let (mut eg, c) = EGraph::from_graph(&env.g, &[t]);
    let report = eg.saturate(&ac, budget());
    assert_eq!(report.stop_reason, StopReason::Saturated, "{report:?}");
    // 3 leaves; sums of 2 (3 classes, 2 orders each); the total (3 pairs x 2 orders).
    assert_eq!((report.classes, report.nodes), (7, 15));
    assert_eq!(eg.find(c[0]), eg.find(c[0]));
}

#[test]
fn conditions_and_patterns_are_checked_when_built() {
    let err = Rewrite::new("bad", "(mul ?x 1)", "?y", &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rewrite bad: `?y` uses ?y, which `(mul ?x 1)` never binds"
    );
    let err = Rewrite::new("bad", "(exp ?x)", "?x", &[Condition::SignClear("?y")]).unwrap_err();
    assert!(err.to_string().contains("never binds"), "{err}");
}

#[test]
fn dot_output_is_well_formed() {
    let mut env = Env::new();
    let x = env.leaf(F32, &[2, 3]);
    let one = env.constant(Scalar::F32(1.0), x);
    let y = env.binary(BinaryOp::Mul, x, one);
    let p = env.permute(y, &[1, 0]);
    let t = env.unary(UnaryOp::Neg, p);
    let (mut eg, c) = EGraph::from_graph(&env.g, &[t]);
    eg.saturate(tessel_graph::rules(), budget());
    let dot = eg.to_dot(&c);
    assert!(dot.starts_with("digraph"), "{dot}");
    assert_eq!(dot.matches('{').count(), dot.matches('}').count(), "{dot}");
    let mut declared = Vec::new();
    let mut endpoints = Vec::new();
    for line in dot.lines().map(str::trim) {
        if let Some((from, rest)) = line.split_once(" -> ") {
            let to = rest.split_whitespace().next().unwrap();
            endpoints.extend([from.to_owned(), to.to_owned()]);
        } else if line.starts_with('"') {
            declared.push(line.split_whitespace().next().unwrap().to_owned());
        }
    }
    assert!(!endpoints.is_empty());
    for end in &endpoints {
        assert!(declared.contains(end), "{end} is not declared in\n{dot}");
    }
    assert_eq!(dot.matches("fillcolor").count(), 3, "leaf, permute, neg chosen:\n{dot}");
    assert!(dot.contains("mul") && dot.contains("permute [1, 0]"), "{dot}");
}

#[test]
fn class_ids_print_short() {
    assert_eq!(format!("{:?}", ClassId(3)), "c3");
    assert_eq!(ClassId(3).to_string(), "c3");
}

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
        match self.rng.below(13) {
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
            _ => self.view(v),
        }
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
            Val::new(self.env.reduce(ReduceOp::Sum, v.id, &axes), v.bound * n as f64)
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
                let d = (2..=n).find(|d| n % d == 0 && self.rng.chance(2)).unwrap_or(1);
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
                self.env.node(Op::Pad(v.id, pads, value), dtype, Shape::from(out))
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
        let s = simplify(&g.env.g, &ids, budget());
        assert_eq!(s.report.stop_reason, StopReason::Saturated, "case {case}");
        for &(name, n) in &s.report.applied {
            *applied.entry(name).or_default() += n;
        }
        changed += usize::from(signature(&s.graph, &s.targets) != signature(&g.env.g, &ids));
        let want = realize(&g.env.g, &g.env.data, &ids);
        let got = realize(&s.graph, &g.env.data, &s.targets);
        for (i, t) in targets.iter().enumerate() {
            let dtype = g.env.dtype(t.id);
            let what = format!("case {case} ({dtype}), target {i}");
            assert_same(&what, dtype, &got[i], &want[i], t.bound);
        }
    }
    for rule in tessel_graph::rules() {
        let n = applied.get(rule.name()).copied().unwrap_or(0);
        assert!(n > 0, "{} never fired in {cases} random graphs", rule.name());
    }
    assert!(changed > cases as usize / 2, "only {changed} graphs simplified");
    eprintln!("STATS changed {changed}/{cases} applied {applied:?}");
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

#[test]
fn a_large_graph_saturates_and_computes_the_same() {
    let start = std::time::Instant::now();
    let mut env = Env::new();
    let mut h = env.leaf(F32, &[8, 16]);
    for _ in 0..12 {
        h = block(&mut env, h);
    }
    let built = start.elapsed();
    let before = env.g.toposort(&[h]).len();
    let s = simplify(&env.g, &[h], budget());
    let simplified = start.elapsed() - built;
    assert_eq!(s.report.stop_reason, StopReason::Saturated, "{:?}", s.report);
    let after = s.graph.len();
    assert!(after < before * 3 / 4, "{before} nodes became {after}");
    let want = realize(&env.g, &env.data, &[h]);
    let got = realize(&s.graph, &env.data, &s.targets);
    assert_same("12 blocks", F32, &got[0], &want[0], 10.0);
    eprintln!(
        "TIMING graph {before} nodes built in {built:?}; simplify (e-graph + saturate + \
         extract) {simplified:?}; {after} nodes; {:?}",
        s.report
    );
}
