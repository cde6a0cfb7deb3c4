//! `BatchNorm1d` and `BatchNorm2d`: normalization over the batch, with running
//! statistics for evaluation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tessel_tensor::{DType, Result, Tensor};

use super::{check_dtype, check_rank, dims_i64, impl_forward, invalid};
use crate::init::{ParamOptions, constant};
use crate::{Module, Visitor};

/// Options of a batch normalization layer; `Default` is PyTorch's: `eps = 1e-5`,
/// `momentum = Some(0.1)`, learned affine parameters, running statistics tracked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormOptions {
    /// Added to the variance inside the square root.
    pub eps: f64,
    /// Weight of the newest batch in the running statistics; `None` gives the cumulative
    /// average of all batches so far (factor `1 / num_batches_tracked`), as in PyTorch.
    pub momentum: Option<f64>,
    /// Learn a per-channel `weight` (ones) and `bias` (zeros).
    pub affine: bool,
    /// Keep `running_mean`, `running_var` and `num_batches_tracked` and use them in
    /// evaluation mode; without them batch statistics are used in both modes.
    pub track_running_stats: bool,
}

impl Default for BatchNormOptions {
    fn default() -> Self {
        BatchNormOptions {
            eps: 1e-5,
            momentum: Some(0.1),
            affine: true,
            track_running_stats: true,
        }
    }
}

/// What both batch-norm layers share; they differ only in the input ranks they take.
struct BatchNorm {
    op: &'static str,
    ranks: &'static [usize],
    input: &'static str,
    opts: BatchNormOptions,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    /// `running_mean`, `running_var`, `num_batches_tracked`.
    stats: Option<(Tensor, Tensor, Tensor)>,
    training: AtomicBool,
    /// Whether the statistics' lazy update is listed for the next optimizer step.
    listed: Arc<AtomicBool>,
}

impl BatchNorm {
    fn new(
        op: &'static str,
        ranks: &'static [usize],
        input: &'static str,
        num_features: usize,
        opts: BatchNormOptions,
        params: &ParamOptions,
    ) -> Result<BatchNorm> {
        if num_features == 0 {
            return Err(invalid(op, "num_features must be positive"));
        }
        if let Some(m) = opts.momentum
            && !(0.0..=1.0).contains(&m)
        {
            return Err(invalid(op, format!("momentum must be in [0, 1], got {m}")));
        }
        if opts.eps.is_nan() || opts.eps < 0.0 {
            return Err(invalid(op, format!("eps must be >= 0, got {}", opts.eps)));
        }
        let c = [num_features];
        let (weight, bias) = if opts.affine {
            (
                Some(constant(&c, 1.0, params)?),
                Some(constant(&c, 0.0, params)?),
            )
        } else {
            (None, None)
        };
        let stats = if opts.track_running_stats {
            let count = Tensor::scalar(0i64).to(&params.device)?;
            Some((
                constant(&c, 0.0, params)?,
                constant(&c, 1.0, params)?,
                count,
            ))
        } else {
            None
        };
        Ok(BatchNorm {
            op,
            ranks,
            input,
            opts,
            weight,
            bias,
            stats,
            training: AtomicBool::new(true),
            listed: Arc::new(AtomicBool::new(false)),
        })
    }

