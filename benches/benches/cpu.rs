//! The CPU backend against plain Rust on 64 MiB of `f32`: a vector add (memory bound) and
//! a row sum (bound by the latency of sequential float adds, which neither side may
//! reorder without changing the result). Goal: elementwise within 2× of memory bandwidth.
//! The backend runs workgroups on every core; the single-threaded Rust loop is the
//! baseline a user would write, the rayon one the parallel upper bound.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rayon::prelude::*;
use tessel_cpu::CpuBackend;
use tessel_ir::{Backend, BufferId, samples};
use tessel_shape::{Bindings, DType};

/// 64 MiB of f32.
const N: usize = 16 << 20;
/// The row sum's matrix: `ROWS × COLS = N`.
const ROWS: usize = 16 << 10;
const COLS: usize = N / ROWS;

/// Deterministic data in `[-1, 1)`.
fn data(seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..N)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

fn upload(cpu: &CpuBackend, values: &[f32]) -> BufferId {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let id = cpu.alloc(0, bytes.len()).expect("alloc");
    cpu.write(id, 0, &bytes).expect("write");
    id
}

fn vector_add(c: &mut Criterion) {
    let cpu = CpuBackend::new();
    let (a, b) = (data(1), data(2));
    let mut out = vec![0.0f32; N];
    let kernel = samples::vector_add(DType::F32, N, 64).expect("kernel");
    let program = cpu.compile(0, &kernel).expect("compile");
    let ids = [upload(&cpu, &a), upload(&cpu, &b), upload(&cpu, &out)];
    let mut group = c.benchmark_group("vector_add_f32_64MiB");
    // Two operands read and one result written.
    group.throughput(Throughput::Bytes(3 * 4 * N as u64));
    group.bench_function("tessel_cpu", |bench| {
        bench.iter(|| cpu.launch(program, &ids, &Bindings::new()).expect("launch"));
    });
    group.bench_function("rust_loop", |bench| {
        bench.iter(|| {
            for ((o, x), y) in out.iter_mut().zip(&a).zip(&b) {
                *o = x + y;
            }
            black_box(&mut out);
        });
    });
    group.bench_function("rust_rayon", |bench| {
        bench.iter(|| {
            out.par_chunks_mut(1 << 16)
                .zip(a.par_chunks(1 << 16))
                .zip(b.par_chunks(1 << 16))
                .for_each(|((o, x), y)| {
                    for ((o, x), y) in o.iter_mut().zip(x).zip(y) {
                        *o = x + y;
                    }
                });
            black_box(&mut out);
        });
    });
    group.finish();
}

fn row_sum(c: &mut Criterion) {
    let cpu = CpuBackend::new();
    let x = data(3);
    let mut sums = vec![0.0f32; ROWS];
    let kernel = samples::row_sum(ROWS, COLS, DType::F32).expect("kernel");
    let program = cpu.compile(0, &kernel).expect("compile");
    let ids = [upload(&cpu, &x), upload(&cpu, &sums)];
    let mut group = c.benchmark_group("row_sum_f32_64MiB");
    group.throughput(Throughput::Bytes(4 * N as u64));
    group.bench_function("tessel_cpu", |bench| {
        bench.iter(|| cpu.launch(program, &ids, &Bindings::new()).expect("launch"));
    });
    group.bench_function("rust_loop", |bench| {
        bench.iter(|| {
            for (s, row) in sums.iter_mut().zip(x.chunks_exact(COLS)) {
                *s = row.iter().fold(0.0, |acc, v| acc + v);
            }
            black_box(&mut sums);
        });
    });
    group.bench_function("rust_rayon", |bench| {
        bench.iter(|| {
            sums.par_iter_mut()
                .zip(x.par_chunks_exact(COLS))
                .for_each(|(s, row)| {
                    *s = row.iter().fold(0.0, |acc, v| acc + v);
                });
            black_box(&mut sums);
        });
    });
    group.finish();
}

criterion_group!(benches, vector_add, row_sum);
criterion_main!(benches);
