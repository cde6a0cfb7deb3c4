//! Reductions against independent f64 references: every op, every dtype it supports (and
//! the error for the others), odd, size-1, size-0 and 0-d shapes, negative axes, keepdim
//! both ways, and non-contiguous inputs.

use crate::common;
use crate::common::nd::{Nd, assert_nd, reduce_tol};
use crate::common::{Domain, Rng};
use tessel_tensor::{DType, Error, Result, Tensor};

/// Values of magnitude about 1 and small integers, so sums and products stay exact in the
/// integer dtypes and ties occur.
const SMALL: Domain = Domain::new((-1.0, 1.0), (-9, 9));

/// Shapes with every awkward feature: odd sizes, size-1 dims, a 3-d shape.
const SHAPES: [&[usize]; 4] = [&[45, 65], &[1, 1], &[7, 13, 3], &[5]];

/// The shapes to test `dtype` on: all of them for `f32`; the 3-d one, which has every
/// kind of axis list, for the others. (Each case compiles kernels of its own, so the
/// matrix is kept to what adds coverage.)
fn shapes_for(dtype: DType) -> &'static [&'static [usize]] {
    if dtype == DType::F32 {
        &SHAPES
    } else {
        &SHAPES[2..3]
    }
}

/// Axis lists to reduce over for a shape of `ndim` dims, as given (negative included) and
/// normalized.
fn axis_cases(ndim: usize) -> Vec<(Vec<i64>, Vec<usize>)> {
    let n = ndim as i64;
    let mut cases = vec![(vec![0], vec![0]), (vec![-1], vec![ndim - 1])];
    if ndim >= 2 {
        cases.push((vec![-1, 0], vec![0, ndim - 1]));
    }
    if ndim >= 3 {
        cases.push((vec![1], vec![1]));
        cases.push((vec![-n, 1, 2], vec![0, 1, 2]));
    }
    cases
}

/// The keepdim values to test for the `case`-th axis list: both for the first, then
/// alternating, which covers both on every shape at half the kernels.
fn keepdims(case: usize) -> &'static [bool] {
    match case {
        0 => &[false, true],
        c if c % 2 == 1 => &[true],
        _ => &[false],
    }
}

fn sum(v: &[f64]) -> f64 {
    v.iter().sum()
}

fn prod(v: &[f64]) -> f64 {
    v.iter().product()
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, |a, b| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    })
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, |a, b| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.min(b)
        }
    })
}

/// The first index of the maximum (`better(a, b)`: a beats b), NaN winning.
fn arg(v: &[f64], better: fn(f64, f64) -> bool) -> f64 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if v[best].is_nan() {
            break;
        }
        if x.is_nan() || better(x, v[best]) {
            best = i;
        }
    }
    best as f64
}

fn mean(v: &[f64]) -> f64 {
    sum(v) / v.len() as f64
}

fn var(v: &[f64], correction: usize) -> f64 {
    let m = mean(v);
    let ss: f64 = v.iter().map(|x| (x - m) * (x - m)).sum();
    ss / (v.len() as f64 - correction as f64).max(0.0)
}

fn logsumexp(v: &[f64]) -> f64 {
    let m = max(v);
    let m = if m.is_infinite() { 0.0 } else { m };
    v.iter().map(|x| (x - m).exp()).sum::<f64>().ln() + m
}

/// A random input of `dtype` and its values as the reference sees them.
fn input(seed: u64, dims: &[usize], dtype: DType) -> (Tensor, Nd) {
    let r = Nd::random(&mut Rng::new(seed), dtype, dims, SMALL);
    (r.tensor(dtype), r)
}

/// Uniform floats in `[lo, hi)`, exact in `dtype`.
fn floats(seed: u64, dtype: DType, dims: &[usize], lo: f64, hi: f64) -> Nd {
    Nd::random(
        &mut Rng::new(seed),
        dtype,
        dims,
        Domain::new((lo, hi), (0, 0)),
    )
}

/// Uniform integers in `lo..=hi`.
fn ints(seed: u64, dims: &[usize], lo: i64, hi: i64) -> Nd {
    Nd::random(
        &mut Rng::new(seed),
        DType::I64,
        dims,
        Domain::new((0.0, 0.0), (lo, hi)),
    )
}

fn reduced_len(dims: &[usize], axes: &[usize]) -> usize {
    axes.iter().map(|&a| dims[a]).product()
}

