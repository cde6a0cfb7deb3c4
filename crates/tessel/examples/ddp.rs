//! Data-parallel training of the digits MLP: one process per GPU (or per CPU worker), each
//! training on its share of every batch, gradients averaged by `DistributedDataParallel`.
//!
//! ```text
//! cargo run --release --example ddp -- --cpus 2
//! cargo run --release --features cuda --example ddp -- --gpus 2
//! ```
//!
//! The launcher starts one copy of itself per rank with `RANK`, `WORLD_SIZE`, `MASTER_ADDR`
//! and `MASTER_PORT` set (as `torchrun` does; a process started with them by another
//! launcher works the same) and `TESSEL_DEVICE=cuda:<rank>` with `--gpus`. Rank 0 prints
//! the loss per epoch and the test accuracy. Options: `--epochs N` (default 20),
//! `--port P` (default 29500).

use std::process::Command;
use std::time::Instant;

use tessel::distributed::{DistributedDataParallel, ProcessGroup};
use tessel::nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel::nn::optim::{AdamW, AdamWConfig};
use tessel::nn::{Linear, ReLU, Sequential};
use tessel::prelude::*;

#[path = "shared/digits.rs"]
mod digits;
use digits::{Rng, load, shuffle};

/// Samples per step over all ranks (each rank takes `BATCH / world`).
const BATCH: usize = 64;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| -> Option<usize> {
        let at = args.iter().position(|a| a == flag)?;
        args.get(at + 1)?.parse().ok()
    };
    let epochs = value("--epochs").unwrap_or(20);
    if std::env::var_os("RANK").is_some() {
        return rank(epochs);
    }
    let (world, gpus) = match (value("--gpus"), value("--cpus")) {
        (Some(n), _) => (n, true),
        (None, n) => (n.unwrap_or(2), false),
    };
    if world == 0 || !BATCH.is_multiple_of(world) {
        return Err(Error::InvalidArgument {
            op: "ddp example",
            reason: format!("{world} ranks cannot split a batch of {BATCH}; use 1, 2, 4, 8, ..."),
        });
    }
    let port = value("--port").unwrap_or(29500);
    let exe = std::env::current_exe().map_err(|e| Error::Internal(e.to_string()))?;
    let children: Vec<_> = (0..world)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            cmd.args(["--epochs", &epochs.to_string()])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string());
            if gpus {
                cmd.env("TESSEL_DEVICE", format!("cuda:{r}"));
            }
            cmd.spawn()
                .map_err(|e| Error::Internal(format!("starting rank {r}: {e}")))
        })
        .collect::<Result<_>>()?;
    let mut failed = Vec::new();
    for (r, mut child) in children.into_iter().enumerate() {
        let ok = child.wait().is_ok_and(|s| s.success());
        if !ok {
            failed.push(r);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::Internal(format!("ranks {failed:?} failed")))
    }
}

/// One rank's training.
fn rank(epochs: usize) -> Result<()> {
    let group = ProcessGroup::from_env()?;
    let (r, world) = (group.rank(), group.world_size());
    let (train, test) = load();
    Tensor::manual_seed(0);
    let model = Sequential::new()
        .layer(Linear::new(64, 128)?)
        .layer(ReLU)
        .layer(Linear::new(128, 10)?);
    let ddp = DistributedDataParallel::new(&group, model.parameters())?;
    let mut opt = AdamW::new(
        model.parameters(),
        AdamWConfig {
            lr: 3e-3,
            ..AdamWConfig::default()
        },
    )?;
    if r == 0 {
        println!(
            "digits: {} training samples, {world} ranks of {} each per step, rank 0 on {}",
            train.len(),
            BATCH / world,
            Device::default()
        );
    }
    let ce = CrossEntropyOptions::default();
    // The same shuffle on every rank; each takes its share of each batch.
    let mut rng = Rng(7);
    let mut order: Vec<usize> = (0..train.len()).collect();
    let share = BATCH / world;
    let start = Instant::now();
    let mut steps = 0;
    for epoch in 1..=epochs {
        shuffle(&mut order, &mut rng);
        let mut total = 0.0;
        let batches = order.chunks_exact(BATCH);
        let count = batches.len();
        for batch in batches {
            let (x, y) = train.batch(&batch[r * share..(r + 1) * share])?;
            let loss = cross_entropy(&model.forward(&x)?, &y, &ce)?;
            ddp.step(&mut opt, &loss)?;
            total += f64::from(loss.item::<f32>()?);
            steps += 1;
        }
        if r == 0 {
            println!("epoch {epoch:>2}: rank 0 loss {:.4}", total / count as f64);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    if r == 0 {
        let idx: Vec<usize> = (0..test.len()).collect();
        let (x, y) = test.batch(&idx)?;
        let predicted = model.forward(&x)?.argmax(-1, false)?;
        let correct = predicted
            .eq(&y)?
            .cast(DType::F32)
            .sum_all()?
            .item::<f32>()?;
        println!(
            "test accuracy {:.1}% ({correct}/{}); {steps} steps in {seconds:.1} s ({:.2} ms per step, {:.0} samples/s over {world} ranks)",
            100.0 * f64::from(correct) / test.len() as f64,
            test.len(),
            1e3 * seconds / steps as f64,
            (steps * BATCH) as f64 / seconds
        );
    }
    group.barrier()
}
