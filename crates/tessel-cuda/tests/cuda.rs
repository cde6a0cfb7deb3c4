//! The CUDA backend on every device found (restricted by `TESSEL_CUDA_DEVICE`). First the
//! shared conformance checks of `tessel-testkit` (every op against the reference
//! interpreter, the sample kernels, the error paths), then what only this backend has:
//! device listing, the module caches, NVRTC's log, the caching allocator, launch limits,
//! and the cuBLAS matmul ([`Backend::vendor`]) against an `f64` reference.
//! Without a driver or a GPU every test passes after printing a `tessel-skip:` line, and
//! [`without_a_gpu_there_are_no_devices_and_no_panics`] checks the empty backend.

use std::sync::OnceLock;
use std::time::Duration;

use tessel_cuda::{CudaBackend, CudaConfig, CudaGraphs, GeneratedMatmul};
use tessel_ir::{
    Access, Backend, BackendError, DeviceInfo, KernelBuilder, Matmul, MatmulSizes, ProgramId,
    VendorOp, VendorProgram, samples,
};
use tessel_shape::{BinaryOp, Bindings, DType, Dim, UnaryOp, Var};
use tessel_testkit::{Check, Conformance, Op, Rng, Tolerance, decode, encode};

/// One backend for the whole test binary (compiles are what take time, and its module cache
/// is shared this way). It offers the generated tensor-core matmul next to cuBLAS, so the
/// matmul tests check both, and replays repeated launch sequences as CUDA graphs.
fn backend() -> &'static CudaBackend {
    static BACKEND: OnceLock<CudaBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        CudaBackend::with_config(CudaConfig {
            generated_matmul: GeneratedMatmul::Always,
            graphs: CudaGraphs::On,
            ..CudaConfig::from_env()
        })
    })
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
    // The device is checked before the dtype and before cuBLAS is looked for.
    for dtype in [DType::F32, DType::F64, DType::I32] {
        let op = VendorOp::Matmul(matmul(dtype, [1, 2, 3, 4], (false, false), (0, 0)));
        assert!(
            matches!(cuda.vendor(n, &op), Err(BackendError::InvalidArgument(_))),
            "{op}"
        );
    }
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
    let second = CudaBackend::with_config(config.clone());
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
    // A cached CUBIN that is empty or garbage is compiled again and overwritten, so the
    // instance after that loads it from disk again: the cache heals by itself.
    for (case, bytes) in [("empty", &b""[..]), ("garbage", &b"not a cubin at all"[..])] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "cubin") {
                std::fs::write(&path, bytes).unwrap();
            }
        }
        let healing = CudaBackend::with_config(config.clone());
        healing.compile(0, &kernel).unwrap();
        let stats = healing.stats();
        assert_eq!(
            (stats.compiles, stats.disk_hits),
            (1, 0),
            "{case}: {stats:?}"
        );
        drop(healing);
        let healed = CudaBackend::with_config(config.clone());
        healed.compile(0, &kernel).unwrap();
        let stats = healed.stats();
        assert_eq!(
            (stats.compiles, stats.disk_hits),
            (0, 1),
            "{case}: {stats:?}"
        );
    }
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

/// A matmul of constant sizes `[batch, m, n, k]`, with `(lhs, rhs)` transpose flags and
/// batch strides.
fn matmul(dtype: DType, sizes: [i64; 4], transposed: (bool, bool), strides: (i64, i64)) -> Matmul {
    let [batch, m, n, k] = sizes.map(Dim::from);
    Matmul {
        dtype,
        batch,
        m,
        n,
        k,
        lhs_transposed: transposed.0,
        rhs_transposed: transposed.1,
        lhs_batch_stride: Dim::from(strides.0),
        rhs_batch_stride: Dim::from(strides.1),
        allow_tf32: false,
        epilogue: tessel_ir::Epilogue::NONE,
    }
}

/// The four `(lhs, rhs)` transpose combinations.
const TRANSPOSES: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

/// Every program `device` has for `op` (cuBLAS's first), or an empty list after a skip
/// line when it has none.
fn routines(test: &str, device: usize, op: &Matmul) -> Vec<VendorProgram> {
    let programs = backend()
        .vendor(device, &VendorOp::Matmul(op.clone()))
        .unwrap();
    if programs.is_empty() {
        tessel_testkit::skip(
            &format!("cuda::{test}"),
            "cuBLAS (libcublas.so.13) is not on the loader path",
        );
    }
    programs
}

