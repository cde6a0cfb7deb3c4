//! The CPU backend on both paths: compiled with the system C compiler, and the interpreter
//! fallback (a compiler path that does not exist). First the shared conformance checks of
//! `tessel-testkit` (every op against the reference interpreter bit for bit, the sample
//! kernels, the error paths), then what only this backend has: compiler discovery, the
//! disk cache shared between instances and processes, compile counts, compiler failures.

use std::path::{Path, PathBuf};
use std::process::Command;

use tessel_cpu::{CpuBackend, CpuConfig};
use tessel_ir::{Backend, ProgramOrigin, samples};
use tessel_shape::{DType, UnaryOp};
use tessel_testkit::{Check, Conformance, Op, Tolerance};

/// A fresh, empty directory for one test, under Cargo's temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("tessel-cpu-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A backend that compiles with the system compiler, caching in `cache_dir`.
fn compiled_in(cache_dir: PathBuf) -> CpuBackend {
    CpuBackend::with_config(CpuConfig {
        cc: None,
        cache_dir,
        threads: 4,
    })
}

/// A backend that compiles with the system compiler, caching in its own directory.
fn compiled(name: &str) -> CpuBackend {
    compiled_in(temp_dir(name))
}

/// A backend whose compiler does not exist, so every kernel runs in the interpreter.
fn interpreted(name: &str) -> CpuBackend {
    CpuBackend::with_config(CpuConfig {
        cc: Some("/nonexistent/cc".into()),
        cache_dir: temp_dir(name),
        threads: 4,
    })
}

