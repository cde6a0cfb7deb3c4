//! Optimizers against hand-written f64 references of PyTorch's update formulas, schedules
//! against their closed forms, and "a training step compiles once".

use std::f64::consts::PI;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tessel_nn::optim::{
    Adam, AdamConfig, AdamW, AdamWConfig, ConstantLr, CosineAnnealingLr, LinearLr, LrSchedule,
    LrScheduler, Optimizer, SequentialLr, Sgd, SgdConfig, StepLr,
};
use tessel_nn::{BatchNorm1d, Linear, Module};
use tessel_tensor::{DType, Tensor, bf16, f16, stats};

/// The compile counters are process-wide: tests that read them must not overlap with
/// tests that compile, so every test here runs alone.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A small LCG: values in [-1, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn assert_close(got: &[f64], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        // Half-precision values near zero carry absolute, not relative, rounding error.
        let floor = if rel >= 1e-2 { 1.0 } else { 1e-3 };
        let tol = rel * w.abs().max(floor);
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w} (|diff| {} > {tol})",
            (g - w).abs()
        );
    }
}

// ---- f64 references, transcribed from torch/optim/{sgd,adam,adamw}.py (single tensor) ----

#[derive(Clone, Copy)]
struct SgdRef {
    lr: f64,
    momentum: f64,
    dampening: f64,
    weight_decay: f64,
    nesterov: bool,
}

fn sgd_ref(p: &mut [f64], buf: &mut Option<Vec<f64>>, g: &[f64], c: SgdRef) {
    let mut d: Vec<f64> = g
        .iter()
        .zip(p.iter())
        .map(|(g, p)| g + c.weight_decay * p)
        .collect();
    if c.momentum != 0.0 {
        let b = match buf.take() {
            None => d.clone(),
            Some(b) => b
                .iter()
                .zip(&d)
                .map(|(b, g)| c.momentum * b + (1.0 - c.dampening) * g)
                .collect(),
        };
        if c.nesterov {
            d = d.iter().zip(&b).map(|(g, b)| g + c.momentum * b).collect();
        } else {
            d.clone_from(&b);
        }
        *buf = Some(b);
    }
    for (p, d) in p.iter_mut().zip(&d) {
        *p -= c.lr * d;
    }
}

#[derive(Clone, Copy)]
struct AdamRef {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    amsgrad: bool,
    decoupled: bool,
}

struct AdamState {
    m: Vec<f64>,
    v: Vec<f64>,
    vmax: Vec<f64>,
    t: i32,
}

impl AdamState {
    fn new(n: usize) -> Self {
        AdamState {
            m: vec![0.0; n],
            v: vec![0.0; n],
            vmax: vec![0.0; n],
            t: 0,
        }
    }
}

fn adam_ref(p: &mut [f64], s: &mut AdamState, g: &[f64], c: AdamRef) {
    s.t += 1;
    let bc1 = 1.0 - c.beta1.powi(s.t);
    let bc2 = 1.0 - c.beta2.powi(s.t);
    for i in 0..p.len() {
        let mut g = g[i];
        if c.decoupled {
            p[i] *= 1.0 - c.lr * c.weight_decay;
        } else {
            g += c.weight_decay * p[i];
        }
        s.m[i] = c.beta1 * s.m[i] + (1.0 - c.beta1) * g;
        s.v[i] = c.beta2 * s.v[i] + (1.0 - c.beta2) * g * g;
        s.vmax[i] = s.vmax[i].max(s.v[i]);
        let v = if c.amsgrad { s.vmax[i] } else { s.v[i] };
        let denom = v.sqrt() / bc2.sqrt() + c.eps;
        p[i] -= c.lr / bc1 * s.m[i] / denom;
    }
}

/// Two parameters of different shapes, their initial values and `steps` gradients each.
struct Problem {
    init: Vec<Vec<f64>>,
    dims: Vec<Vec<usize>>,
    grads: Vec<Vec<Vec<f64>>>,
}

