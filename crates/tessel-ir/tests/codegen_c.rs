//! The C dialect's output for the sample kernels, as snapshots, and a syntax check of each
//! with the system C compiler when there is one. Whether the code *computes* the right
//! thing is tested by running it: `tessel-cpu`'s tests compare it with the interpreter.

use std::path::PathBuf;
use std::process::Command;

use tessel_ir::codegen::{self, C, CStyle, CodegenError, Launch};
use tessel_ir::{Access, Inst, Kernel, KernelBuilder, Mem, samples};
use tessel_shape::{DType, Expr, Var};

#[track_caller]
fn check(name: &str, kernel: &Kernel) {
    let source = codegen::render(kernel, &C).unwrap();
    insta::assert_snapshot!(name, source);
}

/// out[i..i+4] = a[i..i+4] * 2 as one 4-lane vector per invocation, through a cast to f64
/// and back, to show vector values.
fn vector_scale() -> Kernel {
    let mut kb = KernelBuilder::new("vector_scale");
    let a = kb.buffer("a", DType::F32, 256, Access::Read);
    let out = kb.buffer("out", DType::F32, 256, Access::Write);
    kb.grid([1, 1, 1], [64, 1, 1]);
    let lid = kb.local_id(0, DType::I32);
    let four = kb.constant_as(4, DType::I32);
    let i = kb.mul(lid, four);
    let x = kb.load_vec(a, i, 4);
    let wide = kb.cast(x, DType::F64);
    let two = kb.constant(2.0f64);
    let twos = kb.vectorize(vec![two; 4]);
    let y = kb.mul(wide, twos);
    let y = kb.cast(y, DType::F32);
    kb.store(out, i, y);
    kb.build().unwrap()
}

fn samples() -> Vec<(&'static str, Kernel)> {
    let n = Var::new("n", 1, 1 << 20).unwrap();
    vec![
        (
            "vector_add_f32",
            samples::vector_add(DType::F32, 1000, 64).unwrap(),
        ),
        (
            "vector_add_f16",
            samples::vector_add(DType::F16, 1000, 64).unwrap(),
        ),
        (
            "vector_add_bool",
            samples::vector_add(DType::Bool, 1000, 64).unwrap(),
        ),
        (
            "vector_add_i8",
            samples::vector_add(DType::I8, 1000, 64).unwrap(),
        ),
        (
            "permuted_copy",
            samples::permuted_copy([4, 8, 16], [2, 0, 1]).unwrap(),
        ),
        ("row_sum", samples::row_sum(100, 37, DType::F32).unwrap()),
        ("tree_reduce", samples::tree_reduce(1000, 64).unwrap()),
        (
            "tiled_matmul",
            samples::tiled_matmul(64, 64, 64, 16).unwrap(),
        ),
        (
            "dynamic_vector_add",
            samples::dynamic_vector_add(n, 64).unwrap(),
        ),
        ("vector_scale", vector_scale()),
    ]
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
fn vector_add_bool() {
    check(
        "vector_add_bool",
        &samples::vector_add(DType::Bool, 1000, 64).unwrap(),
    );
}

#[test]
fn vector_add_i8() {
    check(
        "vector_add_i8",
        &samples::vector_add(DType::I8, 1000, 64).unwrap(),
    );
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
fn vector_values() {
    check("vector_scale", &vector_scale());
}

/// A made-up GPU-style dialect: the same emitter prints one invocation per thread.
#[test]
fn native_launch() {
    const GPU: CStyle = CStyle {
        name: "test-gpu",
        launch: Launch::Native,
        kernel_prefix: "__kernel ",
        buffer_qualifier: "__global ",
        local_qualifier: "__local ",
        barrier: "barrier(CLK_LOCAL_MEM_FENCE);",
        group_id: |axis| format!("get_group_id({axis})"),
        local_id: |axis| format!("get_local_id({axis})"),
        ..C
    };
    let kernel = samples::tree_reduce(1000, 64).unwrap();
    insta::assert_snapshot!(
        "tree_reduce_native",
        codegen::render(&kernel, &GPU).unwrap()
    );
}

#[test]
fn invalid_kernels_are_not_rendered() {
    let mut kb = KernelBuilder::new("broken");
    let a = kb.buffer("a", DType::F32, 4, Access::Read);
    let i = kb.constant_as(0, DType::I32);
    let x = kb.load(a, i);
    // Stores to a read-only buffer.
    kb.push(Inst::Store {
        mem: Mem::Global(0),
        index: i,
        value: x,
    });
    let err = codegen::render(&kb.finish_unverified(), &C).unwrap_err();
    assert!(matches!(err, CodegenError::Verify(_)), "{err}");
    assert!(err.to_string().contains("broken"), "{err}");
}

#[test]
fn missing_types_are_named() {
    const NO_F64: CStyle = CStyle {
        name: "no-f64",
        type_name: |d| {
            if d == DType::F64 {
                None
            } else {
                codegen::c_type_name(d)
            }
        },
        ..C
    };
    let err = codegen::render(&vector_scale(), &NO_F64).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel `vector_scale`: failed to render cast on f64 in the no-f64 dialect"
    );
}

#[test]
fn values_across_barriers_need_constant_local_sizes() {
    let n = Var::new("l", 1, 64).unwrap();
    let mut kb = KernelBuilder::new("symbolic_local");
    let out = kb.buffer("out", DType::I32, 64, Access::Write);
    kb.grid(
        [1, 1, 1],
        [Expr::from(n), Expr::constant(1), Expr::constant(1)],
    );
    let lid = kb.local_id(0, DType::I32);
    let one = kb.constant_as(1, DType::I32);
    let x = kb.add(lid, one);
    let y = kb.cast(x, DType::F32);
    kb.barrier();
    let z = kb.cast(y, DType::I32);
    kb.store(out, lid, z);
    let kernel = kb.build().unwrap();
    let err = codegen::render(&kernel, &C).unwrap_err();
    assert!(matches!(err, CodegenError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("constant local sizes"), "{err}");
}

/// The first of `cc`, `gcc`, `clang` that runs, if any.
fn c_compiler() -> Option<&'static str> {
    ["cc", "gcc", "clang"].into_iter().find(|cc| {
        Command::new(cc)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn every_sample_compiles() {
    let Some(cc) = c_compiler() else {
        eprintln!("no C compiler found: skipping the syntax check");
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("codegen_c");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, kernel) in samples() {
        let path = dir.join(format!("{name}.c"));
        std::fs::write(&path, codegen::render(&kernel, &C).unwrap()).unwrap();
        let out = Command::new(cc)
            .args([
                "-std=c11",
                "-fsyntax-only",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-Wno-unused",
            ])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name} does not compile:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
