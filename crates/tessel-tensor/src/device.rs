//! Devices: where tensors live and kernels run.

use std::fmt;

/// A device: one backend's device by ordinal. `Device::cpu()` is the default.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    pub(crate) backend: &'static str,
    pub(crate) ordinal: usize,
}

impl Device {
    /// The host CPU, through the embedded C backend.
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

impl Default for Device {
    fn default() -> Self {
        Device::cpu()
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
