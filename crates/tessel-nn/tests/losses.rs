//! Each loss against an independent `f64` reference written here (PyTorch's formulas as
//! plain loops), for every reduction, on seeded random data; and the error paths.

use tessel_nn::loss::{
    CrossEntropyOptions, NllLossOptions, Reduction, binary_cross_entropy,
    binary_cross_entropy_with_logits, cross_entropy, l1_loss, mse_loss, nll_loss,
};
use tessel_tensor::{DType, Tensor};

mod common;
use common::{Rng, assert_close, assert_invalid, read, t64};

// =====================================================================================
// Helpers
// =====================================================================================

const REDUCTIONS: [Reduction; 3] = [Reduction::None, Reduction::Mean, Reduction::Sum];

/// Reduces per-element values the plain way (mean over the count).
fn reduce_ref(v: &[f64], r: Reduction) -> Vec<f64> {
    match r {
        Reduction::None => v.to_vec(),
        Reduction::Sum => vec![v.iter().sum()],
        Reduction::Mean => vec![v.iter().sum::<f64>() / v.len() as f64],
    }
}

/// `log_softmax` over the class dim of `[N, C, D]` data.
fn log_softmax_ref(x: &[f64], n: usize, c: usize, d: usize) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for b in 0..n {
        for j in 0..d {
            let at = |k: usize| (b * c + k) * d + j;
            let m = (0..c).map(|k| x[at(k)]).fold(f64::NEG_INFINITY, f64::max);
            let lse = m + (0..c).map(|k| (x[at(k)] - m).exp()).sum::<f64>().ln();
            for k in 0..c {
                out[at(k)] = x[at(k)] - lse;
            }
        }
    }
    out
}

struct IndexCase<'a> {
    n: usize,
    c: usize,
    d: usize,
    weight: Option<&'a [f64]>,
    ignore: i64,
    smoothing: f64,
}

/// PyTorch's cross-entropy (or NLL, with `logp` given and no smoothing) for class
/// indices, on log-probabilities `[N, C, D]`.
fn index_loss_ref(logp: &[f64], target: &[i64], case: &IndexCase<'_>, r: Reduction) -> Vec<f64> {
    let (n, c, d) = (case.n, case.c, case.d);
    let (mut nll, mut smooth, mut w) = (vec![0.0; n * d], vec![0.0; n * d], vec![0.0; n * d]);
    let class_w = |k: usize| case.weight.map_or(1.0, |w| w[k]);
    for b in 0..n {
        for j in 0..d {
            let e = b * d + j;
            let t = target[e];
            if t == case.ignore {
                continue;
            }
            let at = |k: usize| (b * c + k) * d + j;
            w[e] = class_w(t as usize);
            nll[e] = -w[e] * logp[at(t as usize)];
            smooth[e] = -(0..c).map(|k| class_w(k) * logp[at(k)]).sum::<f64>();
        }
    }
    let ls = case.smoothing;
    let mix = |a: f64, s: f64| (1.0 - ls) * a + ls / c as f64 * s;
    match r {
        Reduction::None => nll.iter().zip(&smooth).map(|(&a, &s)| mix(a, s)).collect(),
        Reduction::Sum => vec![mix(nll.iter().sum(), smooth.iter().sum())],
        Reduction::Mean => {
            let total: f64 = w.iter().sum();
            vec![mix(
                nll.iter().sum::<f64>() / total,
                smooth.iter().sum::<f64>() / total,
            )]
        }
    }
}

// =====================================================================================
// Regression losses
// =====================================================================================

