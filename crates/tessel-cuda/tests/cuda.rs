//! The CUDA backend on every device found (restricted by `TESSEL_CUDA_DEVICE`). First the
//! shared conformance checks of `tessel-testkit` (every op against the reference
//! interpreter, the sample kernels, the error paths), then what only this backend has:
//! device listing, the module caches, NVRTC's log, the caching allocator, launch limits.
//! Without a driver or a GPU every test passes after printing a `tessel-skip:` line, and
//! [`without_a_gpu_there_are_no_devices_and_no_panics`] checks the empty backend.

use std::sync::OnceLock;

use tessel_cuda::{CudaBackend, CudaConfig};
use tessel_ir::{Access, Backend, BackendError, DeviceInfo, KernelBuilder, samples};
use tessel_shape::{BinaryOp, Bindings, DType, UnaryOp};
use tessel_testkit::{Check, Conformance, Op, Tolerance};

/// One backend for the whole test binary (compiles are what take time, and its module cache
/// is shared this way).
fn backend() -> &'static CudaBackend {
    static BACKEND: OnceLock<CudaBackend> = OnceLock::new();
    BACKEND.get_or_init(CudaBackend::new)
}

/// How CUDA may differ from the interpreter. Kernels are compiled with `--fmad=false` and
/// NVRTC's IEEE defaults (no flush to zero, correctly rounded `/` and `sqrtf`), so every op is
/// bit for bit except CUDA's transcendentals.
const TOLERANCE: Tolerance = Tolerance {
    ulps: cuda_ulps,
    may_refuse: |_: &DeviceInfo, _, _| false,
};

/// The CUDA C++ Programming Guide's maximum ulp error of the device function (single
/// precision; double precision's are no larger), plus one for the reference's own error
/// (glibc's is below one ulp). `erf` is fdlibm's in both, but calls the device's `exp`. A
/// half type's result is the `float` result rounded, so at most one ulp off.
fn cuda_ulps(op: Op, input: DType, out: DType) -> u64 {
    if !op.is_transcendental(input) {
        return 0;
    }
    if matches!(out, DType::F16 | DType::BF16) {
        return 1;
    }
    match op {
        Op::Unary(UnaryOp::Exp | UnaryOp::Exp2 | UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Tanh) => {
            2 + 1
        }
        Op::Unary(UnaryOp::Log | UnaryOp::Log2) => 1 + 1,
        Op::Unary(UnaryOp::Tan) | Op::Binary(BinaryOp::Pow) => 4 + 1,
        _ => 4,
    }
}

/// Runs a conformance check on every device.
fn run(test: &str, check: Check) {
    tessel_testkit::on_every_device(backend(), TOLERANCE, test, check);
}

tessel_testkit::conformance_tests!(run);

/// A skip line when there is no device; the number of devices otherwise.
fn devices(test: &str) -> usize {
    let n = backend().devices().len();
    if n == 0 {
        tessel_testkit::skip(
            &format!("cuda::{test}"),
            "no CUDA device found (needs libcuda and an NVIDIA GPU)",
        );
    }
    n
}

#[test]
fn without_a_gpu_there_are_no_devices_and_no_panics() {
    let cuda = backend();
    assert_eq!(cuda.name(), "cuda");
    let n = cuda.devices().len();
    // Past the last device, every call is an error value, never a panic.
    let kernel = samples::vector_add(DType::F32, 16, 16).unwrap();
    assert!(matches!(
        cuda.alloc(n, 16),
        Err(BackendError::InvalidArgument(_))
    ));
    assert!(matches!(
        cuda.compile(n, &kernel),
        Err(BackendError::InvalidArgument(_))
    ));
    assert!(cuda.synchronize(n).is_err());
    assert!(cuda.compute_capability(n).is_none());
    if n == 0 {
        assert_eq!(cuda.cached_bytes(0), 0);
        assert!(cuda.trim().is_ok());
        // A device ordinal past the end selects nothing.
        let none = CudaBackend::with_config(CudaConfig {
            device: Some(1000),
            ..CudaConfig::default()
        });
        assert!(none.devices().is_empty());
        tessel_testkit::skip(
            "cuda::without_a_gpu_there_are_no_devices_and_no_panics",
            "no CUDA device found: checked the empty backend only",
        );
    }
}

