//! Max and average pooling against direct f64 loops: kernel, stride, padding, dilation,
//! ceil mode, `count_include_pad`, NaN and ±inf, size-0 and size-1 dims, unbatched and
//! non-contiguous inputs, every float dtype the device computes, and errors; then
//! `return_indices`, adaptive average pooling and nearest / linear interpolation. (Most
//! kernel counts are checked with convolution's in `conv.rs`.)

use crate::common;
use crate::common::nd::{Nd, assert_nd, reduce_tol, unravel};
use crate::common::{Domain, Rng};
use tessel_tensor::{DType, PoolOptions, Result, Tensor};

/// Values of magnitude about 1.
const SMALL: Domain = Domain::new((-1.0, 1.0), (-9, 9));

fn random(seed: u64, dtype: DType, dims: &[usize]) -> Nd {
    Nd::random(&mut Rng::new(seed), dtype, dims, SMALL)
}

/// Max (`avg == None`) or average (`Some(count_include_pad)`) pooling by its definition,
/// with `PyTorch`'s output size and divisor formulas.
fn pool_ref(
    x: &Nd,
    kernel: &[usize],
    opts: (&[usize], &[usize], &[usize], bool),
    avg: Option<bool>,
) -> Nd {
    let (stride, pad, dil, ceil) = opts;
    let n = kernel.len();
    let lead = x.dims.len() - n;
    let mut dims = x.dims[..lead].to_vec();
    for a in 0..n {
        let (i, eff) = (x.dims[lead + a], dil[a] * (kernel[a] - 1) + 1);
        let num = i + 2 * pad[a] - eff;
        let mut o = if ceil {
            num.div_ceil(stride[a]) + 1
        } else {
            num / stride[a] + 1
        };
        if ceil && (o - 1) * stride[a] >= i + pad[a] {
            o -= 1;
        }
        dims.push(o);
    }
    let taps: usize = kernel.iter().product();
    Nd::from_fn(&dims, |o| {
        let (mut best, mut sum, mut real) = (f64::NEG_INFINITY, 0.0, 0usize);
        let mut divisor = 1usize;
        for a in 0..n {
            let start = (o[lead + a] * stride[a]) as i64 - pad[a] as i64;
            let end = (start + kernel[a] as i64).min((x.dims[lead + a] + pad[a]) as i64);
            divisor *= (end - start) as usize;
        }
        for t in 0..taps {
            let k = unravel(t, kernel);
            let mut idx = o[..lead].to_vec();
            let mut inside = true;
            for a in 0..n {
                let p = (o[lead + a] * stride[a] + k[a] * dil[a]) as i64 - pad[a] as i64;
                inside &= p >= 0 && p < x.dims[lead + a] as i64;
                idx.push(p.max(0) as usize);
            }
            if inside {
                let v = x.at(&idx);
                best = if best.is_nan() || v.is_nan() {
                    f64::NAN
                } else {
                    best.max(v)
                };
                sum += v;
                real += 1;
            }
        }
        match avg {
            None => best,
            Some(true) => sum / divisor as f64,
            Some(false) => sum / real as f64,
        }
    })
}

fn check_pool2d(
    seed: u64,
    dtype: DType,
    xdims: &[usize],
    opts: &PoolOptions<2>,
    edge: bool,
) -> Result<()> {
    let mut x = random(seed, dtype, xdims);
    if edge {
        x.data[3] = f64::NAN;
        x.data[10] = f64::INFINITY;
        x.data[17] = f64::NEG_INFINITY;
    }
    let t = x.tensor(dtype);
    let stride = opts.stride.unwrap_or(opts.kernel);
    let o = (
        &stride[..],
        &opts.padding[..],
        &opts.dilation[..],
        opts.ceil_mode,
    );
    let tol = reduce_tol(dtype, opts.kernel.iter().product());
    let y = t.max_pool2d(opts)?;
    let what = format!("max_pool2d {dtype} {xdims:?} {opts:?}");
    if !common::skipped(&y, &what) {
        assert_nd(
            &what,
            &Nd::of(&y),
            &pool_ref(&x, &opts.kernel, o, None),
            0.0,
        );
    }
    if opts.dilation == [1, 1] {
        let y = t.avg_pool2d(opts)?;
        let what = format!("avg_pool2d {dtype} {xdims:?} {opts:?}");
        if !common::skipped(&y, &what) {
            let want = pool_ref(&x, &opts.kernel, o, Some(opts.count_include_pad));
            assert_nd(&what, &Nd::of(&y), &want, tol);
        }
    }
    Ok(())
}

