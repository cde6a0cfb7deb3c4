//! Elementwise ops: arithmetic, comparisons, logic, bitwise ops, unary math, activations,
//! selection and dtype conversion, with PyTorch's type promotion and NumPy broadcasting.
//!
//! Binary ops take an [`Operand`]: a tensor (`&t`, `t`) or a Rust number (`2.0`, `3`,
//! `true`). Two tensors promote with [`DType::promote`] (`torch.promote_types`); a tensor
//! and a number promote with [`DType::promote_scalar`], so a number only changes the dtype
//! when its category is higher (`i32 tensor + 2.5` is `f32`, `f16 tensor * 2.0` stays
//! `f16`, `u8 tensor + 1000` stays `u8` and wraps).
//!
//! Float functions (`exp`, `sqrt`, `sigmoid`, ...) compute integer and `bool` inputs in
//! `f32`, like `torch.exp(int_tensor)`. Composite activations (`sigmoid`, `silu`, `gelu`)
//! compute `f16`/`bf16` inputs in `f32` and round once, like PyTorch's CPU and CUDA kernels.

use tessel_graph::Op;
use tessel_shape::{BinaryOp, DType, Scalar, ScalarKind, TernaryOp, UnaryOp, rules};

use super::ScalarOperand;
use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

/// The other operand of a binary op: a tensor (`&t` or `t`) or a Rust number (`f64`,
/// `f32`, `i64`, `i32`, `bool`).
///
/// Numbers follow PyTorch's rules for Python scalars: `2` is an int and `2.0` a float,
/// whatever their Rust width; see [`DType::promote_scalar`].
///
/// ```
/// # use tessel_tensor::{DType, Tensor};
/// # fn main() -> tessel_tensor::Result<()> {
/// let t = Tensor::from([1i32, 2, 3]);
/// assert_eq!(t.add(&t)?.dtype(), DType::I32);
/// assert_eq!(t.add(1)?.dtype(), DType::I32);
/// assert_eq!(t.add(0.5)?.dtype(), DType::F32);
/// # Ok(())
/// # }
/// ```
pub trait Operand: sealed::Sealed {}

mod sealed {
    use tessel_shape::{Scalar, ScalarKind};

    use crate::tensor::Tensor;

    /// Keeps [`Operand`](super::Operand) closed: its implementations are the whole list.
    pub trait Sealed {
        /// The operand as a tensor or a Python-like scalar.
        fn into_value(self) -> Value;

        /// `(lhs, self)` promoted and broadcast together for the op `name`.
        fn align_to(self, lhs: &Tensor, name: &'static str) -> crate::Result<(Tensor, Tensor)>;
    }

    /// A resolved operand.
    pub enum Value {
        /// A tensor.
        Tensor(Tensor),
        /// A number and its category.
        Scalar(Scalar, ScalarKind),
    }
}

use sealed::Value;

impl sealed::Sealed for Tensor {
    fn into_value(self) -> Value {
        Value::Tensor(self)
    }

    fn align_to(self, lhs: &Tensor, name: &'static str) -> Result<(Tensor, Tensor)> {
        lhs.align(&self, name)
    }
}
impl Operand for Tensor {}

impl sealed::Sealed for &Tensor {
    fn into_value(self) -> Value {
        Value::Tensor(self.clone())
    }

    fn align_to(self, lhs: &Tensor, name: &'static str) -> Result<(Tensor, Tensor)> {
        lhs.align(self, name)
    }
}
impl Operand for &Tensor {}

impl<T: ScalarOperand> sealed::Sealed for T {
    fn into_value(self) -> Value {
        let (scalar, kind) = self.to_operand();
        Value::Scalar(scalar, kind)
    }

    fn align_to(self, lhs: &Tensor, _name: &'static str) -> Result<(Tensor, Tensor)> {
        Ok(lhs.with_scalar(self))
    }
}
impl<T: ScalarOperand> Operand for T {}

const SUB_BOOL_HINT: &str = "to flip a mask use logical_not() or logical_xor(); otherwise cast to an integer dtype first with .cast(DType::I64)";
const NEG_BOOL_HINT: &str = "to invert a mask use logical_not() or bitwise_not() instead";
const ARITH_BOOL_HINT: &str =
    "cast the bool tensor to an integer or float dtype first, e.g. .cast(DType::I64)";
const BITWISE_HINT: &str = "bitwise ops take integer or bool tensors; cast with .cast(DType::I64), or use logical_and/logical_or/logical_xor for truth values";
const SHIFT_HINT: &str = "shifts take integer tensors; cast with .cast(DType::I64) first";
const ROUND_BOOL_HINT: &str =
    "rounding a bool tensor is meaningless; cast it to a numeric dtype first";

impl Tensor {
    /// Promotes and broadcasts `self` with an operand, returning `(self, other)` aligned.
    pub(crate) fn align_operand(
        &self,
        other: impl Operand,
        name: &'static str,
    ) -> Result<(Tensor, Tensor)> {
        other.align_to(self, name)
    }

