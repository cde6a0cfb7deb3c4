//! Encoding and submitting one kernel launch, and timing it.

use std::time::{Duration, Instant};

use tessel_ir::codegen::CodegenError;
use tessel_ir::{BackendError, LaunchArgs};
use wgpu::util::DeviceExt;

use crate::device::GpuDevice;
use crate::memory::{DeviceBuffer, padded};
use crate::programs::Pipeline;

/// The two timestamps of a timed launch: where they are resolved, and the mappable copy.
struct Timestamps {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
}

/// A submitted launch.
pub(crate) struct Submitted {
    index: wgpu::SubmissionIndex,
    timestamps: Option<Timestamps>,
}

/// Encodes one compute pass running `pipeline` over `buffers` with `args`, and submits it;
/// `None` when the dispatch is empty (nothing runs). With `timed` and a device that has
/// timestamp queries, the pass records its start and end.
pub(crate) fn submit(
    dev: &GpuDevice,
    kernel: &str,
    pipeline: &Pipeline,
    buffers: &[&DeviceBuffer],
    args: &LaunchArgs,
    timed: bool,
) -> Result<Option<Submitted>, BackendError> {
    dev.check()?;
    let fail = |reason: String| BackendError::Launch {
        kernel: kernel.to_owned(),
        reason,
    };
    if args.groups == 0 || args.grid[3..].contains(&0) {
        return clear_only(dev, kernel, buffers, args);
    }
    let shader = &pipeline.shader;
    let [x, y, z] = shader.dispatch(args).map_err(|e| match e {
        CodegenError::Unsupported { reason, .. } => fail(reason),
        other => fail(other.to_string()),
    })?;
    if x == 0 || y == 0 || z == 0 {
        return clear_only(dev, kernel, buffers, args);
    }
    let max_binding = dev.limits.max_storage_buffer_binding_size;
    if let Some(b) = buffers.iter().find(|b| padded(b.bytes) > max_binding) {
        return Err(fail(format!(
            "a buffer of {} bytes is larger than the {max_binding} bytes one kernel may bind \
             on {} (max_storage_buffer_binding_size); split the tensor",
            b.bytes, dev.info.name
        )));
    }
    // One buffer bound to a read-only and another parameter needs the all-writable variant.
    let aliased = buffers.iter().enumerate().any(|(k, b)| {
        buffers[..k]
            .iter()
            .zip(&shader.buffers)
            .any(|(other, binding)| {
                std::ptr::eq(*other, *b)
                    && (binding.read_only || shader.buffers.get(k).is_some_and(|b| b.read_only))
            })
    });
    let compiled = if aliased {
        pipeline.aliased(dev, kernel)?
    } else {
        &pipeline.exact
    };
    let mut contents = shader.uniform_bytes(args);
    // A uniform binding is never empty, and its size is a multiple of 16.
    contents.resize(contents.len().max(16).next_multiple_of(16), 0);
    let oom = || BackendError::OutOfMemory {
        device: dev.info.name.clone(),
        requested: contents.len(),
    };
    let uniform = pipeline.uniform(&contents, || {
        let (uniform, error) = dev.scoped(|| {
            dev.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("tessel launch uniform"),
                    contents: &contents,
                    usage: wgpu::BufferUsages::UNIFORM,
                })
        });
        match error {
            None => Ok(uniform),
            Some(wgpu::Error::OutOfMemory { .. }) => Err(oom()),
            Some(e) => Err(fail(e.to_string())),
        }
    })?;
    let ((index, timestamps), error) = dev.scoped(|| {
        let timestamps = (timed && dev.details.timestamps).then(|| timestamps(dev));
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = shader
            .buffers
            .iter()
            .zip(buffers)
            .map(|(binding, b)| wgpu::BindGroupEntry {
                binding: binding.binding,
                resource: b.binding(),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: shader.uniform_binding,
            resource: uniform.as_entire_binding(),
        });
        let bind_group = dev.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel),
            layout: &compiled.layout,
            entries: &entries,
        });
        let mut encoder = dev
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some(kernel),
            });
        clear(&mut encoder, buffers, args);
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(kernel),
                timestamp_writes: timestamps
                    .as_ref()
                    .map(|t| wgpu::ComputePassTimestampWrites {
                        query_set: &t.queries,
                        beginning_of_pass_write_index: Some(0),
                        end_of_pass_write_index: Some(1),
                    }),
            });
            pass.set_pipeline(&compiled.compute);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(x, y, z);
        }
        if let Some(t) = &timestamps {
            encoder.resolve_query_set(&t.queries, 0..2, &t.resolved, 0);
            encoder.copy_buffer_to_buffer(&t.resolved, 0, &t.readback, 0, 16);
        }
        (dev.queue.submit([encoder.finish()]), timestamps)
    });
    match error {
        None => Ok(Some(Submitted { index, timestamps })),
        Some(wgpu::Error::OutOfMemory { .. }) => Err(oom()),
        Some(e) => Err(fail(e.to_string())),
    }
}

