//! Hand-written kernels on tensors (`CustomOp`, `Tensor::custom`): values against plain
//! Rust, inputs that are views, fusion with ordinary ops around them, dynamic dims,
//! gradients through a user backward, guarded out-of-range indices, and every misuse as an
//! error naming the kernel.

use tessel_ir::{Access, Kernel, KernelBuilder};
use tessel_shape::{BinaryOp, Expr};
use tessel_tensor::{CustomOp, DType, Error, Result, Tensor, Var};

use crate::common::{self, Domain, Rng, assert_err};

/// `out[i] = a[i] * b[i] + 1` over `n` f32 elements (`n` may be a dynamic dim).
fn fma_kernel(n: impl Into<Expr> + Copy) -> Kernel {
    let mut kb = KernelBuilder::new("mul_add_one");
    let a = kb.buffer("a", DType::F32, n.into(), Access::Read);
    let b = kb.buffer("b", DType::F32, n.into(), Access::Read);
    let out = kb.buffer("out", DType::F32, n.into(), Access::Write);
    let len: Expr = n.into();
    kb.grid(
        [len.ceil_div(64), Expr::constant(1), Expr::constant(1)],
        [64, 1, 1],
    );
    let i = kb.global_id(0, DType::I32);
    let end = kb.expr(len, DType::I32);
    let inside = kb.lt(i, end);
    kb.if_(inside, |kb| {
        let (x, y) = (kb.load(a, i), kb.load(b, i));
        let p = kb.mul(x, y);
        let one = kb.constant(1.0f32);
        let v = kb.add(p, one);
        kb.store(out, i, v);
    });
    kb.build().unwrap()
}

fn values(seed: u64, n: usize) -> Vec<f64> {
    common::random(
        &mut Rng::new(seed),
        DType::F32,
        n,
        Domain::new((-2.0, 2.0), (0, 0)),
    )
    .into_iter()
    .map(|v| f64::from(v as f32))
    .collect()
}

#[test]
fn a_custom_kernel_computes_on_views_and_fuses_with_ops_around_it() -> Result<()> {
    let (a, b) = (values(1, 6 * 7), values(2, 6 * 7));
    // `at` is the transpose of a [7, 6] tensor: a view the kernel reads as a buffer.
    let at = common::tensor(DType::F32, &a, &[7, 6]).transpose(0, 1)?;
    let bt = common::tensor(DType::F32, &b, &[6, 7]);
    let y = Tensor::custom(&fma_kernel(42), &[&at, &bt], [6, 7], DType::F32)?;
    let z = (&y * 2.0)?.sum(&[1], false)?;
    let got = common::read(&y);
    for r in 0..6 {
        for c in 0..7 {
            let want = f64::from((a[c * 6 + r] as f32) * (b[r * 7 + c] as f32) + 1.0);
            assert_eq!(got[r * 7 + c], want, "[{r}, {c}]");
        }
    }
    let sums = common::read(&z);
    for r in 0..6 {
        let want: f64 = got[r * 7..r * 7 + 7].iter().map(|v| 2.0 * v).sum();
        assert!(
            (sums[r] - want).abs() <= 1e-5 * want.abs().max(1.0),
            "row {r}"
        );
    }
    // The same op on new data replays the plan: nothing is compiled again.
    let op = CustomOp::new(fma_kernel(42))?;
    let run = |seed| -> Result<Tensor> {
        let x = common::tensor(DType::F32, &values(seed, 42), &[42]);
        x.realize()?;
        op.apply(&[&x, &x], [42], DType::F32)
    };
    run(3)?.realize()?;
    let again = run(4)?;
    assert_eq!(again.realize()?.kernels_prepared(), 0);
    let x = values(4, 42);
    let want: Vec<f64> = x
        .iter()
        .map(|v| f64::from((*v as f32) * (*v as f32) + 1.0))
        .collect();
    assert_eq!(common::read(&again), want);
    Ok(())
}

