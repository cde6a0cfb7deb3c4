//! The WGSL functions generated code calls where WGSL has no operator with
//! [`Scalar`](tessel_shape::Scalar)'s semantics: half-type conversions, guarded integer
//! division, IEEE division by zero, NaN-propagating `max`, exact `fmod`, `pow`'s special
//! cases, `erf`, `log`, `log2`, `sin`, `cos` and `tan` in the shader, `exp` reaching the subnormals, saturating
//! and correctly rounded conversions, conversions between `f32` and `f64` on the bits (exact
//! where a device flushes subnormals), and the opaque identity that keeps products from
//! being contracted into fused multiply-adds.
//!
//! Only the helpers a kernel uses are emitted, each after the helpers it calls. Arguments
//! of a function are never constant expressions to naga, so a helper also keeps naga's
//! constant evaluation away from operations that would fail on constant operands
//! (`1 / 0`, overflowing `MIN / -1`).

use tessel_shape::{DType, UnaryOp};

/// One helper a shader needs. Integer helpers take the WGSL representation's dtype (`I32`,
/// `U32`, `I64`, `U64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Helper {
    /// Whether an `F32` or `F64` is a NaN, from its bits.
    IsNan(DType),
    /// An `F32` or `F64` passed through an XOR of its bits with the uniform's zero word:
    /// the identity, which no compiler can see through, so that it cannot rewrite the
    /// error terms of a two-sum algebraically (Mesa's NIR turns `s - (s - p)` into `p` in
    /// float code not marked exact, and naga marks none), nor contract a product with the
    /// sum it feeds into a fused multiply-add (NVIDIA's compiler does).
    Opaque(DType),
    /// `f16` bits to `f32`, exactly (NaNs quieted, as `half` does).
    F16ToF32,
    /// `f32` to `f16` bits, rounding to nearest even.
    F32ToF16,
    /// `bf16` bits to `f32`, exactly (NaNs quieted).
    Bf16ToF32,
    /// `f32` to `bf16` bits, rounding to nearest even.
    F32ToBf16,
    /// A float8 dtype's bits (`F8E4M3` or `F8E5M2`) to `f32`, exactly (NaN as a quiet NaN of
    /// the same sign), on the bits.
    F8ToF32(DType),
    /// `f32` to a float8 dtype's bits, rounding to nearest even, out of range to NaN
    /// (`F8E4M3`) or infinity (`F8E5M2`), as PyTorch does; on the bits.
    F32ToF8(DType),
    /// `f32` to `f64` on the bits: exact for subnormals too, which devices may flush in a
    /// float conversion.
    F32ToF64,
    /// `f64` to `f32` on the bits, rounding to nearest even (subnormal results included).
    F64ToF32,
    /// `f64` to `f32` on the bits, rounding to odd, so that a second rounding to a half
    /// type is exact.
    F64ToF32Odd,
    /// `a * b + c` on `bf16` values given as `f64`, rounded once (to odd, to `f32`).
    HalfFmaF64,
    /// `a * b + c` on `f16` bits, rounded once to `f16`, computed exactly in `f32`.
    MadF16,
    /// `max` of two floats: NaN wins, `-0 < +0`.
    FloatMax(DType),
    /// `min` of two floats: NaN wins, `-0 < +0`.
    FloatMin(DType),
    /// C's `fmod`, exactly (musl's algorithm on the bits).
    Fmod(DType),
    /// `floor`, `ceil`, `round` (half to even) or `trunc` of an `F32` or `F64`, on the bits
    /// (drivers differ in the sign of a zero result and in `f64` rounding).
    Integral(UnaryOp, DType),
    /// C's `pow` on `f32`: the special cases explicitly, WGSL's `pow` on `|x|` otherwise.
    PowF32,
    /// Float `/` (`F32` or `F64`) with IEEE 754's results for a zero divisor made explicit
    /// (WGSL leaves them to the implementation, and Mesa folds `x / 0.0` to zero).
    FloatDiv(DType),
    /// `erf` on `f32`: fdlibm's `erff` with WGSL's `exp`.
    ErfF32,
    /// `exp` on `f32`, reaching the subnormal results (lavapipe's `exp` flushes them).
    ExpF32,
    /// `exp2` on `f32`, reaching the subnormal results.
    Exp2F32,
    /// `log` on `f32`, subnormal inputs included (lavapipe's `log` misreads them).
    LogF32,
    /// `log2` on `f32`, subnormal inputs included.
    Log2F32,
    /// `tanh` on `f32`: exactly ±1 and `x` where `f32` rounds it so, a polynomial near 0
    /// (where `tanh` built from `exp` cancels), WGSL's `tanh` in between.
    TanhF32,
    /// `u32 * u32` as two words (low, high), for the trigonometric reduction.
    MulWide,
    /// `|x|` reduced by π/2 for `sin`, `cos` and `tan` (Payne–Hanek, integer arithmetic).
    TrigReduceF32,
    /// `sin` on `f32` (see the `trig` module).
    SinF32,
    /// `cos` on `f32`.
    CosF32,
    /// `tan` on `f32`.
    TanF32,
    /// `fma` on `F32` or `F64`, with an infinite addend and finite factors giving the
    /// addend (a device rounding the product first may overflow it into `inf - inf`).
    Fma(DType),
    /// Integer `/`: `a / 0 == a`, `MIN / -1 == MIN`.
    IntDiv(DType),
    /// Integer `%`: `a % 0 == 0`, `MIN % -1 == 0`.
    IntRem(DType),
    /// Integer `a^b`, wrapping; negative exponents truncate `1 / a^|b|`.
    IntPow(DType),
    /// An integer (`I32`, `U32`, `I64`, `U64`) to `F32` or `F64`, rounding to nearest even.
    IntToFloat(DType, DType),
    /// `F32`/`F64` to an integer dtype (any width): truncating, saturating, NaN to 0.
    FloatToInt(DType, DType),
}

