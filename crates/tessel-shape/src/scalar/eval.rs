//! The op table (which dtypes each op supports, and its result dtype) and what each op
//! computes on [`Scalar`]s. The doc comments on the op enums in [`crate::ops`] are the spec;
//! this file implements them.
//!
//! Floats: `f32` and `f64` ops use Rust's own operators and methods (`%` is C's `fmod`,
//! `mul_add` is fused). `f16` and `bf16` are converted to `f32`, computed there and rounded
//! back once. For `+ - * /` and `sqrt` that equals IEEE arithmetic in the half type, since
//! rounding twice is harmless when the wider format has at least `2p + 2` significand bits
//! (`f32` has 24; `2 * 11 + 2 = 24` for `f16`, `2 * 8 + 2 = 18` for `bf16`); for the other
//! functions it is what generated code does anyway. `mul_add` is the exception: it must round
//! once, and `f32` is too narrow for that, so it is computed exactly in `f64` (see
//! [`half_mul_add`]).

use half::{bf16, f16};

use super::erf::erf;
use super::{Scalar, ScalarError, f64_to_f32_round_to_odd};
use crate::{BinaryOp, DType, TernaryOp, UnaryOp};

impl UnaryOp {
    /// Whether the op is defined for an operand of `dtype`:
    ///
    /// - `neg`, `abs`, `sign`, `floor`, `ceil`, `round`, `trunc`: every dtype but `bool`
    ///   (the rounding ops are the identity on integers);
    /// - `not`: integers and `bool`;
    /// - `recip`, `sqrt`, `rsqrt`, `exp`, `exp2`, `log`, `log2`, `sin`, `cos`, `tan`,
    ///   `tanh`, `erf`: floats only;
    /// - `isnan`, `isinf`: every dtype (always `false` on integers and `bool`);
    /// - nothing on the float8 storage dtypes (cast them first).
    pub const fn supports(self, dtype: DType) -> bool {
        if dtype.is_float8() {
            return false;
        }
        match self {
            Self::Neg
            | Self::Abs
            | Self::Sign
            | Self::Floor
            | Self::Ceil
            | Self::Round
            | Self::Trunc => !dtype.is_bool(),
            Self::Not => !dtype.is_float(),
            Self::Reciprocal
            | Self::Sqrt
            | Self::Rsqrt
            | Self::Exp
            | Self::Exp2
            | Self::Log
            | Self::Log2
            | Self::Sin
            | Self::Cos
            | Self::Tan
            | Self::Tanh
            | Self::Erf => dtype.is_float(),
            Self::IsNan | Self::IsInf => true,
        }
    }

    /// The dtype of the result for an operand of `dtype`: `bool` for `isnan` and `isinf`,
    /// `dtype` for the others, `None` where [`supports`](Self::supports) is false.
    pub const fn result_dtype(self, dtype: DType) -> Option<DType> {
        if !self.supports(dtype) {
            None
        } else if matches!(self, Self::IsNan | Self::IsInf) {
            Some(DType::Bool)
        } else {
            Some(dtype)
        }
    }
}

impl BinaryOp {
    /// Whether the op is defined for two operands of `dtype`:
    ///
    /// - `add`, `mul`, `max`, `min`: every dtype (on `bool`: or, and, or, and);
    /// - `sub`, `div`, `rem`, `pow`: every dtype but `bool`;
    /// - `and`, `or`, `xor`: integers and `bool`;
    /// - `shl`, `shr`: integers;
    /// - comparisons: every dtype (`false < true`);
    /// - nothing on the float8 storage dtypes (cast them first).
    pub const fn supports(self, dtype: DType) -> bool {
        if dtype.is_float8() {
            return false;
        }
        match self {
            Self::Add | Self::Mul | Self::Max | Self::Min => true,
            Self::Sub | Self::Div | Self::Rem | Self::Pow => !dtype.is_bool(),
            Self::And | Self::Or | Self::Xor => !dtype.is_float(),
            Self::Shl | Self::Shr => dtype.is_int(),
            Self::Eq | Self::Ne | Self::Lt | Self::Le | Self::Gt | Self::Ge => true,
        }
    }

