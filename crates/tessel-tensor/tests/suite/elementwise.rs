//! Elementwise ops against plain-Rust `f64` references on seeded random data: every op for
//! every dtype (unsupported ones must fail at the call with the right error), broadcasting,
//! odd and empty shapes, 0-d tensors and non-contiguous views.

mod unary;

use crate::common;
use crate::common::{Domain, Layout, Rng};
use tessel_tensor::{DType, Error, Result, Tensor};

// =====================================================================================
// Cases
// =====================================================================================

/// The inputs of one binary check: two shapes, or two `[7, 3]` views.
#[derive(Clone, Copy, Debug)]
enum Case {
    Shapes(&'static [usize], &'static [usize]),
    Views(Layout, Layout),
}

/// Run for every dtype: broadcasting across three dims, and two non-contiguous views.
const EVERY_DTYPE: [Case; 2] = [
    Case::Shapes(&[7, 1, 3], &[13, 1]),
    Case::Views(Layout::Permuted, Layout::Strided),
];

/// Run for `f32` and `i32` as well: odd, tiny, empty and 0-d shapes and the other views.
const MORE: [Case; 7] = [
    Case::Shapes(&[45, 65], &[45, 65]),
    Case::Shapes(&[1, 1], &[1, 1]),
    Case::Shapes(&[7, 13, 3], &[3]),
    Case::Shapes(&[], &[]),
    Case::Shapes(&[], &[4, 5]),
    Case::Views(Layout::Narrowed, Layout::Padded),
    Case::Views(Layout::Flipped, Layout::Expanded),
];

fn cases(dtype: DType) -> Vec<Case> {
    let mut all = EVERY_DTYPE.to_vec();
    if matches!(dtype, DType::F32 | DType::I32) {
        all.extend(MORE);
    }
    all
}

/// A test input: the tensor, its logical values and dims.
struct Input {
    t: Tensor,
    values: Vec<f64>,
    dims: Vec<usize>,
}

fn input(rng: &mut Rng, dtype: DType, dims: &[usize], domain: Domain, nans: bool) -> Input {
    let n = dims.iter().product();
    let mut values = common::random(rng, dtype, n, domain);
    if nans && dtype.is_float() && n > 4 {
        values[n / 3] = f64::NAN;
    }
    Input {
        t: common::tensor(dtype, &values, dims),
        values,
        dims: dims.to_vec(),
    }
}

fn view_input(rng: &mut Rng, layout: Layout, dtype: DType, domain: Domain, nans: bool) -> Input {
    let mut values = common::random(rng, dtype, 21, domain);
    if nans && dtype.is_float() {
        values[10] = f64::NAN;
    }
    let (t, values) = common::view(layout, dtype, &values, 7, 3, 1.0);
    Input {
        t,
        values,
        dims: vec![7, 3],
    }
}

fn pair(
    rng: &mut Rng,
    case: Case,
    (da, db): (DType, DType),
    (ra, rb): (Domain, Domain),
    nans: bool,
) -> (Input, Input) {
    match case {
        Case::Shapes(sa, sb) => (input(rng, da, sa, ra, nans), input(rng, db, sb, rb, nans)),
        Case::Views(la, lb) => (
            view_input(rng, la, da, ra, nans),
            view_input(rng, lb, db, rb, nans),
        ),
    }
}

// =====================================================================================
// Binary ops
// =====================================================================================

type BinaryFn = fn(&Tensor, &Tensor) -> Result<Tensor>;
type RefFn = fn(f64, f64, DType) -> f64;

/// A binary op under test.
struct Binary {
    name: &'static str,
    run: BinaryFn,
    /// The exact result for operands of the (promoted) compute dtype.
    reference: RefFn,
    /// Whether the op is defined on the compute dtype.
    supports: fn(DType) -> bool,
    /// The result dtype for the compute dtype.
    result: fn(DType) -> DType,
    lhs: Domain,
    rhs: Domain,
    nans: bool,
    transcendental: bool,
}

impl Binary {
    const fn new(name: &'static str, run: BinaryFn, reference: RefFn) -> Binary {
        Binary {
            name,
            run,
            reference,
            supports: |_| true,
            result: |d| d,
            lhs: common::DEFAULT,
            rhs: common::DEFAULT,
            nans: false,
            transcendental: false,
        }
    }
}

fn not_bool(d: DType) -> bool {
    d != DType::Bool
}

fn to_bool(_: DType) -> DType {
    DType::Bool
}

