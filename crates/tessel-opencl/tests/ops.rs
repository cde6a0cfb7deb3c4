//! Every op, cast and bitcast on every dtype a device supports, on every OpenCL device,
//! against the reference interpreter, on random bits mixed with the values where OpenCL C
//! and the reference most easily disagree: zeros of both signs, infinities, NaNs,
//! subnormals, `MIN`, `-1`, shift amounts past the width.
//!
//! Results must be equal bit for bit (NaN payloads aside), except the OpenCL built-in
//! transcendentals, which the OpenCL specification allows a few ulps (16 for `pow`) and
//! which the reference computes with the host's libm: those must agree within
//! [`transcendental_ulps`] (one ulp of the half types, whose `float` result is rounded).

mod common;

use common::{Rng, backend, devices, execute, interpret, supports};
use tessel_ir::{Access, Kernel, KernelBuilder};
use tessel_shape::{BinaryOp, Bindings, DType, Expr, TernaryOp, UnaryOp, Var, bf16, f16};

/// Elements per buffer: 64 workgroups of 64.
const N: usize = 4096;

/// The largest difference, in ulps of `f32`/`f64`, allowed between a device's built-in
/// transcendental and the reference's: the OpenCL 1.2 specification's bound for the
/// built-in plus one for the reference's own error (glibc's is below one ulp). `erf` is
/// fdlibm's in both, but calls the device's `exp`.
fn transcendental_ulps(op: Op) -> u64 {
    match op {
        Op::Unary(UnaryOp::Exp | UnaryOp::Exp2 | UnaryOp::Log | UnaryOp::Log2) => 3 + 1,
        Op::Unary(UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Tan) => 4 + 1,
        Op::Unary(UnaryOp::Tanh) => 5 + 1,
        Op::Binary(BinaryOp::Pow) => 16 + 1,
        _ => 4,
    }
}

/// Interesting values of `dtype`, as little-endian bytes.
fn specials(dtype: DType) -> Vec<Vec<u8>> {
    let f64s = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.5,
        -2.5,
        3.0,
        1e-40,
        -1e-310,
        65504.0,
        1e30,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MAX,
        f64::MIN_POSITIVE,
    ];
    match dtype {
        DType::Bool => vec![vec![0], vec![1]],
        DType::F16 => f64s
            .iter()
            .map(|&x| f16::from_f64(x).to_le_bytes().to_vec())
            .chain([vec![1, 0], vec![0xff, 0x03]])
            .collect(),
        DType::BF16 => f64s
            .iter()
            .map(|&x| bf16::from_f64(x).to_le_bytes().to_vec())
            .chain([vec![1, 0]])
            .collect(),
        DType::F32 => f64s
            .iter()
            .map(|&x| (x as f32).to_le_bytes().to_vec())
            .chain([f32::from_bits(1).to_le_bytes().to_vec()])
            .collect(),
        DType::F64 => f64s.iter().map(|&x| x.to_le_bytes().to_vec()).collect(),
        _ => {
            let size = dtype.size_bytes();
            let bits = dtype.bits() as u64;
            let (min, max) = (dtype.min_value().to_bits(), dtype.max_value().to_bits());
            [0, 1, 2, u64::MAX, min, max, bits - 1, bits, bits + 1, 7]
                .iter()
                .map(|v: &u64| v.to_le_bytes()[..size].to_vec())
                .collect()
        }
    }
}

/// `N` elements of `dtype`: a quarter special values, the rest random bits (random small
/// values for floats' second quarter, so that transcendentals see ordinary arguments).
fn data(rng: &mut Rng, dtype: DType) -> Vec<u8> {
    let specials = specials(dtype);
    let mut out = Vec::with_capacity(N * dtype.size_bytes());
    for _ in 0..N {
        let bits = rng.next_u64().to_le_bytes();
        let x = rng.unit() * 8.0;
        let element = match (rng.below(4), dtype) {
            (0, _) => specials[rng.below(specials.len() as u64) as usize].clone(),
            (_, DType::Bool) => vec![bits[0] & 1],
            (1, DType::F16) => f16::from_f64(x).to_le_bytes().to_vec(),
            (1, DType::BF16) => bf16::from_f64(x).to_le_bytes().to_vec(),
            (1, DType::F32) => (x as f32).to_le_bytes().to_vec(),
            (1, DType::F64) => x.to_le_bytes().to_vec(),
            _ => bits[..dtype.size_bytes()].to_vec(),
        };
        out.extend(element);
    }
    out
}