#[test]
fn mse_and_l1_all_reductions() {
    let mut rng = Rng(1);
    let (a, b) = (rng.vec_in(24, -3.0, 3.0), rng.vec_in(24, -3.0, 3.0));
    let (x, y) = (t64(&a, &[2, 3, 4]), t64(&b, &[2, 3, 4]));
    let sq: Vec<f64> = a.iter().zip(&b).map(|(p, q)| (p - q).powi(2)).collect();
    let ab: Vec<f64> = a.iter().zip(&b).map(|(p, q)| (p - q).abs()).collect();
    for r in REDUCTIONS {
        let got = mse_loss(&x, &y, r).unwrap();
        assert_eq!(
            got.dims(),
            if r == Reduction::None {
                vec![2, 3, 4]
            } else {
                vec![]
            }
        );
        assert_close(&read(&got), &reduce_ref(&sq, r), 1e-12);
        assert_close(
            &read(&l1_loss(&x, &y, r).unwrap()),
            &reduce_ref(&ab, r),
            1e-12,
        );
    }
    // f32 at the project's reduction tolerance.
    let got = mse_loss(&x.cast(DType::F32), &y.cast(DType::F32), Reduction::Mean).unwrap();
    assert_eq!(got.dtype(), DType::F32);
    assert_close(&read(&got), &reduce_ref(&sq, Reduction::Mean), 1e-5);

    assert_invalid(
        mse_loss(&x, &t64(&b[..12], &[3, 4]), Reduction::Mean),
        "mse_loss",
        "must have the input's shape",
    );
    assert_invalid(
        mse_loss(&x, &y.cast(DType::F32), Reduction::Mean),
        "mse_loss",
        "cast the target",
    );
    let ints = Tensor::ones([2, 3, 4], DType::I64);
    assert_invalid(
        l1_loss(&ints, &ints, Reduction::Sum),
        "l1_loss",
        "float tensor",
    );
}

// =====================================================================================
// Cross-entropy and NLL
// =====================================================================================

#[test]
fn cross_entropy_class_indices_weights_ignore_and_smoothing() {
    let mut rng = Rng(2);
    for (n, c, d) in [(6, 4, 1), (3, 5, 4)] {
        let x = rng.vec_in(n * c * d, -4.0, 4.0);
        let mut target = rng.classes(n * d, c);
        target[1] = -100; // PyTorch's default ignore_index
        let weight = rng.vec_in(c, 0.2, 2.0);
        let logp = log_softmax_ref(&x, n, c, d);
        let input = if d == 1 {
            t64(&x, &[n, c])
        } else {
            t64(&x, &[n, c, d])
        };
        let tshape: Vec<usize> = if d == 1 { vec![n] } else { vec![n, d] };
        let tt = Tensor::from_slice(&target, tshape.as_slice()).unwrap();
        for smoothing in [0.0, 0.2] {
            for w in [None, Some(&weight[..])] {
                for r in REDUCTIONS {
                    let case = IndexCase {
                        n,
                        c,
                        d,
                        weight: w,
                        ignore: -100,
                        smoothing,
                    };
                    let opts = CrossEntropyOptions {
                        weight: w.map(|w| t64(w, &[c])),
                        reduction: r,
                        label_smoothing: smoothing,
                        ..CrossEntropyOptions::default()
                    };
                    let got = cross_entropy(&input, &tt, &opts).unwrap();
                    if r == Reduction::None {
                        assert_eq!(got.dims(), tshape);
                    }
                    let want = index_loss_ref(&logp, &target, &case, r);
                    assert_close(&read(&got), &want, 1e-12);
                }
            }
        }
    }

    // A custom ignore_index that is a real class, i32 targets, f32 logits.
    let x = rng.vec_in(5 * 3, -2.0, 2.0);
    let target = [0i64, 2, 1, 2, 0];
    let case = IndexCase {
        n: 5,
        c: 3,
        d: 1,
        weight: None,
        ignore: 2,
        smoothing: 0.1,
    };
    let want = index_loss_ref(
        &log_softmax_ref(&x, 5, 3, 1),
        &target,
        &case,
        Reduction::Mean,
    );
    let t32: Vec<i32> = target.iter().map(|&t| t as i32).collect();
    let opts = CrossEntropyOptions {
        ignore_index: 2,
        label_smoothing: 0.1,
        ..CrossEntropyOptions::default()
    };
    let got = cross_entropy(
        &t64(&x, &[5, 3]).cast(DType::F32),
        &Tensor::from_slice(&t32, [5]).unwrap(),
        &opts,
    )
    .unwrap();
    assert_close(&read(&got), &want, 1e-5);

    // Unbatched: [C] logits and a 0-d target.
    let got = cross_entropy(
        &t64(&x[..3], &[3]),
        &Tensor::scalar(1i64),
        &CrossEntropyOptions {
            reduction: Reduction::None,
            ..CrossEntropyOptions::default()
        },
    )
    .unwrap();
    assert_eq!(got.ndim(), 0);
    assert_close(&read(&got), &[-log_softmax_ref(&x[..3], 1, 3, 1)[1]], 1e-12);
}

