//! The kernel tuner's settings and its cache.
//!
//! Generated kernels have launch-shape knobs (`tessel_graph::tune`: workgroup size,
//! outputs per invocation, lanes of a cooperative workgroup). Where tuning applies, the
//! planner adds each large kernel's variants as candidates writing the same values as it;
//! measurement checks them against the kernel's output, times them, and extraction keeps
//! the fastest, like any other alternative. The winner's knobs are written to the tuning
//! cache (`<cache root>/tuning/`, one small file per kernel text and device), so a later
//! realize holding the same kernel, in this process or another, compiles only the kernel
//! and that winner: it searches nothing.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

use rustc_hash::FxHashMap;
use tessel_graph::{Graph, Knobs, ScheduledKernel, Search};
use tessel_ir::cache::{Fnv128, read_keyed, write_keyed};
use tessel_ir::{Backend, DeviceInfo, DeviceKind, Kernel, Param};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::planner::Compiled;

/// How hard the planner searches kernels' launch shapes. Set it with [`set_tuning`];
/// `TESSEL_TUNE=0|1|2` sets it at start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Tuning {
    /// Every kernel keeps the heuristics' launch shape (`TESSEL_TUNE=0`).
    Off = 0,
    /// Kernels binding at least 64 MiB get a few other shapes on GPUs, measured where the
    /// kernel is in the plan, takes at least 20 µs and is within 2× of the fastest program
    /// for its values (`TESSEL_TUNE=1`, the default); CPUs keep the heuristics (compiling
    /// is costly there and the shape matters little).
    #[default]
    Default = 1,
    /// Every kernel with knobs gets every combination measured, on every device
    /// (`TESSEL_TUNE=2`).
    Exhaustive = 2,
}

impl FromStr for Tuning {
    type Err = Error;

    /// `0`, `1` or `2`, or `off`, `default` or `exhaustive`.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "0" | "off" => Ok(Tuning::Off),
            "1" | "default" => Ok(Tuning::Default),
            "2" | "exhaustive" => Ok(Tuning::Exhaustive),
            other => Err(Error::InvalidArgument {
                op: "set_tuning",
                reason: format!(
                    "unknown tuning level {other:?}; use 0 (off), 1 (default) or 2 (exhaustive)"
                ),
            }),
        }
    }
}

/// `u8::MAX` until the first query reads `TESSEL_TUNE` (or [`set_tuning`] decides).
static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);

/// Sets how hard new plans search kernels' launch shapes, process-wide. Plans already made
/// keep theirs; plans are cached per level.
///
/// ```
/// tessel_runtime::set_tuning(tessel_runtime::Tuning::Off);
/// assert_eq!(tessel_runtime::tuning(), tessel_runtime::Tuning::Off);
/// tessel_runtime::set_tuning(tessel_runtime::Tuning::Default);
/// ```
pub fn set_tuning(level: Tuning) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// The current [`Tuning`] level.
pub fn tuning() -> Tuning {
    match LEVEL.load(Ordering::Relaxed) {
        0 => Tuning::Off,
        1 => Tuning::Default,
        2 => Tuning::Exhaustive,
        _ => {
            let level = match std::env::var("TESSEL_TUNE") {
                Ok(v) => v.parse().unwrap_or_else(|e| {
                    tracing::warn!(target: "tessel::plan", "TESSEL_TUNE ignored: {e}");
                    Tuning::Default
                }),
                Err(_) => Tuning::Default,
            };
            // A concurrent `set_tuning` wins over the environment.
            let _ =
                LEVEL.compare_exchange(u8::MAX, level as u8, Ordering::Relaxed, Ordering::Relaxed);
            tuning()
        }
    }
}

/// Below this many bytes bound, a kernel takes a few microseconds on a GPU (16 µs at an
/// H200's 4 TB/s): what another shape could save is not worth its compile and
/// measurement (a GPT-2 forward's 500 kernels of 8 MiB or more took 35 s more to plan
/// with every one of them tuned), and [`Tuning::Default`] leaves it alone.
const DEFAULT_MIN_BYTES: i64 = 64 << 20;

