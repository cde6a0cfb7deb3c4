//! Fixtures written by `fixtures/make_fixtures.py` (Hugging Face's own code) and
//! comparisons against them.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

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
