//! The Tensor API on the CPU backend (issue 4's benchmarks):
//! - recording one op (target < 1 µs),
//! - replaying a cached plan of one kernel and of several (issue 23's host overhead:
//!   ≤ 10 µs per realize plus ≤ 2 µs per kernel), and calling the same work compiled
//!   (`Compiled`: nothing recorded or looked up),
//! - a fused 10-op elementwise chain on 16M f32 against the same chain unfused,
//! - a 1024×1024×1024 f32 matmul through the measured choice of path, and the `gemm`
//!   crate called directly (throughput in elements = FLOP/s);
//! - issue 9's op families: `conv2d` forward at a ResNet-50 stage shape (batch 1 here),
//!   `max_pool2d` 3×3/2 on a `ResNet` stem map, and sort of one long `f32` row.
//!
//! Run: `cargo bench -p tessel-benches --bench tensor`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tessel_tensor::{Compiled, Conv2dOptions, DType, Padding, PoolOptions, Tensor};

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
    // Realized inputs: random values are computed lazily, inside the kernels that read
    // them, so unrealized ones would be drawn again by every replay.
    Tensor::realize_all(&[&a, &b]).unwrap();
    // Warm the plan cache.
    ((&a * 2.0).unwrap() + &b).unwrap().realize().unwrap();
    c.bench_function(
        "replay a cached 1-kernel plan (record 2 ops + realize)",
        |bench| {
            bench.iter(|| {
                let y = ((&a * 2.0).unwrap() + &b).unwrap();
                let report = y.realize().unwrap();
                debug_assert_eq!(report.kernels_prepared(), 0);
                black_box(y)
            });
        },
    );
}

/// Several kernels: each step subtracts the row sums (a reduction broadcast back; the
/// kernelizer nests some of them, so the bench reports how many kernels the plan runs).
fn several_kernels(x: &Tensor) -> Tensor {
    (0..14).fold(x.clone(), |y, _| {
        let sums = y.sum(&[-1], true).unwrap();
        ((&y - &sums).unwrap() * 0.5).unwrap()
    })
}

fn cached_plan_of_several_kernels(c: &mut Criterion) {
    let x = Tensor::randn([4, 16], DType::F32).unwrap();
    x.realize().unwrap();
    let kernels = several_kernels(&x).realize().unwrap().kernels;
    c.bench_function(
        &format!("replay a cached plan of {kernels} kernels (record 42 ops + realize)"),
        |bench| {
            bench.iter(|| {
                let y = several_kernels(&x);
                let report = y.realize().unwrap();
                debug_assert_eq!(report.kernels_prepared(), 0);
                black_box(y)
            });
        },
    );
    // The same ops recorded and dropped: the difference is the realize's host time.
    c.bench_function("record the same 42 ops only (then drop)", |bench| {
        bench.iter(|| black_box(several_kernels(&x)));
    });
}

/// The two workloads above as `Compiled` functions of their inputs: a call binds and
/// launches, recording nothing.
fn compiled_calls(c: &mut Criterion) {
    let a = Tensor::randn([16], DType::F32).unwrap();
    let b = Tensor::randn([16], DType::F32).unwrap();
    let f = Compiled::new(&[&a, &b], |t| Ok(vec![((&t[0] * 2.0)? + &t[1])?])).unwrap();
    c.bench_function("call a compiled 1-kernel function (x * 2 + b)", |bench| {
        bench.iter(|| black_box(f.call(&[&a, &b]).unwrap()));
    });
    let x = Tensor::randn([4, 16], DType::F32).unwrap();
    let g = Compiled::new(&[&x], |t| Ok(vec![several_kernels(&t[0])])).unwrap();
    c.bench_function(
        &format!(
            "call a compiled function of {} kernels (the 42 ops above)",
            g.launches()
        ),
        |bench| {
            bench.iter(|| black_box(g.call(&[&x]).unwrap()));
        },
    );
}

