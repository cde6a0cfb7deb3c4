//! Finding wgpu adapters, choosing among them, and opening one device and queue on each,
//! with the errors wgpu reports asynchronously caught instead of panicking.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use tessel_ir::codegen::WgslTarget;
use tessel_ir::{BackendError, DeviceInfo, DeviceKind, Features};

/// What wgpu says about an adapter beyond [`DeviceInfo`], for diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgpuDeviceDetails {
    /// The graphics API underneath (`Vulkan`, `Metal`, `Dx12`).
    pub backend: String,
    /// The kind of device (`DiscreteGpu`, `IntegratedGpu`, `Cpu`, ...).
    pub device_type: String,
    /// The driver's name (`"llvmpipe"`, `"NVIDIA"`), where the API reports one.
    pub driver: String,
    /// The driver's version string, where the API reports one.
    pub driver_info: String,
    /// Whether `f64` kernels run (`wgpu::Features::SHADER_F64`).
    pub shader_f64: bool,
    /// Whether `i64`/`u64` kernels run (`wgpu::Features::SHADER_INT64`).
    pub shader_int64: bool,
    /// Whether [`Backend::time`](tessel_ir::Backend::time) uses the device's timestamps
    /// (`wgpu::Features::TIMESTAMP_QUERY`) rather than the host's clock.
    pub timestamps: bool,
    /// The largest buffer, in bytes (`max_buffer_size`).
    pub max_buffer_size: u64,
    /// The largest buffer a kernel may bind, in bytes (`max_storage_buffer_binding_size`).
    pub max_storage_binding: u64,
    /// The most buffers one kernel may bind (`max_storage_buffers_per_shader_stage`).
    pub max_storage_buffers: u32,
}

/// Errors wgpu delivered outside any error scope (to `on_uncaptured_error`) and the
/// device-lost notice, kept until the next call on the device reports them.
#[derive(Default)]
pub(crate) struct Incidents {
    lost: Mutex<Option<String>>,
    uncaptured: Mutex<Vec<String>>,
}

impl Incidents {
    fn lose(&self, reason: String) {
        let mut lost = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        lost.get_or_insert(reason);
    }

    fn record(&self, error: String) {
        self.uncaptured
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(error);
    }
}

/// One device in use.
pub(crate) struct GpuDevice {
    pub(crate) info: DeviceInfo,
    pub(crate) details: WgpuDeviceDetails,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) limits: wgpu::Limits,
    /// What the WGSL emitter may use on this device.
    pub(crate) target: WgslTarget,
    incidents: Arc<Incidents>,
}

impl GpuDevice {
    /// Fails with what went wrong on the device since the last call: [`BackendError::DeviceLost`]
    /// once it is lost (and ever after), else the errors wgpu reported outside any scope
    /// (reported once, as [`BackendError::Launch`]: they come from earlier submitted work).
    pub(crate) fn check(&self) -> Result<(), BackendError> {
        if let Some(reason) = self
            .incidents
            .lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Err(BackendError::DeviceLost {
                device: self.info.name.clone(),
                reason,
            });
        }
        let errors = std::mem::take(
            &mut *self
                .incidents
                .uncaptured
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if errors.is_empty() {
            Ok(())
        } else {
            Err(BackendError::Launch {
                kernel: format!("(earlier work on {})", self.info.name),
                reason: errors.join("\n"),
            })
        }
    }

    /// Runs `f` with every error it causes captured (out of memory, validation, internal)
    /// instead of reaching the uncaptured handler; returns the first one.
    ///
    /// wgpu-core validates synchronously, so the scopes' futures are ready at once. The scope
    /// stack is per thread, so concurrent callers do not see each other's errors.
    pub(crate) fn scoped<T>(&self, f: impl FnOnce() -> T) -> (T, Option<wgpu::Error>) {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        // Popped innermost first, as wgpu requires.
        let validation = pollster::block_on(validation.pop());
        let internal = pollster::block_on(internal.pop());
        let oom = pollster::block_on(oom.pop());
        (out, oom.or(internal).or(validation))
    }

    /// Blocks until submission `index` (or, with `None`, everything submitted) is done and
    /// its callbacks (buffer mappings) have run.
    pub(crate) fn wait(&self, index: Option<wgpu::SubmissionIndex>) -> Result<(), BackendError> {
        self.check()?;
        self.poll(wgpu::PollType::Wait {
            submission_index: index,
            timeout: None,
        })
    }

