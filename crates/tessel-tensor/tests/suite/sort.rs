//! Sorting and selection (`sort`, `argsort`, `topk`, `kthvalue`, `median`, `median_all`,
//! `searchsorted`) against references built with Rust's stable sort: every dtype, ties,
//! NaN, ±inf and ±0, both directions, permuted inputs, size-0/1 and 0-d shapes, and errors.

use std::cmp::Ordering;

use crate::common;
use crate::common::nd::Nd;
use crate::common::{Domain, Rng};
use crate::scan::along;
use tessel_tensor::{DType, Result, Tensor};

/// torch's order: NaN is larger than every number; -0.0 equals +0.0.
fn order(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// The stable sort of a row: (values, original indices).
fn sorted(row: &[f64], descending: bool) -> (Vec<f64>, Vec<f64>) {
    let mut pairs: Vec<(f64, usize)> = row.iter().copied().zip(0..).collect();
    // `sort_by` is stable, so equal values keep their input order in both directions.
    pairs.sort_by(|a, b| {
        let o = order(a.0, b.0);
        if descending { o.reverse() } else { o }
    });
    (
        pairs.iter().map(|p| p.0).collect(),
        pairs.iter().map(|p| p.1 as f64).collect(),
    )
}

/// Asserts equal values bit for bit as f64 (so -0.0 differs from +0.0; NaN equals NaN).
#[track_caller]
fn assert_exact(what: &str, got: &Nd, want: &Nd) {
    assert_eq!(got.dims, want.dims, "{what}: dims");
    let bad: Vec<String> = got
        .data
        .iter()
        .zip(&want.data)
        .enumerate()
        .filter(|(_, (g, w))| !(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())))
        .take(5)
        .map(|(i, (g, w))| format!("[{i}] got {g:?}, want {w:?}"))
        .collect();
    assert!(bad.is_empty(), "{what}: {}", bad.join("; "));
}

/// Random values with many ties, and NaN, ±inf and ±0 mixed into floats.
fn data(seed: u64, dtype: DType, dims: &[usize]) -> Nd {
    let mut rng = Rng::new(seed);
    let domain = Domain::new((-3.0, 3.0), (-4, 4)).quantized(0.5);
    let mut x = Nd::random(&mut rng, dtype, dims, domain);
    if dtype.is_float() {
        for v in &mut x.data {
            match rng.int(0, 12) {
                0 => *v = f64::NAN,
                1 => *v = f64::INFINITY,
                2 => *v = f64::NEG_INFINITY,
                3 => *v = -0.0,
                4 => *v = 0.0,
                _ => {}
            }
        }
    }
    x
}

/// The last two are a local-memory sort's extremes: several pairs per invocation (1000
/// elements padded to 1024, four per invocation), and rows of one element.
const CASES: [(&[usize], i64, usize); 5] = [
    (&[5, 9, 3], 1, 1),
    (&[5, 9, 3], 0, 0),
    (&[2, 40], -1, 1),
    (&[3, 1000], -1, 1),
    (&[4, 1], 1, 1),
];

/// The cases to test `dtype` on: all for `f32`, the first for the others (each case
/// compiles kernels of its own, so the matrix is kept to what adds coverage).
fn cases(dtype: DType) -> &'static [(&'static [usize], i64, usize)] {
    if dtype == DType::F32 {
        &CASES
    } else {
        &CASES[..1]
    }
}

#[test]
fn sort_and_argsort_every_dtype_both_directions() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        for &(dims, dim, axis) in cases(dtype) {
            let x = data(seed as u64, dtype, dims);
            let t = x.tensor(dtype);
            let n = dims[axis];
            for descending in [false, true] {
                let what = format!("{dtype} {dims:?} dim {dim} descending {descending}");
                let (v, i) = t.sort(dim, descending)?;
                assert_eq!((v.dtype(), i.dtype()), (dtype, DType::I64), "{what}");
                let want_v = along(&x, axis, n, |r| sorted(r, descending).0);
                let want_i = along(&x, axis, n, |r| sorted(r, descending).1);
                assert_exact(&format!("sort values {what}"), &Nd::of(&v), &want_v);
                assert_exact(&format!("sort indices {what}"), &Nd::of(&i), &want_i);
                let a = t.argsort(dim, descending)?;
                assert_exact(&format!("argsort {what}"), &Nd::of(&a), &want_i);
            }
        }
    }
    Ok(())
}

