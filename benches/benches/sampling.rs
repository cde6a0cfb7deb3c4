//! Picking a token on the host (`tessel_models::Sampler`) from one row of GPT-2's 50257
//! logits: temperature alone, top-k 50 and top-p 0.9, on flat logits (uniform in 0..8, as
//! a random-weight model gives) and peaked ones (0..40); greedy for comparison.
//!
//! Run: `cargo bench -p tessel-benches --bench sampling`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tessel_models::{GenerateOptions, Sampler};

const VOCAB: usize = 50257;

/// Logits uniform in `0..scale` from a fixed linear congruential sequence.
fn logits(scale: f32) -> Vec<f32> {
    let mut x = 12345u64;
    (0..VOCAB)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 40) as f32 / (1u64 << 24) as f32 * scale
        })
        .collect()
}

fn sampling(c: &mut Criterion) {
    let sampled = |top_k, top_p| GenerateOptions {
        temperature: 0.8,
        top_k,
        top_p,
        ..GenerateOptions::greedy(1)
    };
    let ways = [
        ("greedy", GenerateOptions::greedy(1)),
        ("temperature 0.8", sampled(None, None)),
        ("top-k 50", sampled(Some(50), None)),
        ("top-p 0.9", sampled(None, Some(0.9))),
    ];
    for (shape, scale) in [("flat", 8.0), ("peaked", 40.0)] {
        let row = logits(scale);
        for (name, opts) in &ways {
            let mut sampler = Sampler::new(0);
            c.bench_function(&format!("sample {VOCAB} {shape} logits, {name}"), |b| {
                b.iter(|| black_box(sampler.sample(&row, opts).unwrap()));
            });
        }
    }
}

criterion_group!(benches, sampling);
criterion_main!(benches);
