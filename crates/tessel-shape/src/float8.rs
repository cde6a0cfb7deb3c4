//! The 8-bit float storage types, bit for bit as PyTorch defines them
//! (`c10/util/Float8_e4m3fn.h` and `Float8_e5m2.h`).
//!
//! - [`F8E4M3`] is `torch.float8_e4m3fn`: 1 sign, 4 exponent (bias 7) and 3 significand
//!   bits, no infinities; `S.1111.111` is NaN, so the largest finite value is 448. Rounding
//!   is to nearest even on a grid that continues past 448: a value whose magnitude rounds
//!   above 448 (anything above 464, and infinity) becomes NaN — PyTorch's `.to()` does not
//!   saturate.
//! - [`F8E5M2`] is `torch.float8_e5m2`: 1 sign, 5 exponent (bias 15) and 2 significand
//!   bits, IEEE-like (the top byte of an `f16`), with infinities and NaNs; the largest finite
//!   value is 57344, and values from 61440 up (the tie included) round to infinity.
//!
//! Both convert to `f32` exactly and from `f32` with one rounding to nearest even,
//! subnormals included; NaN stays NaN with its sign (as `0x7f`/`0xff`). The conversions are
//! written with integer operations only, the same algorithm generated kernels use.

use std::fmt;

/// Rounds the non-negative `f32` bit pattern `abs` (not NaN) to an 8-bit float with `m`
/// significand bits and exponent bias `bias`, to nearest even, giving the magnitude's bit
/// pattern; values past the largest encodable exponent come out past `0x7f`, and the caller
/// clamps them.
const fn round_f32_bits(abs: u32, m: u32, bias: u32) -> u32 {
    let exponent = abs >> 23;
    // Biased f32 exponent of the smallest normal value, 2^(1 - bias).
    let min_normal = 128 - bias;
    if exponent < min_normal {
        // Subnormal: the result is |x| / 2^(1 - bias - m) rounded to an integer (which may
        // be 2^m, the smallest normal, whose bit pattern is that same integer).
        let significand = if exponent == 0 {
            // f32 subnormals are far below half the smallest subnormal of either format.
            return 0;
        } else {
            (abs & 0x007f_ffff) | 0x0080_0000
        };
        // |x| = significand * 2^(exponent - 150), so the quotient is the significand
        // shifted right by this much (at least 21 for both formats).
        let shift = 151 - bias - m - exponent;
        if shift > 25 {
            // Below 2^-2 units of the last place: rounds to zero.
            return 0;
        }
        let quotient = significand >> shift;
        let rest = significand & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        if rest > half || (rest == half && quotient & 1 == 1) {
            quotient + 1
        } else {
            quotient
        }
    } else {
        // Normal: rebias the exponent and round the significand, ties to even; a carry
        // out of the significand correctly bumps the exponent.
        let drop = 23 - m;
        let rebased = abs - ((127 - bias) << 23);
        let odd = (rebased >> drop) & 1;
        (rebased + (1 << (drop - 1)) - 1 + odd) >> drop
    }
}

/// PyTorch's `torch.float8_e4m3fn`, held as its bit pattern.
///
/// Equality is bitwise (like [`Scalar`](crate::Scalar)'s): `+0 != -0` and a NaN equals
/// itself.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct F8E4M3(u8);

/// PyTorch's `torch.float8_e5m2`, held as its bit pattern.
///
/// Equality is bitwise (like [`Scalar`](crate::Scalar)'s): `+0 != -0` and a NaN equals
/// itself.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct F8E5M2(u8);

impl F8E4M3 {
    /// The largest finite value, 448.
    pub const MAX: Self = Self(0x7e);
    /// The lowest finite value, -448.
    pub const MIN: Self = Self(0xfe);
    /// The NaN PyTorch produces (`0x7f`).
    pub const NAN: Self = Self(0x7f);

    /// The value with bit pattern `bits`.
    pub const fn from_bits(bits: u8) -> Self {
        Self(bits)
    }

    /// The bit pattern.
    pub const fn to_bits(self) -> u8 {
        self.0
    }

    /// `x` rounded to nearest even; NaN, infinities and magnitudes above 464 give NaN (of
    /// `x`'s sign), exactly like PyTorch's conversion.
    pub const fn from_f32(x: f32) -> Self {
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let abs = bits & 0x7fff_ffff;
        // 480 = 2^8 * 1.875, the first value past the grid's top: NaN from there on (and
        // for infinities and NaNs); below it, rounding yields at most 0x7f, which is NaN.
        let magnitude = if abs >= 0x43f0_0000 {
            0x7f
        } else {
            round_f32_bits(abs, 3, 7) as u8
        };
        Self(magnitude | sign)
    }

    /// `x` rounded once to nearest even (through `f32` rounded to odd, which makes the
    /// second rounding exact).
    pub fn from_f64(x: f64) -> Self {
        Self::from_f32(crate::scalar::f64_to_f32_round_to_odd(x))
    }

    /// The value as an `f32`, exactly (NaN as a quiet NaN of the same sign).
    pub const fn to_f32(self) -> f32 {
        let sign = ((self.0 & 0x80) as u32) << 24;
        let exponent = ((self.0 >> 3) & 0xf) as u32;
        let significand = (self.0 & 0x7) as u32;
        let magnitude = if exponent == 0xf && significand == 0x7 {
            0x7fc0_0000
        } else if exponent == 0 {
            if significand == 0 {
                0
            } else {
                // significand * 2^-9: normalize so the leading one becomes implicit.
                let lead = significand.ilog2();
                ((127 - 9 + lead) << 23) | ((significand & !(1 << lead)) << (23 - lead))
            }
        } else {
            ((exponent + 120) << 23) | (significand << 20)
        };
        f32::from_bits(sign | magnitude)
    }

