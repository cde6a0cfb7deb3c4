//! The symbolic layer's cost on the op-recording path: every tensor op runs a shape rule,
//! and kernels build index expressions. Targets: a shape rule on constant shapes well
//! under 1 µs (the whole op budget), symbolic index construction in the low µs.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tessel_shape::{Expr, Shape, Var, rules};

fn shape_rules(c: &mut Criterion) {
    let a = Shape::from([64, 1, 128]);
    let b = Shape::from([32, 1]);
    c.bench_function("broadcast [64,1,128] x [32,1]", |bench| {
        bench.iter(|| rules::broadcast("add", black_box(&a), black_box(&b)));
    });
    let x = Shape::from([8, 64, 128]);
    let w = Shape::from([128, 10]);
    c.bench_function("matmul [8,64,128] x [128,10]", |bench| {
        bench.iter(|| rules::matmul(black_box(&x), black_box(&w)));
    });
    let batch = Var::new("batch", 1, 4096).unwrap();
    let sym = Shape::new(vec![batch.into(), Expr::constant(64), Expr::constant(128)]);
    c.bench_function("reshape [batch,64,128] -> [-1,128]", |bench| {
        bench.iter(|| rules::reshape(black_box(&sym), black_box(&[-1, 128])));
    });
}

fn index_expressions(c: &mut Criterion) {
    let batch = Var::new("batch", 1, 4096).unwrap();
    let gid = Var::new("gid", 0, 1 << 20).unwrap();
    c.bench_function("permute+reshape+pad index", |bench| {
        bench.iter(|| {
            // A flat index into [batch, 8, 16] viewed as permute(0, 2, 1), padded by 1.
            let g = Expr::from(black_box(gid));
            let (i0, i1, i2) = (g / (8 * 18), (g / 18) % 8, g % 18 - 1);
            let valid = i2.cmp_ge(0) * i2.cmp_lt(16);
            let idx = i0 * 128 + i2 * 8 + i1;
            black_box((idx, valid, Expr::from(batch)))
        });
    });
}

criterion_group!(benches, shape_rules, index_expressions);
criterion_main!(benches);
