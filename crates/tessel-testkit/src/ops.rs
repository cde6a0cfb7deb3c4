//! Every op, cast and bitcast on every dtype against the reference interpreter, on random
//! bits mixed with the values where a target language and the reference most easily
//! disagree: zeros of both signs, infinities, NaNs, subnormals, `MIN`, `-1`, shift amounts
//! past the width. Results must agree bit for bit (NaN payloads aside) except where the
//! backend's [`Tolerance`](crate::Tolerance) allows ulps, and, on a device that may flush
//! subnormals to zero, where flushing explains the difference (see [`crate::flush`]).

use std::fmt;

use tessel_ir::{Access, Kernel, KernelBuilder};
use tessel_shape::{BinaryOp, Bindings, DType, TernaryOp, UnaryOp};

use crate::Conformance;
use crate::data::{Rng, op_data};
use crate::flush::Reference;

/// Elements per buffer of the op kernels: 64 workgroups of 64.
const N: usize = 4096;

/// What one output of an op kernel computes from its inputs `x`, `y`, `z` (`where` selects
/// `x` where `z < x`, else `y`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `op(x)`.
    Unary(UnaryOp),
    /// `op(x, y)`.
    Binary(BinaryOp),
    /// `op(x, y, z)`.
    Ternary(TernaryOp),
    /// `x` converted to the dtype.
    Cast(DType),
    /// `x`'s bits as the dtype.
    Bitcast(DType),
}

impl Op {
    /// Whether the op on `input` is one a C-family target usually computes with a built-in
    /// that is not correctly rounded: `exp`, `exp2`, `log`, `log2`, `sin`, `cos`, `tan`,
    /// `tanh`, `erf`, and `pow` on floats (a starting point for a [`Tolerance`]'s `ulps`).
    ///
    /// [`Tolerance`]: crate::Tolerance
    pub fn is_transcendental(self, input: DType) -> bool {
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
            Op::Binary(BinaryOp::Pow) => input.is_float(),
            _ => false,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Unary(op) => write!(f, "{}", op.name()),
            Op::Binary(op) => write!(f, "{}", op.name()),
            Op::Ternary(op) => write!(f, "{op:?}"),
            Op::Cast(to) => write!(f, "cast to {to}"),
            Op::Bitcast(to) => write!(f, "bitcast to {to}"),
        }
    }
}