    /// The value as an `f64`, exactly.
    pub fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }

    /// Whether the value is NaN.
    pub const fn is_nan(self) -> bool {
        self.0 & 0x7f == 0x7f
    }
}

impl F8E5M2 {
    /// The largest finite value, 57344.
    pub const MAX: Self = Self(0x7b);
    /// The lowest finite value, -57344.
    pub const MIN: Self = Self(0xfb);
    /// Positive infinity.
    pub const INFINITY: Self = Self(0x7c);
    /// The NaN PyTorch produces (`0x7f`).
    pub const NAN: Self = Self(0x7f);

    /// The value with bit pattern `bits`.
    pub const fn from_bits(bits: u8) -> Self {
        Self(bits)
    }

    /// The bit pattern.
    pub const fn to_bits(self) -> u8 {
        self.0
    }

    /// `x` rounded to nearest even; magnitudes from 61440 up overflow to infinity and NaN
    /// stays NaN (`0x7f` with `x`'s sign), exactly like PyTorch's conversion.
    pub const fn from_f32(x: f32) -> Self {
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let abs = bits & 0x7fff_ffff;
        let magnitude = if abs > 0x7f80_0000 {
            0x7f
        } else if abs >= 0x4780_0000 {
            // 65536 and up, infinity included: past the top of the grid.
            0x7c
        } else {
            // At most 0x7c (infinity), reached by rounding up from 61440.
            round_f32_bits(abs, 2, 15) as u8
        };
        Self(magnitude | sign)
    }

    /// `x` rounded once to nearest even (through `f32` rounded to odd, which makes the
    /// second rounding exact).
    pub fn from_f64(x: f64) -> Self {
        Self::from_f32(crate::scalar::f64_to_f32_round_to_odd(x))
    }

    /// The value as an `f32`, exactly (NaN as a quiet NaN of the same sign).
    pub const fn to_f32(self) -> f32 {
        let sign = ((self.0 & 0x80) as u32) << 24;
        let exponent = ((self.0 >> 2) & 0x1f) as u32;
        let significand = (self.0 & 0x3) as u32;
        let magnitude = if exponent == 0x1f {
            if significand == 0 {
                0x7f80_0000
            } else {
                0x7fc0_0000
            }
        } else if exponent == 0 {
            if significand == 0 {
                0
            } else {
                // significand * 2^-16.
                let lead = significand.ilog2();
                ((127 - 16 + lead) << 23) | ((significand & !(1 << lead)) << (23 - lead))
            }
        } else {
            ((exponent + 112) << 23) | (significand << 21)
        };
        f32::from_bits(sign | magnitude)
    }

    /// The value as an `f64`, exactly.
    pub fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }

    /// Whether the value is NaN.
    pub const fn is_nan(self) -> bool {
        self.0 & 0x7f > 0x7c
    }

    /// Whether the value is an infinity of either sign.
    pub const fn is_infinite(self) -> bool {
        self.0 & 0x7f == 0x7c
    }
}

impl fmt::Debug for F8E4M3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_f32(), f)
    }
}

impl fmt::Display for F8E4M3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_f32(), f)
    }
}

impl fmt::Debug for F8E5M2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_f32(), f)
    }
}

impl fmt::Display for F8E5M2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_f32(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::{F8E4M3, F8E5M2};

    #[test]
    fn known_values() {
        assert_eq!(F8E4M3::MAX.to_f32(), 448.0);
        assert_eq!(F8E4M3::from_bits(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(F8E4M3::from_bits(0x08).to_f32(), 2f32.powi(-6));
        assert_eq!(F8E4M3::from_f32(464.0), F8E4M3::MAX);
        assert!(F8E4M3::from_f32(464.5).is_nan());
        assert!(F8E4M3::from_f32(f32::INFINITY).is_nan());
        assert_eq!(F8E4M3::from_f32(-0.0).to_bits(), 0x80);
        assert_eq!(F8E5M2::MAX.to_f32(), 57344.0);
        assert_eq!(F8E5M2::from_bits(0x01).to_f32(), 2f32.powi(-16));
        assert_eq!(F8E5M2::from_f32(61439.0), F8E5M2::MAX);
        assert_eq!(F8E5M2::from_f32(61440.0), F8E5M2::INFINITY);
        assert_eq!(F8E5M2::from_f32(f32::NAN).to_bits(), 0x7f);
        // Ties to even in the subnormal range: 1.5 and 2.5 units of 2^-9.
        assert_eq!(F8E4M3::from_f32(1.5 * 2f32.powi(-9)).to_bits(), 0x02);
        assert_eq!(F8E4M3::from_f32(2.5 * 2f32.powi(-9)).to_bits(), 0x02);
        assert_eq!(F8E4M3::from_f32(0.5 * 2f32.powi(-9)).to_bits(), 0x00);
        assert_eq!(F8E4M3::from_f32(0.51 * 2f32.powi(-9)).to_bits(), 0x01);
    }

    #[test]
    fn every_pattern_round_trips() {
        for bits in 0..=255u8 {
            let a = F8E4M3::from_bits(bits);
            if !a.is_nan() {
                assert_eq!(F8E4M3::from_f32(a.to_f32()), a, "e4m3 {bits:#04x}");
            }
            let b = F8E5M2::from_bits(bits);
            if !b.is_nan() {
                assert_eq!(F8E5M2::from_f32(b.to_f32()), b, "e5m2 {bits:#04x}");
                // e5m2 is the top byte of an f16.
                let half = half::f16::from_bits(u16::from(bits) << 8).to_f32();
                assert_eq!(b.to_f32().to_bits(), half.to_bits(), "e5m2 {bits:#04x}");
            }
        }
    }
}
