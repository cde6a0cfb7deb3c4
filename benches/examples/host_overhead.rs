//! Host time of loops that replay cached plans on the default device: greedy decoding with
//! the tiny GPT-2 fixture (`crates/tessel-models/tests/fixtures/gpt2`: 2 layers, 32 wide, so
//! the device's work is small), its forward on [4, 32] tokens (recording, then realizing;
//! then as a `Compiled` function),
//! and `AdamW` steps of a 784-128-10 MLP on a batch of 64 and of
//! the tiny GPT-2 on [4, 32] tokens, timed by phase (recording the forward and loss, `grad`,
//! recording the update plus realizing it), then the same steps through a `CompiledStep`
//! (recorded once, replayed per step). `GPT2_DIR` names another GPT-2 directory
//! (`config.json` and `model.safetensors`), such as a deeper model of the same small width.
//!
//! ```text
//! cargo run --release -p tessel-benches --example host_overhead
//! TESSEL_LOG=tessel::replay=debug cargo run --release -p tessel-benches --example host_overhead
//! ```
//!
//! The second form logs each realize's host time (plan lookup, inputs bound, launched,
//! outputs kept) on stderr. `TOKENS`, `RUNS` and `STEPS` set the loop lengths, `ROWS` and
//! `LEN` the forward's batch (4 × 32 unless given); `ONLY=mlp`
//! runs the MLP's steps alone, `ONLY=forward` GPT-2's decoding and forwards, `ONLY=sdpa` a
//! small causal attention (`DTYPE=bf16` for bf16) and a one-kernel op (for a profiler).

use std::time::Instant;

use tessel_models::{GenerateOptions, Gpt2, generate};
use tessel_nn::Module;
use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel_nn::optim::{AdamW, AdamWConfig, CompiledStep, Optimizer};
use tessel_tensor::{Compiled, DType, Device, Result, Tensor};

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
    let only = std::env::var("ONLY").unwrap_or_default();
    if only == "sdpa" {
        return sdpa(device, env("STEPS", 2000));
    }
    if only != "mlp" {
        gpt2(device)?;
    }
    if only == "forward" {
        return Ok(());
    }
    mlp(device)
}

/// Greedy decoding and `AdamW` steps of GPT-2 (the tiny fixture unless `GPT2_DIR` is set).
fn gpt2(device: Device) -> Result<()> {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crates/tessel-models/tests/fixtures/gpt2"
    );
    let dir = std::env::var("GPT2_DIR").unwrap_or_else(|_| fixture.to_owned());
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

    let (rows, len) = (env("ROWS", 4), env("LEN", 32));
    let ids: Vec<i64> = (0..rows * (len + 1))
        .map(|i| (i as i64 * 37 + 11) % 100)
        .collect();
    let ids = Tensor::from_vec(ids, [rows, len + 1])?.to(&device)?;
    let inputs = ids.narrow(1, 0, len as i64)?;
    let targets = ids.narrow(1, 1, len as i64)?.reshape(&[-1])?;
    Tensor::realize_all(&[&inputs, &targets])?;
    forward(&model, device, &inputs, env("STEPS", 300))?;
    if std::env::var("ONLY").as_deref() == Ok("forward") {
        return Ok(());
    }
    let params = model.parameters();
    let mut opt = AdamW::new(params.clone(), AdamWConfig::default())?;
    train(
        "tiny GPT-2 AdamW step [4,32]",
        device,
        &params,
        &mut opt,
        env("STEPS", 300),
        || gpt2_loss(&model, &inputs, &targets),
    )?;
    train_compiled(
        "tiny GPT-2 AdamW step [4,32], compiled",
        device,
        &mut opt,
        env("STEPS", 300),
        &[&inputs, &targets],
        |b| gpt2_loss(&model, &b[0], &b[1]),
    )
}

/// Forwards of GPT-2 on `inputs` (after 3 untimed ones): the mean host time of recording
/// the forward, and of realizing and synchronizing it.
fn forward(model: &Gpt2, device: Device, inputs: &Tensor, runs: usize) -> Result<()> {
    let (record, realize) = record_and_realize(device, runs, || model.forward(inputs))?;
    eprintln!(
        "GPT-2 forward {:?}: recording {record:.1} µs, realize + synchronize {realize:.1} µs",
        inputs.dims(),
    );
    let recorded = model.forward(inputs)?.to_vec::<f32>()?;
    let f = Compiled::new(&[inputs], |a| Ok(vec![model.forward(&a[0])?]))?;
    let mut call = 0.0;
    let mut logits = Vec::new();
    for run in 0..runs + 3 {
        let t0 = Instant::now();
        logits = f.call(&[inputs])?;
        device.synchronize()?;
        if run >= 3 {
            call += t0.elapsed().as_secs_f64();
        }
    }
    let same = logits[0].to_vec::<f32>()? == recorded;
    eprintln!(
        "GPT-2 forward {:?} as a Compiled function: {:.1} µs per call + synchronize (logits {} the recorded forward's)",
        inputs.dims(),
        call * 1e6 / runs as f64,
        if same { "equal" } else { "DIFFER from" }
    );
    Ok(())
}

