//! `matmul` and `dot` against a plain-loop f64 reference: every `torch.matmul` rank case,
//! batch broadcasting, odd and degenerate sizes, every dtype (and the error for `bool`),
//! non-contiguous operands, and the shape errors.

use crate::common;
use crate::common::nd::{Nd, assert_nd, reduce_tol};
use crate::common::{Domain, Rng, assert_err};
use tessel_tensor::{DType, Error, Result, Tensor};

/// Floats in `[-1, 1)` and integers in `[-2, 2]` (so products summed over `k <= 31` stay
/// exact even in `i8`), exact in `dtype`.
fn operand(seed: u64, dtype: DType, dims: &[usize]) -> (Tensor, Nd) {
    let r = Nd::random(
        &mut Rng::new(seed),
        dtype,
        dims,
        Domain::new((-1.0, 1.0), (-2, 2)),
    );
    (r.tensor(dtype), r)
}

/// `a · b` for random operands of `dtype`, checked against the reference.
#[track_caller]
fn check(seed: u64, dtype: DType, a: &[usize], b: &[usize]) -> Result<()> {
    let (x, xr) = operand(seed, dtype, a);
    let (y, yr) = operand(seed + 1, dtype, b);
    let got = x.matmul(&y)?;
    assert_eq!(got.dtype(), dtype, "{a:?} · {b:?}");
    let k = a[a.len() - 1];
    assert_nd(
        &format!("{dtype} {a:?} · {b:?}"),
        &Nd::of(&got),
        &xr.matmul(&yr),
        reduce_tol(dtype, k),
    );
    Ok(())
}

#[test]
fn every_rank_case_of_torch_matmul() -> Result<()> {
    let cases: [(&[usize], &[usize], &[usize]); 14] = [
        (&[7], &[7], &[]),
        (&[1], &[1], &[]),
        (&[5], &[5, 3], &[3]),
        (&[5, 3], &[3], &[5]),
        (&[4, 5], &[5, 6], &[4, 6]),
        (&[1, 1], &[1, 1], &[1, 1]),
        (&[45, 65], &[65, 7], &[45, 7]),
        (&[3], &[2, 3, 4], &[2, 4]),
        (&[2, 4, 3], &[3], &[2, 4]),
        (&[2, 4, 3], &[3, 5], &[2, 4, 5]),
        (&[4, 3], &[2, 3, 5], &[2, 4, 5]),
        (&[5, 1, 2, 3], &[4, 3, 6], &[5, 4, 2, 6]),
        (&[1, 3, 1, 2], &[2, 1, 2, 2], &[2, 3, 1, 2]),
        (&[2, 1, 3, 7, 13], &[4, 1, 13, 3], &[2, 4, 3, 7, 3]),
    ];
    for (i, (a, b, out)) in cases.into_iter().enumerate() {
        let (x, _) = operand(0, DType::F32, a);
        let (y, _) = operand(1, DType::F32, b);
        assert_eq!(x.matmul(&y)?.dims(), out.to_vec(), "{a:?} · {b:?}");
        check(10 * i as u64, DType::F32, a, b)?;
    }
    Ok(())
}

#[test]
fn mlp_sized_f32() -> Result<()> {
    check(7, DType::F32, &[64, 128], &[128, 10])
}

#[test]
fn every_dtype() -> Result<()> {
    for (seed, &dtype) in common::on_device(DType::ALL).iter().enumerate() {
        if dtype == DType::Bool {
            let b = Tensor::from_vec(vec![true; 4], [2, 2])?;
            assert_err(
                "bool matmul",
                b.matmul(&b),
                |e| matches!(e, Error::UnsupportedDType { .. }),
                &["matmul", "bool", ".cast(DType::F32)"],
            );
            continue;
        }
        check(100 + seed as u64, dtype, &[2, 9, 11], &[11, 5])?;
        check(200 + seed as u64, dtype, &[11], &[11])?;
    }
    // Mixed dtypes promote: i32 · f32 is f32, u8 · i8 is i16, f16 · bf16 is f32.
    for (a, b, want) in [
        (DType::I32, DType::F32, DType::F32),
        (DType::U8, DType::I8, DType::I16),
        (DType::F16, DType::BF16, DType::F32),
    ] {
        let (x, xr) = operand(1, a, &[3, 4]);
        let (y, yr) = operand(2, b, &[4, 2]);
        let got = x.matmul(&y)?;
        assert_eq!(got.dtype(), want, "{a} · {b}");
        assert_nd(
            &format!("{a} · {b}"),
            &Nd::of(&got),
            &xr.matmul(&yr),
            reduce_tol(want, 4),
        );
    }
    Ok(())
}

