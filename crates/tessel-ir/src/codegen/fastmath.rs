//! Branch-free `float` transcendentals for the C dialect
//! ([`CStyle::own_f32_math`](super::CStyle::own_f32_math)).
//!
//! The math library's `expf`, `logf` and `tanhf` are scalar calls, so a loop that calls
//! them never vectorizes: a fused chain with a sigmoid and a tanh ran at a twentieth of
//! the memory bandwidth. These functions are straight-line arithmetic, bit moves and
//! selects, which GCC and Clang turn into SIMD at `-O3` (with `-fno-trapping-math`, so
//! both arms of a select may be computed). Every special value is exact (NaN, ±inf, ±0,
//! overflow to inf, underflow through the subnormals, `exp2` of an integer, `log2` of a
//! power of two); elsewhere the results are within these bounds of the exact value,
//! checked over every 7th `float` bit pattern against glibc's `double` functions:
//!
//! | function | algorithm | worst error |
//! |---|---|---|
//! | `exp` | Cody–Waite reduction by `ln 2`, degree-7 polynomial (SLEEF's `expf` coefficients), `2^k` applied in two halves | 0.95 ulp |
//! | `exp2` | `r = x - rint(x)`, the same polynomial at `r ln 2` | 0.97 ulp |
//! | `log` | fdlibm's `logf` reduction to `[√2/2, √2)` and its polynomial in `s = f / (2 + f)` | 0.82 ulp |
//! | `log2` | the same `log(m)` times `log2 e`, plus the exponent | 1.8 ulp |
//! | `tanh` | `|x| < 0.625`: odd polynomial (minimax fit, degree 9); else `1 - 2 / (e^{2|x|} + 1)` | 1.3 ulp |
//!
//! A value's evaluation order is fixed by the source (`-ffp-contract=off`), so a kernel
//! computes the same bits on every run, whichever width the compiler vectorizes with.

use super::helpers::Helper;

/// The transcendental each helper computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Fast {
    /// `e^r · 2^k` for `|r| ≤ ln2 / 2`, `k` in `[-151, 128]`: what `exp` and `exp2` share.
    ExpScaled,
    Exp,
    Exp2,
    Log,
    Log2,
    Tanh,
}