    /// The dtype of the result for operands of `dtype`: `bool` for comparisons, `dtype`
    /// for the others, `None` where [`supports`](Self::supports) is false.
    pub const fn result_dtype(self, dtype: DType) -> Option<DType> {
        if !self.supports(dtype) {
            None
        } else if self.is_comparison() {
            Some(DType::Bool)
        } else {
            Some(dtype)
        }
    }
}

impl TernaryOp {
    /// Whether the op is defined when its value operands have `dtype` (`b` and `c` for
    /// `where`, whose condition is always `bool`; all three for `mad`).
    ///
    /// `where` supports every dtype, and `mad` every dtype but the float8 storage dtypes
    /// (which have no arithmetic). `mad` on `bool` is `(a and b) or c`, following
    /// [`BinaryOp::Mul`] and [`BinaryOp::Add`] on `bool`, so fusing a `mul` and an `add`
    /// into a `mad` is valid for every dtype they support.
    pub const fn supports(self, dtype: DType) -> bool {
        match self {
            Self::Where => true,
            Self::MulAdd => !dtype.is_float8(),
        }
    }

    /// The dtype of the result: the value operands' `dtype`, or `None` where
    /// [`supports`](Self::supports) is false.
    pub const fn result_dtype(self, dtype: DType) -> Option<DType> {
        if self.supports(dtype) {
            Some(dtype)
        } else {
            None
        }
    }
}

/// The fix [`ScalarError::Unsupported`] suggests for the op named `op` on `dtype`: a cast
/// to a dtype category the op supports.
pub(super) fn unsupported_hint(op: &str, dtype: DType) -> &'static str {
    if dtype.is_float8() {
        return "float8 dtypes are for storage and casts only (like PyTorch's): cast to f16, \
                bf16 or f32 first";
    }
    let supports = |dtype: DType| {
        if let Some(unary) = UnaryOp::ALL.into_iter().find(|u| u.name() == op) {
            unary.supports(dtype)
        } else if let Some(binary) = BinaryOp::ALL.into_iter().find(|b| b.name() == op) {
            binary.supports(dtype)
        } else {
            true
        }
    };
    match (
        supports(DType::F32),
        supports(DType::I32),
        supports(DType::Bool),
    ) {
        (true, false, false) => "cast to a float dtype first",
        (false, true, true) => "cast to an integer or bool dtype first",
        (false, true, false) => "cast to an integer dtype first",
        (true, true, false) => "cast to an integer or float dtype first",
        _ => "cast to a dtype the op supports first",
    }
}

/// The semantics of the arithmetic ops on one primitive type; `None` for ops the type
/// lacks. Comparisons, `isnan` and `isinf` are not here: [`Scalar`] handles them for every
/// type at once.
trait Arith: Copy {
    fn eval_unary(self, op: UnaryOp) -> Option<Self>;
    fn eval_binary(self, op: BinaryOp, rhs: Self) -> Option<Self>;
    fn eval_mul_add(self, b: Self, c: Self) -> Self;
}

/// `|x|`, wrapping on signed integers.
macro_rules! int_abs {
    (signed, $x:expr) => {
        $x.wrapping_abs()
    };
    (unsigned, $x:expr) => {
        $x
    };
}

/// `-1`, `0` or `1`.
macro_rules! int_sign {
    (signed, $x:expr) => {
        $x.signum()
    };
    (unsigned, $x:expr) => {
        Self::from($x != 0)
    };
}

