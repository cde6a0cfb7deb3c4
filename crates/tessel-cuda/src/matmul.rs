//! A [`Matmul`] as cuBLAS runs it: the row-major product turned into one column-major GEMM
//! call, and every check that comes before the call. Nothing here touches the device, so
//! the mapping is unit-tested on any machine against a column-major GEMM written in Rust
//! with cuBLAS's semantics.
//!
//! cuBLAS is column-major. A row-major `r × c` matrix with row stride `c`, read
//! column-major, is its transpose: `c × r` with leading dimension `c`. So instead of the
//! row-major `C = op(A)·op(B)` (`m × n`), cuBLAS computes the column-major
//! `Cᵀ = op(B)ᵀ·op(A)ᵀ` (`n × m`, leading dimension `n`), which is the same memory. The
//! operands swap places and each keeps its own transpose flag:
//!
//! | operand | stored (row-major) | read column-major | wanted | op | ld |
//! |---|---|---|---|---|---|
//! | rhs | `k × n` | `Bᵀ`, `n × k` | `Bᵀ` | `N` | `n` |
//! | rhs, transposed | `n × k` | `B`, `k × n` | `Bᵀ` | `T` | `k` |
//! | lhs | `m × k` | `Aᵀ`, `k × m` | `Aᵀ` | `N` | `k` |
//! | lhs, transposed | `k × m` | `A`, `m × k` | `Aᵀ` | `T` | `m` |
//!
//! That is `gemm(transa = rhs_transposed, transb = lhs_transposed, m' = n, n' = m, k' = k,
//! A' = rhs, B' = lhs, C' = out, ldc = n)`, with batch strides `rhs_batch_stride`,
//! `lhs_batch_stride` and `m·n` (a stride of 0 reads one matrix for every batch).

use tessel_ir::{BackendError, Matmul, MatmulSizes};
use tessel_shape::DType;

/// The element type of a GEMM cuBLAS runs for this backend. Every one accumulates in at
/// least `f32`, as the generated kernels do, so a vendor program and a generated one compute
/// the same sums up to their order. Integers have no vendor program here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Precision {
    /// `cublasSgemm`: `f32` in, `f32` accumulated, `f32` out.
    F32,
    /// `cublasDgemm`.
    F64,
    /// `cublasGemmEx` with `CUDA_R_16F` operands and output, `CUBLAS_COMPUTE_32F`: tensor
    /// cores, `f32` accumulation, one rounding to `f16` at the end.
    F16,
    /// `cublasGemmEx` with `CUDA_R_16BF` operands and output, `CUBLAS_COMPUTE_32F`.
    BF16,
    /// `cublasGemmEx` with `CUDA_R_32F` operands and output,
    /// `CUBLAS_COMPUTE_32F_FAST_TF32`: operands rounded to TF32 on tensor cores, `f32`
    /// accumulation. Only where the matmul allows it ([`Matmul::allow_tf32`]).
    Tf32,
}

