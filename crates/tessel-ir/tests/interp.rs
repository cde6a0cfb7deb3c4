//! The reference interpreter against results computed directly in Rust, on the sample
//! kernels and on hand-built kernels for the error paths.

use tessel_ir::interp::{self, InterpError};
use tessel_ir::{Access, KernelBuilder, samples};
use tessel_shape::{Bindings, DType, EvalError, TernaryOp, Var, bf16, f16};

/// A fixed-seed splitmix64 generator, so failures reproduce without a `rand` dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }

    /// `n` random elements of `dtype` as little-endian bytes: any bit pattern for integers,
    /// 0 or 1 for `bool`, finite values in `[-100, 100)` for floats.
    fn bytes(&mut self, dtype: DType, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n * dtype.size_bytes());
        for _ in 0..n {
            let bits = self.next();
            let x = self.uniform(-100.0, 100.0);
            match dtype {
                DType::Bool => out.push((bits & 1) as u8),
                DType::F16 => out.extend(f16::from_f64(x).to_le_bytes()),
                DType::BF16 => out.extend(bf16::from_f64(x).to_le_bytes()),
                DType::F32 => out.extend((x as f32).to_le_bytes()),
                DType::F64 => out.extend(x.to_le_bytes()),
                _ => out.extend(&bits.to_le_bytes()[..dtype.size_bytes()]),
            }
        }
        out
    }

    fn f32s(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi) as f32).collect()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s_of(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `a + b` element by element as Rust computes it: wrapping for integers, IEEE for
/// `f32`/`f64`, through `f32` and rounded once for `f16`/`bf16`, or for `bool`.
fn rust_add(dtype: DType, a: &[u8], b: &[u8]) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut out = Vec::with_capacity(a.len());
    for (x, y) in a.chunks_exact(size).zip(b.chunks_exact(size)) {
        macro_rules! int {
            ($t:ty) => {{
                let x = <$t>::from_le_bytes(x.try_into().unwrap());
                let y = <$t>::from_le_bytes(y.try_into().unwrap());
                out.extend(x.wrapping_add(y).to_le_bytes());
            }};
        }
        macro_rules! float {
            ($t:ty, $op:expr) => {{
                let x = <$t>::from_le_bytes(x.try_into().unwrap());
                let y = <$t>::from_le_bytes(y.try_into().unwrap());
                out.extend($op(x, y).to_le_bytes());
            }};
        }
        match dtype {
            DType::Bool => out.push(u8::from(x[0] != 0 || y[0] != 0)),
            DType::U8 => int!(u8),
            DType::U16 => int!(u16),
            DType::U32 => int!(u32),
            DType::U64 => int!(u64),
            DType::I8 => int!(i8),
            DType::I16 => int!(i16),
            DType::I32 => int!(i32),
            DType::I64 => int!(i64),
            DType::F16 => float!(f16, |x: f16, y: f16| f16::from_f32(x.to_f32() + y.to_f32())),
            DType::BF16 => float!(bf16, |x: bf16, y: bf16| bf16::from_f32(
                x.to_f32() + y.to_f32()
            )),
            DType::F32 => float!(f32, |x: f32, y: f32| x + y),
            DType::F64 => float!(f64, |x: f64, y: f64| x + y),
            DType::F8E4M3 | DType::F8E5M2 => unreachable!("float8 has no add; not in ALL"),
        }
    }
    out
}

#[test]
fn vector_add_every_dtype() {
    let mut rng = SplitMix64(1);
    for dtype in DType::ALL {
        // 1000 elements in workgroups of 64: the last workgroup over-covers by 24.
        let n = 1000;
        let kernel = samples::vector_add(dtype, n, 64).unwrap();
        let (mut a, mut b) = (rng.bytes(dtype, n), rng.bytes(dtype, n));
        let expected = rust_add(dtype, &a, &b);
        let mut out = vec![0xaa; n * dtype.size_bytes()];
        interp::run(&kernel, &mut [&mut a, &mut b, &mut out], &Bindings::new()).unwrap();
        assert!(out == expected, "vector_add differs from Rust for {dtype}");
    }
}

