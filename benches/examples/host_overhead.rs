//! Host time of two loops that replay cached plans on the default device: greedy decoding
//! with the tiny GPT-2 fixture (`crates/tessel-models/tests/fixtures/gpt2`: 2 layers, 32
//! wide, so the device's work is small) and an `AdamW` step of a 784-128-10 MLP on a batch of
//! 64, timed by phase (recording the forward and loss, `grad`, recording the update plus
//! realizing it).
//!
//! ```text
//! cargo run --release -p tessel-benches --example host_overhead
//! TESSEL_LOG=tessel::replay=debug cargo run --release -p tessel-benches --example host_overhead
//! ```
//!
//! The second form logs each realize's host time (plan lookup, inputs bound, launched,
//! outputs kept) on stderr. `TOKENS`, `RUNS` and `STEPS` set the loop lengths.

use std::time::Instant;

use tessel_models::{GenerateOptions, Gpt2, generate};
use tessel_nn::Module;
use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel_nn::optim::{AdamW, AdamWConfig, Optimizer};
use tessel_tensor::{DType, Device, Result, Tensor};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<()> {
    if let Ok(filter) = std::env::var("TESSEL_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let device = Device::default();
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crates/tessel-models/tests/fixtures/gpt2"
    );
    let model = Gpt2::from_dir(dir, DType::F32, &device)?;
    let prompt: Vec<i64> = (0..8).map(|i| i * 7 % 100).collect();
    let tokens = env("TOKENS", 48);
    for run in 0..env("RUNS", 5) {
        let start = Instant::now();
        let opts = GenerateOptions::greedy(tokens);
        generate(&model, std::slice::from_ref(&prompt), &opts, |_, _| {})?;
        let per_token = start.elapsed().as_secs_f64() * 1e6 / tokens as f64;
        eprintln!("tiny GPT-2 decode, run {run}: {per_token:.1} µs per token");
    }

    Tensor::manual_seed(0);
    let opts = tessel_nn::ParamOptions {
        dtype: DType::F32,
        device,
    };
    let mlp = tessel_nn::Sequential::new()
        .layer(tessel_nn::Linear::with_options(784, 128, true, &opts)?)
        .layer(tessel_nn::ReLU)
        .layer(tessel_nn::Linear::with_options(128, 10, true, &opts)?);
    let x = Tensor::rand([64, 784], DType::F32)?.to(&device)?;
    let y = Tensor::from_vec((0..64).map(|i| i % 10).collect::<Vec<i64>>(), [64])?.to(&device)?;
    Tensor::realize_all(&[&x, &y])?;
    let params = mlp.parameters();
    let mut opt = AdamW::new(params.clone(), AdamWConfig::default())?;
    let steps = env("STEPS", 500);
    let (mut forward, mut backward, mut update) = (0.0, 0.0, 0.0);
    for step in 0..steps + 3 {
        let t0 = Instant::now();
        let loss = cross_entropy(&mlp.forward(&x)?, &y, &CrossEntropyOptions::default())?;
        let t1 = Instant::now();
        let grads = tessel_tensor::grad(&loss, &params.iter().collect::<Vec<_>>())?;
        let t2 = Instant::now();
        opt.apply(&grads, &[])?;
        device.synchronize()?;
        if step >= 3 {
            forward += (t1 - t0).as_secs_f64();
            backward += (t2 - t1).as_secs_f64();
            update += t2.elapsed().as_secs_f64();
        }
    }
    let us = |s: f64| s * 1e6 / steps as f64;
    eprintln!(
        "MLP AdamW step: recording forward + loss {:.1} µs, grad {:.1} µs, update recorded + realized {:.1} µs",
        us(forward),
        us(backward),
        us(update)
    );
    Ok(())
}
