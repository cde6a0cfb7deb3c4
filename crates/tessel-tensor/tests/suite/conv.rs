//! Convolution against direct f64 loops: odd sizes, stride, dilation, padding
//! (explicit and "same"), groups, bias, batch 1 and 0, unbatched inputs, non-contiguous
//! inputs, NaN and ±inf, every float dtype the device computes, kernel counts (with
//! pooling's) and errors; then `im2col` and transposed convolution. Pooling's values are
//! checked in `pool.rs`.

use crate::common;
use crate::common::nd::{Nd, assert_nd, reduce_tol, unravel};
use crate::common::{Domain, Rng};
use tessel_tensor::{
    Conv1dOptions, Conv2dOptions, Conv3dOptions, ConvOptions, DType, Padding, PoolOptions, Result,
    Tensor,
};

/// Values of magnitude about 1, so sums of products stay well inside f16.
const SMALL: Domain = Domain::new((-1.0, 1.0), (-9, 9));

fn random(seed: u64, dtype: DType, dims: &[usize]) -> Nd {
    Nd::random(&mut Rng::new(seed), dtype, dims, SMALL)
}

/// A convolution by its definition: for every output element, the sum over the group's
/// input channels and the kernel taps of input × weight, zero outside the input.
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &Nd,
    w: &Nd,
    bias: Option<&Nd>,
    stride: &[usize],
    pads: &[(usize, usize)],
    dilation: &[usize],
    groups: usize,
) -> Nd {
    let n = stride.len();
    let (nb, cin) = (x.dims[0], x.dims[1]);
    let (cout, cg) = (w.dims[0], w.dims[1]);
    let kernel = &w.dims[2..];
    let outs: Vec<usize> = (0..n)
        .map(|a| {
            (x.dims[2 + a] + pads[a].0 + pads[a].1 - dilation[a] * (kernel[a] - 1) - 1) / stride[a]
                + 1
        })
        .collect();
    let mut dims = vec![nb, cout];
    dims.extend(&outs);
    let taps: usize = kernel.iter().product();
    Nd::from_fn(&dims, |o| {
        let (b, co) = (o[0], o[1]);
        let g = co / (cout / groups);
        let mut acc = bias.map_or(0.0, |b| b.data[co]);
        for c in 0..cg {
            let ci = g * (cin / groups) + c;
            for t in 0..taps {
                let k = unravel(t, kernel);
                let mut idx = vec![b, ci];
                let mut inside = true;
                for a in 0..n {
                    let p = (o[2 + a] * stride[a] + k[a] * dilation[a]) as i64 - pads[a].0 as i64;
                    inside &= p >= 0 && p < x.dims[2 + a] as i64;
                    idx.push(p.max(0) as usize);
                }
                if inside {
                    let mut widx = vec![co, c];
                    widx.extend(&k);
                    acc += x.at(&idx) * w.at(&widx);
                }
            }
        }
        acc
    })
}

/// Options and the pads they mean, for the reference.
fn pads_of<const N: usize>(opts: &ConvOptions<N>, kernel: &[usize]) -> Vec<(usize, usize)> {
    match opts.padding {
        Padding::Valid => vec![(0, 0); N],
        Padding::Explicit(p) => p.iter().map(|&p| (p, p)).collect(),
        Padding::Same => (0..N)
            .map(|a| {
                let t = opts.dilation[a] * (kernel[a] - 1);
                (t / 2, t - t / 2)
            })
            .collect(),
    }
}

