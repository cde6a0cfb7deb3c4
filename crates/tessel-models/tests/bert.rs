//! BERT against `transformers`' `BertModel` on the same weights: hidden states and pooler
//! in f32 and bf16 with padding and segments, and sentence-transformers' mean-pooled,
//! normalized sentence embeddings.

mod common;

use common::{assert_close, assert_half_close, dir, reference};
use tessel_models::Bert;
use tessel_tensor::{DType, Device};

#[test]
fn hidden_states_pooler_and_sentence_embeddings_match_transformers() {
    let r = reference("bert");
    let model = Bert::from_dir(dir("bert"), DType::F32, &Device::default()).unwrap();
    let (ids, types, mask) = (&r["input_ids"], &r["token_type_ids"], &r["attention_mask"]);
    let out = model.forward(ids, Some(types), Some(mask)).unwrap();
    // Padded positions' states are as meaningless as in PyTorch, but still computed alike.
    assert_close(
        "bert last_hidden_state",
        &out.last_hidden_state,
        &r["last_hidden_state"],
        1e-4,
    );
    assert_close(
        "bert pooler_output",
        out.pooler_output.as_ref().unwrap(),
        &r["pooler_output"],
        1e-4,
    );
    let emb = model.sentence_embedding(ids, Some(types), mask).unwrap();
    assert_close(
        "bert sentence_embedding",
        &emb,
        &r["sentence_embedding"],
        1e-4,
    );

    let model = Bert::from_dir(dir("bert"), DType::BF16, &Device::default()).unwrap();
    let out = model.forward(ids, Some(types), Some(mask)).unwrap();
    assert_eq!(out.last_hidden_state.dtype(), DType::BF16);
    assert_half_close(
        "bert bf16 last_hidden_state",
        &out.last_hidden_state,
        &r["last_hidden_state_bf16"],
        &r["last_hidden_state"],
        2.0,
    );
}
