//! Llama (`LlamaForCausalLM`): RMSNorm, rotary positions (RoPE, `transformers`'
//! `rotate_half` convention), grouped-query attention and a SwiGLU MLP. Mistral- and
//! Qwen2-style checkpoints, which differ only in their config and in attention biases,
//! load as well.

use std::path::Path;

use tessel_nn::{Linear, Module, RMSNorm, Weights};
use tessel_tensor::{DType, Device, Result, Tensor};

use crate::attention::{attend, merge_heads, split_heads};
use crate::cache::KvCache;
use crate::config::{Config, load_dir, unsupported};
use crate::generate::CausalLm;

/// The fields of a Llama `config.json` the model uses.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size`: the MLP's width.
    pub intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads` (grouped-query attention; default: every head its own).
    pub num_key_value_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// `rope_theta` (top level, or in `rope_parameters` as `transformers` 5 writes it).
    pub rope_theta: f64,
    /// `tie_word_embeddings`: the head is the token embedding.
    pub tie_word_embeddings: bool,
    /// `eos_token_id`, if any.
    pub eos_token_id: Option<i64>,
}

impl LlamaConfig {
    /// Reads a Llama-style `config.json` (Llama, Mistral, Qwen2). RoPE scaling other than
    /// the default and sliding-window attention are errors until they are implemented.
    pub fn from_config(c: &Config) -> Result<LlamaConfig> {
        const OP: &str = "Llama";
        let hidden_size = c.usize("hidden_size")?;
        let heads = c.usize("num_attention_heads")?;
        let act = c.str_or("hidden_act", "silu")?;
        if act != "silu" {
            return Err(unsupported(
                OP,
                format!("hidden_act `{act}` is not supported (silu is)"),
            ));
        }
        let rope = c.get("rope_parameters").or_else(|| c.get("rope_scaling"));
        let rope_type = rope
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("default");
        if rope_type != "default" {
            return Err(unsupported(
                OP,
                format!("rope type `{rope_type}` is not supported yet (only the default RoPE is)"),
            ));
        }
        let rope_theta = match rope
            .and_then(|r| r.get("rope_theta"))
            .and_then(serde_json::Value::as_f64)
        {
            Some(theta) => theta,
            None => c.f64_or("rope_theta", 10000.0)?,
        };
        let max_position_embeddings = c.usize_or("max_position_embeddings", 2048)?;
        if c.get("sliding_window").is_some() && c.bool_or("use_sliding_window", true)? {
            let window = c.usize("sliding_window")?;
            if window < max_position_embeddings {
                return Err(unsupported(
                    OP,
                    format!("sliding-window attention (window {window}) is not supported yet"),
                ));
            }
        }
        Ok(LlamaConfig {
            vocab_size: c.usize("vocab_size")?,
            hidden_size,
            intermediate_size: c.usize("intermediate_size")?,
            num_hidden_layers: c.usize("num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: c.usize_or("num_key_value_heads", heads)?,
            head_dim: c.usize_or("head_dim", hidden_size / heads.max(1))?,
            max_position_embeddings,
            rms_norm_eps: c.f64_or("rms_norm_eps", 1e-6)?,
            rope_theta,
            tie_word_embeddings: c.bool_or("tie_word_embeddings", false)?,
            eos_token_id: c.token_id("eos_token_id")?,
        })
    }
}

#[derive(Module)]
#[allow(clippy::struct_field_names)] // Hugging Face's names.
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
}

#[derive(Module)]
#[allow(clippy::struct_field_names)] // Hugging Face's names.
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

#[derive(Module)]
struct Layer {
    input_layernorm: RMSNorm,
    self_attn: Attention,
    post_attention_layernorm: RMSNorm,
    mlp: Mlp,
}

#[derive(Module)]
struct Decoder {
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: RMSNorm,
}

/// Llama with its language-model head (`LlamaForCausalLM`), weight names as in
/// `transformers` (`model.layers.0.self_attn.q_proj.weight`, ...).
#[derive(Module)]
pub struct Llama {
    model: Decoder,
    /// `lm_head.weight`, absent when tied to the embedding.
    #[module(rename = "lm_head.weight")]
    lm_head: Option<Tensor>,
    #[module(skip)]
    config: LlamaConfig,
    /// RoPE's inverse frequencies, `[head_dim / 2]` f32 on the weights' device (the
    /// `rotary_emb.inv_freq` buffer `transformers` computes at load, not a weight).
    #[module(skip)]
    inv_freq: Tensor,
}

/// A linear layer `[out, inp]`, with a bias if the checkpoint has one (Qwen2's q/k/v).
fn linear(w: &Weights, inp: usize, out: usize) -> Result<Linear> {
    let bias = if w.contains("bias") {
        Some(w.get("bias", &[out])?)
    } else {
        None
    };
    Linear::from_tensors(w.get("weight", &[out, inp])?, bias)
}

impl Llama {
    /// Loads a model directory (`config.json` + weights) with float weights as `dtype` on
    /// `device`.
    pub fn from_dir(dir: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Llama> {
        load_dir(
            dir.as_ref(),
            dtype,
            device,
            LlamaConfig::from_config,
            Llama::load,
        )
    }

    /// Builds the model from `weights`.
    pub fn load(config: &LlamaConfig, weights: &Weights) -> Result<Llama> {
        let c = config;
        let m = weights.pp("model");
        let eps = Some(c.rms_norm_eps);
        let (q_out, kv_out) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        if c.num_key_value_heads == 0
            || !c.num_attention_heads.is_multiple_of(c.num_key_value_heads)
        {
            return Err(unsupported(
                "Llama",
                format!(
                    "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                    c.num_attention_heads, c.num_key_value_heads
                ),
            ));
        }
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let l = m.pp(&format!("layers.{i}"));
            l.skip("self_attn.rotary_emb.inv_freq");
            let a = l.pp("self_attn");
            let p = l.pp("mlp");
            layers.push(Layer {
                input_layernorm: RMSNorm::from_tensors(
                    l.get("input_layernorm.weight", &[c.hidden_size])?,
                    eps,
                )?,
                self_attn: Attention {
                    q_proj: linear(&a.pp("q_proj"), c.hidden_size, q_out)?,
                    k_proj: linear(&a.pp("k_proj"), c.hidden_size, kv_out)?,
                    v_proj: linear(&a.pp("v_proj"), c.hidden_size, kv_out)?,
                    o_proj: linear(&a.pp("o_proj"), q_out, c.hidden_size)?,
                },
                post_attention_layernorm: RMSNorm::from_tensors(
                    l.get("post_attention_layernorm.weight", &[c.hidden_size])?,
                    eps,
                )?,
                mlp: Mlp {
                    gate_proj: linear(&p.pp("gate_proj"), c.hidden_size, c.intermediate_size)?,
                    up_proj: linear(&p.pp("up_proj"), c.hidden_size, c.intermediate_size)?,
                    down_proj: linear(&p.pp("down_proj"), c.intermediate_size, c.hidden_size)?,
                },
            });
        }
        let model = Decoder {
            embed_tokens: m.get("embed_tokens.weight", &[c.vocab_size, c.hidden_size])?,
            layers,
            norm: RMSNorm::from_tensors(m.get("norm.weight", &[c.hidden_size])?, eps)?,
        };
        let lm_head = if weights.contains("lm_head.weight") || !c.tie_word_embeddings {
            Some(weights.get("lm_head.weight", &[c.vocab_size, c.hidden_size])?)
        } else {
            None
        };
        let d = c.head_dim;
        let theta = c.rope_theta as f32;
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / d as f32))
            .collect();
        let inv_freq = Tensor::from_vec(inv_freq, [d / 2])?.to(&model.embed_tokens.device())?;
        Ok(Llama {
            model,
            lm_head,
            config: c.clone(),
            inv_freq,
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The logits `[B, T, vocab]` of `input_ids` (`[B, T]` i64), every token attended.
    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        let mut cache = self.new_cache()?;
        let d = input_ids.dims();
        cache.begin(vec![vec![true; d[1]]; d[0]])?;
        self.forward_cached(input_ids, &mut cache)
    }

    /// RoPE's `cos` and `sin` for `positions` (`[B, T]` i64), `[B, 1, T, head_dim]` each,
    /// computed in f32 on the device as `transformers` does and cast to `dtype`.
    fn rotary(&self, positions: &Tensor, dtype: DType) -> Result<(Tensor, Tensor)> {
        let freqs = (&positions.cast(DType::F32).unsqueeze(-1)? * &self.inv_freq)?;
        // `cat(freqs, freqs)`: both halves of the head see the same angles.
        let angles = Tensor::cat(&[&freqs, &freqs], -1)?.unsqueeze(1)?;
        Ok((angles.cos().cast(dtype), angles.sin().cast(dtype)))
    }
}

/// `x * cos + rotate_half(x) * sin`, `rotate_half(x) = cat(-x₂, x₁)` over the halves of the
/// last dim.
fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let halves = x.split(x.dims()[3] / 2, -1)?;
    let rotated = Tensor::cat(&[&halves[1].neg()?, &halves[0]], -1)?;
    &(x * cos)? + &(&rotated * sin)?
}

impl CausalLm for Llama {
    fn forward_cached(&self, input_ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let c = &self.config;
        // The ids go where the weights are (`generate` builds them on the host).
        let device = self.model.embed_tokens.device();
        let input_ids = &input_ids.to(&device)?;
        let dtype = self.model.embed_tokens.dtype();
        let (cos, sin) = self.rotary(&cache.position_ids(&device)?, dtype)?;
        let mask = cache.attention_mask(dtype, &device)?;
        let mut x = Tensor::embedding(&self.model.embed_tokens, input_ids)?;
        for (i, layer) in self.model.layers.iter().enumerate() {
            let h = layer.input_layernorm.forward(&x)?;
            let a = &layer.self_attn;
            let q = split_heads(&a.q_proj.forward(&h)?, c.num_attention_heads, c.head_dim)?;
            let k = split_heads(&a.k_proj.forward(&h)?, c.num_key_value_heads, c.head_dim)?;
            let v = split_heads(&a.v_proj.forward(&h)?, c.num_key_value_heads, c.head_dim)?;
            let (q, k) = (apply_rotary(&q, &cos, &sin)?, apply_rotary(&k, &cos, &sin)?);
            let y = attend(cache, i, &q, k, v, mask.as_ref())?;
            x = (&x + &a.o_proj.forward(&merge_heads(&y)?)?)?;
            let h = layer.post_attention_layernorm.forward(&x)?;
            let m = &layer.mlp;
            let gated = (&m.gate_proj.forward(&h)?.silu() * &m.up_proj.forward(&h)?)?;
            x = (&x + &m.down_proj.forward(&gated)?)?;
        }
        let x = self.model.norm.forward(&x)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.model.embed_tokens);
        x.matmul(&head.t()?)
    }

    fn new_cache(&self) -> Result<KvCache> {
        KvCache::new(
            self.config.num_hidden_layers,
            self.config.max_position_embeddings,
        )
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
}
