//! Dynamic dims: a model run at five sizes of a dim marked dynamic compiles on the first
//! size only, and every size gives the reference's values.

use crate::common::nd::{Nd, assert_nd, reduce_tol};
use crate::common::{Domain, Rng, assert_err, invalid};
use tessel_tensor::{DType, Result, Tensor, Var};

pub(crate) fn random(seed: u64, dims: &[usize]) -> Nd {
    Nd::random(
        &mut Rng::new(seed),
        DType::F32,
        dims,
        Domain::new((-1.0, 1.0), (-2, 2)),
    )
}

/// Softmax over the last axis, in f64.
pub(crate) fn softmax_ref(x: &Nd) -> Nd {
    let n = *x.dims.last().expect("a vector or more");
    let mut data = x.data.clone();
    for row in data.chunks_mut(n) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        for v in row.iter_mut() {
            *v = (*v - max).exp() / sum;
        }
    }
    Nd::new(&x.dims, data)
}

/// `x + b` with `b` broadcast over the rows, then `ReLU`.
pub(crate) fn bias_relu_ref(x: &Nd, b: &Nd) -> Nd {
    let n = b.numel();
    let data = x
        .data
        .iter()
        .enumerate()
        .map(|(i, v)| (v + b.data[i % n]).max(0.0))
        .collect();
    Nd::new(&x.dims, data)
}

/// A two-layer MLP with softmax and a mean over the batch, at five batch sizes: every
/// size after the first replays the plan (no compilation) and gives the right values.
#[test]
fn mlp_over_five_batch_sizes_compiles_once() -> Result<()> {
    let batch = Var::new("batch", 1, 4096)?;
    let (w1r, b1r, w2r) = (random(1, &[16, 32]), random(2, &[32]), random(3, &[32, 10]));
    let (w1, b1, w2) = (
        w1r.tensor(DType::F32),
        b1r.tensor(DType::F32),
        w2r.tensor(DType::F32),
    );
    for (i, n) in [5usize, 17, 64, 3, 33].into_iter().enumerate() {
        let xr = random(10 + i as u64, &[n, 16]);
        let x = xr.tensor(DType::F32).mark_dynamic(0, batch)?;
        assert_eq!(x.dims(), vec![n, 16]);
        let hidden = (&x.matmul(&w1)? + &b1)?.relu();
        let probs = hidden.matmul(&w2)?.softmax(-1)?;
        let mean = probs.mean(&[0], false)?;
        let report = Tensor::realize_all(&[&probs, &mean])?;
        if i > 0 {
            assert_eq!(report.kernels_prepared(), 0, "batch {n} compiled kernels");
        }
        assert_eq!(probs.dims(), vec![n, 10]);
        let want = softmax_ref(&bias_relu_ref(&xr.matmul(&w1r), &b1r).matmul(&w2r));
        assert_nd(
            &format!("probs, batch {n}"),
            &Nd::of(&probs),
            &want,
            reduce_tol(DType::F32, 32),
        );
        let want_mean = want.reduce(&[0], false, |v| v.iter().sum::<f64>() / v.len() as f64);
        assert_nd(
            &format!("mean, batch {n}"),
            &Nd::of(&mean),
            &want_mean,
            reduce_tol(DType::F32, n),
        );
    }
    Ok(())
}

/// The same MLP at one size, realized six times with new inputs each time, the weights
/// updated in place halfway: every realize after the first replays the cached plan (on
/// CUDA as a recorded graph, replayed for as long as its buffers stay the same) and gives
/// that round's values.
#[test]
fn replayed_plans_follow_new_inputs() -> Result<()> {
    let (w1r, b1r, w2r) = (random(4, &[16, 32]), random(5, &[32]), random(6, &[32, 10]));
    let (w1, b1, w2) = (
        w1r.tensor(DType::F32),
        b1r.tensor(DType::F32),
        w2r.tensor(DType::F32),
    );
    let mut w2r = w2r;
    for round in 0..6 {
        if round == 3 {
            w2r = random(7, &[32, 10]);
            w2.assign(&w2r.tensor(DType::F32))?;
            w2.realize()?;
        }
        let xr = random(20 + round, &[9, 16]);
        let x = xr.tensor(DType::F32);
        let probs = (&x.matmul(&w1)? + &b1)?.relu().matmul(&w2)?.softmax(-1)?;
        let report = Tensor::realize_all(&[&probs])?;
        if round > 0 && round != 3 {
            assert_eq!(
                report.kernels_prepared(),
                0,
                "round {round} compiled kernels"
            );
        }
        let want = softmax_ref(&bias_relu_ref(&xr.matmul(&w1r), &b1r).matmul(&w2r));
        assert_nd(
            &format!("probs, round {round}"),
            &Nd::of(&probs),
            &want,
            reduce_tol(DType::F32, 32),
        );
    }
    Ok(())
}

