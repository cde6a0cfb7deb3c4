//! `use_deterministic_algorithms` and the planner: a plan made while it is on leaves out
//! the library routines whose results vary run to run (CUDA's fused `f32` attention
//! backward adds each key tile's share of `dq` atomically), so attention gradients repeat
//! bit for bit, and still match an `f64` reference.
//!
//! In its own binary: the setting is process-wide. Run it on a GPU with `TESSEL_DEVICE`.

use tessel_nn::scaled_dot_product_attention;
use tessel_tensor::{DType, Result, Tensor, grad, inspect, use_deterministic_algorithms};

const SHAPE: [usize; 4] = [2, 3, 67, 64];

/// The gradients of `sum(sdpa(q, k, v) * r)` (causal) by `q`, `k` and `v`, as bits, and
/// the plan that computed them, as DOT.
fn gradients(q: &Tensor, k: &Tensor, v: &Tensor, r: &Tensor) -> Result<(Vec<Vec<u32>>, String)> {
    let y = scaled_dot_product_attention(q, k, v, None, 0.0, true, None, false)?;
    let loss = (&y * r)?.sum_all()?;
    let g = grad(&loss, &[q, k, v])?;
    let targets: Vec<&Tensor> = g.iter().collect();
    let plan = inspect::plan_to_dot(&targets)?.unwrap_or_default();
    Tensor::realize_all(&targets)?;
    let bits = g
        .iter()
        .map(|t| Ok(t.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect()))
        .collect::<Result<Vec<Vec<u32>>>>()?;
    Ok((bits, plan))
}

/// `dv = softmax(causal(q kᵀ / √e))ᵀ r` in `f64`, per (batch, head).
fn value_gradient(q: &[f32], k: &[f32], r: &[f32]) -> Vec<f64> {
    let [b, h, l, e] = SHAPE;
    let scale = 1.0 / (e as f64).sqrt();
    let mut dv = vec![0f64; q.len()];
    for bh in 0..b * h {
        let at = |x: &[f32], row: usize, c: usize| f64::from(x[(bh * l + row) * e + c]);
        for i in 0..l {
            let scores: Vec<f64> = (0..=i)
                .map(|j| (0..e).map(|c| at(q, i, c) * at(k, j, c)).sum::<f64>() * scale)
                .collect();
            let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = scores.iter().map(|s| (s - top).exp()).sum();
            for (j, s) in scores.iter().enumerate() {
                let p = (s - top).exp() / total;
                for c in 0..e {
                    dv[(bh * l + j) * e + c] += p * at(r, i, c);
                }
            }
        }
    }
    dv
}

#[test]
fn deterministic_attention_gradients_repeat_bit_for_bit() -> Result<()> {
    let [q, k, v, r] = [0, 1, 2, 3].map(|_| Tensor::randn(SHAPE, DType::F32));
    let (q, k, v, r) = (q?, k?, v?, r?);
    Tensor::realize_all(&[&q, &k, &v, &r])?;
    let (free, _) = gradients(&q, &k, &v, &r)?;

    use_deterministic_algorithms(true);
    let (first, plan) = gradients(&q, &k, &v, &r)?;
    assert!(
        !plan.contains("dq, dk and dv"),
        "a deterministic plan offers the atomic gradients routine:\n{plan}"
    );
    for _ in 0..2 {
        assert_eq!(
            gradients(&q, &k, &v, &r)?.0,
            first,
            "deterministic attention gradients changed between runs"
        );
    }
    use_deterministic_algorithms(false);

    let want = value_gradient(
        &q.to_vec::<f32>()?,
        &k.to_vec::<f32>()?,
        &r.to_vec::<f32>()?,
    );
    let largest = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    for (got, want) in first[2].iter().zip(&want) {
        let got = f64::from(f32::from_bits(*got));
        assert!(
            (got - want).abs() <= 1e-4 * largest,
            "dv {got} against {want}"
        );
    }
    // Whatever the plan without the setting chose, it computes the same gradients.
    for (which, (a, b)) in ["dq", "dk", "dv"].iter().zip(free.iter().zip(&first)) {
        let value = |bits: &u32| f64::from(f32::from_bits(*bits));
        let largest = b.iter().map(value).fold(0f64, |m, v| m.max(v.abs()));
        for (x, y) in a.iter().zip(b) {
            assert!(
                (value(x) - value(y)).abs() <= 1e-4 * largest,
                "{which}: {} without the setting against {} with it",
                value(x),
                value(y)
            );
        }
    }
    Ok(())
}
