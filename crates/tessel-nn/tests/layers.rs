//! Each layer's forward against an independent `f64` reference written here with plain
//! loops, on seeded random data; parameter names; train/eval switching; error paths.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tessel_nn::{
    AttentionMasks, AvgPool2d, BatchNorm1d, BatchNorm2d, BatchNormOptions, Conv1d, Conv2d, Dropout,
    Embedding, Flatten, Forward, GELU, GeluApproximate, LayerNorm, Linear, MaxPool2d, Module,
    MultiheadAttention, ParamKind, ParamOptions, RMSNorm, ReLU, Sequential, SiLU, Sigmoid, Tanh,
    scaled_dot_product_attention,
};
use tessel_tensor::{ConvOptions, DType, Padding, PoolOptions, Tensor};

mod common;
use common::{Rng, assert_close, assert_invalid, read, t64};

// =====================================================================================
// Helpers
// =====================================================================================

/// The process-wide generator is shared by the test threads: tests that draw from it
/// (building layers, dropout) hold this lock so seeded sequences stay reproducible.
static GENERATOR: Mutex<()> = Mutex::new(());

fn seeded(seed: u64) -> MutexGuard<'static, ()> {
    let guard = GENERATOR.lock().unwrap_or_else(PoisonError::into_inner);
    Tensor::manual_seed(seed);
    guard
}

fn f64_params() -> ParamOptions {
    ParamOptions::dtype(DType::F64)
}

/// Gives `t` fresh random values (same shape), returning them.
fn randomize(t: &Tensor, rng: &mut Rng) -> Vec<f64> {
    let v = rng.vec(t.numel());
    t.assign(&t64(&v, &t.dims()).cast(t.dtype())).unwrap();
    v
}

fn names(m: &dyn Module) -> Vec<String> {
    m.state().into_iter().map(|(n, _)| n).collect()
}

// =====================================================================================
// Linear
// =====================================================================================

fn linear_ref(x: &[f64], rows: usize, w: &[f64], b: Option<&[f64]>, out: usize) -> Vec<f64> {
    let inp = w.len() / out;
    let mut y = vec![0.0; rows * out];
    for r in 0..rows {
        for o in 0..out {
            let mut acc = b.map_or(0.0, |b| b[o]);
            for i in 0..inp {
                acc += x[r * inp + i] * w[o * inp + i];
            }
            y[r * out + o] = acc;
        }
    }
    y
}

#[test]
fn linear_matches_reference_in_f64_and_f32() {
    let _g = seeded(1);
    let mut rng = Rng(10);
    let layer = Linear::with_options(5, 3, true, &f64_params()).unwrap();
    let (w, b) = (read(layer.weight()), read(layer.bias().unwrap()));
    let x = rng.vec(2 * 4 * 5);
    let y = layer.forward(&t64(&x, &[2, 4, 5])).unwrap();
    assert_eq!(y.dims(), vec![2, 4, 3]);
    assert_close(&read(&y), &linear_ref(&x, 8, &w, Some(&b), 3), 1e-12);

    let no_bias = Linear::with_options(5, 3, false, &ParamOptions::default()).unwrap();
    assert!(no_bias.bias().is_none());
    assert_eq!(names(&no_bias), ["weight"]);
    let w = read(no_bias.weight());
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let y = no_bias
        .forward(&Tensor::from_vec(x32.clone(), [8, 5]).unwrap())
        .unwrap();
    let xr: Vec<f64> = x32.iter().map(|&v| f64::from(v)).collect();
    assert_close(&read(&y), &linear_ref(&xr, 8, &w, None, 3), 1e-5);
}

#[test]
fn linear_init_is_pytorch_uniform_and_seeded() {
    let draw = |seed| {
        let _g = seeded(seed);
        let l = Linear::new(16, 8).unwrap();
        (read(l.weight()), read(l.bias().unwrap()))
    };
    let (w, b) = draw(7);
    let bound = 1.0 / 4.0;
    assert!(w.iter().chain(&b).all(|v| v.abs() <= bound));
    // Spread over the interval, not a constant.
    let max = w.iter().copied().fold(f64::MIN, f64::max);
    let min = w.iter().copied().fold(f64::MAX, f64::min);
    assert!(max > 0.2 && min < -0.2, "weights span [{min}, {max}]");
    let mean = w.iter().sum::<f64>() / w.len() as f64;
    assert!(mean.abs() < 0.05, "mean {mean}");
    assert_eq!(draw(7), (w.clone(), b), "same seed, same parameters");
    assert_ne!(draw(8).0, w, "another seed, other parameters");
}

#[test]
fn linear_errors() {
    let _g = seeded(2);
    let l = Linear::new(4, 2).unwrap();
    assert_invalid(
        l.forward(&Tensor::ones([3, 5], DType::F32)),
        "Linear",
        "in_features = 4",
    );
    assert_invalid(
        l.forward(&Tensor::ones([3, 4], DType::F64)),
        "Linear",
        "cast the input",
    );
    assert_invalid(Linear::new(0, 2), "Linear::new", "positive");
    assert_invalid(
        Linear::with_options(2, 2, true, &ParamOptions::dtype(DType::I32)),
        "init::uniform",
        "float dtype",
    );
    assert_invalid(
        Linear::from_tensors(
            Tensor::ones([2, 3], DType::F32),
            Some(Tensor::ones([3], DType::F32)),
        ),
        "Linear::from_tensors",
        "bias must be [2]",
    );
}

// =====================================================================================
// Convolutions and pooling
// =====================================================================================

struct ConvCase {
    x: [usize; 4],
    w: [usize; 4],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
}

/// Cross-correlation of `[N, C, H, W]` with `[O, C/g, kH, kW]`, zero padding.
fn conv2d_ref(c: &ConvCase, x: &[f64], w: &[f64], b: Option<&[f64]>) -> (Vec<f64>, [usize; 4]) {
    let [n, ci, h, wd] = c.x;
    let [o, cg, kh, kw] = c.w;
    let out =
        |i: usize, k: usize, d: usize, s: usize, p: usize| (i + 2 * p - d * (k - 1) - 1) / s + 1;
    let oh = out(h, kh, c.dil[0], c.stride[0], c.pad[0]);
    let ow = out(wd, kw, c.dil[1], c.stride[1], c.pad[1]);
    let og = o / c.groups;
    let mut y = vec![0.0; n * o * oh * ow];
    for bi in 0..n {
        for oc in 0..o {
            let g = oc / og;
            for yi in 0..oh {
                for xi in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[oc]);
                    for cc in 0..cg {
                        let ic = g * cg + cc;
                        for u in 0..kh {
                            for v in 0..kw {
                                let hy =
                                    (yi * c.stride[0] + u * c.dil[0]) as isize - c.pad[0] as isize;
                                let wx =
                                    (xi * c.stride[1] + v * c.dil[1]) as isize - c.pad[1] as isize;
                                if hy < 0 || wx < 0 || hy as usize >= h || wx as usize >= wd {
                                    continue;
                                }
                                let xv = x[((bi * ci + ic) * h + hy as usize) * wd + wx as usize];
                                acc += xv * w[((oc * cg + cc) * kh + u) * kw + v];
                            }
                        }
                    }
                    y[((bi * o + oc) * oh + yi) * ow + xi] = acc;
                }
            }
        }
    }
    (y, [n, o, oh, ow])
}

