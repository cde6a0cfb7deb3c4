//! The OpenCL backend on every device found (restricted by `TESSEL_OPENCL_DEVICE`). First
//! the shared conformance checks of `tessel-testkit` (every op against the reference
//! interpreter, the sample kernels, the error paths), then what only this backend has:
//! device listing and selection, program-cache counts, build logs, devices without doubles,
//! no platform. Without any OpenCL device every test passes after printing a
//! `tessel-skip:` line.

use std::process::Command;
use std::sync::OnceLock;

use tessel_ir::{Access, Backend, BackendError, DeviceInfo, Kernel, KernelBuilder, samples};
use tessel_opencl::{OpenClBackend, OpenClConfig};
use tessel_shape::{BinaryOp, Bindings, DType, TernaryOp, UnaryOp};
use tessel_testkit::{Check, Conformance, Op, Tolerance};

/// One backend for the whole test binary, over every device `TESSEL_OPENCL_DEVICE` allows
/// (building programs is what takes time, and its cache is shared this way).
fn backend() -> &'static OpenClBackend {
    static BACKEND: OnceLock<OpenClBackend> = OnceLock::new();
    BACKEND.get_or_init(OpenClBackend::new)
}

/// How OpenCL may differ from the interpreter. Programs are built with correctly rounded
/// `/` and `sqrt`, without contraction or fast-math, so every op is bit for bit except the
/// built-in transcendentals, which the OpenCL specification allows a few ulps (16 for
/// `pow`) and which the reference computes with the host's libm; a device without doubles
/// refuses what the reference computes through `f64`.
const TOLERANCE: Tolerance = Tolerance {
    ulps: opencl_ulps,
    may_refuse: refused_without_doubles,
};

/// The OpenCL 1.2 specification's bound for the built-in plus one for the reference's own
/// error (glibc's is below one ulp); `erf` on `f64` is fdlibm's in both, but calls the
/// device's `exp`. A half type's result is the `float` result rounded, so at most one ulp
/// off.
fn opencl_ulps(op: Op, input: DType, out: DType) -> u64 {
    if !op.is_transcendental(input) {
        return 0;
    }
    if matches!(out, DType::F16 | DType::BF16) {
        return 1;
    }
    match op {
        Op::Unary(UnaryOp::Exp | UnaryOp::Exp2 | UnaryOp::Log | UnaryOp::Log2) => 3 + 1,
        Op::Unary(UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Tan) => 4 + 1,
        Op::Unary(UnaryOp::Tanh) => 5 + 1,
        Op::Binary(BinaryOp::Pow) => 16 + 1,
        // OpenCL C's own `erf` on `float` (the reference's is fdlibm's in `double`).
        Op::Unary(UnaryOp::Erf) if input != DType::F64 => 16 + 1,
        _ => 4,
    }
}

/// Without `cl_khr_fp64`, `mad` on the half types, which the reference computes through
/// `f64` to round once, is refused (see `OPENCL_NO_FP64`); `erf` on the narrower floats is
/// OpenCL C's own.
fn refused_without_doubles(info: &DeviceInfo, op: Op, input: DType) -> bool {
    !info.features.f64
        && op == Op::Ternary(TernaryOp::MulAdd)
        && matches!(input, DType::F16 | DType::BF16)
}

/// Runs a conformance check on every device.
fn run(test: &str, check: Check) {
    tessel_testkit::on_every_device(backend(), TOLERANCE, test, check);
}

tessel_testkit::conformance_tests!(run);

/// `<platform>: <device>` for each device of `cl`.
fn device_names(cl: &OpenClBackend) -> Vec<(usize, String)> {
    (0..cl.devices().len())
        .map(|k| {
            let platform = cl.details(k).map_or("?", |d| d.platform.as_str());
            (k, format!("{platform}: {}", cl.devices()[k].name))
        })
        .collect()
}