#[test]
fn topk_kthvalue_median_every_dtype() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        for &(dims, dim, axis) in cases(dtype) {
            let x = data(100 + seed as u64, dtype, dims);
            let t = x.tensor(dtype);
            let n = dims[axis];
            let what = format!("{dtype} {dims:?} dim {dim}");
            for (k, largest) in [(3.min(n), true), (1, false), (n, false), (0, true)] {
                let (v, i) = t.topk(k, dim, largest, true)?;
                let want_v = along(&x, axis, k, |r| sorted(r, largest).0[..k].to_vec());
                let want_i = along(&x, axis, k, |r| sorted(r, largest).1[..k].to_vec());
                assert_exact(&format!("topk {k} {largest} {what}"), &Nd::of(&v), &want_v);
                assert_exact(
                    &format!("topk idx {k} {largest} {what}"),
                    &Nd::of(&i),
                    &want_i,
                );
            }
            for (k, keepdim) in [(1, false), (n, true), (n.div_ceil(2), false)] {
                let (v, i) = t.kthvalue(k, dim, keepdim)?;
                let mut want_v = along(&x, axis, 1, |r| vec![sorted(r, false).0[k - 1]]);
                let mut want_i = along(&x, axis, 1, |r| vec![sorted(r, false).1[k - 1]]);
                if !keepdim {
                    want_v.dims.remove(axis);
                    want_i.dims.remove(axis);
                }
                assert_exact(&format!("kthvalue {k} {what}"), &Nd::of(&v), &want_v);
                assert_exact(&format!("kthvalue idx {k} {what}"), &Nd::of(&i), &want_i);
            }
            // The lower median; a row with NaN gives its first NaN.
            let median = |r: &[f64]| -> (f64, f64) {
                if let Some(p) = r.iter().position(|v| v.is_nan()) {
                    return (f64::NAN, p as f64);
                }
                let (v, i) = sorted(r, false);
                (v[(r.len() - 1) / 2], i[(r.len() - 1) / 2])
            };
            let (v, i) = t.median(dim, true)?;
            assert_exact(
                &format!("median {what}"),
                &Nd::of(&v),
                &along(&x, axis, 1, |r| vec![median(r).0]),
            );
            assert_exact(
                &format!("median idx {what}"),
                &Nd::of(&i),
                &along(&x, axis, 1, |r| vec![median(r).1]),
            );
            let all = t.median_all()?;
            assert_eq!(all.dims(), Vec::<usize>::new());
            assert_exact(
                &format!("median_all {what}"),
                &Nd::of(&all),
                &Nd::new(&[], vec![median(&x.data).0]),
            );
        }
    }
    Ok(())
}