    fn forward(&self, x: &Tensor, num_features: usize) -> Result<Tensor> {
        let op = self.op;
        check_rank(op, x, self.ranks, self.input)?;
        let dims = x.dims();
        if dims[1] != num_features {
            return Err(invalid(
                op,
                format!(
                    "the layer has {num_features} channels (dim 1), got input {}",
                    x.shape()
                ),
            ));
        }
        match (&self.weight, &self.stats) {
            (Some(w), _) => check_dtype(op, x, w.dtype())?,
            (None, Some((mean, _, _))) => check_dtype(op, x, mean.dtype())?,
            (None, None) if !x.dtype().is_float() => {
                return Err(invalid(
                    op,
                    format!("the input must be a float tensor, got {}", x.dtype()),
                ));
            }
            (None, None) => {}
        }
        let running = self.stats.as_ref().map(|(mean, var, count)| Running {
            mean,
            var,
            count: Some(count),
            momentum: self.opts.momentum,
            listed: &self.listed,
        });
        let training = self.training.load(Ordering::Relaxed);
        normalize(
            op,
            x,
            running.as_ref(),
            self.weight.as_ref(),
            self.bias.as_ref(),
            training,
            self.opts.eps,
        )
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        if let Some(w) = &self.weight {
            v.param("weight", w);
        }
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
        if let Some((mean, var, count)) = &self.stats {
            v.buffer("running_mean", mean);
            v.buffer("running_var", var);
            v.buffer("num_batches_tracked", count);
        }
    }
}

macro_rules! batch_norm_layer {
    ($(#[$doc:meta])* $name:ident, $ranks:expr, $input:literal) => {
        $(#[$doc])*
        pub struct $name {
            num_features: usize,
            inner: BatchNorm,
        }

        impl $name {
            /// A layer over `num_features` channels with PyTorch's defaults, `f32` on the
            /// default device, in training mode.
            pub fn new(num_features: usize) -> Result<$name> {
                $name::with_options(num_features, BatchNormOptions::default(), &ParamOptions::default())
            }

            /// A layer with the given options, parameters and buffers of `params`' dtype
            /// and device.
            pub fn with_options(
                num_features: usize,
                opts: BatchNormOptions,
                params: &ParamOptions,
            ) -> Result<$name> {
                let inner = BatchNorm::new(
                    stringify!($name),
                    $ranks,
                    $input,
                    num_features,
                    opts,
                    params,
                )?;
                Ok($name { num_features, inner })
            }

            /// The learned per-channel scale, if affine.
            pub fn weight(&self) -> Option<&Tensor> {
                self.inner.weight.as_ref()
            }

            /// The learned per-channel shift, if affine.
            pub fn bias(&self) -> Option<&Tensor> {
                self.inner.bias.as_ref()
            }

            /// The running mean, if tracked.
            pub fn running_mean(&self) -> Option<&Tensor> {
                self.inner.stats.as_ref().map(|s| &s.0)
            }

            /// The running (unbiased) variance, if tracked.
            pub fn running_var(&self) -> Option<&Tensor> {
                self.inner.stats.as_ref().map(|s| &s.1)
            }

            /// How many training batches went into the running statistics (0-d `i64`), if
            /// tracked.
            pub fn num_batches_tracked(&self) -> Option<&Tensor> {
                self.inner.stats.as_ref().map(|s| &s.2)
            }

            /// Whether the layer is in training mode.
            pub fn is_training(&self) -> bool {
                self.inner.training.load(Ordering::Relaxed)
            }

            #[doc = concat!("`x` (", $input, ") normalized per channel; see the type's documentation.")]
            pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
                self.inner.forward(x, self.num_features)
            }
        }

        impl Module for $name {
            fn visit(&self, v: &mut Visitor<'_>) {
                self.inner.visit(v);
            }

            fn set_training_local(&self, training: bool) {
                self.inner.training.store(training, Ordering::Relaxed);
            }
        }

        impl_forward!($name);
    };
}

batch_norm_layer!(
    /// Batch normalization over `[N, C]` or `[N, C, L]` (`torch.nn.BatchNorm1d`).
    ///
    /// In training mode each channel is normalized by the batch's mean and biased
    /// variance, and the running statistics are updated with
    /// `running = (1 - momentum) * running + momentum * batch` (the variance unbiased,
    /// `n / (n - 1)`), written with [`Tensor::assign`]; in evaluation mode
    /// ([`Module::eval`]) the running statistics are used. Then `weight` and `bias` apply.
    ///
    /// The update is lazy like every op: the running statistics stay an expression until
    /// something realizes them. A training loop should realize them with its step
    /// ([`Module::buffers`] in the step's [`Tensor::realize_all`]), or each step's update
    /// chains onto the last, keeping every earlier batch alive.
    ///
    /// ```
    /// # use tessel_nn::{BatchNorm1d, Module};
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let bn = BatchNorm1d::new(2)?;
    /// let x = Tensor::from([[1.0f32, 10.0], [3.0, 30.0]]);
    /// let y = bn.forward(&x)?.to_vec::<f32>()?;
    /// assert!((y[0] + 1.0).abs() < 1e-3 && (y[3] - 1.0).abs() < 1e-3);
    /// // 0.9 * 0 + 0.1 * [2, 20]
    /// let mean = bn.running_mean().unwrap().to_vec::<f32>()?;
    /// assert!((mean[0] - 0.2).abs() < 1e-6 && (mean[1] - 2.0).abs() < 1e-6);
    /// bn.eval();
    /// assert_eq!(bn.forward(&x)?.dims(), vec![2, 2]);
    /// # Ok(())
    /// # }
    /// ```
    BatchNorm1d,
    &[2, 3],
    "[N, C] or [N, C, L]"
);

batch_norm_layer!(
    /// Batch normalization over `[N, C, H, W]` (`torch.nn.BatchNorm2d`); statistics are
    /// per channel over the batch and both spatial dims. See [`BatchNorm1d`] for the
    /// training and evaluation behaviour.
    BatchNorm2d,
    &[4],
    "[N, C, H, W]"
);

/// Running statistics a batch norm reads in evaluation and updates in training.
struct Running<'a> {
    mean: &'a Tensor,
    var: &'a Tensor,
    /// `num_batches_tracked`, when kept (the layers; not the functional form).
    count: Option<&'a Tensor>,
    /// `None`: a cumulative average (needs `count`).
    momentum: Option<f64>,
    /// Whether the update is listed for the next optimizer step.
    listed: &'a Arc<AtomicBool>,
}

