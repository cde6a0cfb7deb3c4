//! Mixed-precision training: the digits MLP of `examples/train_digits.rs` trained under
//! `autocast(bf16)` with `f32` master weights reaches the `f32` run's test accuracy, and
//! `GradScaler` skips a step whose gradients are not finite, backs off and grows its scale.

use tessel::nn::amp::{GradScaler, GradScalerConfig};
use tessel::nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel::nn::optim::{AdamW, AdamWConfig, Sgd, SgdConfig};
use tessel::nn::{Linear, ReLU, Sequential};
use tessel::prelude::*;

const DATA: &str = include_str!("../examples/data/optdigits.tes");

/// Pixels (`[n, 64]`, flat) and classes.
type Samples = (Vec<f32>, Vec<i64>);

/// `SplitMix64`, for the shuffles (the example's).
struct Rng(u64);

impl Rng {
    fn shuffle(&mut self, v: &mut [usize]) {
        for i in (1..v.len()).rev() {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            v.swap(i, ((z ^ (z >> 31)) % (i as u64 + 1)) as usize);
        }
    }
}

/// Pixels in `[0, 1]` (`[n, 64]`) and classes, shuffled as the example does: the last
/// 360 samples are the test set.
fn digits() -> (Samples, Samples) {
    let (mut pixels, mut labels) = (Vec::new(), Vec::new());
    for line in DATA.lines().filter(|l| !l.trim().is_empty()) {
        let v: Vec<i64> = line.split(',').map(|x| x.trim().parse().unwrap()).collect();
        pixels.extend(v[..64].iter().map(|&p| p as f32 / 16.0));
        labels.push(v[64]);
    }
    let mut order: Vec<usize> = (0..labels.len()).collect();
    Rng(2024).shuffle(&mut order);
    let split = |idx: &[usize]| {
        (
            idx.iter()
                .flat_map(|&i| pixels[i * 64..(i + 1) * 64].to_vec())
                .collect(),
            idx.iter().map(|&i| labels[i]).collect(),
        )
    };
    let (train, test) = order.split_at(labels.len() - 360);
    (split(train), split(test))
}

/// Test accuracy of the MLP after `epochs` of `AdamW` in batches of 64, with the forward
/// (and the loss) under `autocast(dtype)` when given.
fn train(autocast: Option<DType>, epochs: usize) -> Result<f64> {
    Tensor::manual_seed(0);
    let ((px, py), (tx, ty)) = digits();
    let model = Sequential::new()
        .layer(Linear::new(64, 128)?)
        .layer(ReLU)
        .layer(Linear::new(128, 10)?);
    let mut opt = AdamW::new(
        model.parameters(),
        AdamWConfig {
            lr: 3e-3,
            ..AdamWConfig::default()
        },
    )?;
    let forward = |x: &Tensor| match autocast {
        Some(dtype) => tessel::autocast(dtype, || model.forward(x)),
        None => model.forward(x),
    };
    let batch = 64;
    let mut rng = Rng(7);
    let mut order: Vec<usize> = (0..py.len()).collect();
    for _ in 0..epochs {
        rng.shuffle(&mut order);
        for idx in order.chunks_exact(batch) {
            let pixels: Vec<f32> = idx
                .iter()
                .flat_map(|&i| px[i * 64..(i + 1) * 64].to_vec())
                .collect();
            let x = Tensor::from_vec(pixels, [batch, 64])?;
            let y = Tensor::from_vec(idx.iter().map(|&i| py[i]).collect::<Vec<i64>>(), [batch])?;
            let logits = forward(&x)?;
            if autocast.is_some() {
                assert_eq!(
                    logits.dtype(),
                    DType::F32,
                    "a bf16 product plus the f32 bias"
                );
            }
            let loss = cross_entropy(&logits, &y, &CrossEntropyOptions::default())?;
            opt.step(&loss)?;
        }
    }
    for p in model.parameters() {
        assert_eq!(p.dtype(), DType::F32, "master weights stay f32");
    }
    let x = Tensor::from_vec(tx, [ty.len(), 64])?;
    let predicted = forward(&x)?.argmax(-1, false)?.to_vec::<i64>()?;
    let correct = predicted.iter().zip(&ty).filter(|(p, t)| p == t).count();
    Ok(correct as f64 / ty.len() as f64)
}

