//! Tessel's neural-network library: layers, losses, optimizers and weight files.
//!
//! Everything here is built from [`Tensor`](tessel_tensor::Tensor) ops, so it runs on every
//! device, fuses like hand-written tensor code, and is differentiable through
//! [`Tensor::backward`](tessel_tensor::Tensor::backward).
//!
//! A layer is a plain struct holding its parameters as tensors; [`Module`] enumerates them
//! by name, so optimizers and weight files never need a hand-written list.

mod module;

pub use module::{Module, ParamKind, Visitor};