#[test]
fn searchsorted_left_right_1d_and_batched() -> Result<()> {
    for (seed, &dtype) in
        common::on_device([DType::F32, DType::I32, DType::F64, DType::U8, DType::BF16])
            .iter()
            .enumerate()
    {
        let mut rng = Rng::new(300 + seed as u64);
        let domain = Domain::new((-3.0, 3.0), (0, 9)).quantized(0.5);
        let mut seq = Nd::random(&mut rng, dtype, &[3, 11], domain);
        for row in seq.data.chunks_mut(11) {
            row.sort_by(f64::total_cmp);
        }
        let vals = Nd::random(&mut rng, dtype, &[3, 6], domain);
        let count = |s: &[f64], v: f64, right: bool| {
            s.iter()
                .filter(|&&x| if right { x <= v } else { x < v })
                .count() as f64
        };
        for right in [false, true] {
            let what = format!("{dtype} right {right}");
            // Batched: row b of the values searches row b of the sequence.
            let got = seq.tensor(dtype).searchsorted(&vals.tensor(dtype), right)?;
            assert_eq!(got.dtype(), DType::I64);
            let want = Nd::from_fn(&[3, 6], |c| {
                count(&seq.data[c[0] * 11..(c[0] + 1) * 11], vals.at(c), right)
            });
            assert_exact(
                &format!("searchsorted batched {what}"),
                &Nd::of(&got),
                &want,
            );
            // 1-d: every value searches the one sequence, whatever its shape.
            let s0 = &seq.data[..11];
            let one = common::tensor(dtype, s0, &[11]);
            let vt = vals.tensor(dtype).permute(&[1, 0])?;
            let got = one.searchsorted(&vt, right)?;
            let want = Nd::from_fn(&[6, 3], |c| count(s0, vals.at(&[c[1], c[0]]), right));
            assert_exact(&format!("searchsorted 1-d {what}"), &Nd::of(&got), &want);
        }
    }
    // Mixed dtypes promote; an empty sequence puts everything at 0.
    let s = Tensor::from_vec(vec![1i32, 2, 3], [3])?;
    let v = Tensor::from_vec(vec![2.5f32, 0.5], [2])?;
    assert_eq!(s.searchsorted(&v, false)?.to_vec::<i64>()?, vec![2, 0]);
    let e = Tensor::from_vec(Vec::<f32>::new(), [0])?;
    assert_eq!(e.searchsorted(&v, true)?.to_vec::<i64>()?, vec![0, 0]);
    // NaN is the largest value, as the sorts place it; -0.0 equals +0.0.
    let s = Tensor::from_vec(vec![-1.0f32, 0.0, 3.0, f32::NAN], [4])?;
    let v = Tensor::from_vec(vec![f32::NAN, -0.0, 9.0], [3])?;
    assert_eq!(s.searchsorted(&v, false)?.to_vec::<i64>()?, vec![3, 1, 3]);
    assert_eq!(s.searchsorted(&v, true)?.to_vec::<i64>()?, vec![4, 2, 3]);
    Ok(())
}

#[test]
fn sorting_views_sizes_0_and_1_and_0d() -> Result<()> {
    let mut rng = Rng::new(11);
    // A permuted input sorted along its (strided) last axis.
    let x = data(12, DType::F32, &[7, 4]);
    let t = x.tensor(DType::F32).permute(&[1, 0])?;
    let xp = x.permute(&[1, 0]);
    let (v, i) = t.sort(-1, true)?;
    assert_exact(
        "sort permuted",
        &Nd::of(&v),
        &along(&xp, 1, 7, |r| sorted(r, true).0),
    );
    assert_exact(
        "sort idx permuted",
        &Nd::of(&i),
        &along(&xp, 1, 7, |r| sorted(r, true).1),
    );
    let (v, _) = t.topk(2, 0, true, false)?;
    assert_exact(
        "topk permuted",
        &Nd::of(&v),
        &along(&xp, 0, 2, |r| sorted(r, true).0[..2].to_vec()),
    );

    for dims in [&[0usize, 4][..], &[3, 0], &[1, 1], &[4, 1]] {
        let x = Nd::random(&mut rng, DType::I64, dims, common::DEFAULT);
        let t = x.tensor(DType::I64);
        for (axis, &n) in dims.iter().enumerate() {
            let (v, i) = t.sort(axis as i64, false)?;
            assert_exact(
                "sort small",
                &Nd::of(&v),
                &along(&x, axis, n, |r| sorted(r, false).0),
            );
            assert_exact(
                "sort idx small",
                &Nd::of(&i),
                &along(&x, axis, n, |r| sorted(r, false).1),
            );
            if n > 0 {
                let (v, _) = t.kthvalue(1, axis as i64, true)?;
                assert_exact(
                    "kthvalue small",
                    &Nd::of(&v),
                    &along(&x, axis, 1, |r| vec![sorted(r, false).0[0]]),
                );
            }
        }
    }
    let s = Tensor::scalar(4.0f32);
    let (v, i) = s.sort(0, false)?;
    assert_eq!((v.item::<f32>()?, i.item::<i64>()?), (4.0, 0));
    let (v, i) = s.median(-1, false)?;
    assert_eq!((v.item::<f32>()?, i.item::<i64>()?), (4.0, 0));
    assert_eq!(s.median_all()?.item::<f32>()?, 4.0);
    let (v, i) = s.topk(1, 0, true, true)?;
    assert_eq!((v.dims(), i.item::<i64>()?), (vec![], 0));
    let (v, i) = s.topk(0, 0, true, true)?;
    assert_eq!((v.dims(), i.dims()), (vec![0], vec![0]));
    Ok(())
}