/// Names the devices under test in the output (`--nocapture`), so a CI log shows where
/// the suite ran.
#[test]
fn lists_devices() {
    let cl = backend();
    if cl.devices().is_empty() {
        tessel_testkit::skip(
            "opencl::lists_devices",
            "no OpenCL device found (install an ICD such as pocl-opencl-icd)",
        );
    }
    for (device, name) in device_names(cl) {
        let info = &cl.devices()[device];
        let details = cl.details(device).unwrap();
        eprintln!(
            "opencl device {device}: {name} | {} | {} | driver {} | f64 {} | f16 {} | \
             correctly rounded div/sqrt {} | denormals {} | {} CUs | {} MiB",
            details.version,
            details.opencl_c,
            details.driver,
            info.features.f64,
            info.features.f16,
            details.correctly_rounded_divide_sqrt,
            details.denormals,
            info.compute_units,
            info.memory_bytes >> 20
        );
        assert!(!info.name.is_empty() && !details.platform.is_empty());
    }
}

/// A dynamic-length kernel is built once for two launches of different lengths, and
/// compiling it again is a program-cache hit, not a build.
#[test]
fn dynamic_dims_are_built_once() {
    // A backend of its own, so the counters are this test's.
    let cl = OpenClBackend::new();
    for device in 0..cl.devices().len() {
        let before = cl.stats();
        Conformance::new(&cl, device, TOLERANCE)
            .named("dynamic_dims_are_built_once")
            .dynamic_dims_compile_once();
        let stats = cl.stats();
        assert_eq!(
            (
                stats.builds - before.builds,
                stats.cache_hits - before.cache_hits,
                stats.launches - before.launches
            ),
            (1, 1, 2),
            "device {device}: {stats:?}"
        );
    }
}

#[test]
fn build_failures_carry_the_log() {
    let cl = backend();
    for (device, name) in device_names(cl) {
        let source = "__kernel void broken(__global float *x) { x[0] = undeclared_name; }\n";
        let err = cl.build_source(device, "broken", source).unwrap_err();
        let BackendError::Compile { kernel, code, log } = &err else {
            panic!("{name}: {err:?}")
        };
        assert_eq!(kernel, "broken", "{name}");
        assert_eq!(code, source, "{name}");
        assert!(log.contains("CL_BUILD_PROGRAM_FAILURE"), "{name}: {log}");
        assert!(
            log.contains("undeclared_name"),
            "{name}: the build log is missing: {log}"
        );
        let message = err.to_string();
        assert!(
            message.contains("broken") && message.contains("undeclared_name"),
            "{message}"
        );
        // What compiles is fine, and a kernel's generated source is available.
        cl.build_source(
            device,
            "fine",
            "__kernel void fine(__global float *x) { x[0] = 1.0f; }",
        )
        .unwrap();
        let generated = cl
            .source(device, &samples::vector_add(DType::F16, 10, 4).unwrap())
            .unwrap();
        assert!(
            generated.contains("__kernel void tessel_vector_add("),
            "{generated}"
        );
    }
}

/// The kernels that need `double`, for the refusal tests: `f64` itself, and `mad` on
/// `f16`, which the reference rounds once through `double` (`erf` on `f32` is OpenCL C's
/// own and needs none).
fn needs_f64() -> Vec<(&'static str, Kernel)> {
    let mut kb = KernelBuilder::new("mad_f16");
    let x = kb.buffer("x", DType::F16, 64, Access::Read);
    let out = kb.buffer("out", DType::F16, 64, Access::Write);
    kb.grid([1, 1, 1], [64, 1, 1]);
    let i = kb.local_id(0, DType::I32);
    let v = kb.load(x, i);
    let e = kb.ternary(TernaryOp::MulAdd, v, v, v);
    kb.store(out, i, e);
    vec![
        ("f64", samples::vector_add(DType::F64, 100, 64).unwrap()),
        ("mad (computed in f64)", kb.build().unwrap()),
    ]
}