#[test]
fn sum_and_prod_every_dtype() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        let out_dtype = if dtype.is_float() { dtype } else { DType::I64 };
        for &dims in shapes_for(dtype) {
            let (t, r) = input(seed as u64, dims, dtype);
            for (case, (axes, norm)) in axis_cases(dims.len()).into_iter().enumerate() {
                for &keepdim in keepdims(case) {
                    let what = format!("sum {dtype} {dims:?} axes {axes:?} keepdim {keepdim}");
                    let got = t.sum(&axes, keepdim)?;
                    assert_eq!(got.dtype(), out_dtype, "{what}");
                    assert_nd(
                        &what,
                        &Nd::of(&got),
                        &r.reduce(&norm, keepdim, sum),
                        reduce_tol(dtype, reduced_len(dims, &norm)),
                    );
                }
            }
            let all = t.sum_all()?;
            assert_eq!(all.dims(), Vec::<usize>::new());
            assert_nd(
                &format!("sum_all {dtype} {dims:?}"),
                &Nd::of(&all),
                &r.reduce(&(0..dims.len()).collect::<Vec<_>>(), false, sum),
                reduce_tol(dtype, r.numel()),
            );
        }
        // Products stay small: factors near 1 (floats) or in {-1, 1, 2} (integers; |x| for
        // unsigned ones).
        let dims = [7, 13, 3];
        let data = if dtype.is_float() {
            floats(seed as u64, dtype, &dims, 0.5, 1.5)
        } else {
            let ints = ints(seed as u64, &dims, -1, 2);
            let fix = |x: f64| {
                if x == 0.0 {
                    1.0
                } else if dtype.is_signed() {
                    x
                } else {
                    x.abs()
                }
            };
            Nd::new(&dims, ints.data.iter().map(|&x| fix(x)).collect())
        };
        let t = data.tensor(dtype);
        let r = Nd::of(&t);
        for (axes, norm) in axis_cases(3) {
            if reduced_len(&dims, &norm) > 62 && !dtype.is_float() {
                continue; // Integer products of up to 62 factors of magnitude <= 2 fit in i64.
            }
            let got = t.prod(&axes, true)?;
            assert_eq!(got.dtype(), out_dtype);
            let tolerance = reduce_tol(dtype, reduced_len(&dims, &norm)) * 10.0;
            assert_nd(
                &format!("prod {dtype} axes {axes:?}"),
                &Nd::of(&got),
                &r.reduce(&norm, true, prod),
                tolerance,
            );
        }
    }
    Ok(())
}

#[test]
fn mean_var_std_floats_and_errors_for_others() -> Result<()> {
    for dtype in common::on_device(DType::ALL) {
        if !dtype.is_float() {
            let t = Nd::random(&mut Rng::new(1), dtype, &[3, 4], SMALL).tensor(dtype);
            for (name, res) in [
                ("mean", t.mean(&[0], false)),
                ("var", t.var(&[0], false)),
                ("std", t.std_all()),
                ("mean", t.mean_all()),
            ] {
                match res {
                    Err(e @ Error::UnsupportedDType { .. }) => {
                        let msg = e.to_string();
                        assert!(
                            msg.contains(name)
                                && msg.contains(&dtype.to_string())
                                && msg.contains(".cast(DType::F32)"),
                            "{msg}"
                        );
                    }
                    other => {
                        panic!("{name} on {dtype} should fail with UnsupportedDType, got {other:?}")
                    }
                }
            }
            continue;
        }
        for (seed, &dims) in shapes_for(dtype).iter().enumerate() {
            let (t, r) = input(seed as u64 + 10, dims, dtype);
            for (axes, norm) in axis_cases(dims.len()) {
                let n = reduced_len(dims, &norm);
                for keepdim in [false, true] {
                    let what = format!("{dtype} {dims:?} axes {axes:?} keepdim {keepdim}");
                    let got = t.mean(&axes, keepdim)?;
                    assert_eq!(got.dtype(), dtype);
                    assert_nd(
                        &format!("mean {what}"),
                        &Nd::of(&got),
                        &r.reduce(&norm, keepdim, mean),
                        reduce_tol(dtype, n),
                    );
                    let got = t.var(&axes, keepdim)?;
                    assert_nd(
                        &format!("var {what}"),
                        &Nd::of(&got),
                        &r.reduce(&norm, keepdim, |v| var(v, 1)),
                        reduce_tol(dtype, n),
                    );
                    let got = t.std(&axes, keepdim)?;
                    assert_nd(
                        &format!("std {what}"),
                        &Nd::of(&got),
                        &r.reduce(&norm, keepdim, |v| var(v, 1).sqrt()),
                        reduce_tol(dtype, n),
                    );
                    for correction in [0, 2] {
                        let got = t.var_correction(Some(&axes), correction, keepdim)?;
                        let want = r.reduce(&norm, keepdim, |v| var(v, correction));
                        assert_nd(
                            &format!("var correction {correction} {what}"),
                            &Nd::of(&got),
                            &want,
                            reduce_tol(dtype, n),
                        );
                        let got = t.std_correction(Some(&axes), correction, keepdim)?;
                        let want = r.reduce(&norm, keepdim, |v| var(v, correction).sqrt());
                        assert_nd(
                            &format!("std correction {correction} {what}"),
                            &Nd::of(&got),
                            &want,
                            reduce_tol(dtype, n),
                        );
                    }
                }
            }
            let every: Vec<usize> = (0..dims.len()).collect();
            let n = r.numel();
            assert_nd(
                "mean_all",
                &Nd::of(&t.mean_all()?),
                &r.reduce(&every, false, mean),
                reduce_tol(dtype, n),
            );
            assert_nd(
                "var_all",
                &Nd::of(&t.var_all()?),
                &r.reduce(&every, false, |v| var(v, 1)),
                reduce_tol(dtype, n),
            );
            assert_nd(
                "std_all",
                &Nd::of(&t.std_all()?),
                &r.reduce(&every, false, |v| var(v, 1).sqrt()),
                reduce_tol(dtype, n),
            );
            let got = t.var_correction(None, 0, true)?;
            assert_eq!(got.dims(), vec![1; dims.len()]);
            assert_nd(
                "var_correction(None)",
                &Nd::of(&got),
                &r.reduce(&every, true, |v| var(v, 0)),
                reduce_tol(dtype, n),
            );
        }
    }
    // One element with correction 1: 0 / 0, NaN as in torch.
    let one = Tensor::from_vec(vec![3.0f32], [1])?;
    assert!(one.var_all()?.item::<f32>()?.is_nan());
    Ok(())
}