#[test]
fn bf16_autocast_training_reaches_the_f32_accuracy() -> Result<()> {
    let epochs = 10;
    let full = train(None, epochs)?;
    let mixed = train(Some(DType::BF16), epochs)?;
    eprintln!("digits MLP test accuracy: f32 {full:.3}, bf16 autocast {mixed:.3}");
    assert!(full > 0.93, "f32 accuracy {full}");
    assert!(
        mixed >= full - 0.02,
        "bf16 autocast accuracy {mixed} against f32 {full}"
    );
    Ok(())
}

#[test]
fn grad_scaler_skips_non_finite_steps_and_adapts_its_scale() -> Result<()> {
    let w = Tensor::from_vec(vec![1.0f32, -2.0], [2])?;
    let mut opt = Sgd::new(
        vec![w.clone()],
        SgdConfig {
            lr: 0.25,
            ..Default::default()
        },
    )?;
    let mut scaler = GradScaler::new(GradScalerConfig {
        init_scale: 1024.0,
        growth_interval: 2,
        ..Default::default()
    })?;
    let loss_at = |x: f32| -> Result<Tensor> {
        // Σ x·w²: gradient 2x·w, infinite for x = inf.
        (&(&w * &w)? * &Tensor::scalar(x))?.sum_all()
    };
    // An infinite gradient: no step, the scale halves.
    assert!(!scaler.step(&mut opt, &loss_at(f32::INFINITY)?)?);
    assert_eq!(w.to_vec::<f32>()?, vec![1.0, -2.0]);
    assert_eq!(scaler.scale(), 512.0);
    // Finite: w -= 0.25 · 2w, unscaled exactly.
    assert!(scaler.step(&mut opt, &loss_at(1.0)?)?);
    assert_eq!(w.to_vec::<f32>()?, vec![0.5, -1.0]);
    assert_eq!(scaler.scale(), 512.0);
    // The second finite step in a row doubles the scale.
    assert!(scaler.step(&mut opt, &loss_at(1.0)?)?);
    assert_eq!(w.to_vec::<f32>()?, vec![0.25, -0.5]);
    assert_eq!(scaler.scale(), 1024.0);
    // NaN counts as well.
    assert!(!scaler.step(&mut opt, &loss_at(f32::NAN)?)?);
    assert_eq!(w.to_vec::<f32>()?, vec![0.25, -0.5]);
    assert_eq!(scaler.scale(), 512.0);
    // Bad settings are errors.
    for bad in [
        GradScalerConfig {
            init_scale: 0.0,
            ..Default::default()
        },
        GradScalerConfig {
            growth_factor: 1.0,
            ..Default::default()
        },
        GradScalerConfig {
            backoff_factor: 1.0,
            ..Default::default()
        },
        GradScalerConfig {
            growth_interval: 0,
            ..Default::default()
        },
    ] {
        assert!(GradScaler::new(bad).is_err(), "{bad:?}");
    }
    Ok(())
}

/// Under `autocast`, a `LayerNorm` with `f32` weights takes a `bf16` activation (the
/// product of a bias-free `Linear`) and normalizes it in `f32`, as does the loss; without
/// the scope the same call is a dtype error, as in PyTorch.
#[test]
fn autocast_runs_norms_and_losses_in_f32() -> Result<()> {
    let norm = tessel::nn::LayerNorm::new(&[4])?;
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 2.0], [2, 4])?;
    let w = Tensor::from_vec(
        vec![
            1.0f32, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0,
        ],
        [4, 4],
    )?;
    let (h, y, loss) = tessel::autocast(DType::BF16, || {
        let h = x.matmul(&w)?;
        let y = norm.forward(&h)?;
        let loss = cross_entropy(
            &h,
            &Tensor::from_vec(vec![3i64, 0], [2])?,
            &CrossEntropyOptions::default(),
        )?;
        Ok((h, y, loss))
    })?;
    assert_eq!(
        (h.dtype(), y.dtype(), loss.dtype()),
        (DType::BF16, DType::F32, DType::F32)
    );
    // Each row normalized: (v - mean) / sqrt(var + 1e-5), the rows exact in bf16.
    let got = y.to_vec::<f32>()?;
    let z = 1.0 / (1.25f32 + 1e-5).sqrt();
    let want = [-1.5 * z, -0.5 * z, 0.5 * z, 1.5 * z];
    for (g, w) in got.iter().zip(want.iter().chain(&want)) {
        assert!((g - w).abs() < 1e-5, "{got:?}");
    }
    assert!(
        norm.forward(&h).is_err(),
        "bf16 input, f32 weights, no autocast"
    );
    Ok(())
}
