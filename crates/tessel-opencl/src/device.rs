//! Finding OpenCL devices, choosing among them, and setting each up: a context, an in-order
//! queue with profiling, the OpenCL C dialect it compiles and the build options.

use opencl3::command_queue::{CL_QUEUE_PROFILING_ENABLE, CommandQueue};
use opencl3::context::Context;
use opencl3::device::{
    CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU,
    CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT, CL_FP_DENORM, Device,
};
use opencl3::error_codes::{
    CL_DEVICE_NOT_FOUND, CL_PLATFORM_NOT_FOUND_KHR, ClError, DLOPEN_RUNTIME_LOAD_FAILED,
};
use opencl3::platform::{Platform, get_platforms};
use tessel_ir::codegen::{CStyle, OPENCL, OPENCL_NO_FP64};
use tessel_ir::{DeviceInfo, DeviceKind, Features};

use crate::ffi::Queue;

/// The most workgroups per axis reported for every device. OpenCL has no query for it (the
/// only hard limit is that `groups * local` fit a `size_t`), but GPU drivers reject larger
/// grids at launch; these are CUDA's grid limits, the smallest among common hardware.
pub(crate) const MAX_GROUPS: [u64; 3] = [(1 << 31) - 1, 65535, 65535];

/// What the driver says about a device beyond [`DeviceInfo`], for diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenClDeviceDetails {
    /// The platform's name (`"Portable Computing Language"`, `"NVIDIA CUDA"`).
    pub platform: String,
    /// The device's OpenCL version string (`"OpenCL 3.0 PoCL ..."`).
    pub version: String,
    /// The OpenCL C version the device compiles (`"OpenCL C 1.2 PoCL"`).
    pub opencl_c: String,
    /// The driver's version string.
    pub driver: String,
    /// Whether `float` division and `sqrt` can be correctly rounded (the build option
    /// `-cl-fp32-correctly-rounded-divide-sqrt` is then passed); without it they may be off
    /// by a few ulps against the reference.
    pub correctly_rounded_divide_sqrt: bool,
    /// Whether `float` subnormals are kept; without it they flush to zero.
    pub denormals: bool,
    /// Why kernels are built with `-cl-opt-disable`, where they are: PoCL's CPU device on
    /// an x86 target without AVX-512, whose LLVM miscompiles vectorized integer remainders.
    pub optimizations_off: Option<&'static str>,
}

/// One device in use, with what this backend keeps for it.
pub(crate) struct ClDevice {
    pub(crate) info: DeviceInfo,
    pub(crate) details: OpenClDeviceDetails,
    pub(crate) device: Device,
    pub(crate) context: Context,
    pub(crate) queue: Queue,
    /// [`OPENCL`] or, without doubles, [`OPENCL_NO_FP64`].
    pub(crate) dialect: &'static CStyle,
    pub(crate) build_options: String,
    /// The largest single buffer, in bytes.
    pub(crate) max_alloc: u64,
}

/// A device as found, before it is set up.
struct Candidate {
    platform: Platform,
    device: Device,
    platform_name: String,
    name: String,
    /// What a name selector is matched against: the platform's and device's names, vendors
    /// and versions (so `pocl` finds PoCL, whose platform is named "Portable Computing
    /// Language" but versioned "OpenCL 3.0 PoCL ...").
    haystack: String,
    /// GPUs first, then accelerators, CPUs, anything else.
    rank: u8,
}