/// `a^b` per [`BinaryOp::Pow`]: exact with wrapping for `b >= 0`; for `b < 0`, `1 / a^|b|`
/// truncated, which is `±1` for `a == ±1` and `0` otherwise (`0` also for `a == 0`, where
/// the quotient does not exist).
macro_rules! int_pow {
    (signed, $a:expr, $b:expr) => {
        if $b < 0 {
            match $a {
                1 => 1,
                // Two's complement keeps the parity in the low bit of negative numbers too.
                -1 => {
                    if $b & 1 == 0 {
                        1
                    } else {
                        -1
                    }
                }
                _ => 0,
            }
        } else {
            int_pow!(unsigned, $a, $b)
        }
    };
    (unsigned, $a:expr, $b:expr) => {{
        // Square and multiply over the full exponent: `wrapping_pow` takes only a `u32`, and
        // both compute a^b modulo 2^bits.
        let (mut base, mut exponent, mut result) = ($a, $b as u64, 1 as Self);
        while exponent > 0 {
            if exponent & 1 == 1 {
                result = result.wrapping_mul(base);
            }
            base = base.wrapping_mul(base);
            exponent >>= 1;
        }
        result
    }};
}

macro_rules! impl_int_arith {
    ($($t:ty: $signedness:ident),* $(,)?) => {$(
        impl Arith for $t {
            fn eval_unary(self, op: UnaryOp) -> Option<Self> {
                Some(match op {
                    UnaryOp::Neg => self.wrapping_neg(),
                    UnaryOp::Not => !self,
                    UnaryOp::Abs => int_abs!($signedness, self),
                    UnaryOp::Sign => int_sign!($signedness, self),
                    // Integers are already integral.
                    UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => self,
                    _ => return None,
                })
            }

            fn eval_binary(self, op: BinaryOp, rhs: Self) -> Option<Self> {
                Some(match op {
                    BinaryOp::Add => self.wrapping_add(rhs),
                    BinaryOp::Sub => self.wrapping_sub(rhs),
                    BinaryOp::Mul => self.wrapping_mul(rhs),
                    // `a / 0 == a` as in WGSL; `wrapping_div` gives `MIN / -1 == MIN`.
                    BinaryOp::Div => {
                        if rhs == 0 {
                            self
                        } else {
                            self.wrapping_div(rhs)
                        }
                    }
                    // `a % 0 == 0`; `wrapping_rem` gives `MIN % -1 == 0`.
                    BinaryOp::Rem => {
                        if rhs == 0 {
                            0
                        } else {
                            self.wrapping_rem(rhs)
                        }
                    }
                    BinaryOp::Pow => int_pow!($signedness, self, rhs),
                    BinaryOp::Max => self.max(rhs),
                    BinaryOp::Min => self.min(rhs),
                    BinaryOp::And => self & rhs,
                    BinaryOp::Or => self | rhs,
                    BinaryOp::Xor => self ^ rhs,
                    // The amount is the rhs as a `u32`, taken modulo the width by the
                    // wrapping shifts; since the width divides 2^32 this is `rhs mod bits`
                    // for negative amounts too.
                    BinaryOp::Shl => self.wrapping_shl(rhs as u32),
                    BinaryOp::Shr => self.wrapping_shr(rhs as u32),
                    _ => return None,
                })
            }

            fn eval_mul_add(self, b: Self, c: Self) -> Self {
                self.wrapping_mul(b).wrapping_add(c)
            }
        }
    )*};
}

impl_int_arith! {
    u8: unsigned, u16: unsigned, u32: unsigned, u64: unsigned,
    i8: signed, i16: signed, i32: signed, i64: signed,
}

