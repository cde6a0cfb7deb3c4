//! Helpers shared by the layer and loss tests: seeded data, `f64` tensors, comparisons.
#![allow(dead_code)]

use tessel_tensor::{DType, Error, Result, Tensor};

/// `SplitMix64` for test data.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * u
    }

    /// `n` values uniform in `[-2, 2)`.
    pub(crate) fn vec(&mut self, n: usize) -> Vec<f64> {
        self.vec_in(n, -2.0, 2.0)
    }

    /// `n` values uniform in `[lo, hi)`.
    pub(crate) fn vec_in(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// `n` class indices below `c`.
    pub(crate) fn classes(&mut self, n: usize, c: usize) -> Vec<i64> {
        (0..n)
            .map(|_| (self.next_u64() % c as u64) as i64)
            .collect()
    }
}

/// An `f64` tensor of `data` in `shape`.
pub(crate) fn t64(data: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape).unwrap()
}

/// The values as `f64`.
pub(crate) fn read(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).to_vec::<f64>().unwrap()
}

/// Every element within `tol * (1 + |want|)`.
#[track_caller]
pub(crate) fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g}, want {w} (tol {tol})"
        );
    }
}

/// Asserts an `InvalidArgument` error whose message names `op` and contains `text`.
#[track_caller]
pub(crate) fn assert_invalid<T>(r: Result<T>, op: &str, text: &str) {
    match r {
        Err(e @ Error::InvalidArgument { .. }) => {
            let msg = e.to_string();
            assert!(msg.starts_with(op), "error `{msg}` does not name {op}");
            assert!(msg.contains(text), "error `{msg}` lacks `{text}`");
        }
        Err(e) => panic!("expected InvalidArgument from {op}, got {e}"),
        Ok(_) => panic!("expected an error from {op}"),
    }
}
