//! `sin`, `cos` and `tan` on `f32` in the shader (WGSL's built-ins are bounded only by an
//! absolute 2^-11 on [-π, π], and lavapipe's are wrong past |x| = 2^23).
//!
//! The argument is reduced by π/2 with a Payne–Hanek reduction done entirely in 32-bit
//! integer arithmetic, for every |x| > π/4: the 24-bit significand times the 192 bits of
//! 2/π (as in CUDA's slow path and fdlibm's `__kernel_rem_pio2`, with 32-bit words), from
//! which the two quadrant bits and 64 fraction bits are taken, and the fraction times π/2
//! (64 bits) in fixed point. The reduced argument comes back as `hi + lo` (24 + 32
//! significant bits), so no float rounding happens before the polynomials, and there is no
//! float error-free transformation a compiler could contract or rewrite. The polynomials
//! on [-π/4, π/4] are Cephes' single-precision ones (`sinf.c`, `cosf.c`, `tanf.c`, peak
//! relative error below 1e-7), with first-order corrections for `lo`.

/// `a * b` as 64 bits: `(low word, high word)`.
pub(super) const MUL_WIDE: &str = "fn tsl_mul_wide(a: u32, b: u32) -> vec2<u32> {
    let al = a & 0xffffu;
    let ah = a >> 16u;
    let bl = b & 0xffffu;
    let bh = b >> 16u;
    let ll = al * bl;
    let lh = al * bh;
    let hl = ah * bl;
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    return vec2<u32>((ll & 0xffffu) | (mid << 16u), ah * bh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u));
}
";

/// `|x|` (its bits, finite, above π/4) as `n * π/2 + hi + lo` modulo 2π: `(hi, lo, n)`,
/// `|hi + lo| <= π/4`, `n` in 0..4.
pub(super) const TRIG_REDUCE: &str = "fn tsl_trig_reduce_f32(ax: u32) -> vec3<f32> {
    // The significand, shifted to the top: |x| = m * 2^(e - 158), e the biased exponent.
    let m = ((ax & 0x7fffffu) | 0x800000u) << 8u;
    // r = m * (the first 192 bits of 2/pi, 0xa2f9836e 4e441529 ... as an integer), so that
    // |x| * 2/pi = r * 2^(e - 350), less than 2^-64 off.
    var r: array<u32, 9>;
    var p = tsl_mul_wide(m, 0x3c439041u);
    r[0] = p.x;
    var carry = p.y;
    p = tsl_mul_wide(m, 0xdb629599u);
    r[1] = p.x + carry;
    carry = p.y + select(0u, 1u, r[1] < carry);
    p = tsl_mul_wide(m, 0xf534ddc0u);
    r[2] = p.x + carry;
    carry = p.y + select(0u, 1u, r[2] < carry);
    p = tsl_mul_wide(m, 0xfc2757d1u);
    r[3] = p.x + carry;
    carry = p.y + select(0u, 1u, r[3] < carry);
    p = tsl_mul_wide(m, 0x4e441529u);
    r[4] = p.x + carry;
    carry = p.y + select(0u, 1u, r[4] < carry);
    p = tsl_mul_wide(m, 0xa2f9836eu);
    r[5] = p.x + carry;
    r[6] = p.y + select(0u, 1u, r[5] < carry);
    r[7] = 0u;
    r[8] = 0u;
    // Bits s + 64 up of r are the integer part (only its low two bits matter), bits s to
    // s + 63 the fraction: s = 350 - e - 64, from 32 (e = 254) to 160 (e = 126).
    let s = 286u - (ax >> 23u);
    let q = s >> 5u;
    let b = s & 31u;
    var w0 = r[q];
    var w1 = r[q + 1u];
    var w2 = r[q + 2u];
    if b != 0u {
        w0 = (w0 >> b) | (w1 << (32u - b));
        w1 = (w1 >> b) | (w2 << (32u - b));
        w2 = (w2 >> b) | (r[q + 3u] << (32u - b));
    }
    // A fraction of 1/2 or more counts as the next quadrant minus the rest.
    var n = w2;
    var gh = w1;
    var gl = w0;
    var neg = 0u;
    if (gh & 0x80000000u) != 0u {
        n = n + 1u;
        gl = ~gl + 1u;
        gh = ~gh + select(0u, 1u, gl == 0u);
        neg = 0x80000000u;
    }
    // Normalize the fraction g * 2^-64 (it is never 0, and at least 2^-40 or so for f32).
    var sh = 0u;
    if gh == 0u {
        gh = gl;
        gl = 0u;
        sh = 32u;
    }
    let c = countLeadingZeros(gh);
    if c != 0u {
        gh = (gh << c) | (gl >> (32u - c));
        gl = gl << c;
    }
    sh = sh + c;
    // Times pi/2 = 0xc90fdaa2_2168c234 * 2^-63: the top 64 bits y of the product (the
    // dropped low products are below 2^-94 of it), the result being y * 2^(-63 - sh).
    let a = tsl_mul_wide(gh, 0xc90fdaa2u);
    let bm = tsl_mul_wide(gh, 0x2168c234u);
    let d = tsl_mul_wide(gl, 0xc90fdaa2u);
    let t = bm.x + d.x;
    let m1 = a.x + bm.y;
    let m2 = m1 + d.y;
    var yl = m2 + select(0u, 1u, t < bm.x);
    var yh = a.y + select(0u, 1u, m1 < a.x) + select(0u, 1u, m2 < m1) + select(0u, 1u, yl < m2);
    var ex = sh;
    if (yh & 0x80000000u) == 0u {
        yh = (yh << 1u) | (yl >> 31u);
        yl = yl << 1u;
        ex = sh + 1u;
    }
    // The top 24 bits exactly, the next 32 rounded (a power of two times an integer).
    let hi = bitcast<f32>(neg | ((127u - ex) << 23u) | ((yh >> 8u) & 0x7fffffu));
    let rest = ((yh & 0xffu) << 24u) | (yl >> 8u);
    let lo = bitcast<f32>(neg | ((72u - min(ex, 71u)) << 23u)) * f32(rest);
    return vec3<f32>(hi, lo, f32(n & 3u));
}
";