#[test]
fn permuted_copy_matches_a_strided_gather() {
    let mut rng = SplitMix64(2);
    let perms = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    for shape in [[3, 5, 7], [1, 4, 2], [8, 1, 9]] {
        for perm in perms {
            let kernel = samples::permuted_copy(shape, perm).unwrap();
            let total = shape.iter().product::<usize>();
            let x = rng.f32s(total, -1.0, 1.0);
            let strides = [shape[1] * shape[2], shape[2], 1];
            let out_shape = perm.map(|p| shape[p]);
            let mut expected = Vec::with_capacity(total);
            for o0 in 0..out_shape[0] {
                for o1 in 0..out_shape[1] {
                    for o2 in 0..out_shape[2] {
                        let src =
                            o0 * strides[perm[0]] + o1 * strides[perm[1]] + o2 * strides[perm[2]];
                        expected.push(x[src]);
                    }
                }
            }
            let mut x = f32_bytes(&x);
            let mut out = vec![0; total * 4];
            interp::run(&kernel, &mut [&mut x, &mut out], &Bindings::new()).unwrap();
            assert_eq!(f32s_of(&out), expected, "shape {shape:?} perm {perm:?}");
        }
    }
}

#[test]
fn row_sum_f32() {
    let mut rng = SplitMix64(3);
    let (rows, cols) = (37, 129);
    let kernel = samples::row_sum(rows, cols, DType::F32).unwrap();
    let x = rng.f32s(rows * cols, 0.0, 1.0);
    let mut xb = f32_bytes(&x);
    let mut out = vec![0; rows * 4];
    interp::run(&kernel, &mut [&mut xb, &mut out], &Bindings::new()).unwrap();
    for (r, got) in f32s_of(&out).into_iter().enumerate() {
        let reference: f64 = x[r * cols..(r + 1) * cols]
            .iter()
            .map(|&v| f64::from(v))
            .sum();
        let err = (f64::from(got) - reference).abs();
        assert!(
            err <= 1e-5 * reference.abs(),
            "row {r}: {got} vs {reference}"
        );
    }
}

#[test]
fn row_sum_i32_wraps() {
    let mut rng = SplitMix64(4);
    let (rows, cols) = (70, 33);
    let kernel = samples::row_sum(rows, cols, DType::I32).unwrap();
    let x: Vec<i32> = (0..rows * cols).map(|_| rng.next() as i32).collect();
    let expected: Vec<i32> = x
        .chunks_exact(cols)
        .map(|row| row.iter().fold(0i32, |acc, &v| acc.wrapping_add(v)))
        .collect();
    let mut xb = i32_bytes(&x);
    let mut out = vec![0; rows * 4];
    interp::run(&kernel, &mut [&mut xb, &mut out], &Bindings::new()).unwrap();
    assert_eq!(out, i32_bytes(&expected));
}

#[test]
fn tree_reduce_partial_sums() {
    let mut rng = SplitMix64(5);
    for (n, local) in [(1000, 64), (100, 16), (5, 1), (7, 8)] {
        let kernel = samples::tree_reduce(n, local).unwrap();
        let x = rng.f32s(n, 0.0, 1.0);
        let groups = n.div_ceil(local);
        let mut xb = f32_bytes(&x);
        let mut partial = vec![0; groups * 4];
        interp::run(&kernel, &mut [&mut xb, &mut partial], &Bindings::new()).unwrap();
        for (g, got) in f32s_of(&partial).into_iter().enumerate() {
            let chunk = &x[g * local..((g + 1) * local).min(n)];
            let reference: f64 = chunk.iter().map(|&v| f64::from(v)).sum();
            let err = (f64::from(got) - reference).abs();
            assert!(
                err <= 1e-5 * reference.abs(),
                "n {n} local {local} group {g}: {got} vs {reference}"
            );
        }
    }
}

