//! Device buffers: a caching allocator, and the transfers between buffers and the host.
//!
//! wgpu moves buffer data in 4-byte words (`COPY_BUFFER_ALIGNMENT`), while a tensor's bytes
//! may start and end anywhere. Every buffer is therefore allocated rounded up to a multiple
//! of 4 (at least 4: the WGSL ABI packs 8- and 16-bit elements into `u32` words, so a
//! shader touches whole words), and a transfer whose ends are not word-aligned reads the
//! boundary words back and merges them on the host.
//!
//! Creating a wgpu buffer is slow for large sizes (the driver allocates and maps the memory,
//! and wgpu clears every new buffer before its first use), and a tensor program allocates
//! and frees the same sizes over and over; so, as in `tessel-cuda`, freed buffers go to a
//! free list per size class ([`Pool`]) and are handed out again, up to a cap on the bytes
//! kept. Reuse needs no synchronization: every command on a device goes to its one queue,
//! in order, and wgpu orders each use of a buffer after the earlier ones, so whatever the
//! new owner queues runs after everything the old owner queued. A reused buffer holds its
//! old owner's bytes (allocations are not zeroed). Cached buffers are dropped when an
//! allocation runs out of memory (then it is tried once more) or on
//! [`WgpuBackend::trim`](crate::WgpuBackend::trim).

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tessel_ir::BackendError;

use crate::device::GpuDevice;

/// The smallest buffer created; also the granularity of small size classes.
const MIN_BLOCK: u64 = 256;

/// The size class of a buffer of `size` bytes: `size` rounded up to a multiple of a
/// sixteenth of its next power of two (at least [`MIN_BLOCK`]), so at most an eighth is
/// wasted and eight classes cover each power of two; `size` itself where the class would
/// exceed `max` (the device's largest buffer).
pub(crate) fn size_class(size: u64, max: u64) -> u64 {
    let size = size.max(1);
    let step = (size.checked_next_power_of_two().unwrap_or(1 << 63) / 16).max(MIN_BLOCK);
    let class = size.div_ceil(step).saturating_mul(step);
    if class > max { size } else { class }
}

/// Freed buffers of one device, by size class, kept for reuse.
pub(crate) struct Pool {
    free: BTreeMap<u64, Vec<wgpu::Buffer>>,
    /// Bytes held in `free`.
    cached_bytes: u64,
    /// The most bytes `free` may hold; a buffer freed beyond it is dropped.
    limit: u64,
    /// Allocations answered from the free lists.
    pub(crate) reuses: u64,
    /// Buffers created.
    pub(crate) creates: u64,
}

impl Pool {
    /// An empty pool keeping at most `limit` bytes of freed buffers.
    pub(crate) fn new(limit: u64) -> Self {
        Pool {
            free: BTreeMap::new(),
            cached_bytes: 0,
            limit,
            reuses: 0,
            creates: 0,
        }
    }

    /// The bytes of the buffers kept for reuse.
    pub(crate) fn cached_bytes(&self) -> u64 {
        self.cached_bytes
    }

    /// A cached buffer of size class `class`, if there is one.
    fn take(&mut self, class: u64) -> Option<wgpu::Buffer> {
        let buffer = self.free.get_mut(&class).and_then(Vec::pop)?;
        self.cached_bytes -= class;
        self.reuses += 1;
        Some(buffer)
    }

    /// Keeps `buffer` (of size class `class`) for reuse, unless that would pass the limit
    /// (then it is dropped, and wgpu frees it once no queued work uses it).
    fn put(&mut self, buffer: wgpu::Buffer, class: u64) {
        if self.cached_bytes + class <= self.limit {
            self.free.entry(class).or_default().push(buffer);
            self.cached_bytes += class;
        }
    }

    /// Drops every cached buffer; returns the bytes they held.
    pub(crate) fn clear(&mut self) -> u64 {
        self.free.clear();
        std::mem::take(&mut self.cached_bytes)
    }
}

/// A device's pool, shared by its live buffers (which return to it when dropped).
pub(crate) type SharedPool = Arc<Mutex<Pool>>;

pub(crate) fn lock_pool(pool: &SharedPool) -> MutexGuard<'_, Pool> {
    pool.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A live buffer. Dropping it (when it is freed and no launch still holds it) returns the
/// wgpu buffer to its device's pool.
pub(crate) struct DeviceBuffer {
    pub(crate) device: usize,
    /// The size asked for; shaders see [`padded`] bytes of it ([`DeviceBuffer::binding`]),
    /// and the wgpu buffer is its size class.
    pub(crate) bytes: usize,
    pub(crate) buffer: wgpu::Buffer,
    /// The wgpu buffer's size.
    class: u64,
    pool: SharedPool,
    /// Held by the read-modify-write of unaligned transfers, so that two of them on
    /// neighbouring bytes of one word do not undo each other.
    merge: Mutex<()>,
}

impl DeviceBuffer {
    /// The binding of the buffer's [`padded`] bytes (the wgpu buffer may be larger), so that
    /// a shader's `arrayLength` is that of the buffer asked for.
    pub(crate) fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: 0,
            size: NonZeroU64::new(padded(self.bytes)),
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        lock_pool(&self.pool).put(self.buffer.clone(), self.class);
    }
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

/// A storage buffer of `bytes` on `dev`: a cached one of its size class from `pool`, else a
/// new one (zero-filled: wgpu initializes it on first use). Its contents are unspecified.
/// When the driver runs out of memory, the cached buffers are dropped, the queue drained
/// (so that wgpu frees them) and the creation tried once more.
pub(crate) fn alloc(
    dev: &GpuDevice,
    pool: &SharedPool,
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
    let class = size_class(size, dev.limits.max_buffer_size);
    let wrap = |buffer| DeviceBuffer {
        device,
        bytes,
        buffer,
        class,
        pool: Arc::clone(pool),
        merge: Mutex::new(()),
    };
    if let Some(buffer) = lock_pool(pool).take(class) {
        return Ok(wrap(buffer));
    }
    let create = || {
        dev.scoped(|| {
            dev.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tessel buffer"),
                size: class,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })
    };
    let (mut buffer, mut error) = create();
    if error.is_some() {
        let released = lock_pool(pool).clear();
        if released > 0 {
            tracing::debug!(
                released,
                requested = class,
                "tessel-wgpu: allocation failed; dropped the cached buffers and retrying"
            );
            dev.wait(None)?;
            (buffer, error) = create();
        }
    }
    match error {
        None => {
            lock_pool(pool).creates += 1;
            Ok(wrap(buffer))
        }
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
    use super::{MIN_BLOCK, align_down, padded, size_class};

    #[test]
    fn size_classes_waste_at_most_an_eighth() {
        let max = 1 << 40;
        assert_eq!(size_class(4, max), MIN_BLOCK);
        assert_eq!(size_class(MIN_BLOCK + 4, max), 2 * MIN_BLOCK);
        assert_eq!(size_class(1 << 30, max), 1 << 30);
        assert_eq!(size_class((1 << 30) + 4, max), (1 << 30) + (1 << 27));
        for size in (4..1 << 24).step_by(4093 * 4) {
            let class = size_class(size, max);
            assert!(
                class >= size && class - size <= size / 8 + MIN_BLOCK,
                "{size}"
            );
            assert_eq!(size_class(class, max), class, "{size}");
        }
        // Never past the device's largest buffer.
        assert_eq!(size_class(1000, 512), 1000);
        assert_eq!(size_class(u64::MAX - 3, 1 << 40), u64::MAX - 3);
    }

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
