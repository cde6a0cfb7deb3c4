//! The WGSL emitter: every shader of a corpus (the sample kernels, every op, cast and
//! bitcast on every dtype) parsed and validated by naga, the validator wgpu runs before
//! building a pipeline; the refusals (`UnsupportedOp`) where a target lacks a type; the
//! host side of the ABI (`dispatch`, `uniform_bytes`); and one snapshot. Whether the
//! shaders *compute* the right thing is tested by running them, in `tessel-wgpu`.

use naga::valid::{Capabilities, ValidationFlags, Validator};
use tessel_ir::codegen::{CodegenError, WgslShader, WgslTarget, render_wgsl};
use tessel_ir::{Access, Kernel, KernelBuilder, LaunchArgs, Value, samples};
use tessel_shape::{BinaryOp, DType, TernaryOp, UnaryOp, Var};

const BASE: WgslTarget = WgslTarget {
    f64: false,
    int64: false,
    max_groups_per_dim: 65535,
    max_invocations: 256,
};

const INT64: WgslTarget = WgslTarget {
    int64: true,
    ..BASE
};

const FULL: WgslTarget = WgslTarget {
    f64: true,
    int64: true,
    ..BASE
};

/// The naga capabilities a device with `target`'s features has.
fn capabilities(target: &WgslTarget) -> Capabilities {
    let mut caps = Capabilities::empty();
    if target.int64 {
        caps |= Capabilities::SHADER_INT64;
    }
    if target.f64 {
        caps |= Capabilities::FLOAT64;
    }
    caps
}

/// Parses and validates `source` with `caps`; the error names what naga rejected.
fn validate(source: &str, caps: Capabilities) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    Ok(())
}

/// Renders `kernel` for `target` and validates the shader; panics with the source and
/// naga's message when it is invalid.
#[track_caller]
fn render_valid(kernel: &Kernel, target: &WgslTarget) -> Result<WgslShader, CodegenError> {
    let shader = render_wgsl(kernel, target)?;
    if let Err(e) = validate(&shader.source, capabilities(target)) {
        panic!(
            "invalid WGSL for `{}` on {target:?}:\n{e}\n{}",
            kernel.name, shader.source
        );
    }
    Ok(shader)
}

/// Whether a dtype needs a feature `target` lacks.
fn lacks(target: &WgslTarget, dtype: DType) -> bool {
    match dtype {
        DType::I64 | DType::U64 => !target.int64,
        DType::F64 => !(target.f64 && target.int64),
        _ => false,
    }
}

#[test]
fn samples_validate() {
    for target in [BASE, INT64, FULL] {
        for dtype in DType::ALL {
            let kernel = samples::vector_add(dtype, 1000, 64).unwrap();
            match render_valid(&kernel, &target) {
                Ok(_) => assert!(!lacks(&target, dtype), "{dtype} rendered on {target:?}"),
                Err(CodegenError::UnsupportedOp { dtype: d, .. }) => {
                    assert!(lacks(&target, dtype) && d == dtype, "{dtype}: {d}");
                }
                Err(e) => panic!("{dtype}: {e}"),
            }
        }
        for dtype in [DType::F32, DType::F16, DType::I32, DType::U8] {
            render_valid(&samples::row_sum(5, 300, dtype).unwrap(), &target).unwrap();
        }
        render_valid(
            &samples::permuted_copy([3, 5, 7], [2, 0, 1]).unwrap(),
            &target,
        )
        .unwrap();
        render_valid(&samples::tree_reduce(1000, 64).unwrap(), &target).unwrap();
        render_valid(&samples::tiled_matmul(32, 48, 16, 8).unwrap(), &target).unwrap();
        let n = Var::new("n", 1, 1 << 20).unwrap();
        render_valid(&samples::dynamic_vector_add(n, 64).unwrap(), &target).unwrap();
    }
}

/// What one test kernel computes.
#[derive(Clone, Copy, Debug)]
enum Op {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Ternary(TernaryOp),
    Cast(DType),
    Bitcast(DType),
}

