//! `set_float32_matmul_precision`: PyTorch's names, TF32-permitted products still within
//! TF32's tolerance of an f64 reference on every backend, and one plan per setting.
//!
//! In its own binary: the setting is process-wide, and other tests' `f32` products must not
//! run in TF32 while this one has it on.

use tessel_tensor::{
    DType, Device, Error, Float32MatmulPrecision, Result, Tensor, float32_matmul_precision,
    set_float32_matmul_precision, stats,
};

/// `a · b` in f64, row-major `m × k` times `k × n`.
fn reference(a: &[f32], b: &[f32], [m, k, n]: [usize; 3]) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
        }
    }
    out
}

#[test]
fn tf32_is_a_permission_with_its_own_plans() -> Result<()> {
    assert_eq!(float32_matmul_precision(), Float32MatmulPrecision::Highest);
    for (name, p) in [
        ("highest", Float32MatmulPrecision::Highest),
        ("high", Float32MatmulPrecision::High),
        ("medium", Float32MatmulPrecision::Medium),
    ] {
        assert_eq!(name.parse::<Float32MatmulPrecision>()?, p);
        assert_eq!(p.to_string(), name);
    }
    let err = "fast".parse::<Float32MatmulPrecision>().unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { op, .. } if *op == "set_float32_matmul_precision")
            && err
                .to_string()
                .contains("\"highest\", \"high\" or \"medium\""),
        "{err}"
    );

    let device = Device::default();
    let [m, k, n] = [96, 300, 80];
    Tensor::manual_seed(21);
    let a = Tensor::rand([m, k], DType::F32)?.to(&device)?;
    let b = (Tensor::rand([k, n], DType::F32)? - 0.5)?.to(&device)?;
    let want = reference(&a.to_vec::<f32>()?, &b.to_vec::<f32>()?, [m, k, n]);
    let scale = want.iter().fold(0.0f64, |s, v| s.max(v.abs()));
    let product = |precision| -> Result<Vec<f32>> {
        set_float32_matmul_precision(precision);
        a.matmul(&b)?.to_vec::<f32>()
    };
    // Full f32 within f32's reduction tolerance; TF32 (11-bit significands) within 1e-2.
    for (precision, tolerance) in [
        (Float32MatmulPrecision::Highest, 1e-4),
        (Float32MatmulPrecision::High, 1e-2),
        (Float32MatmulPrecision::Medium, 1e-2),
    ] {
        let got = product(precision)?;
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= tolerance * scale,
                "{device} {precision}: element {i} is {g}, want {w}"
            );
        }
    }
    // Each setting keeps its plan: switching back plans nothing new.
    let plans = stats().plans;
    product(Float32MatmulPrecision::Highest)?;
    product(Float32MatmulPrecision::High)?;
    assert_eq!(stats().plans, plans, "switching precision replanned");
    set_float32_matmul_precision(Float32MatmulPrecision::Highest);
    Ok(())
}
