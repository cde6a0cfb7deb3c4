//! Element types and their promotion, which follows `torch.promote_types`.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::{F8E4M3, F8E5M2, Scalar};

/// The element type of a tensor or a [`Scalar`].
///
/// The variants are ordered by category (bool, unsigned, signed, float) and then by width,
/// which is the order [`DType::ALL`] lists them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `bool`: one byte holding 0 or 1.
    Bool,
    /// 8-bit unsigned integer.
    U8,
    /// 16-bit unsigned integer.
    U16,
    /// 32-bit unsigned integer.
    U32,
    /// 64-bit unsigned integer.
    U64,
    /// 8-bit signed integer.
    I8,
    /// 16-bit signed integer.
    I16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// PyTorch's `float8_e4m3fn` ([`F8E4M3`]): a storage and cast dtype with no arithmetic.
    F8E4M3,
    /// PyTorch's `float8_e5m2` ([`F8E5M2`]): a storage and cast dtype with no arithmetic.
    F8E5M2,
    /// IEEE 754 binary16 (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`): `f32`'s exponent range with an 8-bit significand.
    BF16,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
}

/// The category of a value, as Python sees a scalar operand: `True`, `3` or `3.0`.
///
/// The variants are ordered `Bool < Int < Float`, the order in which a Python scalar of a
/// higher category can change a tensor's dtype (see [`DType::promote_scalar`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScalarKind {
    /// `bool`.
    Bool,
    /// Any integer, signed or unsigned.
    Int,
    /// Any floating-point type.
    Float,
}

/// Why a dtype could not be parsed or two dtypes could not be promoted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DTypeError {
    /// No dtype holds every value of both operands (`u64` with a signed integer).
    #[error(
        "{lhs} and {rhs} have no common dtype: no integer dtype holds every value of both; \
         cast one operand explicitly"
    )]
    NoCommonType {
        /// The left operand's dtype.
        lhs: DType,
        /// The right operand's dtype.
        rhs: DType,
    },
    /// A float8 dtype with any other dtype: like PyTorch, Tessel does not promote them.
    #[error(
        "promotion for float8 dtypes is not supported ({lhs} and {rhs}); float8 is a storage \
         dtype: cast it to f16, bf16 or f32 first"
    )]
    Float8 {
        /// The left operand's dtype.
        lhs: DType,
        /// The right operand's dtype.
        rhs: DType,
    },
    /// The name is not one [`DType::name`] gives.
    #[error(
        "unknown dtype {name:?}; expected one of bool, u8, u16, u32, u64, i8, i16, i32, i64, \
         f8e4m3, f8e5m2, f16, bf16, f32, f64"
    )]
    Unknown {
        /// The name that was parsed.
        name: String,
    },
}

impl DType {
    /// Every dtype with arithmetic, in declaration order: all but the float8 storage dtypes
    /// ([`DType::FLOAT8`]), which only cast, move and select (see [`DType::is_float8`]).
    pub const ALL: [DType; 13] = [
        Self::Bool,
        Self::U8,
        Self::U16,
        Self::U32,
        Self::U64,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F16,
        Self::BF16,
        Self::F32,
        Self::F64,
    ];

    /// The float8 storage dtypes, which [`DType::ALL`] leaves out.
    pub const FLOAT8: [DType; 2] = [Self::F8E4M3, Self::F8E5M2];

