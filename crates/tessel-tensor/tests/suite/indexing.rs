//! Index ops against plain loops over the index arrays: gathers and selections moved bit
//! for bit in every dtype with i32 and i64 indices, scatters with repeated indices, masks,
//! triangles, diagonals and rolls, on non-contiguous views and size-0/size-1 dims, and
//! the errors, which name the op and the shapes.

use crate::common::nd::{Nd, reduce_tol, unravel};
use crate::common::{DEFAULT, Rng, assert_close, assert_err, invalid, on_device, tensor};
use tessel_tensor::{DType, Error, Result, Tensor};

const INDEX: [DType; 2] = [DType::I32, DType::I64];

fn random(seed: u64, dtype: DType, dims: &[usize]) -> Nd {
    let mut x = Nd::random(&mut Rng::new(seed), dtype, dims, DEFAULT);
    if dtype.is_float() && x.data.len() >= 4 {
        // Edge values must travel unchanged through selections.
        x.data[0] = f64::NAN;
        x.data[1] = -0.0;
        x.data[2] = f64::INFINITY;
        x.data[3] = f64::NEG_INFINITY;
    }
    x
}

/// Random indices in `0..n`.
fn indices(seed: u64, dims: &[usize], n: usize) -> Nd {
    let mut rng = Rng::new(seed);
    let count = dims.iter().product();
    Nd::new(
        dims,
        (0..count)
            .map(|_| rng.int(0, n as i64 - 1) as f64)
            .collect(),
    )
}