/// What one output of a test kernel computes.
#[derive(Clone, Copy, Debug)]
enum Op {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Ternary(TernaryOp),
    Cast(DType),
    Bitcast(DType),
}

impl Op {
    /// Whether OpenCL computes it with a built-in that is not correctly rounded.
    fn is_transcendental(self, dtype: DType) -> bool {
        match self {
            Op::Unary(op) => matches!(
                op,
                UnaryOp::Exp
                    | UnaryOp::Exp2
                    | UnaryOp::Log
                    | UnaryOp::Log2
                    | UnaryOp::Sin
                    | UnaryOp::Cos
                    | UnaryOp::Tan
                    | UnaryOp::Tanh
                    | UnaryOp::Erf
            ),
            Op::Binary(BinaryOp::Pow) => dtype.is_float(),
            _ => false,
        }
    }
}

/// A kernel reading `x`, `y`, `z` of `dtype` and writing one output per op.
fn kernel(name: &str, dtype: DType, ops: &[(Op, DType)]) -> Kernel {
    let mut kb = KernelBuilder::new(name);
    let inputs = ["x", "y", "z"].map(|n| kb.buffer(n, dtype, N, Access::Read));
    let outputs: Vec<_> = ops
        .iter()
        .enumerate()
        .map(|(k, (_, d))| kb.buffer(&format!("out{k}"), *d, N, Access::Write))
        .collect();
    kb.grid([N as i64 / 64, 1, 1], [64, 1, 1]);
    let i = kb.global_id(0, DType::I32);
    let [a, b, c] = inputs.map(|buf| kb.load(buf, i));
    for ((op, _), out) in ops.iter().zip(outputs) {
        let value = match *op {
            Op::Unary(op) => kb.unary(op, a),
            Op::Binary(op) => kb.binary(op, a, b),
            Op::Ternary(TernaryOp::Where) => {
                let cond = kb.lt(c, a);
                kb.select(cond, a, b)
            }
            Op::Ternary(op) => kb.ternary(op, a, b, c),
            Op::Cast(to) => kb.cast(a, to),
            Op::Bitcast(to) => kb.bitcast(a, to),
        };
        kb.store(out, i, value);
    }
    kb.build().unwrap()
}

/// A float's bits mapped to integers that order like the values (`-0` and `+0` both 0), so
/// that the difference of two is their distance in ulps.
fn ordered(dtype: DType, bytes: &[u8]) -> i128 {
    let (bits, sign) = match dtype {
        DType::F16 | DType::BF16 => (u64::from(u16::from_le_bytes([bytes[0], bytes[1]])), 15),
        DType::F32 => (u64::from(u32::from_le_bytes(bytes.try_into().unwrap())), 31),
        _ => (u64::from_le_bytes(bytes.try_into().unwrap()), 63),
    };
    let magnitude = i128::from(bits & ((1 << sign) - 1));
    if bits >> sign == 1 {
        -magnitude
    } else {
        magnitude
    }
}

fn is_nan(dtype: DType, bytes: &[u8]) -> bool {
    match dtype {
        DType::F16 => f16::from_le_bytes([bytes[0], bytes[1]]).is_nan(),
        DType::BF16 => bf16::from_le_bytes([bytes[0], bytes[1]]).is_nan(),
        DType::F32 => f32::from_le_bytes(bytes.try_into().unwrap()).is_nan(),
        DType::F64 => f64::from_le_bytes(bytes.try_into().unwrap()).is_nan(),
        _ => false,
    }
}

/// Whether `got` is an acceptable result for the reference's `want`.
fn agrees(op: Op, input: DType, out: DType, got: &[u8], want: &[u8]) -> bool {
    if got == want || (is_nan(out, got) && is_nan(out, want)) {
        return true;
    }
    if !op.is_transcendental(input) || is_nan(out, got) || is_nan(out, want) {
        return false;
    }
    // A half type's result is the `float` result rounded, so at most one ulp off.
    let ulps = if matches!(out, DType::F16 | DType::BF16) {
        1
    } else {
        transcendental_ulps(op)
    };
    ordered(out, got).abs_diff(ordered(out, want)) <= u128::from(ulps)
}

