//! The OpenCL backend on the sample kernels, on every device found (restricted by
//! `TESSEL_OPENCL_DEVICE`), compared with values computed directly in Rust; then the
//! program cache, transfers and the error paths. Without any OpenCL device every test passes
//! after printing a note.

mod common;

use std::process::Command;

use common::{Rng, backend, devices, execute, f32_bytes, f32_values, supports};
use tessel_ir::{Access, Backend, BackendError, KernelBuilder, samples};
use tessel_opencl::{OpenClBackend, OpenClConfig};
use tessel_shape::{Bindings, DType, UnaryOp, Var, bf16, f16};

/// Random elements of `dtype`: any bits for integers, 0 or 1 for `bool`, and finite values
/// in `[-100, 100)` for floats (so that sums are ordinary numbers).
fn random_elements(rng: &mut Rng, dtype: DType, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size_bytes());
    for _ in 0..n {
        let bits = rng.next_u64();
        let x = rng.unit() * 100.0;
        match dtype {
            DType::Bool => out.push((bits & 1) as u8),
            DType::F16 => out.extend(f16::from_f64(x).to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f64(x).to_le_bytes()),
            DType::F32 => out.extend((x as f32).to_le_bytes()),
            DType::F64 => out.extend(x.to_le_bytes()),
            _ => out.extend(&bits.to_le_bytes()[..dtype.size_bytes()]),
        }
    }
    out
}

/// `a + b` element by element, as Rust computes it for `dtype`.
fn add_in_rust(dtype: DType, a: &[u8], b: &[u8]) -> Vec<u8> {
    macro_rules! elementwise {
        ($t:ty, |$x:ident, $y:ident| $e:expr) => {
            a.chunks_exact(size_of::<$t>())
                .zip(b.chunks_exact(size_of::<$t>()))
                .flat_map(|(x, y)| {
                    let $x = <$t>::from_le_bytes(x.try_into().unwrap());
                    let $y = <$t>::from_le_bytes(y.try_into().unwrap());
                    $e.to_le_bytes()
                })
                .collect()
        };
    }
    match dtype {
        DType::Bool => a.iter().zip(b).map(|(x, y)| x | y).collect(),
        DType::U8 => elementwise!(u8, |x, y| x.wrapping_add(y)),
        DType::U16 => elementwise!(u16, |x, y| x.wrapping_add(y)),
        DType::U32 => elementwise!(u32, |x, y| x.wrapping_add(y)),
        DType::U64 => elementwise!(u64, |x, y| x.wrapping_add(y)),
        DType::I8 => elementwise!(i8, |x, y| x.wrapping_add(y)),
        DType::I16 => elementwise!(i16, |x, y| x.wrapping_add(y)),
        DType::I32 => elementwise!(i32, |x, y| x.wrapping_add(y)),
        DType::I64 => elementwise!(i64, |x, y| x.wrapping_add(y)),
        DType::F16 => elementwise!(f16, |x, y| x + y),
        DType::BF16 => elementwise!(bf16, |x, y| x + y),
        DType::F32 => elementwise!(f32, |x, y| x + y),
        DType::F64 => elementwise!(f64, |x, y| x + y),
    }
}

