//! The wgpu backend on every adapter found (restricted by `TESSEL_WGPU_ADAPTER`): the shared
//! conformance checks of `tessel-testkit` (every op against the reference interpreter, the
//! sample kernels, the error paths), then what only this backend has: discovery and
//! selection, transfers with unaligned ends, buffer limits, WGSL compile errors, the
//! pipeline cache. Without any adapter every test passes after printing a note. On Linux
//! without a GPU, Mesa's lavapipe is an adapter: `WGPU_BACKEND=vulkan cargo test -p
//! tessel-wgpu`.

use std::process::Command;
use std::sync::OnceLock;

use tessel_ir::codegen::{WgslBuffer, WgslShader};
use tessel_ir::{Backend, BackendError, BufferId, DeviceInfo, samples};
use tessel_shape::{BinaryOp, Bindings, DType, TernaryOp, UnaryOp};
use tessel_testkit::{Check, Op, Tolerance};
use tessel_wgpu::{WgpuBackend, WgpuConfig};

/// One backend for the whole test binary (opening devices and building pipelines is what
/// takes time).
fn backend() -> &'static WgpuBackend {
    static BACKEND: OnceLock<WgpuBackend> = OnceLock::new();
    BACKEND.get_or_init(WgpuBackend::new)
}

/// How WGSL may differ from the interpreter (see the WGSL emitter's docs): float `/`,
/// `sqrt` and `1 / sqrt` are within WGSL's 2.5 ulps rather than correctly rounded, the
/// transcendentals other than `sin`/`cos`/`tan`, `log`/`log2` and `erf` (the emitter's
/// own) are the device's built-ins, and `mad` on `f32`/`f64` is WGSL's `fma`, which may
/// round twice; what WGSL cannot express is refused.
const TOLERANCE: Tolerance = Tolerance {
    ulps: wgsl_ulps,
    may_refuse: wgsl_refusals,
};

/// The WGSL specification's accuracy bounds (section "Floating Point Accuracy", for `f32`)
/// at the worst input, plus one ulp for the reference's own rounding.
fn wgsl_ulps(op: Op, input: DType, out: DType) -> u64 {
    let rounded = input.is_float()
        && matches!(
            op,
            Op::Unary(UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal)
                | Op::Binary(BinaryOp::Div)
                | Op::Ternary(TernaryOp::MulAdd)
        );
    if !rounded && !op.is_transcendental(input) {
        return 0;
    }
    // `sin`, `cos` and `tan` are the emitter's own (a Payne–Hanek reduction in integer
    // arithmetic and Cephes' polynomials, WGSL's `/` for `tan`'s cotangent quadrants), not
    // WGSL's built-ins. The half types keep the allowance they had with the built-ins.
    if matches!(op, Op::Unary(UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Tan)) {
        return if input == DType::F32 {
            TRIG_ULPS
        } else {
            u64::MAX
        };
    }
    // A half type's result is the `f32` result rounded, so at most one ulp off.
    if matches!(out, DType::F16 | DType::BF16) {
        return 1;
    }
    match op {
        // `fma` is "inherited from x * y + z": rounding the product first, as lavapipe
        // does, is off by half an ulp of the product, which is any number of ulps of the
        // result when the sum cancels (tens on this data).
        Op::Ternary(TernaryOp::MulAdd) => u64::MAX,
        // 2.5 ulps for `x / y`; `sqrt` is inherited from `1 / inverseSqrt(x)`, 2 ulps each.
        Op::Unary(UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal)
        | Op::Binary(BinaryOp::Div) => 3,
        // `exp`: 3 + 2 |x| ulps, |x| < 89 where the result is a finite normal.
        Op::Unary(UnaryOp::Exp) => 3 + 2 * 89 + 1,
        // `exp2`: 3 + 2 |x| ulps, |x| <= 128.
        Op::Unary(UnaryOp::Exp2) => 3 + 2 * 128 + 1,
        // `pow` is inherited from `exp2(y * log2(x))`: `exp2`'s bound at 150 plus `log2`'s
        // 3 ulps scaled by `y * log2(x)` (up to 150), times ln 2.
        Op::Binary(BinaryOp::Pow) => 3 + 2 * 150 + 3 * 150 + 1,
        // `erf` is fdlibm's `erff` on WGSL's `exp` (near 1 - e/x, with e/x < 0.1 where
        // `exp` is used) and `/`.
        Op::Unary(UnaryOp::Erf) => 8,
        // `log`/`log2` are musl's, not the built-ins (which are only within an absolute
        // 2^-21 on [0.5, 2]), with WGSL's `/`. `tanh` is inherited from `sinh / cosh`,
        // built on `exp`; near 0, where that cancels, the emitter uses its own polynomial.
        _ => 8,
    }
}