impl Precision {
    /// The precision of `op`, if cuBLAS runs it here.
    pub(crate) fn of(op: &Matmul) -> Option<Precision> {
        match op.dtype {
            DType::F32 if op.allow_tf32 => Some(Precision::Tf32),
            DType::F32 => Some(Precision::F32),
            DType::F64 => Some(Precision::F64),
            DType::F16 => Some(Precision::F16),
            DType::BF16 => Some(Precision::BF16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub(crate) fn size_bytes(self) -> usize {
        match self {
            Precision::F32 | Precision::Tf32 => 4,
            Precision::F64 => 8,
            Precision::F16 | Precision::BF16 => 2,
        }
    }
}

/// One cuBLAS GEMM's arguments, in cuBLAS's column-major terms and in elements: `batch`
/// products `C'[p] = op_a(A'[p])·op_b(B'[p])`, where `A'` is the matmul's rhs, `B'` its lhs
/// and `C'` its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Gemm {
    /// `op_a` is `T` (else `N`).
    pub(crate) transa: bool,
    /// `op_b` is `T` (else `N`).
    pub(crate) transb: bool,
    /// Rows of `C'`: the matmul's `n`.
    pub(crate) m: i32,
    /// Columns of `C'`: the matmul's `m`.
    pub(crate) n: i32,
    /// The contracted length.
    pub(crate) k: i32,
    pub(crate) lda: i32,
    pub(crate) ldb: i32,
    pub(crate) ldc: i32,
    pub(crate) stride_a: i64,
    pub(crate) stride_b: i64,
    pub(crate) stride_c: i64,
    /// Number of products; 1 calls plain `gemm`, more `gemmStridedBatched`.
    pub(crate) batch: i32,
}

/// What one launch of a matmul queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Nothing: the output has no elements.
    Nothing,
    /// `k == 0`: every output element is an empty sum, so the first `bytes` of the output
    /// are zeroed (cuBLAS is not asked, so this does not rest on how it treats `k == 0`).
    Zero {
        /// `batch·m·n` elements, in bytes.
        bytes: usize,
    },
    /// One cuBLAS call.
    Gemm(Gemm),
}

/// The launch of `op` (shown as `name` in errors) with sizes `s`, on buffers of `bytes`
/// bytes (`[lhs, rhs, out]`): buffers too small for [`MatmulSizes::min_elements`] are
/// [`BackendError::InvalidArgument`], sizes past cuBLAS's 32-bit `int` arguments
/// [`BackendError::Unsupported`]. Never panics, whatever the sizes.
pub(crate) fn plan(
    op: &Matmul,
    name: &str,
    precision: Precision,
    s: &MatmulSizes,
    bytes: [usize; 3],
) -> Result<Plan, BackendError> {
    let invalid = |why: String| BackendError::InvalidArgument(format!("cuda {name}: {why}"));
    let sizes = format!(
        "batch {}, m {}, n {}, k {}, batch strides {} and {}",
        s.batch, s.m, s.n, s.k, s.lhs_batch_stride, s.rhs_batch_stride
    );
    // `min_elements` multiplies unchecked; sizes whose spans overflow need more memory than
    // any buffer has, so they are rejected here, before it is called.
    if !spans_fit(s) {
        return Err(invalid(format!(
            "{sizes} need more elements than fit in memory"
        )));
    }
    let needed = s.min_elements();
    let element = precision.size_bytes();
    for (role, need, have) in [
        ("lhs", needed.0, bytes[0]),
        ("rhs", needed.1, bytes[1]),
        ("out", needed.2, bytes[2]),
    ] {
        let holds = have / element;
        if holds < need {
            return Err(invalid(format!(
                "buffer `{role}` holds {holds} elements of {} ({have} bytes), but {sizes} need \
                 {need}",
                op.dtype
            )));
        }
    }
    if needed.2 == 0 {
        return Ok(Plan::Nothing);
    }
    if s.k == 0 {
        return Ok(Plan::Zero {
            bytes: needed.2 * element,
        });
    }
    let int = |what: &str, value: usize| {
        i32::try_from(value).map_err(|_| BackendError::Unsupported {
            backend: "cuda",
            what: format!(
                "{name}: {what} = {value} exceeds cuBLAS's 32-bit limit of {}; split the \
                 product, or let the generated kernel run it",
                i32::MAX
            ),
        })
    };
    let long = |what: &str, value: usize| {
        i64::try_from(value).map_err(|_| BackendError::Unsupported {
            backend: "cuda",
            what: format!("{name}: {what} = {value} exceeds cuBLAS's 64-bit stride"),
        })
    };
    let (m, n, k) = (int("m", s.m)?, int("n", s.n)?, int("k", s.k)?);
    Ok(Plan::Gemm(Gemm {
        transa: op.rhs_transposed,
        transb: op.lhs_transposed,
        m: n,
        n: m,
        k,
        lda: if op.rhs_transposed { k } else { n },
        ldb: if op.lhs_transposed { m } else { k },
        ldc: n,
        stride_a: long("the rhs batch stride", s.rhs_batch_stride)?,
        stride_b: long("the lhs batch stride", s.lhs_batch_stride)?,
        // At most (2³¹)² elements, since m and n fit an i32.
        stride_c: i64::from(m) * i64::from(n),
        batch: int("batch", s.batch)?,
    }))
}

/// Outputs of at least this many elements get rows padded by [`padded`]: below it, the
/// copy's launch costs more than a slow kernel loses.
const PADDED_OUTPUT_MIN: i64 = 1 << 20;

/// A GEMM whose output rows (cuBLAS's `m'`) are not a multiple of 8 elements, split so that
/// each part writes rows padded to a multiple of 8 elements (16 bytes) of a scratch matrix,
/// whose rows the caller then copies into place. For half precisions cuBLAS runs slow
/// kernels unless both `m'` and `ldc` are multiples of 8: GPT-2's LM head in bf16
/// (`m' = 50257`) took 3.33 ms on the H200 with `ldc` 50257 or 50264, 0.42 ms as `m' = 50256`
/// with `ldc = 50264`, plus 0.008 ms for the last row and 0.34 ms for the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Padded {
    /// The first `m'` rounded down to a multiple of 8 rows, into the scratch matrix.
    pub(crate) main: Gemm,
    /// The remaining rows, with the element offsets of their first row in `A'` (and the
    /// bias) and in the scratch matrix.
    pub(crate) rest: (Gemm, i64, i64),
}

