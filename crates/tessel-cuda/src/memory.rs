//! Device memory: a caching allocator, and pinned staging for host-to-device copies.
//!
//! `cuMemAlloc` and `cuMemFree` are slow (`cuMemFree` also synchronizes the device), and a
//! tensor program allocates and frees the same sizes over and over, so freed blocks go to
//! a free list per size class and are handed out again. Reuse needs no synchronization:
//! every command on a device goes to its one in-order stream, so whatever the new owner
//! queues runs after everything the old owner queued. A class hands out its lowest free
//! address first, so a loop that frees what it allocated gets the same blocks back on every
//! iteration, whatever order it frees them in: the same device pointers, which CUDA graph
//! recordings are keyed by (`graphs.rs`). Cached blocks go back to the driver
//! when an allocation fails (then the allocation is retried once) or on
//! [`CudaBackend::trim`](crate::CudaBackend::trim).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use cudarc::driver::result::DriverError;

use crate::ffi::{self, Context, Event, Pinned, Stream};

/// The smallest block handed out; also the granularity of small size classes.
const MIN_BLOCK: usize = 512;

/// The size class of a request: the request rounded up to a multiple of a sixteenth of its
/// next power of two (at least [`MIN_BLOCK`]), so at most an eighth is wasted and eight
/// classes cover each power of two.
pub(crate) fn size_class(bytes: usize) -> usize {
    let bytes = bytes.max(1);
    let step = (bytes.next_power_of_two() / 16).max(MIN_BLOCK);
    bytes.div_ceil(step).saturating_mul(step)
}

/// Free blocks of one device, by size class.
#[derive(Default)]
pub(crate) struct Pool {
    /// By class: the free blocks' addresses, lowest first.
    free: BTreeMap<usize, BTreeSet<u64>>,
    /// Bytes held in `free`.
    pub(crate) cached_bytes: usize,
    /// Allocations answered from the free lists.
    pub(crate) reuses: u64,
    /// Allocations that went to the driver.
    pub(crate) driver_allocs: u64,
}

impl Pool {
    /// A block of at least `bytes` bytes: `(pointer, class)`. On running out of memory the
    /// cached blocks are returned to the driver (after `stream` is idle) and the allocation
    /// is tried once more; the error is the driver's if that fails too.
    pub(crate) fn alloc(
        &mut self,
        ctx: &Context,
        stream: &Stream,
        bytes: usize,
    ) -> Result<(u64, usize), DriverError> {
        let class = size_class(bytes);
        if let Some(ptr) = self.free.get_mut(&class).and_then(BTreeSet::pop_first) {
            self.cached_bytes -= class;
            self.reuses += 1;
            return Ok((ptr, class));
        }
        let ptr = match ffi::malloc(ctx, class) {
            Err(e) if ffi::is_out_of_memory(e) && self.cached_bytes > 0 => {
                tracing::debug!(
                    cached = self.cached_bytes,
                    requested = class,
                    "tessel-cuda: out of memory; freeing cached blocks and retrying"
                );
                self.trim(ctx, stream)?;
                ffi::malloc(ctx, class)?
            }
            other => other?,
        };
        self.driver_allocs += 1;
        Ok((ptr, class))
    }

    /// Keeps a block for reuse.
    pub(crate) fn release(&mut self, ptr: u64, class: usize) {
        self.free.entry(class).or_default().insert(ptr);
        self.cached_bytes += class;
    }

