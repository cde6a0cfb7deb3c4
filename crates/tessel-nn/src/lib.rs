//! Tessel's neural-network library: layers, losses, optimizers and weight files.
//!
//! Everything here is built from [`Tensor`](tessel_tensor::Tensor) ops, so it runs on every
//! device, fuses like hand-written tensor code, and is differentiable through
//! [`Tensor::backward`](tessel_tensor::Tensor::backward).
//!
//! A layer is a plain struct holding its parameters as tensors; [`Module`] enumerates them
//! by name, so optimizers and weight files never need a hand-written list.

mod module;

// The derive's generated code names `::tessel_nn`, also inside this crate.
extern crate self as tessel_nn;

pub use module::{Module, ParamKind, VisitField, Visitor};
/// `#[derive(Module)]`: [`Module::visit`] from the struct's fields (see [`VisitField`]).
pub use tessel_nn_derive::Module;

pub mod amp;
mod io;
pub mod optim;
mod pending;
mod weights;

pub use io::{load, save};
pub use weights::{LoadReport, Weights};

pub mod init;
mod layers;
pub mod loss;

pub use init::ParamOptions;
pub use layers::{
    AttentionMasks, AvgPool1d, AvgPool2d, BatchNorm1d, BatchNorm2d, BatchNormOptions, Conv1d,
    Conv2d, Dropout, Embedding, Flatten, Forward, GELU, GeluApproximate, LayerNorm, Linear,
    MaxPool1d, MaxPool2d, MultiHeadAttention, MultiheadAttention, RMSNorm, ReLU, Sequential, SiLU,
    Sigmoid, Tanh, batch_norm, layer_norm, rms_norm, scaled_dot_product_attention,
};