macro_rules! impl_float_arith {
    ($($t:ty: erf = $erf:expr),* $(,)?) => {$(
        impl Arith for $t {
            fn eval_unary(self, op: UnaryOp) -> Option<Self> {
                Some(match op {
                    UnaryOp::Neg => -self,
                    UnaryOp::Abs => self.abs(),
                    UnaryOp::Sign => {
                        if self.is_nan() {
                            self
                        } else if self > 0.0 {
                            1.0
                        } else if self < 0.0 {
                            -1.0
                        } else {
                            0.0
                        }
                    }
                    UnaryOp::Reciprocal => 1.0 / self,
                    UnaryOp::Sqrt => self.sqrt(),
                    UnaryOp::Rsqrt => 1.0 / self.sqrt(),
                    UnaryOp::Exp => self.exp(),
                    UnaryOp::Exp2 => self.exp2(),
                    UnaryOp::Log => self.ln(),
                    UnaryOp::Log2 => self.log2(),
                    UnaryOp::Sin => self.sin(),
                    UnaryOp::Cos => self.cos(),
                    UnaryOp::Tan => self.tan(),
                    UnaryOp::Tanh => self.tanh(),
                    UnaryOp::Erf => $erf(self),
                    UnaryOp::Floor => self.floor(),
                    UnaryOp::Ceil => self.ceil(),
                    UnaryOp::Round => self.round_ties_even(),
                    UnaryOp::Trunc => self.trunc(),
                    UnaryOp::Not | UnaryOp::IsNan | UnaryOp::IsInf => return None,
                })
            }

            fn eval_binary(self, op: BinaryOp, rhs: Self) -> Option<Self> {
                Some(match op {
                    BinaryOp::Add => self + rhs,
                    BinaryOp::Sub => self - rhs,
                    BinaryOp::Mul => self * rhs,
                    BinaryOp::Div => self / rhs,
                    BinaryOp::Rem => self % rhs,
                    BinaryOp::Pow => self.powf(rhs),
                    // NaN wins, and -0 < +0, as IEEE 754-2019's `maximum` and `minimum`
                    // define it, so the result never depends on the operand order (Rust's
                    // `max` may return either zero).
                    BinaryOp::Max => {
                        if self.is_nan() {
                            self
                        } else if rhs.is_nan() {
                            rhs
                        } else if self > rhs || (self == rhs && rhs.is_sign_negative()) {
                            self
                        } else {
                            rhs
                        }
                    }
                    BinaryOp::Min => {
                        if self.is_nan() {
                            self
                        } else if rhs.is_nan() {
                            rhs
                        } else if self < rhs || (self == rhs && self.is_sign_negative()) {
                            self
                        } else {
                            rhs
                        }
                    }
                    _ => return None,
                })
            }

            fn eval_mul_add(self, b: Self, c: Self) -> Self {
                // Fused: one rounding, like C's `fma`.
                <$t>::mul_add(self, b, c)
            }
        }
    )*};
}

impl_float_arith! {
    f32: erf = erf_f32,
    f64: erf = erf,
}

/// `erf` for `f32`, through `f64`, whose `erf` is far more precise than `f32` needs.
fn erf_f32(x: f32) -> f32 {
    erf(f64::from(x)) as f32
}

/// `a * b + c` for values of `f16` or `bf16` (given exactly as `f64`), rounded once, to
/// `f32` *to odd*; the caller's rounding to the half type then rounds the exact result
/// once (see [`f64_to_f32_round_to_odd`]).
///
/// The product is exact in `f64`: at most 22 significant bits, within `f64`'s exponent range
/// for both half types. The sum is rounded to `f64` to odd, using the exact error of the
/// addition (Knuth's two-sum), and from there to `f32` to odd, which composes.
fn half_mul_add(a: f64, b: f64, c: f64) -> f32 {
    let product = a * b;
    let sum = product + c;
    if !sum.is_finite() {
        return sum as f32;
    }
    let c_part = sum - product;
    let error = (product - (sum - c_part)) + (c - c_part);
    let bits = sum.to_bits();
    let odd = if error == 0.0 || bits & 1 == 1 {
        sum
    } else if (error > 0.0) == (sum > 0.0) {
        // Inexact and even: step to the neighbour on the exact value's side. An inexact sum
        // is never zero (sums near zero are exact), so its sign says which way that is.
        f64::from_bits(bits + 1)
    } else {
        f64::from_bits(bits - 1)
    };
    f64_to_f32_round_to_odd(odd)
}

/// The comparison `op` on two values of one type (IEEE semantics for floats).
fn compare<T: PartialOrd + Copy>(op: BinaryOp, a: T, b: T) -> Option<bool> {
    Some(match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => a < b,
        BinaryOp::Le => a <= b,
        BinaryOp::Gt => a > b,
        BinaryOp::Ge => a >= b,
        _ => return None,
    })
}