/// The transcendentals (and `erf`) on `f64`, and `mad` on `bf16` without doubles (see the
/// WGSL emitter's docs).
fn wgsl_refusals(info: &DeviceInfo, op: Op, input: DType) -> bool {
    (input == DType::F64 && op.is_transcendental(input))
        || (op == Op::Ternary(TernaryOp::MulAdd) && input == DType::BF16 && !info.features.f64)
}

/// `sin`, `cos` and `tan` on `f32`: the emitter's helpers are within 1 ulp (`sin`, `cos`)
/// and 2 ulps (`tan`, through WGSL's `/` in its odd quadrants) of the correctly rounded
/// result in an f32 emulation of 100,000 inputs over the whole range; on lavapipe this
/// test's data needs 2 (1 fails), including |x| up to 2^127.
const TRIG_ULPS: u64 = 2;

/// Runs a conformance check on every device.
fn run(test: &str, check: Check) {
    tessel_testkit::on_every_device(backend(), TOLERANCE, test, check);
}

tessel_testkit::conformance_tests!(run);

/// The devices to test on, each named; announces when there is none, so a run without a
/// driver passes visibly vacuously.
fn devices(gpu: &WgpuBackend, test: &str) -> Vec<(usize, String)> {
    let devices: Vec<(usize, String)> = gpu
        .devices()
        .iter()
        .enumerate()
        .map(|(k, info)| {
            let api = gpu.details(k).map_or("?", |d| d.backend.as_str());
            (k, format!("{api}: {}", info.name))
        })
        .collect();
    if devices.is_empty() {
        eprintln!(
            "{test}: no wgpu adapter found (install a Vulkan driver such as \
             mesa-vulkan-drivers); nothing to test"
        );
    }
    devices
}

/// A small deterministic byte pattern.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn read_all(gpu: &WgpuBackend, id: BufferId, len: usize) -> Vec<u8> {
    let mut out = vec![0xAA; len];
    gpu.read(id, 0, &mut out).unwrap();
    out
}

/// Names the devices under test in the output (`--nocapture`), so a CI log shows where the
/// suite ran.
#[test]
fn lists_devices() {
    let gpu = backend();
    assert_eq!(gpu.name(), "wgpu");
    for (device, name) in devices(gpu, "lists_devices") {
        let info = &gpu.devices()[device];
        let d = gpu.details(device).unwrap();
        eprintln!(
            "wgpu device {device}: {name} | {} | driver {} {} | f64 {} | int64 {} | f16 {} | \
             timestamps {} | max buffer {} | max binding {} | max buffers {} | workgroup {} \
             {:?} | groups {:?} | local {} B | subgroup {:?}",
            d.device_type,
            d.driver,
            d.driver_info,
            d.shader_f64,
            d.shader_int64,
            info.features.f16,
            d.timestamps,
            d.max_buffer_size,
            d.max_storage_binding,
            d.max_storage_buffers,
            info.max_workgroup_size,
            info.max_local_size,
            info.max_groups,
            info.local_memory_bytes,
            info.features.subgroup_size,
        );
        assert!(!info.name.is_empty());
        assert!(info.max_workgroup_size >= 64, "{name}");
        assert!(info.max_groups[0] >= 65535, "{name}");
        assert!(d.max_storage_buffers >= 4, "{name}");
        assert_eq!(info.features.f64, d.shader_f64 && d.shader_int64);
        assert_eq!(info.features.int64, d.shader_int64);
    }
    assert!(gpu.details(gpu.devices().len()).is_none());
}

/// Whole-buffer writes read back, at sizes around the 4-byte word.
#[test]
fn buffers_round_trip_at_odd_sizes() {
    let gpu = backend();
    for (device, name) in devices(gpu, "buffers_round_trip_at_odd_sizes") {
        for len in [0, 1, 2, 3, 4, 5, 7, 8, 17, 1000, 4099] {
            let id = gpu.alloc(device, len).unwrap();
            let data = pattern(len, 7);
            gpu.write(id, 0, &data).unwrap();
            assert_eq!(read_all(gpu, id, len), data, "{name}: {len} bytes");
            gpu.free(id).unwrap();
        }
    }
}

