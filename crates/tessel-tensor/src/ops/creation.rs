//! Tensors from nothing: constants, ranges, identity matrices and Rust arrays.
//!
//! Constants, ranges and `eye` are graph nodes (`Const`, `Index`), so they hold no host
//! data and fuse into whatever consumes them. Random tensors are in `random.rs`, drawn on
//! the device the same way.

use tessel_graph::Op;
use tessel_shape::{BinaryOp, DType, Scalar, ScalarKind, Shape, TernaryOp};

use super::ScalarOperand;
use crate::element::Element;
use crate::tensor::Tensor;
use tessel_runtime::Device;
use tessel_runtime::{Error, Result};

impl Tensor {
    /// A tensor of `shape` filled with `value` converted to `dtype` (`torch.full`), on the
    /// default device. It is a constant node: no memory is used until it is realized.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::full([2, 2], 7.5, DType::F32);
    /// assert_eq!(t.to_vec::<f32>()?, vec![7.5; 4]);
    /// assert_eq!(Tensor::full([3], 2.9, DType::I32).to_vec::<i32>()?, vec![2; 3]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn full<T: Element>(shape: impl Into<Shape>, value: T, dtype: DType) -> Tensor {
        let value: Scalar = value.into();
        Tensor::record_on(
            Device::default(),
            Op::Const(value.cast(dtype)),
            dtype,
            shape.into(),
        )
    }

    /// A tensor of zeros (`torch.zeros`); `false` for `bool`.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let z = Tensor::zeros([2, 3], DType::I64);
    /// assert_eq!(z.dims(), vec![2, 3]);
    /// assert_eq!(z.to_vec::<i64>()?, vec![0; 6]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn zeros(shape: impl Into<Shape>, dtype: DType) -> Tensor {
        Tensor::full(shape, false, dtype)
    }

    /// A tensor of ones (`torch.ones`); `true` for `bool`.
    pub fn ones(shape: impl Into<Shape>, dtype: DType) -> Tensor {
        Tensor::full(shape, true, dtype)
    }

    /// A tensor of `self`'s shape, dtype and device filled with `value` converted to the
    /// dtype (`torch.full_like`).
    pub fn full_like<T: Element>(&self, value: T) -> Tensor {
        self.full_like_scalar(value.into(), self.dtype())
    }

    /// Zeros of `self`'s shape, dtype and device (`torch.zeros_like`).
    pub fn zeros_like(&self) -> Tensor {
        self.full_like(false)
    }

    /// Ones of `self`'s shape, dtype and device (`torch.ones_like`).
    pub fn ones_like(&self) -> Tensor {
        self.full_like(true)
    }

    /// A 0-d tensor holding `value`, like `torch.tensor(value)`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::scalar(3.5f64);
    /// assert_eq!(t.ndim(), 0);
    /// assert_eq!(t.item::<f64>()?, 3.5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Tensor::from_elements([value], Shape::scalar())
    }

    fn from_elements<T: Element>(values: impl IntoIterator<Item = T>, shape: Shape) -> Tensor {
        let mut bytes = Vec::new();
        for v in values {
            v.write_le(&mut bytes);
        }
        Tensor::from_bytes(bytes, T::DTYPE, shape)
    }

    /// Values from `start` up to (not including) `end` by `step` (`torch.arange`).
    ///
    /// The dtype follows PyTorch: `i64` when all three arguments are integers, else `f32`.
    /// The length is `ceil((end - start) / step)`. The values are computed by the kernel
    /// from each element's index, so the tensor holds no host data.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let i = Tensor::arange(0, 5, 2)?;
    /// assert_eq!(i.dtype(), DType::I64);
    /// assert_eq!(i.to_vec::<i64>()?, vec![0, 2, 4]);
    /// let f = Tensor::arange(1.0, 0.0, -0.25)?;
    /// assert_eq!(f.to_vec::<f32>()?, vec![1.0, 0.75, 0.5, 0.25]);
    /// assert!(Tensor::arange(0, 5, 0).is_err());
    /// assert!(Tensor::arange(0, 5, -1).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn arange(
        start: impl ScalarOperand,
        end: impl ScalarOperand,
        step: impl ScalarOperand,
    ) -> Result<Tensor> {
        let (start, k0) = start.to_operand();
        let (end, k1) = end.to_operand();
        let (step, k2) = step.to_operand();
        if k0.max(k1).max(k2) == ScalarKind::Float {
            arange_f32(start.to_f64(), end.to_f64(), step.to_f64())
        } else {
            arange_i64(start.to_i64(), end.to_i64(), step.to_i64())
        }
    }

    /// `steps` values evenly spaced from `start` to `end`, both included, as `f32`
    /// (`torch.linspace`), with PyTorch's formula: the first half counts up from `start`
    /// and the second half down from `end`, so both ends are exact.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::linspace(0.0, 1.0, 5);
    /// assert_eq!(t.to_vec::<f32>()?, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    /// assert_eq!(Tensor::linspace(3.0, 9.0, 1).to_vec::<f32>()?, vec![3.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn linspace(start: f64, end: f64, steps: usize) -> Tensor {
        let shape = Shape::from([steps]);
        let (start, end) = (start as f32, end as f32);
        if steps <= 1 {
            return Tensor::full(shape, start, DType::F32);
        }
        // In f32, like PyTorch's CPU kernel.
        let step = (end - start) / (steps - 1) as f32;
        let i = Tensor::record_on(Device::default(), Op::Index(0), DType::F32, shape);
        let up = i
            .raw_binary(BinaryOp::Mul, &i.constant(f64::from(step)))
            .raw_binary(BinaryOp::Add, &i.constant(f64::from(start)));
        let from_end = i.constant((steps - 1) as f64).raw_binary(BinaryOp::Sub, &i);
        let down = i.constant(f64::from(end)).raw_binary(
            BinaryOp::Sub,
            &from_end.raw_binary(BinaryOp::Mul, &i.constant(f64::from(step))),
        );
        let first_half = i.raw_binary(BinaryOp::Lt, &i.constant((steps / 2) as f64));
        first_half.raw_where(&up, &down)
    }

    /// The `n x n` identity matrix as `f32` (`torch.eye(n)`).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// assert_eq!(Tensor::eye(2).to_vec::<f32>()?, vec![1.0, 0.0, 0.0, 1.0]);
    /// assert_eq!(Tensor::eye_m(2, 3).to_vec::<f32>()?, vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn eye(n: usize) -> Tensor {
        Tensor::eye_m(n, n)
    }

    /// The `n x m` matrix with ones on the main diagonal, as `f32` (`torch.eye(n, m)`).
    pub fn eye_m(n: usize, m: usize) -> Tensor {
        let shape = Shape::from([n, m]);
        let row = Tensor::record_on(Device::default(), Op::Index(0), DType::I64, shape.clone());
        let col = Tensor::record_on(Device::default(), Op::Index(1), DType::I64, shape);
        row.raw_binary(BinaryOp::Eq, &col).cast_to(DType::F32)
    }
}