#[test]
fn conv2d_matches_reference_with_stride_padding_dilation_groups() {
    let _g = seeded(3);
    let mut rng = Rng(30);
    let cases = [
        ConvCase {
            x: [2, 3, 7, 6],
            w: [4, 3, 3, 3],
            stride: [1, 1],
            pad: [0, 0],
            dil: [1, 1],
            groups: 1,
        },
        ConvCase {
            x: [1, 4, 9, 8],
            w: [6, 2, 3, 2],
            stride: [2, 1],
            pad: [1, 1],
            dil: [1, 2],
            groups: 2,
        },
        ConvCase {
            x: [2, 4, 8, 8],
            w: [4, 1, 3, 3],
            stride: [2, 2],
            pad: [2, 1],
            dil: [2, 1],
            groups: 4,
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let opts = ConvOptions {
            stride: c.stride,
            padding: Padding::Explicit(c.pad),
            dilation: c.dil,
            groups: c.groups,
        };
        let layer = Conv2d::with_options(
            c.x[1],
            c.w[0],
            [c.w[2], c.w[3]],
            opts,
            i != 1,
            &f64_params(),
        )
        .unwrap();
        assert_eq!(layer.weight().dims(), c.w.to_vec());
        let w = read(layer.weight());
        let b = layer.bias().map(read);
        // Init bound 1/sqrt(fan_in), fan_in = C/g * kH * kW.
        let bound = 1.0 / ((c.w[1] * c.w[2] * c.w[3]) as f64).sqrt();
        assert!(w.iter().all(|v| v.abs() <= bound));
        let x = rng.vec(c.x.iter().product());
        let y = layer.forward(&t64(&x, &c.x)).unwrap();
        let (want, shape) = conv2d_ref(c, &x, &w, b.as_deref());
        assert_eq!(y.dims(), shape.to_vec(), "case {i}");
        assert_close(&read(&y), &want, 1e-12);
    }
}

#[test]
fn conv1d_matches_reference_and_same_padding_keeps_length() {
    let _g = seeded(4);
    let mut rng = Rng(40);
    // Conv1d over [N, C, L] is conv2d over [N, C, 1, L].
    let c = ConvCase {
        x: [2, 4, 1, 11],
        w: [6, 2, 1, 3],
        stride: [1, 2],
        pad: [0, 1],
        dil: [1, 2],
        groups: 2,
    };
    let opts = ConvOptions {
        stride: [2],
        padding: Padding::Explicit([1]),
        dilation: [2],
        groups: 2,
    };
    let layer = Conv1d::with_options(4, 6, [3], opts, true, &f64_params()).unwrap();
    let w = read(layer.weight());
    let b = read(layer.bias().unwrap());
    let x = rng.vec(2 * 4 * 11);
    let y = layer.forward(&t64(&x, &[2, 4, 11])).unwrap();
    let (want, shape) = conv2d_ref(&c, &x, &w, Some(&b));
    assert_eq!(y.dims(), vec![shape[0], shape[1], shape[3]]);
    assert_close(&read(&y), &want, 1e-12);

    // Unbatched input and `Same` padding.
    let same = ConvOptions {
        padding: Padding::Same,
        ..ConvOptions::default()
    };
    let layer = Conv1d::with_options(4, 3, [3], same, false, &f64_params()).unwrap();
    let w = read(layer.weight());
    let x = rng.vec(4 * 9);
    let y = layer.forward(&t64(&x, &[4, 9])).unwrap();
    assert_eq!(y.dims(), vec![3, 9]);
    let c = ConvCase {
        x: [1, 4, 1, 9],
        w: [3, 4, 1, 3],
        stride: [1, 1],
        pad: [0, 1],
        dil: [1, 1],
        groups: 1,
    };
    assert_close(&read(&y), &conv2d_ref(&c, &x, &w, None).0, 1e-12);
}

#[test]
fn conv_errors() {
    let _g = seeded(5);
    let grouped = ConvOptions {
        groups: 2,
        ..ConvOptions::default()
    };
    assert_invalid(
        Conv2d::with_options(3, 4, [3, 3], grouped, true, &ParamOptions::default()),
        "Conv2d::new",
        "divide both in_channels = 3",
    );
    let strided_same = ConvOptions {
        stride: [2],
        padding: Padding::Same,
        ..ConvOptions::default()
    };
    assert_invalid(
        Conv1d::with_options(2, 2, [3], strided_same, true, &ParamOptions::default()),
        "Conv1d::new",
        "needs stride 1",
    );
    let conv = Conv2d::new(3, 4, [3, 3]).unwrap();
    assert_invalid(
        conv.forward(&Tensor::ones([1, 2, 5, 5], DType::F32)),
        "Conv2d",
        "takes 3 input channels",
    );
    assert_invalid(
        conv.forward(&Tensor::ones([5, 5], DType::F32)),
        "Conv2d",
        "[N, C_in, H, W]",
    );
}

#[test]
fn pools_match_reference() {
    let mut rng = Rng(50);
    let (n, c, h, w) = (2, 3, 7, 6);
    let x = rng.vec(n * c * h * w);
    let xt = t64(&x, &[n, c, h, w]);
    // Max pool: kernel 3x2, stride 2x2, padding 1x1 (padding is -inf).
    let opts = PoolOptions {
        stride: Some([2, 2]),
        padding: [1, 1],
        ..PoolOptions::new([3, 2])
    };
    let y = MaxPool2d::with_options(opts).unwrap().forward(&xt).unwrap();
    let (oh, ow) = ((h + 2 - 3) / 2 + 1, (w + 2 - 2) / 2 + 1);
    assert_eq!(y.dims(), vec![n, c, oh, ow]);
    let window = |p: usize, yi: usize, xi: usize, reduce: &mut dyn FnMut(Option<f64>)| {
        for u in 0..3 {
            for v in 0..2 {
                let (hy, wx) = ((yi * 2 + u) as isize - 1, (xi * 2 + v) as isize - 1);
                let inside = hy >= 0 && wx >= 0 && (hy as usize) < h && (wx as usize) < w;
                reduce(inside.then(|| x[(p * h + hy as usize) * w + wx as usize]));
            }
        }
    };
    let mut want_max = Vec::new();
    let mut want_avg = Vec::new();
    for p in 0..n * c {
        for yi in 0..oh {
            for xi in 0..ow {
                let (mut m, mut s) = (f64::NEG_INFINITY, 0.0);
                window(p, yi, xi, &mut |v| {
                    if let Some(v) = v {
                        m = m.max(v);
                        s += v;
                    }
                });
                want_max.push(m);
                want_avg.push(s / 6.0); // padding counted: the full 3x2 window
            }
        }
    }
    assert_close(&read(&y), &want_max, 0.0);
    let y = AvgPool2d::with_options(opts).unwrap().forward(&xt).unwrap();
    assert_close(&read(&y), &want_avg, 1e-12);

    // Defaults: stride = kernel.
    let y = MaxPool2d::new([2, 2]).unwrap().forward(&xt).unwrap();
    assert_eq!(y.dims(), vec![n, c, 3, 3]);
    assert_eq!(read(&y)[0], x[0].max(x[1]).max(x[w]).max(x[w + 1]));
    assert_invalid(MaxPool2d::new([0, 2]), "MaxPool2d::new", "positive");
    assert_invalid(
        MaxPool2d::with_options(PoolOptions {
            padding: [2, 0],
            ..PoolOptions::new([3, 3])
        }),
        "MaxPool2d::new",
        "half the kernel",
    );
}

// =====================================================================================
// Embedding and normalization
// =====================================================================================

#[test]
fn embedding_reads_rows() {
    let _g = seeded(6);
    let emb = Embedding::with_options(7, 3, &f64_params()).unwrap();
    let table = read(emb.weight());
    // N(0, 1) init: not constant, plausible spread.
    let var = table.iter().map(|v| v * v).sum::<f64>() / table.len() as f64;
    assert!(var > 0.2 && var < 3.0, "variance {var}");
    let idx = [3i64, 0, 6, 3, 5, 1];
    let y = emb
        .forward(&Tensor::from_slice(&idx, [2, 3]).unwrap())
        .unwrap();
    assert_eq!(y.dims(), vec![2, 3, 3]);
    let want: Vec<f64> = idx
        .iter()
        .flat_map(|&i| table[i as usize * 3..i as usize * 3 + 3].to_vec())
        .collect();
    assert_eq!(read(&y), want);
    let y32 = emb
        .forward(&Tensor::from_slice(&[2i32, 4], [2]).unwrap())
        .unwrap();
    assert_eq!(read(&y32), [&table[6..9], &table[12..15]].concat());
    assert_invalid(
        emb.forward(&Tensor::ones([2], DType::F32)),
        "Embedding",
        "i32 or i64",
    );
}

#[test]
fn layer_norm_matches_reference() {
    let _g = seeded(7);
    let mut rng = Rng(70);
    let ln = LayerNorm::with_options(&[3, 4], 1e-5, true, true, &f64_params()).unwrap();
    assert_eq!(read(ln.weight().unwrap()), vec![1.0; 12]);
    assert_eq!(read(ln.bias().unwrap()), vec![0.0; 12]);
    let w = randomize(ln.weight().unwrap(), &mut rng);
    let b = randomize(ln.bias().unwrap(), &mut rng);
    let x = rng.vec(2 * 3 * 12);
    let y = ln.forward(&t64(&x, &[2, 3, 3, 4])).unwrap();
    let mut want = Vec::new();
    for row in x.chunks(12) {
        let mean = row.iter().sum::<f64>() / 12.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 12.0;
        for (i, v) in row.iter().enumerate() {
            want.push((v - mean) / (var + 1e-5).sqrt() * w[i] + b[i]);
        }
    }
    assert_close(&read(&y), &want, 1e-12);
    assert_eq!(names(&ln), ["weight", "bias"]);

    // No affine parameters, f32 input.
    let plain =
        LayerNorm::with_options(&[12], 1e-3, false, false, &ParamOptions::default()).unwrap();
    assert!(names(&plain).is_empty());
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let y = plain
        .forward(&Tensor::from_vec(x32.clone(), [6, 12]).unwrap())
        .unwrap();
    let mut want = Vec::new();
    for row in x32.chunks(12) {
        let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        let mean = row.iter().sum::<f64>() / 12.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 12.0;
        want.extend(row.iter().map(|v| (v - mean) / (var + 1e-3).sqrt()));
    }
    assert_close(&read(&y), &want, 1e-4);
    assert_invalid(
        ln.forward(&Tensor::ones([2, 4, 3], DType::F64)),
        "LayerNorm",
        "must end with normalized_shape [3, 4]",
    );
}

#[test]
fn rms_norm_matches_reference() {
    let _g = seeded(8);
    let mut rng = Rng(80);
    let norm = RMSNorm::with_options(&[5], None, true, &f64_params()).unwrap();
    let w = randomize(norm.weight().unwrap(), &mut rng);
    let x = rng.vec(4 * 5);
    let y = norm.forward(&t64(&x, &[4, 5])).unwrap();
    let mut want = Vec::new();
    for row in x.chunks(5) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 5.0;
        want.extend(
            row.iter()
                .enumerate()
                .map(|(i, v)| v / (ms + f64::EPSILON).sqrt() * w[i]),
        );
    }
    assert_close(&read(&y), &want, 1e-12);
    assert_eq!(names(&norm), ["weight"]);

    let eps = RMSNorm::with_options(&[5], Some(0.5), false, &f64_params()).unwrap();
    let y = eps.forward(&t64(&x, &[4, 5])).unwrap();
    let mut want = Vec::new();
    for row in x.chunks(5) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 5.0;
        want.extend(row.iter().map(|v| v / (ms + 0.5).sqrt()));
    }
    assert_close(&read(&y), &want, 1e-12);
}

