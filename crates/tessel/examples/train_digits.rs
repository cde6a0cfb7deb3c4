//! Trains an MLP and a small CNN on the UCI handwritten digits (1797 8×8 images, the data of
//! scikit-learn's `load_digits`) with `AdamW`, and reports test accuracy:
//! `cargo run --release --example train_digits`.
//!
//! Each training step records the forward pass, `Optimizer::step` adds the gradients and
//! the `AdamW` update, and one cached plan computes all of it: kernels compile during the
//! first steps only. The data set and its license: `examples/data/README.md`.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use tessel::nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel::nn::optim::{AdamW, AdamWConfig};
use tessel::nn::{Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential};
use tessel::prelude::*;

#[path = "shared/digits.rs"]
mod digits;
use digits::{Digits, Rng, load, shuffle};

const BATCH: usize = 64;

fn mlp() -> Result<Sequential> {
    Ok(Sequential::new()
        .layer(Linear::new(64, 128)?)
        .layer(ReLU)
        .layer(Linear::new(128, 10)?))
}

fn cnn() -> Result<Sequential> {
    Ok(Sequential::new()
        .layer(Conv2d::new(1, 16, [3, 3])?)
        .layer(ReLU)
        .layer(MaxPool2d::new([2, 2])?)
        .layer(Flatten::new())
        .layer(Linear::new(16 * 3 * 3, 10)?))
}

/// Trains `model` (whose input is `[n, 64]` reshaped by `view`) and returns the test
/// accuracy.
fn train(
    name: &str,
    model: &Sequential,
    view: &[i64],
    epochs: usize,
    data: &(Digits, Digits),
) -> Result<f64> {
    let (train, test) = data;
    let mut opt = AdamW::new(
        model.parameters(),
        AdamWConfig {
            lr: 3e-3,
            ..AdamWConfig::default()
        },
    )?;
    let ce = CrossEntropyOptions::default();
    let steps_per_epoch = train.len() / BATCH;
    let bar = ProgressBar::new((epochs * steps_per_epoch) as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>4} [{bar:30}] {pos}/{len} steps {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(name.to_string());
    let mut rng = Rng(7);
    let mut order: Vec<usize> = (0..train.len()).collect();
    let start = Instant::now();
    for epoch in 1..=epochs {
        shuffle(&mut order, &mut rng);
        let mut total = 0.0;
        // Full batches only: every step has the same shapes, so one plan serves them all.
        for idx in order.chunks_exact(BATCH) {
            let (x, y) = train.batch(idx)?;
            let logits = model.forward(&x.reshape(view)?)?;
            let loss = cross_entropy(&logits, &y, &ce)?;
            opt.step(&loss)?;
            total += f64::from(loss.item::<f32>()?);
            bar.inc(1);
        }
        let mean = total / steps_per_epoch as f64;
        bar.set_message(format!("loss {mean:.4}"));
        let line = format!("{name} epoch {epoch:>2}: loss {mean:.4}");
        if bar.is_hidden() {
            println!("{line}");
        } else {
            bar.println(line);
        }
    }
    bar.finish_and_clear();
    let idx: Vec<usize> = (0..test.len()).collect();
    let (x, y) = test.batch(&idx)?;
    let predicted = model.forward(&x.reshape(view)?)?.argmax(-1, false)?;
    let correct = predicted
        .eq(&y)?
        .cast(DType::F32)
        .sum_all()?
        .item::<f32>()?;
    let accuracy = f64::from(correct) / test.len() as f64;
    println!(
        "{name}: test accuracy {:.1}% ({correct}/{}) after {epochs} epochs in {:.1} s",
        100.0 * accuracy,
        test.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(accuracy)
}

fn main() -> Result<()> {
    Tensor::manual_seed(0);
    let data = load();
    println!(
        "digits: {} training and {} test samples on {}",
        data.0.len(),
        data.1.len(),
        Device::default()
    );
    let mlp_accuracy = train("mlp", &mlp()?, &[-1, 64], 20, &data)?;
    let cnn_accuracy = train("cnn", &cnn()?, &[-1, 1, 8, 8], 15, &data)?;
    let stats = tessel::stats();
    println!(
        "kernels compiled in all: {} (and {} from the kernel cache), launched: {}",
        stats.kernels_compiled, stats.kernels_cached, stats.kernels_launched
    );
    if mlp_accuracy < 0.95 || cnn_accuracy < 0.95 {
        return Err(Error::Internal(format!(
            "accuracy below 95%: mlp {mlp_accuracy:.3}, cnn {cnn_accuracy:.3}"
        )));
    }
    Ok(())
}