#[test]
fn unique_with_inverse_and_counts_every_dtype() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        let x = data(400 + seed as u64, dtype, &[6, 7]);
        // A permuted view: unique flattens the logical (row-major) order.
        let t = x.tensor(dtype).permute(&[1, 0])?;
        let flat = x.permute(&[1, 0]).data;
        let (vals, from) = sorted(&flat, false);
        // The reference: runs of equal values in sorted order, NaNs each on their own.
        let mut want_v: Vec<f64> = Vec::new();
        let mut want_c: Vec<f64> = Vec::new();
        let mut want_inv = vec![0.0; flat.len()];
        for (&v, &i) in vals.iter().zip(&from) {
            if want_v
                .last()
                .is_none_or(|&l| v.is_nan() || order(l, v) != Ordering::Equal)
            {
                want_v.push(v);
                want_c.push(0.0);
            }
            *want_c.last_mut().unwrap_or(&mut 0.0) += 1.0;
            want_inv[i as usize] = (want_v.len() - 1) as f64;
        }
        let what = format!("unique {dtype}");
        let u = t.unique(true)?;
        assert_eq!((u.dtype(), u.dims()), (dtype, vec![want_v.len()]), "{what}");
        assert_exact(
            &what,
            &Nd::of(&u),
            &Nd::new(&[want_v.len()], want_v.clone()),
        );
        let (u, inv, counts) = t.unique_with_inverse_and_counts()?;
        assert_exact(
            &what,
            &Nd::of(&u),
            &Nd::new(&[want_v.len()], want_v.clone()),
        );
        assert_exact(
            &format!("{what} inverse"),
            &Nd::of(&inv),
            &Nd::new(&[7, 6], want_inv),
        );
        assert_exact(
            &format!("{what} counts"),
            &Nd::of(&counts),
            &Nd::new(&[want_c.len()], want_c),
        );
    }
    let e = Tensor::from_vec(Vec::<f32>::new(), [2, 0])?;
    let (u, inv, c) = e.unique_with_inverse_and_counts()?;
    assert_eq!(
        (u.dims(), inv.dims(), c.dims()),
        (vec![0], vec![2, 0], vec![0])
    );
    // Large integers compare exactly (not through f64).
    let big = Tensor::from_vec(vec![i64::MAX, i64::MAX - 1, i64::MAX], [3])?;
    assert_eq!(
        big.unique(false)?.to_vec::<i64>()?,
        vec![i64::MAX - 1, i64::MAX]
    );
    Ok(())
}