    /// Returns every cached block to the driver, once `stream` has finished the work that
    /// may still use them.
    pub(crate) fn trim(&mut self, ctx: &Context, stream: &Stream) -> Result<(), DriverError> {
        stream.synchronize(ctx)?;
        let free = std::mem::take(&mut self.free);
        self.cached_bytes = 0;
        let mut first_error = None;
        for ptr in free.into_values().flatten() {
            if let Err(e) = ffi::free(ctx, ptr) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The most pinned memory kept for staging per device; larger writes go through it in
/// chunks of this size.
pub(crate) const STAGING_BYTES: usize = 16 << 20;

/// Writes of at most this many bytes go through [`Staging`]'s ring of small slots.
const SMALL_WRITE: usize = 64 << 10;

/// Slots of the small-write ring (4 MiB of pinned memory at most).
const SMALL_SLOTS: usize = 64;

/// Pinned memory through which host data is copied to the device, so that a write returns
/// as soon as its data is staged: the copy to the device runs on the stream, in order with
/// launches, and the staging buffer is reused once the copy's event completes.
///
/// Small writes (a random draw's key, a scalar, indices) take a slot of a ring whose copy
/// has completed, so a write waits for the device only when every slot is in flight: with
/// one buffer, each write would wait for the copy before it, and so for every kernel queued
/// before that copy.
#[derive(Default)]
pub(crate) struct Staging {
    buffer: Option<Pinned>,
    /// Recorded after the last copy out of `buffer`.
    pending: Option<Event>,
    /// Small slots, least recently used first, each with the event recorded after its
    /// last copy.
    small: VecDeque<(Pinned, Event)>,
}

impl Staging {
    /// Queues a copy of `data` to device address `dst`, through pinned memory; falls back to
    /// a synchronous copy of pageable memory when pinned memory cannot be had.
    pub(crate) fn write(
        &mut self,
        ctx: &Context,
        stream: &Stream,
        dst: u64,
        data: &[u8],
    ) -> Result<(), DriverError> {
        if !data.is_empty() && data.len() <= SMALL_WRITE {
            return self.write_small(ctx, stream, dst, data);
        }
        for (k, chunk) in data.chunks(STAGING_BYTES).enumerate() {
            let at = dst + (k * STAGING_BYTES) as u64;
            // The buffer may still be read by the previous copy.
            if let Some(event) = self.pending.take() {
                let waited = event.synchronize(ctx);
                event.destroy(ctx);
                waited?;
            }
            if self.buffer.as_ref().is_none_or(|b| b.len < chunk.len()) {
                if let Some(mut old) = self.buffer.take() {
                    old.free(ctx);
                }
                let want = chunk.len().next_power_of_two().min(STAGING_BYTES);
                match Pinned::new(ctx, want.max(chunk.len())) {
                    Ok(buffer) => self.buffer = Some(buffer),
                    Err(e) => {
                        tracing::debug!(
                            "tessel-cuda: no pinned staging memory ({e}); copying from pageable memory"
                        );
                        ffi::copy_to_device_and_wait(ctx, stream, at, chunk)?;
                        continue;
                    }
                }
            }
            let Some(buffer) = self.buffer.as_mut() else {
                continue;
            };
            buffer.fill(chunk);
            ffi::copy_to_device(ctx, stream, at, buffer, chunk.len())?;
            let event = Event::new(ctx, false)?;
            event.record(ctx, stream)?;
            self.pending = Some(event);
        }
        Ok(())
    }

    /// A small write through a ring slot whose copy is done, a new slot, or (all in flight)
    /// the least recently used one once its copy is done.
    fn write_small(
        &mut self,
        ctx: &Context,
        stream: &Stream,
        dst: u64,
        data: &[u8],
    ) -> Result<(), DriverError> {
        let mut free = None;
        for (k, (_, event)) in self.small.iter().enumerate() {
            if event.is_done(ctx)? {
                free = Some(k);
                break;
            }
        }
        let (mut buffer, event) = match free {
            Some(k) => self.small.remove(k).expect("k indexes the ring"),
            None if self.small.len() < SMALL_SLOTS => {
                let made = Pinned::new(ctx, SMALL_WRITE)
                    .and_then(|buffer| Event::new(ctx, false).map(|event| (buffer, event)));
                match made {
                    Ok(slot) => slot,
                    Err(e) => {
                        tracing::debug!(
                            "tessel-cuda: no pinned staging memory ({e}); copying from pageable memory"
                        );
                        return ffi::copy_to_device_and_wait(ctx, stream, dst, data);
                    }
                }
            }
            None => {
                let (buffer, event) = self.small.pop_front().expect("the ring is full");
                if let Err(e) = event.synchronize(ctx) {
                    self.small.push_back((buffer, event));
                    return Err(e);
                }
                (buffer, event)
            }
        };
        buffer.fill(data);
        let queued = ffi::copy_to_device(ctx, stream, dst, &buffer, data.len())
            .and_then(|()| event.record(ctx, stream));
        self.small.push_back((buffer, event));
        queued
    }

    /// Waits for the pending copy and frees the pinned memory (the owner's drop).
    pub(crate) fn clear(&mut self, ctx: &Context) {
        for (mut buffer, event) in std::mem::take(&mut self.small) {
            let _ = event.synchronize(ctx);
            event.destroy(ctx);
            buffer.free(ctx);
        }
        if let Some(event) = self.pending.take() {
            let _ = event.synchronize(ctx);
            event.destroy(ctx);
        }
        if let Some(mut buffer) = self.buffer.take() {
            buffer.free(ctx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn size_classes_round_up_by_at_most_an_eighth() {
        assert_eq!(size_class(0), 512);
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(512), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class(4096), 4096);
        assert_eq!(size_class(4097), 4608);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), (1 << 20) + (1 << 17));
        for bytes in [1usize, 700, 5000, 123_456, 10_000_000, 3 << 30] {
            let class = size_class(bytes);
            assert!(
                class >= bytes && class - bytes <= bytes / 8 + 512,
                "{bytes}"
            );
            assert_eq!(size_class(class), class, "classes are fixed points");
        }
    }
}
