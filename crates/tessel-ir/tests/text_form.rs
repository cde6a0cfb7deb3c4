//! Snapshots of the text form of every sample kernel, at small sizes: a change to the
//! samples, the builder or the printer shows up here as a reviewable diff.

use tessel_ir::samples;
use tessel_shape::{DType, Var};

#[test]
fn vector_add() {
    let kernel = samples::vector_add(DType::F32, 100, 32).unwrap();
    insta::assert_snapshot!(format!("{kernel}"));
}

#[test]
fn vector_add_bool() {
    let kernel = samples::vector_add(DType::Bool, 8, 8).unwrap();
    insta::assert_snapshot!(format!("{kernel}"));
}

#[test]
fn permuted_copy() {
    let kernel = samples::permuted_copy([2, 3, 4], [2, 0, 1]).unwrap();
    insta::assert_snapshot!(format!("{kernel}"));
}

#[test]
fn row_sum() {
    let kernel = samples::row_sum(4, 8, DType::I32).unwrap();
    insta::assert_snapshot!(format!("{kernel}"));
}

#[test]
fn tree_reduce() {
    let kernel = samples::tree_reduce(100, 16).unwrap();
    insta::assert_snapshot!(format!("{kernel}"));
}

#[test]
fn tiled_matmul() {
    let kernel = samples::tiled_matmul(8, 12, 16, 4).unwrap();
    insta::assert_snapshot!(format!("{kernel}"));
}

#[test]
fn dynamic_vector_add() {
    let n = Var::new("n", 1, 4096).unwrap();
    let kernel = samples::dynamic_vector_add(n, 64).unwrap();
    insta::assert_snapshot!(format!("{kernel}"));
}

#[test]
fn rejects_unusable_arguments() {
    let msg = |e: tessel_ir::VerifyError| e.to_string();
    assert_eq!(
        msg(samples::tiled_matmul(30, 32, 32, 8).unwrap_err()),
        "kernel `tiled_matmul`: parameter error: m = 30 is not a multiple of tile = 8"
    );
    assert_eq!(
        msg(samples::tree_reduce(100, 12).unwrap_err()),
        "kernel `tree_reduce`: parameter error: local = 12 must be a power of two"
    );
    assert_eq!(
        msg(samples::permuted_copy([2, 3, 4], [0, 0, 1]).unwrap_err()),
        "kernel `permuted_copy`: parameter error: perm [0, 0, 1] is not a permutation of [0, 1, 2]"
    );
    assert_eq!(
        msg(samples::vector_add(DType::F32, 0, 64).unwrap_err()),
        "kernel `vector_add`: parameter error: n must be positive"
    );
    assert_eq!(
        msg(samples::vector_add(DType::F32, 1 << 31, 64).unwrap_err()),
        "kernel `vector_add`: parameter error: n = 2147483648 does not fit the i32 index arithmetic"
    );
    let negative = Var::new("m", -1, 10).unwrap();
    assert!(samples::dynamic_vector_add(negative, 64).is_err());
    let huge = Var::new("h", 0, i64::from(i32::MAX)).unwrap();
    assert!(samples::dynamic_vector_add(huge, 64).is_err());
}

#[test]
fn the_text_form_reads_back() {
    use tessel_ir::{AtomicOp, Kernel};
    let kernels = [
        samples::vector_add(DType::F32, 100, 32).unwrap(),
        samples::vector_add(DType::Bool, 8, 8).unwrap(),
        samples::vector_add(DType::BF16, 64, 32).unwrap(),
        samples::upcast_add(DType::F16, 64, 4, 8).unwrap(),
        samples::permuted_copy([2, 3, 4], [2, 0, 1]).unwrap(),
        samples::row_sum(4, 8, DType::I32).unwrap(),
        samples::tree_reduce(100, 16).unwrap(),
        samples::tiled_matmul(8, 12, 16, 4).unwrap(),
        samples::scatter(AtomicOp::Add, DType::F32, 64, 8).unwrap(),
        samples::scatter(AtomicOp::Max, DType::U32, 64, 8).unwrap(),
        samples::dynamic_vector_add(Var::new("n", 1, 4096).unwrap(), 64).unwrap(),
    ];
    for kernel in kernels {
        let text = kernel.to_string();
        let back = Kernel::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(back, kernel, "{text}");
        assert_eq!(back.to_string(), text);
    }
}

#[test]
fn the_text_form_refuses_what_it_cannot_read_back() {
    use tessel_ir::Kernel;
    let n = Var::new("n", 1, 4096).unwrap();
    let text = samples::dynamic_vector_add(n, 64).unwrap().to_string();
    let e = Kernel::parse(&text.replace("f32[n] read", "f32[m] read")).unwrap_err();
    assert_eq!(e.line, 1);
    assert!(
        e.to_string().contains("not a size of the kernel's dims"),
        "{e}"
    );

    let text = samples::vector_add(DType::F32, 100, 32)
        .unwrap()
        .to_string();
    let broken = text.replacen(" add ", " frobnicate ", 1);
    let e = Kernel::parse(&broken).unwrap_err();
    assert!(
        e.to_string().contains("unknown instruction `frobnicate`"),
        "{e}"
    );
    assert!(e.line > 2, "{e}");
    let e = Kernel::parse(&text.replacen("%1 =", "%7 =", 1)).unwrap_err();
    assert!(e.to_string().contains("defined as instruction 1"), "{e}");
    assert!(Kernel::parse("").is_err());
}
