//! Loss functions (`torch.nn.functional`'s, with the same names, formulas and defaults).
//! Under [`tessel_tensor::autocast`] they compute half-precision operands in `f32`, as
//! PyTorch's autocast does.
//!
//! Every loss is built from Tensor ops only — nothing is read back — so it stays lazy,
//! fuses with the model, and is differentiable. Shapes and dtypes are checked when the
//! call is made; values (such as a class index out of range) cannot be, since they are
//! not computed yet: an out-of-range class index reads a log-probability of 0 instead of
//! raising as PyTorch does.

use tessel_tensor::{DType, Error, Result, Tensor};

use crate::layers::dims_i64;

/// How a loss's per-element values become the result (`reduction=` in PyTorch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The per-element losses, unreduced (`"none"`).
    None,
    /// Their mean (`"mean"`, the default); weighted losses divide by the total weight.
    #[default]
    Mean,
    /// Their sum (`"sum"`).
    Sum,
}

fn invalid(op: &'static str, reason: String) -> Error {
    Error::InvalidArgument { op, reason }
}

fn reduce(loss: &Tensor, reduction: Reduction) -> Result<Tensor> {
    match reduction {
        Reduction::None => Ok(loss.clone()),
        Reduction::Mean => loss.mean_all(),
        Reduction::Sum => loss.sum_all(),
    }
}

fn check_float(op: &'static str, what: &str, t: &Tensor) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(invalid(
            op,
            format!(
                "{what} must be a float tensor, got {} {}; cast it with .cast(DType::F32)",
                t.shape(),
                t.dtype()
            ),
        ))
    }
}

/// Checks that `input` is float and `target` has its shape and dtype.
fn check_pair(op: &'static str, input: &Tensor, target: &Tensor) -> Result<()> {
    check_float(op, "input", input)?;
    if input.shape() != target.shape() {
        return Err(invalid(
            op,
            format!(
                "target {} must have the input's shape {}; reshape it (broadcasting is not applied to targets)",
                target.shape(),
                input.shape()
            ),
        ));
    }
    if input.dtype() != target.dtype() {
        return Err(invalid(
            op,
            format!(
                "target is {} but input is {}; cast the target with .cast(DType::{:?})",
                target.dtype(),
                input.dtype(),
                input.dtype()
            ),
        ));
    }
    Ok(())
}

/// Mean squared error `(input - target)²` (`torch.nn.functional.mse_loss`). `input` and
/// `target` share one shape and float dtype.
///
/// ```
/// # use tessel_nn::loss::{mse_loss, Reduction};
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let l = mse_loss(&Tensor::from([1.0f32, 2.0]), &Tensor::from([0.0f32, 4.0]), Reduction::Mean)?;
/// assert_eq!(l.item::<f32>()?, 2.5);
/// # Ok(())
/// # }
/// ```
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let (input, target) = (
        &tessel_tensor::full_precision_operand(input),
        &tessel_tensor::full_precision_operand(target),
    );
    check_pair("mse_loss", input, target)?;
    let d = (input - target)?;
    reduce(&(&d * &d)?, reduction)
}

/// Mean absolute error `|input - target|` (`torch.nn.functional.l1_loss`). `input` and
/// `target` share one shape and float dtype.
pub fn l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let (input, target) = (
        &tessel_tensor::full_precision_operand(input),
        &tessel_tensor::full_precision_operand(target),
    );
    check_pair("l1_loss", input, target)?;
    reduce(&(input - target)?.abs()?, reduction)
}

/// Options of [`cross_entropy`]; `Default` is PyTorch's: no class weights,
/// `ignore_index = -100`, mean reduction, no label smoothing.
#[derive(Clone, Debug)]
pub struct CrossEntropyOptions {
    /// A weight per class, `[C]`, of the input's dtype.
    pub weight: Option<Tensor>,
    /// Class-index targets equal to this contribute nothing, to the sum or to the mean's
    /// divisor. Not used with probability targets.
    pub ignore_index: i64,
    /// How to reduce the per-element losses.
    pub reduction: Reduction,
    /// In `[0, 1]`: the target becomes a mix of itself (`1 - label_smoothing`) and the
    /// uniform distribution over the `C` classes.
    pub label_smoothing: f64,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
            label_smoothing: 0.0,
        }
    }
}

/// Options of [`nll_loss`]; `Default` is PyTorch's: no class weights,
/// `ignore_index = -100`, mean reduction.
#[derive(Clone, Debug)]
pub struct NllLossOptions {
    /// A weight per class, `[C]`, of the input's dtype.
    pub weight: Option<Tensor>,
    /// Targets equal to this contribute nothing, to the sum or to the mean's divisor.
    pub ignore_index: i64,
    /// How to reduce the per-element losses.
    pub reduction: Reduction,
}

