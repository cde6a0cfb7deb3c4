//! Elementwise reductions of little-endian element buffers: what rank 0 computes from every
//! rank's contribution, in rank order (so every run reduces in the same order).

use half::{bf16, f16};
use tessel_tensor::{DType, Error, Result};

/// How an all-reduce combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The sum divided by the world size (floats only).
    Mean,
    /// The largest value (NaN wins, as in `torch.maximum`).
    Max,
    /// The smallest value (NaN wins).
    Min,
}

impl ReduceOp {
    pub(crate) fn code(self) -> u64 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Mean => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
        }
    }
}

/// Element types a collective moves; reductions compute in `f32` for the half types
/// (rounded once at the end), in the dtype itself otherwise.
pub(crate) fn check_dtype(op: &'static str, dtype: DType, reduce: Option<ReduceOp>) -> Result<()> {
    let reducible = matches!(
        dtype,
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 | DType::I32 | DType::I64
    );
    if reduce.is_some() && !reducible {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "cannot reduce {dtype} tensors; reduce f32, f64, bf16, f16, i32 or i64 (cast first)"
            ),
        });
    }
    if reduce == Some(ReduceOp::Mean) && !dtype.is_float() {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("ReduceOp::Mean needs a float tensor, got {dtype}; use Sum and divide"),
        });
    }
    Ok(())
}

/// Combines `parts` (one buffer per rank, in rank order, each of `dtype` elements) by `op`.
/// `parts` must be non-empty and of one length.
pub(crate) fn reduce(dtype: DType, op: ReduceOp, parts: &[&[u8]]) -> Vec<u8> {
    let ranks = parts.len();
    match dtype {
        DType::F32 => fold::<f32, 4>(
            parts,
            f32::from_le_bytes,
            f32::to_le_bytes,
            &floats(op, ranks),
        ),
        DType::F64 => fold::<f64, 8>(
            parts,
            f64::from_le_bytes,
            f64::to_le_bytes,
            &floats(op, ranks),
        ),
        DType::BF16 => fold::<f32, 2>(
            parts,
            |b| bf16::from_le_bytes(b).to_f32(),
            |x| bf16::from_f32(x).to_le_bytes(),
            &floats(op, ranks),
        ),
        DType::F16 => fold::<f32, 2>(
            parts,
            |b| f16::from_le_bytes(b).to_f32(),
            |x| f16::from_f32(x).to_le_bytes(),
            &floats(op, ranks),
        ),
        DType::I32 => fold::<i64, 4>(
            parts,
            |b| i64::from(i32::from_le_bytes(b)),
            |x| (x as i32).to_le_bytes(),
            &integers(op),
        ),
        DType::I64 => fold::<i64, 8>(parts, i64::from_le_bytes, i64::to_le_bytes, &integers(op)),
        _ => {
            debug_assert!(false, "check_dtype admits only reducible dtypes");
            parts[0].to_vec()
        }
    }
}

/// How values combine, and the divisor of a mean.
struct Combine<A> {
    with: fn(ReduceOp, A, A) -> A,
    op: ReduceOp,
    divisor: Option<A>,
}

/// Element `i` of every part combined in rank order, written back as bytes.
fn fold<A: Copy + std::ops::Div<Output = A>, const W: usize>(
    parts: &[&[u8]],
    read: impl Fn([u8; W]) -> A,
    write: impl Fn(A) -> [u8; W],
    combine: &Combine<A>,
) -> Vec<u8> {
    let at = |part: &[u8], i: usize| read(part[i * W..(i + 1) * W].try_into().expect("W bytes"));
    let n = parts[0].len() / W;
    let mut out = Vec::with_capacity(n * W);
    for i in 0..n {
        let acc = parts[1..].iter().fold(at(parts[0], i), |acc, part| {
            (combine.with)(combine.op, acc, at(part, i))
        });
        let value = combine.divisor.map_or(acc, |d| acc / d);
        out.extend_from_slice(&write(value));
    }
    out
}