/// Batch statistics per channel of `[N, C, S]` data: (mean, biased var).
fn channel_stats(x: &[f64], n: usize, c: usize, s: usize) -> Vec<(f64, f64)> {
    (0..c)
        .map(|ch| {
            let vals: Vec<f64> = (0..n)
                .flat_map(|b| (0..s).map(move |i| (b, i)))
                .map(|(b, i)| x[(b * c + ch) * s + i])
                .collect();
            let m = vals.iter().sum::<f64>() / vals.len() as f64;
            let v = vals.iter().map(|x| (x - m).powi(2)).sum::<f64>() / vals.len() as f64;
            (m, v)
        })
        .collect()
}

#[test]
fn batch_norm_2d_train_updates_running_stats_and_eval_uses_them() {
    let _g = seeded(9);
    let mut rng = Rng(90);
    let (n, c, h, w) = (3, 2, 3, 4);
    let s = h * w;
    let bn = BatchNorm2d::with_options(c, BatchNormOptions::default(), &f64_params()).unwrap();
    assert_eq!(
        names(&bn),
        [
            "weight",
            "bias",
            "running_mean",
            "running_var",
            "num_batches_tracked"
        ]
    );
    let kinds: Vec<ParamKind> = {
        let mut k = Vec::new();
        bn.visit(&mut tessel_nn::Visitor::new(&mut |_, kind, _| k.push(kind)));
        k
    };
    assert_eq!(kinds[..2], [ParamKind::Parameter; 2]);
    assert_eq!(kinds[2..], [ParamKind::Buffer; 3]);
    let gamma = randomize(bn.weight().unwrap(), &mut rng);
    let beta = randomize(bn.bias().unwrap(), &mut rng);

    let (mut rm, mut rv) = (vec![0.0; c], vec![1.0; c]);
    for step in 0..2 {
        let x = rng.vec(n * c * s);
        let y = bn.forward(&t64(&x, &[n, c, h, w])).unwrap();
        let stats = channel_stats(&x, n, c, s);
        let mut want = vec![0.0; x.len()];
        for (i, v) in x.iter().enumerate() {
            let ch = (i / s) % c;
            let (m, var) = stats[ch];
            want[i] = (v - m) / (var + 1e-5).sqrt() * gamma[ch] + beta[ch];
        }
        assert_close(&read(&y), &want, 1e-12);
        let count = (n * s) as f64;
        for ch in 0..c {
            rm[ch] = 0.9 * rm[ch] + 0.1 * stats[ch].0;
            rv[ch] = 0.9 * rv[ch] + 0.1 * stats[ch].1 * count / (count - 1.0);
        }
        assert_close(&read(bn.running_mean().unwrap()), &rm, 1e-12);
        assert_close(&read(bn.running_var().unwrap()), &rv, 1e-12);
        assert_eq!(
            bn.num_batches_tracked().unwrap().item::<i64>().unwrap(),
            step + 1
        );
    }

    bn.eval();
    assert!(!bn.is_training());
    let x = rng.vec(n * c * s);
    let y = bn.forward(&t64(&x, &[n, c, h, w])).unwrap();
    let want: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let ch = (i / s) % c;
            (v - rm[ch]) / (rv[ch] + 1e-5).sqrt() * gamma[ch] + beta[ch]
        })
        .collect();
    assert_close(&read(&y), &want, 1e-12);
    // Evaluation leaves the statistics alone.
    assert_close(&read(bn.running_mean().unwrap()), &rm, 1e-12);
    assert_eq!(bn.num_batches_tracked().unwrap().item::<i64>().unwrap(), 2);
}