/// Every usable OpenCL device, GPUs first, narrowed by `selector` (an index into that list,
/// or a case-insensitive substring of a device's names, vendors and versions; see
/// `Candidate::haystack`); without doubles where `disable_f64`. Problems are logged and cost only the device concerned: no loader, no
/// platform or a failing driver means no devices, never a panic.
pub(crate) fn discover(selector: Option<&str>, disable_f64: bool) -> Vec<ClDevice> {
    let platforms = match get_platforms() {
        Ok(platforms) => platforms,
        Err(ClError(code))
            if code == DLOPEN_RUNTIME_LOAD_FAILED || code == CL_PLATFORM_NOT_FOUND_KHR =>
        {
            tracing::debug!(
                "tessel-opencl: no OpenCL {} ({}): no devices",
                if code == DLOPEN_RUNTIME_LOAD_FAILED {
                    "loader (libOpenCL.so.1, or $OPENCL_DYLIB_PATH)"
                } else {
                    "platform (no ICD registered)"
                },
                ClError(code)
            );
            return Vec::new();
        }
        Err(e) => {
            tracing::warn!("tessel-opencl: listing OpenCL platforms failed ({e}): no devices");
            return Vec::new();
        }
    };
    let mut candidates = Vec::new();
    for platform in platforms {
        let platform_name = platform.name().unwrap_or_default().trim().to_owned();
        let ids = match platform.get_devices(CL_DEVICE_TYPE_ALL) {
            Ok(ids) => ids,
            Err(ClError(CL_DEVICE_NOT_FOUND)) => continue,
            Err(e) => {
                tracing::warn!("tessel-opencl: platform `{platform_name}` lists no devices: {e}");
                continue;
            }
        };
        for id in ids {
            let device = Device::new(id);
            let name = device.name().unwrap_or_default().trim().to_owned();
            if let Some(why) = unusable(device) {
                tracing::info!("tessel-opencl: skipping `{platform_name}: {name}`: {why}");
                continue;
            }
            let ty = device.dev_type().unwrap_or(0);
            let rank = if ty & CL_DEVICE_TYPE_GPU != 0 {
                0
            } else if ty & CL_DEVICE_TYPE_ACCELERATOR != 0 {
                1
            } else if ty & CL_DEVICE_TYPE_CPU != 0 {
                2
            } else {
                3
            };
            let haystack = [
                platform_name.clone(),
                platform.vendor().unwrap_or_default(),
                platform.version().unwrap_or_default(),
                name.clone(),
                device.vendor().unwrap_or_default(),
                device.version().unwrap_or_default(),
            ]
            .join(" | ");
            candidates.push(Candidate {
                platform,
                device,
                platform_name: platform_name.clone(),
                name,
                haystack,
                rank,
            });
        }
    }
    // Stable: within a rank, platforms and devices keep the driver's order.
    candidates.sort_by_key(|c| c.rank);
    let names: Vec<String> = candidates
        .iter()
        .map(|c| format!("{}: {}", c.platform_name, c.name))
        .collect();
    let haystacks: Vec<&str> = candidates.iter().map(|c| c.haystack.as_str()).collect();
    let chosen = select(&haystacks, selector);
    if chosen.is_empty() && !candidates.is_empty() {
        tracing::warn!(
            "tessel-opencl: TESSEL_OPENCL_DEVICE={:?} matches none of the devices {names:?}",
            selector.unwrap_or_default()
        );
    }
    candidates
        .into_iter()
        .enumerate()
        .filter(|(k, _)| chosen.contains(k))
        .filter_map(|(_, c)| match set_up(&c, disable_f64) {
            Ok(device) => {
                tracing::debug!(
                    "tessel-opencl: using `{}: {}` ({})",
                    c.platform_name,
                    c.name,
                    device.details.opencl_c
                );
                Some(device)
            }
            Err(e) => {
                tracing::warn!(
                    "tessel-opencl: cannot set up `{}: {}`: {e}",
                    c.platform_name,
                    c.name
                );
                None
            }
        })
        .collect()
}

/// Why kernels must be built unoptimized on a device, if they must: PoCL's CPU device
/// compiling for an x86 target without AVX-512 (the LLVM target in its name, such as
/// `pthread-haswell-...` on AMD Zen 3). There, LLVM's vectorization of PoCL's work-item
/// loops miscompiles integer remainders by a constant that feed comparisons (checked with
/// PoCL 3.1 on LLVM 15: `cummax` of a `[4, 7, 3]` bool tensor along axis 1, whose window
/// guard is `j <= i % 7`, gets wrong indices in 4 lanes; the same source is right on the
/// `skylake-avx512` target, unvectorized, and built with `-cl-opt-disable`). Rewriting the
/// remainder in the source does not help: LLVM folds `a - a / b * b` back into it.
fn miscompiling_driver(version: &str, cpu: bool, name: &str) -> Option<&'static str> {
    /// LLVM's x86 targets with AVX2 and without AVX-512 (PoCL's distribution builds use
    /// `haswell` for every such CPU).
    const AVX2_TARGETS: [&str; 7] = [
        "haswell",
        "broadwell",
        "skylake",
        "alderlake",
        "znver1",
        "znver2",
        "znver3",
    ];
    let pocl = version.contains("PoCL");
    // PoCL names its CPU device `pthread-<LLVM target>-<CPU model>`.
    let target = name.strip_prefix("pthread-").unwrap_or("");
    let x86_without_avx512 =
        !target.contains("avx512") && AVX2_TARGETS.iter().any(|t| target.starts_with(t));
    (pocl && cpu && x86_without_avx512).then_some(
        "LLVM's vectorized work-item loops on this x86 target (no AVX-512) miscompile integer \
         remainders that feed comparisons",
    )
}