/// The logical ops on `bool`: or for `add`, `or` and `max`, and for `mul`, `and` and `min`.
fn bool_binary(op: BinaryOp, a: bool, b: bool) -> Option<bool> {
    Some(match op {
        BinaryOp::Add | BinaryOp::Or | BinaryOp::Max => a | b,
        BinaryOp::Mul | BinaryOp::And | BinaryOp::Min => a & b,
        BinaryOp::Xor => a ^ b,
        _ => return None,
    })
}

impl Scalar {
    /// Applies `op` as [`UnaryOp`]'s documentation defines it.
    ///
    /// Fails with [`ScalarError::Unsupported`] when [`UnaryOp::supports`] is false for the
    /// value's dtype.
    ///
    /// ```
    /// use tessel_shape::{DType, Scalar, UnaryOp};
    ///
    /// assert_eq!(Scalar::F32(2.5).unary(UnaryOp::Round), Ok(Scalar::F32(2.0)));
    /// assert_eq!(Scalar::I8(i8::MIN).unary(UnaryOp::Abs), Ok(Scalar::I8(i8::MIN)));
    /// assert_eq!(Scalar::I32(7).unary(UnaryOp::IsNan), Ok(Scalar::Bool(false)));
    /// let err = Scalar::I32(4).unary(UnaryOp::Sqrt).unwrap_err();
    /// assert_eq!(err.to_string(), "sqrt is not defined for i32; cast to a float dtype first");
    /// ```
    pub fn unary(self, op: UnaryOp) -> Result<Scalar, ScalarError> {
        let unsupported = || ScalarError::Unsupported {
            op: op.name().to_owned(),
            dtype: self.dtype(),
        };
        if !op.supports(self.dtype()) {
            return Err(unsupported());
        }
        let result = match (op, self) {
            (UnaryOp::IsNan, _) => Some(Self::Bool(self.is_nan())),
            (UnaryOp::IsInf, _) => Some(Self::Bool(self.is_infinite())),
            (UnaryOp::Not, Self::Bool(x)) => Some(Self::Bool(!x)),
            // No arithmetic on these (`supports` is false, so this is not reached).
            (_, Self::Bool(_) | Self::F8E4M3(_) | Self::F8E5M2(_)) => None,
            (_, Self::U8(x)) => x.eval_unary(op).map(Self::U8),
            (_, Self::U16(x)) => x.eval_unary(op).map(Self::U16),
            (_, Self::U32(x)) => x.eval_unary(op).map(Self::U32),
            (_, Self::U64(x)) => x.eval_unary(op).map(Self::U64),
            (_, Self::I8(x)) => x.eval_unary(op).map(Self::I8),
            (_, Self::I16(x)) => x.eval_unary(op).map(Self::I16),
            (_, Self::I32(x)) => x.eval_unary(op).map(Self::I32),
            (_, Self::I64(x)) => x.eval_unary(op).map(Self::I64),
            (_, Self::F16(x)) => x
                .to_f32()
                .eval_unary(op)
                .map(|y| Self::F16(f16::from_f32(y))),
            (_, Self::BF16(x)) => x
                .to_f32()
                .eval_unary(op)
                .map(|y| Self::BF16(bf16::from_f32(y))),
            (_, Self::F32(x)) => x.eval_unary(op).map(Self::F32),
            (_, Self::F64(x)) => x.eval_unary(op).map(Self::F64),
        };
        result.ok_or_else(unsupported)
    }