#[test]
fn cross_entropy_probability_targets() {
    let mut rng = Rng(3);
    let (n, c, d) = (3, 4, 2);
    let x = rng.vec_in(n * c * d, -3.0, 3.0);
    let raw = rng.vec_in(n * c * d, 0.0, 1.0);
    // Normalize each [b, :, j] column to a distribution.
    let mut p = raw.clone();
    for b in 0..n {
        for j in 0..d {
            let s: f64 = (0..c).map(|k| raw[(b * c + k) * d + j]).sum();
            for k in 0..c {
                p[(b * c + k) * d + j] /= s;
            }
        }
    }
    let weight = rng.vec_in(c, 0.5, 1.5);
    let logp = log_softmax_ref(&x, n, c, d);
    for smoothing in [0.0, 0.3] {
        for w in [None, Some(&weight)] {
            let mut per = vec![0.0; n * d];
            for b in 0..n {
                for j in 0..d {
                    for k in 0..c {
                        let i = (b * c + k) * d + j;
                        let pk = p[i] * (1.0 - smoothing) + smoothing / c as f64;
                        per[b * d + j] -= w.map_or(1.0, |w| w[k]) * logp[i] * pk;
                    }
                }
            }
            for r in REDUCTIONS {
                let opts = CrossEntropyOptions {
                    weight: w.map(|w| t64(w, &[c])),
                    reduction: r,
                    label_smoothing: smoothing,
                    ..CrossEntropyOptions::default()
                };
                let got = cross_entropy(&t64(&x, &[n, c, d]), &t64(&p, &[n, c, d]), &opts).unwrap();
                // The mean divides by the N * d positions, whatever the weights.
                assert_close(&read(&got), &reduce_ref(&per, r), 1e-12);
            }
        }
    }
}

#[test]
fn nll_loss_matches_reference() {
    let mut rng = Rng(4);
    let (n, c, d) = (4, 3, 3);
    let logp = rng.vec_in(n * c * d, -5.0, 0.0); // any values: nll_loss does not normalize
    let mut target = rng.classes(n * d, c);
    target[4] = 7; // ignore_index below
    let weight = rng.vec_in(c, 0.1, 3.0);
    let tt = Tensor::from_slice(&target, [n, d]).unwrap();
    for w in [None, Some(&weight[..])] {
        for r in REDUCTIONS {
            let case = IndexCase {
                n,
                c,
                d,
                weight: w,
                ignore: 7,
                smoothing: 0.0,
            };
            let opts = NllLossOptions {
                weight: w.map(|w| t64(w, &[c])),
                ignore_index: 7,
                reduction: r,
            };
            let got = nll_loss(&t64(&logp, &[n, c, d]), &tt, &opts).unwrap();
            assert_close(
                &read(&got),
                &index_loss_ref(&logp, &target, &case, r),
                1e-12,
            );
        }
    }
}

#[test]
fn cross_entropy_and_nll_errors() {
    let x = Tensor::ones([4, 3], DType::F32);
    let ce = |t: &Tensor, o: &CrossEntropyOptions| cross_entropy(&x, t, o);
    let d = CrossEntropyOptions::default();
    assert_invalid(
        ce(&Tensor::zeros([3], DType::I64), &d),
        "cross_entropy",
        "must be [4]",
    );
    assert_invalid(
        ce(&Tensor::zeros([4, 1], DType::I64), &d),
        "cross_entropy",
        "must be [4]",
    );
    assert_invalid(
        ce(&Tensor::zeros([4], DType::U8), &d),
        "cross_entropy",
        "i32 or i64",
    );
    assert_invalid(
        ce(&Tensor::zeros([4, 2], DType::F32), &d),
        "cross_entropy",
        "probability targets",
    );
    assert_invalid(
        ce(&Tensor::zeros([4, 3], DType::F64), &d),
        "cross_entropy",
        "probability targets",
    );
    let bad_ls = CrossEntropyOptions {
        label_smoothing: 1.5,
        ..CrossEntropyOptions::default()
    };
    assert_invalid(
        ce(&Tensor::zeros([4], DType::I64), &bad_ls),
        "cross_entropy",
        "label_smoothing",
    );
    let bad_w = CrossEntropyOptions {
        weight: Some(Tensor::ones([4], DType::F32)),
        ..CrossEntropyOptions::default()
    };
    assert_invalid(
        ce(&Tensor::zeros([4], DType::I64), &bad_w),
        "cross_entropy",
        "weight must be [3] f32",
    );
    assert_invalid(
        cross_entropy(
            &Tensor::zeros([4], DType::I64),
            &Tensor::zeros([4], DType::I64),
            &d,
        ),
        "cross_entropy",
        "float tensor",
    );
    assert_invalid(
        cross_entropy(&Tensor::scalar(1.0f32), &Tensor::scalar(0i64), &d),
        "cross_entropy",
        "0-d",
    );
    assert_invalid(
        nll_loss(
            &x,
            &Tensor::zeros([4], DType::F32),
            &NllLossOptions::default(),
        ),
        "nll_loss",
        "i32 or i64",
    );
}