fn cached_plan_of_one_long_kernel(c: &mut Criterion) {
    let x = Tensor::randn([4, 16], DType::F32).unwrap();
    x.realize().unwrap();
    let chain = |x: &Tensor| (0..21).fold(x.clone(), |y, _| ((&y * 0.5).unwrap() + x).unwrap());
    chain(&x).realize().unwrap();
    c.bench_function(
        "replay a cached plan of 1 kernel (record 42 ops + realize)",
        |bench| {
            bench.iter(|| {
                let y = chain(&x);
                y.realize().unwrap();
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

fn conv2d(c: &mut Criterion) {
    // ResNet-50's first stage (64 -> 64 channels, 56×56, 3×3, padding 1) at batch 1: the
    // issue's batch 32 is 32× the work (7.4 GFLOP a run), too slow for criterion's samples
    // on a 2-core CPU. The GPU bench (`--bench gpu`) runs batch 32.
    let x = Tensor::randn([1, 64, 56, 56], DType::F32).unwrap();
    let w = Tensor::randn([64, 64, 3, 3], DType::F32).unwrap();
    Tensor::realize_all(&[&x, &w]).unwrap();
    let opts = Conv2dOptions {
        padding: Padding::Explicit([1, 1]),
        ..Conv2dOptions::default()
    };
    let mut group = c.benchmark_group("conv2d f32 [1,64,56,56] 64->64 3x3 p1");
    group.throughput(Throughput::Elements(2 * 64 * 56 * 56 * 64 * 9));
    group.sample_size(10);
    // Compiles and caches the plan; the samples replay it.
    x.conv2d(&w, None, &opts).unwrap().realize().unwrap();
    group.bench_function("tessel", |bench| {
        bench.iter(|| x.conv2d(&w, None, &opts).unwrap().realize().unwrap());
    });
    group.finish();
}

fn max_pool2d(c: &mut Criterion) {
    let x = Tensor::randn([1, 64, 112, 112], DType::F32).unwrap();
    x.realize().unwrap();
    let opts = PoolOptions {
        stride: Some([2, 2]),
        padding: [1, 1],
        ..PoolOptions::new([3, 3])
    };
    let mut group = c.benchmark_group("max_pool2d f32 [1,64,112,112] 3x3 s2 p1");
    group.throughput(Throughput::Bytes(4 * (64 * 112 * 112 + 64 * 56 * 56)));
    group.sample_size(10);
    x.max_pool2d(&opts).unwrap().realize().unwrap();
    group.bench_function("tessel", |bench| {
        bench.iter(|| x.max_pool2d(&opts).unwrap().realize().unwrap());
    });
    group.finish();
}

fn sort(c: &mut Criterion) {
    // One row of 2^16: the bitonic network (136 stages, about one kernel each). A row of
    // 2^20 takes seconds a run on 2 cores; the GPU bench sorts 16M.
    let n = 1 << 16;
    let x = Tensor::randn([n], DType::F32).unwrap();
    x.realize().unwrap();
    let mut group = c.benchmark_group("sort f32 [65536] (values + i64 indices)");
    group.throughput(Throughput::Elements(n as u64));
    group.sample_size(10);
    let run = || {
        let (v, i) = x.sort(0, false).unwrap();
        Tensor::realize_all(&[&v, &i]).unwrap()
    };
    run();
    group.bench_function("tessel", |bench| bench.iter(run));
    group.bench_function("host sort_by (to_vec, sort, indices)", |bench| {
        bench.iter(|| {
            let data = x.to_vec::<f32>().unwrap();
            let mut idx: Vec<usize> = (0..data.len()).collect();
            idx.sort_by(|&a, &b| data[a].total_cmp(&data[b]));
            black_box(idx)
        });
    });
    group.finish();
}

criterion_group!(
    benches,
    recording,
    cached_plan,
    cached_plan_of_several_kernels,
    cached_plan_of_one_long_kernel,
    compiled_calls,
    fusion,
    matmul
);
criterion_group!(ops, conv2d, max_pool2d, sort);
criterion_main!(benches, ops);