/// How `g` runs padded (see [`Padded`]), or `None` where its rows are aligned already, the
/// output is small, or the precision is not a half one.
pub(crate) fn padded(precision: Precision, g: &Gemm) -> Option<Padded> {
    if !matches!(precision, Precision::F16 | Precision::BF16) || g.m % 8 == 0 || g.m < 8 {
        return None;
    }
    if i64::from(g.m) * i64::from(g.n) * i64::from(g.batch) < PADDED_OUTPUT_MIN {
        return None;
    }
    let ldc = g.m.checked_add(7)? / 8 * 8;
    let stride_c = i64::from(ldc) * i64::from(g.n);
    let head = g.m / 8 * 8;
    // Row `i` of `op(A')` starts at element `i·lda` of a transposed `A'`, at `i` otherwise.
    let a_offset = if g.transa {
        i64::from(head) * i64::from(g.lda)
    } else {
        i64::from(head)
    };
    Some(Padded {
        main: Gemm {
            m: head,
            ldc,
            stride_c,
            ..*g
        },
        rest: (
            Gemm {
                m: g.m - head,
                ldc,
                stride_c,
                ..*g
            },
            a_offset,
            i64::from(head),
        ),
    })
}

/// Whether every product [`MatmulSizes::min_elements`] computes fits a `usize`.
fn spans_fit(s: &MatmulSizes) -> bool {
    let last = s.batch.saturating_sub(1);
    let span = |stride: usize, one: Option<usize>| {
        one.is_some_and(|one| {
            one == 0
                || last
                    .checked_mul(stride)
                    .and_then(|x| x.checked_add(one))
                    .is_some()
        })
    };
    span(s.lhs_batch_stride, s.m.checked_mul(s.k))
        && span(s.rhs_batch_stride, s.k.checked_mul(s.n))
        && s.batch
            .checked_mul(s.m)
            .and_then(|bm| bm.checked_mul(s.n))
            .is_some()
}

#[cfg(test)]
mod tests {
    use tessel_ir::{BackendError, Matmul, MatmulSizes};
    use tessel_shape::{Bindings, DType, Dim};

    use super::{Gemm, Plan, Precision, padded, plan};

    fn matmul(batch: i64, m: i64, n: i64, k: i64, t: (bool, bool), strides: (i64, i64)) -> Matmul {
        Matmul {
            dtype: DType::F64,
            batch: Dim::from(batch),
            m: Dim::from(m),
            n: Dim::from(n),
            k: Dim::from(k),
            lhs_transposed: t.0,
            rhs_transposed: t.1,
            lhs_batch_stride: Dim::from(strides.0),
            rhs_batch_stride: Dim::from(strides.1),
            allow_tf32: false,
            epilogue: tessel_ir::Epilogue::NONE,
        }
    }