fn problem(seed: u64, steps: usize) -> Problem {
    let mut rng = Lcg(seed);
    let dims = vec![vec![3, 4], vec![5]];
    let init = dims.iter().map(|d| rng.vec(d.iter().product())).collect();
    let grads = (0..steps)
        .map(|_| dims.iter().map(|d| rng.vec(d.iter().product())).collect())
        .collect();
    Problem { init, dims, grads }
}

fn tensors(values: &[Vec<f64>], dims: &[Vec<usize>], dtype: DType) -> Vec<Tensor> {
    values
        .iter()
        .zip(dims)
        .map(|(v, d)| match dtype {
            DType::F64 => Tensor::from_vec(v.clone(), d.clone()).unwrap(),
            DType::F32 => {
                Tensor::from_vec(v.iter().map(|&x| x as f32).collect(), d.clone()).unwrap()
            }
            DType::F16 => {
                Tensor::from_vec(v.iter().map(|&x| f16::from_f64(x)).collect(), d.clone()).unwrap()
            }
            DType::BF16 => {
                Tensor::from_vec(v.iter().map(|&x| bf16::from_f64(x)).collect(), d.clone()).unwrap()
            }
            _ => unreachable!(),
        })
        .collect()
}

fn values(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F64 => t.to_vec::<f64>().unwrap(),
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        other => panic!("unexpected dtype {other}"),
    }
}

/// Runs `opt` and the reference `reference` for the problem's steps, comparing the
/// parameters after every step.
fn run_against_reference(
    pb: &Problem,
    dtype: DType,
    rel: f64,
    make: impl FnOnce(Vec<Tensor>) -> Box<dyn Optimizer>,
    mut reference: impl FnMut(usize, &mut [f64], &[f64]),
    what: &str,
) {
    let params = tensors(&pb.init, &pb.dims, dtype);
    let mut opt = make(params.clone());
    let mut want = pb.init.clone();
    for (step, grads) in pb.grads.iter().enumerate() {
        opt.apply(&tensors(grads, &pb.dims, dtype), &[]).unwrap();
        for (i, (p, g)) in want.iter_mut().zip(grads).enumerate() {
            reference(i, p, g);
        }
        for (i, p) in params.iter().enumerate() {
            assert_close(
                &values(p),
                &want[i],
                rel,
                &format!("{what}, step {}, param {i}", step + 1),
            );
        }
    }
    assert_eq!(opt.steps(), pb.grads.len() as u64);
}

fn check_sgd(c: SgdRef, dtype: DType, rel: f64, steps: usize, what: &str) {
    let pb = problem(11, steps);
    let mut bufs = [None, None];
    run_against_reference(
        &pb,
        dtype,
        rel,
        |ps| {
            Box::new(
                Sgd::new(
                    ps,
                    SgdConfig {
                        lr: c.lr,
                        momentum: c.momentum,
                        dampening: c.dampening,
                        weight_decay: c.weight_decay,
                        nesterov: c.nesterov,
                    },
                )
                .unwrap(),
            )
        },
        |i, p, g| sgd_ref(p, &mut bufs[i], g, c),
        what,
    );
}

const SGD_PLAIN: SgdRef = SgdRef {
    lr: 0.1,
    momentum: 0.0,
    dampening: 0.0,
    weight_decay: 0.0,
    nesterov: false,
};

#[test]
fn sgd_plain_one_and_three_steps() {
    let _g = serial();
    check_sgd(SGD_PLAIN, DType::F64, 1e-12, 1, "sgd");
    check_sgd(SGD_PLAIN, DType::F64, 1e-12, 3, "sgd");
    check_sgd(
        SgdRef {
            weight_decay: 0.05,
            ..SGD_PLAIN
        },
        DType::F64,
        1e-12,
        3,
        "sgd+wd",
    );
    check_sgd(SGD_PLAIN, DType::F32, 1e-5, 3, "sgd f32");
}