/// Runs `f` (a conv of the given rank) on random data and checks it against the reference.
fn check_conv<const N: usize>(
    seed: u64,
    dtype: DType,
    xdims: &[usize],
    wdims: &[usize],
    with_bias: bool,
    opts: &ConvOptions<N>,
    f: impl Fn(&Tensor, &Tensor, Option<&Tensor>, &ConvOptions<N>) -> Result<Tensor>,
) -> Result<()> {
    let x = random(seed, dtype, xdims);
    let w = random(seed + 100, dtype, wdims);
    let b = random(seed + 200, dtype, &[wdims[0]]);
    let bt = b.tensor(dtype);
    let y = f(
        &x.tensor(dtype),
        &w.tensor(dtype),
        with_bias.then_some(&bt),
        opts,
    )?;
    let what = format!("conv {dtype} x{xdims:?} w{wdims:?} {opts:?}");
    if common::skipped(&y, &what) {
        return Ok(());
    }
    let want = conv_ref(
        &x,
        &w,
        with_bias.then_some(&b),
        &opts.stride,
        &pads_of(opts, &wdims[2..]),
        &opts.dilation,
        opts.groups,
    );
    let n: usize = wdims[1..].iter().product();
    assert_nd(&what, &Nd::of(&y), &want, reduce_tol(dtype, n));
    Ok(())
}

fn conv2d(x: &Tensor, w: &Tensor, b: Option<&Tensor>, o: &Conv2dOptions) -> Result<Tensor> {
    x.conv2d(w, b, o)
}

fn conv1d(x: &Tensor, w: &Tensor, b: Option<&Tensor>, o: &Conv1dOptions) -> Result<Tensor> {
    x.conv1d(w, b, o)
}

fn conv3d(x: &Tensor, w: &Tensor, b: Option<&Tensor>, o: &Conv3dOptions) -> Result<Tensor> {
    x.conv3d(w, b, o)
}

#[test]
fn conv2d_matches_reference_across_options() -> Result<()> {
    let d = Conv2dOptions::default();
    let cases: [(&[usize], &[usize], bool, Conv2dOptions); 8] = [
        (&[2, 3, 7, 9], &[4, 3, 3, 3], true, d),
        (
            &[1, 3, 9, 8],
            &[5, 3, 3, 2],
            false,
            Conv2dOptions {
                stride: [2, 3],
                ..d
            },
        ),
        (
            &[2, 2, 11, 7],
            &[3, 2, 3, 3],
            true,
            Conv2dOptions {
                dilation: [2, 1],
                ..d
            },
        ),
        (
            &[1, 3, 6, 5],
            &[2, 3, 4, 3],
            true,
            Conv2dOptions {
                stride: [2, 2],
                padding: Padding::Explicit([2, 1]),
                dilation: [1, 2],
                ..d
            },
        ),
        (
            &[2, 4, 5, 5],
            &[6, 2, 3, 3],
            true,
            Conv2dOptions {
                groups: 2,
                padding: Padding::Explicit([1, 1]),
                ..d
            },
        ),
        (
            &[1, 6, 5, 4],
            &[6, 1, 2, 2],
            false,
            Conv2dOptions { groups: 6, ..d },
        ),
        (&[1, 1, 1, 1], &[1, 1, 1, 1], true, d),
        (
            &[3, 2, 4, 1],
            &[1, 2, 1, 1],
            false,
            Conv2dOptions {
                stride: [3, 1],
                ..d
            },
        ),
    ];
    for (i, (xd, wd, bias, opts)) in cases.iter().enumerate() {
        check_conv(i as u64, DType::F32, xd, wd, *bias, opts, conv2d)?;
    }
    Ok(())
}

#[test]
fn conv2d_same_padding_keeps_the_size() -> Result<()> {
    let cases: [(&[usize], [usize; 2]); 3] = [
        (&[2, 3, 3, 3], [1, 1]),
        (&[2, 3, 4, 2], [1, 1]),
        (&[2, 3, 3, 4], [2, 3]),
    ];
    for (i, (wd, dilation)) in cases.iter().enumerate() {
        let opts = Conv2dOptions {
            padding: Padding::Same,
            dilation: *dilation,
            ..Conv2dOptions::default()
        };
        check_conv(
            10 + i as u64,
            DType::F32,
            &[1, 3, 7, 8],
            wd,
            true,
            &opts,
            conv2d,
        )?;
        let x = Tensor::zeros([1, 3, 7, 8], DType::F32);
        let w = Tensor::zeros(wd.to_vec(), DType::F32);
        assert_eq!(x.conv2d(&w, None, &opts)?.dims(), vec![1, 2, 7, 8]);
    }
    Ok(())
}