    fn sizes(op: &Matmul) -> MatmulSizes {
        op.sizes(&Bindings::new()).unwrap()
    }

    /// cuBLAS's `gemmStridedBatched` as its documentation defines it: column-major, element
    /// `(i, j)` of a matrix with leading dimension `ld` at `i + j·ld`, and `op(X)(i, j)` being
    /// `X(j, i)` for `T`. `beta` is 0.
    fn cublas_gemm(g: &Gemm, a: &[f64], b: &[f64], c: &mut [f64]) {
        let [m, n, k, lda, ldb, ldc] = [g.m, g.n, g.k, g.lda, g.ldb, g.ldc].map(|v| v as usize);
        // cuBLAS rejects leading dimensions below the stored matrix's row count.
        assert!(lda >= if g.transa { k } else { m }, "{g:?}");
        assert!(ldb >= if g.transb { n } else { k }, "{g:?}");
        assert!(ldc >= m, "{g:?}");
        for p in 0..g.batch as usize {
            let [sa, sb, sc] = [g.stride_a, g.stride_b, g.stride_c].map(|s| s as usize * p);
            for i in 0..m {
                for j in 0..n {
                    let mut sum = 0.0;
                    for l in 0..k {
                        let x = if g.transa {
                            a[sa + l + i * lda]
                        } else {
                            a[sa + i + l * lda]
                        };
                        let y = if g.transb {
                            b[sb + j + l * ldb]
                        } else {
                            b[sb + l + j * ldb]
                        };
                        sum += x * y;
                    }
                    c[sc + i + j * ldc] = sum;
                }
            }
        }
    }

    /// The matmul straight from [`Matmul`]'s definition, row-major.
    fn reference(op: &Matmul, lhs: &[f64], rhs: &[f64]) -> Vec<f64> {
        let s = sizes(op);
        let mut out = vec![0.0; s.batch * s.m * s.n];
        for p in 0..s.batch {
            let (ls, rs) = (p * s.lhs_batch_stride, p * s.rhs_batch_stride);
            for i in 0..s.m {
                for j in 0..s.n {
                    let mut sum = 0.0;
                    for l in 0..s.k {
                        let a = if op.lhs_transposed {
                            lhs[ls + l * s.m + i]
                        } else {
                            lhs[ls + i * s.k + l]
                        };
                        let b = if op.rhs_transposed {
                            rhs[rs + j * s.k + l]
                        } else {
                            rhs[rs + l * s.n + j]
                        };
                        sum += a * b;
                    }
                    out[(p * s.m + i) * s.n + j] = sum;
                }
            }
        }
        out
    }

