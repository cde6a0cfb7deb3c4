//! `Linear`: `y = x Wᵀ + b`.

use tessel_tensor::{Result, Tensor};

use super::{check_dtype, impl_forward, invalid};
use crate::init::{ParamOptions, fan_in_uniform};
use crate::{Module, Visitor};

/// A fully connected layer (`torch.nn.Linear`): `y = x Wᵀ + b` over the last dim of `x`.
///
/// `weight` is `[out_features, in_features]` and `bias` `[out_features]`, both drawn from
/// `U(-1/sqrt(in_features), 1/sqrt(in_features))` like PyTorch's default, weight first.
///
/// ```
/// # use tessel_nn::Linear;
/// # use tessel_tensor::{DType, Tensor};
/// # fn main() -> tessel_tensor::Result<()> {
/// Tensor::manual_seed(0);
/// let layer = Linear::new(3, 2)?;
/// let y = layer.forward(&Tensor::ones([4, 3], DType::F32))?;
/// assert_eq!(y.dims(), vec![4, 2]);
/// # Ok(())
/// # }
/// ```
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// A layer with a bias, `f32` on the default device.
    pub fn new(in_features: usize, out_features: usize) -> Result<Linear> {
        Linear::with_options(in_features, out_features, true, &ParamOptions::default())
    }

    /// A layer with or without a bias, with parameters of `opts`' dtype and device.
    pub fn with_options(
        in_features: usize,
        out_features: usize,
        bias: bool,
        opts: &ParamOptions,
    ) -> Result<Linear> {
        if in_features == 0 || out_features == 0 {
            return Err(invalid(
                "Linear::new",
                format!(
                    "in_features and out_features must be positive, got {in_features} and {out_features}"
                ),
            ));
        }
        let weight = fan_in_uniform(&[out_features, in_features], in_features, opts)?;
        let bias = if bias {
            Some(fan_in_uniform(&[out_features], in_features, opts)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// A layer holding the given tensors: `weight` `[out, in]`, `bias` `[out]`.
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        const OP: &str = "Linear::from_tensors";
        if weight.ndim() != 2 || !weight.dtype().is_float() {
            return Err(invalid(
                OP,
                format!(
                    "weight must be a 2-d float tensor [out_features, in_features], got {} {}",
                    weight.shape(),
                    weight.dtype()
                ),
            ));
        }
        if let Some(b) = &bias
            && (b.dims() != [weight.dims()[0]] || b.dtype() != weight.dtype())
        {
            return Err(invalid(
                OP,
                format!(
                    "bias must be [{}] {} to match weight {}, got {} {}",
                    weight.dims()[0],
                    weight.dtype(),
                    weight.shape(),
                    b.shape(),
                    b.dtype()
                ),
            ));
        }
        Ok(Linear { weight, bias })
    }

    /// The weight, `[out_features, in_features]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias, `[out_features]`, if the layer has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The size of each input row.
    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }

    /// The size of each output row.
    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }

    /// `x Wᵀ + b` for `x` of shape `[..., in_features]`, giving `[..., out_features]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        const OP: &str = "Linear";
        let fan_in = self.in_features();
        if x.ndim() == 0 || x.dims()[x.ndim() - 1] != fan_in {
            return Err(invalid(
                OP,
                format!(
                    "expected the input's last dim to be in_features = {fan_in}, got shape {}",
                    x.shape()
                ),
            ));
        }
        check_dtype(OP, x, self.weight.dtype())?;
        let y = x.matmul(&self.weight.t()?)?;
        match &self.bias {
            Some(b) => &y + b,
            None => Ok(y),
        }
    }
}

impl Module for Linear {
    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("weight", &self.weight);
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
    }
}

impl_forward!(Linear);
