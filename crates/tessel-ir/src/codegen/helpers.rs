//! The helper functions generated code calls where C has no operator with
//! [`Scalar`](tessel_shape::Scalar)'s semantics: half-precision conversions, guarded integer
//! division, NaN-propagating `max`, saturating float-to-integer casts, bit reinterpretation,
//! `erf`, and the vector typedefs.
//!
//! Only the helpers a kernel uses are emitted, each after the helpers it calls, so sources
//! stay short and snapshots show what each kernel needs. The bodies are written in the C
//! subset that OpenCL C and CUDA C share (no `memcpy`, no `<float.h>`); type and math
//! function names come from the dialect.

use std::fmt::Write;

use rustc_hash::FxHashSet;
use tessel_shape::DType;

use super::CodegenError;
use super::cstyle::CStyle;
use super::exprs::int_literal;
use super::fastmath::Fast;

/// One helper a kernel's source needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Helper {
    /// `typedef struct { T v[W]; } tsl_<dtype>x<W>;`
    Vector(DType, u8),
    /// Reinterprets the bits of a value of the first dtype as the second (same size).
    Bitcast(DType, DType),
    /// `f16` bits to `float`, exactly (`half`'s conversion: NaNs are quieted).
    F16ToF32,
    /// `float` to `f16` bits, rounding to nearest even.
    F32ToF16,
    /// `bf16` bits to `float`, exactly (NaNs quieted).
    Bf16ToF32,
    /// `float` to `bf16` bits, rounding to nearest even.
    F32ToBf16,
    /// A float8 dtype's bits (`F8E4M3` or `F8E5M2`) to `float`, exactly (NaN as a quiet NaN
    /// of the same sign).
    F8ToF32(DType),
    /// `float` to a float8 dtype's bits, rounding to nearest even, out of range to NaN
    /// (`F8E4M3`) or infinity (`F8E5M2`), as PyTorch does.
    F32ToF8(DType),
    /// `double` to `float` rounding to odd, so that a second rounding to a half type is exact.
    F64ToF32Odd,
    /// `a * b + c` on half-type values given as `double`, rounded once (to odd, to `float`).
    HalfFma,
    /// The error function on `double`, fdlibm's algorithm in the reference's exact order.
    Erf,
    /// `max` of two floats (`F32` or `F64`): NaN wins, `-0 < +0`.
    FloatMax(DType),
    /// `min` of two floats: NaN wins, `-0 < +0`.
    FloatMin(DType),
    /// Integer `/`: `a / 0 == a`, `MIN / -1 == MIN`.
    IntDiv(DType),
    /// Integer `%`: `a % 0 == 0`, `MIN % -1 == 0`.
    IntRem(DType),
    /// Integer `a^b`, exact with wrapping; negative exponents truncate `1 / a^|b|`.
    IntPow(DType),
    /// `F32`/`F64` to an integer dtype: truncating, saturating, NaN to 0.
    FloatToInt(DType, DType),
    /// A vectorizable `float` transcendental (the C dialect's own, see `fastmath.rs`).
    Fast(Fast),
}

impl Helper {
    /// The helpers this one calls, in a dialect whose `f16` (`bf16`) conversions are
    /// built in when `f16_builtins` (`bf16_builtins`) holds.
    fn deps(self, f16_builtins: bool, bf16_builtins: bool) -> Vec<Helper> {
        let f32_bits = [
            Helper::Bitcast(DType::F32, DType::U32),
            Helper::Bitcast(DType::U32, DType::F32),
        ];
        let f64_bits = [
            Helper::Bitcast(DType::F64, DType::U64),
            Helper::Bitcast(DType::U64, DType::F64),
        ];
        match self {
            Helper::F16ToF32 | Helper::F32ToF16 if f16_builtins => Vec::new(),
            Helper::Bf16ToF32 | Helper::F32ToBf16 if bf16_builtins => Vec::new(),
            Helper::F16ToF32 | Helper::F32ToF16 | Helper::Bf16ToF32 | Helper::F32ToBf16 => {
                f32_bits.to_vec()
            }
            Helper::F64ToF32Odd | Helper::F8ToF32(_) | Helper::F32ToF8(_) => f32_bits.to_vec(),
            Helper::HalfFma => {
                let mut deps = f64_bits.to_vec();
                deps.push(Helper::F64ToF32Odd);
                deps
            }
            Helper::Erf => f64_bits.to_vec(),
            Helper::Fast(f) => f.deps(),
            _ => Vec::new(),
        }
    }