#[test]
fn conv1d_and_conv3d_match_reference() -> Result<()> {
    let d1 = Conv1dOptions::default();
    let cases1: [(&[usize], &[usize], Conv1dOptions); 4] = [
        (&[2, 3, 17], &[4, 3, 5], d1),
        (
            &[1, 4, 10],
            &[2, 2, 3],
            Conv1dOptions {
                stride: [2],
                dilation: [3],
                groups: 2,
                ..d1
            },
        ),
        (
            &[3, 1, 6],
            &[2, 1, 4],
            Conv1dOptions {
                padding: Padding::Same,
                ..d1
            },
        ),
        (
            &[1, 2, 5],
            &[3, 2, 3],
            Conv1dOptions {
                padding: Padding::Explicit([2]),
                stride: [2],
                ..d1
            },
        ),
    ];
    for (i, (xd, wd, opts)) in cases1.iter().enumerate() {
        check_conv(20 + i as u64, DType::F32, xd, wd, true, opts, conv1d)?;
    }
    let d3 = Conv3dOptions::default();
    let cases3: [(&[usize], &[usize], Conv3dOptions); 2] = [
        (&[1, 2, 4, 5, 3], &[3, 2, 2, 3, 2], d3),
        (
            &[2, 2, 5, 4, 6],
            &[2, 1, 3, 2, 2],
            Conv3dOptions {
                stride: [2, 1, 2],
                padding: Padding::Explicit([1, 0, 1]),
                dilation: [1, 2, 1],
                groups: 2,
            },
        ),
    ];
    for (i, (xd, wd, opts)) in cases3.iter().enumerate() {
        check_conv(30 + i as u64, DType::F32, xd, wd, i == 0, opts, conv3d)?;
    }
    Ok(())
}

#[test]
fn conv_other_float_dtypes() -> Result<()> {
    let opts = Conv2dOptions {
        stride: [2, 1],
        padding: Padding::Explicit([1, 1]),
        groups: 2,
        ..Conv2dOptions::default()
    };
    for dtype in common::on_device([DType::F64, DType::F16, DType::BF16]) {
        check_conv(40, dtype, &[2, 4, 7, 6], &[4, 2, 3, 3], true, &opts, conv2d)?;
        check_conv(
            41,
            dtype,
            &[1, 2, 9],
            &[3, 2, 3],
            false,
            &Conv1dOptions::default(),
            conv1d,
        )?;
    }
    Ok(())
}

#[test]
fn conv_non_contiguous_and_unbatched_inputs() -> Result<()> {
    // A channels-last buffer permuted to [N, C, H, W].
    let nhwc = random(50, DType::F32, &[2, 6, 5, 3]);
    let x = nhwc.permute(&[0, 3, 1, 2]);
    let w = random(51, DType::F32, &[4, 3, 3, 2]);
    let opts = Conv2dOptions {
        stride: [1, 2],
        padding: Padding::Explicit([1, 0]),
        ..Conv2dOptions::default()
    };
    let y = nhwc.tensor(DType::F32).permute(&[0, 3, 1, 2])?.conv2d(
        &w.tensor(DType::F32),
        None,
        &opts,
    )?;
    let want = conv_ref(
        &x,
        &w,
        None,
        &opts.stride,
        &[(1, 1), (0, 0)],
        &opts.dilation,
        1,
    );
    assert_nd(
        "permuted input",
        &Nd::of(&y),
        &want,
        reduce_tol(DType::F32, 18),
    );

    // Every other row of a taller buffer, and an unbatched [C, H, W] input.
    let tall = random(52, DType::F32, &[3, 14, 5]);
    let sliced = tall.slice(1, 1, 2, 7);
    let y = tall.tensor(DType::F32).slice(1, Some(1), None, 2)?.conv2d(
        &w.tensor(DType::F32),
        None,
        &Conv2dOptions::default(),
    )?;
    let want = conv_ref(
        &sliced.reshape(&[1, 3, 7, 5]),
        &w,
        None,
        &[1, 1],
        &[(0, 0); 2],
        &[1, 1],
        1,
    );
    assert_eq!(y.dims(), vec![4, 5, 4]);
    assert_nd(
        "sliced unbatched input",
        &Nd::of(&y),
        &want.reshape(&[4, 5, 4]),
        reduce_tol(DType::F32, 18),
    );
    Ok(())
}

