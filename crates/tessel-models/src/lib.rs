//! Real models for Tessel, loaded from the files users have: GPT-2, BERT and Llama from a
//! Hugging Face model directory (`config.json` + `model.safetensors`, or sharded), ResNets
//! from a torchvision state dict. Weight names are Hugging Face's and torchvision's exactly,
//! so a checkpoint loads as it is.
//!
//! Every model is a plain struct of [`tessel_tensor::Tensor`]s and
//! [`tessel_nn`] layers built from `config.json` and [`Weights`]; its forward is a short
//! composition of tensor ops, so it runs on every backend and fuses like any tensor code.
//! Language models implement [`CausalLm`], which [`generate`] drives with a [`KvCache`].
//!
//! ```no_run
//! use tessel_models::{GenerateOptions, Gpt2, generate};
//! use tessel_tensor::{DType, Device};
//! # fn main() -> tessel_tensor::Result<()> {
//! let model = Gpt2::from_dir("gpt2", DType::F32, &Device::default())?;
//! let prompt = vec![464, 2068, 7586, 21831]; // "The quick brown fox", GPT-2's tokens
//! let out = generate(&model, &[prompt], &GenerateOptions::greedy(20), |_, _| {})?;
//! assert_eq!(out[0].len(), 24);
//! # Ok(())
//! # }
//! ```

mod attention;
mod bert;
mod cache;
mod config;
mod generate;
mod gpt2;
mod llama;
mod resnet;

pub use bert::{Bert, BertConfig, BertOutput};
pub use cache::KvCache;
pub use config::Config;
pub use generate::{CausalLm, GenerateOptions, Sampler, generate};
/// The end-of-sequence token of a model's `config.json`, if it names one.
pub fn eos_token_id(dir: impl AsRef<std::path::Path>) -> tessel_tensor::Result<Option<i64>> {
    Config::open(dir)?.token_id("eos_token_id")
}
pub use gpt2::{Gpt2, Gpt2Config};
pub use llama::{Llama, LlamaConfig};
pub use resnet::{ResNet, ResNetBlock, ResNetConfig};

pub use tessel_nn::Weights;
/// Hugging Face's tokenizers (`tokenizer.json`), with the `tokenizers` feature.
#[cfg(feature = "tokenizers")]
pub use tokenizers;

use std::path::Path;

use tessel_tensor::{DType, Device, Result};

/// The language model of a Hugging Face model directory, by its config's `model_type`:
/// `gpt2` is [`Gpt2`]; `llama`, `mistral` and `qwen2` are [`Llama`].
pub fn causal_lm_from_dir(
    dir: impl AsRef<Path>,
    dtype: DType,
    device: &Device,
) -> Result<Box<dyn CausalLm>> {
    let dir = dir.as_ref();
    let config = Config::open(dir)?;
    match config.str_or("model_type", "")? {
        "gpt2" => Ok(Box::new(Gpt2::from_dir(dir, dtype, device)?)),
        "llama" | "mistral" | "qwen2" => Ok(Box::new(Llama::from_dir(dir, dtype, device)?)),
        other => Err(tessel_tensor::Error::InvalidArgument {
            op: "causal_lm_from_dir",
            reason: format!(
                "{}: model_type `{other}` is not a language model Tessel has (gpt2, llama, mistral, qwen2)",
                config.path().display()
            ),
        }),
    }
}
