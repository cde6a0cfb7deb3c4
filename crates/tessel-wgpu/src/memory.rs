//! Device buffers: allocation, and the transfers between them and the host.
//!
//! wgpu moves buffer data in 4-byte words (`COPY_BUFFER_ALIGNMENT`), while a tensor's bytes
//! may start and end anywhere. Every buffer is therefore allocated rounded up to a multiple
//! of 4 (at least 4: the WGSL ABI packs 8- and 16-bit elements into `u32` words, so a
//! shader touches whole words), and a transfer whose ends are not word-aligned reads the
//! boundary words back and merges them on the host.

use std::sync::{Mutex, PoisonError};

use tessel_ir::BackendError;

use crate::device::GpuDevice;

/// A live buffer.
pub(crate) struct DeviceBuffer {
    pub(crate) device: usize,
    /// The size asked for; the wgpu buffer is [`padded`] bytes.
    pub(crate) bytes: usize,
    pub(crate) buffer: wgpu::Buffer,
    /// Held by the read-modify-write of unaligned transfers, so that two of them on
    /// neighbouring bytes of one word do not undo each other.
    merge: Mutex<()>,
}

/// `bytes` rounded up to whole words, at least one (`u64::MAX` when that overflows, which
/// no device allows).
pub(crate) fn padded(bytes: usize) -> u64 {
    u64::try_from(bytes.max(1))
        .ok()
        .and_then(|b| b.checked_next_multiple_of(4))
        .unwrap_or(u64::MAX)
}

fn align_down(n: usize) -> usize {
    n & !3
}

/// A storage buffer of `bytes` on `dev`, zero-filled (wgpu initializes on first use).
pub(crate) fn alloc(
    dev: &GpuDevice,
    device: usize,
    bytes: usize,
) -> Result<DeviceBuffer, BackendError> {
    dev.check()?;
    let oom = || BackendError::OutOfMemory {
        device: dev.info.name.clone(),
        requested: bytes,
    };
    let size = padded(bytes);
    // wgpu rejects a larger buffer as a validation error; to the caller it is memory.
    if size > dev.limits.max_buffer_size {
        return Err(oom());
    }
    let (buffer, error) = dev.scoped(|| {
        dev.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tessel buffer"),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    });
    match error {
        None => Ok(DeviceBuffer {
            device,
            bytes,
            buffer,
            merge: Mutex::new(()),
        }),
        Some(wgpu::Error::OutOfMemory { .. }) => Err(oom()),
        Some(e) => {
            // Nothing but the size can be wrong with this descriptor, and the size was
            // checked: the driver refused the memory in its own way.
            tracing::debug!("tessel-wgpu: allocating {bytes} bytes failed: {e}");
            Err(oom())
        }
    }
}

/// Copies `data` into `b` at byte `offset` (in range: checked by the caller). Queued: later
/// commands on the device see it.
pub(crate) fn write(
    dev: &GpuDevice,
    b: &DeviceBuffer,
    offset: usize,
    data: &[u8],
) -> Result<(), BackendError> {
    dev.check()?;
    let end = offset + data.len();
    let (start, stop) = (align_down(offset), end.next_multiple_of(4));
    if start == offset && stop == end {
        return queue_write(dev, b, offset, data);
    }
    // Unaligned: the words at either end also hold bytes that must stay as they are.
    let _merge = b.merge.lock().unwrap_or_else(PoisonError::into_inner);
    let mut words = vec![0u8; stop - start];
    let head = start;
    let tail = stop - 4;
    let ends: &[usize] = if head == tail { &[head] } else { &[head, tail] };
    let old = read_ranges(dev, b, ends, 4)?;
    words[..4].copy_from_slice(&old[..4]);
    let len = words.len();
    words[len - 4..].copy_from_slice(&old[old.len() - 4..]);
    words[offset - start..end - start].copy_from_slice(data);
    queue_write(dev, b, start, &words)
}

fn queue_write(
    dev: &GpuDevice,
    b: &DeviceBuffer,
    offset: usize,
    data: &[u8],
) -> Result<(), BackendError> {
    let ((), error) = dev.scoped(|| dev.queue.write_buffer(&b.buffer, offset as u64, data));
    match error {
        None => Ok(()),
        Some(wgpu::Error::OutOfMemory { .. }) => Err(BackendError::OutOfMemory {
            device: dev.info.name.clone(),
            requested: data.len(),
        }),
        Some(e) => Err(dev.lost(format!("queue.write_buffer failed: {e}"))),
    }
}

/// Fills `out` from `b` at byte `offset` (in range: checked by the caller), after all work
/// submitted before.
pub(crate) fn read(
    dev: &GpuDevice,
    b: &DeviceBuffer,
    offset: usize,
    out: &mut [u8],
) -> Result<(), BackendError> {
    if out.is_empty() {
        // Nothing to copy, but the caller may rely on the wait.
        return dev.wait(None);
    }
    let start = align_down(offset);
    let stop = (offset + out.len()).next_multiple_of(4);
    let words = read_ranges(dev, b, &[start], stop - start)?;
    out.copy_from_slice(&words[offset - start..offset - start + out.len()]);
    Ok(())
}

/// The `len` bytes at each of `starts` in `b` (word-aligned, in bounds), concatenated: one
/// copy each into a mappable staging buffer, one submission, one wait.
fn read_ranges(
    dev: &GpuDevice,
    b: &DeviceBuffer,
    starts: &[usize],
    len: usize,
) -> Result<Vec<u8>, BackendError> {
    dev.check()?;
    let total = (starts.len() * len) as u64;
    let ((staging, index), error) = dev.scoped(|| {
        let staging = dev.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tessel read staging"),
            size: total,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = dev
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("tessel read"),
            });
        for (k, &start) in starts.iter().enumerate() {
            encoder.copy_buffer_to_buffer(
                &b.buffer,
                start as u64,
                &staging,
                (k * len) as u64,
                len as u64,
            );
        }
        let index = dev.queue.submit([encoder.finish()]);
        (staging, index)
    });
    if let Some(e) = error {
        return Err(match e {
            wgpu::Error::OutOfMemory { .. } => BackendError::OutOfMemory {
                device: dev.info.name.clone(),
                requested: total as usize,
            },
            e => dev.lost(format!("copying to a staging buffer failed: {e}")),
        });
    }
    dev.map_read(&staging, index)?;
    let bytes = staging
        .get_mapped_range(..)
        .map(|view| view.to_vec())
        .map_err(|e| dev.lost(format!("reading a mapped staging buffer failed: {e}")));
    staging.unmap();
    bytes
}

