//! Host memory: 64-byte-aligned buffers, a table of live buffers, and a bounded cache of
//! freed ones.
//!
//! A buffer is a `Vec` of 64-byte [`Chunk`]s, so it is aligned for any vector load without
//! `unsafe` (the chunk type's alignment does it) and its bytes are a safe `bytemuck` cast.
//!
//! Each live buffer sits behind its own `Arc<RwLock<..>>`: the table's lock is held only to
//! find a buffer, never while copying or while a kernel runs, so transfers and launches on
//! different buffers proceed in parallel.
//!
//! Freed buffers are kept for reuse, by power-of-two size class: an allocation reserves
//! its class as capacity (at most twice the request, at least one chunk), so any cached
//! buffer of the class fits any request of the class, but holds only the chunks its bytes
//! need: the rest of the class is never written, so the system never maps its pages. The
//! cache is bounded both in total bytes ([`CACHE_BYTES`]) and per class
//! ([`CACHE_PER_CLASS`]); a freed buffer that does not fit is returned to the system
//! allocator. A reused buffer keeps its old contents (like `cudaMalloc`, an allocation's
//! contents are unspecified); fresh ones are zeroed, or hold the bytes they were made from
//! ([`Memory::upload`]: one pass over the memory instead of zeroing it and then copying).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytemuck::{Pod, Zeroable};
use rustc_hash::FxHashMap;
use tessel_ir::handles::lock;
use tessel_ir::{BackendError, BufferId, Handles};

/// The most bytes the free-buffer cache holds.
pub(crate) const CACHE_BYTES: usize = 1 << 30;

/// The most buffers the cache holds per size class.
pub(crate) const CACHE_PER_CLASS: usize = 16;

/// 64 bytes, 64-byte aligned: a cache line and the widest vector register (AVX-512).
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
pub(crate) struct Chunk([u8; 64]);

/// One allocation.
pub(crate) struct HostBuffer {
    chunks: Vec<Chunk>,
    /// The size the user asked for; reads, writes and launches are checked against it.
    len: usize,
}

impl HostBuffer {
    /// The buffer's bytes (`len` of them).
    pub(crate) fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.chunks)[..self.len]
    }

    /// The buffer's bytes, mutably.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.chunks)[..self.len]
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The start of the storage, for a kernel that reads it.
    pub(crate) fn addr(&self) -> usize {
        self.chunks.as_ptr().expose_provenance()
    }

    /// The start of the storage, for a kernel that writes it.
    pub(crate) fn addr_mut(&mut self) -> usize {
        self.chunks.as_mut_ptr().expose_provenance()
    }
}

/// A live buffer, shared between the table and in-flight operations.
pub(crate) type Shared = Arc<RwLock<HostBuffer>>;

/// Reads a lock even if a thread panicked while holding it: buffers are plain bytes, which
/// a panic cannot leave in a state that is unsafe to read.
pub(crate) fn read(buffer: &Shared) -> RwLockReadGuard<'_, HostBuffer> {
    buffer.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes a lock even if a thread panicked while holding it (see [`read`]).
pub(crate) fn write(buffer: &Shared) -> RwLockWriteGuard<'_, HostBuffer> {
    buffer.write().unwrap_or_else(PoisonError::into_inner)
}

/// The free-buffer cache, keyed by size class (the capacity in bytes, a power of two).
#[derive(Default)]
struct Cache {
    classes: FxHashMap<usize, Vec<Vec<Chunk>>>,
    bytes: usize,
}

/// Every live buffer, and the cache of freed ones.
pub(crate) struct Memory {
    device: String,
    buffers: Handles<BufferId, RwLock<HostBuffer>>,
    cache: Mutex<Cache>,
}

/// The chunks holding `bytes` (at least one, so every buffer has an address to pass).
fn chunks_for(bytes: usize) -> usize {
    bytes.div_ceil(size_of::<Chunk>()).max(1)
}

impl Memory {
    pub(crate) fn new(device: String) -> Self {
        Memory {
            device,
            buffers: Handles::new("cpu"),
            cache: Mutex::default(),
        }
    }

