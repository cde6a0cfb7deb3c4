//! Kernel counts of the standard fused patterns, read from the `RealizeReport` of a
//! realize: each result is also checked against an f64 reference, so a fusion that drops
//! work shows up as a wrong value, not only as a count.

use crate::common::nd::{Nd, assert_nd, reduce_tol};
use crate::common::{Domain, Rng};
use tessel_tensor::{DType, Result, Tensor};

fn random(seed: u64, dims: &[usize]) -> (Tensor, Nd) {
    let r = Nd::random(
        &mut Rng::new(seed),
        DType::F32,
        dims,
        Domain::new((-3.0, 3.0), (0, 0)),
    );
    (r.tensor(DType::F32), r)
}

/// Realizes `t` and returns how many kernels ran.
fn kernels(t: &Tensor) -> Result<usize> {
    Ok(t.realize()?.kernels)
}

fn softmax_ref(r: &Nd, axis: usize, log: bool) -> Nd {
    let max = r
        .reduce(&[axis], true, |v| {
            v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        })
        .expand(&r.dims);
    let shifted: Vec<f64> = r.data.iter().zip(&max.data).map(|(x, m)| x - m).collect();
    let sums = Nd::new(&r.dims, shifted.iter().map(|x| x.exp()).collect())
        .reduce(&[axis], true, |v| v.iter().sum())
        .expand(&r.dims);
    let out = shifted
        .iter()
        .zip(&sums.data)
        .map(|(x, s)| if log { x - s.ln() } else { x.exp() / s })
        .collect();
    Nd::new(&r.dims, out)
}

#[test]
fn softmax_and_log_softmax_take_at_most_two_kernels() -> Result<()> {
    let (x, r) = random(1, &[32, 100]);
    for axis in [-1i64, 0] {
        let a = if axis < 0 { r.dims.len() - 1 } else { 0 };
        let y = x.softmax(axis)?;
        let n = kernels(&y)?;
        assert!(n <= 2, "softmax along {axis}: {n} kernels");
        assert_nd("softmax", &Nd::of(&y), &softmax_ref(&r, a, false), 1e-5);
        let y = x.log_softmax(axis)?;
        let n = kernels(&y)?;
        assert!(n <= 2, "log_softmax along {axis}: {n} kernels");
        assert_nd("log_softmax", &Nd::of(&y), &softmax_ref(&r, a, true), 1e-5);
    }
    Ok(())
}

#[test]
fn linear_layer_with_bias_and_relu_takes_at_most_two_kernels() -> Result<()> {
    let (x, xr) = random(2, &[16, 32]);
    let (w, wr) = random(3, &[32, 8]);
    let (b, br) = random(4, &[8]);
    let y = x.matmul(&w)?.add(&b)?.relu();
    let n = kernels(&y)?;
    assert!(n <= 2, "relu(x @ w + b): {n} kernels");
    let mm = xr.matmul(&wr);
    let want = Nd::from_fn(&[16, 8], |o| (mm.at(o) + br.at(&[o[1]])).max(0.0));
    assert_nd(
        "relu(x @ w + b)",
        &Nd::of(&y),
        &want,
        reduce_tol(DType::F32, 32),
    );
    Ok(())
}

#[test]
fn reductions_and_views_fuse_into_one_kernel() -> Result<()> {
    let (x, r) = random(5, &[8, 9, 10]);
    // A sum over a permuted view reads through the view: one kernel.
    let s = x.permute(&[2, 0, 1])?.sum(&[1], false)?;
    assert_eq!(kernels(&s)?, 1, "sum over a permuted view");
    assert_nd(
        "sum over permute",
        &Nd::of(&s),
        &r.permute(&[2, 0, 1])
            .reduce(&[1], false, |v| v.iter().sum()),
        reduce_tol(DType::F32, 8),
    );
    // A chain of views and an elementwise op: one kernel, no copies.
    let v = x
        .permute(&[1, 0, 2])?
        .flip(&[2])?
        .slice(0, Some(1), None, 2)?
        .pad(&[(1, 1)], 0.0)?
        .mul(2.0)?;
    assert_eq!(kernels(&v)?, 1, "views + mul");
    let want = r
        .permute(&[1, 0, 2])
        .flip(&[2])
        .slice(0, 1, 2, 4)
        .pad(&[(1, 1)], 0.0);
    assert_nd(
        "views + mul",
        &Nd::of(&v),
        &Nd::new(&want.dims, want.data.iter().map(|x| 2.0 * x).collect()),
        1e-6,
    );
    // cat is one kernel, matmul is one kernel.
    let c = Tensor::cat(&[&x, &x.flip(&[0])?], 1)?;
    assert_eq!(kernels(&c)?, 1, "cat");
    let m = x.matmul(&x.transpose(1, 2)?)?;
    assert_eq!(kernels(&m)?, 1, "batched matmul");
    // argmax: the max, then the first index reaching it.
    let am = x.argmax(1, false)?;
    let n = kernels(&am)?;
    assert!(n <= 2, "argmax: {n} kernels");
    let lse = x.logsumexp(&[-1], true)?;
    let n = kernels(&lse)?;
    assert!(n <= 2, "logsumexp: {n} kernels");
    Ok(())
}

