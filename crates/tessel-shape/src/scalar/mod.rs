//! One typed value, and the definition of what every op computes on it.
//!
//! [`Scalar`] is the reference semantics of Tessel: constant folding calls
//! [`Scalar::unary`], [`Scalar::binary`], [`Scalar::ternary`] and [`Scalar::cast`] directly,
//! the reference interpreter calls them per element, and every backend's generated code must
//! agree with them bit for bit (NaN payloads aside). The op table
//! ([`UnaryOp::supports`](crate::UnaryOp::supports),
//! [`BinaryOp::result_dtype`](crate::BinaryOp::result_dtype), ...) lives in `eval`, next to
//! the semantics it describes.

mod erf;
mod eval;

pub use erf::erf;

use std::fmt;
use std::hash::{Hash, Hasher};

use half::{bf16, f16};

use crate::{DType, F8E4M3, F8E5M2};

/// One value of one [`DType`].
///
/// Equality and hashing are **bitwise**: two scalars are equal when they have the same dtype
/// and the same bit pattern. So `F32(NaN) == F32(NaN)` (same payload), `F32(0.0) !=
/// F32(-0.0)`, and `F32(1.0) != F64(1.0)`. This is what a hash-consed graph needs when it
/// merges constants by value: merging `0.0` with `-0.0` would change `1 / x`, and refusing
/// to merge a NaN with itself would break `Eq`'s reflexivity (and the graph's dedup). Compare
/// numerically with [`BinaryOp::Eq`](crate::BinaryOp::Eq) through [`Scalar::binary`].
#[derive(Debug, Clone, Copy)]
pub enum Scalar {
    /// A `bool`.
    Bool(bool),
    /// A `u8`.
    U8(u8),
    /// A `u16`.
    U16(u16),
    /// A `u32`.
    U32(u32),
    /// A `u64`.
    U64(u64),
    /// An `i8`.
    I8(i8),
    /// An `i16`.
    I16(i16),
    /// An `i32`.
    I32(i32),
    /// An `i64`.
    I64(i64),
    /// A float8 e4m3fn (storage only: casts, `where`, no arithmetic).
    F8E4M3(F8E4M3),
    /// A float8 e5m2 (storage only: casts, `where`, no arithmetic).
    F8E5M2(F8E5M2),
    /// An IEEE binary16.
    F16(f16),
    /// A bfloat16.
    BF16(bf16),
    /// An IEEE binary32.
    F32(f32),
    /// An IEEE binary64.
    F64(f64),
}

/// Why an op could not be applied to scalars.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScalarError {
    /// The op is not defined for the dtype (`sqrt` on `i32`, `shl` on `f32`).
    #[error("{op} is not defined for {dtype}; {}", eval::unsupported_hint(.op, *.dtype))]
    Unsupported {
        /// The op's name, as [`UnaryOp::name`](crate::UnaryOp::name) and friends give it.
        op: String,
        /// The operand's dtype.
        dtype: DType,
    },
    /// The operands of an op that needs one dtype have different dtypes.
    #[error(
        "{op} needs operands of one dtype, got {lhs} and {rhs}; cast both to a common dtype \
         first (DType::promote gives torch's)"
    )]
    DTypeMismatch {
        /// The op's name.
        op: String,
        /// The first mismatched operand's dtype.
        lhs: DType,
        /// The second mismatched operand's dtype.
        rhs: DType,
    },
    /// A condition operand is not `bool`.
    #[error("{op} needs a bool condition, got {dtype}; compare it with zero (ne) first")]
    ConditionNotBool {
        /// The op's name.
        op: String,
        /// The condition's dtype.
        dtype: DType,
    },
    /// A bitcast between dtypes of different sizes.
    #[error(
        "cannot bitcast {from} ({} bytes) to {to} ({} bytes): a bitcast keeps the bits, so \
         the sizes must match; use cast to convert the value instead",
        .from.size_bytes(),
        .to.size_bytes()
    )]
    Bitcast {
        /// The source dtype.
        from: DType,
        /// The requested dtype.
        to: DType,
    },
    /// A bitcast to `bool` of a byte that is neither 0 nor 1.
    #[error(
        "cannot bitcast the {from} bit pattern {bits:#04x} to bool: only 0x00 and 0x01 are \
         bools; compare with zero (ne) to get a bool instead"
    )]
    InvalidBool {
        /// The source dtype (`u8` or `i8`).
        from: DType,
        /// The source's bit pattern.
        bits: u8,
    },
}