/// Why a device cannot run Tessel's kernels, if it cannot.
fn unusable(device: Device) -> Option<String> {
    if !device.available().unwrap_or(false) {
        return Some("the driver reports it unavailable".into());
    }
    if !device.compiler_available().unwrap_or(false) {
        return Some("it has no OpenCL C compiler".into());
    }
    if !device.endian_little().unwrap_or(false) {
        return Some("it is big-endian, and Tessel's buffers are little-endian".into());
    }
    let version = device.opencl_c_version().unwrap_or_default();
    match opencl_c_version(&version) {
        Some(v) if v >= (1, 2) => None,
        _ => Some(format!(
            "it compiles `{version}`, and Tessel's kernels need OpenCL C 1.2"
        )),
    }
}

/// `(major, minor)` from an `"OpenCL C 1.2 ..."` or `"OpenCL 3.0 ..."` string.
fn opencl_c_version(text: &str) -> Option<(u32, u32)> {
    let number = text
        .split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    let (major, minor) = number.split_once('.')?;
    let minor: String = minor.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The positions in `names` that `selector` picks: all without one, the one it numbers, or
/// those containing it (ignoring case).
fn select(names: &[&str], selector: Option<&str>) -> Vec<usize> {
    let Some(selector) = selector.map(str::trim).filter(|s| !s.is_empty()) else {
        return (0..names.len()).collect();
    };
    if let Ok(index) = selector.parse::<usize>() {
        return if index < names.len() {
            vec![index]
        } else {
            Vec::new()
        };
    }
    let needle = selector.to_lowercase();
    (0..names.len())
        .filter(|&k| names[k].to_lowercase().contains(&needle))
        .collect()
}

/// Creates the context and queue of a candidate and reads its limits.
fn set_up(c: &Candidate, disable_f64: bool) -> Result<ClDevice, ClError> {
    let device = &c.device;
    let extensions = device.extensions()?;
    let has = |ext: &str| extensions.split_whitespace().any(|e| e == ext);
    let f64 = has("cl_khr_fp64") && !disable_f64;
    let single = device.single_fp_config()?;
    let version = device.version().unwrap_or_default();
    let is_cpu = device.dev_type().unwrap_or(0) & CL_DEVICE_TYPE_CPU != 0;
    let details = OpenClDeviceDetails {
        platform: c.platform_name.clone(),
        optimizations_off: miscompiling_driver(&version, is_cpu, &c.name),
        version,
        opencl_c: device.opencl_c_version().unwrap_or_default(),
        driver: device.driver_version().unwrap_or_default(),
        correctly_rounded_divide_sqrt: single & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT != 0,
        denormals: single & CL_FP_DENORM != 0,
    };
    if let Some(why) = details.optimizations_off {
        tracing::info!(
            "tessel-opencl: `{}`: kernels are built with -cl-opt-disable: {why}",
            c.name
        );
    }
    if !details.correctly_rounded_divide_sqrt {
        tracing::warn!(
            "tessel-opencl: `{}` cannot round float division and sqrt correctly; results \
             may differ from the reference by a few ulps",
            c.name
        );
    }
    if !details.denormals {
        tracing::warn!(
            "tessel-opencl: `{}` flushes float subnormals to zero; results on subnormals \
             differ from the reference",
            c.name
        );
    }
    let sizes = device.max_work_item_sizes()?;
    let size = |axis: usize| {
        sizes
            .get(axis)
            .map_or(1, |&s| u32::try_from(s).unwrap_or(u32::MAX))
    };
    let info = DeviceInfo {
        name: c.name.clone(),
        kind: if is_cpu {
            DeviceKind::Cpu
        } else {
            DeviceKind::Gpu
        },
        // Unoptimized builds run at other speeds: their measured times are kept apart.
        driver: format!(
            "{} / {}{}",
            details.platform,
            details.driver,
            if details.optimizations_off.is_some() {
                " / -cl-opt-disable"
            } else {
                ""
            }
        ),
        memory_bytes: device.global_mem_size()?,
        compute_units: device.max_compute_units()?,
        max_workgroup_size: u32::try_from(device.max_work_group_size()?).unwrap_or(u32::MAX),
        max_local_size: [size(0), size(1), size(2)],
        max_groups: MAX_GROUPS,
        local_memory_bytes: device.local_mem_size()?,
        features: Features {
            // The capability; Tessel's kernels still compute f16 in f32 (to round exactly
            // as the reference does) and store it with `vload_half`/`vstore_half`.
            f16: has("cl_khr_fp16"),
            f64,
            f64_math: f64,
            // 64-bit integers are core OpenCL C.
            int64: true,
            // Subgroup sizes are a per-kernel query, and no kernel uses subgroups yet.
            subgroup_size: None,
            matrix_units: false,
            subnormals_may_flush: false,
            cooperative_workgroups: true,
            // `atom_add`/`atom_cmpxchg` and `atom_max` on 64-bit words (and `f64` sums
            // through them, which need `cl_khr_fp64` as well).
            atomics64: f64
                && has("cl_khr_int64_base_atomics")
                && has("cl_khr_int64_extended_atomics"),
        },
    };
    let mut options = Vec::new();
    if details.correctly_rounded_divide_sqrt {
        options.push("-cl-fp32-correctly-rounded-divide-sqrt");
    }
    if details.optimizations_off.is_some() {
        options.push("-cl-opt-disable");
    }
    let build_options = options.join(" ");
    let context = Context::from_device(device)?;
    let queue = create_queue(c.platform, &context)?;
    Ok(ClDevice {
        info,
        details,
        device: Device::new(device.id()),
        max_alloc: device.max_mem_alloc_size()?,
        context,
        queue: Queue::new(queue),
        dialect: if f64 { &OPENCL } else { &OPENCL_NO_FP64 },
        build_options,
    })
}

/// An in-order queue with profiling on the context's one device.
fn create_queue(platform: Platform, context: &Context) -> Result<CommandQueue, ClError> {
    let version = platform.version().unwrap_or_default();
    if opencl_c_version(&version).is_some_and(|v| v >= (2, 0)) {
        CommandQueue::create_default_with_properties(context, CL_QUEUE_PROFILING_ENABLE, 0)
    } else {
        // `clCreateCommandQueueWithProperties` is OpenCL 2.0; a 1.2 platform's dispatch
        // table lacks it, so it gets the older call.
        #[allow(deprecated)]
        CommandQueue::create_default(context, CL_QUEUE_PROFILING_ENABLE)
    }
}

#[cfg(test)]
mod tests {
    use super::{miscompiling_driver, opencl_c_version, select};

    #[test]
    fn unoptimized_builds_only_for_pocl_on_avx2_targets() {
        let pocl = "OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, RELOC, LLVM 15.0.6";
        assert!(miscompiling_driver(pocl, true, "pthread-haswell-AMD EPYC 7B13").is_some());
        assert!(miscompiling_driver(pocl, true, "pthread-znver3-AMD EPYC").is_some());
        assert!(miscompiling_driver(pocl, true, "pthread-skylake-Intel Core i7").is_some());
        for fine in [
            "pthread-skylake-avx512-AMD EPYC",
            "pthread-znver4-AMD EPYC",
            "pthread-cascadelake-Intel Xeon",
        ] {
            assert_eq!(miscompiling_driver(pocl, true, fine), None, "{fine}");
        }
        assert_eq!(
            miscompiling_driver("OpenCL 3.0 CUDA 13.0.98", false, "NVIDIA H200"),
            None
        );
        assert_eq!(miscompiling_driver(pocl, false, "pthread-haswell-x"), None);
    }

    #[test]
    fn versions_parse() {
        assert_eq!(opencl_c_version("OpenCL C 1.2 PoCL"), Some((1, 2)));
        assert_eq!(opencl_c_version("OpenCL 3.0 CUDA 13.0.98"), Some((3, 0)));
        assert_eq!(opencl_c_version("OpenCL C 1.1 "), Some((1, 1)));
        assert_eq!(opencl_c_version("garbage"), None);
    }

    #[test]
    fn selectors_pick_by_index_or_name() {
        let names = [
            "NVIDIA CUDA | NVIDIA Corporation | OpenCL 3.0 CUDA 13.0.98 | NVIDIA H200",
            "Portable Computing Language | The pocl project | OpenCL 3.0 PoCL 3.1 | pthread-skylake",
        ];
        assert_eq!(select(&names, None), [0, 1]);
        assert_eq!(select(&names, Some(" ")), [0, 1]);
        assert_eq!(select(&names, Some("1")), [1]);
        assert!(select(&names, Some("2")).is_empty());
        assert_eq!(select(&names, Some("PoCL")), [1]);
        assert_eq!(select(&names, Some("portable")), [1]);
        assert_eq!(select(&names, Some("h200")), [0]);
    }
}
