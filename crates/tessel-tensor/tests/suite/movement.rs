//! Movement ops against reference index computations: every op alone, every dtype moved
//! bit for bit, chains of views checked element by element, joins and splits, and the
//! errors, which name the op and the shapes.

use crate::common;
use crate::common::nd::{Nd, py_slice};
use crate::common::{Domain, Rng, assert_err};
use tessel_tensor::{DType, Error, Result, Tensor};

/// A random f32 input and its values.
fn random(seed: u64, dims: &[usize]) -> (Tensor, Nd) {
    let r = Nd::random(
        &mut Rng::new(seed),
        DType::F32,
        dims,
        Domain::new((-4.0, 4.0), (0, 0)),
    );
    (r.tensor(DType::F32), r)
}

/// Asserts a view's dims and every element, exactly.
#[track_caller]
fn check(what: &str, got: &Tensor, want: &Nd) {
    let got = Nd::of(got);
    assert_eq!(got.dims, want.dims, "{what}: dims");
    for (i, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

fn norm(axis: i64, ndim: usize) -> usize {
    if axis < 0 {
        (axis + ndim as i64) as usize
    } else {
        axis as usize
    }
}

#[test]
fn reshape_view_flatten_squeeze_unsqueeze() -> Result<()> {
    let (t, r) = random(1, &[2, 3, 4]);
    check(
        "reshape [4, -1]",
        &t.reshape(&[4, -1])?,
        &r.reshape(&[4, 6]),
    );
    check("reshape [-1]", &t.reshape(&[-1])?, &r.reshape(&[24]));
    check(
        "view [2, 2, 6]",
        &t.view(&[2, 2, 6])?,
        &r.reshape(&[2, 2, 6]),
    );
    check("flatten(1, 2)", &t.flatten(1, 2)?, &r.reshape(&[2, 12]));
    check("flatten(0, -1)", &t.flatten(0, -1)?, &r.reshape(&[24]));
    check("flatten(-2, -2)", &t.flatten(-2, -2)?, &r);
    check("contiguous", &t.contiguous(), &r);
    let (u, ur) = random(2, &[1, 3, 1, 2]);
    check("squeeze(None)", &u.squeeze(None)?, &ur.reshape(&[3, 2]));
    check(
        "squeeze([0])",
        &u.squeeze(Some(&[0]))?,
        &ur.reshape(&[3, 1, 2]),
    );
    check(
        "squeeze([1, -2])",
        &u.squeeze(Some(&[1, -2]))?,
        &ur.reshape(&[1, 3, 2]),
    );
    check("unsqueeze(0)", &t.unsqueeze(0)?, &r.reshape(&[1, 2, 3, 4]));
    check(
        "unsqueeze(-1)",
        &t.unsqueeze(-1)?,
        &r.reshape(&[2, 3, 4, 1]),
    );
    check("unsqueeze(2)", &t.unsqueeze(2)?, &r.reshape(&[2, 3, 1, 4]));
    // 0-d tensors: flatten gives [1]; reshape to [] and back.
    let s = Tensor::from_vec(vec![7i32], Vec::<usize>::new())?;
    assert_eq!(s.flatten(0, -1)?.dims(), vec![1]);
    assert_eq!(s.reshape(&[1, 1])?.reshape(&[])?.item::<i32>()?, 7);
    assert_eq!(s.unsqueeze(0)?.dims(), vec![1]);
    // Reshapes of empty tensors only need matching element counts.
    let e = Tensor::from_vec(Vec::<f32>::new(), [0, 4])?;
    assert_eq!(e.reshape(&[2, 0, 2])?.dims(), vec![2, 0, 2]);
    Ok(())
}

#[test]
fn permute_transpose_t() -> Result<()> {
    let (t, r) = random(3, &[2, 3, 4]);
    for perm in [[0i64, 1, 2], [2, 0, 1], [1, 2, 0], [2, 1, 0], [-1, -3, -2]] {
        let p: Vec<usize> = perm.iter().map(|&a| norm(a, 3)).collect();
        check(
            &format!("permute {perm:?}"),
            &t.permute(&perm)?,
            &r.permute(&p),
        );
    }
    check(
        "transpose(0, 2)",
        &t.transpose(0, 2)?,
        &r.permute(&[2, 1, 0]),
    );
    check(
        "transpose(-1, 1)",
        &t.transpose(-1, 1)?,
        &r.permute(&[0, 2, 1]),
    );
    check("transpose(1, 1)", &t.transpose(1, 1)?, &r);
    let (m, mr) = random(4, &[45, 65]);
    check("t() of 2-d", &m.t()?, &mr.permute(&[1, 0]));
    check("t() of t()", &m.t()?.t()?, &mr);
    let (v, vr) = random(5, &[7]);
    check("t() of 1-d", &v.t()?, &vr);
    assert_err(
        "t() of 3-d",
        t.t(),
        |e| matches!(e, Error::Shape(_)),
        &["t: shape [2, 3, 4] has 3 dims", "transpose"],
    );
    Ok(())
}

#[test]
fn expand_broadcast_to_repeat() -> Result<()> {
    let (t, r) = random(6, &[3, 1]);
    check("expand [3, 4]", &t.expand(&[3, 4])?, &r.expand(&[3, 4]));
    check(
        "expand [2, -1, 5]",
        &t.expand(&[2, -1, 5])?,
        &r.reshape(&[1, 3, 1]).expand(&[2, 3, 5]),
    );
    check(
        "broadcast_to [2, 3, 2]",
        &t.broadcast_to([2, 3, 2])?,
        &r.reshape(&[1, 3, 1]).expand(&[2, 3, 2]),
    );
    check(
        "expand to 0",
        &t.expand(&[3, 0])?,
        &Nd::new(&[3, 0], vec![]),
    );
    let (u, ur) = random(7, &[2, 3]);
    // torch: x.repeat(2, 1, 3) on [2, 3] tiles to [2, 2, 9].
    let want = Nd::from_fn(&[2, 2, 9], |o| ur.at(&[o[1] % 2, o[2] % 3]));
    check("repeat [2, 1, 3]", &u.repeat(&[2, 1, 3])?, &want);
    check("repeat [1, 1]", &u.repeat(&[1, 1])?, &ur);
    assert_eq!(u.repeat(&[0, 2])?.dims(), vec![0, 6]);
    // torch: x.repeat_interleave(3, dim=1) and (2, dim=-2) on [2, 3].
    let want = Nd::from_fn(&[2, 9], |o| ur.at(&[o[0], o[1] / 3]));
    check(
        "repeat_interleave 3 dim 1",
        &u.repeat_interleave(3, 1)?,
        &want,
    );
    let want = Nd::from_fn(&[4, 3], |o| ur.at(&[o[0] / 2, o[1]]));
    check(
        "repeat_interleave 2 dim -2",
        &u.repeat_interleave(2, -2)?,
        &want,
    );
    assert_eq!(u.repeat_interleave(0, 0)?.dims(), vec![0, 3]);
    assert_err(
        "expand a non-1 dim",
        u.expand(&[4, 3]),
        |e| matches!(e, Error::Shape(_)),
        &["expand", "[2, 3]", "[4, 3]"],
    );
    assert_err(
        "repeat too few",
        u.repeat(&[2]),
        |e| matches!(e, Error::Shape(_)),
        &["repeat", "[2, 3]"],
    );
    Ok(())
}

#[test]
fn pad_and_crop() -> Result<()> {
    let (t, r) = random(8, &[4, 5, 6]);
    let cases: [&[(i64, i64)]; 8] = [
        &[(1, 2)],
        &[(0, 1), (0, 0)],
        &[(2, 0), (0, 0), (0, 0)],
        &[(1, 1), (2, 2)],
        &[(-1, 0)],
        &[(1, -2), (-1, 3)],
        &[(0, 0), (-2, -3), (1, 0)],
        &[(-4, 1), (0, 0), (0, 0)],
    ];
    for pads in cases {
        check(
            &format!("pad {pads:?}"),
            &t.pad(pads, -0.5)?,
            &r.pad(pads, -0.5),
        );
    }
    // torch: F.pad(x, (1, 2, 3, 4)) pads the last dim by (1, 2) and the one before by (3, 4).
    check(
        "F.pad order",
        &t.pad(&[(3, 4), (1, 2)], 0.0)?,
        &r.pad(&[(3, 4), (1, 2)], 0.0),
    );
    // The value converts to the dtype; the dtype never changes.
    let i = Tensor::from_vec(vec![1i8, 2], [2])?;
    assert_eq!(i.pad(&[(1, 1)], 7.9)?.to_vec::<i8>()?, vec![7, 1, 2, 7]);
    let b = Tensor::from_vec(vec![false], [1])?;
    assert_eq!(b.pad(&[(1, 0)], true)?.to_vec::<bool>()?, vec![true, false]);
    let errs = [
        (t.pad(&[(0, 0); 4], 0.0), "at least 4"),
        (t.pad(&[(-4, -3)], 0.0), "negative size"),
        (t.pad(&[(-7, 2)], 0.0), "crops 7 elements"),
    ];
    for (res, fragment) in errs {
        assert_err(
            "pad",
            res,
            |e| matches!(e, Error::Shape(_)),
            &["pad", "[4, 5, 6]", fragment],
        );
    }
    Ok(())
}

#[test]
fn narrow_slice_flip() -> Result<()> {
    let (t, r) = random(9, &[6, 10]);
    for (axis, start, len) in [(0, 0, 6), (0, 2, 3), (1, -4, 4), (-1, 9, 1), (1, 3, 0)] {
        let a = norm(axis, 2);
        let s = if start < 0 {
            (start + 10) as usize
        } else {
            start as usize
        };
        check(
            &format!("narrow({axis}, {start}, {len})"),
            &t.narrow(axis, start, len)?,
            &r.slice(a, s, 1, len as usize),
        );
    }
    let slices = [
        (None, None, 1),
        (Some(2), Some(7), 2),
        (Some(-7), None, 3),
        (None, Some(-1), 4),
        (Some(-100), Some(100), 3),
        (Some(8), Some(2), 1),
        (Some(9), None, 20),
        (Some(10), None, 1),
    ];
    for (start, stop, step) in slices {
        let (s, n) = py_slice(10, start, stop, step as usize);
        check(
            &format!("slice(1, {start:?}, {stop:?}, {step})"),
            &t.slice(1, start, stop, step)?,
            &r.slice(1, s, step as usize, n),
        );
        let (s, n) = py_slice(6, start, stop, step as usize);
        check(
            &format!("slice(0, {start:?}, {stop:?}, {step})"),
            &t.slice(-2, start, stop, step)?,
            &r.slice(0, s, step as usize, n),
        );
    }
    for axes in [&[0i64][..], &[1], &[-1, 0], &[]] {
        let a: Vec<usize> = axes.iter().map(|&x| norm(x, 2)).collect();
        check(&format!("flip {axes:?}"), &t.flip(axes)?, &r.flip(&a));
    }
    assert_err(
        "slice step 0",
        t.slice(0, None, None, 0),
        |e| matches!(e, Error::Shape(_)),
        &["slice", "[6, 10]", "step 0"],
    );
    assert_err(
        "narrow past the end",
        t.narrow(1, 8, 3),
        |e| matches!(e, Error::Shape(_)),
        &["narrow", "[6, 10]", "exceeds"],
    );
    assert_err(
        "flip twice",
        t.flip(&[0, -2]),
        |e| matches!(e, Error::Shape(_)),
        &["flip", "[6, 10]", "more than once"],
    );
    Ok(())
}

#[test]
fn cat_and_stack() -> Result<()> {
    let (a, ar) = random(10, &[2, 3, 4]);
    let (b, br) = random(11, &[2, 5, 4]);
    let (c, cr) = random(12, &[2, 1, 4]);
    check(
        "cat axis 1",
        &Tensor::cat(&[&a, &b, &c], 1)?,
        &Nd::cat(&[&ar, &br, &cr], 1),
    );
    check(
        "cat axis -2",
        &Tensor::cat(&[&c, &a], -2)?,
        &Nd::cat(&[&cr, &ar], 1),
    );
    let (d, dr) = random(13, &[3, 3, 4]);
    check(
        "cat axis 0",
        &Tensor::cat(&[&a, &d, &a], 0)?,
        &Nd::cat(&[&ar, &dr, &ar], 0),
    );
    let (e, er) = random(14, &[2, 3, 1]);
    check(
        "cat axis 2",
        &Tensor::cat(&[&a, &e], 2)?,
        &Nd::cat(&[&ar, &er], 2),
    );
    check("cat one", &Tensor::cat(&[&a], 1)?, &ar);
    // Views as parts.
    let pt = a.permute(&[1, 0, 2])?;
    let fs = d.flip(&[0])?.slice(1, None, None, 2)?;
    let want = Nd::cat(
        &[&ar.permute(&[1, 0, 2]), &dr.flip(&[0]).slice(1, 0, 2, 2)],
        0,
    );
    check("cat of views", &Tensor::cat(&[&pt, &fs], 0)?, &want);
    // Values are selected, not summed: -0.0 and NaN survive.
    let z = Tensor::from_vec(vec![-0.0f32, f32::NAN], [2])?;
    let got = Tensor::cat(&[&z, &z], 0)?.to_vec::<f32>()?;
    assert!(
        got[0].is_sign_negative() && got[0] == 0.0 && got[1].is_nan() && got[2].is_sign_negative()
    );
    // Dtypes promote like torch.cat.
    let i = Tensor::from_vec(vec![1i32, -2], [1, 2])?;
    let u = Tensor::from_vec(vec![200u8, 3], [1, 2])?;
    let h = Tensor::from_vec(vec![tessel_tensor::f16::from_f32(0.5); 2], [1, 2])?;
    let bo = Tensor::from_vec(vec![true, false], [1, 2])?;
    let iu = Tensor::cat(&[&i, &u], 0)?;
    assert_eq!(
        (iu.dtype(), iu.to_vec::<i32>()?),
        (DType::I32, vec![1, -2, 200, 3])
    );
    let ih = Tensor::cat(&[&i, &h, &bo], 0)?;
    assert_eq!(ih.dtype(), DType::F16);
    check(
        "cat promote",
        &ih,
        &Nd::new(&[3, 2], vec![1.0, -2.0, 0.5, 0.5, 1.0, 0.0]),
    );
    // Legacy [0] tensors are skipped; parts empty along the axis add nothing.
    let legacy = Tensor::from_vec(Vec::<f32>::new(), [0])?;
    check(
        "cat with [0]",
        &Tensor::cat(&[&legacy, &a, &legacy], 1)?,
        &ar,
    );
    let empty_part = Tensor::from_vec(Vec::<f32>::new(), [2, 0, 4])?;
    check(
        "cat with an empty part",
        &Tensor::cat(&[&a, &empty_part, &c], 1)?,
        &Nd::cat(&[&ar, &cr], 1),
    );
    // stack: a new axis anywhere.
    let (f, fr) = random(15, &[2, 3, 4]);
    for axis in [0i64, 1, 3, -1, -4] {
        let n = norm(axis, 4);
        let want = Nd::cat(
            &[
                &ar.reshape(&unsqueezed(&[2, 3, 4], n)),
                &fr.reshape(&unsqueezed(&[2, 3, 4], n)),
            ],
            n,
        );
        check(
            &format!("stack axis {axis}"),
            &Tensor::stack(&[&a, &f], axis)?,
            &want,
        );
    }
    // Errors name the op and the shapes.
    assert_err(
        "cat dims",
        Tensor::cat(&[&a, &d], 1),
        |e| matches!(e, Error::Shape(_)),
        &["cat", "[2, 3, 4]", "[3, 3, 4]", "dim 0"],
    );
    assert_err(
        "cat ranks",
        Tensor::cat(&[&a, &i], 0),
        |e| matches!(e, Error::Shape(_)),
        &["cat", "[1, 2]", "same number of dims"],
    );
    assert_err(
        "cat axis",
        Tensor::cat(&[&a, &a], 3),
        |e| matches!(e, Error::Shape(_)),
        &["cat", "axis 3", "[2, 3, 4]"],
    );
    assert_err(
        "cat none",
        Tensor::cat(&[], 0),
        |e| matches!(e, Error::Shape(_)),
        &["cat", "non-empty"],
    );
    let big = Tensor::from_vec(vec![1u64], [1])?;
    let neg = Tensor::from_vec(vec![-1i64], [1])?;
    assert_err(
        "cat u64 and i64",
        Tensor::cat(&[&big, &neg], 0),
        |e| matches!(e, Error::Promotion { .. }),
        &["cat", "u64", "i64"],
    );
    assert_err(
        "stack shapes",
        Tensor::stack(&[&a, &b], 0),
        |e| matches!(e, Error::Shape(_)),
        &["stack", "[2, 3, 4]", "[2, 5, 4]"],
    );
    Ok(())
}

fn unsqueezed(dims: &[usize], axis: usize) -> Vec<usize> {
    let mut d = dims.to_vec();
    d.insert(axis, 1);
    d
}

#[test]
fn split_split_sizes_chunk() -> Result<()> {
    let (t, r) = random(16, &[5, 7]);
    let parts = t.split(2, 1)?;
    assert_eq!(parts.len(), 4);
    for (k, p) in parts.iter().enumerate() {
        let len = if k == 3 { 1 } else { 2 };
        check(&format!("split piece {k}"), p, &r.slice(1, 2 * k, 1, len));
    }
    let parts = t.split_sizes(&[1, 0, 4], -2)?;
    let starts = [0, 1, 1];
    for (k, (p, len)) in parts.iter().zip([1, 0, 4]).enumerate() {
        check(
            &format!("split_sizes piece {k}"),
            p,
            &r.slice(0, starts[k], 1, len),
        );
    }
    let parts = t.chunk(3, 1)?;
    assert_eq!(
        parts.iter().map(Tensor::dims).collect::<Vec<_>>(),
        vec![vec![5, 3], vec![5, 3], vec![5, 1]]
    );
    check("chunk last", &parts[2], &r.slice(1, 6, 1, 1));
    assert_eq!(t.chunk(9, 0)?.len(), 5);
    // The pieces rebuild the tensor.
    let pieces = t.split(3, 0)?;
    let refs: Vec<&Tensor> = pieces.iter().collect();
    check("cat of split", &Tensor::cat(&refs, 0)?, &r);
    assert_err(
        "split_sizes sum",
        t.split_sizes(&[2, 2], 0).map(|mut v| v.remove(0)),
        |e| matches!(e, Error::Shape(_)),
        &["split", "[5, 7]", "add up to 4"],
    );
    assert_err(
        "chunk 0",
        t.chunk(0, 0).map(|mut v| v.remove(0)),
        |e| matches!(e, Error::Shape(_)),
        &["chunk", "positive"],
    );
    // Pieces past 2^20 are an error at once, not minutes of recording tensors (an empty
    // tensor with a dim of 6·10^18 split in pieces of 2^20 hung the fuzzer).
    let huge = Tensor::zeros([6_148_914_691_236_517_205usize, 0], DType::F32);
    for (what, res) in [
        ("split", huge.split(1 << 20, 0)),
        (
            "chunk",
            Tensor::zeros([0usize], DType::F32).chunk(1 << 40, 0),
        ),
    ] {
        assert_err(
            what,
            res.map(|mut v| v.remove(0)),
            |e| matches!(e, Error::Shape(_)),
            &[what, "1048576", "narrow"],
        );
    }
    assert_eq!(Tensor::zeros([0usize], DType::F32).chunk(3, 0)?.len(), 3);
    Ok(())
}

/// One movement step, applied to a tensor and to the reference.
#[derive(Clone, Debug)]
enum Step {
    Permute(Vec<i64>),
    Reshape(Vec<i64>),
    Pad(Vec<(i64, i64)>),
    Flip(Vec<i64>),
    Slice(i64, Option<i64>, Option<i64>, i64),
    Narrow(i64, i64, i64),
    Expand(Vec<i64>),
    Transpose(i64, i64),
}

impl Step {
    fn tensor(&self, t: &Tensor) -> Result<Tensor> {
        match self {
            Step::Permute(p) => t.permute(p),
            Step::Reshape(s) => t.reshape(s),
            Step::Pad(p) => t.pad(p, 9.5),
            Step::Flip(a) => t.flip(a),
            Step::Slice(a, s, e, k) => t.slice(*a, *s, *e, *k),
            Step::Narrow(a, s, n) => t.narrow(*a, *s, *n),
            Step::Expand(d) => t.expand(d),
            Step::Transpose(a, b) => t.transpose(*a, *b),
        }
    }

    fn reference(&self, r: &Nd) -> Nd {
        let nd = r.dims.len();
        match self {
            Step::Permute(p) => r.permute(&p.iter().map(|&a| norm(a, nd)).collect::<Vec<_>>()),
            Step::Reshape(s) => {
                let known: i64 = s.iter().filter(|&&d| d >= 0).product();
                let dims: Vec<usize> = s
                    .iter()
                    .map(|&d| {
                        if d < 0 {
                            r.numel() / known as usize
                        } else {
                            d as usize
                        }
                    })
                    .collect();
                r.reshape(&dims)
            }
            Step::Pad(p) => r.pad(p, 9.5),
            Step::Flip(a) => r.flip(&a.iter().map(|&x| norm(x, nd)).collect::<Vec<_>>()),
            Step::Slice(a, s, e, k) => {
                let a = norm(*a, nd);
                let (start, n) = py_slice(r.dims[a], *s, *e, *k as usize);
                r.slice(a, start, *k as usize, n)
            }
            Step::Narrow(a, s, n) => r.slice(norm(*a, nd), *s as usize, 1, *n as usize),
            Step::Expand(d) => {
                let lead = d.len() - nd;
                let dims: Vec<usize> = d
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| if x < 0 { r.dims[i - lead] } else { x as usize })
                    .collect();
                r.reshape(
                    &std::iter::repeat_n(1, lead)
                        .chain(r.dims.iter().copied())
                        .collect::<Vec<_>>(),
                )
                .expand(&dims)
            }
            Step::Transpose(a, b) => {
                let mut p: Vec<usize> = (0..nd).collect();
                p.swap(norm(*a, nd), norm(*b, nd));
                r.permute(&p)
            }
        }
    }
}

#[test]
fn chains_of_views() -> Result<()> {
    use Step::{Expand, Flip, Narrow, Pad, Permute, Reshape, Slice, Transpose};
    let chains: Vec<(Vec<usize>, Vec<Step>)> = vec![
        (
            vec![4, 6, 5],
            vec![
                Permute(vec![2, 0, 1]),
                Reshape(vec![5, 24]),
                Pad(vec![(1, 2), (3, -2)]),
                Flip(vec![0]),
                Slice(1, Some(1), None, 3),
            ],
        ),
        (
            vec![4, 6, 5],
            vec![
                Permute(vec![1, 2, 0]),
                Reshape(vec![-1, 4]),
                Pad(vec![(2, 0)]),
                Flip(vec![-1, 0]),
                Slice(0, None, Some(-3), 2),
            ],
        ),
        (
            vec![3, 7],
            vec![
                Transpose(0, 1),
                Pad(vec![(0, 0), (2, 2)]),
                Reshape(vec![7, 7, 1]),
                Flip(vec![1]),
                Slice(2, None, None, 1),
                Expand(vec![2, 7, 7, 3]),
            ],
        ),
        (
            vec![6, 10],
            vec![
                Slice(1, Some(1), None, 2),
                Flip(vec![0]),
                Pad(vec![(1, 1), (1, 1)]),
                Permute(vec![1, 0]),
                Narrow(0, 1, 5),
            ],
        ),
        (
            vec![2, 3, 4],
            vec![
                Flip(vec![1]),
                Permute(vec![2, 1, 0]),
                Pad(vec![(-1, 0), (0, 0), (1, 0)]),
                Reshape(vec![-1]),
                Slice(0, Some(-20), Some(-2), 3),
            ],
        ),
        (
            vec![5, 1, 3],
            vec![
                Expand(vec![5, 4, 3]),
                Permute(vec![1, 0, 2]),
                Reshape(vec![4, 15]),
                Flip(vec![1]),
                Pad(vec![(1, 0), (0, 1)]),
                Narrow(-1, 2, 10),
            ],
        ),
        (
            vec![8, 9],
            vec![
                Slice(0, Some(1), Some(7), 2),
                Slice(1, None, None, 4),
                Transpose(-1, -2),
                Pad(vec![(2, 2)]),
                Reshape(vec![3, 1, 7]),
            ],
        ),
        (
            vec![45, 65],
            vec![
                Permute(vec![1, 0]),
                Pad(vec![(1, 1), (0, 0)]),
                Flip(vec![1]),
                Slice(0, Some(3), Some(60), 5),
                Reshape(vec![-1, 5]),
            ],
        ),
        (vec![2, 3, 4], vec![Pad(vec![(1, 0)]), Flip(vec![0])]),
    ];
    for (k, (dims, steps)) in chains.iter().enumerate() {
        let (mut t, mut r) = random(100 + k as u64, dims);
        for step in steps {
            t = step.tensor(&t)?;
            r = step.reference(&r);
            assert_eq!(t.dims(), r.dims, "chain {k}: dims after {step:?}");
        }
        check(&format!("chain {k} {steps:?}"), &t, &r);
    }
    Ok(())
}

#[test]
fn every_dtype_moves_bits_exactly() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        let r = Nd::random(
            &mut Rng::new(200 + seed as u64),
            dtype,
            &[3, 4, 5],
            Domain::new((-1e6, 1e6), (-100, 100)),
        );
        let t = r.tensor(dtype);
        let what = format!("{dtype}");
        let v = t
            .permute(&[2, 0, 1])?
            .flip(&[1])?
            .slice(0, Some(1), None, 2)?
            .reshape(&[2, 12])?;
        let want = r
            .permute(&[2, 0, 1])
            .flip(&[1])
            .slice(0, 1, 2, 2)
            .reshape(&[2, 12]);
        check(&format!("view chain {what}"), &v, &want);
        let c = Tensor::cat(&[&v, &t.reshape(&[5, 12])?], 0)?;
        assert_eq!(c.dtype(), dtype);
        check(
            &format!("cat {what}"),
            &c,
            &Nd::cat(&[&want, &r.reshape(&[5, 12])], 0),
        );
        let padded = t.pad(&[(1, 0), (0, 2)], 1)?;
        check(
            &format!("pad {what}"),
            &padded,
            &r.pad(&[(1, 0), (0, 2)], 1.0),
        );
        let parts = t.split(2, 1)?;
        check(&format!("split {what}"), &parts[1], &r.slice(1, 2, 1, 2));
        check(
            &format!("repeat {what}"),
            &t.narrow(0, 0, 1)?.repeat(&[2, 1, 1])?,
            &Nd::cat(&[&r.slice(0, 0, 1, 1), &r.slice(0, 0, 1, 1)], 0),
        );
    }
    // Bit patterns survive: -0.0, NaN and infinities.
    let special = Tensor::from_vec(
        vec![-0.0f64, f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
        [2, 2],
    )?;
    let moved = special.t()?.flip(&[0])?.reshape(&[4])?.to_vec::<f64>()?;
    assert!(
        moved[0].is_nan()
            && moved[1] == f64::NEG_INFINITY
            && moved[2] == 0.0
            && moved[2].is_sign_negative()
            && moved[3] == f64::INFINITY
    );
    Ok(())
}