#[track_caller]
fn exact(what: &str, got: &Tensor, want: &Nd) {
    let got = Nd::of(got);
    assert_eq!(got.dims, want.dims, "{what}: dims");
    for (i, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

fn unsupported_any(op: &'static str) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::UnsupportedDType { op: o, .. } if *o == op)
}

/// `torch.gather` by its definition.
fn gather_ref(src: &Nd, axis: usize, index: &Nd) -> Nd {
    Nd::from_fn(&index.dims, |o| {
        let mut idx = o.to_vec();
        idx[axis] = index.at(o) as usize;
        src.at(&idx)
    })
}

#[test]
fn gather_every_dtype_and_index_dtype() -> Result<()> {
    for dtype in on_device(DType::ALL) {
        let x = random(1, dtype, &[3, 5, 4]);
        let t = x.tensor(dtype);
        for (k, idx_dtype) in on_device(INDEX).into_iter().enumerate() {
            let i = indices(2 + k as u64, &[2, 7, 4], 5);
            let got = t.gather(1, &i.tensor(idx_dtype))?;
            assert_eq!(got.dtype(), dtype);
            exact(
                &format!("gather {dtype} by {idx_dtype}"),
                &got,
                &gather_ref(&x, 1, &i),
            );
            let got = t.gather(-3, &indices(9, &[4, 5, 4], 3).tensor(idx_dtype))?;
            exact(
                &format!("gather dim -3 {dtype}"),
                &got,
                &gather_ref(&x, 0, &indices(9, &[4, 5, 4], 3)),
            );
        }
    }
    Ok(())
}

#[test]
fn gather_views_sizes_and_out_of_range() -> Result<()> {
    let _mode = unchecked();
    let x = random(3, DType::F32, &[4, 6]);
    let t = x.tensor(DType::F32);
    // A transposed view of the source.
    let i = indices(4, &[6, 3], 4);
    exact(
        "gather from a permuted view",
        &t.permute(&[1, 0])?.gather(1, &i.tensor(DType::I64))?,
        &gather_ref(&x.permute(&[1, 0]), 1, &i),
    );
    // A strided slice as the index.
    let big = indices(5, &[4, 6], 6);
    let sliced = big.tensor(DType::I32).slice(1, Some(1), None, 2)?;
    exact(
        "gather by a sliced index",
        &t.gather(1, &sliced)?,
        &gather_ref(&x, 1, &big.slice(1, 1, 2, 3)),
    );
    // Size-0 and size-1 dims.
    let empty = Tensor::zeros([4, 0], DType::I64);
    assert_eq!(t.gather(1, &empty)?.dims(), vec![4, 0]);
    let one = indices(6, &[1, 1], 6);
    exact(
        "gather [1, 1]",
        &t.gather(1, &one.tensor(DType::I64))?,
        &gather_ref(&x, 1, &one),
    );
    // 0-d source and index.
    let s = Tensor::from_vec(vec![2.5f32], Vec::<usize>::new())?;
    let z = Tensor::from_vec(vec![0i64], Vec::<usize>::new())?;
    assert_eq!(s.gather(0, &z)?.to_vec::<f32>()?, vec![2.5]);
    // Out of range: see `out_of_range_indices_unchecked_and_checked`.
    Ok(())
}

#[test]
fn gather_errors() {
    let t = Tensor::zeros([3, 4], DType::F32);
    assert_err(
        "float index",
        t.gather(0, &Tensor::zeros([3, 4], DType::F32)),
        unsupported_any("gather"),
        &["gather", "i64"],
    );
    assert_err(
        "rank mismatch",
        t.gather(0, &Tensor::zeros([3], DType::I64)),
        invalid("gather"),
        &["gather", "[3]", "[3, 4]"],
    );
    assert_err(
        "index too large",
        t.gather(0, &Tensor::zeros([2, 5], DType::I64)),
        invalid("gather"),
        &["gather", "[2, 5]", "dim 1"],
    );
    assert!(t.gather(2, &Tensor::zeros([3, 4], DType::I64)).is_err());
}

#[test]
fn take_along_dim_broadcasts_and_flattens() -> Result<()> {
    let x = random(7, DType::F32, &[3, 4, 5]);
    let t = x.tensor(DType::F32);
    let i = indices(8, &[1, 4, 2], 5);
    let want = gather_ref(&x, 2, &i.expand(&[3, 4, 2]));
    exact(
        "broadcast index",
        &t.take_along_dim(&i.tensor(DType::I64), Some(-1))?,
        &want,
    );
    let f = indices(9, &[6], 60);
    let flat = x.reshape(&[60]);
    exact(
        "dim None",
        &t.take_along_dim(&f.tensor(DType::I32), None)?,
        &gather_ref(&flat, 0, &f),
    );
    // The argmax idiom.
    let best = t.argmax(1, true)?;
    let got = Nd::of(&t.take_along_dim(&best, Some(1))?);
    let want = Nd::of(&t.max(&[1], true)?);
    assert_eq!(got.dims, want.dims);
    assert_close("max via take_along_dim", &got.data, &want.data, 0.0);
    assert_err(
        "no broadcast",
        t.take_along_dim(&Tensor::zeros([2, 4, 1], DType::I64), Some(2)),
        invalid("take_along_dim"),
        &["take_along_dim", "[2, 4, 1]", "dim 0"],
    );
    Ok(())
}

#[test]
fn index_select_and_embedding() -> Result<()> {
    for dtype in on_device(DType::ALL) {
        let x = random(10, dtype, &[5, 3]);
        let t = x.tensor(dtype);
        for idx_dtype in on_device(INDEX) {
            // Repeated indices are fine.
            let i = Nd::new(&[4], vec![4.0, 0.0, 4.0, 2.0]);
            let want = Nd::from_fn(&[4, 3], |o| x.at(&[i.data[o[0]] as usize, o[1]]));
            exact(
                &format!("index_select {dtype} {idx_dtype}"),
                &t.index_select(0, &i.tensor(idx_dtype))?,
                &want,
            );
            let j = Nd::new(&[2], vec![2.0, 1.0]);
            let want = Nd::from_fn(&[5, 2], |o| x.at(&[o[0], j.data[o[1]] as usize]));
            exact(
                "index_select dim -1 of a view",
                &t.permute(&[1, 0])?
                    .permute(&[1, 0])?
                    .index_select(-1, &j.tensor(idx_dtype))?,
                &want,
            );
        }
    }
    let w = random(11, DType::F32, &[6, 4]);
    let wt = w.tensor(DType::F32);
    let ids = indices(12, &[2, 3], 6);
    let want = Nd::from_fn(&[2, 3, 4], |o| w.at(&[ids.at(&o[..2]) as usize, o[2]]));
    exact(
        "embedding",
        &Tensor::embedding(&wt, &ids.tensor(DType::I64))?,
        &want,
    );
    assert_eq!(
        Tensor::embedding(&wt, &Tensor::zeros([0], DType::I64))?.dims(),
        vec![0, 4]
    );
    assert_eq!(
        wt.index_select(0, &Tensor::zeros([0], DType::I32))?.dims(),
        vec![0, 4]
    );
    assert_err(
        "2-d index",
        wt.index_select(0, &Tensor::zeros([2, 2], DType::I64)),
        invalid("index_select"),
        &["index_select", "[2, 2]"],
    );
    assert_err(
        "1-d weight",
        Tensor::embedding(
            &Tensor::zeros([4], DType::F32),
            &Tensor::zeros([2], DType::I64),
        ),
        invalid("embedding"),
        &["embedding", "[4]"],
    );
    assert_err(
        "bool index",
        wt.index_select(0, &Tensor::zeros([2], DType::Bool)),
        unsupported_any("index_select"),
        &["index_select"],
    );
    Ok(())
}

#[test]
fn one_hot_classes() -> Result<()> {
    for idx_dtype in on_device(INDEX) {
        let c = indices(13, &[3, 4], 5);
        let got = c.tensor(idx_dtype).one_hot(5)?;
        assert_eq!(got.dtype(), DType::I64);
        let want = Nd::from_fn(&[3, 4, 5], |o| {
            f64::from(u8::from(c.at(&o[..2]) as usize == o[2]))
        });
        exact("one_hot", &got, &want);
    }
    // Size-0 inputs work (out of range: see `out_of_range_indices_unchecked_and_checked`).
    assert_eq!(
        Tensor::zeros([0], DType::I64).one_hot(4)?.dims(),
        vec![0, 4]
    );
    assert_err(
        "float classes",
        Tensor::zeros([2], DType::F32).one_hot(3),
        unsupported_any("one_hot"),
        &["one_hot"],
    );
    Ok(())
}

#[test]
fn masked_fill_tril_triu() -> Result<()> {
    let mut rng = Rng::new(14);
    for dtype in on_device(DType::ALL) {
        let x = random(15, dtype, &[2, 3, 4]);
        let t = x.tensor(dtype);
        let m = Nd::new(&[3, 1], (0..3).map(|_| rng.int(0, 1) as f64).collect());
        let fill = if dtype == DType::Bool { 1.0 } else { 7.0 };
        let want = Nd::from_fn(&x.dims, |o| {
            if m.at(&[o[1], 0]) == 0.0 {
                x.at(o)
            } else {
                fill
            }
        });
        exact(
            &format!("masked_fill {dtype}"),
            &t.masked_fill(&m.tensor(DType::Bool), 7)?,
            &want,
        );
        for k in -3..=4 {
            let tri = |upper: bool| {
                Nd::from_fn(&x.dims, |o| {
                    let d = o[2] as i64 - o[1] as i64;
                    let keep = if upper { d >= k } else { d <= k };
                    if keep { x.at(o) } else { 0.0 }
                })
            };
            exact(&format!("tril({k}) {dtype}"), &t.tril(k)?, &tri(false));
            exact(&format!("triu({k}) {dtype}"), &t.triu(k)?, &tri(true));
        }
    }
    // A transposed view, and a float fill on an int tensor (converted, as in PyTorch).
    let x = random(16, DType::I32, &[4, 3]);
    let t = x.tensor(DType::I32).permute(&[1, 0])?;
    let xt = x.permute(&[1, 0]);
    let want = Nd::from_fn(&[3, 4], |o| if o[1] > o[0] { 0.0 } else { xt.at(o) });
    exact("tril of a view", &t.tril(0)?, &want);
    // Extreme diagonals keep everything or nothing.
    exact("tril(i64::MAX)", &t.tril(i64::MAX)?, &xt);
    exact("triu(i64::MIN)", &t.triu(i64::MIN)?, &xt);
    exact(
        "tril(i64::MIN)",
        &t.tril(i64::MIN)?,
        &Nd::new(&[3, 4], vec![0.0; 12]),
    );
    assert_eq!(
        Tensor::zeros([2, 0, 3], DType::F32).triu(1)?.dims(),
        vec![2, 0, 3]
    );
    let m = t.gt(0)?;
    let want = Nd::from_fn(&[3, 4], |o| if xt.at(o) > 0.0 { 2.0 } else { xt.at(o) });
    let got = t.masked_fill(&m, 2.9)?;
    assert_eq!(got.dtype(), DType::I32);
    exact("masked_fill converts the value", &got, &want);
    assert_err(
        "mask grows the input",
        t.masked_fill(&Tensor::zeros([2, 3, 4], DType::Bool), 0),
        invalid("masked_fill"),
        &["masked_fill", "[2, 3, 4]", "[3, 4]"],
    );
    assert_err(
        "int mask",
        t.masked_fill(&Tensor::zeros([3, 4], DType::I32), 0),
        invalid("masked_fill"),
        &["masked_fill", "bool"],
    );
    assert!(Tensor::zeros([3], DType::F32).tril(0).is_err());
    Ok(())
}

#[test]
fn diagonal_and_roll() -> Result<()> {
    let x = random(17, DType::F32, &[3, 4, 5]);
    let t = x.tensor(DType::F32);
    for (d1, d2) in [(1i64, 2i64), (2, 1), (0, 2), (-1, 0)] {
        for offset in -5..=6i64 {
            let (a1, a2) = ((d1 + 3) as usize % 3, (d2 + 3) as usize % 3);
            let other = (0..3).find(|&d| d != a1 && d != a2).unwrap_or(0);
            let (r, c) = (x.dims[a1] as i64, x.dims[a2] as i64);
            let (r0, c0) = ((-offset).max(0), offset.max(0));
            let len = (r - r0).min(c - c0).max(0) as usize;
            let want = Nd::from_fn(&[x.dims[other], len], |o| {
                let mut idx = vec![0; 3];
                idx[other] = o[0];
                idx[a1] = r0 as usize + o[1];
                idx[a2] = c0 as usize + o[1];
                x.at(&idx)
            });
            exact(
                &format!("diagonal({offset}, {d1}, {d2})"),
                &t.diagonal(offset, d1, d2)?,
                &want,
            );
        }
    }
    // Offsets past every row or column give empty diagonals, the extremes included.
    for offset in [i64::MIN, i64::MAX] {
        assert_eq!(t.diagonal(offset, 1, -1)?.dims(), vec![3, 0], "{offset}");
    }
    assert_err(
        "same dims",
        t.diagonal(0, 1, -2),
        invalid("diagonal"),
        &["diagonal", "[3, 4, 5]"],
    );
    for dtype in on_device(DType::ALL) {
        let x = random(18, dtype, &[3, 4]);
        let t = x.tensor(dtype);
        for (shifts, dims) in [
            (vec![1i64], vec![0i64]),
            (vec![-5, 7], vec![1, 0]),
            (vec![2, 2], vec![-1, -1]),
        ] {
            let want = Nd::from_fn(&x.dims, |o| {
                let mut idx = o.to_vec();
                for (s, d) in shifts.iter().zip(&dims) {
                    let a = (*d + 2) as usize % 2;
                    let n = x.dims[a] as i64;
                    idx[a] = (idx[a] as i64 - s).rem_euclid(n) as usize;
                }
                x.at(&idx)
            });
            exact(
                &format!("roll {shifts:?} {dims:?} {dtype}"),
                &t.roll(&shifts, &dims)?,
                &want,
            );
        }
        let flat = Nd::from_fn(&x.dims, |o| {
            let f = (o[0] * 4 + o[1]) as i64;
            x.data[(f - 5).rem_euclid(12) as usize]
        });
        exact("roll flattened", &t.roll(&[5], &[])?, &flat);
    }
    assert_eq!(
        Tensor::zeros([0, 2], DType::F32).roll(&[3], &[0])?.dims(),
        vec![0, 2]
    );
    assert_err(
        "shifts without dims",
        t.roll(&[1, 2], &[]),
        invalid("roll"),
        &["roll", "one shift"],
    );
    assert_err(
        "mismatch",
        t.roll(&[1], &[0, 1]),
        invalid("roll"),
        &["roll"],
    );
    Ok(())
}

/// `scatter_reduce` by its definition; `reduce` among sum/prod/mean/amax/amin/replace.
fn scatter_ref(x: &Nd, axis: usize, index: &Nd, src: &Nd, reduce: &str, include: bool) -> Nd {
    let mut acc: Vec<Vec<f64>> = x
        .data
        .iter()
        .map(|&v| if include { vec![v] } else { vec![] })
        .collect();
    for flat in 0..index.numel() {
        let o = unravel(flat, &index.dims);
        let mut dst = o.clone();
        dst[axis] = index.at(&o) as usize;
        let f = dst
            .iter()
            .zip(crate::common::nd::strides(&x.dims))
            .map(|(i, s)| i * s)
            .sum::<usize>();
        acc[f].push(src.at(&o));
    }
    let data = acc
        .iter()
        .zip(&x.data)
        .map(|(vals, &own)| {
            if vals.is_empty() || (include && vals.len() == 1 && reduce != "replace") {
                return own;
            }
            match reduce {
                "sum" => vals.iter().sum(),
                "prod" => vals.iter().product(),
                "mean" => vals.iter().sum::<f64>() / vals.len() as f64,
                "amax" => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                "amin" => vals.iter().copied().fold(f64::INFINITY, f64::min),
                _ => *vals.last().unwrap_or(&own),
            }
        })
        .collect();
    Nd::new(&x.dims, data)
}

#[test]
fn scatter_family_with_duplicates() -> Result<()> {
    let dtypes = on_device([DType::F32, DType::F16, DType::I32, DType::I64, DType::F64]);
    for dtype in dtypes {
        let x = Nd::random(
            &mut Rng::new(19),
            dtype,
            &[4, 3, 5],
            DEFAULT.quantized(0.25),
        );
        let src = Nd::random(
            &mut Rng::new(20),
            dtype,
            &[4, 6, 5],
            DEFAULT.quantized(0.25),
        );
        // Six source rows into three destinations: duplicates guaranteed.
        let i = indices(21, &[3, 6, 4], 3);
        for idx_dtype in on_device(INDEX) {
            let (t, s, it) = (x.tensor(dtype), src.tensor(dtype), i.tensor(idx_dtype));
            let src_cut = src.slice(0, 0, 1, 3).slice(2, 0, 1, 4);
            let tol = reduce_tol(dtype, 8);
            let check = |what: &str, got: Tensor, want: Nd| {
                assert_eq!(got.dtype(), dtype, "{what}");
                let g = Nd::of(&got);
                assert_eq!(g.dims, want.dims, "{what}");
                let want: Vec<f64> = want
                    .data
                    .iter()
                    .map(|&w| crate::common::round_to(dtype, w))
                    .collect();
                assert_close(&format!("{what} {dtype} {idx_dtype}"), &g.data, &want, tol);
            };
            check(
                "scatter_add",
                t.scatter_add(1, &it, &s)?,
                scatter_ref(&x, 1, &i, &src_cut, "sum", true),
            );
            check(
                "scatter",
                t.scatter(-2, &it, &s)?,
                scatter_ref(&x, 1, &i, &src_cut, "replace", false),
            );
            for reduce in ["sum", "prod", "mean", "amax", "amin"] {
                if reduce == "mean" && !dtype.is_float() {
                    continue;
                }
                for include in [true, false] {
                    check(
                        &format!("scatter_reduce {reduce} include_self={include}"),
                        t.scatter_reduce(1, &it, &s, reduce, include)?,
                        scatter_ref(&x, 1, &i, &src_cut, reduce, include),
                    );
                }
            }
        }
    }
    // Non-contiguous self and src, scatter along dim 0.
    let x = random(22, DType::F32, &[3, 4]);
    let src = Nd::random(&mut Rng::new(23), DType::F32, &[4, 5], DEFAULT);
    let i = indices(24, &[5, 2], 4);
    let t = x.tensor(DType::F32).permute(&[1, 0])?;
    let s = src.tensor(DType::F32).permute(&[1, 0])?;
    let want = scatter_ref(
        &x.permute(&[1, 0]),
        0,
        &i,
        &src.permute(&[1, 0]).slice(1, 0, 1, 2),
        "sum",
        true,
    );
    assert_close(
        "scatter_add of views",
        &Nd::of(&t.scatter_add(0, &i.tensor(DType::I64), &s)?).data,
        &want.data,
        1e-5,
    );
    // Empty index: nothing changes.
    let got = t.scatter_add(0, &Tensor::zeros([0, 3], DType::I64), &s)?;
    exact("empty scatter", &got, &x.permute(&[1, 0]));
    let tf = Tensor::zeros([3], DType::F32);
    let idx = Tensor::zeros([2], DType::I64);
    assert_err(
        "dtype mismatch",
        tf.scatter_add(0, &idx, &Tensor::zeros([2], DType::F64)),
        invalid("scatter_add"),
        &["scatter_add", "cast"],
    );
    assert_err(
        "bad reduce",
        tf.scatter_reduce(0, &idx, &Tensor::zeros([2], DType::F32), "max", true),
        invalid("scatter_reduce"),
        &["scatter_reduce", "amax"],
    );
    assert_err(
        "int mean",
        Tensor::zeros([3], DType::I32).scatter_reduce(
            0,
            &idx,
            &Tensor::zeros([2], DType::I32),
            "mean",
            true,
        ),
        unsupported_any("scatter_reduce"),
        &["scatter_reduce", "mean"],
    );
    assert_err(
        "index larger than src",
        tf.scatter(
            0,
            &Tensor::zeros([4], DType::I64),
            &Tensor::zeros([2], DType::F32),
        ),
        invalid("scatter"),
        &["scatter", "[4]", "[2]"],
    );
    Ok(())
}

/// `amax`/`amin` by atomic maxima of ordered keys: each result is one of the values sent
/// (bit for bit: `-0.0`, infinities), NaN wins as in `PyTorch`, 64-bit values that differ
/// only in their low 32 bits are told apart, and a position nothing is sent to keeps its
/// value.
#[test]
fn scatter_extremes_are_exact_and_propagate_nan() -> Result<()> {
    // Destinations 0 and 1 get three and two values, 2 and 3 one each, 4 none.
    let idx = Tensor::from_vec(vec![0i64, 1, 0, 2, 1, 0, 3, 2], [8])?;
    let lists: [(&[DType], [f64; 8], [f64; 5]); 4] = [
        (
            &[DType::F32, DType::BF16, DType::F16, DType::F64],
            [1.5, f64::NEG_INFINITY, f64::NAN, -2.0, 3.0, 7.0, -0.0, 2.5],
            [0.5, 4.0, -3.0, -1.0, 9.0],
        ),
        (
            &[DType::I8, DType::I16, DType::I32, DType::I64],
            [5.0, -7.0, 100.0, -2.0, 3.0, 7.0, 0.0, -100.0],
            [6.0, -8.0, 1.0, -1.0, 2.0],
        ),
        (
            &[DType::U8, DType::U16, DType::U32, DType::U64],
            [5.0, 255.0, 100.0, 2.0, 3.0, 7.0, 0.0, 200.0],
            [6.0, 0.0, 1.0, 1.0, 2.0],
        ),
        // Equal high words: only the low 32 bits differ.
        (
            &[DType::I64, DType::F64],
            [
                5_000_000_001.0,
                -5_000_000_001.0,
                5_000_000_000.0,
                1.0 + 2f64.powi(-40),
                -5_000_000_000.0,
                5_000_000_002.0,
                -1.0,
                1.0,
            ],
            [0.0, -5_000_000_002.0, 1.0 + 2f64.powi(-41), 2.0, 3.0],
        ),
    ];
    for (dtypes, src, own) in lists {
        for dtype in on_device(dtypes.to_vec()) {
            if dtype == DType::I64 && src[3].fract() != 0.0 {
                continue;
            }
            let (s, x) = (tensor(dtype, &src, &[8]), tensor(dtype, &own, &[5]));
            let (src_r, own_r) = (Nd::of(&s).data, Nd::of(&x).data);
            for (reduce, largest) in [("amax", true), ("amin", false)] {
                for include in [true, false] {
                    let pick = |a: f64, b: f64| {
                        if a.is_nan() || b.is_nan() {
                            f64::NAN
                        } else if (a > b) == largest {
                            a
                        } else {
                            b
                        }
                    };
                    let want: Vec<f64> = (0..5)
                        .map(|d| {
                            let sent = [0usize, 1, 0, 2, 1, 0, 3, 2].iter().zip(&src_r);
                            let mut vals = sent.filter(|(i, _)| **i == d).map(|(_, v)| *v);
                            match vals.next() {
                                None => own_r[d],
                                Some(first) => {
                                    let start = if include {
                                        pick(own_r[d], first)
                                    } else {
                                        first
                                    };
                                    vals.fold(start, pick)
                                }
                            }
                        })
                        .collect();
                    exact(
                        &format!("scatter_reduce {reduce} include_self={include} {dtype}"),
                        &x.scatter_reduce(0, &idx, &s, reduce, include)?,
                        &Nd::new(&[5], want),
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn masked_select_and_nonzero_synchronize() -> Result<()> {
    for dtype in on_device(DType::ALL) {
        let x = random(25, dtype, &[3, 4]);
        let t = x.tensor(dtype);
        let m = Nd::random(&mut Rng::new(26), DType::Bool, &[4], DEFAULT);
        let want: Vec<f64> = (0..12)
            .filter(|f| m.data[f % 4] != 0.0)
            .map(|f| x.data[f])
            .collect();
        let n = want.len();
        exact(
            &format!("masked_select {dtype}"),
            &t.masked_select(&m.tensor(DType::Bool))?,
            &Nd::new(&[n], want),
        );
        let mut coords = Vec::new();
        for (f, v) in x.data.iter().enumerate() {
            if *v != 0.0 {
                coords.extend([(f / 4) as f64, (f % 4) as f64]);
            }
        }
        let count = coords.len() / 2;
        let got = t.permute(&[1, 0])?.permute(&[1, 0])?.nonzero()?;
        assert_eq!(got.dtype(), DType::I64);
        exact(
            &format!("nonzero {dtype}"),
            &got,
            &Nd::new(&[count, 2], coords),
        );
    }
    let z = tensor(DType::F32, &[0.0, -0.0, f64::NAN], &[3]);
    assert_eq!(z.nonzero()?.to_vec::<i64>()?, vec![2]);
    assert_eq!(
        Tensor::zeros([0, 3], DType::F32).nonzero()?.dims(),
        vec![0, 2]
    );
    assert_eq!(
        Tensor::zeros([2], DType::F32)
            .masked_select(&Tensor::zeros([2], DType::Bool))?
            .dims(),
        vec![0]
    );
    assert_err(
        "int mask",
        z.masked_select(&z),
        invalid("masked_select"),
        &["masked_select", "bool"],
    );
    Ok(())
}

/// Serializes the tests that depend on the process-wide checked-indexing switch.
static CHECK_MODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`CHECK_MODE`] for a test whose out-of-range indices must read 0 and be dropped:
/// a test turning checked mode on meanwhile would report them at this test's reads.
fn unchecked() -> std::sync::MutexGuard<'static, ()> {
    CHECK_MODE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Turns checked indexing off again when dropped, even if the test panics.
struct CheckedOff;

impl Drop for CheckedOff {
    fn drop(&mut self) {
        Tensor::set_checked_indexing(false);
    }
}

/// The range check on its own: every index dtype, the first bad index (in row-major
/// order) with its coordinates, negative indices, views, size 0, and wrong dtypes.
#[test]
fn check_index_range_names_op_index_position_and_range() -> Result<()> {
    for dtype in on_device(INDEX) {
        let i = tensor(dtype, &[0.0, 3.0, 2.0, 1.0, 4.0, -1.0], &[2, 3]);
        i.narrow(1, 0, 2)?.check_index_range(5, "gather")?;
        assert_err(
            &format!("range {dtype}"),
            i.check_index_range(4, "gather").map(|()| i.clone()),
            invalid("gather"),
            &["gather", "index 4", "[1, 1]", "[2, 3]", "0..4"],
        );
        // A transposed view: positions are those of the view, and -1 is met first.
        let t = i.permute(&[1, 0])?;
        assert_err(
            &format!("range of a view {dtype}"),
            t.check_index_range(5, "scatter").map(|()| t.clone()),
            invalid("scatter"),
            &["scatter", "index -1", "[2, 1]", "0..5", "not wrapped"],
        );
    }
    Tensor::zeros([0, 3], DType::I64).check_index_range(0, "gather")?;
    let f = Tensor::zeros([2], DType::F32);
    assert_err(
        "float index",
        f.check_index_range(2, "gather").map(|()| f.clone()),
        unsupported_any("gather"),
        &["gather"],
    );
    Ok(())
}

/// A checked-mode case: the op, a call of it, and what its error must mention.
type Case<'a> = (
    &'static str,
    Box<dyn Fn() -> Result<Tensor> + 'a>,
    &'static [&'static str],
);

/// Out-of-range indices: unchecked they read 0 or are dropped (the documented
/// behaviour), checked every index op's error is reported by the next read. Toggles the process-wide
/// switch, under a lock; skips the unchecked half when `TESSEL_CHECK_INDICES` is set.
#[test]
fn out_of_range_indices_unchecked_and_checked() -> Result<()> {
    let _mode = CHECK_MODE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let x = random(3, DType::F32, &[4, 6]);
    let t = x.tensor(DType::F32);
    let bad = Tensor::from_vec(vec![-1i64, 6, 0, 100], [4, 1])?;
    let rows = Tensor::from_vec(vec![1i32, 4, -2], [3])?;
    let classes = Tensor::from_vec(vec![-1i64, 3], [2])?;
    let base = Tensor::from_vec(vec![1.0f32; 3], [3])?;
    let to = Tensor::from_vec(vec![0i64, 3, -1], [3])?;
    let src = Tensor::from_vec(vec![1.0f32, 2.0, 4.0], [3])?;
    if Tensor::checked_indexing() {
        eprintln!("tessel-skip: unchecked out-of-range indices: TESSEL_CHECK_INDICES is set");
    } else {
        // No position matches: reads give 0, writes are dropped.
        let got = t.gather(1, &bad)?.to_vec::<f32>()?;
        assert_eq!([got[0], got[1], got[3]], [0.0, 0.0, 0.0]);
        assert_eq!(f64::from(got[2]), x.at(&[2, 0]));
        let sel = t.index_select(0, &rows)?.to_vec::<f32>()?;
        assert!(sel[6..].iter().all(|&v| v == 0.0), "index_select {sel:?}");
        assert_eq!(
            sel[..6].iter().map(|v| f64::from(*v)).collect::<Vec<_>>(),
            (0..6).map(|c| x.at(&[1, c])).collect::<Vec<_>>()
        );
        let e = Tensor::embedding(&t, &rows.reshape(&[1, 3])?)?.to_vec::<f32>()?;
        assert!(e[6..].iter().all(|&v| v == 0.0), "embedding {e:?}");
        assert_eq!(classes.one_hot(3)?.to_vec::<i64>()?, vec![0; 6]);
        let added = base.scatter_add(0, &to, &src)?.to_vec::<f32>()?;
        assert_eq!(added, vec![2.0, 1.0, 1.0]);
        let set = base.scatter(0, &to, &src)?.to_vec::<f32>()?;
        assert_eq!(set, vec![1.0, 1.0, 1.0]);
    }

    Tensor::set_checked_indexing(true);
    let _off = CheckedOff;
    assert!(Tensor::checked_indexing());
    let cases: [Case<'_>; 8] = [
        (
            "gather",
            Box::new(|| t.gather(1, &bad)),
            &["index -1", "[0, 0]", "0..6"],
        ),
        (
            "take_along_dim",
            Box::new(|| t.take_along_dim(&bad, Some(1))),
            &["index -1", "0..6"],
        ),
        (
            "index_select",
            Box::new(|| t.index_select(0, &rows)),
            &["index 4", "[1]", "0..4"],
        ),
        (
            "embedding",
            Box::new(|| Tensor::embedding(&t, &rows.reshape(&[1, 3])?)),
            &["index 4", "[1]", "0..4"],
        ),
        (
            "one_hot",
            Box::new(|| classes.one_hot(3)),
            &["index -1", "[0]", "0..3"],
        ),
        (
            "scatter",
            Box::new(|| base.scatter(0, &to, &src)),
            &["index 3", "[1]", "0..3"],
        ),
        (
            "scatter_add",
            Box::new(|| base.scatter_add(0, &to, &src)),
            &["index 3", "[1]", "0..3"],
        ),
        (
            "scatter_reduce",
            Box::new(|| base.scatter_reduce(0, &to, &src, "amax", true)),
            &["index 3", "0..3"],
        ),
    ];
    for (op, res, mentions) in cases {
        let mut all = vec![op];
        all.extend_from_slice(mentions);
        // The op records its check; the next read reports it.
        let read = res().and_then(|t| t.to_scalars().map(|_| t));
        assert_err(&format!("checked {op}"), read, invalid(op), &all);
        // Reported once: the next read succeeds.
        assert!(t.to_scalars().is_ok(), "checked {op}: reported twice");
    }
    // In-range indices pass the check and give the same values as unchecked.
    let ok = Tensor::from_vec(vec![5i64, 0, 2, 3], [4, 1])?;
    exact(
        "checked gather in range",
        &t.gather(1, &ok)?,
        &gather_ref(&x, 1, &Nd::new(&[4, 1], vec![5.0, 0.0, 2.0, 3.0])),
    );
    let i = Tensor::from_vec(vec![2i64, 0], [1, 2])?;
    assert_eq!(i.one_hot(3)?.to_vec::<i64>()?, vec![0, 0, 1, 1, 0, 0]);
    Ok(())
}

/// Gathers along an axis of a real vocabulary (GPT-2's 50 257), forward and backward, in
/// f32 and bf16 with i32 and i64 indices: embedding rows bit for bit (repeated tokens and
/// the last one included), their gradient (repeated rows add up), and cross-entropy's form `x[t] - logsumexp(x)` with its gradient
/// `softmax(x) - onehot(t)`, against f64 loops.
#[test]
fn gathers_and_gradients_over_a_real_vocabulary() -> Result<()> {
    let (vocab, dim) = (50_257, 8);
    for dtype in on_device([DType::F32, DType::BF16]) {
        let table = Nd::random(&mut Rng::new(40), dtype, &[vocab, dim], DEFAULT);
        let mut ids = indices(41, &[4, 33], vocab);
        ids.data[5] = ids.data[0];
        ids.data[6] = ids.data[0];
        ids.data[7] = (vocab - 1) as f64;
        let weights = Nd::random(&mut Rng::new(42), dtype, &[4, 33, dim], DEFAULT);
        for idx_dtype in on_device(INDEX) {
            let what = format!("{dtype} {idx_dtype}");
            let w = table.tensor(dtype);
            let i = ids.tensor(idx_dtype);
            let rows = Tensor::embedding(&w, &i)?;
            let want = Nd::from_fn(&[4, 33, dim], |o| {
                let id = ids.at(&o[..2]) as usize;
                if id < vocab {
                    table.at(&[id, o[2]])
                } else {
                    0.0
                }
            });
            exact(&format!("embedding {what}"), &rows, &want);
            // Read above, `rows` is a realized constant now: record the lookup again.
            let rows = Tensor::embedding(&w, &i)?;
            let loss = (&rows * &weights.tensor(dtype))?.sum_all()?;
            let g = tessel_tensor::grad(&loss, &[&w])?.remove(0);
            let mut want = vec![0.0; vocab * dim];
            for k in 0..4 * 33 {
                let id = ids.data[k] as usize;
                if id < vocab {
                    for d in 0..dim {
                        want[id * dim + d] += weights.data[k * dim + d];
                    }
                }
            }
            assert_close(
                &format!("embedding grad {what}"),
                &Nd::of(&g).data,
                &want,
                reduce_tol(dtype, 3),
            );
        }
    }
    // Cross-entropy's pieces over [48, 50257] logits: a 9.6 MB gradient, which measurement
    // compares with its reference on the device.
    let device = tessel_tensor::Device::default();
    if device.info().is_ok_and(|i| i.name.contains("llvmpipe")) {
        // lavapipe (Mesa 22.3.6, LLVM 15) sums the second of two loops over a row wrongly
        // once the row passes ~32k elements (max then sum of exp: 30% of the sum at 50 257);
        // the IR interpreter, the CPU and PoCL agree on the right value.
        eprintln!(
            "tessel-skip: gathers_and_gradients_over_a_real_vocabulary: cross-entropy over 50 257 classes: lavapipe miscompiles the row kernel on {device}"
        );
        return Ok(());
    }
    let rows = 48;
    let x = Nd::random(&mut Rng::new(43), DType::F32, &[rows, vocab], DEFAULT);
    let t = indices(44, &[rows, 1], vocab);
    for idx_dtype in on_device(INDEX) {
        let xt = x.tensor(DType::F32);
        let lse = xt.logsumexp(&[1], true)?;
        let picked = (&xt.gather(1, &t.tensor(idx_dtype))? - &lse)?;
        let g = tessel_tensor::grad(&picked.sum_all()?, &[&xt])?.remove(0);
        let mut want_logp = Vec::new();
        let mut want_grad = vec![0.0; rows * vocab];
        for r in 0..rows {
            let row = &x.data[r * vocab..(r + 1) * vocab];
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            let target = t.data[r] as usize;
            want_logp.push(row[target] - lse);
            for (c, v) in row.iter().enumerate() {
                want_grad[r * vocab + c] = f64::from(c == target) - (v - lse).exp();
            }
        }
        assert_close(
            &format!("log-probability at the target {idx_dtype}"),
            &Nd::of(&picked).data,
            &want_logp,
            1e-5,
        );
        assert_close(
            &format!("its gradient {idx_dtype}"),
            &Nd::of(&g).data,
            &want_grad,
            1e-5,
        );
    }
    Ok(())
}

/// `index_add` with repeated indices into a non-contiguous input, along dims 0 and 1,
/// and an empty index, against loops.
#[test]
fn index_add_with_repeats() -> Result<()> {
    for dtype in on_device([DType::F32, DType::I32, DType::F16]) {
        let x = Nd::random(&mut Rng::new(50), dtype, &[5, 6], DEFAULT.quantized(0.25));
        let src = Nd::random(&mut Rng::new(51), dtype, &[5, 9], DEFAULT.quantized(0.25));
        let idx = Nd::new(&[9], vec![0.0, 5.0, 5.0, 2.0, 0.0, 5.0, 1.0, 3.0, 4.0]);
        for idx_dtype in on_device(INDEX) {
            let got = x
                .tensor(dtype)
                .index_add(1, &idx.tensor(idx_dtype), &src.tensor(dtype))?;
            let mut want = x.clone();
            for r in 0..5 {
                for (j, &to) in idx.data.iter().enumerate() {
                    want.data[r * 6 + to as usize] += src.data[r * 9 + j];
                }
            }
            let want: Vec<f64> = want
                .data
                .iter()
                .map(|&w| crate::common::round_to(dtype, w))
                .collect();
            assert_close(
                &format!("index_add {dtype} {idx_dtype}"),
                &Nd::of(&got).data,
                &want,
                reduce_tol(dtype, 4),
            );
        }
        // Along dim 0 of a transposed view.
        let t = x.tensor(dtype).permute(&[1, 0])?; // [6, 5]
        let rows = Nd::random(&mut Rng::new(52), dtype, &[3, 5], DEFAULT.quantized(0.25));
        let idx = Nd::new(&[3], vec![4.0, 4.0, 0.0]);
        let got = t.index_add(0, &idx.tensor(DType::I64), &rows.tensor(dtype))?;
        let want = Nd::from_fn(&[6, 5], |o| {
            let mut v = x.at(&[o[1], o[0]]);
            for (j, &to) in idx.data.iter().enumerate() {
                if to as usize == o[0] {
                    v += rows.at(&[j, o[1]]);
                }
            }
            crate::common::round_to(dtype, v)
        });
        assert_close(
            &format!("index_add of a view {dtype}"),
            &Nd::of(&got).data,
            &want.data,
            reduce_tol(dtype, 3),
        );
        let empty = t.index_add(
            0,
            &Tensor::zeros([0], DType::I64),
            &Tensor::zeros([0, 5], dtype),
        )?;
        exact(
            &format!("empty index_add {dtype}"),
            &empty,
            &x.permute(&[1, 0]),
        );
    }
    Ok(())
}

/// `index_put` with two broadcasting index tensors into a 3-d input (the last dim kept
/// whole), accumulating repeats or not, an out-of-range position dropped, against loops.
#[test]
fn index_put_with_and_without_accumulate() -> Result<()> {
    let _mode = unchecked();
    for dtype in on_device([DType::F32, DType::I32]) {
        let x = Nd::random(
            &mut Rng::new(60),
            dtype,
            &[3, 4, 2],
            DEFAULT.quantized(0.25),
        );
        let i = Nd::new(&[5, 1], vec![0.0, 2.0, 2.0, 1.0, 3.0]); // 3 is out of range
        let j = Nd::new(&[1, 2], vec![1.0, 3.0]);
        let v = Nd::random(
            &mut Rng::new(61),
            dtype,
            &[5, 2, 2],
            DEFAULT.quantized(0.25),
        );
        for idx_dtype in on_device(INDEX) {
            let (ti, tj) = (i.tensor(idx_dtype), j.tensor(idx_dtype));
            let got = x
                .tensor(dtype)
                .index_put(&[&ti, &tj], &v.tensor(dtype), true)?;
            let mut want = x.clone();
            for a in 0..5 {
                for b in 0..2 {
                    let (r, c) = (i.data[a] as usize, j.data[b] as usize);
                    if r < 3 {
                        for e in 0..2 {
                            want.data[(r * 4 + c) * 2 + e] += v.data[(a * 2 + b) * 2 + e];
                        }
                    }
                }
            }
            assert_close(
                &format!("index_put accumulate {dtype} {idx_dtype}"),
                &Nd::of(&got).data,
                &want.data,
                1e-6,
            );
            // Without accumulate, only positions written once (row 2 repeats).
            let got = x
                .tensor(dtype)
                .index_put(&[&ti, &tj], &v.tensor(dtype), false)?;
            let g = Nd::of(&got);
            for (r, c, a, b) in [(0, 1, 0, 0), (0, 3, 0, 1), (1, 1, 3, 0), (1, 3, 3, 1)] {
                for e in 0..2 {
                    assert_eq!(
                        g.data[(r * 4 + c) * 2 + e],
                        v.data[(a * 2 + b) * 2 + e],
                        "index_put {dtype} at {r},{c}"
                    );
                }
            }
            assert_eq!(
                g.data[0], x.data[0],
                "untouched positions keep their values"
            );
        }
    }
    Ok(())
}

/// `index_put` of whole rows 300 wide: the last writer of each row is found once per row
/// and broadcast along it, and stays a kernel of its own where a GPU plan tries row
/// kernels.
#[test]
fn index_put_of_wide_rows() -> Result<()> {
    let x = Nd::random(&mut Rng::new(80), DType::F32, &[6, 300], DEFAULT);
    let v = Nd::random(&mut Rng::new(81), DType::F32, &[5, 300], DEFAULT);
    let rows = [4usize, 0, 4, 2, 5];
    let at = Tensor::from_vec(rows.iter().map(|&r| r as i64).collect::<Vec<_>>(), [5])?;
    let got = x
        .tensor(DType::F32)
        .index_put(&[&at], &v.tensor(DType::F32), false)?;
    let mut want = x.clone();
    for (j, &r) in rows.iter().enumerate() {
        want.data[r * 300..(r + 1) * 300].copy_from_slice(&v.data[j * 300..(j + 1) * 300]);
    }
    exact("index_put of wide rows", &got, &want);
    Ok(())
}

/// A scatter-add whose source is a gather from a table shaped like the destination (an
/// embedding's rows added into a table of the same size): one kernel binds a gathered
/// coordinate for the read and another for the write, of equal bounds.
#[test]
fn scatter_of_a_gather_from_a_table_of_the_same_shape() -> Result<()> {
    let (rows, width) = (6, 4);
    let table = Nd::random(
        &mut Rng::new(70),
        DType::F32,
        &[rows, width],
        DEFAULT.quantized(0.25),
    );
    let base = Nd::random(
        &mut Rng::new(71),
        DType::F32,
        &[rows, width],
        DEFAULT.quantized(0.25),
    );
    let read = Nd::new(&[5], vec![3.0, 0.0, 5.0, 3.0, 1.0]);
    let write = Nd::new(&[5], vec![2.0, 2.0, 4.0, 0.0, 5.0]);
    let picked = table
        .tensor(DType::F32)
        .index_select(0, &read.tensor(DType::I64))?;
    let got = base
        .tensor(DType::F32)
        .index_add(0, &write.tensor(DType::I64), &picked)?;
    let mut want = base.clone();
    for j in 0..5 {
        let (from, to) = (read.data[j] as usize, write.data[j] as usize);
        for c in 0..width {
            want.data[to * width + c] += table.data[from * width + c];
        }
    }
    assert_close(
        "index_add of gathered rows",
        &Nd::of(&got).data,
        &want.data,
        1e-6,
    );
    Ok(())
}
