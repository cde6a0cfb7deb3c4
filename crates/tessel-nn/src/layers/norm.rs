//! `LayerNorm` and `RMSNorm`: normalization over the trailing dims of each sample.

use tessel_tensor::{DType, Result, Tensor};

use super::{check_dtype, impl_forward, invalid};
use crate::init::{ParamOptions, constant};
use crate::{Module, Visitor};

/// Checks that `x` ends with `normalized_shape` and returns the axes to reduce.
fn trailing_axes(op: &'static str, x: &Tensor, normalized_shape: &[usize]) -> Result<Vec<i64>> {
    let k = normalized_shape.len();
    let dims = x.dims();
    if dims.len() < k || dims[dims.len() - k..] != *normalized_shape {
        return Err(invalid(
            op,
            format!(
                "the input {} must end with normalized_shape {normalized_shape:?}",
                x.shape()
            ),
        ));
    }
    Ok((1..=k as i64).rev().map(|i| -i).collect())
}

/// Runs `f` on `x` in `f32` when `x` is `f16`/`bf16` (as PyTorch's kernels accumulate),
/// rounding the result back once.
fn in_opmath(x: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    if matches!(x.dtype(), DType::F16 | DType::BF16) {
        Ok(f(&x.cast(DType::F32))?.cast(x.dtype()))
    } else {
        f(x)
    }
}

fn check_shape(op: &'static str, normalized_shape: &[usize]) -> Result<()> {
    if normalized_shape.is_empty() || normalized_shape.contains(&0) {
        return Err(invalid(
            op,
            format!("normalized_shape must be non-empty and positive, got {normalized_shape:?}"),
        ));
    }
    Ok(())
}

/// Layer normalization (`torch.nn.LayerNorm`): each sample is normalized to mean 0 and
/// variance 1 over its trailing `normalized_shape` dims (biased variance, `eps` inside the
/// square root), then scaled by `weight` and shifted by `bias` (ones and zeros at first).
///
/// ```
/// # use tessel_nn::LayerNorm;
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let ln = LayerNorm::new(&[2])?;
/// let y = ln.forward(&Tensor::from([[1.0f32, 3.0]]))?.to_vec::<f32>()?;
/// assert!((y[0] + 1.0).abs() < 1e-4 && (y[1] - 1.0).abs() < 1e-4);
/// # Ok(())
/// # }
/// ```
pub struct LayerNorm {
    normalized_shape: Vec<usize>,
    eps: f64,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
}

impl LayerNorm {
    /// PyTorch's defaults: `eps = 1e-5`, learned weight and bias, `f32` on the default
    /// device.
    pub fn new(normalized_shape: &[usize]) -> Result<LayerNorm> {
        LayerNorm::with_options(normalized_shape, 1e-5, true, true, &ParamOptions::default())
    }

    /// A layer with the given `eps`; `elementwise_affine` adds a weight, and `bias` (only
    /// with it) a bias, of `opts`' dtype and device.
    pub fn with_options(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
        bias: bool,
        opts: &ParamOptions,
    ) -> Result<LayerNorm> {
        check_shape("LayerNorm::new", normalized_shape)?;
        let (weight, bias) = if elementwise_affine {
            let w = constant(normalized_shape, 1.0, opts)?;
            let b = if bias {
                Some(constant(normalized_shape, 0.0, opts)?)
            } else {
                None
            };
            (Some(w), b)
        } else {
            (None, None)
        };
        Ok(LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            eps,
            weight,
            bias,
        })
    }

    /// A layer holding the given tensors (a checkpoint's), normalizing over their shape:
    /// `weight` and `bias` are `normalized_shape`, either may be absent.
    pub fn from_tensors(
        weight: Option<Tensor>,
        bias: Option<Tensor>,
        eps: f64,
    ) -> Result<LayerNorm> {
        const OP: &str = "LayerNorm::from_tensors";
        let Some(shape) = weight.as_ref().or(bias.as_ref()).map(Tensor::dims) else {
            return Err(invalid(
                OP,
                "give a weight or a bias; for a layer without either, use LayerNorm::with_options",
            ));
        };
        for t in weight.iter().chain(&bias) {
            if t.dims() != shape || !t.dtype().is_float() {
                return Err(invalid(
                    OP,
                    format!(
                        "weight and bias must be float tensors of one shape, got {} {} beside {shape:?}",
                        t.shape(),
                        t.dtype()
                    ),
                ));
            }
        }
        check_shape(OP, &shape)?;
        Ok(LayerNorm {
            normalized_shape: shape,
            eps,
            weight,
            bias,
        })
    }

    /// The learned scale, if any.
    pub fn weight(&self) -> Option<&Tensor> {
        self.weight.as_ref()
    }

    /// The learned shift, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// `x` normalized over its trailing `normalized_shape` dims.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        layer_norm_op(
            "LayerNorm",
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }
}