/// Freed buffers are handed out again for allocations of their size class (keeping their
/// bytes), up to the pool's cap; new buffers read as zeros; `trim` drops the cached ones.
#[test]
fn freed_buffers_are_reused() {
    // Backends of their own: other tests allocate concurrently on the shared one.
    let gpu = &WgpuBackend::with_config(WgpuConfig::from_env());
    let uncached = &WgpuBackend::with_config(WgpuConfig {
        pool_bytes: 0,
        ..WgpuConfig::from_env()
    });
    for (device, name) in devices(gpu, "freed_buffers_are_reused") {
        let len = 4099;
        let fresh = gpu.alloc(device, len).unwrap();
        assert_eq!(read_all(gpu, fresh, len), vec![0; len], "{name}: fresh");
        gpu.write(fresh, 0, &pattern(len, 3)).unwrap();
        gpu.free(fresh).unwrap();
        let before = gpu.stats();
        assert!(before.cached_bytes >= len as u64, "{name}: {before:?}");
        // 4100 bytes and 4099 share a size class.
        let again = gpu.alloc(device, len + 1).unwrap();
        let after = gpu.stats();
        assert_eq!(
            after.pool_reuses,
            before.pool_reuses + 1,
            "{name}: {after:?}"
        );
        assert_eq!(after.buffers_created, before.buffers_created, "{name}");
        // Allocations are not zeroed: the old owner's bytes are still there.
        assert_eq!(read_all(gpu, again, len), pattern(len, 3), "{name}: reused");
        gpu.free(again).unwrap();
        assert!(gpu.trim() >= len as u64, "{name}");
        assert_eq!(gpu.stats().cached_bytes, 0, "{name}");
        let new = gpu.alloc(device, len).unwrap();
        assert_eq!(
            gpu.stats().buffers_created,
            after.buffers_created + 1,
            "{name}"
        );
        gpu.free(new).unwrap();
        // Without a pool nothing is kept.
        let id = uncached.alloc(device, len).unwrap();
        uncached.free(id).unwrap();
        let id = uncached.alloc(device, len).unwrap();
        let stats = uncached.stats();
        assert_eq!((stats.pool_reuses, stats.cached_bytes), (0, 0), "{name}");
        uncached.free(id).unwrap();
    }
}

/// Writes and reads that start or end inside a word change exactly their bytes.
#[test]
fn unaligned_writes_and_reads() {
    let gpu = backend();
    for (device, name) in devices(gpu, "unaligned_writes_and_reads") {
        let len = 23;
        let id = gpu.alloc(device, len).unwrap();
        let mut model = pattern(len, 1);
        gpu.write(id, 0, &model).unwrap();
        for (offset, n) in [
            (1, 1),
            (2, 1),
            (3, 2),
            (5, 3),
            (6, 7),
            (1, 22),
            (20, 3),
            (4, 4),
        ] {
            let data = pattern(n, (offset * 13 + n) as u8);
            gpu.write(id, offset, &data).unwrap();
            model[offset..offset + n].copy_from_slice(&data);
            assert_eq!(
                read_all(gpu, id, len),
                model,
                "{name}: after writing {n} at {offset}"
            );
        }
        for offset in 0..len {
            for n in [0, 1, 2, 3, 5, len - offset] {
                if offset + n > len {
                    continue;
                }
                let mut out = vec![0xEE; n];
                gpu.read(id, offset, &mut out).unwrap();
                assert_eq!(out, model[offset..offset + n], "{name}: {n} at {offset}");
            }
        }
        // Out of range either way.
        assert!(matches!(
            gpu.write(id, 20, &[0; 4]),
            Err(BackendError::InvalidArgument(_))
        ));
        assert!(matches!(
            gpu.read(id, usize::MAX, &mut [0; 2]),
            Err(BackendError::InvalidArgument(_))
        ));
        gpu.free(id).unwrap();
    }
}