#[test]
fn max_min_argmax_argmin_every_dtype() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        for &dims in shapes_for(dtype) {
            // Small integer ranges give plenty of ties for the first-index rule.
            let (t, r) = input(seed as u64 + 20, dims, dtype);
            for (case, (axes, norm)) in axis_cases(dims.len()).into_iter().enumerate() {
                for &keepdim in keepdims(case) {
                    let what = format!("{dtype} {dims:?} axes {axes:?} keepdim {keepdim}");
                    let got = t.max(&axes, keepdim)?;
                    assert_eq!(got.dtype(), dtype);
                    assert_nd(
                        &format!("max {what}"),
                        &Nd::of(&got),
                        &r.reduce(&norm, keepdim, max),
                        0.0,
                    );
                    let got = t.min(&axes, keepdim)?;
                    assert_nd(
                        &format!("min {what}"),
                        &Nd::of(&got),
                        &r.reduce(&norm, keepdim, min),
                        0.0,
                    );
                }
            }
            for axis in [0, -1, dims.len() as i64 - 1] {
                let a = if axis < 0 {
                    dims.len() - 1
                } else {
                    axis as usize
                };
                for keepdim in [false, true] {
                    let what = format!("{dtype} {dims:?} axis {axis} keepdim {keepdim}");
                    let got = t.argmax(axis, keepdim)?;
                    assert_eq!(got.dtype(), DType::I64);
                    assert_nd(
                        &format!("argmax {what}"),
                        &Nd::of(&got),
                        &r.reduce(&[a], keepdim, |v| arg(v, |x, y| x > y)),
                        0.0,
                    );
                    let got = t.argmin(axis, keepdim)?;
                    assert_nd(
                        &format!("argmin {what}"),
                        &Nd::of(&got),
                        &r.reduce(&[a], keepdim, |v| arg(v, |x, y| x < y)),
                        0.0,
                    );
                }
            }
            assert_eq!(t.max_all()?.to_scalars()?[0].to_f64(), max(&r.data));
            assert_eq!(t.min_all()?.to_scalars()?[0].to_f64(), min(&r.data));
            assert_eq!(
                t.argmax_all()?.item::<i64>()?,
                arg(&r.data, |x, y| x > y) as i64
            );
            assert_eq!(
                t.argmin_all()?.item::<i64>()?,
                arg(&r.data, |x, y| x < y) as i64
            );
        }
    }
    // NaN wins max/min and is the arg of both; ties give the first index.
    let t = Tensor::from_vec(
        vec![1.0f32, f32::NAN, 3.0, f32::NAN, 7.0, 7.0, -2.0, -2.0],
        [2, 4],
    )?;
    let max = t.max(&[1], false)?.to_vec::<f32>()?;
    assert!(max[0].is_nan() && max[1] == 7.0);
    assert!(t.min(&[1], false)?.to_vec::<f32>()?[0].is_nan());
    assert_eq!(t.argmax(1, false)?.to_vec::<i64>()?, vec![1, 0]);
    assert_eq!(t.argmin(1, false)?.to_vec::<i64>()?, vec![1, 2]);
    assert_eq!(t.argmax_all()?.item::<i64>()?, 1);
    let inf = Tensor::from_vec(vec![f32::NEG_INFINITY, f32::NEG_INFINITY], [2])?;
    assert_eq!(inf.argmax_all()?.item::<i64>()?, 0);
    // -0.0 equals +0.0 (the first wins), negative values order by magnitude reversed.
    let zeros = Tensor::from_vec(vec![-0.0f32, 0.0, -1.0, 0.0, -0.0, 1.0], [2, 3])?;
    assert_eq!(zeros.argmax(1, false)?.to_vec::<i64>()?, vec![0, 2]);
    assert_eq!(zeros.argmin(1, false)?.to_vec::<i64>()?, vec![2, 0]);
    let negative = Tensor::from_vec(vec![-3.0f32, -0.5, -2.0, -0.25], [4])?;
    assert_eq!(negative.argmax_all()?.item::<i64>()?, 3);
    assert_eq!(negative.argmin_all()?.item::<i64>()?, 0);
    // The argmax of a computed value (a product) is one of its maxima's indices.
    let a = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25, 1.5, -0.75], [2, 3])?;
    let b = Tensor::from_vec(vec![1.0f32, 0.5, -2.0, 0.25, 1.0, 3.0], [3, 2])?;
    assert_eq!(a.matmul(&b)?.argmax(1, false)?.to_vec::<i64>()?, vec![1, 1]);
    Ok(())
}

