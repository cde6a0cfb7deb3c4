//! BERT (`BertModel`): token, position and segment embeddings, post-norm encoder layers, the
//! `[CLS]` pooler; and mean-pooled sentence embeddings as sentence-transformers computes
//! them (all-MiniLM-L6-v2 and its kin).

use std::path::Path;

use tessel_nn::{LayerNorm, Linear, Module, Weights, scaled_dot_product_attention};
use tessel_tensor::{DType, Device, Result, Tensor};

use crate::attention::{merge_heads, split_heads};
use crate::config::{Config, load_dir, unsupported};

/// The fields of a BERT `config.json` the model uses.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `intermediate_size`.
    pub intermediate_size: usize,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `type_vocab_size`: the number of segments.
    pub type_vocab_size: usize,
    /// `layer_norm_eps`.
    pub layer_norm_eps: f64,
    /// `hidden_act` is `gelu_new`/`gelu_pytorch_tanh` (tanh approximation), not `gelu`.
    pub gelu_tanh: bool,
}

impl BertConfig {
    /// Reads a BERT `config.json`.
    pub fn from_config(c: &Config) -> Result<BertConfig> {
        let act = c.str_or("hidden_act", "gelu")?;
        let gelu_tanh = match act {
            "gelu" => false,
            "gelu_new" | "gelu_pytorch_tanh" => true,
            other => {
                return Err(unsupported(
                    "Bert",
                    format!("hidden_act `{other}` is not supported (gelu and gelu_new are)"),
                ));
            }
        };
        let position = c.str_or("position_embedding_type", "absolute")?;
        if position != "absolute" {
            return Err(unsupported(
                "Bert",
                format!("position_embedding_type `{position}` is not supported yet"),
            ));
        }
        Ok(BertConfig {
            vocab_size: c.usize("vocab_size")?,
            hidden_size: c.usize("hidden_size")?,
            num_hidden_layers: c.usize("num_hidden_layers")?,
            num_attention_heads: c.usize("num_attention_heads")?,
            intermediate_size: c.usize("intermediate_size")?,
            max_position_embeddings: c.usize_or("max_position_embeddings", 512)?,
            type_vocab_size: c.usize_or("type_vocab_size", 2)?,
            layer_norm_eps: c.f64_or("layer_norm_eps", 1e-12)?,
            gelu_tanh,
        })
    }
}

#[derive(Module)]
#[allow(clippy::struct_field_names)] // Hugging Face's names.
struct Embeddings {
    word_embeddings: Tensor,
    position_embeddings: Tensor,
    token_type_embeddings: Tensor,
    #[module(rename = "LayerNorm")]
    layer_norm: LayerNorm,
}

#[derive(Module)]
struct SelfAttention {
    query: Linear,
    key: Linear,
    value: Linear,
}

/// A dense layer, then a residual add and a layer norm (`BertSelfOutput`, `BertOutput`).
#[derive(Module)]
struct DenseNorm {
    dense: Linear,
    #[module(rename = "LayerNorm")]
    layer_norm: LayerNorm,
}

impl DenseNorm {
    fn forward(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        self.layer_norm
            .forward(&(&self.dense.forward(x)? + residual)?)
    }
}

#[derive(Module)]
struct Attention {
    #[module(rename = "self")]
    self_attention: SelfAttention,
    output: DenseNorm,
}

#[derive(Module)]
struct Intermediate {
    dense: Linear,
}

#[derive(Module)]
struct Layer {
    attention: Attention,
    intermediate: Intermediate,
    output: DenseNorm,
}

#[derive(Module)]
struct Encoder {
    layer: Vec<Layer>,
}

#[derive(Module)]
struct Pooler {
    dense: Linear,
}

/// BERT's encoder (`BertModel`), weight names as in `transformers`
/// (`encoder.layer.0.attention.self.query.weight`, ...; a `bert.` prefix, as
/// `BertForMaskedLM` checkpoints have, is found by itself).
#[derive(Module)]
pub struct Bert {
    embeddings: Embeddings,
    encoder: Encoder,
    /// Absent in checkpoints saved without the pooling layer.
    pooler: Option<Pooler>,
    #[module(skip)]
    config: BertConfig,
}

/// What [`Bert::forward`] returns.
#[derive(Clone)]
pub struct BertOutput {
    /// The last layer's hidden states, `[B, T, hidden]`.
    pub last_hidden_state: Tensor,
    /// `tanh(dense(h[:, 0]))`, `[B, hidden]`, when the checkpoint has a pooler.
    pub pooler_output: Option<Tensor>,
}

fn linear(w: &Weights, inp: usize, out: usize) -> Result<Linear> {
    Linear::from_tensors(w.get("weight", &[out, inp])?, Some(w.get("bias", &[out])?))
}

fn layer_norm(w: &Weights, width: usize, eps: f64) -> Result<LayerNorm> {
    LayerNorm::from_tensors(
        Some(w.get("weight", &[width])?),
        Some(w.get("bias", &[width])?),
        eps,
    )
}

fn dense_norm(w: &Weights, inp: usize, out: usize, eps: f64) -> Result<DenseNorm> {
    Ok(DenseNorm {
        dense: linear(&w.pp("dense"), inp, out)?,
        layer_norm: layer_norm(&w.pp("LayerNorm"), out, eps)?,
    })
}