impl Helper {
    /// The helpers this one calls.
    fn deps(self) -> Vec<Helper> {
        match self {
            Helper::FloatMax(d) | Helper::FloatMin(d) | Helper::Fmod(d) => vec![Helper::IsNan(d)],
            Helper::FloatToInt(from, _) => vec![Helper::IsNan(from)],
            Helper::ErfF32 => vec![Helper::FloatDiv(DType::F32), Helper::ExpF32],
            Helper::PowF32 => vec![Helper::IsNan(DType::F32), Helper::Exp2F32, Helper::Log2F32],
            Helper::TrigReduceF32 => vec![Helper::MulWide],
            Helper::SinF32 | Helper::CosF32 | Helper::TanF32 => vec![Helper::TrigReduceF32],
            Helper::HalfFmaF64 => vec![Helper::F64ToF32Odd, Helper::Opaque(DType::F64)],
            Helper::MadF16 => vec![
                Helper::F16ToF32,
                Helper::F32ToF16,
                Helper::Opaque(DType::F32),
            ],
            Helper::IntToFloat(DType::I32, to) => vec![Helper::IntToFloat(DType::U32, to)],
            Helper::IntToFloat(DType::I64, to) => vec![Helper::IntToFloat(DType::U64, to)],
            _ => Vec::new(),
        }
    }

    /// The function's name.
    pub(super) fn name(self) -> String {
        match self {
            Helper::IsNan(d) => format!("tsl_isnan_{d}"),
            Helper::Opaque(d) => format!("tsl_opaque_{d}"),
            Helper::F16ToF32 => "tsl_f16_to_f32".into(),
            Helper::F32ToF16 => "tsl_f32_to_f16".into(),
            Helper::Bf16ToF32 => "tsl_bf16_to_f32".into(),
            Helper::F32ToBf16 => "tsl_f32_to_bf16".into(),
            Helper::F8ToF32(d) => format!("tsl_{d}_to_f32"),
            Helper::F32ToF8(d) => format!("tsl_f32_to_{d}"),
            Helper::F32ToF64 => "tsl_f32_to_f64".into(),
            Helper::F64ToF32 => "tsl_f64_to_f32".into(),
            Helper::F64ToF32Odd => "tsl_f64_to_f32_odd".into(),
            Helper::HalfFmaF64 => "tsl_half_fma".into(),
            Helper::MadF16 => "tsl_mad_f16".into(),
            Helper::FloatMax(d) => format!("tsl_max_{d}"),
            Helper::FloatMin(d) => format!("tsl_min_{d}"),
            Helper::Fmod(d) => format!("tsl_fmod_{d}"),
            Helper::Integral(op, d) => format!("tsl_{}_{d}", op.name()),
            Helper::PowF32 => "tsl_pow_f32".into(),
            Helper::FloatDiv(d) => format!("tsl_fdiv_{d}"),
            Helper::ErfF32 => "tsl_erf_f32".into(),
            Helper::ExpF32 => "tsl_exp_f32".into(),
            Helper::Exp2F32 => "tsl_exp2_f32".into(),
            Helper::LogF32 => "tsl_log_f32".into(),
            Helper::Log2F32 => "tsl_log2_f32".into(),
            Helper::TanhF32 => "tsl_tanh_f32".into(),
            Helper::MulWide => "tsl_mul_wide".into(),
            Helper::TrigReduceF32 => "tsl_trig_reduce_f32".into(),
            Helper::SinF32 => "tsl_sin_f32".into(),
            Helper::CosF32 => "tsl_cos_f32".into(),
            Helper::TanF32 => "tsl_tan_f32".into(),
            Helper::Fma(d) => format!("tsl_fma_{d}"),
            Helper::IntDiv(d) => format!("tsl_div_{d}"),
            Helper::IntRem(d) => format!("tsl_rem_{d}"),
            Helper::IntPow(d) => format!("tsl_pow_{d}"),
            Helper::IntToFloat(from, to) | Helper::FloatToInt(from, to) => {
                format!("tsl_{from}_to_{to}")
            }
        }
    }
}

/// The helpers a shader needs, in an order where each follows the helpers it calls.
#[derive(Default)]
pub(super) struct Helpers {
    order: Vec<Helper>,
}

impl Helpers {
    /// Records that the shader calls `helper`; returns its name.
    pub(super) fn call(&mut self, helper: Helper) -> String {
        self.require(helper);
        helper.name()
    }

    fn require(&mut self, helper: Helper) {
        if self.order.contains(&helper) {
            return;
        }
        for dep in helper.deps() {
            self.require(dep);
        }
        self.order.push(helper);
    }