/// `op`'s cuBLAS program on `device` (its other programs released), or `None` after a skip
/// line when cuBLAS is not installed.
fn cublas(test: &str, device: usize, op: &Matmul) -> Option<ProgramId> {
    let mut cublas = None;
    for p in routines(test, device, op) {
        if p.variant == "cuBLAS" {
            cublas = Some(p.program);
        } else {
            backend().release(p.program).unwrap();
        }
    }
    cublas
}

/// The float dtypes cuBLAS runs.
const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// `value` as the device stores it in `dtype`.
fn rounded(dtype: DType, value: f64) -> f64 {
    decode(dtype, &encode(dtype, &[value]))[0]
}

/// `op`'s product with sizes `s`, straight from [`Matmul`]'s definition in `f64`, and for
/// each output element the sum of its terms' magnitudes, which bounds the rounding error a
/// float sum in any order can have relative to it (with cancellation the exact result can
/// be far smaller than its terms).
fn reference(op: &Matmul, s: &MatmulSizes, lhs: &[f64], rhs: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; s.batch * s.m * s.n];
    let mut scale = out.clone();
    for p in 0..s.batch {
        let (ls, rs) = (p * s.lhs_batch_stride, p * s.rhs_batch_stride);
        for i in 0..s.m {
            for j in 0..s.n {
                let (mut sum, mut magnitude) = (0.0, 0.0);
                for l in 0..s.k {
                    let a = if op.lhs_transposed {
                        lhs[ls + l * s.m + i]
                    } else {
                        lhs[ls + i * s.k + l]
                    };
                    let b = if op.rhs_transposed {
                        rhs[rs + j * s.k + l]
                    } else {
                        rhs[rs + l * s.n + j]
                    };
                    sum += a * b;
                    magnitude += (a * b).abs();
                }
                out[(p * s.m + i) * s.n + j] = sum;
                scale[(p * s.m + i) * s.n + j] = magnitude;
            }
        }
    }
    (out, scale)
}

/// Launches `program` (`op`'s) on `device` with `dims` on seeded random operands in
/// `[-1, 1)`, each buffer exactly as large as [`MatmulSizes::min_elements`] asks, and checks
/// the output against the `f64` reference: within `1e-4·√k` (`f32`, and the `f32`
/// accumulation of `f16`/`bf16`; `1e-12·√k` for `f64`) of the terms' magnitude, plus the
/// final rounding to a half type (half an ulp: `2⁻¹¹` relative for `f16`, `2⁻⁸` for `bf16`). The output starts as NaN, so an element left unwritten fails.
/// When `timed`, runs it through [`Backend::time`] and returns the duration.
fn check_program(
    test: &str,
    device: usize,
    program: ProgramId,
    op: &Matmul,
    dims: &Bindings,
    timed: bool,
) -> Duration {
    let cuda = backend();
    let s = op.sizes(dims).unwrap();
    let (nl, nr, no) = s.min_elements();
    let mut rng = Rng(0x5eed_0000 ^ (s.batch * 1_000_003 + s.m * 7919 + s.n * 101 + s.k) as u64);
    let mut values = |n: usize| -> Vec<f64> {
        (0..n)
            // The values the device sees: rounded to the dtype.
            .map(|_| rounded(op.dtype, rng.unit()))
            .collect()
    };
    let (lhs, rhs) = (values(nl), values(nr));
    let size = op.dtype.size_bytes();
    let ids = [nl, nr, no].map(|n| cuda.alloc(device, n.max(1) * size).unwrap());
    cuda.write(ids[0], 0, &encode(op.dtype, &lhs)).unwrap();
    cuda.write(ids[1], 0, &encode(op.dtype, &rhs)).unwrap();
    cuda.write(ids[2], 0, &encode(op.dtype, &vec![f64::NAN; no]))
        .unwrap();
    let elapsed = if timed {
        cuda.time(program, &ids, dims).unwrap()
    } else {
        cuda.launch(program, &ids, dims).unwrap();
        Duration::ZERO
    };
    let mut bytes = vec![0u8; no * size];
    cuda.read(ids[2], 0, &mut bytes).unwrap();
    let got = decode(op.dtype, &bytes);
    let (want, scale) = reference(op, &s, &lhs, &rhs);
    let eps = if op.dtype == DType::F64 { 1e-12 } else { 1e-4 };
    let tolerance = eps * (s.k.max(1) as f64).sqrt();
    let last_rounding = match op.dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    };
    for (i, ((g, w), magnitude)) in got.iter().zip(&want).zip(&scale).enumerate() {
        let allowed = tolerance * magnitude + last_rounding * w.abs();
        assert!(
            (g - w).abs() <= allowed,
            "cuda::{test}: {op} with {s:?}: element {i} is {g}, want {w} (tolerance {allowed})"
        );
    }
    for id in ids {
        cuda.free(id).unwrap();
    }
    elapsed
}

