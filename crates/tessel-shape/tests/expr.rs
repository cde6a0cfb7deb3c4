//! Symbolic expressions: canonical forms, bounds, evaluation and the text form.
//!
//! The property tests build random expression trees over random bounded variables, then
//! check the canonical expression against a naive evaluation of the *unsimplified* tree
//! (in `i128`, so no intermediate overflows) at random bindings inside the bounds.

use std::fmt::Write;

use proptest::prelude::*;
use tessel_shape::{Bindings, EvalError, Expr, Var};

fn var(name: &str, lo: i64, hi: i64) -> Expr {
    Var::new(name, lo, hi).unwrap().into()
}

// ---------------------------------------------------------------------------------------
// Canonical forms
// ---------------------------------------------------------------------------------------

#[test]
fn sums_and_products_are_polynomials() {
    let (a, b) = (var("a", -10, 10), var("b", 0, 100));
    assert_eq!(a + b, b + a);
    assert_eq!(a * b, b * a);
    assert_eq!(2 * (b + 1), b * 2 + 2);
    assert_eq!((a + b) * (a - b), a * a - b * b);
    assert_eq!(a + 0, a);
    assert_eq!(a * 1, a);
    let zero = Expr::constant(0);
    assert_eq!(a * zero, zero);
    assert_eq!(a - a, Expr::constant(0));
    assert_eq!(-(-a), a);
    assert_eq!((a + 3) - (a + 1), Expr::constant(2));
    assert_eq!(Expr::constant(6) * 7, Expr::constant(42));
}

#[test]
fn division_and_modulo_by_constants() {
    let x = var("x", 0, 1000);
    let k = var("k", -50, 50);
    let i = var("i", 0, 63);
    // (x*a)/a == x, and multiples of the divisor leave a modulo.
    assert_eq!((x * 8) / 8, x);
    assert_eq!((x + k * 4) % 4, x % 4);
    assert_eq!((x * 12 + 5) / 4, x * 3 + 1);
    // Bounds decide: (x % 8) / 8 == 0 when x >= 0, i < 64.
    assert_eq!((x % 8) / 8, Expr::constant(0));
    assert_eq!(i / 64, Expr::constant(0));
    assert_eq!(i % 64, i);
    assert_eq!((i + 64) % 64, i);
    // A flat index split back into its coordinates.
    let b = var("b", 0, 31);
    let flat = b * 64 + i;
    assert_eq!(flat / 64, b);
    assert_eq!(flat % 64, i);
    // Common factors cancel and small remainders drop.
    assert_eq!((x * 4 + 2) / 8, (x * 2 + 1) / 4);
    assert_eq!((x * 4 + (i % 4)) / 8, x / 2);
    assert_eq!((x * 4 + (i % 4)) % 8, (x % 2) * 4 + i % 4);
    // Nested divisions and moduli.
    assert_eq!((x / 4) / 8, x / 32);
    assert_eq!((x % 32) % 8, x % 8);
    // Negative divisors follow floor semantics.
    assert_eq!(Expr::constant(7) / -2, Expr::constant(-4));
    assert_eq!(Expr::constant(7) % -2, Expr::constant(-1));
    assert_eq!(Expr::constant(-7) % 2, Expr::constant(1));
    assert_eq!(x.checked_div(0), None);
    assert_eq!(x.checked_rem(0), None);
}

#[test]
fn symbolic_divisors() {
    let n = var("n", 1, 64);
    let m = var("m", 0, 1000);
    assert_eq!((m * n) / n, m);
    assert_eq!((m * n * 3) % n, Expr::constant(0));
    assert_eq!(n / n, Expr::constant(1));
    let small = var("s", 0, 0);
    assert_eq!(small / n, Expr::constant(0));
    assert_eq!(
        (m / n).eval(&Bindings::new()),
        Err(EvalError::Unbound {
            name: "m".into(),
            expr: "m / n".into(),
        })
    );
}

#[test]
fn min_max_and_comparisons_fold_on_bounds() {
    let x = var("x", 0, 10);
    let y = var("y", 20, 30);
    let z = var("z", 5, 25);
    assert_eq!(x.min(y), x);
    assert_eq!(x.max(y), y);
    assert_eq!(x.max(0), x);
    assert_eq!((x + 1).min(x), x);
    assert_eq!(x.min(z), z.min(x));
    assert_eq!(x.cmp_lt(y), Expr::constant(1));
    assert_eq!(y.cmp_le(x), Expr::constant(0));
    assert_eq!(x.cmp_eq(y), Expr::constant(0));
    assert_eq!(x.cmp_ne(y), Expr::constant(1));
    assert_eq!(x.cmp_lt(z).bounds().lo, 0);
    assert_eq!((x + 1).cmp_gt(x), Expr::constant(1));
}