/// `out[i] = op(x[i], y[i], z[i])` on `dtype`, with `width` lanes per invocation.
fn op_kernel(dtype: DType, op: Op, out: DType, width: u8) -> Kernel {
    let mut kb = KernelBuilder::new(&format!("{op:?}_{dtype}"));
    let n = 256 * i64::from(width);
    let inputs = ["x", "y", "z"].map(|name| kb.buffer(name, dtype, n, Access::Read));
    let output = kb.buffer("out", out, n, Access::Write);
    kb.grid([4, 1, 1], [64, 1, 1]);
    let g = kb.global_id(0, DType::I32);
    let w = kb.constant_as(i64::from(width), DType::I32);
    let i = kb.mul(g, w);
    let [a, b, c]: [Value; 3] = inputs.map(|buf| {
        if width == 1 {
            kb.load(buf, i)
        } else {
            kb.load_vec(buf, i, width)
        }
    });
    let value = match op {
        Op::Unary(op) => kb.unary(op, a),
        Op::Binary(op) => kb.binary(op, a, b),
        Op::Ternary(TernaryOp::Where) => {
            let cond = kb.lt(c, a);
            kb.select(cond, a, b)
        }
        Op::Ternary(op) => kb.ternary(op, a, b, c),
        Op::Cast(to) => kb.cast(a, to),
        Op::Bitcast(to) => kb.bitcast(a, to),
    };
    kb.store(output, i, value);
    kb.build().unwrap()
}

/// Every op the verifier accepts on `dtype`, with its result dtype.
fn ops_on(dtype: DType) -> Vec<(Op, DType)> {
    let mut ops = Vec::new();
    for op in UnaryOp::ALL {
        if let Some(d) = op.result_dtype(dtype) {
            ops.push((Op::Unary(op), d));
        }
    }
    for op in BinaryOp::ALL {
        if let Some(d) = op.result_dtype(dtype) {
            ops.push((Op::Binary(op), d));
        }
    }
    // The kernel's `where` compares its inputs, which float8 cannot (nor `mad`).
    if !dtype.is_float8() {
        ops.push((Op::Ternary(TernaryOp::Where), dtype));
    }
    if dtype != DType::Bool && !dtype.is_float8() {
        ops.push((Op::Ternary(TernaryOp::MulAdd), dtype));
    }
    for to in DType::ALL.into_iter().chain(DType::FLOAT8) {
        ops.push((Op::Cast(to), to));
        if to != dtype
            && to != DType::Bool
            && dtype != DType::Bool
            && to.size_bytes() == dtype.size_bytes()
        {
            ops.push((Op::Bitcast(to), to));
        }
    }
    ops
}

/// The ops the emitter refuses on `target` whatever the dtypes' support: the documented
/// list (see the `wgsl` module docs).
fn refused(target: &WgslTarget, op: Op, dtype: DType) -> bool {
    let transcendental = matches!(
        op,
        Op::Unary(
            UnaryOp::Erf
                | UnaryOp::Exp
                | UnaryOp::Exp2
                | UnaryOp::Log
                | UnaryOp::Log2
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Tan
                | UnaryOp::Tanh
        ) | Op::Binary(BinaryOp::Pow)
    );
    match op {
        _ if transcendental => dtype == DType::F64,
        Op::Ternary(TernaryOp::MulAdd) => dtype == DType::BF16 && !(target.f64 && target.int64),
        _ => false,
    }
}

#[test]
fn every_op_cast_and_bitcast_validates() {
    let mut rendered = 0;
    for target in [BASE, INT64, FULL] {
        for dtype in DType::ALL.into_iter().chain(DType::FLOAT8) {
            for (op, out) in ops_on(dtype) {
                for width in [1, 4] {
                    let kernel = op_kernel(dtype, op, out, width);
                    let expect_refusal =
                        lacks(&target, dtype) || lacks(&target, out) || refused(&target, op, dtype);
                    match render_valid(&kernel, &target) {
                        Ok(_) => {
                            assert!(
                                !expect_refusal,
                                "{op:?} on {dtype} -> {out} rendered on {target:?}"
                            );
                            rendered += 1;
                        }
                        Err(CodegenError::UnsupportedOp { dialect, .. }) if expect_refusal => {
                            assert_eq!(dialect, "wgsl");
                        }
                        Err(e) => panic!("{op:?} on {dtype} -> {out} on {target:?}: {e}"),
                    }
                }
            }
        }
    }
    assert!(rendered > 1000, "only {rendered} shaders rendered");
}

