//! Fixtures written by `fixtures/make_fixtures.py` (Hugging Face's own code) and
//! comparisons against them.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use tessel_models::{CausalLm, GenerateOptions, generate};
use tessel_tensor::{DType, Device, Tensor, load_safetensors};

/// The directory of fixture `name`.
pub(crate) fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The reference tensors of fixture `name` (inputs and `transformers`' outputs).
pub(crate) fn reference(name: &str) -> HashMap<String, Tensor> {
    load_safetensors(dir(name).join("reference.safetensors"), &Device::default())
        .unwrap()
        .into_iter()
        .collect()
}

/// The values as `f64`.
pub(crate) fn read(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

/// The rows of an i64 `[B, T]` tensor.
pub(crate) fn rows(t: &Tensor) -> Vec<Vec<i64>> {
    let d = t.dims();
    let v = t.to_vec::<i64>().unwrap();
    v.chunks(d[1]).map(<[i64]>::to_vec).collect()
}

/// Every element within `tol` relative to the reference's largest magnitude.
#[track_caller]
pub(crate) fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.dims(), want.dims(), "{what}: shapes differ");
    let (g, w) = (read(got), read(want));
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    let worst = g
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f64, f64::max);
    assert!(
        worst <= tol * scale,
        "{what}: largest difference {worst:e} against values up to {scale:e} (tolerance {tol:e} relative)"
    );
}

/// The largest absolute difference.
pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    read(a)
        .iter()
        .zip(&read(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// A half-precision result judged against PyTorch's in the same dtype: its error from the
/// f32 reference may be at most `factor` times PyTorch's own (half-precision rounding
/// differs in where it happens, never by much), plus `1e-2` of the values' range.
#[track_caller]
pub(crate) fn assert_half_close(
    what: &str,
    got: &Tensor,
    torch_half: &Tensor,
    reference: &Tensor,
    factor: f64,
) {
    assert_eq!(got.dims(), reference.dims(), "{what}: shapes differ");
    let scale = read(reference).iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let ours = max_diff(got, reference);
    let torch = max_diff(torch_half, reference);
    assert!(
        ours <= factor * torch + 1e-2 * scale,
        "{what}: {ours:e} from the f32 reference, PyTorch's own {torch:e} (values up to {scale:e})"
    );
}

/// `model`'s greedy continuation of the fixture's prompt equals `transformers`'
/// `generate` (streamed token by token), and decoding token after token replays one plan:
/// the third and later steps compile nothing (the prompt and the first new token compile).
#[track_caller]
pub(crate) fn check_greedy_generation(model: &dyn CausalLm, r: &HashMap<String, Tensor>) {
    let prompt = rows(&r["prompt"]).remove(0);
    let want = rows(&r["greedy"]).remove(0);
    let mut streamed = Vec::new();
    let got = generate(
        model,
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

/// A left-padded batch of the fixture's prompts generates what `transformers` does.
#[track_caller]
pub(crate) fn check_batch_generation(model: &dyn CausalLm, r: &HashMap<String, Tensor>) {
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
    let got = generate(model, &prompts, &GenerateOptions::greedy(10), |_, _| {}).unwrap();
    assert_eq!(got, rows(&r["batch_greedy"]));
}