#[test]
fn a_custom_kernel_with_a_dynamic_dim_compiles_once() -> Result<()> {
    let n = Var::new("n", 1, 4096)?;
    let op = CustomOp::new(fma_kernel(n))?;
    let mut prepared = Vec::new();
    for (k, len) in [100usize, 37, 1000].into_iter().enumerate() {
        let (a, b) = (values(10 + k as u64, len), values(20 + k as u64, len));
        let at = common::tensor(DType::F32, &a, &[len]).mark_dynamic(0, n)?;
        let bt = common::tensor(DType::F32, &b, &[len]).mark_dynamic(0, n)?;
        let y = op.apply(&[&at, &bt], at.shape().clone(), DType::F32)?;
        prepared.push(y.realize()?.kernels_prepared());
        let want: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from((*x as f32) * (*y as f32) + 1.0))
            .collect();
        assert_eq!(common::read(&y), want, "n = {len}");
    }
    assert_eq!(&prepared[1..], &[0, 0], "{prepared:?}");
    Ok(())
}

#[test]
fn gradients_flow_through_a_user_backward() -> Result<()> {
    // out = x * x, with d out / d x = 2 x, checked by finite differences of the kernel.
    let mut kb = KernelBuilder::new("square");
    let x = kb.buffer("x", DType::F64, 5, Access::Read);
    let out = kb.buffer("out", DType::F64, 5, Access::Write);
    kb.grid([1, 1, 1], [5, 1, 1]);
    let i = kb.local_id(0, DType::I32);
    let v = kb.load(x, i);
    let sq = kb.mul(v, v);
    kb.store(out, i, sq);
    let square = CustomOp::new(kb.build().unwrap())?
        .with_backward(|xs, _out, g| Ok(vec![Some(((&xs[0] * 2.0)? * &g[0])?)]));
    if common::on_device([DType::F64]).is_empty() {
        return Ok(());
    }
    let data = values(7, 5);
    let w = values(8, 5);
    let loss = |d: &[f64]| -> Result<Tensor> {
        let x = common::tensor(DType::F64, d, &[5]);
        (&square.apply(&[&x], [5], DType::F64)? * &common::tensor(DType::F64, &w, &[5]))?.sum_all()
    };
    let xt = common::tensor(DType::F64, &data, &[5]);
    let y = (&square.apply(&[&xt], [5], DType::F64)? * &common::tensor(DType::F64, &w, &[5]))?;
    let g = common::read(&tessel_tensor::grad(&y.sum_all()?, &[&xt])?.remove(0));
    for k in 0..5 {
        let h = 1e-6;
        let (mut up, mut down) = (data.clone(), data.clone());
        up[k] += h;
        down[k] -= h;
        let fd = (common::read(&loss(&up)?)[0] - common::read(&loss(&down)?)[0]) / (2.0 * h);
        assert!(
            (g[k] - fd).abs() <= 1e-6 * fd.abs().max(1.0),
            "d/dx[{k}]: {} vs {fd}",
            g[k]
        );
    }
    // Without a backward, a gradient through the kernel is an error, not a silent zero.
    let plain = Tensor::custom(square.kernel(), &[&xt], [5], DType::F64)?;
    assert_err(
        "grad without a backward",
        tessel_tensor::grad(&plain.sum_all()?, &[&xt]).map(|mut g| g.remove(0)),
        |e| matches!(e, Error::InvalidArgument { op: "grad", .. }),
        &["square", "with_backward"],
    );
    // A backward of the wrong shape is named.
    let bad = CustomOp::new(square.kernel().clone())?
        .with_backward(|_, _, _| Ok(vec![Some(Tensor::zeros([4], DType::F64))]));
    let y = bad.apply(&[&xt], [5], DType::F64)?;
    assert_err(
        "a backward of the wrong shape",
        tessel_tensor::grad(&y.sum_all()?, &[&xt]).map(|mut g| g.remove(0)),
        |e| matches!(e, Error::InvalidArgument { op: "grad", .. }),
        &["square", "[4]", "[5]"],
    );
    Ok(())
}