/// `x` (`[N, C, ...]`) normalized per channel: by `running` in evaluation, by the batch's
/// statistics in training (folding them into `running`, unbiased, as PyTorch stores them),
/// then scaled and shifted.
fn normalize(
    op: &'static str,
    x: &Tensor,
    running: Option<&Running<'_>>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    eps: f64,
) -> Result<Tensor> {
    let dims = x.dims();
    // Per-channel tensors broadcast as [1, C, 1, ...].
    let mut channel_shape = vec![1; dims.len()];
    channel_shape[1] = dims[1];
    let channel_shape = dims_i64(&channel_shape);
    let per_channel = |t: &Tensor| t.reshape(&channel_shape);
    let y = match running {
        Some(r) if !training => {
            let centered = (x - &per_channel(r.mean)?)?;
            (&centered * &(&per_channel(r.var)? + eps)?.rsqrt())?
        }
        _ => batch_statistics(op, x, running, eps)?,
    };
    let y = match weight {
        Some(w) => (&y * &per_channel(w)?)?,
        None => y,
    };
    match bias {
        Some(b) => &y + &per_channel(b)?,
        None => Ok(y),
    }
}

/// Normalizes by the batch's own statistics and folds them into `running`, if given.
fn batch_statistics(
    op: &'static str,
    x: &Tensor,
    running: Option<&Running<'_>>,
    eps: f64,
) -> Result<Tensor> {
    let dims = x.dims();
    let axes: Vec<i64> = (0..dims.len() as i64).filter(|&a| a != 1).collect();
    let n: usize = dims.iter().product::<usize>() / dims[1].max(1);
    if n <= 1 {
        return Err(invalid(
            op,
            format!(
                "expected more than 1 value per channel when training, got input {}; use a larger batch or eval()",
                x.shape()
            ),
        ));
    }
    let opmath = if matches!(x.dtype(), DType::F16 | DType::BF16) {
        DType::F32
    } else {
        x.dtype()
    };
    let xf = x.cast(opmath);
    let mean = xf.mean(&axes, true)?;
    let centered = (&xf - &mean)?;
    let var = (&centered * &centered)?.mean(&axes, true)?;
    let y = (&centered * &(&var + eps)?.rsqrt())?.cast(x.dtype());

    if let Some(r) = running {
        let dtype = r.mean.dtype();
        let c = dims_i64(&[dims[1]]);
        let batch_mean = mean.reshape(&c)?.cast(dtype);
        let batch_var = (&var.reshape(&c)? * (n as f64 / (n - 1) as f64))?.cast(dtype);
        let new_count = r.count.map(|count| count + 1).transpose()?;
        let (new_mean, new_var) = match (r.momentum, &new_count) {
            (Some(m), _) => (
                (&(r.mean * (1.0 - m))? + &(&batch_mean * m)?)?,
                (&(r.var * (1.0 - m))? + &(&batch_var * m)?)?,
            ),
            // Cumulative average: factor 1 / count after this batch.
            (None, Some(count)) => {
                let f = count.cast(dtype).reciprocal();
                let keep = (1.0 - &f)?;
                (
                    (&(r.mean * &keep)? + &(&batch_mean * &f)?)?,
                    (&(r.var * &keep)? + &(&batch_var * &f)?)?,
                )
            }
            (None, None) => {
                return Err(invalid(
                    op,
                    "a cumulative average (momentum None) needs a batch count",
                ));
            }
        };
        r.mean.assign(&new_mean)?;
        r.var.assign(&new_var)?;
        let mut updated = vec![r.mean, r.var];
        if let (Some(count), Some(new_count)) = (r.count, &new_count) {
            count.assign(new_count)?;
            updated.push(count);
        }
        crate::pending::register(&updated, r.listed);
    }
    Ok(y)
}