/// Checks `op` with constant sizes on `device` through every program the backend has for it
/// (cuBLAS, and the generated tensor-core kernel's tiles where it runs `op`); `false` (after
/// a skip line) when there is none.
fn check_matmul(test: &str, device: usize, op: &Matmul) -> bool {
    let programs = routines(test, device, op);
    for p in &programs {
        check_program(test, device, p.program, op, &Bindings::new(), false);
        backend().release(p.program).unwrap();
    }
    !programs.is_empty()
}

/// Half products whose output rows are not a multiple of 8 elements and large enough to run
/// split into parts writing padded rows (`matmul::padded`): every layout of the rhs, and a
/// batch, against the reference (the output starts as NaN, so a row the copy misses fails).
#[test]
fn cublas_half_products_with_unaligned_rows() {
    let test = "cublas_half_products_with_unaligned_rows";
    for device in 0..devices(test) {
        for dtype in [DType::F16, DType::BF16] {
            for (sizes, t) in [
                ([1, 130, 8195, 24], (false, true)),
                ([1, 130, 8195, 24], (false, false)),
                ([2, 70, 8195, 16], (true, true)),
            ] {
                let [batch, m, n, k] = sizes;
                let op = matmul(dtype, sizes, t, (m * k, k * n));
                assert!(batch * m * n >= 1 << 20);
                if !check_matmul(test, device, &op) {
                    return;
                }
            }
        }
    }
}

/// Odd sizes (no dimension a multiple of a tile), including 1×1×1 and vectors, in every
/// float dtype.
#[test]
fn cublas_matmul_odd_sizes() {
    let test = "cublas_matmul_odd_sizes";
    for device in 0..devices(test) {
        let before = backend().stats().vendor_launches;
        let shapes = [
            [1, 1, 1, 1],
            [1, 37, 53, 29],
            [1, 1, 67, 33],
            [1, 45, 1, 70],
            [1, 129, 65, 257],
        ];
        for dtype in FLOATS {
            for shape in shapes {
                if !check_matmul(test, device, &matmul(dtype, shape, (false, false), (0, 0))) {
                    return;
                }
            }
        }
        // Other tests share the backend, so its counter may have grown by more.
        assert!(backend().stats().vendor_launches >= before + 20);
    }
}

/// Every combination of a transposed lhs and rhs, on sizes where each transpose changes the
/// leading dimension cuBLAS is given.
#[test]
fn cublas_matmul_transposes() {
    let test = "cublas_matmul_transposes";
    for device in 0..devices(test) {
        for dtype in FLOATS {
            for transposed in TRANSPOSES {
                for shape in [[1, 23, 41, 17], [1, 64, 3, 100]] {
                    if !check_matmul(test, device, &matmul(dtype, shape, transposed, (0, 0))) {
                        return;
                    }
                }
            }
        }
    }
}

/// Batch 3 through `gemmStridedBatched`: packed strides, padded ones, and a stride of 0
/// broadcasting one operand (or both) to every product, with every transpose combination.
#[test]
fn cublas_matmul_batched_strides_and_broadcast() {
    let test = "cublas_matmul_batched_strides_and_broadcast";
    for device in 0..devices(test) {
        let [batch, m, n, k] = [3, 19, 27, 13];
        let (mk, kn) = (m * k, k * n);
        for dtype in FLOATS {
            for transposed in TRANSPOSES {
                for strides in [(mk, kn), (mk + 5, kn + 3), (0, kn), (mk, 0), (0, 0)] {
                    let op = matmul(dtype, [batch, m, n, k], transposed, strides);
                    if !check_matmul(test, device, &op) {
                        return;
                    }
                }
            }
        }
    }
}

