//! The CPU backend's vendor matmul ([`Backend::vendor`] through the `gemm` crate) against a
//! reference computed here in f64 on seeded random data: layouts, batch strides and
//! broadcasting, empty sizes, symbolic sizes, every parallel path, the error paths, and
//! timing and release like any program.

use std::path::Path;

use tessel_cpu::{CpuBackend, CpuConfig};
use tessel_ir::{Backend, BackendError, BufferId, Matmul, ProgramId, VendorOp, samples};
use tessel_shape::{Bindings, DType, Dim, Var};
use tessel_testkit::{Rng, f32_bytes};

/// A backend with `threads` workers. Vendor programs never compile, so the compiler and
/// cache directory matter only to [`generated_kernel_agrees`].
fn cpu(threads: usize) -> CpuBackend {
    CpuBackend::with_config(CpuConfig {
        cc: None,
        cache_dir: Path::new(env!("CARGO_TARGET_TMPDIR")).join("tessel-cpu-vendor-tests"),
        threads,
    })
}

/// One matmul with constant sizes; the batch strides are in elements.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    lhs_transposed: bool,
    rhs_transposed: bool,
    lhs_stride: usize,
    rhs_stride: usize,
}

impl Case {
    /// `batch` dense products, untransposed.
    fn dense(batch: usize, m: usize, n: usize, k: usize) -> Case {
        Case {
            batch,
            m,
            n,
            k,
            lhs_transposed: false,
            rhs_transposed: false,
            lhs_stride: m * k,
            rhs_stride: k * n,
        }
    }

    fn transposed(self, lhs: bool, rhs: bool) -> Case {
        Case {
            lhs_transposed: lhs,
            rhs_transposed: rhs,
            ..self
        }
    }

    fn strides(self, lhs: usize, rhs: usize) -> Case {
        Case {
            lhs_stride: lhs,
            rhs_stride: rhs,
            ..self
        }
    }

    fn op(&self, dtype: DType) -> Matmul {
        Matmul {
            dtype,
            batch: Dim::from(self.batch),
            m: Dim::from(self.m),
            n: Dim::from(self.n),
            k: Dim::from(self.k),
            lhs_transposed: self.lhs_transposed,
            rhs_transposed: self.rhs_transposed,
            lhs_batch_stride: Dim::from(self.lhs_stride),
            rhs_batch_stride: Dim::from(self.rhs_stride),
            allow_tf32: false,
            epilogue: tessel_ir::Epilogue::NONE,
        }
    }

    /// Elements of `(lhs, rhs, out)`: the last matrix's end.
    fn lens(&self) -> (usize, usize, usize) {
        let span = |stride: usize, one: usize| {
            if one == 0 {
                0
            } else {
                (self.batch - 1) * stride + one
            }
        };
        (
            span(self.lhs_stride, self.m * self.k),
            span(self.rhs_stride, self.k * self.n),
            self.batch * self.m * self.n,
        )
    }

    /// `out` in f64, and for each element the sum of the magnitudes of its terms, the
    /// scale that the rounding error of any summation order is bounded by.
    fn reference(&self, lhs: &[f64], rhs: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let Case { m, n, k, .. } = *self;
        let (mut out, mut scale) = (Vec::new(), Vec::new());
        for b in 0..self.batch {
            for i in 0..m {
                for j in 0..n {
                    let (mut sum, mut abs) = (0.0, 0.0);
                    for p in 0..k {
                        let l = if self.lhs_transposed {
                            p * m + i
                        } else {
                            i * k + p
                        };
                        let r = if self.rhs_transposed {
                            j * k + p
                        } else {
                            p * n + j
                        };
                        let term = lhs[b * self.lhs_stride + l] * rhs[b * self.rhs_stride + r];
                        sum += term;
                        abs += term.abs();
                    }
                    out.push(sum);
                    scale.push(abs);
                }
            }
        }
        (out, scale)
    }
}