#[test]
fn indices_a_custom_kernel_reads_from_data_are_guarded() -> Result<()> {
    // out[i] = src[idx[i]]: outside `src` it reads 0 instead of foreign memory.
    let mut kb = KernelBuilder::new("lookup");
    let src = kb.buffer("src", DType::F32, 4, Access::Read);
    let idx = kb.buffer("idx", DType::I32, 6, Access::Read);
    let out = kb.buffer("out", DType::F32, 6, Access::Write);
    kb.grid([1, 1, 1], [6, 1, 1]);
    let i = kb.local_id(0, DType::I32);
    let j = kb.load(idx, i);
    let v = kb.load(src, j);
    kb.store(out, i, v);
    let kernel = kb.build().unwrap();
    let s = Tensor::from([1.5f32, 2.5, 3.5, 4.5]);
    let ix = Tensor::from([3i32, -1, 1 << 30, 0, i32::MIN, 2]);
    let y = Tensor::custom(&kernel, &[&s, &ix], [6], DType::F32)?;
    assert_eq!(y.to_vec::<f32>()?, vec![4.5, 0.0, 0.0, 1.5, 0.0, 3.5]);
    Ok(())
}

#[test]
fn misuse_is_an_error_naming_the_kernel() -> Result<()> {
    let x = Tensor::ones([42], DType::F32);
    let k = fma_kernel(42);
    let invalid = |e: &Error| matches!(e, Error::InvalidArgument { op: "custom", .. });
    assert_err(
        "one input for two",
        Tensor::custom(&k, &[&x], [42], DType::F32),
        invalid,
        &["mul_add_one", "3 buffer parameters", "1 inputs"],
    );
    assert_err(
        "a dtype the kernel does not read",
        Tensor::custom(&k, &[&x, &x.cast(DType::F16)], [42], DType::F32),
        invalid,
        &["`b`", "f32", "f16"],
    );
    assert_err(
        "a length the kernel does not read",
        Tensor::custom(&k, &[&x, &Tensor::ones([41], DType::F32)], [42], DType::F32),
        invalid,
        &["`b`", "42", "41"],
    );
    assert_err(
        "an output of another size",
        Tensor::custom(&k, &[&x, &x], [6, 8], DType::F32),
        invalid,
        &["`out`", "output", "48"],
    );
    // A dim only the kernel names has no value at launch.
    let n = Var::new("n", 1, 64)?;
    let mut kb = KernelBuilder::new("reads_a_dim");
    let a = kb.buffer("a", DType::F32, 42, Access::Read);
    let out = kb.buffer("out", DType::F32, 42, Access::Write);
    kb.grid([1, 1, 1], [42, 1, 1]);
    let i = kb.local_id(0, DType::I32);
    let end = kb.dim(n, DType::I32);
    let inside = kb.lt(i, end);
    kb.if_(inside, |kb| {
        let v = kb.load(a, i);
        kb.store(out, i, v);
    });
    assert_err(
        "a dim no input carries",
        Tensor::custom(&kb.build().unwrap(), &[&x], [42], DType::F32),
        invalid,
        &["reads_a_dim", "`n`", "dynamic"],
    );
    // An input bound to a parameter the kernel writes.
    let mut kb = KernelBuilder::new("writes_input");
    let a = kb.buffer("a", DType::F32, 42, Access::Write);
    let out = kb.buffer("out", DType::F32, 42, Access::Write);
    let zero = kb.constant(0i32);
    let v = kb.constant(1.0f32);
    kb.store(a, zero, v);
    kb.store(out, zero, v);
    assert_err(
        "an input the kernel writes",
        Tensor::custom(&kb.build().unwrap(), &[&x], [42], DType::F32),
        invalid,
        &["`a`", "Write"],
    );
    // A kernel that does not verify.
    let mut kb = KernelBuilder::new("unverified");
    let a = kb.buffer("a", DType::F32, 4, Access::Read);
    let bad_index = kb.constant(7i32);
    let v = kb.load(a, bad_index);
    let w = kb.binary(BinaryOp::Add, v, v);
    let _ = w;
    assert!(matches!(
        CustomOp::new(kb.finish_unverified()),
        Err(Error::InvalidArgument { op: "custom", .. })
    ));
    Ok(())
}

