//! One scalar operation as a WGSL expression, with [`Scalar`]'s semantics.
//!
//! Operands are always names (`v3`, `v5[2]`): constants are bound to `let`s, because
//! naga's constant evaluation rejects operations on literals that overflow or divide by
//! zero (which the reference defines). Every expression is fully parenthesized, since WGSL
//! refuses to mix some operators without parentheses.

use tessel_shape::{BinaryOp, DType, Scalar, TernaryOp, UnaryOp};

use super::super::CodegenError;
use super::helpers::{Helper, Helpers, int_lit};
use super::{DIALECT, WgslTarget};

/// The dtype whose WGSL type holds values of `dtype`: 8- and 16-bit integers are held in
/// 32-bit ones of the same signedness, `bool` and the others in their own.
pub(super) fn repr_dtype(dtype: DType) -> DType {
    match dtype {
        DType::I8 | DType::I16 => DType::I32,
        DType::U8 | DType::U16 => DType::U32,
        d => d,
    }
}

/// Whether `dtype` is held as bits and converted through `f32` (the half and float8 types).
fn is_half(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
    )
}

/// `e` (of `dtype`'s WGSL type) brought back into `dtype`'s range, as wrapping arithmetic
/// in `dtype` would leave it: sign-extended or masked for 8- and 16-bit integers.
pub(super) fn wrap(dtype: DType, e: &str) -> String {
    match dtype {
        DType::I8 => format!("(({e} << 24u) >> 24u)"),
        DType::I16 => format!("(({e} << 16u) >> 16u)"),
        DType::U8 => format!("({e} & 0xffu)"),
        DType::U16 => format!("({e} & 0xffffu)"),
        _ => e.to_owned(),
    }
}

/// Renders scalar expressions for one target, recording the helpers they call.
pub(super) struct Ops<'k> {
    target: WgslTarget,
    kernel: &'k str,
    pub(super) helpers: Helpers,
}

impl<'k> Ops<'k> {
    pub(super) fn new(target: WgslTarget, kernel: &'k str) -> Self {
        Ops {
            target,
            kernel,
            helpers: Helpers::default(),
        }
    }

    pub(super) fn unsupported(&self, op: &str, dtype: DType) -> CodegenError {
        CodegenError::UnsupportedOp {
            kernel: self.kernel.to_owned(),
            dialect: DIALECT,
            op: op.to_owned(),
            dtype,
        }
    }