// =====================================================================================
// Binary cross-entropy
// =====================================================================================

#[test]
fn binary_cross_entropy_matches_reference_and_clamps_logs() {
    let mut rng = Rng(5);
    let mut x = rng.vec_in(12, 0.01, 0.99);
    x[0] = 0.0; // log(0) clamps to -100, as in PyTorch
    x[1] = 1.0;
    let t = rng.vec_in(12, 0.0, 1.0);
    let w = rng.vec_in(4, 0.5, 2.0); // broadcasts along the last dim
    let clog = |v: f64| v.ln().max(-100.0);
    for weight in [None, Some(&w)] {
        let per: Vec<f64> = x
            .iter()
            .zip(&t)
            .enumerate()
            .map(|(i, (&p, &q))| {
                -(q * clog(p) + (1.0 - q) * clog(1.0 - p)) * weight.map_or(1.0, |w| w[i % 4])
            })
            .collect();
        assert!(per.iter().all(|v| v.is_finite()));
        for r in REDUCTIONS {
            let wt = weight.map(|w| t64(w, &[4]));
            let got =
                binary_cross_entropy(&t64(&x, &[3, 4]), &t64(&t, &[3, 4]), wt.as_ref(), r).unwrap();
            assert_close(&read(&got), &reduce_ref(&per, r), 1e-12);
        }
    }
    assert_invalid(
        binary_cross_entropy(&t64(&x, &[3, 4]), &t64(&t, &[12]), None, Reduction::Mean),
        "binary_cross_entropy",
        "must have the input's shape",
    );
    assert_invalid(
        binary_cross_entropy(
            &t64(&x, &[3, 4]),
            &t64(&t, &[3, 4]),
            Some(&t64(&w[..3], &[3])),
            Reduction::Mean,
        ),
        "binary_cross_entropy",
        "must broadcast",
    );
}

#[test]
fn bce_with_logits_is_stable_and_matches_reference() {
    let mut rng = Rng(6);
    let mut x = rng.vec_in(15, -6.0, 6.0);
    x[0] = 120.0;
    x[1] = -120.0;
    let mut t = rng.vec_in(15, 0.0, 1.0);
    t[0] = 0.0; // a confident wrong answer: loss ~ 120, finite
    t[1] = 0.0;
    let w = rng.vec_in(15, 0.5, 1.5);
    let pw = rng.vec_in(5, 0.5, 4.0);
    // log(sigmoid(v)) computed stably in f64.
    let log_sig = |v: f64| {
        if v >= 0.0 {
            -(-v).exp().ln_1p()
        } else {
            v - v.exp().ln_1p()
        }
    };
    for (weight, pos) in [
        (None, None),
        (Some(&w), None),
        (None, Some(&pw)),
        (Some(&w), Some(&pw)),
    ] {
        let per: Vec<f64> = (0..15)
            .map(|i| {
                let lw = pos.map_or(1.0, |p| 1.0 + (p[i % 5] - 1.0) * t[i]);
                let l = (1.0 - t[i]) * x[i] - lw * log_sig(x[i]);
                l * weight.map_or(1.0, |w| w[i])
            })
            .collect();
        assert!(per.iter().all(|v| v.is_finite()));
        for r in REDUCTIONS {
            let (wt, pt) = (weight.map(|w| t64(w, &[3, 5])), pos.map(|p| t64(p, &[5])));
            let got = binary_cross_entropy_with_logits(
                &t64(&x, &[3, 5]),
                &t64(&t, &[3, 5]),
                wt.as_ref(),
                pt.as_ref(),
                r,
            )
            .unwrap();
            assert_close(&read(&got), &reduce_ref(&per, r), 1e-12);
        }
    }
    // f32 with extreme logits stays finite and accurate.
    let got = binary_cross_entropy_with_logits(
        &Tensor::from([100.0f32, -100.0, 0.0]),
        &Tensor::from([0.0f32, 1.0, 1.0]),
        None,
        None,
        Reduction::None,
    )
    .unwrap();
    assert_close(&read(&got), &[100.0, 100.0, std::f64::consts::LN_2], 1e-6);
    assert_invalid(
        binary_cross_entropy_with_logits(
            &t64(&x, &[3, 5]),
            &t64(&t, &[3, 5]),
            None,
            Some(&t64(&pw[..3], &[3])),
            Reduction::Sum,
        ),
        "binary_cross_entropy_with_logits",
        "pos_weight",
    );
}