/// Names the devices under test in the output (`--nocapture`), so a CI log shows where
/// the suite ran.
#[test]
fn lists_devices() {
    let cl = backend();
    for (device, name) in devices(cl, "lists_devices") {
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

#[test]
fn vector_add_every_dtype() {
    let cl = backend();
    let n = 1000;
    for (device, name) in devices(cl, "vector_add_every_dtype") {
        for dtype in DType::ALL {
            if !supports(cl, device, &name, dtype) {
                continue;
            }
            let mut rng = Rng(dtype as u64 + 1);
            let a = random_elements(&mut rng, dtype, n);
            let b = random_elements(&mut rng, dtype, n);
            let kernel = samples::vector_add(dtype, n, 64).unwrap();
            let out = vec![0xAB; n * dtype.size_bytes()];
            let result = execute(
                cl,
                device,
                &kernel,
                &[a.clone(), b.clone(), out],
                &Bindings::new(),
            )
            .unwrap();
            assert_eq!(
                result[2],
                add_in_rust(dtype, &a, &b),
                "{name}: vector_add on {dtype}"
            );
        }
    }
}

#[test]
fn permuted_copy() {
    let cl = backend();
    let (shape, perm) = ([5, 7, 9], [2, 0, 1]);
    let total = shape.iter().product::<usize>();
    let x = Rng(7).f32s(total);
    // out[o0, o1, o2] = x[i] where input axis perm[j] has coordinate o_j.
    let out_shape = perm.map(|p| shape[p]);
    let mut expected = Vec::with_capacity(total);
    for o0 in 0..out_shape[0] {
        for o1 in 0..out_shape[1] {
            for o2 in 0..out_shape[2] {
                let mut at = [0; 3];
                for (j, o) in [o0, o1, o2].into_iter().enumerate() {
                    at[perm[j]] = o;
                }
                expected.push(x[(at[0] * shape[1] + at[1]) * shape[2] + at[2]]);
            }
        }
    }
    let kernel = samples::permuted_copy(shape, perm).unwrap();
    for (device, name) in devices(cl, "permuted_copy") {
        let buffers = [f32_bytes(&x), vec![0; total * 4]];
        let result = execute(cl, device, &kernel, &buffers, &Bindings::new()).unwrap();
        assert_eq!(f32_values(&result[1]), expected, "{name}");
    }
}

#[test]
fn row_sum() {
    let cl = backend();
    let (rows, cols) = (100, 37);
    let x = Rng(11).f32s(rows * cols);
    // Left to right in f32, as the kernel sums: the same roundings, so the same bits.
    let expected: Vec<f32> = x
        .chunks(cols)
        .map(|row| row.iter().fold(0.0f32, |acc, v| acc + v))
        .collect();
    let kernel = samples::row_sum(rows, cols, DType::F32).unwrap();
    for (device, name) in devices(cl, "row_sum") {
        let buffers = [f32_bytes(&x), vec![0; rows * 4]];
        let result = execute(cl, device, &kernel, &buffers, &Bindings::new()).unwrap();
        assert_eq!(f32_values(&result[1]), expected, "{name}");
    }
}

#[test]
fn tree_reduce_with_barriers() {
    let cl = backend();
    let (n, local) = (1000, 64);
    let x = Rng(13).f32s(n);
    let groups = n.div_ceil(local);
    // The kernel's own order: pairwise halving within each workgroup, zeros past n.
    let expected: Vec<f32> = (0..groups)
        .map(|g| {
            let mut scratch: Vec<f32> = (0..local)
                .map(|l| x.get(g * local + l).copied().unwrap_or(0.0))
                .collect();
            let mut stride = local / 2;
            while stride > 0 {
                for l in 0..stride {
                    scratch[l] += scratch[l + stride];
                }
                stride /= 2;
            }
            scratch[0]
        })
        .collect();
    let kernel = samples::tree_reduce(n, local).unwrap();
    for (device, name) in devices(cl, "tree_reduce") {
        let buffers = [f32_bytes(&x), vec![0; groups * 4]];
        let result = execute(cl, device, &kernel, &buffers, &Bindings::new()).unwrap();
        assert_eq!(f32_values(&result[1]), expected, "{name}");
    }
}

#[test]
fn tiled_matmul_with_local_memory() {
    let cl = backend();
    let (m, n, k, tile) = (64, 64, 64, 16);
    let mut rng = Rng(17);
    let (a, b) = (rng.f32s(m * k), rng.f32s(k * n));
    // The kernel's own order: one fused multiply-add per step, k ascending.
    let mut expected = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            expected[i * n + j] =
                (0..k).fold(0.0f32, |acc, p| a[i * k + p].mul_add(b[p * n + j], acc));
        }
    }
    let kernel = samples::tiled_matmul(m, n, k, tile).unwrap();
    for (device, name) in devices(cl, "tiled_matmul") {
        let buffers = [f32_bytes(&a), f32_bytes(&b), vec![0; m * n * 4]];
        let c = execute(cl, device, &kernel, &buffers, &Bindings::new()).unwrap();
        assert_eq!(f32_values(&c[2]), expected, "{name}");
    }
}