#[test]
fn pool2d_matches_reference_across_options() -> Result<()> {
    let p = PoolOptions::new([3, 3]);
    let cases = [
        PoolOptions::new([2, 2]),
        p,
        PoolOptions {
            stride: Some([2, 1]),
            ..p
        },
        PoolOptions {
            padding: [1, 1],
            ..p
        },
        PoolOptions {
            padding: [1, 0],
            count_include_pad: false,
            ..p
        },
        PoolOptions {
            ceil_mode: true,
            ..p
        },
        PoolOptions {
            ceil_mode: true,
            padding: [1, 1],
            stride: Some([2, 2]),
            ..p
        },
        PoolOptions {
            ceil_mode: true,
            padding: [1, 1],
            stride: Some([2, 2]),
            count_include_pad: false,
            ..p
        },
        PoolOptions {
            dilation: [2, 1],
            padding: [1, 1],
            ..p
        },
        PoolOptions {
            kernel: [2, 3],
            stride: Some([1, 2]),
            ceil_mode: true,
            ..p
        },
        PoolOptions::new([1, 1]),
    ];
    for (i, opts) in cases.iter().enumerate() {
        check_pool2d(80 + i as u64, DType::F32, &[2, 3, 8, 7], opts, false)?;
    }
    check_pool2d(
        95,
        DType::F32,
        &[1, 2, 7, 5],
        &PoolOptions {
            padding: [1, 1],
            ..p
        },
        true,
    )?;
    check_pool2d(
        96,
        DType::F32,
        &[1, 1, 1, 1],
        &PoolOptions::new([1, 1]),
        false,
    )?;
    check_pool2d(97, DType::F32, &[0, 2, 4, 4], &p, false)?;
    for dtype in common::on_device([DType::F64, DType::F16, DType::BF16]) {
        check_pool2d(
            98,
            dtype,
            &[1, 2, 7, 6],
            &PoolOptions {
                padding: [1, 1],
                ceil_mode: true,
                ..p
            },
            false,
        )?;
    }
    Ok(())
}

#[test]
fn pool1d_pool3d_unbatched_and_non_contiguous() -> Result<()> {
    let x = random(110, DType::F32, &[2, 3, 11]);
    let t = x.tensor(DType::F32);
    let cases = [
        PoolOptions::new([3]),
        PoolOptions {
            stride: Some([2]),
            padding: [1],
            ceil_mode: true,
            ..PoolOptions::new([3])
        },
        PoolOptions {
            dilation: [3],
            padding: [2],
            ..PoolOptions::new([3])
        },
    ];
    for opts in &cases {
        let s = opts.stride.unwrap_or(opts.kernel);
        let o = (
            &s[..],
            &opts.padding[..],
            &opts.dilation[..],
            opts.ceil_mode,
        );
        assert_nd(
            "max_pool1d",
            &Nd::of(&t.max_pool1d(opts)?),
            &pool_ref(&x, &opts.kernel, o, None),
            0.0,
        );
        if opts.dilation == [1] {
            let want = pool_ref(&x, &opts.kernel, o, Some(true));
            assert_nd("avg_pool1d", &Nd::of(&t.avg_pool1d(opts)?), &want, 1e-5);
        }
    }
    // 3-d.
    let x = random(112, DType::F32, &[1, 2, 5, 4, 6]);
    let t = x.tensor(DType::F32);
    let opts = PoolOptions {
        stride: Some([2, 1, 2]),
        padding: [1, 0, 1],
        ceil_mode: true,
        ..PoolOptions::new([3, 2, 3])
    };
    let o = (
        [2, 1, 2].as_slice(),
        [1, 0, 1].as_slice(),
        [1, 1, 1].as_slice(),
        true,
    );
    assert_nd(
        "max_pool3d",
        &Nd::of(&t.max_pool3d(&opts)?),
        &pool_ref(&x, &[3, 2, 3], o, None),
        0.0,
    );
    let want = pool_ref(&x, &[3, 2, 3], o, Some(true));
    assert_nd("avg_pool3d", &Nd::of(&t.avg_pool3d(&opts)?), &want, 1e-5);
    // Unbatched [C, H, W], permuted from [W, H, C].
    let whc = random(111, DType::F32, &[6, 5, 3]);
    let chw = whc.permute(&[2, 1, 0]);
    let t = whc.tensor(DType::F32).permute(&[2, 1, 0])?;
    let opts = PoolOptions {
        stride: Some([1, 2]),
        padding: [1, 1],
        ..PoolOptions::new([2, 3])
    };
    let o = (
        [1, 2].as_slice(),
        [1, 1].as_slice(),
        [1, 1].as_slice(),
        false,
    );
    let want = pool_ref(&chw, &[2, 3], o, None);
    assert_nd(
        "unbatched permuted max",
        &Nd::of(&t.max_pool2d(&opts)?),
        &want,
        0.0,
    );
    let want = pool_ref(&chw, &[2, 3], o, Some(true));
    assert_nd(
        "unbatched permuted avg",
        &Nd::of(&t.avg_pool2d(&opts)?),
        &want,
        1e-5,
    );
    Ok(())
}