/// `n` random values of `dtype` (a float) in `[-1, 1)`, as bytes and widened to f64.
fn random(rng: &mut Rng, dtype: DType, n: usize) -> (Vec<u8>, Vec<f64>) {
    let bytes: Vec<u8> = (0..n)
        .flat_map(|_| {
            let v = rng.unit();
            match dtype {
                DType::F32 => (v as f32).to_le_bytes().to_vec(),
                DType::F16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
                DType::BF16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
                _ => v.to_le_bytes().to_vec(),
            }
        })
        .collect();
    let values = values(dtype, &bytes);
    (bytes, values)
}

fn values(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(dtype.size_bytes())
        .map(|c| match dtype {
            DType::F32 => f64::from(f32::from_le_bytes(c.try_into().unwrap())),
            DType::F16 => half::f16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            DType::BF16 => half::bf16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            _ => f64::from_le_bytes(c.try_into().unwrap()),
        })
        .collect()
}

/// A buffer holding `data`.
fn buffer(cpu: &CpuBackend, data: &[u8]) -> BufferId {
    let id = cpu.alloc(0, data.len()).unwrap();
    cpu.write(id, 0, data).unwrap();
    id
}

fn vendor(cpu: &CpuBackend, op: Matmul) -> ProgramId {
    let programs = cpu.vendor(0, &VendorOp::Matmul(op)).unwrap();
    assert_eq!(programs.len(), 1, "float matmuls have one vendor program");
    programs[0].program
}

/// Checks that `got` is the product to within the tolerance of `dtype`: relative
/// 1e-4·√k (f32, and the f32 sums of f16/bf16) or 1e-12·√k (f64) of the sum of the terms'
/// magnitudes, so that cancellation to a result near zero is judged by the rounding it can
/// really have, plus half an ulp of the result for the final rounding to a half type.
fn assert_close(what: &str, dtype: DType, k: usize, got: &[f64], want: &[f64], scale: &[f64]) {
    let rel = if dtype == DType::F64 { 1e-12 } else { 1e-4 } * (k as f64).sqrt();
    let last_rounding = match dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    };
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (e, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(
            (g - w).abs() <= rel * s.max(f64::MIN_POSITIVE) + last_rounding * w.abs(),
            "{what}: element {e} is {g}, expected {w} (scale {s})"
        );
    }
}

/// Runs `op` (sizes of `case`, evaluated with `dims`) on seeded random data of `dtype`,
/// `timed` through [`Backend::time`], and compares with the reference. The output starts
/// as NaNs, so every element must be written.
fn check_with(
    cpu: &CpuBackend,
    dtype: DType,
    case: Case,
    op: Matmul,
    dims: &Bindings,
    timed: bool,
) {
    let what = format!("{dtype} {case:?}");
    let (lhs_len, rhs_len, out_len) = case.lens();
    let mut rng = Rng(0x5eed ^ (case.m * 1_000_003 + case.n * 1009 + case.k) as u64);
    let (lhs_bytes, lhs) = random(&mut rng, dtype, lhs_len);
    let (rhs_bytes, rhs) = random(&mut rng, dtype, rhs_len);
    let size = dtype.size_bytes();
    let ids = [
        buffer(cpu, &lhs_bytes),
        buffer(cpu, &rhs_bytes),
        buffer(cpu, &vec![0xff; out_len * size]),
    ];
    let program = vendor(cpu, op);
    if timed {
        cpu.time(program, &ids, dims).unwrap();
    } else {
        cpu.launch(program, &ids, dims).unwrap();
    }
    let mut out = vec![0; out_len * size];
    cpu.read(ids[2], 0, &mut out).unwrap();
    let (want, scale) = case.reference(&lhs, &rhs);
    assert_close(&what, dtype, case.k, &values(dtype, &out), &want, &scale);
    cpu.release(program).unwrap();
    for id in ids {
        cpu.free(id).unwrap();
    }
}

fn check(cpu: &CpuBackend, dtype: DType, case: Case) {
    check_with(cpu, dtype, case, case.op(dtype), &Bindings::new(), false);
}

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