#[test]
fn non_contiguous_operands() -> Result<()> {
    let (a, ar) = operand(30, DType::F32, &[6, 9]);
    let (b, br) = operand(31, DType::F32, &[9, 7]);
    let k = 9;
    let tol = reduce_tol(DType::F32, k);
    // Transposed, flipped, sliced and padded views on either side.
    let (at, atr) = (a.t()?, ar.permute(&[1, 0]));
    let (bt, btr) = (b.t()?, br.permute(&[1, 0]));
    assert_nd(
        "aᵀᵀ · b",
        &Nd::of(&at.t()?.matmul(&b)?),
        &ar.matmul(&br),
        tol,
    );
    assert_nd(
        "a · (bᵀ)ᵀ",
        &Nd::of(&a.matmul(&bt.t()?)?),
        &ar.matmul(&br),
        tol,
    );
    assert_nd("bᵀ · aᵀ", &Nd::of(&bt.matmul(&at)?), &btr.matmul(&atr), tol);
    let fa = a.flip(&[0, 1])?;
    assert_nd(
        "flip(a) · b",
        &Nd::of(&fa.matmul(&b)?),
        &ar.flip(&[0, 1]).matmul(&br),
        tol,
    );
    let sb = b.slice(1, Some(1), None, 2)?;
    assert_nd(
        "a · b[:, 1::2]",
        &Nd::of(&a.matmul(&sb)?),
        &ar.matmul(&br.slice(1, 1, 2, 3)),
        tol,
    );
    let pa = a.pad(&[(0, 2)], 0.5)?;
    let pb = b.pad(&[(1, 1), (0, 0)], -1.0)?;
    assert_nd(
        "pad(a) · pad(b)",
        &Nd::of(&pa.matmul(&pb)?),
        &ar.pad(&[(0, 2)], 0.5)
            .matmul(&br.pad(&[(1, 1), (0, 0)], -1.0)),
        reduce_tol(DType::F32, 11),
    );
    // A broadcast (expanded) batch and a permuted 3-d operand.
    let (c, cr) = operand(32, DType::F32, &[1, 9, 4]);
    let ce = c.expand(&[3, 9, 4])?;
    let (d, dr) = operand(33, DType::F32, &[9, 3, 6]);
    let dp = d.permute(&[1, 2, 0])?;
    assert_nd(
        "expand · permute",
        &Nd::of(&dp.matmul(&ce)?),
        &dr.permute(&[1, 2, 0]).matmul(&cr.expand(&[3, 9, 4])),
        tol,
    );
    Ok(())
}

#[test]
fn degenerate_sizes() -> Result<()> {
    // k = 0: every output is 0, as in torch.
    let a = Tensor::from_vec(Vec::<f32>::new(), [3, 0])?;
    let b = Tensor::from_vec(Vec::<f32>::new(), [0, 2])?;
    assert_eq!(a.matmul(&b)?.to_vec::<f32>()?, vec![0.0; 6]);
    let v = Tensor::from_vec(Vec::<i64>::new(), [0])?;
    assert_eq!(v.matmul(&v)?.item::<i64>()?, 0);
    // m = 0 or a 0-size batch: empty results of the right shape.
    let e = Tensor::from_vec(Vec::<f32>::new(), [0, 4])?;
    let (w, _) = operand(40, DType::F32, &[4, 3]);
    let em = e.matmul(&w)?;
    assert_eq!((em.dims(), em.to_vec::<f32>()?), (vec![0, 3], vec![]));
    let eb = Tensor::from_vec(Vec::<f32>::new(), [0, 2, 4])?;
    let ebm = eb.matmul(&w)?;
    assert_eq!((ebm.dims(), ebm.to_vec::<f32>()?), (vec![0, 2, 3], vec![]));
    Ok(())
}

#[test]
fn dot_products() -> Result<()> {
    let dtypes = common::on_device([DType::F32, DType::F64, DType::I32, DType::BF16]);
    for (seed, &dtype) in dtypes.iter().enumerate() {
        let (x, xr) = operand(50 + seed as u64, dtype, &[31]);
        let (y, yr) = operand(60 + seed as u64, dtype, &[31]);
        let got = x.dot(&y)?;
        assert_eq!(got.dims(), Vec::<usize>::new());
        assert_nd(
            &format!("dot {dtype}"),
            &Nd::of(&got),
            &xr.matmul(&yr),
            reduce_tol(dtype, 31),
        );
    }
    let (m, _) = operand(70, DType::F32, &[3, 3]);
    let (v, _) = operand(71, DType::F32, &[3]);
    let (w, _) = operand(72, DType::F32, &[4]);
    assert_err(
        "dot of a matrix",
        m.dot(&v),
        |e| matches!(e, Error::Shape(_)),
        &["dot", "[3, 3]", "use matmul"],
    );
    assert_err(
        "dot lengths",
        v.dot(&w),
        |e| matches!(e, Error::Shape(_)),
        &["dot", "[3]", "[4]"],
    );
    Ok(())
}

