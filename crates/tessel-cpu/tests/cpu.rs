//! The CPU backend on the sample kernels, on both paths: compiled with the system C
//! compiler, and the interpreter fallback (a compiler path that does not exist). Results
//! are compared with values computed directly in Rust; then the caches and error paths.

mod common;

use std::process::Command;

use common::{
    Rng, backends, compiled, compiled_in, execute, f32_bytes, f32_values, has_compiler,
    interpreted, temp_dir,
};
use tessel_cpu::{CpuBackend, CpuConfig};
use tessel_ir::{Access, Backend, BackendError, Inst, KernelBuilder, Mem, samples};
use tessel_shape::{Bindings, DType, Var, bf16, f16};

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

#[test]
fn compiler_is_used_when_present() {
    let found = ["cc", "gcc", "clang"].iter().any(|cc| {
        Command::new(cc)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert_eq!(compiled("probe-compiler").compiler_path().is_some(), found);
    assert_eq!(interpreted("probe-interpreter").compiler_path(), None);
}

#[test]
fn vector_add_every_dtype() {
    let n = 1000;
    for (path, cpu) in backends("vector-add") {
        for dtype in DType::ALL {
            let mut rng = Rng(dtype as u64 + 1);
            let a = random_elements(&mut rng, dtype, n);
            let b = random_elements(&mut rng, dtype, n);
            let kernel = samples::vector_add(dtype, n, 64).unwrap();
            let out = vec![0xAB; n * dtype.size_bytes()];
            let result = execute(
                &cpu,
                &kernel,
                &[a.clone(), b.clone(), out],
                &Bindings::new(),
            )
            .unwrap();
            assert_eq!(
                result[2],
                add_in_rust(dtype, &a, &b),
                "{path}: vector_add on {dtype}"
            );
        }
    }
}

#[test]
fn permuted_copy() {
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
    for (path, cpu) in backends("permuted-copy") {
        let result = execute(
            &cpu,
            &kernel,
            &[f32_bytes(&x), vec![0; total * 4]],
            &Bindings::new(),
        )
        .unwrap();
        assert_eq!(f32_values(&result[1]), expected, "{path}");
    }
}

#[test]
fn row_sum() {
    let (rows, cols) = (100, 37);
    let x = Rng(11).f32s(rows * cols);
    // Left to right in f32, as the kernel sums: the same roundings, so the same bits.
    let expected: Vec<f32> = x
        .chunks(cols)
        .map(|row| row.iter().fold(0.0f32, |acc, v| acc + v))
        .collect();
    let kernel = samples::row_sum(rows, cols, DType::F32).unwrap();
    for (path, cpu) in backends("row-sum") {
        let result = execute(
            &cpu,
            &kernel,
            &[f32_bytes(&x), vec![0; rows * 4]],
            &Bindings::new(),
        )
        .unwrap();
        assert_eq!(f32_values(&result[1]), expected, "{path}");
    }
}

#[test]
fn tree_reduce_with_barriers() {
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
    for (path, cpu) in backends("tree-reduce") {
        let result = execute(
            &cpu,
            &kernel,
            &[f32_bytes(&x), vec![0; groups * 4]],
            &Bindings::new(),
        )
        .unwrap();
        assert_eq!(f32_values(&result[1]), expected, "{path}");
    }
}

#[test]
fn tiled_matmul_with_local_memory() {
    let (m, n, k, tile) = (64, 64, 64, 16);
    let mut rng = Rng(17);
    let (a, b) = (rng.f32s(m * k), rng.f32s(k * n));
    let kernel = samples::tiled_matmul(m, n, k, tile).unwrap();
    for (path, cpu) in backends("matmul") {
        let buffers = [f32_bytes(&a), f32_bytes(&b), vec![0; m * n * 4]];
        let c = f32_values(&execute(&cpu, &kernel, &buffers, &Bindings::new()).unwrap()[2]);
        for i in 0..m {
            for j in 0..n {
                let terms = (0..k).map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]));
                let (want, scale) = terms.fold((0.0, 0.0), |(s, abs), t| (s + t, abs + t.abs()));
                let got = f64::from(c[i * n + j]);
                // Relative to the sum of magnitudes, the scale of f32 rounding in a dot product.
                assert!(
                    (got - want).abs() <= 1e-4 * scale,
                    "{path}: c[{i}, {j}] = {got}, want {want}"
                );
            }
        }
    }
}