    /// Small integers: every sum is exact, so the two must agree bit for bit.
    fn data(n: usize, seed: usize) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 7 + seed * 13) % 11) as f64 - 5.0)
            .collect()
    }

    #[test]
    fn the_gemm_computes_the_row_major_product() {
        let shapes = [
            (1, 5, 7, 3),
            (1, 1, 9, 4),
            (1, 6, 1, 2),
            (3, 4, 5, 6),
            (2, 3, 3, 1),
        ];
        let mut cases = 0;
        for (batch, m, n, k) in shapes {
            for t in [(false, false), (true, false), (false, true), (true, true)] {
                let (mk, kn) = (m * k, k * n);
                // Packed, padded, and broadcast batch strides.
                for strides in [(mk, kn), (mk + 3, kn + 1), (0, kn), (mk, 0), (0, 0)] {
                    let op = matmul(batch, m, n, k, t, strides);
                    let s = sizes(&op);
                    let (nl, nr, no) = s.min_elements();
                    let bytes = [nl * 8, nr * 8, no * 8];
                    let Plan::Gemm(g) = plan(&op, "test", Precision::F64, &s, bytes).unwrap()
                    else {
                        panic!("{op}")
                    };
                    let (lhs, rhs) = (data(nl, 1), data(nr, 2));
                    let mut out = vec![f64::NAN; no];
                    cublas_gemm(&g, &rhs, &lhs, &mut out);
                    assert_eq!(out, reference(&op, &lhs, &rhs), "{op}: {g:?}");
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 100);
    }

    #[test]
    fn the_mapping_matches_the_table() {
        let op = matmul(3, 5, 7, 9, (false, false), (45, 0));
        let planned = plan(&op, "t", Precision::F32, &sizes(&op), [1 << 20; 3]).unwrap();
        let expected = Gemm {
            transa: false,
            transb: false,
            m: 7,
            n: 5,
            k: 9,
            lda: 7,
            ldb: 9,
            ldc: 7,
            stride_a: 0,
            stride_b: 45,
            stride_c: 35,
            batch: 3,
        };
        assert_eq!(planned, Plan::Gemm(expected));
        let op = matmul(1, 5, 7, 9, (true, true), (0, 0));
        let Ok(Plan::Gemm(g)) = plan(&op, "t", Precision::F32, &sizes(&op), [1 << 20; 3]) else {
            panic!()
        };
        assert_eq!(
            (g.transa, g.transb, g.lda, g.ldb, g.ldc),
            (true, true, 9, 5, 7)
        );
    }

    #[test]
    fn empty_products_and_empty_sums() {
        for (m, n, batch) in [(0, 4, 2), (4, 0, 2), (4, 4, 0)] {
            let op = matmul(batch, m, n, 3, (false, false), (0, 0));
            // The rhs still needs its elements when only m is 0 (and the lhs when n is).
            let p = plan(&op, "t", Precision::F32, &sizes(&op), [48; 3]).unwrap();
            assert_eq!(p, Plan::Nothing, "{op}");
        }
        let op = matmul(2, 3, 4, 0, (true, false), (0, 0));
        let p = plan(&op, "t", Precision::F64, &sizes(&op), [0, 0, 2 * 12 * 8]).unwrap();
        assert_eq!(p, Plan::Zero { bytes: 2 * 12 * 8 });
    }

    #[test]
    fn small_buffers_and_huge_sizes_are_errors() {
        let op = matmul(2, 3, 4, 5, (false, false), (15, 20));
        let s = sizes(&op);
        let (nl, nr, no) = s.min_elements();
        let fits = [nl * 4, nr * 4, no * 4];
        assert!(plan(&op, "t", Precision::F32, &s, fits).is_ok());
        for role in 0..3 {
            let mut bytes = fits;
            bytes[role] -= 1;
            let err = plan(&op, "matmul x", Precision::F32, &s, bytes).unwrap_err();
            let BackendError::InvalidArgument(why) = &err else {
                panic!("{err:?}")
            };
            let name = ["`lhs`", "`rhs`", "`out`"][role];
            assert!(why.contains("matmul x") && why.contains(name), "{why}");
            assert!(why.contains("m 3, n 4, k 5"), "{why}");
        }
        // Past i32: an Unsupported refusal, checked after the buffers.
        let big = 1i64 << 31;
        let op = matmul(1, 1, 1, big, (false, false), (0, 0));
        let err = plan(&op, "t", Precision::F32, &sizes(&op), [usize::MAX; 3]).unwrap_err();
        assert!(
            matches!(&err, BackendError::Unsupported { what, .. } if what.contains("k = 2147483648")),
            "{err:?}"
        );
        let op = matmul(big, 1, 1, 1, (false, false), (0, 0));
        let err = plan(&op, "t", Precision::F32, &sizes(&op), [usize::MAX; 3]).unwrap_err();
        assert!(matches!(err, BackendError::Unsupported { .. }), "{err:?}");
        // Spans past usize: an error, not an overflow panic.
        let op = matmul(4, 2, 2, 2, (false, false), (i64::MAX, 0));
        let err = plan(&op, "t", Precision::F32, &sizes(&op), [usize::MAX; 3]).unwrap_err();
        assert!(matches!(err, BackendError::InvalidArgument(_)), "{err:?}");
        let huge = 1i64 << 40;
        let op = matmul(huge, huge, huge, 1, (false, false), (0, 0));
        let err = plan(&op, "t", Precision::F32, &sizes(&op), [usize::MAX; 3]).unwrap_err();
        assert!(matches!(err, BackendError::InvalidArgument(_)), "{err:?}");
    }

    /// GPT-2's LM head in bf16 (`n = 50257`) runs as 50256 rows and 1 into rows padded to
    /// 50264, and the parts compute the rows the whole would (checked against the column-major
    /// reference, in both layouts of `A'`); aligned rows, small outputs and f32 are left alone.
    #[test]
    fn odd_half_rows_are_split_and_padded_to_16_bytes() {
        let gemm_of = |m: i64, n: i64, k: i64, dtype, t: (bool, bool)| {
            let op = Matmul {
                dtype,
                ..matmul(2, m, n, k, t, (m * k, k * n))
            };
            let precision = Precision::of(&op).unwrap();
            let Ok(Plan::Gemm(g)) = plan(&op, "t", precision, &sizes(&op), [usize::MAX; 3]) else {
                panic!("a gemm");
            };
            g
        };
        let head = gemm_of(4096, 50257, 768, DType::BF16, (false, true));
        let p = padded(Precision::BF16, &head).unwrap();
        assert_eq!((p.main.m, p.main.ldc), (50256, 50264));
        assert_eq!((p.rest.0.m, p.rest.1, p.rest.2), (1, 50256 * 768, 50256));
        let bf16 = |m, n| gemm_of(m, n, 768, DType::BF16, (false, true));
        assert_eq!(padded(Precision::BF16, &bf16(4096, 50264)), None, "aligned");
        assert_eq!(padded(Precision::BF16, &bf16(8, 50257)), None, "small");
        let f32 = gemm_of(4096, 50257, 768, DType::F32, (false, true));
        assert_eq!(padded(Precision::F32, &f32), None, "f32");
        // Small enough to compute: the parts against the whole, both layouts of the rhs.
        for t in [(false, false), (false, true), (true, true)] {
            let g = gemm_of(70, 8195, 3, DType::BF16, t);
            let p = padded(Precision::BF16, &g).unwrap();
            let (a, b) = (data(3 * 8195 * 2, 1), data(70 * 3 * 2, 2));
            let mut whole = vec![0.0; 8195 * 70 * 2];
            cublas_gemm(&g, &a, &b, &mut whole);
            let mut scratch = vec![f64::NAN; p.main.stride_c as usize * 2];
            cublas_gemm(&p.main, &a, &b, &mut scratch);
            let (rest, a_off, c_off) = p.rest;
            cublas_gemm(
                &rest,
                &a[a_off as usize..],
                &b,
                &mut scratch[c_off as usize..],
            );
            for col in 0..70 * 2 {
                let got = &scratch[col * p.main.ldc as usize..][..8195];
                assert_eq!(got, &whole[col * 8195..][..8195], "{t:?}: column {col}");
            }
        }
    }

    #[test]
    fn floats_run_on_cublas_and_integers_do_not() {
        let of = |dtype, allow_tf32| {
            Precision::of(&Matmul {
                dtype,
                allow_tf32,
                ..matmul(1, 2, 2, 2, (false, false), (0, 0))
            })
        };
        assert_eq!(of(DType::F32, false), Some(Precision::F32));
        assert_eq!(of(DType::F32, true), Some(Precision::Tf32));
        assert_eq!(of(DType::F64, true), Some(Precision::F64));
        assert_eq!(of(DType::F16, false), Some(Precision::F16));
        assert_eq!(of(DType::BF16, true), Some(Precision::BF16));
        for dtype in [DType::I32, DType::I64, DType::U8] {
            assert_eq!(of(dtype, false), None, "{dtype}");
        }
    }
}