/// Copies the first `bytes` of `src` into `dst` (distinct buffers on `dev`, in range).
pub(crate) fn copy(
    dev: &GpuDevice,
    src: &DeviceBuffer,
    dst: &DeviceBuffer,
    bytes: usize,
) -> Result<(), BackendError> {
    dev.check()?;
    // Whole words can go device to device. A partial last word may too when the bytes past
    // `bytes` in it are `dst`'s padding, else it is merged on the host.
    let whole = if bytes == dst.bytes {
        bytes.next_multiple_of(4)
    } else {
        align_down(bytes)
    };
    if whole > 0 {
        let ((), error) = dev.scoped(|| {
            let mut encoder = dev
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("tessel copy"),
                });
            encoder.copy_buffer_to_buffer(&src.buffer, 0, &dst.buffer, 0, whole as u64);
            dev.queue.submit([encoder.finish()]);
        });
        if let Some(e) = error {
            return Err(dev.lost(format!("copy_buffer_to_buffer failed: {e}")));
        }
    }
    if whole < bytes {
        let mut tail = vec![0u8; bytes - whole];
        read(dev, src, whole, &mut tail)?;
        write(dev, dst, whole, &tail)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{align_down, padded};

    #[test]
    fn sizes_round_to_words() {
        assert_eq!(padded(0), 4);
        assert_eq!(padded(1), 4);
        assert_eq!(padded(4), 4);
        assert_eq!(padded(5), 8);
        assert_eq!(padded(usize::MAX), u64::MAX);
        assert_eq!(align_down(7), 4);
        assert_eq!(align_down(8), 8);
    }
}
