//! Helpers that are exact because they work on the bits: integer-to-float conversions
//! rounded to nearest even, the `f64` to `f32` narrowing (subnormals included), musl's
//! `fmod`, and rounding to an integral value (`floor`, `ceil`, `round`, `trunc`). WGSL
//! leaves all of them to the implementation's rounding or precision.

use tessel_shape::{DType, UnaryOp};

use super::helpers::{Helper, wgsl};

/// `tsl_<from>_to_<to>`: an integer to a float, rounded to nearest even on the bits
/// (WGSL lets an implementation round a conversion either way).
pub(super) fn int_to_float_definition(from: DType, to: DType) -> String {
    let name = Helper::IntToFloat(from, to).name();
    let f = wgsl(from);
    let t = wgsl(to);
    if from.is_signed() {
        // Through the magnitude, whose wrapping negation is right for MIN too.
        let (u, unsigned, zero) = if from == DType::I64 {
            ("u64", DType::U64, "0li")
        } else {
            ("u32", DType::U32, "0i")
        };
        let inner = Helper::IntToFloat(unsigned, to).name();
        return format!(
            "fn {name}(x: {f}) -> {t} {{
    let magnitude = {inner}(select(bitcast<{u}>(x), {zero_u} - bitcast<{u}>(x), x < {zero}));
    return select(magnitude, -magnitude, x < {zero});
}}
",
            zero_u = if from == DType::I64 { "0lu" } else { "0u" },
        );
    }
    // Keep `p` significant bits (24 or 53), round the rest away to nearest even.
    let (p, bias, bits_t, bits_lit) = if to == DType::F32 {
        (24u32, 127u32, "u32", "u")
    } else {
        (53, 1023, "u64", "lu")
    };
    let (width, lit, clz) = if from == DType::U64 {
        (
            64u32,
            "lu",
            "select(32u + countLeadingZeros(u32(x)), countLeadingZeros(u32(x >> 32u)), (x >> 32u) != 0lu)",
        )
    } else {
        (32, "u", "countLeadingZeros(x)")
    };
    let exact = format!("{t}(x)");
    if width <= p {
        return format!("fn {name}(x: {f}) -> {t} {{\n    return {exact};\n}}\n");
    }
    let mantissa_bits = p - 1;
    format!(
        "fn {name}(x: {f}) -> {t} {{
    if x < (1{lit} << {p}u) {{
        return {exact};
    }}
    // Drop the bits below the {p} most significant ones, rounding to nearest even.
    let shift = {drop}u - {clz};
    let kept = x >> shift;
    let rest = x & ((1{lit} << shift) - 1{lit});
    let half = 1{lit} << (shift - 1u);
    let up = rest > half || (rest == half && (kept & 1{lit}) != 0{lit});
    // The exponent field plus the fraction; a carry out of the fraction bumps the exponent.
    let bits = ({bits_t}({bias}u + {mantissa_bits}u + shift) << {mantissa_bits}u) + ({bits_t}(kept) - (1{bits_lit} << {mantissa_bits}u)) + select(0{bits_lit}, 1{bits_lit}, up);
    return bitcast<{t}>(bits);
}}
",
        drop = width - p,
    )
}

