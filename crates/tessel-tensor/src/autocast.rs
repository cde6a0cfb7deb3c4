//! Mixed precision: PyTorch's `torch.autocast`.
//!
//! Inside [`autocast`]`(dtype, ..)` the ops that profit from half precision, matrix
//! products ([`Tensor::matmul`] and what is built on it: `Linear`, convolutions, `bmm`,
//! attention) cast their float operands (but `f64`) to `dtype` (`bf16` or `f16`) and
//! return `dtype` (`einsum` and `tensordot` compute their product so but return their
//! operands' dtype); products run on the half-precision library routines (tensor cores,
//! `f32` accumulation). The ops that need range or precision (`softmax`, `log_softmax`,
//! and `tessel-nn`'s losses and layer norms) cast half-precision operands to `f32` and
//! return `f32`. Every other op follows the usual type promotion (a `bf16` product plus an
//! `f32` bias is `f32`), as in PyTorch.
//!
//! Parameters stay in `f32` (the master weights): a product reads them through a cast,
//! whose gradient is cast back, so gradients and the optimizer's update are `f32`. With
//! `f16`, scale the loss to keep small gradients from flushing to zero (`tessel-nn`'s
//! `GradScaler`); `bf16` has `f32`'s range and needs no scaling.
//!
//! The setting is per thread, as PyTorch's is, and nests: the innermost scope wins.
//!
//! ```
//! use tessel_tensor::{DType, Tensor, autocast};
//! # fn main() -> tessel_tensor::Result<()> {
//! let x = Tensor::ones([2, 3], DType::F32);
//! let w = Tensor::ones([3, 4], DType::F32);
//! let y = autocast(DType::BF16, || x.matmul(&w))?;
//! assert_eq!(y.dtype(), DType::BF16);
//! assert_eq!(x.matmul(&w)?.dtype(), DType::F32); // outside the scope
//! # Ok(())
//! # }
//! ```

use std::cell::Cell;

use tessel_graph::Op;
use tessel_shape::DType;

use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Runs `f` with automatic mixed precision in `dtype` (`DType::BF16` or `DType::F16`), as
/// `with torch.autocast(device_type, dtype):` does. See the module docs for which ops
/// change.
///
/// # Errors
///
/// `dtype` other than `bf16` or `f16`; whatever `f` returns.
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> Result<R>) -> Result<R> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(Error::InvalidArgument {
            op: "autocast",
            reason: format!(
                "mixed precision runs in DType::BF16 or DType::F16, not {dtype}; pick one of those"
            ),
        });
    }
    let _restore = Restore(AUTOCAST.replace(Some(dtype)));
    f()
}

/// Restores the enclosing [`autocast`] setting when dropped, also when the scope panics.
struct Restore(Option<DType>);

impl Drop for Restore {
    fn drop(&mut self) {
        AUTOCAST.set(self.0);
    }
}

/// The dtype of the innermost [`autocast`] scope on this thread, if any.
#[must_use]
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.get()
}

/// A matrix product's operand under [`autocast`]: floats cast to the scope's dtype
/// (`f64` stays, as in PyTorch).
pub(crate) fn product_operand(x: &Tensor) -> Tensor {
    match autocast_dtype() {
        Some(low) if x.dtype().is_float() && x.dtype() != DType::F64 && x.dtype() != low => {
            cast_below_permute(x, low)
        }
        _ => x.clone(),
    }
}

/// `x` cast to `dtype`; where `x` is a permute (a transposed weight, `w.t()`), the permute
/// of the cast of its operand, which is the same values: the cast is then stored in the
/// weight's own layout, which a library routine reads transposed. Cast after the permute,
/// it would be stored transposed: GPT-2's tied `[50257, 768]` embedding as rows of 50 257
/// elements, which cuBLAS reads several times slower than rows of 768.
fn cast_below_permute(x: &Tensor, dtype: DType) -> Tensor {
    let inner = {
        let mut st = tessel_runtime::runtime().lock();
        match &st.graph.node(x.node()).op {
            Op::Permute(child, perm) => {
                let (child, perm) = (*child, perm.clone());
                let node = st.graph.node(child);
                let (shape, from) = (node.shape.clone(), node.dtype);
                st.graph.retain(child);
                Some((child, perm, shape, from))
            }
            _ => None,
        }
    };
    match inner {
        Some((child, perm, shape, from)) => {
            let values = x.dim_values().clone();
            let source = Tensor::from_node_with(child, shape, from, x.device(), values);
            let cast = source.cast(dtype);
            cast.record(Op::Permute(cast.node(), perm), dtype, x.shape().clone())
        }
        None => x.cast(dtype),
    }
}

/// The operand of an op that [`autocast`] runs in `f32` (half-precision floats cast to
/// `f32`). Public for `tessel-nn`'s losses and norms.
#[must_use]
pub fn full_precision_operand(x: &Tensor) -> Tensor {
    match (autocast_dtype(), x.dtype()) {
        (Some(_), DType::F16 | DType::BF16) => x.cast(DType::F32),
        _ => x.clone(),
    }
}