/// Both kinds of backend, named for failure messages. Where this machine has no C
/// compiler, the "compiled" one runs the interpreter too (and `has_compiler` says so).
fn backends(name: &str) -> [(&'static str, CpuBackend); 2] {
    [
        ("compiled", compiled(&format!("{name}-compiled"))),
        ("interpreted", interpreted(&format!("{name}-interpreted"))),
    ]
}

/// Whether this machine has a working C compiler (the compiled path is the interpreter
/// without one).
fn has_compiler() -> bool {
    compiled("probe").compiler_path().is_some()
}

/// How the compiled path may differ from the interpreter: it is IEEE-exact (no fast-math,
/// no contraction) except `exp`, `exp2`, `log`, `log2` and `tanh` on `float`, which are
/// Tessel's vectorizable ones (within 2 ulps of the exact value; the reference's own libm
/// adds up to one more). A half type's result is the `float` one rounded, so at most one ulp
/// off. It refuses nothing.
const TOLERANCE: Tolerance = Tolerance {
    ulps: |op, input, out| {
        let fast = matches!(
            op,
            Op::Unary(UnaryOp::Exp | UnaryOp::Exp2 | UnaryOp::Log | UnaryOp::Log2 | UnaryOp::Tanh)
        ) && input != DType::F64;
        match (fast, out) {
            (false, _) => 0,
            (true, DType::F16 | DType::BF16) => 1,
            (true, _) => 2,
        }
    },
    ..Tolerance::EXACT
};

/// Runs a conformance check on both paths (the interpreter's bit for bit).
fn run(test: &str, check: Check) {
    for (path, cpu) in backends(test) {
        if path == "compiled" && cpu.compiler_path().is_none() {
            tessel_testkit::skip(
                &format!("cpu::{test}"),
                "no C compiler found: the compiled path runs the interpreter",
            );
        }
        let tolerance = if path == "compiled" {
            TOLERANCE
        } else {
            Tolerance::EXACT
        };
        check(&Conformance::new(&cpu, 0, tolerance).named(&format!("{test} ({path})")));
    }
}

tessel_testkit::conformance_tests!(run);

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

/// The host is one device, with doubles.
#[test]
fn the_host_is_one_device_with_doubles() {
    let cpu = interpreted("host");
    assert_eq!(cpu.devices().len(), 1);
    let device = &cpu.devices()[0];
    assert!(device.compute_units >= 1 && device.features.f64 && !device.name.is_empty());
}

/// A dynamic-length kernel compiles once (on the compiled path) for two launches of
/// different lengths, and compiling it again is a memory-cache hit.
#[test]
fn dynamic_dims_are_compiled_once() {
    for (path, cpu) in backends("dynamic") {
        Conformance::new(&cpu, 0, Tolerance::EXACT)
            .named(&format!("dynamic_dims_are_compiled_once ({path})"))
            .dynamic_dims_compile_once();
        let stats = cpu.stats();
        let compiles = u64::from(path == "compiled" && has_compiler());
        assert_eq!(
            (stats.compiles, stats.launches),
            (compiles, 2),
            "{path}: {stats:?}"
        );
        if compiles == 1 {
            assert_eq!(stats.memory_hits, 1, "{path}: {stats:?}");
        }
    }
}

#[test]
fn disk_cache_is_shared_between_instances() {
    if !has_compiler() {
        tessel_testkit::skip(
            "cpu::disk_cache_is_shared_between_instances",
            "no C compiler",
        );
        return;
    }
    let dir = temp_dir("disk-cache");
    let kernel = samples::vector_add(DType::F32, 1000, 64).unwrap();
    let first = compiled_in(dir.clone());
    let program = first.compile(0, &kernel).unwrap();
    assert_eq!((first.stats().compiles, first.stats().disk_hits), (1, 0));
    assert_eq!(first.origin(program).unwrap(), ProgramOrigin::Compiled);
    // A new instance has an empty memory cache, but the same disk cache.
    let second = compiled_in(dir);
    let program = second.compile(0, &kernel).unwrap();
    assert_eq!((second.stats().compiles, second.stats().disk_hits), (0, 1));
    assert_eq!(second.origin(program).unwrap(), ProgramOrigin::Cached);
    let program = second.compile(0, &kernel).unwrap();
    assert_eq!(second.stats().memory_hits, 1);
    assert_eq!(second.origin(program).unwrap(), ProgramOrigin::Cached);
    // Without a compiler nothing is compiled: the interpreter runs the kernel.
    let fallback = interpreted("disk-cache-interpreted");
    let program = fallback.compile(0, &kernel).unwrap();
    assert_eq!(
        fallback.origin(program).unwrap(),
        ProgramOrigin::Interpreted
    );
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
        tessel_testkit::skip("cpu::second_process_compiles_nothing", "no C compiler");
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

/// The kernels of one `compile_many` are one compiler run; each runs. A kernel that differs
/// only in its name shares its library, and a later instance finds each kernel's library
/// alone.
#[test]
fn kernels_compiled_together_are_one_compiler_run() {
    if !has_compiler() {
        tessel_testkit::skip(
            "cpu::kernels_compiled_together_are_one_compiler_run",
            "no C compiler",
        );
        return;
    }
    let dir = temp_dir("compiled-together");
    let add = samples::vector_add(DType::F32, 10, 4).unwrap();
    let reduce = samples::tree_reduce(1000, 64).unwrap();
    let mut renamed = add.clone();
    renamed.name = "the same sum".into();
    let cpu = compiled_in(dir.clone());
    assert_eq!(cpu.compile_batch(3, 2), 2, "one batch per thread");
    let programs: Vec<_> = cpu
        .compile_many(0, &[&add, &reduce, &renamed])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let stats = cpu.stats();
    assert_eq!((stats.builds, stats.compiles), (1, 3), "{stats:?}");
    for &program in &programs {
        assert_eq!(cpu.origin(program).unwrap(), ProgramOrigin::Compiled);
    }
    vector_add_runs(&cpu, programs[0]);
    vector_add_runs(&cpu, programs[2]);
    let second = compiled_in(dir);
    let program = second.compile(0, &reduce).unwrap();
    assert_eq!(second.origin(program).unwrap(), ProgramOrigin::Cached);
    let stats = second.stats();
    assert_eq!((stats.builds, stats.disk_hits), (0, 1), "{stats:?}");
}

/// Runs `samples::vector_add` (f32, 10 elements) on `cpu` and checks the sums.
fn vector_add_runs(cpu: &CpuBackend, program: tessel_ir::ProgramId) {
    let a: Vec<f32> = (0..10).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..10).map(|i| 0.5 * i as f32).collect();
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let bufs: Vec<_> = (0..3).map(|_| cpu.alloc(0, 40).unwrap()).collect();
    cpu.write(bufs[0], 0, &bytes(&a)).unwrap();
    cpu.write(bufs[1], 0, &bytes(&b)).unwrap();
    cpu.launch(program, &bufs, &tessel_shape::Bindings::new())
        .unwrap();
    let mut out = vec![0u8; 40];
    cpu.read(bufs[2], 0, &mut out).unwrap();
    let sums: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(sums, want);
}

/// A compiler that rejects every kernel costs speed, not the realize: the kernel runs in
/// the interpreter (a warning names the kernel and shows the compiler's message, then the
/// source), and the failure is counted.
#[cfg(unix)]
#[test]
fn a_failing_compiler_leaves_kernels_to_the_interpreter() {
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
    let program = cpu
        .compile(0, &samples::vector_add(DType::F32, 10, 4).unwrap())
        .unwrap();
    assert_eq!(cpu.origin(program).unwrap(), ProgramOrigin::Interpreted);
    assert_eq!((cpu.stats().compiles, cpu.stats().compile_failures), (0, 1));
    vector_add_runs(&cpu, program);
}

/// A cached library that does not load (empty, or garbage) is built again once, by the
/// next instance that finds it, instead of failing every later run.
#[test]
fn a_broken_cached_library_is_built_again() {
    if !has_compiler() {
        tessel_testkit::skip(
            "cpu::a_broken_cached_library_is_built_again",
            "no C compiler",
        );
        return;
    }
    let kernel = samples::vector_add(DType::F32, 10, 4).unwrap();
    for (case, bytes) in [
        ("empty", &b""[..]),
        ("garbage", &b"not a library at all"[..]),
    ] {
        let dir = temp_dir(&format!("broken-cache-{case}"));
        compiled_in(dir.clone()).compile(0, &kernel).unwrap();
        let libraries: Vec<_> = std::fs::read_dir(dir.join("cpu"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == std::env::consts::DLL_EXTENSION)
            })
            .collect();
        assert_eq!(libraries.len(), 1, "{libraries:?}");
        std::fs::write(&libraries[0], bytes).unwrap();
        let cpu = compiled_in(dir);
        let program = cpu.compile(0, &kernel).unwrap();
        assert_eq!(cpu.stats().compiles, 1, "{case}: rebuilt once");
        vector_add_runs(&cpu, program);
    }
}

