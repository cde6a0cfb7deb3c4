//! Shared by the OpenCL backend's test files: one backend over every device found, running
//! a kernel on host byte vectors (on a device and in the interpreter), and a seeded random
//! generator.

#![allow(dead_code, unreachable_pub)]

use std::sync::OnceLock;

use tessel_ir::{Backend, BackendError, Kernel, interp};
use tessel_opencl::OpenClBackend;
use tessel_shape::{Bindings, DType};

/// One backend for the whole test binary, over every device `TESSEL_OPENCL_DEVICE` allows
/// (building programs is what takes time, and its cache is shared this way).
pub fn backend() -> &'static OpenClBackend {
    static BACKEND: OnceLock<OpenClBackend> = OnceLock::new();
    BACKEND.get_or_init(OpenClBackend::new)
}

/// The devices of `cl` to test on, each named; announces (to the test's output) when there
/// is none, so a run without OpenCL passes visibly vacuously.
pub fn devices(cl: &OpenClBackend, test: &str) -> Vec<(usize, String)> {
    let devices: Vec<(usize, String)> = cl
        .devices()
        .iter()
        .enumerate()
        .map(|(k, info)| {
            let platform = cl.details(k).map_or("?", |d| d.platform.as_str());
            (k, format!("{platform}: {}", info.name))
        })
        .collect();
    if devices.is_empty() {
        eprintln!(
            "{test}: no OpenCL device found (install an ICD such as pocl-opencl-icd); nothing to test"
        );
    }
    devices
}

/// Whether device `device` can run kernels on `dtype`; prints why not when it cannot.
pub fn supports(cl: &OpenClBackend, device: usize, name: &str, dtype: DType) -> bool {
    let ok = dtype != DType::F64 || cl.devices()[device].features.f64;
    if !ok {
        eprintln!("{name}: skipping {dtype}: the device has no cl_khr_fp64");
    }
    ok
}

/// Compiles `kernel` for `device`, uploads `buffers` (one per buffer parameter), launches,
/// and returns every buffer's contents afterwards.
pub fn execute(
    cl: &OpenClBackend,
    device: usize,
    kernel: &Kernel,
    buffers: &[Vec<u8>],
    dims: &Bindings,
) -> Result<Vec<Vec<u8>>, BackendError> {
    let program = cl.compile(device, kernel)?;
    let ids = buffers
        .iter()
        .map(|data| {
            let id = cl.alloc(device, data.len())?;
            cl.write(id, 0, data)?;
            Ok(id)
        })
        .collect::<Result<Vec<_>, BackendError>>()?;
    let launched = cl.launch(program, &ids, dims);
    let mut out = Vec::new();
    for (id, data) in ids.iter().zip(buffers) {
        let mut bytes = vec![0; data.len()];
        if launched.is_ok() {
            cl.read(*id, 0, &mut bytes)?;
        }
        cl.free(*id)?;
        out.push(bytes);
    }
    cl.release(program)?;
    launched.map(|()| out)
}

/// Runs `kernel` in the reference interpreter on copies of `buffers`.
pub fn interpret(kernel: &Kernel, buffers: &[Vec<u8>], dims: &Bindings) -> Vec<Vec<u8>> {
    let mut out = buffers.to_vec();
    let mut slices: Vec<&mut [u8]> = out.iter_mut().map(Vec::as_mut_slice).collect();
    interp::run(kernel, &mut slices, dims).unwrap();
    out
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