fn arange_error(
    start: impl std::fmt::Display,
    end: impl std::fmt::Display,
    step: impl std::fmt::Display,
    why: &str,
) -> Error {
    Error::InvalidArgument {
        op: "arange",
        reason: format!("cannot make a range from {start} to {end} by {step}: {why}"),
    }
}

const WRONG_SIGN: &str = "the step must be positive when end > start and negative when end < start";

fn arange_i64(start: i64, end: i64, step: i64) -> Result<Tensor> {
    if step == 0 {
        return Err(arange_error(start, end, step, "the step must be nonzero"));
    }
    let span = i128::from(end) - i128::from(start);
    if span != 0 && (span > 0) != (step > 0) {
        return Err(arange_error(start, end, step, WRONG_SIGN));
    }
    let step_abs = i128::from(step).abs();
    let len = (span.abs() + step_abs - 1) / step_abs;
    // Dims are i64: a range longer than that is refused here, not wrapped.
    let len = i64::try_from(len)
        .ok()
        .and_then(|len| usize::try_from(len).ok())
        .ok_or_else(|| arange_error(start, end, step, "the range is too long"))?;
    let i = Tensor::record_on(
        Device::default(),
        Op::Index(0),
        DType::I64,
        Shape::from([len]),
    );
    let scaled = if step == 1 {
        i
    } else {
        i.raw_binary(
            BinaryOp::Mul,
            &i.full_like_scalar(Scalar::I64(step), DType::I64),
        )
    };
    Ok(if start == 0 {
        scaled
    } else {
        scaled.raw_binary(
            BinaryOp::Add,
            &scaled.full_like_scalar(Scalar::I64(start), DType::I64),
        )
    })
}

fn arange_f32(start: f64, end: f64, step: f64) -> Result<Tensor> {
    if !(start.is_finite() && end.is_finite() && step.is_finite()) {
        return Err(arange_error(
            start,
            end,
            step,
            "start, end and step must be finite",
        ));
    }
    if step == 0.0 {
        return Err(arange_error(start, end, step, "the step must be nonzero"));
    }
    let span = end - start;
    if span != 0.0 && (span > 0.0) != (step > 0.0) {
        return Err(arange_error(start, end, step, WRONG_SIGN));
    }
    // PyTorch computes the length in f64.
    let len = (span / step).ceil();
    if len >= 9.0e15 {
        return Err(arange_error(start, end, step, "the range is too long"));
    }
    let i = Tensor::record_on(
        Device::default(),
        Op::Index(0),
        DType::F32,
        Shape::from([len as usize]),
    );
    // One rounding: start + i * step, fused.
    let (step, start) = (i.constant(step), i.constant(start));
    Ok(i.record_with(
        &[&step, &start],
        Op::Ternary(TernaryOp::MulAdd, i.node(), step.node(), start.node()),
        DType::F32,
        i.shape().clone(),
    ))
}

/// `Tensor::from([1.0f32, 2.0])`: a 1-d tensor.
impl<T: Element, const N: usize> From<[T; N]> for Tensor {
    fn from(values: [T; N]) -> Tensor {
        Tensor::from_elements(values, Shape::from([N]))
    }
}

/// `Tensor::from([[1, 2], [3, 4]])`: a 2-d tensor, rows first.
impl<T: Element, const N: usize, const M: usize> From<[[T; N]; M]> for Tensor {
    fn from(values: [[T; N]; M]) -> Tensor {
        Tensor::from_elements(values.into_iter().flatten(), Shape::from([M, N]))
    }
}

/// `Tensor::from([[[1, 2]], [[3, 4]]])`: a 3-d tensor in row-major order.
impl<T: Element, const N: usize, const M: usize, const K: usize> From<[[[T; N]; M]; K]> for Tensor {
    fn from(values: [[[T; N]; M]; K]) -> Tensor {
        Tensor::from_elements(
            values.into_iter().flatten().flatten(),
            Shape::from([K, M, N]),
        )
    }
}