/// A cache directory that cannot be used (here a regular file) is a warning: libraries go
/// to the temporary directory's `tessel-<user>/cpu` instead.
#[test]
fn an_unusable_cache_directory_falls_back_to_the_temporary_one() {
    if !has_compiler() {
        tessel_testkit::skip(
            "cpu::an_unusable_cache_directory_falls_back_to_the_temporary_one",
            "no C compiler",
        );
        return;
    }
    let file = temp_dir("unusable-cache").join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let cpu = compiled_in(file);
    let program = cpu
        .compile(0, &samples::vector_add(DType::F32, 10, 4).unwrap())
        .unwrap();
    assert_ne!(cpu.origin(program).unwrap(), ProgramOrigin::Interpreted);
    vector_add_runs(&cpu, program);
}

/// `time_within` stops a compiled kernel whose deadline has passed before its workgroups
/// start (`None`, as measurement reads it), and times one that finishes within it; the
/// interpreter always finishes.
#[test]
fn launches_stop_at_their_deadline() {
    let n = 1 << 20;
    let kernel = samples::vector_add(DType::F32, n, 64).unwrap();
    for (path, cpu) in backends("deadline") {
        let program = cpu.compile(0, &kernel).unwrap();
        let buffers: Vec<_> = (0..3).map(|_| cpu.alloc(0, 4 * n).unwrap()).collect();
        let data: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
        for &b in &buffers {
            cpu.write(b, 0, &data).unwrap();
        }
        let dims = tessel_shape::Bindings::new();
        let stopped = cpu
            .time_within(program, &buffers, &dims, std::time::Duration::ZERO)
            .unwrap();
        let compiled = path == "compiled" && cpu.compiler_path().is_some();
        assert_eq!(stopped.is_none(), compiled, "{path}: {stopped:?}");
        let timed = cpu
            .time_within(program, &buffers, &dims, std::time::Duration::from_secs(60))
            .unwrap();
        assert!(timed.is_some(), "{path}");
    }
}
