//! The one device this backend has: the host CPU, described from the operating system.

use std::fs;
use std::num::NonZeroUsize;

use tessel_ir::{DeviceInfo, DeviceKind, Features};

/// Workgroup-local memory a kernel may declare. Local arrays (and the per-invocation
/// arrays that carry values across barriers) live on the stack of the thread running the
/// workgroup, so this stays far below [`crate::launch::STACK_BYTES`].
pub(crate) const LOCAL_MEMORY_BYTES: u64 = 1 << 20;

/// The host CPU as a [`DeviceInfo`].
pub(crate) fn host(threads: usize) -> DeviceInfo {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(threads, NonZeroUsize::get);
    DeviceInfo {
        name: cpu_name(&cpuinfo).unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH)),
        kind: DeviceKind::Cpu,
        driver: format!(
            "tessel-cpu {}, {threads} threads",
            env!("CARGO_PKG_VERSION")
        ),
        memory_bytes: mem_total(&meminfo).unwrap_or(0),
        compute_units: u32::try_from(cores).unwrap_or(u32::MAX),
        // Invocations are loop iterations, so any size works; this bound keeps the
        // per-invocation arrays of a barrier kernel comfortably on the stack.
        max_workgroup_size: 1024,
        max_local_size: [1024, 1024, 64],
        // Workgroups are numbered with an i64 at launch.
        max_groups: [i64::MAX as u64; 3],
        local_memory_bytes: LOCAL_MEMORY_BYTES,
        features: Features {
            // f16/bf16 are stored as such but computed in f32.
            f16: false,
            f64: true,
            f64_math: true,
            int64: true,
            subgroup_size: None,
            matrix_units: false,
            subnormals_may_flush: false,
            // One thread runs a workgroup's invocations in turn.
            cooperative_workgroups: false,
            // C11-style built-ins on the host.
            atomics64: true,
        },
    }
}

/// The CPU's model name: x86's `model name`, or the `cpu`/`Model` lines other
/// architectures print.
fn cpu_name(cpuinfo: &str) -> Option<String> {
    ["model name", "cpu model", "Model", "cpu"]
        .iter()
        .find_map(|key| {
            cpuinfo.lines().find_map(|line| {
                let (k, v) = line.split_once(':')?;
                (k.trim() == *key && !v.trim().is_empty()).then(|| v.trim().to_owned())
            })
        })
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::{cpu_name, mem_total};

    #[test]
    fn parses_proc_files() {
        let cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\n";
        assert_eq!(
            cpu_name(cpuinfo).as_deref(),
            Some("AMD EPYC 9654 96-Core Processor")
        );
        assert_eq!(
            cpu_name("processor : 0\ncpu : POWER9\n").as_deref(),
            Some("POWER9")
        );
        assert_eq!(cpu_name(""), None);
        assert_eq!(
            mem_total("MemTotal:       16314216 kB\nMemFree: 1 kB\n"),
            Some(16314216 * 1024)
        );
    }
}