/// A kernel reading `x`, `y`, `z` of `dtype` and writing one output per op.
fn op_kernel(name: &str, dtype: DType, ops: &[(Op, DType)]) -> Kernel {
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

impl Conformance<'_> {
    /// Every unary, binary and ternary op on every dtype that has it.
    pub fn alu_ops_match_the_interpreter(&self) {
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
            self.compare_ops(&format!("alu_{dtype}"), dtype, &ops, seed as u64 + 100);
        }
    }

    /// Every cast between dtypes, and every bitcast between dtypes of one size, the float8
    /// storage dtypes included (on all 256 of their bit patterns, which the random inputs
    /// cover).
    pub fn casts_and_bitcasts_match_the_interpreter(&self) {
        let every = || DType::ALL.into_iter().chain(DType::FLOAT8);
        for (seed, from) in every().enumerate() {
            // Casts to f64 are a kernel apart, so that devices without doubles test the rest.
            let mut ops: Vec<(Op, DType)> = every()
                .filter(|&to| to != DType::F64 || from == DType::F64)
                .map(|to| (Op::Cast(to), to))
                .collect();
            for to in every() {
                // The verifier rejects bitcasts to and from bool (and the reference would
                // fail on bytes other than 0 and 1).
                if to != from
                    && to != DType::Bool
                    && from != DType::Bool
                    && to != DType::F64
                    && to.size_bytes() == from.size_bytes()
                {
                    ops.push((Op::Bitcast(to), to));
                }
            }
            self.compare_ops(&format!("cast_{from}"), from, &ops, seed as u64 + 200);
            if from != DType::F64 {
                let mut to_f64 = vec![(Op::Cast(DType::F64), DType::F64)];
                if from.size_bytes() == 8 && from != DType::Bool {
                    to_f64.push((Op::Bitcast(DType::F64), DType::F64));
                }
                self.compare_ops(
                    &format!("cast_{from}_f64"),
                    from,
                    &to_f64,
                    seed as u64 + 300,
                );
            }
        }
    }

    /// Runs the kernel of `ops` on the device and in the interpreter on the same data; fails
    /// on any disagreement the tolerance does not allow. A refused kernel is retried op by
    /// op, so that only the ops the device refuses are skipped.
    fn compare_ops(&self, name: &str, dtype: DType, ops: &[(Op, DType)], seed: u64) {
        let mut rng = Rng(seed);
        let inputs: Vec<Vec<u8>> = (0..3).map(|_| op_data(&mut rng, dtype, N)).collect();
        let kernel = op_kernel(name, dtype, ops);
        let mut buffers = inputs.clone();
        buffers.extend(ops.iter().map(|(_, d)| vec![0; N * d.size_bytes()]));
        let dims = Bindings::new();
        let flush = self.info().features.subnormals_may_flush;
        let flushable = [(0, dtype), (1, dtype), (2, dtype)];
        let reference = Reference::new(&kernel, &buffers, &flushable, &dims, flush);
        let mut failures = Vec::new();
        match self.execute(&kernel, &buffers, &Bindings::new()) {
            Ok(got) => {
                for (k, &(op, out)) in ops.iter().enumerate() {
                    self.compare_op(
                        op,
                        dtype,
                        out,
                        &reference,
                        3 + k,
                        &got[3 + k],
                        &mut failures,
                    );
                }
            }
            Err(e) if ops.len() > 1 && crate::refusal(&e).is_some() => {
                if !self.info().features.supports(dtype) {
                    // The whole kernel is about a dtype the device lacks.
                    self.refused(
                        &format!("{name} ({} ops on {dtype})", ops.len()),
                        None,
                        &[dtype],
                        &e,
                    );
                    return;
                }
                for (k, &(op, out)) in ops.iter().enumerate() {
                    let single = op_kernel(&format!("{name}_{k}"), dtype, &[(op, out)]);
                    let mut buffers = inputs.clone();
                    buffers.push(vec![0; N * out.size_bytes()]);
                    if let Some(got) = self.execute_or_skip(
                        &format!("{op} on {dtype} -> {out}"),
                        Some(op),
                        &[dtype, out],
                        &single,
                        &buffers,
                        &Bindings::new(),
                    ) {
                        self.compare_op(op, dtype, out, &reference, 3 + k, &got[3], &mut failures);
                    }
                }
            }
            Err(e) => {
                let mut dtypes = vec![dtype];
                dtypes.extend(ops.iter().map(|(_, d)| *d));
                match ops {
                    [(op, out)] => {
                        self.refused(&format!("{op} on {dtype} -> {out}"), Some(*op), &dtypes, &e);
                    }
                    _ => self.refused(&format!("{name} on {dtype}"), None, &dtypes, &e),
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{}: {} mismatches with the interpreter ({}), first ones:\n{}",
            self.label(),
            failures.len(),
            mismatches_by_op(&failures),
            failures[..failures.len().min(20)].join("\n")
        );
    }

    /// Compares `got`, the device's output of `op` (buffer `k` of the kernel), with the
    /// reference's element by element, adding a line per mismatch to `failures`.
    #[allow(clippy::too_many_arguments)]
    fn compare_op(
        &self,
        op: Op,
        dtype: DType,
        out: DType,
        reference: &Reference<'_>,
        k: usize,
        got: &[u8],
        failures: &mut Vec<String>,
    ) {
        let inputs = &reference.buffers[..3];
        let ulps = if out.is_float() {
            (self.tolerance.ulps)(op, dtype, out)
        } else {
            0
        };
        let size = out.size_bytes();
        for e in 0..N {
            let g = &got[e * size..][..size];
            if !reference.accepts(k, e, out, ulps, g) {
                let w = reference.element(k, e, out);
                let input = |b: &Vec<u8>| {
                    format!(
                        "{:02x?}",
                        &b[e * dtype.size_bytes()..][..dtype.size_bytes()]
                    )
                };
                failures.push(format!(
                    "{op} ({op:?}) on {dtype} -> {out}: inputs {} {} {}: device {g:02x?}, \
                     interpreter {w:02x?} (allowed: {ulps} ulps{})",
                    input(&inputs[0]),
                    input(&inputs[1]),
                    input(&inputs[2]),
                    if reference.flush {
                        ", or what flushing subnormals explains"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
}

/// How many of `failures` each op has, in first-seen order: `round on f64 -> f64: 1331`.
fn mismatches_by_op(failures: &[String]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for line in failures {
        let op = line.split(": inputs").next().unwrap_or(line);
        match counts.iter_mut().find(|(o, _)| *o == op) {
            Some((_, n)) => *n += 1,
            None => counts.push((op, 1)),
        }
    }
    counts
        .iter()
        .map(|(op, n)| format!("{op}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
