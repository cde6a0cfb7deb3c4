//! Tessel: write tensor code once, PyTorch-style, and run it fast on whatever hardware is
//! present.
//!
//! ```
//! use tessel::prelude::*;
//!
//! # fn main() -> tessel::Result<()> {
//! Tensor::manual_seed(0);
//! let x = Tensor::randn([4, 8], DType::F32)?;
//! let w = Tensor::randn([8, 3], DType::F32)?;
//! let y = (x.matmul(&w)? + 1.0)?.relu().softmax(-1)?;
//! let rows: Vec<f32> = y.sum(&[-1], false)?.to_vec()?;
//! assert!(rows.iter().all(|s| (s - 1.0).abs() < 1e-5));
//! # Ok(())
//! # }
//! ```
//!
//! Work is recorded lazily; reading data (`to_vec`, `item`, `Display`) or
//! [`Tensor::realize`] fuses the recorded ops into kernels, compiles them for the tensor's
//! device (cached) and runs them. See the user guide in `docs/GUIDE.md`.
//!
//! # Feature flags
//! - `cpu` (default): the embedded CPU backend. It compiles generated C with the system C
//!   compiler (`$TESSEL_CC`, else `cc`, `gcc`, `clang`) and falls back to the reference
//!   interpreter when none is found.
//! - `opencl`: the OpenCL backend (`Device::opencl(i)`). The OpenCL library is loaded at run
//!   time; without a driver the backend has no devices.
//! - `cuda`: the CUDA backend (`Device::cuda(i)`): CUDA C compiled by NVRTC for the GPU's
//!   exact architecture, run through the driver API. `libcuda` and NVRTC are loaded at run
//!   time, so it builds without the CUDA toolkit; without a driver it has no devices.
//! - `wgpu`: the wgpu backend (`Device::wgpu(i)`): WGSL on Vulkan, Metal or DX12.
//!   Without an adapter it has no devices.
//!
//! `TESSEL_DEVICE` (`cpu`, `cuda`, `wgpu`, `opencl:1`, ...) picks the device new tensors are
//! created on.

pub use tessel_tensor::{
    BackendError, Compiled, Conv1dOptions, Conv2dOptions, Conv3dOptions, ConvOptions,
    CustomBackward, CustomOp, DType, Device, DeviceInfo, DeviceKind, Dim, Element, Error, Features,
    Float32MatmulPrecision, Operand, PLAN_CACHE_LIMIT, Padding, PoolOptions, RealizeReport, Result,
    RuntimeStats, ScalarOperand, Shape, Tensor, Tuning, Var, are_deterministic_algorithms_enabled,
    autocast, autocast_dtype, bf16, f16, float32_matmul_precision, inspect,
    set_float32_matmul_precision, set_placement, set_tuning, stats, tuning,
    use_deterministic_algorithms,
};

/// Data-parallel training across processes: process groups, collectives,
/// `DistributedDataParallel`.
pub use tessel_distributed as distributed;
/// GPT-2, BERT, Llama and ResNet from Hugging Face and torchvision files; generation.
pub use tessel_models as models;
/// Layers, losses, optimizers and weight files.
pub use tessel_nn as nn;
pub use tessel_tensor::{grad, load_safetensors, save_safetensors};

/// The kernel IR, for writing custom kernels and inspecting generated ones.
pub use tessel_ir as ir;
/// The symbolic layer: dtypes, scalar semantics, symbolic dims, shape rules.
pub use tessel_shape as shape;

/// The names most programs need: `use tessel::prelude::*;`.
pub mod prelude {
    pub use tessel_nn::optim::Optimizer;
    pub use tessel_nn::{Forward, Module};
    pub use tessel_tensor::{DType, Device, Error, Result, Tensor};
}
