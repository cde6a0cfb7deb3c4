//! GPT-2 against `transformers`' `GPT2LMHeadModel` on the same weights: logits in f32 and
//! bf16, greedy generation of one prompt and of a left-padded batch, and a decode loop that
//! compiles nothing after its first token.

mod common;

use common::{assert_close, assert_half_close, dir, reference, rows};
use tessel_models::{CausalLm, GenerateOptions, Gpt2, generate};
use tessel_nn::Module;
use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel_nn::optim::{AdamW, AdamWConfig, Optimizer};
use tessel_tensor::{DType, Device, Tensor};

/// The compile counters are process-wide: the test that reads them runs alone.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn logits_match_transformers_in_f32_bf16_and_f16() {
    let _serial = serial();
    let r = reference("gpt2");
    let model = Gpt2::from_dir(dir("gpt2"), DType::F32, &Device::default()).unwrap();
    let logits = model.forward(&r["input_ids"]).unwrap();
    assert_close("gpt2 f32 logits", &logits, &r["logits"], 1e-4);

    let model = Gpt2::from_dir(dir("gpt2"), DType::BF16, &Device::default()).unwrap();
    let logits = model.forward(&r["input_ids"]).unwrap();
    assert_eq!(logits.dtype(), DType::BF16);
    assert_half_close(
        "gpt2 bf16 logits",
        &logits,
        &r["logits_bf16"],
        &r["logits"],
        2.0,
    );

    // f16 has 3 more significand bits than bf16: its error stays within PyTorch's bf16 one.
    let model = Gpt2::from_dir(dir("gpt2"), DType::F16, &Device::default()).unwrap();
    let logits = model.forward(&r["input_ids"]).unwrap();
    assert_eq!(logits.dtype(), DType::F16);
    assert_half_close(
        "gpt2 f16 logits",
        &logits,
        &r["logits_bf16"],
        &r["logits"],
        1.0,
    );
}

#[test]
fn a_sharded_checkpoint_loads_the_same_model() {
    let _serial = serial();
    let r = reference("gpt2");
    let model = Gpt2::from_dir(dir("gpt2-sharded"), DType::F32, &Device::default()).unwrap();
    let logits = model.forward(&r["input_ids"]).unwrap();
    assert_close("gpt2 sharded logits", &logits, &r["logits"], 1e-4);
}

#[test]
fn greedy_generation_reproduces_transformers_and_compiles_once() {
    let _serial = serial();
    let r = reference("gpt2");
    let model = Gpt2::from_dir(dir("gpt2"), DType::F32, &Device::default()).unwrap();
    let prompt = rows(&r["prompt"]).remove(0);
    let want = rows(&r["greedy"]).remove(0);
    let mut streamed = Vec::new();
    let got = generate(
        &model,
        std::slice::from_ref(&prompt),
        &GenerateOptions::greedy(20),
        |row, t| {
            assert_eq!(row, 0);
            streamed.push(t);
        },
    )
    .unwrap();
    assert_eq!(got[0], want, "greedy tokens");
    assert_eq!(streamed, want[prompt.len()..]);

    // Decoding token after token replays one plan: the third and later steps compile
    // nothing (the prompt and the first new token compile).
    let mut cache = model.new_cache().unwrap();
    let mut ids = prompt;
    for step in 0..6 {
        let width = if step == 0 { ids.len() } else { 1 };
        cache.begin(vec![vec![true; width]]).unwrap();
        let input = Tensor::from_vec(ids[ids.len() - width..].to_vec(), [1, width]).unwrap();
        let logits = model.forward_cached(&input, &mut cache).unwrap();
        let last = logits.narrow(1, width as i64 - 1, 1).unwrap();
        let mut outputs = vec![&last];
        outputs.extend(cache.pending());
        let report = Tensor::realize_all(&outputs).unwrap();
        cache.commit().unwrap();
        if step >= 2 {
            assert_eq!(
                report.kernels_prepared(),
                0,
                "decode step {step} prepared kernels"
            );
        }
        ids.push(want[ids.len()]);
    }
}

#[test]
fn a_left_padded_batch_generates_what_transformers_does() {
    let _serial = serial();
    let r = reference("gpt2");
    let model = Gpt2::from_dir(dir("gpt2"), DType::F32, &Device::default()).unwrap();
    let padded = rows(&r["batch_prompts"]);
    let mask = rows(&r["batch_mask"]);
    let prompts: Vec<Vec<i64>> = padded
        .iter()
        .zip(&mask)
        .map(|(p, m)| {
            p.iter()
                .zip(m)
                .filter(|(_, m)| **m == 1)
                .map(|(t, _)| *t)
                .collect()
        })
        .collect();
    let got = generate(&model, &prompts, &GenerateOptions::greedy(10), |_, _| {}).unwrap();
    assert_eq!(got, rows(&r["batch_greedy"]));
}

/// Fine-tuning: `AdamW` steps on the loaded model's parameters (every one of them, through
/// `derive(Module)`) lower the language-model loss, and the third step compiles nothing.
#[test]
fn adamw_steps_on_the_loaded_model_lower_the_loss_and_compile_once() {
    let _serial = serial();
    let r = reference("gpt2");
    let model = Gpt2::from_dir(dir("gpt2"), DType::F32, &Device::default()).unwrap();
    // 2 layers of 12 tensors, embeddings, the final norm; the head is tied.
    assert_eq!(model.parameters().len(), 2 * 12 + 2 + 2);
    let ids = &r["input_ids"];
    let (inputs, targets) = (
        ids.narrow(1, 0, 6).unwrap(),
        ids.narrow(1, 1, 6).unwrap().reshape(&[-1]).unwrap(),
    );
    let config = AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::new(model.parameters(), config).unwrap();
    let mut losses = Vec::new();
    for step in 0..4 {
        let logits = model.forward(&inputs).unwrap().reshape(&[-1, 101]).unwrap();
        let loss = cross_entropy(&logits, &targets, &CrossEntropyOptions::default()).unwrap();
        let before = tessel_tensor::stats().kernels_prepared();
        opt.step(&loss).unwrap();
        if step >= 2 {
            assert_eq!(
                tessel_tensor::stats().kernels_prepared(),
                before,
                "step {step} prepared kernels"
            );
        }
        losses.push(loss.item::<f32>().unwrap());
    }
    assert!(losses[3] < losses[0], "losses {losses:?}");
}