#[test]
fn odd_sizes_match_the_reference() {
    let cpu = cpu(4);
    for dtype in FLOATS {
        check(&cpu, dtype, Case::dense(1, 37, 29, 53));
        check(&cpu, dtype, Case::dense(1, 1, 1, 1));
        check(&cpu, dtype, Case::dense(1, 1, 17, 3));
    }
}

#[test]
fn every_transpose_combination() {
    let cpu = cpu(4);
    for dtype in FLOATS {
        for lhs in [false, true] {
            for rhs in [false, true] {
                check(&cpu, dtype, Case::dense(1, 37, 29, 53).transposed(lhs, rhs));
            }
        }
    }
}

/// Batches with padding between matrices, and one operand broadcast (stride 0).
#[test]
fn batch_strides_and_broadcast() {
    let cpu = cpu(4);
    let (m, n, k) = (13, 11, 7);
    for dtype in FLOATS {
        for (lhs_t, rhs_t) in [(false, false), (true, true)] {
            let case = Case::dense(3, m, n, k).transposed(lhs_t, rhs_t);
            check(&cpu, dtype, case);
            check(&cpu, dtype, case.strides(m * k + 5, k * n + 3));
            check(&cpu, dtype, case.strides(m * k + 1, 0));
            check(&cpu, dtype, case.strides(0, k * n));
            check(&cpu, dtype, case.strides(0, 0));
        }
    }
}

/// Large enough products to split inside gemm, small ones split across the batch, and one
/// worker thread (no pool hop at all): every way a launch can run.
#[test]
fn every_parallel_path() {
    for threads in [1, 3] {
        let cpu = cpu(threads);
        for dtype in FLOATS {
            check(
                &cpu,
                dtype,
                Case::dense(2, 97, 101, 103).transposed(true, false),
            );
            check(
                &cpu,
                dtype,
                Case::dense(17, 40, 41, 39).strides(40 * 39 + 2, 0),
            );
        }
    }
}

/// An empty sum is zero; an empty result writes nothing.
#[test]
fn empty_sizes() {
    let cpu = cpu(4);
    for dtype in FLOATS {
        // k = 0: the output (NaNs before) must become zeros, with empty operands.
        check(&cpu, dtype, Case::dense(2, 5, 6, 0));
        for (m, n) in [(0, 6), (5, 0)] {
            let case = Case::dense(2, m, n, 4);
            let (lhs_len, rhs_len, _) = case.lens();
            let size = dtype.size_bytes();
            let ids = [
                buffer(&cpu, &vec![0; lhs_len * size]),
                buffer(&cpu, &vec![0; rhs_len * size]),
                buffer(&cpu, &[7; 16]),
            ];
            let program = vendor(&cpu, case.op(dtype));
            cpu.launch(program, &ids, &Bindings::new()).unwrap();
            let mut out = [0; 16];
            cpu.read(ids[2], 0, &mut out).unwrap();
            assert_eq!(out, [7; 16], "{dtype} {case:?}: nothing is written");
        }
        let empty = Case::dense(0, 5, 6, 4);
        let ids = [0; 3].map(|_| cpu.alloc(0, 0).unwrap());
        let program = vendor(&cpu, empty.op(dtype));
        cpu.launch(program, &ids, &Bindings::new()).unwrap();
    }
}