impl Tuning {
    /// How kernels are searched on a device of `kind`, if at all.
    pub(crate) fn search_on(self, kind: DeviceKind) -> Option<Search> {
        match (self, kind) {
            (Tuning::Off, _) | (Tuning::Default, DeviceKind::Cpu) => None,
            (Tuning::Default, DeviceKind::Gpu) => Some(Search::Default),
            (Tuning::Exhaustive, _) => Some(Search::Exhaustive),
        }
    }

    /// The search for `kernel` on the widest of `devices`, if any: the cost model that
    /// spares launch-bound kernels the compiles.
    pub(crate) fn search_for(self, kernel: &Kernel, devices: &[Device]) -> Option<Search> {
        let search = devices
            .iter()
            .filter_map(|d| self.search_on(d.info().ok()?.kind))
            .max_by_key(|s| *s == Search::Exhaustive)?;
        (search == Search::Exhaustive || bytes_touched(kernel) >= DEFAULT_MIN_BYTES)
            .then_some(search)
    }
}

/// Makes the variants of a realize's kernels, at one level, for its devices.
pub(crate) struct Tuner<'d> {
    level: Tuning,
    devices: &'d [Device],
}

impl<'d> Tuner<'d> {
    pub(crate) fn new(level: Tuning, devices: &'d [Device]) -> Self {
        Tuner { level, devices }
    }

    /// The launch-shape variants of `kernel` (kernelized from `graph`) worth measuring on
    /// some device of the realize; none where no device tunes it.
    pub(crate) fn variants(
        &self,
        graph: &Graph,
        kernel: &ScheduledKernel,
    ) -> Vec<(Knobs, ScheduledKernel)> {
        self.level
            .search_for(&kernel.kernel, self.devices)
            .map_or_else(Vec::new, |search| kernel.variants(graph, search))
    }
}

/// Which kernel a tuning candidate belongs to, and which shape it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TuneTag {
    /// [`kernel_key`] of the default kernel.
    pub(crate) kernel: u128,
    /// The default kernel's candidate index: the shapes of one group read and write the
    /// same slots (one kernel text may compute several values of a realize).
    pub(crate) group: usize,
    /// The knobs, as [`Knobs`] displays them (`default` for the kernel itself).
    pub(crate) knobs: String,
}

impl TuneTag {
    pub(crate) fn default_of(kernel: u128, group: usize) -> Self {
        TuneTag {
            kernel,
            group,
            knobs: Knobs::default().to_string(),
        }
    }

    pub(crate) fn is_default(&self) -> bool {
        self.knobs == Knobs::default().to_string()
    }
}

/// Whether and when a program is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Build {
    /// Not on this device.
    No,
    /// With the other programs, before measuring.
    Now,
    /// When measurement decides to measure it, if it does.
    Later,
}

/// Decides, while compiling, which variants each device builds: all of them where the
/// tuning cache has no winner for the kernel there (a search: each built when
/// measurement decides to measure it), else only the winner.
pub(crate) struct Winners {
    level: Tuning,
    known: FxHashMap<(u128, usize), Option<String>>,
    /// (kernel, device index) pairs searched.
    pub(crate) searches: Vec<(u128, usize)>,
}

impl Winners {
    pub(crate) fn new(level: Tuning) -> Self {
        Winners {
            level,
            known: FxHashMap::default(),
            searches: Vec::new(),
        }
    }

    /// Whether and when `kernel`, tagged `tag`, is built on device `d` (`device` of
    /// `backend`).
    pub(crate) fn wants(
        &mut self,
        tag: &TuneTag,
        kernel: &Kernel,
        (d, device, backend): (usize, Device, &dyn Backend),
    ) -> Build {
        if tag.is_default() {
            return Build::Now;
        }
        let Some(info) = backend.devices().get(device.ordinal).cloned() else {
            return Build::No;
        };
        if self.level.search_on(info.kind).is_none() || !fits(kernel, &info) {
            return Build::No;
        }
        let winner = self
            .known
            .entry((tag.kernel, d))
            .or_insert_with(|| load(device_key(tag.kernel, backend, device)));
        if let Some(w) = winner {
            return if *w == tag.knobs {
                Build::Now
            } else {
                Build::No
            };
        }
        if !self.searches.contains(&(tag.kernel, d)) {
            self.searches.push((tag.kernel, d));
        }
        Build::Later
    }
}

/// Below this, a kernel's default shape is left alone: another shape could save a few
/// microseconds at most, less than measuring it costs.
const TUNE_MIN_SECONDS: f64 = 20e-6;