/// Attention over a dynamic sequence length: `softmax(q kᵀ / √d) v` with the head
/// split by a reshape through `-1`, at five lengths, compiling once.
#[test]
fn attention_over_five_sequence_lengths_compiles_once() -> Result<()> {
    let seq = Var::new("seq", 1, 1024)?;
    let (heads, d) = (2usize, 4usize);
    for (i, s) in [7usize, 1, 30, 12, 65].into_iter().enumerate() {
        let seed = 100 + 3 * i as u64;
        let (qr, kr, vr) = (
            random(seed, &[s, heads * d]),
            random(seed + 1, &[s, heads * d]),
            random(seed + 2, &[s, heads * d]),
        );
        // [s, h·d] → [h, s, d], the sequence axis dynamic throughout.
        let split = |t: &Nd| -> Result<Tensor> {
            t.tensor(DType::F32)
                .mark_dynamic(0, seq)?
                .reshape(&[-1, heads as i64, d as i64])?
                .permute(&[1, 0, 2])
        };
        let (q, k, v) = (split(&qr)?, split(&kr)?, split(&vr)?);
        let scores = (&q.matmul(&k.transpose(-1, -2)?)? * (1.0 / (d as f64).sqrt()))?;
        let out = scores.softmax(-1)?.matmul(&v)?;
        let report = out.realize()?;
        if i > 0 {
            assert_eq!(report.kernels_prepared(), 0, "length {s} compiled kernels");
        }
        assert_eq!(out.dims(), vec![heads, s, d]);
        let split_ref = |t: &Nd| t.reshape(&[s, heads, d]).permute(&[1, 0, 2]);
        let (q, k, v) = (split_ref(&qr), split_ref(&kr), split_ref(&vr));
        let scale = 1.0 / (d as f64).sqrt();
        let mut scores = q.matmul(&k.permute(&[0, 2, 1]));
        scores.data.iter_mut().for_each(|x| *x *= scale);
        let want = softmax_ref(&scores).matmul(&v);
        assert_nd(
            &format!("attention, length {s}"),
            &Nd::of(&out),
            &want,
            reduce_tol(DType::F32, s),
        );
    }
    Ok(())
}

/// Variance and normalization over a dynamic axis count the axis in the kernel.
#[test]
fn statistics_over_a_dynamic_axis() -> Result<()> {
    let n = Var::new("rows", 1, 512)?;
    for (i, rows) in [9usize, 40, 2].into_iter().enumerate() {
        let xr = random(200 + i as u64, &[rows, 3]);
        let x = xr.tensor(DType::F32).mark_dynamic(0, n)?;
        let var = x.var(&[0], false)?;
        let mean = x.mean_all()?;
        Tensor::realize_all(&[&var, &mean])?;
        let want_var = xr.reduce(&[0], false, |v| {
            let m = v.iter().sum::<f64>() / v.len() as f64;
            v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() as f64 - 1.0)
        });
        assert_nd(
            "var",
            &Nd::of(&var),
            &want_var,
            reduce_tol(DType::F32, rows),
        );
        let want_mean = xr.data.iter().sum::<f64>() / xr.numel() as f64;
        let got = mean.item::<f32>()?;
        assert!(
            (f64::from(got) - want_mean).abs() < 1e-5,
            "mean of {rows} rows: {got} vs {want_mean}"
        );
    }
    Ok(())
}