fn float_result(d: DType) -> DType {
    if d.is_float() { d } else { DType::F32 }
}

fn b(x: bool) -> f64 {
    f64::from(u8::from(x))
}

/// `x` as the value an op of result dtype `dtype` stores: integers wrap, `bool` is
/// `!= 0`, floats are left for the tolerance check.
fn stored(dtype: DType, x: f64) -> f64 {
    if dtype.is_float() {
        x
    } else {
        common::round_to(dtype, x)
    }
}

/// Checks `op` on inputs of dtypes `(da, db)` for `case`.
fn check_binary(op: &Binary, rng: &mut Rng, case: Case, dtypes: (DType, DType)) {
    let (a, b) = pair(rng, case, dtypes, (op.lhs, op.rhs), op.nans);
    let what = format!(
        "{} {:?} ({} {:?}, {} {:?})",
        op.name, case, dtypes.0, a.dims, dtypes.1, b.dims
    );
    let Ok(compute) = dtypes.0.promote(dtypes.1) else {
        common::assert_err(
            &what,
            (op.run)(&a.t, &b.t),
            common::promotion(op.name),
            &[dtypes.0.name(), dtypes.1.name()],
        );
        return;
    };
    if !(op.supports)(compute) {
        let check = common::unsupported(op.name, compute);
        common::assert_err(
            &what,
            (op.run)(&a.t, &b.t),
            check,
            &[op.name, compute.name()],
        );
        return;
    }
    let out = (op.run)(&a.t, &b.t).unwrap_or_else(|e| panic!("{what}: {e}"));
    let result = (op.result)(compute);
    assert_eq!(out.dtype(), result, "{what}: result dtype");
    let (want, dims) = common::broadcast_map(&[(&a.values, &a.dims), (&b.values, &b.dims)], |x| {
        stored(result, (op.reference)(x[0], x[1], compute))
    });
    assert_eq!(out.dims(), dims, "{what}: result shape");
    if common::skipped(&out, &what) {
        return;
    }
    common::assert_close(
        &what,
        &common::read(&out),
        &want,
        common::tolerance(result, op.transcendental),
    );
}

fn run_binary_table(ops: &[Binary], seed: u64) {
    let mut rng = Rng::new(seed);
    for op in ops {
        for dtype in common::on_device(DType::ALL) {
            for case in cases(dtype) {
                check_binary(op, &mut rng, case, (dtype, dtype));
            }
        }
    }
}

/// `a % b` with the sign of `a`; integer `% 0` is 0.
fn fmod_ref(a: f64, b: f64, d: DType) -> f64 {
    if b == 0.0 && !d.is_float() {
        0.0
    } else {
        a % b
    }
}

/// Python's `a % b`, PyTorch's formula on top of `fmod`.
fn remainder_ref(a: f64, b: f64, d: DType) -> f64 {
    let r = fmod_ref(a, b, d);
    if r != 0.0 && (r < 0.0) != (b < 0.0) {
        r + b
    } else {
        r
    }
}

fn pow_ref(a: f64, b: f64, d: DType) -> f64 {
    if d.is_float() {
        a.powf(b)
    } else {
        // Exact; the caller wraps to the dtype.
        (0..b as i64).fold(1.0, |acc, _| common::round_to(DType::I64, acc * a))
    }
}

fn max_ref(a: f64, b: f64, _: DType) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn min_ref(a: f64, b: f64, _: DType) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

#[test]
fn arithmetic() {
    let positive = Domain::new((0.1, 3.0), (0, 5));
    let small = Domain::new((-2.0, 2.0), (0, 6));
    let divisor = Domain::new((-4.0, 4.0), (-7, 7)).quantized(0.25);
    let ops = [
        Binary::new("add", |a, b| a.add(b), |a, b, _| a + b),
        Binary {
            supports: not_bool,
            ..Binary::new("sub", |a, b| a.sub(b), |a, b, _| a - b)
        },
        Binary::new("mul", |a, b| a.mul(b), |a, b, _| a * b),
        Binary {
            result: float_result,
            rhs: Domain::new((0.25, 4.0), (-20, 20)),
            ..Binary::new("div", |a, b| a.div(b), |a, b, _| a / b)
        },
        Binary {
            supports: not_bool,
            lhs: positive,
            rhs: small,
            transcendental: true,
            ..Binary::new("pow", |a, b| a.pow(b), pow_ref)
        },
        Binary {
            nans: true,
            ..Binary::new("maximum", |a, b| a.maximum(b), max_ref)
        },
        Binary {
            nans: true,
            ..Binary::new("minimum", |a, b| a.minimum(b), min_ref)
        },
        Binary {
            supports: not_bool,
            rhs: divisor,
            ..Binary::new("remainder", |a, b| a.remainder(b), remainder_ref)
        },
        Binary {
            supports: not_bool,
            rhs: divisor,
            ..Binary::new("fmod", |a, b| a.fmod(b), fmod_ref)
        },
    ];
    run_binary_table(&ops, 1);
}