/// Runs the kernel of `ops` on every device and in the interpreter on the same data; fails
/// on any disagreement.
fn compare(name: &str, dtype: DType, ops: &[(Op, DType)], seed: u64) {
    let cl = backend();
    let kernel = kernel(name, dtype, ops);
    let mut rng = Rng(seed);
    let mut buffers: Vec<Vec<u8>> = (0..3).map(|_| data(&mut rng, dtype)).collect();
    buffers.extend(ops.iter().map(|(_, d)| vec![0; N * d.size_bytes()]));
    let mut want = None;
    for (device, device_name) in devices(cl, name) {
        if !supports(cl, device, &device_name, dtype)
            || ops
                .iter()
                .any(|(_, out)| !supports(cl, device, &device_name, *out))
        {
            continue;
        }
        let want = want.get_or_insert_with(|| interpret(&kernel, &buffers, &Bindings::new()));
        let got = execute(cl, device, &kernel, &buffers, &Bindings::new())
            .unwrap_or_else(|e| panic!("{device_name}: {e}"));
        let mut failures = Vec::new();
        for (k, (op, out)) in ops.iter().enumerate() {
            let size = out.size_bytes();
            for e in 0..N {
                let (g, w) = (
                    &got[3 + k][e * size..][..size],
                    &want[3 + k][e * size..][..size],
                );
                if !agrees(*op, dtype, *out, g, w) {
                    let input = |b: &Vec<u8>| {
                        format!(
                            "{:02x?}",
                            &b[e * dtype.size_bytes()..][..dtype.size_bytes()]
                        )
                    };
                    failures.push(format!(
                        "{op:?} on {dtype} -> {out}: inputs {} {} {}: device {g:02x?}, interpreter {w:02x?}",
                        input(&buffers[0]),
                        input(&buffers[1]),
                        input(&buffers[2])
                    ));
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{device_name}: {} mismatches, first ones:\n{}",
            failures.len(),
            failures[..failures.len().min(20)].join("\n")
        );
    }
}

#[test]
fn alu_ops_match_the_interpreter() {
    for (seed, dtype) in DType::ALL.into_iter().enumerate() {
        let mut ops = Vec::new();
        for op in UnaryOp::ALL {
            if let Some(d) = op.result_dtype(dtype) {
                ops.push((Op::Unary(op), d));
            }
        }
        for op in BinaryOp::ALL {
            if let Some(d) = op.result_dtype(dtype) {
                ops.push((Op::Binary(op), d));
            }
        }
        ops.push((Op::Ternary(TernaryOp::Where), dtype));
        // The verifier accepts `mad` on numbers only.
        if dtype != DType::Bool {
            ops.push((Op::Ternary(TernaryOp::MulAdd), dtype));
        }
        compare(&format!("alu_{dtype}"), dtype, &ops, seed as u64 + 100);
    }
}

#[test]
fn casts_and_bitcasts_match_the_interpreter() {
    for (seed, from) in DType::ALL.into_iter().enumerate() {
        // Casts to f64 are tested apart, so that devices without doubles test the rest.
        let mut ops: Vec<(Op, DType)> = DType::ALL
            .iter()
            .filter(|&&to| to != DType::F64 || from == DType::F64)
            .map(|&to| (Op::Cast(to), to))
            .collect();
        for to in DType::ALL {
            // The verifier rejects bitcasts to and from bool (and the reference would fail
            // on bytes other than 0 and 1).
            if to != from
                && to != DType::Bool
                && from != DType::Bool
                && to != DType::F64
                && to.size_bytes() == from.size_bytes()
            {
                ops.push((Op::Bitcast(to), to));
            }
        }
        compare(&format!("cast_{from}"), from, &ops, seed as u64 + 200);
        if from != DType::F64 {
            let mut to_f64 = vec![(Op::Cast(DType::F64), DType::F64)];
            if from.size_bytes() == 8 && from != DType::Bool {
                to_f64.push((Op::Bitcast(DType::F64), DType::F64));
            }
            compare(
                &format!("cast_{from}_f64"),
                from,
                &to_f64,
                seed as u64 + 300,
            );
        }
    }
}

/// OpenCL C may contract `a * b + c` into one rounding unless told not to; the dialect
/// turns contraction off, so a product and a sum stay two roundings, as in the reference.
#[test]
fn products_and_sums_are_not_fused() {
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
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let buffers = [bytes(&a), bytes(&b), bytes(&c), vec![0; N * 4]];
    let cl = backend();
    for (device, name) in devices(cl, "products_and_sums_are_not_fused") {
        let got = execute(cl, device, &kernel, &buffers, &Bindings::new()).unwrap();
        // Unfused, every result is exactly zero; fused, most are the product's error.
        assert!(
            got[3].iter().all(|&byte| byte == 0),
            "{name}: a * b + c was fused"
        );
    }
}

/// Equal, or NaN in both where the element is a float of `size` bytes (4 or 2).
fn same(a: &[u8], b: &[u8], size: usize) -> bool {
    let dtype = match size {
        4 => DType::F32,
        2 => DType::F16,
        _ => DType::U8,
    };
    a.chunks(size)
        .zip(b.chunks(size))
        .all(|(x, y)| x == y || (is_nan(dtype, x) && is_nan(dtype, y)))
}

#[test]
fn vectors_match_the_interpreter() {
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
    let mut buffers = vec![data(&mut rng, DType::F32), data(&mut rng, DType::F32)];
    buffers.extend([4, 2, 1, 4].map(|size| vec![0; N * size]));
    let want = interpret(&kernel, &buffers, &Bindings::new());
    let cl = backend();
    for (device, name) in devices(cl, "vectors_match_the_interpreter") {
        let got = execute(cl, device, &kernel, &buffers, &Bindings::new()).unwrap();
        for k in 2..6 {
            assert!(
                same(&got[k], &want[k], [4, 2, 1, 4][k - 2]),
                "{name}: output {k} differs"
            );
        }
    }
}

/// A 2-D workgroup where a float value and a register array live across barriers, and a
/// loop containing barriers runs to a bound loaded from memory.
#[test]
fn barriers_in_loops_match_the_interpreter() {
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
    let x_data: Vec<u8> = Rng(400)
        .f32s(len as usize)
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    let buffers = vec![
        x_data,
        3i32.to_le_bytes().to_vec(),
        vec![0; len as usize * 4],
    ];
    let want = interpret(&kernel, &buffers, &Bindings::new());
    assert_ne!(want[2], buffers[2], "the kernel wrote nothing");
    let cl = backend();
    for (device, name) in devices(cl, "barriers_in_loops_match_the_interpreter") {
        let got = execute(cl, device, &kernel, &buffers, &Bindings::new()).unwrap();
        assert_eq!(got[2], want[2], "{name}");
    }
}

/// Local sizes bound at launch.
#[test]
fn symbolic_local_sizes_match_the_interpreter() {
    let l = Var::new("l", 1, 64).unwrap();
    let len = 1000;
    let mut kb = KernelBuilder::new("symbolic_local");
    let x = kb.buffer("x", DType::F32, len, Access::Read);
    let out = kb.buffer("out", DType::F32, len, Access::Write);
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
        let v = kb.unary(UnaryOp::Sqrt, v);
        kb.store(out, i, v);
    });
    let kernel = kb.build().unwrap();
    let x_data: Vec<u8> = Rng(500)
        .f32s(len as usize)
        .iter()
        .flat_map(|f| f.abs().to_le_bytes())
        .collect();
    let cl = backend();
    for (device, name) in devices(cl, "symbolic_local_sizes_match_the_interpreter") {
        for local in [1, 7, 64] {
            let buffers = vec![x_data.clone(), vec![0; len as usize * 4]];
            let dims = Bindings::new().with(l, local);
            let want = interpret(&kernel, &buffers, &dims);
            let got = execute(cl, device, &kernel, &buffers, &dims).unwrap();
            assert_eq!(got[1], want[1], "{name}: local = {local}");
            assert_ne!(got[1], buffers[1]);
        }
    }
}