/// Causal `scaled_dot_product_attention` over [1, 2, 16, 16] tensors (the device's work is
/// small) and a one-kernel op, `x * 2 + b` on 16 elements: the mean host time of recording
/// each, and of realizing and synchronizing it.
fn sdpa(device: Device, runs: usize) -> Result<()> {
    Tensor::manual_seed(0);
    let dtype = match std::env::var("DTYPE").as_deref() {
        Ok("bf16") => DType::BF16,
        _ => DType::F32,
    };
    let qkv: Vec<Tensor> = (0..3)
        .map(|_| Tensor::randn([1, 2, 16, 16], dtype)?.to(&device))
        .collect::<Result<_>>()?;
    let x = Tensor::rand([16], DType::F32)?.to(&device)?;
    let b = Tensor::rand([16], DType::F32)?.to(&device)?;
    Tensor::realize_all(&[&qkv[0], &qkv[1], &qkv[2], &x, &b])?;
    let ops: [(&str, &dyn Fn() -> Result<Tensor>); 2] = [
        ("causal sdpa [1,2,16,16]", &|| {
            tessel_nn::scaled_dot_product_attention(
                &qkv[0], &qkv[1], &qkv[2], None, 0.0, true, None, false,
            )
        }),
        ("small op x * 2 + b [16]", &|| &(&x * 2.0)? + &b),
    ];
    for (name, op) in ops {
        let (record, realize) = record_and_realize(device, runs, op)?;
        eprintln!("{name}: recording {record:.2} µs, realize + synchronize {realize:.2} µs");
    }
    Ok(())
}

/// `runs` calls of `record` (after 3 untimed ones), each result realized and the device
/// synchronized: the mean µs of recording, and of realizing plus synchronizing.
fn record_and_realize(
    device: Device,
    runs: usize,
    record: impl Fn() -> Result<Tensor>,
) -> Result<(f64, f64)> {
    let (mut recording, mut realizing) = (0.0, 0.0);
    for run in 0..runs + 3 {
        let t0 = Instant::now();
        let y = record()?;
        let t1 = Instant::now();
        y.realize()?;
        device.synchronize()?;
        if run >= 3 {
            recording += (t1 - t0).as_secs_f64();
            realizing += t1.elapsed().as_secs_f64();
        }
    }
    let us = |s: f64| s * 1e6 / runs as f64;
    Ok((us(recording), us(realizing)))
}

fn gpt2_loss(model: &Gpt2, inputs: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let logits = model.forward(inputs)?;
    let v = logits.dims()[2] as i64;
    cross_entropy(
        &logits.reshape(&[-1, v])?,
        targets,
        &CrossEntropyOptions::default(),
    )
}

/// `AdamW` steps of a 784-128-10 MLP on a batch of 64.
fn mlp(device: Device) -> Result<()> {
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
    train(
        "MLP AdamW step",
        device,
        &params,
        &mut opt,
        env("STEPS", 500),
        || cross_entropy(&mlp.forward(&x)?, &y, &CrossEntropyOptions::default()),
    )?;
    train_compiled(
        "MLP AdamW step, compiled",
        device,
        &mut opt,
        env("STEPS", 500),
        &[&x, &y],
        |b| cross_entropy(&mlp.forward(&b[0])?, &b[1], &CrossEntropyOptions::default()),
    )
}

/// Compiles one training step of `loss` on `batch`, runs `steps` of them (after 3 untimed
/// ones) and prints the mean time of a step, host and device.
fn train_compiled(
    name: &str,
    device: Device,
    opt: &mut AdamW,
    steps: usize,
    batch: &[&Tensor],
    loss: impl FnOnce(&[Tensor]) -> Result<Tensor>,
) -> Result<()> {
    let step = CompiledStep::new(opt, batch, loss)?;
    let mut total = 0.0;
    for i in 0..steps + 3 {
        let t0 = Instant::now();
        step.step(opt, batch)?;
        device.synchronize()?;
        if i >= 3 {
            total += t0.elapsed().as_secs_f64();
        }
    }
    eprintln!(
        "{name}: {:.1} µs per step (replayed and synchronized; {} launches)",
        total * 1e6 / steps as f64,
        step.launches()
    );
    Ok(())
}

/// Runs `steps` training steps of `loss` (after 3 untimed ones) and prints the mean host
/// time of each phase.
fn train(
    name: &str,
    device: Device,
    params: &[Tensor],
    opt: &mut AdamW,
    steps: usize,
    loss: impl Fn() -> Result<Tensor>,
) -> Result<()> {
    let (mut forward, mut backward, mut update) = (0.0, 0.0, 0.0);
    for step in 0..steps + 3 {
        let t0 = Instant::now();
        let loss = loss()?;
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
        "{name}: recording forward + loss {:.1} µs, grad {:.1} µs, update recorded + realized {:.1} µs ({:.1} µs per step)",
        us(forward),
        us(backward),
        us(update),
        us(forward + backward + update)
    );
    Ok(())
}
