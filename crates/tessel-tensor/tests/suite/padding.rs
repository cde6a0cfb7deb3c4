//! Reflect, replicate and circular padding against a reference that maps every output
//! coordinate back to its source element: every dtype moved bit for bit, negative pads
//! (cropping), size-0 and size-1 dims, non-contiguous inputs, and `PyTorch`'s limits as
//! errors naming the op and the shape.

use crate::common::nd::Nd;
use crate::common::{DEFAULT, Rng, assert_err, on_device, shape_error};
use tessel_tensor::{DType, Result, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Reflect,
    Replicate,
    Circular,
}

const MODES: [Mode; 3] = [Mode::Reflect, Mode::Replicate, Mode::Circular];

fn run(t: &Tensor, pads: &[(i64, i64)], mode: Mode) -> Result<Tensor> {
    match mode {
        Mode::Reflect => t.pad_reflect(pads),
        Mode::Replicate => t.pad_replicate(pads),
        Mode::Circular => t.pad_circular(pads),
    }
}

/// The reference: crop the negative pads, then map each output coordinate of a padded
/// dim to its source by the mode's rule.
fn reference(x: &Nd, pads: &[(i64, i64)], mode: Mode) -> Nd {
    let first = x.dims.len() - pads.len();
    let crop: Vec<(i64, i64)> = pads.iter().map(|&(b, a)| (b.min(0), a.min(0))).collect();
    let x = x.pad(&crop, 0.0);
    let mut dims = x.dims.clone();
    for (k, &(b, a)) in pads.iter().enumerate() {
        dims[first + k] += (b.max(0) + a.max(0)) as usize;
    }
    Nd::from_fn(&dims, |o| {
        let mut idx = o.to_vec();
        for (k, &(b, _)) in pads.iter().enumerate() {
            let n = x.dims[first + k] as i64;
            let p = o[first + k] as i64 - b.max(0);
            let src = match mode {
                Mode::Reflect if p < 0 => -p,
                Mode::Reflect if p >= n => 2 * (n - 1) - p,
                Mode::Replicate => p.clamp(0, n - 1),
                Mode::Circular => p.rem_euclid(n),
                Mode::Reflect => p,
            };
            idx[first + k] = src as usize;
        }
        x.at(&idx)
    })
}

