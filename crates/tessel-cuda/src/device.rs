//! Finding CUDA devices and setting each up: its primary context, one stream, its memory
//! pool and staging buffer, its cuBLAS handle (made on first use), and what the driver
//! says about it.

use std::sync::{Mutex, RwLock, RwLockReadGuard};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::CUdevice_attribute as Attr;
use tessel_ir::handles::lock;
use tessel_ir::{BackendError, DeviceInfo, DeviceKind, Features};

use crate::ffi::cublas::{self, Blas};
use crate::ffi::cublaslt::{self, Lt};
use crate::ffi::{self, Context, Stream};
use crate::memory::{Pool, Staging};

/// One device in use.
pub(crate) struct CudaDevice {
    /// Its index among this backend's devices.
    pub(crate) index: usize,
    /// The driver's ordinal.
    pub(crate) ordinal: usize,
    pub(crate) info: DeviceInfo,
    /// `(major, minor)`.
    pub(crate) capability: (i32, i32),
    pub(crate) stream: Stream,
    /// Held shared by every call that queues work on `stream` or waits for it ([`Self::submit`]),
    /// exclusively while a launch sequence is recorded from it (`graphs.rs`): a capture
    /// must see no other thread's work, and a wait on a capturing stream fails.
    pub(crate) gate: RwLock<()>,
    /// While a capture is open: the scratch blocks its launches used, which the recording
    /// keeps (every replay writes them) instead of returning them to the pool.
    pub(crate) captured_scratch: Mutex<Option<Vec<(u64, usize)>>>,
    pub(crate) pool: Mutex<Pool>,
    pub(crate) staging: Mutex<Staging>,
    /// The cuBLAS handle, queueing on `stream`; created by the first vendor program.
    pub(crate) blas: Mutex<Option<Blas>>,
    /// The cuBLASLt handle (matmuls with epilogues); created by the first such program.
    pub(crate) lt: Mutex<Option<Lt>>,
    /// Declared last: dropped after everything that needs it bound.
    pub(crate) ctx: Context,
}