impl Scalar {
    /// The value's dtype.
    pub const fn dtype(self) -> DType {
        match self {
            Self::Bool(_) => DType::Bool,
            Self::U8(_) => DType::U8,
            Self::U16(_) => DType::U16,
            Self::U32(_) => DType::U32,
            Self::U64(_) => DType::U64,
            Self::I8(_) => DType::I8,
            Self::I16(_) => DType::I16,
            Self::I32(_) => DType::I32,
            Self::I64(_) => DType::I64,
            Self::F8E4M3(_) => DType::F8E4M3,
            Self::F8E5M2(_) => DType::F8E5M2,
            Self::F16(_) => DType::F16,
            Self::BF16(_) => DType::BF16,
            Self::F32(_) => DType::F32,
            Self::F64(_) => DType::F64,
        }
    }

    /// Zero of `dtype` (`false` for `bool`, `+0.0` for floats).
    pub fn zero(dtype: DType) -> Scalar {
        Scalar::Bool(false).cast(dtype)
    }

    /// One of `dtype` (`true` for `bool`).
    pub fn one(dtype: DType) -> Scalar {
        Scalar::Bool(true).cast(dtype)
    }

    /// The value as an `f64`, lossy like Rust's `as` (`bool` gives 0 or 1).
    pub fn to_f64(self) -> f64 {
        match self.cast(DType::F64) {
            Self::F64(x) => x,
            // `cast` always returns the dtype it is asked for.
            _ => f64::NAN,
        }
    }

    /// The value as an `i64`, lossy like Rust's `as`: floats truncate toward zero and
    /// saturate, NaN gives 0, `u64` wraps, `bool` gives 0 or 1.
    pub fn to_i64(self) -> i64 {
        match self.cast(DType::I64) {
            Self::I64(x) => x,
            // `cast` always returns the dtype it is asked for.
            _ => 0,
        }
    }

    /// Whether the value is a float NaN (never true for integers and `bool`).
    pub fn is_nan(self) -> bool {
        match self {
            Self::F8E4M3(x) => x.is_nan(),
            Self::F8E5M2(x) => x.is_nan(),
            Self::F16(x) => x.is_nan(),
            Self::BF16(x) => x.is_nan(),
            Self::F32(x) => x.is_nan(),
            Self::F64(x) => x.is_nan(),
            _ => false,
        }
    }

    /// Whether the value is a float infinity of either sign.
    fn is_infinite(self) -> bool {
        match self {
            Self::F8E5M2(x) => x.is_infinite(),
            Self::F16(x) => x.is_infinite(),
            Self::BF16(x) => x.is_infinite(),
            Self::F32(x) => x.is_infinite(),
            Self::F64(x) => x.is_infinite(),
            _ => false,
        }
    }

    /// The value's bit pattern, zero-extended to 64 bits (`bool` is 0 or 1; signed integers
    /// are two's complement of their own width, so `I8(-1)` gives `0xff`).
    ///
    /// Equality and hashing compare these bits together with the dtype.
    pub fn to_bits(self) -> u64 {
        match self {
            Self::Bool(x) => u64::from(x),
            Self::U8(x) => u64::from(x),
            Self::U16(x) => u64::from(x),
            Self::U32(x) => u64::from(x),
            Self::U64(x) => x,
            Self::I8(x) => u64::from(x as u8),
            Self::I16(x) => u64::from(x as u16),
            Self::I32(x) => u64::from(x as u32),
            Self::I64(x) => x as u64,
            Self::F8E4M3(x) => u64::from(x.to_bits()),
            Self::F8E5M2(x) => u64::from(x.to_bits()),
            Self::F16(x) => u64::from(x.to_bits()),
            Self::BF16(x) => u64::from(x.to_bits()),
            Self::F32(x) => u64::from(x.to_bits()),
            Self::F64(x) => x.to_bits(),
        }
    }