#[track_caller]
fn exact(what: &str, got: &Tensor, want: &Nd) {
    let got = Nd::of(got);
    assert_eq!(got.dims, want.dims, "{what}: dims");
    for (i, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

fn random(seed: u64, dtype: DType, dims: &[usize]) -> Nd {
    Nd::random(&mut Rng::new(seed), dtype, dims, DEFAULT)
}

/// Input dims and pads.
type Case<'a> = (&'a [usize], &'a [(i64, i64)]);

#[test]
fn pad_modes_match_reference_f32() -> Result<()> {
    let cases: &[Case] = &[
        (&[7], &[(3, 2)]),
        (&[2, 3, 5], &[(2, 1), (0, 4)]),
        (&[2, 3, 5], &[(1, 1), (2, 2), (3, 1)]),
        (&[4, 6], &[(0, 0), (5, 0)]),
        (&[3, 6], &[(-1, 1), (2, -2)]),
        (&[1, 5], &[(0, 0), (-4, 0)]),
    ];
    for (seed, &(dims, pads)) in cases.iter().enumerate() {
        let x = random(seed as u64, DType::F32, dims);
        let t = x.tensor(DType::F32);
        for mode in MODES {
            let what = format!("{mode:?} {dims:?} by {pads:?}");
            exact(&what, &run(&t, pads, mode)?, &reference(&x, pads, mode));
        }
    }
    Ok(())
}

#[test]
fn pad_modes_every_dtype_bit_exact() -> Result<()> {
    for dtype in on_device(DType::ALL) {
        let mut x = random(11, dtype, &[2, 3, 4]);
        if dtype.is_float() {
            // Edge values travel unchanged.
            x.data[0] = f64::NAN;
            x.data[4] = f64::INFINITY;
            x.data[5] = f64::NEG_INFINITY;
            x.data[8] = -0.0;
        }
        let t = x.tensor(dtype);
        for mode in MODES {
            let pads = [(1, 2), (2, 3)];
            let got = run(&t, &pads, mode)?;
            assert_eq!(got.dtype(), dtype);
            exact(
                &format!("{mode:?} {dtype}"),
                &got,
                &reference(&x, &pads, mode),
            );
        }
    }
    Ok(())
}

#[test]
fn pad_modes_non_contiguous_inputs() -> Result<()> {
    let x = random(21, DType::F32, &[4, 3, 5]);
    let t = x.tensor(DType::F32);
    // A permuted view and a strided slice of it.
    let p = t.permute(&[2, 0, 1])?;
    let xp = x.permute(&[2, 0, 1]);
    let s = t.slice(2, Some(1), None, 2)?;
    let xs = x.slice(2, 1, 2, 2);
    for mode in MODES {
        exact(
            &format!("{mode:?} permuted"),
            &run(&p, &[(2, 1), (1, 2)], mode)?,
            &reference(&xp, &[(2, 1), (1, 2)], mode),
        );
        exact(
            &format!("{mode:?} sliced"),
            &run(&s, &[(1, 1), (0, 1)], mode)?,
            &reference(&xs, &[(1, 1), (0, 1)], mode),
        );
    }
    Ok(())
}

#[test]
fn pad_modes_size_one_and_empty_dims() -> Result<()> {
    let x = random(31, DType::I32, &[1, 4]);
    let t = x.tensor(DType::I32);
    for mode in [Mode::Replicate, Mode::Circular] {
        let pads = [(1, 1), (1, 0)];
        exact(
            &format!("{mode:?} size-1"),
            &run(&t, &pads, mode)?,
            &reference(&x, &pads, mode),
        );
    }
    // Reflect of a size-1 dim by 0 is the identity there.
    exact(
        "reflect size-1 by 0",
        &t.pad_reflect(&[(0, 0), (2, 1)])?,
        &reference(&x, &[(0, 0), (2, 1)], Mode::Reflect),
    );
    // An empty dim that is not padded stays empty; padding the others works.
    let e = Tensor::zeros([0, 3], DType::F32);
    for mode in MODES {
        assert_eq!(run(&e, &[(0, 0), (1, 1)], mode)?.dims(), vec![0, 5]);
    }
    // Zero pads everywhere return the input.
    exact("no pads", &t.pad_circular(&[(0, 0)])?, &x);
    Ok(())
}

#[test]
fn pad_modes_errors_name_the_op_and_shape() {
    let t = Tensor::zeros([2, 3], DType::F32);
    assert_err(
        "reflect by the dim size",
        t.pad_reflect(&[(3, 0)]),
        shape_error,
        &["pad_reflect", "[2, 3]", "smaller"],
    );
    assert_err(
        "reflect after cropping",
        t.pad_reflect(&[(-2, 1)]),
        shape_error,
        &["pad_reflect", "after cropping"],
    );
    assert_err(
        "circular wraps twice",
        t.pad_circular(&[(0, 4)]),
        shape_error,
        &["pad_circular", "exceed"],
    );
    assert_err(
        "replicate an empty dim",
        Tensor::zeros([2, 0], DType::F32).pad_replicate(&[(1, 0)]),
        shape_error,
        &["pad_replicate", "non-empty"],
    );
    assert_err(
        "too many pairs",
        t.pad_reflect(&[(0, 0), (0, 0), (1, 1)]),
        shape_error,
        &["pad_reflect", "3 (before, after) pairs"],
    );
    assert_err(
        "crop too much",
        t.pad_replicate(&[(-2, -2)]),
        shape_error,
        &["pad"],
    );
}