#[test]
fn a_kernel_with_two_outputs_writes_both() -> Result<()> {
    // a[i] = x[i] + 1 over 6 elements; b[j] = x[j] * x[j + 3] over 3.
    let mut kb = KernelBuilder::new("two_outputs");
    let x = kb.buffer("x", DType::F32, 6, Access::Read);
    let a = kb.buffer("a", DType::F32, 6, Access::Write);
    let b = kb.buffer("b", DType::F32, 3, Access::Write);
    kb.grid([1, 1, 1], [6, 1, 1]);
    let i = kb.local_id(0, DType::I32);
    let v = kb.load(x, i);
    let one = kb.constant(1.0f32);
    let inc = kb.add(v, one);
    kb.store(a, i, inc);
    let three = kb.constant(3i32);
    let low = kb.lt(i, three);
    kb.if_(low, |kb| {
        let j = kb.add(i, three);
        let w = kb.load(x, j);
        let p = kb.mul(v, w);
        kb.store(b, i, p);
    });
    // d a / d x = 1; d b_j / d x_j = x_{j+3}, d b_j / d x_{j+3} = x_j.
    let op = CustomOp::new(kb.build().unwrap())?.with_backward(|xs, _outs, g| {
        let x = &xs[0];
        let (lo, hi) = (x.narrow(0, 0, 3)?, x.narrow(0, 3, 3)?);
        let db = Tensor::cat(&[&(&g[1] * &hi)?, &(&g[1] * &lo)?], 0)?;
        Ok(vec![Some((&g[0].reshape(&[6])? + &db)?)])
    });
    let data = values(9, 6);
    let xt = common::tensor(DType::F32, &data, &[6]);
    let outs = op.apply_many(
        &[&xt],
        &[([2, 3].into(), DType::F32), ([3].into(), DType::F32)],
    )?;
    assert_eq!((outs[0].dims(), outs[1].dims()), (vec![2, 3], vec![3]));
    let w = values(10, 3);
    let loss = ((outs[0].sum_all()? * 0.5)?
        + (&outs[1] * &common::tensor(DType::F32, &w, &[3]))?.sum_all()?)?;
    let g = common::read(&tessel_tensor::grad(&loss, &[&xt])?.remove(0));
    Tensor::realize_all(&[&outs[0], &outs[1]])?;
    let x32: Vec<f32> = data.iter().map(|v| *v as f32).collect();
    let want_a: Vec<f64> = x32.iter().map(|v| f64::from(v + 1.0)).collect();
    let want_b: Vec<f64> = (0..3).map(|j| f64::from(x32[j] * x32[j + 3])).collect();
    assert_eq!(common::read(&outs[0]), want_a);
    assert_eq!(common::read(&outs[1]), want_b);
    for k in 0..6 {
        let want = 0.5
            + if k < 3 {
                w[k] * data[k + 3]
            } else {
                w[k - 3] * data[k - 3]
            };
        assert!(
            (g[k] - want).abs() <= 1e-5 * want.abs().max(1.0),
            "d/dx[{k}]: {} vs {want}",
            g[k]
        );
    }
    // Outputs of different dtypes cannot share a buffer.
    assert_err(
        "outputs of two dtypes",
        op.apply_many(
            &[&xt],
            &[([6].into(), DType::F32), ([3].into(), DType::F16)],
        )
        .map(|mut v| v.remove(0)),
        |e| matches!(e, Error::InvalidArgument { op: "custom", .. }),
        &["two_outputs", "`b`", "f16"],
    );
    Ok(())
}
