//! Math functions and activations composed from core ops (`expm1`, `log1p`, inverse and
//! hyperbolic trigonometry, `atan2`, `hypot`, ELU family, ...), against Rust's `f64`
//! functions on seeded random data, edge values and views.

use crate::common::{self, Domain, Layout, Rng};
use tessel_tensor::{DType, Result, Tensor};

type UnaryFn = fn(&Tensor) -> Tensor;

/// A unary function under test.
struct Case {
    name: &'static str,
    run: UnaryFn,
    reference: fn(f64) -> f64,
    /// Random floats come from here; integers from its integral part.
    domain: (f64, f64),
    /// Values whose error is absolute below this (1e-30: relative everywhere).
    floor: f64,
    /// Whether a zero result must carry the reference's sign (`f(-0) = -0`).
    signed_zero: bool,
}

const fn case(
    name: &'static str,
    run: UnaryFn,
    reference: fn(f64) -> f64,
    domain: (f64, f64),
) -> Case {
    Case {
        name,
        run,
        reference,
        domain,
        floor: 1e-30,
        signed_zero: true,
    }
}

/// Edge values every case sees (rounded to the dtype): specials, domain boundaries and
/// magnitudes where naive formulas cancel or overflow.
const EDGES: [f64; 22] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    0.0,
    -0.0,
    1e-10,
    -1e-10,
    1e-30,
    -3e-6,
    1.0,
    -1.0,
    0.5,
    -0.5,
    0.999_9,
    -0.999_9,
    1.000_1,
    2.5,
    -2.5,
    30.0,
    -30.0,
    100.0,
    1e30,
];

/// The result dtype of a float function.
fn float_result(d: DType) -> DType {
    if d.is_float() { d } else { DType::F32 }
}

/// Relative tolerance: tighter than the project's transcendental 1e-4 where the
/// compositions allow.
fn rel(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F16 | DType::BF16 => 1e-2,
        _ => 1e-5,
    }
}

/// Inputs of one dtype: contiguous random `[5, 7]`, a permuted `[7, 3]` view, `[0, 3]`,
/// `[1, 1]`, and (floats) the edge values.
fn inputs(rng: &mut Rng, dtype: DType, lo: f64, hi: f64) -> Vec<(String, Tensor, Vec<f64>)> {
    let domain = Domain::new((lo, hi), (lo.ceil() as i64, hi.floor() as i64));
    let mut out = Vec::new();
    for dims in [&[5usize, 7][..], &[0, 3], &[1, 1]] {
        let n = dims.iter().product();
        let values = common::random(rng, dtype, n, domain);
        out.push((
            format!("{dims:?}"),
            common::tensor(dtype, &values, dims),
            values,
        ));
    }
    let values = common::random(rng, dtype, 21, domain);
    let (t, values) = common::view(Layout::Permuted, dtype, &values, 7, 3, 0.0);
    out.push(("permuted".to_owned(), t, values));
    if dtype.is_float() {
        let values: Vec<f64> = EDGES.iter().map(|&v| common::round_to(dtype, v)).collect();
        let t = common::tensor(dtype, &values, &[values.len()]);
        out.push(("edges".to_owned(), t, values));
    }
    out
}

/// Asserts `got` matches `want`, and that zeros carry the reference's sign.
#[track_caller]
fn check(what: &str, got: &[f64], want: &[f64], rel: f64, floor: f64, signed_zero: bool) {
    common::assert_close_floor(what, got, want, rel, floor);
    if signed_zero {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            if *w == 0.0 {
                assert_eq!(
                    g.is_sign_negative(),
                    w.is_sign_negative(),
                    "{what}: [{i}] got {g:e}, want {w:e}"
                );
            }
        }
    }
}

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::Bool,
];