    /// Applies `op` to `self` and `rhs` as [`BinaryOp`]'s documentation defines it.
    ///
    /// Both operands must have one dtype ([`ScalarError::DTypeMismatch`] otherwise; promote
    /// and cast first), which [`BinaryOp::supports`] must accept
    /// ([`ScalarError::Unsupported`] otherwise).
    ///
    /// ```
    /// use tessel_shape::{BinaryOp, Scalar};
    ///
    /// let div = |a: i32, b: i32| Scalar::I32(a).binary(BinaryOp::Div, Scalar::I32(b));
    /// assert_eq!(div(7, -2), Ok(Scalar::I32(-3)));
    /// assert_eq!(div(7, 0), Ok(Scalar::I32(7)));
    /// assert_eq!(div(i32::MIN, -1), Ok(Scalar::I32(i32::MIN)));
    /// let lt = Scalar::F32(1.0).binary(BinaryOp::Lt, Scalar::F32(f32::NAN));
    /// assert_eq!(lt, Ok(Scalar::Bool(false)));
    /// assert!(Scalar::F32(1.0).binary(BinaryOp::Add, Scalar::F64(1.0)).is_err());
    /// ```
    pub fn binary(self, op: BinaryOp, rhs: Scalar) -> Result<Scalar, ScalarError> {
        let dtype = self.dtype();
        if rhs.dtype() != dtype {
            return Err(ScalarError::DTypeMismatch {
                op: op.name().to_owned(),
                lhs: dtype,
                rhs: rhs.dtype(),
            });
        }
        let unsupported = || ScalarError::Unsupported {
            op: op.name().to_owned(),
            dtype,
        };
        if !op.supports(dtype) {
            return Err(unsupported());
        }
        let result = if op.is_comparison() {
            match (self, rhs) {
                (Self::Bool(a), Self::Bool(b)) => compare(op, a, b),
                (Self::U8(a), Self::U8(b)) => compare(op, a, b),
                (Self::U16(a), Self::U16(b)) => compare(op, a, b),
                (Self::U32(a), Self::U32(b)) => compare(op, a, b),
                (Self::U64(a), Self::U64(b)) => compare(op, a, b),
                (Self::I8(a), Self::I8(b)) => compare(op, a, b),
                (Self::I16(a), Self::I16(b)) => compare(op, a, b),
                (Self::I32(a), Self::I32(b)) => compare(op, a, b),
                (Self::I64(a), Self::I64(b)) => compare(op, a, b),
                (Self::F16(a), Self::F16(b)) => compare(op, a.to_f32(), b.to_f32()),
                (Self::BF16(a), Self::BF16(b)) => compare(op, a.to_f32(), b.to_f32()),
                (Self::F32(a), Self::F32(b)) => compare(op, a, b),
                (Self::F64(a), Self::F64(b)) => compare(op, a, b),
                _ => None,
            }
            .map(Self::Bool)
        } else {
            match (self, rhs) {
                (Self::Bool(a), Self::Bool(b)) => bool_binary(op, a, b).map(Self::Bool),
                (Self::U8(a), Self::U8(b)) => a.eval_binary(op, b).map(Self::U8),
                (Self::U16(a), Self::U16(b)) => a.eval_binary(op, b).map(Self::U16),
                (Self::U32(a), Self::U32(b)) => a.eval_binary(op, b).map(Self::U32),
                (Self::U64(a), Self::U64(b)) => a.eval_binary(op, b).map(Self::U64),
                (Self::I8(a), Self::I8(b)) => a.eval_binary(op, b).map(Self::I8),
                (Self::I16(a), Self::I16(b)) => a.eval_binary(op, b).map(Self::I16),
                (Self::I32(a), Self::I32(b)) => a.eval_binary(op, b).map(Self::I32),
                (Self::I64(a), Self::I64(b)) => a.eval_binary(op, b).map(Self::I64),
                (Self::F16(a), Self::F16(b)) => (a.to_f32())
                    .eval_binary(op, b.to_f32())
                    .map(|y| Self::F16(f16::from_f32(y))),
                (Self::BF16(a), Self::BF16(b)) => (a.to_f32())
                    .eval_binary(op, b.to_f32())
                    .map(|y| Self::BF16(bf16::from_f32(y))),
                (Self::F32(a), Self::F32(b)) => a.eval_binary(op, b).map(Self::F32),
                (Self::F64(a), Self::F64(b)) => a.eval_binary(op, b).map(Self::F64),
                _ => None,
            }
        };
        result.ok_or_else(unsupported)
    }

