//! GPT-2 (`GPT2LMHeadModel`): learned positions, pre-norm blocks, `gelu_new`, and the
//! language-model head tied to the token embedding.

use std::path::Path;

use tessel_nn::{LayerNorm, Module, Weights};
use tessel_tensor::{DType, Device, Result, Tensor};

use crate::attention::{attend, merge_heads, split_heads};
use crate::cache::KvCache;
use crate::config::{Config, load_dir, unsupported};
use crate::generate::CausalLm;

/// The fields of a GPT-2 `config.json` the model uses.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Config {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `n_positions`: the longest sequence.
    pub n_positions: usize,
    /// `n_embd`: the width.
    pub n_embd: usize,
    /// `n_layer`.
    pub n_layer: usize,
    /// `n_head`.
    pub n_head: usize,
    /// `n_inner` (default `4 * n_embd`).
    pub n_inner: usize,
    /// `layer_norm_epsilon`.
    pub layer_norm_epsilon: f64,
    /// `eos_token_id`, if any.
    pub eos_token_id: Option<i64>,
}

impl Gpt2Config {
    /// Reads a GPT-2 `config.json`; configs the model does not implement
    /// (`scale_attn_by_inverse_layer_idx`, another activation) are an error.
    pub fn from_config(c: &Config) -> Result<Gpt2Config> {
        const OP: &str = "Gpt2";
        let n_embd = c.usize("n_embd")?;
        let activation = c.str_or("activation_function", "gelu_new")?;
        if !matches!(activation, "gelu_new" | "gelu_pytorch_tanh") {
            return Err(unsupported(
                OP,
                format!("activation_function `{activation}` is not supported (gelu_new is)"),
            ));
        }
        for key in [
            "scale_attn_by_inverse_layer_idx",
            "reorder_and_upcast_attn",
            "add_cross_attention",
        ] {
            if c.bool_or(key, false)? {
                return Err(unsupported(
                    OP,
                    format!("`{key}: true` is not supported yet"),
                ));
            }
        }
        if !c.bool_or("scale_attn_weights", true)? {
            return Err(unsupported(
                OP,
                "`scale_attn_weights: false` is not supported yet".into(),
            ));
        }
        Ok(Gpt2Config {
            vocab_size: c.usize("vocab_size")?,
            n_positions: c.usize_or("n_positions", 1024)?,
            n_embd,
            n_layer: c.usize("n_layer")?,
            n_head: c.usize("n_head")?,
            n_inner: c.usize_or("n_inner", 4 * n_embd)?,
            layer_norm_epsilon: c.f64_or("layer_norm_epsilon", 1e-5)?,
            eos_token_id: c.token_id("eos_token_id")?,
        })
    }
}

/// GPT-2's `Conv1D`: a linear layer whose weight is stored `[in, out]`.
#[derive(Module)]
struct Conv1D {
    weight: Tensor,
    bias: Tensor,
}

