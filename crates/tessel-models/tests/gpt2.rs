//! GPT-2 against `transformers`' `GPT2LMHeadModel` on the same weights: logits in f32 and
//! bf16, greedy generation of one prompt and of a left-padded batch, and a decode loop that
//! compiles nothing after its first token.

mod common;

use common::{
    assert_close, assert_half_close, check_batch_generation, check_greedy_generation, dir,
    reference,
};
use tessel_models::Gpt2;
use tessel_nn::Module;
use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel_nn::optim::{AdamW, AdamWConfig, Optimizer};
use tessel_tensor::{DType, Device};

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
    check_greedy_generation(&model, &r);
}

#[test]
fn a_left_padded_batch_generates_what_transformers_does() {
    let _serial = serial();
    let r = reference("gpt2");
    let model = Gpt2::from_dir(dir("gpt2"), DType::F32, &Device::default()).unwrap();
    check_batch_generation(&model, &r);
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