#[test]
fn conv_propagates_nan_and_inf_and_handles_size_zero() -> Result<()> {
    let mut x = random(60, DType::F32, &[1, 2, 5, 5]);
    x.data[7] = f64::NAN;
    x.data[30] = f64::INFINITY;
    x.data[44] = f64::NEG_INFINITY;
    let w = random(61, DType::F32, &[3, 2, 2, 2]);
    let opts = Conv2dOptions {
        padding: Padding::Explicit([1, 1]),
        ..Conv2dOptions::default()
    };
    let y = x
        .tensor(DType::F32)
        .conv2d(&w.tensor(DType::F32), None, &opts)?;
    let want = conv_ref(&x, &w, None, &[1, 1], &[(1, 1); 2], &[1, 1], 1);
    assert!(want.data.iter().any(|v| v.is_nan()) && want.data.iter().any(|v| v.is_infinite()));
    assert_nd("nan/inf", &Nd::of(&y), &want, reduce_tol(DType::F32, 8));

    let empty = Tensor::zeros([0, 2, 5, 5], DType::F32);
    let y = empty.conv2d(&w.tensor(DType::F32), None, &opts)?;
    assert_eq!(y.dims(), vec![0, 3, 6, 6]);
    assert!(common::read(&y).is_empty());
    let no_out = Tensor::zeros([0, 2, 2, 2], DType::F32);
    let y = x
        .tensor(DType::F32)
        .conv2d(&no_out, None, &Conv2dOptions::default())?;
    assert_eq!(y.dims(), vec![1, 0, 4, 4]);
    Ok(())
}

/// Realizes `t` and returns how many kernels ran.
fn kernels(t: &Tensor) -> Result<usize> {
    Ok(t.realize()?.kernels)
}

#[test]
fn conv_and_pooling_fuse_into_few_kernels() -> Result<()> {
    let x = random(70, DType::F32, &[2, 4, 9, 9]).tensor(DType::F32);
    let w = random(71, DType::F32, &[6, 2, 3, 3]).tensor(DType::F32);
    let b = random(72, DType::F32, &[6]).tensor(DType::F32);
    let opts = Conv2dOptions {
        stride: [2, 2],
        padding: Padding::Explicit([1, 1]),
        groups: 2,
        ..Conv2dOptions::default()
    };
    let n = kernels(&x.conv2d(&w, Some(&b), &opts)?)?;
    assert!(n <= 2, "conv2d: {n} kernels");
    let pool = PoolOptions {
        padding: [1, 1],
        ceil_mode: true,
        ..PoolOptions::new([3, 3])
    };
    let n = kernels(&x.max_pool2d(&pool)?)?;
    assert!(n <= 2, "max_pool2d: {n} kernels");
    let n = kernels(&x.avg_pool2d(&pool)?)?;
    assert!(n <= 2, "avg_pool2d: {n} kernels");
    Ok(())
}

