//! Gradients: every differentiable op against central finite differences in f64, a
//! hand-derived reference for an MLP in f32 on every device, PyTorch's tie rules, second
//! derivatives, and misuse errors.

use tessel_tensor::{Conv2dOptions, DType, Padding, PoolOptions, Result, Tensor, grad};

use crate::common::{Rng, assert_close, invalid, on_device, read, skipped, tensor};

type Case = dyn Fn(&[Tensor]) -> Result<Tensor>;

/// A named case, its input shapes, the domain its inputs are drawn from, and the function.
type Shaped<'a> = (&'a str, &'a [&'a [usize]], (f64, f64), &'a Case);

/// Checks the gradient of `Σ w ⊙ f(inputs)` (random weights `w`) with respect to every
/// input against central differences, in f64. Inputs are drawn from `[lo, hi)`.
#[track_caller]
fn gradcheck(name: &str, dims: &[&[usize]], (lo, hi): (f64, f64), f: &Case) {
    if on_device([DType::F64]).is_empty() {
        return;
    }
    let mut rng = Rng::new(
        name.bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31) + u64::from(b)),
    );
    let values: Vec<Vec<f64>> = dims
        .iter()
        .map(|d| {
            (0..d.iter().product())
                .map(|_| rng.uniform(lo, hi))
                .collect()
        })
        .collect();
    let leaves = |values: &[Vec<f64>]| -> Vec<Tensor> {
        values
            .iter()
            .zip(dims)
            .map(|(v, d)| tensor(DType::F64, v, d))
            .collect()
    };
    let inputs = leaves(&values);
    let out = f(&inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let weights: Vec<f64> = (0..out.numel()).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let w = tensor(DType::F64, &weights, &out.dims());
    let loss_of = |inputs: &[Tensor]| -> Tensor {
        let out = f(inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        (&out * &w).and_then(|t| t.sum_all()).unwrap()
    };
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let grads = grad(&loss_of(&inputs), &refs).unwrap_or_else(|e| panic!("{name}: {e}"));
    // The forward pass alone, as a fresh graph (realizing this one would make it a
    // constant): some devices cannot compute every op in f64.
    if grads.iter().any(|g| skipped(g, name)) || skipped(&loss_of(&inputs), name) {
        return;
    }
    for (i, g) in grads.iter().enumerate() {
        assert_eq!(
            g.dims(),
            dims[i].to_vec(),
            "{name}: gradient shape of input {i}"
        );
        let analytic = read(g);
        let numeric: Vec<f64> = (0..values[i].len())
            .map(|j| {
                let h = 1e-6 * values[i][j].abs().max(1.0);
                let at = |delta: f64| {
                    let mut v = values.clone();
                    v[i][j] += delta;
                    read(&loss_of(&leaves(&v)))[0]
                };
                (at(h) - at(-h)) / (2.0 * h)
            })
            .collect();
        assert_close(&format!("{name}: d/d input {i}"), &analytic, &numeric, 1e-6);
    }
}

const WIDE: (f64, f64) = (-2.0, 2.0);
const POSITIVE: (f64, f64) = (0.5, 3.0);

#[test]
fn unary_ops_match_finite_differences() {
    let cases: [(&str, (f64, f64), &Case); 20] = [
        ("neg", WIDE, &|x| x[0].neg()),
        ("abs", WIDE, &|x| x[0].abs()),
        ("exp", WIDE, &|x| Ok(x[0].exp())),
        ("exp2", WIDE, &|x| Ok(x[0].exp2())),
        ("log", POSITIVE, &|x| Ok(x[0].log())),
        ("log2", POSITIVE, &|x| Ok(x[0].log2())),
        ("sqrt", POSITIVE, &|x| Ok(x[0].sqrt())),
        ("rsqrt", POSITIVE, &|x| Ok(x[0].rsqrt())),
        ("reciprocal", POSITIVE, &|x| Ok(x[0].reciprocal())),
        ("sin", WIDE, &|x| Ok(x[0].sin())),
        ("cos", WIDE, &|x| Ok(x[0].cos())),
        ("tan", (-1.0, 1.0), &|x| Ok(x[0].tan())),
        ("tanh", WIDE, &|x| Ok(x[0].tanh())),
        ("erf", WIDE, &|x| Ok(x[0].erf())),
        ("sigmoid", WIDE, &|x| Ok(x[0].sigmoid())),
        ("relu", WIDE, &|x| Ok(x[0].relu())),
        ("gelu", WIDE, &|x| Ok(x[0].gelu())),
        ("silu", WIDE, &|x| Ok(x[0].silu())),
        ("softplus", WIDE, &|x| x[0].softplus(1.0, 20.0)),
        ("floor has a zero gradient", WIDE, &|x| x[0].floor()),
    ];
    for (name, domain, f) in cases {
        gradcheck(name, &[&[2, 3]], domain, f);
    }
}

#[test]
fn binary_ops_with_broadcasting_match_finite_differences() {
    let cases: [Shaped; 9] = [
        ("add", &[&[2, 3], &[3]], WIDE, &|x| &x[0] + &x[1]),
        ("sub", &[&[2, 1], &[1, 3]], WIDE, &|x| &x[0] - &x[1]),
        ("mul", &[&[2, 3], &[2, 1]], WIDE, &|x| &x[0] * &x[1]),
        ("div", &[&[2, 3], &[3]], POSITIVE, &|x| &x[0] / &x[1]),
        ("pow", &[&[2, 3], &[2, 3]], POSITIVE, &|x| x[0].pow(&x[1])),
        ("maximum", &[&[3, 4], &[4]], WIDE, &|x| x[0].maximum(&x[1])),
        ("minimum", &[&[3, 4], &[3, 1]], WIDE, &|x| {
            x[0].minimum(&x[1])
        }),
        ("fmod", &[&[2, 3], &[3]], POSITIVE, &|x| x[0].fmod(&x[1])),
        ("where", &[&[2, 3], &[2, 3]], WIDE, &|x| {
            Tensor::where_cond(&x[0].gt(0.0)?, &x[0], &(&x[1] * 3.0)?)
        }),
    ];
    for (name, dims, domain, f) in cases {
        gradcheck(name, dims, domain, f);
    }
    gradcheck("clamp", &[&[4, 3]], WIDE, &|x| {
        x[0].clamp(Some(-1.0), Some(1.0))
    });
    gradcheck("scalar pow", &[&[5]], POSITIVE, &|x| x[0].pow(2.5));
    gradcheck("mad chain", &[&[4], &[4], &[4]], WIDE, &|x| {
        (&(&x[0] * &x[1])? + &x[2])?.mul(&x[0])
    });
}

#[test]
fn movement_ops_match_finite_differences() {
    let cases: [(&str, &[&[usize]], &Case); 11] = [
        ("reshape", &[&[2, 6]], &|x| x[0].reshape(&[3, 4])),
        ("transpose (non-contiguous)", &[&[3, 4]], &|x| {
            x[0].t()?.exp().sum(&[0], false)
        }),
        ("permute", &[&[2, 3, 4]], &|x| x[0].permute(&[2, 0, 1])),
        ("expand", &[&[3, 1]], &|x| x[0].expand(&[2, 3, 4])),
        ("pad", &[&[2, 3]], &|x| x[0].pad(&[(1, 0), (2, 1)], 0.5)),
        ("strided slice", &[&[2, 10]], &|x| {
            x[0].slice(1, Some(1), Some(9), 3)
        }),
        ("flip", &[&[3, 4]], &|x| x[0].flip(&[0, 1])),
        ("cat", &[&[2, 3], &[1, 3]], &|x| {
            Tensor::cat(&[&x[0], &x[1], &x[0]], 0)
        }),
        ("stack", &[&[2, 3], &[2, 3]], &|x| {
            Tensor::stack(&[&x[0], &x[1]], 1)
        }),
        ("repeat", &[&[2, 2]], &|x| x[0].repeat(&[2, 3])),
        ("reflect pad", &[&[1, 5]], &|x| {
            x[0].pad_reflect(&[(0, 0), (2, 2)])
        }),
    ];
    for (name, dims, f) in cases {
        gradcheck(name, dims, WIDE, f);
    }
}

#[test]
fn reductions_match_finite_differences() {
    let cases: [(&str, &Case); 10] = [
        ("sum", &|x| x[0].sum(&[1], false)),
        ("mean", &|x| x[0].mean(&[0, 2], true)),
        ("max", &|x| x[0].max(&[2], false)),
        ("min", &|x| x[0].min(&[0], false)),
        ("prod", &|x| x[0].prod(&[1], false)),
        ("var", &|x| x[0].var(&[2], false)),
        ("std", &|x| x[0].std(&[1, 2], false)),
        ("logsumexp", &|x| x[0].logsumexp(&[2], false)),
        ("softmax", &|x| x[0].softmax(-1)),
        ("log_softmax", &|x| x[0].log_softmax(1)),
    ];
    for (name, f) in cases {
        gradcheck(name, &[&[2, 3, 4]], WIDE, f);
    }
}

#[test]
fn contractions_convolutions_and_pooling_match_finite_differences() {
    gradcheck("matmul", &[&[3, 4], &[4, 2]], WIDE, &|x| x[0].matmul(&x[1]));
    // Products of every batch layout: each operand's gradient is a product of its own
    // (folded over a shared operand's batch, summed over a partially broadcast one).
    for (name, a, b) in [
        ("batched matmul", &[2, 3, 4][..], &[4, 5][..]),
        ("matmul of a shared lhs", &[3, 4], &[2, 4, 5]),
        ("matmul of two batches", &[2, 3, 4], &[2, 4, 5]),
        ("matmul broadcast along one axis", &[2, 1, 3, 4], &[3, 4, 2]),
        ("matrix times vector", &[3, 4], &[4]),
        ("vector times batch", &[4], &[2, 4, 3]),
    ] {
        gradcheck(name, &[a, b], WIDE, &|x| x[0].matmul(&x[1]));
    }
    let conv = Conv2dOptions {
        stride: [2, 1],
        padding: Padding::Explicit([1, 1]),
        ..Conv2dOptions::default()
    };
    gradcheck(
        "conv2d",
        &[&[1, 2, 5, 4], &[3, 2, 3, 3], &[3]],
        WIDE,
        &move |x| x[0].conv2d(&x[1], Some(&x[2]), &conv),
    );
    let pool = PoolOptions {
        stride: Some([1, 2]),
        padding: [1, 1],
        ..PoolOptions::new([3, 3])
    };
    gradcheck("max_pool2d", &[&[1, 2, 4, 5]], WIDE, &move |x| {
        x[0].max_pool2d(&pool)
    });
    gradcheck("avg_pool2d", &[&[1, 2, 4, 5]], WIDE, &move |x| {
        x[0].avg_pool2d(&pool)
    });
    gradcheck("cumsum", &[&[2, 5]], WIDE, &|x| x[0].cumsum(1));
}

#[test]
fn indexing_ops_match_finite_differences() {
    let rows = || Tensor::from_vec(vec![2i64, 0, 2, 1], [4]).unwrap();
    // Column 1 sends two values to row 0: the last write wins, the first gets no gradient.
    let to = || Tensor::from_vec(vec![2i64, 0, 2, 1, 0, 0, 1, 2], [2, 4]).unwrap();
    let cases: [(&str, &[&[usize]], &Case); 12] = [
        ("gather", &[&[3, 4]], &|x| {
            let idx = Tensor::from_vec(vec![3i64, 0, 0, 1, 2, 2], [3, 2])?;
            x[0].gather(1, &idx)
        }),
        ("index_select", &[&[3, 2]], &move |x| {
            x[0].index_select(0, &rows())
        }),
        ("embedding", &[&[3, 2]], &move |x| {
            Tensor::embedding(&x[0], &rows())
        }),
        ("masked_fill", &[&[2, 3]], &|x| {
            x[0].masked_fill(&x[0].gt(0.5)?, 2.0)
        }),
        ("tril", &[&[3, 3]], &|x| x[0].tril(-1)),
        ("roll", &[&[2, 3]], &|x| x[0].roll(&[1, -1], &[0, 1])),
        ("scatter", &[&[3, 4], &[2, 4]], &move |x| {
            x[0].scatter(0, &to(), &x[1])
        }),
        ("scatter_add", &[&[3, 4], &[2, 4]], &move |x| {
            x[0].scatter_add(0, &to(), &x[1])
        }),
        ("scatter_reduce amax", &[&[3, 4], &[2, 4]], &move |x| {
            x[0].scatter_reduce(0, &to(), &x[1], "amax", true)
        }),
        ("scatter_reduce amin", &[&[3, 4], &[2, 4]], &move |x| {
            x[0].scatter_reduce(0, &to(), &x[1], "amin", false)
        }),
        ("index_add", &[&[3, 2], &[4, 2]], &move |x| {
            x[0].index_add(0, &rows(), &x[1])
        }),
        ("index_put", &[&[3, 2], &[4, 2]], &move |x| {
            x[0].index_put(&[&rows()], &x[1], false)
        }),
    ];
    for (name, dims, f) in cases {
        gradcheck(name, dims, WIDE, f);
    }
}

#[test]
fn prod_with_zeros_and_max_ties_follow_pytorch() {
    if on_device([DType::F64]).is_empty() {
        return;
    }
    // prod: one zero → only it gets the product of the rest; two zeros → all zero.
    let x = tensor(DType::F64, &[2.0, 0.0, 3.0, 0.0, 0.0, 5.0], &[2, 3]);
    let g = grad(&x.prod(&[1], false).unwrap().sum_all().unwrap(), &[&x]).unwrap();
    assert_eq!(read(&g[0]), vec![0.0, 6.0, 0.0, 0.0, 0.0, 0.0]);
    // amax: ties share the gradient equally; maximum: a tie gives each side half.
    let x = tensor(DType::F64, &[1.0, 3.0, 3.0], &[3]);
    let g = grad(&x.max_all().unwrap(), &[&x]).unwrap();
    assert_eq!(read(&g[0]), vec![0.0, 0.5, 0.5]);
    let y = tensor(DType::F64, &[1.0, 2.0, 3.0], &[3]);
    let g = grad(&x.maximum(&y).unwrap().sum_all().unwrap(), &[&x, &y]).unwrap();
    assert_eq!(read(&g[0]), vec![0.5, 1.0, 0.5]);
    assert_eq!(read(&g[1]), vec![0.5, 0.0, 0.5]);
}

#[test]
fn second_derivatives_are_gradients_of_gradients() {
    if on_device([DType::F64]).is_empty() {
        return;
    }
    let x = tensor(DType::F64, &[-1.5, 0.5, 2.0], &[3]);
    let y = (&(&x * &x).unwrap() * &x).unwrap().sum_all().unwrap(); // Σ x³
    let dx = grad(&y, &[&x]).unwrap().remove(0);
    // Differentiate before reading: reading realizes `dx`, after which it is a constant.
    let ddx = grad(&dx.sum_all().unwrap(), &[&x]).unwrap().remove(0);
    assert_close("d x³", &read(&dx), &[6.75, 0.75, 12.0], 1e-12);
    assert_close("d² x³", &read(&ddx), &[-9.0, 3.0, 12.0], 1e-12);
    // Through a transcendental: d²/dx² sin x = -sin x.
    let s = x.sin().sum_all().unwrap();
    let ds = grad(&s, &[&x]).unwrap().remove(0);
    let dds = grad(&ds.sum_all().unwrap(), &[&x]).unwrap().remove(0);
    if skipped(&dds, "sin''") {
        return;
    }
    let want: Vec<f64> = [-1.5f64, 0.5, 2.0].iter().map(|v| -v.sin()).collect();
    assert_close("d² sin", &read(&dds), &want, 1e-12);
}

/// `loss = Σ v ⊙ tanh(x·W + b)`, with the gradients derived by hand.
#[test]
fn mlp_gradients_in_f32_match_a_hand_derived_reference() {
    let (n, k, m) = (5, 4, 3);
    let mut rng = Rng::new(11);
    let mut draw = |len: usize| -> Vec<f64> {
        (0..len)
            .map(|_| f64::from(rng.uniform(-1.0, 1.0) as f32))
            .collect()
    };
    let (xv, wv, bv, vv) = (draw(n * k), draw(k * m), draw(m), draw(n * m));
    let x = tensor(DType::F32, &xv, &[n, k]);
    let w = tensor(DType::F32, &wv, &[k, m]);
    let b = tensor(DType::F32, &bv, &[m]);
    let v = tensor(DType::F32, &vv, &[n, m]);
    let h = (&x.matmul(&w).unwrap() + &b).unwrap().tanh();
    let loss = (&h * &v).unwrap().sum_all().unwrap();
    let grads = grad(&loss, &[&x, &w, &b]).unwrap();
    let refs: Vec<&Tensor> = std::iter::once(&loss).chain(&grads).collect();
    Tensor::realize_all(&refs).unwrap();

    // delta[i][j] = v ⊙ (1 - tanh²(z)), z = x·W + b.
    let mut delta = vec![0.0; n * m];
    let mut want_loss = 0.0;
    for i in 0..n {
        for j in 0..m {
            let z = bv[j] + (0..k).map(|p| xv[i * k + p] * wv[p * m + j]).sum::<f64>();
            want_loss += vv[i * m + j] * z.tanh();
            delta[i * m + j] = vv[i * m + j] * (1.0 - z.tanh().powi(2));
        }
    }
    let dx: Vec<f64> = (0..n * k)
        .map(|ip| {
            (0..m)
                .map(|j| delta[ip / k * m + j] * wv[ip % k * m + j])
                .sum()
        })
        .collect();
    let dw: Vec<f64> = (0..k * m)
        .map(|pj| {
            (0..n)
                .map(|i| xv[i * k + pj / m] * delta[i * m + pj % m])
                .sum()
        })
        .collect();
    let db: Vec<f64> = (0..m)
        .map(|j| (0..n).map(|i| delta[i * m + j]).sum())
        .collect();
    assert_close("loss", &read(&loss), &[want_loss], 1e-4);
    assert_close("dx", &read(&grads[0]), &dx, 1e-4);
    assert_close("dW", &read(&grads[1]), &dw, 1e-4);
    assert_close("db", &read(&grads[2]), &db, 1e-4);
}

#[test]
fn misuse_is_an_error_that_says_what_to_do() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    let y = (&x * 3.0).unwrap();
    let e = grad(&y, &[&x]).unwrap_err();
    assert!(
        invalid("grad")(&e) && e.to_string().contains("sum_all"),
        "{e}"
    );
    let loss = y.sum_all().unwrap();
    let unused = Tensor::from_vec(vec![1.0f32], [1]).unwrap();
    let e = grad(&loss, &[&unused]).unwrap_err();
    assert!(e.to_string().contains("does not take part"), "{e}");
    let ints = Tensor::from_vec(vec![1i32, 2], [2]).unwrap();
    let e = grad(&loss, &[&ints]).unwrap_err();
    assert!(e.to_string().contains("float"), "{e}");
}

