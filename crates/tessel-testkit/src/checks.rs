//! The checks beyond single ops: vectors, barriers, symbolic launches, the sample kernels
//! against values computed directly in Rust, the program and buffer life cycle, and the
//! error paths every backend shares.

use std::time::Duration;

use tessel_ir::{Access, AtomicOp, BackendError, Inst, KernelBuilder, Mem, samples};
use tessel_shape::{BinaryOp, Bindings, DType, Expr, TernaryOp, UnaryOp, Var};

use crate::data::{Rng, add_in_rust, agrees, f32_bytes, f32_values, op_data, random_elements};
use crate::flush::Reference;
use crate::{Conformance, Op, interpret};

/// Elements per buffer of the vector kernels.
const N: usize = 4096;

impl Conformance<'_> {
    /// Vector loads and stores of width 4, vector arithmetic, casts, comparisons, lane
    /// extraction and splats.
    pub fn vectors_match_the_interpreter(&self) {
        let mut kb = KernelBuilder::new("vectors");
        let x = kb.buffer("x", DType::F32, N, Access::Read);
        let y = kb.buffer("y", DType::F32, N, Access::Read);
        let sums = kb.buffer("sums", DType::F32, N, Access::Write);
        let halves = kb.buffer("halves", DType::F16, N, Access::Write);
        let flags = kb.buffer("flags", DType::Bool, N, Access::Write);
        let splat = kb.buffer("splat", DType::F32, N, Access::Write);
        kb.grid([N as i64 / 4 / 64, 1, 1], [64, 1, 1]);
        let g = kb.global_id(0, DType::I32);
        let four = kb.constant_as(4, DType::I32);
        let i = kb.mul(g, four);
        let (a, b) = (kb.load_vec(x, i, 4), kb.load_vec(y, i, 4));
        let sum = kb.add(a, b);
        kb.store(sums, i, sum);
        let half = kb.cast(sum, DType::F16);
        let half = kb.binary(BinaryOp::Max, half, half);
        kb.store(halves, i, half);
        let flag = kb.lt(a, b);
        kb.store(flags, i, flag);
        let lane = kb.extract(sum, 2);
        let v = kb.vectorize(vec![lane; 4]);
        let v = kb.ternary(TernaryOp::MulAdd, v, a, b);
        kb.store(splat, i, v);
        let kernel = kb.build().unwrap();
        let mut rng = Rng(300);
        let mut buffers = vec![
            op_data(&mut rng, DType::F32, N),
            op_data(&mut rng, DType::F32, N),
        ];
        let outputs = [DType::F32, DType::F16, DType::Bool, DType::F32];
        buffers.extend(outputs.map(|d| vec![0; N * d.size_bytes()]));
        let dims = Bindings::new();
        let flush = self.info().features.subnormals_may_flush;
        let inputs = [(0, DType::F32), (1, DType::F32)];
        let reference = Reference::new(&kernel, &buffers, &inputs, &dims, flush);
        let Some(got) = self.execute_or_skip(
            "vectors",
            None,
            &[DType::F32, DType::F16, DType::Bool],
            &kernel,
            &buffers,
            &Bindings::new(),
        ) else {
            return;
        };
        // The last output is a `mad`, which the backend may round as its tolerance says.
        let mad = Op::Ternary(TernaryOp::MulAdd);
        let ulps = [0, 0, 0, (self.tolerance.ulps)(mad, DType::F32, DType::F32)];
        for (k, dtype) in outputs.into_iter().enumerate() {
            let size = dtype.size_bytes();
            let bad = (0..N).find(|&e| {
                !reference.accepts(2 + k, e, dtype, ulps[k], &got[2 + k][e * size..][..size])
            });
            if let Some(e) = bad {
                panic!(
                    "{}: vectors: output {} ({dtype}) differs from the interpreter at element \
                     {e}: device {:02x?}, interpreter {:02x?}, inputs {:02x?} {:02x?}",
                    self.label(),
                    2 + k,
                    &got[2 + k][e * size..][..size],
                    reference.element(2 + k, e, dtype),
                    &buffers[0][e / 4 * 16..][..16],
                    &buffers[1][e / 4 * 16..][..16],
                );
            }
        }
    }

    /// A 2-D workgroup where a float value and a register array live across barriers, and
    /// a loop containing barriers runs to a bound loaded from memory (the CPU backend's
    /// loop fission).
    pub fn barriers_in_loops_match_the_interpreter(&self) {
        let (lx, ly) = (8i64, 16i64);
        let len = 2 * lx * ly;
        let mut kb = KernelBuilder::new("barrier_loop");
        let x = kb.buffer("x", DType::F32, len, Access::Read);
        let count = kb.buffer("count", DType::I32, 1, Access::Read);
        let out = kb.buffer("out", DType::F32, len, Access::Write);
        kb.grid([2, 1, 1], [lx, ly, 1]);
        let scratch = kb.local(DType::F32, (lx * ly) as usize);
        let acc = kb.reg(DType::F32, 2);
        let (tx, ty) = (kb.local_id(0, DType::I32), kb.local_id(1, DType::I32));
        let g = kb.group_id(0, DType::I32);
        let (lx_v, ly_v) = (
            kb.constant_as(lx, DType::I32),
            kb.constant_as(ly, DType::I32),
        );
        let slot = kb.ternary(TernaryOp::MulAdd, ty, lx_v, tx);
        let base = kb.mul(g, ly_v);
        let row = kb.add(base, ty);
        let flat = kb.ternary(TernaryOp::MulAdd, row, lx_v, tx);
        let v = kb.load(x, flat);
        let two = kb.constant(2.0f32);
        let w = kb.mul(v, two);
        let zero = kb.constant_as(0, DType::I32);
        kb.store(acc, zero, w);
        let steps = kb.load(count, zero);
        kb.store(scratch, slot, v);
        kb.barrier();
        kb.range(zero, steps, |kb, r| {
            let shifted = kb.add(tx, r);
            let seven = kb.constant_as(lx - 1, DType::I32);
            let neighbour = kb.binary(BinaryOp::And, shifted, seven);
            let at = kb.ternary(TernaryOp::MulAdd, ty, lx_v, neighbour);
            let a = kb.load(scratch, at);
            let old = kb.load(acc, zero);
            let new = kb.add(old, a);
            kb.store(acc, zero, new);
            kb.barrier();
            kb.store(scratch, slot, new);
            kb.barrier();
        });
        let total = kb.load(acc, zero);
        let total = kb.add(total, w);
        let total = kb.add(total, v);
        kb.store(out, flat, total);
        let kernel = kb.build().unwrap();
        let buffers = vec![
            f32_bytes(&Rng(400).f32s(len as usize)),
            3i32.to_le_bytes().to_vec(),
            vec![0; len as usize * 4],
        ];
        let want = interpret(&kernel, &buffers, &Bindings::new());
        assert_ne!(want[2], buffers[2], "the kernel wrote nothing");
        let got = self.ok(
            self.execute(&kernel, &buffers, &Bindings::new()),
            "barrier_loop",
        );
        assert_eq!(got[2], want[2], "{}: barrier_loop", self.label());
    }

    /// Workgroup counts and sizes bound at launch (1, 7 and 64 invocations per workgroup),
    /// a guard for the ragged last workgroup, and `exp` and `sqrt` in the guarded body.
    pub fn symbolic_local_sizes_match_the_interpreter(&self) {
        let l = Var::new("l", 1, 64).unwrap();
        let len = 1000;
        let mut kb = KernelBuilder::new("symbolic_local");
        let x = kb.buffer("x", DType::F32, len, Access::Read);
        let exps = kb.buffer("exps", DType::F32, len, Access::Write);
        let roots = kb.buffer("roots", DType::F32, len, Access::Write);
        kb.grid(
            [
                Expr::constant(len).ceil_div(Expr::from(l)),
                Expr::constant(1),
                Expr::constant(1),
            ],
            [Expr::from(l), Expr::constant(1), Expr::constant(1)],
        );
        let i = kb.global_id(0, DType::I32);
        let n = kb.constant_as(len, DType::I32);
        let in_range = kb.lt(i, n);
        kb.if_(in_range, |kb| {
            let v = kb.load(x, i);
            let e = kb.unary(UnaryOp::Exp, v);
            kb.store(exps, i, e);
            let a = kb.unary(UnaryOp::Abs, v);
            let r = kb.unary(UnaryOp::Sqrt, a);
            kb.store(roots, i, r);
        });
        let kernel = kb.build().unwrap();
        let x_data = f32_bytes(&Rng(500).f32s(len as usize));
        let (exp_ulps, sqrt_ulps) = (
            (self.tolerance.ulps)(Op::Unary(UnaryOp::Exp), DType::F32, DType::F32),
            (self.tolerance.ulps)(Op::Unary(UnaryOp::Sqrt), DType::F32, DType::F32),
        );
        for local in [1, 7, 64] {
            let buffers = vec![
                x_data.clone(),
                vec![0; len as usize * 4],
                vec![0; len as usize * 4],
            ];
            let dims = Bindings::new().with(l, local);
            let want = interpret(&kernel, &buffers, &dims);
            let got = self.ok(
                self.execute(&kernel, &buffers, &dims),
                &format!("symbolic_local with local = {local}"),
            );
            for (k, ulps) in [(1, exp_ulps), (2, sqrt_ulps)] {
                assert_ne!(
                    got[k],
                    buffers[k],
                    "{}: the kernel wrote nothing",
                    self.label()
                );
                for (e, (g, w)) in got[k].chunks(4).zip(want[k].chunks(4)).enumerate() {
                    assert!(
                        agrees(DType::F32, ulps, g, w),
                        "{}: symbolic_local with local = {local}: output {k} element {e}: \
                         device {g:02x?}, interpreter {w:02x?} (allowed: {ulps} ulps)",
                        self.label()
                    );
                }
            }
        }
    }

    /// `a * b + c` stays two roundings, as in the reference (C-family languages may
    /// contract it into a fused multiply-add unless told not to, and so may a Vulkan driver
    /// compiling WGSL: naga marks no `NoContraction`, and the WGSL emitter makes products
    /// opaque instead).
    pub fn products_and_sums_are_not_fused(&self) {
        let mut kb = KernelBuilder::new("unfused");
        let [x, y, z] = ["x", "y", "z"].map(|n| kb.buffer(n, DType::F32, N, Access::Read));
        let out = kb.buffer("out", DType::F32, N, Access::Write);
        kb.grid([N as i64 / 64, 1, 1], [64, 1, 1]);
        let i = kb.global_id(0, DType::I32);
        let [a, b, c] = [x, y, z].map(|buf| kb.load(buf, i));
        let p = kb.mul(a, b);
        let s = kb.add(p, c);
        kb.store(out, i, s);
        let kernel = kb.build().unwrap();
        let mut rng = Rng(600);
        // Products whose rounding error the sum exposes: c = -round(a * b).
        let (a, b) = (rng.f32s(N), rng.f32s(N));
        let c: Vec<f32> = a.iter().zip(&b).map(|(x, y)| -(x * y)).collect();
        let buffers = [f32_bytes(&a), f32_bytes(&b), f32_bytes(&c), vec![0; N * 4]];
        let got = self.ok(self.execute(&kernel, &buffers, &Bindings::new()), "unfused");
        // Unfused, every result is exactly zero; fused, most are the product's error.
        assert!(
            got[3].iter().all(|&byte| byte == 0),
            "{}: a * b + c was fused",
            self.label()
        );
    }

    /// `samples::vector_add` on every dtype, against Rust's `+` (wrapping for integers,
    /// `or` for `bool`), into an output buffer filled with garbage.
    pub fn vector_add_every_dtype(&self) {
        let n = 1000;
        for dtype in DType::ALL {
            let mut rng = Rng(dtype as u64 + 1);
            let a = random_elements(&mut rng, dtype, n);
            let b = random_elements(&mut rng, dtype, n);
            let kernel = samples::vector_add(dtype, n, 64).unwrap();
            let out = vec![0xAB; n * dtype.size_bytes()];
            let what = format!("vector_add on {dtype}");
            if let Some(result) = self.execute_or_skip(
                &what,
                None,
                &[dtype],
                &kernel,
                &[a.clone(), b.clone(), out],
                &Bindings::new(),
            ) {
                assert_eq!(
                    result[2],
                    add_in_rust(dtype, &a, &b),
                    "{}: {what}",
                    self.label()
                );
            }
        }
    }

    /// `samples::permuted_copy`: a 3-D transpose through index arithmetic.
    pub fn permuted_copy(&self) {
        let (shape, perm) = ([5, 7, 9], [2, 0, 1]);
        let total = shape.iter().product::<usize>();
        let x = Rng(7).f32s(total);
        // out[o0, o1, o2] = x[i] where input axis perm[j] has coordinate o_j.
        let out_shape = perm.map(|p| shape[p]);
        let mut expected = Vec::with_capacity(total);
        for o0 in 0..out_shape[0] {
            for o1 in 0..out_shape[1] {
                for o2 in 0..out_shape[2] {
                    let mut at = [0; 3];
                    for (j, o) in [o0, o1, o2].into_iter().enumerate() {
                        at[perm[j]] = o;
                    }
                    expected.push(x[(at[0] * shape[1] + at[1]) * shape[2] + at[2]]);
                }
            }
        }
        let kernel = samples::permuted_copy(shape, perm).unwrap();
        let buffers = [f32_bytes(&x), vec![0; total * 4]];
        let result = self.ok(
            self.execute(&kernel, &buffers, &Bindings::new()),
            "permuted_copy",
        );
        assert_eq!(f32_values(&result[1]), expected, "{}", self.label());
    }

    /// `samples::row_sum`: a loop with a register accumulator, bit for bit against the
    /// same left-to-right sum in Rust.
    pub fn row_sum(&self) {
        let (rows, cols) = (100, 37);
        let x = Rng(11).f32s(rows * cols);
        // Left to right in f32, as the kernel sums: the same roundings, so the same bits.
        let expected: Vec<f32> = x
            .chunks(cols)
            .map(|row| row.iter().fold(0.0f32, |acc, v| acc + v))
            .collect();
        let kernel = samples::row_sum(rows, cols, DType::F32).unwrap();
        let buffers = [f32_bytes(&x), vec![0; rows * 4]];
        let result = self.ok(self.execute(&kernel, &buffers, &Bindings::new()), "row_sum");
        assert_eq!(f32_values(&result[1]), expected, "{}", self.label());
    }

    /// `samples::scatter`: 4096 atomic adds, and 4096 atomic maxima, into 7 elements (and
    /// some out of range, dropped), into a buffer holding garbage that the launch must zero,
    /// run twice. Values are small integers, so every order of the float adds gives the
    /// same bits. 32-bit types must work everywhere; a backend may refuse the 64-bit ones.
    pub fn atomic_adds_collide(&self) {
        let (n, bins) = (4096usize, 7usize);
        let mut rng = Rng(29);
        let idx: Vec<i32> = (0..n)
            .map(|_| rng.below(bins as u64 + 4) as i32 - 2)
            .collect();
        let vals: Vec<i64> = (0..n).map(|_| rng.below(100) as i64).collect();
        let mut sums = vec![0i64; bins];
        let mut maxima = vec![0i64; bins];
        for (&at, &v) in idx.iter().zip(&vals) {
            if let Ok(at) = usize::try_from(at)
                && at < bins
            {
                sums[at] += v;
                maxima[at] = maxima[at].max(v);
            }
        }
        let idx_bytes: Vec<u8> = idx.iter().flat_map(|v| v.to_le_bytes()).collect();
        let cases = [
            (AtomicOp::Add, DType::F32, &sums),
            (AtomicOp::Add, DType::I32, &sums),
            (AtomicOp::Add, DType::U32, &sums),
            (AtomicOp::Add, DType::F64, &sums),
            (AtomicOp::Add, DType::I64, &sums),
            (AtomicOp::Add, DType::U64, &sums),
            (AtomicOp::Max, DType::U32, &maxima),
            (AtomicOp::Max, DType::U64, &maxima),
        ];
        for (op, dtype, expected) in cases {
            let bytes = |values: &[i64]| -> Vec<u8> {
                values
                    .iter()
                    .flat_map(|&v| {
                        let s = tessel_shape::Scalar::I64(v).cast(dtype);
                        s.to_bits().to_le_bytes()[..dtype.size_bytes()].to_vec()
                    })
                    .collect()
            };
            let kernel = samples::scatter(op, dtype, n, bins).unwrap();
            let what = format!("atomic {} on {dtype}", op.name());
            let buffers = [
                idx_bytes.clone(),
                bytes(&vals),
                vec![0xAB; bins * dtype.size_bytes()],
            ];
            for run in 0..2 {
                match self.execute(&kernel, &buffers, &Bindings::new()) {
                    Ok(result) => {
                        assert_eq!(
                            result[2],
                            bytes(expected),
                            "{}: {what}, run {run}",
                            self.label()
                        );
                    }
                    Err(e) if dtype.size_bytes() == 8 => {
                        crate::skip(
                            &self.test_name(),
                            &format!("{}: {what}: refused: {e}", self.device_name()),
                        );
                        break;
                    }
                    Err(e) => panic!("{}: {what} failed: {e}", self.label()),
                }
            }
        }
    }

    /// `compare::differences`: two buffers of every float dtype (NaN, infinities, equal
    /// and distant elements; longer than one pass of the grid), the workgroups' summaries
    /// folded, against the same maxima computed in Rust in the kernel's arithmetic
    /// (maxima do not depend on the order, so the bits agree). A backend may refuse `f64`.
    pub fn buffer_differences_on_the_device(&self) {
        use tessel_ir::compare::{self, Differences};
        let n = 140_001;
        let mut rng = Rng(31);
        let special = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0];
        let mut x = Vec::with_capacity(n);
        let mut y = Vec::with_capacity(n);
        for i in 0..n {
            let v = f64::from(rng.f32s(1)[0]) * 8.0;
            let p = if i % 9973 == 5 { special[i % 4] } else { v };
            let q = match i % 3 {
                0 => p,
                1 => p + f64::from(rng.f32s(1)[0]) / 64.0,
                _ if i % 7919 == 2 => special[(i / 3) % 4],
                _ => p,
            };
            x.push(p);
            y.push(q);
        }
        let dims = Bindings::new().with(compare::length(), n as i64);
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            let bytes = |values: &[f64]| -> Vec<u8> {
                values
                    .iter()
                    .flat_map(|&v| {
                        let s = tessel_shape::Scalar::F64(v).cast(dtype);
                        s.to_bits().to_le_bytes()[..dtype.size_bytes()].to_vec()
                    })
                    .collect()
            };
            let kernel = compare::differences(dtype).unwrap();
            let wide = compare::summary_dtype(dtype);
            let buffers = [
                bytes(&x),
                bytes(&y),
                vec![0xAB; 2 * compare::GROUPS * wide.size_bytes()],
            ];
            let want = expected_differences(&x, &y, dtype);
            assert!(want.worst.is_infinite() && want.largest > 7.0, "{want:?}");
            match self.execute(&kernel, &buffers, &dims) {
                Ok(got) => assert_eq!(
                    Differences::read(&got[2], dtype),
                    want,
                    "{}: {dtype}",
                    self.label()
                ),
                Err(e) if dtype == DType::F64 => crate::skip(
                    &self.test_name(),
                    &format!("{}: differences on f64: refused: {e}", self.device_name()),
                ),
                Err(e) => panic!("{}: differences on {dtype} failed: {e}", self.label()),
            }
        }
    }

    /// `samples::tree_reduce`: pairwise halving through local memory with barriers, bit for
    /// bit against the same order in Rust.
    pub fn tree_reduce_with_barriers(&self) {
        let (n, local) = (1000, 64);
        let x = Rng(13).f32s(n);
        let groups = n.div_ceil(local);
        // The kernel's own order: pairwise halving within each workgroup, zeros past n.
        let expected: Vec<f32> = (0..groups)
            .map(|g| {
                let mut scratch: Vec<f32> = (0..local)
                    .map(|l| x.get(g * local + l).copied().unwrap_or(0.0))
                    .collect();
                let mut stride = local / 2;
                while stride > 0 {
                    for l in 0..stride {
                        scratch[l] += scratch[l + stride];
                    }
                    stride /= 2;
                }
                scratch[0]
            })
            .collect();
        let kernel = samples::tree_reduce(n, local).unwrap();
        let buffers = [f32_bytes(&x), vec![0; groups * 4]];
        let result = self.ok(
            self.execute(&kernel, &buffers, &Bindings::new()),
            "tree_reduce",
        );
        assert_eq!(f32_values(&result[1]), expected, "{}", self.label());
    }

    /// `samples::tiled_matmul`: tiles in local memory, bit for bit against the kernel's own
    /// order (one fused multiply-add per step, `k` ascending) where the backend's tolerance
    /// allows no ulps for `f32` `mad`. Where it allows some (a `mad` that may round the
    /// product first), each of the `k` steps rounds twice, and the result may differ from
    /// the fused one by twice the dot product's usual bound, `2 k EPSILON/2 sum |a b|`.
    pub fn tiled_matmul_with_local_memory(&self) {
        let (m, n, k, tile) = (64, 64, 64, 16);
        let mut rng = Rng(17);
        let (a, b) = (rng.f32s(m * k), rng.f32s(k * n));
        let mut expected = vec![0.0f32; m * n];
        let mut magnitude = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                expected[i * n + j] =
                    (0..k).fold(0.0f32, |acc, p| a[i * k + p].mul_add(b[p * n + j], acc));
                magnitude[i * n + j] = (0..k)
                    .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                    .map(f64::abs)
                    .sum();
            }
        }
        let kernel = samples::tiled_matmul(m, n, k, tile).unwrap();
        let buffers = [f32_bytes(&a), f32_bytes(&b), vec![0; m * n * 4]];
        let c = self.ok(
            self.execute(&kernel, &buffers, &Bindings::new()),
            "tiled_matmul",
        );
        let got = f32_values(&c[2]);
        let ulps = (self.tolerance.ulps)(Op::Ternary(TernaryOp::MulAdd), DType::F32, DType::F32);
        if ulps == 0 {
            assert_eq!(got, expected, "{}", self.label());
            return;
        }
        let scale = k as f64 * f64::from(f32::EPSILON);
        for (e, ((&g, &w), &sum)) in got.iter().zip(&expected).zip(&magnitude).enumerate() {
            let allowed = scale * sum;
            assert!(
                (f64::from(g) - f64::from(w)).abs() <= allowed,
                "{}: tiled_matmul: element {e}: got {g}, want {w} (allowed: {allowed:e})",
                self.label()
            );
        }
    }

    /// One program with a dynamic length serves two launches of different lengths;
    /// compiling it again gives a program of its own, and each is released exactly once.
    /// (A backend's own test can count the compiles around this check.)
    pub fn dynamic_dims_compile_once(&self) {
        let (b, device) = (self.backend, self.device);
        let var = Var::new("n", 1, 1 << 20).unwrap();
        let kernel = samples::dynamic_vector_add(var, 64).unwrap();
        let program = self.ok(b.compile(device, &kernel), "compile");
        for n in [1000, 4097] {
            let mut rng = Rng(n as u64);
            let (x, y) = (rng.f32s(n), rng.f32s(n));
            let ids: Vec<_> = [f32_bytes(&x), f32_bytes(&y), vec![0; n * 4]]
                .iter()
                .map(|data| {
                    let id = self.ok(b.alloc(device, data.len()), "alloc");
                    self.ok(b.write(id, 0, data), "write");
                    id
                })
                .collect();
            self.ok(
                b.launch(program, &ids, &Bindings::new().with(var, n as i64)),
                "launch",
            );
            self.ok(b.synchronize(device), "synchronize");
            let mut out = vec![0; n * 4];
            self.ok(b.read(ids[2], 0, &mut out), "read");
            let expected: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
            assert_eq!(f32_values(&out), expected, "{}: n = {n}", self.label());
            for id in ids {
                self.ok(b.free(id), "free");
            }
        }
        let again = self.ok(b.compile(device, &kernel), "compile again");
        self.ok(b.release(again), "release");
        self.ok(b.release(program), "release");
        assert!(
            b.release(program).is_err(),
            "{}: a program released twice",
            self.label()
        );
    }

    /// The same buffer bound to two parameters: `out = a + b` with `out` and `a` one
    /// buffer, an in-place update.
    pub fn one_buffer_bound_twice(&self) {
        let (b, device) = (self.backend, self.device);
        let n = 300;
        let kernel = samples::vector_add(DType::I32, n, 64).unwrap();
        let x_values: Vec<i32> = (0..n as i32).collect();
        let y_values: Vec<i32> = (0..n as i32).map(|i| 1000 * i).collect();
        let bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let program = self.ok(b.compile(device, &kernel), "compile");
        let (x, y) = (
            self.ok(b.alloc(device, n * 4), "alloc"),
            self.ok(b.alloc(device, n * 4), "alloc"),
        );
        self.ok(b.write(x, 0, &bytes(&x_values)), "write");
        self.ok(b.write(y, 0, &bytes(&y_values)), "write");
        self.ok(b.launch(program, &[x, y, x], &Bindings::new()), "launch");
        let mut out = vec![0; n * 4];
        self.ok(b.read(x, 0, &mut out), "read");
        let expected: Vec<i32> = x_values.iter().zip(&y_values).map(|(p, q)| p + q).collect();
        assert_eq!(out, bytes(&expected), "{}", self.label());
        for id in [x, y] {
            self.ok(b.free(id), "free");
        }
        self.ok(b.release(program), "release");
    }

    /// `time` runs the launch and measures a positive, plausible duration.
    pub fn launches_are_timed(&self) {
        let (b, device) = (self.backend, self.device);
        let n = 1 << 16;
        let kernel = samples::vector_add(DType::F32, n, 64).unwrap();
        let program = self.ok(b.compile(device, &kernel), "compile");
        let ids: Vec<_> = (0..3)
            .map(|_| self.ok(b.alloc(device, n * 4), "alloc"))
            .collect();
        let data = f32_bytes(&Rng(19).f32s(n));
        self.ok(b.write(ids[0], 0, &data), "write");
        self.ok(b.write(ids[1], 0, &data), "write");
        let elapsed = self.ok(b.time(program, &ids, &Bindings::new()), "time");
        assert!(
            elapsed > Duration::ZERO && elapsed.as_secs() < 60,
            "{}: {elapsed:?}",
            self.label()
        );
        let mut out = vec![0; n * 4];
        self.ok(b.read(ids[2], 0, &mut out), "read");
        let doubled: Vec<f32> = f32_values(&data).iter().map(|x| x + x).collect();
        assert_eq!(f32_values(&out), doubled, "{}", self.label());
        for id in ids {
            self.ok(b.free(id), "free");
        }
        self.ok(b.release(program), "release");
    }

    /// A kernel the verifier rejects is a `Compile` error naming the kernel, with the
    /// verifier's message as its log.
    pub fn kernels_failing_verification_are_compile_errors(&self) {
        let mut kb = KernelBuilder::new("writes_read_only");
        kb.buffer("a", DType::F32, 4, Access::Read);
        let i = kb.constant_as(0, DType::I32);
        let x = kb.constant(1.0f32);
        kb.push(Inst::Store {
            mem: Mem::Global(0),
            index: i,
            value: x,
        });
        let kernel = kb.finish_unverified();
        let label = self.label();
        let err = self.fails(
            self.backend.compile(self.device, &kernel),
            "compiling an invalid kernel",
        );
        let BackendError::Compile {
            kernel: name, log, ..
        } = &err
        else {
            panic!("{label}: {err:?}")
        };
        assert_eq!(name, "writes_read_only", "{label}");
        assert!(log.contains("declared Read"), "{label}: {log}");
    }

    /// Kernel names are free text; generated code must not depend on them being
    /// identifiers.
    pub fn any_kernel_name_compiles(&self) {
        let mut kernel = samples::vector_add(DType::I8, 10, 4).unwrap();
        "add */ int #define x\n \"quoted\" é".clone_into(&mut kernel.name);
        let (a, b) = (vec![1u8; 10], vec![2u8; 10]);
        let out = self.ok(
            self.execute(&kernel, &[a, b, vec![0; 10]], &Bindings::new()),
            "a kernel with an odd name",
        );
        assert_eq!(out[2], vec![3u8; 10], "{}", self.label());
    }

    /// A launch with a buffer too small for its parameter, too few buffers, or an unbound
    /// dim is an `InvalidArgument` naming the problem.
    pub fn too_small_buffers_are_rejected(&self) {
        let label = self.label();
        let kernel = samples::vector_add(DType::F32, 100, 64).unwrap();
        let err = self.fails(
            self.execute(
                &kernel,
                &[vec![0; 400], vec![0; 399], vec![0; 400]],
                &Bindings::new(),
            ),
            "a launch with a too small buffer",
        );
        let BackendError::InvalidArgument(msg) = &err else {
            panic!("{label}: {err:?}")
        };
        for part in ["vector_add", "`b`", "400 bytes", "399 bytes"] {
            assert!(msg.contains(part), "{label}: {msg}");
        }
        let err = self.fails(
            self.execute(&kernel, &[vec![0; 400], vec![0; 400]], &Bindings::new()),
            "a launch with too few buffers",
        );
        assert!(
            matches!(err, BackendError::InvalidArgument(_)),
            "{label}: {err:?}"
        );
        let var = Var::new("n", 1, 1 << 20).unwrap();
        let dynamic = samples::dynamic_vector_add(var, 64).unwrap();
        let err = self.fails(
            self.execute(&dynamic, &vec![vec![0; 400]; 3], &Bindings::new()),
            "a launch with an unbound dim",
        );
        assert!(
            matches!(err, BackendError::InvalidArgument(_)),
            "{label}: {err:?}"
        );
    }

    /// A hand-written kernel whose indices are data (far outside, negative, at the edge):
    /// loads outside a buffer read zeros and stores outside are dropped, on every backend,
    /// instead of touching memory the kernel does not own.
    pub fn unproven_accesses_are_guarded(&self) {
        let label = self.label();
        let mut kb = KernelBuilder::new("data_indexed");
        let src = kb.buffer("src", DType::I32, 4, Access::Read);
        let idx = kb.buffer("idx", DType::I32, 8, Access::Read);
        let out = kb.buffer("out", DType::I32, 8, Access::Write);
        let hits = kb.buffer("hits", DType::I32, 4, Access::Write);
        kb.grid([1, 1, 1], [8, 1, 1]);
        let i = kb.local_id(0, DType::I32);
        let j = kb.load(idx, i);
        let v = kb.load(src, j);
        kb.store(out, i, v);
        kb.store(hits, j, i);
        let kernel = kb.build().unwrap();
        let ints = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let indices = [3, -1, 4, 0, i32::MAX, 2, i32::MIN, 1 << 28];
        let got = self
            .execute(
                &kernel,
                &[
                    ints(&[10, 11, 12, 13]),
                    ints(&indices),
                    ints(&[7; 8]),
                    ints(&[-5; 4]),
                ],
                &Bindings::new(),
            )
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let read = |b: &[u8]| -> Vec<i32> {
            b.chunks(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        assert_eq!(read(&got[2]), [13, 0, 0, 10, 0, 12, 0, 0], "{label}: loads");
        assert_eq!(read(&got[3]), [3, -5, 5, 0], "{label}: stores");
    }

    /// Writes at offsets, reads of a tail, copies (also onto itself), range checks, empty
    /// buffers, use after free, huge allocations, out-of-range devices, and a plausible
    /// device description.
    pub fn memory_and_transfers_are_checked(&self) {
        let (cl, device, name) = (self.backend, self.device, self.label());
        let (a, b) = (
            self.ok(cl.alloc(device, 100), "alloc"),
            self.ok(cl.alloc(device, 50), "alloc"),
        );
        self.ok(cl.write(a, 0, &[7; 100]), "write");
        self.ok(cl.write(a, 10, &[9; 5]), "write at an offset");
        self.ok(cl.copy(a, b, 50), "copy");
        let mut out = [0; 50];
        self.ok(cl.read(b, 0, &mut out), "read");
        let mut expected = [7; 50];
        expected[10..15].fill(9);
        assert_eq!(out, expected, "{name}");
        let mut tail = [0; 3];
        self.ok(cl.read(a, 97, &mut tail), "read at an offset");
        assert_eq!(tail, [7; 3], "{name}");
        self.ok(cl.copy(a, a, 100), "copy onto itself");
        // A fill sets a prefix and leaves the rest.
        self.ok(cl.fill(b, 0xab, 20), "fill");
        self.ok(cl.read(b, 0, &mut out), "read after a fill");
        expected[..20].fill(0xab);
        assert_eq!(out, expected, "{name}: fill");
        assert!(cl.fill(b, 0, 51).is_err(), "{name}: fill past the end");
        self.ok(cl.fill(b, 0, 0), "empty fill");
        assert!(cl.copy(a, b, 51).is_err(), "{name}: copy past the end");
        assert!(
            cl.write(a, 90, &[0; 11]).is_err(),
            "{name}: write past the end"
        );
        assert!(
            cl.read(a, usize::MAX, &mut [0; 2]).is_err(),
            "{name}: read at an overflowing offset"
        );
        // Empty buffers and transfers are fine.
        let empty = self.ok(cl.alloc(device, 0), "alloc of 0 bytes");
        self.ok(cl.write(empty, 0, &[]), "empty write");
        self.ok(cl.read(empty, 0, &mut []), "empty read");
        self.ok(cl.free(empty), "free");
        self.ok(cl.free(a), "free");
        assert!(
            matches!(
                cl.read(a, 0, &mut [0; 1]),
                Err(BackendError::InvalidArgument(_))
            ),
            "{name}: read after free"
        );
        assert!(cl.free(a).is_err(), "{name}: double free");
        self.ok(cl.free(b), "free");
        for bytes in [1 << 60, 1 << 62, usize::MAX] {
            let err = self.fails(cl.alloc(device, bytes), &format!("alloc of {bytes} bytes"));
            assert!(
                matches!(err, BackendError::OutOfMemory { requested, .. } if requested == bytes),
                "{name}: {err:?}"
            );
        }
        let info = self.info();
        // `compute_units` may be 0: wgpu cannot query it, and 0 means unknown.
        assert!(
            info.max_workgroup_size >= 1
                && info.memory_bytes > 0
                && info.local_memory_bytes > 0
                && !info.name.is_empty(),
            "{name}: {info:?}"
        );
        self.ok(cl.synchronize(device), "synchronize");
        let count = cl.devices().len();
        assert!(
            matches!(cl.alloc(count, 16), Err(BackendError::InvalidArgument(_))),
            "{name}: alloc on device {count} of {count}"
        );
        assert!(
            matches!(cl.synchronize(count), Err(BackendError::InvalidArgument(_))),
            "{name}: synchronize on device {count} of {count}"
        );
    }
}

/// What `compare::differences` must find for `x` against `y` stored as `dtype`: the same
/// arithmetic in the kernel's summary dtype (`f32`, or `f64` for `f64`).
fn expected_differences(x: &[f64], y: &[f64], dtype: DType) -> tessel_ir::compare::Differences {
    fn fold<F: Into<f64> + Copy>(
        pairs: impl Iterator<Item = (F, F)>,
        abs_diff: fn(F, F) -> F,
    ) -> (f64, f64) {
        pairs.fold((0.0f64, 0.0f64), |(largest, worst), (p, q)| {
            let (pf, qf): (f64, f64) = (p.into(), q.into());
            let largest = if pf.abs() < f64::INFINITY {
                largest.max(pf.abs())
            } else {
                largest
            };
            let same = pf == qf || (pf.is_nan() && qf.is_nan());
            let d: f64 = abs_diff(p, q).into();
            let d = if same {
                0.0
            } else if d.is_nan() {
                f64::INFINITY
            } else {
                d
            };
            (largest, worst.max(d))
        })
    }
    let stored = |v: f64| tessel_shape::Scalar::F64(v).cast(dtype).to_f64();
    let pairs = x.iter().zip(y).map(|(&p, &q)| (stored(p), stored(q)));
    let (largest, worst) = if dtype == DType::F64 {
        fold(pairs, |p, q| (p - q).abs())
    } else {
        // Narrow floats widen to f32 exactly; the kernel subtracts in f32.
        fold(
            pairs.map(|(p, q)| (p as f32, q as f32)),
            |p: f32, q: f32| (p - q).abs(),
        )
    };
    tessel_ir::compare::Differences { largest, worst }
}
