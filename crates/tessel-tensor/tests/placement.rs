//! Placement across devices: with every other device present enabled for placement, the
//! measured plan may run kernels anywhere and copy values between devices, and the values
//! are those of the home device alone.
//!
//! In its own binary: [`set_placement`] is process-wide and would slow every other test.
//! `cargo xtask test-gpu` runs it once per backend (home = `TESSEL_DEVICE`); in CI that is
//! the CPU with wgpu (lavapipe) and OpenCL (PoCL) as the other devices, and the reverse.

use tessel_tensor::{DType, Device, Result, Tensor, set_placement};

/// A small model: matmul, bias, `ReLU`, softmax and a row sum, as two outputs.
fn model(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let h = (&x.matmul(w)? + b)?.relu();
    let probs = h.softmax(-1)?;
    let total = h.sum(&[1], false)?;
    Ok((probs, total))
}

#[test]
fn placed_plans_give_the_home_devices_values() -> Result<()> {
    let home = Device::default();
    let others: Vec<Device> = Device::all()
        .into_iter()
        .filter(|d| *d != home && d.supports(DType::F32))
        .collect();
    Tensor::manual_seed(3);
    let x = Tensor::randn([40, 300], DType::F32)?.to(&home)?;
    let w = Tensor::randn([300, 24], DType::F32)?.to(&home)?;
    let b = Tensor::randn([24], DType::F32)?.to(&home)?;
    Tensor::realize_all(&[&x, &w, &b])?;

    let (probs, total) = model(&x, &w, &b)?;
    let want = (probs.to_vec::<f32>()?, total.to_vec::<f32>()?);

    set_placement(&others)?;
    let (probs, total) = model(&x, &w, &b)?;
    let report = Tensor::realize_all(&[&probs, &total])?;
    eprintln!("{home} with {others:?}: {report:?}");
    if others.is_empty() {
        assert_eq!(report.copies, 0, "one device has nothing to copy");
    }
    let got = (probs.to_vec::<f32>()?, total.to_vec::<f32>()?);
    for (what, g, w) in [("probs", &got.0, &want.0), ("total", &got.1, &want.1)] {
        assert_eq!(g.len(), w.len());
        for (i, (g, w)) in g.iter().zip(w).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{what}[{i}]: {g} placed vs {w} at home"
            );
        }
    }
    // Replays the placed plan: nothing compiles, the same values.
    let (probs, total) = model(&x, &w, &b)?;
    assert_eq!(
        Tensor::realize_all(&[&probs, &total])?.kernels_prepared(),
        0
    );
    assert_eq!(probs.to_vec::<f32>()?, got.0);
    set_placement(&[])?;
    Ok(())
}
