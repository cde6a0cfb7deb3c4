//! CPU kernels against numpy and the `gemm` crate, first call next to steady state.
//!
//! Each workload is recorded and realized once (the first call: plan, compile, measure)
//! and then `--runs` more times (the median is the steady state). The references run in
//! the same process: a `copy_from_slice` of the chain's input (memcpy bandwidth, bytes
//! read + written) and the `gemm` crate on the same matrices. numpy's figures come from
//! `benches/cpu_numpy.py`, run right after on the same machine.
//!
//! `TESSEL_LOG=tessel::plan=info` logs each plan's measured programs.
//!
//! Run: `cargo bench -p tessel-benches --bench cpu_first -- [--runs N] [--only a,b]`.
//! Start from empty caches (`TESSEL_CACHE_DIR=$(mktemp -d)`) to see a cold first call;
//! a second run with the same directory shows a second process's first call.

use std::hint::black_box;
use std::time::Instant;

use tessel_models::Gpt2;
use tessel_nn::Module;
use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel_nn::optim::{AdamW, AdamWConfig, Optimizer};
use tessel_tensor::{DType, Device, Result, Tensor};

/// 16M f32: the chain's and the copy's size.
const CHAIN: usize = 1 << 24;

struct Row {
    name: &'static str,
    first_s: f64,
    steady_ms: f64,
    reference: Option<(&'static str, f64)>,
    /// `cpu_numpy.py` times the same workload.
    numpy: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `f` once (first call) and `runs` more times (median, ms).
fn time(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    let start = Instant::now();
    f()?;
    let first = start.elapsed().as_secs_f64();
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        f()?;
        samples.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok((first, median(samples)))
}

/// Eight elementwise ops with two transcendentals, as `cpu_numpy.py` writes them.
fn chain(x: &Tensor) -> Result<Tensor> {
    let a = ((x * 1.5)? + 0.25)?.sigmoid();
    let b = ((&a * x)? - 0.5)?.tanh();
    (&b + x)?.abs()
}

/// A training step of the 2-block GPT-2 test fixture (`tessel-models/tests/fixtures/gpt2`):
/// forward, cross-entropy, backward and an `AdamW` update.
fn tiny_gpt2_step(runs: usize) -> Result<(f64, f64)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/tessel-models/tests/fixtures/gpt2");
    let model = Gpt2::from_dir(&dir, DType::F32, &Device::cpu())?;
    let vocab = model.config().vocab_size as i64;
    let ids: Vec<i64> = (0..4 * 33).map(|i| (i * 7919) % vocab).collect();
    let ids = Tensor::from_vec(ids, [4, 33])?;
    let inputs = ids.narrow(1, 0, 32)?;
    let targets = ids.narrow(1, 1, 32)?.reshape(&[-1])?;
    let mut opt = AdamW::new(model.parameters(), AdamWConfig::default())?;
    time(runs, || {
        let logits = model.forward(&inputs)?;
        let loss = cross_entropy(
            &logits.reshape(&[-1, vocab])?,
            &targets,
            &CrossEntropyOptions::default(),
        )?;
        opt.step(&loss)?;
        loss.realize().map(drop)
    })
}

fn main() -> Result<()> {
    if let Ok(filter) = std::env::var("TESSEL_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let args: Vec<String> = std::env::args().collect();
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(5);
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').map(str::to_owned).collect());
    let wanted = |name: &str| {
        only.as_ref()
            .is_none_or(|o| o.iter().any(|w| name.contains(w.as_str())))
    };
    Tensor::manual_seed(0);
    let mut rows = Vec::new();

    if wanted("chain") {
        let x = Tensor::randn([CHAIN], DType::F32)?;
        x.realize()?;
        let host: Vec<f32> = x.to_vec()?;
        let mut copy = vec![0f32; CHAIN];
        let (_, copy_ms) = time(runs, || {
            copy.copy_from_slice(black_box(&host));
            black_box(&copy);
            Ok(())
        })?;
        let (first_s, steady_ms) = time(runs, || chain(&x)?.realize().map(drop))?;
        let bytes = 2.0 * 4.0 * CHAIN as f64;
        rows.push(Row {
            name: "chain8 sigmoid/tanh f32 [16M]",
            first_s,
            steady_ms,
            reference: Some(("memcpy", copy_ms)),
            numpy: true,
        });
        eprintln!(
            "chain: {:.2} GB/s, memcpy {:.2} GB/s",
            bytes / steady_ms / 1e6,
            bytes / copy_ms / 1e6
        );
    }
    if wanted("row sum") {
        let x = Tensor::randn([4096, 4096], DType::F32)?;
        x.realize()?;
        let (first_s, steady_ms) = time(runs, || x.sum(&[-1], false)?.realize().map(drop))?;
        rows.push(Row {
            name: "row sum f32 [4096, 4096]",
            first_s,
            steady_ms,
            reference: None,
            numpy: true,
        });
    }
    if wanted("matmul") {
        let n = 2048;
        let a = Tensor::randn([n, n], DType::F32)?;
        let b = Tensor::randn([n, n], DType::F32)?;
        Tensor::realize_all(&[&a, &b])?;
        let (ha, hb): (Vec<f32>, Vec<f32>) = (a.to_vec()?, b.to_vec()?);
        let mut hc = vec![0f32; n * n];
        let (_, gemm_ms) = time(runs, || {
            // SAFETY: the three slices hold n×n row-major matrices (row stride n, column
            // stride 1) and `hc` is written only here.
            unsafe {
                gemm::gemm(
                    n,
                    n,
                    n,
                    hc.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    ha.as_ptr(),
                    1,
                    n as isize,
                    hb.as_ptr(),
                    1,
                    n as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::Rayon(0),
                );
            }
            Ok(())
        })?;
        let (first_s, steady_ms) = time(runs, || a.matmul(&b)?.realize().map(drop))?;
        rows.push(Row {
            name: "matmul f32 2048³",
            first_s,
            steady_ms,
            reference: Some(("gemm crate", gemm_ms)),
            numpy: true,
        });
    }
    if wanted("tiny gpt2") {
        let (first_s, steady_ms) = tiny_gpt2_step(runs)?;
        rows.push(Row {
            name: "tiny GPT-2 (2 blocks, width 32) AdamW step [4, 32]",
            first_s,
            steady_ms,
            reference: None,
            numpy: false,
        });
    }

    println!("| workload | Tessel CPU steady (first call) | reference | ratio |");
    println!("|---|---|---|---|");
    for r in rows {
        let (mut reference, ratio) = match r.reference {
            Some((name, ms)) => (
                format!("{name} {ms:.2} ms"),
                format!("{:.2}", ms / r.steady_ms),
            ),
            None => (String::new(), String::new()),
        };
        if r.numpy {
            reference.push_str(" (numpy: cpu_numpy.py)");
        }
        println!(
            "| {} | {:.2} ms ({:.2} s) | {reference} | {ratio} |",
            r.name, r.steady_ms, r.first_s
        );
    }
    Ok(())
}