#[test]
fn conv_errors_name_the_op_shapes_and_fix() {
    let x = Tensor::zeros([1, 4, 5, 5], DType::F32);
    let w = |d: &[usize]| Tensor::zeros(d.to_vec(), DType::F32);
    let d = Conv2dOptions::default();
    let inv = common::invalid("conv2d");
    common::assert_err(
        "channels",
        x.conv2d(&w(&[2, 3, 3, 3]), None, &d),
        &inv,
        &["[1, 4, 5, 5]", "must be 4"],
    );
    common::assert_err(
        "groups",
        x.conv2d(&w(&[2, 4, 3, 3]), None, &Conv2dOptions { groups: 3, ..d }),
        &inv,
        &["groups=3", "divide"],
    );
    common::assert_err(
        "kernel too large",
        x.conv2d(
            &w(&[2, 4, 6, 3]),
            None,
            &Conv2dOptions {
                dilation: [1, 1],
                ..d
            },
        ),
        &inv,
        &["more than the padded input", "more padding"],
    );
    common::assert_err(
        "same with stride",
        x.conv2d(
            &w(&[2, 4, 3, 3]),
            None,
            &Conv2dOptions {
                stride: [2, 1],
                padding: Padding::Same,
                ..d
            },
        ),
        &inv,
        &["stride 1", "Explicit"],
    );
    common::assert_err(
        "rank",
        x.conv2d(&w(&[2, 4, 3]), None, &d),
        &inv,
        &["weight must be 4-d"],
    );
    common::assert_err(
        "input rank",
        w(&[5]).conv2d(&w(&[2, 4, 3, 3]), None, &d),
        &inv,
        &["4-d input"],
    );
    common::assert_err(
        "stride 0",
        x.conv2d(
            &w(&[2, 4, 3, 3]),
            None,
            &Conv2dOptions {
                stride: [0, 1],
                ..d
            },
        ),
        &inv,
        &["stride"],
    );
    common::assert_err(
        "bias",
        x.conv2d(&w(&[2, 4, 3, 3]), Some(&w(&[3])), &d),
        &inv,
        &["bias", "2 output channels"],
    );
    common::assert_err(
        "dtype mismatch",
        x.conv2d(&Tensor::zeros([2, 4, 3, 3], DType::F64), None, &d),
        &inv,
        &["f64", "cast"],
    );
    let xi = Tensor::zeros([1, 4, 5, 5], DType::I32);
    common::assert_err(
        "int input",
        xi.conv2d(&Tensor::zeros([2, 4, 3, 3], DType::I32), None, &d),
        common::unsupported("conv2d", DType::I32),
        &["float"],
    );
}

// === im2col ===