    /// The function (or type) name generated code uses.
    pub(super) fn name(self) -> String {
        match self {
            Helper::Vector(d, w) => format!("tsl_{d}x{w}"),
            Helper::Bitcast(from, to) => format!("tsl_bitcast_{from}_{to}"),
            Helper::F16ToF32 => "tsl_f16_to_f32".into(),
            Helper::F32ToF16 => "tsl_f32_to_f16".into(),
            Helper::Bf16ToF32 => "tsl_bf16_to_f32".into(),
            Helper::F32ToBf16 => "tsl_f32_to_bf16".into(),
            Helper::F8ToF32(d) => format!("tsl_{d}_to_f32"),
            Helper::F32ToF8(d) => format!("tsl_f32_to_{d}"),
            Helper::F64ToF32Odd => "tsl_f64_to_f32_odd".into(),
            Helper::HalfFma => "tsl_half_fma".into(),
            Helper::Erf => "tsl_erf".into(),
            Helper::FloatMax(d) => format!("tsl_max_{d}"),
            Helper::FloatMin(d) => format!("tsl_min_{d}"),
            Helper::IntDiv(d) => format!("tsl_div_{d}"),
            Helper::IntRem(d) => format!("tsl_rem_{d}"),
            Helper::IntPow(d) => format!("tsl_pow_{d}"),
            Helper::FloatToInt(from, to) => format!("tsl_{from}_to_{to}"),
            Helper::Fast(f) => f.name().into(),
        }
    }
}

/// The helpers a source needs, in an order where each follows the helpers it calls.
pub(super) struct Helpers {
    order: Vec<Helper>,
    seen: FxHashSet<Helper>,
    /// Whether the dialect converts `f16` with built-ins (which call no other helper).
    f16_builtins: bool,
    /// The same for `bf16`.
    bf16_builtins: bool,
}

impl Helpers {
    pub(super) fn new(dialect: &CStyle) -> Self {
        Helpers {
            order: Vec::new(),
            seen: FxHashSet::default(),
            f16_builtins: dialect.f16_builtins.is_some(),
            bf16_builtins: dialect.bf16_builtins.is_some(),
        }
    }

    /// Records that the source calls `helper`; returns its name.
    pub(super) fn call(&mut self, helper: Helper) -> String {
        self.require(helper);
        helper.name()
    }

    fn require(&mut self, helper: Helper) {
        if self.seen.contains(&helper) {
            return;
        }
        for dep in helper.deps(self.f16_builtins, self.bf16_builtins) {
            self.require(dep);
        }
        self.seen.insert(helper);
        self.order.push(helper);
    }

    /// The definitions, in dependency order.
    pub(super) fn render(&self, dialect: &CStyle, kernel: &str) -> Result<String, CodegenError> {
        let mut out = String::new();
        for &helper in &self.order {
            out.push_str(&definition(helper, dialect, kernel)?);
            out.push('\n');
        }
        Ok(out)
    }
}