/// `k == 0`: every element is an empty sum, so the output is zeroed (over whatever it held);
/// an empty output runs nothing and is timed as zero.
#[test]
fn cublas_matmul_empty_sums_and_products() {
    let test = "cublas_matmul_empty_sums_and_products";
    let cuda = backend();
    for device in 0..devices(test) {
        for dtype in FLOATS {
            let op = matmul(dtype, [2, 3, 5, 0], (false, true), (0, 0));
            let Some(program) = cublas(test, device, &op) else {
                return;
            };
            let size = dtype.size_bytes();
            let ids = [size, size, 30 * size].map(|b| cuda.alloc(device, b).unwrap());
            cuda.write(ids[2], 0, &encode(dtype, &[7.0; 30])).unwrap();
            cuda.launch(program, &ids, &Bindings::new()).unwrap();
            let mut out = vec![0xffu8; 30 * size];
            cuda.read(ids[2], 0, &mut out).unwrap();
            assert_eq!(decode(dtype, &out), vec![0.0; 30], "{op}");
            cuda.release(program).unwrap();

            for shape in [[2, 0, 5, 4], [2, 3, 0, 4], [0, 3, 5, 4]] {
                let op = matmul(dtype, shape, (false, false), (0, 0));
                let program = cublas(test, device, &op).unwrap();
                cuda.write(ids[2], 0, &encode(dtype, &[7.0; 30])).unwrap();
                // The operands that are not empty still need their elements: the rhs when
                // only m is 0, the lhs when only n is.
                let big = [0, 1].map(|_| cuda.alloc(device, 64 * size).unwrap());
                let bound = [big[0], big[1], ids[2]];
                assert_eq!(
                    cuda.time(program, &bound, &Bindings::new()),
                    Ok(Duration::ZERO)
                );
                cuda.read(ids[2], 0, &mut out).unwrap();
                assert_eq!(decode(dtype, &out), vec![7.0; 30], "{op} wrote its output");
                for id in big {
                    cuda.free(id).unwrap();
                }
                cuda.release(program).unwrap();
            }
            for id in ids {
                cuda.free(id).unwrap();
            }
        }
    }
}

/// Sizes and strides symbolic in a variable are evaluated at each launch: one program runs
/// two sizes.
#[test]
fn cublas_matmul_symbolic_sizes() {
    let test = "cublas_matmul_symbolic_sizes";
    let cuda = backend();
    for device in 0..devices(test) {
        let rows = Var::new("rows", 0, 4096).unwrap();
        let k = 21;
        let mut op = matmul(DType::F32, [2, 0, 33, k], (false, false), (0, 0));
        op.m = Dim::from(rows);
        op.lhs_batch_stride = Dim::from(rows) * Dim::from(k);
        let Some(program) = cublas(test, device, &op) else {
            return;
        };
        for m in [37, 5] {
            check_program(
                test,
                device,
                program,
                &op,
                &Bindings::new().with(rows, m),
                false,
            );
        }
        // Unbound, it cannot run.
        let ids = [0, 1, 2].map(|_| cuda.alloc(device, 4).unwrap());
        let err = cuda.launch(program, &ids, &Bindings::new()).unwrap_err();
        assert!(matches!(err, BackendError::InvalidArgument(_)), "{err:?}");
        for id in ids {
            cuda.free(id).unwrap();
        }
        cuda.release(program).unwrap();
    }
}

/// Launches that do not fit are errors naming the op and the sizes, before cuBLAS is called:
/// a buffer one element short, the wrong number of buffers, the output bound as an operand,
/// a released program.
#[test]
fn cublas_matmul_rejects_bad_launches() {
    let test = "cublas_matmul_rejects_bad_launches";
    let cuda = backend();
    for device in 0..devices(test) {
        let op = matmul(DType::F32, [2, 4, 5, 6], (false, false), (24, 0));
        let Some(program) = cublas(test, device, &op) else {
            return;
        };
        // lhs 48 elements, rhs 30, out 40.
        let needed = [48, 30, 40];
        for short in 0..3 {
            let ids = needed.map(|n| cuda.alloc(device, n * 4).unwrap());
            let small = cuda.alloc(device, (needed[short] - 1) * 4).unwrap();
            let mut bound = ids;
            bound[short] = small;
            let err = cuda.launch(program, &bound, &Bindings::new()).unwrap_err();
            let BackendError::InvalidArgument(why) = &err else {
                panic!("{err:?}")
            };
            let role = ["`lhs`", "`rhs`", "`out`"][short];
            assert!(
                why.contains("matmul f32") && why.contains(role) && why.contains("m 4, n 5, k 6"),
                "{why}"
            );
            // Exactly large enough runs.
            cuda.launch(program, &ids, &Bindings::new()).unwrap();
            let err = cuda
                .launch(program, &ids[..2], &Bindings::new())
                .unwrap_err();
            assert!(matches!(err, BackendError::InvalidArgument(_)), "{err:?}");
            let aliased = [ids[0], ids[1], ids[0]];
            let err = cuda
                .launch(program, &aliased, &Bindings::new())
                .unwrap_err();
            assert!(matches!(err, BackendError::InvalidArgument(_)), "{err:?}");
            for id in ids.into_iter().chain([small]) {
                cuda.free(id).unwrap();
            }
        }
        cuda.synchronize(device).unwrap();
        cuda.release(program).unwrap();
        let ids = needed.map(|n| cuda.alloc(device, n * 4).unwrap());
        let err = cuda.launch(program, &ids, &Bindings::new()).unwrap_err();
        assert!(matches!(err, BackendError::InvalidArgument(_)), "{err:?}");
        assert!(cuda.release(program).is_err());
        for id in ids {
            cuda.free(id).unwrap();
        }
    }
}