impl Module for LayerNorm {
    fn visit(&self, v: &mut Visitor<'_>) {
        if let Some(w) = &self.weight {
            v.param("weight", w);
        }
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
    }
}

/// Root-mean-square normalization (`torch.nn.RMSNorm`):
/// `x / sqrt(mean(x²) + eps) * weight` over the trailing `normalized_shape` dims. With
/// `eps = None` it uses the input dtype's machine epsilon, as PyTorch does.
///
/// ```
/// # use tessel_nn::RMSNorm;
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let norm = RMSNorm::new(&[2])?;
/// let y = norm.forward(&Tensor::from([[3.0f32, 4.0]]))?.to_vec::<f32>()?;
/// let rms = (12.5f32).sqrt();
/// assert!((y[0] - 3.0 / rms).abs() < 1e-5);
/// # Ok(())
/// # }
/// ```
pub struct RMSNorm {
    normalized_shape: Vec<usize>,
    eps: Option<f64>,
    weight: Option<Tensor>,
}

impl RMSNorm {
    /// PyTorch's defaults: machine-epsilon `eps` and a learned weight (ones), `f32` on the
    /// default device.
    pub fn new(normalized_shape: &[usize]) -> Result<RMSNorm> {
        RMSNorm::with_options(normalized_shape, None, true, &ParamOptions::default())
    }

    /// A layer with the given `eps` (`None`: the input dtype's epsilon) and, with
    /// `elementwise_affine`, a weight of `opts`' dtype and device.
    pub fn with_options(
        normalized_shape: &[usize],
        eps: Option<f64>,
        elementwise_affine: bool,
        opts: &ParamOptions,
    ) -> Result<RMSNorm> {
        check_shape("RMSNorm::new", normalized_shape)?;
        let weight = if elementwise_affine {
            Some(constant(normalized_shape, 1.0, opts)?)
        } else {
            None
        };
        Ok(RMSNorm {
            normalized_shape: normalized_shape.to_vec(),
            eps,
            weight,
        })
    }

    /// A layer holding `weight` (a checkpoint's), normalizing over its shape.
    pub fn from_tensors(weight: Tensor, eps: Option<f64>) -> Result<RMSNorm> {
        const OP: &str = "RMSNorm::from_tensors";
        if !weight.dtype().is_float() {
            return Err(invalid(
                OP,
                format!(
                    "weight must be a float tensor, got {} {}",
                    weight.shape(),
                    weight.dtype()
                ),
            ));
        }
        check_shape(OP, &weight.dims())?;
        Ok(RMSNorm {
            normalized_shape: weight.dims(),
            eps,
            weight: Some(weight),
        })
    }

    /// The learned scale, if any.
    pub fn weight(&self) -> Option<&Tensor> {
        self.weight.as_ref()
    }

    /// `x` divided by its root mean square over the trailing `normalized_shape` dims.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        rms_norm_op(
            "RMSNorm",
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.eps,
        )
    }
}

impl Module for RMSNorm {
    fn visit(&self, v: &mut Visitor<'_>) {
        if let Some(w) = &self.weight {
            v.param("weight", w);
        }
    }
}

impl_forward!(LayerNorm, RMSNorm);