#[test]
fn batch_norm_1d_ranks_cumulative_momentum_and_untracked() {
    let _g = seeded(10);
    let mut rng = Rng(100);
    // [N, C] with momentum None: the running mean is the plain average of batch means.
    let opts = BatchNormOptions {
        momentum: None,
        ..BatchNormOptions::default()
    };
    let bn = BatchNorm1d::with_options(3, opts, &f64_params()).unwrap();
    let mut means = vec![0.0; 3];
    for step in 1..=3 {
        let x = rng.vec(4 * 3);
        let y = bn.forward(&t64(&x, &[4, 3])).unwrap();
        let stats = channel_stats(&x, 4, 3, 1);
        let want: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, v)| (v - stats[i % 3].0) / (stats[i % 3].1 + 1e-5).sqrt())
            .collect();
        assert_close(&read(&y), &want, 1e-12);
        for ch in 0..3 {
            means[ch] += (stats[ch].0 - means[ch]) / f64::from(step);
        }
    }
    assert_close(&read(bn.running_mean().unwrap()), &means, 1e-12);

    // [N, C, L], no affine, no running stats: batch statistics in both modes.
    let opts = BatchNormOptions {
        affine: false,
        track_running_stats: false,
        ..BatchNormOptions::default()
    };
    let bn = BatchNorm1d::with_options(2, opts, &f64_params()).unwrap();
    assert!(names(&bn).is_empty());
    bn.eval();
    let x = rng.vec(3 * 2 * 5);
    let y = bn.forward(&t64(&x, &[3, 2, 5])).unwrap();
    let stats = channel_stats(&x, 3, 2, 5);
    let want: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, v)| (v - stats[(i / 5) % 2].0) / (stats[(i / 5) % 2].1 + 1e-5).sqrt())
        .collect();
    assert_close(&read(&y), &want, 1e-12);

    let bn = BatchNorm1d::new(3).unwrap();
    assert_invalid(
        bn.forward(&Tensor::ones([4, 2], DType::F32)),
        "BatchNorm1d",
        "3 channels",
    );
    assert_invalid(
        bn.forward(&Tensor::ones([1, 3], DType::F32)),
        "BatchNorm1d",
        "more than 1 value per channel",
    );
    assert_invalid(
        bn.forward(&Tensor::ones([4, 3, 2, 2], DType::F32)),
        "BatchNorm1d",
        "[N, C] or [N, C, L]",
    );
    assert_invalid(
        BatchNorm2d::with_options(
            2,
            BatchNormOptions {
                momentum: Some(1.5),
                ..BatchNormOptions::default()
            },
            &ParamOptions::default(),
        ),
        "BatchNorm2d",
        "momentum",
    );
}

// =====================================================================================
// Dropout and activations
// =====================================================================================

#[test]
fn dropout_statistics_seeding_and_eval_identity() {
    let n = 20_000;
    let mut rng = Rng(110);
    let x = rng.vec(n);
    let xt = t64(&x, &[100, 200]);
    let run = |seed, p| {
        let _g = seeded(seed);
        read(&Dropout::new(p).unwrap().forward(&xt).unwrap())
    };
    for p in [0.1, 0.5, 0.8] {
        let y = run(1, p);
        let dropped = y.iter().filter(|&&v| v == 0.0).count() as f64 / n as f64;
        // Binomial: std of the fraction is sqrt(p(1-p)/n) < 0.0036; allow 5 sigma.
        assert!((dropped - p).abs() < 0.018, "p = {p}: dropped {dropped}");
        for (g, v) in y.iter().zip(&x) {
            assert!(*g == 0.0 || (g - v / (1.0 - p)).abs() <= 1e-12 * (1.0 + g.abs()));
        }
    }
    assert_eq!(run(5, 0.5), run(5, 0.5), "same seed, same mask");
    assert_ne!(run(5, 0.5), run(6, 0.5), "another seed, another mask");
    assert_eq!(run(5, 0.0), x);
    assert!(run(5, 1.0).iter().all(|&v| v == 0.0));

    let drop = Dropout::new(0.5).unwrap();
    drop.eval();
    assert!(!drop.is_training());
    assert_eq!(read(&drop.forward(&xt).unwrap()), x);
    drop.train(true);
    assert!(drop.is_training());
    assert_invalid(Dropout::new(1.5), "Dropout::new", "[0, 1]");
    assert_invalid(
        drop.forward(&Tensor::ones([2], DType::I32)),
        "Dropout",
        "float",
    );
}

/// A layer and its elementwise reference.
type ActivationCase = (Box<dyn Forward>, Box<dyn Fn(f64) -> f64>);

#[test]
fn activation_modules_match_reference() {
    let mut rng = Rng(120);
    let x = rng.vec(64);
    let xt = t64(&x, &[8, 8]);
    let erf_gelu = |v: f64| {
        // erf by its Taylor series, converging fast for |v / sqrt 2| < 2.
        let z = v / std::f64::consts::SQRT_2;
        let (mut term, mut sum, mut k) = (z, z, 0.0);
        while term.abs() > 1e-18 {
            k += 1.0;
            term *= -z * z / k;
            sum += term / (2.0 * k + 1.0);
        }
        0.5 * v * (1.0 + 2.0 / std::f64::consts::PI.sqrt() * sum)
    };
    let tanh_gelu = |v: f64| {
        0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
    };
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    let cases: Vec<ActivationCase> = vec![
        (Box::new(ReLU), Box::new(|v: f64| v.max(0.0))),
        (Box::new(SiLU), Box::new(move |v: f64| v * sigmoid(v))),
        (Box::new(Tanh), Box::new(f64::tanh)),
        (Box::new(Sigmoid), Box::new(sigmoid)),
        (Box::new(GELU::default()), Box::new(erf_gelu)),
        (
            Box::new(GELU::new(GeluApproximate::Tanh)),
            Box::new(tanh_gelu),
        ),
    ];
    for (i, (layer, f)) in cases.iter().enumerate() {
        let want: Vec<f64> = x.iter().map(|&v| f(v)).collect();
        let got = read(&layer.forward(&xt).unwrap());
        assert_close(&got, &want, 1e-10);
        assert!(
            names(layer.as_ref()).is_empty(),
            "activation {i} has parameters"
        );
    }
}

// =====================================================================================
// Attention
// =====================================================================================

/// `softmax(q kᵀ * scale + mask) v` for one head: q `[L, E]`, k `[S, E]`, v `[S, Ev]`;
/// `hidden(l, s)` says which scores are `-inf`, `bias(l, s)` adds to the rest.
fn attention_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (l, s, e, ev): (usize, usize, usize, usize),
    scale: f64,
    hidden: &dyn Fn(usize, usize) -> bool,
    bias: &dyn Fn(usize, usize) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; l * ev];
    let mut probs = vec![0.0; l * s];
    for i in 0..l {
        let scores: Vec<f64> = (0..s)
            .map(|j| {
                if hidden(i, j) {
                    f64::NEG_INFINITY
                } else {
                    (0..e).map(|d| q[i * e + d] * k[j * e + d]).sum::<f64>() * scale + bias(i, j)
                }
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
        for j in 0..s {
            let p = (scores[j] - m).exp() / z;
            probs[i * s + j] = p;
            for d in 0..ev {
                out[i * ev + d] += p * v[j * ev + d];
            }
        }
    }
    (out, probs)
}

#[test]
fn sdpa_matches_reference_with_masks_and_causal() {
    let mut rng = Rng(130);
    let (b, l, s, e, ev) = (3, 4, 5, 6, 3);
    let (q, k, v) = (rng.vec(b * l * e), rng.vec(b * s * e), rng.vec(b * s * ev));
    let (qt, kt, vt) = (
        t64(&q, &[b, l, e]),
        t64(&k, &[b, s, e]),
        t64(&v, &[b, s, ev]),
    );
    let keep: Vec<bool> = (0..l * s).map(|i| i % 3 != 1 || i % s == 0).collect();
    let add = rng.vec(l * s);
    let scale = 1.0 / (e as f64).sqrt();
    let cases: Vec<(Option<Tensor>, bool, Option<f64>)> = vec![
        (None, false, None),
        (None, true, None),
        (
            Some(Tensor::from_slice(&keep, [l, s]).unwrap()),
            false,
            Some(0.3),
        ),
        (Some(t64(&add, &[l, s])), false, None),
    ];
    // f64 runs the composition; f32 may run a fused kernel (the planner measures both).
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        let [qd, kd, vd] = [&qt, &kt, &vt].map(|t| t.cast(dtype));
        for (ci, (mask, causal, sc)) in cases.iter().enumerate() {
            let mask = mask.as_ref().map(|m| {
                if m.dtype() == DType::Bool {
                    m.clone()
                } else {
                    m.cast(dtype)
                }
            });
            let got = read(
                &scaled_dot_product_attention(
                    &qd,
                    &kd,
                    &vd,
                    mask.as_ref(),
                    0.0,
                    *causal,
                    *sc,
                    false,
                )
                .unwrap(),
            );
            let mut want = Vec::new();
            for bi in 0..b {
                let hidden =
                    |i: usize, j: usize| (*causal && j > i) || (ci == 2 && !keep[i * s + j]);
                let bias = |i: usize, j: usize| if ci == 3 { add[i * s + j] } else { 0.0 };
                let (o, _) = attention_ref(
                    &q[bi * l * e..][..l * e],
                    &k[bi * s * e..][..s * e],
                    &v[bi * s * ev..][..s * ev],
                    (l, s, e, ev),
                    sc.unwrap_or(scale),
                    &hidden,
                    &bias,
                );
                want.extend(o);
            }
            assert_close(&got, &want, tol);
        }
    }
    let r = scaled_dot_product_attention(
        &qt,
        &kt,
        &vt,
        Some(&t64(&add, &[l, s])),
        0.0,
        true,
        None,
        false,
    );
    assert_invalid(r, "scaled_dot_product_attention", "not both");
    let r = scaled_dot_product_attention(&qt, &vt, &vt, None, 0.0, false, None, false);
    assert_invalid(r, "scaled_dot_product_attention", "disagree");
    let r = scaled_dot_product_attention(
        &qt,
        &kt,
        &vt.cast(DType::F32),
        None,
        0.0,
        false,
        None,
        false,
    );
    assert_invalid(r, "scaled_dot_product_attention", "one float dtype");
}