/// PyTorch's order: read the loss, then take its gradients. A realized one-element loss
/// keeps what it was computed from, so `grad` still reaches the inputs; a realized
/// intermediate is still a constant.
#[test]
fn a_loss_read_before_grad_is_still_differentiable() {
    let x = Tensor::from_vec(vec![1.0f64, -2.0, 3.0], [3]).unwrap();
    let h = (&x * &x).unwrap();
    let loss = (&h * 0.5).unwrap().sum_all().unwrap();
    assert_eq!(loss.item::<f64>().unwrap(), 7.0);
    let g = grad(&loss, &[&x]).unwrap();
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![1.0, -2.0, 3.0]);
    // Reading the loss again, and differentiating it again, give the same.
    assert_eq!(loss.item::<f64>().unwrap(), 7.0);
    let g = grad(&loss, &[&x]).unwrap();
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![1.0, -2.0, 3.0]);
    // Through a realized intermediate, nothing reaches `x`.
    h.realize().unwrap();
    let through = (&h * 1.0).unwrap().sum_all().unwrap();
    through.realize().unwrap();
    let e = grad(&through, &[&x]).unwrap_err();
    assert!(e.to_string().contains("does not take part"), "{e}");
}

#[test]
fn a_gradient_step_assigned_to_a_parameter_replays_one_plan() {
    let w = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], [3]).unwrap();
    let target = Tensor::from_vec(vec![1.0f32, 1.0, 1.0], [3]).unwrap();
    let mut losses = Vec::new();
    let mut compiled = Vec::new();
    for _ in 0..4 {
        let loss = (&w - &target).unwrap().pow(2.0).unwrap().sum_all().unwrap();
        let g = loss.backward(&[&w]).unwrap().remove(0);
        let next = (&w - &(&g * 0.25).unwrap()).unwrap();
        let report = Tensor::realize_all(&[&loss, &next]).unwrap();
        w.assign(&next).unwrap();
        losses.push(loss.item::<f32>().unwrap());
        compiled.push(report.kernels_prepared());
    }
    // w ← w - 0.5 (w - 1): the distance to 1 halves each step, so the loss quarters.
    assert_close(
        "losses",
        &losses.iter().map(|&l| f64::from(l)).collect::<Vec<_>>(),
        &[5.25, 1.3125, 0.328125, 0.08203125],
        1e-6,
    );
    assert!(
        compiled[1..].iter().all(|&c| c == 0),
        "compiles per step: {compiled:?}"
    );
    assert_close("w", &read(&w), &[0.96875, 0.875, 1.0625], 1e-6);
}

