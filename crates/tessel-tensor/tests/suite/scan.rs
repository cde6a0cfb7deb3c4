//! Scans (`cumsum`, `cumprod`, `cummax`, `cummin`, `logcumsumexp`) against f64 references:
//! every dtype, every axis of a 3-d shape, short axes (the triangular window) and long ones
//! (the two-level split), ties, NaN and infinities, permuted inputs, size-0/1 and 0-d
//! shapes, and errors.

use crate::common;
use crate::common::nd::{Nd, assert_nd, reduce_tol};
use crate::common::{Domain, Rng};
use tessel_tensor::{DType, Result, Tensor};

/// Applies `f` to every row of `x` along `axis` (a row of `x.dims[axis]` values), giving
/// rows of `out_len` values in the result.
pub(crate) fn along(x: &Nd, axis: usize, out_len: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Nd {
    let n = x.dims[axis];
    let mut out_dims = x.dims.clone();
    out_dims[axis] = out_len;
    let mut base_dims = x.dims.clone();
    base_dims[axis] = 1;
    let mut out = Nd::new(&out_dims, vec![0.0; out_dims.iter().product()]);
    let out_strides = common::nd::strides(&out_dims);
    let base_count: usize = base_dims.iter().product();
    for flat in 0..base_count {
        let mut coord = common::nd::unravel(flat, &base_dims);
        let row: Vec<f64> = (0..n)
            .map(|k| {
                coord[axis] = k;
                x.at(&coord)
            })
            .collect();
        let res = f(&row);
        assert_eq!(res.len(), out_len);
        for (k, v) in res.into_iter().enumerate() {
            coord[axis] = k;
            let at: usize = coord.iter().zip(&out_strides).map(|(c, s)| c * s).sum();
            out.data[at] = v;
        }
    }
    out
}

fn prefix(row: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    (0..row.len()).map(|i| f(&row[..=i])).collect()
}

/// torch's cummax/cummin kernel: `isnan(x) || (!isnan(best) && x >= best)` replaces the
/// best, so ties and repeated NaNs take the latest index.
fn cum_extreme(row: &[f64], max: bool) -> (Vec<f64>, Vec<f64>) {
    let (mut best, mut at) = (row.first().copied().unwrap_or(0.0), 0usize);
    let mut vals = Vec::new();
    let mut idx = Vec::new();
    for (i, &x) in row.iter().enumerate() {
        let better = if max { x >= best } else { x <= best };
        if x.is_nan() || (!best.is_nan() && better) {
            best = x;
            at = i;
        }
        vals.push(best);
        idx.push(at as f64);
    }
    (vals, idx)
}

fn logsumexp(v: &[f64]) -> f64 {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    let safe = if m.is_infinite() { 0.0 } else { m };
    safe + v.iter().map(|x| (x - safe).exp()).sum::<f64>().ln()
}

/// The result dtype of cumsum/cumprod.
fn acc_dtype(dtype: DType) -> DType {
    if dtype.is_float() { dtype } else { DType::I64 }
}

/// Random data of `dims` in `dtype` with some NaN and infinities mixed into float inputs.
fn data(seed: u64, dtype: DType, dims: &[usize], domain: Domain, specials: bool) -> Nd {
    let mut rng = Rng::new(seed);
    let mut x = Nd::random(&mut rng, dtype, dims, domain);
    if specials && dtype.is_float() {
        for v in &mut x.data {
            match rng.int(0, 40) {
                0 => *v = f64::NAN,
                1 => *v = f64::INFINITY,
                2 => *v = f64::NEG_INFINITY,
                3 => *v = -0.0,
                _ => {}
            }
        }
    }
    x
}

/// The cases every scan runs: (dims, axis as given, normalized axis). The 300-long axis
/// takes the two-level path.
/// The cases to test `dtype` on: all for `f32`, one short and one long (two-level) axis
/// for the others (each case compiles kernels of its own).
fn cases(dtype: DType) -> Vec<(&'static [usize], i64, usize)> {
    if dtype == DType::F32 {
        CASES.to_vec()
    } else {
        vec![CASES[1], CASES[3]]
    }
}

const CASES: [(&[usize], i64, usize); 5] = [
    (&[4, 7, 3], 0, 0),
    (&[4, 7, 3], 1, 1),
    (&[4, 7, 3], -1, 2),
    (&[2, 300], -1, 1),
    (&[300, 2], 0, 0),
];

#[test]
fn cumsum_and_cumprod_every_dtype() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        for (dims, dim, axis) in cases(dtype) {
            let what = format!("{dtype} {dims:?} dim {dim}");
            let x = data(
                seed as u64,
                dtype,
                dims,
                Domain::new((-1.0, 1.0), (-9, 9)),
                false,
            );
            let t = x.tensor(dtype);
            let s = t.cumsum(dim)?;
            assert_eq!(s.dtype(), acc_dtype(dtype), "cumsum {what}");
            let want = along(&x, axis, dims[axis], |r| prefix(r, |p| p.iter().sum()));
            assert_nd(
                &format!("cumsum {what}"),
                &Nd::of(&s),
                &want,
                reduce_tol(dtype, dims[axis]),
            );

            // Factors near 1 (and -1, 0, 1 for integers) keep products in range.
            let x = data(
                seed as u64 + 50,
                dtype,
                dims,
                Domain::new((0.9, 1.1), (-1, 1)),
                false,
            );
            let p = x.tensor(dtype).cumprod(dim)?;
            assert_eq!(p.dtype(), acc_dtype(dtype), "cumprod {what}");
            let want = along(&x, axis, dims[axis], |r| prefix(r, |p| p.iter().product()));
            assert_nd(
                &format!("cumprod {what}"),
                &Nd::of(&p),
                &want,
                reduce_tol(dtype, dims[axis]),
            );
        }
    }
    Ok(())
}