#[test]
fn pool_errors_name_the_op_and_fix() {
    let x = Tensor::zeros([1, 2, 5, 5], DType::F32);
    let inv = common::invalid("max_pool2d");
    common::assert_err(
        "pad too large",
        x.max_pool2d(&PoolOptions {
            padding: [2, 0],
            ..PoolOptions::new([2, 2])
        }),
        &inv,
        &["at most half", "[2, 0]"],
    );
    common::assert_err(
        "kernel too large",
        x.max_pool2d(&PoolOptions::new([6, 1])),
        &inv,
        &["more than the padded input"],
    );
    common::assert_err(
        "kernel 0",
        x.max_pool2d(&PoolOptions::new([0, 1])),
        &inv,
        &["kernel"],
    );
    common::assert_err(
        "rank",
        Tensor::zeros([5], DType::F32).max_pool2d(&PoolOptions::new([1, 1])),
        &inv,
        &["4-d input", "[5]"],
    );
    common::assert_err(
        "avg dilation",
        x.avg_pool2d(&PoolOptions {
            dilation: [2, 2],
            ..PoolOptions::new([2, 2])
        }),
        common::invalid("avg_pool2d"),
        &["dilation"],
    );
    common::assert_err(
        "int input",
        Tensor::zeros([1, 2, 4], DType::I64).avg_pool1d(&PoolOptions::new([2])),
        common::unsupported("avg_pool1d", DType::I64),
        &["cast"],
    );
}

// === Adaptive average pooling ===

/// `PyTorch`'s adaptive average pooling by its definition.
fn adaptive_ref(x: &Nd, out: &[usize]) -> Nd {
    let n = out.len();
    let lead = x.dims.len() - n;
    let mut dims = x.dims[..lead].to_vec();
    dims.extend(out);
    Nd::from_fn(&dims, |o| {
        let ranges: Vec<(usize, usize)> = (0..n)
            .map(|a| {
                let i = x.dims[lead + a];
                (
                    o[lead + a] * i / out[a],
                    ((o[lead + a] + 1) * i).div_ceil(out[a]),
                )
            })
            .collect();
        let sizes: Vec<usize> = ranges.iter().map(|(s, e)| e - s).collect();
        let count: usize = sizes.iter().product();
        let mut sum = 0.0;
        for t in 0..count {
            let k = unravel(t, &sizes);
            let mut idx = o[..lead].to_vec();
            idx.extend((0..n).map(|a| ranges[a].0 + k[a]));
            sum += x.at(&idx);
        }
        sum / count as f64
    })
}

