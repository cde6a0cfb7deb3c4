//! Tensors from nothing: constants, ranges, identity matrices, random values, and Rust
//! arrays.
//!
//! Constants, ranges and `eye` are graph nodes (`Const`, `Index`), so they hold no host
//! data and fuse into whatever consumes them. Random tensors are drawn on the host from one
//! process-wide generator (see [`Tensor::manual_seed`]).

use std::sync::{Mutex, PoisonError};

use tessel_graph::Op;
use tessel_shape::{BinaryOp, DType, Scalar, ScalarKind, Shape, TernaryOp};

use super::ScalarOperand;
use crate::element::Element;
use crate::tensor::Tensor;
use tessel_runtime::Device;
use tessel_runtime::{Error, Result};

/// PyTorch's default CPU generator seed, so an unseeded process is reproducible too.
const DEFAULT_SEED: u64 = 67_280_421_310_721;

/// The process-wide generator behind [`Tensor::rand`] and [`Tensor::randn`].
static GENERATOR: Mutex<SplitMix64> = Mutex::new(SplitMix64::new(DEFAULT_SEED));

/// `SplitMix64` (Steele, Lea and Flood, 2014): a counter-based generator whose output is a
/// bijective mix of a Weyl sequence, so every seed gives a full-period stream.
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform `f64` in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A uniform value in `[0, 1)` of a float dtype, from `digits` random significand bits so
/// it is exact in the dtype and never rounds up to 1.
fn uniform(rng: &mut SplitMix64, dtype: DType) -> Scalar {
    let digits = match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        DType::F32 => 24,
        _ => 53,
    };
    let x = (rng.next_u64() >> (64 - digits)) as f64 / (1u64 << digits) as f64;
    Scalar::F64(x).cast(dtype)
}

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

    /// Sets the seed of the process-wide generator behind [`Tensor::rand`] and
    /// [`Tensor::randn`] (`torch.manual_seed`).
    ///
    /// A seed fixes the sequence of values the process draws from then on: the same seed
    /// followed by the same calls, in the same order, gives the same tensors. Threads share
    /// the generator, so concurrent draws interleave in whatever order they run. A process
    /// that never seeds starts from PyTorch's default seed, so it is reproducible too (but
    /// its values differ from PyTorch's, whose generator is another).
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// Tensor::manual_seed(42);
    /// let a = Tensor::rand([3], DType::F32)?.to_vec::<f32>()?;
    /// Tensor::manual_seed(42);
    /// let b = Tensor::rand([3], DType::F32)?.to_vec::<f32>()?;
    /// assert_eq!(a, b);
    /// # Ok(())
    /// # }
    /// ```
    pub fn manual_seed(seed: u64) {
        *GENERATOR.lock().unwrap_or_else(PoisonError::into_inner) = SplitMix64::new(seed);
    }

    /// Values drawn uniformly from `[0, 1)` (`torch.rand`), for a float `dtype`. Every
    /// value is a multiple of `2^-p` for the dtype's significand width `p`, so none rounds
    /// up to 1.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let u = Tensor::rand([2, 3], DType::F32)?.to_vec::<f32>()?;
    /// assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    /// assert!(Tensor::rand([2], DType::I32).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn rand(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        random(shape.into(), dtype, "rand", |rng, n, push| {
            for _ in 0..n {
                push(uniform(rng, dtype));
            }
        })
    }

    /// Values drawn from the standard normal distribution (`torch.randn`), for a float
    /// `dtype`, by the Box-Muller transform in `f64`, rounded once to `dtype`.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let z = Tensor::randn([1000], DType::F64)?.to_vec::<f64>()?;
    /// let mean = z.iter().sum::<f64>() / 1000.0;
    /// assert!(mean.abs() < 0.2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn randn(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        random(shape.into(), dtype, "randn", |rng, n, push| {
            for k in (0..n).step_by(2) {
                // u1 in (0, 1], so the log is finite.
                let u1 = 1.0 - rng.next_f64();
                let u2 = rng.next_f64();
                let r = (-2.0 * u1.ln()).sqrt();
                let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
                push(Scalar::F64(r * cos).cast(dtype));
                if k + 1 < n {
                    push(Scalar::F64(r * sin).cast(dtype));
                }
            }
        })
    }
}

/// A host tensor of `shape` whose `numel` values `draw(generator, numel, push)` pushes.
fn random(
    shape: Shape,
    dtype: DType,
    op: &'static str,
    draw: impl FnOnce(&mut SplitMix64, usize, &mut dyn FnMut(Scalar)),
) -> Result<Tensor> {
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            hint: "random values are drawn as floats; use a float dtype (f16, bf16, f32, f64) and .cast() the result",
        });
    }
    let Some(dims) = shape.as_usizes() else {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("random tensors need a concrete shape, got {shape}"),
        });
    };
    let size = dtype.size_bytes();
    let Some((numel, total)) = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .and_then(|n| Some((n, n.checked_mul(size)?)))
    else {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "shape {shape} holds more elements of {dtype} than the host can address"
            ),
        });
    };
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(total)
        .map_err(|_| tessel_runtime::out_of_host_memory(total))?;
    let mut push = |s: Scalar| bytes.extend_from_slice(&s.to_bits().to_le_bytes()[..size]);
    draw(
        &mut GENERATOR.lock().unwrap_or_else(PoisonError::into_inner),
        numel,
        &mut push,
    );
    Ok(Tensor::from_bytes(bytes, dtype, shape))
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