    fn poll(&self, poll: wgpu::PollType) -> Result<(), BackendError> {
        // `Device::poll` panics (rather than returning an error) when the device is lost or
        // out of memory; that must not take the caller's thread down.
        match catch_unwind(AssertUnwindSafe(|| self.device.poll(poll))) {
            Ok(Ok(_)) => self.check(),
            Ok(Err(e)) => Err(self.lost(format!("waiting for the queue failed: {e}"))),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("wgpu panicked");
                Err(self.lost(format!("waiting for the queue failed: {what}")))
            }
        }
    }

    /// Maps `buffer` (a `MAP_READ` buffer written by submission `index`) for reading, and
    /// blocks until it is mapped.
    pub(crate) fn map_read(
        &self,
        buffer: &wgpu::Buffer,
        index: wgpu::SubmissionIndex,
    ) -> Result<(), BackendError> {
        let (send, receive) = mpsc::channel();
        buffer.map_async(wgpu::MapMode::Read, .., move |result| {
            // The receiver waits below until this arrives; a failed send only means it
            // gave up on an error.
            let _ = send.send(result);
        });
        self.wait(Some(index))?;
        // The mapping is done once the submission is, but its callback runs on whichever
        // thread polled the device: if another thread's poll took it, it may not have run
        // yet. Polling again until it arrives covers that.
        loop {
            match receive.recv_timeout(Duration::from_millis(1)) {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => return Err(self.lost(format!("mapping a buffer failed: {e}"))),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.lost("a buffer mapping was dropped".into()));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.poll(wgpu::PollType::Poll)?,
            }
        }
    }

    /// Marks the device lost for `reason` and returns the error saying so.
    pub(crate) fn lost(&self, reason: String) -> BackendError {
        self.incidents.lose(reason.clone());
        BackendError::DeviceLost {
            device: self.info.name.clone(),
            reason,
        }
    }
}

/// The wgpu features used where the adapter has them: doubles and 64-bit integers widen the
/// dtypes kernels may use, timestamps make `time` exact; f16 and subgroups are reported in
/// [`Features`] (no kernel uses them yet, and enabling them costs nothing).
fn wanted_features() -> wgpu::Features {
    wgpu::Features::SHADER_F64
        | wgpu::Features::SHADER_INT64
        | wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
}

/// An adapter found, before its device is opened.
struct Candidate {
    adapter: wgpu::Adapter,
    info: wgpu::AdapterInfo,
    /// What a name selector is matched against: name, backend, driver, driver info and type.
    haystack: String,
}

/// Every compute-capable adapter (discrete GPUs first, then integrated, virtual, other and
/// CPU ones), narrowed by `selector`, each with its device open. Any failure costs only the
/// adapter concerned, and a panic inside wgpu or a driver costs all of them: never the
/// caller's thread.
pub(crate) fn discover(selector: Option<&str>) -> Vec<GpuDevice> {
    catch_unwind(|| discover_inner(selector)).unwrap_or_else(|_| {
        tracing::warn!("tessel-wgpu: wgpu panicked while listing adapters: no devices");
        Vec::new()
    })
}

fn discover_inner(selector: Option<&str>) -> Vec<GpuDevice> {
    if wgpu::Instance::enabled_backend_features().is_empty() {
        tracing::debug!("tessel-wgpu: no wgpu backend is built for this target: no devices");
        return Vec::new();
    }
    // `WGPU_BACKEND` (e.g. `vulkan`) restricts the APIs; the instance flags start empty,
    // whatever the build profile, so that debug builds measure what release builds run,
    // and `WGPU_VALIDATION=1`/`WGPU_DEBUG=1` turn the API's validation layers on.
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::all().with_env();
    desc.flags = wgpu::InstanceFlags::empty().with_env();
    desc.backend_options = wgpu::BackendOptions::from_env_or_default();
    let backends = desc.backends;
    let instance = wgpu::Instance::new(desc);
    let adapters = pollster::block_on(instance.enumerate_adapters(backends));
    let mut candidates: Vec<Candidate> = adapters
        .into_iter()
        .filter_map(|adapter| {
            let info = adapter.get_info();
            let caps = adapter.get_downlevel_capabilities();
            if !caps.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS) {
                tracing::info!(
                    "tessel-wgpu: skipping `{}` ({:?}): no compute shaders",
                    info.name,
                    info.backend
                );
                return None;
            }
            let haystack = format!(
                "{} | {:?} | {} | {} | {:?}",
                info.name, info.backend, info.driver, info.driver_info, info.device_type
            );
            Some(Candidate {
                adapter,
                info,
                haystack,
            })
        })
        .collect();
    // Stable: within a type, wgpu's order, which lists Vulkan, Metal and DX12 in that order.
    candidates.sort_by_key(|c| type_rank(c.info.device_type));
    if candidates.is_empty() {
        tracing::debug!("tessel-wgpu: no adapter with compute shaders ({backends:?}): no devices");
        return Vec::new();
    }
    let haystacks: Vec<&str> = candidates.iter().map(|c| c.haystack.as_str()).collect();
    let keys: Vec<Key<'_>> = candidates
        .iter()
        .map(|c| {
            let id = (c.info.vendor, c.info.device, c.info.name.as_str());
            (id, c.info.backend)
        })
        .collect();
    let chosen = select(&haystacks, &keys, selector);
    if chosen.is_empty() {
        tracing::warn!(
            "tessel-wgpu: TESSEL_WGPU_ADAPTER={:?} matches none of the adapters {haystacks:?}",
            selector.unwrap_or_default()
        );
    }
    candidates
        .into_iter()
        .enumerate()
        .filter(|(k, _)| chosen.contains(k))
        .filter_map(|(_, c)| match open(&c) {
            Ok(device) => {
                tracing::debug!("tessel-wgpu: using `{}`", c.haystack);
                Some(device)
            }
            Err(e) => {
                tracing::warn!("tessel-wgpu: cannot open `{}`: {e}", c.haystack);
                None
            }
        })
        .collect()
}

