//! Checked indexing reports the user's bad indices only: ignored targets of a loss and the
//! indices that ops compute internally (a radix selection's bins) are never reported.
//!
//! In its own binary: the switch is process-wide.

use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel_tensor::{Result, Tensor};

#[test]
fn ignored_targets_and_internal_gathers_pass_checked_indexing() -> Result<()> {
    Tensor::set_checked_indexing(true);
    let logits = Tensor::from_vec((0..12).map(|v| v as f32 * 0.25).collect::<Vec<_>>(), [4, 3])?;
    let weight = Tensor::from_vec(vec![1.0f32, 2.0, 0.5], [3])?;
    let opts = CrossEntropyOptions {
        weight: Some(weight),
        ..CrossEntropyOptions::default()
    };
    // PyTorch's default ignore_index, -100, is not a class: no error, and it is dropped.
    let target = Tensor::from_vec(vec![2i64, -100, 0, 1], [4])?;
    let loss = cross_entropy(&logits, &target, &opts)?.item::<f32>()?;
    let lse = |r: usize| {
        (0..3)
            .map(|c| f64::from(r as u8 * 3 + c) * 0.25)
            .map(f64::exp)
            .sum::<f64>()
            .ln()
    };
    let term = |r: usize, c: u8, w: f64| w * (lse(r) - f64::from(r as u8 * 3 + c) * 0.25);
    let want = (term(0, 2, 0.5) + term(2, 0, 1.0) + term(3, 1, 2.0)) / 3.5;
    assert!(
        (f64::from(loss) - want).abs() < 1e-5,
        "{loss} against {want}"
    );
    // A topk of a long row gathers past its histogram's last bin internally.
    let row = Tensor::from_vec(
        (0..3000)
            .map(|v| ((v * 37) % 3000) as f32)
            .collect::<Vec<_>>(),
        [3000],
    )?;
    let (values, _) = row.topk(3, 0, true, true)?;
    assert_eq!(values.to_vec::<f32>()?, vec![2999.0, 2998.0, 2997.0]);
    // A real target out of range is still reported, naming the op.
    let bad = Tensor::from_vec(vec![2i64, 3, 0, 1], [4])?;
    let err = cross_entropy(&logits, &bad, &CrossEntropyOptions::default())?
        .item::<f32>()
        .unwrap_err()
        .to_string();
    assert!(err.contains("index 3") && err.contains("0..3"), "{err}");
    Tensor::set_checked_indexing(false);
    Ok(())
}
