//! The models bench: GPT-2 small, BERT-base and ResNet-50 at full size, from the files
//! `benches/models_torch.py DIR` writes (random weights, inputs and PyTorch's outputs), and
//! a small MLP's training step (`mlp-train`, built here: it needs no files; with
//! `-compiled`, `mlp-train-compiled`, `gpt2-train-f32-compiled` and
//! `gpt2-train-bf16-compiled` run the step through a `CompiledStep`; `gpt2-bf16-compiled` and `bert-bf16-compiled` run the forward as a
//! `tessel::Compiled` function),
//! timed as a user sees them (record + realize + `Device::synchronize`): the first call
//! (plan, compile, measure) and the median of later calls. Each output is checked against
//! PyTorch's for the same weights.
//!
//! ```text
//! python3 benches/models_torch.py /tmp/models
//! cargo bench -p tessel-benches --bench models --features cuda -- /tmp/models --device cuda
//! ```
//!
//! Options: `--device D` (default: `Device::default()`), `--only NAME[,NAME]` (workloads
//! by name prefix), `--runs N` (5), `--tokens B,T` (GPT-2's forward and training step on
//! the first `B` rows and `T` tokens of the saved input instead of all [8, 512], for a
//! CPU; the forward's output is then not checked, as PyTorch's is for the whole input).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tessel_models::{Bert, GenerateOptions, Gpt2, ResNet, generate};
use tessel_nn::Module;
use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel_nn::optim::{AdamW, AdamWConfig, CompiledStep, Optimizer};
use tessel_tensor::{
    Compiled, DType, Device, Result, Tensor, autocast as autocast_scope, load_safetensors,
};

/// First call and median of `runs` later calls of `f`, synchronized.
fn timed(
    device: Device,
    runs: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<(Duration, Duration)> {
    device.synchronize()?;
    let start = Instant::now();
    f()?;
    device.synchronize()?;
    let first = start.elapsed();
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        f()?;
        device.synchronize()?;
        times.push(start.elapsed());
    }
    times.sort();
    Ok((first, times[times.len() / 2]))
}