    /// Bytes one element occupies in memory (`bool` takes a whole byte).
    pub const fn size_bytes(self) -> usize {
        match self {
            Self::Bool | Self::U8 | Self::I8 | Self::F8E4M3 | Self::F8E5M2 => 1,
            Self::U16 | Self::I16 | Self::F16 | Self::BF16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }

    /// Bits one element occupies in memory: `8 * size_bytes()`, so 8 for `bool`.
    ///
    /// For integers this is also the width shifts are taken modulo (see
    /// [`BinaryOp::Shl`](crate::BinaryOp::Shl)).
    pub const fn bits(self) -> u32 {
        // `size_bytes` is at most 8, so the product always fits.
        (self.size_bytes() * 8) as u32
    }

    /// Whether this is a floating-point dtype (`f8e4m3`, `f8e5m2`, `f16`, `bf16`, `f32`,
    /// `f64`).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            Self::F8E4M3 | Self::F8E5M2 | Self::F16 | Self::BF16 | Self::F32 | Self::F64
        )
    }

    /// Whether this is a float8 storage dtype (`f8e4m3`, `f8e5m2`).
    ///
    /// Like PyTorch's, they are for storage and conversion: casts to and from every dtype,
    /// movement (reshape, permute, pad, cat, ...), `where` and loads and stores work; other
    /// ops are not defined for them (their [`supports`](crate::UnaryOp::supports) is false)
    /// and promotion with any other dtype is an error. Cast to a wider float to compute.
    pub const fn is_float8(self) -> bool {
        matches!(self, Self::F8E4M3 | Self::F8E5M2)
    }

    /// Whether this is an integer dtype, signed or unsigned (`bool` is not).
    pub const fn is_int(self) -> bool {
        matches!(
            self,
            Self::U8
                | Self::U16
                | Self::U32
                | Self::U64
                | Self::I8
                | Self::I16
                | Self::I32
                | Self::I64
        )
    }

    /// Whether the dtype can hold negative values: signed integers and floats.
    pub const fn is_signed(self) -> bool {
        matches!(
            self,
            Self::I8
                | Self::I16
                | Self::I32
                | Self::I64
                | Self::F8E4M3
                | Self::F8E5M2
                | Self::F16
                | Self::BF16
                | Self::F32
                | Self::F64
        )
    }

    /// Whether this is `bool`.
    pub const fn is_bool(self) -> bool {
        matches!(self, Self::Bool)
    }

    /// The category a Python scalar of this dtype would have.
    pub const fn kind(self) -> ScalarKind {
        if self.is_bool() {
            ScalarKind::Bool
        } else if self.is_float() {
            ScalarKind::Float
        } else {
            ScalarKind::Int
        }
    }

    /// The short name: `bool`, `u8` … `i64`, `f8e4m3`, `f8e5m2`, `f16`, `bf16`, `f32`, `f64`.
    ///
    /// [`Display`](fmt::Display) prints it and [`FromStr`] parses it back.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Bool => "bool",
            Self::U8 => "u8",
            Self::U16 => "u16",
            Self::U32 => "u32",
            Self::U64 => "u64",
            Self::I8 => "i8",
            Self::I16 => "i16",
            Self::I32 => "i32",
            Self::I64 => "i64",
            Self::F8E4M3 => "f8e4m3",
            Self::F8E5M2 => "f8e5m2",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::F32 => "f32",
            Self::F64 => "f64",
        }
    }

    /// The lowest finite value, like `torch.finfo(dtype).min` / `torch.iinfo(dtype).min`;
    /// `false` for `bool`.
    pub fn min_value(self) -> Scalar {
        match self {
            Self::Bool => Scalar::Bool(false),
            Self::U8 => Scalar::U8(u8::MIN),
            Self::U16 => Scalar::U16(u16::MIN),
            Self::U32 => Scalar::U32(u32::MIN),
            Self::U64 => Scalar::U64(u64::MIN),
            Self::I8 => Scalar::I8(i8::MIN),
            Self::I16 => Scalar::I16(i16::MIN),
            Self::I32 => Scalar::I32(i32::MIN),
            Self::I64 => Scalar::I64(i64::MIN),
            Self::F8E4M3 => Scalar::F8E4M3(F8E4M3::MIN),
            Self::F8E5M2 => Scalar::F8E5M2(F8E5M2::MIN),
            Self::F16 => Scalar::F16(f16::MIN),
            Self::BF16 => Scalar::BF16(bf16::MIN),
            Self::F32 => Scalar::F32(f32::MIN),
            Self::F64 => Scalar::F64(f64::MIN),
        }
    }

    /// The highest finite value, like `torch.finfo(dtype).max` / `torch.iinfo(dtype).max`;
    /// `true` for `bool`.
    pub fn max_value(self) -> Scalar {
        match self {
            Self::Bool => Scalar::Bool(true),
            Self::U8 => Scalar::U8(u8::MAX),
            Self::U16 => Scalar::U16(u16::MAX),
            Self::U32 => Scalar::U32(u32::MAX),
            Self::U64 => Scalar::U64(u64::MAX),
            Self::I8 => Scalar::I8(i8::MAX),
            Self::I16 => Scalar::I16(i16::MAX),
            Self::I32 => Scalar::I32(i32::MAX),
            Self::I64 => Scalar::I64(i64::MAX),
            Self::F8E4M3 => Scalar::F8E4M3(F8E4M3::MAX),
            Self::F8E5M2 => Scalar::F8E5M2(F8E5M2::MAX),
            Self::F16 => Scalar::F16(f16::MAX),
            Self::BF16 => Scalar::BF16(bf16::MAX),
            Self::F32 => Scalar::F32(f32::MAX),
            Self::F64 => Scalar::F64(f64::MAX),
        }
    }

    /// The dtype a binary op on tensors of dtypes `self` and `other` computes in, exactly
    /// like `torch.promote_types` for every pair torch supports:
    ///
    /// - equal dtypes give that dtype, and `bool` with any dtype gives the other one;
    /// - a float with an integer gives the float; two floats give the wider one, except
    ///   `f16` with `bf16`, which gives `f32` (neither holds the other's values);
    /// - two signed integers give the wider one; `u8` with a signed `iN` gives the smallest
    ///   signed dtype holding both (`u8 + i8 = i16`, `u8 + i32 = i32`).
    ///
    /// torch refuses `u16`, `u32` and `u64` with any other integer dtype. Tessel extends
    /// the same principle (the result holds every value of both operands) to them:
    ///
    /// - two unsigned integers give the wider one;
    /// - `uN` with a signed `iM` gives the smallest signed dtype with more than `N` bits and
    ///   at least `M` (`u16 + i8 = i32`, `u32 + i64 = i64`);
    /// - `u64` with a signed integer has no such dtype and is an error.
    ///
    /// The float8 dtypes promote with nothing but themselves, as in torch ("Promotion for
    /// Float8 Types is not supported"): [`DTypeError::Float8`].
    ///
    /// The result is symmetric: `a.promote(b) == b.promote(a)`.
    ///
    /// ```
    /// use tessel_shape::DType;
    ///
    /// assert_eq!(DType::U8.promote(DType::I8), Ok(DType::I16));
    /// assert_eq!(DType::F16.promote(DType::BF16), Ok(DType::F32));
    /// assert!(DType::U64.promote(DType::I64).is_err());
    /// ```
    pub fn promote(self, other: DType) -> Result<DType, DTypeError> {
        if self == other {
            return Ok(self);
        }
        if self.is_float8() || other.is_float8() {
            return Err(DTypeError::Float8 {
                lhs: self,
                rhs: other,
            });
        }
        match (self.kind(), other.kind()) {
            (ScalarKind::Bool, _) => Ok(other),
            (_, ScalarKind::Bool) => Ok(self),
            (ScalarKind::Float, ScalarKind::Int) => Ok(self),
            (ScalarKind::Int, ScalarKind::Float) => Ok(other),
            (ScalarKind::Float, ScalarKind::Float) => Ok(match self.bits().cmp(&other.bits()) {
                // f16 and bf16 are the only distinct floats of one width.
                Ordering::Equal => Self::F32,
                Ordering::Greater => self,
                Ordering::Less => other,
            }),
            (ScalarKind::Int, ScalarKind::Int) => match (self.is_signed(), other.is_signed()) {
                (true, true) | (false, false) => Some(if self.bits() >= other.bits() {
                    self
                } else {
                    other
                }),
                (false, true) => Self::promote_mixed_sign(self, other),
                (true, false) => Self::promote_mixed_sign(other, self),
            }
            .ok_or(DTypeError::NoCommonType {
                lhs: self,
                rhs: other,
            }),
        }
    }

    /// The smallest signed integer dtype holding every value of the unsigned `unsigned` and
    /// the signed `signed`: more bits than `unsigned` (for its top half) and at least as many
    /// as `signed`; `None` when `unsigned` is `u64`.
    fn promote_mixed_sign(unsigned: DType, signed: DType) -> Option<DType> {
        [Self::I8, Self::I16, Self::I32, Self::I64]
            .into_iter()
            .find(|candidate| {
                candidate.bits() > unsigned.bits() && candidate.bits() >= signed.bits()
            })
    }

    /// The dtype of an op between a tensor of dtype `self` and a Python scalar of category
    /// `kind`, by torch's rule: a scalar only changes the dtype when its category is higher
    /// than the tensor's, and then gives that category's default dtype (`i64` for integers,
    /// `f32`, torch's default float, for floats). So `u8 tensor + 1000` stays `u8` and
    /// `i32 tensor + 0.5` is `f32`.
    ///
    /// ```
    /// use tessel_shape::{DType, ScalarKind};
    ///
    /// assert_eq!(DType::U8.promote_scalar(ScalarKind::Int), DType::U8);
    /// assert_eq!(DType::Bool.promote_scalar(ScalarKind::Int), DType::I64);
    /// assert_eq!(DType::I32.promote_scalar(ScalarKind::Float), DType::F32);
    /// assert_eq!(DType::F16.promote_scalar(ScalarKind::Float), DType::F16);
    /// ```
    pub fn promote_scalar(self, kind: ScalarKind) -> DType {
        if kind <= self.kind() {
            return self;
        }
        match kind {
            ScalarKind::Bool => Self::Bool,
            ScalarKind::Int => Self::I64,
            ScalarKind::Float => Self::F32,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = DTypeError;

    /// Parses a name [`DType::name`] gives; the match is exact (case-sensitive), so the
    /// text form has one spelling per dtype.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .chain(Self::FLOAT8)
            .find(|dtype| dtype.name() == name)
            .ok_or_else(|| DTypeError::Unknown {
                name: name.to_owned(),
            })
    }
}

impl fmt::Display for ScalarKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Bool => "bool",
            Self::Int => "int",
            Self::Float => "float",
        })
    }
}