/// Layer normalization as a function (`torch.nn.functional.layer_norm`): `x` normalized
/// over its trailing `normalized_shape` dims (biased variance, `eps` inside the root), then
/// scaled by `weight` and shifted by `bias` where given (each `normalized_shape`).
/// Half-precision inputs are normalized in f32 and rounded once, as PyTorch's kernel does.
///
/// ```
/// # use tessel_nn::layer_norm;
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let y = layer_norm(&Tensor::from([[1.0f32, 3.0]]), &[2], None, None, 1e-5)?.to_vec::<f32>()?;
/// assert!((y[0] + 1.0).abs() < 1e-4 && (y[1] - 1.0).abs() < 1e-4);
/// # Ok(())
/// # }
/// ```
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "layer_norm";
    check_shape(OP, normalized_shape)?;
    for t in weight.iter().chain(&bias) {
        if t.dims() != normalized_shape {
            return Err(invalid(
                OP,
                format!(
                    "weight and bias must be {normalized_shape:?}, got {}",
                    t.shape()
                ),
            ));
        }
    }
    layer_norm_op(OP, x, normalized_shape, weight, bias, eps)
}

fn layer_norm_op(
    op: &'static str,
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    // Under `autocast`, half-precision inputs are normalized in f32.
    let x = &tessel_tensor::full_precision_operand(x);
    let axes = trailing_axes(op, x, normalized_shape)?;
    if let Some(w) = weight.or(bias) {
        check_dtype(op, x, w.dtype())?;
    } else if !x.dtype().is_float() {
        return Err(invalid(
            op,
            format!("the input must be a float tensor, got {}", x.dtype()),
        ));
    }
    let y = in_opmath(x, |x| {
        let centered = (x - &x.mean(&axes, true)?)?;
        let var = (&centered * &centered)?.mean(&axes, true)?;
        &centered * &(&var + eps)?.rsqrt()
    })?;
    let y = match weight {
        Some(w) => (&y * w)?,
        None => y,
    };
    match bias {
        Some(b) => &y + b,
        None => Ok(y),
    }
}

/// Root-mean-square normalization as a function (`torch.nn.functional.rms_norm`):
/// `x / sqrt(mean(x²) + eps) * weight` over the trailing `normalized_shape` dims; `eps`
/// `None` is the input dtype's machine epsilon, as in PyTorch.
///
/// ```
/// # use tessel_nn::rms_norm;
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let y = rms_norm(&Tensor::from([[3.0f32, 4.0]]), &[2], None, Some(0.0))?.to_vec::<f32>()?;
/// assert!((y[0] - 3.0 / 12.5f32.sqrt()).abs() < 1e-6);
/// # Ok(())
/// # }
/// ```
pub fn rms_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    eps: Option<f64>,
) -> Result<Tensor> {
    const OP: &str = "rms_norm";
    check_shape(OP, normalized_shape)?;
    if let Some(w) = weight
        && w.dims() != normalized_shape
    {
        return Err(invalid(
            OP,
            format!("weight must be {normalized_shape:?}, got {}", w.shape()),
        ));
    }
    rms_norm_op(OP, x, normalized_shape, weight, eps)
}

fn rms_norm_op(
    op: &'static str,
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    eps: Option<f64>,
) -> Result<Tensor> {
    let x = &tessel_tensor::full_precision_operand(x);
    let axes = trailing_axes(op, x, normalized_shape)?;
    if let Some(w) = weight {
        check_dtype(op, x, w.dtype())?;
    }
    let eps = match (eps, x.dtype()) {
        (Some(eps), _) => eps,
        (None, DType::F64) => f64::EPSILON,
        (None, DType::F32) => f64::from(f32::EPSILON),
        (None, DType::F16) => 0.0009765625,
        (None, DType::BF16) => 0.0078125,
        (None, other) => {
            return Err(invalid(
                op,
                format!("the input must be a float tensor, got {other}"),
            ));
        }
    };
    let y = in_opmath(x, |x| {
        let ms = (x * x)?.mean(&axes, true)?;
        x * &(&ms + eps)?.rsqrt()
    })?;
    match weight {
        Some(w) => &y * w,
        None => Ok(y),
    }
}