/// A kernel whose default shape is this many times slower than the fastest program
/// writing the same values is not tuned: launch shapes move a kernel by tens of percent,
/// not by this much.
const TUNE_LOSING: f64 = 2.0;

/// Why another shape of a kernel whose default shape took `base` seconds, where the
/// fastest program writing the same values took `best`, is not worth measuring at
/// `level` (exhaustive tuning measures every shape).
pub(crate) fn hopeless(level: Tuning, base: f64, best: f64) -> Option<String> {
    if level == Tuning::Exhaustive {
        None
    } else if base < TUNE_MIN_SECONDS {
        Some(format!("its default shape takes {:.1} µs", base * 1e6))
    } else if base > best * TUNE_LOSING {
        Some(format!(
            "its default shape ({:.1} µs) is over {TUNE_LOSING} times the fastest program writing its values ({:.1} µs)",
            base * 1e6,
            best * 1e6
        ))
    } else {
        None
    }
}

/// Whether a kernel's workgroup fits the device's limits.
fn fits(kernel: &Kernel, info: &DeviceInfo) -> bool {
    let local: Vec<i64> = kernel
        .grid
        .local
        .iter()
        .map(|d| d.as_const().unwrap_or(i64::MAX))
        .collect();
    local.iter().product::<i64>() <= i64::from(info.max_workgroup_size)
        && local
            .iter()
            .zip(info.max_local_size)
            .all(|(&l, max)| l <= i64::from(max))
}

/// The fastest measured program of each group of shapes on each device, by program
/// index: the others are never better substitutes for it, so extraction does not see
/// them (several shapes per kernel would multiply its search for nothing).
pub(crate) fn fastest(
    compiled: &Compiled,
    times: &[Option<f64>],
) -> FxHashMap<(usize, usize), usize> {
    let mut best: FxHashMap<(usize, usize), usize> = FxHashMap::default();
    for (k, b) in compiled.programs.iter().enumerate() {
        let (Some(tag), Some(t)) = (&compiled.candidates[b.candidate].tuning, times[k]) else {
            continue;
        };
        let slot = best.entry((tag.group, b.device)).or_insert(k);
        if times[*slot].is_none_or(|s| t < s) {
            *slot = k;
        }
    }
    best
}

/// Whether program `k` is a shape that lost to another of its group (see [`fastest`]).
pub(crate) fn lost(
    compiled: &Compiled,
    fastest: &FxHashMap<(usize, usize), usize>,
    k: usize,
) -> bool {
    let b = &compiled.programs[k];
    compiled.candidates[b.candidate]
        .tuning
        .as_ref()
        .is_some_and(|tag| fastest.get(&(tag.group, b.device)) != Some(&k))
}