#[test]
fn im2col_matches_reference() -> Result<()> {
    // (input, kernel, dilation, padding, stride)
    type Case = ([usize; 4], [usize; 2], [usize; 2], [usize; 2], [usize; 2]);
    let cases: [Case; 4] = [
        ([2, 3, 5, 4], [2, 3], [1, 1], [0, 0], [1, 1]),
        ([1, 2, 7, 6], [3, 2], [2, 1], [1, 2], [2, 3]),
        ([1, 1, 1, 1], [1, 1], [1, 1], [0, 0], [1, 1]),
        ([0, 2, 3, 3], [2, 2], [1, 1], [0, 0], [1, 1]),
    ];
    for dtype in common::on_device([DType::F32, DType::I32, DType::F64]) {
        for (i, (xd, k, d, p, s)) in cases.iter().enumerate() {
            let x = random(120 + i as u64, dtype, xd);
            let y = x.tensor(dtype).im2col(*k, *d, *p, *s)?;
            let what = format!("im2col {dtype} {xd:?} k{k:?} d{d:?} p{p:?} s{s:?}");
            if common::skipped(&y, &what) {
                continue;
            }
            let o: Vec<usize> = (0..2)
                .map(|a| (xd[2 + a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) / s[a] + 1)
                .collect();
            let want = Nd::from_fn(&[xd[0], xd[1] * k[0] * k[1], o[0] * o[1]], |idx| {
                let (c, t) = (idx[1] / (k[0] * k[1]), idx[1] % (k[0] * k[1]));
                let (ki, kj) = (t / k[1], t % k[1]);
                let (oi, oj) = (idx[2] / o[1], idx[2] % o[1]);
                let r = (oi * s[0] + ki * d[0]) as i64 - p[0] as i64;
                let q = (oj * s[1] + kj * d[1]) as i64 - p[1] as i64;
                if r < 0 || q < 0 || r >= xd[2] as i64 || q >= xd[3] as i64 {
                    0.0
                } else {
                    x.at(&[idx[0], c, r as usize, q as usize])
                }
            });
            assert_nd(&what, &Nd::of(&y), &want, 0.0);
        }
    }
    // Unbatched and permuted: [W, H, C] viewed as [C, H, W].
    let whc = random(130, DType::F32, &[4, 3, 2]);
    let y = whc
        .tensor(DType::F32)
        .permute(&[2, 1, 0])?
        .im2col([2, 2], [1, 1], [0, 0], [1, 1])?;
    let chw = whc.permute(&[2, 1, 0]);
    let want = Nd::from_fn(&[8, 6], |idx| {
        let (c, ki, kj) = (idx[0] / 4, (idx[0] % 4) / 2, idx[0] % 2);
        chw.at(&[c, idx[1] / 3 + ki, idx[1] % 3 + kj])
    });
    assert_nd("im2col unbatched permuted", &Nd::of(&y), &want, 0.0);
    common::assert_err(
        "im2col too large",
        Tensor::zeros([1, 1, 2, 2], DType::F32).im2col([3, 1], [1, 1], [0, 0], [1, 1]),
        common::invalid("im2col"),
        &["more than the padded input", "[1, 1, 2, 2]"],
    );
    Ok(())
}

// === Transposed convolution ===

/// A transposed convolution by its definition: every input element scatters
/// `x * w[ci, co_local, k]` to output position `i * s - p + k * d`.
#[allow(clippy::too_many_arguments)]
fn conv_transpose_ref(
    x: &Nd,
    w: &Nd,
    bias: Option<&Nd>,
    stride: &[usize],
    pad: &[usize],
    out_pad: &[usize],
    dil: &[usize],
    groups: usize,
) -> Nd {
    let n = stride.len();
    let (nb, cin) = (x.dims[0], x.dims[1]);
    let cog = w.dims[1];
    let kernel = &w.dims[2..];
    let mut dims = vec![nb, cog * groups];
    for a in 0..n {
        dims.push(
            (x.dims[2 + a] - 1) * stride[a] + dil[a] * (kernel[a] - 1) + out_pad[a] + 1
                - 2 * pad[a],
        );
    }
    let spatial_in = &x.dims[2..];
    let taps: usize = kernel.iter().product();
    let positions: usize = spatial_in.iter().product();
    Nd::from_fn(&dims, |o| {
        let (b, co) = (o[0], o[1]);
        let (g, col) = (co / cog, co % cog);
        let mut acc = bias.map_or(0.0, |b| b.data[co]);
        for c in 0..cin / groups {
            let ci = g * (cin / groups) + c;
            for pos in 0..positions {
                let i = unravel(pos, spatial_in);
                for t in 0..taps {
                    let k = unravel(t, kernel);
                    let hit = (0..n).all(|a| {
                        (i[a] * stride[a] + k[a] * dil[a]) as i64 - pad[a] as i64 == o[2 + a] as i64
                    });
                    if hit {
                        let mut xi = vec![b, ci];
                        xi.extend(&i);
                        let mut wi = vec![ci, col];
                        wi.extend(&k);
                        acc += x.at(&xi) * w.at(&wi);
                    }
                }
            }
        }
        acc
    })
}

#[test]
fn conv_transpose_matches_reference() -> Result<()> {
    // (input, weight, opts, output_padding)
    type Case<'a> = (&'a [usize], &'a [usize], Conv2dOptions, [usize; 2]);
    let d = Conv2dOptions::default();
    let cases: [Case; 5] = [
        (&[2, 3, 4, 5], &[3, 2, 3, 3], d, [0, 0]),
        (
            &[1, 2, 3, 4],
            &[2, 3, 3, 2],
            Conv2dOptions {
                stride: [2, 3],
                ..d
            },
            [1, 2],
        ),
        (
            &[1, 4, 5, 3],
            &[4, 1, 3, 3],
            Conv2dOptions {
                stride: [2, 1],
                padding: Padding::Explicit([1, 2]),
                dilation: [1, 2],
                groups: 2,
            },
            [1, 1],
        ),
        (
            &[1, 2, 4, 4],
            &[2, 2, 2, 2],
            Conv2dOptions {
                padding: Padding::Explicit([1, 1]),
                ..d
            },
            [0, 0],
        ),
        (&[1, 1, 1, 1], &[1, 1, 1, 1], d, [0, 0]),
    ];
    for dtype in common::on_device([DType::F32, DType::F64, DType::F16]) {
        for (i, (xd, wd, opts, op)) in cases.iter().enumerate() {
            if dtype != DType::F32 && i != 2 {
                continue;
            }
            let x = random(140 + i as u64, dtype, xd);
            let w = random(150 + i as u64, dtype, wd);
            let b = random(160 + i as u64, dtype, &[wd[1] * opts.groups]);
            let bt = b.tensor(dtype);
            let bias = (i % 2 == 0).then_some(&bt);
            let y = x
                .tensor(dtype)
                .conv_transpose2d(&w.tensor(dtype), bias, opts, *op)?;
            let what = format!("conv_transpose2d {dtype} x{xd:?} w{wd:?} {opts:?} {op:?}");
            if common::skipped(&y, &what) {
                continue;
            }
            let p = match opts.padding {
                Padding::Explicit(p) => p,
                _ => [0, 0],
            };
            let want = conv_transpose_ref(
                &x,
                &w,
                (i % 2 == 0).then_some(&b),
                &opts.stride,
                &p,
                op,
                &opts.dilation,
                opts.groups,
            );
            assert_nd(&what, &Nd::of(&y), &want, reduce_tol(dtype, 2 * xd[1] * 9));
        }
    }
    // 3-d.
    let x = random(172, DType::F32, &[1, 2, 3, 2, 3]);
    let w = random(173, DType::F32, &[2, 2, 2, 3, 2]);
    let opts = Conv3dOptions {
        stride: [2, 1, 3],
        padding: Padding::Explicit([1, 1, 0]),
        ..Conv3dOptions::default()
    };
    let y = x
        .tensor(DType::F32)
        .conv_transpose3d(&w.tensor(DType::F32), None, &opts, [1, 0, 2])?;
    let want = conv_transpose_ref(
        &x,
        &w,
        None,
        &[2, 1, 3],
        &[1, 1, 0],
        &[1, 0, 2],
        &[1, 1, 1],
        1,
    );
    assert_nd(
        "conv_transpose3d",
        &Nd::of(&y),
        &want,
        reduce_tol(DType::F32, 24),
    );
    // 1-d, unbatched, on a sliced input.
    let tall = random(170, DType::F32, &[3, 14]);
    let x = tall.slice(1, 0, 2, 7);
    let w = random(171, DType::F32, &[3, 2, 4]);
    let opts = Conv1dOptions {
        stride: [3],
        padding: Padding::Explicit([2]),
        ..Conv1dOptions::default()
    };
    let y = tall
        .tensor(DType::F32)
        .slice(1, None, None, 2)?
        .conv_transpose1d(&w.tensor(DType::F32), None, &opts, [2])?;
    let want = conv_transpose_ref(&x.reshape(&[1, 3, 7]), &w, None, &[3], &[2], &[2], &[1], 1);
    let n = want.dims[2];
    assert_nd(
        "conv_transpose1d",
        &Nd::of(&y),
        &want.reshape(&[2, n]),
        reduce_tol(DType::F32, 12),
    );
    assert!(kernels(&y)? <= 2);
    Ok(())
}

#[test]
fn conv_transpose_errors() {
    let x = Tensor::zeros([1, 4, 3, 3], DType::F32);
    let w = Tensor::zeros([4, 2, 3, 3], DType::F32);
    let d = Conv2dOptions::default();
    let inv = common::invalid("conv_transpose2d");
    common::assert_err(
        "output_padding",
        x.conv_transpose2d(&w, None, &d, [1, 0]),
        &inv,
        &["output_padding", "smaller"],
    );
    common::assert_err(
        "same",
        x.conv_transpose2d(
            &w,
            None,
            &Conv2dOptions {
                padding: Padding::Same,
                ..d
            },
            [0, 0],
        ),
        &inv,
        &["Explicit"],
    );
    common::assert_err(
        "channels",
        x.conv_transpose2d(&Tensor::zeros([3, 2, 3, 3], DType::F32), None, &d, [0, 0]),
        &inv,
        &["4 channels", "[3, 2, 3, 3]"],
    );
    common::assert_err(
        "too much padding",
        x.conv_transpose2d(
            &w,
            None,
            &Conv2dOptions {
                padding: Padding::Explicit([3, 0]),
                ..d
            },
            [0, 0],
        ),
        &inv,
        &["no elements", "reduce the padding"],
    );
}