impl CudaDevice {
    /// Shared access to the stream, for queueing work or waiting on it.
    pub(crate) fn submit(&self) -> RwLockReadGuard<'_, ()> {
        self.gate
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Returns a scratch block the queued work is done with to the pool (stream-ordered:
    /// whoever gets it next queues after that work), or to the open capture.
    pub(crate) fn release_scratch(&self, ptr: u64, class: usize) {
        if let Some(kept) = lock(&self.captured_scratch).as_mut() {
            kept.push((ptr, class));
            return;
        }
        lock(&self.pool).release(ptr, class);
    }

    /// A failed driver call on this device, which leaves it in an unknown state.
    pub(crate) fn lost(&self, call: &str, e: DriverError) -> BackendError {
        BackendError::DeviceLost {
            device: self.info.name.clone(),
            reason: format!("{call} failed: {e}"),
        }
    }

    /// Makes sure the device has its cuBLAS handle: `Ok(false)` when cuBLAS is not
    /// installed (logged once per process), an error when it is but no handle can be made.
    pub(crate) fn ensure_blas(&self) -> Result<bool, BackendError> {
        if cublas::load().is_err() {
            return Ok(false);
        }
        if lock(&self.blas).is_some() {
            return Ok(true);
        }
        // Made without the lock held (creating a handle allocates on the device, which may
        // wait); if another thread got there first, its handle stays and this one is
        // destroyed.
        let made = Blas::new(&self.ctx, &self.stream).map_err(|why| BackendError::Unsupported {
            backend: "cuda",
            what: format!(
                "cuBLAS is installed but unusable on {}: {why}",
                self.info.name
            ),
        })?;
        let version = made.version;
        let spare = {
            let mut slot = lock(&self.blas);
            if slot.is_some() {
                Some(made)
            } else {
                *slot = Some(made);
                None
            }
        };
        if spare.is_none() {
            tracing::debug!(
                "tessel-cuda: {}: cuBLAS {}.{}.{} handle created",
                self.info.name,
                version / 10000,
                version / 100 % 100,
                version % 100
            );
        }
        // A handle that lost the race is destroyed here, with the lock released.
        drop(spare);
        Ok(true)
    }

    /// Makes sure the device has its cuBLASLt handle: `Ok(false)` when cuBLASLt is not
    /// installed, an error when it is but no handle can be made. Made with the lock held:
    /// only matmul programs with epilogues wait on it.
    pub(crate) fn ensure_lt(&self) -> Result<bool, BackendError> {
        if cublaslt::load().is_err() {
            return Ok(false);
        }
        let mut slot = lock(&self.lt);
        if slot.is_none() {
            let made = Lt::new(&self.ctx).map_err(|why| BackendError::Unsupported {
                backend: "cuda",
                what: format!(
                    "cuBLASLt is installed but unusable on {}: {why}",
                    self.info.name
                ),
            })?;
            tracing::debug!(
                "tessel-cuda: {}: cuBLASLt {} handle created",
                self.info.name,
                made.version
            );
            *slot = Some(made);
        }
        Ok(true)
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Work still queued may use the cached blocks and the staging buffer.
        if let Err(e) = self.stream.synchronize(&self.ctx) {
            tracing::warn!(
                "tessel-cuda: {}: final synchronize failed: {e}",
                self.info.name
            );
        }
        // The handle queues on the stream, so it goes before the stream does.
        drop(lock(&self.blas).take());
        drop(lock(&self.lt).take());
        lock(&self.staging).clear(&self.ctx);
        if let Err(e) = lock(&self.pool).trim(&self.ctx, &self.stream) {
            tracing::warn!(
                "tessel-cuda: {}: freeing cached memory failed: {e}",
                self.info.name
            );
        }
        if self.ctx.bind().is_ok() {
            self.stream.destroy();
        }
    }
}

/// What discovery found: the devices, the driver's CUDA version, and why there are none
/// when there are none.
pub(crate) struct Discovery {
    pub(crate) devices: Vec<CudaDevice>,
    pub(crate) driver_version: i32,
}

/// Every CUDA device, or only ordinal `only`. No driver, no GPU or a failing driver means no
/// devices (logged), never a panic.
pub(crate) fn discover(only: Option<usize>) -> Discovery {
    let none = Discovery {
        devices: Vec::new(),
        driver_version: 0,
    };
    if let Err(why) = ffi::load_driver() {
        tracing::debug!("tessel-cuda: {why}: no devices");
        return none;
    }
    if let Err(e) = ffi::init() {
        tracing::debug!("tessel-cuda: cuInit failed ({e}): no devices");
        return none;
    }
    let driver_version = ffi::driver_version().unwrap_or(0);
    let count = match ffi::device_count() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("tessel-cuda: cuDeviceGetCount failed ({e}): no devices");
            return none;
        }
    };
    let ordinals: Vec<usize> = match only {
        Some(k) if k < count => vec![k],
        Some(k) => {
            tracing::warn!(
                "tessel-cuda: TESSEL_CUDA_DEVICE={k}, but there are {count} device(s): no devices"
            );
            Vec::new()
        }
        None => (0..count).collect(),
    };
    let mut devices = Vec::new();
    for ordinal in ordinals {
        match set_up(devices.len(), ordinal, driver_version) {
            Ok(device) => {
                tracing::debug!(
                    "tessel-cuda: device {ordinal}: {} (sm_{}{})",
                    device.info.name,
                    device.capability.0,
                    device.capability.1
                );
                devices.push(device);
            }
            Err(e) => tracing::warn!("tessel-cuda: skipping device {ordinal}: {e}"),
        }
    }
    Discovery {
        devices,
        driver_version,
    }
}

fn set_up(index: usize, ordinal: usize, driver_version: i32) -> Result<CudaDevice, DriverError> {
    let ctx = Context::new(ordinal)?;
    let get = |a: Attr| ctx.attribute(a).map(|v| u32::try_from(v).unwrap_or(0));
    let capability = (
        ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    let info = DeviceInfo {
        name: ctx.name()?,
        kind: DeviceKind::Gpu,
        driver: format!("CUDA driver {driver_version}"),
        memory_bytes: ctx.total_memory()? as u64,
        compute_units: get(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        max_workgroup_size: get(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_local_size: [
            get(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
            get(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
            get(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
        ],
        max_groups: [
            u64::from(get(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?),
            u64::from(get(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?),
            u64::from(get(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?),
        ],
        // Static `__shared__` arrays are limited to this (48 KiB), whatever the opt-in
        // maximum for dynamic shared memory is.
        local_memory_bytes: u64::from(get(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?),
        features: Features {
            // Kernels compute f16 in float, and every CUDA GPU converts f16 natively.
            f16: true,
            f64: true,
            f64_math: true,
            int64: true,
            subgroup_size: Some(get(Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?),
            // Tensor cores arrived with Volta (sm_70).
            matrix_units: capability.0 >= 7,
            subnormals_may_flush: false,
            cooperative_workgroups: true,
            // `atomicAdd` on `double` and `unsigned long long` (sm_60 and later).
            atomics64: true,
        },
    };
    let stream = Stream::new(&ctx)?;
    Ok(CudaDevice {
        index,
        ordinal,
        info,
        capability,
        stream,
        gate: RwLock::new(()),
        captured_scratch: Mutex::new(None),
        pool: Mutex::new(Pool::default()),
        staging: Mutex::new(Staging::default()),
        blas: Mutex::new(None),
        lt: Mutex::new(None),
        ctx,
    })
}