    fn aligned_binary(
        &self,
        other: impl Operand,
        op: BinaryOp,
        name: &'static str,
        hint: &'static str,
    ) -> Result<Tensor> {
        let (a, b) = self.align_operand(other, name)?;
        a.binary_aligned(&b, op, name, hint)
    }

    /// The binary op on operands whose dtype the op is known to support (internal
    /// composites only).
    pub(crate) fn raw_binary(&self, op: BinaryOp, rhs: &Tensor) -> Tensor {
        debug_assert!(op.supports(self.dtype()) && self.dtype() == rhs.dtype());
        debug_assert_eq!(self.shape(), rhs.shape());
        let dtype = if op.is_comparison() {
            DType::Bool
        } else {
            self.dtype()
        };
        self.record_with(
            &[rhs],
            Op::Binary(op, self.node(), rhs.node()),
            dtype,
            self.shape().clone(),
        )
    }

    /// The unary op on an operand whose dtype the op is known to support.
    pub(crate) fn raw_unary(&self, op: UnaryOp) -> Tensor {
        debug_assert!(op.supports(self.dtype()));
        let dtype = if matches!(op, UnaryOp::IsNan | UnaryOp::IsInf) {
            DType::Bool
        } else {
            self.dtype()
        };
        self.record(Op::Unary(op, self.node()), dtype, self.shape().clone())
    }

    /// `where(self, a, b)` for a bool `self` and aligned `a`, `b`.
    pub(crate) fn raw_where(&self, a: &Tensor, b: &Tensor) -> Tensor {
        debug_assert!(self.dtype() == DType::Bool && a.dtype() == b.dtype());
        self.record_with(
            &[a, b],
            Op::Ternary(TernaryOp::Where, self.node(), a.node(), b.node()),
            a.dtype(),
            self.shape().clone(),
        )
    }

    /// A constant `value` of this tensor's dtype and shape.
    pub(crate) fn constant(&self, value: f64) -> Tensor {
        self.full_like_scalar(Scalar::F64(value), self.dtype())
    }

    /// Runs `f` on the tensor as a float; `f16`/`bf16` compute in `f32` and round once.
    fn with_opmath(&self, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        let x = self.to_float();
        if matches!(x.dtype(), DType::F16 | DType::BF16) {
            f(&x.cast_to(DType::F32)).cast_to(x.dtype())
        } else {
            f(&x)
        }
    }

    // ---------------------------------------------------------------------------------
    // Arithmetic
    // ---------------------------------------------------------------------------------

    /// `self + other` (`torch.add`), broadcasting; logical or on two `bool` tensors.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::from([[1.0f32], [2.0]]);
    /// let b = Tensor::from([10.0f32, 20.0, 30.0]);
    /// let c = a.add(&b)?;
    /// assert_eq!(c.dims(), vec![2, 3]);
    /// assert_eq!(c.to_vec::<f32>()?, vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn add(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Add, "add", "")
    }