#[test]
fn layer_norm_statistics_take_at_most_two_kernels() -> Result<()> {
    let (x, r) = random(6, &[16, 64]);
    let mean = x.mean(&[-1], true)?;
    let var = x.var_correction(Some(&[-1]), 0, true)?;
    let y = x.sub(&mean)?.div(var.add(1e-5)?.sqrt())?;
    let n = kernels(&y)?;
    assert!(n <= 2, "layer norm: {n} kernels");
    let m = r
        .reduce(&[1], true, |v| v.iter().sum::<f64>() / v.len() as f64)
        .expand(&r.dims);
    let d: Vec<f64> = r.data.iter().zip(&m.data).map(|(x, m)| x - m).collect();
    let v = Nd::new(&r.dims, d.iter().map(|x| x * x).collect())
        .reduce(&[1], true, |v| v.iter().sum::<f64>() / v.len() as f64)
        .expand(&r.dims);
    let want = Nd::new(
        &r.dims,
        d.iter()
            .zip(&v.data)
            .map(|(d, v)| d / (v + 1e-5).sqrt())
            .collect(),
    );
    assert_nd("layer norm", &Nd::of(&y), &want, reduce_tol(DType::F32, 64));
    // Mean and variance alone: one pass computes both.
    let n = Tensor::realize_all(&[&x.mean(&[-1], true)?, &x.var(&[-1], true)?])?.kernels;
    assert!(n <= 2, "mean + var: {n} kernels");
    Ok(())
}

/// GPT-2's input: token rows gathered from the table, the positions' rows added, and the
/// first layer norm, fused like any loads: at most two kernels (the row statistics and
/// the normalized rows; one on a GPU), with no one-hot selection and no gathered
/// intermediate in memory.
#[test]
fn embedding_positions_and_layer_norm_fuse() -> Result<()> {
    let (vocab, seq, width) = (5000, 24, 64);
    let (wte, rte) = random(40, &[vocab, width]);
    let (wpe, rpe) = random(41, &[seq, width]);
    let ids: Vec<i64> = (0..seq as i64)
        .map(|i| (i * 977 + 13) % vocab as i64)
        .collect();
    let idx = Tensor::from_vec(ids.clone(), [seq])?;
    let h = (&Tensor::embedding(&wte, &idx)? + &wpe)?;
    let mean = h.mean(&[-1], true)?;
    let centered = (&h - &mean)?;
    let y = (&centered * &(&(&centered * &centered)?.mean(&[-1], true)? + 1e-5)?.rsqrt())?;
    let n = kernels(&y)?;
    assert!(n <= 2, "embedding + positions + layer norm: {n} kernels");
    let want = Nd::from_fn(&[seq, width], |o| {
        let row: Vec<f64> = (0..width)
            .map(|c| rte.at(&[ids[o[0]] as usize, c]) + rpe.at(&[o[0], c]))
            .collect();
        let m = row.iter().sum::<f64>() / width as f64;
        let v = row.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / width as f64;
        (row[o[1]] - m) / (v + 1e-5).sqrt()
    });
    assert_nd(
        "embedding + layer norm",
        &Nd::of(&y),
        &want,
        reduce_tol(DType::F32, width),
    );
    Ok(())
}