    /// The WGSL type of values of `dtype`, or an error naming `op` when the target lacks it.
    pub(super) fn ty(&self, op: &str, dtype: DType) -> Result<&'static str, CodegenError> {
        Ok(match dtype {
            DType::Bool => "bool",
            DType::U8
            | DType::U16
            | DType::U32
            | DType::F8E4M3
            | DType::F8E5M2
            | DType::F16
            | DType::BF16 => "u32",
            DType::I8 | DType::I16 | DType::I32 => "i32",
            DType::F32 => "f32",
            DType::I64 | DType::U64 if !self.target.int64 => {
                return Err(self.unsupported(op, dtype));
            }
            DType::I64 => "i64",
            DType::U64 => "u64",
            // f64's NaN tests, `max`, `%` and conversions work on its bits, as a `u64`.
            DType::F64 if !(self.target.f64 && self.target.int64) => {
                return Err(self.unsupported(op, dtype));
            }
            DType::F64 => "f64",
        })
    }

    /// Checks that `op` on `dtype`, which the reference computes through `f64`, can be.
    fn require_f64(&self, op: &str, dtype: DType) -> Result<(), CodegenError> {
        if self.target.f64 && self.target.int64 {
            Ok(())
        } else {
            Err(self.unsupported(&format!("{op} (computed in f64)"), dtype))
        }
    }

    fn call(&mut self, helper: Helper, args: &[&str]) -> String {
        format!("{}({})", self.helpers.call(helper), args.join(", "))
    }

    /// A literal of `value`'s dtype, in its WGSL type.
    pub(super) fn constant(&mut self, value: Scalar) -> Result<String, CodegenError> {
        let dtype = value.dtype();
        self.ty("const", dtype)?;
        Ok(match value {
            Scalar::Bool(b) => b.to_string(),
            Scalar::F16(_) | Scalar::BF16(_) => format!("0x{:04x}u", value.to_bits()),
            Scalar::F8E4M3(_) | Scalar::F8E5M2(_) => format!("0x{:02x}u", value.to_bits()),
            Scalar::F32(x) => {
                // The shortest decimal that reads back as `x`, when it reads back as `x`
                // through f64 as well (so however naga parses it); else the exact bits.
                let text = format!("{x:?}");
                if x.is_finite() && text.parse::<f64>().is_ok_and(|y| y as f32 == x) {
                    paren(format!("{text}f"))
                } else {
                    format!("bitcast<f32>(0x{:08x}u)", x.to_bits())
                }
            }
            Scalar::F64(x) => {
                if x.is_finite() {
                    paren(format!("{x:?}lf"))
                } else {
                    format!("bitcast<f64>(0x{:016x}lu)", x.to_bits())
                }
            }
            Scalar::U64(v) => int_lit(DType::U64, i128::from(v)),
            _ => int_lit(repr_dtype(dtype), i128::from(value.to_i64())),
        })
    }

    fn isnan(&mut self, dtype: DType, a: &str) -> String {
        self.call(Helper::IsNan(dtype), &[a])
    }

    fn half_to_f32(&mut self, dtype: DType, a: &str) -> String {
        let helper = match dtype {
            DType::F16 => Helper::F16ToF32,
            DType::F8E4M3 | DType::F8E5M2 => Helper::F8ToF32(dtype),
            _ => Helper::Bf16ToF32,
        };
        self.call(helper, &[a])
    }

    fn f32_to_half(&mut self, dtype: DType, a: &str) -> String {
        let helper = match dtype {
            DType::F16 => Helper::F32ToF16,
            DType::F8E4M3 | DType::F8E5M2 => Helper::F32ToF8(dtype),
            _ => Helper::F32ToBf16,
        };
        self.call(helper, &[a])
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
        self.ty(name, dtype)?;
        if matches!(op, UnaryOp::IsNan | UnaryOp::IsInf) && !dtype.is_float() {
            return Ok("false".into());
        }
        Ok(match dtype {
            DType::Bool => match op {
                UnaryOp::Not => format!("(!{a})"),
                _ => return Err(self.unsupported(name, dtype)),
            },
            DType::F16 | DType::BF16 => {
                // Exactly on the bits: no conversion needed.
                let inf = if dtype == DType::F16 {
                    "0x7c00u"
                } else {
                    "0x7f80u"
                };
                match op {
                    UnaryOp::IsNan => return Ok(format!("(({a} & 0x7fffu) > {inf})")),
                    UnaryOp::IsInf => return Ok(format!("(({a} & 0x7fffu) == {inf})")),
                    // The sign bit alone, as the reference's negation and magnitude are
                    // (NaNs keep their payload; subnormals stay exact).
                    UnaryOp::Neg => return Ok(format!("({a} ^ 0x8000u)")),
                    UnaryOp::Abs => return Ok(format!("({a} & 0x7fffu)")),
                    _ => {}
                }
                let x = self.half_to_f32(dtype, a);
                let r = self.float_unary(op, DType::F32, &x)?;
                self.f32_to_half(dtype, &r)
            }
            DType::F32 | DType::F64 => self.float_unary(op, dtype, a)?,
            _ => {
                let r = repr_dtype(dtype);
                let zero = int_lit(r, 0);
                match op {
                    UnaryOp::Neg if dtype.is_signed() => wrap(dtype, &format!("(-{a})")),
                    UnaryOp::Neg => wrap(dtype, &format!("({zero} - {a})")),
                    UnaryOp::Not => wrap(dtype, &format!("(~{a})")),
                    UnaryOp::Abs if dtype.is_signed() => {
                        wrap(dtype, &format!("select({a}, -{a}, {a} < {zero})"))
                    }
                    UnaryOp::Sign if dtype.is_signed() => format!(
                        "select(select({zero}, {}, {a} < {zero}), {}, {a} > {zero})",
                        int_lit(r, -1),
                        int_lit(r, 1)
                    ),
                    UnaryOp::Sign => format!("select({zero}, {}, {a} != {zero})", int_lit(r, 1)),
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
        let f64 = dtype == DType::F64;
        let one = if f64 { "1.0lf" } else { "1.0f" };
        let (abs_mask, inf_bits, bits_t) = if f64 {
            ("0x7ffffffffffffffflu", "0x7ff0000000000000lu", "u64")
        } else {
            ("0x7fffffffu", "0x7f800000u", "u32")
        };
        let t = if f64 { "f64" } else { "f32" };
        let sign_bit = if f64 {
            "0x8000000000000000lu"
        } else {
            "0x80000000u"
        };
        let call = |f: &str| format!("{f}({a})");
        Ok(match op {
            // On the bits: devices may flush a subnormal operand of float negation or `abs`
            // to zero (NVIDIA's Vulkan driver does), and need not keep the sign of a zero.
            UnaryOp::Neg => format!("bitcast<{t}>(bitcast<{bits_t}>({a}) ^ {sign_bit})"),
            UnaryOp::Abs => format!("bitcast<{t}>(bitcast<{bits_t}>({a}) & {abs_mask})"),
            UnaryOp::Sign => {
                // On the bits: drivers need not keep the sign of a zero through float
                // selects (Vulkan without SignedZeroInfNanPreserve), and sign(±0) is +0.
                let nan = self.isnan(dtype, a);
                let (one_bits, zero_bits) = if f64 {
                    ("0x3ff0000000000000lu", "0lu")
                } else {
                    ("0x3f800000u", "0u")
                };
                format!(
                    "bitcast<{t}>(select(select((bitcast<{bits_t}>({a}) & {sign_bit}) | {one_bits}, {zero_bits}, (bitcast<{bits_t}>({a}) & {abs_mask}) == {zero_bits}), bitcast<{bits_t}>({a}), {nan}))"
                )
            }
            UnaryOp::Reciprocal => self.call(Helper::FloatDiv(dtype), &[one, a]),
            UnaryOp::Sqrt => call("sqrt"),
            UnaryOp::Rsqrt => self.call(Helper::FloatDiv(dtype), &[one, &call("sqrt")]),
            UnaryOp::Exp
            | UnaryOp::Exp2
            | UnaryOp::Log
            | UnaryOp::Log2
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tan
            | UnaryOp::Tanh
                if f64 =>
            {
                // GLSL.std.450, HLSL and MSL define these for 16- and 32-bit floats only.
                return Err(self.unsupported(op.name(), dtype));
            }
            UnaryOp::Exp => self.call(Helper::ExpF32, &[a]),
            UnaryOp::Exp2 => self.call(Helper::Exp2F32, &[a]),
            UnaryOp::Log => self.call(Helper::LogF32, &[a]),
            UnaryOp::Log2 => self.call(Helper::Log2F32, &[a]),
            UnaryOp::Sin => self.call(Helper::SinF32, &[a]),
            UnaryOp::Cos => self.call(Helper::CosF32, &[a]),
            UnaryOp::Tan => self.call(Helper::TanF32, &[a]),
            UnaryOp::Tanh => self.call(Helper::TanhF32, &[a]),
            // There is no f64 `exp` to compute fdlibm's erf with (see the module docs).
            UnaryOp::Erf if f64 => return Err(self.unsupported(op.name(), dtype)),
            UnaryOp::Erf => self.call(Helper::ErfF32, &[a]),
            // On the bits (see the helper): WGSL's built-ins need not keep a zero's sign.
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => {
                self.call(Helper::Integral(op, dtype), &[a])
            }
            UnaryOp::IsNan => self.isnan(dtype, a),
            UnaryOp::IsInf => format!("((bitcast<{bits_t}>({a}) & {abs_mask}) == {inf_bits})"),
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
        self.ty(name, dtype)?;
        if op.is_comparison() {
            return Ok(match dtype {
                DType::Bool => match op {
                    BinaryOp::Eq => format!("({a} == {b})"),
                    BinaryOp::Ne => format!("({a} != {b})"),
                    // false < true
                    BinaryOp::Lt => format!("(!{a} && {b})"),
                    BinaryOp::Le => format!("(!{a} || {b})"),
                    BinaryOp::Gt => format!("({a} && !{b})"),
                    _ => format!("({a} || !{b})"),
                },
                DType::F16 | DType::BF16 => {
                    let (x, y) = (self.half_to_f32(dtype, a), self.half_to_f32(dtype, b));
                    self.float_compare(op, DType::F32, &x, &y)
                }
                DType::F32 | DType::F64 => self.float_compare(op, dtype, a, b),
                _ => format!("({a} {} {b})", cmp_symbol(op)),
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
                let r = repr_dtype(dtype);
                let mask = dtype.bits() - 1;
                // The amount modulo the width, as the reference's wrapping shifts take it
                // (negative amounts included); WGSL rejects over-wide constant amounts.
                let amount = if r.bits() == 64 {
                    format!("u32({b} & {})", int_lit(r, i128::from(mask)))
                } else {
                    format!("(u32({b}) & {mask}u)")
                };
                match op {
                    BinaryOp::Add => wrap(dtype, &format!("({a} + {b})")),
                    BinaryOp::Sub => wrap(dtype, &format!("({a} - {b})")),
                    BinaryOp::Mul => wrap(dtype, &format!("({a} * {b})")),
                    BinaryOp::Div => wrap(dtype, &self.call(Helper::IntDiv(r), &[a, b])),
                    BinaryOp::Rem => self.call(Helper::IntRem(r), &[a, b]),
                    BinaryOp::Pow => wrap(dtype, &self.call(Helper::IntPow(r), &[a, b])),
                    BinaryOp::Max => format!("select({b}, {a}, {a} > {b})"),
                    BinaryOp::Min => format!("select({b}, {a}, {a} < {b})"),
                    BinaryOp::And => format!("({a} & {b})"),
                    BinaryOp::Or => format!("({a} | {b})"),
                    BinaryOp::Xor => format!("({a} ^ {b})"),
                    BinaryOp::Shl => wrap(dtype, &format!("({a} << {amount})")),
                    // Values are canonical, so a right shift stays in range (arithmetic
                    // for signed types, logical for unsigned ones).
                    BinaryOp::Shr => format!("({a} >> {amount})"),
                    _ => return Err(self.unsupported(name, dtype)),
                }
            }
        })
    }

    /// A comparison of two `f32` or `f64` values; false for NaN (true for `!=`), tested on
    /// the bits since WGSL lets implementations assume there are no NaNs.
    fn float_compare(&mut self, op: BinaryOp, dtype: DType, a: &str, b: &str) -> String {
        let (na, nb) = (self.isnan(dtype, a), self.isnan(dtype, b));
        if op == BinaryOp::Ne {
            format!("(({a} != {b}) || {na} || {nb})")
        } else {
            format!("(({a} {} {b}) && !{na} && !{nb})", cmp_symbol(op))
        }
    }

    /// A non-comparison binary op on `f32` or `f64`.
    fn float_binary(
        &mut self,
        op: BinaryOp,
        dtype: DType,
        a: &str,
        b: &str,
    ) -> Result<String, CodegenError> {
        Ok(match op {
            BinaryOp::Add => format!("({a} + {b})"),
            BinaryOp::Sub => format!("({a} - {b})"),
            // The product through the opaque identity: a compiler may otherwise contract
            // it with an add or sub it feeds into one fused multiply-add (naga marks no
            // SPIR-V `NoContraction`, and NVIDIA's compiler does contract), rounding once
            // where the reference rounds twice. Only an explicit `mad` fuses.
            BinaryOp::Mul => self.call(Helper::Opaque(dtype), &[&format!("({a} * {b})")]),
            BinaryOp::Div => self.call(Helper::FloatDiv(dtype), &[a, b]),
            BinaryOp::Rem => self.call(Helper::Fmod(dtype), &[a, b]),
            BinaryOp::Pow if dtype == DType::F64 => {
                return Err(self.unsupported(op.name(), dtype));
            }
            BinaryOp::Pow => self.call(Helper::PowF32, &[a, b]),
            BinaryOp::Max => self.call(Helper::FloatMax(dtype), &[a, b]),
            BinaryOp::Min => self.call(Helper::FloatMin(dtype), &[a, b]),
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
        self.ty(name, dtype)?;
        Ok(match op {
            TernaryOp::Where => format!("select({c}, {b}, {a})"),
            TernaryOp::MulAdd => match dtype {
                DType::Bool => format!("(({a} && {b}) || {c})"),
                DType::F32 | DType::F64 => self.call(Helper::Fma(dtype), &[a, b, c]),
                DType::F16 => self.call(Helper::MadF16, &[a, b, c]),
                DType::BF16 => {
                    self.require_f64(name, dtype)?;
                    let (x, y, z) = (
                        self.half_to_f32(dtype, a),
                        self.half_to_f32(dtype, b),
                        self.half_to_f32(dtype, c),
                    );
                    // Widened on the bits: a bf16 subnormal is an f32 subnormal, which a
                    // device may flush in a float conversion.
                    let (x, y, z) = (
                        self.call(Helper::F32ToF64, &[&x]),
                        self.call(Helper::F32ToF64, &[&y]),
                        self.call(Helper::F32ToF64, &[&z]),
                    );
                    let fma = self.helpers.call(Helper::HalfFmaF64);
                    self.f32_to_half(dtype, &format!("{fma}({x}, {y}, {z})"))
                }
                _ => wrap(dtype, &format!("(({a} * {b}) + {c})")),
            },
        })
    }

    /// `a` converted from `from` to `to` with [`Scalar::cast`] semantics.
    pub(super) fn cast(&mut self, from: DType, to: DType, a: &str) -> Result<String, CodegenError> {
        self.ty("cast", from)?;
        self.ty("cast", to)?;
        if from == to {
            return Ok(a.to_owned());
        }
        if to == DType::Bool {
            // On the bits: NaN is nonzero, -0 is zero, and a flushed subnormal stays nonzero.
            return Ok(match from {
                DType::F16 | DType::BF16 => format!("(({a} & 0x7fffu) != 0u)"),
                DType::F8E4M3 | DType::F8E5M2 => format!("(({a} & 0x7fu) != 0u)"),
                DType::F32 => format!("((bitcast<u32>({a}) & 0x7fffffffu) != 0u)"),
                DType::F64 => format!("((bitcast<u64>({a}) & 0x7ffffffffffffffflu) != 0lu)"),
                _ => format!("({a} != {})", int_lit(repr_dtype(from), 0)),
            });
        }
        if from == DType::Bool {
            let (zero, one) = match to {
                DType::F16 => ("0u".to_owned(), "0x3c00u".to_owned()),
                DType::BF16 => ("0u".to_owned(), "0x3f80u".to_owned()),
                DType::F8E4M3 => ("0u".to_owned(), "0x38u".to_owned()),
                DType::F8E5M2 => ("0u".to_owned(), "0x3cu".to_owned()),
                DType::F32 => ("0.0f".to_owned(), "1.0f".to_owned()),
                DType::F64 => ("0.0lf".to_owned(), "1.0lf".to_owned()),
                _ => (int_lit(repr_dtype(to), 0), int_lit(repr_dtype(to), 1)),
            };
            return Ok(format!("select({zero}, {one}, {a})"));
        }
        if is_half(from) {
            // Exact in f32; then as from f32.
            let x = self.half_to_f32(from, a);
            return self.cast(DType::F32, to, &x);
        }
        if is_half(to) {
            let x = match from {
                DType::F32 => a.to_owned(),
                // Rounding to odd first makes the one rounding that counts the last.
                DType::F64 => self.call(Helper::F64ToF32Odd, &[a]),
                // Integers round to f32 first, as the reference does.
                _ => self.cast(from, DType::F32, a)?,
            };
            return Ok(self.f32_to_half(to, &x));
        }
        Ok(match (from, to) {
            // On the bits, so that subnormals (of either type) convert exactly on devices
            // that flush them in float conversions.
            (DType::F32, DType::F64) => self.call(Helper::F32ToF64, &[a]),
            (DType::F64, DType::F32) => self.call(Helper::F64ToF32, &[a]),
            (DType::F32 | DType::F64, _) => self.call(Helper::FloatToInt(from, to), &[a]),
            // Integers to floats: exact when the integer fits the significand.
            (_, DType::F32) if from.bits() <= 16 => format!("f32({a})"),
            (_, DType::F64) if from.bits() <= 32 => format!("f64({a})"),
            (_, DType::F32 | DType::F64) => {
                self.call(Helper::IntToFloat(repr_dtype(from), to), &[a])
            }
            _ => wrap(to, &int_convert(repr_dtype(from), repr_dtype(to), a)),
        })
    }

    /// `a`'s bits reinterpreted from `from` to `to` (of the same size).
    pub(super) fn bitcast(
        &mut self,
        from: DType,
        to: DType,
        a: &str,
    ) -> Result<String, CodegenError> {
        self.ty("bitcast", from)?;
        let t = self.ty("bitcast", to)?;
        if from == to {
            return Ok(a.to_owned());
        }
        if to == DType::Bool || from == DType::Bool {
            // The verifier's kernels never get here; any nonzero byte reads as true, as in C.
            return self.cast(from, to, a);
        }
        Ok(if from.bits() >= 32 {
            format!("bitcast<{t}>({a})")
        } else {
            // 8- and 16-bit types: the bits in a u32, then sign-extended for signed types.
            let bits = if from.is_int() && from.is_signed() {
                format!("(bitcast<u32>({a}) & {}u)", (1u32 << from.bits()) - 1)
            } else {
                a.to_owned()
            };
            if to.is_int() && to.is_signed() {
                wrap(to, &format!("bitcast<i32>({bits})"))
            } else {
                bits
            }
        })
    }
}

/// A value of the integer representation dtype `from` in `to`, keeping the low bits
/// (sign-extending a signed source into a wider type, as Rust's `as` does).
fn int_convert(from: DType, to: DType, a: &str) -> String {
    use DType::{I32, I64, U32, U64};
    match (from, to) {
        (f, t) if f == t => a.to_owned(),
        (I32, U32) => format!("bitcast<u32>({a})"),
        (U32, I32) => format!("bitcast<i32>({a})"),
        // Sign extension spelled out: lavapipe (Mesa 22, LLVM 15) miscompiles a signed
        // comparison of `i64(x)`, WGSL's own sign extension, as false for every lane.
        (I32, I64) => format!("bitcast<i64>({})", sign_extend(a)),
        (I32, U64) => sign_extend(a),
        (U32, U64) => format!("u64({a})"),
        (U32, I64) => format!("bitcast<i64>(u64({a}))"),
        (I64, U64) => format!("bitcast<u64>({a})"),
        (U64, I64) => format!("bitcast<i64>({a})"),
        (I64, I32) => format!("bitcast<i32>(u32(bitcast<u64>({a})))"),
        (I64, U32) => format!("u32(bitcast<u64>({a}))"),
        (U64, I32) => format!("bitcast<i32>(u32({a}))"),
        _ => format!("u32({a})"),
    }
}

/// The `i32` `a` sign-extended to a `u64`, through 32-bit operations only.
fn sign_extend(a: &str) -> String {
    format!("(u64(bitcast<u32>({a})) | (u64(bitcast<u32>({a} >> 31u)) << 32u))")
}

fn cmp_symbol(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Eq => "==",
        BinaryOp::Ne => "!=",
        BinaryOp::Lt => "<",
        BinaryOp::Le => "<=",
        BinaryOp::Gt => ">",
        _ => ">=",
    }
}

/// Wraps a literal starting with `-` in parentheses, so `x - -1` never reads as `x--1`.
fn paren(s: String) -> String {
    if s.starts_with('-') {
        format!("({s})")
    } else {
        s
    }
}