/// A classifier's loss and gradients in one realize: `-mean(log_softmax(x·W)[y])` with
/// `dW = xᵀ (softmax(x·W) - onehot(y)) / n`. Realized together, the schedule once formed
/// multi-output kernels that waited on each other (a cycle).
#[test]
fn cross_entropy_gradients_realize_with_the_loss() {
    let (n, k, c) = (5, 6, 3);
    let mut rng = Rng::new(5);
    let xv: Vec<f64> = (0..n * k)
        .map(|_| f64::from(rng.uniform(-1.0, 1.0) as f32))
        .collect();
    let wv: Vec<f64> = (0..k * c)
        .map(|_| f64::from(rng.uniform(-1.0, 1.0) as f32))
        .collect();
    let labels = [0usize, 2, 1, 2, 0];
    let x = tensor(DType::F32, &xv, &[n, k]);
    let w = tensor(DType::F32, &wv, &[k, c]);
    let y = Tensor::from_vec(labels.iter().map(|&l| l as i64).collect(), [n, 1]).unwrap();
    let h = x.matmul(&w).unwrap().relu();
    let w2 = tensor(
        DType::F32,
        &[0.5, -1.0, 0.25, 1.5, 0.75, -0.5, -2.0, 1.0, 0.5],
        &[c, c],
    );
    let logits = h.matmul(&w2).unwrap();
    let picked = logits.log_softmax(1).unwrap().gather(1, &y).unwrap();
    let loss = picked.mean_all().unwrap().neg().unwrap();
    let g = grad(&loss, &[&logits, &w]).unwrap();
    Tensor::realize_all(&[&loss, &g[0], &g[1]]).unwrap();
    // The reference for d loss / d logits: (softmax - onehot) / n.
    let lv = read(&logits);
    let mut want = vec![0.0; n * c];
    let mut want_loss = 0.0;
    for i in 0..n {
        let row = &lv[i * c..(i + 1) * c];
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        for j in 0..c {
            let p = (row[j] - max).exp() / sum;
            want[i * c + j] = (p - f64::from(u8::from(j == labels[i]))) / n as f64;
        }
        want_loss -= (row[labels[i]] - max - sum.ln()) / n as f64;
    }
    assert_close("loss", &read(&loss), &[want_loss], 1e-5);
    assert_close("d logits", &read(&g[0]), &want, 1e-5);
    assert_eq!(g[1].dims(), vec![k, c]);
}