#[test]
fn any_all_every_dtype() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        for &dims in shapes_for(dtype) {
            // Mostly zeros, so both answers occur.
            let sparse = ints(seed as u64 + 30, dims, -12, 2);
            let data = Nd::new(
                dims,
                sparse
                    .data
                    .iter()
                    .map(|&x| if x < 0.0 { 0.0 } else { x })
                    .collect(),
            );
            let t = data.tensor(dtype);
            let r = Nd::of(&t);
            let any = |v: &[f64]| f64::from(u8::from(v.iter().any(|&x| x != 0.0)));
            let all = |v: &[f64]| f64::from(u8::from(v.iter().all(|&x| x != 0.0)));
            for (case, (axes, norm)) in axis_cases(dims.len()).into_iter().enumerate() {
                for &keepdim in keepdims(case) {
                    let what = format!("{dtype} {dims:?} axes {axes:?} keepdim {keepdim}");
                    let got = t.any(&axes, keepdim)?;
                    assert_eq!(got.dtype(), DType::Bool);
                    assert_nd(
                        &format!("any {what}"),
                        &Nd::of(&got),
                        &r.reduce(&norm, keepdim, any),
                        0.0,
                    );
                    let got = t.all(&axes, keepdim)?;
                    assert_nd(
                        &format!("all {what}"),
                        &Nd::of(&got),
                        &r.reduce(&norm, keepdim, all),
                        0.0,
                    );
                }
            }
            assert_eq!(t.any_all()?.item::<bool>()?, any(&r.data) == 1.0);
            assert_eq!(t.all_all()?.item::<bool>()?, all(&r.data) == 1.0);
        }
    }
    let nan = Tensor::from_vec(vec![0.0f32, f32::NAN], [2])?;
    assert!(nan.any_all()?.item::<bool>()?);
    Ok(())
}

#[test]
fn logsumexp_softmax_log_softmax() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        if !dtype.is_float() {
            let t = Nd::random(&mut Rng::new(2), dtype, &[3, 4], SMALL).tensor(dtype);
            for res in [t.softmax(-1), t.log_softmax(0)] {
                assert!(
                    matches!(res, Err(Error::UnsupportedDType { .. })),
                    "softmax of {dtype}: {res:?}"
                );
            }
            // logsumexp promotes to f32, like torch.logsumexp of an integer tensor.
            let got = t.logsumexp(&[1], false)?;
            assert_eq!(got.dtype(), DType::F32);
            let r = Nd::of(&t);
            assert_nd(
                &format!("logsumexp {dtype}"),
                &Nd::of(&got),
                &r.reduce(&[1], false, logsumexp),
                1e-5,
            );
            continue;
        }
        let probe = floats(seed as u64 + 40, dtype, &[2], -1.0, 1.0).tensor(dtype);
        if common::skipped(&probe.exp(), &format!("exp on {dtype}")) {
            continue;
        }
        for &dims in shapes_for(dtype) {
            // A wider range shows the max subtraction at work.
            let t = floats(seed as u64 + 40, dtype, dims, -30.0, 30.0).tensor(dtype);
            let r = Nd::of(&t);
            for (case, (axes, norm)) in axis_cases(dims.len()).into_iter().enumerate() {
                for &keepdim in keepdims(case) {
                    let got = t.logsumexp(&axes, keepdim)?;
                    let what =
                        format!("logsumexp {dtype} {dims:?} axes {axes:?} keepdim {keepdim}");
                    assert_nd(
                        &what,
                        &Nd::of(&got),
                        &r.reduce(&norm, keepdim, logsumexp),
                        reduce_tol(dtype, reduced_len(dims, &norm)),
                    );
                }
            }
            for axis in [0, -1] {
                let a = if axis < 0 { dims.len() - 1 } else { 0 };
                let n = dims[a];
                let lse = r.reduce(&[a], true, logsumexp).expand(dims);
                let want_log = Nd::new(
                    dims,
                    r.data.iter().zip(&lse.data).map(|(x, l)| x - l).collect(),
                );
                let want = Nd::new(dims, want_log.data.iter().map(|x| x.exp()).collect());
                let got = t.softmax(axis)?;
                assert_eq!(got.dtype(), dtype);
                assert_nd(
                    &format!("softmax {dtype} {dims:?} axis {axis}"),
                    &Nd::of(&got),
                    &want,
                    reduce_tol(dtype, n),
                );
                let got = t.log_softmax(axis)?;
                assert_nd(
                    &format!("log_softmax {dtype} {dims:?} axis {axis}"),
                    &Nd::of(&got),
                    &want_log,
                    reduce_tol(dtype, n),
                );
            }
        }
    }
    // torch's guards: all -inf gives -inf, a +inf gives +inf, and huge values don't overflow.
    let t = Tensor::from_vec(
        vec![
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::INFINITY,
            0.0,
            1000.0,
            1000.0,
        ],
        [3, 2],
    )?;
    let got = t.logsumexp(&[1], false)?.to_vec::<f32>()?;
    assert_eq!(&got[..2], &[f32::NEG_INFINITY, f32::INFINITY]);
    assert!((got[2] - (1000.0 + 2f32.ln())).abs() < 1e-3);
    let sm = Tensor::from_vec(vec![1000.0f32, 1000.0, -1000.0, 0.0], [2, 2])?
        .softmax(1)?
        .to_vec::<f32>()?;
    assert_eq!(sm, vec![0.5, 0.5, 0.0, 1.0]);
    Ok(())
}