#[test]
fn sgd_momentum_dampening_nesterov() {
    let _g = serial();
    let m = SgdRef {
        momentum: 0.9,
        ..SGD_PLAIN
    };
    check_sgd(m, DType::F64, 1e-12, 1, "momentum");
    check_sgd(m, DType::F64, 1e-12, 3, "momentum");
    // Dampening does not apply on the first step (the buffer starts as the gradient).
    check_sgd(
        SgdRef {
            dampening: 0.3,
            weight_decay: 0.01,
            ..m
        },
        DType::F64,
        1e-12,
        3,
        "momentum+dampening+wd",
    );
    check_sgd(
        SgdRef {
            nesterov: true,
            ..m
        },
        DType::F64,
        1e-12,
        3,
        "nesterov",
    );
    check_sgd(
        SgdRef {
            nesterov: true,
            ..m
        },
        DType::F32,
        1e-5,
        3,
        "nesterov f32",
    );
}

fn check_adam(c: AdamRef, dtype: DType, rel: f64, steps: usize, what: &str) {
    let pb = problem(23, steps);
    let mut states: Vec<AdamState> = pb.init.iter().map(|v| AdamState::new(v.len())).collect();
    run_against_reference(
        &pb,
        dtype,
        rel,
        |ps| -> Box<dyn Optimizer> {
            if c.decoupled {
                Box::new(
                    AdamW::new(
                        ps,
                        AdamWConfig {
                            lr: c.lr,
                            betas: (c.beta1, c.beta2),
                            eps: c.eps,
                            weight_decay: c.weight_decay,
                            amsgrad: c.amsgrad,
                        },
                    )
                    .unwrap(),
                )
            } else {
                Box::new(
                    Adam::new(
                        ps,
                        AdamConfig {
                            lr: c.lr,
                            betas: (c.beta1, c.beta2),
                            eps: c.eps,
                            weight_decay: c.weight_decay,
                            amsgrad: c.amsgrad,
                        },
                    )
                    .unwrap(),
                )
            }
        },
        |i, p, g| adam_ref(p, &mut states[i], g, c),
        what,
    );
}

const ADAM: AdamRef = AdamRef {
    lr: 0.01,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 0.0,
    amsgrad: false,
    decoupled: false,
};

#[test]
fn adam_one_and_three_steps() {
    let _g = serial();
    check_adam(ADAM, DType::F64, 1e-12, 1, "adam");
    check_adam(ADAM, DType::F64, 1e-12, 3, "adam");
    check_adam(
        AdamRef {
            weight_decay: 0.1,
            beta1: 0.6,
            ..ADAM
        },
        DType::F64,
        1e-12,
        3,
        "adam+l2, beta1 0.6",
    );
    check_adam(ADAM, DType::F32, 1e-5, 3, "adam f32");
}

#[test]
fn adam_amsgrad() {
    let _g = serial();
    let c = AdamRef {
        amsgrad: true,
        beta2: 0.9,
        ..ADAM
    };
    check_adam(c, DType::F64, 1e-12, 5, "amsgrad");
    check_adam(
        AdamRef {
            decoupled: true,
            weight_decay: 0.01,
            ..c
        },
        DType::F64,
        1e-12,
        5,
        "adamw amsgrad",
    );
}

#[test]
fn adamw_one_and_three_steps() {
    let _g = serial();
    let c = AdamRef {
        decoupled: true,
        weight_decay: 1e-2,
        ..ADAM
    };
    assert_eq!(AdamWConfig::default().weight_decay, 1e-2);
    check_adam(c, DType::F64, 1e-12, 1, "adamw");
    check_adam(c, DType::F64, 1e-12, 3, "adamw");
    check_adam(
        AdamRef {
            weight_decay: 0.3,
            lr: 0.1,
            ..c
        },
        DType::F64,
        1e-12,
        3,
        "adamw strong decay",
    );
    check_adam(c, DType::F32, 1e-5, 3, "adamw f32");
}

/// Half-precision parameters update in their own dtype (f16/bf16 compare at 1e-2).
#[test]
fn half_precision_params() {
    let _g = serial();
    let lr = AdamRef { lr: 0.05, ..ADAM };
    for dtype in [DType::F16, DType::BF16] {
        check_adam(lr, dtype, 1e-2, 3, &format!("adam {dtype}"));
        check_adam(
            AdamRef {
                decoupled: true,
                weight_decay: 0.01,
                ..lr
            },
            dtype,
            1e-2,
            3,
            &format!("adamw {dtype}"),
        );
        check_sgd(
            SgdRef {
                momentum: 0.9,
                ..SGD_PLAIN
            },
            dtype,
            1e-2,
            3,
            &format!("sgd {dtype}"),
        );
    }
}