/// Device-to-device copies of whole buffers, prefixes ending inside a word (the bytes after
/// them stay), onto itself and of nothing.
#[test]
fn copies_keep_the_bytes_past_their_end() {
    let gpu = backend();
    for (device, name) in devices(gpu, "copies_keep_the_bytes_past_their_end") {
        let src_data = pattern(19, 3);
        let src = gpu.alloc(device, 19).unwrap();
        gpu.write(src, 0, &src_data).unwrap();
        for bytes in [0, 1, 3, 4, 6, 8, 13, 19] {
            let dst_data = pattern(21, 99);
            let dst = gpu.alloc(device, 21).unwrap();
            gpu.write(dst, 0, &dst_data).unwrap();
            gpu.copy(src, dst, bytes).unwrap();
            let mut want = dst_data.clone();
            want[..bytes].copy_from_slice(&src_data[..bytes]);
            assert_eq!(read_all(gpu, dst, 21), want, "{name}: copy of {bytes}");
            gpu.free(dst).unwrap();
        }
        // Whole buffers of the same odd size (the padding goes along).
        let dst = gpu.alloc(device, 19).unwrap();
        gpu.copy(src, dst, 19).unwrap();
        assert_eq!(read_all(gpu, dst, 19), src_data, "{name}: whole");
        gpu.copy(src, src, 19).unwrap();
        assert_eq!(read_all(gpu, src, 19), src_data, "{name}: onto itself");
        assert!(matches!(
            gpu.copy(src, dst, 20),
            Err(BackendError::InvalidArgument(_))
        ));
        for id in [src, dst] {
            gpu.free(id).unwrap();
        }
        assert!(matches!(
            gpu.free(src),
            Err(BackendError::InvalidArgument(_))
        ));
        assert!(matches!(
            gpu.write(src, 0, &[1]),
            Err(BackendError::InvalidArgument(_))
        ));
    }
}

/// A buffer beyond the device's limit is `OutOfMemory`, and the device works afterwards.
#[test]
fn huge_allocations_are_out_of_memory() {
    let gpu = backend();
    for (device, name) in devices(gpu, "huge_allocations_are_out_of_memory") {
        let limit = gpu.details(device).unwrap().max_buffer_size;
        let over = usize::try_from(limit + 1).unwrap_or(usize::MAX);
        for bytes in [over, 1 << 60, 1 << 62, usize::MAX / 2, usize::MAX] {
            let err = gpu.alloc(device, bytes).unwrap_err();
            assert!(
                matches!(err, BackendError::OutOfMemory { requested, .. } if requested == bytes),
                "{name}: {err:?}"
            );
        }
        // Empty buffers and transfers are fine.
        let empty = gpu.alloc(device, 0).unwrap();
        gpu.write(empty, 0, &[]).unwrap();
        gpu.read(empty, 0, &mut []).unwrap();
        gpu.copy(empty, empty, 0).unwrap();
        gpu.free(empty).unwrap();
        assert!(matches!(
            gpu.read(empty, 0, &mut []),
            Err(BackendError::InvalidArgument(_))
        ));
        let id = gpu.alloc(device, 8).unwrap();
        gpu.write(id, 0, &[1; 8]).unwrap();
        assert_eq!(read_all(gpu, id, 8), [1; 8], "{name}");
        gpu.free(id).unwrap();
        gpu.synchronize(device).unwrap();
    }
}

/// Unknown devices, buffers and programs are invalid arguments, not panics.
#[test]
fn unknown_ids_are_invalid_arguments() {
    let gpu = backend();
    let n = gpu.devices().len();
    let invalid = |r: Result<(), BackendError>| matches!(r, Err(BackendError::InvalidArgument(_)));
    assert!(invalid(gpu.alloc(n, 4).map(drop)));
    assert!(invalid(gpu.synchronize(n)));
    let kernel = samples::vector_add(DType::F32, 16, 16).unwrap();
    assert!(invalid(gpu.compile(n, &kernel).map(drop)));
    let bogus = tessel_ir::ProgramId(u64::MAX);
    assert!(invalid(gpu.launch(bogus, &[], &Bindings::new())));
    assert!(invalid(gpu.time(bogus, &[], &Bindings::new()).map(drop)));
    assert!(invalid(gpu.release(bogus)));
}

/// The vector-add ABI of `render_wgsl` (three `f32` buffers, the uniform after them), with
/// `source` as the shader.
fn vector_add_shader(source: &str) -> WgslShader {
    let buffer = |binding, read_only| WgslBuffer {
        binding,
        read_only,
        dtype: DType::F32,
    };
    WgslShader {
        source: source.to_owned(),
        entry_point: "main".to_owned(),
        workgroup_size: [64, 1, 1],
        buffers: vec![buffer(0, true), buffer(1, true), buffer(2, false)],
        uniform_binding: 3,
        uniform_size: 16,
        max_groups_per_dim: 65535,
    }
}