/// `f64` on a device without `cl_khr_fp64` is refused by name, never run: on such devices
/// when there are any, and always on every device with doubles switched off by config.
/// Everything else still runs, through the dialect without doubles: every dtype but `f64`
/// in `vector_add`, and every cast (casts to `f64` refused).
#[test]
fn f64_without_fp64_is_unsupported() {
    let real = backend();
    let forced = OpenClBackend::with_config(OpenClConfig {
        disable_f64: true,
        ..OpenClConfig::from_env()
    });
    let mut checked = 0;
    for (cl, how) in [(real, "reported"), (&forced, "forced")] {
        for (device, name) in device_names(cl) {
            if cl.devices()[device].features.f64 {
                continue;
            }
            for (what, kernel) in needs_f64() {
                let err = cl.compile(device, &kernel).unwrap_err();
                let BackendError::Unsupported { backend, what: msg } = &err else {
                    panic!("{name} ({how}): {err:?}")
                };
                assert_eq!(*backend, "opencl");
                assert!(
                    msg.contains(what) && msg.contains("opencl-no-fp64"),
                    "{name}: {msg}"
                );
            }
            let kit = Conformance::new(cl, device, TOLERANCE)
                .named(&format!("f64_without_fp64_is_unsupported ({how})"));
            kit.vector_add_every_dtype();
            assert_eq!(kit.skipped(), 1, "{name} ({how}): only f64 is refused");
            kit.casts_and_bitcasts_match_the_interpreter();
            checked += 1;
        }
    }
    if !forced.devices().is_empty() {
        assert!(checked >= forced.devices().len());
    }
}

#[test]
fn unmatched_selector_means_no_devices() {
    let cl = OpenClBackend::with_config(OpenClConfig {
        device: Some("no device is called this".into()),
        ..OpenClConfig::default()
    });
    assert!(cl.devices().is_empty());
    let kernel = samples::vector_add(DType::F32, 10, 4).unwrap();
    assert!(matches!(
        cl.compile(0, &kernel),
        Err(BackendError::InvalidArgument(_))
    ));
    assert!(matches!(
        cl.alloc(0, 4),
        Err(BackendError::InvalidArgument(_))
    ));
    // An index picks exactly one device.
    let all = backend().devices().len();
    if all > 0 {
        let one = OpenClBackend::with_config(OpenClConfig {
            device: Some((all - 1).to_string()),
            ..OpenClConfig::default()
        });
        assert_eq!(one.devices().len(), 1);
        assert_eq!(one.devices()[0], backend().devices()[all - 1]);
    }
}

/// Set in the child process of `no_platform_means_no_devices`.
const CHILD: &str = "TESSEL_OPENCL_TEST_CHILD";

/// With the loader present but no driver it can load, `clGetPlatformIDs` fails with
/// `CL_PLATFORM_NOT_FOUND_KHR` and the backend has zero devices. Runs in a child process
/// (the loader reads its variables once) whose loader is pointed at a driver that does not
/// exist: `OCL_ICD_VENDORS` (a directory of `.icd` files) for ocl-icd, `OCL_ICD_FILENAMES`
/// for the Khronos loader (CUDA's `libOpenCL.so.1` is one, and ignores the first).
#[test]
fn no_platform_means_no_devices() {
    let vendors = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tessel-opencl-bogus-icd-{}", std::process::id()));
    std::fs::create_dir_all(&vendors).unwrap();
    let missing = vendors.join("libmissing-opencl-driver.so");
    std::fs::write(
        vendors.join("missing.icd"),
        format!("{}\n", missing.display()),
    )
    .unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_reports_devices",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("OCL_ICD_VENDORS", &vendors)
        .env("OCL_ICD_FILENAMES", &missing)
        .env_remove("TESSEL_OPENCL_DEVICE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split("child: ").nth(1))
        .unwrap_or_else(|| panic!("the child test did not run:\n{stdout}"));
    if line.starts_with("platforms=0 ") {
        assert_eq!(line, "platforms=0 devices=0");
    } else {
        tessel_testkit::skip(
            "opencl::no_platform_means_no_devices",
            &format!(
                "this system's OpenCL loader ignores OCL_ICD_VENDORS and OCL_ICD_FILENAMES \
                 ({line}); nothing to test"
            ),
        );
    }
}

/// The child of `no_platform_means_no_devices`; does nothing when run directly.
#[test]
fn child_reports_devices() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let platforms = opencl3::platform::get_platforms().map_or(0, |p| p.len());
    let cl = OpenClBackend::with_config(OpenClConfig::default());
    println!(
        "child: platforms={platforms} devices={}",
        cl.devices().len()
    );
}