/// `tsl_f64_to_f32` (nearest even) or `tsl_f64_to_f32_odd` (to odd), on the bits: exact
/// for every input, subnormal results included, on devices that flush those in `f32(x)`.
pub(super) fn f64_to_f32_definition(helper: Helper) -> String {
    let name = helper.name();
    let odd = helper == Helper::F64ToF32Odd;
    let (overflow, underflow, round) = if odd {
        (
            // Past the top of the range: the largest finite f32, whose significand is odd.
            "sign | 0x7f7fffffu",
            // Below half the smallest subnormal: zero if x is zero, else the smallest
            // subnormal (odd).
            "sign | select(0u, 1u, (b << 1u) != 0lu)",
            "    // Truncated, with the last bit set when inexact (rounding to odd).
    return bitcast<f32>(sign | kept | select(0u, 1u, rest != 0lu));",
        )
    } else {
        (
            "sign | 0x7f800000u",
            "sign",
            "    // Round to nearest even; a carry runs into the exponent (up to infinity).
    let half = 1lu << (shift - 1u);
    let up = rest > half || (rest == half && (kept & 1u) != 0u);
    return bitcast<f32>(sign | (kept + select(0u, 1u, up)));",
        )
    };
    format!(
        "fn {name}(x: f64) -> f32 {{
    let b = bitcast<u64>(x);
    let sign = u32(b >> 32u) & 0x80000000u;
    let e = i32(u32(b >> 52u) & 0x7ffu);
    let man = b & 0x000ffffffffffffflu;
    if e == 0x7ffi {{
        // Infinity, or a quiet NaN keeping the payload's top bits.
        return bitcast<f32>(sign | 0x7f800000u | select(0u, 0x00400000u | u32(man >> 29u), man != 0lu));
    }}
    // The f32 exponent field the value would have, unbounded.
    let e32 = e - 896i;
    if e32 >= 0xffi {{
        return bitcast<f32>({overflow});
    }}
    if e32 < -24i {{
        return bitcast<f32>({underflow});
    }}
    // The significand with its implicit bit (x is normal here), shifted down to the 24
    // bits of a normal result, or fewer for a subnormal one; then the exponent field
    // above (the implicit bit of a normal result adds 1 to it).
    let sig = man | 0x0010000000000000lu;
    let shift = u32(29i + max(1i - e32, 0i));
    let rest = sig & ((1lu << shift) - 1lu);
    let kept = u32(sig >> shift) + select(0u, u32(e32 - 1i) << 23u, e32 >= 1i);
{round}
}}
"
    )
}

/// musl's `fmod` on the bits, exact for every input.
pub(super) fn fmod_definition(d: DType) -> String {
    let name = Helper::Fmod(d).name();
    // (float type, bits type, literal suffix, exponent shift, exponent mask, the implicit
    // bit, the fraction mask, the sign bit, quiet NaN)
    let (t, u, s, shift, emask, implicit, fraction, sign, nan) = if d == DType::F64 {
        (
            "f64",
            "u64",
            "lu",
            52u32,
            "0x7ffu",
            "0x10000000000000lu",
            "0xffffffffffffflu",
            "0x8000000000000000lu",
            "0x7ff8000000000000lu",
        )
    } else {
        (
            "f32",
            "u32",
            "u",
            23,
            "0xffu",
            "0x800000u",
            "0x7fffffu",
            "0x80000000u",
            "0x7fc00000u",
        )
    };
    let top = if d == DType::F64 { 63 } else { 31 };
    let emax = if d == DType::F64 { "0x7ffi" } else { "0xffi" };
    let width = top + 1;
    format!(
        "fn {name}(x: {t}, y: {t}) -> {t} {{
    // musl's fmod: the exact remainder, by long division of the significands.
    let xi = bitcast<{u}>(x);
    let yi = bitcast<{u}>(y);
    var ex = i32(u32(xi >> {shift}u) & {emask});
    var ey = i32(u32(yi >> {shift}u) & {emask});
    let sx = xi & {sign};
    if (yi << 1u) == 0{s} || tsl_isnan_{d}(y) || ex == {emax} {{
        return bitcast<{t}>({nan});
    }}
    if (xi << 1u) <= (yi << 1u) {{
        if (xi << 1u) == (yi << 1u) {{
            return bitcast<{t}>(sx);
        }}
        return x;
    }}
    var ux: {u};
    var uy: {u};
    // Normalize both significands, leading 1 at bit {shift}.
    if ex == 0i {{
        var i = xi << {ebits}u;
        while (i >> {top}u) == 0{s} {{
            ex -= 1i;
            i = i << 1u;
        }}
        ux = xi << u32(1i - ex);
    }} else {{
        ux = (xi & {fraction}) | {implicit};
    }}
    if ey == 0i {{
        var i = yi << {ebits}u;
        while (i >> {top}u) == 0{s} {{
            ey -= 1i;
            i = i << 1u;
        }}
        uy = yi << u32(1i - ey);
    }} else {{
        uy = (yi & {fraction}) | {implicit};
    }}
    for (; ex > ey; ex -= 1i) {{
        let i = ux - uy;
        if (i >> {top}u) == 0{s} {{
            if i == 0{s} {{
                return bitcast<{t}>(sx);
            }}
            ux = i;
        }}
        ux = ux << 1u;
    }}
    let i = ux - uy;
    if (i >> {top}u) == 0{s} {{
        if i == 0{s} {{
            return bitcast<{t}>(sx);
        }}
        ux = i;
    }}
    while (ux >> {shift}u) == 0{s} {{
        ux = ux << 1u;
        ex -= 1i;
    }}
    if ex > 0i {{
        ux = (ux - {implicit}) | ({u}(u32(ex)) << {shift}u);
    }} else {{
        ux = ux >> u32(1i - ex);
    }}
    return bitcast<{t}>(ux | sx);
}}
",
        ebits = width - shift,
    )
}