    /// The `dtype` value whose bit pattern is `bits` (the inverse of [`Scalar::to_bits`];
    /// higher bits than the dtype's width are ignored, and `bool` is `bits != 0`).
    ///
    /// ```
    /// use tessel_shape::{DType, Scalar};
    ///
    /// assert_eq!(Scalar::from_bits(DType::I8, 0xff), Scalar::I8(-1));
    /// assert_eq!(Scalar::from_bits(DType::F32, 1.5f32.to_bits().into()), Scalar::F32(1.5));
    /// ```
    pub fn from_bits(dtype: DType, bits: u64) -> Scalar {
        match dtype {
            DType::Bool => Scalar::Bool(bits != 0),
            DType::U8 => Scalar::U8(bits as u8),
            DType::U16 => Scalar::U16(bits as u16),
            DType::U32 => Scalar::U32(bits as u32),
            DType::U64 => Scalar::U64(bits),
            DType::I8 => Scalar::I8(bits as i8),
            DType::I16 => Scalar::I16(bits as i16),
            DType::I32 => Scalar::I32(bits as i32),
            DType::I64 => Scalar::I64(bits as i64),
            DType::F8E4M3 => Scalar::F8E4M3(F8E4M3::from_bits(bits as u8)),
            DType::F8E5M2 => Scalar::F8E5M2(F8E5M2::from_bits(bits as u8)),
            DType::F16 => Scalar::F16(f16::from_bits(bits as u16)),
            DType::BF16 => Scalar::BF16(bf16::from_bits(bits as u16)),
            DType::F32 => Scalar::F32(f32::from_bits(bits as u32)),
            DType::F64 => Scalar::F64(f64::from_bits(bits)),
        }
    }

    /// The `dtype` value stored little-endian in `bytes` (at most 8 bytes; missing high
    /// bytes are zero).
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Scalar {
        let mut raw = [0u8; 8];
        let n = bytes.len().min(8);
        raw[..n].copy_from_slice(&bytes[..n]);
        Scalar::from_bits(dtype, u64::from_le_bytes(raw))
    }

    /// Converts the value to `to` with Rust's `as` semantics, for every pair of dtypes:
    ///
    /// - float to integer truncates toward zero and saturates; NaN gives 0;
    /// - integer to integer wraps (keeps the low bits, sign-extending signed sources);
    /// - anything to `bool` is `x != 0` (so NaN gives `true` and `-0.0` gives `false`);
    /// - `bool` to a number gives 0 or 1;
    /// - to `f32`/`f64`: round to nearest, ties to even;
    /// - `f32` to `f16`/`bf16` rounds once, to nearest even; `f64` to `f16`/`bf16` also
    ///   rounds once (correctly, see below);
    /// - an integer to `f16`/`bf16` goes through `f32` (`x as f32`, then round), which may
    ///   round twice for wide integers: this is what generated C and CUDA code does, since
    ///   neither has a direct integer-to-half conversion for every width;
    /// - `f16`/`bf16` to anything goes through `f32` (exact), then as above;
    /// - the float8 dtypes convert like the half types: from `f32` with one rounding to
    ///   nearest even (out of range: NaN for `f8e4m3`, which has no infinity, and infinity
    ///   for `f8e5m2`, both as PyTorch does), from `f64` rounded once through `f32` to odd,
    ///   from integers through `f32`, and to anything through `f32` (exact). See
    ///   [`F8E4M3`] and [`F8E5M2`].
    ///
    /// `half`'s `from_f64` is not correctly rounded (it drops the low 32 bits of the
    /// significand before rounding, and on x86 with F16C it rounds through `f32`, so its
    /// result depends on the machine). Tessel instead rounds `f64` to `f32` *to odd* and then
    /// to the half type: rounding to odd in a format with at least two more significand bits
    /// than the target makes the second rounding exact, on every machine.
    ///
    /// ```
    /// use tessel_shape::{DType, Scalar};
    ///
    /// assert_eq!(Scalar::F32(-1.7).cast(DType::I32), Scalar::I32(-1));
    /// assert_eq!(Scalar::F32(f32::NAN).cast(DType::U8), Scalar::U8(0));
    /// assert_eq!(Scalar::F64(1e10).cast(DType::I32), Scalar::I32(i32::MAX));
    /// assert_eq!(Scalar::I32(300).cast(DType::U8), Scalar::U8(44));
    /// assert_eq!(Scalar::F32(f32::NAN).cast(DType::Bool), Scalar::Bool(true));
    /// ```
    pub fn cast(self, to: DType) -> Scalar {
        // Same-dtype casts keep the bits exactly, NaN payloads and signaling NaNs included,
        // which a round trip through f32 would not for the half types.
        if self.dtype() == to {
            return self;
        }
        // Converts the primitive `$v` with `as`; `$nonzero`, `$f16` and `$bf16` give the
        // conversions `as` has no spelling for.
        macro_rules! cast_primitive {
            ($v:expr, nonzero: $nonzero:expr, f16: $f16:expr, bf16: $bf16:expr,
             f8: $f8:expr) => {
                match to {
                    DType::Bool => Self::Bool($nonzero),
                    DType::U8 => Self::U8($v as u8),
                    DType::U16 => Self::U16($v as u16),
                    DType::U32 => Self::U32($v as u32),
                    DType::U64 => Self::U64($v as u64),
                    DType::I8 => Self::I8($v as i8),
                    DType::I16 => Self::I16($v as i16),
                    DType::I32 => Self::I32($v as i32),
                    DType::I64 => Self::I64($v as i64),
                    DType::F8E4M3 => Self::F8E4M3(F8E4M3::from_f32($f8)),
                    DType::F8E5M2 => Self::F8E5M2(F8E5M2::from_f32($f8)),
                    DType::F16 => Self::F16($f16),
                    DType::BF16 => Self::BF16($bf16),
                    DType::F32 => Self::F32($v as f32),
                    DType::F64 => Self::F64($v as f64),
                }
            };
        }
        macro_rules! cast_int {
            ($v:expr) => {
                cast_primitive!($v, nonzero: $v != 0,
                    f16: f16::from_f32($v as f32), bf16: bf16::from_f32($v as f32),
                    f8: $v as f32)
            };
        }
        match self {
            // A bool converts exactly like the byte it is stored as.
            Self::Bool(b) => Self::U8(u8::from(b)).cast(to),
            Self::U8(v) => cast_int!(v),
            Self::U16(v) => cast_int!(v),
            Self::U32(v) => cast_int!(v),
            Self::U64(v) => cast_int!(v),
            Self::I8(v) => cast_int!(v),
            Self::I16(v) => cast_int!(v),
            Self::I32(v) => cast_int!(v),
            Self::I64(v) => cast_int!(v),
            Self::F8E4M3(v) => Self::F32(v.to_f32()).cast(to),
            Self::F8E5M2(v) => Self::F32(v.to_f32()).cast(to),
            Self::F16(v) => Self::F32(v.to_f32()).cast(to),
            Self::BF16(v) => Self::F32(v.to_f32()).cast(to),
            Self::F32(v) => cast_primitive!(v, nonzero: v != 0.0,
                f16: f16::from_f32(v), bf16: bf16::from_f32(v), f8: v),
            Self::F64(v) => cast_primitive!(v, nonzero: v != 0.0,
                f16: f16::from_f32(f64_to_f32_round_to_odd(v)),
                bf16: bf16::from_f32(f64_to_f32_round_to_odd(v)),
                f8: f64_to_f32_round_to_odd(v)),
        }
    }