/// Integers have no cuBLAS program: they get `Ok(None)` and run as generated kernels.
#[test]
fn cublas_matmul_declines_integers() {
    let test = "cublas_matmul_declines_integers";
    let cuda = backend();
    for device in 0..devices(test) {
        for dtype in [DType::I32, DType::I64, DType::U8] {
            let op = VendorOp::Matmul(matmul(dtype, [1, 8, 8, 8], (false, false), (0, 0)));
            assert_eq!(cuda.vendor(device, &op), Ok(Vec::new()), "{op}");
        }
    }
}

/// [`Backend::time`] brackets the cuBLAS call with events on the backend's stream: a
/// non-zero duration, and the product it timed is right.
#[test]
fn cublas_matmul_is_timed() {
    let test = "cublas_matmul_is_timed";
    for device in 0..devices(test) {
        for (dtype, batch) in [(DType::F32, 1), (DType::F64, 1), (DType::F32, 4)] {
            let op = matmul(
                dtype,
                [batch, 256, 192, 320],
                (false, false),
                (256 * 320, 0),
            );
            let Some(program) = cublas(test, device, &op) else {
                return;
            };
            let elapsed = check_program(test, device, program, &op, &Bindings::new(), true);
            assert!(
                elapsed > Duration::ZERO && elapsed < Duration::from_secs(10),
                "{op}: {elapsed:?}"
            );
            backend().release(program).unwrap();
        }
    }
}

/// `f32` products run in full `f32`, not on TF32 tensor cores (a 10-bit mantissa), unless
/// the matmul allows TF32: every lhs element is `1 + 2⁻¹²`, which TF32 rounds to 1, and
/// every rhs element 1. Each partial sum of up to 64 such terms is exact in `f32`, so in any
/// summation order every output element is exactly `64 + 2⁻⁶` in full `f32`, and 64 in TF32.
/// The generated 3xTF32 programs keep the `2⁻¹²` in each lhs element's small part, so they
/// give `64 + 2⁻⁶` too.
#[test]
fn cublas_f32_matmul_is_full_precision_unless_tf32_is_allowed() {
    let test = "cublas_f32_matmul_is_full_precision_unless_tf32_is_allowed";
    let cuda = backend();
    let [m, n, k] = [128, 96, 64];
    let x = 1.0 + 2f64.powi(-12);
    let product = |device: usize, program: ProgramId| {
        let ids = [m * k, k * n, m * n].map(|e: usize| cuda.alloc(device, e * 4).unwrap());
        cuda.write(ids[0], 0, &encode(DType::F32, &vec![x; m * k]))
            .unwrap();
        cuda.write(ids[1], 0, &encode(DType::F32, &vec![1.0; k * n]))
            .unwrap();
        cuda.launch(program, &ids, &Bindings::new()).unwrap();
        let mut out = vec![0u8; m * n * 4];
        cuda.read(ids[2], 0, &mut out).unwrap();
        for id in ids {
            cuda.free(id).unwrap();
        }
        cuda.release(program).unwrap();
        decode(DType::F32, &out)
    };
    for device in 0..devices(test) {
        for allow_tf32 in [false, true] {
            let op = Matmul {
                allow_tf32,
                ..matmul(
                    DType::F32,
                    [1, m as i64, n as i64, k as i64],
                    (false, false),
                    (0, 0),
                )
            };
            let programs = routines(test, device, &op);
            if programs.is_empty() {
                return;
            }
            for p in programs {
                let generated = p.variant != "cuBLAS";
                let want = if allow_tf32 && !generated {
                    64.0
                } else {
                    64.0 + 2f64.powi(-6)
                };
                let got = product(device, p.program);
                assert!(
                    got.iter().all(|&v| v == want),
                    "{op} [{}]: want {want} everywhere, got {:?}",
                    p.variant,
                    got.iter().find(|&&v| v != want)
                );
            }
        }
    }
}