#[test]
fn shape_errors_name_op_and_shapes() -> Result<()> {
    let (a, _) = operand(80, DType::F32, &[2, 3]);
    let (b, _) = operand(81, DType::F32, &[4, 5]);
    let (c, _) = operand(82, DType::F32, &[2, 3, 4]);
    let (d, _) = operand(83, DType::F32, &[3, 4, 5]);
    let s = Tensor::from_vec(vec![1.0f32], Vec::<usize>::new())?;
    let is_shape = |e: &Error| matches!(e, Error::Shape(_));
    assert_err(
        "inner mismatch",
        a.matmul(&b),
        is_shape,
        &[
            "matmul",
            "[2, 3]",
            "[4, 5]",
            "(3) must equal the rhs's contraction dim (4)",
        ],
    );
    assert_err(
        "vector mismatch",
        a.matmul(&Tensor::from_vec(vec![1.0f32; 2], [2])?),
        is_shape,
        &["matmul", "[2, 3]", "[2]"],
    );
    assert_err(
        "batch mismatch",
        c.matmul(&d),
        is_shape,
        &["matmul", "[2, 3, 4]", "[3, 4, 5]"],
    );
    assert_err(
        "0-d",
        s.matmul(&a),
        is_shape,
        &["matmul", "0 dims", "use mul"],
    );
    let big = Tensor::from_vec(vec![1u64; 4], [2, 2])?;
    let neg = Tensor::from_vec(vec![-1i64; 4], [2, 2])?;
    assert_err(
        "promotion",
        big.matmul(&neg),
        |e| matches!(e, Error::Promotion { .. }),
        &["matmul", "u64", "i64"],
    );
    Ok(())
}

/// `autocast(bf16)`: a product of `f32` operands runs in `bf16` (the operands rounded to
/// `bf16`, sums in `f32`, the result rounded), `softmax` of it in `f32`; the gradients of
/// the `f32` operands are `f32`, computed by `bf16` products, against the same computation
/// in `f64` on the rounded operands. Outside the scope, and after it, products are `f32` again; `f32` is not a
/// mixed-precision dtype.
#[test]
fn autocast_runs_products_in_half_precision() -> Result<()> {
    if common::on_device([DType::BF16]).is_empty() {
        return Ok(());
    }
    let (x, xr) = operand(90, DType::F32, &[6, 40]);
    let (w, wr) = operand(91, DType::F32, &[40, 5]);
    let bf = |n: &Nd| {
        Nd::new(
            &n.dims,
            n.data
                .iter()
                .map(|&v| common::round_to(DType::BF16, v))
                .collect(),
        )
    };
    let (xb, wb) = (bf(&xr), bf(&wr));
    let (y, p, grads) = tessel_tensor::autocast(DType::BF16, || {
        assert_eq!(tessel_tensor::autocast_dtype(), Some(DType::BF16));
        let y = x.matmul(&w)?;
        let p = y.softmax(-1)?;
        let loss = (&p * &p)?.sum_all()?;
        let grads = tessel_tensor::grad(&loss, &[&x, &w])?;
        Ok((y, p, grads))
    })?;
    assert_eq!(tessel_tensor::autocast_dtype(), None);
    assert_eq!((y.dtype(), p.dtype()), (DType::BF16, DType::F32));
    assert_eq!(
        (grads[0].dtype(), grads[1].dtype()),
        (DType::F32, DType::F32)
    );
    let want = bf(&xb.matmul(&wb));
    assert_nd("autocast product", &Nd::of(&y), &want, 1e-2);
    // softmax rows of the bf16 product, and d(Σ p²)/dy = 2p·(p - Σ p²) per row.
    let (rows, cols) = (6, 5);
    let mut softmax = Vec::new();
    let mut dy = Vec::new();
    for r in 0..rows {
        let row = &want.data[r * cols..(r + 1) * cols];
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|v| v / s).collect();
        let sq: f64 = p.iter().map(|v| v * v).sum();
        dy.extend(p.iter().map(|&v| 2.0 * v * (v - sq)));
        softmax.extend(p);
    }
    assert_nd(
        "softmax in f32",
        &Nd::of(&p),
        &Nd::new(&[rows, cols], softmax),
        1e-2,
    );
    // dx = dy · wᵀ and dw = xᵀ · dy, from the rounded operands; dy is rounded to bf16 as
    // the product's gradient flows through it.
    let dy = bf(&Nd::new(&[rows, cols], dy));
    let dx = dy.matmul(&wb.permute(&[1, 0]));
    let dw = xb.permute(&[1, 0]).matmul(&dy);
    let scale = |n: &Nd| n.data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    common::assert_close_floor(
        "dx",
        &Nd::of(&grads[0]).data,
        &dx.data,
        2e-2,
        2e-2 * scale(&dx),
    );
    common::assert_close_floor(
        "dw",
        &Nd::of(&grads[1]).data,
        &dw.data,
        2e-2,
        2e-2 * scale(&dw),
    );
    assert_eq!(x.matmul(&w)?.dtype(), DType::F32);
    let refused = tessel_tensor::autocast(DType::F32, || Ok(()));
    assert!(
        matches!(&refused, Err(Error::InvalidArgument { op: "autocast", reason }) if reason.contains("BF16")),
        "{refused:?}"
    );
    Ok(())
}

