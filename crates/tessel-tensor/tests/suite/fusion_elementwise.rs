//! Elementwise work fuses: chains of ops, composite ops, constants, index-based creation
//! ops and views all realize as one kernel, and a realized structure replays on new data
//! without compiling.

use crate::common;
use crate::common::{Domain, Layout, Rng};
use tessel_tensor::{DType, RealizeReport, Result, Tensor};

/// `[45, 65]` and `[65]` inputs with their values.
fn inputs(seed: u64) -> (Tensor, Vec<f64>, Tensor, Vec<f64>) {
    let mut rng = Rng::new(seed);
    let x = common::random(
        &mut rng,
        DType::F32,
        45 * 65,
        Domain::new((-2.0, 2.0), (0, 0)),
    );
    let y = common::random(&mut rng, DType::F32, 65, Domain::new((0.5, 1.5), (0, 0)));
    (
        common::tensor(DType::F32, &x, &[45, 65]),
        x,
        common::tensor(DType::F32, &y, &[65]),
        y,
    )
}

/// Ten elementwise ops, one of them broadcasting.
fn chain(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    x.mul(y)?
        .add(1.5)?
        .tanh()
        .mul(x)?
        .sub(0.25)?
        .abs()?
        .sqrt()
        .maximum(y)?
        .div(2.0)?
        .neg()
}

fn chain_ref(x: f64, y: f64) -> f64 {
    -(((x * y + 1.5).tanh() * x - 0.25).abs().sqrt().max(y) / 2.0)
}

fn check_chain(x: &Tensor, xv: &[f64], y: &Tensor, yv: &[f64]) -> Result<RealizeReport> {
    let out = chain(x, y)?;
    let report = out.realize()?;
    let (want, _) =
        common::broadcast_map(&[(xv, &[45, 65]), (yv, &[65])], |v| chain_ref(v[0], v[1]));
    common::assert_close("chain", &common::read(&out), &want, 1e-4);
    Ok(report)
}

#[test]
fn a_ten_op_chain_is_one_kernel_and_replays_on_new_data_without_compiling() -> Result<()> {
    let (x, xv, y, yv) = inputs(21);
    let first = check_chain(&x, &xv, &y, &yv)?;
    assert_eq!(first.kernels, 1, "{first:?}");
    // The same computation on new data: the cached plan replays.
    let (x, xv, y, yv) = inputs(22);
    let again = check_chain(&x, &xv, &y, &yv)?;
    assert_eq!(
        (again.kernels, again.kernels_prepared(), again.copies),
        (1, 0, 0)
    );
    // Realizing a realized tensor does nothing.
    let out = chain(&x, &y)?;
    out.realize()?;
    assert_eq!(out.realize()?, RealizeReport::default());
    Ok(())
}

#[test]
fn composite_ops_views_and_creation_ops_fuse_into_one_kernel() -> Result<()> {
    let mut rng = Rng::new(23);
    let mut f = |dtype, layout| {
        let values = common::random(&mut rng, dtype, 21, Domain::new((-3.0, 3.0), (-9, 9)));
        common::view(layout, dtype, &values, 7, 3, 0.0)
    };
    let (a, av) = f(DType::F32, Layout::Permuted);
    let (b, bv) = f(DType::F32, Layout::Strided);
    let (i, iv) = f(DType::I32, Layout::Flipped);
    let one_kernel = |what: &str, t: &Tensor| -> Result<()> {
        let report = t.realize()?;
        assert_eq!(report.kernels, 1, "{what}: {report:?}");
        Ok(())
    };
    // Each composite op is one kernel, even on views.
    let composites = [
        ("remainder", a.remainder(&b)?),
        ("sigmoid", a.sigmoid()),
        ("silu", a.silu()),
        ("gelu", a.gelu()),
        ("gelu_tanh", a.gelu_tanh()),
        ("shl", i.shl(3)?.cast(DType::F32)),
        ("shr", i.shr(&i)?.cast(DType::F32)),
        ("where", Tensor::where_cond(&a.gt(&b)?, &a, &i)?),
        ("clamp", a.clamp(Some(-1.0), Some(1.0))?),
        ("logical_xor", a.logical_xor(&i)?.cast(DType::F32)),
    ];
    for (what, t) in &composites {
        one_kernel(what, t)?;
    }
    // Views, casts, comparisons and index-based creation ops in one expression.
    let mixed = Tensor::where_cond(
        &a.lt(0.0)?,
        &a.add(&Tensor::arange(0, 3, 1)?)?,
        Tensor::eye_m(7, 3),
    )?
    .mul(i.cast(DType::F32))?
    .sigmoid();
    one_kernel("mixed", &mixed)?;
    let want: Vec<f64> = (0..21)
        .map(|k| {
            let picked = if av[k] < 0.0 {
                av[k] + (k % 3) as f64
            } else if k / 3 == k % 3 {
                1.0
            } else {
                0.0
            };
            1.0 / (1.0 + (-(picked * iv[k])).exp())
        })
        .collect();
    common::assert_close("mixed", &common::read(&mixed), &want, 1e-4);
    let want: Vec<f64> = av
        .iter()
        .zip(&bv)
        .map(|(&x, &y)| x - (x / y).floor() * y)
        .collect();
    common::assert_close_floor(
        "remainder",
        &common::read(&composites[0].1),
        &want,
        1e-5,
        3.0,
    );
    // A constant alone is one kernel too.
    one_kernel("zeros", &Tensor::zeros([5, 3], DType::F16))?;
    Ok(())
}