/// Matmul epilogues (a bias along the rows, `relu`, GELU in both forms) on odd, transposed
/// and batched products of f32, f16 and bf16, by cuBLASLt and the generated kernel, against
/// `activation(sum + bias)` in f64. f32 is compared at 1e-6 of the sums' scale, tight
/// enough to tell GELU's tanh form from its erf form, which differ by up to 5e-4 around
/// |x| = 2; the operands are scaled by 2 so the sums reach there. cuBLASLt has no erf
/// GELU: those products run on the generated kernel alone, where their shapes allow it.
#[test]
fn cublaslt_epilogues_match_the_reference() {
    use tessel_ir::{Activation, Epilogue};
    let test = "cublaslt_epilogues_match_the_reference";
    let cuda = backend();
    let epilogues = [
        (true, Activation::Identity),
        (false, Activation::Relu),
        (true, Activation::Relu),
        (false, Activation::GeluTanh),
        (true, Activation::GeluTanh),
        (false, Activation::Gelu),
        (true, Activation::Gelu),
    ]
    .map(|(bias, activation)| Epilogue { bias, activation });
    let shapes: [([i64; 4], (bool, bool)); 5] = [
        ([1, 37, 29, 53], (false, false)),
        ([1, 64, 96, 128], (false, true)),
        ([1, 33, 50, 24], (true, true)),
        ([3, 16, 40, 24], (false, true)),
        // Half outputs with rows of 8195: split into padded parts (`matmul::padded`).
        ([1, 130, 8195, 24], (false, true)),
    ];
    for device in 0..devices(test) {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for (sizes, t) in shapes {
                for epilogue in epilogues {
                    let [batch, m, n, k] = sizes.map(|v| v as usize);
                    let op = Matmul {
                        epilogue,
                        ..matmul(dtype, sizes, t, ((m * k) as i64, (k * n) as i64))
                    };
                    let programs = if epilogue.activation == Activation::Gelu {
                        let programs = cuda.vendor(device, &VendorOp::Matmul(op.clone())).unwrap();
                        assert!(
                            programs.iter().all(|p| p.variant.starts_with("mma ")),
                            "{op}: {programs:?}"
                        );
                        programs
                    } else {
                        let programs = routines(test, device, &op);
                        if programs.is_empty() {
                            return;
                        }
                        programs
                    };
                    for VendorProgram {
                        program, variant, ..
                    } in programs
                    {
                        let mut rng = Rng(0xe911 ^ (m * 31 + n) as u64);
                        let mut random = |len: usize| -> Vec<f64> {
                            (0..len).map(|_| rounded(dtype, 2.0 * rng.unit())).collect()
                        };
                        let (lhs, rhs, bias) =
                            (random(batch * m * k), random(batch * k * n), random(n));
                        let mut data = vec![encode(dtype, &lhs), encode(dtype, &rhs)];
                        if epilogue.bias {
                            data.push(encode(dtype, &bias));
                        }
                        data.push(vec![0xff; batch * m * n * dtype.size_bytes()]);
                        let ids: Vec<_> = data
                            .iter()
                            .map(|d| {
                                let id = cuda.alloc(device, d.len()).unwrap();
                                cuda.write(id, 0, d).unwrap();
                                id
                            })
                            .collect();
                        if let Err(e) = cuda.launch(program, &ids, &Bindings::new()) {
                            panic!("{op} [{variant}]: {e}");
                        }
                        let mut out = vec![0u8; data.last().unwrap().len()];
                        cuda.read(*ids.last().unwrap(), 0, &mut out).unwrap();
                        let s = op.sizes(&Bindings::new()).unwrap();
                        let (sums, scale) = reference(&op, &s, &lhs, &rhs);
                        let (rel, last) = match dtype {
                            DType::F32 => (1e-6, 2f64.powi(-23)),
                            DType::F16 => (1e-3, 2f64.powi(-10)),
                            _ => (1e-3, 2f64.powi(-7)),
                        };
                        for (e, got) in decode(dtype, &out).iter().enumerate() {
                            let want = epilogue.apply(sums[e], bias[e % n]);
                            let tolerance = rel * 1.2 * scale[e] + last * want.abs() + 1e-6;
                            assert!(
                                (got - want).abs() <= tolerance,
                                "{op} [{variant}]: element {e} is {got}, expected {want}"
                            );
                        }
                        for id in ids {
                            cuda.free(id).unwrap();
                        }
                        cuda.release(program).unwrap();
                    }
                }
            }
        }
    }
}