/// Under `autocast(bf16)` the gradient products of a linear layer (a batch of rows against a
/// shared weight, a bias and an activation between it and the loss) are bf16 products, as
/// PyTorch's are: every matrix product routine in the gradients' plan reads bf16 operands.
#[test]
fn autocast_gradient_products_are_half_products() -> Result<()> {
    if common::on_device([DType::BF16]).is_empty() {
        return Ok(());
    }
    let (x, _) = operand(92, DType::F32, &[2, 24, 40]);
    let (w, _) = operand(93, DType::F32, &[16, 40]);
    let (b, _) = operand(94, DType::F32, &[16]);
    let (product, grads) = tessel_tensor::autocast(DType::BF16, || {
        let product = x.matmul(&w.t()?)?;
        let y = (&product + &b)?.gelu_tanh();
        let loss = (&y * &y)?.sum_all()?;
        Ok((product, tessel_tensor::grad(&loss, &[&x, &w])?))
    })?;
    let plan = tessel_tensor::inspect::plan_to_dot(&[&grads[0], &grads[1]])?.unwrap_or_default();
    // Devices with a matmul routine (the CPU's `gemm`, cuBLAS) name it in the plan; the
    // others run every product as a generated kernel.
    let has_routine = plan.contains("matmul ");
    assert!(
        has_routine || tessel_tensor::Device::default() != tessel_tensor::Device::cpu(),
        "{plan}"
    );
    if has_routine {
        assert!(plan.contains("matmul bf16"), "{plan}");
    }
    assert!(!plan.contains("matmul f32"), "{plan}");
    for g in &grads {
        assert!(Nd::of(g).data.iter().all(|v| v.is_finite()));
    }
    // The transposed weight is cast before its transpose (stored in its own layout): the
    // same values as the product of the rounded operands.
    let bf = |t: &Tensor| t.cast(DType::BF16).cast(DType::F64);
    let want = bf(&x).matmul(&bf(&w).t()?)?;
    assert_nd("autocast x·wᵀ", &Nd::of(&product), &Nd::of(&want), 1e-2);
    Ok(())
}

/// A linear layer's bias and activation above the product, as the epilogue a library
/// routine may absorb (`act(x·wᵀ + b)`, `relu`, GELU's tanh form, GELU's erf form, which
/// no routine offers, and the bias alone), against the f64 reference, in `f32` and `bf16`,
/// with a batch of rows folded into one product and a row length that is not a multiple of
/// 8. Whichever form measurement picks must give these values.
/// A function of one value, as the reference applies it.
type Activation<'a> = &'a dyn Fn(f64) -> f64;

#[test]
fn bias_and_activation_above_a_product() -> Result<()> {
    let k = 40;
    for dtype in common::on_device([DType::F32, DType::BF16]) {
        let (x, xr) = operand(100, dtype, &[3, 7, k]);
        let (w, wr) = operand(101, dtype, &[21, k]);
        let (b, br) = operand(102, dtype, &[21]);
        let sums = xr.matmul(&wr.permute(&[1, 0]));
        let linear = (&x.matmul(&w.t()?)? + &b)?;
        let gelu_tanh = |v: f64| {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * v * (1.0 + (c * (v + 0.044_715 * v * v * v)).tanh())
        };
        let gelu_erf = |v: f64| 0.5 * v * (1.0 + common::erf(v / std::f64::consts::SQRT_2));
        let cases: [(&str, Tensor, Activation); 4] = [
            ("bias", linear.clone(), &|v| v),
            ("relu", linear.relu(), &|v: f64| v.max(0.0)),
            ("gelu tanh", linear.gelu_tanh(), &gelu_tanh),
            ("gelu erf", linear.gelu(), &gelu_erf),
        ];
        for (what, got, act) in cases {
            let want = Nd::from_fn(&[3, 7, 21], |i| {
                act(common::round_to(dtype, sums.at(i) + br.data[i[2]]))
            });
            let tol = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
            assert_nd(&format!("{dtype} {what}"), &Nd::of(&got), &want, tol);
        }
    }
    Ok(())
}