#[test]
fn reductions_of_views() -> Result<()> {
    let base = floats(50, DType::F32, &[6, 9, 5], -1.0, 1.0);
    let t = base.tensor(DType::F32);
    let base = Nd::of(&t);
    // Each view and its reference: permuted, padded, flipped, sliced, and all four.
    let views: Vec<(&str, Tensor, Nd)> = vec![
        ("permute", t.permute(&[2, 0, 1])?, base.permute(&[2, 0, 1])),
        (
            "pad",
            t.pad(&[(2, 1), (0, 3)], 0.5)?,
            base.pad(&[(2, 1), (0, 3)], 0.5),
        ),
        ("flip", t.flip(&[0, 2])?, base.flip(&[0, 2])),
        (
            "slice",
            t.slice(1, Some(1), Some(-1), 3)?,
            base.slice(1, 1, 3, 3),
        ),
        (
            "chain",
            t.permute(&[1, 2, 0])?
                .flip(&[1])?
                .pad(&[(1, -1)], -0.25)?
                .slice(0, None, None, 2)?,
            base.permute(&[1, 2, 0])
                .flip(&[1])
                .pad(&[(1, -1)], -0.25)
                .slice(0, 0, 2, 5),
        ),
    ];
    for (name, v, r) in &views {
        assert_eq!(v.dims(), r.dims, "{name}");
        for (axes, norm) in axis_cases(3) {
            for keepdim in [false, true] {
                let n = reduced_len(&r.dims, &norm);
                let what = format!("{name} axes {axes:?} keepdim {keepdim}");
                assert_nd(
                    &format!("sum {what}"),
                    &Nd::of(&v.sum(&axes, keepdim)?),
                    &r.reduce(&norm, keepdim, sum),
                    reduce_tol(DType::F32, n),
                );
                assert_nd(
                    &format!("mean {what}"),
                    &Nd::of(&v.mean(&axes, keepdim)?),
                    &r.reduce(&norm, keepdim, mean),
                    reduce_tol(DType::F32, n),
                );
                assert_nd(
                    &format!("var {what}"),
                    &Nd::of(&v.var(&axes, keepdim)?),
                    &r.reduce(&norm, keepdim, |x| var(x, 1)),
                    reduce_tol(DType::F32, n),
                );
                assert_nd(
                    &format!("max {what}"),
                    &Nd::of(&v.max(&axes, keepdim)?),
                    &r.reduce(&norm, keepdim, max),
                    0.0,
                );
                assert_nd(
                    &format!("prod {what}"),
                    &Nd::of(&v.prod(&axes, keepdim)?),
                    &r.reduce(&norm, keepdim, prod),
                    reduce_tol(DType::F32, n),
                );
                let lse = v.logsumexp(&axes, keepdim)?;
                assert_nd(
                    &format!("logsumexp {what}"),
                    &Nd::of(&lse),
                    &r.reduce(&norm, keepdim, logsumexp),
                    reduce_tol(DType::F32, n),
                );
                assert_nd(
                    &format!("min {what}"),
                    &Nd::of(&v.min(&axes, keepdim)?),
                    &r.reduce(&norm, keepdim, min),
                    0.0,
                );
                assert_nd(
                    &format!("std {what}"),
                    &Nd::of(&v.std_correction(Some(&axes), 0, keepdim)?),
                    &r.reduce(&norm, keepdim, |x| var(x, 0).sqrt()),
                    reduce_tol(DType::F32, n),
                );
                let any = |x: &[f64]| f64::from(u8::from(x.iter().any(|&x| x > 0.9)));
                let big = v.gt(0.9)?;
                assert_nd(
                    &format!("any {what}"),
                    &Nd::of(&big.any(&axes, keepdim)?),
                    &r.reduce(&norm, keepdim, any),
                    0.0,
                );
                let all = |x: &[f64]| f64::from(u8::from(x.iter().all(|&x| x > -0.9)));
                assert_nd(
                    &format!("all {what}"),
                    &Nd::of(&v.gt(-0.9)?.all(&axes, keepdim)?),
                    &r.reduce(&norm, keepdim, all),
                    0.0,
                );
            }
        }
        for axis in 0..3 {
            let what = format!("{name} axis {axis}");
            let got = v.argmax(axis, false)?;
            assert_nd(
                &format!("argmax {what}"),
                &Nd::of(&got),
                &r.reduce(&[axis as usize], false, |x| arg(x, |a, b| a > b)),
                0.0,
            );
            let got = v.argmin(axis, true)?;
            assert_nd(
                &format!("argmin {what}"),
                &Nd::of(&got),
                &r.reduce(&[axis as usize], true, |x| arg(x, |a, b| a < b)),
                0.0,
            );
            let lse = r.reduce(&[axis as usize], true, logsumexp).expand(&r.dims);
            let want = Nd::new(
                &r.dims,
                r.data
                    .iter()
                    .zip(&lse.data)
                    .map(|(x, l)| (x - l).exp())
                    .collect(),
            );
            assert_nd(
                &format!("softmax {what}"),
                &Nd::of(&v.softmax(axis)?),
                &want,
                1e-5,
            );
            let want_log = Nd::new(&r.dims, want.data.iter().map(|x| x.ln()).collect());
            assert_nd(
                &format!("log_softmax {what}"),
                &Nd::of(&v.log_softmax(axis)?),
                &want_log,
                1e-5,
            );
        }
    }
    Ok(())
}

