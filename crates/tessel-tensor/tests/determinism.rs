//! `use_deterministic_algorithms`: float scatter-adds (and so the gradients of gathers)
//! sum in a fixed order, bit-identical run to run, and still match an f64 reference.
//!
//! In its own binary: the setting is process-wide.

use tessel_tensor::{
    DType, Result, Tensor, are_deterministic_algorithms_enabled, grad, use_deterministic_algorithms,
};

/// Values of both signs over six orders of magnitude, so that the order of a float sum
/// shows in its last bits.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
            let scale = 10f32.powi((state >> 20 & 7) as i32 - 3);
            (unit - 0.5) * scale
        })
        .collect()
}

#[test]
fn deterministic_scatter_adds_repeat_bit_for_bit() -> Result<()> {
    assert!(!are_deterministic_algorithms_enabled());
    use_deterministic_algorithms(true);
    assert!(are_deterministic_algorithms_enabled());
    // 1000 rows of 300 into 7, with some out of range (dropped). Rows this wide make a GPU
    // plan try row kernels, which must leave the sort's scatters kernels of their own.
    let (m, n, cols) = (1000usize, 7usize, 300usize);
    let rows: Vec<i64> = (0..m as i64).map(|i| (i * 37 + i / 11) % 9 - 1).collect();
    let src = values(m * cols, 3);
    let mut want = vec![0f64; n * cols];
    for (i, &r) in rows.iter().enumerate() {
        if (0..n as i64).contains(&r) {
            for c in 0..cols {
                want[r as usize * cols + c] += f64::from(src[i * cols + c]);
            }
        }
    }
    let scale: f64 = src.iter().map(|v| f64::from(v.abs())).sum();
    let index = Tensor::from_vec(rows.clone(), [m])?;
    let source = Tensor::from_vec(src.clone(), [m, cols])?;
    let run = || -> Result<Vec<u32>> {
        let sums = Tensor::zeros([n, cols], DType::F32).index_add(0, &index, &source)?;
        Ok(sums.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect())
    };
    let first = run()?;
    for (got, want) in first.iter().zip(&want) {
        let got = f64::from(f32::from_bits(*got));
        assert!((got - want).abs() <= 1e-6 * scale, "{got} against {want}");
    }
    for _ in 0..3 {
        assert_eq!(
            run()?,
            first,
            "a deterministic index_add changed between runs"
        );
    }
    // An embedding's gradient is a scatter-add of the output's gradient into the table.
    let table = Tensor::from_vec(values(n * cols, 5), [n, cols])?;
    let inside: Vec<i64> = rows.iter().map(|r| r.rem_euclid(n as i64)).collect();
    let tokens = Tensor::from_vec(inside.clone(), [m])?;
    let weights = Tensor::from_vec(src.clone(), [m, cols])?;
    let gradient = || -> Result<Vec<u32>> {
        let loss = Tensor::embedding(&table, &tokens)?
            .mul(&weights)?
            .sum_all()?;
        let g = grad(&loss, &[&table])?;
        Ok(g[0].to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect())
    };
    let first = gradient()?;
    let mut want = vec![0f64; n * cols];
    for (i, &r) in inside.iter().enumerate() {
        for c in 0..cols {
            want[r as usize * cols + c] += f64::from(src[i * cols + c]);
        }
    }
    for (got, want) in first.iter().zip(&want) {
        let got = f64::from(f32::from_bits(*got));
        assert!((got - want).abs() <= 1e-6 * scale, "{got} against {want}");
    }
    assert_eq!(
        gradient()?,
        first,
        "a deterministic gradient changed between runs"
    );
    use_deterministic_algorithms(false);
    assert!(!are_deterministic_algorithms_enabled());
    Ok(())
}