#[test]
fn errors_name_the_op_and_shapes() -> Result<()> {
    let t = Tensor::from_vec(vec![0.0f32; 24], [2, 3, 4])?;
    let is_shape = |e: &Error| matches!(e, Error::Shape(_));
    assert_err(
        "reshape count",
        t.reshape(&[5, 5]),
        is_shape,
        &["reshape", "[2, 3, 4]", "[5, 5]"],
    );
    assert_err(
        "reshape infer",
        t.reshape(&[5, -1]),
        is_shape,
        &["reshape", "[2, 3, 4]", "not divisible by 5"],
    );
    assert_err(
        "reshape two -1",
        t.reshape(&[-1, -1]),
        is_shape,
        &["reshape", "only one dim can be -1"],
    );
    assert_err(
        "permute length",
        t.permute(&[0, 1]),
        is_shape,
        &["permute", "[0, 1]", "[2, 3, 4]"],
    );
    assert_err(
        "permute repeat",
        t.permute(&[0, 1, 1]),
        is_shape,
        &["permute", "more than once"],
    );
    assert_err(
        "transpose axis",
        t.transpose(0, 3),
        is_shape,
        &["transpose", "axis 3", "[2, 3, 4]"],
    );
    assert_err(
        "unsqueeze axis",
        t.unsqueeze(5),
        is_shape,
        &["unsqueeze", "axis 5", "[2, 3, 4]"],
    );
    assert_err(
        "squeeze axis",
        t.squeeze(Some(&[3])),
        is_shape,
        &["squeeze", "axis 3"],
    );
    assert_err(
        "flatten order",
        t.flatten(2, 1),
        is_shape,
        &["flatten", "[2, 3, 4]", "comes after"],
    );
    assert_err(
        "narrow axis",
        t.narrow(-4, 0, 1),
        is_shape,
        &["narrow", "axis -4", "[2, 3, 4]"],
    );
    assert_err(
        "slice axis",
        t.slice(3, None, None, 1),
        is_shape,
        &["slice", "axis 3"],
    );
    assert_err(
        "broadcast_to",
        t.broadcast_to([3, 3, 4]),
        is_shape,
        &["expand", "[2, 3, 4]", "[3, 3, 4]"],
    );
    assert_err(
        "expand overflow",
        t.expand(&[i64::MAX, 2, 3, 4]),
        is_shape,
        &["expand", "[2, 3, 4]", "more than i64::MAX elements"],
    );
    assert_err(
        "repeat overflow",
        t.repeat(&[usize::MAX >> 2, 1, 1]),
        is_shape,
        &["repeat", "more than i64::MAX elements"],
    );
    Ok(())
}