#[test]
fn zero_d_and_empty_inputs() -> Result<()> {
    // 0-d: axis 0 and -1 are allowed and reduce nothing; the _all forms give the value.
    let s = Tensor::from_vec(vec![2.5f32], Vec::<usize>::new())?;
    for axes in [&[0i64][..], &[-1]] {
        assert_eq!(s.sum(axes, false)?.item::<f32>()?, 2.5);
        assert_eq!(s.max(axes, true)?.dims(), Vec::<usize>::new());
    }
    assert_eq!(s.sum_all()?.item::<f32>()?, 2.5);
    assert_eq!(s.argmax(0, false)?.item::<i64>()?, 0);
    assert_eq!(s.argmin_all()?.item::<i64>()?, 0);
    assert_eq!(s.softmax(0)?.item::<f32>()?, 1.0);
    assert_eq!(s.log_softmax(-1)?.item::<f32>()?, 0.0);
    assert_eq!(s.logsumexp(&[0], false)?.item::<f32>()?, 2.5);
    assert!(s.var_all()?.item::<f32>()?.is_nan());
    assert!(s.sum(&[1], false).is_err());

    // Size-0 dims: sums are 0, products 1, any false, all true, means NaN.
    let e = Tensor::from_vec(Vec::<f32>::new(), [4, 0, 3])?;
    assert_eq!(e.sum(&[1], false)?.to_vec::<f32>()?, vec![0.0; 12]);
    assert_eq!(e.sum(&[1], true)?.dims(), vec![4, 1, 3]);
    let empty = e.sum(&[0], false)?;
    assert_eq!((empty.dims(), empty.to_vec::<f32>()?), (vec![0, 3], vec![]));
    assert_eq!(e.sum_all()?.item::<f32>()?, 0.0);
    assert_eq!(e.prod(&[1], false)?.to_vec::<f32>()?, vec![1.0; 12]);
    assert_eq!(e.any(&[1], false)?.to_vec::<bool>()?, vec![false; 12]);
    assert_eq!(e.all(&[1], false)?.to_vec::<bool>()?, vec![true; 12]);
    assert!(
        e.mean(&[1], false)?
            .to_vec::<f32>()?
            .iter()
            .all(|x| x.is_nan())
    );
    assert_eq!(
        e.logsumexp(&[1], false)?.to_vec::<f32>()?,
        vec![f32::NEG_INFINITY; 12]
    );
    let sm = e.softmax(1)?;
    assert_eq!((sm.dims(), sm.to_vec::<f32>()?), (vec![4, 0, 3], vec![]));
    // max/min/argmax over an empty axis have no value: an error, as in torch.
    for (name, res) in [
        ("max", e.max(&[1], false)),
        ("min", e.min(&[-2], true)),
        ("argmax", e.argmax(1, false)),
        ("argmin", e.argmin(1, false)),
        ("max", e.max_all()),
        ("argmax", e.argmax_all()),
    ] {
        let msg = res.expect_err(name).to_string();
        assert!(
            msg.starts_with(name) && msg.contains("[4, 0, 3]") && msg.contains("size 0"),
            "{msg}"
        );
    }
    // A non-empty axis of an empty tensor is fine.
    let m = e.max(&[0], false)?;
    assert_eq!((m.dims(), m.to_vec::<f32>()?), (vec![0, 3], vec![]));
    let ie = Tensor::from_vec(Vec::<i32>::new(), [0])?;
    assert_eq!(ie.sum_all()?.item::<i64>()?, 0);
    assert_eq!(ie.prod_all()?.item::<i64>()?, 1);
    Ok(())
}