#[test]
fn dynamic_dims_compile_once() {
    let var = Var::new("n", 1, 1 << 20).unwrap();
    let kernel = samples::dynamic_vector_add(var, 64).unwrap();
    for (path, cpu) in backends("dynamic") {
        let program = cpu.compile(0, &kernel).unwrap();
        for n in [1000, 4097] {
            let mut rng = Rng(n as u64);
            let (a, b) = (rng.f32s(n), rng.f32s(n));
            let ids: Vec<_> = [f32_bytes(&a), f32_bytes(&b), vec![0; n * 4]]
                .iter()
                .map(|data| {
                    let id = cpu.alloc(0, data.len()).unwrap();
                    cpu.write(id, 0, data).unwrap();
                    id
                })
                .collect();
            cpu.launch(program, &ids, &Bindings::new().with(var, n as i64))
                .unwrap();
            let mut out = vec![0; n * 4];
            cpu.read(ids[2], 0, &mut out).unwrap();
            let expected: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            assert_eq!(f32_values(&out), expected, "{path}: n = {n}");
            for id in ids {
                cpu.free(id).unwrap();
            }
        }
        let stats = cpu.stats();
        let compiles = u64::from(path == "compiled" && has_compiler());
        assert_eq!(
            (stats.compiles, stats.launches),
            (compiles, 2),
            "{path}: {stats:?}"
        );
    }
}

#[test]
fn one_buffer_bound_twice() {
    // out = a + b with out and a the same buffer: an in-place update.
    let n = 300;
    let kernel = samples::vector_add(DType::I32, n, 64).unwrap();
    let a: Vec<i32> = (0..n as i32).collect();
    let b: Vec<i32> = (0..n as i32).map(|i| 1000 * i).collect();
    let bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for (path, cpu) in backends("aliasing") {
        let program = cpu.compile(0, &kernel).unwrap();
        let (x, y) = (cpu.alloc(0, n * 4).unwrap(), cpu.alloc(0, n * 4).unwrap());
        cpu.write(x, 0, &bytes(&a)).unwrap();
        cpu.write(y, 0, &bytes(&b)).unwrap();
        cpu.launch(program, &[x, y, x], &Bindings::new()).unwrap();
        let mut out = vec![0; n * 4];
        cpu.read(x, 0, &mut out).unwrap();
        let expected: Vec<i32> = a.iter().zip(&b).map(|(p, q)| p + q).collect();
        assert_eq!(out, bytes(&expected), "{path}");
    }
}

#[test]
fn disk_cache_is_shared_between_instances() {
    if !has_compiler() {
        return;
    }
    let dir = temp_dir("disk-cache");
    let kernel = samples::vector_add(DType::F32, 1000, 64).unwrap();
    let first = compiled_in(dir.clone());
    first.compile(0, &kernel).unwrap();
    assert_eq!((first.stats().compiles, first.stats().disk_hits), (1, 0));
    // A new instance has an empty memory cache, but the same disk cache.
    let second = compiled_in(dir);
    second.compile(0, &kernel).unwrap();
    assert_eq!((second.stats().compiles, second.stats().disk_hits), (0, 1));
    second.compile(0, &kernel).unwrap();
    assert_eq!(second.stats().memory_hits, 1);
    // A different kernel is a different library.
    second
        .compile(0, &samples::vector_add(DType::F64, 1000, 64).unwrap())
        .unwrap();
    assert_eq!(second.stats().compiles, 1);
}

/// Set, to a cache directory, in the child process of `second_process_compiles_nothing`.
const CHILD_CACHE: &str = "TESSEL_CPU_TEST_CHILD_CACHE";

#[test]
fn second_process_compiles_nothing() {
    if !has_compiler() {
        return;
    }
    let dir = temp_dir("second-process");
    let cpu = compiled_in(dir.clone());
    cpu.compile(0, &samples::tree_reduce(1000, 64).unwrap())
        .unwrap();
    assert_eq!(cpu.stats().compiles, 1);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_process_compiles_nothing",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_CACHE, &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("child: compiles=0 disk_hits=1"),
        "the child test did not run:\n{stdout}"
    );
}

/// The second process of `second_process_compiles_nothing`; does nothing when run directly.
#[test]
fn child_process_compiles_nothing() {
    let Some(dir) = std::env::var_os(CHILD_CACHE) else {
        return;
    };
    let cpu = compiled_in(dir.into());
    cpu.compile(0, &samples::tree_reduce(1000, 64).unwrap())
        .unwrap();
    let stats = cpu.stats();
    println!(
        "child: compiles={} disk_hits={}",
        stats.compiles, stats.disk_hits
    );
    assert_eq!((stats.compiles, stats.disk_hits), (0, 1));
}

