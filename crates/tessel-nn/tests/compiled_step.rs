//! `CompiledStep`: steps replayed from one recording update parameters and state exactly
//! as `Optimizer::step` does, batch after batch, and refuse what they cannot replay.

use tessel_nn::BatchNorm1d;
use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel_nn::optim::{AdamW, AdamWConfig, CompiledStep, Optimizer, Sgd, SgdConfig};
use tessel_tensor::{Error, Result, Tensor};

/// A small LCG: values in [-1, 1).
struct Lcg(u64);

impl Lcg {
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0) as f32
            })
            .collect()
    }
}

/// The weights of a 12-16-5 MLP, as new tensors (so two models start equal but apart).
fn weights(seed: u64) -> Result<Vec<Tensor>> {
    let mut rng = Lcg(seed);
    Ok(vec![
        Tensor::from_vec(rng.vec(12 * 16), [12, 16])?,
        Tensor::from_vec(rng.vec(16), [16])?,
        Tensor::from_vec(rng.vec(16 * 5), [16, 5])?,
        Tensor::from_vec(rng.vec(5), [5])?,
    ])
}

/// With `dropout`, the hidden layer's activations are dropped with p = 0.25.
fn mlp_loss(w: &[Tensor], x: &Tensor, y: &Tensor, dropout: bool) -> Result<Tensor> {
    let mut h = (&x.matmul(&w[0])? + &w[1])?.relu();
    if dropout {
        h = h.dropout(0.25)?;
    }
    let logits = (&h.matmul(&w[2])? + &w[3])?;
    cross_entropy(&logits, y, &CrossEntropyOptions::default())
}

fn batch(seed: u64) -> Result<(Tensor, Tensor)> {
    let x = Tensor::from_vec(Lcg(seed).vec(8 * 12), [8, 12])?;
    let y = Tensor::from_vec((0..8).map(|i| (i * 3 + seed as i64) % 5).collect(), [8])?;
    Ok((x, y))
}

fn assert_close(got: &Tensor, want: &Tensor, what: &str) -> Result<()> {
    let (g, w) = (got.to_vec::<f32>()?, want.to_vec::<f32>()?);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let tol = 1e-5 * b.abs().max(1.0);
        assert!(
            (a - b).abs() <= tol,
            "{what}[{i}]: compiled {a}, stepped {b}"
        );
    }
    Ok(())
}

/// Five batches through `Optimizer::step` and through a compiled step, with `AdamW` (also
/// with dropout, the generator seeded alike before each step) and with SGD (momentum,
/// dampening: its first step differs from the later ones), and a learning rate changed
/// halfway: the losses and parameters agree after every step.
#[test]
fn compiled_steps_update_as_optimizer_steps_do() -> Result<()> {
    for (sgd, dropout) in [(false, false), (true, false), (false, true)] {
        let (stepped, compiled) = (weights(7)?, weights(7)?);
        let make = |params: Vec<Tensor>| -> Result<Box<dyn Optimizer>> {
            Ok(if sgd {
                let config = SgdConfig {
                    lr: 0.1,
                    momentum: 0.9,
                    dampening: 0.1,
                    ..SgdConfig::default()
                };
                Box::new(Sgd::new(params, config)?)
            } else {
                let config = AdamWConfig {
                    lr: 0.01,
                    ..AdamWConfig::default()
                };
                Box::new(AdamW::new(params, config)?)
            })
        };
        let (mut opt_a, mut opt_b) = (make(stepped.clone())?, make(compiled.clone())?);
        let (x0, y0) = batch(100)?;
        let step = CompiledStep::new(&mut *opt_b, &[&x0, &y0], |b| {
            mlp_loss(&compiled, &b[0], &b[1], dropout)
        })?;
        assert_eq!(opt_b.steps(), 0, "compiling takes no step");
        for round in 0..5u64 {
            if round == 3 {
                opt_a.set_lr(opt_a.lr() / 2.0);
                opt_b.set_lr(opt_b.lr() / 2.0);
            }
            let (x, y) = batch(round)?;
            Tensor::manual_seed(100 + round);
            let want = mlp_loss(&stepped, &x, &y, dropout)?;
            opt_a.step(&want)?;
            Tensor::manual_seed(100 + round);
            let got = step.step(&mut *opt_b, &[&x, &y])?;
            let what = format!(
                "{} step {round}{}",
                if sgd { "SGD" } else { "AdamW" },
                if dropout { " with dropout" } else { "" }
            );
            assert_close(&got, &want, &format!("{what}: loss"))?;
            for (k, (a, b)) in compiled.iter().zip(&stepped).enumerate() {
                assert_close(a, b, &format!("{what}: parameter {k}"))?;
            }
            assert_eq!(opt_b.steps(), round + 1);
        }
    }
    Ok(())
}

fn error_of<T>(what: &str, r: Result<T>) -> Error {
    match r {
        Ok(_) => panic!("{what}: expected an error"),
        Err(e) => e,
    }
}

#[test]
fn compiled_steps_refuse_what_they_cannot_replay() -> Result<()> {
    let w = weights(3)?;
    let (x, y) = batch(1)?;
    let mut opt = Sgd::new(w.clone(), SgdConfig::default())?;

    let bn = BatchNorm1d::new(12)?;
    let e = error_of(
        "batch norm",
        CompiledStep::new(&mut opt, &[&x, &y], |b| {
            mlp_loss(&w, &bn.forward(&b[0])?, &b[1], false)
        }),
    );
    assert!(e.to_string().contains("BatchNorm"), "{e}");

    let e = error_of(
        "not a scalar",
        CompiledStep::new(&mut opt, &[&x, &y], |b| b[0].matmul(&w[0])),
    );
    assert!(e.to_string().contains("single value"), "{e}");

    let step = CompiledStep::new(&mut opt, &[&x, &y], |b| mlp_loss(&w, &b[0], &b[1], false))?;
    let mut other = Sgd::new(weights(3)?, SgdConfig::default())?;
    let e = error_of("other optimizer", step.step(&mut other, &[&x, &y]));
    assert!(e.to_string().contains("not the one"), "{e}");
    let wide = Tensor::from_vec(vec![0f32; 8 * 13], [8, 13])?;
    let e = error_of("batch shape", step.step(&mut opt, &[&wide, &y]));
    assert!(e.to_string().contains("compiled for"), "{e}");
    assert_eq!(
        opt.steps(),
        0,
        "a refused step does not advance the optimizer"
    );
    step.step(&mut opt, &[&x, &y])?;
    assert_eq!(opt.steps(), 1);
    Ok(())
}