    /// Reinterprets the bits as `to`, which must have the same size.
    ///
    /// `bool` shares its size with `u8` and `i8`; it bitcasts to them as 0 or 1, and they
    /// bitcast to it only when the byte is 0 or 1, since any other byte is not a valid `bool`.
    ///
    /// ```
    /// use tessel_shape::{DType, Scalar};
    ///
    /// assert_eq!(Scalar::F32(1.0).bitcast(DType::U32), Ok(Scalar::U32(0x3f80_0000)));
    /// assert_eq!(Scalar::I8(-1).bitcast(DType::U8), Ok(Scalar::U8(255)));
    /// assert!(Scalar::F32(1.0).bitcast(DType::F16).is_err());
    /// assert!(Scalar::U8(2).bitcast(DType::Bool).is_err());
    /// ```
    pub fn bitcast(self, to: DType) -> Result<Scalar, ScalarError> {
        let from = self.dtype();
        if from.size_bytes() != to.size_bytes() {
            return Err(ScalarError::Bitcast { from, to });
        }
        // Same size, so the bits fit `to` and the truncating `as` below drops only zeros.
        let bits = self.to_bits();
        Ok(match to {
            DType::Bool => match bits {
                0 => Self::Bool(false),
                1 => Self::Bool(true),
                _ => {
                    return Err(ScalarError::InvalidBool {
                        from,
                        bits: bits as u8,
                    });
                }
            },
            DType::U8 => Self::U8(bits as u8),
            DType::U16 => Self::U16(bits as u16),
            DType::U32 => Self::U32(bits as u32),
            DType::U64 => Self::U64(bits),
            DType::I8 => Self::I8(bits as i8),
            DType::I16 => Self::I16(bits as i16),
            DType::I32 => Self::I32(bits as i32),
            DType::I64 => Self::I64(bits as i64),
            DType::F8E4M3 => Self::F8E4M3(F8E4M3::from_bits(bits as u8)),
            DType::F8E5M2 => Self::F8E5M2(F8E5M2::from_bits(bits as u8)),
            DType::F16 => Self::F16(f16::from_bits(bits as u16)),
            DType::BF16 => Self::BF16(bf16::from_bits(bits as u16)),
            DType::F32 => Self::F32(f32::from_bits(bits as u32)),
            DType::F64 => Self::F64(f64::from_bits(bits)),
        })
    }
}