/// Grouped-query attention (`enable_gqa`): 6 query heads over 2 key/value heads give what
/// attention over the key/value heads repeated for their 3 query heads each gives.
#[test]
fn sdpa_with_grouped_query_heads_repeats_each_kv_head() {
    let mut rng = Rng(41);
    let (b, l, s, e) = (2, 5, 7, 4);
    let q = t64(&rng.vec(b * 6 * l * e), &[b, 6, l, e]);
    let k = t64(&rng.vec(b * 2 * s * e), &[b, 2, s, e]);
    let v = t64(&rng.vec(b * 2 * s * e), &[b, 2, s, e]);
    let heads = |t: &Tensor| -> Tensor {
        let parts: Vec<Tensor> = (0..6).map(|h| t.narrow(1, h / 3, 1).unwrap()).collect();
        Tensor::cat(&parts.iter().collect::<Vec<_>>(), 1).unwrap()
    };
    for causal in [false, true] {
        let got = scaled_dot_product_attention(&q, &k, &v, None, 0.0, causal, None, true).unwrap();
        let want = scaled_dot_product_attention(
            &q,
            &heads(&k),
            &heads(&v),
            None,
            0.0,
            causal,
            None,
            false,
        )
        .unwrap();
        assert_close(&read(&got), &read(&want), 1e-12);
    }
    let k4 = t64(&rng.vec(b * 4 * s * e), &[b, 4, s, e]);
    let r = scaled_dot_product_attention(&q, &k4, &k4, None, 0.0, false, None, true);
    assert_invalid(r, "scaled_dot_product_attention", "divides q's");
}

/// `x [T, E] · W[rows]ᵀ + b[rows]` for the projection block `part` of `in_proj`.
fn project(x: &[f64], t: usize, e: usize, w: &[f64], b: &[f64], part: usize) -> Vec<f64> {
    linear_ref(
        x,
        t,
        &w[part * e * e..][..e * e],
        Some(&b[part * e..][..e]),
        e,
    )
}

#[test]
fn multihead_attention_matches_hand_written_reference() {
    let _g = seeded(11);
    let mut rng = Rng(140);
    let (n, l, s, e, h) = (2, 4, 3, 8, 2);
    let d = e / h;
    let mha = MultiheadAttention::with_options(e, h, true, &f64_params())
        .unwrap()
        .batch_first(true);
    assert_eq!(
        names(&mha),
        [
            "in_proj_weight",
            "in_proj_bias",
            "out_proj.weight",
            "out_proj.bias"
        ]
    );
    // Glorot bound for [3E, E]: sqrt(6 / (E + 3E)).
    let bound = (6.0 / (4 * e) as f64).sqrt();
    assert!(read(mha.in_proj_weight()).iter().all(|v| v.abs() <= bound));
    assert_eq!(read(mha.in_proj_bias().unwrap()), vec![0.0; 3 * e]);
    let w_in = read(mha.in_proj_weight());
    let b_in = randomize(mha.in_proj_bias().unwrap(), &mut rng);
    let w_out = read(mha.out_proj().weight());
    let b_out = randomize(mha.out_proj().bias().unwrap(), &mut rng);

    let (xq, xk, xv) = (rng.vec(n * l * e), rng.vec(n * s * e), rng.vec(n * s * e));
    let padding = [false, false, true, false, true, false]; // [N, S]: key 2 of batch 0, key 1 of batch 1
    let reference = |causal: bool, kpm: bool| {
        let mut out = Vec::new();
        let mut weights = Vec::new();
        for bi in 0..n {
            let qp = project(&xq[bi * l * e..][..l * e], l, e, &w_in, &b_in, 0);
            let kp = project(&xk[bi * s * e..][..s * e], s, e, &w_in, &b_in, 1);
            let vp = project(&xv[bi * s * e..][..s * e], s, e, &w_in, &b_in, 2);
            let head = |x: &[f64], t: usize, hi: usize| -> Vec<f64> {
                (0..t)
                    .flat_map(|r| x[r * e + hi * d..][..d].to_vec())
                    .collect()
            };
            let mut merged = vec![0.0; l * e];
            let mut avg = vec![0.0; l * s];
            for hi in 0..h {
                let hidden = |i: usize, j: usize| (causal && j > i) || (kpm && padding[bi * s + j]);
                let (o, p) = attention_ref(
                    &head(&qp, l, hi),
                    &head(&kp, s, hi),
                    &head(&vp, s, hi),
                    (l, s, d, d),
                    1.0 / (d as f64).sqrt(),
                    &hidden,
                    &|_, _| 0.0,
                );
                for i in 0..l {
                    merged[i * e + hi * d..][..d].copy_from_slice(&o[i * d..][..d]);
                }
                for (a, p) in avg.iter_mut().zip(p) {
                    *a += p / h as f64;
                }
            }
            out.extend(linear_ref(&merged, l, &w_out, Some(&b_out), e));
            weights.extend(avg);
        }
        (out, weights)
    };
    let (q, k, v) = (
        t64(&xq, &[n, l, e]),
        t64(&xk, &[n, s, e]),
        t64(&xv, &[n, s, e]),
    );
    let kpm = Tensor::from_slice(&padding, [n, s]).unwrap();
    for (causal, with_kpm) in [(false, false), (true, false), (true, true), (false, true)] {
        let masks = AttentionMasks {
            is_causal: causal,
            key_padding_mask: with_kpm.then_some(&kpm),
            ..AttentionMasks::default()
        };
        let (out, weights) = mha.forward_with_weights(&q, &k, &v, &masks).unwrap();
        assert_eq!(out.dims(), vec![n, l, e]);
        assert_eq!(weights.dims(), vec![n, l, s]);
        let (want_out, want_w) = reference(causal, with_kpm);
        assert_close(&read(&out), &want_out, 1e-12);
        assert_close(&read(&weights), &want_w, 1e-12);
    }

    // An explicit bool attn_mask (true = hidden) equal to the causal mask gives the same.
    let causal_mask: Vec<bool> = (0..l * s).map(|i| i % s > i / s).collect();
    let cm = Tensor::from_slice(&causal_mask, [l, s]).unwrap();
    let masks = AttentionMasks {
        attn_mask: Some(&cm),
        ..AttentionMasks::default()
    };
    assert_close(
        &read(&mha.forward(&q, &k, &v, &masks).unwrap()),
        &reference(true, false).0,
        1e-12,
    );

    // Unbatched input is batch element 0.
    let masks = AttentionMasks {
        is_causal: true,
        ..AttentionMasks::default()
    };
    let y = mha
        .forward(
            &q.narrow(0, 0, 1).unwrap().squeeze(Some(&[0])).unwrap(),
            &k.narrow(0, 0, 1).unwrap().squeeze(Some(&[0])).unwrap(),
            &v.narrow(0, 0, 1).unwrap().squeeze(Some(&[0])).unwrap(),
            &masks,
        )
        .unwrap();
    assert_eq!(y.dims(), vec![l, e]);
    assert_close(&read(&y), &reference(true, false).0[..l * e], 1e-12);

    assert_invalid(
        MultiheadAttention::new(10, 3),
        "MultiheadAttention::new",
        "multiple of num_heads",
    );
    assert_invalid(
        mha.forward(&q, &k, &q, &AttentionMasks::default()),
        "MultiheadAttention",
        "expected query",
    );
    let bad = Tensor::from_slice(&[true; 4], [2, 2]).unwrap();
    let masks = AttentionMasks {
        key_padding_mask: Some(&bad),
        ..AttentionMasks::default()
    };
    assert_invalid(
        mha.forward(&q, &k, &v, &masks),
        "MultiheadAttention",
        "key_padding_mask must be [2, 3]",
    );
}