fn run_cases(cases: &[Case], seed: u64) {
    let mut rng = Rng::new(seed);
    for c in cases {
        for dtype in common::on_device(DTYPES) {
            let result = float_result(dtype);
            for (label, x, values) in inputs(&mut rng, dtype, c.domain.0, c.domain.1) {
                let what = format!("{} {dtype} {label}", c.name);
                let out = (c.run)(&x);
                assert_eq!((out.dtype(), out.dims()), (result, x.dims()), "{what}");
                if common::skipped(&out, &what) {
                    continue;
                }
                let want: Vec<f64> = values
                    .iter()
                    .map(|&v| common::round_to(result, (c.reference)(v)))
                    .collect();
                // Half results are rounded once from f32: subnormal ones are absolute.
                let floor = if matches!(result, DType::F16 | DType::BF16) {
                    c.floor.max(1e-3)
                } else {
                    c.floor
                };
                let signed = c.signed_zero && result != DType::F16 && result != DType::BF16;
                check(
                    &what,
                    &common::read(&out),
                    &want,
                    rel(result),
                    floor,
                    signed,
                );
            }
        }
    }
}

#[test]
fn exp_and_log_family() {
    let cases = [
        case("expm1", Tensor::expm1, f64::exp_m1, (-10.0, 10.0)),
        case("log1p", Tensor::log1p, f64::ln_1p, (-0.99, 10.0)),
        case("log10", Tensor::log10, f64::log10, (0.01, 100.0)),
        Case {
            floor: 1.0,
            signed_zero: false,
            ..case("erfc", Tensor::erfc, erfc_ref, (-3.0, 3.0))
        },
    ];
    run_cases(&cases, 11);
}

/// `erfc` in `f64`, relative-accurate in the tail: erfc's continued fraction for
/// `x >= 2.5` (the same one `common::erf` uses), `1 - erf(x)` below.
fn erfc_ref(x: f64) -> f64 {
    if x.is_nan() || x < 2.5 {
        return 1.0 - common::erf(x);
    }
    if x.is_infinite() {
        return 0.0;
    }
    let t = (1..=300).rev().fold(x, |t, n| x + f64::from(n) / 2.0 / t);
    (-x * x).exp() / std::f64::consts::PI.sqrt() / t
}

/// `f32` `erfc` keeps its relative accuracy in the tail, down to 1e-35.
#[test]
fn erfc_tail_is_relative_in_f32() {
    let mut rng = Rng::new(18);
    let values = common::random(&mut rng, DType::F32, 200, Domain::new((-3.0, 8.9), (0, 0)));
    let out = common::tensor(DType::F32, &values, &[200]).erfc();
    let want: Vec<f64> = values
        .iter()
        .map(|&v| common::round_to(DType::F32, erfc_ref(v)))
        .collect();
    // e^(-x^2) amplifies x^2's rounding (x^2 * 6e-8 relative), hence 2e-5 at x ~ 9.
    common::assert_close_floor("erfc f32 tail", &common::read(&out), &want, 2e-5, 1e-30);
}

#[test]
fn hyperbolic() {
    let cases = [
        case("sinh", Tensor::sinh, f64::sinh, (-10.0, 10.0)),
        case("cosh", Tensor::cosh, f64::cosh, (-10.0, 10.0)),
        case("asinh", Tensor::asinh, f64::asinh, (-100.0, 100.0)),
        case("acosh", Tensor::acosh, f64::acosh, (1.0, 100.0)),
        case("atanh", Tensor::atanh, f64::atanh, (-0.999, 0.999)),
    ];
    run_cases(&cases, 12);
}

#[test]
fn inverse_trigonometry() {
    let cases = [
        case("atan", Tensor::atan, f64::atan, (-20.0, 20.0)),
        case("asin", Tensor::asin, f64::asin, (-1.0, 1.0)),
        case("acos", Tensor::acos, f64::acos, (-1.0, 1.0)),
    ];
    run_cases(&cases, 13);
}

fn softplus_ref(x: f64, beta: f64, threshold: f64) -> f64 {
    if x * beta > threshold {
        x
    } else {
        (x * beta).exp().ln_1p() / beta
    }
}

fn nan_or(x: f64, f: impl Fn(f64) -> f64) -> f64 {
    if x.is_nan() { x } else { f(x) }
}