    /// `self - other` (`torch.sub`), broadcasting. Not defined for `bool`.
    pub fn sub(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Sub, "sub", SUB_BOOL_HINT)
    }

    /// `self * other` (`torch.mul`), broadcasting; logical and on two `bool` tensors.
    pub fn mul(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Mul, "mul", "")
    }

    /// True division `self / other` (`torch.div`): integer and `bool` operands are divided
    /// as `f32`, so `7 / 2 == 3.5` and `1 / 0 == inf`.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let q = Tensor::from([7i64, -7]).div(2)?;
    /// assert_eq!(q.dtype(), DType::F32);
    /// assert_eq!(q.to_vec::<f32>()?, vec![3.5, -3.5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn div(&self, other: impl Operand) -> Result<Tensor> {
        let (a, b) = self.align_operand(other, "div")?;
        a.to_float()
            .binary_aligned(&b.to_float(), BinaryOp::Div, "div", "")
    }

    /// `base ** self` for a number `base` (`torch.pow(base, exponent)`, Python's
    /// `base ** t`); the dtype promotes as in [`Tensor::pow`] with the number on the left
    /// (`2 ** int_tensor` stays integer, `2.0 ** int_tensor` is `f32`).
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([0i32, 1, 3]);
    /// assert_eq!(t.rpow(2)?.to_vec::<i32>()?, vec![1, 2, 8]);
    /// assert_eq!(t.rpow(0.5)?.to_vec::<f32>()?, vec![1.0, 0.5, 0.125]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn rpow(&self, base: impl ScalarOperand) -> Result<Tensor> {
        let (value, kind) = base.to_operand();
        let dtype = self.dtype().promote_scalar(kind);
        let exponent = self.cast(dtype);
        exponent.full_like_scalar(value, dtype).pow(&exponent)
    }

    /// `self * self` (`torch.square`), in the tensor's dtype (integers wrap). Not defined
    /// for `bool`, as in PyTorch.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// assert_eq!(Tensor::from([-3.0f32, 0.5]).square()?.to_vec::<f32>()?, vec![9.0, 0.25]);
    /// assert_eq!(Tensor::from([-3i32, 4]).square()?.to_vec::<i32>()?, vec![9, 16]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn square(&self) -> Result<Tensor> {
        if self.dtype() == DType::Bool {
            return Err(Error::UnsupportedDType {
                op: "square",
                dtype: DType::Bool,
                hint: "cast to an integer or float dtype first",
            });
        }
        self.mul(self)
    }

    /// `self ^ exponent` (`torch.pow`): `powf` on floats; on integers exact with wrapping,
    /// so `i64 ^ 2` stays `i64` while `i64 ^ 0.5` is `f32`.
    ///
    /// An integer tensor raised to a negative integer *number* is an error, as in PyTorch;
    /// negative values inside an integer exponent *tensor* give `1 / a^|b|` truncated
    /// (`0` unless `|a| == 1`).
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([2i32, 3]);
    /// assert_eq!(t.pow(3)?.to_vec::<i32>()?, vec![8, 27]);
    /// assert_eq!(t.pow(0.5)?.dtype(), DType::F32);
    /// assert!(t.pow(-1).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn pow(&self, exponent: impl Operand) -> Result<Tensor> {
        let value = exponent.into_value();
        if let Value::Scalar(s, ScalarKind::Int) = value
            && !self.dtype().is_float()
            && s.to_i64() < 0
        {
            return Err(Error::InvalidArgument {
                op: "pow",
                reason: format!(
                    "integers to negative integer powers are not allowed ({} tensor ^ {s}); use a float exponent ({s}.0) or cast the tensor to a float dtype",
                    self.dtype()
                ),
            });
        }
        let (a, b) = match value {
            Value::Tensor(t) => self.align(&t, "pow")?,
            Value::Scalar(s, kind) => {
                let dtype = self.dtype().promote_scalar(kind);
                let a = self.cast_to(dtype);
                let b = a.full_like_scalar(s, dtype);
                (a, b)
            }
        };
        a.binary_aligned(&b, BinaryOp::Pow, "pow", ARITH_BOOL_HINT)
    }

    /// The elementwise maximum (`torch.maximum`); NaN if either value is NaN.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([-1.0f32, 2.0, f32::NAN]);
    /// let m = t.maximum(0.0)?.to_vec::<f32>()?;
    /// assert_eq!(&m[..2], &[0.0, 2.0]);
    /// assert!(m[2].is_nan());
    /// # Ok(())
    /// # }
    /// ```
    pub fn maximum(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Max, "maximum", "")
    }

    /// The elementwise minimum (`torch.minimum`); NaN if either value is NaN.
    pub fn minimum(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Min, "minimum", "")
    }

    /// Python's modulus (`torch.remainder`): the result has the sign of the divisor,
    /// `a - floor(a / b) * b`. An integer remainder by zero is `0` (PyTorch raises instead).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([-7i32, 7]);
    /// assert_eq!(t.remainder(3)?.to_vec::<i32>()?, vec![2, 1]);
    /// assert_eq!(t.remainder(-3)?.to_vec::<i32>()?, vec![-1, -2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn remainder(&self, other: impl Operand) -> Result<Tensor> {
        let (a, b) = self.align_operand(other, "remainder")?;
        let r = a.binary_aligned(&b, BinaryOp::Rem, "remainder", ARITH_BOOL_HINT)?;
        if !r.dtype().is_signed() {
            return Ok(r);
        }
        // torch's formula: r = fmod(a, b); where r != 0 and sign(r) != sign(b): r + b.
        let zero = r.constant(0.0);
        let fix = r.raw_binary(BinaryOp::Ne, &zero).raw_binary(
            BinaryOp::And,
            &r.raw_binary(BinaryOp::Lt, &zero)
                .raw_binary(BinaryOp::Xor, &b.raw_binary(BinaryOp::Lt, &zero)),
        );
        Ok(fix.raw_where(&r.raw_binary(BinaryOp::Add, &b), &r))
    }

    /// C's remainder (`torch.fmod`): the result has the sign of the dividend. An integer
    /// `fmod` by zero is `0` (PyTorch raises instead).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([-7.0f32, 7.0]);
    /// assert_eq!(t.fmod(3.0)?.to_vec::<f32>()?, vec![-1.0, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn fmod(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Rem, "fmod", ARITH_BOOL_HINT)
    }

    // ---------------------------------------------------------------------------------
    // Comparisons
    // ---------------------------------------------------------------------------------

    /// `self == other` (`torch.eq`) as `bool`, comparing in the promoted dtype.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([1i32, 2, 3]);
    /// let m = t.eq(2)?;
    /// assert_eq!(m.dtype(), DType::Bool);
    /// assert_eq!(m.to_vec::<bool>()?, vec![false, true, false]);
    /// assert_eq!(t.lt(2.5)?.to_vec::<bool>()?, vec![true, true, false]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn eq(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Eq, "eq", "")
    }

    /// `self != other` (`torch.ne`) as `bool`.
    pub fn ne(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Ne, "ne", "")
    }

    /// `self < other` (`torch.lt`) as `bool`.
    pub fn lt(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Lt, "lt", "")
    }

    /// `self <= other` (`torch.le`) as `bool`.
    pub fn le(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Le, "le", "")
    }

    /// `self > other` (`torch.gt`) as `bool`.
    pub fn gt(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Gt, "gt", "")
    }

    /// `self >= other` (`torch.ge`) as `bool`.
    pub fn ge(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Ge, "ge", "")
    }

    // ---------------------------------------------------------------------------------
    // Logical and bitwise
    // ---------------------------------------------------------------------------------

    fn logical(&self, other: impl Operand, op: BinaryOp, name: &'static str) -> Result<Tensor> {
        let a = self.cast_to(DType::Bool);
        let b = match other.into_value() {
            Value::Tensor(t) => {
                self.same_device(&t, name)?;
                t.cast_to(DType::Bool)
            }
            Value::Scalar(s, _) => a.full_like_scalar(s, DType::Bool),
        };
        let (a, b) = a.align(&b, name)?;
        a.binary_aligned(&b, op, name, "")
    }

    /// Logical and (`torch.logical_and`): any dtype, nonzero (and NaN) is true; the result
    /// is `bool`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::from([0.0f32, 0.5, 2.0]);
    /// let b = Tensor::from([true, true, false]);
    /// assert_eq!(a.logical_and(&b)?.to_vec::<bool>()?, vec![false, true, false]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn logical_and(&self, other: impl Operand) -> Result<Tensor> {
        self.logical(other, BinaryOp::And, "logical_and")
    }

    /// Logical or (`torch.logical_or`), as [`Tensor::logical_and`].
    pub fn logical_or(&self, other: impl Operand) -> Result<Tensor> {
        self.logical(other, BinaryOp::Or, "logical_or")
    }

    /// Logical xor (`torch.logical_xor`), as [`Tensor::logical_and`].
    pub fn logical_xor(&self, other: impl Operand) -> Result<Tensor> {
        self.logical(other, BinaryOp::Xor, "logical_xor")
    }

    /// Logical not (`torch.logical_not`): `self == 0`, as `bool`, for any dtype.
    pub fn logical_not(&self) -> Tensor {
        self.cast_to(DType::Bool).raw_unary(UnaryOp::Not)
    }

    /// Bitwise and (`torch.bitwise_and`, `&`) on integer or `bool` tensors.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([0b1100u8, 0b1010]);
    /// assert_eq!(t.bitwise_and(0b0110)?.to_vec::<u8>()?, vec![0b0100, 0b0010]);
    /// assert!(Tensor::from([1.0f32]).bitwise_and(1).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn bitwise_and(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::And, "bitwise_and", BITWISE_HINT)
    }

    /// Bitwise or (`torch.bitwise_or`, `|`) on integer or `bool` tensors.
    pub fn bitwise_or(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Or, "bitwise_or", BITWISE_HINT)
    }

    /// Bitwise xor (`torch.bitwise_xor`, `^`) on integer or `bool` tensors.
    pub fn bitwise_xor(&self, other: impl Operand) -> Result<Tensor> {
        self.aligned_binary(other, BinaryOp::Xor, "bitwise_xor", BITWISE_HINT)
    }

    /// Bitwise not (`torch.bitwise_not`, `~`) on integer tensors; logical not on `bool`.
    pub fn bitwise_not(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Not, "bitwise_not", BITWISE_HINT)
    }

    fn shift(&self, other: impl Operand, op: BinaryOp, name: &'static str) -> Result<Tensor> {
        let (a, b) = self.align_operand(other, name)?;
        let shifted = a.binary_aligned(&b, op, name, SHIFT_HINT)?;
        // PyTorch's rule: a shift by a negative amount or by the bit width or more gives 0
        // (left) or fills with the sign bit (right).
        let bits = f64::from(a.dtype().bits());
        let out_of_range = if a.dtype().is_signed() {
            let zero = b.constant(0.0);
            b.raw_binary(BinaryOp::Lt, &zero)
                .raw_binary(BinaryOp::Or, &b.raw_binary(BinaryOp::Ge, &b.constant(bits)))
        } else {
            b.raw_binary(BinaryOp::Ge, &b.constant(bits))
        };
        let fill = if op == BinaryOp::Shr && a.dtype().is_signed() {
            a.raw_binary(BinaryOp::Shr, &a.constant(bits - 1.0))
        } else {
            a.constant(0.0)
        };
        Ok(out_of_range.raw_where(&fill, &shifted))
    }

    /// `self << other` (`torch.bitwise_left_shift`) on integer tensors. Shifting by a
    /// negative amount or by the bit width or more gives 0, as in PyTorch.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([1i32, 3]);
    /// assert_eq!(t.shl(4)?.to_vec::<i32>()?, vec![16, 48]);
    /// assert_eq!(t.shl(32)?.to_vec::<i32>()?, vec![0, 0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn shl(&self, other: impl Operand) -> Result<Tensor> {
        self.shift(other, BinaryOp::Shl, "shl")
    }

    /// `self >> other` (`torch.bitwise_right_shift`) on integer tensors: arithmetic for
    /// signed dtypes, logical for unsigned. Shifting by a negative amount or by the bit
    /// width or more fills with the sign bit, as in PyTorch.
    pub fn shr(&self, other: impl Operand) -> Result<Tensor> {
        self.shift(other, BinaryOp::Shr, "shr")
    }

    // ---------------------------------------------------------------------------------
    // Selection
    // ---------------------------------------------------------------------------------

    /// `torch.where(condition, input, other)`: `input` where `condition` is true, else
    /// `other`, all three broadcast together. `condition` must be `bool`; `input` and
    /// `other` promote like a binary op's operands (two numbers give `bool`, `i64` or
    /// `f32` by their highest category).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from([-1.0f32, 2.0, -3.0]);
    /// let y = Tensor::where_cond(&x.gt(0.0)?, &x, 0.0)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 2.0, 0.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn where_cond(
        condition: &Tensor,
        input: impl Operand,
        other: impl Operand,
    ) -> Result<Tensor> {
        const NAME: &str = "where";
        if condition.dtype() != DType::Bool {
            return Err(Error::InvalidArgument {
                op: NAME,
                reason: format!(
                    "the condition must be a bool tensor, got {}; compare it first, e.g. condition.ne(0)",
                    condition.dtype()
                ),
            });
        }
        let (x, y) = (input.into_value(), other.into_value());
        let dtype = match (&x, &y) {
            (Value::Tensor(a), Value::Tensor(b)) => a
                .dtype()
                .promote(b.dtype())
                .map_err(|source| Error::Promotion { op: NAME, source })?,
            (Value::Tensor(t), Value::Scalar(_, kind))
            | (Value::Scalar(_, kind), Value::Tensor(t)) => t.dtype().promote_scalar(*kind),
            (Value::Scalar(_, a), Value::Scalar(_, b)) => DType::Bool.promote_scalar((*a).max(*b)),
        };
        let mut shapes = vec![condition.shape()];
        for v in [&x, &y] {
            if let Value::Tensor(t) = v {
                condition.same_device(t, NAME)?;
                condition.dim_values().merge(t.dim_values(), NAME)?;
                shapes.push(t.shape());
            }
        }
        let shape = rules::broadcast_all(NAME, &shapes)?;
        let cond = condition.broadcast_to_shape(&shape);
        let operand = |v: Value| match v {
            Value::Tensor(t) => t.cast_to(dtype).broadcast_to_shape(&shape),
            Value::Scalar(s, _) => cond.full_like_scalar(s, dtype),
        };
        let (x, y) = (operand(x), operand(y));
        Ok(cond.raw_where(&x, &y))
    }

    /// Clamps every value into `[min, max]` (`torch.clamp`); either bound may be `None`.
    /// NaN stays NaN; where `min > max` the result is `max`. A float bound on an integer
    /// tensor gives `f32`, like PyTorch.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([-2.0f32, 0.5, 3.0]);
    /// assert_eq!(t.clamp(Some(-1.0), Some(1.0))?.to_vec::<f32>()?, vec![-1.0, 0.5, 1.0]);
    /// assert_eq!(Tensor::from([-5i64, 5]).clamp(Some(0), None)?.to_vec::<i64>()?, vec![0, 5]);
    /// assert!(t.clamp(None::<f64>, None).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn clamp<S: ScalarOperand>(&self, min: Option<S>, max: Option<S>) -> Result<Tensor> {
        let mut out = match (min, max) {
            (None, None) => return Err(no_clamp_bounds()),
            (Some(lo), _) => self.aligned_binary(lo, BinaryOp::Max, "clamp", "")?,
            (None, Some(_)) => self.clone(),
        };
        if let Some(hi) = max {
            out = out.aligned_binary(hi, BinaryOp::Min, "clamp", "")?;
        }
        Ok(out)
    }

    /// [`Tensor::clamp`] with tensor bounds, broadcast with `self` (`torch.clamp(x, min,
    /// max)` with tensors).
    pub fn clamp_tensor(&self, min: Option<&Tensor>, max: Option<&Tensor>) -> Result<Tensor> {
        let mut out = match (min, max) {
            (None, None) => return Err(no_clamp_bounds()),
            (Some(lo), _) => self.aligned_binary(lo, BinaryOp::Max, "clamp", "")?,
            (None, Some(_)) => self.clone(),
        };
        if let Some(hi) = max {
            out = out.aligned_binary(hi, BinaryOp::Min, "clamp", "")?;
        }
        Ok(out)
    }

    // ---------------------------------------------------------------------------------
    // Conversion
    // ---------------------------------------------------------------------------------

    /// The values converted to `dtype` (`tensor.to(dtype)`), with Rust's `as` semantics:
    /// float to integer truncates toward zero and saturates (NaN gives 0), integers wrap,
    /// anything to `bool` is `x != 0`, and floats round to nearest even.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([-1.7f32, 2.5, 300.0]);
    /// assert_eq!(t.cast(DType::I32).to_vec::<i32>()?, vec![-1, 2, 300]);
    /// assert_eq!(t.cast(DType::U8).to_vec::<u8>()?, vec![0, 2, 255]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn cast(&self, dtype: DType) -> Tensor {
        self.cast_to(dtype)
    }

    /// The same values, cut off from gradients (`Tensor.detach`): [`crate::grad`] treats the
    /// result as a constant. Nothing is copied; the kernels read `self`.
    ///
    /// ```
    /// # use tessel_tensor::{Tensor, grad};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from([3.0f32]);
    /// let y = (&(&x * &x)? + &(&x * &x.detach())?)?.sum_all()?; // d/dx = 2x + x
    /// assert_eq!(grad(&y, &[&x])?[0].to_vec::<f32>()?, vec![9.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn detach(&self) -> Tensor {
        // A bit reinterpretation as the same dtype: no arithmetic, and no gradient.
        self.record(Op::Bitcast(self.node()), self.dtype(), self.shape().clone())
    }

    /// The same bits reinterpreted as `dtype` (`tensor.view(dtype)`), which must have the
    /// same size. Reinterpreting bytes as `bool` is refused, since only 0 and 1 are valid
    /// `bool` bytes; compare with `.ne(0)` instead.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([1.0f32, -2.0]);
    /// assert_eq!(t.bitcast(DType::U32)?.to_vec::<u32>()?, vec![0x3f80_0000, 0xc000_0000]);
    /// assert!(t.bitcast(DType::F16).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn bitcast(&self, dtype: DType) -> Result<Tensor> {
        let from = self.dtype();
        if from == dtype {
            return Ok(self.clone());
        }
        if from.size_bytes() != dtype.size_bytes() {
            return Err(Error::InvalidArgument {
                op: "bitcast",
                reason: format!(
                    "cannot reinterpret {from} ({} bytes) as {dtype} ({} bytes); bitcast needs dtypes of the same size, use .cast(DType::{dtype:?}) to convert values",
                    from.size_bytes(),
                    dtype.size_bytes()
                ),
            });
        }
        if dtype == DType::Bool {
            return Err(Error::InvalidArgument {
                op: "bitcast",
                reason: format!(
                    "cannot reinterpret {from} bytes as bool, since only 0 and 1 are valid bool bytes; use .ne(0) to test for nonzero"
                ),
            });
        }
        if from == DType::Bool {
            // A bool's byte is 0 or 1, which is also its value as `u8` or `i8`.
            return Ok(self.cast_to(dtype));
        }
        Ok(self.record(Op::Bitcast(self.node()), dtype, self.shape().clone()))
    }

    // ---------------------------------------------------------------------------------
    // Unary
    // ---------------------------------------------------------------------------------

    /// `-self` (`torch.neg`); wrapping on integers. Not defined for `bool`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// assert_eq!(Tensor::from([1i32, -2]).neg()?.to_vec::<i32>()?, vec![-1, 2]);
    /// assert!(Tensor::from([true]).neg().is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn neg(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Neg, "neg", NEG_BOOL_HINT)
    }

    /// `|self|` (`torch.abs`); wrapping on signed integers (`abs(MIN) == MIN`). Not defined
    /// for `bool`.
    pub fn abs(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Abs, "abs", ARITH_BOOL_HINT)
    }

    /// `-1`, `0` or `1` by the sign (`torch.sign`); `0` for `±0`, NaN for NaN; the identity
    /// on `bool`.
    pub fn sign(&self) -> Tensor {
        if self.dtype() == DType::Bool {
            return self.clone();
        }
        if self.dtype().is_float8() {
            // Exact through f32 (float8 has no arithmetic of its own), and back.
            return self.cast_to(DType::F32).sign().cast_to(self.dtype());
        }
        self.raw_unary(UnaryOp::Sign)
    }

    fn rounding(&self, op: UnaryOp, name: &'static str) -> Result<Tensor> {
        if self.dtype().is_int() {
            return Ok(self.clone());
        }
        self.unary_op(op, name, ROUND_BOOL_HINT)
    }

    /// Rounds toward negative infinity (`torch.floor`); the identity on integers. Not
    /// defined for `bool`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([-1.5f32, 0.5, 1.5, 2.5]);
    /// assert_eq!(t.floor()?.to_vec::<f32>()?, vec![-2.0, 0.0, 1.0, 2.0]);
    /// assert_eq!(t.round()?.to_vec::<f32>()?, vec![-2.0, 0.0, 2.0, 2.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn floor(&self) -> Result<Tensor> {
        self.rounding(UnaryOp::Floor, "floor")
    }

    /// Rounds toward positive infinity (`torch.ceil`); the identity on integers.
    pub fn ceil(&self) -> Result<Tensor> {
        self.rounding(UnaryOp::Ceil, "ceil")
    }

    /// Rounds to nearest, ties to even (`torch.round`); the identity on integers.
    pub fn round(&self) -> Result<Tensor> {
        self.rounding(UnaryOp::Round, "round")
    }

    /// Rounds toward zero (`torch.trunc`); the identity on integers.
    pub fn trunc(&self) -> Result<Tensor> {
        self.rounding(UnaryOp::Trunc, "trunc")
    }

    /// Whether each value is NaN (`torch.isnan`), as `bool`; always false for integers.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([1.0f32, f32::NAN, f32::INFINITY]);
    /// assert_eq!(t.isnan().to_vec::<bool>()?, vec![false, true, false]);
    /// assert_eq!(t.isinf().to_vec::<bool>()?, vec![false, false, true]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn isnan(&self) -> Tensor {
        self.widen_float8().raw_unary(UnaryOp::IsNan)
    }

    /// Whether each value is an infinity of either sign (`torch.isinf`), as `bool`.
    pub fn isinf(&self) -> Tensor {
        self.widen_float8().raw_unary(UnaryOp::IsInf)
    }

    /// Float8 (which has no ops of its own) widened to f32, exactly, NaNs and infinities
    /// included; other dtypes as they are.
    fn widen_float8(&self) -> Tensor {
        if self.dtype().is_float8() {
            self.cast_to(DType::F32)
        } else {
            self.clone()
        }
    }

    /// `max(self, 0)` (`torch.relu`); NaN stays NaN; the identity on `bool` and unsigned
    /// dtypes.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([-1.0f32, 0.5]);
    /// assert_eq!(t.relu().to_vec::<f32>()?, vec![0.0, 0.5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn relu(&self) -> Tensor {
        if !self.dtype().is_signed() {
            return self.clone();
        }
        if self.dtype().is_float8() {
            // Exact through f32 (float8 has no arithmetic of its own), and back.
            return self.cast_to(DType::F32).relu().cast_to(self.dtype());
        }
        self.raw_binary(BinaryOp::Max, &self.constant(0.0))
    }

    /// The logistic function `1 / (1 + e^-x)` (`torch.sigmoid`), computed without
    /// overflow for large `|x|`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let s = Tensor::from([0.0f32, -200.0, 200.0]).sigmoid().to_vec::<f32>()?;
    /// assert_eq!(s, vec![0.5, 0.0, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn sigmoid(&self) -> Tensor {
        self.with_opmath(sigmoid_of)
    }

    /// `x * sigmoid(x)` (`torch.nn.functional.silu`).
    pub fn silu(&self) -> Tensor {
        self.with_opmath(|x| x.raw_binary(BinaryOp::Mul, &sigmoid_of(x)))
    }

    /// The exact GELU `x/2 * (1 + erf(x / sqrt 2))` (`torch.nn.functional.gelu`).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let g = Tensor::from([1.0f32]).gelu().item::<f32>()?;
    /// assert!((g - 0.841_344_7).abs() < 1e-6);
    /// # Ok(())
    /// # }
    /// ```
    pub fn gelu(&self) -> Tensor {
        self.with_opmath(|x| {
            let erf = x
                .raw_binary(BinaryOp::Mul, &x.constant(std::f64::consts::FRAC_1_SQRT_2))
                .raw_unary(UnaryOp::Erf);
            half_x_times_one_plus(x, &erf)
        })
    }

    /// GELU's tanh approximation `x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`
    /// (`torch.nn.functional.gelu(x, approximate="tanh")`).
    pub fn gelu_tanh(&self) -> Tensor {
        self.with_opmath(|x| {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let cube = x.raw_binary(BinaryOp::Mul, x).raw_binary(BinaryOp::Mul, x);
            let inner = x
                .raw_binary(
                    BinaryOp::Add,
                    &cube.raw_binary(BinaryOp::Mul, &x.constant(0.044_715)),
                )
                .raw_binary(BinaryOp::Mul, &x.constant(k));
            half_x_times_one_plus(x, &inner.raw_unary(UnaryOp::Tanh))
        })
    }
}

