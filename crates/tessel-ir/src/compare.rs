//! Comparing two float buffers on their device: the kernel the planner's measurement
//! runs to check a candidate's output against its reference without copying either to
//! the host.
//!
//! [`differences`] reduces two buffers `x` (the reference) and `y` of one float dtype to
//! two numbers per workgroup: the largest finite `|x[i]|`, and the largest difference
//! `|x[i] - y[i]|`, where equal values (both NaN, or the same infinity) differ by 0 and a
//! NaN against a number differs by infinity. [`Differences::read`] folds the workgroups'
//! numbers on the host. Two buffers agree within a tolerance relative to the reference's
//! largest magnitude exactly when `worst <= tolerance * largest`: one launch and a read of
//! a few kilobytes, where the host comparison reads both buffers whole (the gradient of a
//! cross-entropy over a 50k vocabulary is 823 MB).
//!
//! ```
//! use tessel_ir::compare;
//! use tessel_shape::DType;
//!
//! let kernel = compare::differences(DType::BF16).unwrap();
//! assert_eq!(kernel.params.len(), 4); // x, y, the per-workgroup summary, the length
//! ```

// `VerifyError` is what `KernelBuilder::build` returns; its size is the verifier's to choose.
#![allow(clippy::result_large_err)]

use tessel_shape::{BinaryOp, DType, Expr, Scalar, TernaryOp, UnaryOp, Var};

use crate::builder::KernelBuilder;
use crate::kernel::{Access, Kernel};
use crate::verify::VerifyError;

/// Workgroups of a [`differences`] launch: each strides over the buffers, so any length
/// takes one launch.
pub const GROUPS: usize = 512;

/// Invocations per workgroup (a power of two: the tree reduction halves it).
const LOCAL: usize = 256;

/// The longest buffers [`differences`] compares: its indices are `i32`.
pub const MAX_LEN: usize = i32::MAX as usize - GROUPS * LOCAL;

/// The length variable of every [`differences`] kernel: bind it to the element count at
/// launch.
///
/// # Panics
///
/// Never: the bounds are valid constants.
pub fn length() -> Var {
    Var::new("compared", 0, MAX_LEN as i64).expect("0 <= MAX_LEN")
}

/// The dtype [`differences`] computes and summarizes in: `f64` for `f64` buffers, `f32`
/// for the narrower floats.
pub fn summary_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// The kernel comparing two `dtype` buffers (a float dtype). See the module docs.
///
/// - Parameters: `x: dtype[n] read`, `y: dtype[n] read`,
///   `summary: w[2 * GROUPS] write` with `w = summary_dtype(dtype)` (workgroup `g`
///   writes its largest finite `|x|` at `2g` and its largest difference at `2g + 1`), then
///   the dim `n` ([`length`]).
/// - Grid: [`GROUPS`] workgroups of 256 invocations; each invocation visits every
///   `GROUPS * 256`-th element.
pub fn differences(dtype: DType) -> Result<Kernel, VerifyError> {
    const INDEX: DType = DType::I32;
    let wide = summary_dtype(dtype);
    let n = Expr::from(length());
    let total = (GROUPS * LOCAL) as i64;
    let mut kb = KernelBuilder::new(&format!("differences_{}", dtype.name()));
    let x = kb.buffer("x", dtype, n, Access::Read);
    let y = kb.buffer("y", dtype, n, Access::Read);
    let summary = kb.buffer("summary", wide, (2 * GROUPS) as i64, Access::Write);
    kb.grid([GROUPS as i64, 1, 1], [LOCAL as i64, 1, 1]);
    let zero_w = kb.push(crate::kernel::Inst::Const(Scalar::zero(wide)));
    let inf = kb.push(crate::kernel::Inst::Const(
        Scalar::F64(f64::INFINITY).cast(wide),
    ));
    let acc = kb.reg(wide, 2);
    let (zero, one) = (kb.constant_as(0, INDEX), kb.constant_as(1, INDEX));
    kb.store(acc, zero, zero_w);
    kb.store(acc, one, zero_w);
    let gid = kb.global_id(0, INDEX);
    let n_v = kb.expr(n, INDEX);
    let chunks = kb.expr(n.ceil_div(total), INDEX);
    let total_v = kb.constant_as(total, INDEX);
    kb.range(zero, chunks, |kb, c| {
        let i = kb.ternary(TernaryOp::MulAdd, c, total_v, gid);
        let inside = kb.lt(i, n_v);
        kb.if_(inside, |kb| {
            let p = kb.load(x, i);
            let p = kb.cast(p, wide);
            let q = kb.load(y, i);
            let q = kb.cast(q, wide);
            // Largest finite magnitude: NaN and infinities are not finite.
            let size = kb.unary(UnaryOp::Abs, p);
            let finite = kb.lt(size, inf);
            let largest = kb.load(acc, zero);
            let larger = kb.binary(BinaryOp::Max, largest, size);
            let largest = kb.select(finite, larger, largest);
            kb.store(acc, zero, largest);
            // Equal values (the same infinity included) and two NaNs differ by 0; a NaN
            // against anything else by infinity.
            let equal = kb.binary(BinaryOp::Eq, p, q);
            let p_nan = kb.unary(UnaryOp::IsNan, p);
            let q_nan = kb.unary(UnaryOp::IsNan, q);
            let both_nan = kb.binary(BinaryOp::And, p_nan, q_nan);
            let same = kb.binary(BinaryOp::Or, equal, both_nan);
            let d = kb.sub(p, q);
            let d = kb.unary(UnaryOp::Abs, d);
            let d_nan = kb.unary(UnaryOp::IsNan, d);
            let d = kb.select(d_nan, inf, d);
            let d = kb.select(same, zero_w, d);
            let worst = kb.load(acc, one);
            let worst = kb.binary(BinaryOp::Max, worst, d);
            kb.store(acc, one, worst);
        });
    });
    // Tree reduction of both numbers in local memory (see `samples::tree_reduce`).
    let scratch = kb.local(wide, 2 * LOCAL);
    let lid = kb.local_id(0, INDEX);
    let local_v = kb.constant_as(LOCAL as i64, INDEX);
    let upper = kb.add(lid, local_v);
    let largest = kb.load(acc, zero);
    kb.store(scratch, lid, largest);
    let worst = kb.load(acc, one);
    kb.store(scratch, upper, worst);
    kb.barrier();
    let steps = kb.constant_as(i64::from(LOCAL.trailing_zeros()), INDEX);
    kb.range(zero, steps, |kb, step| {
        let shift = kb.add(step, one);
        let stride = kb.binary(BinaryOp::Shr, local_v, shift);
        let active = kb.lt(lid, stride);
        kb.if_(active, |kb| {
            for base in [lid, upper] {
                let partner = kb.add(base, stride);
                let mine = kb.load(scratch, base);
                let theirs = kb.load(scratch, partner);
                let m = kb.binary(BinaryOp::Max, mine, theirs);
                kb.store(scratch, base, m);
            }
        });
        kb.barrier();
    });
    let first = kb.binary(BinaryOp::Eq, lid, zero);
    kb.if_(first, |kb| {
        let g = kb.group_id(0, INDEX);
        let two = kb.constant_as(2, INDEX);
        let at = kb.mul(g, two);
        let largest = kb.load(scratch, zero);
        kb.store(summary, at, largest);
        let at = kb.add(at, one);
        let worst = kb.load(scratch, local_v);
        kb.store(summary, at, worst);
    });
    kb.build()
}