impl Default for NllLossOptions {
    fn default() -> Self {
        NllLossOptions {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
        }
    }
}

/// `input` as `[N, C, d...]` and a flag saying it was unbatched `[C]`.
fn batched_input(op: &'static str, input: &Tensor) -> Result<(Tensor, bool)> {
    check_float(op, "input", input)?;
    match input.ndim() {
        0 => Err(invalid(
            op,
            format!(
                "input must be [N, C], [N, C, d...] or unbatched [C], got a 0-d tensor {}",
                input.shape()
            ),
        )),
        1 => Ok((input.unsqueeze(0)?, true)),
        _ => Ok((input.clone(), false)),
    }
}

/// Checks a class-weight vector against `C` classes of `dtype`, and shapes it to
/// broadcast along dim 1 of a rank-`rank` input.
fn class_weight(
    op: &'static str,
    weight: Option<&Tensor>,
    classes: usize,
    dtype: DType,
    rank: usize,
) -> Result<Option<Tensor>> {
    let Some(w) = weight else { return Ok(None) };
    if w.dims() != [classes] || w.dtype() != dtype {
        return Err(invalid(
            op,
            format!(
                "weight must be [{classes}] {dtype} (one per class, the input's dtype), got {} {}",
                w.shape(),
                w.dtype()
            ),
        ));
    }
    let mut shape = vec![1i64; rank];
    shape[1] = classes as i64;
    Ok(Some(w.reshape(&shape)?))
}

/// Checks class-index targets `[N, d...]` for a `[N, C, d...]` input.
fn check_index_target(op: &'static str, input: &Tensor, target: &Tensor) -> Result<()> {
    if !matches!(target.dtype(), DType::I32 | DType::I64) {
        return Err(invalid(
            op,
            format!(
                "class-index targets must be i32 or i64, got {}; cast with .cast(DType::I64)",
                target.dtype()
            ),
        ));
    }
    let mut want = input.dims();
    want.remove(1);
    if target.dims() != want {
        return Err(invalid(
            op,
            format!(
                "for input {} ([N, C, d...]) class-index targets must be {want:?} ([N, d...]), got {}",
                input.shape(),
                target.shape()
            ),
        ));
    }
    Ok(())
}

/// `x` `[N, C, d...]` at each element's class `target` `[N, d...]`, by a gather:
/// `[N, 1, d...]`. An ignored element reads class 0 (its term is dropped), so that checked
/// indexing reports only real targets out of range (which read 0 unchecked).
fn at_target(x: &Tensor, target: &Tensor, ignore_index: i64) -> Result<Tensor> {
    let kept = target.ne(ignore_index)?;
    let class = Tensor::where_cond(&kept, target, 0i64)?.cast(target.dtype());
    x.gather(1, &class.unsqueeze(1)?)
}

/// The negative log-likelihood per element from `picked` `[N, d...]`, the log-probability
/// at each element's class `target` `[N, d...]`, weighted and zero where ignored, and each
/// element's weight (zero where ignored): the mean reduction divides the sums of the two.
fn nll_terms(
    picked: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    ignore_index: i64,
) -> Result<(Tensor, Tensor)> {
    let kept = target.ne(ignore_index)?;
    let w = match weight {
        Some(w) => {
            let class = Tensor::where_cond(&kept, target, 0i64)?.cast(target.dtype());
            let flat = class.reshape(&[-1])?;
            let per = w.reshape(&[-1])?.index_select(0, &flat)?;
            let per = per.reshape(&dims_i64(&target.dims()))?;
            Tensor::where_cond(&kept, &per, 0.0)?
        }
        None => kept.cast(picked.dtype()),
    };
    let loss = Tensor::where_cond(&kept, &(&picked.neg()? * &w)?, 0.0)?;
    Ok((loss, w))
}

/// Reduces per-element losses whose mean divides by the total `weight`.
fn reduce_weighted(loss: &Tensor, weight: &Tensor, reduction: Reduction) -> Result<Tensor> {
    match reduction {
        Reduction::Mean => &loss.sum_all()? / &weight.sum_all()?,
        other => reduce(loss, other),
    }
}

/// An unbatched call's per-element result `[1]` back to 0-d.
fn unbatch(loss: Tensor, unbatched: bool, reduction: Reduction) -> Result<Tensor> {
    if unbatched && reduction == Reduction::None {
        loss.squeeze(Some(&[0]))
    } else {
        Ok(loss)
    }
}

