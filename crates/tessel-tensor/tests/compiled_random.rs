//! Random numbers drawn inside a `Compiled` function are drawn anew by every call, as the
//! same code recorded each time draws them.
//!
//! In its own binary: it sets the process's seed, which tests drawing on other threads
//! would move.

use tessel_tensor::{Compiled, DType, Device, Result, Tensor};

/// After the same `manual_seed`, a call gives exactly what the recorded ops give (dropout
/// and a normal draw, in that order); two calls differ; dropped elements are zeros and
/// kept ones are scaled by 2.
#[test]
fn compiled_functions_draw_new_random_numbers_every_call() -> Result<()> {
    let device = Device::default();
    let values: Vec<f32> = (0..128).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
    let x = Tensor::from_vec(values.clone(), [16, 8])?.to(&device)?;
    let ops = |x: &Tensor| -> Result<Tensor> {
        let noise = Tensor::randn([16, 8], DType::F32)?.to(&x.device())?;
        &x.dropout(0.5)? + &(&noise * 0.001)?
    };
    let f = Compiled::new(&[&x], |a| Ok(vec![ops(&a[0])?]))?;
    Tensor::manual_seed(31);
    let first = f.call(&[&x])?[0].to_vec::<f32>()?;
    let second = f.call(&[&x])?[0].to_vec::<f32>()?;
    Tensor::manual_seed(31);
    let recorded = ops(&x)?.to_vec::<f32>()?;
    for (i, (a, b)) in first.iter().zip(&recorded).enumerate() {
        assert!((a - b).abs() <= 1e-6, "[{i}]: compiled {a}, recorded {b}");
    }
    assert_ne!(first, second, "two calls drew the same numbers");
    let mut dropped = 0;
    for (got, x) in first.iter().zip(&values) {
        if got.abs() < 0.01 {
            dropped += 1;
        } else {
            assert!((got - 2.0 * x).abs() < 0.01, "kept {x} became {got}");
        }
    }
    assert!(
        (32..=96).contains(&dropped),
        "{dropped} of 128 dropped at p = 0.5"
    );
    Ok(())
}