/// WGSL that naga rejects is a compile error carrying the source and naga's diagnostic;
/// the device works afterwards.
#[test]
fn invalid_wgsl_is_a_compile_error() {
    let gpu = backend();
    for (device, name) in devices(gpu, "invalid_wgsl_is_a_compile_error") {
        let kernel = samples::vector_add(DType::F32, 64, 64).unwrap();
        let source =
            "@compute @workgroup_size(64)\nfn main() {\n    let x: f32 = undefined_thing;\n}\n";
        let err = gpu
            .compile_shader(device, &kernel, vector_add_shader(source))
            .unwrap_err();
        let BackendError::Compile {
            kernel: k,
            code,
            log,
        } = &err
        else {
            panic!("{name}: {err:?}")
        };
        assert_eq!(k, &kernel.name);
        assert_eq!(code, source);
        assert!(log.contains("undefined_thing"), "{name}: {log}");
        eprintln!("{name}: the compile error reads:\n{err}");
        // A module that parses but whose entry point is missing fails at the pipeline.
        let err = gpu
            .compile_shader(device, &kernel, vector_add_shader("fn helper() {}\n"))
            .unwrap_err();
        assert!(
            matches!(err, BackendError::Compile { .. }),
            "{name}: {err:?}"
        );
        gpu.synchronize(device).unwrap();
        let id = gpu.alloc(device, 4).unwrap();
        gpu.free(id).unwrap();
    }
}

/// A hand-written vector add builds through the explicit layout, is cached by source, runs
/// and is timed (the emitter's `dispatch` sizes the grid).
#[test]
fn hand_written_wgsl_builds_once() {
    let source = "\
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> args: vec4<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&out)) {
        out[id.x] = a[id.x] + b[id.x];
    }
}
";
    // A backend of its own: other tests build pipelines concurrently on the shared one.
    let gpu = &WgpuBackend::with_config(WgpuConfig::from_env());
    for (device, name) in devices(gpu, "hand_written_wgsl_builds_once") {
        let kernel = samples::vector_add(DType::F32, 64, 64).unwrap();
        let before = gpu.stats();
        let p = gpu
            .compile_shader(device, &kernel, vector_add_shader(source))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let q = gpu
            .compile_shader(device, &kernel, vector_add_shader(source))
            .unwrap();
        let after = gpu.stats();
        assert_eq!(after.builds - before.builds, 1, "{name}");
        assert!(after.cache_hits > before.cache_hits, "{name}");
        let ids: Vec<BufferId> = (0..3).map(|_| gpu.alloc(device, 256).unwrap()).collect();
        // Too small a buffer is rejected before anything is encoded.
        let small = gpu.alloc(device, 255).unwrap();
        let err = gpu
            .launch(p, &[ids[0], ids[1], small], &Bindings::new())
            .unwrap_err();
        assert!(matches!(err, BackendError::InvalidArgument(_)), "{err:?}");
        let a: Vec<f32> = (0..64).map(|k| k as f32 * 0.5).collect();
        let b: Vec<f32> = (0..64).map(|k| 100.0 - k as f32).collect();
        let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        gpu.write(ids[0], 0, &bytes(&a)).unwrap();
        gpu.write(ids[1], 0, &bytes(&b)).unwrap();
        gpu.launch(p, &ids, &Bindings::new()).unwrap();
        let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(read_all(gpu, ids[2], 256), bytes(&sum), "{name}: launch");
        gpu.write(ids[2], 0, &[0; 256]).unwrap();
        let elapsed = gpu.time(q, &ids, &Bindings::new()).unwrap();
        assert_eq!(
            read_all(gpu, ids[2], 256),
            bytes(&sum),
            "{name}: timed launch"
        );
        eprintln!("{name}: a 64-element vector add took {elapsed:?}");
        assert!(
            elapsed < std::time::Duration::from_secs(10),
            "{name}: {elapsed:?}"
        );
        gpu.synchronize(device).unwrap();
        assert_eq!(gpu.stats().launches - after.launches, 2, "{name}");
        for id in ids.into_iter().chain([small]) {
            gpu.free(id).unwrap();
        }
        gpu.release(p).unwrap();
        gpu.release(q).unwrap();
    }
}