/// `tsl_<op>_<d>`: `floor`, `ceil`, `round` (half to even) or `trunc` on the bits. The
/// result keeps the operand's sign (`round(-0.3)` is -0), which lavapipe's built-ins drop,
/// and on a CPU without AVX-512 lavapipe's `f64` `round` and `trunc` also return operands of
/// 2^23 and more unchanged, fraction included.
pub(super) fn integral_definition(op: UnaryOp, d: DType) -> String {
    let name = Helper::Integral(op, d).name();
    // (float type, bits type, literal suffix, fraction bits, exponent bias, exponent mask,
    // the sign bit, the bits of 1.0, the bits of 0.5)
    let (t, u, s, m, bias, emask, sign, one, half) = if d == DType::F64 {
        (
            "f64",
            "u64",
            "lu",
            52,
            1023,
            "0x7ffu",
            "0x8000000000000000lu",
            "0x3ff0000000000000lu",
            "0x3fe0000000000000lu",
        )
    } else {
        (
            "f32",
            "u32",
            "u",
            23,
            127,
            "0xffu",
            "0x80000000u",
            "0x3f800000u",
            "0x3f000000u",
        )
    };
    // The result below 1 in magnitude (`a` the magnitude's bits), and whether the truncated
    // magnitude `t` (at least 1) goes up by one: `unit` is 1's place, `f` the nonzero
    // fraction's bits.
    let (small, up) = match op {
        UnaryOp::Floor => (
            format!("select(sign, sign | {one}, sign != 0{s} && a != 0{s})"),
            format!("sign != 0{s}"),
        ),
        UnaryOp::Ceil => (
            format!("select(sign, {one}, sign == 0{s} && a != 0{s})"),
            format!("sign == 0{s}"),
        ),
        UnaryOp::Round => (
            format!("select(sign, sign | {one}, a > {half})"),
            format!("f > (unit >> 1u) || (f == (unit >> 1u) && (t & unit) != 0{s})"),
        ),
        _ => ("sign".to_owned(), "false".to_owned()),
    };
    format!(
        "fn {name}(x: {t}) -> {t} {{
    let b = bitcast<{u}>(x);
    let sign = b & {sign};
    let a = b ^ sign;
    let e = i32(u32(b >> {m}u) & {emask}) - {bias}i;
    if e >= {m}i {{
        // Integral already, or infinite, or NaN.
        return x;
    }}
    if e < 0i {{
        return bitcast<{t}>({small});
    }}
    let unit = 1{s} << u32({m}i - e);
    let f = b & (unit - 1{s});
    if f == 0{s} {{
        return x;
    }}
    let t = b ^ f;
    // Adding `unit` to the bits adds one to the magnitude (a carry moves into the exponent).
    return bitcast<{t}>(select(t, t + unit, {up}));
}}
"
    )
}