/// A tensor made directly from a symbolic shape has a dim with no value: its dims read it
/// as 0 (no panic), and realizing it, or something computed from it, is an error naming
/// the variable and the fix.
#[test]
fn a_dynamic_dim_without_a_value_is_an_error_not_a_panic() -> Result<()> {
    let n = Var::new("n", 1, 64)?;
    let shape = tessel_tensor::Shape::new(vec![tessel_tensor::Dim::from(n), 3.into()]);
    let t = Tensor::full(shape, 1.0f32, DType::F32);
    assert_eq!((t.dims(), t.numel()), (vec![0, 3], 0));
    let realized = t.realize().map(|_| t.clone());
    assert_err(
        "realizing a dim with no value",
        realized,
        invalid("realize"),
        &["`n`", "mark_dynamic"],
    );
    let total = t.sum(&[0], false)?;
    assert_eq!(total.dims(), [3]);
    let realized = total.realize().map(|_| total.clone());
    assert_err(
        "realizing a sum over a dim with no value",
        realized,
        invalid("realize"),
        &["`n`", "mark_dynamic"],
    );
    Ok(())
}

#[test]
fn misuse_is_an_error() -> Result<()> {
    let batch = Var::new("batch", 1, 8)?;
    let x = Tensor::ones([4, 2], DType::F32);
    assert_err(
        "mark_dynamic beyond the bounds",
        Tensor::ones([9, 2], DType::F32).mark_dynamic(0, batch),
        invalid("mark_dynamic"),
        &["mark_dynamic", "9", "1..=8", "batch"],
    );
    // A variable that may be 0 or negative would reach the kernels as a divisor.
    assert_err(
        "mark_dynamic with a variable that may be below 1",
        Tensor::ones([3, 2], DType::F32).mark_dynamic(0, Var::new("v", -5, 8)?),
        invalid("mark_dynamic"),
        &["mark_dynamic", "`v`", "-5..=8", "at least 1"],
    );
    assert_err(
        "mark_dynamic on a missing axis",
        x.mark_dynamic(2, batch),
        invalid("mark_dynamic"),
        &["axis 2", "[4, 2]"],
    );
    let a = x.mark_dynamic(0, batch)?;
    assert_err(
        "marking a dynamic axis again",
        a.mark_dynamic(0, batch),
        invalid("mark_dynamic"),
        &["already", "batch"],
    );
    let b = Tensor::ones([3, 2], DType::F32).mark_dynamic(0, batch)?;
    assert_err(
        "two values of one dynamic dim",
        &a + &b,
        invalid("add"),
        &["batch", "4", "3"],
    );
    // A dynamic dim never unifies with a number, even an equal one.
    assert!((&a + &Tensor::ones([4, 2], DType::F32)).is_err());
    Ok(())
}

/// The KV-cache pattern: a cache whose length is the dynamic dim `past` grows by one row per
/// step through `cat`, and `mark_dynamic` renames the grown length (`past + 1`) back to
/// `past`. Every step gives the static `cat`'s values bit for bit, and steps after the
/// second compile nothing.
#[test]
fn a_cache_grown_by_cat_along_a_dynamic_axis_compiles_once() -> Result<()> {
    let past = Var::new("past", 1, 64)?;
    let first = random(40, &[2, 3, 4]);
    let mut want = first.clone();
    let mut cache = first.tensor(DType::F32).mark_dynamic(1, past)?;
    for step in 0..5 {
        let row = random(41 + step, &[2, 1, 4]);
        let grown = Tensor::cat(&[&cache, &row.tensor(DType::F32)], 1)?;
        // A reader of the grown cache, as attention reads its keys.
        let total = grown.sum(&[1], false)?;
        let report = Tensor::realize_all(&[&grown, &total])?;
        if step >= 2 {
            assert_eq!(report.kernels_prepared(), 0, "step {step} prepared kernels");
        }
        want = Nd::cat(&[&want, &row], 1);
        assert_nd(&format!("step {step} cache"), &Nd::of(&grown), &want, 0.0);
        cache = grown.mark_dynamic(1, past)?;
        assert_eq!(cache.dims(), want.dims);
        assert_eq!(cache.shape().to_string(), "[2, past, 4]");
    }
    Ok(())
}
