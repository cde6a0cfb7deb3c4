//! The ops, one file per family, over a few shared helpers that every op reports through:
//! dtype checks, promotion, broadcasting and node recording.

mod conv;
mod creation;
mod custom;
mod einsum;
mod elementwise;
mod indexing;
mod linalg;
mod math;
pub(crate) mod movement;
mod operators;
mod padding;
mod pool;
mod random;
pub(crate) mod reduce;
mod scan;
mod scatter;
mod sort;

pub use conv::{Conv1dOptions, Conv2dOptions, Conv3dOptions, ConvOptions, Padding};
pub(crate) use custom::{Backward, split_outputs};
pub use custom::{CustomBackward, CustomOp};
pub use elementwise::Operand;
pub(crate) use indexing::verify_pending_indices;
pub use pool::PoolOptions;
pub(crate) use random::{collect_keys, fresh_key};
pub(crate) use scatter::scatter_add_into_zeros;

use tessel_graph::Op;
use tessel_shape::{BinaryOp, DType, Dim, Scalar, ScalarKind, Shape, UnaryOp, rules};

use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

/// A Rust number usable as the other operand of a tensor op (`&t + 2.0`, `t.maximum(0)`).
pub trait ScalarOperand: Copy {
    /// The value, and whether it counts as an int or a float for promotion.
    fn to_operand(self) -> (Scalar, ScalarKind);
}

macro_rules! scalar_operand {
    ($($t:ty => $kind:ident),*) => {$(
        impl ScalarOperand for $t {
            fn to_operand(self) -> (Scalar, ScalarKind) {
                (Scalar::from(self), ScalarKind::$kind)
            }
        }
    )*};
}
scalar_operand!(f64 => Float, f32 => Float, i64 => Int, i32 => Int, bool => Bool);