    /// The definitions, in dependency order.
    pub(super) fn render(&self) -> String {
        let mut out = String::new();
        for &helper in &self.order {
            out.push_str(&definition(helper));
            out.push('\n');
        }
        out
    }
}

/// The WGSL type holding values of `dtype` (the representation dtypes only).
pub(super) fn wgsl(dtype: DType) -> &'static str {
    match dtype {
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U64 => "u64",
        DType::F32 => "f32",
        DType::F64 => "f64",
        _ => "u32",
    }
}

/// An integer literal of the representation dtype `dtype`.
pub(super) fn int_lit(dtype: DType, value: i128) -> String {
    let suffix = match dtype {
        DType::I8 | DType::I16 | DType::I32 => "i",
        DType::I64 => "li",
        DType::U64 => "lu",
        _ => "u",
    };
    // The most negative value has no literal (its magnitude overflows): MIN = -MAX - 1.
    if (dtype == DType::I32 && value == i128::from(i32::MIN))
        || (dtype == DType::I64 && value == i128::from(i64::MIN))
    {
        return format!("({}{suffix} - 1{suffix})", value + 1);
    }
    if value < 0 {
        format!("({value}{suffix})")
    } else {
        format!("{value}{suffix}")
    }
}

/// `fn tsl_<f8>_to_f32(h: u32) -> f32`: exact, on the bits (a subnormal's leading 1 is
/// shifted into the implicit bit), like the C dialects' helper.
fn f8_to_f32_definition(name: &str, dtype: DType) -> String {
    // Significand bits, the exponent field's mask, the rebias, and the special patterns.
    let (m, exp_mask, rebias, special) = if dtype == DType::F8E4M3 {
        (
            3u32,
            "0xfu",
            120u32,
            // e4m3fn: no infinities; S.1111.111 is the only NaN.
            "if (h & 0x7fu) == 0x7fu {\n        return bitcast<f32>(sign | 0x7fc00000u);\n    }",
        )
    } else {
        (
            2,
            "0x1fu",
            112,
            "if e == 0x1fu {\n        return bitcast<f32>(sign | select(0x7fc00000u, 0x7f800000u, man == 0u));\n    }",
        )
    };
    format!(
        "fn {name}(h: u32) -> f32 {{
    let sign = (h & 0x80u) << 24u;
    let e = (h >> {m}u) & {exp_mask};
    let man = h & {man_mask}u;
    {special}
    if e == 0u {{
        if man == 0u {{
            return bitcast<f32>(sign);
        }}
        // A subnormal: shift its leading 1 into the implicit bit.
        let s = countLeadingZeros(man) - {clz}u;
        return bitcast<f32>(sign | (({sub_bias}u - s) << 23u) | (((man << s) & {man_mask}u) << {shift}u));
    }}
    return bitcast<f32>(sign | ((e + {rebias}u) << 23u) | (man << {shift}u));
}}
",
        man_mask = (1u32 << m) - 1,
        clz = 32 - 1 - m,
        sub_bias = rebias + 1,
        shift = 23 - m,
    )
}

/// `fn tsl_f32_to_<f8>(value: f32) -> u32`: rounds to nearest even with integer operations
/// only, the algorithm of `tessel_shape`'s `F8E4M3::from_f32` and `F8E5M2::from_f32`.
fn f32_to_f8_definition(name: &str, dtype: DType) -> String {
    // Significand bits, exponent bias, the first magnitude past the grid and its result.
    let (m, bias, over, over_value) = if dtype == DType::F8E4M3 {
        (3u32, 7u32, "0x43f00000u", "0x7fu")
    } else {
        (2, 15, "0x47800000u", "0x7cu")
    };
    format!(
        "fn {name}(value: f32) -> u32 {{
    let x = bitcast<u32>(value);
    let sign = (x >> 24u) & 0x80u;
    let a = x & 0x7fffffffu;
    if a > 0x7f800000u {{
        return sign | 0x7fu;
    }}
    if a >= {over} {{
        // Past the top of the grid (infinity included).
        return sign | {over_value};
    }}
    let e = a >> 23u;
    if e < {min_normal}u {{
        // Subnormal or zero: the magnitude in units of the smallest subnormal, rounded to
        // nearest even.
        let shift = {k}u - e;
        if e == 0u || shift > 25u {{
            return sign;
        }}
        let sig = (a & 0x7fffffu) | 0x800000u;
        let halfway = 1u << (shift - 1u);
        let rest = sig & ((halfway << 1u) - 1u);
        var r = sig >> shift;
        if rest > halfway || (rest == halfway && (r & 1u) != 0u) {{
            r += 1u;
        }}
        return sign | r;
    }}
    // Normal: rebias, then round the significand to nearest even (a carry bumps the
    // exponent, up to the NaN or infinity pattern).
    let t = a - ({rebias}u << 23u);
    return sign | ((t + {half_m1}u + ((t >> {drop}u) & 1u)) >> {drop}u);
}}
",
        min_normal = 128 - bias,
        k = 151 - bias - m,
        rebias = 127 - bias,
        half_m1 = (1u32 << (22 - m)) - 1,
        drop = 23 - m,
    )
}