/// The C text of one helper.
fn definition(helper: Helper, dialect: &CStyle, kernel: &str) -> Result<String, CodegenError> {
    let ty = |d: DType| {
        (dialect.type_name)(d).ok_or_else(|| CodegenError::UnsupportedOp {
            kernel: kernel.to_owned(),
            dialect: dialect.name,
            op: helper.name(),
            dtype: d,
        })
    };
    let p = dialect.helper_prefix;
    let name = helper.name();
    let (u16_t, u32_t, u64_t) = (ty(DType::U16)?, ty(DType::U32)?, ty(DType::U64)?);
    let i32_t = ty(DType::I32)?;
    if let Some(builtins) = dialect.bf16_builtins {
        match helper {
            Helper::Bf16ToF32 => {
                return Ok(format!(
                    "{p}float {name}({u16_t} h) {{\n    {}\n}}\n",
                    builtins.to_f32
                ));
            }
            Helper::F32ToBf16 => {
                return Ok(format!(
                    "{p}{u16_t} {name}(float value) {{\n    {}\n}}\n",
                    builtins.from_f32
                ));
            }
            _ => {}
        }
    }
    if let Some(builtins) = dialect.f16_builtins {
        match helper {
            Helper::F16ToF32 => {
                return Ok(format!(
                    "{p}float {name}({u16_t} h) {{\n    {}\n}}\n",
                    builtins.to_f32
                ));
            }
            Helper::F32ToF16 => {
                return Ok(format!(
                    "{p}{u16_t} {name}(float value) {{\n    {}\n}}\n",
                    builtins.from_f32
                ));
            }
            _ => {}
        }
    }
    let s32 = dialect.f32_math_suffix;
    let s64 = dialect.f64_math_suffix;
    Ok(match helper {
        Helper::Vector(d, w) => {
            let align = dialect
                .vector_align
                .map(|attr| attr(vector_alignment(d, w)))
                .unwrap_or_default();
            format!("typedef struct {align}{{ {} v[{w}]; }} {name};\n", ty(d)?)
        }
        Helper::Bitcast(from, to) => {
            let (f, t) = (ty(from)?, ty(to)?);
            // A union is the one bit reinterpretation C, OpenCL C and CUDA all accept.
            format!("{p}{t} {name}({f} x) {{\n    union {{ {f} a; {t} b; }} u;\n    u.a = x;\n    return u.b;\n}}\n")
        }
        Helper::F16ToF32 => format!(
            "{p}float {name}({u16_t} h) {{
    const {u32_t} sign = ({u32_t})(h & 0x8000u) << 16;
    const {u32_t} exp = h & 0x7c00u;
    {u32_t} man = h & 0x03ffu;
    if ((h & 0x7fffu) == 0) return tsl_bitcast_u32_f32(sign);
    if (exp == 0x7c00u) {{
        /* Infinity, or a NaN made quiet with its payload kept, as `half` does. */
        return tsl_bitcast_u32_f32(man == 0 ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (man << 13)));
    }}
    if (exp == 0) {{
        /* A subnormal: shift its leading 1 into the implicit bit. */
        {u32_t} e = 0;
        while ((man & 0x0400u) == 0) {{
            man <<= 1;
            e += 1;
        }}
        return tsl_bitcast_u32_f32(sign | ((113u - e) << 23) | ((man & 0x03ffu) << 13));
    }}
    return tsl_bitcast_u32_f32(sign | (((exp >> 10) + 112u) << 23) | (man << 13));
}}
"
        ),
        Helper::F32ToF16 => format!(
            "{p}{u16_t} {name}(float value) {{
    const {u32_t} x = tsl_bitcast_f32_u32(value);
    const {u32_t} sign = x & 0x80000000u;
    const {u32_t} exp = x & 0x7f800000u;
    const {u32_t} man = x & 0x007fffffu;
    if (exp == 0x7f800000u) {{
        /* Infinity, or a quiet NaN keeping the payload's top bits. */
        return ({u16_t})((sign >> 16) | 0x7c00u | (man == 0 ? 0u : 0x0200u) | (man >> 13));
    }}
    const {u32_t} half_sign = sign >> 16;
    const {i32_t} half_exp = ({i32_t})(exp >> 23) - 127 + 15;
    if (half_exp >= 0x1f) return ({u16_t})(half_sign | 0x7c00u);
    if (half_exp <= 0) {{
        /* A subnormal result, or zero past the smallest subnormal's half. */
        if (14 - half_exp > 24) return ({u16_t})half_sign;
        const {u32_t} m = man | 0x00800000u;
        {u32_t} half_man = m >> (14 - half_exp);
        const {u32_t} round_bit = 1u << (13 - half_exp);
        if ((m & round_bit) != 0 && (m & (3u * round_bit - 1u)) != 0) half_man += 1u;
        return ({u16_t})(half_sign | half_man);
    }}
    {u32_t} out = half_sign | (({u32_t})half_exp << 10) | (man >> 13);
    /* Round to nearest even: up when past half, or at half with an odd result. */
    if ((man & 0x1000u) != 0 && (man & 0x2fffu) != 0) out += 1u;
    return ({u16_t})out;
}}
"
        ),
        Helper::Bf16ToF32 => format!(
            "{p}float {name}({u16_t} h) {{
    /* NaNs are made quiet, as `half` does. */
    const {u32_t} bits = (h & 0x7fffu) > 0x7f80u ? (({u32_t})h | 0x0040u) : ({u32_t})h;
    return tsl_bitcast_u32_f32(bits << 16);
}}
"
        ),
        Helper::F32ToBf16 => format!(
            "{p}{u16_t} {name}(float value) {{
    const {u32_t} x = tsl_bitcast_f32_u32(value);
    if ((x & 0x7fffffffu) > 0x7f800000u) return ({u16_t})((x >> 16) | 0x0040u);
    /* Round to nearest even. */
    if ((x & 0x8000u) != 0 && (x & 0x17fffu) != 0) return ({u16_t})((x >> 16) + 1u);
    return ({u16_t})(x >> 16);
}}
"
        ),
        Helper::F8ToF32(d) => {
            let u8_t = ty(DType::U8)?;
            f8_to_f32_definition(p, &name, d, u8_t, u32_t)
        }
        Helper::F32ToF8(d) => {
            let u8_t = ty(DType::U8)?;
            f32_to_f8_definition(p, &name, d, u8_t, u32_t)
        }
        Helper::F64ToF32Odd => format!(
            "{p}float {name}(double x) {{
    const float nearest = (float)x;
    if (nearest != nearest || (double)nearest == x) return nearest;
    /* Past the top of the range: the largest finite float, whose significand is odd. */
    if (isinf(nearest)) return copysign{s32}(tsl_bitcast_u32_f32(0x7f7fffffu), nearest);
    const {u32_t} bits = tsl_bitcast_f32_u32(nearest);
    if ((bits & 1u) != 0) return nearest;
    /* Even and inexact: take the other neighbour, one step toward x. */
    return tsl_bitcast_u32_f32(fabs{s64}((double)nearest) < fabs{s64}(x) ? bits + 1u : bits - 1u);
}}
"
        ),
        Helper::HalfFma => format!(
            "{p}float {name}(double a, double b, double c) {{
    /* The product of two half values is exact in double; the sum is rounded to odd with
       its exact error (two-sum), then to float to odd, so the caller's rounding to the
       half type is the only one that counts. */
    const double product = a * b;
    const double sum = product + c;
    if (!isfinite(sum)) return (float)sum;
    const double c_part = sum - product;
    const double error = (product - (sum - c_part)) + (c - c_part);
    const {u64_t} bits = tsl_bitcast_f64_u64(sum);
    double odd = sum;
    if (error != 0.0 && (bits & 1u) == 0) {{
        odd = tsl_bitcast_u64_f64((error > 0.0) == (sum > 0.0) ? bits + 1u : bits - 1u);
    }}
    return tsl_f64_to_f32_odd(odd);
}}
"
        ),
        Helper::Erf => erf_definition(p, u32_t, u64_t, s64),
        Helper::Fast(f) => f.definition(p),
        Helper::FloatMax(d) | Helper::FloatMin(d) => {
            let t = ty(d)?;
            let (cmp, signed) = if matches!(helper, Helper::FloatMax(_)) { (">", "b") } else { ("<", "a") };
            format!(
                "{p}{t} {name}({t} a, {t} b) {{
    /* NaN wins, and -0 < +0, as IEEE 754-2019's maximum and minimum define it. */
    if (a != a) return a;
    if (b != b) return b;
    return (a {cmp} b || (a == b && signbit({signed}) != 0)) ? a : b;
}}
"
            )
        }
        Helper::IntDiv(d) => {
            let t = ty(d)?;
            if d.is_signed() {
                let w = wide_unsigned(d, u32_t, u64_t);
                format!(
                    "{p}{t} {name}({t} a, {t} b) {{
    if (b == 0) return a;
    /* MIN / -1 overflows in C; wrapping negation gives MIN. */
    if (b == -1) return ({t})(({w})0 - ({w})a);
    return ({t})(a / b);
}}
"
                )
            } else {
                format!("{p}{t} {name}({t} a, {t} b) {{\n    return b == 0 ? a : ({t})(a / b);\n}}\n")
            }
        }
        Helper::IntRem(d) => {
            let t = ty(d)?;
            // MIN % -1 overflows in C; every remainder by -1 is 0.
            let guard = if d.is_signed() { "b == 0 || b == -1" } else { "b == 0" };
            format!("{p}{t} {name}({t} a, {t} b) {{\n    return ({guard}) ? ({t})0 : ({t})(a % b);\n}}\n")
        }
        Helper::IntPow(d) => {
            let t = ty(d)?;
            let w = wide_unsigned(d, u32_t, u64_t);
            let negative = if d.is_signed() {
                "    /* 1 / a^|b| truncated: only a = 1 and a = -1 give a nonzero result. */
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) != 0 ? -1 : 1) : 0);
"
            } else {
                ""
            };
            format!(
                "{p}{t} {name}({t} a, {t} b) {{
{negative}    /* Square and multiply, wrapping (modulo 2^bits, so a wider type is fine). */
    {w} base = ({w})a;
    {w} result = 1u;
    {u64_t} e = ({u64_t})b;
    while (e != 0) {{
        if ((e & 1u) != 0) result *= base;
        base *= base;
        e >>= 1;
    }}
    return ({t})result;
}}
"
            )
        }
        Helper::FloatToInt(from, to) => {
            let (f, t) = (ty(from)?, ty(to)?);
            let suffix = if from == DType::F32 { "f" } else { "" };
            // The bounds are powers of two, exact in both float types; C's conversion is
            // undefined outside the target's range, so those values are handled first.
            let bits = to.bits();
            let (low_test, low, high) = if to.is_signed() {
                (
                    format!("x <= -{}.0{suffix}", 1u128 << (bits - 1)),
                    int_literal(to.min_value(), t),
                    format!("{}.0{suffix}", 1u128 << (bits - 1)),
                )
            } else {
                (format!("x <= -1.0{suffix}"), format!("({t})0"), format!("{}.0{suffix}", 1u128 << bits))
            };
            format!(
                "{p}{t} {name}({f} x) {{
    if (x != x) return ({t})0;
    if ({low_test}) return {low};
    if (x >= {high}) return {max};
    return ({t})x;
}}
",
                max = int_literal(to.max_value(), t),
            )
        }
    })
}

