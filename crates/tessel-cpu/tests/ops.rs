//! Every op, cast and bitcast on every dtype, compiled C against the reference
//! interpreter, bit for bit (NaN payloads aside), on random bits mixed with the values
//! where C and the reference most easily disagree: zeros of both signs, infinities, NaNs,
//! subnormals, `MIN`, `-1`, shift amounts past the width.

mod common;

use common::{Rng, compiled, execute, interpreted};
use tessel_ir::{Access, Kernel, KernelBuilder};
use tessel_shape::{BinaryOp, Bindings, DType, Expr, TernaryOp, UnaryOp, Var, bf16, f16};

/// Elements per buffer: 64 workgroups of 64.
const N: usize = 4096;

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

/// Runs `kernel` compiled and interpreted on the same data; fails on any difference.
fn compare(name: &str, dtype: DType, ops: &[(Op, DType)], seed: u64) {
    let kernel = kernel(name, dtype, ops);
    let mut rng = Rng(seed);
    let mut buffers: Vec<Vec<u8>> = (0..3).map(|_| data(&mut rng, dtype)).collect();
    buffers.extend(ops.iter().map(|(_, d)| vec![0; N * d.size_bytes()]));
    let (native, reference) = (
        compiled(&format!("ops-{name}")),
        interpreted(&format!("ops-ref-{name}")),
    );
    if native.compiler_path().is_none() {
        return;
    }
    let got = execute(&native, &kernel, &buffers, &Bindings::new()).unwrap();
    let want = execute(&reference, &kernel, &buffers, &Bindings::new()).unwrap();
    let mut failures = Vec::new();
    for (k, (op, out)) in ops.iter().enumerate() {
        let size = out.size_bytes();
        for e in 0..N {
            let (g, w) = (
                &got[3 + k][e * size..][..size],
                &want[3 + k][e * size..][..size],
            );
            if g != w && !(is_nan(*out, g) && is_nan(*out, w)) {
                let input = |b: &Vec<u8>| {
                    format!(
                        "{:02x?}",
                        &b[e * dtype.size_bytes()..][..dtype.size_bytes()]
                    )
                };
                failures.push(format!(
                    "{op:?} on {dtype} -> {out}: inputs {} {} {}: compiled {g:02x?}, interpreter {w:02x?}",
                    input(&buffers[0]),
                    input(&buffers[1]),
                    input(&buffers[2])
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches, first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
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
        let mut ops: Vec<(Op, DType)> = DType::ALL.iter().map(|&to| (Op::Cast(to), to)).collect();
        for to in DType::ALL {
            // The verifier rejects bitcasts to and from bool (and the reference would fail
            // on bytes other than 0 and 1).
            if to != from
                && to != DType::Bool
                && from != DType::Bool
                && to.size_bytes() == from.size_bytes()
            {
                ops.push((Op::Bitcast(to), to));
            }
        }
        compare(&format!("cast_{from}"), from, &ops, seed as u64 + 200);
    }
}

/// The contents of a kernel's buffers, in parameter order.
type Buffers = Vec<Vec<u8>>;

/// Runs `kernel` compiled and interpreted on the same buffers; returns both results.
fn both(
    name: &str,
    kernel: &Kernel,
    buffers: &[Vec<u8>],
    dims: &Bindings,
) -> Option<(Buffers, Buffers)> {
    let native = compiled(&format!("both-{name}"));
    native.compiler_path()?;
    let got = execute(&native, kernel, buffers, dims).unwrap();
    let want = execute(
        &interpreted(&format!("both-ref-{name}")),
        kernel,
        buffers,
        dims,
    )
    .unwrap();
    Some((got, want))
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
    if let Some((got, want)) = both("vectors", &kernel, &buffers, &Bindings::new()) {
        for k in 2..6 {
            assert!(
                same(&got[k], &want[k], [4, 2, 1, 4][k - 2]),
                "output {k} differs"
            );
        }
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

/// Loop fission on a 2-D workgroup: a float value and a register array live across
/// barriers, and a loop containing barriers runs to a bound loaded from memory.
#[test]
fn barrier_fission_matches_the_interpreter() {
    let (lx, ly) = (8i64, 16i64);
    let len = 2 * lx * ly;
    let mut kb = KernelBuilder::new("fission");
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
    let buffers = [
        x_data,
        3i32.to_le_bytes().to_vec(),
        vec![0; len as usize * 4],
    ];
    if let Some((got, want)) = both("fission", &kernel, &buffers, &Bindings::new()) {
        assert_eq!(got[2], want[2]);
        assert_ne!(got[2], buffers[2], "the kernel wrote nothing");
    }
}

/// Local sizes bound at launch, in a kernel without barriers.
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
        let v = kb.unary(UnaryOp::Exp, v);
        kb.store(out, i, v);
    });
    let kernel = kb.build().unwrap();
    let x_data: Vec<u8> = Rng(500)
        .f32s(len as usize)
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    for local in [1, 7, 64] {
        let buffers = [x_data.clone(), vec![0; len as usize * 4]];
        if let Some((got, want)) = both(
            &format!("symbolic-{local}"),
            &kernel,
            &buffers,
            &Bindings::new().with(l, local),
        ) {
            assert_eq!(got[1], want[1], "local = {local}");
            assert_ne!(got[1], buffers[1]);
        }
    }
}