/// Rounds `x` to `f32` *to odd*: exact values are kept, inexact ones become whichever of the
/// two neighbouring `f32`s has an odd significand (the largest finite `f32` past the top of
/// the range). Rounding the result to nearest in a format at least two bits narrower (`f16`
/// has 11 bits, `bf16` 8, `f32` 24) then equals rounding `x` directly (Boldo and Melquiond,
/// "When double rounding is odd", 2005).
pub(crate) fn f64_to_f32_round_to_odd(x: f64) -> f32 {
    let nearest = x as f32;
    if nearest.is_nan() || f64::from(nearest) == x {
        return nearest;
    }
    if nearest.is_infinite() {
        // Only finite x get here (infinities convert exactly), so x is past f32::MAX:
        // truncation gives MAX, whose significand is all ones, so odd.
        return f32::MAX.copysign(nearest);
    }
    let bits = nearest.to_bits();
    if bits & 1 == 1 {
        return nearest;
    }
    // The other neighbour is one step toward x. Stepping the bit pattern moves the magnitude,
    // so step up when nearest is below x in magnitude (this also takes ±0 to the smallest
    // subnormal of x's sign) and down otherwise.
    if f64::from(nearest).abs() < x.abs() {
        f32::from_bits(bits + 1)
    } else {
        f32::from_bits(bits - 1)
    }
}

impl PartialEq for Scalar {
    /// Bitwise: same dtype and same bits (see [`Scalar`]).
    fn eq(&self, other: &Self) -> bool {
        self.dtype() == other.dtype() && self.to_bits() == other.to_bits()
    }
}

impl Eq for Scalar {}

impl Hash for Scalar {
    /// Hashes exactly what [`PartialEq`] compares: the dtype and the bits.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.dtype().hash(state);
        self.to_bits().hash(state);
    }
}

impl fmt::Display for Scalar {
    /// Prints the value alone, without its dtype. Floats print like Rust's `{:?}`: the
    /// shortest decimal that parses back to the same value, always with a `.` or an exponent
    /// (`1.0`, `0.1`, `1e-8`, `NaN`, `-inf`), so an integer and a float never print alike.
    /// `f16` and `bf16` print their exact `f32` value that way, which parses back exactly too.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Bool(x) => fmt::Display::fmt(&x, f),
            Self::U8(x) => fmt::Display::fmt(&x, f),
            Self::U16(x) => fmt::Display::fmt(&x, f),
            Self::U32(x) => fmt::Display::fmt(&x, f),
            Self::U64(x) => fmt::Display::fmt(&x, f),
            Self::I8(x) => fmt::Display::fmt(&x, f),
            Self::I16(x) => fmt::Display::fmt(&x, f),
            Self::I32(x) => fmt::Display::fmt(&x, f),
            Self::I64(x) => fmt::Display::fmt(&x, f),
            Self::F8E4M3(x) => fmt::Debug::fmt(&x.to_f32(), f),
            Self::F8E5M2(x) => fmt::Debug::fmt(&x.to_f32(), f),
            Self::F16(x) => fmt::Debug::fmt(&x.to_f32(), f),
            Self::BF16(x) => fmt::Debug::fmt(&x.to_f32(), f),
            Self::F32(x) => fmt::Debug::fmt(&x, f),
            Self::F64(x) => fmt::Debug::fmt(&x, f),
        }
    }
}

macro_rules! impl_from {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<$t> for Scalar {
            fn from(value: $t) -> Self {
                Self::$variant(value)
            }
        }
    )*};
}

impl_from! {
    bool => Bool,
    u8 => U8,
    u16 => U16,
    u32 => U32,
    u64 => U64,
    i8 => I8,
    i16 => I16,
    i32 => I32,
    i64 => I64,
    F8E4M3 => F8E4M3,
    F8E5M2 => F8E5M2,
    f16 => F16,
    bf16 => BF16,
    f32 => F32,
    f64 => F64,
}