#[test]
fn cummax_cummin_ties_nan_and_latest_index() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        for (dims, dim, axis) in cases(dtype) {
            let what = format!("{dtype} {dims:?} dim {dim}");
            // Quantized values and a small integer range make ties common.
            let domain = Domain::new((-2.0, 2.0), (-3, 3)).quantized(0.5);
            let x = data(100 + seed as u64, dtype, dims, domain, true);
            let t = x.tensor(dtype);
            for max in [true, false] {
                let (v, i) = if max { t.cummax(dim)? } else { t.cummin(dim)? };
                assert_eq!(v.dtype(), dtype, "{what}");
                assert_eq!(i.dtype(), DType::I64, "{what}");
                let want_v = along(&x, axis, dims[axis], |r| cum_extreme(r, max).0);
                let want_i = along(&x, axis, dims[axis], |r| cum_extreme(r, max).1);
                let name = if max { "cummax" } else { "cummin" };
                assert_nd(&format!("{name} values {what}"), &Nd::of(&v), &want_v, 0.0);
                assert_nd(&format!("{name} indices {what}"), &Nd::of(&i), &want_i, 0.0);
            }
        }
    }
    Ok(())
}

#[test]
fn logcumsumexp_floats_stable_and_errors_for_others() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        if !dtype.is_float() {
            let t = common::tensor(dtype, &[1.0, 0.0], &[2]);
            common::assert_err(
                &format!("logcumsumexp {dtype}"),
                t.logcumsumexp(0),
                common::unsupported("logcumsumexp", dtype),
                &["logcumsumexp", "cast"],
            );
            continue;
        }
        let probe = common::tensor(dtype, &[1.0], &[1]).logcumsumexp(0)?;
        if common::skipped(&probe, &format!("logcumsumexp on {dtype}")) {
            continue;
        }
        let tol = common::tolerance(dtype, true).max(1e-9) * 10.0;
        for (dims, dim, axis) in cases(dtype) {
            let what = format!("{dtype} {dims:?} dim {dim}");
            let x = data(
                200 + seed as u64,
                dtype,
                dims,
                Domain::new((-5.0, 5.0), (0, 0)),
                true,
            );
            let r = x.tensor(dtype).logcumsumexp(dim)?;
            assert_eq!(r.dtype(), dtype);
            let want = along(&x, axis, dims[axis], |r| prefix(r, logsumexp));
            assert_nd(&format!("logcumsumexp {what}"), &Nd::of(&r), &want, tol);
        }
        // Large magnitudes: a naive log(cumsum(exp)) overflows (or underflows) here.
        let big = if dtype == DType::F16 {
            60_000.0
        } else {
            1000.0
        };
        let t = common::tensor(dtype, &[-big, big, big, -big], &[4]);
        let got = common::read(&t.logcumsumexp(0)?);
        let want = [-big, big, big + 2f64.ln(), big + 2f64.ln()];
        common::assert_close(&format!("logcumsumexp large {dtype}"), &got, &want, 1e-2);
    }
    Ok(())
}

