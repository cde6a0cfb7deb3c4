//! Tests of `DType` (names, promotion) and `Scalar` (casts, bitcasts, equality, display and
//! the semantics of every op), against tables written out here and oracles computed
//! directly with Rust's operators, `as` and `half`.

use std::cmp::Ordering;
use std::collections::HashSet;

use tessel_shape::{
    BinaryOp, DType, DTypeError, F8E4M3, F8E5M2, Scalar, ScalarError, ScalarKind, TernaryOp,
    UnaryOp, bf16, f16,
};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// `SplitMix64`: a tiny, well-mixed generator, so the random tests are reproducible without
/// a `rand` dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-scale, scale)`.
    fn uniform(&mut self, scale: f64) -> f64 {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
    }
}

/// Equal bit for bit, except that any two NaNs match: NaN payloads are outside the spec.
fn same(a: Scalar, b: Scalar) -> bool {
    a == b || (a.dtype() == b.dtype() && a.is_nan() && b.is_nan())
}

#[track_caller]
fn assert_same(got: Scalar, expected: Scalar, context: &str) {
    assert!(
        same(got, expected),
        "{context}: got {got:?}, expected {expected:?}"
    );
}

/// The value nearest to `x` (ties to even) in a 16-bit float format whose non-negative
/// finite values have the bit patterns `0..=max_finite`, found by binary search over those
/// patterns. It shares no code with `half`'s or Tessel's conversions, so it can check both.
fn nearest_16(x: f64, to_f64: fn(u16) -> f64, max_finite: u16) -> u16 {
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let ax = x.abs();
    let max = to_f64(max_finite);
    let overflow = max + (max - to_f64(max_finite - 1)) / 2.0;
    if ax >= overflow {
        // The tie at `overflow` goes to the even neighbour, which is infinity.
        return (max_finite + 1) | sign;
    }
    // The largest pattern whose value is <= ax.
    let (mut lo, mut hi) = (0u16, max_finite);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if to_f64(mid) <= ax {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let below = to_f64(lo);
    if below == ax || lo == max_finite {
        return lo | sign;
    }
    // Both distances are exact (Sterbenz): the neighbours are within a factor of 2 of ax.
    let (down, up) = (ax - below, to_f64(lo + 1) - ax);
    let m = if down < up || (down == up && lo % 2 == 0) {
        lo
    } else {
        lo + 1
    };
    m | sign
}

fn nearest_f16(x: f64) -> f16 {
    if x.is_nan() {
        return f16::from_f32(x as f32);
    }
    f16::from_bits(nearest_16(x, |b| f16::from_bits(b).to_f64(), 0x7BFF))
}

fn nearest_bf16(x: f64) -> bf16 {
    if x.is_nan() {
        return bf16::from_f32(x as f32);
    }
    bf16::from_bits(nearest_16(x, |b| bf16::from_bits(b).to_f64(), 0x7F7F))
}

/// The value of a float8 bit pattern from its definition: `exponent_bits` exponent bits
/// (bias `2^(e-1) - 1`), the rest significand; `e4m3` (PyTorch's e4m3fn) has no infinity and
/// only `S.1111.111` as NaN, `e5m2` is IEEE-like.
fn f8_value(bits: u8, exponent_bits: u32) -> f64 {
    let m_bits = 7 - exponent_bits;
    let bias = (1 << (exponent_bits - 1)) - 1;
    let sign = if bits & 0x80 == 0 { 1.0 } else { -1.0 };
    let e = i32::from(bits >> m_bits) & ((1 << exponent_bits) - 1);
    let m = f64::from(bits & ((1 << m_bits) - 1));
    let scale = f64::from(1u32 << m_bits);
    if exponent_bits == 4 && bits & 0x7f == 0x7f {
        return f64::NAN;
    }
    if exponent_bits == 5 && e == 31 {
        return if m == 0.0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    if e == 0 {
        sign * m / scale * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + m / scale) * 2f64.powi(e - bias)
    }
}

/// `x` rounded to nearest even in a float8 format, by search over the finite patterns
/// `0..=max_finite`; past the top of the grid (as if it continued), `overflow` (NaN for
/// e4m3fn, infinity for e5m2), and NaN for NaN, with the sign of `x` throughout.
fn nearest_8(x: f64, exponent_bits: u32, max_finite: u8, overflow: u8) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return 0x7f | sign;
    }
    let value = |b: u8| f8_value(b, exponent_bits);
    let ax = x.abs();
    let (max, step) = (value(max_finite), value(max_finite) - value(max_finite - 1));
    let tie = max + step / 2.0;
    // The grid's next point would have an odd pattern for e4m3 (0x7f) and even for e5m2
    // (0x7c), so the tie stays at max for e4m3 and overflows for e5m2.
    if ax > tie || (ax == tie && overflow == 0x7c) {
        return overflow | sign;
    }
    let mut best = 0u8;
    for b in 0..=max_finite {
        if value(b) <= ax {
            best = b;
        }
    }
    if best == max_finite || value(best) == ax {
        return best | sign;
    }
    let (down, up) = (ax - value(best), value(best + 1) - ax);
    let m = if down < up || (down == up && best.is_multiple_of(2)) {
        best
    } else {
        best + 1
    };
    m | sign
}

fn nearest_e4m3(x: f64) -> F8E4M3 {
    F8E4M3::from_bits(nearest_8(x, 4, 0x7e, 0x7f))
}

fn nearest_e5m2(x: f64) -> F8E5M2 {
    F8E5M2::from_bits(nearest_8(x, 5, 0x7b, 0x7c))
}

// ---------------------------------------------------------------------------------------
// DType
// ---------------------------------------------------------------------------------------

const NAMES: [&str; 13] = [
    "bool", "u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64",
];

