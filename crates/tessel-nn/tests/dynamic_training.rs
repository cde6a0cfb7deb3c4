//! Training with a dynamic batch size: one plan for every batch, short ones included.
//!
//! In its own binary: it counts compiles through the process-wide `stats()`, which other
//! tests running in parallel would disturb.

mod common;

use common::Rng;
use tessel_nn::Linear;
use tessel_tensor::{Result, Tensor, Var};

/// Training an MLP with `AdamW` where the last batch is short: with the batch dim dynamic,
/// every step after the first replays one plan (0 compiles, the short batches included)
/// and the parameters end where the same steps on static shapes leave them.
#[test]
fn training_steps_over_changing_batch_sizes_compile_once() -> Result<()> {
    use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
    use tessel_nn::optim::{AdamW, AdamWConfig, Optimizer};
    use tessel_nn::{Module, ReLU, Sequential};

    let batch = Var::new("batch", 1, 256)?;
    let run = |dynamic: bool| -> Result<(Vec<Vec<f32>>, Vec<usize>)> {
        Tensor::manual_seed(5);
        let model = Sequential::new()
            .layer(Linear::new(8, 16)?)
            .layer(ReLU)
            .layer(Linear::new(16, 4)?);
        let mut opt = AdamW::new(model.parameters(), AdamWConfig::default())?;
        let mut rng = Rng(9);
        let mut compiled = Vec::new();
        for n in [16usize, 16, 7, 16, 5] {
            let data: Vec<f32> = rng.vec(n * 8).into_iter().map(|v| v as f32).collect();
            let x = Tensor::from_vec(data, [n, 8])?;
            let y = Tensor::from_vec(rng.classes(n, 4), [n])?;
            let (x, y) = if dynamic {
                (x.mark_dynamic(0, batch)?, y.mark_dynamic(0, batch)?)
            } else {
                (x, y)
            };
            let loss = cross_entropy(&model.forward(&x)?, &y, &CrossEntropyOptions::default())?;
            let before = tessel_tensor::stats().kernels_prepared();
            opt.step(&loss)?;
            compiled.push((tessel_tensor::stats().kernels_prepared() - before) as usize);
        }
        let params = model
            .parameters()
            .iter()
            .map(Tensor::to_vec::<f32>)
            .collect::<Result<_>>()?;
        Ok((params, compiled))
    };
    let (dynamic, compiled) = run(true)?;
    assert!(
        compiled[1..].iter().all(|&c| c == 0),
        "compiles per step: {compiled:?}"
    );
    let (fixed, _) = run(false)?;
    for (d, f) in dynamic.iter().zip(&fixed) {
        for (a, b) in d.iter().zip(f) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{a} vs static {b}"
            );
        }
    }
    Ok(())
}
