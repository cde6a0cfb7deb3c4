//! The Tensor API on the CPU backend (issue 4's benchmarks):
//! - recording one op (target < 1 µs),
//! - replaying a cached plan (host time per kernel launch, target < 10 µs),
//! - a fused 10-op elementwise chain on 16M f32 against the same chain unfused,
//! - a 1024×1024×1024 f32 matmul through the measured choice of path, and the `gemm`
//!   crate called directly (throughput in elements = FLOP/s).
//!
//! Run: `cargo bench -p tessel-benches --bench tensor`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tessel_tensor::{DType, Tensor};

fn chain(x: &Tensor, fuse: bool) -> Tensor {
    let step = |t: Tensor, i: usize| -> Tensor {
        let next = match i % 5 {
            0 => (&t * 1.001).unwrap(),
            1 => (&t + 0.5).unwrap(),
            2 => t.relu(),
            3 => (&t - 0.25).unwrap(),
            _ => t.abs().unwrap(),
        };
        if !fuse {
            next.realize().unwrap();
        }
        next
    };
    (0..10).fold(x.clone(), step)
}

fn recording(c: &mut Criterion) {
    let a = Tensor::randn([64, 64], DType::F32).unwrap();
    let b = Tensor::randn([64, 64], DType::F32).unwrap();
    c.bench_function("record one op (add, then drop)", |bench| {
        bench.iter(|| black_box(&a + &b).unwrap());
    });
}

fn cached_plan(c: &mut Criterion) {
    let a = Tensor::randn([16], DType::F32).unwrap();
    let b = Tensor::randn([16], DType::F32).unwrap();
    // Warm the plan cache.
    ((&a * 2.0).unwrap() + &b).unwrap().realize().unwrap();
    c.bench_function(
        "replay a cached 1-kernel plan (record 2 ops + realize)",
        |bench| {
            bench.iter(|| {
                let y = ((&a * 2.0).unwrap() + &b).unwrap();
                let report = y.realize().unwrap();
                debug_assert_eq!(report.compiled, 0);
                black_box(y)
            });
        },
    );
}

fn fusion(c: &mut Criterion) {
    let n = 16 << 20;
    let x = Tensor::randn([n], DType::F32).unwrap();
    x.realize().unwrap();
    let mut group = c.benchmark_group("10-op elementwise chain, 16M f32");
    group.throughput(Throughput::Bytes((n * 4 * 2) as u64));
    group.sample_size(10);
    for (name, fuse) in [("fused", true), ("unfused", false)] {
        group.bench_function(name, |bench| {
            bench.iter_batched(
                || (),
                |()| chain(&x, fuse).realize().unwrap(),
                BatchSize::PerIteration,
            );
        });
    }
    group.finish();
}

fn matmul(c: &mut Criterion) {
    let n = 1024;
    let a = Tensor::randn([n, n], DType::F32).unwrap();
    let b = Tensor::randn([n, n], DType::F32).unwrap();
    Tensor::realize_all(&[&a, &b]).unwrap();
    let mut group = c.benchmark_group("matmul 1024x1024x1024 f32");
    group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
    group.sample_size(10);
    // The first realize measures the candidates (generated kernel, gemm routine) and
    // caches the plan; the samples replay the chosen one.
    a.matmul(&b).unwrap().realize().unwrap();
    group.bench_function("tessel (measured choice)", |bench| {
        bench.iter(|| a.matmul(&b).unwrap().realize().unwrap());
    });
    let (lhs, rhs) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let mut out = vec![0.0f32; n * n];
    group.bench_function("gemm crate directly", |bench| {
        bench.iter(|| gemm_direct(&lhs, &rhs, &mut out, n));
    });
    group.finish();
}

/// The reference: the `gemm` crate on row-major `n × n` matrices, every core.
fn gemm_direct(lhs: &[f32], rhs: &[f32], out: &mut [f32], n: usize) {
    assert!(lhs.len() >= n * n && rhs.len() >= n * n && out.len() >= n * n);
    let s = n as isize;
    // SAFETY: the three slices hold at least n·n elements (asserted above), the strides
    // (row n, column 1) stay inside them, and `out` does not alias the inputs.
    unsafe {
        gemm::gemm(
            n,
            n,
            n,
            out.as_mut_ptr(),
            1,
            s,
            false,
            lhs.as_ptr(),
            1,
            s,
            rhs.as_ptr(),
            1,
            s,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}

criterion_group!(benches, recording, cached_plan, fusion, matmul);
criterion_main!(benches);
