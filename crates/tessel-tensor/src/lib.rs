//! Tessel's Tensor API.
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
mod compiled;
mod dynamic;
mod element;
mod host;
pub mod inspect;
mod ops;
mod safetensors;
mod tensor;

pub use autocast::{autocast, autocast_dtype, full_precision_operand};
pub use autograd::grad;
pub use compiled::Compiled;
pub use element::Element;
pub use ops::{
    Conv1dOptions, Conv2dOptions, Conv3dOptions, ConvOptions, CustomBackward, CustomOp, Operand,
    Padding, PoolOptions, ScalarOperand,
};
pub use safetensors::{SafetensorsFile, load_safetensors, save_safetensors};
pub use tensor::Tensor;
pub use tessel_runtime::{
    BackendError, Device, DeviceInfo, DeviceKind, Error, Features, Float32MatmulPrecision,
    HostBytes, PLAN_CACHE_LIMIT, RealizeReport, Result, RuntimeStats, Tuning,
    are_deterministic_algorithms_enabled, float32_matmul_precision, set_float32_matmul_precision,
    set_placement, set_tuning, stats, tuning, use_deterministic_algorithms,
};
pub use tessel_shape::{DType, Dim, F8E4M3, F8E5M2, Shape, Var, bf16, f16};