#[test]
fn unsupported_ops_name_the_op_and_dtype() {
    let kernel = op_kernel(DType::I64, Op::Binary(BinaryOp::Add), DType::I64, 1);
    let err = render_wgsl(&kernel, &BASE).unwrap_err();
    let CodegenError::UnsupportedOp { op, dtype, .. } = &err else {
        panic!("{err:?}")
    };
    // The first instruction that needs i64 is the load of `x`.
    assert_eq!((op.as_str(), *dtype), ("load", DType::I64), "{err}");

    // erf is fdlibm's erff on f32 (and the half types), refused on f64 (no f64 `exp`).
    let kernel = op_kernel(DType::F32, Op::Unary(UnaryOp::Erf), DType::F32, 1);
    let shader = render_valid(&kernel, &BASE).unwrap();
    assert!(
        shader.source.contains("fn tsl_erf_f32("),
        "{}",
        shader.source
    );
    let kernel = op_kernel(DType::F64, Op::Unary(UnaryOp::Erf), DType::F64, 1);
    let err = render_wgsl(&kernel, &FULL).unwrap_err();
    assert!(
        matches!(&err, CodegenError::UnsupportedOp { op, dtype: DType::F64, .. } if op == "erf"),
        "{err}"
    );

    // f64 needs int64 too (its NaN tests and conversions work on the bits).
    let f64_only = WgslTarget { f64: true, ..BASE };
    let kernel = samples::vector_add(DType::F64, 100, 64).unwrap();
    assert!(matches!(
        render_wgsl(&kernel, &f64_only),
        Err(CodegenError::UnsupportedOp {
            dtype: DType::F64,
            ..
        })
    ));

    let kernel = op_kernel(DType::F64, Op::Unary(UnaryOp::Exp), DType::F64, 1);
    let err = render_wgsl(&kernel, &FULL).unwrap_err();
    assert!(
        matches!(&err, CodegenError::UnsupportedOp { op, dtype: DType::F64, .. } if op == "exp"),
        "{err}"
    );
}

#[test]
fn workgroup_sizes_must_be_constant_and_fit() {
    let n = Var::new("n", 1, 1 << 20).unwrap();
    let mut kb = KernelBuilder::new("symbolic_local");
    let out = kb.buffer("out", DType::F32, 1 << 20, Access::Write);
    let one_dim = tessel_shape::Dim::constant(1);
    kb.grid([one_dim; 3], [tessel_shape::Dim::from(n), one_dim, one_dim]);
    let i = kb.local_id(0, DType::I32);
    let one = kb.constant_as(1, DType::F32);
    kb.store(out, i, one);
    let kernel = kb.build().unwrap();
    let err = render_wgsl(&kernel, &BASE).unwrap_err();
    assert!(
        matches!(&err, CodegenError::Unsupported { reason, .. } if reason.contains("constant")),
        "{err}"
    );

    let kernel = samples::vector_add(DType::F32, 1000, 512).unwrap();
    let err = render_wgsl(&kernel, &BASE).unwrap_err();
    assert!(err.to_string().contains("512"), "{err}");
}