/// One program serves launches with different bindings of its symbolic sizes.
#[test]
fn symbolic_sizes_bind_at_launch() {
    let cpu = cpu(4);
    let rows = Var::new("rows", 0, 4096).unwrap();
    let batch = Var::new("batch", 1, 64).unwrap();
    let (n, k) = (29, 53);
    for dtype in FLOATS {
        let op = Matmul {
            dtype,
            batch: batch.into(),
            m: rows.into(),
            n: Dim::from(n),
            k: Dim::from(k),
            lhs_transposed: false,
            rhs_transposed: true,
            lhs_batch_stride: Dim::from(rows) * Dim::from(k),
            rhs_batch_stride: Dim::from(0),
            allow_tf32: false,
            epilogue: tessel_ir::Epilogue::NONE,
        };
        for (b, m) in [(1, 37), (3, 5), (2, 0)] {
            let dims = Bindings::new().with(rows, m as i64).with(batch, b as i64);
            let case = Case::dense(b, m, n, k)
                .transposed(false, true)
                .strides(m * k, 0);
            check_with(&cpu, dtype, case, op.clone(), &dims, false);
        }
        // Unbound, and out of the variable's bounds.
        let program = vendor(&cpu, op);
        let ids = [0; 3].map(|_| cpu.alloc(0, 1 << 16).unwrap());
        for dims in [
            Bindings::new().with(batch, 1),
            Bindings::new().with(batch, 1).with(rows, 5000),
        ] {
            let err = cpu.launch(program, &ids, &dims).unwrap_err();
            assert!(
                matches!(&err, BackendError::InvalidArgument(msg) if msg.contains("rows")),
                "{err}"
            );
        }
    }
}

/// Launches that do not fit are errors, never panics or out-of-bounds accesses.
#[test]
fn bad_launches_are_errors() {
    let cpu = cpu(4);
    let case = Case::dense(3, 8, 9, 10).strides(80, 0);
    let (lhs_len, rhs_len, out_len) = case.lens();
    for dtype in FLOATS {
        let size = dtype.size_bytes();
        let program = vendor(&cpu, case.op(dtype));
        let sized = |elements: usize| cpu.alloc(0, elements * size).unwrap();
        let invalid = |buffers: &[BufferId], needle: &str| {
            let err = cpu.launch(program, buffers, &Bindings::new()).unwrap_err();
            assert!(
                matches!(&err, BackendError::InvalidArgument(msg) if msg.contains(needle)),
                "{dtype}: expected an invalid argument mentioning `{needle}`, got {err}"
            );
        };
        let [lhs, rhs, out] = [lhs_len, rhs_len, out_len].map(sized);
        cpu.launch(program, &[lhs, rhs, out], &Bindings::new())
            .unwrap();
        // One element short of each operand; then a byte short (not a whole element).
        invalid(&[sized(lhs_len - 1), rhs, out], "lhs buffer");
        invalid(&[lhs, sized(rhs_len - 1), out], "rhs buffer");
        invalid(&[lhs, rhs, sized(out_len - 1)], "out buffer");
        let short = cpu.alloc(0, out_len * size - 1).unwrap();
        invalid(&[lhs, rhs, short], "batch 3, m 8, n 9, k 10");
        // The output bound as an input too.
        invalid(&[lhs, out, out], "also bound as an input");
        invalid(&[out, rhs, out], "also bound as an input");
        // Wrong buffer counts, unknown buffers.
        invalid(&[lhs, rhs], "3 buffers");
        invalid(&[lhs, rhs, out, out], "3 buffers");
        invalid(&[lhs, rhs, BufferId(u64::MAX)], "not a live buffer");
    }
    // Sizes whose element counts overflow.
    let huge = Case::dense(1, 1, 1, 1).op(DType::F32);
    let huge = Matmul {
        m: Dim::from(1i64 << 40),
        n: Dim::from(1i64 << 40),
        k: Dim::from(1i64 << 40),
        ..huge
    };
    let program = vendor(&cpu, huge);
    let ids = [0; 3].map(|_| cpu.alloc(0, 64).unwrap());
    let err = cpu.launch(program, &ids, &Bindings::new()).unwrap_err();
    assert!(matches!(err, BackendError::InvalidArgument(_)), "{err}");
    // An unknown device.
    assert!(
        cpu.vendor(1, &VendorOp::Matmul(case.op(DType::F32)))
            .is_err()
    );
}