/// The negative log-likelihood (`torch.nn.functional.nll_loss`) of log-probabilities
/// `input` `[N, C]`, `[N, C, d...]` or unbatched `[C]`, at class indices `target` `[N]`,
/// `[N, d...]` or `[]` (`i32`/`i64`): `-weight[t] * input[t]` per element; the mean
/// divides by the summed weights of the targets that are not `ignore_index`.
pub fn nll_loss(input: &Tensor, target: &Tensor, opts: &NllLossOptions) -> Result<Tensor> {
    const OP: &str = "nll_loss";
    let input = &tessel_tensor::full_precision_operand(input);
    let (x, unbatched) = batched_input(OP, input)?;
    let t = if unbatched {
        target.unsqueeze(0)?
    } else {
        target.clone()
    };
    check_index_target(OP, &x, &t)?;
    let weight = class_weight(OP, opts.weight.as_ref(), x.dims()[1], x.dtype(), x.ndim())?;
    let picked = at_target(&x, &t, opts.ignore_index)?.squeeze(Some(&[1]))?;
    let (loss, w) = nll_terms(&picked, &t, weight.as_ref(), opts.ignore_index)?;
    unbatch(
        reduce_weighted(&loss, &w, opts.reduction)?,
        unbatched,
        opts.reduction,
    )
}

/// Cross-entropy of logits (`torch.nn.functional.cross_entropy`): `log_softmax` over the
/// class dim, then the negative log-likelihood of the target.
///
/// `input` is `[N, C]`, `[N, C, d...]` or unbatched `[C]`. `target` is either class
/// indices (`i32`/`i64`, the input's shape without the class dim) or class probabilities
/// (the input's float dtype and shape). Label smoothing mixes the target with the
/// uniform distribution; class weights and `ignore_index` follow PyTorch exactly,
/// including how the mean is normalized (for probability targets: by the number of
/// elements, not the weights).
///
/// ```
/// # use tessel_nn::loss::{cross_entropy, CrossEntropyOptions};
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let logits = Tensor::from([[2.0f32, 0.0, 0.0], [0.0, 0.0, 0.0]]);
/// let classes = Tensor::from([0i64, 2]);
/// let l = cross_entropy(&logits, &classes, &CrossEntropyOptions::default())?.item::<f32>()?;
/// let e2 = 2f32.exp();
/// let want = ((-(e2 / (e2 + 2.0)).ln()) + 3f32.ln()) / 2.0;
/// assert!((l - want).abs() < 1e-6);
/// # Ok(())
/// # }
/// ```
pub fn cross_entropy(
    input: &Tensor,
    target: &Tensor,
    opts: &CrossEntropyOptions,
) -> Result<Tensor> {
    const OP: &str = "cross_entropy";
    let (input, target) = (
        &tessel_tensor::full_precision_operand(input),
        &tessel_tensor::full_precision_operand(target),
    );
    let (x, unbatched) = batched_input(OP, input)?;
    let ls = opts.label_smoothing;
    if !(0.0..=1.0).contains(&ls) {
        return Err(invalid(
            OP,
            format!("label_smoothing must be in [0, 1], got {ls}"),
        ));
    }
    let classes = x.dims()[1];
    let weight = class_weight(OP, opts.weight.as_ref(), classes, x.dtype(), x.ndim())?;

    if target.dtype().is_float() {
        let logp = x.log_softmax(1)?;
        // Class probabilities.
        if target.shape() != input.shape() || target.dtype() != input.dtype() {
            return Err(invalid(
                OP,
                format!(
                    "probability targets must have the input's shape and dtype {} {}, got {} {}; class-index targets are i32/i64",
                    input.shape(),
                    input.dtype(),
                    target.shape(),
                    target.dtype()
                ),
            ));
        }
        let mut p = if unbatched {
            target.unsqueeze(0)?
        } else {
            target.clone()
        };
        if ls > 0.0 {
            p = (&(&p * (1.0 - ls))? + ls / classes as f64)?;
        }
        let mut terms = (&logp * &p)?;
        if let Some(w) = &weight {
            terms = (&terms * w)?;
        }
        let loss = match opts.reduction {
            Reduction::None => terms.sum(&[1], false)?.neg()?,
            Reduction::Sum => terms.sum_all()?.neg()?,
            Reduction::Mean => {
                let rows = (x.numel() / classes) as f64;
                (&terms.sum_all()?.neg()? / rows)?
            }
        };
        return unbatch(loss, unbatched, opts.reduction);
    }

    let t = if unbatched {
        target.unsqueeze(0)?
    } else {
        target.clone()
    };
    check_index_target(OP, &x, &t)?;
    // log_softmax(x)[t] = x[t] - logsumexp(x): the row statistics and one gathered logit
    // per element, so the [N, C] log-probabilities are never written. The gradient is
    // softmax(x) minus one at the target, computed where it is consumed.
    let lse = x.logsumexp(&[1], true)?;
    let picked = (&at_target(&x, &t, opts.ignore_index)? - &lse)?.squeeze(Some(&[1]))?;
    let (loss, w) = nll_terms(&picked, &t, weight.as_ref(), opts.ignore_index)?;
    let nll = reduce_weighted(&loss, &w, opts.reduction)?;
    if ls == 0.0 {
        return unbatch(nll, unbatched, opts.reduction);
    }
    // PyTorch's smoothing term: -sum_c weight_c * logp_c per element, zero where ignored,
    // normalized like the NLL term; sum_c w_c (x_c - lse) = sum_c w_c x_c - lse sum_c w_c.
    let logp_sum = match &weight {
        Some(w) => (&(&x * w)?.sum(&[1], true)? - &(&lse * &w.sum_all()?)?)?,
        None => (&x.sum(&[1], true)? - &(&lse * classes as f64)?)?,
    };
    let kept = t.ne(opts.ignore_index)?;
    let smooth = Tensor::where_cond(&kept, &logp_sum.squeeze(Some(&[1]))?.neg()?, 0.0)?;
    let smooth = reduce_weighted(&smooth, &w, opts.reduction)?;
    let loss = (&(&nll * (1.0 - ls))? + &(&smooth * (ls / classes as f64))?)?;
    unbatch(loss, unbatched, opts.reduction)
}