/// Sizes past `i64::MAX` elements are errors naming the op, never wrapped shapes (a
/// negative size came back from `repeat` with a 0 elsewhere) or host allocations that
/// abort the process.
#[test]
fn impossible_sizes_are_errors() -> Result<()> {
    let x = Tensor::zeros([2, 3], DType::F32);
    let shape_error = |e: &Error| matches!(e, Error::Shape(_) | Error::InvalidArgument { .. });
    assert_err(
        "repeat past i64::MAX with a zero",
        x.repeat(&[i64::MAX as usize, 0]),
        shape_error,
        &["repeat", "exceeds i64::MAX"],
    );
    assert_err(
        "repeat_interleave past i64::MAX",
        x.repeat_interleave(usize::MAX / 2, 0),
        shape_error,
        &["repeat_interleave", "exceeds i64::MAX"],
    );
    let ids = Tensor::from_vec(vec![1i64, 2], [2])?;
    assert_err(
        "one_hot past i64::MAX",
        ids.one_hot(usize::MAX / 2),
        shape_error,
        &["one_hot", "i64::MAX"],
    );
    let image = Tensor::zeros([1, 4, 4], DType::F32);
    assert_err(
        "interpolate_nearest past i64::MAX",
        image.interpolate_nearest(&[1 << 62]),
        shape_error,
        &["interpolate_nearest", "i64::MAX"],
    );
    Ok(())
}