#[test]
fn activations() {
    let d = (-8.0, 8.0);
    let absolute = |c: Case| Case {
        floor: 1.0,
        signed_zero: false,
        ..c
    };
    let cases = [
        Case {
            signed_zero: false,
            ..case(
                "softplus",
                |t| t.softplus(1.0, 20.0).unwrap(),
                |x| softplus_ref(x, 1.0, 20.0),
                (-30.0, 30.0),
            )
        },
        Case {
            signed_zero: false,
            ..case(
                "softplus beta 2 threshold 5",
                |t| t.softplus(2.0, 5.0).unwrap(),
                |x| softplus_ref(x, 2.0, 5.0),
                d,
            )
        },
        case(
            "elu",
            |t| t.elu(1.5),
            |x| if x > 0.0 { x } else { 1.5 * x.exp_m1() },
            d,
        ),
        case(
            "selu",
            Tensor::selu,
            |x| {
                let (alpha, scale) = (1.673_263_242_354_377_3, 1.050_700_987_355_480_5);
                scale * if x > 0.0 { x } else { alpha * x.exp_m1() }
            },
            d,
        ),
        case(
            "celu",
            |t| t.celu(2.0).unwrap(),
            |x| if x > 0.0 { x } else { 2.0 * (x / 2.0).exp_m1() },
            d,
        ),
        case(
            "leaky_relu",
            |t| t.leaky_relu(0.1),
            |x| if x > 0.0 { x } else { 0.1 * x },
            d,
        ),
        case("softsign", Tensor::softsign, |x| x / (1.0 + x.abs()), d),
        Case {
            signed_zero: false,
            ..case(
                "logsigmoid",
                Tensor::logsigmoid,
                |x| nan_or(x, |x| x.min(0.0) - (-x.abs()).exp().ln_1p()),
                (-30.0, 30.0),
            )
        },
        absolute(case(
            "hardsigmoid",
            Tensor::hardsigmoid,
            |x| nan_or(x, |x| (x + 3.0).clamp(0.0, 6.0) / 6.0),
            d,
        )),
        absolute(case(
            "hardswish",
            Tensor::hardswish,
            |x| nan_or(x, |x| x * (x + 3.0).clamp(0.0, 6.0) / 6.0),
            d,
        )),
        case(
            "mish",
            Tensor::mish,
            |x| x * softplus_ref(x, 1.0, 20.0).tanh(),
            d,
        ),
        case(
            "quick_gelu",
            Tensor::quick_gelu,
            |x| x / (1.0 + (-1.702 * x).exp()),
            d,
        ),
    ];
    run_cases(&cases, 14);
}

/// A binary function under test with its `f64` reference.
type BinaryCase = (
    &'static str,
    fn(&Tensor, &Tensor) -> Result<Tensor>,
    fn(f64, f64) -> f64,
);

const BINARY: [BinaryCase; 4] = [
    ("atan2", |a, b| a.atan2(b), f64::atan2),
    ("hypot", |a, b| a.hypot(b), f64::hypot),
    ("copysign", |a, b| a.copysign(b), f64::copysign),
    ("logaddexp", |a, b| a.logaddexp(b), logaddexp_ref),
];

fn logaddexp_ref(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        a + std::f64::consts::LN_2
    } else {
        a.max(b) + (-(a - b).abs()).exp().ln_1p()
    }
}

#[test]
fn binary_random_broadcast_and_views() -> Result<()> {
    let mut rng = Rng::new(15);
    let domain = Domain::new((-5.0, 5.0), (-5, 5));
    for (name, run, reference) in BINARY {
        for dtype in common::on_device(DTYPES) {
            let result = float_result(dtype);
            let mut pairs = Vec::new();
            for (da, db) in [
                (&[4usize, 1, 5][..], &[3usize, 5][..]),
                (&[0, 3], &[1, 3]),
                (&[1, 1], &[1]),
            ] {
                let va = common::random(&mut rng, dtype, da.iter().product(), domain);
                let vb = common::random(&mut rng, dtype, db.iter().product(), domain);
                let (ta, tb) = (
                    common::tensor(dtype, &va, da),
                    common::tensor(dtype, &vb, db),
                );
                pairs.push((
                    format!("{da:?} {db:?}"),
                    ta,
                    va,
                    da.to_vec(),
                    tb,
                    vb,
                    db.to_vec(),
                ));
            }
            let va = common::random(&mut rng, dtype, 21, domain);
            let (ta, va) = common::view(Layout::Permuted, dtype, &va, 7, 3, 0.0);
            let vb = common::random(&mut rng, dtype, 3, domain);
            let tb = common::tensor(dtype, &vb, &[3]);
            pairs.push(("permuted".into(), ta, va, vec![7, 3], tb, vb, vec![3]));
            for (label, ta, va, da, tb, vb, db) in pairs {
                let what = format!("{name} {dtype} {label}");
                let out = run(&ta, &tb)?;
                let (want, dims) = common::broadcast_map(&[(&va, &da), (&vb, &db)], |v| {
                    common::round_to(result, reference(v[0], v[1]))
                });
                assert_eq!((out.dtype(), out.dims()), (result, dims), "{what}");
                if common::skipped(&out, &what) {
                    continue;
                }
                let floor = if matches!(result, DType::F16 | DType::BF16) {
                    1e-3
                } else {
                    1e-30
                };
                check(&what, &common::read(&out), &want, rel(result), floor, false);
            }
        }
    }
    Ok(())
}