/// A scale and a bias broadcast over many rows (a layer norm's weight and bias over every
/// token): their gradients, sums over 300 rows (summed in blocks of rows, the last one
/// padded), against sums in f64, in f32 on every device.
#[test]
fn gradients_of_operands_broadcast_over_many_rows() {
    let [rows, cols] = [300usize, 24];
    let mut rng = Rng::new(0x0b1a5);
    let mut random = |n: usize| -> Vec<f64> { (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect() };
    let (xv, sv, bv, wv) = (
        random(rows * cols),
        random(cols),
        random(cols),
        random(rows * cols),
    );
    let x = tensor(DType::F32, &xv, &[3, 100, cols]);
    let (s, b) = (
        tensor(DType::F32, &sv, &[cols]),
        tensor(DType::F32, &bv, &[cols]),
    );
    let w = tensor(DType::F32, &wv, &[3, 100, cols]);
    let y = (&(&x * &s).unwrap() + &b).unwrap();
    let loss = (&y * &w).unwrap().sum_all().unwrap();
    let grads = grad(&loss, &[&s, &b]).unwrap();
    let column = |f: &dyn Fn(usize) -> f64| -> Vec<f64> {
        (0..cols)
            .map(|c| (0..rows).map(|r| f(r * cols + c)).sum())
            .collect()
    };
    let ds = column(&|i| wv[i] * f64::from(xv[i] as f32));
    let db = column(&|i| wv[i]);
    assert_close("d/d scale", &read(&grads[0]), &ds, 1e-4);
    assert_close("d/d bias", &read(&grads[1]), &db, 1e-4);
}

/// Attention's gradients (`softmax(q kᵀ · s [causal | padding mask]) v`, recorded as
/// `scaled_dot_product_attention` records it: half products, the softmax in f32) in f32 and
/// bf16 against `tessel_ir::AttentionBackward::reference` in f64, however the plan computes
/// them (the fused backward kernels or the composition).
#[test]
fn attention_gradients_match_the_f64_reference() {
    use tessel_ir::{Attention, AttentionBackward, AttentionMask};
    use tessel_shape::{Bindings, Dim, Scalar};
    let (pairs, heads, l, s, e) = (6, 3, 37, 45, 16);
    let scale = 0.25;
    let mut rng = Rng::new(23);
    let hidden: Vec<f64> = (0..2 * s)
        .map(|i| f64::from(u8::from(i % 5 == 3)))
        .collect();
    for dtype in on_device([DType::F32, DType::BF16]) {
        for causal in [true, false] {
            let mut draw = |n: usize| -> Vec<f64> {
                let raw: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
                read(&tensor(dtype, &raw, &[n]))
            };
            let (qv, kv, vv, dv) = (
                draw(pairs * l * e),
                draw(pairs * s * e),
                draw(pairs * s * e),
                draw(pairs * l * e),
            );
            let dims = |rows: usize| [2, heads, rows, e];
            let [q, k, v, d_out] =
                [(&qv, l), (&kv, s), (&vv, s), (&dv, l)].map(|(x, r)| tensor(dtype, x, &dims(r)));
            let product = q.matmul(&k.transpose(-2, -1).unwrap()).unwrap();
            let mut scores = (&product.cast(DType::F32) * scale).unwrap();
            scores = if causal {
                let above = scores.ones_like().cast(DType::Bool).triu(1).unwrap();
                scores.masked_fill(&above, f64::NEG_INFINITY).unwrap()
            } else {
                let padding = tensor(DType::Bool, &hidden, &[2, 1, 1, s]);
                scores.masked_fill(&padding, f64::NEG_INFINITY).unwrap()
            };
            let probs = scores.softmax(-1).unwrap().cast(dtype);
            let y = probs.matmul(&v).unwrap();
            let loss = (&y * &d_out).unwrap().cast(DType::F32).sum_all().unwrap();
            let grads = grad(&loss, &[&q, &k, &v]).unwrap();
            if grads.iter().any(|g| skipped(g, "attention gradients")) {
                return;
            }
            let op = Attention {
                dtype,
                batch: Dim::from(pairs as i64),
                l: Dim::from(l as i64),
                s: Dim::from(s as i64),
                e: Dim::from(e as i64),
                ev: Dim::from(e as i64),
                q_batch_stride: Dim::from((l * e) as i64),
                k_batch_stride: Dim::from((s * e) as i64),
                v_batch_stride: Dim::from((s * e) as i64),
                kv_group: Dim::from(1),
                scale: Scalar::F32(scale as f32),
                causal,
                mask: (!causal).then(|| AttentionMask {
                    dtype: DType::Bool,
                    heads: Dim::from(heads as i64),
                    strides: [s as i64, 0, 0, 1].map(Dim::from),
                }),
                dropout: None,
                layout: None,
            };
            let sizes = op.sizes(&Bindings::new()).unwrap();
            let want =
                AttentionBackward::reference(&op, &sizes, [&qv, &kv, &vv, &hidden, &dv], [0; 4]);
            // The reference's dk is transposed per pair.
            let dk: Vec<f64> = (0..pairs * s * e)
                .map(|at| {
                    let (b, j, d) = (at / (s * e), at / e % s, at % e);
                    want.dk[(b * e + d) * s + j]
                })
                .collect();
            let rel = if dtype == DType::F32 {
                1e-4
            } else {
                2f64.powi(-6)
            };
            for (name, got, want) in [("dq", 0, &want.dq), ("dk", 1, &dk), ("dv", 2, &want.dv)] {
                let got = read(&grads[got]);
                let largest = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
                for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    assert!(
                        (g - w).abs() <= rel * largest,
                        "{dtype} causal {causal}: {name}[{i}] is {g}, want {w} (largest {largest})"
                    );
                }
            }
        }
    }
}