#[test]
fn comparisons() {
    const DENSE: Domain = Domain::new((-2.0, 2.0), (-3, 3)).quantized(0.5);
    fn cmp(name: &'static str, run: BinaryFn, reference: RefFn) -> Binary {
        Binary {
            result: to_bool,
            lhs: DENSE,
            rhs: DENSE,
            nans: true,
            ..Binary::new(name, run, reference)
        }
    }
    let ops = [
        cmp("eq", |a, b| a.eq(b), |a, c, _| b(a == c)),
        cmp("ne", |a, b| a.ne(b), |a, c, _| b(a != c)),
        cmp("lt", |a, b| a.lt(b), |a, c, _| b(a < c)),
        cmp("le", |a, b| a.le(b), |a, c, _| b(a <= c)),
        cmp("gt", |a, b| a.gt(b), |a, c, _| b(a > c)),
        cmp("ge", |a, b| a.ge(b), |a, c, _| b(a >= c)),
    ];
    run_binary_table(&ops, 2);
}

fn int_ref(a: f64, b: f64, f: fn(i128, i128) -> i128) -> f64 {
    f(a as i128, b as i128) as f64
}

/// PyTorch's shifts: out-of-range amounts give 0 (left) or the sign fill (right).
fn shift_ref(a: f64, s: f64, d: DType, left: bool) -> f64 {
    let bits = f64::from(d.bits());
    if s < 0.0 || s >= bits {
        return if left || a >= 0.0 { 0.0 } else { -1.0 };
    }
    if left {
        a * 2f64.powf(s)
    } else {
        (a / 2f64.powf(s)).floor()
    }
}

#[test]
fn logical_and_bitwise() {
    const SPARSE: Domain = Domain::new((-1.0, 1.0), (-2, 2)).quantized(0.5);
    fn logical(name: &'static str, run: BinaryFn, reference: RefFn) -> Binary {
        Binary {
            result: to_bool,
            lhs: SPARSE,
            rhs: SPARSE,
            nans: true,
            ..Binary::new(name, run, reference)
        }
    }
    fn bitwise(name: &'static str, run: BinaryFn, reference: RefFn) -> Binary {
        Binary {
            supports: |d| !d.is_float(),
            ..Binary::new(name, run, reference)
        }
    }
    fn shift(name: &'static str, run: BinaryFn, reference: RefFn) -> Binary {
        Binary {
            supports: DType::is_int,
            lhs: Domain::new((0.0, 0.0), (-100, 100)),
            rhs: Domain::new((0.0, 0.0), (-2, 66)),
            ..Binary::new(name, run, reference)
        }
    }
    let ops = [
        logical(
            "logical_and",
            |a, b| a.logical_and(b),
            |a, c, _| b(a != 0.0 && c != 0.0),
        ),
        logical(
            "logical_or",
            |a, b| a.logical_or(b),
            |a, c, _| b(a != 0.0 || c != 0.0),
        ),
        logical(
            "logical_xor",
            |a, b| a.logical_xor(b),
            |a, c, _| b((a != 0.0) != (c != 0.0)),
        ),
        bitwise(
            "bitwise_and",
            |a, b| a.bitwise_and(b),
            |a, c, _| int_ref(a, c, |x, y| x & y),
        ),
        bitwise(
            "bitwise_or",
            |a, b| a.bitwise_or(b),
            |a, c, _| int_ref(a, c, |x, y| x | y),
        ),
        bitwise(
            "bitwise_xor",
            |a, b| a.bitwise_xor(b),
            |a, c, _| int_ref(a, c, |x, y| x ^ y),
        ),
        shift("shl", |a, b| a.shl(b), |a, s, d| shift_ref(a, s, d, true)),
        shift("shr", |a, b| a.shr(b), |a, s, d| shift_ref(a, s, d, false)),
    ];
    run_binary_table(&ops, 3);
}