/// `float tsl_<f8>_to_f32(uchar h)`: exact. Normal values rebias the exponent; subnormals
/// are `significand * 2^-9` (e4m3) or `* 2^-16` (e5m2), products exact in `float`.
fn f8_to_f32_definition(p: &str, name: &str, dtype: DType, u8_t: &str, u32_t: &str) -> String {
    let special = if dtype == DType::F8E4M3 {
        // e4m3fn: no infinities; S.1111.111 is the only NaN.
        "if ((h & 0x7fu) == 0x7fu) return tsl_bitcast_u32_f32(sign | 0x7fc00000u);"
    } else {
        "if (exp == 0x1fu) return tsl_bitcast_u32_f32(sign | (man == 0u ? 0x7f800000u : 0x7fc00000u));"
    };
    let (m, exp_mask, rebias, tiny) = if dtype == DType::F8E4M3 {
        (3, "0xfu", 120, "0.001953125f")
    } else {
        (2, "0x1fu", 112, "0.0000152587890625f")
    };
    format!(
        "{p}float {name}({u8_t} h) {{
    const {u32_t} sign = ({u32_t})(h & 0x80u) << 24;
    const {u32_t} exp = ({u32_t})(h >> {m}) & {exp_mask};
    const {u32_t} man = ({u32_t})h & {man_mask}u;
    {special}
    if (exp == 0u) return tsl_bitcast_u32_f32(sign | tsl_bitcast_f32_u32((float)man * {tiny}));
    return tsl_bitcast_u32_f32(sign | ((exp + {rebias}u) << 23) | (man << {shift}));
}}
",
        man_mask = (1 << m) - 1,
        shift = 23 - m,
    )
}