/// Stores the fastest shape of each kernel searched while compiling, by the measured
/// `times` of the programs (a variant dropped unmeasured, too slow or wrong, cannot win).
/// A kernel whose other shapes went unmeasured because it was not in `planned` (the plan
/// chosen without them) is not stored: in another graph it may be, and a search costs
/// little when nothing is measured.
pub(crate) fn record(
    compiled: &Compiled,
    times: &[Option<f64>],
    planned: Option<&rustc_hash::FxHashSet<usize>>,
) {
    for (&(group, d), &k) in &fastest(compiled, times) {
        let b = &compiled.programs[k];
        let Some(tag) = &compiled.candidates[b.candidate].tuning else {
            continue;
        };
        if !compiled.searches.contains(&(tag.kernel, d)) {
            continue;
        }
        let shapes_measured = compiled.programs.iter().zip(times).any(|(o, t)| {
            t.is_some()
                && o.device == d
                && compiled.candidates[o.candidate]
                    .tuning
                    .as_ref()
                    .is_some_and(|other| other.group == group && !other.is_default())
        });
        if !shapes_measured && planned.is_some_and(|p| !p.contains(&k)) {
            continue;
        }
        let (device, backend) = &compiled.devices[d];
        let seconds = times[k].unwrap_or(f64::NAN);
        tracing::debug!(target: "tessel::plan", "{device}: tuned {}: {} in {:.1} µs", compiled.candidates[b.candidate].work.name(), tag.knobs, seconds * 1e6);
        store(device_key(tag.kernel, &**backend, *device), &tag.knobs);
        compiled
            .winners_stored
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The bytes of every buffer a kernel binds (an upper bound where dims are dynamic).
fn bytes_touched(kernel: &Kernel) -> i64 {
    kernel
        .params
        .iter()
        .map(|p| match p {
            Param::Buffer { dtype, len, .. } => {
                len.bounds().hi.saturating_mul(dtype.size_bytes() as i64)
            }
            Param::Dim { .. } => 0,
        })
        .fold(0, i64::saturating_add)
}

/// A tuned kernel's identity: the default kernel's text, hashed.
pub(crate) fn kernel_key(kernel: &Kernel) -> u128 {
    let mut h = Fnv128::new();
    h.field(kernel.to_string().as_bytes());
    h.finish()
}

/// The cache file's key: the kernel and the device (backend, name, driver), so another
/// driver or another kernel text tunes again.
pub(crate) fn cache_key(kernel: u128, backend: &str, device: &str, driver: &str) -> u128 {
    let mut h = Fnv128::new();
    h.field(b"tessel-tune-v1");
    h.field(&kernel.to_le_bytes());
    for part in [backend, device, driver] {
        h.field(part.as_bytes());
    }
    h.finish()
}

/// [`cache_key`] for a device of a backend.
pub(crate) fn device_key(kernel: u128, backend: &dyn Backend, device: Device) -> u128 {
    let info = backend.devices().get(device.ordinal).cloned();
    let (name, driver) = info.map_or_else(Default::default, |i| (i.name, i.driver));
    cache_key(kernel, backend.name(), &name, &driver)
}

fn dir() -> PathBuf {
    tessel_ir::cache::default_root().join("tuning")
}

/// The winning knobs (their `Display` form) stored under `key`.
pub(crate) fn load(key: u128) -> Option<String> {
    let text = read_keyed(&dir(), key)?;
    Some(text.trim().to_owned()).filter(|t| !t.is_empty())
}

/// Stores the winning knobs under `key`.
pub(crate) fn store(key: u128, knobs: &str) {
    let dir = dir();
    // A cache that cannot be written costs a search next time, nothing else.
    if let Err(e) = write_keyed(&dir, key, &format!("{knobs}\n")) {
        tracing::debug!(target: "tessel::plan", "cannot cache a tuned kernel in {}: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_covers_kernel_and_device() {
        let base = cache_key(1, "cuda", "NVIDIA H200", "CUDA driver 13000");
        for other in [
            cache_key(2, "cuda", "NVIDIA H200", "CUDA driver 13000"),
            cache_key(1, "opencl", "NVIDIA H200", "CUDA driver 13000"),
            cache_key(1, "cuda", "NVIDIA H100", "CUDA driver 13000"),
            cache_key(1, "cuda", "NVIDIA H200", "CUDA driver 13010"),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(
            base,
            cache_key(1, "cuda", "NVIDIA H200", "CUDA driver 13000")
        );
    }

    #[test]
    fn fast_or_losing_kernels_are_not_tuned() {
        assert!(hopeless(Tuning::Default, 10e-6, 10e-6).is_some());
        assert!(hopeless(Tuning::Default, 1e-3, 0.2e-3).is_some());
        assert!(hopeless(Tuning::Default, 1e-3, 0.8e-3).is_none());
        assert!(hopeless(Tuning::Exhaustive, 10e-6, 1e-6).is_none());
    }

    #[test]
    fn levels_parse() {
        assert_eq!("2".parse::<Tuning>().unwrap(), Tuning::Exhaustive);
        assert_eq!("off".parse::<Tuning>().unwrap(), Tuning::Off);
        let err = "3".parse::<Tuning>().unwrap_err().to_string();
        assert!(
            err.contains("set_tuning") && err.contains("exhaustive"),
            "{err}"
        );
    }

    #[test]
    fn default_tuning_spares_cpus() {
        assert_eq!(Tuning::Default.search_on(DeviceKind::Cpu), None);
        assert_eq!(
            Tuning::Default.search_on(DeviceKind::Gpu),
            Some(Search::Default)
        );
        assert_eq!(
            Tuning::Exhaustive.search_on(DeviceKind::Cpu),
            Some(Search::Exhaustive)
        );
        assert_eq!(Tuning::Off.search_on(DeviceKind::Gpu), None);
    }
}