#[test]
fn substitution_recanonicalizes() {
    let nv = Var::new("n", 1, 100).unwrap();
    let n = Expr::from(nv);
    let i = var("i", 0, 7);
    let e = (n * 8 + i) / 8;
    assert_eq!(e, n);
    let e = (i + n) % 8;
    assert_eq!(e.substitute(&[(nv, Expr::constant(16))]), i);
    assert_eq!(e.substitute(&[(nv, n * 8)]), i);
    assert_eq!(((i + n) * 2).vars().len(), 2);
}

#[test]
fn eval_reports_bad_bindings() {
    let nv = Var::new("n", 1, 10).unwrap();
    let e = Expr::from(nv) * 2;
    assert_eq!(e.eval(&Bindings::new().with(nv, 3)), Ok(6));
    let err = e.eval(&Bindings::new().with(nv, 11)).unwrap_err();
    assert_eq!(
        err,
        EvalError::OutOfBounds {
            name: "n".into(),
            value: 11,
            lo: 1,
            hi: 10
        }
    );
    assert!(err.to_string().contains("1..=10"));
    let zero_ok = Var::new("d", -3, 3).unwrap();
    let q = Expr::constant(5) / Expr::from(zero_ok);
    assert!(matches!(
        q.eval(&Bindings::new().with(zero_ok, 0)),
        Err(EvalError::DivisionByZero { .. })
    ));
    assert!(Var::new("bad", 4, 3).is_err());
}

// ---------------------------------------------------------------------------------------
// Text form
// ---------------------------------------------------------------------------------------

#[test]
fn display_reads_like_code() {
    let b = var("b", 0, 100);
    let i = var("i", 0, 1000);
    assert_eq!(((b * 64 + i) % 7).to_string(), "(b*64 + i) % 7");
    assert_eq!((b - i * 2 - 3).to_string(), "b - i*2 - 3");
    assert_eq!(((i / 4) * 3).to_string(), "(i / 4)*3");
    assert_eq!(b.cmp_lt(i).to_string(), "b - i < 0");
    assert_eq!((b * i).min(5).to_string(), "min(b*i, 5)");
}

/// Index expressions of movement-op chains, simplified: the shapes codegen prints.
#[test]
fn movement_index_snapshots() {
    let gid = var("gid", 0, 4095);
    let batch = var("batch", 1, 64);
    let bidx = var("bidx", 0, 63);
    let mut out = String::new();
    let mut show = |name: &str, e: Expr| writeln!(out, "{name:<36} {e}").unwrap();

    // [4, 8, 16] contiguous, viewed as permute(2, 0, 1) -> [16, 4, 8].
    let (j0, j1, j2) = (gid / 32, (gid / 8) % 4, gid % 8);
    show("permute(2,0,1) of [4,8,16]", j1 * 128 + j2 * 16 + j0);
    // ... then reshaped to [16, 32] and back to a flat index: a round trip is the identity.
    let (r0, r1) = (gid / 32, gid % 32);
    show(
        "reshape [16,4,8]->[16,32] round trip",
        (r0 * 32 + r1) / 8 % 4,
    );
    // Reshape [64] -> [8, 8] then transpose: source index of element (a, b) = b*8 + a.
    let (a, b) = ((gid % 64) / 8, gid % 8);
    show("reshape [64]->[8,8] then .t()", b * 8 + a);
    // Pad the last dim of [batch, 30] by (1, 1): index and validity mask.
    let (p0, p1) = (gid / 32, gid % 32 - 1);
    show("pad (1,1) of [batch,30]: index", p0 * 30 + p1);
    show(
        "pad (1,1) of [batch,30]: valid",
        p1.cmp_ge(0) * p1.cmp_lt(30),
    );
    // Flip the last dim of [batch, 16].
    show("flip(-1) of [batch,16]", (gid / 16) * 16 + (15 - gid % 16));
    // Slice [:, 2::3] of [batch, 20] -> [batch, 6].
    show(
        "slice [:, 2::3] of [batch,20]",
        (gid / 6) * 20 + (gid % 6) * 3 + 2,
    );
    // Expand [1, 16] -> [batch, 16]: the broadcast dim drops out.
    let stride0 = Expr::constant(0);
    show("expand [1,16]->[batch,16]", bidx * stride0 + gid % 16);
    // A dynamic batch stride.
    show("dynamic stride [batch, 128]", bidx * 128 + gid % 128);
    show("numel of [batch, 3, batch]", batch * 3 * batch);
    show("split index (b*64 + i) / 64", (bidx * 64 + gid % 64) / 64);
    show("split index (b*64 + i) % 64", (bidx * 64 + gid % 64) % 64);
    show("im2col row: (gid/9)/3 of 3x3 kernel", gid / 9 / 3);
    show("nested ceil div (gid + 7) / 8", (gid + 7) / 8);
    insta::assert_snapshot!(out);
}

