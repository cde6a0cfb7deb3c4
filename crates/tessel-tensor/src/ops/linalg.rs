//! Matrix products: `matmul` (`torch.matmul`) and `dot`.
//!
//! A product is a reduction of a broadcast multiply: both operands are viewed in one
//! `[..batch, m, k, n]` iteration space (the lhs as `[.., m, k, 1]`, the rhs as
//! `[.., 1, k, n]`, each expanded), multiplied, and summed over `k`. The kernelizer folds the
//! views into the loads, so a product is one kernel that never materializes the broadcast,
//! and an elementwise epilogue (bias, activation) fuses into it.

use tessel_graph::{Op, ReduceOp};
use tessel_shape::{BinaryOp, DType, Dim, Scalar, Shape, ShapeError, rules};

use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

impl Tensor {
    /// The matrix product, exactly as `torch.matmul`:
    ///
    /// - 1-d · 1-d: the dot product, a 0-d tensor;
    /// - 2-d · 2-d: `[m, k] · [k, n] → [m, n]`;
    /// - 1-d · n-d: the vector is a `[1, k]` row, and that dim is removed from the result;
    /// - n-d · 1-d: the vector is a `[k, 1]` column, and that dim is removed;
    /// - otherwise the batch dims (all but the last two) broadcast:
    ///   `[5, 1, 2, 3] · [4, 3, 6] → [5, 4, 2, 6]`.
    ///
    /// Dtypes promote like the arithmetic ops (`torch.matmul` itself requires equal dtypes);
    /// integers multiply and accumulate in their own dtype, wrapping like `PyTorch`, and
    /// `f16`/`bf16` accumulate in `f32`. `bool` is an error, as on `PyTorch`'s CPU: cast to a
    /// number type first.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3])?;
    /// let b = Tensor::from_vec(vec![1.0f32, 0.0, 1.0], [3])?;
    /// assert_eq!(a.matmul(&b)?.to_vec::<f32>()?, vec![4.0, 10.0]);
    /// assert!(a.matmul(&a).is_err()); // [2, 3] · [2, 3]: 3 != 2
    /// # Ok(())
    /// # }
    /// ```
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        const OP: &str = "matmul";
        self.same_device(rhs, OP)?;
        let out = rules::matmul(self.shape(), rhs.shape())?;
        // Under `autocast`, float operands in half precision.
        let (lhs, rhs) = (
            crate::autocast::product_operand(self),
            crate::autocast::product_operand(rhs),
        );
        let dtype = lhs
            .dtype()
            .promote(rhs.dtype())
            .map_err(|source| Error::Promotion { op: OP, source })?;
        if dtype.is_bool() {
            return Err(Error::UnsupportedDType {
                op: OP,
                dtype,
                hint: "cast to a number type first, e.g. .cast(DType::F32) or .cast(DType::I64)",
            });
        }
        let compute = match dtype {
            DType::F16 | DType::BF16 => DType::F32,
            other => other,
        };
        let lhs = lhs.cast_to(compute);
        let rhs = rhs.cast_to(compute);

        // Vectors as a [1, k] row and a [k, 1] column.
        let lhs_dims: Vec<Dim> = match lhs.shape().dims() {
            [k] => vec![Dim::constant(1), *k],
            dims => dims.to_vec(),
        };
        let rhs_dims: Vec<Dim> = match rhs.shape().dims() {
            [k] => vec![*k, Dim::constant(1)],
            dims => dims.to_vec(),
        };
        let (l_batch, [m, k]) = split_last2(&lhs_dims);
        let (r_batch, [_, n]) = split_last2(&rhs_dims);
        let batch = rules::broadcast(
            OP,
            &Shape::new(l_batch.to_vec()),
            &Shape::new(r_batch.to_vec()),
        )?;
        let rank = batch.ndim();

        // [..1, l_batch, m, k, 1] and [..1, r_batch, 1, k, n], expanded to [..batch, m, k, n].
        let space: Shape = batch.iter().copied().chain([m, k, n]).collect();
        let aligned = |batch_dims: &[Dim], tail: [Dim; 3]| -> Shape {
            let lead = rank - batch_dims.len();
            std::iter::repeat_n(Dim::constant(1), lead)
                .chain(batch_dims.iter().copied())
                .chain(tail)
                .collect()
        };
        let one = Dim::constant(1);
        let lhs = lhs
            .reshape_to(aligned(l_batch, [m, k, one]))
            .broadcast_to_shape(&space);
        let rhs = rhs
            .reshape_to(aligned(r_batch, [one, k, n]))
            .broadcast_to_shape(&space);
        let prod = lhs.binary_aligned(&rhs, BinaryOp::Mul, OP, "")?;
        let kept: Shape = batch.iter().copied().chain([m, one, n]).collect();
        let sum = if space.iter().any(|d| d.as_const() == Some(0)) {
            // An empty contraction (every output is 0), or no output at all; either way no
            // kernel needs to read an empty operand.
            prod.record(Op::Const(Scalar::zero(compute)), compute, kept)
        } else {
            prod.record(
                Op::Reduce(ReduceOp::Sum, prod.node(), vec![rank + 1].into()),
                compute,
                kept,
            )
        };
        Ok(sum.cast_to(dtype).reshape_to(out))
    }

    /// The dot product of two 1-d tensors of equal length, as a 0-d tensor (`torch.dot`).
    /// Dtypes promote as in [`Tensor::matmul`].
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::from_vec(vec![1i64, 2, 3], [3])?;
    /// assert_eq!(a.dot(&a)?.item::<i64>()?, 14);
    /// # Ok(())
    /// # }
    /// ```
    pub fn dot(&self, rhs: &Tensor) -> Result<Tensor> {
        const OP: &str = "dot";
        for t in [self, rhs] {
            if t.ndim() != 1 {
                return Err(Error::Shape(ShapeError::RankMismatch {
                    op: OP,
                    shape: t.shape().clone(),
                    expected: "1 (dot takes two vectors; use matmul for matrices)".to_owned(),
                }));
            }
        }
        if self.shape()[0] != rhs.shape()[0] {
            return Err(Error::Shape(ShapeError::MatmulMismatch {
                op: OP,
                lhs: self.shape().clone(),
                rhs: rhs.shape().clone(),
                lhs_dim: self.shape()[0],
                rhs_dim: rhs.shape()[0],
            }));
        }
        self.matmul(rhs)
    }
}

/// The batch dims and the last two dims of a shape with at least two dims.
fn split_last2(dims: &[Dim]) -> (&[Dim], [Dim; 2]) {
    let (batch, last) = dims.split_at(dims.len() - 2);
    (batch, [last[0], last[1]])
}