#[test]
fn sorting_errors_name_the_op_and_shape() {
    let t = Tensor::zeros([2, 3], DType::F32);
    common::assert_err(
        "sort dim",
        t.sort(2, false).map(|p| p.0),
        common::shape_error,
        &["sort", "[2, 3]"],
    );
    common::assert_err(
        "argsort dim",
        t.argsort(-3, false),
        common::shape_error,
        &["argsort", "[2, 3]"],
    );
    common::assert_err(
        "topk k",
        t.topk(4, 1, true, true).map(|p| p.0),
        common::shape_error,
        &["topk", "k = 4", "0..=3"],
    );
    common::assert_err(
        "kthvalue 0",
        t.kthvalue(0, 1, false).map(|p| p.0),
        common::shape_error,
        &["kthvalue", "1..=3"],
    );
    common::assert_err(
        "kthvalue k",
        t.kthvalue(3, 0, false).map(|p| p.0),
        common::shape_error,
        &["kthvalue", "[2, 3]"],
    );
    let empty = Tensor::zeros([2, 0], DType::F32);
    common::assert_err(
        "median empty",
        empty.median(1, false).map(|p| p.0),
        common::shape_error,
        &["median", "size 0"],
    );
    common::assert_err(
        "median_all empty",
        empty.median_all(),
        common::shape_error,
        &["median"],
    );
    let v = Tensor::zeros([3, 2], DType::F32);
    common::assert_err(
        "searchsorted batch",
        t.searchsorted(&v, false),
        common::shape_error,
        &["searchsorted", "[2, 3]", "leading dims"],
    );
    common::assert_err(
        "searchsorted 0-d",
        Tensor::scalar(1.0f32).searchsorted(&v, false),
        common::shape_error,
        &["searchsorted", "0-d"],
    );
}

/// Rows past the local-memory sort's limit sort by radix: `f32` rows of 3000 (padded to
/// 3072, three blocks) with many ties, NaN, ±inf and ±0 (the second row without NaN, so
/// its median is a number), both directions, and the selections built on the sort; an
/// `i32` row holding `i32::MAX` (the pads' key) checks that pads sort last, and an `f64`
/// row the 64-bit keys (eight passes). One shape per dtype: every pass is a few kernels.
#[test]
fn long_rows_sort_by_radix() -> Result<()> {
    let n = 3000;
    let mut x = data(500, DType::F32, &[2, n]);
    for v in &mut x.data[n..] {
        if v.is_nan() {
            *v = 1.5;
        }
    }
    let t = x.tensor(DType::F32);
    for descending in [false, true] {
        let what = format!("f32 [2, {n}] descending {descending}");
        let (v, i) = t.sort(-1, descending)?;
        let want_i = along(&x, 1, n, |r| sorted(r, descending).1);
        assert_exact(
            &format!("sort {what}"),
            &Nd::of(&v),
            &along(&x, 1, n, |r| sorted(r, descending).0),
        );
        assert_exact(&format!("sort idx {what}"), &Nd::of(&i), &want_i);
        let a = t.argsort(1, descending)?;
        assert_exact(&format!("argsort {what}"), &Nd::of(&a), &want_i);
    }
    for (k, largest) in [(5, true), (7, false)] {
        let (v, i) = t.topk(k, 1, largest, true)?;
        let what = format!("topk {k} largest {largest}");
        assert_exact(
            &what,
            &Nd::of(&v),
            &along(&x, 1, k, |r| sorted(r, largest).0[..k].to_vec()),
        );
        assert_exact(
            &format!("{what} idx"),
            &Nd::of(&i),
            &along(&x, 1, k, |r| sorted(r, largest).1[..k].to_vec()),
        );
    }
    let (v, i) = t.kthvalue(1234, 1, false)?;
    let kth = |r: &[f64]| {
        let (v, i) = sorted(r, false);
        (v[1233], i[1233])
    };
    assert_exact(
        "kthvalue",
        &Nd::of(&v),
        &Nd::new(&[2], x.data.chunks(n).map(|r| kth(r).0).collect()),
    );
    assert_exact(
        "kthvalue idx",
        &Nd::of(&i),
        &Nd::new(&[2], x.data.chunks(n).map(|r| kth(r).1).collect()),
    );
    // The lower median; the first row holds NaN, so it gives its first NaN.
    let median = |r: &[f64]| -> (f64, f64) {
        if let Some(p) = r.iter().position(|v| v.is_nan()) {
            return (f64::NAN, p as f64);
        }
        let (v, i) = sorted(r, false);
        (v[(r.len() - 1) / 2], i[(r.len() - 1) / 2])
    };
    assert!(x.data[..n].iter().any(|v| v.is_nan()));
    let (v, i) = t.median(1, false)?;
    assert_exact(
        "median",
        &Nd::of(&v),
        &Nd::new(&[2], x.data.chunks(n).map(|r| median(r).0).collect()),
    );
    assert_exact(
        "median idx",
        &Nd::of(&i),
        &Nd::new(&[2], x.data.chunks(n).map(|r| median(r).1).collect()),
    );

    let mut x = data(501, DType::I32, &[1, 1500]);
    x.data[7] = f64::from(i32::MAX);
    x.data[1400] = f64::from(i32::MAX);
    let (v, i) = x.tensor(DType::I32).sort(-1, false)?;
    assert_exact(
        "sort i32",
        &Nd::of(&v),
        &along(&x, 1, 1500, |r| sorted(r, false).0),
    );
    assert_exact(
        "sort idx i32",
        &Nd::of(&i),
        &along(&x, 1, 1500, |r| sorted(r, false).1),
    );

    if common::on_device([DType::F64]).is_empty() {
        return Ok(());
    }
    let x = data(502, DType::F64, &[2, 1100]);
    for descending in [false, true] {
        let (v, i) = x.tensor(DType::F64).sort(-1, descending)?;
        let what = format!("f64 descending {descending}");
        assert_exact(
            &format!("sort {what}"),
            &Nd::of(&v),
            &along(&x, 1, 1100, |r| sorted(r, descending).0),
        );
        assert_exact(
            &format!("sort idx {what}"),
            &Nd::of(&i),
            &along(&x, 1, 1100, |r| sorted(r, descending).1),
        );
    }
    Ok(())
}

