//! Compiling WGSL into compute pipelines, and the bounded cache of built ones.
//!
//! A pipeline is built for one device from one shader, so the cache is keyed by the device
//! and a hash of the WGSL source; the source is kept and compared on a hit, so a hash
//! collision costs a rebuild, never a wrong kernel. Two kernels that render to the same
//! source share one pipeline. Entries are evicted least recently used first; a live
//! `ProgramId` holds its own reference, so eviction never invalidates one.

use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use tessel_ir::BackendError;
use tessel_ir::cache::BuiltCache;
use tessel_ir::codegen::WgslShader;

use crate::device::GpuDevice;

/// A compute pipeline with the bind group layout its launches bind against.
pub(crate) struct Compiled {
    pub(crate) compute: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
}

/// A shader built for one device.
pub(crate) struct Pipeline {
    pub(crate) shader: WgslShader,
    /// As rendered: read-only buffers are `var<storage, read>`.
    pub(crate) exact: Compiled,
    /// Every buffer `read_write`, built on the first launch that needs it (see
    /// [`Pipeline::aliased`]).
    aliased: OnceLock<Result<Compiled, BackendError>>,
    /// Uniform buffers of earlier launches, by contents, least recently used first (see
    /// [`Pipeline::uniform`]).
    uniforms: Mutex<VecDeque<(Vec<u8>, wgpu::Buffer)>>,
}

/// Uniform buffers kept per pipeline: launches repeat the same grid and dims (a tensor
/// program realized again), so a few cover them.
const UNIFORMS_PER_PIPELINE: usize = 16;

impl Pipeline {
    /// A uniform buffer holding `contents`: one an earlier launch created, or a new one from
    /// `create`, kept for later launches. Such a buffer is never written after it is
    /// created, so any number of queued launches can bind it; launches with the same grid
    /// and dims create no buffer.
    pub(crate) fn uniform<E>(
        &self,
        contents: &[u8],
        create: impl FnOnce() -> Result<wgpu::Buffer, E>,
    ) -> Result<wgpu::Buffer, E> {
        let mut uniforms = self.uniforms.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = uniforms.iter().position(|(bytes, _)| bytes == contents) {
            let entry = uniforms.remove(at).expect("found above");
            let buffer = entry.1.clone();
            uniforms.push_back(entry);
            return Ok(buffer);
        }
        let buffer = create()?;
        if uniforms.len() >= UNIFORMS_PER_PIPELINE {
            uniforms.pop_front();
        }
        uniforms.push_back((contents.to_vec(), buffer.clone()));
        Ok(buffer)
    }

    /// The pipeline for a launch that binds one buffer to a read-only and another parameter:
    /// wgpu forbids a buffer being read-only and writable storage in one dispatch, but allows
    /// it twice writable, so this variant declares every buffer `read_write` (the shader
    /// still only reads the read-only ones). Built once, on first use.
    pub(crate) fn aliased(&self, dev: &GpuDevice, kernel: &str) -> Result<&Compiled, BackendError> {
        self.aliased
            .get_or_init(|| {
                let source = self
                    .shader
                    .source
                    .replace("var<storage, read>", "var<storage, read_write>");
                let writable = vec![false; self.shader.buffers.len()];
                compile(dev, kernel, &self.shader, &source, &writable)
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// Built pipelines by device and shader source (see [`BuiltCache`]).
pub(crate) type PipelineCache = BuiltCache<Pipeline>;

/// A [`PipelineCache`] of at most `capacity` pipelines.
pub(crate) fn pipeline_cache(capacity: usize) -> PipelineCache {
    BuiltCache::new(capacity, |p| &p.shader.source)
}

/// Checks what the device's limits decide before building: the number of buffers and the
/// workgroup size.
pub(crate) fn check_limits(
    dev: &GpuDevice,
    kernel: &str,
    shader: &WgslShader,
) -> Result<(), BackendError> {
    let unsupported = |what: String| BackendError::Unsupported {
        backend: "wgpu",
        what: format!("kernel `{kernel}` on {}: {what}", dev.info.name),
    };
    let buffers = shader.buffers.len() as u64;
    let max = dev.limits.max_storage_buffers_per_shader_stage;
    if buffers > u64::from(max) {
        return Err(unsupported(format!(
            "binds {buffers} storage buffers, and the device allows {max} per kernel; split \
             the kernel (fuse less)"
        )));
    }
    let [x, y, z] = shader.workgroup_size;
    let fits = [x, y, z]
        .iter()
        .zip(dev.info.max_local_size)
        .all(|(&size, max)| size <= max);
    let total = u64::from(x) * u64::from(y) * u64::from(z);
    if !fits || total > u64::from(dev.info.max_workgroup_size) {
        return Err(unsupported(format!(
            "workgroups of ({x}, {y}, {z}) invocations exceed the device's limits of {:?} per \
             axis and {} in all",
            dev.info.max_local_size, dev.info.max_workgroup_size
        )));
    }
    Ok(())
}

/// Builds `shader` on `dev`: the shader module, an explicit bind group layout (the storage
/// buffers, read-only where the kernel only reads them, then the uniform), and the compute
/// pipeline. A failure is [`BackendError::Compile`] with the WGSL and wgpu's message (naga's
/// diagnostic, with the offending line, for a shader it rejects).
pub(crate) fn build(
    dev: &GpuDevice,
    kernel: &str,
    shader: WgslShader,
) -> Result<Pipeline, BackendError> {
    let started = Instant::now();
    let read_only: Vec<bool> = shader.buffers.iter().map(|b| b.read_only).collect();
    let exact = compile(dev, kernel, &shader, &shader.source, &read_only)?;
    tracing::debug!(kernel, elapsed = ?started.elapsed(), device = %dev.info.name, "tessel-wgpu: pipeline built");
    Ok(Pipeline {
        shader,
        exact,
        aliased: OnceLock::new(),
        uniforms: Mutex::default(),
    })
}

/// Builds `source` with the bindings of `shader`, buffer `k` read-only where `read_only[k]`.
fn compile(
    dev: &GpuDevice,
    kernel: &str,
    shader: &WgslShader,
    source: &str,
    read_only: &[bool],
) -> Result<Compiled, BackendError> {
    dev.check()?;
    let fail = |log: String| BackendError::Compile {
        kernel: kernel.to_owned(),
        code: source.to_owned(),
        log,
    };
    let (module, error) = dev.scoped(|| {
        dev.device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(kernel),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            })
    });
    if let Some(e) = error {
        return Err(fail(format!("creating the shader module failed: {e}")));
    }
    let visibility = wgpu::ShaderStages::COMPUTE;
    let mut entries: Vec<wgpu::BindGroupLayoutEntry> = shader
        .buffers
        .iter()
        .zip(read_only)
        .map(|(b, &read_only)| wgpu::BindGroupLayoutEntry {
            binding: b.binding,
            visibility,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    entries.push(wgpu::BindGroupLayoutEntry {
        binding: shader.uniform_binding,
        visibility,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: NonZeroU64::new(u64::from(shader.uniform_size)),
        },
        count: None,
    });
    let ((layout, compute), error) = dev.scoped(|| {
        let layout = dev
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(kernel),
                entries: &entries,
            });
        let pipeline_layout = dev
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(kernel),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let compute = dev
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(kernel),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(&shader.entry_point),
                // Zeroed workgroup memory, as the reference interpreter's local memory is.
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            });
        (layout, compute)
    });
    if let Some(e) = error {
        return Err(fail(format!("creating the compute pipeline failed: {e}")));
    }
    Ok(Compiled { compute, layout })
}