#[test]
fn scans_of_views_sizes_0_and_1_and_0d() -> Result<()> {
    let mut rng = Rng::new(7);
    // A permuted input: the scan runs along what is a strided axis in memory.
    let x = Nd::random(&mut rng, DType::F32, &[9, 5], common::DEFAULT);
    let t = x.tensor(DType::F32).permute(&[1, 0])?;
    let xp = x.permute(&[1, 0]);
    let want = along(&xp, 1, 9, |r| prefix(r, |p| p.iter().sum()));
    assert_nd("cumsum permuted", &Nd::of(&t.cumsum(1)?), &want, 1e-4);
    let (v, i) = t.cummax(0)?;
    assert_nd(
        "cummax permuted",
        &Nd::of(&v),
        &along(&xp, 0, 5, |r| cum_extreme(r, true).0),
        0.0,
    );
    assert_nd(
        "cummax idx permuted",
        &Nd::of(&i),
        &along(&xp, 0, 5, |r| cum_extreme(r, true).1),
        0.0,
    );
    // A sliced long input, through the two-level path.
    let x = Nd::random(&mut rng, DType::F32, &[2, 700], common::DEFAULT);
    let t = x.tensor(DType::F32).slice(1, Some(1), None, 2)?;
    let xs = x.slice(1, 1, 2, 350);
    let want = along(&xs, 1, 350, |r| prefix(r, |p| p.iter().sum()));
    assert_nd(
        "cumsum sliced",
        &Nd::of(&t.cumsum(-1)?),
        &want,
        reduce_tol(DType::F32, 350),
    );

    for dims in [&[0usize, 4][..], &[3, 0], &[1, 1], &[4, 1]] {
        let x = Nd::random(&mut rng, DType::F32, dims, common::DEFAULT);
        let t = x.tensor(DType::F32);
        for (axis, &n) in dims.iter().enumerate() {
            let s = t.cumsum(axis as i64)?;
            assert_nd(
                "cumsum small",
                &Nd::of(&s),
                &along(&x, axis, n, |r| prefix(r, |p| p.iter().sum())),
                1e-6,
            );
            let (v, i) = t.cummin(axis as i64)?;
            assert_nd(
                "cummin small",
                &Nd::of(&v),
                &along(&x, axis, n, |r| cum_extreme(r, false).0),
                0.0,
            );
            assert_nd(
                "cummin idx small",
                &Nd::of(&i),
                &along(&x, axis, n, |r| cum_extreme(r, false).1),
                0.0,
            );
            let l = t.logcumsumexp(axis as i64)?;
            assert_nd(
                "logcumsumexp small",
                &Nd::of(&l),
                &along(&x, axis, n, |r| prefix(r, logsumexp)),
                1e-5,
            );
        }
    }
    let s = Tensor::scalar(2.5f32);
    assert_eq!(s.cumsum(0)?.dims(), Vec::<usize>::new());
    assert_eq!(s.cumprod(-1)?.item::<f32>()?, 2.5);
    let (v, i) = s.cummax(0)?;
    assert_eq!((v.item::<f32>()?, i.item::<i64>()?), (2.5, 0));
    Ok(())
}

#[test]
fn short_scans_fuse_and_long_ones_take_few_kernels() -> Result<()> {
    let mut rng = Rng::new(21);
    let x = Nd::random(&mut rng, DType::F32, &[8, 100], common::DEFAULT);
    // The triangular window is one reduction: one kernel.
    let n = x.tensor(DType::F32).cumsum(-1)?.realize()?.kernels;
    assert_eq!(n, 1, "cumsum of a 100-long axis: {n} kernels");
    let x = Nd::random(&mut rng, DType::F32, &[2, 1000], common::DEFAULT);
    // Two levels: the block scans, the scan of block totals, and the combination; the
    // measured plan may instead copy one of the views between them out on its own (the
    // split-views partition, chosen on PoCL once), one kernel more.
    let n = x.tensor(DType::F32).cumsum(-1)?.realize()?.kernels;
    assert!(n <= 4, "cumsum of a 1000-long axis: {n} kernels");
    Ok(())
}

#[test]
fn scan_errors_name_the_op_and_shape() {
    let t = Tensor::zeros([2, 3], DType::F32);
    for (name, res) in [
        ("cumsum", t.cumsum(2)),
        ("cumprod", t.cumprod(-3)),
        ("cummax", t.cummax(5).map(|p| p.0)),
        ("cummin", t.cummin(2).map(|p| p.0)),
        ("logcumsumexp", t.logcumsumexp(2)),
    ] {
        common::assert_err(name, res, common::shape_error, &[name, "[2, 3]"]);
    }
    common::assert_err(
        "cumsum of 0-d with dim 1",
        Tensor::scalar(1.0f32).cumsum(1),
        common::shape_error,
        &["cumsum"],
    );
}

