//! `+ - * /` and unary `-` on tensors and numbers. Every operator returns
//! `Result<Tensor>` (a shape or dtype mistake is an error, not a panic), so expressions
//! compose with `?`:
//!
//! ```
//! # use tessel_tensor::Tensor;
//! # fn main() -> tessel_tensor::Result<()> {
//! let x = Tensor::from([1.0f32, 2.0]);
//! let y = (&(2.0 * &x)? - 1.0)?;
//! assert_eq!(y.to_vec::<f32>()?, vec![1.0, 3.0]);
//! assert_eq!((-&x)?.to_vec::<f32>()?, vec![-1.0, -2.0]);
//! # Ok(())
//! # }
//! ```

use std::ops::{Add, Div, Mul, Neg, Sub};

use super::ScalarOperand;
use super::elementwise::Operand;
use crate::tensor::Tensor;
use tessel_runtime::Result;

/// `tensor op operand` for owned and borrowed tensors, through the named method.
macro_rules! tensor_lhs {
    ($($trait:ident $method:ident),*) => {$(
        impl<R: Operand> $trait<R> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: R) -> Result<Tensor> {
                Tensor::$method(self, rhs)
            }
        }

        impl<R: Operand> $trait<R> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: R) -> Result<Tensor> {
                Tensor::$method(&self, rhs)
            }
        }
    )*};
}

tensor_lhs!(Add add, Sub sub, Mul mul, Div div);

/// `number op tensor`: the number becomes a constant of the tensor's promoted dtype, then
/// the tensor op runs, so `2.0 - &t` promotes exactly like `&t - 2.0`.
///
/// Only `f64` and `i64` get these impls: with one impl per literal category, a bare literal
/// (`2.0 * &t`, `1 - &t`) infers its type; impls for `f32` and `i32` as well would make
/// every such literal ambiguous. `f32`/`i32` values go on the right (`&t * x`) or convert
/// with `f64::from(x)`; promotion is the same either way, since a number's category, not
/// its width, decides it.
macro_rules! scalar_lhs {
    ($($t:ty),*) => {$(
        scalar_lhs!(@op $t, Add add, Sub sub, Mul mul, Div div);
    )*};
    (@op $t:ty, $($trait:ident $method:ident),*) => {$(
        impl $trait<&Tensor> for $t {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(&rhs.scalar_like(self), rhs)
            }
        }

        impl $trait<Tensor> for $t {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(&rhs.scalar_like(self), &rhs)
            }
        }
    )*};
}

scalar_lhs!(f64, i64);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}

impl Tensor {
    /// `value` as a constant in this tensor's shape, of the dtype `self op value` computes
    /// in.
    pub(crate) fn scalar_like(&self, value: impl ScalarOperand) -> Tensor {
        let (scalar, kind) = value.to_operand();
        self.full_like_scalar(scalar, self.dtype().promote_scalar(kind))
    }
}