    /// Applies `op` to `a`, `b` and `c` as [`TernaryOp`]'s documentation defines it.
    ///
    /// `where` needs a `bool` condition `a` ([`ScalarError::ConditionNotBool`]) and `b`, `c`
    /// of one dtype; `mad` needs all three of one dtype ([`ScalarError::DTypeMismatch`]).
    /// `mad` rounds once on every float dtype, `f16` and `bf16` included.
    ///
    /// ```
    /// use tessel_shape::{Scalar, TernaryOp};
    ///
    /// let (a, b, c) = (Scalar::Bool(true), Scalar::I32(1), Scalar::I32(2));
    /// assert_eq!(Scalar::ternary(TernaryOp::Where, a, b, c), Ok(b));
    /// let mad = Scalar::ternary(TernaryOp::MulAdd, Scalar::U8(16), Scalar::U8(16), Scalar::U8(1));
    /// assert_eq!(mad, Ok(Scalar::U8(1)));
    /// ```
    pub fn ternary(op: TernaryOp, a: Scalar, b: Scalar, c: Scalar) -> Result<Scalar, ScalarError> {
        let mismatch = |lhs: Scalar, rhs: Scalar| ScalarError::DTypeMismatch {
            op: op.name().to_owned(),
            lhs: lhs.dtype(),
            rhs: rhs.dtype(),
        };
        let unsupported = || ScalarError::Unsupported {
            op: op.name().to_owned(),
            dtype: b.dtype(),
        };
        match op {
            TernaryOp::Where => {
                let Self::Bool(condition) = a else {
                    return Err(ScalarError::ConditionNotBool {
                        op: op.name().to_owned(),
                        dtype: a.dtype(),
                    });
                };
                if b.dtype() != c.dtype() {
                    return Err(mismatch(b, c));
                }
                if !op.supports(b.dtype()) {
                    return Err(unsupported());
                }
                Ok(if condition { b } else { c })
            }
            TernaryOp::MulAdd => {
                if b.dtype() != a.dtype() {
                    return Err(mismatch(a, b));
                }
                if c.dtype() != a.dtype() {
                    return Err(mismatch(a, c));
                }
                if !op.supports(a.dtype()) {
                    return Err(unsupported());
                }
                let result = match (a, b, c) {
                    (Self::Bool(x), Self::Bool(y), Self::Bool(z)) => Some(Self::Bool((x & y) | z)),
                    (Self::U8(x), Self::U8(y), Self::U8(z)) => Some(Self::U8(x.eval_mul_add(y, z))),
                    (Self::U16(x), Self::U16(y), Self::U16(z)) => {
                        Some(Self::U16(x.eval_mul_add(y, z)))
                    }
                    (Self::U32(x), Self::U32(y), Self::U32(z)) => {
                        Some(Self::U32(x.eval_mul_add(y, z)))
                    }
                    (Self::U64(x), Self::U64(y), Self::U64(z)) => {
                        Some(Self::U64(x.eval_mul_add(y, z)))
                    }
                    (Self::I8(x), Self::I8(y), Self::I8(z)) => Some(Self::I8(x.eval_mul_add(y, z))),
                    (Self::I16(x), Self::I16(y), Self::I16(z)) => {
                        Some(Self::I16(x.eval_mul_add(y, z)))
                    }
                    (Self::I32(x), Self::I32(y), Self::I32(z)) => {
                        Some(Self::I32(x.eval_mul_add(y, z)))
                    }
                    (Self::I64(x), Self::I64(y), Self::I64(z)) => {
                        Some(Self::I64(x.eval_mul_add(y, z)))
                    }
                    (Self::F16(x), Self::F16(y), Self::F16(z)) => Some(Self::F16(f16::from_f32(
                        half_mul_add(x.to_f64(), y.to_f64(), z.to_f64()),
                    ))),
                    (Self::BF16(x), Self::BF16(y), Self::BF16(z)) => Some(Self::BF16(
                        bf16::from_f32(half_mul_add(x.to_f64(), y.to_f64(), z.to_f64())),
                    )),
                    (Self::F32(x), Self::F32(y), Self::F32(z)) => {
                        Some(Self::F32(x.eval_mul_add(y, z)))
                    }
                    (Self::F64(x), Self::F64(y), Self::F64(z)) => {
                        Some(Self::F64(x.eval_mul_add(y, z)))
                    }
                    _ => None,
                };
                result.ok_or_else(unsupported)
            }
        }
    }
}
