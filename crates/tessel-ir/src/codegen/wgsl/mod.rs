//! WGSL for wgpu: the kernel IR printed as one compute shader, plus the host side of its
//! ABI (what to bind where, what goes in the uniform, how many workgroups to dispatch).
//!
//! SKELETON: the interface below is the contract between this emitter and `tessel-wgpu`.
//! The rendering itself is being written; until then `render_wgsl` returns `Unsupported`.
//!
//! # ABI
//!
//! - Bind group 0. The `k`-th `Param::Buffer` of the kernel (counting buffers only) is at
//!   `@binding(k)`, `var<storage, read>` when the parameter is read-only, else
//!   `var<storage, read_write>`. Then one `var<uniform>` at binding `buffers.len()`, always
//!   present, whose bytes [`WgslShader::uniform_bytes`] produces (dim values and the
//!   logical workgroup counts, so a grid larger than the device's per-dimension limit is
//!   split across dispatch dimensions and reassembled in the shader).
//! - Buffers hold the same bytes as on the host (little-endian, `bool` one byte, `f16` and
//!   `bf16` two); 8- and 16-bit element types are packed into `u32` words in the shader, so
//!   the backend must allocate every buffer rounded up to a multiple of 4 bytes (at least 4).

use tessel_shape::DType;

use super::CodegenError;
use crate::kernel::Kernel;
use crate::launch::LaunchArgs;

/// What the target device supports, which decides how (and whether) a kernel renders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgslTarget {
    /// `wgpu::Features::SHADER_F64`: `f64` values and buffers.
    pub f64: bool,
    /// `wgpu::Features::SHADER_INT64`: `i64`/`u64` values and buffers.
    pub int64: bool,
    /// The most workgroups per dispatch dimension (`max_compute_workgroups_per_dimension`).
    pub max_groups_per_dim: u32,
    /// The most invocations per workgroup (`max_compute_invocations_per_workgroup`).
    pub max_invocations: u32,
}

/// One buffer binding of a shader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslBuffer {
    /// The `@binding` number.
    pub binding: u32,
    /// Whether the shader only reads it (`var<storage, read>`).
    pub read_only: bool,
    /// The element dtype of the kernel parameter.
    pub dtype: DType,
}

/// A rendered shader and the host side of its ABI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslShader {
    /// The WGSL source.
    pub source: String,
    /// The compute entry point's name.
    pub entry_point: String,
    /// `@workgroup_size`.
    pub workgroup_size: [u32; 3],
    /// The buffer bindings, in kernel buffer-parameter order.
    pub buffers: Vec<WgslBuffer>,
    /// The binding of the uniform buffer.
    pub uniform_binding: u32,
    /// The uniform buffer's size in bytes (a multiple of 16).
    pub uniform_size: u32,
    /// The target's per-dimension workgroup limit the shader was rendered for.
    pub max_groups_per_dim: u32,
}

impl WgslShader {
    /// The uniform buffer's contents for one launch.
    pub fn uniform_bytes(&self, args: &LaunchArgs) -> Vec<u8> {
        let _ = args;
        vec![0; self.uniform_size as usize]
    }

    /// The workgroup counts to dispatch for one launch (each at most
    /// `max_groups_per_dim`; `[0, 0, 0]` when the grid is empty).
    pub fn dispatch(&self, args: &LaunchArgs) -> Result<[u32; 3], CodegenError> {
        let _ = args;
        Ok([0, 0, 0])
    }
}

/// Renders `kernel` as a WGSL compute shader for `target`, after verifying it.
pub fn render_wgsl(kernel: &Kernel, target: &WgslTarget) -> Result<WgslShader, CodegenError> {
    let _ = target;
    crate::verify::verify(kernel)?;
    Err(CodegenError::Unsupported {
        kernel: kernel.name.clone(),
        dialect: "wgsl",
        reason: "the WGSL emitter is not written yet".into(),
    })
}