/// Every pair of special values, against C's `atan2`/`hypot` (Rust's `f64` functions),
/// including the sign of zero results, and huge/tiny magnitudes for `hypot`.
#[test]
fn binary_special_values() -> Result<()> {
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        2.5,
        -2.5,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e30,
        -1e-30,
    ];
    let n = specials.len();
    let ys: Vec<f64> = (0..n * n).map(|i| specials[i / n]).collect();
    let xs: Vec<f64> = (0..n * n).map(|i| specials[i % n]).collect();
    for (name, run, reference) in BINARY {
        for dtype in common::on_device([DType::F32, DType::F64]) {
            let ys: Vec<f64> = ys.iter().map(|&v| common::round_to(dtype, v)).collect();
            let xs: Vec<f64> = xs.iter().map(|&v| common::round_to(dtype, v)).collect();
            let what = format!("{name} {dtype} specials");
            let out = run(
                &common::tensor(dtype, &ys, &[n, n]),
                &common::tensor(dtype, &xs, &[n, n]),
            )?;
            if common::skipped(&out, &what) {
                continue;
            }
            let want: Vec<f64> = ys
                .iter()
                .zip(&xs)
                .map(|(&y, &x)| common::round_to(dtype, reference(y, x)))
                .collect();
            check(&what, &common::read(&out), &want, rel(dtype), 1e-30, true);
        }
    }
    Ok(())
}

#[test]
fn errors_name_the_op() {
    let t = Tensor::from([1.0f32, 2.0]);
    common::assert_err(
        "softplus beta 0",
        t.softplus(0.0, 20.0),
        common::invalid("softplus"),
        &["softplus", "beta"],
    );
    common::assert_err(
        "celu alpha 0",
        t.celu(0.0),
        common::invalid("celu"),
        &["celu", "alpha"],
    );
    let m = Tensor::from([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]]);
    for (name, run, _) in BINARY {
        common::assert_err(
            name,
            run(&m, &Tensor::from([1.0f32, 2.0, 3.0, 4.0])),
            common::shape_error,
            &[name, "[2, 3]", "[4]"],
        );
    }
}