/// Zeroes the launch's accumulated buffers (`Access::Accumulate`) ahead of its dispatch.
fn clear(encoder: &mut wgpu::CommandEncoder, buffers: &[&DeviceBuffer], args: &LaunchArgs) {
    for &(j, bytes) in &args.zeroed {
        // Accumulated elements are 32-bit, so the size is a multiple of the copy alignment.
        let size = (bytes as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        encoder.clear_buffer(&buffers[j].buffer, 0, Some(size));
    }
}

/// A launch that runs no invocation still zeroes its accumulated buffers.
fn clear_only(
    dev: &GpuDevice,
    kernel: &str,
    buffers: &[&DeviceBuffer],
    args: &LaunchArgs,
) -> Result<Option<Submitted>, BackendError> {
    if args.zeroed.is_empty() {
        return Ok(None);
    }
    let ((), error) = dev.scoped(|| {
        let mut encoder = dev
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some(kernel),
            });
        clear(&mut encoder, buffers, args);
        dev.queue.submit([encoder.finish()]);
    });
    match error {
        None => Ok(None),
        Some(e) => Err(BackendError::Launch {
            kernel: kernel.to_owned(),
            reason: e.to_string(),
        }),
    }
}

fn timestamps(dev: &GpuDevice) -> Timestamps {
    let buffer = |label, usage| {
        dev.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: 2 * wgpu::QUERY_SIZE as u64,
            usage,
            mapped_at_creation: false,
        })
    };
    Timestamps {
        queries: dev.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("tessel timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        }),
        resolved: buffer(
            "tessel timestamps resolved",
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        ),
        readback: buffer(
            "tessel timestamps readback",
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        ),
    }
}

/// Runs a launch to completion and measures it: between the pass's two device timestamps
/// where the device has them, else on the host's clock from submission to completion (after
/// first waiting for earlier work, so that only this launch is counted).
pub(crate) fn time(
    dev: &GpuDevice,
    launch: impl FnOnce() -> Result<Option<Submitted>, BackendError>,
) -> Result<Duration, BackendError> {
    if !dev.details.timestamps {
        dev.wait(None)?;
    }
    let started = Instant::now();
    let Some(submitted) = launch()? else {
        return Ok(Duration::ZERO);
    };
    let Some(t) = submitted.timestamps else {
        dev.wait(Some(submitted.index))?;
        return Ok(started.elapsed());
    };
    dev.map_read(&t.readback, submitted.index)?;
    let ticks = t
        .readback
        .get_mapped_range(..)
        .map(|view| {
            let word = |k: usize| {
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(&view[8 * k..8 * k + 8]);
                u64::from_le_bytes(bytes)
            };
            word(1).saturating_sub(word(0))
        })
        .map_err(|e| dev.lost(format!("reading the timestamps failed: {e}")))?;
    t.readback.unmap();
    let period = f64::from(dev.queue.get_timestamp_period());
    Ok(Duration::from_nanos((ticks as f64 * period).round() as u64))
}