/// `sigmoid(x)` for a float `x`: with `e = exp(-|x|)`, `1 / (1 + e)` for `x >= 0` and
/// `e / (1 + e)` otherwise, so `exp` never overflows.
fn sigmoid_of(x: &Tensor) -> Tensor {
    let e = x
        .raw_unary(UnaryOp::Abs)
        .raw_unary(UnaryOp::Neg)
        .raw_unary(UnaryOp::Exp);
    let s = e
        .raw_binary(BinaryOp::Add, &x.constant(1.0))
        .raw_unary(UnaryOp::Reciprocal);
    let non_negative = x.raw_binary(BinaryOp::Ge, &x.constant(0.0));
    non_negative.raw_where(&s, &e.raw_binary(BinaryOp::Mul, &s))
}

/// `x/2 * (1 + t)`.
fn half_x_times_one_plus(x: &Tensor, t: &Tensor) -> Tensor {
    let half_x = x.raw_binary(BinaryOp::Mul, &x.constant(0.5));
    half_x.raw_binary(
        BinaryOp::Mul,
        &t.raw_binary(BinaryOp::Add, &x.constant(1.0)),
    )
}

fn no_clamp_bounds() -> Error {
    Error::InvalidArgument {
        op: "clamp",
        reason: "at least one of min and max must be given".into(),
    }
}