/// `topk` of rows longer than the rank sort's limit selects by radix (four histogram passes,
/// no sort of the row): 32-bit, 16-bit and 8-bit dtypes, many ties (quantized data), NaN,
/// infinities and both zeros, both directions, `k` small and nearly the whole row, along
/// the last axis and a leading one, bit for bit against a stable sort (values, and the
/// indices of equal values in row order).
#[test]
fn topk_of_long_rows_by_radix_selection() -> Result<()> {
    let n = 3000;
    // Every case compiles its own kernels: a few per dtype keep the test short on PoCL.
    let cases: [(DType, &[(usize, bool)]); 4] = [
        (DType::F32, &[(50, true), (50, false), (700, false)]),
        (DType::BF16, &[(50, true)]),
        (DType::I32, &[(1, true)]),
        (DType::U8, &[(50, false)]),
    ];
    for (seed, (dtype, ks)) in cases.iter().enumerate() {
        if common::on_device([*dtype]).is_empty() {
            continue;
        }
        let x = data(700 + seed as u64, *dtype, &[2, n]);
        let t = x.tensor(*dtype);
        for &(k, largest) in *ks {
            let what = format!("topk {k} largest {largest} {dtype}");
            let (v, i) = t.topk(k, -1, largest, true)?;
            assert_exact(
                &what,
                &Nd::of(&v),
                &along(&x, 1, k, |r| sorted(r, largest).0[..k].to_vec()),
            );
            assert_exact(
                &format!("{what} idx"),
                &Nd::of(&i),
                &along(&x, 1, k, |r| sorted(r, largest).1[..k].to_vec()),
            );
        }
    }
    // Along a leading axis of a transposed view.
    let x = data(710, DType::F32, &[2, n]);
    let t = x.tensor(DType::F32).permute(&[1, 0])?; // [n, 2]
    let (v, i) = t.topk(9, 0, true, true)?;
    let want = |pick: usize| -> Vec<f64> {
        let rows: Vec<Vec<f64>> = x
            .data
            .chunks(n)
            .map(|r| {
                if pick == 0 {
                    sorted(r, true).0
                } else {
                    sorted(r, true).1
                }
            })
            .collect();
        (0..9)
            .flat_map(|j| rows.iter().map(move |r| r[j]))
            .collect()
    };
    assert_exact("topk along dim 0", &Nd::of(&v), &Nd::new(&[9, 2], want(0)));
    assert_exact(
        "topk along dim 0 idx",
        &Nd::of(&i),
        &Nd::new(&[9, 2], want(1)),
    );
    Ok(())
}