/// PyTorch's default layout is sequence first: `[L, N, E]` in, `[L, N, E]` out, the same
/// values as the batch-first layout of the transposed input.
#[test]
fn multihead_attention_is_sequence_first_unless_batch_first() {
    let _g = seeded(13);
    let mut rng = Rng(141);
    Tensor::manual_seed(5);
    let seq_first = MultiheadAttention::with_options(8, 2, true, &f64_params()).unwrap();
    Tensor::manual_seed(5);
    let batch_first = MultiheadAttention::with_options(8, 2, true, &f64_params())
        .unwrap()
        .batch_first(true);
    let x = t64(&rng.vec(4 * 3 * 8), &[4, 3, 8]); // [L = 4, N = 3, E]
    let masks = AttentionMasks {
        is_causal: true,
        ..AttentionMasks::default()
    };
    let got = seq_first.forward(&x, &x, &x, &masks).unwrap();
    assert_eq!(got.dims(), vec![4, 3, 8]);
    let xt = x.transpose(0, 1).unwrap();
    let want = batch_first.forward(&xt, &xt, &xt, &masks).unwrap();
    assert_close(&read(&got.transpose(0, 1).unwrap()), &read(&want), 1e-12);
}

// =====================================================================================
// Sequential, naming, modes
// =====================================================================================

#[test]
fn sequential_names_forward_and_train_switch() {
    let _g = seeded(12);
    let mut rng = Rng(150);
    let inner = Sequential::new()
        .layer(Dropout::new(0.5).unwrap())
        .layer(Linear::with_options(6, 2, true, &f64_params()).unwrap());
    let model = Sequential::new()
        .layer(Linear::with_options(4, 6, true, &f64_params()).unwrap())
        .layer(ReLU)
        .layer(BatchNorm1d::with_options(6, BatchNormOptions::default(), &f64_params()).unwrap())
        .layer(inner);
    assert_eq!(model.len(), 4);
    assert_eq!(
        names(&model),
        [
            "0.weight",
            "0.bias",
            "2.weight",
            "2.bias",
            "2.running_mean",
            "2.running_var",
            "2.num_batches_tracked",
            "3.1.weight",
            "3.1.bias",
        ]
    );
    let buffers: Vec<String> = model.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        buffers,
        ["2.running_mean", "2.running_var", "2.num_batches_tracked"]
    );
    assert_eq!(model.buffers().len(), 3);
    let params: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        params,
        [
            "0.weight",
            "0.bias",
            "2.weight",
            "2.bias",
            "3.1.weight",
            "3.1.bias"
        ]
    );
    // Parameters are handles: assigning through one updates the model.
    let p = model.parameters();
    assert_eq!(p.len(), 6);

    // Evaluation reaches the nested dropout and the batch norm: the output is the plain
    // composition with running statistics (zeros and ones).
    model.eval();
    let state: Vec<Vec<f64>> = model
        .named_parameters()
        .iter()
        .map(|(_, t)| read(t))
        .collect();
    let x = rng.vec(5 * 4);
    let y = read(&model.forward(&t64(&x, &[5, 4])).unwrap());
    let h1 = linear_ref(&x, 5, &state[0], Some(&state[1]), 6);
    let h2: Vec<f64> = h1
        .iter()
        .enumerate()
        .map(|(i, v)| v.max(0.0) / (1.0 + 1e-5f64).sqrt() * state[2][i % 6] + state[3][i % 6])
        .collect();
    let want = linear_ref(&h2, 5, &state[4], Some(&state[5]), 2);
    assert_close(&y, &want, 1e-12);
    let y_again = read(&model.forward(&t64(&x, &[5, 4])).unwrap());
    assert_eq!(y, y_again, "evaluation is deterministic");

    // Back in training mode the dropout acts again (some output differs run to run).
    model.train(true);
    let big = t64(&rng.vec(64 * 4), &[64, 4]);
    let a = read(&model.forward(&big).unwrap());
    let b = read(&model.forward(&big).unwrap());
    assert_ne!(a, b);
    let dyn_model: &dyn Forward = &model;
    assert_eq!(dyn_model.forward(&big).unwrap().dims(), vec![64, 2]);
}

#[test]
fn flatten_and_cnn_stack() {
    let _g = seeded(13);
    let cnn = Sequential::new()
        .layer(Conv2d::new(1, 4, [3, 3]).unwrap())
        .layer(ReLU)
        .layer(MaxPool2d::new([2, 2]).unwrap())
        .layer(Flatten::new())
        .layer(Linear::new(4 * 3 * 3, 10).unwrap());
    assert_eq!(names(&cnn), ["0.weight", "0.bias", "4.weight", "4.bias"]);
    let x = Tensor::randn([2, 1, 8, 8], DType::F32).unwrap();
    assert_eq!(cnn.forward(&x).unwrap().dims(), vec![2, 10]);
    let y = Flatten::with_dims(0, 1)
        .forward(&Tensor::ones([2, 3, 4], DType::F32))
        .unwrap();
    assert_eq!(y.dims(), vec![6, 4]);
}

#[test]
fn layers_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Linear>();
    check::<Conv2d>();
    check::<BatchNorm2d>();
    check::<Dropout>();
    check::<MultiheadAttention>();
    check::<Sequential>();
    check::<Box<dyn Forward>>();
}

// =====================================================================================
// Gradients through the layers
// =====================================================================================