impl Fast {
    pub(super) fn name(self) -> &'static str {
        match self {
            Fast::ExpScaled => "tsl_expf_scaled",
            Fast::Exp => "tsl_expf",
            Fast::Exp2 => "tsl_exp2f",
            Fast::Log => "tsl_logf",
            Fast::Log2 => "tsl_log2f",
            Fast::Tanh => "tsl_tanhf",
        }
    }

    /// The helpers this one calls.
    pub(super) fn deps(self) -> Vec<Helper> {
        use tessel_shape::DType::{F32, U32};
        let bits = [Helper::Bitcast(F32, U32), Helper::Bitcast(U32, F32)];
        match self {
            Fast::ExpScaled => vec![bits[1]],
            Fast::Exp | Fast::Exp2 => vec![Helper::Fast(Fast::ExpScaled)],
            Fast::Tanh => vec![Helper::Fast(Fast::Exp)],
            Fast::Log | Fast::Log2 => bits.to_vec(),
        }
    }

    /// The C definition, for `prefix` (`static inline `).
    pub(super) fn definition(self, p: &str) -> String {
        let name = self.name();
        match self {
            Fast::ExpScaled => format!(
                "{p}float {name}(float r, int32_t k) {{
    float u = 1.98527617612853646278381e-4f;
    u = u * r + 1.39304355252534151077271e-3f;
    u = u * r + 8.33336077630519866943359e-3f;
    u = u * r + 4.16664853692054748535156e-2f;
    u = u * r + 1.66666671633720397949219e-1f;
    u = u * r + 0.5f;
    const float e = 1.0f + (r + (r * r) * u);
    /* 2^k in two factors, each a normal float, so that a subnormal result rounds once. */
    const int32_t k1 = k >> 1;
    const int32_t k2 = k - k1;
    return e * tsl_bitcast_u32_f32((uint32_t)(k1 + 127) << 23)
        * tsl_bitcast_u32_f32((uint32_t)(k2 + 127) << 23);
}}
"
            ),
            Fast::Exp => format!(
                "{p}float {name}(float x) {{
    const float c = x > 88.8f ? 88.8f : (x < -104.0f ? -104.0f : (x == x ? x : 0.0f));
    /* rint(c / ln2) by the 1.5 * 2^23 trick; ln2 in two parts, the first exact in n * hi. */
    const float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (c - n * 0.693145751953125f) - n * 1.428606765330187045e-6f;
    const float y = tsl_expf_scaled(r, (int32_t)n);
    return x != x ? x : (x < -104.0f ? 0.0f : y);
}}
"
            ),
            Fast::Exp2 => format!(
                "{p}float {name}(float x) {{
    const float c = x > 128.5f ? 128.5f : (x < -151.0f ? -151.0f : (x == x ? x : 0.0f));
    const float n = (c + 12582912.0f) - 12582912.0f;
    const float y = tsl_expf_scaled((c - n) * 0.693147180559945309f, (int32_t)n);
    return x != x ? x : (x < -151.0f ? 0.0f : y);
}}
"
            ),
            Fast::Log | Fast::Log2 => {
                let result = if self == Fast::Log {
                    "k * 6.9313812256e-01f - ((hfsq - (tail + k * 9.0580006145e-06f)) - f)"
                } else {
                    "k + (f - (hfsq - tail)) * 1.44269504088896341f"
                };
                format!(
                    "{p}float {name}(float x) {{
    /* Subnormals are scaled by 2^25 first. */
    const int32_t sub = tsl_bitcast_f32_u32(x) < 0x00800000u;
    const uint32_t ix = tsl_bitcast_f32_u32(x * tsl_bitcast_u32_f32((uint32_t)(127 + 25 * sub) << 23));
    /* x = 2^k * (1 + f) with 1 + f in [sqrt(2)/2, sqrt(2)); f is exact. */
    const uint32_t m = ix & 0x007fffffu;
    const uint32_t i = (m + 0x4afb20u) & 0x800000u;
    const float k = (float)((int32_t)((ix >> 23) & 0xffu) - 127 - 25 * sub + (int32_t)(i >> 23));
    const float f = tsl_bitcast_u32_f32(m | (i ^ 0x3f800000u)) - 1.0f;
    const float s = f / (2.0f + f);
    const float z = s * s;
    const float w = z * z;
    const float big_r = z * (0.66666662693f + w * 0.28498786688f) + w * (0.40000972152f + w * 0.24279078841f);
    const float hfsq = 0.5f * f * f;
    const float tail = s * (hfsq + big_r);
    /* Each special case is a select of its own: chained ones defeat if-conversion. */
    float y = {result};
    y = x == INFINITY ? x : y;
    y = x == 0.0f ? -INFINITY : y;
    y = x < 0.0f ? NAN : y;
    return x != x ? x : y;
}}
"
                )
            }
            Fast::Tanh => format!(
                "{p}float {name}(float x) {{
    const float a = fabsf(x);
    const float z = a * a;
    float q = -5.787819624e-03f;
    q = q * z + 2.071170509e-02f;
    q = q * z - 5.376138538e-02f;
    q = q * z + 1.333169192e-01f;
    q = q * z - 3.333328962e-01f;
    const float small = a + a * (z * q);
    /* tanh is 1 in float beyond 9.01. */
    const float e = tsl_expf(2.0f * (a > 10.0f ? 10.0f : a));
    const float large = 1.0f - 2.0f / (e + 1.0f);
    const float t = a < 0.625f ? small : large;
    return x != x ? x : copysignf(t, x);
}}
"
            ),
        }
    }
}