/// `f(acc, x)` run along the row: the running reference of a scan.
fn running(row: &[f64], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::with_capacity(row.len());
    for &x in row {
        out.push(out.last().map_or(x, |&acc| f(acc, x)));
    }
    out
}

/// `log(exp(a) + exp(b))` in `f64`, as `torch.logaddexp` (NaN in, NaN out).
fn log_add_exp(a: f64, b: f64) -> f64 {
    let m = a.max(b);
    if a.is_nan() || b.is_nan() {
        return f64::NAN;
    }
    if m.is_infinite() {
        return m;
    }
    m + ((a - m).exp() + (b - m).exp()).ln()
}

/// Axes past the two-level limit are scanned in log steps: 5000-long rows of `f32` (ties,
/// and NaN, ±inf and -0.0 in one row for `cummax`/`cummin`) and `i32`, and a 17000-long
/// `logcumsumexp` (its own, higher limit), against running references.
#[test]
fn long_axes_scan_in_log_steps() -> Result<()> {
    let n = 5000;
    let what = format!("f32 [2, {n}]");
    let x = data(
        600,
        DType::F32,
        &[2, n],
        Domain::new((-1.0, 1.0), (0, 0)),
        false,
    );
    let s = x.tensor(DType::F32).cumsum(1)?;
    let report = s.realize()?;
    // The default partition fuses the 13 steps into 4 kernels; a measured alternative may
    // compute shared values once in kernels of their own, up to one kernel per step where
    // recomputing is dear (PoCL building unoptimized on an AVX2 target chooses 13). Never
    // more kernels than steps.
    let steps = n.next_power_of_two().trailing_zeros() as usize;
    assert!(
        report.kernels <= steps,
        "cumsum {what}: {} kernels for {steps} steps",
        report.kernels
    );
    assert_nd(
        &format!("cumsum {what}"),
        &Nd::of(&s),
        &along(&x, 1, n, |r| running(r, |a, b| a + b)),
        reduce_tol(DType::F32, n),
    );
    let x = data(
        601,
        DType::F32,
        &[2, n],
        Domain::new((0.99, 1.01), (0, 0)),
        false,
    );
    assert_nd(
        &format!("cumprod {what}"),
        &Nd::of(&x.tensor(DType::F32).cumprod(-1)?),
        &along(&x, 1, n, |r| running(r, |a, b| a * b)),
        reduce_tol(DType::F32, n),
    );
    let domain = Domain::new((-2.0, 2.0), (-3, 3)).quantized(0.5);
    for dtype in [DType::F32, DType::I32] {
        let mut x = data(602, dtype, &[2, n], domain, dtype.is_float());
        // NaN sticks, so only the first row has any: the second tracks values to the end.
        for v in &mut x.data[n..] {
            if v.is_nan() {
                *v = 0.5;
            }
        }
        let t = x.tensor(dtype);
        for max in [true, false] {
            let (v, i) = if max { t.cummax(1)? } else { t.cummin(1)? };
            let name = format!("{} {dtype} [2, {n}]", if max { "cummax" } else { "cummin" });
            let want_v = along(&x, 1, n, |r| cum_extreme(r, max).0);
            let want_i = along(&x, 1, n, |r| cum_extreme(r, max).1);
            assert_nd(&format!("{name} values"), &Nd::of(&v), &want_v, 0.0);
            assert_nd(&format!("{name} indices"), &Nd::of(&i), &want_i, 0.0);
        }
    }
    let x = data(
        603,
        DType::I32,
        &[2, n],
        Domain::new((0.0, 0.0), (-9, 9)),
        false,
    );
    assert_nd(
        &format!("cumsum i32 [2, {n}]"),
        &Nd::of(&x.tensor(DType::I32).cumsum(1)?),
        &along(&x, 1, n, |r| running(r, |a, b| a + b)),
        0.0,
    );
    let m = 17_000;
    let x = data(
        604,
        DType::F32,
        &[1, m],
        Domain::new((-5.0, 5.0), (0, 0)),
        false,
    );
    assert_nd(
        &format!("logcumsumexp f32 [1, {m}]"),
        &Nd::of(&x.tensor(DType::F32).logcumsumexp(1)?),
        &along(&x, 1, m, |r| running(r, log_add_exp)),
        common::tolerance(DType::F32, true) * 10.0,
    );
    Ok(())
}
