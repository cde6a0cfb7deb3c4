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
pub use gpt2::{Gpt2, Gpt2Config};
pub use llama::{Llama, LlamaConfig};
pub use resnet::{ResNet, ResNetBlock, ResNetConfig};

pub use tessel_nn::Weights;