// ---------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------

/// The unsimplified tree, evaluated naively.
#[derive(Debug, Clone)]
enum Ast {
    Const(i64),
    Var(usize),
    Add(Box<Ast>, Box<Ast>),
    Sub(Box<Ast>, Box<Ast>),
    Mul(Box<Ast>, Box<Ast>),
    Neg(Box<Ast>),
    DivC(Box<Ast>, i64),
    ModC(Box<Ast>, i64),
    /// Division by the strictly positive third variable.
    DivV(Box<Ast>),
    ModV(Box<Ast>),
    Min(Box<Ast>, Box<Ast>),
    Max(Box<Ast>, Box<Ast>),
    Lt(Box<Ast>, Box<Ast>),
    Le(Box<Ast>, Box<Ast>),
    Eq(Box<Ast>, Box<Ast>),
    Ne(Box<Ast>, Box<Ast>),
}

fn floor_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && (a < 0) != (b < 0) {
        q - 1
    } else {
        q
    }
}

impl Ast {
    fn eval(&self, vals: &[i64; 3]) -> i128 {
        use Ast::*;
        match self {
            Const(c) => i128::from(*c),
            Var(i) => i128::from(vals[*i]),
            Add(a, b) => a.eval(vals) + b.eval(vals),
            Sub(a, b) => a.eval(vals) - b.eval(vals),
            Mul(a, b) => a.eval(vals) * b.eval(vals),
            Neg(a) => -a.eval(vals),
            DivC(a, c) => floor_div(a.eval(vals), i128::from(*c)),
            ModC(a, c) => {
                let (x, c) = (a.eval(vals), i128::from(*c));
                x - c * floor_div(x, c)
            }
            DivV(a) => floor_div(a.eval(vals), i128::from(vals[2])),
            ModV(a) => {
                let (x, c) = (a.eval(vals), i128::from(vals[2]));
                x - c * floor_div(x, c)
            }
            Min(a, b) => a.eval(vals).min(b.eval(vals)),
            Max(a, b) => a.eval(vals).max(b.eval(vals)),
            Lt(a, b) => i128::from(a.eval(vals) < b.eval(vals)),
            Le(a, b) => i128::from(a.eval(vals) <= b.eval(vals)),
            Eq(a, b) => i128::from(a.eval(vals) == b.eval(vals)),
            Ne(a, b) => i128::from(a.eval(vals) != b.eval(vals)),
        }
    }

    fn build(&self, vars: &[Expr; 3]) -> Expr {
        use Ast::*;
        match self {
            Const(c) => Expr::constant(*c),
            Var(i) => vars[*i],
            Add(a, b) => a.build(vars) + b.build(vars),
            Sub(a, b) => a.build(vars) - b.build(vars),
            Mul(a, b) => a.build(vars) * b.build(vars),
            Neg(a) => -a.build(vars),
            DivC(a, c) => a.build(vars) / *c,
            ModC(a, c) => a.build(vars) % *c,
            DivV(a) => a.build(vars) / vars[2],
            ModV(a) => a.build(vars) % vars[2],
            Min(a, b) => a.build(vars).min(b.build(vars)),
            Max(a, b) => a.build(vars).max(b.build(vars)),
            Lt(a, b) => a.build(vars).cmp_lt(b.build(vars)),
            Le(a, b) => a.build(vars).cmp_le(b.build(vars)),
            Eq(a, b) => a.build(vars).cmp_eq(b.build(vars)),
            Ne(a, b) => a.build(vars).cmp_ne(b.build(vars)),
        }
    }
}