#[test]
fn kernels_failing_verification_are_compile_errors() {
    let mut kb = KernelBuilder::new("writes_read_only");
    kb.buffer("a", DType::F32, 4, Access::Read);
    let i = kb.constant_as(0, DType::I32);
    let x = kb.constant(1.0f32);
    kb.push(Inst::Store {
        mem: Mem::Global(0),
        index: i,
        value: x,
    });
    let kernel = kb.finish_unverified();
    for (path, cpu) in backends("verify-error") {
        let err = cpu.compile(0, &kernel).unwrap_err();
        let BackendError::Compile {
            kernel: name, log, ..
        } = &err
        else {
            panic!("{path}: {err:?}")
        };
        assert_eq!(name, "writes_read_only", "{path}");
        assert!(log.contains("declared Read"), "{path}: {log}");
    }
}

#[cfg(unix)]
#[test]
fn compiler_failures_show_kernel_source_and_log() {
    use std::os::unix::fs::PermissionsExt;

    let dir = temp_dir("fake-compiler");
    let cc = dir.join("fake-cc");
    let script = "#!/bin/sh\nif [ \"$1\" = --version ]; then echo fake 1.0; exit 0; fi\necho 'fake compiler error' >&2\nexit 1\n";
    std::fs::write(&cc, script).unwrap();
    std::fs::set_permissions(&cc, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cpu = CpuBackend::with_config(CpuConfig {
        cc: Some(cc),
        cache_dir: dir.join("cache"),
        threads: 1,
    });
    let err = cpu
        .compile(0, &samples::vector_add(DType::F32, 10, 4).unwrap())
        .unwrap_err();
    let BackendError::Compile { kernel, code, log } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(kernel, "vector_add");
    assert!(code.contains("void tessel_vector_add("), "{code}");
    assert!(log.contains("fake compiler error"), "{log}");
    let message = err.to_string();
    for part in ["vector_add", "fake compiler error", "tessel_vector_add"] {
        assert!(message.contains(part), "{message}");
    }
    assert_eq!(cpu.stats().compiles, 0);
}

#[test]
fn too_small_buffers_are_rejected() {
    let kernel = samples::vector_add(DType::F32, 100, 64).unwrap();
    for (path, cpu) in backends("too-small") {
        let err = execute(
            &cpu,
            &kernel,
            &[vec![0; 400], vec![0; 399], vec![0; 400]],
            &Bindings::new(),
        )
        .unwrap_err();
        let BackendError::InvalidArgument(msg) = &err else {
            panic!("{path}: {err:?}")
        };
        for part in ["vector_add", "`b`", "400 bytes", "399 bytes"] {
            assert!(msg.contains(part), "{path}: {msg}");
        }
        let err = execute(
            &cpu,
            &kernel,
            &[vec![0; 400], vec![0; 400]],
            &Bindings::new(),
        )
        .unwrap_err();
        assert!(
            matches!(err, BackendError::InvalidArgument(_)),
            "{path}: {err:?}"
        );
    }
}

#[test]
fn huge_allocations_are_out_of_memory() {
    let cpu = interpreted("huge");
    for bytes in [1 << 60, usize::MAX] {
        let err = cpu.alloc(0, bytes).unwrap_err();
        assert!(
            matches!(err, BackendError::OutOfMemory { requested, .. } if requested == bytes),
            "{err:?}"
        );
    }
    assert!(matches!(
        cpu.alloc(1, 16),
        Err(BackendError::InvalidArgument(_))
    ));
}

#[test]
fn transfers_are_checked() {
    let cpu = interpreted("transfers");
    let (a, b) = (cpu.alloc(0, 100).unwrap(), cpu.alloc(0, 50).unwrap());
    cpu.write(a, 0, &[7; 100]).unwrap();
    cpu.copy(a, b, 50).unwrap();
    let mut out = [0; 50];
    cpu.read(b, 0, &mut out).unwrap();
    assert_eq!(out, [7; 50]);
    assert!(cpu.copy(a, b, 51).is_err());
    assert!(cpu.write(a, 90, &[0; 11]).is_err());
    assert!(cpu.read(a, usize::MAX, &mut [0; 2]).is_err());
    cpu.free(a).unwrap();
    assert!(cpu.read(a, 0, &mut [0; 1]).is_err());
    let device = &cpu.devices()[0];
    assert!(device.compute_units >= 1 && device.features.f64 && !device.name.is_empty());
}