#[test]
fn set_lr_changes_following_steps() {
    let _g = serial();
    // SGD with lr 0.1, then 0.5 (a schedule's doing): p -= lr_t · g_t.
    let pb = problem(5, 2);
    let params = tensors(&pb.init, &pb.dims, DType::F64);
    let mut opt = Sgd::new(
        params.clone(),
        SgdConfig {
            lr: 0.1,
            ..Default::default()
        },
    )
    .unwrap();
    opt.apply(&tensors(&pb.grads[0], &pb.dims, DType::F64), &[])
        .unwrap();
    opt.set_lr(0.5);
    assert_eq!(opt.lr(), 0.5);
    opt.apply(&tensors(&pb.grads[1], &pb.dims, DType::F64), &[])
        .unwrap();
    for (i, p) in params.iter().enumerate() {
        let want: Vec<f64> = (0..pb.init[i].len())
            .map(|k| pb.init[i][k] - 0.1 * pb.grads[0][i][k] - 0.5 * pb.grads[1][i][k])
            .collect();
        assert_close(&values(p), &want, 1e-12, "sgd with set_lr");
    }
}

#[test]
fn state_is_zeroed_like_the_params() {
    let _g = serial();
    let p = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    let opt = AdamW::new(vec![p], AdamWConfig::default()).unwrap();
    for s in [&opt.exp_avg()[0], &opt.exp_avg_sq()[0]] {
        assert_eq!(s.dtype(), DType::F32);
        assert_eq!(s.dims(), vec![3]);
        assert_eq!(s.to_vec::<f32>().unwrap(), vec![0.0; 3]);
    }
    assert!(opt.max_exp_avg_sq().is_empty());
}

#[test]
fn also_realize_is_computed_with_the_update() {
    let _g = serial();
    let w = Tensor::from_vec(vec![1.0f64, -2.0], [2]).unwrap();
    let metric = (&w * &w).unwrap().sum_all().unwrap();
    let mut opt = Sgd::new(
        vec![w.clone()],
        SgdConfig {
            lr: 0.25,
            ..Default::default()
        },
    )
    .unwrap();
    let g = Tensor::from_vec(vec![4.0f64, -4.0], [2]).unwrap();
    opt.apply(&[g], &[&metric]).unwrap();
    // The metric was recorded before the step: it keeps the old weights' value.
    assert_eq!(metric.item::<f64>().unwrap(), 5.0);
    assert_eq!(w.to_vec::<f64>().unwrap(), vec![0.0, -1.0]);
}