/// The text of one helper.
fn definition(helper: Helper) -> String {
    let name = helper.name();
    match helper {
        Helper::IsNan(d) => {
            if d == DType::F64 {
                format!(
                    "fn {name}(x: f64) -> bool {{\n    return (bitcast<u64>(x) & 0x7ffffffffffffffflu) > 0x7ff0000000000000lu;\n}}\n"
                )
            } else {
                format!(
                    "fn {name}(x: f32) -> bool {{\n    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;\n}}\n"
                )
            }
        }
        Helper::Opaque(d) => {
            let zero = super::ZERO_WORD;
            let word = format!("tsl_u.words[{}][{}]", zero / 4, zero % 4);
            if d == DType::F64 {
                format!(
                    "fn {name}(x: f64) -> f64 {{\n    return bitcast<f64>(bitcast<u64>(x) ^ u64({word}));\n}}\n"
                )
            } else {
                format!(
                    "fn {name}(x: f32) -> f32 {{\n    return bitcast<f32>(bitcast<u32>(x) ^ {word});\n}}\n"
                )
            }
        }
        Helper::F16ToF32 => format!(
            "fn {name}(h: u32) -> f32 {{
    let sign = (h & 0x8000u) << 16u;
    let e = h & 0x7c00u;
    let man = h & 0x03ffu;
    if (h & 0x7fffu) == 0u {{
        return bitcast<f32>(sign);
    }}
    if e == 0x7c00u {{
        // Infinity, or a NaN made quiet with its payload kept, as `half` does.
        return bitcast<f32>(select(sign | 0x7fc00000u | (man << 13u), sign | 0x7f800000u, man == 0u));
    }}
    if e == 0u {{
        // A subnormal: shift its leading 1 into the implicit bit.
        let s = countLeadingZeros(man) - 21u;
        return bitcast<f32>(sign | ((113u - s) << 23u) | (((man << s) & 0x03ffu) << 13u));
    }}
    return bitcast<f32>(sign | (((e >> 10u) + 112u) << 23u) | (man << 13u));
}}
"
        ),
        Helper::F32ToF16 => format!(
            "fn {name}(value: f32) -> u32 {{
    let x = bitcast<u32>(value);
    let sign = x & 0x80000000u;
    let e = x & 0x7f800000u;
    let man = x & 0x007fffffu;
    if e == 0x7f800000u {{
        // Infinity, or a quiet NaN keeping the payload's top bits.
        return (sign >> 16u) | 0x7c00u | select(0x0200u, 0u, man == 0u) | (man >> 13u);
    }}
    let half_sign = sign >> 16u;
    let half_exp = i32(e >> 23u) - 127i + 15i;
    if half_exp >= 0x1fi {{
        return half_sign | 0x7c00u;
    }}
    if half_exp <= 0i {{
        // A subnormal result, or zero past the smallest subnormal's half.
        if 14i - half_exp > 24i {{
            return half_sign;
        }}
        let m = man | 0x00800000u;
        var half_man = m >> u32(14i - half_exp);
        let round_bit = 1u << u32(13i - half_exp);
        if (m & round_bit) != 0u && (m & (3u * round_bit - 1u)) != 0u {{
            half_man += 1u;
        }}
        return half_sign | half_man;
    }}
    var out = half_sign | (u32(half_exp) << 10u) | (man >> 13u);
    // Round to nearest even: up when past half, or at half with an odd result.
    if (man & 0x1000u) != 0u && (man & 0x2fffu) != 0u {{
        out += 1u;
    }}
    return out;
}}
"
        ),
        Helper::F8ToF32(d) => f8_to_f32_definition(&name, d),
        Helper::F32ToF8(d) => f32_to_f8_definition(&name, d),
        Helper::Bf16ToF32 => format!(
            "fn {name}(h: u32) -> f32 {{
    // NaNs are made quiet, as `half` does.
    return bitcast<f32>(select(h, h | 0x0040u, (h & 0x7fffu) > 0x7f80u) << 16u);
}}
"
        ),
        Helper::F32ToBf16 => format!(
            "fn {name}(value: f32) -> u32 {{
    let x = bitcast<u32>(value);
    if (x & 0x7fffffffu) > 0x7f800000u {{
        return (x >> 16u) | 0x0040u;
    }}
    // Round to nearest even.
    if (x & 0x8000u) != 0u && (x & 0x17fffu) != 0u {{
        return (x >> 16u) + 1u;
    }}
    return x >> 16u;
}}
"
        ),
        Helper::F32ToF64 => format!(
            "fn {name}(x: f32) -> f64 {{
    // On the bits: exact for subnormals, which a device may flush in `f64(x)`.
    let b = bitcast<u32>(x);
    let sign = u64(b & 0x80000000u) << 32u;
    let e = (b >> 23u) & 0xffu;
    let man = b & 0x007fffffu;
    if e == 0xffu {{
        // Infinity, or a NaN made quiet with its payload kept.
        return bitcast<f64>(sign | 0x7ff0000000000000lu | select(0lu, 0x0008000000000000lu | (u64(man) << 29u), man != 0u));
    }}
    if e == 0u {{
        if man == 0u {{
            return bitcast<f64>(sign);
        }}
        // A subnormal, man * 2^-149: its leading 1 (bit 31 - lz) becomes the implicit bit.
        let lz = countLeadingZeros(man);
        return bitcast<f64>(sign | (u64(905u - lz) << 52u) | ((u64(man) << (21u + lz)) & 0x000ffffffffffffflu));
    }}
    return bitcast<f64>(sign | (u64(e + 896u) << 52u) | (u64(man) << 29u));
}}
"
        ),
        Helper::F64ToF32 | Helper::F64ToF32Odd => super::exact::f64_to_f32_definition(helper),
        Helper::HalfFmaF64 => format!(
            "fn {name}(a: f64, b: f64, c: f64) -> f32 {{
    // The product of two half values is exact in f64; the sum is rounded to odd with its
    // exact error (two-sum), then to f32 to odd, so the caller's rounding to the half type
    // is the only one that counts.
    let product = a * b;
    let sum = tsl_opaque_f64(product + c);
    if (bitcast<u64>(sum) & 0x7ff0000000000000lu) == 0x7ff0000000000000lu {{
        return f32(sum);
    }}
    let c_part = tsl_opaque_f64(sum - product);
    let error = tsl_opaque_f64(product - tsl_opaque_f64(sum - c_part)) + tsl_opaque_f64(c - c_part);
    let bits = bitcast<u64>(sum);
    var odd = sum;
    if error != 0.0lf && (bits & 1lu) == 0lu {{
        odd = bitcast<f64>(select(bits - 1lu, bits + 1lu, (error > 0.0lf) == (sum > 0.0lf)));
    }}
    return tsl_f64_to_f32_odd(odd);
}}
"
        ),
        Helper::MadF16 => format!(
            "fn {name}(a: u32, b: u32, c: u32) -> u32 {{
    // The product of two f16 values has at most 22 significant bits and lies within
    // 2^-48..2^32, so it is exact in f32; the sum is rounded to odd with its exact error
    // (two-sum), so the rounding to f16 is the only one that counts.
    let x = tsl_f16_to_f32(a);
    let y = tsl_f16_to_f32(b);
    let z = tsl_f16_to_f32(c);
    let product = x * y;
    let sum = tsl_opaque_f32(product + z);
    let bits = bitcast<u32>(sum);
    if (bits & 0x7f800000u) == 0x7f800000u {{
        return tsl_f32_to_f16(sum);
    }}
    let z_part = tsl_opaque_f32(sum - product);
    let error = tsl_opaque_f32(product - tsl_opaque_f32(sum - z_part)) + tsl_opaque_f32(z - z_part);
    var odd = sum;
    if error != 0.0f && (bits & 1u) == 0u {{
        odd = bitcast<f32>(select(bits - 1u, bits + 1u, (error > 0.0f) == (sum > 0.0f)));
    }}
    return tsl_f32_to_f16(odd);
}}
"
        ),
        Helper::FloatMax(d) | Helper::FloatMin(d) => {
            let t = wgsl(d);
            let cmp = if matches!(helper, Helper::FloatMax(_)) {
                ">"
            } else {
                "<"
            };
            // The bits as a signed integer ordered like the values, -0 below +0: the sign
            // and magnitude as they are for positive values, the magnitude's bits flipped
            // for negative ones.
            let (i, flip, zero) = if d == DType::F64 {
                ("i64", int_lit(DType::I64, i128::from(i64::MAX)), "0li")
            } else {
                ("i32", "0x7fffffffi".to_owned(), "0i")
            };
            format!(
                "fn {name}(a: {t}, b: {t}) -> {t} {{
    // NaN wins, and -0 < +0, as IEEE 754-2019's maximum and minimum define it. Ordered on
    // the bits: a device may flush subnormals in float comparisons (NVIDIA's Vulkan driver
    // does), which would pick the wrong one of two subnormals.
    if tsl_isnan_{d}(a) {{
        return a;
    }}
    if tsl_isnan_{d}(b) {{
        return b;
    }}
    let ia = bitcast<{i}>(a);
    let ib = bitcast<{i}>(b);
    let ka = select(ia, ia ^ {flip}, ia < {zero});
    let kb = select(ib, ib ^ {flip}, ib < {zero});
    return select(b, a, ka {cmp} kb);
}}
"
            )
        }
        Helper::Fmod(d) => super::exact::fmod_definition(d),
        Helper::Integral(op, d) => super::exact::integral_definition(op, d),
        Helper::PowF32 => format!(
            "fn {name}(x: f32, y: f32) -> f32 {{
    // C's pow: the special cases on the bits, exp2(y * log2(x)) otherwise.
    let xb = bitcast<u32>(x);
    let yb = bitcast<u32>(y);
    let ax = xb & 0x7fffffffu;
    let ay = yb & 0x7fffffffu;
    let inf = bitcast<f32>(0x7f800000u);
    if ay == 0u || xb == 0x3f800000u {{
        return 1.0f;
    }}
    if ax > 0x7f800000u || ay > 0x7f800000u {{
        return bitcast<f32>(0x7fc00000u);
    }}
    let y_pos = (yb >> 31u) == 0u;
    if ay == 0x7f800000u {{
        if ax == 0x3f800000u {{
            return 1.0f;
        }}
        return select(0.0f, inf, (ax > 0x3f800000u) == y_pos);
    }}
    // Every f32 from 2^23 on is an integer, and every one from 2^24 on is even.
    let y_int = ay >= 0x4b000000u || trunc(y) == y;
    let y_odd = y_int && ay < 0x4b800000u && trunc(y * 0.5f) != y * 0.5f;
    let negate = (xb >> 31u) != 0u && y_odd;
    var magnitude: f32;
    if ax == 0u {{
        magnitude = select(inf, 0.0f, y_pos);
    }} else if ax == 0x7f800000u {{
        magnitude = select(0.0f, inf, y_pos);
    }} else if (xb >> 31u) != 0u && !y_int {{
        return bitcast<f32>(0x7fc00000u);
    }} else {{
        // Not WGSL's pow: its accuracy is inherited from `exp2(y * log2(x))` with the
        // built-in log2's absolute error of 2^-21 near 1, which |y| magnifies without
        // bound (3000 ulps for pow(1.03, -2611) on NVIDIA). The shader's log2 is within
        // an ulp, so the error left is the product's rounding and exp2's. Subnormal bases
        // and results are handled by those helpers.
        magnitude = tsl_exp2_f32(y * tsl_log2_f32(bitcast<f32>(ax)));
    }}
    return select(magnitude, -magnitude, negate);
}}
"
        ),
        Helper::FloatDiv(d) => {
            let t = wgsl(d);
            let (u, abs_mask, sign, inf, nan, zero, big, scale) = if d == DType::F64 {
                (
                    "u64",
                    "0x7ffffffffffffffflu",
                    "0x8000000000000000lu",
                    "0x7ff0000000000000lu",
                    "0x7ff8000000000000lu",
                    "0lu",
                    "0x7fd0000000000000lu",
                    "0.00390625lf",
                )
            } else {
                (
                    "u32",
                    "0x7fffffffu",
                    "0x80000000u",
                    "0x7f800000u",
                    "0x7fc00000u",
                    "0u",
                    "0x7e800000u",
                    "0.00390625f",
                )
            };
            format!(
                "fn {name}(a: {t}, b: {t}) -> {t} {{
    // A zero divisor on the bits: 0 / 0 and NaN / 0 are NaN, anything else / ±0 is an
    // infinity signed by both signs.
    let ab = bitcast<{u}>(a);
    let bb = bitcast<{u}>(b);
    if (bb & {abs_mask}) == {zero} {{
        if (ab & {abs_mask}) == {zero} || (ab & {abs_mask}) > {inf} {{
            return bitcast<{t}>({nan});
        }}
        return bitcast<{t}>(((ab ^ bb) & {sign}) | {inf});
    }}
    if (bb & {abs_mask}) >= {big} && (bb & {abs_mask}) < {inf} {{
        // |b| >= 2^126 (2^1022 for f64), where WGSL bounds `/` no more: a device computing
        // a * (1 / b) flushes the subnormal reciprocal (NVIDIA's Vulkan driver does). Both
        // scalings by 2^-8 are exact, and a / (b * 2^-8) cannot overflow.
        return (a / (b * {scale})) * {scale};
    }}
    return a / b;
}}
"
            )
        }
        Helper::ErfF32 => format!(
            "fn {name}(x: f32) -> f32 {{
    // fdlibm's erff with FreeBSD's coefficients (openlibm's s_erff.c), WGSL's exp.
    let hx = bitcast<u32>(x);
    let ix = hx & 0x7fffffffu;
    let negative = (hx >> 31u) != 0u;
    if ix > 0x7f800000u {{
        return x;
    }}
    if ix >= 0x40800000u {{
        // |x| >= 4, infinities included: 1 - tiny rounds to 1.
        return select(1.0f, -1.0f, negative);
    }}
    if ix < 0x3f580000u {{
        // |x| < 0.84375
        if ix < 0x38800000u {{
            // |x| < 2^-14: x + efx * x, scaled up first where efx * x would underflow.
            if ix < 0x04000000u {{
                return (8.0f * x + 1.0270333290f * x) * 0.125f;
            }}
            return x + 0.12837916613f * x;
        }}
        let z = x * x;
        let r = 0.128379166f + z * (-0.336030394f + z * (-0.00186260219f));
        let s = 1.0f + z * (0.312324286f + z * (0.0216070302f + z * (-0.00198859419f)));
        return x + x * tsl_fdiv_f32(r, s);
    }}
    let ax = bitcast<f32>(ix);
    if ix < 0x3fa00000u {{
        // 0.84375 <= |x| < 1.25
        let s = ax - 1.0f;
        let p = 3.64939137e-06f + s * (0.415109694f + s * (-0.165179938f + s * 0.110914491f));
        let q = 1.0f + s * (0.602074385f + s * (0.535934687f + s * (0.168576106f + s * 0.0562181212f)));
        let v = 0.842697144f + tsl_fdiv_f32(p, q);
        return select(v, -v, negative);
    }}
    // 1.25 <= |x| < 4
    let s = tsl_fdiv_f32(1.0f, ax * ax);
    var r: f32;
    var q: f32;
    if ix < 0x4036db6eu {{
        // |x| < 1 / 0.35
        r = -0.00987132732f + s * (-0.553605914f + s * (-2.17589188f + s * (-1.43268085f)));
        q = 1.0f + s * (5.45995426f + s * (6.69798088f + s * (1.43113089f + s * (-0.0577397496f))));
    }} else {{
        r = -0.00986494310f + s * (-0.625171244f + s * (-6.16498327f + s * (-16.6696873f + s * (-9.53764343f))));
        q = 1.0f + s * (12.6884899f + s * (45.1839523f + s * (47.2810211f + s * 8.93033314f)));
    }}
    let z = bitcast<f32>(ix & 0xffffe000u);
    let e = tsl_exp_f32(-z * z - 0.5625f) * tsl_exp_f32((z - ax) * (z + ax) + tsl_fdiv_f32(r, q));
    let v = 1.0f - tsl_fdiv_f32(e, ax);
    return select(v, -v, negative);
}}
"
        ),
        Helper::ExpF32 | Helper::Exp2F32 => {
            // Below the bound, the result is near or below the smallest normal: the square
            // of the function at x / 2 (exact halving, one rounding onto the subnormal).
            let (f, bound) = if helper == Helper::ExpF32 {
                ("exp", "-87.0f")
            } else {
                ("exp2", "-126.0f")
            };
            format!(
                "fn {name}(x: f32) -> f32 {{
    // Some devices (lavapipe) flush the built-in's subnormal results to zero.
    if x < {bound} {{
        let h = {f}(x * 0.5f);
        return h * h;
    }}
    return {f}(x);
}}
"
            )
        }
        Helper::LogF32 | Helper::Log2F32 => {
            // musl's logf and log2f (from FreeBSD's e_logf.c and e_log2f.c).
            let result = if helper == Helper::LogF32 {
                "    let dk = f32(k);
    return s * (hfsq + r) + dk * bitcast<f32>(0x3717f7d1u) - hfsq + f + dk * bitcast<f32>(0x3f317180u);"
            } else {
                "    // hi has 12 significant bits, so hi times the 12-bit high part of 1/ln(2) is exact.
    let hi = bitcast<f32>(bitcast<u32>(f - hfsq) & 0xfffff000u);
    let lo = f - hi - hfsq + s * (hfsq + r);
    return (lo + hi) * bitcast<f32>(0xb9389ad4u) + lo * bitcast<f32>(0x3fb8b000u) + hi * bitcast<f32>(0x3fb8b000u) + f32(k);"
            };
            format!(
                "fn {name}(value: f32) -> f32 {{
    // musl's algorithm, not WGSL's built-in: that one is only within an absolute 2^-21 on
    // [0.5, 2] (many ulps near 1), and devices (lavapipe) misread subnormal arguments.
    var ix = bitcast<u32>(value);
    var k = 0i;
    if (ix << 1u) == 0u {{
        return bitcast<f32>(0xff800000u);
    }}
    if (ix >> 31u) != 0u {{
        return bitcast<f32>(0x7fc00000u | (ix & 0x007fffffu));
    }}
    if ix >= 0x7f800000u {{
        return value;
    }}
    if ix == 0x3f800000u {{
        return 0.0f;
    }}
    if ix < 0x00800000u {{
        // A subnormal, scaled up by 2^25 exactly: its significand (an integer) times
        // 2^-149 * 2^25, built without going through the subnormal.
        k = -25i;
        ix = bitcast<u32>(f32(ix) * bitcast<f32>(0x01800000u));
    }}
    // x = 2^k (1 + f), with 1 + f in [sqrt(2)/2, sqrt(2)).
    ix += 0x3f800000u - 0x3f3504f3u;
    k += i32(ix >> 23u) - 0x7fi;
    ix = (ix & 0x007fffffu) + 0x3f3504f3u;
    let f = bitcast<f32>(ix) - 1.0f;
    let s = f / (2.0f + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (bitcast<f32>(0x3eccce13u) + w * bitcast<f32>(0x3e789e26u));
    let t2 = z * (bitcast<f32>(0x3f2aaaaau) + w * bitcast<f32>(0x3e91e9eeu));
    let r = t2 + t1;
    let hfsq = 0.5f * f * f;
{result}
}}
"
            )
        }
        Helper::MulWide => super::trig::MUL_WIDE.into(),
        Helper::TrigReduceF32 => super::trig::TRIG_REDUCE.into(),
        Helper::SinF32 => super::trig::sin(),
        Helper::CosF32 => super::trig::cos(),
        Helper::TanF32 => super::trig::tan(),
        Helper::TanhF32 => format!(
            "fn {name}(x: f32) -> f32 {{
    let ax = bitcast<u32>(x) & 0x7fffffffu;
    // tanh is exactly ±1 in f32 beyond |x| = 20, which an implementation computing
    // exp(x) / exp(x) would overflow instead.
    if ax > 0x41a00000u && ax <= 0x7f800000u {{
        return bitcast<f32>((bitcast<u32>(x) & 0x80000000u) | 0x3f800000u);
    }}
    // tanh(x) rounds to x below |x| = 2^-12 (returned as is, keeping -0).
    if ax < 0x39800000u {{
        return x;
    }}
    // Below |x| = 1/8 the Taylor series to x^9 (next term below 2^-36 relative), where
    // (e^2x - 1) / (e^2x + 1) cancels.
    if ax < 0x3e000000u {{
        let z = x * x;
        let p = -0.33333333333f + z * (0.13333333333f + z * (-0.053968253968f + z * 0.021869488536f));
        return x + x * (z * p);
    }}
    return tanh(x);
}}
"
        ),
        Helper::Fma(d) => {
            let (t, u, abs_mask, inf) = if d == DType::F64 {
                ("f64", "u64", "0x7ffffffffffffffflu", "0x7ff0000000000000lu")
            } else {
                ("f32", "u32", "0x7fffffffu", "0x7f800000u")
            };
            format!(
                "fn {name}(a: {t}, b: {t}, c: {t}) -> {t} {{
    // WGSL lets fma round the product first (lavapipe does), which can overflow it: a
    // finite product plus an infinite c is c.
    if (bitcast<{u}>(c) & {abs_mask}) == {inf} && (bitcast<{u}>(a) & {abs_mask}) < {inf} && (bitcast<{u}>(b) & {abs_mask}) < {inf} {{
        return c;
    }}
    return fma(a, b, c);
}}
"
            )
        }
        Helper::IntDiv(d) => {
            let t = wgsl(d);
            let zero = int_lit(d, 0);
            if d.is_signed() {
                let minus_one = int_lit(d, -1);
                format!(
                    "fn {name}(a: {t}, b: {t}) -> {t} {{
    if b == {zero} {{
        return a;
    }}
    // MIN / -1 overflows; wrapping negation gives MIN.
    if b == {minus_one} {{
        return -a;
    }}
    return a / b;
}}
"
                )
            } else {
                format!("fn {name}(a: {t}, b: {t}) -> {t} {{\n    if b == {zero} {{\n        return a;\n    }}\n    return a / b;\n}}\n")
            }
        }
        Helper::IntRem(d) => {
            let t = wgsl(d);
            let zero = int_lit(d, 0);
            let guard = if d.is_signed() {
                format!("b == {zero} || b == {}", int_lit(d, -1))
            } else {
                format!("b == {zero}")
            };
            format!(
                "fn {name}(a: {t}, b: {t}) -> {t} {{
    // Every remainder by -1 is 0, and MIN % -1 would overflow.
    if {guard} {{
        return {zero};
    }}
    return a % b;
}}
"
            )
        }
        Helper::IntPow(d) => {
            let t = wgsl(d);
            let (one, zero) = (int_lit(d, 1), int_lit(d, 0));
            let negative = if d.is_signed() {
                let minus_one = int_lit(d, -1);
                format!(
                    "    // 1 / a^|b| truncated: only a = 1 and a = -1 give a nonzero result.
    if b < {zero} {{
        if a == {one} {{
            return {one};
        }}
        if a == {minus_one} {{
            return select({one}, {minus_one}, (b & {one}) != {zero});
        }}
        return {zero};
    }}
"
                )
            } else {
                String::new()
            };
            let (e_t, e_init, e_one, e_zero) = if d.bits() > 32 {
                ("u64", "bitcast<u64>(b)", "1lu", "0lu")
            } else {
                ("u32", "bitcast<u32>(b)", "1u", "0u")
            };
            format!(
                "fn {name}(a: {t}, b: {t}) -> {t} {{
{negative}    // Square and multiply, wrapping.
    var base = a;
    var result = {one};
    var e: {e_t} = {e_init};
    while e != {e_zero} {{
        if (e & {e_one}) != {e_zero} {{
            result = result * base;
        }}
        base = base * base;
        e = e >> 1u;
    }}
    return result;
}}
"
            )
        }
        Helper::IntToFloat(from, to) => super::exact::int_to_float_definition(from, to),
        Helper::FloatToInt(from, to) => {
            let f = wgsl(from);
            let repr = super::ops::repr_dtype(to);
            let t = wgsl(repr);
            let suffix = if from == DType::F32 { "f" } else { "lf" };
            let bits = to.bits();
            // The bounds are powers of two, exact in both float types; values past them
            // saturate, and the conversion itself only sees values in range.
            let (low_test, low, high, convert) = if to.is_signed() {
                (
                    format!("x <= -{}.0{suffix}", 1u128 << (bits - 1)),
                    int_lit(repr, -(1i128 << (bits - 1))),
                    format!("{}.0{suffix}", 1u128 << (bits - 1)),
                    format!("{t}(x)"),
                )
            } else {
                (
                    format!("x <= -1.0{suffix}"),
                    int_lit(repr, 0),
                    format!("{}.0{suffix}", 1u128 << bits),
                    format!("{t}(max(x, 0.0{suffix}))"),
                )
            };
            let max = if to.is_signed() {
                int_lit(repr, (1i128 << (bits - 1)) - 1)
            } else {
                int_lit(repr, (1i128 << bits) - 1)
            };
            format!(
                "fn {name}(x: {f}) -> {t} {{
    if tsl_isnan_{from}(x) {{
        return {zero};
    }}
    if {low_test} {{
        return {low};
    }}
    if x >= {high} {{
        return {max};
    }}
    return {convert};
}}
",
                zero = int_lit(repr, 0),
            )
        }
    }
}