/// Batch normalization as a function (`torch.nn.functional.batch_norm`): `x` (`[N, C, ...]`)
/// normalized per channel by `running_mean`/`running_var` (`[C]`) in evaluation, or by the
/// batch's statistics in training, which then also update the running statistics in place
/// with `momentum` (the next optimizer step realizes them); then scaled by `weight` and
/// shifted by `bias` (`[C]`) where given.
///
/// ```
/// # use tessel_nn::batch_norm;
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let x = Tensor::from([[1.0f32, 2.0], [3.0, 6.0]]);
/// let (mean, var) = (Tensor::from([2.0f32, 4.0]), Tensor::from([1.0f32, 4.0]));
/// let y = batch_norm(&x, Some(&mean), Some(&var), None, None, false, 0.1, 0.0)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![-1.0, -1.0, 1.0, 1.0]);
/// # Ok(())
/// # }
/// ```
#[allow(clippy::too_many_arguments)] // PyTorch's signature.
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    const OP: &str = "batch_norm";
    if x.ndim() < 2 || !x.dtype().is_float() {
        return Err(invalid(
            OP,
            format!(
                "the input must be a float tensor [N, C, ...], got {} {}",
                x.shape(),
                x.dtype()
            ),
        ));
    }
    let c = x.dims()[1];
    for (what, t) in [
        ("running_mean", running_mean),
        ("running_var", running_var),
        ("weight", weight),
        ("bias", bias),
    ] {
        if let Some(t) = t
            && (t.dims() != [c] || !t.dtype().is_float())
        {
            return Err(invalid(
                OP,
                format!(
                    "{what} must be a float tensor [{c}] for input {}, got {} {}",
                    x.shape(),
                    t.shape(),
                    t.dtype()
                ),
            ));
        }
    }
    let listed = Arc::new(AtomicBool::new(false));
    let running = match (running_mean, running_var) {
        (Some(mean), Some(var)) => Some(Running {
            mean,
            var,
            count: None,
            momentum: Some(momentum),
            listed: &listed,
        }),
        (None, None) if training => None,
        _ => {
            return Err(invalid(
                OP,
                "give both running_mean and running_var (evaluation needs them; training updates them)",
            ));
        }
    };
    normalize(OP, x, running.as_ref(), weight, bias, training, eps)
}