/// Names the devices under test in the output (`--nocapture`).
#[test]
fn lists_devices() {
    let cuda = backend();
    for device in 0..devices("lists_devices") {
        let info = &cuda.devices()[device];
        let (major, minor) = cuda.compute_capability(device).unwrap();
        eprintln!(
            "cuda device {device}: {} | sm_{major}{minor} | driver {} | NVRTC {:?} from {:?} | \
             {} SMs | {} MiB | {} threads/block | local {:?} | groups {:?} | {} KiB shared",
            info.name,
            cuda.driver_version(),
            cuda.nvrtc_version(),
            cuda.nvrtc_path(),
            info.compute_units,
            info.memory_bytes >> 20,
            info.max_workgroup_size,
            info.max_local_size,
            info.max_groups,
            info.local_memory_bytes >> 10
        );
        assert!(!info.name.is_empty() && info.compute_units > 0 && major >= 3);
        assert_eq!(info.features.subgroup_size, Some(32));
        assert!(info.features.f64 && info.features.int64);
    }
}

/// A second compile of the same kernel is a memory-cache hit; a fresh backend on the same
/// cache directory loads the CUBIN from disk instead of compiling.
#[test]
fn modules_are_cached_in_memory_and_on_disk() {
    if devices("modules_are_cached_in_memory_and_on_disk") == 0 {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tessel-cuda-cache-{}", std::process::id()));
    let config = CudaConfig {
        cache_dir: Some(dir.clone()),
        ..CudaConfig::from_env()
    };
    let kernel = samples::tree_reduce(1000, 64).unwrap();
    let first = CudaBackend::with_config(config.clone());
    for device in 0..first.devices().len() {
        let a = first.compile(device, &kernel).unwrap();
        let b = first.compile(device, &kernel).unwrap();
        first.release(a).unwrap();
        first.release(b).unwrap();
    }
    let stats = first.stats();
    assert_eq!(stats.compiles, 1, "{stats:?}");
    assert!(stats.memory_hits >= 1, "{stats:?}");
    drop(first);
    let second = CudaBackend::with_config(config);
    let program = second.compile(0, &kernel).unwrap();
    assert_eq!((second.stats().compiles, second.stats().disk_hits), (0, 1));
    // 1000 values in 16 workgroups of 64: one partial sum per workgroup.
    let ids: Vec<_> = [4000, 64]
        .iter()
        .map(|&n| second.alloc(0, n).unwrap())
        .collect();
    let data: Vec<u8> = (0..1000).flat_map(|i| (i as f32).to_le_bytes()).collect();
    second.write(ids[0], 0, &data).unwrap();
    second.launch(program, &ids, &Bindings::new()).unwrap();
    let mut out = [0u8; 64];
    second.read(ids[1], 0, &mut out).unwrap();
    let total: f32 = tessel_testkit::f32_values(&out).iter().sum();
    assert_eq!(total, 499_500.0);
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nvrtc_failures_carry_the_log() {
    let cuda = backend();
    for device in 0..devices("nvrtc_failures_carry_the_log") {
        let source = "extern \"C\" __global__ void broken(float *x) { x[0] = undeclared_name; }\n";
        let err = cuda.build_source(device, "broken", source).unwrap_err();
        let BackendError::Compile { kernel, code, log } = &err else {
            panic!("{err:?}")
        };
        assert_eq!((kernel.as_str(), code.as_str()), ("broken", source));
        assert!(log.contains("undeclared_name"), "{log}");
        assert!(log.contains("--fmad=false"), "{log}");
        cuda.build_source(
            device,
            "fine",
            "extern \"C\" __global__ void fine(float *x) { x[0] = 1.0f; }",
        )
        .unwrap();
    }
}

/// More `__shared__` memory than a block may have statically fails in NVRTC (ptxas), as a
/// compile error with the log.
#[test]
fn too_much_shared_memory_is_a_compile_error() {
    let cuda = backend();
    for device in 0..devices("too_much_shared_memory_is_a_compile_error") {
        let mut kb = KernelBuilder::new("huge_local");
        let out = kb.buffer("out", DType::F32, 64, Access::Write);
        kb.grid([1, 1, 1], [64, 1, 1]);
        let scratch = kb.local(DType::F32, 1 << 16);
        let i = kb.local_id(0, DType::I32);
        let one = kb.constant(1.0f32);
        kb.store(scratch, i, one);
        kb.barrier();
        let v = kb.load(scratch, i);
        kb.store(out, i, v);
        let kernel = kb.build().unwrap();
        let err = cuda.compile(device, &kernel).unwrap_err();
        assert!(
            matches!(&err, BackendError::Compile { log, .. } if !log.is_empty()),
            "{err:?}"
        );
    }
}

/// Freed blocks are reused; trimming returns them to the driver; an impossible allocation is
/// `OutOfMemory`.
#[test]
fn the_allocator_reuses_and_trims() {
    let cuda = CudaBackend::with_config(CudaConfig {
        cache_dir: None,
        ..CudaConfig::from_env()
    });
    for device in 0..cuda.devices().len() {
        let a = cuda.alloc(device, 1000).unwrap();
        cuda.free(a).unwrap();
        assert_eq!(cuda.cached_bytes(device), 1024);
        let before = cuda.stats();
        let b = cuda.alloc(device, 1010).unwrap();
        assert_eq!(cuda.stats().pool_reuses, before.pool_reuses + 1);
        assert_eq!(cuda.cached_bytes(device), 0);
        cuda.free(b).unwrap();
        cuda.trim().unwrap();
        assert_eq!(cuda.cached_bytes(device), 0);
        let total = cuda.devices()[device].memory_bytes as usize;
        let err = cuda.alloc(device, total + 1).unwrap_err();
        assert!(matches!(err, BackendError::OutOfMemory { .. }), "{err:?}");
        // Nearly all of it: fails in the driver, after trimming the cache.
        let c = cuda.alloc(device, 1 << 20).unwrap();
        cuda.free(c).unwrap();
        let err = cuda.alloc(device, total - (1 << 20)).unwrap_err();
        assert!(matches!(err, BackendError::OutOfMemory { .. }), "{err:?}");
        assert_eq!(cuda.cached_bytes(device), 0);
    }
}

/// Grids beyond the device's limits are clear launch errors; an empty grid runs nothing.
#[test]
fn launch_limits_are_checked() {
    let cuda = backend();
    for device in 0..devices("launch_limits_are_checked") {
        let y = tessel_shape::Var::new("y", 0, 1 << 20).unwrap();
        let mut kb = KernelBuilder::new("tall");
        let out = kb.buffer("out", DType::I32, 1, Access::Write);
        kb.grid(
            [
                tessel_shape::Expr::constant(1),
                tessel_shape::Expr::from(y),
                tessel_shape::Expr::constant(1),
            ],
            [
                tessel_shape::Expr::constant(1),
                tessel_shape::Expr::constant(1),
                tessel_shape::Expr::constant(1),
            ],
        );
        let zero = kb.constant_as(0, DType::I32);
        kb.store(out, zero, zero);
        let kernel = kb.build().unwrap();
        let program = cuda.compile(device, &kernel).unwrap();
        let buffer = cuda.alloc(device, 4).unwrap();
        let err = cuda
            .launch(program, &[buffer], &Bindings::new().with(y, 100_000))
            .unwrap_err();
        assert!(
            matches!(&err, BackendError::Launch { reason, .. } if reason.contains("axis 1")),
            "{err:?}"
        );
        cuda.launch(program, &[buffer], &Bindings::new().with(y, 0))
            .unwrap();
        cuda.launch(program, &[buffer], &Bindings::new().with(y, 3))
            .unwrap();
        cuda.synchronize(device).unwrap();
        cuda.free(buffer).unwrap();
        cuda.release(program).unwrap();
    }
}

/// A check run on one device with an explicit conformance object, as a smoke test that the
/// testkit's helpers work with this backend outside the macro.
#[test]
fn conformance_runs_directly() {
    let cuda = backend();
    for device in 0..devices("conformance_runs_directly") {
        Conformance::new(cuda, device, TOLERANCE)
            .named("conformance_runs_directly")
            .vector_add_every_dtype();
    }
}