#[test]
fn adaptive_avg_pool_matches_reference() -> Result<()> {
    let cases: [(&[usize], [usize; 2]); 5] = [
        (&[2, 3, 7, 9], [3, 4]),
        (&[1, 2, 5, 5], [1, 1]),
        (&[1, 2, 4, 6], [4, 6]),
        (&[1, 1, 3, 2], [5, 7]),
        (&[0, 2, 4, 4], [2, 2]),
    ];
    for dtype in common::on_device([DType::F32, DType::F64, DType::F16]) {
        for (i, (xd, out)) in cases.iter().enumerate() {
            let mut x = random(180 + i as u64, dtype, xd);
            if i == 0 {
                x.data[5] = f64::NAN;
                x.data[70] = f64::INFINITY;
            }
            let y = x.tensor(dtype).adaptive_avg_pool2d(*out)?;
            let what = format!("adaptive_avg_pool2d {dtype} {xd:?} -> {out:?}");
            if common::skipped(&y, &what) {
                continue;
            }
            assert_nd(
                &what,
                &Nd::of(&y),
                &adaptive_ref(&x, out),
                reduce_tol(dtype, 12),
            );
        }
    }
    // 1-d, unbatched and sliced; and 2-d permuted.
    let tall = random(190, DType::F32, &[3, 22]);
    let y = tall
        .tensor(DType::F32)
        .slice(1, Some(1), None, 2)?
        .adaptive_avg_pool1d([4])?;
    assert_nd(
        "adaptive 1d",
        &Nd::of(&y),
        &adaptive_ref(&tall.slice(1, 1, 2, 11), &[4]),
        1e-5,
    );
    let whc = random(191, DType::F32, &[7, 5, 2]);
    let y = whc
        .tensor(DType::F32)
        .permute(&[2, 1, 0])?
        .adaptive_avg_pool2d([2, 3])?;
    assert_nd(
        "adaptive permuted",
        &Nd::of(&y),
        &adaptive_ref(&whc.permute(&[2, 1, 0]), &[2, 3]),
        1e-5,
    );
    assert!(y.realize()?.kernels <= 2);
    common::assert_err(
        "adaptive zero output",
        Tensor::zeros([1, 2, 4, 4], DType::F32).adaptive_avg_pool2d([0, 2]),
        common::invalid("adaptive_avg_pool2d"),
        &["output_size"],
    );
    common::assert_err(
        "adaptive empty input",
        Tensor::zeros([1, 2, 0, 4], DType::F32).adaptive_avg_pool2d([1, 1]),
        common::invalid("adaptive_avg_pool2d"),
        &["empty spatial dim", "[1, 2, 0, 4]"],
    );
    Ok(())
}

// === interpolate ===

/// `PyTorch`'s nearest source index (scale in f32).
fn nearest_src(i: usize, n: usize, m: usize) -> usize {
    if m == n {
        i
    } else if m == 2 * n {
        i / 2
    } else {
        ((i as f32 * (n as f32 / m as f32)).floor() as usize).min(n - 1)
    }
}

/// `PyTorch`'s linear source coordinate, in f64.
fn linear_src(i: usize, n: usize, m: usize, align_corners: bool) -> f64 {
    if align_corners {
        if m > 1 {
            i as f64 * (n - 1) as f64 / (m - 1) as f64
        } else {
            0.0
        }
    } else {
        ((i as f64 + 0.5) * n as f64 / m as f64 - 0.5).max(0.0)
    }
}

/// Separable resampling of the spatial dims of `[N, C, *spatial]` by its definition.
fn resize_ref(x: &Nd, size: &[usize], linear: Option<bool>) -> Nd {
    let mut dims = x.dims[..2].to_vec();
    dims.extend(size);
    let n = size.len();
    Nd::from_fn(&dims, |o| {
        if linear.is_none() {
            let mut idx = o[..2].to_vec();
            idx.extend((0..n).map(|a| nearest_src(o[2 + a], x.dims[2 + a], size[a])));
            return x.at(&idx);
        }
        let align_corners = linear == Some(true);
        // Every corner of the interpolation cell, with its weight.
        let mut acc = 0.0;
        for corner in 0..(1usize << n) {
            let mut idx = o[..2].to_vec();
            let mut weight = 1.0;
            for a in 0..n {
                let (len, m, i) = (x.dims[2 + a], size[a], o[2 + a]);
                let high = corner >> a & 1 == 1;
                let src = linear_src(i, len, m, align_corners);
                let lo = (src.floor() as usize).min(len - 1);
                let l1 = src - lo as f64;
                let hi = (lo + 1).min(len - 1);
                idx.push(if high { hi } else { lo });
                weight *= if high { l1 } else { 1.0 - l1 };
            }
            acc += weight * x.at(&idx);
        }
        acc
    })
}