#[test]
fn misuse_is_an_error() {
    let _g = serial();
    let p = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    let msg = |r: tessel_tensor::Result<()>| r.unwrap_err().to_string();

    assert!(
        Sgd::new(vec![], SgdConfig::default())
            .err()
            .unwrap()
            .to_string()
            .contains("empty")
    );
    let int = Tensor::from_vec(vec![1i32, 2], [2]).unwrap();
    assert!(
        Adam::new(vec![int], AdamConfig::default())
            .err()
            .unwrap()
            .to_string()
            .contains("floating-point")
    );
    let e = Sgd::new(
        vec![p.clone()],
        SgdConfig {
            nesterov: true,
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("Nesterov"), "{e}");
    let e = Adam::new(
        vec![p.clone()],
        AdamConfig {
            betas: (0.9, 1.0),
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("betas.1"), "{e}");
    assert!(
        AdamW::new(
            vec![p.clone()],
            AdamWConfig {
                lr: -1.0,
                ..Default::default()
            }
        )
        .is_err()
    );

    let mut opt = Adam::new(vec![p.clone()], AdamConfig::default()).unwrap();
    let e = msg(opt.apply(&[], &[]));
    assert!(e.contains("0 gradients were given for 1 parameters"), "{e}");
    let wrong_shape = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    let e = msg(opt.apply(&[wrong_shape], &[]));
    assert!(e.contains("gradient 0 is [3] f32"), "{e}");
    let wrong_dtype = Tensor::from_vec(vec![1.0f64, 2.0], [2]).unwrap();
    assert!(opt.apply(&[wrong_dtype], &[]).is_err());
    opt.set_lr(f64::NAN);
    let g = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    assert!(msg(opt.apply(&[g], &[])).contains("lr"));
    // Nothing was applied by the failed calls.
    assert_eq!(opt.steps(), 0);
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);

    let loss = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    let e = msg(opt.step(&loss));
    assert!(e.contains("single value"), "{e}");
}

#[test]
fn apply_compiles_only_on_the_first_step_and_keeps_memory_flat() {
    let _g = serial();
    let pb = problem(77, 12);
    let params = tensors(&pb.init, &pb.dims, DType::F32);
    let mut opt = AdamW::new(
        params,
        AdamWConfig {
            lr: 0.01,
            amsgrad: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mut sched = LrScheduler::new(CosineAnnealingLr::new(6, 0.0).unwrap(), &mut opt);
    let before = stats().kernels_prepared();
    let mut compiled = Vec::new();
    let mut memory = Vec::new();
    for grads in &pb.grads {
        opt.apply(&tensors(grads, &pb.dims, DType::F32), &[])
            .unwrap();
        sched.step(&mut opt);
        let s = stats();
        compiled.push(s.kernels_prepared());
        memory.push((s.buffers, s.graph_nodes, s.plans));
    }
    // The old parameters and states are freed as the new ones replace them.
    assert!(
        memory[1..].windows(2).all(|w| w[0] == w[1]),
        "(buffers, graph nodes, plans) after each step: {memory:?}"
    );
    assert!(compiled[0] > before, "the first step compiles its plan");
    assert!(
        compiled.windows(2).all(|w| w[0] == w[1]),
        "kernels compiled after each step: {compiled:?}"
    );
}

/// 20 steps of linear regression through `step(&loss)`: the loss falls and nothing
/// compiles after the second step.
#[test]
fn training_steps_lower_the_loss_and_compile_once() {
    let _g = serial();
    let mut rng = Lcg(2024);
    let (n, d) = (32, 4);
    let x: Vec<f32> = rng.vec(n * d).into_iter().map(|v| v as f32).collect();
    let true_w = [0.5f32, -1.0, 2.0, 0.25];
    let y: Vec<f32> = (0..n)
        .map(|i| (0..d).map(|j| x[i * d + j] * true_w[j]).sum::<f32>() + 0.3)
        .collect();
    let x = Tensor::from_vec(x, [n, d]).unwrap();
    let y = Tensor::from_vec(y, [n, 1]).unwrap();
    let w = Tensor::from_vec(
        rng.vec(d).into_iter().map(|v| v as f32 * 0.1).collect(),
        [d, 1],
    )
    .unwrap();
    let b = Tensor::from_vec(vec![0.0f32], [1]).unwrap();

    for make in [0, 1, 2] {
        w.assign(&Tensor::from_vec(vec![0.01f32, -0.02, 0.03, 0.0], [d, 1]).unwrap())
            .unwrap();
        b.assign(&Tensor::from_vec(vec![0.0f32], [1]).unwrap())
            .unwrap();
        let params = vec![w.clone(), b.clone()];
        let mut opt: Box<dyn Optimizer> = match make {
            0 => Box::new(
                Sgd::new(
                    params,
                    SgdConfig {
                        lr: 0.1,
                        momentum: 0.9,
                        ..Default::default()
                    },
                )
                .unwrap(),
            ),
            1 => Box::new(
                Adam::new(
                    params,
                    AdamConfig {
                        lr: 0.05,
                        ..Default::default()
                    },
                )
                .unwrap(),
            ),
            _ => Box::new(
                AdamW::new(
                    params,
                    AdamWConfig {
                        lr: 0.05,
                        ..Default::default()
                    },
                )
                .unwrap(),
            ),
        };
        let mut losses = Vec::new();
        let mut compiled = Vec::new();
        for _ in 0..20 {
            let pred = x.matmul(&w).unwrap().add(&b).unwrap();
            let err = pred.sub(&y).unwrap();
            let loss = err.mul(&err).unwrap().mean_all().unwrap();
            opt.step(&loss).unwrap();
            losses.push(f64::from(loss.item::<f32>().unwrap()));
            compiled.push(stats().kernels_prepared());
        }
        assert!(
            losses[19] < 0.25 * losses[0],
            "optimizer {make}: losses {losses:?}"
        );
        assert!(
            compiled[1..].windows(2).all(|w| w[0] == w[1]),
            "optimizer {make}: kernels compiled after each step {compiled:?}"
        );
    }
}

// ---- schedules ----

#[test]
fn step_lr_matches_formula() {
    let s = StepLr::new(3, 0.5).unwrap();
    for t in 0..10u64 {
        let want = 0.2 * 0.5f64.powi((t / 3) as i32);
        assert!((s.lr_at(0.2, t) - want).abs() < 1e-15, "step {t}");
    }
    assert!(StepLr::new(0, 0.1).is_err());
    assert_eq!(ConstantLr.lr_at(0.3, 17), 0.3);
}

#[test]
fn cosine_annealing_matches_formula() {
    let s = CosineAnnealingLr::new(10, 0.01).unwrap();
    for t in 0..=20u64 {
        let want = 0.01 + (0.1 - 0.01) * (1.0 + (PI * t as f64 / 10.0).cos()) / 2.0;
        assert!((s.lr_at(0.1, t) - want).abs() < 1e-15, "step {t}");
    }
    assert!((s.lr_at(0.1, 0) - 0.1).abs() < 1e-15);
    assert!((s.lr_at(0.1, 10) - 0.01).abs() < 1e-15);
    assert!(CosineAnnealingLr::new(0, 0.0).is_err());
}

#[test]
fn linear_warmup_matches_torch_linear_lr() {
    // torch.optim.lr_scheduler.LinearLR defaults: start 1/3, end 1, 5 iterations.
    let s = LinearLr::new(1.0 / 3.0, 1.0, 5).unwrap();
    let torch = [
        0.1 / 3.0,
        0.1 * (1.0 / 3.0 + 2.0 / 3.0 / 5.0),
        0.1 * (1.0 / 3.0 + 2.0 / 3.0 * 2.0 / 5.0),
        0.1 * (1.0 / 3.0 + 2.0 / 3.0 * 3.0 / 5.0),
        0.1 * (1.0 / 3.0 + 2.0 / 3.0 * 4.0 / 5.0),
        0.1,
        0.1,
    ];
    for (t, want) in torch.iter().enumerate() {
        assert!((s.lr_at(0.1, t as u64) - want).abs() < 1e-15, "step {t}");
    }
    let w = LinearLr::warmup(4).unwrap();
    assert!((w.lr_at(1.0, 0) - 0.25).abs() < 1e-15);
    assert!((w.lr_at(1.0, 2) - 0.625).abs() < 1e-15);
    assert!((w.lr_at(1.0, 4) - 1.0).abs() < 1e-15);
    assert!(LinearLr::new(0.0, 1.0, 5).is_err());
}

#[test]
fn warmup_then_cosine() {
    let s = SequentialLr::warmup_cosine(4, 14, 0.0).unwrap();
    for t in 0..4u64 {
        let want = 0.2 * (0.25 + 0.75 * t as f64 / 4.0);
        assert!((s.lr_at(0.2, t) - want).abs() < 1e-15, "warmup step {t}");
    }
    for t in 4..=14u64 {
        let want = 0.2 * (1.0 + (PI * (t - 4) as f64 / 10.0).cos()) / 2.0;
        assert!((s.lr_at(0.2, t) - want).abs() < 1e-15, "cosine step {t}");
    }
    assert!(SequentialLr::warmup_cosine(5, 5, 0.0).is_err());
    assert!(SequentialLr::new(vec![Box::new(ConstantLr)], vec![3]).is_err());
    assert!(
        SequentialLr::new(
            vec![
                Box::new(ConstantLr),
                Box::new(ConstantLr),
                Box::new(ConstantLr)
            ],
            vec![3, 3]
        )
        .is_err()
    );
}

#[test]
fn scheduler_drives_the_optimizer() {
    let _g = serial();
    let p = Tensor::from_vec(vec![1.0f32], [1]).unwrap();
    let mut opt = Sgd::new(
        vec![p],
        SgdConfig {
            lr: 0.4,
            ..Default::default()
        },
    )
    .unwrap();
    let mut sched = LrScheduler::new(StepLr::new(2, 0.5).unwrap(), &mut opt);
    let mut seen = vec![opt.lr()];
    for _ in 0..5 {
        sched.step(&mut opt);
        seen.push(opt.lr());
    }
    assert_eq!(seen, vec![0.4, 0.4, 0.2, 0.2, 0.1, 0.1]);
    assert_eq!(sched.steps(), 5);
    assert_eq!(sched.base_lr(), 0.4);
}

/// `BatchNorm`'s running statistics, updated lazily by each training forward, are realized
/// by the optimizer's step itself: the buffers stay buffers (the statistics follow
/// PyTorch's momentum formula step after step) and step 3 compiles nothing.
#[test]
fn steps_realize_batch_norm_statistics_without_being_told() {
    let _guard = serial();
    let mut rng = Lcg(21);
    let lin = Linear::new(3, 2).unwrap();
    let bn = BatchNorm1d::new(2).unwrap();
    let mut params = lin.parameters();
    params.extend(bn.parameters());
    let mut opt = Sgd::new(
        params,
        SgdConfig {
            lr: 0.1,
            ..SgdConfig::default()
        },
    )
    .unwrap();
    let mut want_mean = [0.0f64; 2];
    for step in 0..4 {
        let x: Vec<f32> = (0..12).map(|_| rng.next() as f32).collect();
        let x = Tensor::from_vec(x, [4, 3]).unwrap();
        let h = lin.forward(&x).unwrap();
        // The batch mean the statistics take in, before this step changes the weights.
        let batch: Vec<f32> = h.mean(&[0], false).unwrap().to_vec().unwrap();
        for (m, b) in want_mean.iter_mut().zip(&batch) {
            *m = 0.9 * *m + 0.1 * f64::from(*b);
        }
        let h = lin.forward(&x).unwrap();
        let loss = bn.forward(&h).unwrap().relu().sum_all().unwrap();
        let before = stats().kernels_prepared();
        opt.step(&loss).unwrap();
        if step >= 2 {
            assert_eq!(
                stats().kernels_prepared(),
                before,
                "step {step} prepared kernels"
            );
        }
        let got: Vec<f32> = bn.running_mean().unwrap().to_vec().unwrap();
        for (g, w) in got.iter().zip(&want_mean) {
            assert!(
                (f64::from(*g) - w).abs() < 1e-5,
                "step {step}: running mean {g} vs {w}"
            );
        }
    }
}

/// PyTorch's order in a training loop: read the loss, then step. The step still takes the
/// loss's gradients, gives the same parameters as stepping first, and replays one plan.
#[test]
fn a_loss_read_before_the_step_still_trains() {
    let _guard = serial();
    let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25, 1.5, -0.75], [2, 3]).unwrap();
    let run = |read_first: bool| -> Vec<f32> {
        let w = Tensor::from_vec(vec![0.1f32, -0.2, 0.3], [3, 1]).unwrap();
        let mut opt = Sgd::new(
            vec![w.clone()],
            SgdConfig {
                lr: 0.1,
                ..SgdConfig::default()
            },
        )
        .unwrap();
        for step in 0..4 {
            let loss = x.matmul(&w).unwrap().square().unwrap().mean_all().unwrap();
            let early = read_first.then(|| loss.item::<f32>().unwrap());
            let before = stats().kernels_prepared();
            opt.step(&loss).unwrap();
            if step >= 2 {
                assert_eq!(
                    stats().kernels_prepared(),
                    before,
                    "step {step} prepared kernels"
                );
            }
            if let Some(early) = early {
                assert_eq!(loss.item::<f32>().unwrap(), early);
            }
        }
        w.to_vec().unwrap()
    };
    assert_eq!(run(true), run(false));
}