#[test]
fn tiled_matmul_64() {
    let mut rng = SplitMix64(6);
    let (m, n, k, tile) = (64, 64, 64, 8);
    let kernel = samples::tiled_matmul(m, n, k, tile).unwrap();
    let a = rng.f32s(m * k, -1.0, 1.0);
    let b = rng.f32s(k * n, -1.0, 1.0);
    let (mut ab, mut bb) = (f32_bytes(&a), f32_bytes(&b));
    let mut c = vec![0; m * n * 4];
    interp::run(&kernel, &mut [&mut ab, &mut bb, &mut c], &Bindings::new()).unwrap();
    let c = f32s_of(&c);
    let tolerance = 1e-4 * (k as f64).sqrt();
    for i in 0..m {
        for j in 0..n {
            let reference: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
            let got = f64::from(c[i * n + j]);
            assert!(
                (got - reference).abs() <= tolerance * reference.abs().max(1.0),
                "c[{i}, {j}]: {got} vs {reference}"
            );
        }
    }
}

#[test]
fn dynamic_vector_add_at_two_bindings() {
    let mut rng = SplitMix64(7);
    let var = Var::new("n", 1, 4096).unwrap();
    let kernel = samples::dynamic_vector_add(var, 64).unwrap();
    for n in [100, 1000] {
        let (mut a, mut b) = (rng.bytes(DType::F32, n), rng.bytes(DType::F32, n));
        let expected = rust_add(DType::F32, &a, &b);
        let mut out = vec![0; n * 4];
        let dims = Bindings::new().with(var, n as i64);
        interp::run(&kernel, &mut [&mut a, &mut b, &mut out], &dims).unwrap();
        assert_eq!(out, expected, "n = {n}");
    }
}

#[test]
fn vectors_and_registers() {
    // out[4g..4g+4] = (x[4g..4g+4] * 2) with lanes reversed, through a vector load, per-lane
    // extracts, a rebuilt vector and a vector register round trip.
    let mut kb = KernelBuilder::new("lanes");
    let x = kb.buffer("x", DType::I16, 16, Access::Read);
    let out = kb.buffer("out", DType::I16, 16, Access::Write);
    kb.grid([4, 1, 1], [1, 1, 1]);
    let g = kb.group_id(0, DType::U32);
    let four = kb.constant(4u32);
    let two = kb.constant(2i16);
    let zero = kb.constant(0u32);
    let base = kb.mul(g, four);
    let v = kb.load_vec(x, base, 4);
    let twos = kb.vectorize(vec![two; 4]);
    let doubled = kb.mul(v, twos);
    let lanes: Vec<_> = (0..4).rev().map(|l| kb.extract(doubled, l)).collect();
    let reversed = kb.vectorize(lanes);
    let reg = kb.reg(DType::I16, 4);
    kb.store(reg, zero, reversed);
    let back = kb.load_vec(reg, zero, 4);
    kb.store(out, base, back);
    let kernel = kb.build().unwrap();

    let input: Vec<i16> = (0..16).map(|i| i * 3 - 20).collect();
    let mut xb: Vec<u8> = input.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut ob = vec![0; 32];
    interp::run(&kernel, &mut [&mut xb, &mut ob], &Bindings::new()).unwrap();
    let expected: Vec<u8> = input
        .chunks_exact(4)
        .flat_map(|c| c.iter().rev().map(|v| v * 2).collect::<Vec<_>>())
        .flat_map(i16::to_le_bytes)
        .collect();
    assert_eq!(ob, expected);
}

#[test]
fn empty_range_and_zeroed_registers() {
    // A loop whose end is below its start never runs, and registers start at zero (the
    // interpreter's documented choice), so out[0] = 0 + nothing.
    let mut kb = KernelBuilder::new("empty_loop");
    let out = kb.buffer("out", DType::I64, 1, Access::Write);
    let acc = kb.reg(DType::I64, 1);
    let zero = kb.constant(0i32);
    let (start, end) = (kb.constant(5i32), kb.constant(2i32));
    kb.range(start, end, |kb, i| {
        let i = kb.cast(i, DType::I64);
        kb.store(acc, zero, i);
    });
    let v = kb.load(acc, zero);
    kb.store(out, zero, v);
    let kernel = kb.build().unwrap();
    let mut ob = vec![0xff; 8];
    interp::run(&kernel, &mut [&mut ob], &Bindings::new()).unwrap();
    assert_eq!(ob, [0; 8]);
}

