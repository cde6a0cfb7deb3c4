//! Building OpenCL programs, and the bounded cache of built ones.
//!
//! A program is built for one device from one source, so the cache is keyed by the device
//! and a hash of the source; the source itself is kept and compared on a hit, so a hash
//! collision costs a rebuild, never a wrong kernel. Entries are evicted least recently used
//! first; a live `ProgramId` holds its own reference, so eviction never invalidates one.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

use opencl3::program::Program;
use rustc_hash::{FxHashMap, FxHasher};
use tessel_ir::{BackendError, Inst, Kernel};
use tessel_shape::{DType, Dim};

use crate::device::ClDevice;

/// A program built for one device.
pub(crate) struct Built {
    pub(crate) program: Program,
    source: String,
}

type Key = (usize, u64);

/// Built programs by device and source hash, least recently used first.
pub(crate) struct ProgramCache {
    map: FxHashMap<Key, Arc<Built>>,
    order: VecDeque<Key>,
    capacity: usize,
}

impl ProgramCache {
    pub(crate) fn new(capacity: usize) -> Self {
        ProgramCache {
            map: FxHashMap::default(),
            order: VecDeque::new(),
            capacity,
        }
    }

    fn key(device: usize, source: &str) -> Key {
        let mut hasher = FxHasher::default();
        source.hash(&mut hasher);
        (device, hasher.finish())
    }

    /// The program built from `source` for `device`, if cached; marks it recently used.
    pub(crate) fn get(&mut self, device: usize, source: &str) -> Option<Arc<Built>> {
        let key = Self::key(device, source);
        let built = self.map.get(&key).filter(|b| b.source == source)?.clone();
        if let Some(at) = self.order.iter().position(|k| *k == key) {
            self.order.remove(at);
        }
        self.order.push_back(key);
        Some(built)
    }

    /// Keeps `built` for `device`, evicting the least recently used beyond capacity.
    pub(crate) fn insert(&mut self, device: usize, built: Arc<Built>) {
        let key = Self::key(device, &built.source);
        if self.map.insert(key, built).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// Builds `source` for `device`; a failure carries the driver's build log.
pub(crate) fn build(device: &ClDevice, kernel: &str, source: &str) -> Result<Built, BackendError> {
    let fail = |log: String| BackendError::Compile {
        kernel: kernel.to_owned(),
        code: source.to_owned(),
        log,
    };
    let started = Instant::now();
    let mut program = Program::create_from_source(&device.context, source)
        .map_err(|e| fail(format!("clCreateProgramWithSource failed: {e}")))?;
    let id = device.device.id();
    let result = program.build(&[id], &device.build_options);
    let log = program.get_build_log(id).unwrap_or_default();
    let log = log.trim();
    if let Err(e) = result {
        let log = if log.is_empty() {
            "(the driver gave no build log)"
        } else {
            log
        };
        return Err(fail(format!("clBuildProgram failed: {e}\n{log}")));
    }
    if !log.is_empty() {
        tracing::debug!(kernel, "tessel-opencl: build log:\n{log}");
    }
    tracing::debug!(kernel, elapsed = ?started.elapsed(), device = %device.info.name, "tessel-opencl: program built");
    Ok(Built {
        program,
        source: source.to_owned(),
    })
}

/// Checks what the device's limits decide before a launch: the kernel's local memory and,
/// when constant, its workgroup size.
pub(crate) fn check_limits(device: &ClDevice, kernel: &Kernel) -> Result<(), BackendError> {
    let unsupported = |what: String| BackendError::Unsupported {
        backend: "opencl",
        what: format!("kernel `{}` on {}: {what}", kernel.name, device.info.name),
    };
    let local_bytes: u64 = kernel
        .insts
        .iter()
        .map(|inst| match inst {
            // `bool` arrays are OpenCL's `bool`, one byte on every known device.
            Inst::DefineLocal { dtype, len } => {
                (*len as u64).saturating_mul(if *dtype == DType::Bool {
                    1
                } else {
                    dtype.size_bytes() as u64
                })
            }
            _ => 0,
        })
        .fold(0, u64::saturating_add);
    if local_bytes > device.info.local_memory_bytes {
        return Err(unsupported(format!(
            "needs {local_bytes} bytes of local memory, and the device has {}",
            device.info.local_memory_bytes
        )));
    }
    let local = kernel.grid.local.map(Dim::as_const);
    if let [Some(x), Some(y), Some(z)] = local {
        let max = device.info.max_local_size;
        let fits = [x, y, z]
            .iter()
            .zip(max)
            .all(|(&size, max)| size <= i64::from(max));
        let total = x.saturating_mul(y).saturating_mul(z);
        if !fits || total > i64::from(device.info.max_workgroup_size) {
            return Err(unsupported(format!(
                "workgroups of ({x}, {y}, {z}) invocations exceed the device's limits of \
                 {max:?} per axis and {} in all",
                device.info.max_workgroup_size
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ProgramCache;

    #[test]
    fn keys_separate_devices_and_sources() {
        // Only the key logic: building needs a device, which the integration tests cover.
        let a = ProgramCache::key(0, "kernel a");
        assert_ne!(a, ProgramCache::key(1, "kernel a"));
        assert_ne!(a, ProgramCache::key(0, "kernel b"));
        assert_eq!(a, ProgramCache::key(0, "kernel a"));
        let cache = ProgramCache::new(2);
        assert_eq!(cache.len(), 0);
    }
}