/// The common start of `sin`, `cos` and `tan`: NaN for NaN and the infinities, `small`
/// below |x| = 2^-12 (where the function rounds to `x` or 1), else the reduction.
fn prologue(small: &str) -> String {
    format!(
        "    let ix = bitcast<u32>(x);
    let ax = ix & 0x7fffffffu;
    if ax >= 0x7f800000u {{
        return bitcast<f32>(ix | 0x7fc00000u);
    }}
    if ax < 0x39800000u {{
        return {small};
    }}
    var hi = bitcast<f32>(ax);
    var lo = 0.0f;
    var n = 0u;
    if ax > 0x3f490fdbu {{
        let red = tsl_trig_reduce_f32(ax);
        hi = red.x;
        lo = red.y;
        n = u32(red.z);
    }}
    let z = hi * hi;
    // Cephes' sinf and cosf on [-pi/4, pi/4], plus the first-order terms of lo.
    let sin_r = hi + (lo * (1.0f - 0.5f * z) + hi * z * ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f));
    let cos_r = 1.0f + (((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z - 0.5f * z - hi * lo);
"
    )
}

/// `sin` on `f32`.
pub(super) fn sin() -> String {
    format!(
        "fn tsl_sin_f32(x: f32) -> f32 {{
{}    // sin, cos, -sin, -cos by quadrant; odd in x.
    let y = select(sin_r, cos_r, (n & 1u) != 0u);
    return bitcast<f32>(bitcast<u32>(y) ^ ((n & 2u) << 30u) ^ (ix & 0x80000000u));
}}
",
        prologue("x")
    )
}

/// `cos` on `f32`.
pub(super) fn cos() -> String {
    format!(
        "fn tsl_cos_f32(x: f32) -> f32 {{
{}    // cos, -sin, -cos, sin by quadrant; even in x.
    let y = select(cos_r, sin_r, (n & 1u) != 0u);
    return bitcast<f32>(bitcast<u32>(y) ^ (((n + 1u) & 2u) << 30u));
}}
",
        prologue("1.0f")
    )
}

/// `tan` on `f32`.
pub(super) fn tan() -> String {
    let p = prologue("x");
    // Only the tangent's polynomial is needed here.
    let p = p
        .lines()
        .filter(|l| !l.contains("sin_r") && !l.contains("cos_r") && !l.contains("Cephes"))
        .collect::<Vec<_>>()
        .join("\n");
    format!(
        "fn tsl_tan_f32(x: f32) -> f32 {{
{p}
    // Cephes' tanf on [-pi/4, pi/4] plus lo * (1 + tan^2); -1/tan in the odd quadrants.
    var t = hi + (lo * (1.0f + z) + hi * z * (((((9.38540185543e-3f * z + 3.11992232697e-3f) * z + 2.44301354525e-2f) * z + 5.34112807005e-2f) * z + 1.33387994085e-1f) * z + 3.33331568548e-1f));
    if (n & 1u) != 0u {{
        t = -1.0f / t;
    }}
    return bitcast<f32>(bitcast<u32>(t) ^ (ix & 0x80000000u));
}}
"
    )
}