impl Conv1D {
    fn load(w: &Weights, inp: usize, out: usize) -> Result<Conv1D> {
        Ok(Conv1D {
            weight: w.get("weight", &[inp, out])?,
            bias: w.get("bias", &[out])?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        &x.matmul(&self.weight)? + &self.bias
    }
}

#[derive(Module)]
struct Attention {
    c_attn: Conv1D,
    c_proj: Conv1D,
}

#[derive(Module)]
struct Mlp {
    c_fc: Conv1D,
    c_proj: Conv1D,
}

#[derive(Module)]
struct Block {
    ln_1: LayerNorm,
    attn: Attention,
    ln_2: LayerNorm,
    mlp: Mlp,
}

/// The transformer under the head (`GPT2Model`).
#[derive(Module)]
struct Transformer {
    wte: Tensor,
    wpe: Tensor,
    h: Vec<Block>,
    ln_f: LayerNorm,
}

/// GPT-2 with its language-model head (`GPT2LMHeadModel`), weight names as in
/// `transformers` (`transformer.h.0.attn.c_attn.weight`, ...).
#[derive(Module)]
pub struct Gpt2 {
    transformer: Transformer,
    /// `lm_head.weight` when the checkpoint stores its own; else the head is `wte`.
    #[module(rename = "lm_head.weight")]
    lm_head: Option<Tensor>,
    #[module(skip)]
    config: Gpt2Config,
}

fn layer_norm(w: &Weights, width: usize, eps: f64) -> Result<LayerNorm> {
    LayerNorm::from_tensors(
        Some(w.get("weight", &[width])?),
        Some(w.get("bias", &[width])?),
        eps,
    )
}

impl Gpt2 {
    /// Loads a model directory (`config.json` + weights) with float weights as `dtype` on
    /// `device`.
    pub fn from_dir(dir: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Gpt2> {
        load_dir(
            dir.as_ref(),
            dtype,
            device,
            Gpt2Config::from_config,
            Gpt2::load,
        )
    }

    /// Builds the model from `weights` (names with or without the `transformer.` prefix, as
    /// the original `gpt2` checkpoint stores them).
    pub fn load(config: &Gpt2Config, weights: &Weights) -> Result<Gpt2> {
        let c = config;
        let t = if weights.contains("transformer.wte.weight") {
            weights.pp("transformer")
        } else {
            weights.clone()
        };
        let eps = c.layer_norm_epsilon;
        let mut h = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let b = t.pp(&format!("h.{i}"));
            // Old checkpoints store the causal mask as buffers; it is rebuilt, not read.
            b.skip("attn.bias");
            b.skip("attn.masked_bias");
            h.push(Block {
                ln_1: layer_norm(&b.pp("ln_1"), c.n_embd, eps)?,
                attn: Attention {
                    c_attn: Conv1D::load(&b.pp("attn.c_attn"), c.n_embd, 3 * c.n_embd)?,
                    c_proj: Conv1D::load(&b.pp("attn.c_proj"), c.n_embd, c.n_embd)?,
                },
                ln_2: layer_norm(&b.pp("ln_2"), c.n_embd, eps)?,
                mlp: Mlp {
                    c_fc: Conv1D::load(&b.pp("mlp.c_fc"), c.n_embd, c.n_inner)?,
                    c_proj: Conv1D::load(&b.pp("mlp.c_proj"), c.n_inner, c.n_embd)?,
                },
            });
        }
        let transformer = Transformer {
            wte: t.get("wte.weight", &[c.vocab_size, c.n_embd])?,
            wpe: t.get("wpe.weight", &[c.n_positions, c.n_embd])?,
            h,
            ln_f: layer_norm(&t.pp("ln_f"), c.n_embd, eps)?,
        };
        let lm_head = if weights.contains("lm_head.weight") {
            Some(weights.get("lm_head.weight", &[c.vocab_size, c.n_embd])?)
        } else {
            None
        };
        Ok(Gpt2 {
            transformer,
            lm_head,
            config: c.clone(),
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &Gpt2Config {
        &self.config
    }

    /// The logits `[B, T, vocab]` of `input_ids` (`[B, T]` i64), every token attended.
    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        let mut cache = KvCache::new(self.config.n_layer, self.config.n_positions)?;
        let d = input_ids.dims();
        cache.begin(vec![vec![true; d[1]]; d[0]])?;
        self.forward_cached(input_ids, &mut cache)
    }
}

impl CausalLm for Gpt2 {
    fn forward_cached(&self, input_ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let c = &self.config;
        let t = &self.transformer;
        // The ids go where the weights are (`generate` builds them on the host).
        let device = t.wte.device();
        let input_ids = &input_ids.to(&device)?;
        let dtype = t.wte.dtype();
        let positions = cache.position_ids(&device)?;
        let mut x =
            (&Tensor::embedding(&t.wte, input_ids)? + &Tensor::embedding(&t.wpe, &positions)?)?;
        let mask = cache.attention_mask(dtype, &device)?;
        let head_dim = c.n_embd / c.n_head;
        for (i, block) in t.h.iter().enumerate() {
            let h = block.ln_1.forward(&x)?;
            let qkv = block.attn.c_attn.forward(&h)?.split(c.n_embd, -1)?;
            let [q, k, v] = [0, 1, 2].map(|j| split_heads(&qkv[j], c.n_head, head_dim));
            let y = attend(cache, i, &q?, k?, v?, mask.as_ref())?;
            x = (&x + &block.attn.c_proj.forward(&merge_heads(&y)?)?)?;
            let h = block.ln_2.forward(&x)?;
            let h = block.mlp.c_fc.forward(&h)?.gelu_tanh();
            x = (&x + &block.mlp.c_proj.forward(&h)?)?;
        }
        let x = t.ln_f.forward(&x)?;
        let head = self.lm_head.as_ref().unwrap_or(&t.wte);
        x.matmul(&head.t()?)
    }

    fn new_cache(&self) -> Result<KvCache> {
        KvCache::new(self.config.n_layer, self.config.n_positions)
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
}