fn type_rank(ty: wgpu::DeviceType) -> u8 {
    match ty {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// A physical device's identity (vendor, device id, name) and the API an adapter reaches
/// it through.
type Key<'a> = ((u32, u32, &'a str), wgpu::Backend);

/// The positions in `haystacks` that `selector` picks.
///
/// Without a selector: every adapter, but one physical device only once. A GPU that two
/// APIs expose (Vulkan and DX12 on Windows) shows up as one adapter per API; only the
/// adapters of the first API that lists an identity (`keys`) are kept (all of them, so that two identical GPUs stay two devices). With an index:
/// that entry of the list without a selector. With anything else: every adapter whose
/// haystack contains it, ignoring case (so `dx12` picks the DX12 adapters).
fn select(haystacks: &[&str], keys: &[Key<'_>], selector: Option<&str>) -> Vec<usize> {
    let deduplicated = || -> Vec<usize> {
        (0..keys.len())
            .filter(|&k| {
                let (id, api) = keys[k];
                keys.iter().find(|(other, _)| *other == id).map(|&(_, a)| a) == Some(api)
            })
            .collect()
    };
    let Some(selector) = selector.map(str::trim).filter(|s| !s.is_empty()) else {
        return deduplicated();
    };
    if let Ok(index) = selector.parse::<usize>() {
        return deduplicated()
            .get(index)
            .map(|&k| vec![k])
            .unwrap_or_default();
    }
    let needle = selector.to_lowercase();
    (0..haystacks.len())
        .filter(|&k| haystacks[k].to_lowercase().contains(&needle))
        .collect()
}

/// Opens the device and queue of an adapter, with its full limits and the wanted features
/// it has, and installs the handlers that keep asynchronous errors from panicking.
fn open(c: &Candidate) -> Result<GpuDevice, String> {
    let adapter = &c.adapter;
    let features = adapter.features() & wanted_features();
    // The adapter's own limits, not wgpu's conservative defaults: buffers up to the
    // hardware's size, the largest workgroups.
    let limits = adapter.limits();
    let desc = wgpu::DeviceDescriptor {
        label: Some("tessel"),
        required_features: features,
        required_limits: limits.clone(),
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    };
    let (device, queue) =
        pollster::block_on(adapter.request_device(&desc)).map_err(|e| e.to_string())?;
    let incidents = Arc::new(Incidents::default());
    let name = c.info.name.clone();
    {
        let incidents = Arc::clone(&incidents);
        let name = name.clone();
        // Without a handler, wgpu panics on any error outside a scope.
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            tracing::error!("tessel-wgpu: uncaptured error on `{name}`: {error}");
            incidents.record(error.to_string());
        }));
    }
    {
        let incidents = Arc::clone(&incidents);
        let name = name.clone();
        device.set_device_lost_callback(move |reason, message| {
            // Dropping the backend destroys the device too; only other losses are news.
            if reason != wgpu::DeviceLostReason::Destroyed {
                tracing::error!("tessel-wgpu: device `{name}` lost ({reason:?}): {message}");
            }
            incidents.lose(format!("{reason:?}: {message}"));
        });
    }
    let has = |f: wgpu::Features| features.contains(f);
    let subgroup_size = has(wgpu::Features::SUBGROUP)
        .then_some(c.info.subgroup_min_size)
        .filter(|&s| s > 0 && s == c.info.subgroup_max_size);
    let info = DeviceInfo {
        name: name.clone(),
        kind: if c.info.device_type == wgpu::DeviceType::Cpu {
            DeviceKind::Cpu
        } else {
            DeviceKind::Gpu
        },
        driver: format!("{} {}", c.info.driver, c.info.driver_info),
        // wgpu has no query for the device's memory: the largest buffer stands in (see the
        // crate docs).
        memory_bytes: limits.max_buffer_size,
        // Nor for its compute units: 0 means unknown.
        compute_units: 0,
        max_workgroup_size: limits.max_compute_invocations_per_workgroup,
        max_local_size: [
            limits.max_compute_workgroup_size_x,
            limits.max_compute_workgroup_size_y,
            limits.max_compute_workgroup_size_z,
        ],
        max_groups: [u64::from(limits.max_compute_workgroups_per_dimension); 3],
        local_memory_bytes: u64::from(limits.max_compute_workgroup_storage_size),
        features: Features {
            f16: has(wgpu::Features::SHADER_F16),
            // The WGSL emitter works on an `f64`'s bits (NaN tests, `max`, `%`,
            // conversions) as 64-bit integers, so doubles need both features.
            f64: has(wgpu::Features::SHADER_F64) && has(wgpu::Features::SHADER_INT64),
            int64: has(wgpu::Features::SHADER_INT64),
            f64_math: false,
            subgroup_size,
            matrix_units: false,
            // WGSL lets an implementation flush f32 subnormals (NVIDIA's Vulkan driver
            // does), and wgpu cannot query a driver's float controls.
            subnormals_may_flush: true,
            cooperative_workgroups: true,
            // WGSL has 32-bit atomics only.
            atomics64: false,
        },
    };
    let details = WgpuDeviceDetails {
        backend: format!("{:?}", c.info.backend),
        device_type: format!("{:?}", c.info.device_type),
        driver: c.info.driver.clone(),
        driver_info: c.info.driver_info.clone(),
        shader_f64: has(wgpu::Features::SHADER_F64),
        shader_int64: has(wgpu::Features::SHADER_INT64),
        timestamps: has(wgpu::Features::TIMESTAMP_QUERY),
        max_buffer_size: limits.max_buffer_size,
        max_storage_binding: limits.max_storage_buffer_binding_size,
        max_storage_buffers: limits.max_storage_buffers_per_shader_stage,
    };
    let target = WgslTarget {
        f64: details.shader_f64,
        int64: details.shader_int64,
        max_groups_per_dim: limits.max_compute_workgroups_per_dimension,
        max_invocations: limits.max_compute_invocations_per_workgroup,
    };
    Ok(GpuDevice {
        info,
        details,
        device,
        queue,
        limits,
        target,
        incidents,
    })
}