impl Bert {
    /// Loads a model directory (`config.json` + weights) with float weights as `dtype` on
    /// `device`. Heads of other tasks in the checkpoint (`cls.*`) are an error unless the
    /// weights are opened non-strict and given to [`Bert::load`].
    pub fn from_dir(dir: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Bert> {
        load_dir(
            dir.as_ref(),
            dtype,
            device,
            BertConfig::from_config,
            Bert::load,
        )
    }

    /// Builds the model from `weights`.
    pub fn load(config: &BertConfig, weights: &Weights) -> Result<Bert> {
        let c = config;
        let w = if weights.contains("bert.embeddings.word_embeddings.weight") {
            weights.pp("bert")
        } else {
            weights.clone()
        };
        let (h, eps) = (c.hidden_size, c.layer_norm_eps);
        let e = w.pp("embeddings");
        e.skip("position_ids");
        let embeddings = Embeddings {
            word_embeddings: e.get("word_embeddings.weight", &[c.vocab_size, h])?,
            position_embeddings: e.get(
                "position_embeddings.weight",
                &[c.max_position_embeddings, h],
            )?,
            token_type_embeddings: e
                .get("token_type_embeddings.weight", &[c.type_vocab_size, h])?,
            layer_norm: layer_norm(&e.pp("LayerNorm"), h, eps)?,
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let l = w.pp(&format!("encoder.layer.{i}"));
            let s = l.pp("attention.self");
            layers.push(Layer {
                attention: Attention {
                    self_attention: SelfAttention {
                        query: linear(&s.pp("query"), h, h)?,
                        key: linear(&s.pp("key"), h, h)?,
                        value: linear(&s.pp("value"), h, h)?,
                    },
                    output: dense_norm(&l.pp("attention.output"), h, h, eps)?,
                },
                intermediate: Intermediate {
                    dense: linear(&l.pp("intermediate.dense"), h, c.intermediate_size)?,
                },
                output: dense_norm(&l.pp("output"), c.intermediate_size, h, eps)?,
            });
        }
        let pooler = if w.contains("pooler.dense.weight") {
            Some(Pooler {
                dense: linear(&w.pp("pooler.dense"), h, h)?,
            })
        } else {
            None
        };
        Ok(Bert {
            embeddings,
            encoder: Encoder { layer: layers },
            pooler,
            config: c.clone(),
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Encodes `input_ids` (`[B, T]` i64); `token_type_ids` default to segment 0 and
    /// `attention_mask` (`[B, T]`, 1 for real tokens, 0 for padding; any integer or float
    /// dtype) to every token.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        token_type_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<BertOutput> {
        let c = &self.config;
        let e = &self.embeddings;
        let d = input_ids.dims();
        if d.len() != 2 || d[1] > c.max_position_embeddings {
            return Err(unsupported(
                "Bert",
                format!(
                    "input_ids must be [batch, length] with length at most {}, got {}",
                    c.max_position_embeddings,
                    input_ids.shape()
                ),
            ));
        }
        let (b, t) = (d[0], d[1]);
        let device = input_ids.device();
        let dtype = e.word_embeddings.dtype();
        let positions = Tensor::arange(0i64, t as i64, 1i64)?
            .to(&device)?
            .unsqueeze(0)?;
        let types = match token_type_ids {
            Some(tt) => tt.clone(),
            None => Tensor::zeros([b, t], DType::I64).to(&device)?,
        };
        let x = ((&Tensor::embedding(&e.word_embeddings, input_ids)?
            + &Tensor::embedding(&e.position_embeddings, &positions)?)?
            + &Tensor::embedding(&e.token_type_embeddings, &types)?)?;
        let mut x = e.layer_norm.forward(&x)?;
        // `(1 - mask) * lowest` on the keys, as `transformers` extends the mask.
        let mask = match attention_mask {
            Some(m) => {
                let hidden = (&m.cast(dtype).reshape(&[b as i64, 1, 1, t as i64])? * -1.0)? + 1.0;
                Some((&hidden? * dtype.min_value().to_f64())?)
            }
            None => None,
        };
        let heads = c.num_attention_heads;
        let head_dim = c.hidden_size / heads;
        for layer in &self.encoder.layer {
            let s = &layer.attention.self_attention;
            let q = split_heads(&s.query.forward(&x)?, heads, head_dim)?;
            let k = split_heads(&s.key.forward(&x)?, heads, head_dim)?;
            let v = split_heads(&s.value.forward(&x)?, heads, head_dim)?;
            let y = merge_heads(&scaled_dot_product_attention(
                &q,
                &k,
                &v,
                mask.as_ref(),
                0.0,
                false,
                None,
                false,
            )?)?;
            let a = layer.attention.output.forward(&y, &x)?;
            let h = layer.intermediate.dense.forward(&a)?;
            let h = if c.gelu_tanh { h.gelu_tanh() } else { h.gelu() };
            x = layer.output.forward(&h, &a)?;
        }
        let pooler_output = match &self.pooler {
            Some(p) => Some(
                p.dense
                    .forward(&x.narrow(1, 0, 1)?.squeeze(Some(&[1]))?)?
                    .tanh(),
            ),
            None => None,
        };
        Ok(BertOutput {
            last_hidden_state: x,
            pooler_output,
        })
    }

    /// Sentence embeddings as sentence-transformers computes them: the mean of the last
    /// hidden states over real tokens (`attention_mask` 1), L2-normalized, `[B, hidden]`.
    pub fn sentence_embedding(
        &self,
        input_ids: &Tensor,
        token_type_ids: Option<&Tensor>,
        attention_mask: &Tensor,
    ) -> Result<Tensor> {
        let h = self
            .forward(input_ids, token_type_ids, Some(attention_mask))?
            .last_hidden_state;
        let m = attention_mask.cast(h.dtype()).unsqueeze(-1)?;
        let summed = (&h * &m)?.sum(&[1], false)?;
        let count = m.sum(&[1], false)?.clamp(Some(1e-9), None)?;
        (&summed / &count)?.normalize(2.0, 1, 1e-12)
    }
}