/// `torch.promote_types` for every pair torch supports, and Tessel's documented extension
/// for the pairs of `u16`/`u32`/`u64` with other integers torch refuses; `--` is an error.
#[rustfmt::skip]
const PROMOTION: [[&str; 13]; 13] = [
    //  bool    u8     u16    u32    u64    i8     i16    i32    i64    f16    bf16   f32    f64
    ["bool", "u8",  "u16", "u32", "u64", "i8",  "i16", "i32", "i64", "f16", "bf16", "f32", "f64"], // bool
    ["u8",   "u8",  "u16", "u32", "u64", "i16", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"], // u8
    ["u16",  "u16", "u16", "u32", "u64", "i32", "i32", "i32", "i64", "f16", "bf16", "f32", "f64"], // u16
    ["u32",  "u32", "u32", "u32", "u64", "i64", "i64", "i64", "i64", "f16", "bf16", "f32", "f64"], // u32
    ["u64",  "u64", "u64", "u64", "u64", "--",  "--",  "--",  "--",  "f16", "bf16", "f32", "f64"], // u64
    ["i8",   "i16", "i32", "i64", "--",  "i8",  "i16", "i32", "i64", "f16", "bf16", "f32", "f64"], // i8
    ["i16",  "i16", "i32", "i64", "--",  "i16", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"], // i16
    ["i32",  "i32", "i32", "i64", "--",  "i32", "i32", "i32", "i64", "f16", "bf16", "f32", "f64"], // i32
    ["i64",  "i64", "i64", "i64", "--",  "i64", "i64", "i64", "i64", "f16", "bf16", "f32", "f64"], // i64
    ["f16",  "f16", "f16", "f16", "f16", "f16", "f16", "f16", "f16", "f16", "f32",  "f32", "f64"], // f16
    ["bf16", "bf16","bf16","bf16","bf16","bf16","bf16","bf16","bf16","f32", "bf16", "f32", "f64"], // bf16
    ["f32",  "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32",  "f32", "f64"], // f32
    ["f64",  "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64",  "f64", "f64"], // f64
];

#[test]
fn names_order_and_parsing() {
    for (dtype, name) in DType::ALL.into_iter().zip(NAMES) {
        assert_eq!(dtype.name(), name);
        assert_eq!(dtype.to_string(), name);
        assert_eq!(name.parse::<DType>(), Ok(dtype));
    }
    let mut sorted = DType::ALL;
    sorted.sort();
    assert_eq!(sorted, DType::ALL, "ALL is in declaration order");

    for bad in ["float32", "F32", "", "int", " f32"] {
        let err = bad.parse::<DType>().unwrap_err();
        assert_eq!(
            err,
            DTypeError::Unknown {
                name: bad.to_owned()
            }
        );
        let message = err.to_string();
        assert!(message.contains(&format!("{bad:?}")), "{message}");
        assert!(
            message.contains("f32") && message.contains("bf16"),
            "{message}"
        );
        assert!(!message.ends_with('.'), "{message}");
    }
}

#[test]
fn sizes_and_categories() {
    // (dtype, bytes, float, int, signed, bool, kind)
    use ScalarKind::{Bool as B, Float as F, Int as I};
    let table = [
        (DType::Bool, 1, false, false, false, true, B),
        (DType::U8, 1, false, true, false, false, I),
        (DType::U16, 2, false, true, false, false, I),
        (DType::U32, 4, false, true, false, false, I),
        (DType::U64, 8, false, true, false, false, I),
        (DType::I8, 1, false, true, true, false, I),
        (DType::I16, 2, false, true, true, false, I),
        (DType::I32, 4, false, true, true, false, I),
        (DType::I64, 8, false, true, true, false, I),
        (DType::F16, 2, true, false, true, false, F),
        (DType::BF16, 2, true, false, true, false, F),
        (DType::F32, 4, true, false, true, false, F),
        (DType::F64, 8, true, false, true, false, F),
    ];
    for (dtype, bytes, float, int, signed, boolean, kind) in table {
        assert_eq!(dtype.size_bytes(), bytes, "{dtype}");
        assert_eq!(dtype.bits(), 8 * bytes as u32, "{dtype}");
        assert_eq!(dtype.is_float(), float, "{dtype}");
        assert_eq!(dtype.is_int(), int, "{dtype}");
        assert_eq!(dtype.is_signed(), signed, "{dtype}");
        assert_eq!(dtype.is_bool(), boolean, "{dtype}");
        assert_eq!(dtype.kind(), kind, "{dtype}");
    }
}

#[test]
fn min_and_max_values() {
    let table = [
        (DType::Bool, Scalar::Bool(false), Scalar::Bool(true)),
        (DType::U8, Scalar::U8(0), Scalar::U8(255)),
        (DType::U16, Scalar::U16(0), Scalar::U16(65535)),
        (DType::U32, Scalar::U32(0), Scalar::U32(u32::MAX)),
        (DType::U64, Scalar::U64(0), Scalar::U64(u64::MAX)),
        (DType::I8, Scalar::I8(-128), Scalar::I8(127)),
        (DType::I16, Scalar::I16(-32768), Scalar::I16(32767)),
        (DType::I32, Scalar::I32(i32::MIN), Scalar::I32(i32::MAX)),
        (DType::I64, Scalar::I64(i64::MIN), Scalar::I64(i64::MAX)),
        (
            DType::F16,
            Scalar::F16(f16::from_f32(-65504.0)),
            Scalar::F16(f16::from_f32(65504.0)),
        ),
        (
            DType::BF16,
            Scalar::BF16(bf16::from_bits(0xFF7F)),
            Scalar::BF16(bf16::from_bits(0x7F7F)),
        ),
        (
            DType::F32,
            Scalar::F32(-3.402_823_5e38),
            Scalar::F32(3.402_823_5e38),
        ),
        (DType::F64, Scalar::F64(f64::MIN), Scalar::F64(f64::MAX)),
    ];
    for (dtype, min, max) in table {
        assert_eq!(dtype.min_value(), min, "{dtype}");
        assert_eq!(dtype.max_value(), max, "{dtype}");
    }
}

#[test]
fn promotion_table() {
    for (i, a) in DType::ALL.into_iter().enumerate() {
        for (j, b) in DType::ALL.into_iter().enumerate() {
            let expected = PROMOTION[i][j];
            assert_eq!(
                expected, PROMOTION[j][i],
                "the table is symmetric at {a}, {b}"
            );
            match a.promote(b) {
                Ok(dtype) => assert_eq!(dtype.name(), expected, "{a}.promote({b})"),
                Err(err) => {
                    assert_eq!(expected, "--", "{a}.promote({b}) failed: {err}");
                    assert_eq!(err, DTypeError::NoCommonType { lhs: a, rhs: b });
                }
            }
            assert_eq!(a.promote(b).ok(), b.promote(a).ok(), "symmetry at {a}, {b}");
        }
    }
}

#[test]
fn promotion_error_message() {
    let message = DType::I32.promote(DType::U64).unwrap_err().to_string();
    assert!(
        message.contains("i32") && message.contains("u64"),
        "{message}"
    );
    assert!(message.contains("cast one operand explicitly"), "{message}");
    assert!(!message.ends_with('.'), "{message}");
}

#[test]
fn promotion_with_python_scalars() {
    use ScalarKind::{Bool, Float, Int};
    let cases = [
        (DType::Bool, Bool, DType::Bool),
        (DType::Bool, Int, DType::I64),
        (DType::Bool, Float, DType::F32),
        (DType::U8, Bool, DType::U8),
        (DType::U8, Int, DType::U8),
        (DType::U8, Float, DType::F32),
        (DType::I32, Int, DType::I32),
        (DType::U64, Int, DType::U64),
        (DType::I64, Float, DType::F32),
        (DType::F16, Int, DType::F16),
        (DType::F16, Float, DType::F16),
        (DType::BF16, Float, DType::BF16),
        (DType::F64, Bool, DType::F64),
        (DType::F64, Float, DType::F64),
    ];
    for (dtype, kind, expected) in cases {
        assert_eq!(
            dtype.promote_scalar(kind),
            expected,
            "{dtype} with a {kind}"
        );
    }
    // The general rule, over every pair.
    for dtype in DType::ALL {
        for kind in [Bool, Int, Float] {
            let expected = match (dtype.kind(), kind) {
                (ScalarKind::Bool, Int) => DType::I64,
                (ScalarKind::Bool | ScalarKind::Int, Float) => DType::F32,
                _ => dtype,
            };
            assert_eq!(
                dtype.promote_scalar(kind),
                expected,
                "{dtype} with a {kind}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Scalar basics
// ---------------------------------------------------------------------------------------

#[test]
fn equality_and_hashing_are_bitwise() {
    let nan = Scalar::F32(f32::NAN);
    assert_eq!(nan, nan);
    assert_ne!(nan, Scalar::F32(f32::from_bits(f32::NAN.to_bits() + 1)));
    assert_ne!(Scalar::F32(0.0), Scalar::F32(-0.0));
    assert_ne!(Scalar::F32(1.0), Scalar::F64(1.0));
    assert_ne!(Scalar::I32(1), Scalar::U32(1));
    assert_ne!(Scalar::F16(f16::ONE), Scalar::BF16(bf16::ONE));
    assert_eq!(Scalar::F64(f64::NAN), Scalar::F64(f64::NAN));

    let mut set = HashSet::new();
    for value in [
        nan,
        nan,
        Scalar::F32(0.0),
        Scalar::F32(-0.0),
        Scalar::F32(1.0),
        Scalar::F64(1.0),
        Scalar::I8(-1),
        Scalar::U8(255),
        Scalar::U8(255),
    ] {
        set.insert(value);
    }
    assert_eq!(set.len(), 7);
    assert!(set.contains(&Scalar::F32(f32::NAN)));
}

#[test]
fn conversions_from_primitives() {
    assert_eq!(Scalar::from(true), Scalar::Bool(true));
    assert_eq!(Scalar::from(7u8), Scalar::U8(7));
    assert_eq!(Scalar::from(7u16), Scalar::U16(7));
    assert_eq!(Scalar::from(7u32), Scalar::U32(7));
    assert_eq!(Scalar::from(7u64), Scalar::U64(7));
    assert_eq!(Scalar::from(-7i8), Scalar::I8(-7));
    assert_eq!(Scalar::from(-7i16), Scalar::I16(-7));
    assert_eq!(Scalar::from(-7i32), Scalar::I32(-7));
    assert_eq!(Scalar::from(-7i64), Scalar::I64(-7));
    assert_eq!(Scalar::from(f16::ONE), Scalar::F16(f16::ONE));
    assert_eq!(Scalar::from(bf16::ONE), Scalar::BF16(bf16::ONE));
    assert_eq!(Scalar::from(1.5f32), Scalar::F32(1.5));
    assert_eq!(Scalar::from(1.5f64), Scalar::F64(1.5));
}

#[test]
fn zero_one_and_lossy_accessors() {
    for dtype in DType::ALL {
        let (zero, one) = (Scalar::zero(dtype), Scalar::one(dtype));
        assert_eq!(zero.dtype(), dtype);
        assert_eq!(one.dtype(), dtype);
        assert_eq!(zero.to_f64(), 0.0, "{dtype}");
        assert!(zero.to_f64().is_sign_positive(), "{dtype}");
        assert_eq!(one.to_f64(), 1.0, "{dtype}");
        assert_eq!(one.to_i64(), 1, "{dtype}");
        assert!(!zero.is_nan());
    }
    assert_eq!(Scalar::zero(DType::Bool), Scalar::Bool(false));
    assert_eq!(Scalar::one(DType::F16), Scalar::F16(f16::ONE));
    assert_eq!(Scalar::F32(f32::NAN).to_i64(), 0);
    assert_eq!(Scalar::F64(-1e30).to_i64(), i64::MIN);
    assert_eq!(Scalar::F32(-2.9).to_i64(), -2);
    assert_eq!(Scalar::U64(u64::MAX).to_i64(), -1);
    assert_eq!(Scalar::U64(u64::MAX).to_f64(), 2f64.powi(64));
    assert_eq!(Scalar::Bool(true).to_f64(), 1.0);
    assert_eq!(Scalar::BF16(bf16::from_f32(1.5)).to_f64(), 1.5);
    assert!(Scalar::F16(f16::NAN).is_nan());
    assert!(Scalar::F16(f16::NAN).to_f64().is_nan());
    assert!(!Scalar::I32(0).is_nan());
}

#[test]
fn display() {
    let cases = [
        (Scalar::Bool(true), "true"),
        (Scalar::Bool(false), "false"),
        (Scalar::U8(255), "255"),
        (Scalar::I8(-5), "-5"),
        (Scalar::U64(u64::MAX), "18446744073709551615"),
        (Scalar::I64(i64::MIN), "-9223372036854775808"),
        (Scalar::F32(1.0), "1.0"),
        (Scalar::F64(1.0), "1.0"),
        (Scalar::F32(0.1), "0.1"),
        (Scalar::F64(0.1), "0.1"),
        (Scalar::F32(-0.0), "-0.0"),
        (Scalar::F64(1e-8), "1e-8"),
        (Scalar::F32(1e20), "1e20"),
        (Scalar::F32(f32::NAN), "NaN"),
        (Scalar::F64(f64::NEG_INFINITY), "-inf"),
        (Scalar::F16(f16::ONE), "1.0"),
        (Scalar::F16(f16::from_f32(65504.0)), "65504.0"),
        (Scalar::BF16(bf16::from_f32(-2.5)), "-2.5"),
        (Scalar::F16(f16::INFINITY), "inf"),
    ];
    for (value, text) in cases {
        assert_eq!(value.to_string(), text, "{value:?}");
    }
}

#[test]
fn display_round_trips() {
    let mut rng = Rng(0xD15A_1A75);
    for _ in 0..2000 {
        let bits = rng.next_u64();
        let x = f64::from_bits(bits);
        if x.is_finite() {
            let text = Scalar::F64(x).to_string();
            assert_eq!(text.parse::<f64>().map(f64::to_bits), Ok(bits), "{text}");
        }
        let y = f32::from_bits(bits as u32);
        if y.is_finite() {
            let text = Scalar::F32(y).to_string();
            assert_eq!(
                text.parse::<f32>().map(f32::to_bits),
                Ok(y.to_bits()),
                "{text}"
            );
        }
        let h = f16::from_bits(bits as u16);
        if h.is_finite() {
            let text = Scalar::F16(h).to_string();
            let back = text.parse::<f32>().map(f16::from_f32);
            assert_eq!(back.map(f16::to_bits), Ok(h.to_bits()), "{text}");
        }
        let b = bf16::from_bits((bits >> 16) as u16);
        if b.is_finite() {
            let text = Scalar::BF16(b).to_string();
            let back = text.parse::<f32>().map(bf16::from_f32);
            assert_eq!(back.map(bf16::to_bits), Ok(b.to_bits()), "{text}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Casts
// ---------------------------------------------------------------------------------------

/// Interesting floats: specials, rounding ties, integer limits, f16/bf16/f32 overflow.
fn interesting_floats() -> Vec<f64> {
    vec![
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.0,
        -1.0,
        -1.5,
        2.5,
        1e-8,
        -1e-8,
        1e10,
        -1e10,
        255.0,
        256.0,
        -128.5,
        -129.0,
        65504.0,
        65519.99,
        65520.0,
        65536.0,
        3e38,
        -3e38,
        3.5e38,
        1e300,
        5e-324,
        2f64.powi(-24),
        2f64.powi(-25),
        2f64.powi(-25) * 1.000_001,
        2f64.powi(31),
        2f64.powi(32),
        u64::MAX as f64,
        i64::MIN as f64,
        i64::MAX as f64,
        16_777_217.0,
        // Just above an f16 tie only in bits `half`'s from_f64 ignores (see below).
        1.0 + 2f64.powi(-11) + 2f64.powi(-23),
        1.0 + 2f64.powi(-9) + 2f64.powi(-40),
        // Just below an f16 tie by less than half an f32 ulp: going through f32 would round
        // to the tie and then away from the correct neighbour.
        1.0 + 3.0 * 2f64.powi(-11) - 2f64.powi(-40),
        1.0 + 3.0 * 2f64.powi(-8) - 2f64.powi(-40),
        0.1,
        -0.3,
        1.0 / 3.0,
    ]
}

/// Interesting integers; each source dtype takes them with `as` (wrapping).
fn interesting_ints() -> Vec<i128> {
    vec![
        0,
        1,
        -1,
        2,
        127,
        128,
        -128,
        -129,
        255,
        256,
        2049,
        65504,
        65519,
        65520,
        65535,
        65536,
        (1 << 24) + 1,
        (1 << 31) - 1,
        1 << 31,
        (1 << 53) + 1,
        i64::MIN as i128,
        i64::MAX as i128,
        u64::MAX as i128,
        0x1234_5678_9ABC_DEF0,
    ]
}

fn sources(dtype: DType) -> Vec<Scalar> {
    let floats = interesting_floats();
    let ints = interesting_ints();
    let mut out = Vec::new();
    macro_rules! from_both {
        ($variant:ident, $t:ty) => {{
            out.extend(ints.iter().map(|&v| Scalar::$variant(v as $t)));
            out.extend(floats.iter().map(|&v| Scalar::$variant(v as $t)));
        }};
    }
    match dtype {
        DType::Bool => out.extend([Scalar::Bool(false), Scalar::Bool(true)]),
        DType::U8 => from_both!(U8, u8),
        DType::U16 => from_both!(U16, u16),
        DType::U32 => from_both!(U32, u32),
        DType::U64 => from_both!(U64, u64),
        DType::I8 => from_both!(I8, i8),
        DType::I16 => from_both!(I16, i16),
        DType::I32 => from_both!(I32, i32),
        DType::I64 => from_both!(I64, i64),
        DType::F32 => from_both!(F32, f32),
        DType::F64 => from_both!(F64, f64),
        DType::F16 => {
            out.extend(floats.iter().map(|&v| Scalar::F16(f16::from_f32(v as f32))));
            out.extend(ints.iter().map(|&v| Scalar::F16(f16::from_f32(v as f32))));
            out.extend(
                [0x0001, 0x8001, 0x03FF, 0x7BFF, 0x7E00].map(|b| Scalar::F16(f16::from_bits(b))),
            );
        }
        DType::F8E4M3 => out.extend((0..=255).map(|b| Scalar::F8E4M3(F8E4M3::from_bits(b)))),
        DType::F8E5M2 => out.extend((0..=255).map(|b| Scalar::F8E5M2(F8E5M2::from_bits(b)))),
        DType::BF16 => {
            out.extend(
                floats
                    .iter()
                    .map(|&v| Scalar::BF16(bf16::from_f32(v as f32))),
            );
            out.extend(ints.iter().map(|&v| Scalar::BF16(bf16::from_f32(v as f32))));
            out.extend([0x0001, 0x8001, 0x7F7F, 0x7FC0].map(|b| Scalar::BF16(bf16::from_bits(b))));
        }
    }
    out
}

/// `cast` computed directly: `as` between primitives, `half` from `f32`, and the
/// correctly rounded search oracle from `f64`.
fn reference_cast(value: Scalar, to: DType) -> Scalar {
    if value.dtype() == to {
        return value;
    }
    macro_rules! convert {
        ($v:expr, f16: $h:expr, bf16: $b:expr, f8: $f8:expr) => {{
            let v = $v;
            match to {
                DType::Bool => Scalar::Bool(v as f64 != 0.0),
                DType::U8 => Scalar::U8(v as u8),
                DType::U16 => Scalar::U16(v as u16),
                DType::U32 => Scalar::U32(v as u32),
                DType::U64 => Scalar::U64(v as u64),
                DType::I8 => Scalar::I8(v as i8),
                DType::I16 => Scalar::I16(v as i16),
                DType::I32 => Scalar::I32(v as i32),
                DType::I64 => Scalar::I64(v as i64),
                DType::F8E4M3 => Scalar::F8E4M3(nearest_e4m3($f8)),
                DType::F8E5M2 => Scalar::F8E5M2(nearest_e5m2($f8)),
                DType::F16 => Scalar::F16($h),
                DType::BF16 => Scalar::BF16($b),
                DType::F32 => Scalar::F32(v as f32),
                DType::F64 => Scalar::F64(v as f64),
            }
        }};
    }
    // Integers reach the half types through f32.
    macro_rules! int {
        ($v:expr) => {{
            let v = $v;
            convert!(v, f16: f16::from_f32(v as f32), bf16: bf16::from_f32(v as f32),
                f8: f64::from(v as f32))
        }};
    }
    macro_rules! float32 {
        ($v:expr) => {{
            let v: f32 = $v;
            convert!(v, f16: f16::from_f32(v), bf16: bf16::from_f32(v), f8: f64::from(v))
        }};
    }
    match value {
        Scalar::Bool(b) => int!(u8::from(b)),
        Scalar::U8(v) => int!(v),
        Scalar::U16(v) => int!(v),
        Scalar::U32(v) => int!(v),
        Scalar::U64(v) => int!(v),
        Scalar::I8(v) => int!(v),
        Scalar::I16(v) => int!(v),
        Scalar::I32(v) => int!(v),
        Scalar::I64(v) => int!(v),
        // The half types widen to f32 exactly, then convert from there.
        Scalar::F16(v) => float32!(v.to_f32()),
        Scalar::BF16(v) => float32!(v.to_f32()),
        // The float8 types widen to f32 exactly (checked against `f8_value` separately).
        Scalar::F8E4M3(v) => float32!(v.to_f32()),
        Scalar::F8E5M2(v) => float32!(v.to_f32()),
        Scalar::F32(v) => float32!(v),
        Scalar::F64(v) => convert!(v, f16: nearest_f16(v), bf16: nearest_bf16(v), f8: v),
    }
}

#[test]
fn cast_table_matches_rust_as_and_half() {
    let mut checked = 0;
    for from in DType::ALL.into_iter().chain(DType::FLOAT8) {
        for value in sources(from) {
            for to in DType::ALL.into_iter().chain(DType::FLOAT8) {
                let got = value.cast(to);
                assert_eq!(got.dtype(), to);
                let expected = reference_cast(value, to);
                // Casts are deterministic, so even NaN payloads must match here (except
                // from float8 NaNs, whose payload the widening to f32 does not keep).
                if value.is_nan() && value.dtype().is_float8() && got.is_nan() {
                    assert!(expected.is_nan(), "{value:?} as {to}");
                    continue;
                }
                assert_eq!(got, expected, "{value:?} as {to}");
                checked += 1;
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
}

#[test]
fn cast_spot_checks() {
    let cases = [
        (Scalar::F32(f32::NAN), DType::I32, Scalar::I32(0)),
        (Scalar::F32(f32::NAN), DType::Bool, Scalar::Bool(true)),
        (Scalar::F64(-0.0), DType::Bool, Scalar::Bool(false)),
        (Scalar::F64(1e10), DType::I32, Scalar::I32(i32::MAX)),
        (Scalar::F64(-1e10), DType::U32, Scalar::U32(0)),
        (Scalar::F32(f32::INFINITY), DType::U8, Scalar::U8(255)),
        (Scalar::F32(-1.5), DType::I8, Scalar::I8(-1)),
        (Scalar::F32(2.5), DType::U8, Scalar::U8(2)),
        (Scalar::I32(256), DType::U8, Scalar::U8(0)),
        (Scalar::I64(-1), DType::U64, Scalar::U64(u64::MAX)),
        (Scalar::U64(u64::MAX), DType::I8, Scalar::I8(-1)),
        (Scalar::U8(2), DType::Bool, Scalar::Bool(true)),
        (Scalar::Bool(true), DType::F64, Scalar::F64(1.0)),
        (Scalar::Bool(true), DType::I8, Scalar::I8(1)),
        (Scalar::F64(65504.0), DType::F16, Scalar::F16(f16::MAX)),
        (Scalar::F64(65519.99), DType::F16, Scalar::F16(f16::MAX)),
        (Scalar::F64(65520.0), DType::F16, Scalar::F16(f16::INFINITY)),
        (Scalar::F32(65520.0), DType::F16, Scalar::F16(f16::INFINITY)),
        (Scalar::F64(3e38), DType::F32, Scalar::F32(3e38)),
        (Scalar::F64(3.5e38), DType::F32, Scalar::F32(f32::INFINITY)),
        (
            Scalar::F64(3.5e38),
            DType::BF16,
            Scalar::BF16(bf16::INFINITY),
        ),
        (
            Scalar::F16(f16::from_f32(-2.5)),
            DType::I32,
            Scalar::I32(-2),
        ),
        (
            Scalar::F16(f16::INFINITY),
            DType::I16,
            Scalar::I16(i16::MAX),
        ),
        (
            Scalar::F16(f16::from_f32(0.5)),
            DType::BF16,
            Scalar::BF16(bf16::from_f32(0.5)),
        ),
        // 2^24 + 1 is not an f32, and rounds to even.
        (
            Scalar::I32(16_777_217),
            DType::F32,
            Scalar::F32(16_777_216.0),
        ),
        // Integers reach f16 through f32: 2049 is a tie in f16 and goes to even (2048).
        (
            Scalar::I32(2049),
            DType::F16,
            Scalar::F16(f16::from_f32(2048.0)),
        ),
    ];
    for (value, to, expected) in cases {
        assert_eq!(value.cast(to), expected, "{value:?} as {to}");
    }
}

#[test]
fn f64_to_half_rounds_once() {
    // 1 + 2^-11 is halfway between the f16s 1 and 1 + 2^-10; the 2^-23 above it must round
    // up. (`half`'s own from_f64 ignores the low 32 bits of the f64 and returns 1.)
    let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-23);
    let up = f16::from_f32(1.0 + 2f32.powi(-10));
    assert_eq!(Scalar::F64(x).cast(DType::F16), Scalar::F16(up));
    assert_eq!(
        Scalar::F64(x).cast(DType::F16),
        Scalar::F32(x as f32).cast(DType::F16)
    );
    // Same for bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7.
    let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    let up = bf16::from_f32(1.0 + 2f32.powi(-7));
    assert_eq!(Scalar::F64(x).cast(DType::BF16), Scalar::BF16(up));
    // 1 + 3 * 2^-11 is a tie between 1 + 2^-10 (odd) and 1 + 2^-9 (even). Just below it,
    // by less than half an f32 ulp, must round down to the odd one; going through f32 would
    // round to the tie first, and then to the even one.
    let x = 1.0 + 3.0 * 2f64.powi(-11) - 2f64.powi(-40);
    let down = f16::from_f32(1.0 + 2f32.powi(-10));
    assert_eq!(Scalar::F64(x).cast(DType::F16), Scalar::F16(down));
    assert_ne!(Scalar::F32(x as f32).cast(DType::F16), Scalar::F16(down));

    // Random f64s against the search oracle, across the whole f16 range and beyond.
    let mut rng = Rng(0xF16);
    for _ in 0..20_000 {
        let bits = rng.next_u64();
        // Exponents from 2^-30 to 2^20 with random significands and signs.
        let exponent = 1023 - 30 + (bits >> 52) % 51;
        let x = f64::from_bits((bits & 0x800F_FFFF_FFFF_FFFF) | (exponent << 52));
        assert_eq!(
            Scalar::F64(x).cast(DType::F16),
            Scalar::F16(nearest_f16(x)),
            "{x:e}"
        );
        let y = x * 2f64.powi(100);
        assert_eq!(
            Scalar::F64(y).cast(DType::BF16),
            Scalar::BF16(nearest_bf16(y)),
            "{y:e}"
        );
        let z = x * 2f64.powi(-110);
        assert_eq!(
            Scalar::F64(z).cast(DType::BF16),
            Scalar::BF16(nearest_bf16(z)),
            "{z:e}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Bitcasts
// ---------------------------------------------------------------------------------------

#[test]
fn bitcasts() {
    assert_eq!(
        Scalar::F32(1.0).bitcast(DType::U32),
        Ok(Scalar::U32(0x3F80_0000))
    );
    assert_eq!(
        Scalar::F32(-0.0).bitcast(DType::I32),
        Ok(Scalar::I32(i32::MIN))
    );
    assert_eq!(Scalar::I8(-1).bitcast(DType::U8), Ok(Scalar::U8(255)));
    assert_eq!(
        Scalar::U16(0x3C00).bitcast(DType::F16),
        Ok(Scalar::F16(f16::ONE))
    );
    assert_eq!(
        Scalar::F16(f16::ONE).bitcast(DType::BF16),
        Ok(Scalar::BF16(bf16::from_bits(0x3C00)))
    );
    assert_eq!(
        Scalar::F64(1.0).bitcast(DType::I64),
        Ok(Scalar::I64(0x3FF0_0000_0000_0000))
    );
    assert_eq!(Scalar::Bool(true).bitcast(DType::U8), Ok(Scalar::U8(1)));
    assert_eq!(Scalar::Bool(false).bitcast(DType::I8), Ok(Scalar::I8(0)));
    assert_eq!(
        Scalar::Bool(true).bitcast(DType::Bool),
        Ok(Scalar::Bool(true))
    );
    assert_eq!(Scalar::U8(1).bitcast(DType::Bool), Ok(Scalar::Bool(true)));
    assert_eq!(Scalar::I8(0).bitcast(DType::Bool), Ok(Scalar::Bool(false)));

    // Round trips keep every bit, NaN payloads included.
    let nan = Scalar::F32(f32::from_bits(0x7FA0_0001));
    assert_eq!(
        nan.bitcast(DType::U32).and_then(|u| u.bitcast(DType::F32)),
        Ok(nan)
    );

    let err = Scalar::U8(2).bitcast(DType::Bool).unwrap_err();
    assert_eq!(
        err,
        ScalarError::InvalidBool {
            from: DType::U8,
            bits: 2
        }
    );
    let err = Scalar::I8(-1).bitcast(DType::Bool).unwrap_err();
    assert_eq!(
        err,
        ScalarError::InvalidBool {
            from: DType::I8,
            bits: 0xFF
        }
    );
    let message = err.to_string();
    assert!(
        message.contains("i8") && message.contains("0xff"),
        "{message}"
    );

    for (from, to) in [
        (Scalar::F32(1.0), DType::F16),
        (Scalar::Bool(true), DType::I32),
        (Scalar::U64(1), DType::U32),
        (Scalar::F16(f16::ONE), DType::U8),
    ] {
        let err = from.bitcast(to).unwrap_err();
        assert_eq!(
            err,
            ScalarError::Bitcast {
                from: from.dtype(),
                to
            }
        );
        let message = err.to_string();
        assert!(message.contains(from.dtype().name()) && message.contains(to.name()));
        assert!(
            message.contains("bytes") && message.contains("use cast"),
            "{message}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Op semantics: random values against oracles computed directly
// ---------------------------------------------------------------------------------------

/// Values of `dtype`: specials first (limits, zeros, ties, NaN, shift widths), then random
/// bit patterns and random small values.
fn samples(dtype: DType, rng: &mut Rng, random: usize) -> Vec<Scalar> {
    let mut out = Vec::new();
    macro_rules! ints {
        ($variant:ident, $t:ty) => {{
            out.extend(
                [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65]
                    .map(|v: i128| Scalar::$variant(v as $t)),
            );
            out.extend([-1i128, -2, -8, -64, -65].map(|v| Scalar::$variant(v as $t)));
            out.extend([<$t>::MIN, <$t>::MAX, <$t>::MIN + 1].map(Scalar::$variant));
            for i in 0..random {
                let bits = rng.next_u64();
                let v = if i % 2 == 0 {
                    bits as $t
                } else {
                    (bits % 21) as $t
                };
                out.push(Scalar::$variant(v.wrapping_sub(if i % 4 == 1 {
                    10
                } else {
                    0
                })));
            }
        }};
    }
    let float_specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        1.5,
        -1.5,
        2.5,
        -2.5,
        3.0,
        0.1,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-40,
        65504.0,
        3e38,
        1e300,
        5e-324,
    ];
    macro_rules! floats {
        ($variant:ident, $from_f64:expr, $from_bits:expr) => {{
            out.extend(
                float_specials
                    .iter()
                    .map(|&v| Scalar::$variant($from_f64(v))),
            );
            for i in 0..random {
                let bits = rng.next_u64();
                out.push(Scalar::$variant(if i % 3 == 0 {
                    $from_bits(bits)
                } else {
                    $from_f64(rng.uniform(if i % 3 == 1 { 4.0 } else { 300.0 }))
                }));
            }
        }};
    }
    match dtype {
        DType::Bool => out.extend([Scalar::Bool(false), Scalar::Bool(true)]),
        DType::U8 => ints!(U8, u8),
        DType::U16 => ints!(U16, u16),
        DType::U32 => ints!(U32, u32),
        DType::U64 => ints!(U64, u64),
        DType::I8 => ints!(I8, i8),
        DType::I16 => ints!(I16, i16),
        DType::I32 => ints!(I32, i32),
        DType::I64 => ints!(I64, i64),
        DType::F16 => floats!(F16, f16_of, f16_bits),
        DType::BF16 => floats!(BF16, bf16_of, bf16_bits),
        DType::F32 => floats!(F32, f32_of, f32_bits),
        DType::F64 => floats!(F64, f64::from, f64::from_bits),
        DType::F8E4M3 => out.extend((0..=255).map(|b| Scalar::F8E4M3(F8E4M3::from_bits(b)))),
        DType::F8E5M2 => out.extend((0..=255).map(|b| Scalar::F8E5M2(F8E5M2::from_bits(b)))),
    }
    out
}

fn f16_of(v: f64) -> f16 {
    f16::from_f32(v as f32)
}

fn f16_bits(bits: u64) -> f16 {
    f16::from_bits(bits as u16)
}

fn bf16_of(v: f64) -> bf16 {
    bf16::from_f32(v as f32)
}

fn bf16_bits(bits: u64) -> bf16 {
    bf16::from_bits(bits as u16)
}

fn f32_of(v: f64) -> f32 {
    v as f32
}

fn f32_bits(bits: u64) -> f32 {
    f32::from_bits(bits as u32)
}

/// What an oracle says an op gives.
enum Expected {
    /// The op is not defined for the dtype.
    Unsupported,
    /// This value (NaN matches any NaN).
    Value(Scalar),
    /// Checked by another test (erf, which has no oracle in Rust).
    Elsewhere,
}

/// Round half to even, written independently of `round_ties_even`.
macro_rules! half_even {
    ($x:expr) => {{
        let x = $x;
        if (x - x.trunc()).abs() == 0.5 {
            2.0 * (x / 2.0).round()
        } else {
            x.round()
        }
    }};
}

/// The float oracle, for `f32` and `f64`.
macro_rules! float_unary {
    ($op:expr, $x:expr) => {{
        let x = $x;
        match $op {
            UnaryOp::Neg => Some(-x),
            UnaryOp::Abs => Some(x.abs()),
            // `signum` gives ±1 for ±0, hence the zero case.
            UnaryOp::Sign => Some(if x.is_nan() {
                x
            } else if x == 0.0 {
                0.0
            } else {
                x.signum()
            }),
            UnaryOp::Reciprocal => Some(1.0 / x),
            UnaryOp::Sqrt => Some(x.sqrt()),
            UnaryOp::Rsqrt => Some(x.sqrt().recip()),
            UnaryOp::Exp => Some(x.exp()),
            UnaryOp::Exp2 => Some(x.exp2()),
            UnaryOp::Log => Some(x.ln()),
            UnaryOp::Log2 => Some(x.log2()),
            UnaryOp::Sin => Some(x.sin()),
            UnaryOp::Cos => Some(x.cos()),
            UnaryOp::Tan => Some(x.tan()),
            UnaryOp::Tanh => Some(x.tanh()),
            UnaryOp::Floor => Some(x.floor()),
            UnaryOp::Ceil => Some(x.ceil()),
            UnaryOp::Round => Some(half_even!(x)),
            UnaryOp::Trunc => Some(x.trunc()),
            UnaryOp::Erf | UnaryOp::Not | UnaryOp::IsNan | UnaryOp::IsInf => None,
        }
    }};
}

fn reference_unary(op: UnaryOp, x: Scalar) -> Expected {
    use Expected::{Elsewhere, Unsupported, Value};
    let dtype = x.dtype();
    match op {
        UnaryOp::IsNan => return Value(Scalar::Bool(x.to_f64().is_nan())),
        UnaryOp::IsInf => return Value(Scalar::Bool(x.to_f64().is_infinite())),
        UnaryOp::Erf if dtype.is_float() => return Elsewhere,
        _ => {}
    }
    // Integers, through i128, where nothing overflows, then wrapped back with `as`.
    macro_rules! int {
        ($variant:ident, $v:expr) => {{
            let v = $v as i128;
            let r: i128 = match op {
                UnaryOp::Neg => -v,
                UnaryOp::Not => !v,
                UnaryOp::Abs => v.abs(),
                UnaryOp::Sign => v.signum(),
                UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => v,
                _ => return Unsupported,
            };
            Value(Scalar::$variant(r as _))
        }};
    }
    match x {
        Scalar::Bool(b) => match op {
            UnaryOp::Not => Value(Scalar::Bool(!b)),
            _ => Unsupported,
        },
        Scalar::U8(v) => int!(U8, v),
        Scalar::U16(v) => int!(U16, v),
        Scalar::U32(v) => int!(U32, v),
        Scalar::U64(v) => int!(U64, v),
        Scalar::I8(v) => int!(I8, v),
        Scalar::I16(v) => int!(I16, v),
        Scalar::I32(v) => int!(I32, v),
        Scalar::I64(v) => int!(I64, v),
        // The half types compute in f32 and round once.
        Scalar::F16(v) => float_unary!(op, v.to_f32())
            .map_or(Unsupported, |r| Value(Scalar::F16(f16::from_f32(r)))),
        Scalar::BF16(v) => float_unary!(op, v.to_f32())
            .map_or(Unsupported, |r| Value(Scalar::BF16(bf16::from_f32(r)))),
        Scalar::F32(v) => float_unary!(op, v).map_or(Unsupported, |r| Value(Scalar::F32(r))),
        Scalar::F64(v) => float_unary!(op, v).map_or(Unsupported, |r| Value(Scalar::F64(r))),
        // Storage only: no op computes on float8.
        Scalar::F8E4M3(_) | Scalar::F8E5M2(_) => Unsupported,
    }
}

/// The float oracle for binary arithmetic (comparisons are handled generically).
macro_rules! float_binary {
    ($op:expr, $a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        match $op {
            BinaryOp::Add => Some(a + b),
            BinaryOp::Sub => Some(a - b),
            BinaryOp::Mul => Some(a * b),
            BinaryOp::Div => Some(a / b),
            BinaryOp::Rem => Some(a % b),
            BinaryOp::Pow => Some(a.powf(b)),
            // NaN first (the first NaN operand), then the total order, where -0 < +0.
            BinaryOp::Max | BinaryOp::Min if a.is_nan() => Some(a),
            BinaryOp::Max | BinaryOp::Min if b.is_nan() => Some(b),
            BinaryOp::Max => Some(if a.total_cmp(&b).is_ge() { a } else { b }),
            BinaryOp::Min => Some(if a.total_cmp(&b).is_le() { a } else { b }),
            _ => None,
        }
    }};
}

/// Wrapping `a^e` for `e < 2^64`, via the standard library's `wrapping_pow` (which takes a
/// `u32`): `a^e = (a^hi)^(2^32) * a^lo`.
fn wrapping_pow_u64(a: i128, e: u64) -> i128 {
    let (hi, lo) = ((e >> 32) as u32, e as u32);
    let high = a
        .wrapping_pow(hi)
        .wrapping_pow(1 << 16)
        .wrapping_pow(1 << 16);
    high.wrapping_mul(a.wrapping_pow(lo))
}

fn reference_binary(op: BinaryOp, a: Scalar, b: Scalar) -> Expected {
    use Expected::{Unsupported, Value};
    if op.is_comparison() {
        // Every dtype compares by value; f64 holds every value but the 64-bit integers'
        // exactly, so compare those in i128.
        let ordering = match (a, b) {
            (Scalar::U64(x), Scalar::U64(y)) => Some(x.cmp(&y)),
            (Scalar::I64(x), Scalar::I64(y)) => Some(x.cmp(&y)),
            _ => a.to_f64().partial_cmp(&b.to_f64()),
        };
        let result = match op {
            BinaryOp::Eq => ordering.is_some_and(Ordering::is_eq),
            BinaryOp::Ne => !ordering.is_some_and(Ordering::is_eq),
            BinaryOp::Lt => ordering.is_some_and(Ordering::is_lt),
            BinaryOp::Le => ordering.is_some_and(Ordering::is_le),
            BinaryOp::Gt => ordering.is_some_and(Ordering::is_gt),
            BinaryOp::Ge => ordering.is_some_and(Ordering::is_ge),
            _ => unreachable!(),
        };
        return Value(Scalar::Bool(result));
    }
    macro_rules! int {
        ($variant:ident, $t:ty, $x:expr, $y:expr) => {{
            let (x, y) = ($x as i128, $y as i128);
            let bits = <$t>::BITS as i128;
            let r: i128 = match op {
                BinaryOp::Add => x + y,
                BinaryOp::Sub => x - y,
                BinaryOp::Mul => x.wrapping_mul(y),
                BinaryOp::Div if y == 0 => x,
                BinaryOp::Div => x / y,
                BinaryOp::Rem if y == 0 => 0,
                BinaryOp::Rem => x % y,
                BinaryOp::Pow if y >= 0 => wrapping_pow_u64(x, y as u64),
                BinaryOp::Pow if x == 1 => 1,
                BinaryOp::Pow if x == -1 => {
                    if y % 2 == 0 {
                        1
                    } else {
                        -1
                    }
                }
                BinaryOp::Pow => 0,
                BinaryOp::Max => x.max(y),
                BinaryOp::Min => x.min(y),
                BinaryOp::And => x & y,
                BinaryOp::Or => x | y,
                BinaryOp::Xor => x ^ y,
                BinaryOp::Shl => x << y.rem_euclid(bits),
                BinaryOp::Shr => x >> y.rem_euclid(bits),
                _ => unreachable!(),
            };
            // `as` from i128 keeps the low bits: the wrapping result.
            Value(Scalar::$variant(r as $t))
        }};
    }
    match (a, b) {
        (Scalar::Bool(x), Scalar::Bool(y)) => match op {
            BinaryOp::Add | BinaryOp::Or | BinaryOp::Max => Value(Scalar::Bool(x || y)),
            BinaryOp::Mul | BinaryOp::And | BinaryOp::Min => Value(Scalar::Bool(x && y)),
            BinaryOp::Xor => Value(Scalar::Bool(x != y)),
            _ => Unsupported,
        },
        (Scalar::U8(x), Scalar::U8(y)) => int!(U8, u8, x, y),
        (Scalar::U16(x), Scalar::U16(y)) => int!(U16, u16, x, y),
        (Scalar::U32(x), Scalar::U32(y)) => int!(U32, u32, x, y),
        (Scalar::U64(x), Scalar::U64(y)) => int!(U64, u64, x, y),
        (Scalar::I8(x), Scalar::I8(y)) => int!(I8, i8, x, y),
        (Scalar::I16(x), Scalar::I16(y)) => int!(I16, i16, x, y),
        (Scalar::I32(x), Scalar::I32(y)) => int!(I32, i32, x, y),
        (Scalar::I64(x), Scalar::I64(y)) => int!(I64, i64, x, y),
        (Scalar::F16(x), Scalar::F16(y)) => float_binary!(op, x.to_f32(), y.to_f32())
            .map_or(Unsupported, |r| Value(Scalar::F16(f16::from_f32(r)))),
        (Scalar::BF16(x), Scalar::BF16(y)) => float_binary!(op, x.to_f32(), y.to_f32())
            .map_or(Unsupported, |r| Value(Scalar::BF16(bf16::from_f32(r)))),
        (Scalar::F32(x), Scalar::F32(y)) => {
            float_binary!(op, x, y).map_or(Unsupported, |r| Value(Scalar::F32(r)))
        }
        (Scalar::F64(x), Scalar::F64(y)) => {
            float_binary!(op, x, y).map_or(Unsupported, |r| Value(Scalar::F64(r)))
        }
        _ => unreachable!("the tests pair values of one dtype"),
    }
}

#[test]
fn unary_ops_match_oracle() {
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    for dtype in DType::ALL {
        let values = samples(dtype, &mut rng, 300);
        for op in UnaryOp::ALL {
            for &x in &values {
                let got = x.unary(op);
                let context = format!("{op}({x:?})");
                match reference_unary(op, x) {
                    Expected::Unsupported => {
                        assert_eq!(
                            got,
                            Err(ScalarError::Unsupported {
                                op: op.name().to_owned(),
                                dtype
                            }),
                            "{context}"
                        );
                    }
                    Expected::Value(expected) => assert_same(got.unwrap(), expected, &context),
                    Expected::Elsewhere => {
                        assert_eq!(got.map(Scalar::dtype), Ok(dtype), "{context}");
                    }
                }
                // The op table agrees with the evaluation.
                assert_eq!(op.supports(dtype), x.unary(op).is_ok(), "{context}");
                assert_eq!(op.result_dtype(dtype), x.unary(op).ok().map(Scalar::dtype));
            }
        }
    }
}

#[test]
fn binary_ops_match_oracle() {
    let mut rng = Rng(0xFEED_FACE_CAFE_BEEF);
    for dtype in DType::ALL {
        let values = samples(dtype, &mut rng, 100);
        let specials = if dtype.is_bool() {
            2
        } else {
            values.len() - 100
        };
        // Every pair of specials, then random pairs.
        let mut pairs: Vec<(Scalar, Scalar)> = Vec::new();
        for &a in &values[..specials] {
            for &b in &values[..specials] {
                pairs.push((a, b));
            }
        }
        for _ in 0..1500 {
            let i = (rng.next_u64() % values.len() as u64) as usize;
            let j = (rng.next_u64() % values.len() as u64) as usize;
            pairs.push((values[i], values[j]));
        }
        for op in BinaryOp::ALL {
            for &(a, b) in &pairs {
                let got = a.binary(op, b);
                let context = format!("{a:?} {op} {b:?}");
                match reference_binary(op, a, b) {
                    Expected::Unsupported => {
                        let err = got.unwrap_err();
                        assert_eq!(
                            err,
                            ScalarError::Unsupported {
                                op: op.name().to_owned(),
                                dtype
                            },
                            "{context}"
                        );
                    }
                    Expected::Value(expected) => assert_same(got.unwrap(), expected, &context),
                    Expected::Elsewhere => unreachable!(),
                }
                assert_eq!(op.supports(dtype), a.binary(op, b).is_ok(), "{context}");
                assert_eq!(
                    op.result_dtype(dtype),
                    a.binary(op, b).ok().map(Scalar::dtype)
                );
            }
        }
    }
}

#[test]
fn op_support_table() {
    // (op, bool, ints, floats)
    let unary = [
        (UnaryOp::Neg, false, true, true),
        (UnaryOp::Not, true, true, false),
        (UnaryOp::Abs, false, true, true),
        (UnaryOp::Sign, false, true, true),
        (UnaryOp::Sqrt, false, false, true),
        (UnaryOp::Erf, false, false, true),
        (UnaryOp::Round, false, true, true),
        (UnaryOp::IsNan, true, true, true),
        (UnaryOp::IsInf, true, true, true),
    ];
    for (op, on_bool, on_ints, on_floats) in unary {
        for dtype in DType::ALL {
            let expected = if dtype.is_bool() {
                on_bool
            } else if dtype.is_int() {
                on_ints
            } else {
                on_floats
            };
            assert_eq!(op.supports(dtype), expected, "{op} on {dtype}");
        }
    }
    let binary = [
        (BinaryOp::Add, true, true, true),
        (BinaryOp::Sub, false, true, true),
        (BinaryOp::Mul, true, true, true),
        (BinaryOp::Div, false, true, true),
        (BinaryOp::Rem, false, true, true),
        (BinaryOp::Pow, false, true, true),
        (BinaryOp::Max, true, true, true),
        (BinaryOp::Min, true, true, true),
        (BinaryOp::And, true, true, false),
        (BinaryOp::Or, true, true, false),
        (BinaryOp::Xor, true, true, false),
        (BinaryOp::Shl, false, true, false),
        (BinaryOp::Shr, false, true, false),
        (BinaryOp::Eq, true, true, true),
        (BinaryOp::Lt, true, true, true),
    ];
    for (op, on_bool, on_ints, on_floats) in binary {
        for dtype in DType::ALL {
            let expected = if dtype.is_bool() {
                on_bool
            } else if dtype.is_int() {
                on_ints
            } else {
                on_floats
            };
            assert_eq!(op.supports(dtype), expected, "{op} on {dtype}");
            let result = op.result_dtype(dtype);
            if !expected {
                assert_eq!(result, None);
            } else if op.is_comparison() {
                assert_eq!(result, Some(DType::Bool));
            } else {
                assert_eq!(result, Some(dtype));
            }
        }
    }
    for dtype in DType::ALL {
        assert_eq!(UnaryOp::IsNan.result_dtype(dtype), Some(DType::Bool));
        for op in [TernaryOp::Where, TernaryOp::MulAdd] {
            assert!(op.supports(dtype));
            assert_eq!(op.result_dtype(dtype), Some(dtype));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Op semantics: the special cases, spelled out
// ---------------------------------------------------------------------------------------

fn bin(a: Scalar, op: BinaryOp, b: Scalar) -> Scalar {
    a.binary(op, b).unwrap()
}

#[test]
fn integer_division_edge_cases() {
    use BinaryOp::{Div, Rem};
    assert_eq!(bin(Scalar::I32(7), Div, Scalar::I32(0)), Scalar::I32(7));
    assert_eq!(bin(Scalar::U8(7), Div, Scalar::U8(0)), Scalar::U8(7));
    assert_eq!(bin(Scalar::I32(7), Rem, Scalar::I32(0)), Scalar::I32(0));
    assert_eq!(bin(Scalar::U64(7), Rem, Scalar::U64(0)), Scalar::U64(0));
    assert_eq!(bin(Scalar::I32(-7), Div, Scalar::I32(2)), Scalar::I32(-3));
    assert_eq!(bin(Scalar::I32(-7), Rem, Scalar::I32(2)), Scalar::I32(-1));
    assert_eq!(bin(Scalar::I32(7), Rem, Scalar::I32(-2)), Scalar::I32(1));
    assert_eq!(
        bin(Scalar::I8(i8::MIN), Div, Scalar::I8(-1)),
        Scalar::I8(i8::MIN)
    );
    assert_eq!(
        bin(Scalar::I64(i64::MIN), Div, Scalar::I64(-1)),
        Scalar::I64(i64::MIN)
    );
    assert_eq!(
        bin(Scalar::I16(i16::MIN), Rem, Scalar::I16(-1)),
        Scalar::I16(0)
    );
    assert_eq!(
        bin(Scalar::I32(i32::MIN), Rem, Scalar::I32(-1)),
        Scalar::I32(0)
    );
    // Floats follow IEEE and fmod.
    assert_eq!(
        bin(Scalar::F32(1.0), Div, Scalar::F32(0.0)),
        Scalar::F32(f32::INFINITY)
    );
    assert_eq!(
        bin(Scalar::F32(-1.0), Div, Scalar::F32(0.0)),
        Scalar::F32(f32::NEG_INFINITY)
    );
    assert!(bin(Scalar::F64(0.0), Div, Scalar::F64(0.0)).is_nan());
    assert_eq!(
        bin(Scalar::F64(-7.5), Rem, Scalar::F64(2.0)),
        Scalar::F64(-1.5)
    );
    assert!(bin(Scalar::F64(1.0), Rem, Scalar::F64(0.0)).is_nan());
}

#[test]
fn integer_pow() {
    use BinaryOp::Pow;
    assert_eq!(bin(Scalar::I32(3), Pow, Scalar::I32(4)), Scalar::I32(81));
    assert_eq!(bin(Scalar::I32(0), Pow, Scalar::I32(0)), Scalar::I32(1));
    assert_eq!(bin(Scalar::U8(2), Pow, Scalar::U8(8)), Scalar::U8(0));
    assert_eq!(bin(Scalar::U8(3), Pow, Scalar::U8(5)), Scalar::U8(243));
    assert_eq!(bin(Scalar::U8(3), Pow, Scalar::U8(6)), Scalar::U8(217)); // 729 mod 256
    assert_eq!(bin(Scalar::I8(-2), Pow, Scalar::I8(7)), Scalar::I8(-128));
    assert_eq!(bin(Scalar::I32(2), Pow, Scalar::I32(-1)), Scalar::I32(0));
    assert_eq!(bin(Scalar::I32(0), Pow, Scalar::I32(-1)), Scalar::I32(0));
    assert_eq!(bin(Scalar::I32(1), Pow, Scalar::I32(-5)), Scalar::I32(1));
    assert_eq!(bin(Scalar::I32(-1), Pow, Scalar::I32(-5)), Scalar::I32(-1));
    assert_eq!(bin(Scalar::I32(-1), Pow, Scalar::I32(-4)), Scalar::I32(1));
    assert_eq!(
        bin(Scalar::I64(-1), Pow, Scalar::I64(i64::MIN)),
        Scalar::I64(1)
    );
    // Exponents past u32::MAX still compute exactly: 3 is odd, 2^64's multiplicative
    // group has exponent 2^62, so 3^(2^62) == 1.
    assert_eq!(
        bin(Scalar::U64(3), Pow, Scalar::U64(1 << 62)),
        Scalar::U64(1)
    );
    assert_eq!(
        bin(Scalar::U64(2), Pow, Scalar::U64(u64::MAX)),
        Scalar::U64(0)
    );
}

#[test]
fn shifts_wrap_the_amount() {
    use BinaryOp::{Shl, Shr};
    assert_eq!(bin(Scalar::I32(1), Shl, Scalar::I32(32)), Scalar::I32(1));
    assert_eq!(bin(Scalar::I32(1), Shl, Scalar::I32(33)), Scalar::I32(2));
    assert_eq!(
        bin(Scalar::I32(1), Shl, Scalar::I32(31)),
        Scalar::I32(i32::MIN)
    );
    assert_eq!(
        bin(Scalar::I32(1), Shl, Scalar::I32(-1)),
        Scalar::I32(i32::MIN)
    );
    assert_eq!(bin(Scalar::U8(1), Shl, Scalar::U8(8)), Scalar::U8(1));
    assert_eq!(bin(Scalar::U8(1), Shl, Scalar::U8(255)), Scalar::U8(128));
    assert_eq!(bin(Scalar::U8(0x81), Shl, Scalar::U8(1)), Scalar::U8(2));
    assert_eq!(bin(Scalar::I8(-128), Shr, Scalar::I8(7)), Scalar::I8(-1));
    assert_eq!(bin(Scalar::U8(128), Shr, Scalar::U8(7)), Scalar::U8(1));
    assert_eq!(bin(Scalar::I64(-16), Shr, Scalar::I64(66)), Scalar::I64(-4));
    assert_eq!(
        bin(Scalar::U64(1 << 63), Shr, Scalar::U64(64 + 63)),
        Scalar::U64(1)
    );
    assert_eq!(
        bin(Scalar::U16(0xFFFF), Shr, Scalar::U16(20)),
        Scalar::U16(0x0FFF)
    );
}

#[test]
fn max_and_min_propagate_nan_and_order_zeros() {
    use BinaryOp::{Max, Min};
    let nan = f32::NAN;
    for op in [Max, Min] {
        assert!(bin(Scalar::F32(nan), op, Scalar::F32(1.0)).is_nan());
        assert!(bin(Scalar::F32(1.0), op, Scalar::F32(nan)).is_nan());
        assert!(bin(Scalar::F64(f64::NAN), op, Scalar::F64(f64::INFINITY)).is_nan());
        let h = |x: f32| Scalar::F16(f16::from_f32(x));
        assert!(bin(h(nan), op, h(1.0)).is_nan());
        assert!(bin(h(-1.0), op, h(nan)).is_nan());
        let b = |x: f32| Scalar::BF16(bf16::from_f32(x));
        assert!(bin(b(2.0), op, b(nan)).is_nan());
    }
    // The NaN operand itself comes back, payload and all.
    let payload = Scalar::F32(f32::from_bits(0x7FC0_1234));
    assert_eq!(bin(payload, Max, Scalar::F32(1.0)), payload);
    assert_eq!(bin(Scalar::F32(1.0), Min, payload), payload);
    // -0 < +0, whatever the operand order.
    for (a, b) in [(0.0, -0.0), (-0.0, 0.0)] {
        assert_eq!(bin(Scalar::F64(a), Max, Scalar::F64(b)), Scalar::F64(0.0));
        assert_eq!(bin(Scalar::F64(a), Min, Scalar::F64(b)), Scalar::F64(-0.0));
    }
    assert_eq!(
        bin(Scalar::F32(2.0), Max, Scalar::F32(-3.0)),
        Scalar::F32(2.0)
    );
    assert_eq!(bin(Scalar::I8(-3), Max, Scalar::I8(2)), Scalar::I8(2));
    assert_eq!(bin(Scalar::U8(200), Min, Scalar::U8(2)), Scalar::U8(2));
    assert_eq!(
        bin(Scalar::Bool(true), Max, Scalar::Bool(false)),
        Scalar::Bool(true)
    );
    assert_eq!(
        bin(Scalar::Bool(true), Min, Scalar::Bool(false)),
        Scalar::Bool(false)
    );
}

#[test]
fn round_is_half_to_even() {
    let cases = [
        (0.5, 0.0),
        (1.5, 2.0),
        (2.5, 2.0),
        (3.5, 4.0),
        (-0.5, -0.0),
        (-1.5, -2.0),
        (-2.5, -2.0),
        (0.4, 0.0),
        (2.6, 3.0),
    ];
    for (x, expected) in cases {
        let round = |s: Scalar| s.unary(UnaryOp::Round).unwrap();
        assert_eq!(round(Scalar::F64(x)), Scalar::F64(expected), "round({x})");
        assert_eq!(
            round(Scalar::F32(x as f32)),
            Scalar::F32(expected as f32),
            "round({x})"
        );
        let h = |v: f64| Scalar::F16(f16::from_f64(v));
        assert_eq!(round(h(x)), h(expected), "round({x}) in f16");
        let b = |v: f64| Scalar::BF16(bf16::from_f64(v));
        assert_eq!(round(b(x)), b(expected), "round({x}) in bf16");
    }
    // -0.5 rounds to -0, not +0: the sign is kept.
    assert_ne!(
        Scalar::F32(-0.5).unary(UnaryOp::Round).unwrap(),
        Scalar::F32(0.0)
    );
    assert_eq!(Scalar::I32(7).unary(UnaryOp::Round), Ok(Scalar::I32(7)));
}

#[test]
fn sign_and_abs() {
    let sign = |s: Scalar| s.unary(UnaryOp::Sign).unwrap();
    assert_eq!(sign(Scalar::F32(-3.0)), Scalar::F32(-1.0));
    assert_eq!(sign(Scalar::F32(1e-40)), Scalar::F32(1.0));
    assert_eq!(sign(Scalar::F32(-0.0)), Scalar::F32(0.0));
    assert!(sign(Scalar::F64(f64::NAN)).is_nan());
    assert_eq!(sign(Scalar::F64(f64::NEG_INFINITY)), Scalar::F64(-1.0));
    assert_eq!(sign(Scalar::I8(-100)), Scalar::I8(-1));
    assert_eq!(sign(Scalar::U8(200)), Scalar::U8(1));
    assert_eq!(sign(Scalar::U8(0)), Scalar::U8(0));
    let abs = |s: Scalar| s.unary(UnaryOp::Abs).unwrap();
    assert_eq!(abs(Scalar::I32(i32::MIN)), Scalar::I32(i32::MIN));
    assert_eq!(abs(Scalar::F32(-0.0)), Scalar::F32(0.0));
    let neg = |s: Scalar| s.unary(UnaryOp::Neg).unwrap();
    assert_eq!(neg(Scalar::U8(1)), Scalar::U8(255));
    assert_eq!(neg(Scalar::I64(i64::MIN)), Scalar::I64(i64::MIN));
    assert_eq!(neg(Scalar::F16(f16::ZERO)), Scalar::F16(f16::NEG_ZERO));
    assert_eq!(Scalar::U8(0x0F).unary(UnaryOp::Not), Ok(Scalar::U8(0xF0)));
    assert_eq!(
        Scalar::Bool(true).unary(UnaryOp::Not),
        Ok(Scalar::Bool(false))
    );
    assert_eq!(
        Scalar::I32(5).unary(UnaryOp::IsInf),
        Ok(Scalar::Bool(false))
    );
    assert_eq!(
        Scalar::Bool(true).unary(UnaryOp::IsNan),
        Ok(Scalar::Bool(false))
    );
    assert_eq!(
        Scalar::F16(f16::NEG_INFINITY).unary(UnaryOp::IsInf),
        Ok(Scalar::Bool(true))
    );
}

#[test]
fn erf_values() {
    // mpmath's erf at 50 digits, rounded to f64.
    let cases: [(f64, f64); 9] = [
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (2.0, 0.9953222650189527),
        (-3.0, -0.9999779095030014),
        (1e-10, 1.1283791670955126e-10),
        (0.84375, 0.7672256612323416),
        (1.25, 0.9229001282564583),
        (4.5, 0.9999999998033839),
        (-0.1, -0.1124629160182849),
    ];
    for (x, expected) in cases {
        let Ok(Scalar::F64(got)) = Scalar::F64(x).unary(UnaryOp::Erf) else {
            panic!("erf({x}) did not give an f64");
        };
        assert!(
            (got - expected).abs() <= expected.abs() * 1e-15,
            "erf({x}) = {got:e}, expected {expected:e}"
        );
        // f32 rounds the f64 result.
        let got = Scalar::F32(x as f32).unary(UnaryOp::Erf).unwrap();
        let close = Scalar::F64(f64::from(x as f32))
            .unary(UnaryOp::Erf)
            .unwrap()
            .cast(DType::F32);
        assert_eq!(got, close, "erf({x}) in f32");
    }
    let erf = |x: f64| Scalar::F64(x).unary(UnaryOp::Erf).unwrap();
    assert_eq!(erf(f64::INFINITY), Scalar::F64(1.0));
    assert_eq!(erf(f64::NEG_INFINITY), Scalar::F64(-1.0));
    assert_eq!(erf(-0.0), Scalar::F64(-0.0));
    assert!(erf(f64::NAN).is_nan());
    // Odd, bounded and monotonic on random inputs.
    let mut rng = Rng(0xE4F);
    let mut previous = (f64::NEG_INFINITY, -1.0);
    let mut xs: Vec<f64> = (0..2000).map(|_| rng.uniform(7.0)).collect();
    xs.sort_by(f64::total_cmp);
    for x in xs {
        let y = erf(x).to_f64();
        assert_eq!(erf(-x).to_f64(), -y);
        assert!(y.abs() <= 1.0);
        // Monotonic up to an ulp: separate approximations meet at range boundaries.
        assert!(
            previous.0 <= x && previous.1 <= y + f64::EPSILON,
            "erf({x}) = {y}"
        );
        previous = (x, y);
    }
}

#[test]
fn half_arithmetic_is_correctly_rounded() {
    // f16 and bf16 compute in f32 and round back; for + - * / and sqrt that equals IEEE
    // arithmetic in the half type, which the search oracle computes from the exact f64 result
    // (exact for + - *, and innocuously rounded for / and sqrt).
    let mut rng = Rng(0x4A1F);
    let ops = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];
    for _ in 0..20_000 {
        let bits = rng.next_u64();
        let (a, b) = (
            f16::from_bits(bits as u16),
            f16::from_bits((bits >> 16) as u16),
        );
        let (x, y) = (
            bf16::from_bits((bits >> 32) as u16),
            bf16::from_bits((bits >> 48) as u16),
        );
        for op in ops {
            let exact = |p: f64, q: f64| match op {
                BinaryOp::Add => p + q,
                BinaryOp::Sub => p - q,
                BinaryOp::Mul => p * q,
                _ => p / q,
            };
            let got = Scalar::F16(a).binary(op, Scalar::F16(b)).unwrap();
            let expected = Scalar::F16(nearest_f16(exact(a.to_f64(), b.to_f64())));
            assert_same(got, expected, &format!("{a} {op} {b} in f16"));
            let f32_then_round = Scalar::F16(f16::from_f32(match op {
                BinaryOp::Add => a.to_f32() + b.to_f32(),
                BinaryOp::Sub => a.to_f32() - b.to_f32(),
                BinaryOp::Mul => a.to_f32() * b.to_f32(),
                _ => a.to_f32() / b.to_f32(),
            }));
            assert_same(got, f32_then_round, &format!("{a} {op} {b} in f16 via f32"));
            // bf16 sums of very different magnitudes are not exact in f64; the products and
            // quotients are, or round innocuously.
            if op != BinaryOp::Add && op != BinaryOp::Sub {
                let got = Scalar::BF16(x).binary(op, Scalar::BF16(y)).unwrap();
                let expected = Scalar::BF16(nearest_bf16(exact(x.to_f64(), y.to_f64())));
                assert_same(got, expected, &format!("{x} {op} {y} in bf16"));
            }
        }
        let got = Scalar::F16(a).unary(UnaryOp::Sqrt).unwrap();
        assert_same(
            got,
            Scalar::F16(nearest_f16(a.to_f64().sqrt())),
            &format!("sqrt({a})"),
        );
    }
}

#[test]
fn mul_add_is_fused() {
    let mad =
        |a: Scalar, b: Scalar, c: Scalar| Scalar::ternary(TernaryOp::MulAdd, a, b, c).unwrap();

    // f32: (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24; unfused, the product rounds (a tie, to even)
    // to 1 + 2^-11 and the sum is 0; fused, the 2^-24 survives.
    let a = 1.0 + 2f32.powi(-12);
    let c = -(1.0 + 2f32.powi(-11));
    assert_eq!(a * a + c, 0.0, "the unfused result, for contrast");
    assert_eq!(
        mad(Scalar::F32(a), Scalar::F32(a), Scalar::F32(c)),
        Scalar::F32(2f32.powi(-24))
    );

    // f64: the same with 2^-27.
    let a = 1.0 + 2f64.powi(-27);
    let c = -(1.0 + 2f64.powi(-26));
    assert_eq!(a * a + c, 0.0);
    assert_eq!(
        mad(Scalar::F64(a), Scalar::F64(a), Scalar::F64(c)),
        Scalar::F64(2f64.powi(-54))
    );

    // f16: 3 * 341.5 = 1024.5 is a tie between 1024 and 1025; adding the smallest subnormal
    // must round up. An f32 fma would round 1024.5 + 2^-24 back to the tie, and then to even
    // (1024): one rounding needs more than f32.
    let h = |x: f32| Scalar::F16(f16::from_f32(x));
    let tiny = Scalar::F16(f16::from_bits(1));
    assert_eq!(mad(h(3.0), h(341.5), tiny), h(1025.0));
    let via_f32 = f16::from_f32(3f32.mul_add(341.5, 2f32.powi(-24)));
    assert_eq!(
        via_f32,
        f16::from_f32(1024.0),
        "the double-rounded result, for contrast"
    );
    // f16 without a tie agrees with f32's fma.
    assert_eq!(mad(h(1.5), h(2.0), h(0.25)), h(3.25));

    // bf16: 7 * 0.14453125 = 259/256, a tie between 258/256 and 260/256 (even); subtracting
    // the smallest subnormal must round down.
    let b = |x: f32| Scalar::BF16(bf16::from_f32(x));
    let tiny = Scalar::BF16(bf16::from_bits(0x8001));
    assert_eq!(mad(b(7.0), b(0.144_531_25), tiny), b(258.0 / 256.0));
    assert_eq!(mad(b(7.0), b(0.144_531_25), b(0.0)), b(260.0 / 256.0));

    // Random f16 triples against the exact result where f64 holds it exactly.
    let mut rng = Rng(0x3AD);
    for _ in 0..20_000 {
        let bits = rng.next_u64();
        let [x, y, z] = [0, 16, 32].map(|s| f16::from_bits((bits >> s) as u16));
        let got = mad(Scalar::F16(x), Scalar::F16(y), Scalar::F16(z));
        // The product of two f16s is exact in f64; the sum is exact unless the addends are
        // far apart, which two-sum detects (then this oracle cannot tell, so skip).
        let (p, q) = (x.to_f64() * y.to_f64(), z.to_f64());
        let sum = p + q;
        let q_part = sum - p;
        let error = (p - (sum - q_part)) + (q - q_part);
        if sum.is_nan() {
            assert!(got.is_nan(), "{x} * {y} + {z}");
        } else if error == 0.0 {
            assert_same(
                got,
                Scalar::F16(nearest_f16(sum)),
                &format!("{x} * {y} + {z}"),
            );
        }
    }

    // Integers wrap; bool is (a and b) or c.
    assert_eq!(
        mad(Scalar::U8(16), Scalar::U8(16), Scalar::U8(1)),
        Scalar::U8(1)
    );
    assert_eq!(
        mad(Scalar::I32(i32::MAX), Scalar::I32(2), Scalar::I32(3)),
        Scalar::I32(1)
    );
    assert_eq!(
        mad(Scalar::Bool(true), Scalar::Bool(false), Scalar::Bool(true)),
        Scalar::Bool(true)
    );
    assert_eq!(
        mad(Scalar::Bool(true), Scalar::Bool(false), Scalar::Bool(false)),
        Scalar::Bool(false)
    );
    assert!(
        mad(
            Scalar::F32(f32::INFINITY),
            Scalar::F32(0.0),
            Scalar::F32(1.0)
        )
        .is_nan()
    );
}

#[test]
fn where_selects() {
    let select = |c: bool| {
        Scalar::ternary(
            TernaryOp::Where,
            Scalar::Bool(c),
            Scalar::F16(f16::ONE),
            Scalar::F16(f16::ZERO),
        )
    };
    assert_eq!(select(true), Ok(Scalar::F16(f16::ONE)));
    assert_eq!(select(false), Ok(Scalar::F16(f16::ZERO)));

    let err = Scalar::ternary(
        TernaryOp::Where,
        Scalar::U8(1),
        Scalar::I32(1),
        Scalar::I32(2),
    )
    .unwrap_err();
    assert_eq!(
        err,
        ScalarError::ConditionNotBool {
            op: "where".to_owned(),
            dtype: DType::U8
        }
    );
    let message = err.to_string();
    assert!(
        message.contains("where") && message.contains("u8"),
        "{message}"
    );
    assert!(!message.ends_with('.'));

    let err = Scalar::ternary(
        TernaryOp::Where,
        Scalar::Bool(true),
        Scalar::I32(1),
        Scalar::I64(2),
    )
    .unwrap_err();
    assert_eq!(
        err,
        ScalarError::DTypeMismatch {
            op: "where".to_owned(),
            lhs: DType::I32,
            rhs: DType::I64
        }
    );
    let err = Scalar::ternary(
        TernaryOp::MulAdd,
        Scalar::F32(1.0),
        Scalar::F32(1.0),
        Scalar::F64(2.0),
    )
    .unwrap_err();
    assert_eq!(
        err,
        ScalarError::DTypeMismatch {
            op: "mad".to_owned(),
            lhs: DType::F32,
            rhs: DType::F64
        }
    );
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

#[test]
fn unsupported_ops_explain_the_fix() {
    let err = Scalar::I32(4).unary(UnaryOp::Sqrt).unwrap_err();
    assert_eq!(
        err,
        ScalarError::Unsupported {
            op: "sqrt".to_owned(),
            dtype: DType::I32
        }
    );
    let message = err.to_string();
    assert!(
        message.contains("sqrt") && message.contains("i32"),
        "{message}"
    );
    assert!(message.contains("cast to a float dtype"), "{message}");
    assert!(!UnaryOp::Sqrt.supports(DType::I32));
    assert!(!UnaryOp::Sqrt.supports(DType::Bool));

    let message = Scalar::Bool(true)
        .unary(UnaryOp::Sqrt)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("sqrt") && message.contains("bool"),
        "{message}"
    );

    let cases = [
        (
            Scalar::F32(1.0).binary(BinaryOp::Shl, Scalar::F32(1.0)),
            "shl is not defined for f32; cast to an integer dtype first",
        ),
        (
            Scalar::F64(1.0).binary(BinaryOp::Xor, Scalar::F64(1.0)),
            "xor is not defined for f64; cast to an integer or bool dtype first",
        ),
        (
            Scalar::Bool(true).binary(BinaryOp::Sub, Scalar::Bool(true)),
            "sub is not defined for bool; cast to an integer or float dtype first",
        ),
        (
            Scalar::Bool(true).unary(UnaryOp::Neg),
            "neg is not defined for bool; cast to an integer or float dtype first",
        ),
        (
            Scalar::F16(f16::ONE).unary(UnaryOp::Not),
            "not is not defined for f16; cast to an integer or bool dtype first",
        ),
    ];
    for (result, message) in cases {
        assert_eq!(result.unwrap_err().to_string(), message);
    }

    let err = Scalar::F32(1.0)
        .binary(BinaryOp::Add, Scalar::I32(1))
        .unwrap_err();
    assert_eq!(
        err,
        ScalarError::DTypeMismatch {
            op: "add".to_owned(),
            lhs: DType::F32,
            rhs: DType::I32
        }
    );
    let message = err.to_string();
    assert!(message.contains("add") && message.contains("f32") && message.contains("i32"));
    assert!(message.contains("cast"), "{message}");
    // A mismatch is reported before an unsupported op.
    assert!(matches!(
        Scalar::F32(1.0).binary(BinaryOp::Shl, Scalar::I32(1)),
        Err(ScalarError::DTypeMismatch { .. })
    ));
}

#[test]
fn error_messages_do_not_end_with_a_period() {
    let errors: Vec<String> = vec![
        DType::U64.promote(DType::I8).unwrap_err().to_string(),
        "x".parse::<DType>().unwrap_err().to_string(),
        Scalar::I32(1).unary(UnaryOp::Exp).unwrap_err().to_string(),
        Scalar::I32(1)
            .binary(BinaryOp::Add, Scalar::I8(1))
            .unwrap_err()
            .to_string(),
        Scalar::F64(1.0)
            .bitcast(DType::F32)
            .unwrap_err()
            .to_string(),
        Scalar::U8(3).bitcast(DType::Bool).unwrap_err().to_string(),
    ];
    for message in errors {
        assert!(!message.ends_with('.'), "{message}");
        assert!(!message.is_empty());
    }
}

// ---------------------------------------------------------------------------------------
// Float8
// ---------------------------------------------------------------------------------------

#[test]
fn float8_every_pattern_widens_exactly() {
    for bits in 0..=255u8 {
        let (a, b) = (F8E4M3::from_bits(bits), F8E5M2::from_bits(bits));
        for (got, expected) in [
            (a.to_f64(), f8_value(bits, 4)),
            (b.to_f64(), f8_value(bits, 5)),
        ] {
            assert!(
                got.to_bits() == expected.to_bits() || (got.is_nan() && expected.is_nan()),
                "{bits:#04x}: {got} vs {expected}"
            );
        }
        assert_eq!(a.is_nan(), f8_value(bits, 4).is_nan());
        assert_eq!(b.is_nan(), f8_value(bits, 5).is_nan());
    }
}

#[test]
fn float8_rounding_matches_the_search_oracle() {
    let mut rng = Rng(8);
    let mut values: Vec<f64> = vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        448.0,
        464.0,
        464.0001,
        479.9,
        480.0,
        57344.0,
        61439.99,
        61440.0,
        65536.0,
        1e30,
        1e-30,
    ];
    // Every midpoint and neighbour of every pattern: ties, and one step either side.
    for bits in 0..=0x7eu8 {
        for exponent_bits in [4, 5] {
            let (lo, hi) = (
                f8_value(bits, exponent_bits),
                f8_value(bits + 1, exponent_bits),
            );
            if lo.is_finite() && hi.is_finite() {
                let mid = f64::midpoint(lo, hi);
                values.extend([mid, mid.next_up(), mid.next_down(), -mid]);
                values.extend([f64::from((mid as f32).next_up()), lo, -hi]);
            }
        }
    }
    for _ in 0..20_000 {
        let scale = 2f64.powi((rng.next_u64() % 40) as i32 - 24);
        values.push(rng.uniform(scale));
    }
    for v in values {
        for x in [Scalar::F64(v), Scalar::F32(v as f32)] {
            let exact = x.to_f64();
            let e4m3 = x.cast(DType::F8E4M3);
            let e5m2 = x.cast(DType::F8E5M2);
            let want4 = Scalar::F8E4M3(nearest_e4m3(exact));
            let want5 = Scalar::F8E5M2(nearest_e5m2(exact));
            assert_eq!(e4m3, want4, "{x:?} to f8e4m3");
            assert_eq!(e5m2, want5, "{x:?} to f8e5m2");
        }
    }
}

#[test]
fn float8_is_storage_only() {
    for dtype in DType::FLOAT8 {
        assert_eq!(dtype.size_bytes(), 1);
        assert!(dtype.is_float() && dtype.is_float8() && dtype.is_signed());
        assert_eq!(dtype.name().parse::<DType>(), Ok(dtype));
        for other in DType::ALL.into_iter().chain(DType::FLOAT8) {
            let promoted = dtype.promote(other);
            if other == dtype {
                assert_eq!(promoted, Ok(dtype));
            } else {
                assert!(
                    matches!(promoted, Err(DTypeError::Float8 { .. })),
                    "{dtype} {other}"
                );
                assert_eq!(
                    other.promote(dtype),
                    promoted.map_err(|_| {
                        DTypeError::Float8 {
                            lhs: other,
                            rhs: dtype,
                        }
                    })
                );
            }
        }
        let x = Scalar::one(dtype);
        assert_eq!(x.to_f64(), 1.0);
        for op in UnaryOp::ALL {
            assert!(!op.supports(dtype));
            assert!(x.unary(op).is_err());
        }
        for op in BinaryOp::ALL {
            let err = x.binary(op, x).unwrap_err();
            assert!(
                err.to_string().contains("cast to f16, bf16 or f32 first"),
                "{err}"
            );
        }
        assert!(Scalar::ternary(TernaryOp::MulAdd, x, x, x).is_err());
        let zero = Scalar::zero(dtype);
        assert_eq!(
            Scalar::ternary(TernaryOp::Where, Scalar::Bool(false), x, zero),
            Ok(zero)
        );
        assert_eq!(x.bitcast(DType::U8).unwrap().bitcast(dtype), Ok(x));
    }
    assert_eq!(DType::F8E4M3.max_value().to_f64(), 448.0);
    assert_eq!(DType::F8E5M2.min_value().to_f64(), -57344.0);
}