/// The same buffer as both operands is fine (both are only read): `a · aᵀ`.
#[test]
fn one_buffer_as_both_operands() {
    let cpu = cpu(4);
    let (m, k) = (19, 23);
    let mut rng = Rng(7);
    let a = rng.f32s(m * k);
    let wide: Vec<f64> = a.iter().map(|&v| v.into()).collect();
    let ids = [
        buffer(&cpu, &f32_bytes(&a)),
        cpu.alloc(0, m * m * 4).unwrap(),
    ];
    let case = Case::dense(1, m, m, k).transposed(false, true);
    let program = vendor(&cpu, case.op(DType::F32));
    cpu.launch(program, &[ids[0], ids[0], ids[1]], &Bindings::new())
        .unwrap();
    let mut out = vec![0; m * m * 4];
    cpu.read(ids[1], 0, &mut out).unwrap();
    let (want, scale) = case.reference(&wide, &wide);
    assert_close(
        "a·aᵀ",
        DType::F32,
        k,
        &values(DType::F32, &out),
        &want,
        &scale,
    );
}

/// Element types without a gemm routine get no program, and no error.
#[test]
fn other_dtypes_have_no_vendor_program() {
    let cpu = cpu(4);
    for dtype in [
        DType::F8E4M3,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ] {
        let op = VendorOp::Matmul(Case::dense(1, 4, 4, 4).op(dtype));
        assert_eq!(cpu.vendor(0, &op), Ok(Vec::new()), "{dtype}");
    }
}

/// `time` runs the product like `launch` and counts as a launch; a released program is
/// gone.
#[test]
fn vendor_programs_time_and_release() {
    let cpu = cpu(4);
    let case = Case::dense(2, 37, 29, 53).transposed(true, true);
    for dtype in FLOATS {
        check_with(&cpu, dtype, case, case.op(dtype), &Bindings::new(), true);
    }
    assert_eq!(cpu.stats().launches, FLOATS.len() as u64);
    let program = vendor(&cpu, case.op(DType::F32));
    let (lhs_len, rhs_len, out_len) = case.lens();
    let ids = [lhs_len, rhs_len, out_len].map(|n| cpu.alloc(0, n * 4).unwrap());
    assert!(cpu.time(program, &ids, &Bindings::new()).is_ok());
    cpu.release(program).unwrap();
    assert!(cpu.launch(program, &ids, &Bindings::new()).is_err());
    assert!(cpu.time(program, &ids, &Bindings::new()).is_err());
    assert!(cpu.release(program).is_err(), "released twice");
}

/// The vendor program and the generated kernel (`samples::tiled_matmul`) agree.
#[test]
fn generated_kernel_agrees() {
    let cpu = cpu(4);
    let (m, n, k) = (64, 48, 32);
    let mut rng = Rng(11);
    let (a, b) = (rng.f32s(m * k), rng.f32s(k * n));
    let [lhs, rhs] = [&a, &b].map(|v| buffer(&cpu, &f32_bytes(v)));
    let [generated, library] = [0; 2].map(|_| cpu.alloc(0, m * n * 4).unwrap());
    let kernel = cpu
        .compile(0, &samples::tiled_matmul(m, n, k, 16).unwrap())
        .unwrap();
    cpu.launch(kernel, &[lhs, rhs, generated], &Bindings::new())
        .unwrap();
    let program = vendor(&cpu, Case::dense(1, m, n, k).op(DType::F32));
    cpu.launch(program, &[lhs, rhs, library], &Bindings::new())
        .unwrap();
    let [want, got] = [generated, library].map(|id| {
        let mut out = vec![0; m * n * 4];
        cpu.read(id, 0, &mut out).unwrap();
        values(DType::F32, &out)
    });
    // Both round in f32, in different orders: compare with the scale of the terms.
    let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let (_, scale) = Case::dense(1, m, n, k).reference(&wide(&a), &wide(&b));
    assert_close("generated vs gemm", DType::F32, k, &got, &want, &scale);
}