/// First call and median of `runs` later calls of the forward `f` on `args`, and its
/// output: recorded and realized each call, or (`compiled`) recorded once into a
/// [`Compiled`] function in the first call and replayed after.
fn timed_forward(
    device: Device,
    runs: usize,
    args: &[&Tensor],
    compiled: bool,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<(Duration, Duration, Tensor)> {
    let mut out = None;
    let mut function: Option<Compiled> = None;
    let (first, steady) = timed(device, runs, || {
        let y = if compiled {
            if function.is_none() {
                function = Some(Compiled::new(args, |a| Ok(vec![f(a)?]))?);
            }
            function
                .as_ref()
                .map_or(Ok(Vec::new()), |c| c.call(args))?
                .remove(0)
        } else {
            let given: Vec<Tensor> = args.iter().map(|&a| a.clone()).collect();
            let y = f(&given)?;
            y.realize()?;
            y
        };
        out = Some(y);
        Ok(())
    })?;
    let out = out.expect("timed calls its function at least once");
    Ok((first, steady, out))
}

/// The largest difference from `want` relative to `want`'s largest magnitude.
fn rel_diff(got: &Tensor, want: &Tensor) -> Result<f64> {
    let g = got.cast(DType::F64).to_vec::<f64>()?;
    let w = want.cast(DType::F64).to_vec::<f64>()?;
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    Ok(g.iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
        / scale)
}

fn reference(dir: &Path, device: Device) -> Result<HashMap<String, Tensor>> {
    let r = load_safetensors(dir.join("reference.safetensors"), &device)?;
    Ok(r.into_iter().collect())
}

fn report(
    name: &str,
    load: Duration,
    first: Duration,
    steady: Duration,
    per_run: f64,
    unit: &str,
    check: &str,
) {
    println!(
        "{name:<44} load {:6.2} s  first {:7.2} s  steady {:9.3} ms  {:10.1} {unit}  {check}",
        load.as_secs_f64(),
        first.as_secs_f64(),
        steady.as_secs_f64() * 1e3,
        per_run / steady.as_secs_f64()
    );
}

/// The saved GPT-2 input, or its first `tokens` (rows, tokens) where given.
fn gpt2_ids(r: &HashMap<String, Tensor>, tokens: Option<(i64, i64)>) -> Result<Tensor> {
    let ids = &r["input_ids"];
    match tokens {
        Some((rows, length)) => ids.narrow(0, 0, rows)?.narrow(1, 0, length),
        None => Ok(ids.clone()),
    }
}

/// `compiled`: the forward as a [`Compiled`] function (compiled in the first call).
fn gpt2_forward(
    dir: &Path,
    device: Device,
    dtype: DType,
    runs: usize,
    tokens: Option<(i64, i64)>,
    compiled: bool,
) -> Result<()> {
    let r = reference(dir, device)?;
    let start = Instant::now();
    let model = Gpt2::from_dir(dir, dtype, &device)?;
    let load = start.elapsed();
    let ids = &gpt2_ids(&r, tokens)?;
    let (first, steady, logits) =
        timed_forward(device, runs, &[ids], compiled, |a| model.forward(&a[0]))?;
    let check = if tokens.is_some() {
        "not checked (--tokens)".to_owned()
    } else {
        let last = logits.narrow(1, 511, 1)?.squeeze(Some(&[1]))?;
        format!(
            "last logits vs PyTorch f32: {:.2e} rel",
            rel_diff(&last, &r["last_logits"])?
        )
    };
    let [rows, length] = [ids.dims()[0], ids.dims()[1]];
    report(
        &format!(
            "gpt2 forward [{rows},{length}] {dtype}{}",
            if compiled { ", compiled" } else { "" }
        ),
        load,
        first,
        steady,
        (rows * length) as f64,
        "tokens/s",
        &check,
    );
    Ok(())
}

fn gpt2_decode(dir: &Path, device: Device, runs: usize) -> Result<()> {
    let r = reference(dir, device)?;
    let start = Instant::now();
    let model = Gpt2::from_dir(dir, DType::F32, &device)?;
    let load = start.elapsed();
    let prompt = r["prompt"].to_vec::<i64>()?;
    let want = r["greedy"].to_vec::<i64>()?;
    let mut got = Vec::new();
    let (first, steady) = timed(device, runs, || {
        got = generate(
            &model,
            std::slice::from_ref(&prompt),
            &GenerateOptions::greedy(128),
            |_, _| {},
        )?
        .remove(0);
        Ok(())
    })?;
    let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count() - prompt.len();
    let check = format!("{same} of 128 greedy tokens as transformers' generate");
    report(
        "gpt2 greedy decode 128 tokens, batch 1",
        load,
        first,
        steady,
        128.0,
        "tokens/s",
        &check,
    );
    Ok(())
}

/// One `AdamW` step of GPT-2 with `f32` master weights; with `autocast` set, the forward and
/// backward run under `tessel_tensor::autocast` in that dtype (PyTorch's `torch.autocast`).
/// `compiled`: through a `CompiledStep` (compiled in the first call).
fn gpt2_train(
    dir: &Path,
    device: Device,
    runs: usize,
    tokens: Option<(i64, i64)>,
    autocast: Option<DType>,
    compiled: bool,
) -> Result<()> {
    let r = reference(dir, device)?;
    let start = Instant::now();
    let model = Gpt2::from_dir(dir, DType::F32, &device)?;
    let load = start.elapsed();
    let ids = &gpt2_ids(&r, tokens.map(|(rows, length)| (rows, length + 1)))?;
    let [rows, length] = [ids.dims()[0], ids.dims()[1] - 1];
    let inputs = ids.narrow(1, 0, length as i64)?;
    let targets = ids.narrow(1, 1, length as i64)?.reshape(&[-1])?;
    let mut opt = AdamW::new(
        model.parameters(),
        AdamWConfig {
            lr: 1e-4,
            ..AdamWConfig::default()
        },
    )?;
    let loss = |inputs: &Tensor, targets: &Tensor| {
        let run = || {
            let logits = model.forward(inputs)?;
            let v = logits.dims()[2] as i64;
            cross_entropy(
                &logits.reshape(&[-1, v])?,
                targets,
                &CrossEntropyOptions::default(),
            )
        };
        match autocast {
            Some(dtype) => autocast_scope(dtype, run),
            None => run(),
        }
    };
    let mut step: Option<CompiledStep> = None;
    let (first, steady) = timed(device, runs, || {
        if !compiled {
            return opt.step(&loss(&inputs, &targets)?);
        }
        if step.is_none() {
            let batch = [&inputs, &targets];
            step = Some(CompiledStep::new(&mut opt, &batch, |b| loss(&b[0], &b[1]))?);
        }
        if let Some(s) = &step {
            s.step(&mut opt, &[&inputs, &targets])?;
        }
        Ok(())
    })?;
    let precision = autocast.map_or("f32".to_owned(), |d| format!("{d} autocast"));
    let how = if compiled { ", compiled" } else { "" };
    report(
        &format!("gpt2 AdamW step [{rows},{}] {precision}{how}", length + 1),
        load,
        first,
        steady,
        (rows * (length + 1)) as f64,
        "tokens/s",
        "",
    );
    Ok(())
}

/// One `AdamW` step of a 784-128-10 MLP (`Linear` → `ReLU` → `Linear`, cross-entropy) on a
/// batch of 64: a step of a few dozen small kernels, where launch overhead is the cost.
/// `compiled`: through a `CompiledStep` (compiled in the first call).
fn mlp_train(device: Device, runs: usize, compiled: bool) -> Result<()> {
    Tensor::manual_seed(0);
    let opts = tessel_nn::ParamOptions {
        dtype: DType::F32,
        device,
    };
    let start = Instant::now();
    let model = tessel_nn::Sequential::new()
        .layer(tessel_nn::Linear::with_options(784, 128, true, &opts)?)
        .layer(tessel_nn::ReLU)
        .layer(tessel_nn::Linear::with_options(128, 10, true, &opts)?);
    let x = Tensor::rand([64, 784], DType::F32)?.to(&device)?;
    let labels: Vec<i64> = (0..64).map(|i| i % 10).collect();
    let y = Tensor::from_vec(labels, [64])?.to(&device)?;
    Tensor::realize_all(&[&x, &y])?;
    let mut opt = AdamW::new(model.parameters(), AdamWConfig::default())?;
    let load = start.elapsed();
    let loss = |x: &Tensor, y: &Tensor| {
        let logits = tessel_nn::Forward::forward(&model, x)?;
        cross_entropy(&logits, y, &CrossEntropyOptions::default())
    };
    let mut step: Option<CompiledStep> = None;
    let (first, steady) = timed(device, runs, || {
        if !compiled {
            return opt.step(&loss(&x, &y)?);
        }
        if step.is_none() {
            step = Some(CompiledStep::new(&mut opt, &[&x, &y], |b| {
                loss(&b[0], &b[1])
            })?);
        }
        if let Some(s) = &step {
            s.step(&mut opt, &[&x, &y])?;
        }
        Ok(())
    })?;
    report(
        if compiled {
            "mlp 784-128-10 AdamW step [64] f32, compiled"
        } else {
            "mlp 784-128-10 AdamW step [64] f32"
        },
        load,
        first,
        steady,
        64.0,
        "samples/s",
        "",
    );
    Ok(())
}

/// `compiled`: the forward as a [`Compiled`] function (compiled in the first call).
fn bert(dir: &Path, device: Device, dtype: DType, runs: usize, compiled: bool) -> Result<()> {
    let r = reference(dir, device)?;
    let start = Instant::now();
    let model = Bert::from_dir(dir, dtype, &device)?;
    let load = start.elapsed();
    let (ids, mask) = (&r["input_ids"], &r["attention_mask"]);
    let (first, steady, states) = timed_forward(device, runs, &[ids, mask], compiled, |a| {
        model
            .forward(&a[0], None, Some(&a[1]))
            .map(|o| o.last_hidden_state)
    })?;
    let cls = states.narrow(1, 0, 1)?.squeeze(Some(&[1]))?;
    let check = format!(
        "[CLS] states vs PyTorch f32: {:.2e} rel",
        rel_diff(&cls, &r["cls"])?
    );
    report(
        &format!(
            "bert-base [64,128] {dtype}{}",
            if compiled { ", compiled" } else { "" }
        ),
        load,
        first,
        steady,
        64.0,
        "sentences/s",
        &check,
    );
    Ok(())
}

fn resnet(dir: &Path, device: Device, dtype: DType, runs: usize) -> Result<()> {
    let r = reference(dir, device)?;
    let start = Instant::now();
    let model = ResNet::from_file(dir, dtype, &device)?;
    let load = start.elapsed();
    let images = r["images"].cast(dtype);
    let (first, steady) = timed(device, runs, || {
        model.forward(&images)?.realize().map(|_| ())
    })?;
    let check = format!(
        "logits vs PyTorch f32: {:.2e} rel",
        rel_diff(&model.forward(&images)?, &r["logits"])?
    );
    report(
        &format!("resnet50 [32,3,224,224] {dtype}"),
        load,
        first,
        steady,
        32.0,
        "images/s",
        &check,
    );
    Ok(())
}

/// One named bench run.
type Workload<'a> = Box<dyn Fn() -> Result<()> + 'a>;

fn main() -> std::process::ExitCode {
    if let Ok(filter) = std::env::var("TESSEL_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let Some(root) = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .map(PathBuf::from)
    else {
        eprintln!(
            "usage: models DIR [--device D] [--only NAME,...] [--runs N] [--tokens B,T] (DIR from benches/models_torch.py)"
        );
        return std::process::ExitCode::FAILURE;
    };
    let device = match value("--device").map(|d| Device::parse(&d)).transpose() {
        Ok(d) => d.unwrap_or_default(),
        Err(e) => {
            eprintln!("models bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let runs: usize = value("--runs").and_then(|r| r.parse().ok()).unwrap_or(5);
    let only = value("--only");
    let tokens: Option<(i64, i64)> = value("--tokens").and_then(|t| {
        let (rows, length) = t.split_once(',')?;
        Some((rows.parse().ok()?, length.parse().ok()?))
    });
    let gpt2 = root.join("gpt2");
    let workloads: Vec<(&str, Workload<'_>)> = vec![
        (
            "gpt2-f32",
            Box::new(|| gpt2_forward(&gpt2, device, DType::F32, runs, tokens, false)),
        ),
        (
            "gpt2-bf16",
            Box::new(|| gpt2_forward(&gpt2, device, DType::BF16, runs, tokens, false)),
        ),
        (
            "gpt2-bf16-compiled",
            Box::new(|| gpt2_forward(&gpt2, device, DType::BF16, runs, tokens, true)),
        ),
        ("gpt2-decode", Box::new(|| gpt2_decode(&gpt2, device, runs))),
        (
            "bert-f32",
            Box::new(|| bert(&root.join("bert"), device, DType::F32, runs, false)),
        ),
        (
            "bert-bf16",
            Box::new(|| bert(&root.join("bert"), device, DType::BF16, runs, false)),
        ),
        (
            "bert-bf16-compiled",
            Box::new(|| bert(&root.join("bert"), device, DType::BF16, runs, true)),
        ),
        (
            "resnet-f32",
            Box::new(|| resnet(&root.join("resnet50"), device, DType::F32, runs)),
        ),
        (
            "resnet-bf16",
            Box::new(|| resnet(&root.join("resnet50"), device, DType::BF16, runs)),
        ),
        (
            "gpt2-train-f32",
            Box::new(|| gpt2_train(&gpt2, device, runs, tokens, None, false)),
        ),
        (
            "gpt2-train-f32-compiled",
            Box::new(|| gpt2_train(&gpt2, device, runs, tokens, None, true)),
        ),
        (
            "mlp-train",
            Box::new(|| mlp_train(device, runs.max(20), false)),
        ),
        (
            "mlp-train-compiled",
            Box::new(|| mlp_train(device, runs.max(20), true)),
        ),
        (
            "gpt2-train-bf16",
            Box::new(|| gpt2_train(&gpt2, device, runs, tokens, Some(DType::BF16), false)),
        ),
        (
            "gpt2-train-bf16-compiled",
            Box::new(|| gpt2_train(&gpt2, device, runs, tokens, Some(DType::BF16), true)),
        ),
    ];
    println!("Tessel on {device}");
    for (name, run) in workloads {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|n| name.starts_with(n)))
        {
            continue;
        }
        if let Err(e) = run() {
            println!("{name:<44} error: {e}");
        }
    }
    std::process::ExitCode::SUCCESS
}