/// The generated tensor-core kernel, every tile, against the f64 reference: sizes that are
/// not multiples of any tile (but rows of 16 bytes), every transpose combination, packed,
/// padded and broadcast batch strides, a single row, and empty sums, in f16, bf16 and f32
/// (3xTF32, held to the full-f32 tolerance). Each program's output starts as NaN, so an
/// element a tile misses fails.
#[test]
fn generated_tensor_core_matmul_matches_the_reference() {
    let test = "generated_tensor_core_matmul_matches_the_reference";
    let cuda = backend();
    for device in 0..devices(test) {
        if cuda.compute_capability(device).is_none_or(|c| c.0 < 8) {
            tessel_testkit::skip(&format!("cuda::{test}"), "mma.sync needs sm_80");
            continue;
        }
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            let mut cases: Vec<Matmul> = Vec::new();
            for t in TRANSPOSES {
                let [_, m, n, k] = [3, 72, 136, 264];
                let (mk, kn) = (m * k, k * n);
                for strides in [(mk, kn), (mk + 8, kn + 16), (0, kn), (mk, 0)] {
                    cases.push(matmul(dtype, [3, m, n, k], t, strides));
                }
                cases.push(matmul(dtype, [1, 200, 72, 40], t, (0, 0)));
                cases.push(matmul(dtype, [1, 8, 8, 8], t, (0, 0)));
                cases.push(matmul(dtype, [2, 24, 16, 0], t, (0, 0)));
            }
            cases.push(matmul(dtype, [1, 1, 264, 40], (false, true), (0, 0)));
            cases.push(matmul(dtype, [1, 520, 1032, 264], (false, false), (0, 0)));
            for op in cases {
                let programs = routines(test, device, &op);
                let generated = programs
                    .iter()
                    .filter(|p| p.variant.starts_with("mma "))
                    .count();
                assert_eq!(generated, 3, "{op}: {programs:?}");
                for p in programs {
                    if p.variant != "cuBLAS" {
                        check_program(test, device, p.program, &op, &Bindings::new(), false);
                    }
                    cuda.release(p.program).unwrap();
                }
            }
        }
    }
}

/// By default the generated kernel is a fallback, and next to cuBLAS for full-precision f32
/// products only (its three 3xTF32 tiles); `Never` offers it nowhere, `Always` next to
/// cuBLAS for every product.
#[test]
fn generated_matmul_is_offered_as_configured() {
    let test = "generated_matmul_is_offered_as_configured";
    for device in 0..devices(test) {
        if backend().compute_capability(device).is_none_or(|c| c.0 < 8) {
            continue;
        }
        let variants = |op: &Matmul, generated_matmul| {
            let cuda = CudaBackend::with_config(CudaConfig {
                generated_matmul,
                ..CudaConfig::from_env()
            });
            let programs = cuda.vendor(device, &VendorOp::Matmul(op.clone())).unwrap();
            for p in &programs {
                cuda.release(p.program).unwrap();
            }
            programs.into_iter().map(|p| p.variant).collect::<Vec<_>>()
        };
        let half = matmul(DType::BF16, [1, 64, 64, 64], (false, true), (0, 0));
        let full = matmul(DType::F32, [1, 64, 64, 64], (false, true), (0, 0));
        let tf32 = Matmul {
            allow_tf32: true,
            ..full.clone()
        };
        let always = variants(&half, GeneratedMatmul::Always);
        let generated: Vec<&String> = always.iter().filter(|v| v.starts_with("mma ")).collect();
        assert_eq!(generated.len(), 3, "{always:?}");
        let has_cublas = always.first().is_some_and(|v| v == "cuBLAS");
        let cublas: Vec<String> = if has_cublas {
            vec!["cuBLAS".into()]
        } else {
            Vec::new()
        };
        for op in [&half, &full, &tf32] {
            assert_eq!(variants(op, GeneratedMatmul::Never), cublas, "{op}");
        }
        // Next to cuBLAS, the default offers the generated kernel for full-precision f32
        // only (3xTF32 on tensor cores against cuBLAS on the CUDA cores).
        for op in [&half, &full, &tf32] {
            let fallback = variants(op, GeneratedMatmul::Fallback);
            let full_f32 = op.dtype == DType::F32 && !op.allow_tf32;
            if has_cublas && !full_f32 {
                assert_eq!(fallback, cublas, "{op}");
            } else {
                assert_eq!(fallback.len(), 3 + cublas.len(), "{op}: {fallback:?}");
            }
        }
        // f32: cuBLAS and the three 3xTF32 tiles.
        let f32_variants = variants(&full, GeneratedMatmul::Always);
        let tf32x3 = f32_variants
            .iter()
            .filter(|v| v.starts_with("mma 3xtf32 "))
            .count();
        assert_eq!(tf32x3, 3, "{f32_variants:?}");
        assert_eq!(f32_variants.len(), 3 + cublas.len(), "{f32_variants:?}");
    }
}

