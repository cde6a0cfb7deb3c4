//! The verifier: each broken kernel gets one precise error naming the kernel, the
//! instruction and what is wrong.

use tessel_ir::{Access, Inst, KernelBuilder, Mem, Value, VerifyErrorKind};
use tessel_shape::{BinaryOp, DType, Scalar, UnaryOp, Var};

/// A kernel with one f32 input `a` and output `out` of 64 elements, one workgroup of 64.
fn base(name: &str) -> (KernelBuilder, tessel_ir::Buf, tessel_ir::Buf) {
    let mut kb = KernelBuilder::new(name);
    let a = kb.buffer("a", DType::F32, 64, Access::Read);
    let out = kb.buffer("out", DType::F32, 64, Access::Write);
    kb.grid([1, 1, 1], [64, 1, 1]);
    (kb, a, out)
}

#[track_caller]
fn expect_err(kb: KernelBuilder, check: impl FnOnce(&VerifyErrorKind) -> bool, text: &[&str]) {
    let err = kb.build().expect_err("the kernel should fail verification");
    assert!(check(&err.kind), "unexpected error kind: {err}");
    let msg = err.to_string();
    for t in text {
        assert!(msg.contains(t), "`{msg}` should mention `{t}`");
    }
}

#[test]
fn a_valid_kernel_passes() {
    let (mut kb, a, out) = base("copy");
    let i = kb.local_id(0, DType::I32);
    let x = kb.load(a, i);
    kb.store(out, i, x);
    assert!(kb.build().is_ok());
}

#[test]
fn type_mismatch_names_the_types() {
    let (mut kb, a, out) = base("mixed");
    let i = kb.local_id(0, DType::I32);
    let x = kb.load(a, i);
    let one = kb.constant(1.0f64);
    let y = kb.add(x, one);
    kb.store(out, i, y);
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::Type(_)),
        &["`mixed`", "add", "f32", "f64", "%3"],
    );
}

#[test]
fn unsupported_op_for_dtype() {
    let (mut kb, _, _) = base("sqrt_int");
    let i = kb.local_id(0, DType::I32);
    kb.unary(UnaryOp::Sqrt, i);
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::Type(_)),
        &["sqrt", "i32"],
    );
}

#[test]
fn use_before_definition() {
    let (mut kb, _, _) = base("forward_ref");
    kb.push(Inst::Unary(UnaryOp::Neg, Value(5)));
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::UseBeforeDef(v) if *v == Value(5)),
        &["%5"],
    );
}

#[test]
fn value_used_outside_its_loop() {
    let (mut kb, a, out) = base("escape");
    let zero = kb.constant(0i32);
    let four = kb.constant(4i32);
    let inner = kb.range(zero, four, |kb, j| kb.load(a, j));
    kb.store(out, zero, inner);
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::OutOfScope(_)),
        &["out of scope"],
    );
}

#[test]
fn unbalanced_blocks() {
    let (mut kb, _, _) = base("open_loop");
    let zero = kb.constant(0i32);
    let four = kb.constant(4i32);
    kb.push(Inst::Range {
        start: zero,
        end: four,
    });
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::Unbalanced(_)),
        &["never closed"],
    );

    let (mut kb, _, _) = base("crossed");
    let zero = kb.constant(0i32);
    let four = kb.constant(4i32);
    let outer = kb.push(Inst::Range {
        start: zero,
        end: four,
    });
    kb.push(Inst::Range {
        start: zero,
        end: four,
    });
    kb.push(Inst::EndRange(outer));
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::Unbalanced(_)),
        &["innermost"],
    );
}

#[test]
fn barrier_under_divergent_if() {
    let (mut kb, _, _) = base("bad_barrier");
    let lid = kb.local_id(0, DType::I32);
    let half = kb.constant(32i32);
    let cond = kb.lt(lid, half);
    kb.if_(cond, KernelBuilder::barrier);
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::DivergentBarrier(_)),
        &["barrier", "invocation-dependent"],
    );

    // The same barrier under a uniform condition is fine.
    let (mut kb, _, _) = base("good_barrier");
    let gid = kb.group_id(0, DType::I32);
    let zero = kb.constant(0i32);
    let cond = kb.binary(BinaryOp::Eq, gid, zero);
    kb.if_(cond, KernelBuilder::barrier);
    assert!(kb.build().is_ok());
}

#[test]
fn read_only_buffer_is_not_written() {
    let (mut kb, a, _) = base("store_to_input");
    let i = kb.local_id(0, DType::I32);
    let x = kb.constant(1.0f32);
    kb.store(a, i, x);
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::Param(_)),
        &["`a`", "Read"],
    );
}