fn args(groups: [i64; 3], local: [i64; 3], dims: Vec<i64>) -> LaunchArgs {
    LaunchArgs {
        grid: [
            groups[0], groups[1], groups[2], local[0], local[1], local[2],
        ],
        dims,
        groups: groups.iter().product(),
        zeroed: Vec::new(),
    }
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn dispatch_splits_large_grids() {
    let kernel = samples::vector_add(DType::F32, 1000, 64).unwrap();
    let shader = render_wgsl(&kernel, &BASE).unwrap();
    // Fits: dispatched as is.
    let a = args([16, 1, 1], [64, 1, 1], vec![]);
    assert_eq!(shader.dispatch(&a).unwrap(), [16, 1, 1]);
    // 100000 groups along x exceed 65535: 2 rows of 50000.
    let a = args([100_000, 1, 1], [64, 1, 1], vec![]);
    assert_eq!(shader.dispatch(&a).unwrap(), [50_000, 2, 1]);
    assert_eq!(
        words(&shader.uniform_bytes(&a))[..4],
        [100_000, 1, 1, 100_000]
    );
    // 1.47e10 workgroups cannot be numbered in a u32.
    assert!(
        shader
            .dispatch(&args([70_000, 3, 70_000], [64, 1, 1], vec![]))
            .is_err()
    );
    // Logical y and z are linearized too: at least the product is dispatched, with fewer
    // surplus workgroups than rows.
    let a = args([65_535, 65_535, 1], [64, 1, 1], vec![]);
    let [x, y, z] = shader.dispatch(&a).unwrap();
    assert!(x <= 65535 && y <= 65535 && z <= 65535);
    let dispatched = u64::from(x) * u64::from(y) * u64::from(z);
    assert!(dispatched >= 65_535 * 65_535 && dispatched - 65_535 * 65_535 < u64::from(y * z));
    // A small limit forces all three axes.
    let small = WgslShader {
        max_groups_per_dim: 10,
        ..shader.clone()
    };
    let a = args([999, 1, 1], [64, 1, 1], vec![]);
    let [x, y, z] = small.dispatch(&a).unwrap();
    assert!(
        x <= 10 && y <= 10 && z <= 10 && x * y * z >= 999,
        "{x} {y} {z}"
    );
    assert!(
        small
            .dispatch(&args([1001, 1, 1], [64, 1, 1], vec![]))
            .is_err()
    );
    // Empty grids dispatch nothing; wrong local sizes are refused.
    assert_eq!(
        shader
            .dispatch(&args([0, 5, 1], [64, 1, 1], vec![]))
            .unwrap(),
        [0, 0, 0]
    );
    assert!(
        shader
            .dispatch(&args([1, 1, 1], [32, 1, 1], vec![]))
            .is_err()
    );
}

#[test]
fn uniform_holds_counts_and_dims() {
    let n = Var::new("n", 1, 1 << 20).unwrap();
    let kernel = samples::dynamic_vector_add(n, 64).unwrap();
    let shader = render_valid(&kernel, &BASE).unwrap();
    assert_eq!(shader.uniform_binding, 3);
    assert_eq!(shader.uniform_size, 16 * 3);
    assert_eq!(shader.buffers.len(), 3);
    assert!(shader.buffers[0].read_only && !shader.buffers[2].read_only);
    let a = args([2, 1, 1], [64, 1, 1], vec![100]);
    let bytes = shader.uniform_bytes(&a);
    assert_eq!(bytes.len(), 48);
    assert_eq!(words(&bytes), [2, 1, 1, 2, 0, 0, 0, 0, 100, 0, 0, 0]);
    // Negative dims are two's complement over both words.
    let a = args([2, 1, 1], [64, 1, 1], vec![-3]);
    assert_eq!(
        words(&shader.uniform_bytes(&a))[8..10],
        [0xffff_fffd, 0xffff_ffff]
    );
}

#[test]
fn vectors_and_packed_stores_validate() {
    let mut kb = KernelBuilder::new("vectors");
    let x = kb.buffer("x", DType::F32, 1024, Access::Read);
    let y = kb.buffer("y", DType::F32, 1024, Access::Read);
    let sums = kb.buffer("sums", DType::F32, 1024, Access::Write);
    let halves = kb.buffer("halves", DType::F16, 1024, Access::ReadWrite);
    let flags = kb.buffer("flags", DType::Bool, 1024, Access::Write);
    let bytes = kb.buffer("bytes", DType::I8, 1024, Access::ReadWrite);
    kb.grid([4, 1, 1], [64, 1, 1]);
    let g = kb.global_id(0, DType::I32);
    let four = kb.constant_as(4, DType::I32);
    let i = kb.mul(g, four);
    let (a, b) = (kb.load_vec(x, i, 4), kb.load_vec(y, i, 4));
    let sum = kb.add(a, b);
    kb.store(sums, i, sum);
    let half = kb.cast(sum, DType::F16);
    let old = kb.load_vec(halves, i, 4);
    let half = kb.binary(BinaryOp::Max, half, old);
    kb.store(halves, i, half);
    let flag = kb.lt(a, b);
    kb.store(flags, i, flag);
    let byte = kb.cast(sum, DType::I8);
    let old = kb.load_vec(bytes, i, 4);
    let byte = kb.add(byte, old);
    kb.store(bytes, i, byte);
    let kernel = kb.build().unwrap();
    let shader = render_valid(&kernel, &BASE).unwrap();
    assert!(shader.source.contains("array<atomic<u32>>"));
    assert!(shader.source.contains("atomicAnd("));
}

#[test]
fn snapshot_vector_add_f16() {
    let shader = render_valid(&samples::vector_add(DType::F16, 1000, 64).unwrap(), &BASE).unwrap();
    insta::assert_snapshot!("wgsl_vector_add_f16", shader.source);
}

/// The body of the entry point (the helpers' definitions come before it).
fn entry_body(shader: &WgslShader) -> &str {
    let at = shader.source.find("@compute").expect("an entry point");
    &shader.source[at..]
}

/// Float products go through the opaque identity (no driver may fuse them with the sum they
/// feed), and `mad` alone fuses; integer products stay plain.
#[test]
fn float_products_cannot_be_contracted() {
    let mut kb = KernelBuilder::new("unfused");
    let [x, y, z] = ["x", "y", "z"].map(|n| kb.buffer(n, DType::F32, 256, Access::Read));
    let out = kb.buffer("out", DType::F32, 256, Access::Write);
    kb.grid([4, 1, 1], [64, 1, 1]);
    let i = kb.global_id(0, DType::I32);
    let [a, b, c] = [x, y, z].map(|buf| kb.load(buf, i));
    let p = kb.mul(a, b);
    let s = kb.add(p, c);
    kb.store(out, i, s);
    let shader = render_valid(&kb.build().unwrap(), &BASE).unwrap();
    let body = entry_body(&shader);
    assert!(
        shader.source.contains("fn tsl_opaque_f32("),
        "{}",
        shader.source
    );
    assert!(body.contains("tsl_opaque_f32((v"), "{}", shader.source);
    assert!(
        body.lines()
            .filter(|l| l.contains(": f32 =") && l.contains(" * "))
            .all(|l| l.contains("tsl_opaque_f32(")),
        "{}",
        shader.source
    );
    for (dtype, target) in [(DType::F64, FULL), (DType::BF16, BASE), (DType::F16, BASE)] {
        let kernel = op_kernel(dtype, Op::Binary(BinaryOp::Mul), dtype, 1);
        let shader = render_valid(&kernel, &target).unwrap();
        let opaque = if dtype == DType::F64 {
            "tsl_opaque_f64(("
        } else {
            "tsl_opaque_f32(("
        };
        assert!(
            entry_body(&shader).contains(opaque),
            "{dtype}: {}",
            shader.source
        );
    }
    let kernel = op_kernel(DType::I32, Op::Binary(BinaryOp::Mul), DType::I32, 1);
    let shader = render_valid(&kernel, &BASE).unwrap();
    assert!(!shader.source.contains("tsl_opaque"), "{}", shader.source);
    let kernel = op_kernel(DType::F32, Op::Ternary(TernaryOp::MulAdd), DType::F32, 1);
    let shader = render_valid(&kernel, &BASE).unwrap();
    assert!(
        entry_body(&shader).contains("tsl_fma_f32("),
        "{}",
        shader.source
    );
}

/// Negation and `abs` are sign-bit operations, and conversions between float types are
/// integer code, so that devices flushing subnormals keep them exact.
#[test]
fn sign_ops_and_float_conversions_work_on_the_bits() {
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for op in [UnaryOp::Neg, UnaryOp::Abs] {
            let kernel = op_kernel(dtype, Op::Unary(op), dtype, 1);
            let shader = render_valid(&kernel, &FULL).unwrap();
            let body = entry_body(&shader);
            let mask = match (dtype, op) {
                (DType::F16 | DType::BF16, UnaryOp::Neg) => "^ 0x8000u",
                (DType::F16 | DType::BF16, _) => "& 0x7fffu",
                (DType::F32, UnaryOp::Neg) => "^ 0x80000000u",
                (DType::F32, _) => "& 0x7fffffffu",
                (_, UnaryOp::Neg) => "^ 0x8000000000000000lu",
                _ => "& 0x7ffffffffffffffflu",
            };
            assert!(body.contains(mask), "{op:?} on {dtype}: {}", shader.source);
            assert!(
                !body.contains("(-") && !body.contains("abs(") && !body.contains("tsl_f"),
                "{op:?} on {dtype}: {}",
                shader.source
            );
        }
    }
    for (from, to, helper) in [
        (DType::F32, DType::F64, "tsl_f32_to_f64("),
        (DType::BF16, DType::F64, "tsl_f32_to_f64("),
        (DType::F64, DType::F32, "tsl_f64_to_f32("),
        (DType::F64, DType::BF16, "tsl_f64_to_f32_odd("),
    ] {
        let kernel = op_kernel(from, Op::Cast(to), to, 1);
        let shader = render_valid(&kernel, &FULL).unwrap();
        let body = entry_body(&shader);
        assert!(
            body.contains(helper) && !body.contains("= f64(") && !body.contains("= f32("),
            "{from} -> {to}: {}",
            shader.source
        );
    }
}