// =====================================================================================
// Gradients
// =====================================================================================

/// Checks `d loss(x) / dx` from autograd against central finite differences at every
/// entry of `x` (small inputs), in `f64`.
fn check_input_gradient(what: &str, x: &[f64], shape: &[usize], loss: &dyn Fn(&Tensor) -> Tensor) {
    let xt = t64(x, shape);
    let g = read(&loss(&xt).backward(&[&xt]).unwrap()[0]);
    let h = 1e-5;
    for i in 0..x.len() {
        let at = |delta: f64| {
            let mut v = x.to_vec();
            v[i] += delta;
            loss(&t64(&v, shape)).item::<f64>().unwrap()
        };
        let fd = (at(h) - at(-h)) / (2.0 * h);
        assert!(
            (g[i] - fd).abs() <= 1e-6 * (1.0 + fd.abs()),
            "{what}: d loss / dx[{i}] = {} but finite differences give {fd}",
            g[i]
        );
    }
}

#[test]
fn losses_are_differentiable() {
    let mut rng = Rng(7);
    let (n, c) = (3, 4);
    let x = rng.vec_in(n * c, -2.0, 2.0);
    let target = Tensor::from_slice(&[2i64, -100, 0], [n]).unwrap();
    let weight = t64(&rng.vec_in(c, 0.5, 1.5), &[c]);
    let opts = CrossEntropyOptions {
        weight: Some(weight.clone()),
        label_smoothing: 0.1,
        ..CrossEntropyOptions::default()
    };
    check_input_gradient("cross_entropy (indices)", &x, &[n, c], &|x| {
        cross_entropy(x, &target, &opts).unwrap()
    });
    let probs = t64(&rng.vec_in(n * c, 0.0, 0.5), &[n, c]);
    check_input_gradient("cross_entropy (probabilities)", &x, &[n, c], &|x| {
        cross_entropy(x, &probs, &CrossEntropyOptions::default()).unwrap()
    });
    let nll_opts = NllLossOptions {
        weight: Some(weight.clone()),
        reduction: Reduction::Sum,
        ..NllLossOptions::default()
    };
    check_input_gradient("nll_loss", &x, &[n, c], &|x| {
        nll_loss(x, &target, &nll_opts).unwrap()
    });

    let t = t64(&rng.vec_in(n * c, 0.0, 1.0), &[n, c]);
    let p = rng.vec_in(n * c, 0.05, 0.95);
    check_input_gradient("binary_cross_entropy", &p, &[n, c], &|x| {
        binary_cross_entropy(x, &t, Some(&weight), Reduction::Mean).unwrap()
    });
    let pw = t64(&rng.vec_in(c, 0.5, 3.0), &[c]);
    check_input_gradient("binary_cross_entropy_with_logits", &x, &[n, c], &|x| {
        binary_cross_entropy_with_logits(x, &t, None, Some(&pw), Reduction::Sum).unwrap()
    });
    check_input_gradient("mse_loss", &x, &[n, c], &|x| {
        mse_loss(x, &t, Reduction::Mean).unwrap()
    });
    check_input_gradient("l1_loss", &x, &[n, c], &|x| {
        l1_loss(x, &t, Reduction::Sum).unwrap()
    });
}