#[test]
fn constant_out_of_bounds_access() {
    // 65 invocations read a 64-element buffer.
    let mut kb = KernelBuilder::new("overrun");
    let a = kb.buffer("a", DType::F32, 64, Access::Read);
    let out = kb.buffer("out", DType::F32, 65, Access::Write);
    kb.grid([1, 1, 1], [65, 1, 1]);
    let i = kb.local_id(0, DType::I32);
    let x = kb.load(a, i);
    kb.store(out, i, x);
    expect_err(
        kb,
        |k| {
            matches!(
                k,
                VerifyErrorKind::OutOfBounds {
                    lo: 0,
                    hi: 64,
                    len: 64,
                    ..
                }
            )
        },
        &["buffer `a`", "0..=64", "64 elements"],
    );

    // Guarded by `i < 64`, the same access is provably in bounds.
    let mut kb = KernelBuilder::new("guarded");
    let a = kb.buffer("a", DType::F32, 64, Access::Read);
    let out = kb.buffer("out", DType::F32, 65, Access::Write);
    kb.grid([1, 1, 1], [65, 1, 1]);
    let i = kb.local_id(0, DType::I32);
    let n = kb.constant(64i32);
    let ok = kb.lt(i, n);
    kb.if_(ok, |kb| {
        let x = kb.load(a, i);
        kb.store(out, i, x);
    });
    assert!(kb.build().is_ok());

    // A vector load of 4 lanes at index 62 overruns too.
    let (mut kb, a, out) = base("vector_overrun");
    let i = kb.local_id(0, DType::I32);
    let q = kb.constant(16i32);
    let j = kb.rem(i, q);
    let four = kb.constant(4i32);
    let base_idx = kb.mul(j, four);
    let two = kb.constant(2i32);
    let idx = kb.add(base_idx, two);
    let v = kb.load_vec(a, idx, 4);
    let x = kb.extract(v, 0);
    kb.store(out, i, x);
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::OutOfBounds { width: 4, .. }),
        &["width 4"],
    );
}

#[test]
fn registers_and_locals_are_checked() {
    let (mut kb, _, out) = base("reg_overrun");
    let acc = kb.reg(DType::F32, 2);
    let i = kb.constant(2i32);
    let x = kb.constant(0.0f32);
    kb.store(acc, i, x);
    let y = kb.load(acc, i);
    kb.store(out, i, y);
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::OutOfBounds { len: 2, .. }),
        &["registers"],
    );

    let (mut kb, _, _) = base("local_in_loop");
    let zero = kb.constant(0i32);
    let four = kb.constant(4i32);
    kb.range(zero, four, |kb, _| kb.local(DType::F32, 16));
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::Type(_)),
        &["top level"],
    );

    let (mut kb, _, _) = base("mem_kind");
    let zero = kb.constant(0i32);
    kb.load(Mem::Local(zero), zero);
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::WrongKind { .. }),
        &["DefineLocal"],
    );
}

#[test]
fn vectors_and_casts() {
    let (mut kb, _, _) = base("vec3");
    let x = kb.constant(1.0f32);
    kb.vectorize(vec![x, x, x]);
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::Type(_)),
        &["2, 4 or 8 lanes"],
    );

    let (mut kb, _, _) = base("bitcast_size");
    let x = kb.constant(1.0f32);
    kb.bitcast(x, DType::F64);
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::Type(_)),
        &["bitcast", "f64"],
    );

    let (mut kb, _, _) = base("lane");
    let x = kb.constant(Scalar::F32(1.0));
    let v = kb.vectorize(vec![x, x]);
    kb.extract(v, 2);
    expect_err(kb, |k| matches!(k, VerifyErrorKind::Type(_)), &["lane 2"]);
}

#[test]
fn symbolic_dims_lower_with_floor_semantics() {
    // A dynamic length: bounds are checked at launch, the verifier accepts the kernel.
    let n = Var::new("n", 1, 1 << 20).unwrap();
    let mut kb = KernelBuilder::new("dyn");
    let a = kb.buffer("a", DType::F32, n, tessel_ir::Access::Read);
    let out = kb.buffer("out", DType::F32, n, tessel_ir::Access::Write);
    kb.grid(
        [tessel_shape::Expr::from(n).ceil_div(64), 1.into(), 1.into()],
        [64, 1, 1],
    );
    let i = kb.global_id(0, DType::I32);
    let nv = kb.dim(n, DType::I32);
    let ok = kb.lt(i, nv);
    kb.if_(ok, |kb| {
        let x = kb.load(a, i);
        kb.store(out, i, x);
    });
    let kernel = kb.build().unwrap();
    assert_eq!(kernel.dim_vars(), vec![n]);
    let text = kernel.to_string();
    assert!(text.contains("n: dim i32 in 1..=1048576"), "{text}");
    assert!(text.contains("groups((n + 63) / 64, 1, 1)"), "{text}");

    // A divisor that may be negative can't be lowered.
    let d = Var::new("d", -4, 4).unwrap();
    let mut kb = KernelBuilder::new("bad_div");
    kb.expr(
        tessel_shape::Expr::constant(7) / tessel_shape::Expr::from(d),
        DType::I32,
    );
    expect_err(
        kb,
        |k| matches!(k, VerifyErrorKind::Type(_)),
        &["divisor may be zero or negative"],
    );
}