#[test]
fn isclose_allclose_and_nan_to_num() -> Result<()> {
    let mut rng = Rng::new(16);
    for dtype in common::on_device([DType::F32, DType::F64, DType::F16, DType::I32]) {
        let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1.0];
        let mut a = common::random(&mut rng, dtype, 30, Domain::new((-3.0, 3.0), (-3, 3)));
        let mut b: Vec<f64> = a
            .iter()
            .enumerate()
            .map(|(i, &v)| common::round_to(dtype, v * (1.0 + [0.0, 1e-7, 1e-3][i % 3])))
            .collect();
        if dtype.is_float() {
            for (i, &x) in specials.iter().enumerate() {
                for (j, &y) in specials.iter().enumerate().take(4) {
                    a[i * 4 + j] = x;
                    b[i * 4 + j] = y;
                }
            }
        }
        let (ta, tb) = (
            common::tensor(dtype, &a, &[6, 5]),
            common::tensor(dtype, &b, &[6, 5]),
        );
        let ta_view = ta.t()?.contiguous().t()?;
        for (rtol, atol, equal_nan) in [(1e-5, 1e-8, false), (1e-2, 0.0, true), (0.0, 0.5, false)] {
            let what = format!("isclose {dtype} {rtol} {atol} {equal_nan}");
            let got = ta_view.isclose(&tb, rtol, atol, equal_nan)?;
            assert_eq!(
                (got.dtype(), got.dims()),
                (DType::Bool, vec![6, 5]),
                "{what}"
            );
            let want: Vec<f64> = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| {
                    let close = x == y
                        || (x.is_finite()
                            && y.is_finite()
                            && (x - y).abs() <= atol + rtol * y.abs())
                        || (equal_nan && x.is_nan() && y.is_nan());
                    f64::from(u8::from(close))
                })
                .collect();
            assert_eq!(common::read(&got), want, "{what}");
            let all = want.iter().all(|&w| w == 1.0);
            assert_eq!(ta.allclose(&tb, rtol, atol, equal_nan)?, all, "{what}");
        }
        assert!(ta.allclose(&ta, 0.0, 0.0, true)?, "{dtype} self");
        if dtype.is_float() {
            let max = match dtype {
                DType::F16 => 65504.0,
                DType::F32 => f64::from(f32::MAX),
                _ => f64::MAX,
            };
            let got = ta.nan_to_num(7.0, None, Some(-3.0));
            let want: Vec<f64> = a
                .iter()
                .map(|&x| {
                    if x.is_nan() {
                        7.0
                    } else if x == f64::INFINITY {
                        max
                    } else if x == f64::NEG_INFINITY {
                        -3.0
                    } else {
                        x
                    }
                })
                .collect();
            assert_eq!(common::read(&got), want, "nan_to_num {dtype}");
        } else {
            assert_eq!(
                common::read(&ta.nan_to_num(0.0, None, None)),
                a,
                "nan_to_num {dtype}"
            );
        }
    }
    let t = Tensor::from([1.0f32]);
    common::assert_err(
        "negative rtol",
        t.isclose(&t, -1.0, 0.0, false),
        common::invalid("isclose"),
        &["isclose", "rtol"],
    );
    common::assert_err(
        "shapes",
        Tensor::from([1.0f32, 2.0]).isclose(&Tensor::from([1.0f32, 2.0, 3.0]), 1e-5, 1e-8, false),
        common::shape_error,
        &["isclose", "[2]", "[3]"],
    );
    Ok(())
}

#[test]
fn lerp_scalar_and_tensor_weights() -> Result<()> {
    let mut rng = Rng::new(17);
    let d = Domain::new((-4.0, 4.0), (-4, 4));
    for dtype in common::on_device([DType::F32, DType::F64, DType::BF16]) {
        let s = common::random(&mut rng, dtype, 12, d);
        let e = common::random(&mut rng, dtype, 4, d);
        let w = common::random(&mut rng, dtype, 3, Domain::new((-0.5, 1.5), (0, 1)));
        let (ts, te, tw) = (
            common::tensor(dtype, &s, &[3, 4]),
            common::tensor(dtype, &e, &[4]),
            common::tensor(dtype, &w, &[3, 1]),
        );
        let lerp = |a: f64, b: f64, w: f64| {
            if w < 0.5 {
                a + w * (b - a)
            } else {
                b - (b - a) * (1.0 - w)
            }
        };
        let got = ts.lerp_tensor(&te, &tw)?;
        let (want, dims) =
            common::broadcast_map(&[(&s, &[3, 4]), (&e, &[4]), (&w, &[3, 1])], |v| {
                common::round_to(dtype, lerp(v[0], v[1], v[2]))
            });
        assert_eq!((got.dtype(), got.dims()), (dtype, dims), "lerp {dtype}");
        check(
            &format!("lerp {dtype}"),
            &common::read(&got),
            &want,
            rel(dtype),
            1.0,
            false,
        );
        for weight in [0.0, 0.3, 1.0] {
            let got = ts.lerp(&te, weight)?;
            let (want, _) = common::broadcast_map(&[(&s, &[3, 4]), (&e, &[4])], |v| {
                common::round_to(dtype, lerp(v[0], v[1], weight))
            });
            assert_eq!(got.dtype(), dtype);
            check(
                &format!("lerp {dtype} {weight}"),
                &common::read(&got),
                &want,
                rel(dtype),
                1.0,
                false,
            );
        }
    }
    // weight = 1 gives end exactly, even where start is huge.
    let got = Tensor::from([1e30f32, -3.0]).lerp(&Tensor::from([1.0f32, 2.0]), 1.0)?;
    assert_eq!(got.to_vec::<f32>()?, vec![1.0, 2.0]);
    Ok(())
}