fn divisor() -> impl Strategy<Value = i64> {
    prop_oneof![1i64..=9, -7i64..=-1, Just(16), Just(32), Just(64), Just(12)]
}

fn ast() -> impl Strategy<Value = Ast> {
    let leaf = prop_oneof![
        (-20i64..=20).prop_map(Ast::Const),
        (0usize..3).prop_map(Ast::Var)
    ];
    leaf.prop_recursive(5, 48, 2, |inner| {
        let pair = || (inner.clone(), inner.clone());
        let boxed = |(a, b): (Ast, Ast)| (Box::new(a), Box::new(b));
        prop_oneof![
            pair().prop_map(move |p| {
                let (a, b) = boxed(p);
                Ast::Add(a, b)
            }),
            pair().prop_map(move |p| {
                let (a, b) = boxed(p);
                Ast::Sub(a, b)
            }),
            pair().prop_map(move |p| {
                let (a, b) = boxed(p);
                Ast::Mul(a, b)
            }),
            inner.clone().prop_map(|a| Ast::Neg(Box::new(a))),
            (inner.clone(), divisor()).prop_map(|(a, c)| Ast::DivC(Box::new(a), c)),
            (inner.clone(), divisor()).prop_map(|(a, c)| Ast::ModC(Box::new(a), c)),
            inner.clone().prop_map(|a| Ast::DivV(Box::new(a))),
            inner.clone().prop_map(|a| Ast::ModV(Box::new(a))),
            pair().prop_map(move |p| {
                let (a, b) = boxed(p);
                Ast::Min(a, b)
            }),
            pair().prop_map(move |p| {
                let (a, b) = boxed(p);
                Ast::Max(a, b)
            }),
            pair().prop_map(move |p| {
                let (a, b) = boxed(p);
                Ast::Lt(a, b)
            }),
            pair().prop_map(move |p| {
                let (a, b) = boxed(p);
                Ast::Le(a, b)
            }),
            pair().prop_map(move |p| {
                let (a, b) = boxed(p);
                Ast::Eq(a, b)
            }),
            pair().prop_map(move |p| {
                let (a, b) = boxed(p);
                Ast::Ne(a, b)
            }),
        ]
    })
}

/// Bounds for the three variables; the third is strictly positive (a divisor).
fn var_bounds() -> impl Strategy<Value = [(i64, i64); 3]> {
    (
        (-30i64..=30, 0i64..=40),
        (0i64..=10, 0i64..=60),
        (1i64..=6, 0i64..=10),
    )
        .prop_map(|((a, da), (b, db), (c, dc))| [(a, a + da), (b, b + db), (c, c + dc)])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn simplified_equals_naive(
        tree in ast(),
        bounds in var_bounds(),
        picks in prop::collection::vec(prop::array::uniform3(0.0f64..=1.0), 12),
    ) {
        let vars = [0, 1, 2].map(|i| Var::new(["x", "y", "n"][i], bounds[i].0, bounds[i].1).unwrap());
        let simplified = tree.build(&vars.map(Expr::from));
        let range = simplified.bounds();
        for pick in &picks {
            let vals: [i64; 3] = std::array::from_fn(|i| {
                let (lo, hi) = bounds[i];
                lo + ((hi - lo) as f64 * pick[i]).round() as i64
            });
            let expected = tree.eval(&vals);
            let bindings: Bindings = vars.iter().copied().zip(vals).collect();
            let got = simplified.eval(&bindings);
            let Ok(expected) = i64::try_from(expected) else { continue };
            match got {
                Ok(v) => {
                    prop_assert_eq!(v, expected, "{} at {:?} (tree {:?})", simplified, vals, tree);
                    prop_assert!(range.contains(v), "{} = {} outside {:?} at {:?}", simplified, v, range, vals);
                }
                Err(EvalError::Overflow { .. }) => {}
                Err(e) => prop_assert!(false, "{simplified}: {e}"),
            }
        }
    }

    #[test]
    fn equal_trees_give_equal_handles(tree in ast(), bounds in var_bounds()) {
        // Building twice yields the very same canonical node; the text form is stable.
        let vars = [0, 1, 2].map(|i| Expr::from(Var::new(["x", "y", "n"][i], bounds[i].0, bounds[i].1).unwrap()));
        let (a, b) = (tree.build(&vars), tree.build(&vars));
        prop_assert_eq!(a, b);
        prop_assert_eq!(a.to_string(), b.to_string());
    }
}