/// `uchar tsl_f32_to_<f8>(float value)`: rounds to nearest even with integer operations
/// only (so flush-to-zero devices agree); the same algorithm as `tessel_shape`'s
/// `F8E4M3::from_f32` and `F8E5M2::from_f32`.
fn f32_to_f8_definition(p: &str, name: &str, dtype: DType, u8_t: &str, u32_t: &str) -> String {
    // Significand bits, exponent bias, the first magnitude past the grid and its result.
    let (m, bias, over, over_value) = if dtype == DType::F8E4M3 {
        (3u32, 7u32, "0x43f00000u", "0x7fu")
    } else {
        (2, 15, "0x47800000u", "0x7cu")
    };
    format!(
        "{p}{u8_t} {name}(float value) {{
    const {u32_t} x = tsl_bitcast_f32_u32(value);
    const {u32_t} sign = (x >> 24) & 0x80u;
    const {u32_t} a = x & 0x7fffffffu;
    {u32_t} r;
    if (a > 0x7f800000u) {{
        r = 0x7fu;
    }} else if (a >= {over}) {{
        /* Past the top of the grid (infinity included). */
        r = {over_value};
    }} else if ((a >> 23) < {min_normal}u) {{
        /* Subnormal or zero: |x| / 2^{ulp} rounded to nearest even. */
        const {u32_t} e = a >> 23;
        const {u32_t} shift = {k}u - e;
        if (e == 0u || shift > 25u) {{
            r = 0u;
        }} else {{
            const {u32_t} sig = (a & 0x7fffffu) | 0x800000u;
            const {u32_t} halfway = 1u << (shift - 1u);
            const {u32_t} rest = sig & ((halfway << 1) - 1u);
            r = sig >> shift;
            if (rest > halfway || (rest == halfway && (r & 1u) != 0u)) r += 1u;
        }}
    }} else {{
        /* Normal: rebias, then round the significand to nearest even (a carry bumps the
           exponent, up to the NaN or infinity pattern). */
        const {u32_t} t = a - ({rebias}u << 23);
        r = (t + {half_m1}u + ((t >> {drop}) & 1u)) >> {drop};
    }}
    return ({u8_t})(sign | r);
}}
",
        min_normal = 128 - bias,
        ulp = format_args!("({})", 1 - i64::from(bias) - i64::from(m)),
        k = 151 - bias - m,
        rebias = 127 - bias,
        half_m1 = (1u32 << (22 - m)) - 1,
        drop = 23 - m,
    )
}

