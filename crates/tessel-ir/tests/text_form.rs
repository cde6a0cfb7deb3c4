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
