//! Tessel's Tensor API and runtime.
//!
//! [`Tensor`] is a lazy handle: ops record nodes of one process-wide graph and check
//! shapes and dtypes as they are called; reading data or [`Tensor::realize`] kernelizes the
//! needed subgraph, compiles (or replays a cached plan) and runs it on the tensor's
//! [`Device`].
//!
//! **Architecture Invariant:** no tensor op computes anything itself: every op is a graph
//! node, and every value is computed by a kernel the kernelizer built.

mod autocast;
mod autograd;
mod determinism;
mod device;
mod dynamic;
mod element;
mod error;
mod host;
pub mod inspect;
mod measure;
mod ops;
mod plan_cache;
mod planner;
mod precision;
mod program;
mod progress;
mod runtime;
mod safetensors;
mod tensor;
mod tuning;

pub use autocast::{autocast, autocast_dtype, full_precision_operand};
pub use autograd::grad;
pub use determinism::{are_deterministic_algorithms_enabled, use_deterministic_algorithms};
pub use device::Device;
pub use element::Element;
pub use error::{Error, Result};
pub use host::HostBytes;
pub use ops::{
    Conv1dOptions, Conv2dOptions, Conv3dOptions, ConvOptions, Operand, Padding, PoolOptions,
    ScalarOperand,
};
pub use planner::set_placement;
pub use precision::{
    Float32MatmulPrecision, float32_matmul_precision, set_float32_matmul_precision,
};
pub use runtime::{PLAN_CACHE_LIMIT, RealizeReport, RuntimeStats, stats};
pub use safetensors::{SafetensorsFile, load_safetensors, save_safetensors};
pub use tensor::Tensor;
pub use tessel_ir::{BackendError, DeviceInfo, DeviceKind, Features};
pub use tessel_shape::{DType, Dim, F8E4M3, F8E5M2, Shape, Var, bf16, f16};
pub use tuning::{Tuning, set_tuning, tuning};
