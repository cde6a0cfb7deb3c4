//! The bookkeeping every [`Backend`](crate::Backend) repeats: tables of live buffers and
//! programs keyed by the ids the backend hands out, the device-index check, the byte-range
//! check of transfers, the checks that a launch or copy stays on one device, and a lock
//! that tolerates poisoning.
//!
//! [`Handles`] is a table of `Arc<T>` under one mutex with its own id counter. The mutex is
//! held only to insert, look up or remove an entry, never while the caller uses the value,
//! so a backend keeps its rule that no lock is held across a compile or a device wait.
//! Its errors are the [`BackendError::InvalidArgument`]s every backend gives for an id it
//! does not know: "buffer 7 is not a live buffer of the cuda backend".

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustc_hash::FxHashMap;

use crate::backend::{BackendError, BufferId, ProgramId};

/// Locks `m` even if a thread panicked while holding it. Backend tables and caches are
/// left consistent by every critical section (they insert or remove whole entries), so a
/// panic elsewhere must not turn every later call into a second panic.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An id a backend hands out: [`BufferId`] or [`ProgramId`].
pub trait Handle: Copy + Eq + Hash {
    /// What the id names, for error messages: `"buffer"`, `"program"`.
    const KIND: &'static str;
    /// The id with this number.
    fn from_raw(raw: u64) -> Self;
    /// The id's number.
    fn raw(self) -> u64;
}

impl Handle for BufferId {
    const KIND: &'static str = "buffer";
    fn from_raw(raw: u64) -> Self {
        BufferId(raw)
    }
    fn raw(self) -> u64 {
        self.0
    }
}

impl Handle for ProgramId {
    const KIND: &'static str = "program";
    fn from_raw(raw: u64) -> Self {
        ProgramId(raw)
    }
    fn raw(self) -> u64 {
        self.0
    }
}

/// The live objects of one kind (buffers or programs) of one backend, by id. Ids start at
/// 1 and are never reused. See the [module docs](self).
pub struct Handles<I, T> {
    backend: &'static str,
    map: Mutex<FxHashMap<I, Arc<T>>>,
    next: AtomicU64,
}

impl<I: Handle, T> Handles<I, T> {
    /// An empty table of the backend named `backend` (as [`Backend::name`](crate::Backend::name)
    /// gives it), for its error messages.
    pub fn new(backend: &'static str) -> Self {
        Handles {
            backend,
            map: Mutex::default(),
            next: AtomicU64::new(1),
        }
    }

    /// Stores `value` under a fresh id.
    pub fn insert(&self, value: T) -> I {
        let id = I::from_raw(self.next.fetch_add(1, Ordering::Relaxed));
        lock(&self.map).insert(id, Arc::new(value));
        id
    }

    /// The value of `id`.
    pub fn get(&self, id: I) -> Result<Arc<T>, BackendError> {
        lock(&self.map)
            .get(&id)
            .cloned()
            .ok_or_else(|| self.unknown(id))
    }

    /// The values of `ids`, in order (an id may repeat), looked up under one lock.
    pub fn get_all(&self, ids: &[I]) -> Result<Vec<Arc<T>>, BackendError> {
        let map = lock(&self.map);
        ids.iter()
            .map(|id| map.get(id).cloned().ok_or_else(|| self.unknown(*id)))
            .collect()
    }

    /// Removes `id` and returns its value; operations still holding the value keep it
    /// alive until they finish.
    pub fn remove(&self, id: I) -> Result<Arc<T>, BackendError> {
        lock(&self.map).remove(&id).ok_or_else(|| self.unknown(id))
    }

    /// The error for an id this table does not hold.
    pub fn unknown(&self, id: I) -> BackendError {
        BackendError::InvalidArgument(format!(
            "{kind} {} is not a live {kind} of the {} backend",
            id.raw(),
            self.backend,
            kind = I::KIND,
        ))
    }
}

/// Device `device` of `devices`, or the error naming how many the backend has.
pub fn device<'a, D>(
    backend: &str,
    devices: &'a [D],
    device: usize,
) -> Result<&'a D, BackendError> {
    devices.get(device).ok_or_else(|| {
        BackendError::InvalidArgument(format!(
            "the {backend} backend has {} device(s), not device {device}",
            devices.len()
        ))
    })
}

