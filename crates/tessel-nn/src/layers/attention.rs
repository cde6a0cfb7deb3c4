//! Attention: [`scaled_dot_product_attention`] and [`MultiheadAttention`].

use std::sync::atomic::{AtomicBool, Ordering};

use tessel_tensor::{DType, Dim, Result, Tensor};

use super::{check_dtype, dims_i64, invalid};
use crate::init::{ParamOptions, constant, xavier_uniform};
use crate::{Linear, Module, Visitor};

/// `[L, S]` bool, true above the diagonal: the positions a causal mask hides (query `i`
/// sees keys `0..=i`, aligned at the top left as in PyTorch), on `like`'s device.
fn causal_hidden(scores: &Tensor) -> Result<Tensor> {
    // In the scores' own shape, so a dynamic sequence length stays dynamic.
    scores.ones_like().cast(DType::Bool).triu(1)
}

/// The attention probabilities `softmax(q kᵀ * scale + mask)` over the last dim.
fn attention_probs(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    attn_mask: Option<&Tensor>,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    let e = q.dims()[q.ndim() - 1];
    let scale = scale.unwrap_or_else(|| 1.0 / (e as f64).sqrt());
    // Half-precision scores are scaled, masked and normalized in f32 and the
    // probabilities rounded once, as PyTorch's fused attention kernels do: no rounding of
    // the scaled scores, and a cheaper kernel.
    let product = q.matmul(&k.transpose(-2, -1)?)?;
    let half = matches!(product.dtype(), DType::F16 | DType::BF16);
    let product = if half {
        product.cast(DType::F32)
    } else {
        product
    };
    let mut scores = (&product * scale)?;
    if is_causal {
        scores = scores.masked_fill(&causal_hidden(&scores)?, f64::NEG_INFINITY)?;
    }
    if let Some(mask) = attn_mask {
        scores = match mask.dtype() {
            // SDPA's convention: true takes part in attention.
            DType::Bool => scores.masked_fill(&mask.logical_not(), f64::NEG_INFINITY)?,
            dt if dt == q.dtype() => (&scores + mask)?,
            dt => {
                return Err(invalid(
                    op,
                    format!(
                        "attn_mask must be bool or the query's dtype {}, got {dt}",
                        q.dtype()
                    ),
                ));
            }
        };
    }
    let probs = scores.softmax(-1)?;
    Ok(if half { probs.cast(q.dtype()) } else { probs })
}