/// Checks an optional per-element weight that must broadcast to `input`.
fn check_broadcast_weight(
    op: &'static str,
    what: &str,
    w: Option<&Tensor>,
    input: &Tensor,
) -> Result<()> {
    let Some(w) = w else { return Ok(()) };
    if w.dtype() != input.dtype() {
        return Err(invalid(
            op,
            format!(
                "{what} must have the input's dtype {}, got {}",
                input.dtype(),
                w.dtype()
            ),
        ));
    }
    let (wd, xd) = (w.dims(), input.dims());
    let fits = wd.len() <= xd.len()
        && wd
            .iter()
            .rev()
            .zip(xd.iter().rev())
            .all(|(&a, &b)| a == b || a == 1);
    if !fits {
        return Err(invalid(
            op,
            format!(
                "{what} {} must broadcast to the input's shape {}",
                w.shape(),
                input.shape()
            ),
        ));
    }
    Ok(())
}

/// Binary cross-entropy of probabilities (`torch.nn.functional.binary_cross_entropy`):
/// `-weight * (t log(x) + (1 - t) log(1 - x))`, each log clamped to `>= -100` as in
/// PyTorch so that `x = 0` or `1` stays finite. `target` has the input's shape and dtype;
/// `weight` broadcasts to it.
pub fn binary_cross_entropy(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "binary_cross_entropy";
    let (input, target) = (
        &tessel_tensor::full_precision_operand(input),
        &tessel_tensor::full_precision_operand(target),
    );
    check_pair(OP, input, target)?;
    check_broadcast_weight(OP, "weight", weight, input)?;
    let log_x = input.log().clamp(Some(-100.0), None)?;
    let log_1mx = (1.0 - input)?.log().clamp(Some(-100.0), None)?;
    let mut loss = (&(target * &log_x)? + &(&(1.0 - target)? * &log_1mx)?)?.neg()?;
    if let Some(w) = weight {
        loss = (&loss * w)?;
    }
    reduce(&loss, reduction)
}

/// Binary cross-entropy of logits
/// (`torch.nn.functional.binary_cross_entropy_with_logits`), in the stable form
/// `(1 - t) x - (1 + (pos_weight - 1) t) logsigmoid(x)`, times `weight`. `target` has the
/// input's shape and dtype; `weight` and `pos_weight` (a weight of the positive term,
/// typically `[C]` along the last dim) broadcast to it.
///
/// ```
/// # use tessel_nn::loss::{binary_cross_entropy_with_logits, Reduction};
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let x = Tensor::from([100.0f32, -100.0]);
/// let t = Tensor::from([1.0f32, 0.0]);
/// let l = binary_cross_entropy_with_logits(&x, &t, None, None, Reduction::Sum)?;
/// assert!(l.item::<f32>()?.abs() < 1e-30);
/// # Ok(())
/// # }
/// ```
pub fn binary_cross_entropy_with_logits(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    pos_weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    const OP: &str = "binary_cross_entropy_with_logits";
    let (input, target) = (
        &tessel_tensor::full_precision_operand(input),
        &tessel_tensor::full_precision_operand(target),
    );
    check_pair(OP, input, target)?;
    check_broadcast_weight(OP, "weight", weight, input)?;
    check_broadcast_weight(OP, "pos_weight", pos_weight, input)?;
    let neg_part = (&(1.0 - target)? * input)?;
    let log_sig = input.logsigmoid();
    let pos_part = match pos_weight {
        Some(pw) => (&(&(&(pw - 1.0)? * target)? + 1.0)? * &log_sig)?,
        None => log_sig,
    };
    let mut loss = (&neg_part - &pos_part)?;
    if let Some(w) = weight {
        loss = (&loss * w)?;
    }
    reduce(&loss, reduction)
}
