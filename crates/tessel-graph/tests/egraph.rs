//! The e-graph: each rewrite rule on a minimal graph, the core invariants (leaves never
//! merge, constants do, congruence), saturation budgets, DOT output, and the key property:
//! random graphs compute the same values before and after `simplify`, run on the IR
//! interpreter.

use std::time::Duration;

use tessel_graph::egraph::{Budget, ClassId, Condition, ENode, StopReason};
use tessel_graph::{EGraph, Graph, LeafId, NodeId, Op, ReduceOp, Rewrite, signature, simplify};
use tessel_shape::{BinaryOp, DType, Scalar, Shape, UnaryOp};

#[path = "egraph/random.rs"]
mod random;
#[path = "egraph/support.rs"]
mod support;

use support::{Env, assert_same, realize};

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
    assert!(
        s.report.applied(rule) > 0,
        "{rule} never fired: {:?}",
        s.report
    );
    assert_eq!(
        signature(&s.graph, &s.targets),
        signature(&b.g, &[e]),
        "{rule}: not the expected form"
    );
    let dtype = a.dtype(t);
    let (got, want) = (
        realize(&s.graph, &a.data, &s.targets),
        realize(&a.g, &a.data, &[t]),
    );
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
    check(
        "add-neg-zero",
        add(F32, Scalar::F32(-0.0), false),
        leaf(F32),
    );
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
    check(
        "exp-log",
        exp_log(Some(UnaryOp::Exp)),
        expected(UnaryOp::Exp),
    );
    check(
        "exp-log",
        exp_log(Some(UnaryOp::Abs)),
        expected(UnaryOp::Abs),
    );
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
    let other_shape = eg.add(ENode::new(
        Op::Const(Scalar::F32(1.0)),
        F32,
        Shape::from([1]),
    ));
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
    assert_eq!(
        out,
        vec![x],
        "x * 1 is the leaf x, whose node already exists"
    );
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
    assert_eq!(
        dot.matches("fillcolor").count(),
        3,
        "leaf, permute, neg chosen:\n{dot}"
    );
    assert!(
        dot.contains("mul") && dot.contains("permute [1, 0]"),
        "{dot}"
    );
}

#[test]
fn class_ids_print_short() {
    assert_eq!(format!("{:?}", ClassId(3)), "c3");
    assert_eq!(ClassId(3).to_string(), "c3");
}

/// `Tensor::matmul`'s recording of `a @ b` over `[batch, m, k, n]`.
fn matmul(e: &mut Env, a: NodeId, b: NodeId) -> NodeId {
    let (da, db) = (e.dims(a), e.dims(b));
    let r = da.len() - 2;
    let (batch, m, k, n) = (&da[..r], da[r], da[r + 1], db[r + 1]);
    let with = |tail: &[usize]| -> Vec<usize> { batch.iter().chain(tail).copied().collect() };
    let a3 = e.reshape(a, &with(&[m, k, 1]));
    let b3 = e.reshape(b, &with(&[1, k, n]));
    let a3 = e.expand(a3, &with(&[m, k, n]));
    let b3 = e.expand(b3, &with(&[m, k, n]));
    let p = e.binary(BinaryOp::Mul, a3, b3);
    let s = e.reduce(ReduceOp::Sum, p, &[r + 1]);
    e.reshape(s, &with(&[m, n]))
}

/// `(A·B)ᵀ = Bᵀ·Aᵀ`: the rule adds the transposed product to the class of the transposed
/// one (the static cost keeps the original), and the transposed form extracts it:
/// `reshape(sum(mul(...)))` with no permute on top, computing the same bits on the
/// interpreter (same products, same order), for floats and integers, batched or not.
#[test]
fn transposed_products_are_products_of_transposes() {
    for (dtype, dims_a, dims_b) in [
        (F32, vec![5, 3], vec![3, 4]),
        (I32, vec![2, 5, 3], vec![2, 3, 4]),
    ] {
        let mut e = Env::new();
        let (a, b) = (e.leaf(dtype, &dims_a), e.leaf(dtype, &dims_b));
        let c = matmul(&mut e, a, b);
        let r = dims_a.len();
        let mut swap: Vec<usize> = (0..r).collect();
        swap.swap(r - 2, r - 1);
        let t = e.permute(c, &swap);
        let f = tessel_graph::egraph::forms(&e.g, &[t], budget());
        assert!(f.report.applied("matmul-transpose") > 0, "{:?}", f.report);
        assert_eq!(f.forms.len(), 2, "{f:?}");
        let form = &f.forms[1];
        let top = form.graph.node(form.targets[0]);
        let Op::Reshape(sum) = top.op else {
            panic!("the transposed form's target is {:?}", top.op)
        };
        assert!(matches!(
            form.graph.node(sum).op,
            Op::Reduce(ReduceOp::Sum, ..)
        ));
        let want = realize(&e.g, &e.data, &[t]);
        let got = realize(&form.graph, &e.data, &form.targets);
        assert_eq!(got, want, "{dtype}: the same bits");
    }
}

/// A `[2, 3, 4, 8]` leaf doubled 64 times (`x + x`): each level reads the one below twice,
/// as a deep model's layers read the residual stream, so its tree cost passes 10^19.
fn shared_chain(env: &mut Env) -> NodeId {
    let mut x = env.leaf(F32, &[2, 3, 4, 8]);
    for _ in 0..64 {
        x = env.binary(BinaryOp::Add, x, x);
    }
    x
}

/// `q @ kᵀ` with `k` split out of `[batch, s, heads, e]` rows by one merged permute
/// (`[0, 2, 3, 1]`), on top of a value whose tree cost an `f64` cannot add 0.1 to: the
/// transposed form still splits the permute into heads, then a transpose the product reads
/// (a deep layer's attention is matched like a shallow one's).
#[test]
fn deep_graphs_get_their_transposes_split() {
    let mut e = Env::new();
    let rows = shared_chain(&mut e);
    let k_t = e.permute(rows, &[0, 2, 3, 1]);
    let q = e.leaf(F32, &[2, 4, 3, 8]);
    let scores = matmul(&mut e, q, k_t);
    let f = tessel_graph::egraph::forms(&e.g, &[scores], budget());
    assert_eq!(f.forms.len(), 2, "{f:?}");
    let form = &f.forms[1];
    let permutes: Vec<Vec<usize>> = form
        .graph
        .toposort(&form.targets)
        .into_iter()
        .filter_map(|n| match &form.graph.node(n).op {
            Op::Permute(_, p) => Some(p.to_vec()),
            _ => None,
        })
        .collect();
    assert_eq!(permutes, vec![vec![0, 2, 1, 3], vec![0, 1, 3, 2]]);
    let want = realize(&e.g, &e.data, &[scores]);
    let got = realize(&form.graph, &e.data, &form.targets);
    assert_eq!(got, want, "the same bits");
}