/// What a [`differences`] launch found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Differences {
    /// The reference's largest finite magnitude (0 where it has none).
    pub largest: f64,
    /// The largest difference between the two buffers (infinite where a NaN meets a
    /// number, or an infinity anything but itself).
    pub worst: f64,
}

impl Differences {
    /// Folds the `summary` buffer of a [`differences`] launch on `dtype` buffers (its raw
    /// bytes, `2 * GROUPS` elements of [`summary_dtype`]).
    pub fn read(summary: &[u8], dtype: DType) -> Differences {
        let wide = summary_dtype(dtype);
        let values: Vec<f64> = summary
            .chunks_exact(wide.size_bytes())
            .map(|b| match wide {
                DType::F64 => f64::from_le_bytes(b.try_into().unwrap_or_default()),
                _ => f64::from(f32::from_le_bytes(b.try_into().unwrap_or_default())),
            })
            .collect();
        let fold = |parity: usize| {
            values
                .iter()
                .skip(parity)
                .step_by(2)
                .fold(0.0f64, |a, &b| a.max(b))
        };
        Differences {
            largest: fold(0),
            worst: fold(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp;
    use tessel_shape::Bindings;

    #[test]
    fn the_interpreter_finds_the_largest_difference() {
        let x: Vec<f32> = vec![1.0, -3.0, f32::NAN, f32::INFINITY, 2.0, 0.5];
        let y: Vec<f32> = vec![1.0, -2.5, f32::NAN, f32::INFINITY, 2.0, 0.25];
        let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
        let kernel = differences(DType::F32).unwrap();
        let dims = Bindings::new().with(length(), x.len() as i64);
        let run = |y: &[f32]| {
            let (mut a, mut b, mut s) = (bytes(&x), bytes(y), vec![0; 2 * GROUPS * 4]);
            interp::run(&kernel, &mut [&mut a, &mut b, &mut s], &dims).unwrap();
            Differences::read(&s, DType::F32)
        };
        assert_eq!(
            run(&y),
            Differences {
                largest: 3.0,
                worst: 0.5
            }
        );
        // A NaN against a number is as far apart as it gets.
        let y = [1.0, -3.0, 0.0, f32::INFINITY, 2.0, 0.5];
        assert_eq!(run(&y).worst, f64::INFINITY);
    }
}
