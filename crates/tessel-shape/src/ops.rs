//! The scalar operations every layer shares.
//!
//! The kernel IR, constant folding and the reference interpreter all speak these enums, and
//! [`Scalar`](crate::Scalar) defines what each one computes. A backend's emitter must produce
//! code whose results equal [`Scalar`](crate::Scalar)'s for every dtype the op supports; where C, CUDA,
//! OpenCL or WGSL differ from it natively (integer division by zero, NaN in `max`, shifts
//! past the bit width), the emitter guards the operation.

use std::fmt;

/// An operation on one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    /// `-x`; wrapping on integers.
    Neg,
    /// Logical not on `bool`, bitwise not on integers.
    Not,
    /// `|x|`; wrapping on signed integers (`abs(MIN) == MIN`).
    Abs,
    /// `-1`, `0` or `1` (`0` for `±0`, NaN for NaN).
    Sign,
    /// `1 / x` (floats only).
    Reciprocal,
    /// Square root (floats only).
    Sqrt,
    /// `1 / sqrt(x)` (floats only).
    Rsqrt,
    /// `e^x` (floats only).
    Exp,
    /// `2^x` (floats only).
    Exp2,
    /// Natural logarithm (floats only).
    Log,
    /// Base-2 logarithm (floats only).
    Log2,
    /// Sine (floats only).
    Sin,
    /// Cosine (floats only).
    Cos,
    /// Tangent (floats only).
    Tan,
    /// Hyperbolic tangent (floats only).
    Tanh,
    /// The error function (floats only).
    Erf,
    /// Round toward negative infinity (identity on integers).
    Floor,
    /// Round toward positive infinity (identity on integers).
    Ceil,
    /// Round half to even, like `torch.round` (identity on integers).
    Round,
    /// Round toward zero (identity on integers).
    Trunc,
    /// `x != x`; the result is `bool`.
    IsNan,
    /// `|x| == inf`; the result is `bool`.
    IsInf,
}

/// An operation on two values of the same dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    /// `a + b`; wrapping on integers, logical or on `bool`.
    Add,
    /// `a - b`; wrapping on integers.
    Sub,
    /// `a * b`; wrapping on integers, logical and on `bool`.
    Mul,
    /// `a / b`: IEEE on floats; truncating on integers, where `a / 0 == a` and
    /// `MIN / -1 == MIN` (WGSL's definition, which the other emitters guard to match).
    Div,
    /// Remainder with the sign of the dividend (C's `%`, `fmod`); `a % 0 == 0` on integers.
    Rem,
    /// `a^b`: `powf` on floats; on integers exact with wrapping, and a negative
    /// exponent gives `1 / a^|b|` truncated (`0` for `|a| > 1`, `0` for `a == 0`).
    Pow,
    /// The larger value; NaN if either is NaN (like `torch.maximum`).
    Max,
    /// The smaller value; NaN if either is NaN (like `torch.minimum`).
    Min,
    /// Bitwise and on integers, logical and on `bool`.
    And,
    /// Bitwise or on integers, logical or on `bool`.
    Or,
    /// Bitwise xor on integers, logical xor on `bool`.
    Xor,
    /// `a << (b mod bits)` on integers.
    Shl,
    /// `a >> (b mod bits)` on integers: arithmetic for signed, logical for unsigned.
    Shr,
    /// `a == b`; the result is `bool`.
    Eq,
    /// `a != b`; the result is `bool`.
    Ne,
    /// `a < b`; the result is `bool`.
    Lt,
    /// `a <= b`; the result is `bool`.
    Le,
    /// `a > b`; the result is `bool`.
    Gt,
    /// `a >= b`; the result is `bool`.
    Ge,
}

/// An operation on three values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TernaryOp {
    /// `if a { b } else { c }`: `a` is `bool`, `b` and `c` share a dtype.
    Where,
    /// `a * b + c`, fused (one rounding) on floats, wrapping on integers.
    MulAdd,
}

impl UnaryOp {
    /// Every unary op, for table-driven tests and op tables.
    pub const ALL: [UnaryOp; 22] = [
        Self::Neg,
        Self::Not,
        Self::Abs,
        Self::Sign,
        Self::Reciprocal,
        Self::Sqrt,
        Self::Rsqrt,
        Self::Exp,
        Self::Exp2,
        Self::Log,
        Self::Log2,
        Self::Sin,
        Self::Cos,
        Self::Tan,
        Self::Tanh,
        Self::Erf,
        Self::Floor,
        Self::Ceil,
        Self::Round,
        Self::Trunc,
        Self::IsNan,
        Self::IsInf,
    ];

    /// The op's lowercase name, as the IR's text form prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Neg => "neg",
            Self::Not => "not",
            Self::Abs => "abs",
            Self::Sign => "sign",
            Self::Reciprocal => "recip",
            Self::Sqrt => "sqrt",
            Self::Rsqrt => "rsqrt",
            Self::Exp => "exp",
            Self::Exp2 => "exp2",
            Self::Log => "log",
            Self::Log2 => "log2",
            Self::Sin => "sin",
            Self::Cos => "cos",
            Self::Tan => "tan",
            Self::Tanh => "tanh",
            Self::Erf => "erf",
            Self::Floor => "floor",
            Self::Ceil => "ceil",
            Self::Round => "round",
            Self::Trunc => "trunc",
            Self::IsNan => "isnan",
            Self::IsInf => "isinf",
        }
    }
}

impl BinaryOp {
    /// Every binary op, for table-driven tests and op tables.
    pub const ALL: [BinaryOp; 19] = [
        Self::Add,
        Self::Sub,
        Self::Mul,
        Self::Div,
        Self::Rem,
        Self::Pow,
        Self::Max,
        Self::Min,
        Self::And,
        Self::Or,
        Self::Xor,
        Self::Shl,
        Self::Shr,
        Self::Eq,
        Self::Ne,
        Self::Lt,
        Self::Le,
        Self::Gt,
        Self::Ge,
    ];

    /// The op's lowercase name, as the IR's text form prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Sub => "sub",
            Self::Mul => "mul",
            Self::Div => "div",
            Self::Rem => "rem",
            Self::Pow => "pow",
            Self::Max => "max",
            Self::Min => "min",
            Self::And => "and",
            Self::Or => "or",
            Self::Xor => "xor",
            Self::Shl => "shl",
            Self::Shr => "shr",
            Self::Eq => "eq",
            Self::Ne => "ne",
            Self::Lt => "lt",
            Self::Le => "le",
            Self::Gt => "gt",
            Self::Ge => "ge",
        }
    }

    /// Whether the result is `bool` whatever the operands' dtype.
    pub const fn is_comparison(self) -> bool {
        matches!(
            self,
            Self::Eq | Self::Ne | Self::Lt | Self::Le | Self::Gt | Self::Ge
        )
    }

    /// Whether `a op b == b op a` for every dtype the op supports.
    pub const fn is_commutative(self) -> bool {
        matches!(
            self,
            Self::Add
                | Self::Mul
                | Self::Max
                | Self::Min
                | Self::And
                | Self::Or
                | Self::Xor
                | Self::Eq
                | Self::Ne
        )
    }
}

impl TernaryOp {
    /// The op's lowercase name, as the IR's text form prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Where => "where",
            Self::MulAdd => "mad",
        }
    }
}

impl fmt::Display for UnaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for BinaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for TernaryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
