//! One training step of the digits MLP (issue 10's benchmark): `[64, 64]` inputs through
//! `Linear(64, 128)` → `ReLU` → `Linear(128, 10)`, cross-entropy, gradients and an `AdamW` update,
//! realized as one cached plan, on the CPU. The data are random: the step's cost does not
//! depend on them.
//!
//! Run: `cargo bench -p tessel-benches --bench train`.

use criterion::{Criterion, criterion_group, criterion_main};
use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel_nn::optim::{AdamW, AdamWConfig, Optimizer};
use tessel_nn::{Linear, Module, ReLU, Sequential};
use tessel_tensor::{DType, Tensor};

fn mlp_step(c: &mut Criterion) {
    Tensor::manual_seed(0);
    let model = Sequential::new()
        .layer(Linear::new(64, 128).unwrap())
        .layer(ReLU)
        .layer(Linear::new(128, 10).unwrap());
    let mut opt = AdamW::new(model.parameters(), AdamWConfig::default()).unwrap();
    let x = Tensor::rand([64, 64], DType::F32).unwrap();
    let labels: Vec<i64> = (0..64).map(|i| i % 10).collect();
    let y = Tensor::from_vec(labels, [64]).unwrap();
    Tensor::realize_all(&[&x, &y]).unwrap();
    let ce = CrossEntropyOptions::default();
    let mut step = || {
        let logits = tessel_nn::Forward::forward(&model, &x).unwrap();
        let loss = cross_entropy(&logits, &y, &ce).unwrap();
        opt.step(&loss).unwrap();
        loss
    };
    // Compile and measure the plan before timing.
    for _ in 0..3 {
        step();
    }
    c.bench_function("digits MLP training step (batch 64, AdamW)", |b| {
        b.iter(&mut step);
    });
}

criterion_group!(benches, mlp_step);
criterion_main!(benches);
