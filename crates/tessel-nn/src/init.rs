//! Parameter initialization: where a layer's tensors start, as in `torch.nn.init`.
//!
//! Values are drawn in `f64` from the process-wide generator behind [`Tensor::rand`] and
//! [`Tensor::randn`], so [`Tensor::manual_seed`] makes every layer reproducible, then
//! rounded once to the parameter's dtype. Every initializer returns a realized buffer of
//! its own, never a lazy constant: constants merge by value in the graph, and two
//! parameters must never share a node.

use tessel_tensor::{DType, Device, Error, Result, Tensor, bf16, f16};

/// Where a layer's parameters live: their dtype and device (`dtype=`, `device=` of
/// PyTorch's layer constructors). `Default` is `f32` on [`Device::default`], the device
/// every other tensor is created on (the CPU unless `TESSEL_DEVICE` says otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamOptions {
    /// Float dtype of the parameters.
    pub dtype: DType,
    /// Device of the parameters.
    pub device: Device,
}

impl Default for ParamOptions {
    fn default() -> Self {
        ParamOptions {
            dtype: DType::F32,
            device: Device::default(),
        }
    }
}

impl ParamOptions {
    /// Parameters of `dtype` on `device`.
    pub fn new(dtype: DType, device: Device) -> Self {
        ParamOptions { dtype, device }
    }

    /// Parameters of `dtype` on the default device.
    pub fn dtype(dtype: DType) -> Self {
        ParamOptions {
            dtype,
            ..ParamOptions::default()
        }
    }
}

/// Builds a tensor of `opts`' dtype and device from `f64` values.
pub(crate) fn from_f64(
    op: &'static str,
    values: &[f64],
    shape: &[usize],
    opts: &ParamOptions,
) -> Result<Tensor> {
    let t = match opts.dtype {
        DType::F64 => Tensor::from_slice(values, shape)?,
        DType::F32 => {
            let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
            Tensor::from_vec(v, shape)?
        }
        DType::F16 => {
            let v: Vec<f16> = values.iter().map(|&x| f16::from_f64(x)).collect();
            Tensor::from_vec(v, shape)?
        }
        DType::BF16 => {
            let v: Vec<bf16> = values.iter().map(|&x| bf16::from_f64(x)).collect();
            Tensor::from_vec(v, shape)?
        }
        other => {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "parameters must have a float dtype (f16, bf16, f32, f64), got {other}"
                ),
            });
        }
    };
    t.to(&opts.device)
}

/// Values drawn uniformly from `[low, high)` (`torch.nn.init.uniform_`).
pub fn uniform(shape: &[usize], low: f64, high: f64, opts: &ParamOptions) -> Result<Tensor> {
    if !(low.is_finite() && high.is_finite() && low <= high) {
        return Err(Error::InvalidArgument {
            op: "init::uniform",
            reason: format!("the bounds must be finite with low <= high, got [{low}, {high})"),
        });
    }
    let u = Tensor::rand(shape, DType::F64)?.to_vec::<f64>()?;
    let v: Vec<f64> = u.iter().map(|&u| low + (high - low) * u).collect();
    from_f64("init::uniform", &v, shape, opts)
}

/// Values drawn from `N(mean, std²)` (`torch.nn.init.normal_`).
pub fn normal(shape: &[usize], mean: f64, std: f64, opts: &ParamOptions) -> Result<Tensor> {
    if !(mean.is_finite() && std.is_finite() && std >= 0.0) {
        return Err(Error::InvalidArgument {
            op: "init::normal",
            reason: format!("mean must be finite and std finite and >= 0, got {mean}, {std}"),
        });
    }
    let z = Tensor::randn(shape, DType::F64)?.to_vec::<f64>()?;
    let v: Vec<f64> = z.iter().map(|&z| mean + std * z).collect();
    from_f64("init::normal", &v, shape, opts)
}

/// A buffer filled with `value` (`torch.nn.init.constant_`).
pub fn constant(shape: &[usize], value: f64, opts: &ParamOptions) -> Result<Tensor> {
    let v = vec![value; shape.iter().product()];
    from_f64("init::constant", &v, shape, opts)
}

/// PyTorch's default init of `Linear` and convolution weights and biases:
/// `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`, which is what `kaiming_uniform_(a=sqrt(5))`
/// works out to. `fan_in` is the number of inputs each output sums over.
pub fn fan_in_uniform(shape: &[usize], fan_in: usize, opts: &ParamOptions) -> Result<Tensor> {
    if fan_in == 0 {
        return Err(Error::InvalidArgument {
            op: "init::fan_in_uniform",
            reason: format!("fan_in must be positive to scale {shape:?}"),
        });
    }
    let bound = 1.0 / (fan_in as f64).sqrt();
    uniform(shape, -bound, bound, opts)
}

/// Glorot uniform init (`torch.nn.init.xavier_uniform_`): `U(-a, a)` with
/// `a = gain * sqrt(6 / (fan_in + fan_out))`.
pub fn xavier_uniform(
    shape: &[usize],
    fan_in: usize,
    fan_out: usize,
    gain: f64,
    opts: &ParamOptions,
) -> Result<Tensor> {
    if fan_in + fan_out == 0 {
        return Err(Error::InvalidArgument {
            op: "init::xavier_uniform",
            reason: format!("fan_in + fan_out must be positive for {shape:?}"),
        });
    }
    let bound = gain * (6.0 / (fan_in + fan_out) as f64).sqrt();
    uniform(shape, -bound, bound, opts)
}