#[test]
fn interpolate_nearest_matches_reference() -> Result<()> {
    let cases: [(&[usize], &[usize]); 5] = [
        (&[2, 3, 5, 7], &[9, 4]),
        (&[1, 2, 3, 4], &[6, 8]),
        (&[1, 1, 7], &[3]),
        (&[1, 2, 2, 3, 2], &[3, 5, 1]),
        (&[0, 2, 3, 3], &[5, 5]),
    ];
    for dtype in common::on_device([DType::F32, DType::I32, DType::F64, DType::F16]) {
        for (i, (xd, size)) in cases.iter().enumerate() {
            let mut x = random(200 + i as u64, dtype, xd);
            if i == 0 && dtype.is_float() {
                x.data[1] = f64::NAN;
                x.data[2] = f64::NEG_INFINITY;
                x.data[3] = -0.0;
            }
            let y = x.tensor(dtype).interpolate_nearest(size)?;
            let what = format!("interpolate_nearest {dtype} {xd:?} -> {size:?}");
            if common::skipped(&y, &what) {
                continue;
            }
            assert_eq!(y.dtype(), dtype, "{what}");
            let got = Nd::of(&y);
            let want = resize_ref(&x, size, None);
            assert_nd(&what, &got, &want, 0.0);
            let signs = |v: &Nd| {
                v.data
                    .iter()
                    .map(|f| f.is_sign_negative())
                    .collect::<Vec<_>>()
            };
            assert_eq!(signs(&got), signs(&want), "{what}: signs of zeros");
        }
    }
    Ok(())
}

#[test]
fn interpolate_linear_matches_reference() -> Result<()> {
    let cases: [(&[usize], &[usize]); 5] = [
        (&[2, 3, 5, 7], &[9, 4]),
        (&[1, 2, 4, 4], &[8, 8]),
        (&[1, 1, 7], &[3]),
        (&[1, 2, 2, 3, 2], &[3, 5, 1]),
        (&[1, 1, 1, 1], &[3, 2]),
    ];
    for dtype in common::on_device([DType::F32, DType::F64, DType::F16]) {
        for align_corners in [false, true] {
            for (i, (xd, size)) in cases.iter().enumerate() {
                let x = random(210 + i as u64, dtype, xd);
                let y = x.tensor(dtype).interpolate_linear(size, align_corners)?;
                let what =
                    format!("interpolate_linear {dtype} {xd:?} -> {size:?} ac={align_corners}");
                if common::skipped(&y, &what) {
                    continue;
                }
                let tol = if dtype == DType::F64 {
                    1e-12
                } else {
                    reduce_tol(dtype, 8)
                };
                assert_nd(
                    &what,
                    &Nd::of(&y),
                    &resize_ref(&x, size, Some(align_corners)),
                    tol,
                );
            }
        }
    }
    // A permuted input.
    let whc = random(220, DType::F32, &[5, 4, 3]);
    let chw = whc.permute(&[2, 1, 0]).reshape(&[1, 3, 4, 5]);
    let t = whc.tensor(DType::F32).permute(&[2, 1, 0])?.unsqueeze(0)?;
    let y = t.interpolate_linear(&[7, 3], false)?;
    let n = y.realize()?.kernels;
    assert!(n <= 2, "interpolate_linear 2-d: {n} kernels");
    assert_nd(
        "linear permuted",
        &Nd::of(&y),
        &resize_ref(&chw, &[7, 3], Some(false)),
        1e-5,
    );
    let y = t.interpolate_nearest(&[7, 3])?;
    let n = y.realize()?.kernels;
    assert!(n <= 2, "interpolate_nearest 2-d: {n} kernels");
    assert_nd(
        "nearest permuted",
        &Nd::of(&y),
        &resize_ref(&chw, &[7, 3], None),
        0.0,
    );
    common::assert_err(
        "rank",
        Tensor::zeros([4, 4], DType::F32).interpolate_linear(&[2, 2], false),
        common::invalid("interpolate_linear"),
        &["[4, 4]", "[2, 2]"],
    );
    common::assert_err(
        "size 0",
        t.interpolate_nearest(&[0, 3]),
        common::invalid("interpolate_nearest"),
        &["size"],
    );
    common::assert_err(
        "int linear",
        Tensor::zeros([1, 1, 4], DType::I32).interpolate_linear(&[2], true),
        common::unsupported("interpolate_linear", DType::I32),
        &["float"],
    );
    Ok(())
}

// === max pooling with indices ===