/// A tensor-number op: its name, result, expected dtype and reference.
type ScalarCheck = (&'static str, Tensor, DType, fn(f64) -> f64);

#[test]
fn promotion_scalars_and_operators() -> Result<()> {
    // Every pair of dtypes promotes like torch.promote_types (or fails naming both).
    let mut rng = Rng::new(4);
    for da in common::on_device(DType::ALL) {
        for db in common::on_device(DType::ALL) {
            let a = common::tensor(da, &[1.0, 0.0], &[2]);
            let c = common::tensor(db, &[1.0], &[1]);
            match da.promote(db) {
                Ok(d) => assert_eq!(a.add(&c)?.dtype(), d, "{da} + {db}"),
                Err(_) => common::assert_err(
                    &format!("{da} + {db}"),
                    a.add(&c),
                    common::promotion("add"),
                    &[da.name(), db.name()],
                ),
            }
        }
    }
    // Mixed-dtype values, with broadcasting.
    let add = Binary::new("add", |a, b| a.add(b), |a, b, _| a + b);
    let mul = Binary::new("mul", |a, b| a.mul(b), |a, b, _| a * b);
    let div = Binary {
        result: float_result,
        rhs: Domain::new((0.25, 4.0), (1, 20)),
        ..Binary::new("div", |a, b| a.div(b), |a, b, _| a / b)
    };
    for (da, db) in [
        (DType::U8, DType::I8),
        (DType::I32, DType::F16),
        (DType::Bool, DType::F32),
        (DType::F16, DType::BF16),
        (DType::I64, DType::F64),
        (DType::U16, DType::I16),
    ] {
        for op in [&add, &mul, &div] {
            check_binary(op, &mut rng, EVERY_DTYPE[0], (da, db));
            check_binary(op, &mut rng, EVERY_DTYPE[1], (db, da));
        }
    }
    // Tensor-number ops: a number changes the dtype only when its category is higher.
    let (int, float) = (DType::I64.kind(), DType::F32.kind());
    for dtype in common::on_device(DType::ALL) {
        let x = input(
            &mut rng,
            dtype,
            &[3, 5],
            Domain::new((-4.0, 4.0), (0, 9)),
            false,
        );
        let mut checks: Vec<ScalarCheck> = vec![
            ("t + 3", x.t.add(3)?, dtype.promote_scalar(int), |v| v + 3.0),
            ("t * 2.5", (&x.t * 2.5)?, dtype.promote_scalar(float), |v| {
                v * 2.5
            }),
            ("t + true", x.t.add(true)?, dtype, |v| v + 1.0),
            ("2.0 * t", (2.0 * &x.t)?, dtype.promote_scalar(float), |v| {
                2.0 * v
            }),
            ("7 - t", (7 - &x.t)?, dtype.promote_scalar(int), |v| 7.0 - v),
            (
                "1.0 / t",
                (1.0 / x.t.clone())?,
                float_result(dtype.promote_scalar(float)),
                |v| 1.0 / v,
            ),
            (
                "t.maximum(1.5)",
                x.t.maximum(1.5)?,
                dtype.promote_scalar(float),
                |v| v.max(1.5),
            ),
            ("t.lt(2)", x.t.lt(2)?, DType::Bool, |v| b(v < 2.0)),
        ];
        if dtype != DType::Bool {
            checks.push(("-t", (-x.t.clone())?, dtype, |v| -v));
        }
        for (what, out, want_dtype, f) in checks {
            let what = format!("{dtype} {what}");
            assert_eq!(out.dtype(), want_dtype, "{what}");
            let want: Vec<f64> = x.values.iter().map(|&v| stored(want_dtype, f(v))).collect();
            common::assert_close(
                &what,
                &common::read(&out),
                &want,
                common::tolerance(want_dtype, false),
            );
        }
    }
    // Owned and borrowed operands all work, and int ^ negative int number is refused.
    let t = Tensor::from([1.0f32, 2.0]);
    let sum = (((t.clone() + &t)? - t.clone())? * (&t / t.clone())?)?;
    assert_eq!(sum.to_vec::<f32>()?, vec![1.0, 2.0]);
    common::assert_err(
        "i32 ^ -1",
        Tensor::from([2i32]).pow(-1),
        common::invalid("pow"),
        &["negative"],
    );
    // Negative values inside an integer exponent tensor: 1 / a^|b|, truncated.
    let base = Tensor::from([2i32, 1, -1, -1, 0, 3]);
    let exp = Tensor::from([-1i32, -3, -3, -2, -1, 0]);
    assert_eq!(base.pow(&exp)?.to_vec::<i32>()?, vec![0, 1, -1, 1, 0, 1]);
    // A number to tensor powers (`torch.pow(2.5, t)`), against f64.
    let x: Vec<f32> = vec![-3.0, -0.5, 0.0, 0.75, 2.0, 7.25];
    let got = Tensor::from_slice(&x, [6])?.rpow(2.5)?;
    assert_eq!(got.dtype(), DType::F32);
    let want: Vec<f64> = x.iter().map(|&v| 2.5f64.powf(f64::from(v))).collect();
    common::assert_close(
        "rpow f32",
        &common::read(&got),
        &want,
        common::tolerance(DType::F32, true),
    );
    let got = Tensor::from([0i64, 1, 5, -1]).rpow(3)?;
    assert_eq!(got.to_vec::<i64>()?, vec![1, 3, 243, 0]);
    Ok(())
}

// =====================================================================================
// Errors
// =====================================================================================

#[test]
fn errors_name_the_op_the_operands_and_the_fix() -> Result<()> {
    let a = Tensor::zeros([2, 3], DType::F32);
    let c = Tensor::zeros([4], DType::F32);
    let mask = Tensor::from([true, false]);
    let (u, i) = (Tensor::from([1u64]), Tensor::from([1i64]));
    let shapes = [
        ("[2, 3] + [4]", a.add(&c), "add"),
        ("[2, 3] * [4]", &a * &c, "mul"),
    ];
    for (what, res, op) in shapes {
        common::assert_err(what, res, common::shape_error, &[op, "[2, 3]", "[4]"]);
    }
    common::assert_err(
        "u64 + i64",
        u.add(&i),
        common::promotion("add"),
        &["u64", "i64", "cast"],
    );
    // sqrt on bool promotes to f32; neg and abs on bool are errors that suggest the fix.
    assert_eq!(mask.sqrt().to_vec::<f32>()?, vec![1.0, 0.0]);
    let unsupported = [
        ("-bool", mask.neg(), "neg", DType::Bool, "logical_not"),
        ("-bool operator", -&mask, "neg", DType::Bool, "logical_not"),
        ("abs(bool)", mask.abs(), "abs", DType::Bool, "cast"),
        (
            "bool - bool",
            mask.sub(&mask),
            "sub",
            DType::Bool,
            "logical_xor",
        ),
        ("floor(bool)", mask.floor(), "floor", DType::Bool, "cast"),
        (
            "f32 & 1",
            a.bitwise_and(1),
            "bitwise_and",
            DType::F32,
            "integer",
        ),
        (
            "~f32",
            a.bitwise_not(),
            "bitwise_not",
            DType::F32,
            "integer",
        ),
        ("f32 << 1", a.shl(1), "shl", DType::F32, "integer"),
        ("bool ^ bool", mask.pow(&mask), "pow", DType::Bool, "cast"),
    ];
    for (what, res, op, dtype, fix) in unsupported {
        common::assert_err(
            what,
            res,
            common::unsupported(op, dtype),
            &[op, dtype.name(), fix],
        );
    }
    // Reading data back checks the dtype and the element count.
    let e = Tensor::from([1.0f32]).to_vec::<f64>().unwrap_err();
    assert!(
        matches!(
            e,
            Error::DTypeMismatch {
                op: "to_vec",
                actual: DType::F32,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("cast(DType::F64)"), "{e}");
    let e = a.item::<f32>().unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { op: "item", .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("[2, 3]"), "{e}");
    let e = Tensor::from_vec(vec![1.0f32; 5], [2, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DataLength {
                op: "from_vec",
                len: 5,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("[2, 3]"), "{e}");
    Ok(())
}

/// Size-0 dims: shapes and dtypes are checked at the call like any other.
#[test]
fn size_zero_dims() -> Result<()> {
    let a = common::tensor(DType::F32, &[], &[0, 3]);
    let c = Tensor::from([1.0f32, 2.0, 3.0]);
    let outs = [
        a.add(&c)?,
        a.exp(),
        a.lt(&c)?,
        a.cast(DType::I32),
        Tensor::where_cond(&a.gt(0.0)?, &a, 1.0)?,
        a.remainder(2.0)?,
        Tensor::zeros([0, 3], DType::F32),
    ];
    for out in &outs {
        assert_eq!(out.dims(), vec![0, 3]);
        assert!(common::read(out).is_empty());
    }
    common::assert_err(
        "[0, 3] + [2]",
        a.add(Tensor::from([1.0f32, 2.0])),
        common::shape_error,
        &["[0, 3]", "[2]"],
    );
    Ok(())
}