/// Checks that `offset..offset + len` lies within buffer `id` of `size` bytes; `what`
/// names the operation (`"write"`, `"copy source"`) in the error.
pub fn check_range(
    what: &str,
    id: BufferId,
    offset: usize,
    len: usize,
    size: usize,
) -> Result<(), BackendError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BackendError::InvalidArgument(format!(
            "{what} of {len} bytes at offset {offset} is outside buffer {} of {size} bytes",
            id.0
        ))),
    }
}

/// Checks that every buffer bound to a launch of kernel `kernel`, compiled for device
/// `device`, is on that device: `on` gives the device of each of `buffers`, in order.
pub fn check_launch_devices(
    backend: &str,
    kernel: &str,
    device: usize,
    buffers: &[BufferId],
    on: impl IntoIterator<Item = usize>,
) -> Result<(), BackendError> {
    match buffers.iter().zip(on).find(|(_, d)| *d != device) {
        None => Ok(()),
        Some((id, d)) => Err(BackendError::InvalidArgument(format!(
            "kernel `{kernel}` was compiled for {backend} device {device}, but buffer {} is on \
             device {d}",
            id.0
        ))),
    }
}

/// Checks that a copy from `src` (on device `from`) to `dst` (on device `to`) stays on one
/// device, for backends that copy only within a device.
pub fn check_copy_devices(
    backend: &str,
    (src, from): (BufferId, usize),
    (dst, to): (BufferId, usize),
) -> Result<(), BackendError> {
    if from == to {
        return Ok(());
    }
    Err(BackendError::InvalidArgument(format!(
        "copy from buffer {} on {backend} device {from} to buffer {} on device {to}: copies \
         stay on one device; read to the host and write instead",
        src.0, dst.0
    )))
}

#[cfg(test)]
mod tests {
    use super::{Handles, check_copy_devices, check_launch_devices, check_range, device};
    use crate::{BackendError, BufferId, ProgramId};

    #[test]
    fn ids_are_fresh_and_errors_name_the_backend() {
        let table: Handles<BufferId, &str> = Handles::new("test");
        let a = table.insert("a");
        let b = table.insert("b");
        assert_eq!((a, b), (BufferId(1), BufferId(2)));
        assert_eq!(*table.get(b).unwrap(), "b");
        assert_eq!(table.get_all(&[b, a, b]).unwrap().len(), 3);
        assert_eq!(*table.remove(a).unwrap(), "a");
        assert_eq!(
            table.get(a).unwrap_err(),
            BackendError::InvalidArgument(
                "buffer 1 is not a live buffer of the test backend".into()
            )
        );
        assert!(table.remove(a).is_err() && table.get_all(&[b, a]).is_err());
        assert_eq!(table.insert("c"), BufferId(3), "ids are not reused");
        let programs: Handles<ProgramId, ()> = Handles::new("test");
        assert_eq!(
            programs.get(ProgramId(4)).unwrap_err().to_string(),
            "invalid argument: program 4 is not a live program of the test backend"
        );
    }

    #[test]
    fn devices_and_ranges() {
        assert_eq!(device("test", &[10, 11], 1), Ok(&11));
        assert_eq!(
            device("test", &[10], 1).unwrap_err().to_string(),
            "invalid argument: the test backend has 1 device(s), not device 1"
        );
        assert!(check_range("read", BufferId(1), 4, 4, 8).is_ok());
        assert!(check_range("read", BufferId(1), 5, 4, 8).is_err());
        assert!(check_range("read", BufferId(1), usize::MAX, 1, 8).is_err());
        let ids = [BufferId(3), BufferId(4)];
        assert!(check_launch_devices("test", "k", 1, &ids, [1, 1]).is_ok());
        assert_eq!(
            check_launch_devices("test", "k", 1, &ids, [1, 0])
                .unwrap_err()
                .to_string(),
            "invalid argument: kernel `k` was compiled for test device 1, but buffer 4 is on \
             device 0"
        );
        assert!(check_copy_devices("test", (ids[0], 0), (ids[1], 0)).is_ok());
        assert!(check_copy_devices("test", (ids[0], 0), (ids[1], 1)).is_err());
    }
}
