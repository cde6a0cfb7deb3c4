//! Devices: where tensors live and kernels run.

use std::fmt;
use std::sync::{LazyLock, OnceLock};

use tessel_ir::DeviceInfo;
use tessel_shape::DType;

use crate::error::{Error, Result};

/// A device: one backend's device by ordinal. `Device::cpu()` is the default.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    pub(crate) backend: &'static str,
    pub(crate) ordinal: usize,
}

impl Device {
    /// The host CPU, through the embedded C backend: the `cpu` feature, on by default.
    /// Without that feature, running work on this device is an [`Error::NoDevice`] that
    /// names the feature.
    ///
    /// [`Error::NoDevice`]: crate::Error::NoDevice
    pub const fn cpu() -> Device {
        Device {
            backend: "cpu",
            ordinal: 0,
        }
    }

    /// The backend's name (`"cpu"`, `"cuda"`, ...).
    pub const fn backend(&self) -> &'static str {
        self.backend
    }

    /// The device's ordinal within its backend.
    pub const fn ordinal(&self) -> usize {
        self.ordinal
    }
}

impl Device {
    /// OpenCL device `ordinal` (needs the `opencl` feature).
    pub const fn opencl(ordinal: usize) -> Device {
        Device {
            backend: "opencl",
            ordinal,
        }
    }

    /// CUDA device `ordinal` (needs the `cuda` feature).
    pub const fn cuda(ordinal: usize) -> Device {
        Device {
            backend: "cuda",
            ordinal,
        }
    }

    /// wgpu adapter `ordinal`: Vulkan, Metal or DX12 (needs the `wgpu` feature).
    pub const fn wgpu(ordinal: usize) -> Device {
        Device {
            backend: "wgpu",
            ordinal,
        }
    }

    /// Every device of every compiled-in backend, the CPU first. A backend whose driver
    /// is absent contributes none.
    pub fn all() -> Vec<Device> {
        crate::runtime()
            .backends()
            .iter()
            .flat_map(|b| {
                let backend = BACKENDS
                    .iter()
                    .find(|&&name| name == b.name())
                    .copied()
                    .unwrap_or("unknown");
                (0..b.devices().len()).map(move |ordinal| Device { backend, ordinal })
            })
            .collect()
    }

    /// What the device is and can do: its name, memory, limits and features.
    pub fn info(&self) -> Result<DeviceInfo> {
        let backend = crate::runtime().backend(*self)?;
        Ok(backend.devices()[self.ordinal].clone())
    }

    /// Whether tensors of `dtype` can be computed on the device (`f64` and the 64-bit
    /// integers need device support; see [`Features::supports`](crate::Features::supports)). `false` when the device
    /// is not available.
    pub fn supports(&self, dtype: DType) -> bool {
        self.info().is_ok_and(|info| info.features.supports(dtype))
    }

    /// Whether kernels on the device add `dtype` values atomically
    /// ([`Features::atomics64`](crate::Features::atomics64) for the 64-bit ones): scatters
    /// of other dtypes take a slower path.
    pub fn atomic_adds(&self, dtype: DType) -> bool {
        dtype.size_bytes() < 8 || self.info().is_ok_and(|info| info.features.atomics64)
    }

    /// Waits until every kernel launched on the device has finished (as
    /// `torch.cuda.synchronize()`): realizing returns once the work is queued, reading data
    /// waits by itself, and timing code calls this.
    pub fn synchronize(&self) -> Result<()> {
        if let Some(check) = BEFORE_SYNCHRONIZE.get() {
            check()?;
        }
        let backend = crate::runtime().backend(*self)?;
        backend.synchronize(self.ordinal)?;
        Ok(())
    }

    /// Parses `cpu`, `opencl`, `opencl:1`, ... (a backend name, optionally `:ordinal`).
    ///
    /// ```
    /// # use tessel_runtime::Device;
    /// assert_eq!(Device::parse("opencl:1").unwrap(), Device::opencl(1));
    /// assert_eq!(Device::parse("cpu").unwrap(), Device::cpu());
    /// assert!(Device::parse("tpu").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Device> {
        let (name, ordinal) = match text.trim().split_once(':') {
            Some((name, ordinal)) => {
                let ordinal = ordinal.parse().map_err(|_| Error::InvalidArgument {
                    op: "Device::parse",
                    reason: format!(
                        "`{text}`: the ordinal after `:` must be a number, as in `opencl:0`"
                    ),
                })?;
                (name, ordinal)
            }
            None => (text.trim(), 0),
        };
        let backend = BACKENDS
            .iter()
            .find(|b| b.eq_ignore_ascii_case(name))
            .ok_or_else(|| Error::InvalidArgument {
                op: "Device::parse",
                reason: format!(
                    "unknown backend `{name}`; known backends: {}",
                    BACKENDS.join(", ")
                ),
            })?;
        Ok(Device { backend, ordinal })
    }
}

/// Work that [`Device::synchronize`] finishes before it returns: set once by the layer
/// above that records work the device must confirm (`tessel-tensor`'s checked indexing).
static BEFORE_SYNCHRONIZE: OnceLock<fn() -> Result<()>> = OnceLock::new();

/// Makes every [`Device::synchronize`] call `check` first and return its error: the hook
/// through which a layer above the runtime reports failures it recorded on the device
/// (out-of-range indices in checked mode). The first hook set stays; later calls change
/// nothing.
pub fn on_synchronize(check: fn() -> Result<()>) {
    let _ = BEFORE_SYNCHRONIZE.set(check);
}

/// Every backend name Tessel knows, compiled in or not.
const BACKENDS: [&str; 4] = ["cpu", "opencl", "cuda", "wgpu"];

/// The device new tensors are created on: `TESSEL_DEVICE` (e.g. `opencl` or `opencl:1`),
/// read once, else the CPU. An unparsable value is reported once and ignored.
impl Default for Device {
    fn default() -> Self {
        static DEFAULT: LazyLock<Device> = LazyLock::new(|| match std::env::var("TESSEL_DEVICE") {
            Ok(text) if !text.trim().is_empty() => Device::parse(&text).unwrap_or_else(|e| {
                tracing::warn!("ignoring TESSEL_DEVICE: {e}");
                Device::cpu()
            }),
            _ => Device::cpu(),
        });
        *DEFAULT
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend, self.ordinal)
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