/// A launch sequence run again and again is recorded once and replayed as one CUDA graph:
/// every round gives what plain launches give, after its inputs' values change and after
/// its buffers do (a new recording). It holds two dependent kernels and a cuBLAS `bf16`
/// product whose rows run padded through scratch memory, which the recording must keep
/// (the allocations in between would otherwise reuse it).
#[test]
fn repeated_sequences_replay_as_graphs() {
    const N: usize = 3001;
    let test = "repeated_sequences_replay_as_graphs";
    if devices(test) == 0 {
        return;
    }
    let cuda = backend();
    let add = cuda
        .compile(0, &samples::vector_add(DType::F32, N, 128).unwrap())
        .unwrap();
    // Integers small enough that the product is exact in `bf16` and `f32`.
    let [m, n, k] = [130usize, 8195, 24];
    let op = matmul(
        DType::BF16,
        [1, m as i64, n as i64, k as i64],
        (false, false),
        ((m * k) as i64, (k * n) as i64),
    );
    let Some(product) = cublas(test, 0, &op) else {
        return;
    };
    let f32s =
        |rng: &mut Rng| -> Vec<f64> { (0..N).map(|_| rounded(DType::F32, rng.unit())).collect() };
    // -1, 0 or 1: sums of 24 products stay exact in `bf16`.
    let ints = |rng: &mut Rng, len: usize| -> Vec<f64> {
        (0..len).map(|_| (rng.unit() * 1.5).round()).collect()
    };
    let alloc = |bytes: usize| cuda.alloc(0, bytes).unwrap();
    let vectors = || [0; 4].map(|_| alloc(N * 4));
    let mut sets = [vectors(), vectors()];
    let [lhs, rhs, out] = [m * k, k * n, m * n].map(|len| alloc(len * 2));
    let sequence = tessel_ir::SequenceId::new();
    let before = cuda.stats();
    let mut rng = Rng(0x6a4f);
    for round in 0..7 {
        // Rounds 0–3 use the first buffers, 4–6 the second; every round new values.
        let [a, b, c, d] = sets[usize::from(round >= 4)];
        let (av, bv) = (f32s(&mut rng), f32s(&mut rng));
        let (lv, rv) = (ints(&mut rng, m * k), ints(&mut rng, k * n));
        cuda.write(a, 0, &encode(DType::F32, &av)).unwrap();
        cuda.write(b, 0, &encode(DType::F32, &bv)).unwrap();
        cuda.write(lhs, 0, &encode(DType::BF16, &lv)).unwrap();
        cuda.write(rhs, 0, &encode(DType::BF16, &rv)).unwrap();
        // Scratch memory changes hands between rounds: a recording that gave its padded
        // rows back to the pool would share them with this buffer.
        let other = alloc(m * 8200 * 2);
        cuda.write(other, 0, &vec![0xff; m * 8200 * 2]).unwrap();
        cuda.launch_sequence(
            sequence,
            &[
                (add, &[a, b, c][..]),
                (product, &[lhs, rhs, out][..]),
                (add, &[c, a, d][..]),
            ],
            &Bindings::new(),
        )
        .unwrap();
        cuda.free(other).unwrap();
        let read = |id, dtype: DType, len: usize| {
            let mut bytes = vec![0u8; len * dtype.size_bytes()];
            cuda.read(id, 0, &mut bytes).unwrap();
            decode(dtype, &bytes)
        };
        let (cv, dv) = (read(c, DType::F32, N), read(d, DType::F32, N));
        for i in 0..N {
            let sum = rounded(DType::F32, av[i] + bv[i]);
            assert_eq!(cv[i], sum, "cuda::{test}: round {round}: c[{i}]");
            assert_eq!(
                dv[i],
                rounded(DType::F32, sum + av[i]),
                "cuda::{test}: round {round}: d[{i}]"
            );
        }
        let got = read(out, DType::BF16, m * n);
        for row in 0..m {
            for col in (0..n).step_by(97).chain([n - 1]) {
                let want: f64 = (0..k).map(|j| lv[row * k + j] * rv[j * n + col]).sum();
                assert_eq!(
                    got[row * n + col],
                    want,
                    "cuda::{test}: round {round}: out[{row}, {col}]"
                );
            }
        }
    }
    let after = cuda.stats();
    // Rounds 0 and 4 (new buffers) launch plainly, 1 and 5 (buffers seen before) record,
    // 2, 3 and 6 replay.
    assert_eq!(
        after.graph_recordings - before.graph_recordings,
        2,
        "cuda::{test}"
    );
    assert_eq!(
        after.graph_launches - before.graph_launches,
        5,
        "cuda::{test}"
    );
    for id in sets
        .iter_mut()
        .flat_map(|s| s.iter())
        .chain(&[lhs, rhs, out])
    {
        cuda.free(*id).unwrap();
    }
    cuda.release(add).unwrap();
    cuda.release(product).unwrap();
}
