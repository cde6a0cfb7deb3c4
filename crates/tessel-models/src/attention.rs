//! The pieces of attention the decoders share: splitting heads, attending through a KV
//! cache with the cache's mask, and merging heads.

use tessel_nn::scaled_dot_product_attention;
use tessel_tensor::{Result, Tensor};

use crate::cache::KvCache;

/// `[B, T, heads * head_dim]` to `[B, heads, T, head_dim]`.
pub(crate) fn split_heads(x: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
    let d = x.dims();
    x.reshape(&[d[0] as i64, d[1] as i64, heads as i64, head_dim as i64])?
        .transpose(1, 2)
}

/// `[B, heads, T, head_dim]` to `[B, T, heads * head_dim]`.
pub(crate) fn merge_heads(x: &Tensor) -> Result<Tensor> {
    let d = x.dims();
    x.transpose(1, 2)?
        .reshape(&[d[0] as i64, d[2] as i64, (d[1] * d[3]) as i64])
}

/// `softmax(q kᵀ / √d + mask) v` over the cached and new positions of `layer` (causal
/// from the positions, on the device, where the cache says so and gives no mask); keys and
/// values with fewer heads than the queries (grouped-query attention) serve
/// `heads / kv_heads` query heads each, as `transformers`' `repeat_kv`.
pub(crate) fn attend(
    cache: &mut KvCache,
    layer: usize,
    q: &Tensor,
    k: Tensor,
    v: Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let causal = mask.is_none() && cache.causal();
    let (k, v) = cache.append(layer, k, v)?;
    scaled_dot_product_attention(q, &k, &v, mask, 0.0, causal, None, true)
}