/// Set in the child processes of `environment_narrows_the_devices`.
const CHILD: &str = "TESSEL_WGPU_TEST_CHILD";

/// Runs `child_reports_devices` in a child process with `envs`, and returns the device count
/// it printed.
fn devices_in_child(envs: &[(&str, &str)]) -> usize {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "child_reports_devices",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env_remove("TESSEL_WGPU_ADAPTER");
    for (key, value) in envs {
        command.env(key, value);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child with {envs:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.split("child: devices=").nth(1))
        .unwrap_or_else(|| panic!("the child test did not run:\n{stdout}"))
        .trim()
        .parse()
        .unwrap()
}

/// `TESSEL_WGPU_ADAPTER` matching nothing, and `WGPU_BACKEND` naming an API with no driver
/// here, both give zero devices, without a panic. Child processes: wgpu and the Vulkan
/// loader read their variables once per process.
#[test]
fn environment_narrows_the_devices() {
    assert_eq!(devices_in_child(&[("TESSEL_WGPU_ADAPTER", "nomatch")]), 0);
    // No API has a driver under a name no driver has.
    let missing = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-icd.json");
    let missing = missing.to_str().unwrap();
    assert_eq!(
        devices_in_child(&[
            ("WGPU_BACKEND", "vulkan"),
            ("VK_ICD_FILENAMES", missing),
            ("VK_DRIVER_FILES", missing),
        ]),
        0
    );
    let all = backend().devices().len();
    if all > 0 {
        assert_eq!(devices_in_child(&[("TESSEL_WGPU_ADAPTER", "0")]), 1);
        let first = backend().devices()[0].name.to_uppercase();
        assert!(devices_in_child(&[("TESSEL_WGPU_ADAPTER", &first)]) >= 1);
    }
}

/// The child of `environment_narrows_the_devices`; does nothing when run directly.
#[test]
fn child_reports_devices() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let gpu = WgpuBackend::with_config(WgpuConfig::from_env());
    println!("child: devices={}", gpu.devices().len());
}

/// An explicit configuration ignores the environment; an index out of range picks nothing.
#[test]
fn configured_adapters() {
    let none = WgpuBackend::with_config(WgpuConfig {
        adapter: Some("999".into()),
        ..WgpuConfig::default()
    });
    assert!(none.devices().is_empty());
    assert_eq!(none.config().adapter.as_deref(), Some("999"));
    assert!(matches!(
        none.alloc(0, 4),
        Err(BackendError::InvalidArgument(_))
    ));
}

/// An `i32` widened to `i64` and compared signed, as the tensor runtime's `cat` kernels
/// do: lavapipe miscompiled WGSL's own `i64(x)` there (every comparison false), which the
/// emitter now avoids by spelling the sign extension out.
#[test]
fn widened_integers_compare_signed() {
    let gpu = backend();
    for (device, name) in devices(gpu, "widened_integers_compare_signed") {
        if !gpu.devices()[device].features.int64 {
            continue;
        }
        let n = 64;
        let mut kb = tessel_ir::KernelBuilder::new("widen_compare");
        let out = kb.buffer("out", DType::I32, n, tessel_ir::Access::Write);
        kb.grid([1, 1, 1], [n, 1, 1]);
        let l = kb.local_id(0, DType::I32);
        let half = kb.constant_as(n / 2, DType::I32);
        let centred = kb.sub(l, half);
        let wide = kb.cast(centred, DType::I64);
        let three = kb.constant_as(3, DType::I64);
        let below = kb.lt(wide, three);
        let minus_two = kb.constant_as(-2, DType::I64);
        let above = kb.lt(minus_two, wide);
        let (one, two) = (kb.constant_as(1, DType::I32), kb.constant_as(2, DType::I32));
        let zero = kb.constant_as(0, DType::I32);
        let a = kb.select(below, one, zero);
        let b = kb.select(above, two, zero);
        let sum = kb.add(a, b);
        kb.store(out, l, sum);
        let kernel = kb.build().unwrap();
        let kit = tessel_testkit::Conformance::new(gpu, device, TOLERANCE);
        let buffers = [vec![0; n as usize * 4]];
        let got = kit.execute(&kernel, &buffers, &Bindings::new()).unwrap();
        let want = tessel_testkit::interpret(&kernel, &buffers, &Bindings::new());
        assert_eq!(got, want, "{name}");
    }
}