    /// Allocates `bytes`, reusing a cached buffer of the same size class when there is one.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<BufferId, BackendError> {
        let mut chunks = self.storage(bytes)?;
        chunks.resize(chunks_for(bytes), Chunk::zeroed());
        Ok(self.insert(chunks, bytes))
    }

    /// Allocates a buffer holding `data`.
    pub(crate) fn upload(&self, data: &[u8]) -> Result<BufferId, BackendError> {
        let mut chunks = self.storage(data.len())?;
        chunks.clear();
        let whole = data.chunks_exact(size_of::<Chunk>());
        let rest = whole.remainder();
        chunks.extend(whole.map(bytemuck::pod_read_unaligned::<Chunk>));
        if !rest.is_empty() || chunks.is_empty() {
            let mut last = Chunk::zeroed();
            last.0[..rest.len()].copy_from_slice(rest);
            chunks.push(last);
        }
        debug_assert_eq!(chunks.len(), chunks_for(data.len()));
        Ok(self.insert(chunks, data.len()))
    }

    /// Empty storage with the capacity of `bytes`' size class: a cached buffer of the class
    /// (holding its old chunks) or a fresh reservation.
    fn storage(&self, bytes: usize) -> Result<Vec<Chunk>, BackendError> {
        let oom = || BackendError::OutOfMemory {
            device: self.device.clone(),
            requested: bytes,
        };
        let class = bytes
            .max(size_of::<Chunk>())
            .checked_next_power_of_two()
            .ok_or_else(oom)?;
        let cached = {
            let mut cache = lock(&self.cache);
            let chunks = cache.classes.get_mut(&class).and_then(Vec::pop);
            if chunks.is_some() {
                cache.bytes -= class;
            }
            chunks
        };
        if let Some(chunks) = cached {
            return Ok(chunks);
        }
        let mut chunks = Vec::new();
        chunks
            .try_reserve_exact(class / size_of::<Chunk>())
            .map_err(|_| oom())?;
        Ok(chunks)
    }

    fn insert(&self, chunks: Vec<Chunk>, len: usize) -> BufferId {
        self.buffers.insert(RwLock::new(HostBuffer { chunks, len }))
    }

    /// Frees a buffer. Its storage goes to the cache once no in-flight operation holds it.
    pub(crate) fn free(&self, id: BufferId) -> Result<(), BackendError> {
        let buffer = self.buffers.remove(id)?;
        // An operation still running on another thread keeps its own reference; then the
        // storage is simply dropped when it finishes.
        let Ok(lock) = Arc::try_unwrap(buffer) else {
            return Ok(());
        };
        let chunks = lock
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .chunks;
        // The largest class the storage holds (`try_reserve_exact` may give more).
        let Some(bits) = (chunks.capacity() * size_of::<Chunk>()).checked_ilog2() else {
            return Ok(());
        };
        let class = 1usize << bits;
        let mut cache = lock_cache(&self.cache);
        if cache.bytes + class <= CACHE_BYTES {
            let list = cache.classes.entry(class).or_default();
            if list.len() < CACHE_PER_CLASS {
                list.push(chunks);
                cache.bytes += class;
            }
        }
        Ok(())
    }

    /// The buffer with this id.
    pub(crate) fn get(&self, id: BufferId) -> Result<Shared, BackendError> {
        self.buffers.get(id)
    }

    /// The buffers with these ids, each once, in id order (the order locks are taken in,
    /// so that two operations locking overlapping sets can never deadlock).
    pub(crate) fn get_sorted(
        &self,
        ids: &[BufferId],
    ) -> Result<Vec<(BufferId, Shared)>, BackendError> {
        let shared = self.buffers.get_all(ids)?;
        let mut out: Vec<(BufferId, Shared)> = ids.iter().copied().zip(shared).collect();
        // A launch binds a handful of buffers: sorting them beats hashing them.
        out.sort_unstable_by_key(|(id, _)| *id);
        out.dedup_by_key(|(id, _)| *id);
        Ok(out)
    }

    /// Bytes currently held by the free-buffer cache.
    #[cfg(test)]
    pub(crate) fn cached_bytes(&self) -> usize {
        lock_cache(&self.cache).bytes
    }
}

fn lock_cache(cache: &Mutex<Cache>) -> MutexGuard<'_, Cache> {
    lock(cache)
}

#[cfg(test)]
mod tests {
    use super::{CACHE_BYTES, Chunk, Memory};

    #[test]
    fn chunks_are_cache_lines() {
        assert_eq!(size_of::<Chunk>(), 64);
        assert_eq!(align_of::<Chunk>(), 64);
    }

    #[test]
    fn freed_buffers_are_reused_by_size_class() {
        let memory = Memory::new("test".into());
        let a = memory.alloc(1000).unwrap();
        let addr = memory.get(a).unwrap().read().unwrap().addr();
        memory.free(a).unwrap();
        assert_eq!(memory.cached_bytes(), 1024);
        // 600 bytes round up to the same 1024-byte class.
        let b = memory.alloc(600).unwrap();
        assert_eq!(memory.get(b).unwrap().read().unwrap().addr(), addr);
        assert_eq!(memory.get(b).unwrap().read().unwrap().len(), 600);
        assert_eq!(memory.cached_bytes(), 0);
        assert!(memory.free(b).is_ok());
        assert!(memory.free(b).is_err(), "double free is an error");
        assert!(memory.cached_bytes() <= CACHE_BYTES);
    }

    #[test]
    fn uploads_hold_their_bytes_and_reuse_the_cache() {
        let memory = Memory::new("test".into());
        let a = memory.alloc(3000).unwrap();
        let addr = memory.get(a).unwrap().read().unwrap().addr();
        memory.free(a).unwrap();
        assert_eq!(memory.cached_bytes(), 4096);
        let data: Vec<u8> = (0..2500u32).map(|i| (i * 7 % 251) as u8).collect();
        let b = memory.upload(&data).unwrap();
        let buffer = memory.get(b).unwrap();
        let guard = buffer.read().unwrap();
        assert_eq!(guard.addr(), addr);
        assert_eq!(guard.bytes(), &data[..]);
        for len in [0, 1, 64, 65] {
            let c = memory.upload(&data[..len]).unwrap();
            assert_eq!(memory.get(c).unwrap().read().unwrap().bytes(), &data[..len]);
        }
    }
}