#[cfg(test)]
mod tests {
    use wgpu::Backend;

    use super::select;

    #[test]
    fn selectors_pick_by_index_or_name_and_skip_duplicate_apis() {
        let hay = [
            "NVIDIA RTX | Vulkan | NVIDIA | 580 | DiscreteGpu",
            "NVIDIA RTX | Vulkan | NVIDIA | 580 | DiscreteGpu",
            "NVIDIA RTX | Dx12 |  |  | DiscreteGpu",
            "NVIDIA RTX | Dx12 |  |  | DiscreteGpu",
            "llvmpipe (LLVM 15) | Vulkan | llvmpipe | Mesa 23 | Cpu",
        ];
        let rtx = (0x10de, 1, "NVIDIA RTX");
        let keys = [
            (rtx, Backend::Vulkan),
            (rtx, Backend::Vulkan),
            (rtx, Backend::Dx12),
            (rtx, Backend::Dx12),
            ((0x10005, 0, "llvmpipe (LLVM 15)"), Backend::Vulkan),
        ];
        assert_eq!(select(&hay, &keys, None), [0, 1, 4]);
        assert_eq!(select(&hay, &keys, Some(" ")), [0, 1, 4]);
        assert_eq!(select(&hay, &keys, Some("2")), [4]);
        assert!(select(&hay, &keys, Some("3")).is_empty());
        assert_eq!(select(&hay, &keys, Some("DX12")), [2, 3]);
        assert_eq!(select(&hay, &keys, Some("llvmpipe")), [4]);
        assert_eq!(select(&hay, &keys, Some("cpu")), [4]);
        assert!(select(&hay, &keys, Some("nomatch")).is_empty());
    }
}
