//! Shared by the CPU backend's test files: backends in fresh cache directories, a seeded
//! random generator, and running a kernel on host byte vectors.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use tessel_cpu::{CpuBackend, CpuConfig};
use tessel_ir::{Backend, BackendError, Kernel};
use tessel_shape::Bindings;

/// A fresh, empty directory for one test, under Cargo's temporary directory.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("tessel-cpu-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A backend that compiles with the system compiler, caching in its own directory.
pub fn compiled(name: &str) -> CpuBackend {
    compiled_in(temp_dir(name))
}

pub fn compiled_in(cache_dir: PathBuf) -> CpuBackend {
    CpuBackend::with_config(CpuConfig {
        cc: None,
        cache_dir,
        threads: 4,
    })
}

/// A backend whose compiler does not exist, so every kernel runs in the interpreter.
pub fn interpreted(name: &str) -> CpuBackend {
    CpuBackend::with_config(CpuConfig {
        cc: Some("/nonexistent/cc".into()),
        cache_dir: temp_dir(name),
        threads: 4,
    })
}

/// Both kinds of backend, named for failure messages. Where this machine has no C
/// compiler, the "compiled" one runs the interpreter too (and `has_compiler` says so).
pub fn backends(name: &str) -> [(&'static str, CpuBackend); 2] {
    [
        ("compiled", compiled(&format!("{name}-compiled"))),
        ("interpreted", interpreted(&format!("{name}-interpreted"))),
    ]
}

/// Whether this machine has a working C compiler (the compiled-path tests are vacuous
/// without one).
pub fn has_compiler() -> bool {
    compiled("probe").compiler_path().is_some()
}

/// Compiles `kernel`, uploads `buffers` (one per buffer parameter), launches, and returns
/// every buffer's contents afterwards.
pub fn execute(
    cpu: &CpuBackend,
    kernel: &Kernel,
    buffers: &[Vec<u8>],
    dims: &Bindings,
) -> Result<Vec<Vec<u8>>, BackendError> {
    let program = cpu.compile(0, kernel)?;
    let ids = buffers
        .iter()
        .map(|data| {
            let id = cpu.alloc(0, data.len())?;
            cpu.write(id, 0, data)?;
            Ok(id)
        })
        .collect::<Result<Vec<_>, BackendError>>()?;
    cpu.launch(program, &ids, dims)?;
    let mut out = Vec::new();
    for (id, data) in ids.iter().zip(buffers) {
        let mut bytes = vec![0; data.len()];
        cpu.read(*id, 0, &mut bytes)?;
        cpu.free(*id)?;
        out.push(bytes);
    }
    cpu.release(program)?;
    Ok(out)
}

/// splitmix64: a tiny, fixed-seed generator, so every run sees the same data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit() as f32).collect()
    }
}

/// Little-endian bytes of `f32`s.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `f32`s from little-endian bytes.
pub fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