/// Checks the gradient of `loss()` with respect to every parameter of `module` against
/// central finite differences at three entries of each, in `f64`.
fn check_gradients(what: &str, module: &dyn Module, loss: &dyn Fn() -> Tensor) {
    let params = module.parameters();
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads: Vec<Vec<f64>> = loss().backward(&refs).unwrap().iter().map(read).collect();
    let h = 1e-5;
    for ((p, g), (name, _)) in params.iter().zip(&grads).zip(module.named_parameters()) {
        let base = read(p);
        let dims = p.dims();
        for i in [0, base.len() / 2, base.len() - 1] {
            let at = |delta: f64| {
                let mut v = base.clone();
                v[i] += delta;
                p.assign(&t64(&v, &dims)).unwrap();
                loss().item::<f64>().unwrap()
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            p.assign(&t64(&base, &dims)).unwrap();
            assert!(
                (g[i] - fd).abs() <= 1e-6 * (1.0 + fd.abs()),
                "{what}: d loss / d {name}[{i}] = {} but finite differences give {fd}",
                g[i]
            );
        }
    }
}

#[test]
fn layers_are_differentiable() {
    let _g = seeded(14);
    let mut rng = Rng(160);
    let p64 = f64_params();
    // loss = sum(forward(x) * r) with a fixed random r.
    let weighted_sum = |y: Tensor, seed: u64| {
        let r = Rng(seed).vec(y.numel());
        (&y * &t64(&r, &y.dims())).unwrap().sum_all().unwrap()
    };

    let x = t64(&rng.vec(3 * 4), &[3, 4]);
    let linear = Linear::with_options(4, 2, true, &p64).unwrap();
    check_gradients("Linear", &linear, &|| {
        weighted_sum(linear.forward(&x).unwrap(), 1)
    });

    let opts = ConvOptions {
        stride: [2, 1],
        padding: Padding::Explicit([1, 1]),
        dilation: [1, 2],
        groups: 2,
    };
    let conv = Conv2d::with_options(4, 2, [2, 2], opts, true, &p64).unwrap();
    let x = t64(&rng.vec(2 * 4 * 5 * 5), &[2, 4, 5, 5]);
    check_gradients("Conv2d", &conv, &|| {
        weighted_sum(conv.forward(&x).unwrap(), 2)
    });

    let ln = LayerNorm::with_options(&[6], 1e-5, true, true, &p64).unwrap();
    randomize(ln.weight().unwrap(), &mut rng);
    let x = t64(&rng.vec(4 * 6), &[4, 6]);
    check_gradients("LayerNorm", &ln, &|| {
        weighted_sum(ln.forward(&x).unwrap(), 3)
    });

    let rms = RMSNorm::with_options(&[6], None, true, &p64).unwrap();
    check_gradients("RMSNorm", &rms, &|| {
        weighted_sum(rms.forward(&x).unwrap(), 4)
    });

    let bn = BatchNorm2d::with_options(3, BatchNormOptions::default(), &p64).unwrap();
    randomize(bn.weight().unwrap(), &mut rng);
    let xb = t64(&rng.vec(2 * 3 * 2 * 2), &[2, 3, 2, 2]);
    check_gradients("BatchNorm2d", &bn, &|| {
        weighted_sum(bn.forward(&xb).unwrap(), 5)
    });

    let emb = Embedding::with_options(5, 3, &p64).unwrap();
    let idx = Tensor::from_slice(&[4i64, 0, 4, 2], [4]).unwrap();
    check_gradients("Embedding", &emb, &|| {
        weighted_sum(emb.forward(&idx).unwrap(), 6)
    });

    let mha = MultiheadAttention::with_options(4, 2, true, &p64)
        .unwrap()
        .batch_first(true);
    randomize(mha.in_proj_bias().unwrap(), &mut rng);
    let q = t64(&rng.vec(2 * 3 * 4), &[2, 3, 4]);
    let masks = AttentionMasks {
        is_causal: true,
        ..AttentionMasks::default()
    };
    check_gradients("MultiheadAttention", &mha, &|| {
        weighted_sum(mha.forward(&q, &q, &q, &masks).unwrap(), 7)
    });
}

#[test]
fn half_precision_layers_stay_close_to_f64() {
    let _g = seeded(15);
    let mut rng = Rng(170);
    let x = rng.vec(4 * 8);
    for dtype in [DType::F16, DType::BF16] {
        let opts = ParamOptions::dtype(dtype);
        let linear = Linear::with_options(8, 3, true, &opts).unwrap();
        assert_eq!(linear.weight().dtype(), dtype);
        let xh = t64(&x, &[4, 8]).cast(dtype);
        let xr = read(&xh);
        let y = linear.forward(&xh).unwrap();
        assert_eq!(y.dtype(), dtype);
        let want = linear_ref(
            &xr,
            4,
            &read(linear.weight()),
            Some(&read(linear.bias().unwrap())),
            3,
        );
        assert_close(&read(&y), &want, 1e-2);

        let ln = LayerNorm::with_options(&[8], 1e-5, true, true, &opts).unwrap();
        let y = read(&ln.forward(&xh).unwrap());
        let mut want = Vec::new();
        for row in xr.chunks(8) {
            let mean = row.iter().sum::<f64>() / 8.0;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 8.0;
            want.extend(row.iter().map(|v| (v - mean) / (var + 1e-5).sqrt()));
        }
        assert_close(&y, &want, 1e-2);
    }
}

/// The functional norms against an f64 reference, and their shape errors.
#[test]
fn functional_layer_norm_and_rms_norm_match_the_reference() {
    let mut rng = Rng(177);
    let (rows, n) = (3, 5);
    let x = rng.vec(rows * n);
    let (w, b) = (rng.vec(n), rng.vec(n));
    let xt = t64(&x, &[rows, n]);
    let (wt, bt) = (t64(&w, &[n]), t64(&b, &[n]));
    let mut want_ln = Vec::new();
    let mut want_rms = Vec::new();
    for row in x.chunks(n) {
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        for (i, v) in row.iter().enumerate() {
            want_ln.push((v - mean) / (var + 1e-5).sqrt() * w[i] + b[i]);
            want_rms.push(v / (ms + 1e-6).sqrt() * w[i]);
        }
    }
    let ln = tessel_nn::layer_norm(&xt, &[n], Some(&wt), Some(&bt), 1e-5).unwrap();
    assert_close(&read(&ln), &want_ln, 1e-12);
    let rms = tessel_nn::rms_norm(&xt, &[n], Some(&wt), Some(1e-6)).unwrap();
    assert_close(&read(&rms), &want_rms, 1e-12);
    assert_invalid(
        tessel_nn::layer_norm(&xt, &[n], Some(&t64(&w[..4], &[4])), None, 1e-5),
        "layer_norm",
        "weight and bias must be [5]",
    );
    assert_invalid(
        tessel_nn::rms_norm(&xt, &[4], None, None),
        "rms_norm",
        "must end with normalized_shape [4]",
    );
}

/// Functional batch norm against an f64 reference: evaluation by the running statistics,
/// training by the batch's, updating the running ones in place with `momentum`.
#[test]
fn functional_batch_norm_matches_the_reference_and_updates_statistics() {
    let mut rng = Rng(178);
    let (n, c, l) = (4, 3, 2);
    let x = rng.vec(n * c * l);
    let xt = t64(&x, &[n, c, l]);
    let (w, b) = (rng.vec(c), rng.vec(c));
    let (wt, bt) = (t64(&w, &[c]), t64(&b, &[c]));
    let mean0 = rng.vec(c);
    let var0: Vec<f64> = rng.vec_in(c, 0.5, 2.0);
    let (mean, var) = (t64(&mean0, &[c]), t64(&var0, &[c]));
    let at = |i: usize, ch: usize, j: usize| x[(i * c + ch) * l + j];
    // Evaluation.
    let got = tessel_nn::batch_norm(
        &xt,
        Some(&mean),
        Some(&var),
        Some(&wt),
        Some(&bt),
        false,
        0.1,
        1e-5,
    )
    .unwrap();
    let mut want = Vec::new();
    for i in 0..n {
        for ch in 0..c {
            for j in 0..l {
                want.push((at(i, ch, j) - mean0[ch]) / (var0[ch] + 1e-5).sqrt() * w[ch] + b[ch]);
            }
        }
    }
    assert_close(&read(&got), &want, 1e-12);
    // Training: batch statistics, and the running ones move by momentum 0.1.
    let got =
        tessel_nn::batch_norm(&xt, Some(&mean), Some(&var), None, None, true, 0.1, 1e-5).unwrap();
    let mut want = vec![0.0; n * c * l];
    let (mut want_mean, mut want_var) = (Vec::new(), Vec::new());
    for ch in 0..c {
        let vals: Vec<f64> = (0..n)
            .flat_map(|i| (0..l).map(move |j| (i, j)))
            .map(|(i, j)| at(i, ch, j))
            .collect();
        let m = vals.iter().sum::<f64>() / vals.len() as f64;
        let v = vals.iter().map(|x| (x - m).powi(2)).sum::<f64>() / vals.len() as f64;
        for i in 0..n {
            for j in 0..l {
                want[(i * c + ch) * l + j] = (at(i, ch, j) - m) / (v + 1e-5).sqrt();
            }
        }
        let unbiased = v * vals.len() as f64 / (vals.len() - 1) as f64;
        want_mean.push(0.9 * mean0[ch] + 0.1 * m);
        want_var.push(0.9 * var0[ch] + 0.1 * unbiased);
    }
    assert_close(&read(&got), &want, 1e-12);
    assert_close(&read(&mean), &want_mean, 1e-12);
    assert_close(&read(&var), &want_var, 1e-12);
    assert_invalid(
        tessel_nn::batch_norm(&xt, Some(&mean), None, None, None, false, 0.1, 1e-5),
        "batch_norm",
        "both running_mean and running_var",
    );
    assert_invalid(
        tessel_nn::batch_norm(
            &xt,
            None,
            None,
            Some(&t64(&w[..2], &[2])),
            None,
            true,
            0.1,
            1e-5,
        ),
        "batch_norm",
        "weight must be a float tensor [3]",
    );
}

/// Gradients of `scaled_dot_product_attention` with respect to `q`, `k` and `v` against
/// central finite differences, in f64: causal, a boolean and an additive mask, grouped-query
/// heads, and dropout (every evaluation drawing the same bits). Autograd records them in
/// flash attention's form (`autograd/attention.rs`).
#[test]
fn sdpa_gradients_match_finite_differences() {
    let mut rng = Rng(190);
    let (l, s, e) = (3, 4, 2);
    let keep: Vec<bool> = (0..l * s).map(|i| i % 4 != 2).collect();
    let add = rng.vec(l * s);
    let cases: Vec<(Option<Tensor>, bool, bool, f64)> = vec![
        (None, true, false, 0.0),
        (
            Some(Tensor::from_slice(&keep, [l, s]).unwrap()),
            false,
            false,
            0.0,
        ),
        (Some(t64(&add, &[l, s])), false, false, 0.0),
        (None, false, true, 0.0),
        (None, true, false, 0.3),
    ];
    for (ci, (mask, causal, gqa, dropout)) in cases.iter().enumerate() {
        let kv_heads = if *gqa { 1 } else { 2 };
        let data = [
            rng.vec(2 * l * e),
            rng.vec(kv_heads * s * e),
            rng.vec(kv_heads * s * e),
        ];
        let dims = [vec![2, l, e], vec![kv_heads, s, e], vec![kv_heads, s, e]];
        let r = Rng(200 + ci as u64).vec(2 * l * e);
        let loss = |values: &[Vec<f64>; 3]| -> (Tensor, [Tensor; 3]) {
            let [q, k, v] = [0, 1, 2].map(|i| t64(&values[i], &dims[i]));
            let _same_draw = seeded(91);
            let y = scaled_dot_product_attention(
                &q,
                &k,
                &v,
                mask.as_ref(),
                *dropout,
                *causal,
                None,
                *gqa,
            )
            .unwrap();
            let loss = (&y * &t64(&r, &[2, l, e])).unwrap().sum_all().unwrap();
            (loss, [q, k, v])
        };
        let (total, inputs) = loss(&data);
        let grads: Vec<Vec<f64>> = total
            .backward(&inputs.iter().collect::<Vec<_>>())
            .unwrap()
            .iter()
            .map(read)
            .collect();
        let h = 1e-6;
        for (t, g) in grads.iter().enumerate() {
            for i in 0..data[t].len() {
                let at = |delta: f64| {
                    let mut moved = data.clone();
                    moved[t][i] += delta;
                    loss(&moved).0.item::<f64>().unwrap()
                };
                let fd = (at(h) - at(-h)) / (2.0 * h);
                assert!(
                    (g[i] - fd).abs() <= 1e-6 * (1.0 + fd.abs()),
                    "case {ci}: d loss / d {}[{i}] = {} but finite differences give {fd}",
                    ["q", "k", "v"][t],
                    g[i]
                );
            }
        }
    }
}

/// Attention dropout: SDPA's `dropout_p` is `Tensor::dropout` of the probabilities (the same
/// draw gives the same values as the composition written out), 1 zeroes everything, a bad
/// probability is an error; `MultiheadAttention::dropout` drops in training mode only.
#[test]
fn attention_dropout_is_dropout_of_the_probabilities() {
    let mut rng = Rng(210);
    let (b, l, s, e) = (2, 5, 6, 4);
    let q = t64(&rng.vec(b * l * e), &[b, l, e]);
    let k = t64(&rng.vec(b * s * e), &[b, s, e]);
    let v = t64(&rng.vec(b * s * e), &[b, s, e]);
    let p = 0.4;
    let fused = {
        let _g = seeded(77);
        read(&scaled_dot_product_attention(&q, &k, &v, None, p, true, None, false).unwrap())
    };
    let written_out = {
        let _g = seeded(77);
        let scores = (q.matmul(&k.transpose(-2, -1).unwrap()).unwrap() * 0.5).unwrap();
        let hidden = scores.ones_like().cast(DType::Bool).triu(1).unwrap();
        let probs = scores
            .masked_fill(&hidden, f64::NEG_INFINITY)
            .unwrap()
            .softmax(-1)
            .unwrap();
        read(&probs.dropout(p).unwrap().matmul(&v).unwrap())
    };
    assert_close(&fused, &written_out, 1e-12);
    let plain =
        read(&scaled_dot_product_attention(&q, &k, &v, None, 0.0, true, None, false).unwrap());
    assert!(
        fused.iter().zip(&plain).any(|(a, b)| (a - b).abs() > 1e-6),
        "dropout changed nothing"
    );
    let all =
        read(&scaled_dot_product_attention(&q, &k, &v, None, 1.0, true, None, false).unwrap());
    assert!(all.iter().all(|&x| x == 0.0));
    let r = scaled_dot_product_attention(&q, &k, &v, None, 1.5, false, None, false);
    assert_invalid(
        r,
        "scaled_dot_product_attention",
        "dropout_p must be in [0, 1]",
    );

    let _g = seeded(78);
    let mha = MultiheadAttention::with_options(4, 2, true, &f64_params())
        .unwrap()
        .batch_first(true)
        .dropout(0.5)
        .unwrap();
    let x = t64(&rng.vec(2 * 3 * 4), &[2, 3, 4]);
    let none = AttentionMasks::default();
    let (a, b2) = (
        read(&mha.forward(&x, &x, &x, &none).unwrap()),
        read(&mha.forward(&x, &x, &x, &none).unwrap()),
    );
    assert!(
        a.iter().zip(&b2).any(|(x, y)| (x - y).abs() > 1e-9),
        "two training draws agree"
    );
    mha.eval();
    let (c, d) = (
        read(&mha.forward(&x, &x, &x, &none).unwrap()),
        read(&mha.forward(&x, &x, &x, &none).unwrap()),
    );
    assert_eq!(c, d, "evaluation is deterministic");
    assert!(
        MultiheadAttention::new(4, 2)
            .unwrap()
            .dropout(-0.1)
            .is_err()
    );
}