/// Kernels compiled together are one driver build; each runs as it would alone (two of
/// them share a name and differ in dtype), and compiling them again is all cache hits.
#[test]
fn kernels_compiled_together_are_one_build() {
    let cl = OpenClBackend::new();
    let (n, rows, cols) = (1000, 7, 33);
    let kernels = [
        samples::vector_add(DType::F32, n, 64).unwrap(),
        samples::vector_add(DType::I32, n, 64).unwrap(),
        samples::row_sum(rows, cols, DType::F32).unwrap(),
    ];
    let kernels: Vec<&Kernel> = kernels.iter().collect();
    for device in 0..cl.devices().len() {
        let before = cl.stats();
        let programs: Vec<_> = cl
            .compile_many(device, &kernels)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(cl.stats().builds - before.builds, 1, "device {device}");
        let upload = |bytes: Vec<u8>| {
            let id = cl.alloc(device, bytes.len()).unwrap();
            cl.write(id, 0, &bytes).unwrap();
            id
        };
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let i32s = |v: &[i32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let read = |id, len: usize| {
            let mut out = vec![0u8; len * 4];
            cl.read(id, 0, &mut out).unwrap();
            out.chunks(4)
                .map(|c| [c[0], c[1], c[2], c[3]])
                .collect::<Vec<_>>()
        };
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let ids = [upload(f32s(&x)), upload(f32s(&x)), upload(vec![0; n * 4])];
        cl.launch(programs[0], &ids, &Bindings::default()).unwrap();
        let sums: Vec<f32> = read(ids[2], n)
            .into_iter()
            .map(f32::from_ne_bytes)
            .collect();
        assert_eq!(sums, x.iter().map(|v| v + v).collect::<Vec<_>>());
        let k: Vec<i32> = (0..n as i32).map(|i| i - 500).collect();
        let ids = [upload(i32s(&k)), upload(i32s(&k)), upload(vec![0; n * 4])];
        cl.launch(programs[1], &ids, &Bindings::default()).unwrap();
        let sums: Vec<i32> = read(ids[2], n)
            .into_iter()
            .map(i32::from_ne_bytes)
            .collect();
        assert_eq!(sums, k.iter().map(|v| v + v).collect::<Vec<_>>());
        let m: Vec<f32> = (0..rows * cols).map(|i| (i % cols) as f32).collect();
        let ids = [upload(f32s(&m)), upload(vec![0; rows * 4])];
        cl.launch(programs[2], &ids, &Bindings::default()).unwrap();
        let sums: Vec<f32> = read(ids[1], rows)
            .into_iter()
            .map(f32::from_ne_bytes)
            .collect();
        assert_eq!(sums, vec![(cols * (cols - 1) / 2) as f32; rows]);
        let before = cl.stats();
        for result in cl.compile_many(device, &kernels) {
            cl.release(result.unwrap()).unwrap();
        }
        let stats = cl.stats();
        assert_eq!(
            (stats.builds, stats.cache_hits - before.cache_hits),
            (before.builds, 3)
        );
    }
}