/// `dropout(softmax(q kᵀ * scale + mask), dropout_p) v`
/// (`torch.nn.functional.scaled_dot_product_attention`, the same arguments in the same
/// order).
///
/// `q` is `[..., L, E]`, `k` `[..., S, E]`, `v` `[..., S, Ev]`, batch dims broadcasting;
/// the result is `[..., L, Ev]`. `scale` defaults to `1 / sqrt(E)`. `attn_mask`
/// broadcasts to `[..., L, S]`: a `bool` mask marks the positions that **take part**
/// (PyTorch's convention here, the opposite of [`MultiheadAttention`]'s), a float mask is
/// added to the scores. `is_causal` hides key `j > i` from query `i`; it cannot be combined
/// with `attn_mask` (as in PyTorch). A query row that sees no key gives NaN.
/// `enable_gqa`: `k` and `v` may have fewer heads (dim -3) than `q`, each serving
/// `q_heads / kv_heads` consecutive query heads (grouped-query attention, PyTorch's
/// `enable_gqa=True`). `dropout_p` in `[0, 1]` zeroes each attention probability with that
/// probability and scales the rest by `1 / (1 - dropout_p)` ([`Tensor::dropout`]: Philox
/// bits computed in the kernel, a new draw per call); pass 0 outside training, as PyTorch
/// callers pass `dropout_p=0.0` in evaluation.
///
/// ```
/// # use tessel_nn::scaled_dot_product_attention;
/// # use tessel_tensor::{DType, Tensor};
/// # fn main() -> tessel_tensor::Result<()> {
/// let q = Tensor::randn([2, 4, 8], DType::F32)?;
/// let v = Tensor::randn([2, 4, 8], DType::F32)?;
/// let y = scaled_dot_product_attention(&q, &q, &v, None, 0.0, true, None, false)?;
/// // The first query sees only the first key.
/// assert_eq!(y.narrow(1, 0, 1)?.to_vec::<f32>()?[..8], v.narrow(1, 0, 1)?.to_vec::<f32>()?[..8]);
/// # Ok(())
/// # }
/// ```
// PyTorch's signature, argument for argument.
#[allow(clippy::too_many_arguments)]
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
    enable_gqa: bool,
) -> Result<Tensor> {
    const OP: &str = "scaled_dot_product_attention";
    if !(0.0..=1.0).contains(&dropout_p) {
        return Err(invalid(
            OP,
            format!("dropout_p must be in [0, 1], got {dropout_p}"),
        ));
    }
    if q.ndim() < 2 || k.ndim() < 2 || v.ndim() < 2 {
        return Err(invalid(
            OP,
            format!(
                "q, k and v must be at least 2-d ([..., L, E], [..., S, E], [..., S, Ev]), got {}, {} and {}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    if !q.dtype().is_float() || k.dtype() != q.dtype() || v.dtype() != q.dtype() {
        return Err(invalid(
            OP,
            format!(
                "q, k and v must share one float dtype, got {}, {} and {}",
                q.dtype(),
                k.dtype(),
                v.dtype()
            ),
        ));
    }
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if qd[qd.len() - 1] != kd[kd.len() - 1] || kd[kd.len() - 2] != vd[vd.len() - 2] {
        return Err(invalid(
            OP,
            format!(
                "q [..., L, E], k [..., S, E] and v [..., S, Ev] disagree: got {}, {} and {}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    if is_causal && attn_mask.is_some() {
        return Err(invalid(
            OP,
            "give either attn_mask or is_causal, not both; fold the causal mask into attn_mask",
        ));
    }
    if let Some(s) = scale
        && !s.is_finite()
    {
        return Err(invalid(OP, format!("scale must be finite, got {s}")));
    }
    let (k, v) = if enable_gqa {
        grouped_heads(OP, q, k, v)?
    } else {
        (k.clone(), v.clone())
    };
    attention_probs(OP, q, &k, attn_mask, is_causal, scale)?
        .dropout(dropout_p)?
        .matmul(&v)
}

/// `k` and `v` with each of their heads (dim -3) repeated for the query heads it serves.
fn grouped_heads(op: &'static str, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
    let heads = |t: &Tensor| (t.ndim() >= 3).then(|| t.dims()[t.ndim() - 3]);
    let (Some(hq), Some(hk), Some(hv)) = (heads(q), heads(k), heads(v)) else {
        return Err(invalid(
            op,
            format!(
                "enable_gqa needs q, k and v with a head dim ([..., heads, L, E]), got {}, {} and {}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    };
    if hk != hv || hk == 0 || !hq.is_multiple_of(hk) {
        return Err(invalid(
            op,
            format!(
                "with enable_gqa, k and v need one head count that divides q's: got {hq} query heads, {hk} key and {hv} value heads"
            ),
        ));
    }
    let groups = hq / hk;
    if groups == 1 {
        return Ok((k.clone(), v.clone()));
    }
    Ok((
        k.repeat_interleave(groups, -3)?,
        v.repeat_interleave(groups, -3)?,
    ))
}

/// The masks of a [`MultiheadAttention`] call; `Default` is none.
///
/// Following `torch.nn.MultiheadAttention`, a `bool` mask marks the positions to **hide**
/// (true = not attended), and a float mask (the query's dtype) is added to the scores.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionMasks<'a> {
    /// `[N, S]` (`[S]` for unbatched input): keys to ignore per batch element, such as
    /// padding.
    pub key_padding_mask: Option<&'a Tensor>,
    /// `[L, S]`, or `[N * num_heads, L, S]` (`[num_heads, L, S]` unbatched): per query.
    pub attn_mask: Option<&'a Tensor>,
    /// Hide key `j > i` from query `i` (a causal mask is built; it combines with the
    /// masks above).
    pub is_causal: bool,
}

/// Multi-head attention (`torch.nn.MultiheadAttention`, the same embedding size for
/// queries, keys and values; [`MultiheadAttention::dropout`] on the attention weights in
/// training mode).
///
/// Batched inputs are `[L, N, E]` (sequence first) as PyTorch's default is;
/// [`MultiheadAttention::batch_first`]`(true)` takes `[N, L, E]`.
///
/// Parameters, named as in PyTorch's `state_dict`: `in_proj_weight` `[3E, E]` (Glorot
/// uniform) and `in_proj_bias` `[3E]` (zeros) project queries, keys and values, stacked in
/// that order; `out_proj.weight` `[E, E]` and `out_proj.bias` `[E]` (zeros) mix the heads.
///
/// ```
/// # use tessel_nn::{AttentionMasks, MultiheadAttention};
/// # use tessel_tensor::{DType, Tensor};
/// # fn main() -> tessel_tensor::Result<()> {
/// let mha = MultiheadAttention::new(16, 4)?.batch_first(true);
/// let x = Tensor::randn([2, 5, 16], DType::F32)?;
/// let masks = AttentionMasks { is_causal: true, ..AttentionMasks::default() };
/// assert_eq!(mha.forward(&x, &x, &x, &masks)?.dims(), vec![2, 5, 16]);
/// # Ok(())
/// # }
/// ```
pub struct MultiheadAttention {
    num_heads: usize,
    batch_first: bool,
    in_proj_weight: Tensor,
    in_proj_bias: Option<Tensor>,
    out_proj: Linear,
    /// Dropout probability of the attention weights while training.
    dropout: f64,
    training: AtomicBool,
}

/// [`MultiheadAttention`] under the name the project's docs use.
pub type MultiHeadAttention = MultiheadAttention;

impl MultiheadAttention {
    /// Attention over `embed_dim` features split into `num_heads` heads, with biases,
    /// `f32` on the default device.
    pub fn new(embed_dim: usize, num_heads: usize) -> Result<MultiheadAttention> {
        MultiheadAttention::with_options(embed_dim, num_heads, true, &ParamOptions::default())
    }

    /// Attention with or without the projection biases, parameters of `opts`' dtype and
    /// device.
    pub fn with_options(
        embed_dim: usize,
        num_heads: usize,
        bias: bool,
        opts: &ParamOptions,
    ) -> Result<MultiheadAttention> {
        if embed_dim == 0 || num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(invalid(
                "MultiheadAttention::new",
                format!(
                    "embed_dim = {embed_dim} must be a positive multiple of num_heads = {num_heads}"
                ),
            ));
        }
        let e = embed_dim;
        // PyTorch's order: out_proj is built (its weight drawn) before in_proj.
        let out_weight = Linear::with_options(e, e, false, opts)?.weight().clone();
        let out_bias = if bias {
            Some(constant(&[e], 0.0, opts)?)
        } else {
            None
        };
        let out_proj = Linear::from_tensors(out_weight, out_bias)?;
        let in_proj_weight = xavier_uniform(&[3 * e, e], e, 3 * e, 1.0, opts)?;
        let in_proj_bias = if bias {
            Some(constant(&[3 * e], 0.0, opts)?)
        } else {
            None
        };
        Ok(MultiheadAttention {
            num_heads,
            batch_first: false,
            in_proj_weight,
            in_proj_bias,
            out_proj,
            dropout: 0.0,
            training: AtomicBool::new(true),
        })
    }

    /// Drops each attention weight with probability `p` while training (PyTorch's
    /// `dropout` argument; 0 by default), the identity in evaluation mode
    /// ([`Module::eval`]).
    pub fn dropout(mut self, p: f64) -> Result<MultiheadAttention> {
        if !(0.0..=1.0).contains(&p) {
            return Err(invalid(
                "MultiheadAttention::dropout",
                format!("the probability must be in [0, 1], got {p}"),
            ));
        }
        self.dropout = p;
        Ok(self)
    }

    /// `true`: batched inputs and outputs are `[N, L, E]` (batch first); `false` (the
    /// default, as in PyTorch): `[L, N, E]`.
    pub fn batch_first(mut self, batch_first: bool) -> MultiheadAttention {
        self.batch_first = batch_first;
        self
    }

    /// The embedding size `E`.
    pub fn embed_dim(&self) -> usize {
        self.in_proj_weight.dims()[1]
    }

    /// The number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// The stacked query, key and value projection weights, `[3E, E]`.
    pub fn in_proj_weight(&self) -> &Tensor {
        &self.in_proj_weight
    }

    /// The stacked projection biases, `[3E]`, if the layer has them.
    pub fn in_proj_bias(&self) -> Option<&Tensor> {
        self.in_proj_bias.as_ref()
    }

    /// The output projection.
    pub fn out_proj(&self) -> &Linear {
        &self.out_proj
    }

    /// The attention output for `query` `[L, N, E]`, `key` and `value` `[S, N, E]` (with
    /// [`MultiheadAttention::batch_first`]: `[N, L, E]`, `[N, S, E]`; or unbatched `[L, E]`,
    /// `[S, E]`): `[L, N, E]` (`[N, L, E]` batch first, `[L, E]` unbatched).
    pub fn forward(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        masks: &AttentionMasks<'_>,
    ) -> Result<Tensor> {
        Ok(self.run(query, key, value, masks)?.0)
    }

    /// [`MultiheadAttention::forward`] and the attention weights averaged over the heads,
    /// `[N, L, S]` (or `[L, S]`), as PyTorch returns with `need_weights=True`.
    pub fn forward_with_weights(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        masks: &AttentionMasks<'_>,
    ) -> Result<(Tensor, Tensor)> {
        let (out, probs) = self.run(query, key, value, masks)?;
        let weights = probs.mean(&[-3], false)?;
        Ok((out, weights))
    }

    /// The output and the per-head probabilities `[N, H, L, S]` (unbatched: `[H, L, S]`).
    fn run(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        masks: &AttentionMasks<'_>,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "MultiheadAttention";
        let e = self.embed_dim();
        let h = self.num_heads;
        let batched = query.ndim() == 3;
        let ranks_ok = matches!(query.ndim(), 2 | 3)
            && key.ndim() == query.ndim()
            && value.ndim() == query.ndim();
        let (q, k, v) = if batched && !self.batch_first {
            (
                query.transpose(0, 1)?,
                key.transpose(0, 1)?,
                value.transpose(0, 1)?,
            )
        } else if batched {
            (query.clone(), key.clone(), value.clone())
        } else {
            (query.unsqueeze(0)?, key.unsqueeze(0)?, value.unsqueeze(0)?)
        };
        let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
        if !ranks_ok
            || qd[2] != e
            || kd[2] != e
            || vd[2] != e
            || kd[0] != qd[0]
            || vd[0] != qd[0]
            || kd[1] != vd[1]
        {
            return Err(invalid(
                OP,
                format!(
                    "expected query {}, key and value {} (or unbatched [L, {e}], [S, {e}]), got {}, {} and {}",
                    if self.batch_first {
                        format!("[N, L, {e}]")
                    } else {
                        format!("[L, N, {e}]")
                    },
                    if self.batch_first {
                        format!("[N, S, {e}]")
                    } else {
                        format!("[S, N, {e}]")
                    },
                    query.shape(),
                    key.shape(),
                    value.shape()
                ),
            ));
        }
        let dtype = self.in_proj_weight.dtype();
        for t in [query, key, value] {
            check_dtype(OP, t, dtype)?;
        }
        let (n, l, s) = (qd[0], qd[1], kd[1]);
        let d = e / h;

        // Project and split heads: [N, T, E] -> [N, H, T, D], in the input's own (maybe
        // dynamic) N and T.
        let project = |x: &Tensor, i: usize| -> Result<Tensor> {
            let w = self.in_proj_weight.narrow(0, (i * e) as i64, e as i64)?;
            let mut y = x.matmul(&w.t()?)?;
            if let Some(b) = &self.in_proj_bias {
                y = (&y + &b.narrow(0, (i * e) as i64, e as i64)?)?;
            }
            let (nt, tt) = (x.shape()[0], x.shape()[1]);
            y.reshape_dims(&[nt, tt, Dim::from(h), Dim::from(d)])?
                .permute(&[0, 2, 1, 3])
        };
        let (qh, kh, vh) = (project(&q, 0)?, project(&k, 1)?, project(&v, 2)?);

        let mask = self.additive_mask(masks, batched, n, l, s, &q)?;
        // The causal mask is built in the scores' shape, so dynamic lengths stay dynamic.
        let mut probs = attention_probs(OP, &qh, &kh, mask.as_ref(), masks.is_causal, None)?;
        if self.training.load(Ordering::Relaxed) {
            probs = probs.dropout(self.dropout)?;
        }
        let heads = probs.matmul(&vh)?;
        let merged = heads.permute(&[0, 2, 1, 3])?.reshape_dims(&[
            q.shape()[0],
            q.shape()[1],
            Dim::from(e),
        ])?;
        let out = self.out_proj.forward(&merged)?;
        if batched && !self.batch_first {
            Ok((out.transpose(0, 1)?, probs))
        } else if batched {
            Ok((out, probs))
        } else {
            Ok((out.squeeze(Some(&[0]))?, probs.squeeze(Some(&[0]))?))
        }
    }

    /// The masks folded into one float mask broadcasting to `[N, H, L, S]`: 0 where a key
    /// is seen, `-inf` where it is hidden, plus any float mask given.
    fn additive_mask(
        &self,
        masks: &AttentionMasks<'_>,
        batched: bool,
        n: usize,
        l: usize,
        s: usize,
        q: &Tensor,
    ) -> Result<Option<Tensor>> {
        const OP: &str = "MultiheadAttention";
        let h = self.num_heads;
        let dtype = q.dtype();
        let to_float = |m: &Tensor, what: &str| -> Result<Tensor> {
            match m.dtype() {
                DType::Bool => Ok(Tensor::where_cond(m, f64::NEG_INFINITY, 0.0)?.cast(dtype)),
                dt if dt == dtype => Ok(m.clone()),
                dt => Err(invalid(
                    OP,
                    format!("{what} must be bool or the query's dtype {dtype}, got {dt}"),
                )),
            }
        };
        let mut total: Option<Tensor> = None;
        let mut add = |m: Tensor| -> Result<()> {
            total = Some(match total.take() {
                Some(t) => (&t + &m)?,
                None => m,
            });
            Ok(())
        };
        if let Some(m) = masks.key_padding_mask {
            let want = if batched { vec![n, s] } else { vec![s] };
            if m.dims() != want {
                return Err(invalid(
                    OP,
                    format!(
                        "key_padding_mask must be {want:?} ([N, S], or [S] unbatched), got {}",
                        m.shape()
                    ),
                ));
            }
            add(to_float(m, "key_padding_mask")?.reshape(&dims_i64(&[n, 1, 1, s]))?)?;
        }
        if let Some(m) = masks.attn_mask {
            let per_head = if batched {
                vec![n * h, l, s]
            } else {
                vec![h, l, s]
            };
            let shaped = if m.dims() == [l, s] {
                m.reshape(&dims_i64(&[1, 1, l, s]))?
            } else if m.dims() == per_head {
                m.reshape(&dims_i64(&[n, h, l, s]))?
            } else {
                return Err(invalid(
                    OP,
                    format!(
                        "attn_mask must be [L, S] = {:?} or {per_head:?} ([N * num_heads, L, S], or [num_heads, L, S] unbatched), got {}",
                        [l, s],
                        m.shape()
                    ),
                ));
            };
            add(to_float(&shaped, "attn_mask")?)?;
        }
        Ok(total)
    }
}

impl Module for MultiheadAttention {
    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("in_proj_weight", &self.in_proj_weight);
        if let Some(b) = &self.in_proj_bias {
            v.param("in_proj_bias", b);
        }
        v.module("out_proj", &self.out_proj);
    }

    fn set_training_local(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
    }
}
