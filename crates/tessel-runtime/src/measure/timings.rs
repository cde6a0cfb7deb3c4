//! The disk timing cache and the identities its keys (and the plan caches' keys) hash.

use std::path::PathBuf;

use tessel_ir::Backend;
use tessel_ir::cache::{Fnv128, read_keyed, write_keyed};
use tessel_shape::Bindings;

use crate::device::Device;
use crate::planner::Work;

/// The disk timing cache: one small file per (backend, device, driver, program text,
/// dynamic-dim values), or per copy (both devices, size).
pub(super) fn timing_dir() -> PathBuf {
    tessel_ir::cache::default_root().join("timings")
}

/// Hashes the dynamic dims' values (a program takes as long as the sizes it runs at), in
/// name order.
pub(crate) fn dims_identity(h: &mut Fnv128, dims: &Bindings) {
    let mut values: Vec<(String, i64)> = dims.iter().map(|(v, n)| (v.to_string(), n)).collect();
    values.sort_unstable();
    for (name, value) in values {
        h.field(format!("{name}={value}").as_bytes());
    }
}

/// Hashes a backend's device identity: backend, device name and driver.
pub(crate) fn device_identity(h: &mut Fnv128, backend: &dyn Backend, device: Device) {
    h.field(backend.name().as_bytes());
    if let Some(info) = backend.devices().get(device.ordinal) {
        h.field(info.name.as_bytes());
        h.field(info.driver.as_bytes());
    }
}

/// A measured time and how it was taken.
#[derive(Clone, Copy, Debug)]
pub(super) enum Timed {
    /// The median of several runs: what the timing cache keeps.
    Median(f64),
    /// One checking run of a program that loses anyway: an upper bound.
    FirstRun(f64),
}

pub(super) fn timing_key(
    backend: &dyn Backend,
    device: Device,
    work: &Work,
    variant: &str,
    dims: &Bindings,
) -> u128 {
    let mut h = Fnv128::new();
    // v3: v2 caches could hold first-run times of losing candidates.
    h.field(b"tessel-timing-v3");
    // A program with dynamic dims takes as long as the sizes it runs at.
    dims_identity(&mut h, dims);
    device_identity(&mut h, backend, device);
    if let Work::Vendor(_) = work {
        h.field(backend.vendor_library(device.ordinal).as_bytes());
        h.field(variant.as_bytes());
    }
    h.field(work.text().as_bytes());
    h.finish()
}

pub(super) fn copy_key(
    from: (&dyn Backend, Device),
    to: (&dyn Backend, Device),
    bytes: usize,
) -> u128 {
    let mut h = Fnv128::new();
    h.field(b"tessel-copy-v1");
    device_identity(&mut h, from.0, from.1);
    device_identity(&mut h, to.0, to.1);
    h.field(&bytes.to_le_bytes());
    h.finish()
}

pub(super) fn load_timing(key: u128) -> Option<f64> {
    let text = read_keyed(&timing_dir(), key)?;
    text.trim()
        .parse()
        .ok()
        .filter(|t: &f64| t.is_finite() && *t >= 0.0)
}

pub(super) fn store_timing(key: u128, seconds: f64) {
    let dir = timing_dir();
    // A cache that cannot be written costs a measurement next time, nothing else.
    if let Err(e) = write_keyed(&dir, key, &format!("{seconds:e}\n")) {
        tracing::debug!(target: "tessel::plan", "cannot cache a timing in {}: {e}", dir.display());
    }
}