/// Accumulator arithmetic for the float folds.
trait Float: Copy + PartialOrd + std::ops::Add<Output = Self> + std::ops::Div<Output = Self> {
    fn is_nan(self) -> bool;
    fn from_count(n: usize) -> Self;
}

impl Float for f32 {
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn from_count(n: usize) -> Self {
        n as f32
    }
}

impl Float for f64 {
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    fn from_count(n: usize) -> Self {
        n as f64
    }
}

/// Float combination: sums, or the max/min with NaN winning (as `torch.maximum`).
fn floats<A: Float>(op: ReduceOp, ranks: usize) -> Combine<A> {
    fn with<A: Float>(op: ReduceOp, acc: A, x: A) -> A {
        let nan = if acc.is_nan() {
            Some(acc)
        } else {
            x.is_nan().then_some(x)
        };
        match (op, nan) {
            (ReduceOp::Sum | ReduceOp::Mean, _) => acc + x,
            (_, Some(nan)) => nan,
            (ReduceOp::Max, None) => {
                if x > acc {
                    x
                } else {
                    acc
                }
            }
            (ReduceOp::Min, None) => {
                if x < acc {
                    x
                } else {
                    acc
                }
            }
        }
    }
    Combine {
        with,
        op,
        divisor: (op == ReduceOp::Mean).then(|| A::from_count(ranks)),
    }
}

/// Integer combination, wrapping as integer tensor arithmetic does (`Mean` is refused
/// before any communication).
fn integers(op: ReduceOp) -> Combine<i64> {
    fn with(op: ReduceOp, acc: i64, x: i64) -> i64 {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => acc.wrapping_add(x),
            ReduceOp::Max => acc.max(x),
            ReduceOp::Min => acc.min(x),
        }
    }
    Combine {
        with,
        op,
        divisor: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn reductions_in_rank_order() {
        let (a, b, c) = (
            bytes(&[1.0, 5.0, f32::NAN]),
            bytes(&[2.0, -1.0, 0.0]),
            bytes(&[4.0, 3.0, 1.0]),
        );
        let parts = [a.as_slice(), b.as_slice(), c.as_slice()];
        let read = |v: Vec<u8>| -> Vec<f32> {
            v.chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let sum = read(reduce(DType::F32, ReduceOp::Sum, &parts));
        assert_eq!(&sum[..2], &[7.0, 7.0]);
        assert!(sum[2].is_nan());
        let mean = read(reduce(DType::F32, ReduceOp::Mean, &parts));
        assert_eq!(&mean[..2], &[7.0 / 3.0, 7.0 / 3.0]);
        let max = read(reduce(DType::F32, ReduceOp::Max, &parts));
        assert_eq!(&max[..2], &[4.0, 5.0]);
        assert!(max[2].is_nan());
        let min = read(reduce(DType::F32, ReduceOp::Min, &parts));
        assert_eq!(&min[..2], &[1.0, -1.0]);
        // bf16 sums in f32 and rounds once: 256 + 1 + 1 = 258 exactly, where rounding
        // after each addition would give 256.
        let h = |x: f32| bf16::from_f32(x).to_le_bytes().to_vec();
        let (x, y, z) = (h(256.0), h(1.0), h(1.0));
        let out = reduce(DType::BF16, ReduceOp::Sum, &[&x, &y, &z]);
        assert_eq!(bf16::from_le_bytes([out[0], out[1]]).to_f32(), 258.0);
        let i = |v: i64| v.to_le_bytes().to_vec();
        let out = reduce(DType::I64, ReduceOp::Sum, &[&i(i64::MAX), &i(1)]);
        assert_eq!(i64::from_le_bytes(out.try_into().unwrap()), i64::MIN);
        assert!(check_dtype("all_reduce", DType::I32, Some(ReduceOp::Mean)).is_err());
        assert!(check_dtype("all_reduce", DType::Bool, Some(ReduceOp::Sum)).is_err());
        assert!(check_dtype("broadcast", DType::Bool, None).is_ok());
    }
}