/// `out[i] = x[idx[i]]` for 4 invocations: the index is data, so the verifier cannot
/// bound it and the interpreter must.
fn gather_kernel() -> tessel_ir::Kernel {
    let mut kb = KernelBuilder::new("gather");
    let idx = kb.buffer("idx", DType::I32, 4, Access::Read);
    let x = kb.buffer("x", DType::F32, 8, Access::Read);
    let out = kb.buffer("out", DType::F32, 4, Access::Write);
    kb.grid([1, 1, 1], [4, 1, 1]);
    let i = kb.local_id(0, DType::I32);
    let j = kb.load(idx, i);
    let v = kb.load(x, j);
    kb.store(out, i, v);
    kb.build().unwrap()
}

#[test]
fn data_dependent_out_of_bounds_is_an_error() {
    let kernel = gather_kernel();
    for (bad, index) in [(9, 9i64), (-1, -1)] {
        let mut idx = i32_bytes(&[0, 1, bad, 2]);
        let mut x = f32_bytes(&[1.0; 8]);
        let mut out = vec![0; 16];
        let err =
            interp::run(&kernel, &mut [&mut idx, &mut x, &mut out], &Bindings::new()).unwrap_err();
        let InterpError::OutOfBounds {
            ref kernel,
            ref mem,
            index: got,
            width,
            len,
            ref invocation,
            ..
        } = err
        else {
            panic!("expected OutOfBounds, got {err}");
        };
        assert_eq!(
            (kernel.as_str(), mem.as_str(), got, width, len),
            ("gather", "buffer `x`", index, 1, 8)
        );
        assert_eq!(invocation, "group (0, 0, 0) local (2, 0, 0)");
        let msg = err.to_string();
        assert!(msg.contains("kernel `gather`"), "{msg}");
    }
    // In bounds, it gathers.
    let mut idx = i32_bytes(&[7, 0, 3, 3]);
    let mut x = f32_bytes(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let mut out = vec![0; 16];
    interp::run(&kernel, &mut [&mut idx, &mut x, &mut out], &Bindings::new()).unwrap();
    assert_eq!(f32s_of(&out), [7.0, 0.0, 3.0, 3.0]);
}

#[test]
fn wrong_buffers_are_errors() {
    let kernel = samples::vector_add(DType::F32, 100, 64).unwrap();
    let (mut a, mut b, mut out) = (vec![0; 400], vec![0; 400], vec![0; 399]);
    let err = interp::run(&kernel, &mut [&mut a, &mut b, &mut out], &Bindings::new()).unwrap_err();
    assert_eq!(
        err,
        InterpError::BufferTooSmall {
            kernel: "vector_add".into(),
            param: "out".into(),
            expected: 400,
            actual: 399
        }
    );
    assert!(err.to_string().contains("kernel `vector_add`"));
    let err = interp::run(&kernel, &mut [&mut a, &mut b], &Bindings::new()).unwrap_err();
    assert!(
        matches!(
            err,
            InterpError::BufferCount {
                expected: 3,
                actual: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unbound_and_out_of_range_dims_are_errors() {
    let var = Var::new("n", 1, 4096).unwrap();
    let kernel = samples::dynamic_vector_add(var, 64).unwrap();
    let (mut a, mut b, mut out) = (vec![0; 400], vec![0; 400], vec![0; 400]);
    let err = interp::run(&kernel, &mut [&mut a, &mut b, &mut out], &Bindings::new()).unwrap_err();
    assert!(
        matches!(&err, InterpError::Eval { kernel, source: EvalError::Unbound { .. }, .. } if kernel == "dynamic_vector_add"),
        "{err}"
    );
    assert!(err.to_string().contains("`n`"), "{err}");
    let dims = Bindings::new().with(var, 5000);
    let err = interp::run(&kernel, &mut [&mut a, &mut b, &mut out], &dims).unwrap_err();
    assert!(
        matches!(
            err,
            InterpError::Eval {
                source: EvalError::OutOfBounds { .. },
                ..
            }
        ),
        "{err}"
    );
    // Bound to 101, the 400-byte buffers are one element short.
    let dims = Bindings::new().with(var, 101);
    let err = interp::run(&kernel, &mut [&mut a, &mut b, &mut out], &dims).unwrap_err();
    assert!(
        matches!(err, InterpError::BufferTooSmall { expected: 404, .. }),
        "{err}"
    );
}

#[test]
fn unverifiable_kernels_are_rejected() {
    let mut kb = KernelBuilder::new("broken");
    let out = kb.buffer("out", DType::F32, 1, Access::Read);
    let zero = kb.constant(0i32);
    let one = kb.constant(1.0f32);
    kb.store(out, zero, one);
    let kernel = kb.finish_unverified();
    let mut ob = vec![0; 4];
    let err = interp::run(&kernel, &mut [&mut ob], &Bindings::new()).unwrap_err();
    assert!(matches!(err, InterpError::Verify(_)), "{err}");
    assert!(err.to_string().contains("kernel `broken`"), "{err}");
}

/// Every invocation increments a shared counter without synchronization and branches on
/// the value it read: the verifier sees a load at a uniform index (so, for it, a uniform
/// condition), but the race makes the condition differ between invocations.
fn racy_barrier_kernel(second_barrier: bool) -> tessel_ir::Kernel {
    let mut kb = KernelBuilder::new("racy_barrier");
    let counter = kb.buffer("counter", DType::I32, 1, Access::ReadWrite);
    kb.grid([1, 1, 1], [2, 1, 1]);
    let zero = kb.constant(0i32);
    let one = kb.constant(1i32);
    let seen = kb.load(counter, zero);
    let next = kb.add(seen, one);
    kb.store(counter, zero, next);
    let first = kb.binary(tessel_shape::BinaryOp::Eq, seen, zero);
    kb.if_(first, KernelBuilder::barrier);
    if second_barrier {
        let later = kb.binary(tessel_shape::BinaryOp::Ne, seen, zero);
        kb.if_(later, KernelBuilder::barrier);
    }
    kb.build().unwrap()
}

#[test]
fn barrier_divergence_is_an_error() {
    let mut counter = vec![0; 4];
    let err = interp::run(
        &racy_barrier_kernel(false),
        &mut [&mut counter],
        &Bindings::new(),
    )
    .unwrap_err();
    let InterpError::BarrierDivergence {
        ref kernel,
        group,
        ref detail,
    } = err
    else {
        panic!("expected BarrierDivergence, got {err}");
    };
    assert_eq!((kernel.as_str(), group), ("racy_barrier", [0, 0, 0]));
    assert!(detail.contains("(1, 0, 0) has finished"), "{detail}");

    // Waiting at two different barriers is divergence too, not a rendezvous.
    let mut counter = vec![0; 4];
    let err = interp::run(
        &racy_barrier_kernel(true),
        &mut [&mut counter],
        &Bindings::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("waits at the barrier %"), "{err}");
    assert!(err.to_string().contains("kernel `racy_barrier`"), "{err}");
}

#[test]
fn barriers_make_local_writes_visible() {
    // Each invocation writes its id to local memory, and after a barrier reads its right
    // neighbour's: correct only if every write lands before any read.
    let mut kb = KernelBuilder::new("rotate");
    let out = kb.buffer("out", DType::U32, 8, Access::Write);
    kb.grid([1, 1, 1], [8, 1, 1]);
    let shared = kb.local(DType::U32, 8);
    let lid = kb.local_id(0, DType::U32);
    kb.store(shared, lid, lid);
    kb.barrier();
    let (one, eight) = (kb.constant(1u32), kb.constant(8u32));
    let right = kb.add(lid, one);
    let right = kb.rem(right, eight);
    let v = kb.load(shared, right);
    let v = kb.ternary(TernaryOp::MulAdd, v, one, v);
    kb.store(out, lid, v);
    let kernel = kb.build().unwrap();
    let mut ob = vec![0; 32];
    interp::run(&kernel, &mut [&mut ob], &Bindings::new()).unwrap();
    let expected: Vec<u8> = (0..8u32)
        .flat_map(|i| ((i + 1) % 8 * 2).to_le_bytes())
        .collect();
    assert_eq!(ob, expected);
}