/// The unsigned type at least as wide as `int` that holds `dtype`'s bits: arithmetic in it
/// wraps, where arithmetic on narrower types would be promoted to signed `int` and overflow.
pub(super) fn wide_unsigned(
    dtype: DType,
    u32_t: &'static str,
    u64_t: &'static str,
) -> &'static str {
    if dtype.bits() > 32 { u64_t } else { u32_t }
}

/// fdlibm's `erf` coefficients, as the reference (`tessel_shape`'s `erf.rs`) spells them.
const ERX: u64 = 0x3feb_0ac1_6000_0000;
const EFX: u64 = 0x3fc0_6eba_8214_db69;
const EFX8: u64 = 0x3ff0_6eba_8214_db69;
const PP: [u64; 5] = [
    0x3fc06eba8214db68,
    0xbfd4cd7d691cb913,
    0xbf9d2a51dbd7194f,
    0xbf77a291236668e4,
    0xbef8ead6120016ac,
];
const QQ: [u64; 5] = [
    0x3fd97779cddadc09,
    0x3fb0a54c5536ceba,
    0x3f74d022c4d36b0f,
    0x3f215dc9221c1a10,
    0xbed09c4342a26120,
];
const PA: [u64; 7] = [
    0xbf6359b8bef77538,
    0x3fda8d00ad92b34d,
    0xbfd7d240fbb8c3f1,
    0x3fd45fca805120e4,
    0xbfbc63983d3e28ec,
    0x3fa22a36599795eb,
    0xbf61bf380a96073f,
];
const QA: [u64; 6] = [
    0x3fbb3e6618eee323,
    0x3fe14af092eb6f33,
    0x3fb2635cd99fe9a7,
    0x3fc02660e763351f,
    0x3f8bedc26b51dd1c,
    0x3f888b545735151d,
];
const RA: [u64; 8] = [
    0xbf843412600d6435,
    0xbfe63416e4ba7360,
    0xc0251e0441b0e726,
    0xc04f300ae4cba38d,
    0xc0644cb184282266,
    0xc067135cebccabb2,
    0xc054526557e4d2f2,
    0xc023a0efc69ac25c,
];
const SA: [u64; 8] = [
    0x4033a6b9bd707687,
    0x4061350c526ae721,
    0x407b290dd58a1a71,
    0x40842b1921ec2868,
    0x407ad02157700314,
    0x405b28a3ee48ae2c,
    0x401a47ef8e484a93,
    0xbfaeeff2ee749a62,
];
const RB: [u64; 7] = [
    0xbf84341239e86f4a,
    0xbfe993ba70c285de,
    0xc031c209555f995a,
    0xc064145d43c5ed98,
    0xc083ec881375f228,
    0xc09004616a2e5992,
    0xc07e384e9bdc383f,
];
const SB: [u64; 7] = [
    0x403e568b261d5190,
    0x40745cae221b9f0a,
    0x409802eb189d5118,
    0x40a8ffb7688c246a,
    0x40a3f219cedf3be6,
    0x407da874e79fe763,
    0xc03670e242712d62,
];