#[test]
fn dynamic_dims_compile_once() {
    // A backend of its own, so the counters are this test's.
    let cl = OpenClBackend::new();
    let var = Var::new("n", 1, 1 << 20).unwrap();
    let kernel = samples::dynamic_vector_add(var, 64).unwrap();
    for (device, name) in devices(&cl, "dynamic_dims_compile_once") {
        let before = cl.stats();
        let program = cl.compile(device, &kernel).unwrap();
        for n in [1000, 4097] {
            let mut rng = Rng(n as u64);
            let (a, b) = (rng.f32s(n), rng.f32s(n));
            let ids: Vec<_> = [f32_bytes(&a), f32_bytes(&b), vec![0; n * 4]]
                .iter()
                .map(|data| {
                    let id = cl.alloc(device, data.len()).unwrap();
                    cl.write(id, 0, data).unwrap();
                    id
                })
                .collect();
            cl.launch(program, &ids, &Bindings::new().with(var, n as i64))
                .unwrap();
            cl.synchronize(device).unwrap();
            let mut out = vec![0; n * 4];
            cl.read(ids[2], 0, &mut out).unwrap();
            let expected: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            assert_eq!(f32_values(&out), expected, "{name}: n = {n}");
            for id in ids {
                cl.free(id).unwrap();
            }
        }
        // The same kernel again is a cache hit, not a build.
        let again = cl.compile(device, &kernel).unwrap();
        let stats = cl.stats();
        assert_eq!(
            (
                stats.builds - before.builds,
                stats.cache_hits - before.cache_hits,
                stats.launches - before.launches
            ),
            (1, 1, 2),
            "{name}: {stats:?}"
        );
        cl.release(again).unwrap();
        cl.release(program).unwrap();
        assert!(cl.release(program).is_err());
    }
}

#[test]
fn one_buffer_bound_twice() {
    // out = a + b with out and a the same buffer: an in-place update.
    let cl = backend();
    let n = 300;
    let kernel = samples::vector_add(DType::I32, n, 64).unwrap();
    let a: Vec<i32> = (0..n as i32).collect();
    let b: Vec<i32> = (0..n as i32).map(|i| 1000 * i).collect();
    let bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for (device, name) in devices(cl, "one_buffer_bound_twice") {
        let program = cl.compile(device, &kernel).unwrap();
        let (x, y) = (
            cl.alloc(device, n * 4).unwrap(),
            cl.alloc(device, n * 4).unwrap(),
        );
        cl.write(x, 0, &bytes(&a)).unwrap();
        cl.write(y, 0, &bytes(&b)).unwrap();
        cl.launch(program, &[x, y, x], &Bindings::new()).unwrap();
        let mut out = vec![0; n * 4];
        cl.read(x, 0, &mut out).unwrap();
        let expected: Vec<i32> = a.iter().zip(&b).map(|(p, q)| p + q).collect();
        assert_eq!(out, bytes(&expected), "{name}");
        for id in [x, y] {
            cl.free(id).unwrap();
        }
        cl.release(program).unwrap();
    }
}

#[test]
fn launches_are_timed_on_the_device() {
    let cl = backend();
    let n = 1 << 16;
    let kernel = samples::vector_add(DType::F32, n, 64).unwrap();
    for (device, name) in devices(cl, "launches_are_timed_on_the_device") {
        let program = cl.compile(device, &kernel).unwrap();
        let ids: Vec<_> = (0..3).map(|_| cl.alloc(device, n * 4).unwrap()).collect();
        let data = f32_bytes(&Rng(19).f32s(n));
        cl.write(ids[0], 0, &data).unwrap();
        cl.write(ids[1], 0, &data).unwrap();
        let elapsed = cl.time(program, &ids, &Bindings::new()).unwrap();
        assert!(
            elapsed > std::time::Duration::ZERO && elapsed.as_secs() < 60,
            "{name}: {elapsed:?}"
        );
        let mut out = vec![0; n * 4];
        cl.read(ids[2], 0, &mut out).unwrap();
        let doubled: Vec<f32> = f32_values(&data).iter().map(|x| x + x).collect();
        assert_eq!(f32_values(&out), doubled, "{name}");
        for id in ids {
            cl.free(id).unwrap();
        }
        cl.release(program).unwrap();
    }
}