#[test]
fn reduction_errors_name_the_op_and_shape() -> Result<()> {
    let t = Tensor::from_vec(vec![1.0f32; 6], [2, 3])?;
    let cases = [
        (
            "sum",
            t.sum(&[2], false),
            "axis 2 is out of range for shape [2, 3]",
        ),
        (
            "mean",
            t.mean(&[-3], false),
            "axis -3 is out of range for shape [2, 3]",
        ),
        ("max", t.max(&[0, -2], false), "more than once"),
        ("argmax", t.argmax(5, false), "out of range"),
        ("softmax", t.softmax(2), "out of range"),
        ("var", t.var(&[1, 1], true), "more than once"),
        ("logsumexp", t.logsumexp(&[9], true), "out of range"),
    ];
    for (op, res, fragment) in cases {
        let msg = res.expect_err(op).to_string();
        assert!(msg.starts_with(op) && msg.contains(fragment), "{op}: {msg}");
    }
    let msg = Tensor::from_vec(vec![1i32, 2], [2])?
        .mean_all()
        .expect_err("mean of ints")
        .to_string();
    assert_eq!(
        msg,
        "mean is not supported for i32; it needs a floating-point input, as in PyTorch; cast first, e.g. .cast(DType::F32)"
    );
    Ok(())
}

/// Rows long enough that GPUs also try the cooperative kernels (a workgroup per row,
/// partial results combined in local memory), which must agree with the references: sums,
/// maxima with a NaN, means, variances, softmax and logsumexp of 3 × 3000 values, in f32
/// and f16 (accumulated in f32).
#[test]
fn long_rows_reduce_alike_on_every_device() -> Result<()> {
    const COLS: usize = 3000;
    for dtype in common::on_device([DType::F32, DType::F16]) {
        let mut x = floats(31, dtype, &[3, COLS], -3.0, 3.0);
        x.data[COLS + 17] = f64::NAN;
        let t = x.tensor(dtype);
        let rows: Vec<&[f64]> = x.data.chunks(COLS).collect();
        let tol = reduce_tol(dtype, COLS);
        let per_row = |f: &dyn Fn(&[f64]) -> f64| Nd {
            dims: vec![3],
            data: rows.iter().map(|r| f(r)).collect(),
        };
        let sum_t = t.sum(&[1], false)?;
        if common::skipped(&sum_t, "long rows") {
            continue;
        }
        assert_nd("sum", &Nd::of(&sum_t), &per_row(&sum), tol);
        assert_nd("max", &Nd::of(&t.max(&[1], false)?), &per_row(&max), 0.0);
        assert_nd("mean", &Nd::of(&t.mean(&[1], false)?), &per_row(&mean), tol);
        assert_nd(
            "var",
            &Nd::of(&t.var(&[1], false)?),
            &per_row(&|r| var(r, 1)),
            tol,
        );
        assert_nd(
            "logsumexp",
            &Nd::of(&t.logsumexp(&[1], false)?),
            &per_row(&logsumexp),
            tol,
        );
        let softmax: Vec<f64> = rows
            .iter()
            .flat_map(|r| {
                let l = logsumexp(r);
                r.iter().map(move |v| (v - l).exp())
            })
            .collect();
        let want = Nd {
            dims: vec![3, COLS],
            data: softmax,
        };
        assert_nd("softmax", &Nd::of(&t.softmax(1)?), &want, tol);
    }
    Ok(())
}