/// An `f64` as an exact C hexadecimal floating literal (`0x1.8p+1`); every coefficient
/// above is normal, and so is every value this is called with.
fn hex_f64(bits: u64) -> String {
    let sign = if bits >> 63 == 1 { "-" } else { "" };
    let exponent = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mantissa = bits & ((1 << 52) - 1);
    format!("{sign}0x1.{mantissa:013x}p{exponent:+}")
}

/// `c[0] + c[1] z + ...` by Horner's rule, innermost coefficient first, as the reference
/// folds it (its first step, `0 * z + c[n-1]`, is exactly `c[n-1]`).
fn horner(c: &[u64], z: &str) -> String {
    let mut it = c.iter().rev();
    let mut acc = it.next().map_or_else(|| "0.0".to_owned(), |&b| hex_f64(b));
    for &b in it {
        acc = format!("({acc}) * {z} + {}", hex_f64(b));
    }
    acc
}

/// `1 + z * poly(c, z)`: the denominators.
fn horner1(c: &[u64], z: &str) -> String {
    format!("1.0 + {z} * ({})", horner(c, z))
}

fn erf_definition(p: &str, u32_t: &str, u64_t: &str, s64: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{p}double tsl_erf(double x) {{
    /* fdlibm's s_erf.c (Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
       Developed at SunSoft, a Sun Microsystems, Inc. business. Permission to use, copy,
       modify, and distribute this software is freely granted, provided that this notice
       is preserved.), in the reference interpreter's exact operation order, so results
       match it bit for bit whatever the platform's erf does. */
    if (x != x) return x;
    const double a = fabs{s64}(x);
    const {u32_t} hi = ({u32_t})(tsl_bitcast_f64_u64(a) >> 32);
    if (hi < 0x3feb0000u) {{
        if (hi < 0x3e300000u) {{
            if (hi < 0x00800000u) return 0.125 * (8.0 * x + {efx8} * x);
            return x + {efx} * x;
        }}
        const double z = x * x;
        return x + x * (({pp}) / ({qq}));
    }}
    double magnitude;
    if (hi < 0x3ff40000u) {{
        const double s = a - 1.0;
        magnitude = {erx} + ({pa}) / ({qa});
    }} else if (hi >= 0x40180000u) {{
        magnitude = 1.0;
    }} else {{
        const double s = 1.0 / (a * a);
        double ratio;
        if (hi < 0x4006db6eu) {{
            ratio = ({ra}) / ({sa});
        }} else {{
            ratio = ({rb}) / ({sb});
        }}
        const double z = tsl_bitcast_u64_f64(tsl_bitcast_f64_u64(a) & ({u64_t})0xffffffff00000000u);
        const double erfc = exp{s64}(-z * z - 0.5625) * exp{s64}((z - a) * (z + a) + ratio) / a;
        magnitude = 1.0 - erfc;
    }}
    return copysign{s64}(magnitude, x);
}}
",
        efx8 = hex_f64(EFX8),
        efx = hex_f64(EFX),
        erx = hex_f64(ERX),
        pp = horner(&PP, "z"),
        qq = horner1(&QQ, "z"),
        pa = horner(&PA, "s"),
        qa = horner1(&QA, "s"),
        ra = horner(&RA, "s"),
        sa = horner1(&SA, "s"),
        rb = horner(&RB, "s"),
        sb = horner1(&SB, "s"),
    );
    out
}

/// The alignment of a vector of `w` `d`s where the dialect aligns vectors: its size, at
/// most 16 bytes (the widest access one instruction makes).
pub(super) fn vector_alignment(d: DType, w: u8) -> usize {
    (d.size_bytes() * usize::from(w)).min(16)
}

#[cfg(test)]
mod tests {
    use super::hex_f64;

    #[test]
    fn hex_floats_are_exact() {
        assert_eq!(hex_f64(3.0f64.to_bits()), "0x1.8000000000000p+1");
        assert_eq!(hex_f64((-0.375f64).to_bits()), "-0x1.8000000000000p-2");
    }
}