/// Float functions: integer and `bool` inputs compute in `f32`, like PyTorch.
macro_rules! float_unary {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Tensor {$(
            $(#[$doc])*
            pub fn $name(&self) -> Tensor {
                self.to_float().raw_unary(UnaryOp::$op)
            }
        )*}
    };
}

float_unary! {
    /// `e^x` (`torch.exp`).
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let e = Tensor::from([0i32, 1]).exp();
    /// assert_eq!(e.dtype(), DType::F32);
    /// assert_eq!(e.to_vec::<f32>()?, vec![1.0, std::f32::consts::E]);
    /// # Ok(())
    /// # }
    /// ```
    exp => Exp;
    /// `2^x` (`torch.exp2`).
    exp2 => Exp2;
    /// The natural logarithm (`torch.log`); NaN below 0, `-inf` at 0.
    log => Log;
    /// The base-2 logarithm (`torch.log2`).
    log2 => Log2;
    /// The square root (`torch.sqrt`); NaN below 0.
    sqrt => Sqrt;
    /// `1 / sqrt(x)` (`torch.rsqrt`).
    rsqrt => Rsqrt;
    /// `1 / x` (`torch.reciprocal`).
    reciprocal => Reciprocal;
    /// The sine (`torch.sin`).
    sin => Sin;
    /// The cosine (`torch.cos`).
    cos => Cos;
    /// The tangent (`torch.tan`).
    tan => Tan;
    /// The hyperbolic tangent (`torch.tanh`).
    tanh => Tanh;
    /// The error function (`torch.erf`).
    erf => Erf;
}