/// The flat input position of each window's maximum: the first strict maximum in window
/// order, the first NaN, or the window's first input position if nothing beats `-inf`.
fn argmax_ref(
    x: &Nd,
    kernel: &[usize],
    stride: &[usize],
    pad: &[usize],
    dil: &[usize],
    ceil: bool,
) -> Nd {
    let n = kernel.len();
    let lead = x.dims.len() - n;
    let spatial = &x.dims[lead..];
    let shape = pool_ref(x, kernel, (stride, pad, dil, ceil), None).dims;
    let taps: usize = kernel.iter().product();
    Nd::from_fn(&shape, |o| {
        let (mut best, mut at) = (f64::NEG_INFINITY, None::<usize>);
        let mut first = None;
        for t in 0..taps {
            let k = unravel(t, kernel);
            let mut pos = Vec::with_capacity(n);
            for a in 0..n {
                pos.push((o[lead + a] * stride[a] + k[a] * dil[a]) as i64 - pad[a] as i64);
            }
            if pos
                .iter()
                .zip(spatial)
                .any(|(&p, &s)| p < 0 || p >= s as i64)
            {
                continue;
            }
            let pos: Vec<usize> = pos.iter().map(|&p| p as usize).collect();
            let flat = (0..n).fold(0, |acc, a| acc * spatial[a] + pos[a]);
            first.get_or_insert(flat);
            let mut idx = o[..lead].to_vec();
            idx.extend(&pos);
            let v = x.at(&idx);
            if best.is_nan() {
                break;
            }
            if v.is_nan() || v > best {
                best = v;
                at = Some(flat);
            }
        }
        at.or(first).expect("a window holds an input element") as f64
    })
}

#[test]
fn max_pool_with_indices_matches_reference() -> Result<()> {
    let quantized = Domain::new((-2.0, 2.0), (0, 0)).quantized(1.0);
    let p = PoolOptions::new([3, 3]);
    let cases = [
        PoolOptions::new([2, 2]),
        PoolOptions {
            padding: [1, 1],
            stride: Some([2, 1]),
            ..p
        },
        PoolOptions {
            dilation: [2, 1],
            padding: [1, 1],
            ceil_mode: true,
            ..p
        },
        PoolOptions {
            stride: Some([2, 2]),
            ceil_mode: true,
            ..p
        },
    ];
    for dtype in common::on_device([DType::F32, DType::F64, DType::F16]) {
        for (i, opts) in cases.iter().enumerate() {
            let mut x = Nd::random(
                &mut Rng::new(230 + i as u64),
                dtype,
                &[2, 2, 7, 8],
                quantized,
            );
            // A NaN, and a corner of -inf so whole windows hold nothing larger.
            x.data[20] = f64::NAN;
            x.data[27] = f64::NAN;
            for r in 0..3 {
                for c in 0..3 {
                    x.data[56 + r * 8 + c] = f64::NEG_INFINITY;
                }
            }
            let (v, idx) = x.tensor(dtype).max_pool2d_with_indices(opts)?;
            let what = format!("max_pool2d_with_indices {dtype} {opts:?}");
            if common::skipped(&idx, &what) {
                continue;
            }
            let s = opts.stride.unwrap_or(opts.kernel);
            let o = (
                &s[..],
                &opts.padding[..],
                &opts.dilation[..],
                opts.ceil_mode,
            );
            assert_nd(
                &what,
                &Nd::of(&v),
                &pool_ref(&x, &opts.kernel, o, None),
                0.0,
            );
            assert_eq!(idx.dtype(), DType::I64);
            let want = argmax_ref(
                &x,
                &opts.kernel,
                &s,
                &opts.padding,
                &opts.dilation,
                opts.ceil_mode,
            );
            assert_nd(&what, &Nd::of(&idx), &want, 0.0);
        }
    }
    // 1-d, unbatched.
    let x = Nd::random(&mut Rng::new(240), DType::F32, &[3, 10], quantized);
    let opts = PoolOptions {
        padding: [1],
        stride: Some([2]),
        ceil_mode: true,
        ..PoolOptions::new([3])
    };
    let (_, idx) = x.tensor(DType::F32).max_pool1d_with_indices(&opts)?;
    assert_nd(
        "max_pool1d indices",
        &Nd::of(&idx),
        &argmax_ref(&x, &[3], &[2], &[1], &[1], true),
        0.0,
    );
    Ok(())
}