#[test]
fn build_failures_carry_the_log() {
    let cl = backend();
    for (device, name) in devices(cl, "build_failures_carry_the_log") {
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

#[test]
fn kernels_failing_verification_are_compile_errors() {
    let cl = backend();
    let mut kb = KernelBuilder::new("writes_read_only");
    kb.buffer("a", DType::F32, 4, Access::Read);
    let i = kb.constant_as(0, DType::I32);
    let x = kb.constant(1.0f32);
    kb.push(tessel_ir::Inst::Store {
        mem: tessel_ir::Mem::Global(0),
        index: i,
        value: x,
    });
    let kernel = kb.finish_unverified();
    for (device, name) in devices(cl, "kernels_failing_verification") {
        let err = cl.compile(device, &kernel).unwrap_err();
        let BackendError::Compile { log, .. } = &err else {
            panic!("{name}: {err:?}")
        };
        assert!(log.contains("declared Read"), "{name}: {log}");
    }
}

/// Kernel names are free text; generated code must not depend on them being identifiers.
#[test]
fn any_kernel_name_compiles() {
    let cl = backend();
    let mut kernel = samples::vector_add(DType::I8, 10, 4).unwrap();
    kernel.name = "add */ int #define x\n \"quoted\" é".to_owned();
    for (device, name) in devices(cl, "any_kernel_name_compiles") {
        let (a, b) = (vec![1u8; 10], vec![2u8; 10]);
        let out = execute(cl, device, &kernel, &[a, b, vec![0; 10]], &Bindings::new()).unwrap();
        assert_eq!(out[2], vec![3u8; 10], "{name}");
    }
}

#[test]
fn too_small_buffers_are_rejected() {
    let cl = backend();
    let kernel = samples::vector_add(DType::F32, 100, 64).unwrap();
    for (device, name) in devices(cl, "too_small_buffers_are_rejected") {
        let err = execute(
            cl,
            device,
            &kernel,
            &[vec![0; 400], vec![0; 399], vec![0; 400]],
            &Bindings::new(),
        )
        .unwrap_err();
        let BackendError::InvalidArgument(msg) = &err else {
            panic!("{name}: {err:?}")
        };
        for part in ["vector_add", "`b`", "400 bytes", "399 bytes"] {
            assert!(msg.contains(part), "{name}: {msg}");
        }
        let err = execute(
            cl,
            device,
            &kernel,
            &[vec![0; 400], vec![0; 400]],
            &Bindings::new(),
        )
        .unwrap_err();
        assert!(
            matches!(err, BackendError::InvalidArgument(_)),
            "{name}: {err:?}"
        );
        // An unbound dim is rejected the same way.
        let var = Var::new("n", 1, 1 << 20).unwrap();
        let dynamic = samples::dynamic_vector_add(var, 64).unwrap();
        let err = execute(
            cl,
            device,
            &dynamic,
            &vec![vec![0; 400]; 3],
            &Bindings::new(),
        )
        .unwrap_err();
        assert!(
            matches!(err, BackendError::InvalidArgument(_)),
            "{name}: {err:?}"
        );
    }
}

/// The kernels that need `double`, for the refusal tests.
fn needs_f64() -> Vec<(&'static str, tessel_ir::Kernel)> {
    let mut kb = KernelBuilder::new("erf_f32");
    let x = kb.buffer("x", DType::F32, 64, Access::Read);
    let out = kb.buffer("out", DType::F32, 64, Access::Write);
    kb.grid([1, 1, 1], [64, 1, 1]);
    let i = kb.local_id(0, DType::I32);
    let v = kb.load(x, i);
    let e = kb.unary(UnaryOp::Erf, v);
    kb.store(out, i, e);
    vec![
        ("f64", samples::vector_add(DType::F64, 100, 64).unwrap()),
        ("erf (computed in f64)", kb.build().unwrap()),
    ]
}

/// `f64` on a device without `cl_khr_fp64` is refused by name, never run: on such devices
/// when there are any, and always on every device with doubles switched off by config.
#[test]
fn f64_without_fp64_is_unsupported() {
    let real = backend();
    let forced = OpenClBackend::with_config(OpenClConfig {
        disable_f64: true,
        ..OpenClConfig::from_env()
    });
    let mut checked = 0;
    for (cl, how) in [(real, "reported"), (&forced, "forced")] {
        for (device, name) in devices(cl, "f64_without_fp64_is_unsupported") {
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
            // Everything else still runs, through the dialect without doubles.
            let kernel = samples::vector_add(DType::F16, 100, 64).unwrap();
            let mut rng = Rng(23);
            let (a, b) = (
                random_elements(&mut rng, DType::F16, 100),
                random_elements(&mut rng, DType::F16, 100),
            );
            let out = execute(
                cl,
                device,
                &kernel,
                &[a.clone(), b.clone(), vec![0; 200]],
                &Bindings::new(),
            )
            .unwrap();
            assert_eq!(out[2], add_in_rust(DType::F16, &a, &b), "{name} ({how})");
            checked += 1;
        }
    }
    if !forced.devices().is_empty() {
        assert!(checked >= forced.devices().len());
    }
}

#[test]
fn memory_and_transfers_are_checked() {
    let cl = backend();
    for (device, name) in devices(cl, "memory_and_transfers_are_checked") {
        let (a, b) = (
            cl.alloc(device, 100).unwrap(),
            cl.alloc(device, 50).unwrap(),
        );
        cl.write(a, 0, &[7; 100]).unwrap();
        cl.write(a, 10, &[9; 5]).unwrap();
        cl.copy(a, b, 50).unwrap();
        let mut out = [0; 50];
        cl.read(b, 0, &mut out).unwrap();
        let mut expected = [7; 50];
        expected[10..15].fill(9);
        assert_eq!(out, expected, "{name}");
        let mut tail = [0; 3];
        cl.read(a, 97, &mut tail).unwrap();
        assert_eq!(tail, [7; 3]);
        cl.copy(a, a, 100).unwrap();
        assert!(cl.copy(a, b, 51).is_err());
        assert!(cl.write(a, 90, &[0; 11]).is_err());
        assert!(cl.read(a, usize::MAX, &mut [0; 2]).is_err());
        // Empty buffers and transfers are fine.
        let empty = cl.alloc(device, 0).unwrap();
        cl.write(empty, 0, &[]).unwrap();
        cl.read(empty, 0, &mut []).unwrap();
        cl.free(empty).unwrap();
        cl.free(a).unwrap();
        assert!(matches!(
            cl.read(a, 0, &mut [0; 1]),
            Err(BackendError::InvalidArgument(_))
        ));
        assert!(cl.free(a).is_err());
        cl.free(b).unwrap();
        for bytes in [1 << 62, usize::MAX] {
            let err = cl.alloc(device, bytes).unwrap_err();
            assert!(
                matches!(err, BackendError::OutOfMemory { requested, .. } if requested == bytes),
                "{name}: {err:?}"
            );
        }
        let info = &cl.devices()[device];
        assert!(
            info.compute_units >= 1
                && info.max_workgroup_size >= 1
                && info.memory_bytes > 0
                && info.local_memory_bytes > 0
                && !info.name.is_empty(),
            "{info:?}"
        );
        cl.synchronize(device).unwrap();
    }
    let count = cl.devices().len();
    assert!(matches!(
        cl.alloc(count, 16),
        Err(BackendError::InvalidArgument(_))
    ));
    assert!(matches!(
        cl.synchronize(count),
        Err(BackendError::InvalidArgument(_))
    ));
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
        eprintln!(
            "no_platform_means_no_devices: this system's OpenCL loader ignores \
             OCL_ICD_VENDORS and OCL_ICD_FILENAMES ({line}); nothing to test"
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
