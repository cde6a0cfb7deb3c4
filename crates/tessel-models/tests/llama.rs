//! Llama against `transformers`' `LlamaForCausalLM` on the same weights: logits in f32 and
//! bf16, greedy generation of one prompt and of a left-padded batch, and a decode loop that
//! compiles nothing after its first token.

mod common;

use common::{
    assert_close, assert_half_close, check_batch_generation, check_greedy_generation, dir,
    reference,
};
use tessel_models::Llama;
use tessel_tensor::{DType, Device};

#[test]
fn logits_match_transformers_in_f32_bf16_and_f16() {
    let r = reference("llama");
    let model = Llama::from_dir(dir("llama"), DType::F32, &Device::default()).unwrap();
    let logits = model.forward(&r["input_ids"]).unwrap();
    assert_close("llama f32 logits", &logits, &r["logits"], 1e-4);

    let model = Llama::from_dir(dir("llama"), DType::BF16, &Device::default()).unwrap();
    let logits = model.forward(&r["input_ids"]).unwrap();
    assert_eq!(logits.dtype(), DType::BF16);
    assert_half_close(
        "llama bf16 logits",
        &logits,
        &r["logits_bf16"],
        &r["logits"],
        2.0,
    );

    // f16 has 3 more significand bits than bf16: its error stays within PyTorch's bf16 one.
    let model = Llama::from_dir(dir("llama"), DType::F16, &Device::default()).unwrap();
    let logits = model.forward(&r["input_ids"]).unwrap();
    assert_eq!(logits.dtype(), DType::F16);
    assert_half_close(
        "llama f16 logits",
        &logits,
        &r["logits_bf16"],
        &r["logits"],
        1.0,
    );
}

#[test]
fn greedy_generation_reproduces_transformers_and_compiles_once() {
    let r = reference("llama");
    let model = Llama::from_dir(dir("llama"), DType::F32, &Device::default()).unwrap();
    check_greedy_generation(&model, &r);
}

#[test]
fn a_left_padded_batch_generates_what_transformers_does() {
    let r = reference("llama");
    let model = Llama::from_dir(dir("llama"), DType::F32, &Device::default()).unwrap();
    check_batch_generation(&model, &r);
}
