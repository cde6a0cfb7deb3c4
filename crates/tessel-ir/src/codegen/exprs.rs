//! One scalar operation as a C expression, with [`Scalar`]'s semantics.
//!
//! Operands are always plain names or literals (every instruction's result is a named
//! variable), so an operand may appear more than once in an expression without being
//! evaluated twice in any way that matters.
//!
//! How C is made to agree with the reference:
//!
//! - Integer `+ - * neg mad` run in an unsigned type at least as wide as `int`, where they
//!   wrap by definition; narrow types would otherwise be promoted to a signed `int` that
//!   can overflow (`u16 * u16`). Where the dialect's signed arithmetic wraps
//!   ([`CStyle::signed_wraps`](super::CStyle::signed_wraps)), `i32`/`i64` ones are plain.
//! - Integer `/ %` and `pow` go through helpers (see [`Helper`]); shifts mask the amount
//!   by the bit width (`b mod bits`, negative amounts included).
//! - `f16`/`bf16` values are their bit patterns; every op converts to `float`, computes
//!   there and rounds back once, as [`Scalar`] does. `mad` on them rounds once.
//! - `f8e4m3`/`f8e5m2` values are their bytes; they only cast (through `float`, like the
//!   half types), move and select.
//! - Float `max`/`min` are helpers (NaN wins, `-0 < +0`), `round` is `rint` (ties to even
//!   in the default rounding mode), `erf` is fdlibm's, computed in `double` (on `f32`, the
//!   dialect's own where [`CStyle::native_f32_erf`](super::CStyle::native_f32_erf) says so).
//! - Float-to-integer casts saturate (NaN gives 0) through helpers, since C leaves
//!   out-of-range conversions undefined.

use tessel_shape::{BinaryOp, DType, Scalar, TernaryOp, UnaryOp};

use super::CodegenError;
use super::cstyle::CStyle;
use super::fastmath::Fast;
use super::helpers::{Helper, Helpers, wide_unsigned};

/// Renders scalar expressions for one dialect, recording the helpers they call.
pub(super) struct Exprs<'d> {
    pub(super) dialect: &'d CStyle,
    /// The kernel's name, for errors.
    kernel: &'d str,
    pub(super) helpers: Helpers,
}

impl<'d> Exprs<'d> {
    pub(super) fn new(dialect: &'d CStyle, kernel: &'d str) -> Self {
        Exprs {
            dialect,
            kernel,
            helpers: Helpers::new(dialect),
        }
    }