impl Tensor {
    /// Checks that the constant dims of `self` multiply to at most `i64::MAX`, zeros
    /// counted as ones: ops that index the tensor (flat offsets, strides, radix passes)
    /// compute such products, and no buffer could hold past it anyway (an empty tensor
    /// with such dims is refused too, as PyTorch refuses it).
    pub(crate) fn check_size(&self, op: &'static str) -> Result<()> {
        let fits = self
            .shape()
            .iter()
            .filter_map(|d| d.as_const())
            .try_fold(1i64, |n, d| n.checked_mul(d.max(1)));
        match fits {
            Some(_) => Ok(()),
            None => Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "shape {} has more than i64::MAX ({}) elements; no tensor this large can exist",
                    self.shape(),
                    i64::MAX
                ),
            }),
        }
    }

    /// Checks that `self` and `other` live on one device.
    pub(crate) fn same_device(&self, other: &Tensor, op: &'static str) -> Result<()> {
        if self.device() == other.device() {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                op,
                lhs: self.device().to_string(),
                rhs: other.device().to_string(),
            })
        }
    }

    /// `self` converted to `dtype` (the same handle if it already is).
    pub(crate) fn cast_to(&self, dtype: DType) -> Tensor {
        if self.dtype() == dtype {
            return self.clone();
        }
        // A constant that survives the round trip bit for bit is recorded converted: one
        // node fewer (`ones_like().cast(Bool)` is a constant `true`), and no question of
        // how a device would round it.
        if let Some(c) = self.constant_value() {
            let converted = c.cast(dtype);
            if converted.cast(self.dtype()) == c {
                return self.full_like_scalar(converted, dtype);
            }
        }
        self.record(Op::Cast(self.node()), dtype, self.shape().clone())
    }

    /// The value of a tensor recorded as a constant (`full_like`, `ones_like`, a scalar
    /// operand), none for any other.
    pub(crate) fn constant_value(&self) -> Option<Scalar> {
        match tessel_runtime::runtime().lock().graph.node(self.node()).op {
            Op::Const(c) => Some(c),
            _ => None,
        }
    }

    /// A constant of `value` (cast to `dtype`) in this tensor's shape and device.
    pub(crate) fn full_like_scalar(&self, value: Scalar, dtype: DType) -> Tensor {
        self.record(Op::Const(value.cast(dtype)), dtype, self.shape().clone())
    }

    /// `self` broadcast to `shape`, which broadcasting rules already produced.
    pub(crate) fn broadcast_to_shape(&self, shape: &Shape) -> Tensor {
        if self.shape() == shape {
            return self.clone();
        }
        // Right-align: prepend size-1 dims, then expand the size-1 dims.
        let missing = shape.ndim() - self.ndim();
        let mut dims = vec![Dim::constant(1); missing];
        dims.extend_from_slice(self.shape().dims());
        let aligned = Shape::new(dims);
        let base = if missing == 0 {
            self.clone()
        } else {
            self.record(Op::Reshape(self.node()), self.dtype(), aligned.clone())
        };
        if &aligned == shape {
            return base;
        }
        base.record(Op::Expand(base.node()), self.dtype(), shape.clone())
    }

    /// A unary op; `dtype_ok` rejects dtypes the op is not defined for (with `hint`).
    pub(crate) fn unary_op(
        &self,
        op: UnaryOp,
        name: &'static str,
        hint: &'static str,
    ) -> Result<Tensor> {
        let dtype = op
            .result_dtype(self.dtype())
            .ok_or_else(|| Error::UnsupportedDType {
                op: name,
                dtype: self.dtype(),
                hint: float8_hint(self.dtype(), hint),
            })?;
        Ok(self.record(Op::Unary(op, self.node()), dtype, self.shape().clone()))
    }

    /// `self` if it is a float tensor, else cast to f32. The float8 storage dtypes have no
    /// arithmetic, so float functions compute them in f32 too (and return f32).
    pub(crate) fn to_float(&self) -> Tensor {
        if self.dtype().is_float() && !self.dtype().is_float8() {
            self.clone()
        } else {
            self.cast_to(DType::F32)
        }
    }

    /// Promotes and broadcasts two operands for an elementwise op named `name`.
    pub(crate) fn align(&self, rhs: &Tensor, name: &'static str) -> Result<(Tensor, Tensor)> {
        self.same_device(rhs, name)?;
        let dtype = self
            .dtype()
            .promote(rhs.dtype())
            .map_err(|source| Error::Promotion { op: name, source })?;
        let shape = rules::broadcast(name, self.shape(), rhs.shape())?;
        let a = self.cast_to(dtype).broadcast_to_shape(&shape);
        let b = rhs.cast_to(dtype).broadcast_to_shape(&shape);
        Ok((a, b))
    }

    /// A binary op on operands of one dtype and shape.
    pub(crate) fn binary_aligned(
        &self,
        rhs: &Tensor,
        op: BinaryOp,
        name: &'static str,
        hint: &'static str,
    ) -> Result<Tensor> {
        debug_assert_eq!(self.shape(), rhs.shape());
        debug_assert_eq!(self.dtype(), rhs.dtype());
        let dtype = op
            .result_dtype(self.dtype())
            .ok_or_else(|| Error::UnsupportedDType {
                op: name,
                dtype: self.dtype(),
                hint: float8_hint(self.dtype(), hint),
            })?;
        self.dim_values().merge(rhs.dim_values(), name)?;
        Ok(self.record_with(
            &[rhs],
            Op::Binary(op, self.node(), rhs.node()),
            dtype,
            self.shape().clone(),
        ))
    }

    /// A scalar operand as a tensor, with PyTorch's tensor-scalar promotion applied to both.
    pub(crate) fn with_scalar(&self, value: impl ScalarOperand) -> (Tensor, Tensor) {
        let (scalar, kind) = value.to_operand();
        let dtype = self.dtype().promote_scalar(kind);
        let a = self.cast_to(dtype);
        let b = a.full_like_scalar(scalar, dtype);
        (a, b)
    }

    /// `self` viewed with `shape` (same number of elements, checked by the caller).
    pub(crate) fn reshape_to(&self, shape: Shape) -> Tensor {
        if self.shape() == &shape {
            return self.clone();
        }
        self.record(Op::Reshape(self.node()), self.dtype(), shape)
    }
}

/// What to do about an op on a float8 tensor, which has no arithmetic; `hint` otherwise.
pub(crate) fn float8_hint(dtype: DType, hint: &'static str) -> &'static str {
    if dtype.is_float8() {
        "float8 tensors are for storage and casts only, like PyTorch's; cast to f16, bf16 or \
         f32 first with .cast(DType::F32)"
    } else {
        hint
    }
}