/// Epilogues (a bias along the rows, `relu`, GELU's tanh and erf forms) over odd,
/// transposed, batched and empty (`k = 0`) products, against `activation(sum + bias)` in
/// f64. The activations' slopes stay under 1.2, so the sum's tolerance grows by that much.
#[test]
fn epilogues_add_the_bias_and_apply_the_activation() {
    use tessel_ir::{Activation, Epilogue};
    let cpu = cpu(3);
    let epilogues = [
        (true, Activation::Identity),
        (false, Activation::Relu),
        (true, Activation::Relu),
        (false, Activation::GeluTanh),
        (true, Activation::GeluTanh),
        (false, Activation::Gelu),
        (true, Activation::Gelu),
    ]
    .map(|(bias, activation)| Epilogue { bias, activation });
    let cases = [
        Case::dense(1, 37, 29, 53),
        Case::dense(3, 13, 11, 7).transposed(true, true),
        Case::dense(2, 97, 301, 103).transposed(false, true),
        Case::dense(2, 5, 6, 0),
    ];
    for dtype in FLOATS {
        for case in cases {
            for epilogue in epilogues {
                let what = format!("{dtype} {case:?} {epilogue:?}");
                let (lhs_len, rhs_len, out_len) = case.lens();
                let mut rng = Rng(0xe9 ^ (case.m * 1009 + case.k) as u64);
                let (lhs_bytes, lhs) = random(&mut rng, dtype, lhs_len);
                let (rhs_bytes, rhs) = random(&mut rng, dtype, rhs_len);
                let (bias_bytes, bias) = random(&mut rng, dtype, case.n);
                let size = dtype.size_bytes();
                let mut ids = vec![buffer(&cpu, &lhs_bytes), buffer(&cpu, &rhs_bytes)];
                if epilogue.bias {
                    ids.push(buffer(&cpu, &bias_bytes));
                }
                ids.push(buffer(&cpu, &vec![0xff; out_len * size]));
                let op = Matmul {
                    epilogue,
                    ..case.op(dtype)
                };
                let program = vendor(&cpu, op);
                cpu.launch(program, &ids, &Bindings::new()).unwrap();
                let mut out = vec![0; out_len * size];
                cpu.read(*ids.last().unwrap(), 0, &mut out).unwrap();
                let (sums, scale) = case.reference(&lhs, &rhs);
                let want: Vec<f64> = sums
                    .iter()
                    .enumerate()
                    .map(|(e, s)| epilogue.apply(*s, bias[e % case.n]))
                    .collect();
                // The sum's tolerance, and the final rounding (f32's too: the epilogue
                // runs in f64).
                let rel = if dtype == DType::F64 { 1e-12 } else { 1e-4 } * (case.k as f64).sqrt();
                let last = match dtype {
                    DType::F16 => 2f64.powi(-11),
                    DType::BF16 => 2f64.powi(-8),
                    DType::F32 => 2f64.powi(-24),
                    _ => 0.0,
                };
                for (e, (g, w)) in values(dtype, &out).iter().zip(&want).enumerate() {
                    let tolerance = rel * 1.2 * scale[e] + last * w.abs();
                    assert!(
                        (g - w).abs() <= tolerance,
                        "{what}: element {e} is {g}, expected {w}"
                    );
                }
                cpu.release(program).unwrap();
                for id in ids {
                    cpu.free(id).unwrap();
                }
            }
        }
    }
}

/// A bias epilogue bound without its bias buffer is an error naming the four buffers.
#[test]
fn a_bias_epilogue_needs_four_buffers() {
    let cpu = cpu(1);
    let case = Case::dense(1, 2, 3, 4);
    let op = Matmul {
        epilogue: tessel_ir::Epilogue {
            bias: true,
            activation: tessel_ir::Activation::Identity,
        },
        ..case.op(DType::F32)
    };
    let program = vendor(&cpu, op);
    let ids = [8, 12, 6].map(|n| buffer(&cpu, &f32_bytes(&vec![1.0; n])));
    let err = cpu.launch(program, &ids, &Bindings::new()).unwrap_err();
    assert!(err.to_string().contains("[lhs, rhs, bias, out]"), "{err}");
}
