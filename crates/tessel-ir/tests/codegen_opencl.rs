//! The OpenCL C dialect's output for the sample kernels, as snapshots, and the dialect's
//! refusals on devices without `double`. Whether the code *computes* the right thing is
//! tested by running it: `tessel-opencl`'s tests compare it with the interpreter on every
//! OpenCL device found.

use tessel_ir::codegen::{self, CodegenError, OPENCL, OPENCL_NO_FP64};
use tessel_ir::{Access, Kernel, KernelBuilder, samples};
use tessel_shape::{DType, TernaryOp, UnaryOp, Var};

#[track_caller]
fn check(name: &str, kernel: &Kernel) {
    let source = codegen::render(kernel, &OPENCL).unwrap();
    insta::assert_snapshot!(name, source);
}

/// One op on one dtype, `out[i] = op(x[i], y[i], z[i])`, for the refusal tests.
fn one_op(
    dtype: DType,
    op: impl FnOnce(&mut KernelBuilder, [tessel_ir::Value; 3]) -> tessel_ir::Value,
) -> Kernel {
    let mut kb = KernelBuilder::new("one_op");
    let inputs = ["x", "y", "z"].map(|n| kb.buffer(n, dtype, 64, Access::Read));
    let out = kb.buffer("out", dtype, 64, Access::Write);
    kb.grid([1, 1, 1], [64, 1, 1]);
    let i = kb.local_id(0, DType::I32);
    let values = inputs.map(|b| kb.load(b, i));
    let r = op(&mut kb, values);
    kb.store(out, i, r);
    kb.build().unwrap()
}

#[test]
fn vector_add_f32() {
    check(
        "vector_add_f32",
        &samples::vector_add(DType::F32, 1000, 64).unwrap(),
    );
}

#[test]
fn vector_add_f16() {
    check(
        "vector_add_f16",
        &samples::vector_add(DType::F16, 1000, 64).unwrap(),
    );
}

#[test]
fn vector_add_bf16() {
    check(
        "vector_add_bf16",
        &samples::vector_add(DType::BF16, 1000, 64).unwrap(),
    );
}

#[test]
fn vector_add_bool() {
    check(
        "vector_add_bool",
        &samples::vector_add(DType::Bool, 1000, 64).unwrap(),
    );
}

#[test]
fn vector_add_i64() {
    check(
        "vector_add_i64",
        &samples::vector_add(DType::I64, 1000, 64).unwrap(),
    );
}

#[test]
fn vector_add_f64() {
    check(
        "vector_add_f64",
        &samples::vector_add(DType::F64, 1000, 64).unwrap(),
    );
}

#[test]
fn upcast_kernels_access_whole_vectors() {
    let kernel = samples::upcast_add(DType::F32, 1024, 4, 64).unwrap();
    let source = codegen::render(&kernel, &OPENCL).unwrap();
    for needle in [
        "typedef struct __attribute__((aligned(16))) {",
        "*(__global const tsl_f32x4 *)(b0_a + ",
        "*(__global tsl_f32x4 *)(b2_out + ",
    ] {
        assert!(source.contains(needle), "no `{needle}` in\n{source}");
    }
}

#[test]
fn permuted_copy() {
    check(
        "permuted_copy",
        &samples::permuted_copy([4, 8, 16], [2, 0, 1]).unwrap(),
    );
}

#[test]
fn row_sum() {
    check("row_sum", &samples::row_sum(100, 37, DType::F32).unwrap());
}

#[test]
fn tree_reduce() {
    check("tree_reduce", &samples::tree_reduce(1000, 64).unwrap());
}

#[test]
fn tiled_matmul() {
    check(
        "tiled_matmul",
        &samples::tiled_matmul(64, 64, 64, 16).unwrap(),
    );
}

#[test]
fn dynamic_vector_add() {
    let n = Var::new("n", 1, 1 << 20).unwrap();
    check(
        "dynamic_vector_add",
        &samples::dynamic_vector_add(n, 64).unwrap(),
    );
}

#[test]
fn without_fp64_doubles_are_refused_by_name() {
    let err = codegen::render(
        &samples::vector_add(DType::F64, 1000, 64).unwrap(),
        &OPENCL_NO_FP64,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel `vector_add`: failed to render value on f64 in the opencl-no-fp64 dialect"
    );
    // `erf` on f32 is OpenCL C's own, so it needs no doubles.
    let erf = one_op(DType::F32, |kb, [x, _, _]| kb.unary(UnaryOp::Erf, x));
    let source = codegen::render(&erf, &OPENCL_NO_FP64).unwrap();
    assert!(
        source.contains("erf(") && !source.contains("double"),
        "{source}"
    );
    // Ops the reference computes through f64 on narrower dtypes.
    let mad = one_op(DType::F16, |kb, [x, y, z]| {
        kb.ternary(TernaryOp::MulAdd, x, y, z)
    });
    let err = codegen::render(&mad, &OPENCL_NO_FP64).unwrap_err();
    let CodegenError::UnsupportedOp { op, dtype, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!((op.as_str(), *dtype), ("mad (computed in f64)", DType::F16));
    // The same kernel renders where the device has doubles.
    codegen::render(&mad, &OPENCL).unwrap();
    // Everything else renders without doubles.
    for dtype in DType::ALL.into_iter().filter(|&d| d != DType::F64) {
        let kernel = samples::vector_add(dtype, 100, 64).unwrap();
        let source = codegen::render(&kernel, &OPENCL_NO_FP64).unwrap();
        assert!(!source.contains("double"), "{dtype}:\n{source}");
        assert!(!source.contains("cl_khr_fp64"), "{dtype}:\n{source}");
    }
}

#[test]
fn sources_use_no_c_library_names() {
    // OpenCL C has no <stdint.h>: every type name must come from the dialect.
    let n = Var::new("n", 1, 1 << 20).unwrap();
    let kernels = [
        samples::vector_add(DType::F16, 100, 64).unwrap(),
        samples::vector_add(DType::BF16, 100, 64).unwrap(),
        samples::vector_add(DType::U16, 100, 64).unwrap(),
        samples::permuted_copy([4, 8, 16], [2, 0, 1]).unwrap(),
        samples::tiled_matmul(64, 64, 64, 16).unwrap(),
        samples::dynamic_vector_add(n, 64).unwrap(),
        one_op(DType::F32, |kb, [x, _, _]| kb.unary(UnaryOp::Erf, x)),
        one_op(DType::BF16, |kb, [x, y, z]| {
            kb.ternary(TernaryOp::MulAdd, x, y, z)
        }),
        one_op(DType::F64, |kb, [x, _, _]| {
            let h = kb.cast(x, DType::F16);
            let back = kb.cast(h, DType::I64);
            kb.cast(back, DType::F64)
        }),
    ];
    for kernel in &kernels {
        let source = codegen::render(kernel, &OPENCL).unwrap();
        for banned in ["int8_t", "int16_t", "int32_t", "int64_t", "#include"] {
            assert!(!source.contains(banned), "{banned} in\n{source}");
        }
    }
}