/// Reductions over many leading rows run in blocks of 64 rows, then over the blocks (twice
/// where there are enough blocks): rows that are not a multiple of 64 are padded with the
/// op's identity, half sums accumulate in f32, and every op and `keepdim` agrees with one
/// pass over the rows.
#[test]
fn long_leading_reductions_run_in_blocks() -> Result<()> {
    let dtypes = common::on_device([DType::F32, DType::BF16, DType::I32]);
    for (seed, &dtype) in dtypes.iter().enumerate() {
        // 3001 rows: padded to 3008, 47 blocks; 70001 rows of one column: 1094 blocks of
        // blocks, then 18.
        for dims in [&[3001usize, 2, 3][..], &[70001, 1]] {
            let (t, r) = input(seed as u64 + 40, dims, dtype);
            let n = dims[0];
            let what = |op: &str| format!("{op} {dtype} {dims:?} over axis 0");
            let got = t.sum(&[0], false)?;
            assert_nd(
                &what("sum"),
                &Nd::of(&got),
                &r.reduce(&[0], false, sum),
                reduce_tol(dtype, n),
            );
            let got = t.max(&[0], true)?;
            assert_nd(&what("max"), &Nd::of(&got), &r.reduce(&[0], true, max), 0.0);
            let got = t.min(&[0], false)?;
            assert_nd(
                &what("min"),
                &Nd::of(&got),
                &r.reduce(&[0], false, min),
                0.0,
            );
            if dtype.is_float() {
                let got = t.mean(&[0], false)?;
                assert_nd(
                    &what("mean"),
                    &Nd::of(&got),
                    &r.reduce(&[0], false, mean),
                    reduce_tol(dtype, n),
                );
            }
            let all = t.sum_all()?;
            let axes: Vec<usize> = (0..dims.len()).collect();
            assert_nd(
                &what("sum_all"),
                &Nd::of(&all),
                &r.reduce(&axes, false, sum),
                reduce_tol(dtype, r.numel()),
            );
        }
    }
    Ok(())
}

/// A product compared with reductions of itself, on rows of 2048 sums of 64 products (sums
/// whose bits depend on the order they add in): `x == max(x)` marks a maximum in every row,
/// `topk` by radix selection returns each row's largest values with indices that hold them,
/// and `max`'s gradient lands on the maximum's column. Each needs every kernel reading `x`
/// to see the same bits, which the planner gives by computing such a sum once.
#[test]
fn a_product_compared_with_its_own_reductions() -> Result<()> {
    if common::on_device([DType::F32]).is_empty() {
        return Ok(());
    }
    let (m, k, n) = (4, 64, 2048);
    let mut rng = Rng::new(91);
    let mut values =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.uniform(-1.0, 1.0) as f32).collect() };
    let (av, bv) = (values(m * k), values(k * n));
    let a = Tensor::from_vec(av, [m, k])?;
    let b = Tensor::from_vec(bv.clone(), [k, n])?;
    Tensor::realize_all(&[&a, &b])?;
    // The f64 product, row-major [m, n].
    let reference: Vec<f64> = {
        let (a, b) = (a.to_vec::<f32>()?, &bv);
        (0..m * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                (0..k)
                    .map(|j| f64::from(a[r * k + j]) * f64::from(b[j * n + c]))
                    .sum()
            })
            .collect()
    };
    let x = a.matmul(&b)?;

    let hits = x.eq(&x.max(&[-1], true)?)?.to_vec::<bool>()?;
    for row in 0..m {
        assert!(
            hits[row * n..(row + 1) * n].iter().any(|&h| h),
            "row {row}: no element equals the row's maximum"
        );
    }

    let top = 5;
    let (v, i) = x.topk(top, -1, true, true)?;
    let (v, i) = (v.to_vec::<f32>()?, i.to_vec::<i64>()?);
    for row in 0..m {
        let mut want: Vec<f64> = reference[row * n..(row + 1) * n].to_vec();
        want.sort_by(|p, q| q.total_cmp(p));
        for t in 0..top {
            let (got, at) = (f64::from(v[row * top + t]), i[row * top + t] as usize);
            assert!(
                (got - want[t]).abs() <= 1e-4 && (reference[row * n + at] - got).abs() <= 1e-4,
                "topk row {row} place {t}: {got} at {at}, the f64 product's is {} (there {})",
                want[t],
                reference[row * n + at]
            );
        }
    }

    let g = tessel_tensor::grad(&x.max(&[-1], false)?.sum_all()?, &[&a])?;
    let g = g[0].to_vec::<f32>()?;
    for row in 0..m {
        let at = (0..n)
            .max_by(|&p, &q| reference[row * n + p].total_cmp(&reference[row * n + q]))
            .expect("n > 0");
        for j in 0..k {
            let (got, want) = (g[row * k + j], bv[j * n + at]);
            assert!(
                (got - want).abs() <= 1e-6,
                "max's gradient row {row}, column {j}: {got}, want b[{j}, {at}] = {want}"
            );
        }
    }
    Ok(())
}