/// A deep residual stream read by a reduction at every step: without materializing
/// large shared values, each step's reduction kernel would recompute the whole stream
/// from the input (kernels growing with depth); with it, results stay exact.
#[test]
fn a_deep_residual_stream_with_a_reduction_per_step() -> Result<()> {
    let (x, xv, _, _) = inputs(7);
    let mut t = x.clone();
    let mut want = xv.clone();
    let mut sums = Vec::new();
    let mut want_sums = Vec::new();
    for _ in 0..24 {
        // t + tanh(t)·0.5 − t·t·0.01: t is used four times per step.
        t = t.add(&t.tanh().mul(0.5)?)?.sub(&t.mul(&t)?.mul(0.01)?)?;
        for v in &mut want {
            let w = *v as f32;
            *v = f64::from(w + w.tanh() * 0.5 - w * w * 0.01);
        }
        sums.push(t.sum(&[-1], false)?);
        want_sums.push(
            want.chunks(65)
                .map(|r| r.iter().sum::<f64>())
                .collect::<Vec<_>>(),
        );
    }
    let all: Vec<&Tensor> = sums.iter().chain([&t]).collect();
    Tensor::realize_all(&all)?;
    common::assert_close("residual stream", &common::read(&t), &want, 1e-4);
    for (s, w) in sums.iter().zip(&want_sums) {
        common::assert_close_floor("per-step sum", &common::read(s), w, 1e-4, 1e-3);
    }
    Ok(())
}

/// Kernels large enough to compute several consecutive outputs per invocation (8 for 2-byte
/// elements, 4 otherwise): a transposed read with a bias broadcast along the rows, a pad of
/// the last axis (each output's own validity), and a row statistic broadcast along the last
/// axis, in f32 and bf16, against the f64 reference.
#[test]
fn several_outputs_per_invocation() -> Result<()> {
    use crate::common::nd::{Nd, assert_nd};
    for dtype in common::on_device([DType::F32, DType::BF16]) {
        let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
        let domain = Domain::new((-2.0, 2.0), (0, 0));
        let xr = Nd::random(&mut Rng::new(7), dtype, &[2, 128, 256], domain);
        let br = Nd::random(&mut Rng::new(8), dtype, &[256], domain);
        let (x, b) = (xr.tensor(dtype), br.tensor(dtype));
        let y = (&x.permute(&[1, 0, 2])? + &b)?.relu();
        let want = Nd::from_fn(&[128, 2, 256], |i| {
            common::round_to(dtype, xr.at(&[i[1], i[0], i[2]]) + br.data[i[2]]).max(0.0)
        });
        assert_nd(&format!("{dtype} bias relu"), &Nd::of(&y), &want, tol);

        let pr = Nd::random(&mut Rng::new(9), dtype, &[300, 250], domain);
        let padded = (&pr.tensor(dtype).pad(&[(3, 3)], 0.5)? * 2.0)?;
        let want = Nd::from_fn(&[300, 256], |i| {
            if (3..253).contains(&i[1]) {
                2.0 * pr.at(&[i[0], i[1] - 3])
            } else {
                1.0
            }
        });
        assert_nd(&format!("{dtype} pad"), &Nd::of(&padded), &want, tol);

        let m = x.max(&[2], true)?;
        Tensor::realize_all(&[&m])?;
        let centered = (&x - &m)?;
        let want = Nd::from_fn(&[2, 128, 256], |i| {
            let row_max = (0..256)
                .map(|c| xr.at(&[i[0], i[1], c]))
                .fold(f64::NEG_INFINITY, f64::max);
            common::round_to(dtype, xr.at(i) - row_max)
        });
        assert_nd(&format!("{dtype} row max"), &Nd::of(&centered), &want, tol);
    }
    Ok(())
}