    /// The dialect's type for values of `dtype`, or an error naming `op`.
    pub(super) fn ty_for(&self, op: &str, dtype: DType) -> Result<&'static str, CodegenError> {
        (self.dialect.type_name)(dtype).ok_or_else(|| self.unsupported(op, dtype))
    }

    /// Checks that the dialect has `double`, which `op` on `dtype` is computed in (to round
    /// once, as the reference does); the error names the op and the operand's dtype.
    fn require_f64(&self, op: &str, dtype: DType) -> Result<(), CodegenError> {
        if (self.dialect.type_name)(DType::F64).is_some() {
            Ok(())
        } else {
            Err(self.unsupported(&format!("{op} (computed in f64)"), dtype))
        }
    }

    fn unsupported(&self, op: &str, dtype: DType) -> CodegenError {
        CodegenError::UnsupportedOp {
            kernel: self.kernel.to_owned(),
            dialect: self.dialect.name,
            op: op.to_owned(),
            dtype,
        }
    }

    /// The wide unsigned type integer arithmetic on `dtype` runs in.
    fn wide(&self, op: &str, dtype: DType) -> Result<&'static str, CodegenError> {
        Ok(wide_unsigned(
            dtype,
            self.ty_for(op, DType::U32)?,
            self.ty_for(op, DType::U64)?,
        ))
    }

    /// Whether `+ - *` on `dtype` may be written plainly: signed 32- and 64-bit integers
    /// where the dialect's signed arithmetic wraps.
    fn plain_signed(&self, dtype: DType) -> bool {
        self.dialect.signed_wraps && matches!(dtype, DType::I32 | DType::I64)
    }

    fn suffix(&self, dtype: DType) -> &'static str {
        if dtype == DType::F64 {
            self.dialect.f64_math_suffix
        } else {
            self.dialect.f32_math_suffix
        }
    }

    /// The half (or float8) type's value converted to `float`.
    fn half_to_f32(&mut self, dtype: DType, a: &str) -> String {
        let helper = match dtype {
            DType::F16 => Helper::F16ToF32,
            DType::F8E4M3 | DType::F8E5M2 => Helper::F8ToF32(dtype),
            _ => Helper::Bf16ToF32,
        };
        format!("{}({a})", self.helpers.call(helper))
    }

    /// A `float` rounded to the half (or float8) type.
    fn f32_to_half(&mut self, dtype: DType, a: &str) -> String {
        let helper = match dtype {
            DType::F16 => Helper::F32ToF16,
            DType::F8E4M3 | DType::F8E5M2 => Helper::F32ToF8(dtype),
            _ => Helper::F32ToBf16,
        };
        format!("{}({a})", self.helpers.call(helper))
    }

    /// A literal of `value`'s dtype.
    pub(super) fn constant(&mut self, value: Scalar) -> Result<String, CodegenError> {
        let t = self.ty_for("const", value.dtype())?;
        Ok(match value {
            Scalar::Bool(b) => b.to_string(),
            Scalar::F16(_) | Scalar::BF16(_) => format!("(({t})0x{:04x}u)", value.to_bits()),
            Scalar::F8E4M3(_) | Scalar::F8E5M2(_) => {
                format!("(({t})0x{:02x}u)", value.to_bits())
            }
            Scalar::F32(x) => {
                if x.is_nan() {
                    // The exact payload: `NAN` would be whichever NaN the platform picks.
                    let from_bits = self.helpers.call(Helper::Bitcast(DType::U32, DType::F32));
                    format!("{from_bits}(0x{:08x}u)", x.to_bits())
                } else if x.is_infinite() {
                    if x > 0.0 {
                        "INFINITY".into()
                    } else {
                        "(-INFINITY)".into()
                    }
                } else {
                    // Rust's shortest round-trip form, which C parses back to the same float.
                    parenthesize(format!("{x:?}f"))
                }
            }
            Scalar::F64(x) => {
                if x.is_nan() {
                    let from_bits = self.helpers.call(Helper::Bitcast(DType::U64, DType::F64));
                    let u64_t = self.ty_for("const", DType::U64)?;
                    format!("{from_bits}(({u64_t})0x{:016x}u)", x.to_bits())
                } else if x.is_infinite() {
                    if x > 0.0 {
                        format!("(({t})INFINITY)")
                    } else {
                        format!("(-({t})INFINITY)")
                    }
                } else {
                    parenthesize(format!("{x:?}"))
                }
            }
            _ => int_literal(value, t),
        })
    }

    /// `op a`, for an operand of `dtype`.
    pub(super) fn unary(
        &mut self,
        op: UnaryOp,
        dtype: DType,
        a: &str,
    ) -> Result<String, CodegenError> {
        let name = op.name();
        if !op.supports(dtype) {
            return Err(self.unsupported(name, dtype));
        }
        let t = self.ty_for(name, dtype)?;
        if matches!(op, UnaryOp::IsNan | UnaryOp::IsInf) && !dtype.is_float() {
            return Ok("false".into());
        }
        Ok(match dtype {
            DType::Bool => match op {
                UnaryOp::Not => format!("(!{a})"),
                _ => return Err(self.unsupported(name, dtype)),
            },
            DType::F16 | DType::BF16 => {
                if op == UnaryOp::Erf && !self.dialect.native_f32_erf {
                    self.require_f64(name, dtype)?;
                }
                let x = self.half_to_f32(dtype, a);
                let r = self.float_unary(op, DType::F32, &x)?;
                if matches!(op, UnaryOp::IsNan | UnaryOp::IsInf) {
                    r
                } else {
                    self.f32_to_half(dtype, &r)
                }
            }
            DType::F32 | DType::F64 => {
                if op == UnaryOp::Erf && (dtype == DType::F64 || !self.dialect.native_f32_erf) {
                    self.require_f64(name, dtype)?;
                }
                self.float_unary(op, dtype, a)?
            }
            _ => {
                let w = self.wide(name, dtype)?;
                match op {
                    UnaryOp::Neg => format!("({t})(({w})0 - ({w}){a})"),
                    UnaryOp::Not => format!("({t})~{a}"),
                    UnaryOp::Abs if dtype.is_signed() => {
                        format!("({a} < 0 ? ({t})(({w})0 - ({w}){a}) : {a})")
                    }
                    UnaryOp::Sign if dtype.is_signed() => format!("({t})(({a} > 0) - ({a} < 0))"),
                    UnaryOp::Sign => format!("({t})({a} != 0)"),
                    // Integers are already integral, and unsigned ones their own magnitude.
                    UnaryOp::Abs
                    | UnaryOp::Floor
                    | UnaryOp::Ceil
                    | UnaryOp::Round
                    | UnaryOp::Trunc => a.to_owned(),
                    _ => return Err(self.unsupported(name, dtype)),
                }
            }
        })
    }

    /// A unary op on `f32` or `f64`.
    fn float_unary(&mut self, op: UnaryOp, dtype: DType, a: &str) -> Result<String, CodegenError> {
        let s = self.suffix(dtype);
        let (one, zero) = if dtype == DType::F64 {
            ("1.0", "0.0")
        } else {
            ("1.0f", "0.0f")
        };
        let call = |f: &str| format!("{f}{s}({a})");
        if dtype == DType::F32 && self.dialect.own_f32_math {
            let fast = match op {
                UnaryOp::Exp => Some(Fast::Exp),
                UnaryOp::Exp2 => Some(Fast::Exp2),
                UnaryOp::Log => Some(Fast::Log),
                UnaryOp::Log2 => Some(Fast::Log2),
                UnaryOp::Tanh => Some(Fast::Tanh),
                _ => None,
            };
            if let Some(fast) = fast {
                return Ok(format!("{}({a})", self.helpers.call(Helper::Fast(fast))));
            }
        }
        Ok(match op {
            UnaryOp::Neg => format!("(-{a})"),
            UnaryOp::Abs => call("fabs"),
            UnaryOp::Sign => format!(
                "({a} != {a} ? {a} : ({a} > {zero} ? {one} : ({a} < {zero} ? -{one} : {zero})))"
            ),
            UnaryOp::Reciprocal => format!("({one} / {a})"),
            UnaryOp::Sqrt => call("sqrt"),
            UnaryOp::Rsqrt => format!("({one} / {})", call("sqrt")),
            UnaryOp::Exp => call("exp"),
            UnaryOp::Exp2 => call("exp2"),
            UnaryOp::Log => call("log"),
            UnaryOp::Log2 => call("log2"),
            UnaryOp::Sin => call("sin"),
            UnaryOp::Cos => call("cos"),
            UnaryOp::Tan => call("tan"),
            // tanh is exactly ±1 in f32 and f64 beyond |x| = 20; saying so explicitly keeps
            // drivers whose tanh is inexact at large |x| (PoCL gives > -1 at -inf) exact.
            UnaryOp::Tanh => {
                let (abs, tanh, sign) = (
                    call("fabs"),
                    call("tanh"),
                    format!("copysign{s}({one}, {a})"),
                );
                let limit = if dtype == DType::F64 { "20.0" } else { "20.0f" };
                format!("({abs} > {limit} ? {sign} : {tanh})")
            }
            UnaryOp::Erf if dtype == DType::F32 && self.dialect.native_f32_erf => call("erf"),
            UnaryOp::Erf => {
                let erf = self.helpers.call(Helper::Erf);
                if dtype == DType::F64 {
                    format!("{erf}({a})")
                } else {
                    // The reference computes f32's erf in f64 and rounds once.
                    format!("(float){erf}((double){a})")
                }
            }
            UnaryOp::Floor => call("floor"),
            UnaryOp::Ceil => call("ceil"),
            UnaryOp::Round => call("rint"),
            UnaryOp::Trunc => call("trunc"),
            UnaryOp::IsNan => format!("({a} != {a})"),
            UnaryOp::IsInf => format!("({} == INFINITY)", call("fabs")),
            UnaryOp::Not => return Err(self.unsupported(op.name(), dtype)),
        })
    }

    /// `a op b`, for operands of `dtype`.
    pub(super) fn binary(
        &mut self,
        op: BinaryOp,
        dtype: DType,
        a: &str,
        b: &str,
    ) -> Result<String, CodegenError> {
        let name = op.name();
        if !op.supports(dtype) {
            return Err(self.unsupported(name, dtype));
        }
        let t = self.ty_for(name, dtype)?;
        let cmp = match op {
            BinaryOp::Eq => Some("=="),
            BinaryOp::Ne => Some("!="),
            BinaryOp::Lt => Some("<"),
            BinaryOp::Le => Some("<="),
            BinaryOp::Gt => Some(">"),
            BinaryOp::Ge => Some(">="),
            _ => None,
        };
        if let Some(cmp) = cmp {
            return Ok(if matches!(dtype, DType::F16 | DType::BF16) {
                let (x, y) = (self.half_to_f32(dtype, a), self.half_to_f32(dtype, b));
                format!("({x} {cmp} {y})")
            } else {
                format!("({a} {cmp} {b})")
            });
        }
        Ok(match dtype {
            DType::Bool => match op {
                BinaryOp::Add | BinaryOp::Or | BinaryOp::Max => format!("({a} || {b})"),
                BinaryOp::Mul | BinaryOp::And | BinaryOp::Min => format!("({a} && {b})"),
                BinaryOp::Xor => format!("({a} != {b})"),
                _ => return Err(self.unsupported(name, dtype)),
            },
            DType::F16 | DType::BF16 => {
                let (x, y) = (self.half_to_f32(dtype, a), self.half_to_f32(dtype, b));
                let r = self.float_binary(op, DType::F32, &x, &y)?;
                self.f32_to_half(dtype, &r)
            }
            DType::F32 | DType::F64 => self.float_binary(op, dtype, a, b)?,
            _ => {
                let w = self.wide(name, dtype)?;
                let mask = dtype.bits() - 1;
                let plain = self.plain_signed(dtype);
                match op {
                    BinaryOp::Add if plain => format!("({a} + {b})"),
                    BinaryOp::Sub if plain => format!("({a} - {b})"),
                    BinaryOp::Mul if plain => format!("({a} * {b})"),
                    BinaryOp::Add => format!("({t})(({w}){a} + ({w}){b})"),
                    BinaryOp::Sub => format!("({t})(({w}){a} - ({w}){b})"),
                    BinaryOp::Mul => format!("({t})(({w}){a} * ({w}){b})"),
                    BinaryOp::Div => {
                        format!("{}({a}, {b})", self.helpers.call(Helper::IntDiv(dtype)))
                    }
                    BinaryOp::Rem => {
                        format!("{}({a}, {b})", self.helpers.call(Helper::IntRem(dtype)))
                    }
                    BinaryOp::Pow => {
                        format!("{}({a}, {b})", self.helpers.call(Helper::IntPow(dtype)))
                    }
                    BinaryOp::Max => format!("({a} > {b} ? {a} : {b})"),
                    BinaryOp::Min => format!("({a} < {b} ? {a} : {b})"),
                    BinaryOp::And => format!("({t})({a} & {b})"),
                    BinaryOp::Or => format!("({t})({a} | {b})"),
                    BinaryOp::Xor => format!("({t})({a} ^ {b})"),
                    // Shifting a signed value left is undefined in C when it overflows, so
                    // shift its unsigned bits; right shifts of signed values are arithmetic
                    // on every compiler Tessel targets.
                    BinaryOp::Shl => format!("({t})(({w}){a} << (({w}){b} & {mask}u))"),
                    BinaryOp::Shr => format!("({t})({a} >> (({w}){b} & {mask}u))"),
                    _ => return Err(self.unsupported(name, dtype)),
                }
            }
        })
    }

    /// A non-comparison binary op on `f32` or `f64`.
    fn float_binary(
        &mut self,
        op: BinaryOp,
        dtype: DType,
        a: &str,
        b: &str,
    ) -> Result<String, CodegenError> {
        let s = self.suffix(dtype);
        Ok(match op {
            BinaryOp::Add => format!("({a} + {b})"),
            BinaryOp::Sub => format!("({a} - {b})"),
            BinaryOp::Mul => format!("({a} * {b})"),
            BinaryOp::Div => format!("({a} / {b})"),
            BinaryOp::Rem => format!("fmod{s}({a}, {b})"),
            BinaryOp::Pow => format!("pow{s}({a}, {b})"),
            BinaryOp::Max => format!("{}({a}, {b})", self.helpers.call(Helper::FloatMax(dtype))),
            BinaryOp::Min => format!("{}({a}, {b})", self.helpers.call(Helper::FloatMin(dtype))),
            _ => return Err(self.unsupported(op.name(), dtype)),
        })
    }

    /// `op a, b, c`, where `dtype` is the dtype of `b` (and `c`; and `a` for `mad`).
    pub(super) fn ternary(
        &mut self,
        op: TernaryOp,
        dtype: DType,
        a: &str,
        b: &str,
        c: &str,
    ) -> Result<String, CodegenError> {
        let name = op.name();
        if !op.supports(dtype) {
            return Err(self.unsupported(name, dtype));
        }
        let t = self.ty_for(name, dtype)?;
        Ok(match op {
            TernaryOp::Where => format!("({a} ? {b} : {c})"),
            TernaryOp::MulAdd => match dtype {
                DType::Bool => format!("(({a} && {b}) || {c})"),
                DType::F32 | DType::F64 => format!("fma{}({a}, {b}, {c})", self.suffix(dtype)),
                DType::F16 | DType::BF16 => {
                    self.require_f64(name, dtype)?;
                    let (x, y, z) = (
                        self.half_to_f32(dtype, a),
                        self.half_to_f32(dtype, b),
                        self.half_to_f32(dtype, c),
                    );
                    let fma = self.helpers.call(Helper::HalfFma);
                    let r = format!("{fma}((double){x}, (double){y}, (double){z})");
                    self.f32_to_half(dtype, &r)
                }
                _ if self.plain_signed(dtype) => format!("({a} * {b} + {c})"),
                _ => {
                    let w = self.wide(name, dtype)?;
                    format!("({t})(({w}){a} * ({w}){b} + ({w}){c})")
                }
            },
        })
    }

    /// `a` converted from `from` to `to` with [`Scalar::cast`] semantics.
    pub(super) fn cast(&mut self, from: DType, to: DType, a: &str) -> Result<String, CodegenError> {
        let t = self.ty_for("cast", to)?;
        self.ty_for("cast", from)?;
        if from == to {
            return Ok(a.to_owned());
        }
        // The float8 types convert exactly like the half types: through `float`.
        let is_half =
            |d: DType| matches!(d, DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2);
        Ok(if to == DType::Bool {
            if is_half(from) {
                format!("({} != 0.0f)", self.half_to_f32(from, a))
            } else {
                format!("({a} != 0)")
            }
        } else if is_half(from) {
            // Exact in float; then as from float.
            let x = self.half_to_f32(from, a);
            self.cast(DType::F32, to, &x)?
        } else if is_half(to) {
            let x = match from {
                DType::F32 => a.to_owned(),
                // Rounding to odd first makes the one rounding that counts the last.
                DType::F64 => format!("{}({a})", self.helpers.call(Helper::F64ToF32Odd)),
                // Integers (and bool) round to float first, as the reference does.
                _ => format!("(float){a}"),
            };
            self.f32_to_half(to, &x)
        } else if matches!(from, DType::F32 | DType::F64) && (to.is_int()) {
            format!("{}({a})", self.helpers.call(Helper::FloatToInt(from, to)))
        } else {
            // Integer to integer keeps the low bits; to float rounds to nearest even; bool
            // is 0 or 1. (C's conversion to a narrower signed type is implementation
            // defined, and every supported compiler wraps.)
            format!("(({t}){a})")
        })
    }

    /// `a`'s bits reinterpreted from `from` to `to` (of the same size).
    pub(super) fn bitcast(
        &mut self,
        from: DType,
        to: DType,
        a: &str,
    ) -> Result<String, CodegenError> {
        let t = self.ty_for("bitcast", to)?;
        self.ty_for("bitcast", from)?;
        if from == to {
            return Ok(a.to_owned());
        }
        let native_float = |d: DType| matches!(d, DType::F32 | DType::F64);
        Ok(if to == DType::Bool {
            // The reference rejects bytes other than 0 and 1; generated code cannot fail,
            // so it reads any nonzero byte as true.
            format!("({a} != 0)")
        } else if native_float(from) || native_float(to) {
            format!("{}({a})", self.helpers.call(Helper::Bitcast(from, to)))
        } else {
            // Integers and half types are all held as integers: a conversion keeps the bits.
            format!("(({t}){a})")
        })
    }
}

/// Wraps a literal starting with `-` in parentheses, so `x - -1` never reads as `x--1`.
fn parenthesize(s: String) -> String {
    if s.starts_with('-') {
        format!("({s})")
    } else {
        s
    }
}

/// An integer `value` as a C literal of type `t`.
pub(super) fn int_literal(value: Scalar, t: &str) -> String {
    match value {
        Scalar::I32(i32::MIN) => "(-2147483647 - 1)".into(),
        Scalar::I32(v) => parenthesize(v.to_string()),
        // The literal 9223372036854775808 has no signed type, so MIN is spelled MAX - 1.
        Scalar::I64(i64::MIN) => format!("(({t})(-9223372036854775807 - 1))"),
        Scalar::I64(v) => format!("(({t}){v})"),
        Scalar::U32(v) => format!("{v}u"),
        Scalar::U64(v) => format!("(({t}){v}u)"),
        Scalar::Bool(b) => b.to_string(),
        _ => format!("(({t}){})", value.to_i64()),
    }
}
