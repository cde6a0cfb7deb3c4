//! The Tensor API on the CPU backend (issue 4's benchmarks):
//! - recording one op (target < 1 µs),
//! - replaying a cached plan (host time per kernel launch, target < 10 µs),
//! - a fused 10-op elementwise chain on 16M f32 against the same chain unfused,
//! - a 512×512×512 f32 matmul (throughput in elements = FLOP/s).
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
    let n = 512;
    let a = Tensor::randn([n, n], DType::F32).unwrap();
    let b = Tensor::randn([n, n], DType::F32).unwrap();
    Tensor::realize_all(&[&a, &b]).unwrap();
    let mut group = c.benchmark_group("matmul 512x512x512 f32");
    group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
    group.sample_size(10);
    group.bench_function("tessel", |bench| {
        bench.iter(|| a.matmul(&b).unwrap().realize().unwrap());
    });
    group.finish();
}

criterion_group!(benches, recording, cached_plan, fusion, matmul);
criterion_main!(benches);
