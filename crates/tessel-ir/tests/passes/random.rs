//! Random kernels for the pass tests: small, verifying, and biased toward what the passes
//! rewrite.

use tessel_ir::{Access, Kernel, KernelBuilder, Mem, Value};
use tessel_shape::{BinaryOp, DType, TernaryOp, UnaryOp};

use super::{F32, I32, SplitMix64};

/// Stores per invocation in a random kernel; each store has its own slot.
const SLOTS: i64 = 24;

/// Builds random, verifying kernels over `i32` and `f32`: ALU chains biased toward the
/// identities the folder knows (constant 0, 1 and -1 operands, `x op x`), nested `If`s and
/// constant or triangular `Range`s, loads, stores, register accumulators and barriers where
/// they are allowed.
struct Gen {
    rng: SplitMix64,
    /// Values in scope per open block, the kernel's top level first.
    ints: Vec<Vec<Value>>,
    floats: Vec<Vec<Value>>,
    loop_vars: Vec<Value>,
    ifs_open: usize,
    slot: i64,
    gid: Value,
    /// The buffers `x: i32`, `y: f32`, `out: i32`, `outf: f32` and the accumulators.
    x: Mem,
    y: Mem,
    out: Mem,
    outf: Mem,
    acc: Mem,
}

impl Gen {
    fn pick(&mut self, pool: fn(&Gen) -> &Vec<Vec<Value>>) -> Value {
        let all: Vec<Value> = pool(self).iter().flatten().copied().collect();
        all[self.rng.below(all.len() as u64) as usize]
    }

    fn int(&mut self, kb: &mut KernelBuilder) -> Value {
        match self.rng.below(8) {
            0 => kb.constant([0, 1, -1, 3][self.rng.below(4) as usize]),
            _ => self.pick(|g| &g.ints),
        }
    }

    fn float(&mut self, kb: &mut KernelBuilder) -> Value {
        match self.rng.below(6) {
            0 => kb.constant([0.0f32, -0.0, 1.0, f32::NAN][self.rng.below(4) as usize]),
            _ => self.pick(|g| &g.floats),
        }
    }

    /// A random index into `x` or `y`, provably in bounds.
    fn index(&mut self, kb: &mut KernelBuilder) -> Value {
        let v = self.int(kb);
        let mask = kb.constant(63);
        kb.binary(BinaryOp::And, v, mask)
    }

    fn next_slot(&mut self, kb: &mut KernelBuilder) -> Option<Value> {
        (self.slot < SLOTS).then(|| {
            let (slots, slot) = (kb.constant_as(SLOTS, I32), kb.constant_as(self.slot, I32));
            self.slot += 1;
            kb.ternary(TernaryOp::MulAdd, self.gid, slots, slot)
        })
    }

    fn statement(&mut self, kb: &mut KernelBuilder, depth: usize) {
        // `BinaryOp::ALL` lists the arithmetic ops (add to shr) before the comparisons.
        let (arith, compare) = BinaryOp::ALL.split_at(13);
        let new_int = match self.rng.below(21) {
            0..=5 => {
                let a = self.int(kb);
                let b = if self.rng.one_in(4) { a } else { self.int(kb) };
                Some(kb.binary(arith[self.rng.below(13) as usize], a, b))
            }
            6 => {
                let (a, b, c) = (self.int(kb), self.int(kb), self.int(kb));
                Some(kb.ternary(TernaryOp::MulAdd, a, b, c))
            }
            7 => {
                let a = self.int(kb);
                let b = if self.rng.one_in(3) { a } else { self.int(kb) };
                let cond = kb.binary(compare[self.rng.below(6) as usize], a, b);
                let (c, d) = (self.int(kb), self.int(kb));
                Some(kb.select(cond, c, d))
            }
            8 => {
                let a = self.int(kb);
                let op = [UnaryOp::Neg, UnaryOp::Not, UnaryOp::Abs, UnaryOp::Sign]
                    [self.rng.below(4) as usize];
                let once = kb.unary(op, a);
                Some(if self.rng.one_in(2) {
                    kb.unary(op, once)
                } else {
                    once
                })
            }
            9 => {
                let a = self.int(kb);
                let wide = kb.cast(a, DType::I64);
                let same = kb.cast(wide, DType::I64);
                Some(kb.cast(same, I32))
            }
            10 | 11 => {
                let at = self.index(kb);
                Some(kb.load(self.x, at))
            }
            12 => {
                let at = self.index(kb);
                let v = kb.load(self.y, at);
                let other = if self.rng.one_in(3) {
                    v
                } else {
                    self.float(kb)
                };
                let op = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max]
                    [self.rng.below(4) as usize];
                let f = kb.binary(op, v, other);
                self.floats.last_mut().unwrap().push(f);
                None
            }
            13 | 14 => {
                if let Some(at) = self.next_slot(kb) {
                    let v = self.int(kb);
                    kb.store(self.out, at, v);
                }
                None
            }
            15 => {
                if let Some(at) = self.next_slot(kb) {
                    let v = self.float(kb);
                    kb.store(self.outf, at, v);
                }
                None
            }
            16 => {
                let at = kb.constant_as(self.rng.below(2) as i64, I32);
                let old = kb.load(self.acc, at);
                let v = self.int(kb);
                let sum = kb.add(old, v);
                kb.store(self.acc, at, sum);
                None
            }
            17 if depth < 3 => {
                let (a, b) = (self.int(kb), self.int(kb));
                let cond = kb.binary(compare[self.rng.below(6) as usize], a, b);
                self.ifs_open += 1;
                kb.if_(cond, |kb| self.block(kb, depth + 1, None));
                self.ifs_open -= 1;
                None
            }
            18 if depth < 3 => {
                let start = kb.constant_as(self.rng.below(3) as i64, I32);
                let end = match self.loop_vars.last() {
                    Some(&outer) if self.rng.one_in(3) => outer,
                    _ => kb.constant_as([0, 1, 3, 5, 10][self.rng.below(5) as usize], I32),
                };
                kb.range(start, end, |kb, r| {
                    self.loop_vars.push(r);
                    self.block(kb, depth + 1, Some(r));
                    self.loop_vars.pop();
                });
                None
            }
            19 if self.ifs_open == 0 => {
                kb.barrier();
                None
            }
            20 => {
                // Four lanes of `x` against four scalars, lane-wise, then one lane back.
                let v = self.int(kb);
                let mask = kb.constant(60);
                let at = kb.binary(BinaryOp::And, v, mask);
                let loaded = kb.load_vec(self.x, at, 4);
                let lanes = (0..4).map(|_| self.int(kb)).collect();
                let built = kb.vectorize(lanes);
                let other = if self.rng.one_in(3) { loaded } else { built };
                let op = arith[self.rng.below(13) as usize];
                let result = kb.binary(op, loaded, other);
                let result = if self.rng.one_in(2) {
                    let cond = kb.binary(compare[self.rng.below(6) as usize], result, built);
                    kb.select(cond, result, built)
                } else {
                    result
                };
                Some(kb.extract(result, self.rng.below(4) as u8))
            }
            _ => None,
        };
        if let Some(v) = new_int {
            self.ints.last_mut().unwrap().push(v);
        }
    }

    /// A block's statements; a loop's variable is in scope in its body only.
    fn block(&mut self, kb: &mut KernelBuilder, depth: usize, loop_var: Option<Value>) {
        self.ints.push(loop_var.into_iter().collect());
        self.floats.push(Vec::new());
        let len = 1 + self.rng.below(8);
        for _ in 0..len {
            self.statement(kb, depth);
        }
        self.ints.pop();
        self.floats.pop();
    }
}

/// A random kernel, which verifies by construction.
pub(crate) fn random_kernel(seed: u64) -> Kernel {
    let mut kb = KernelBuilder::new("random");
    let x = kb.buffer("x", I32, 64, Access::Read);
    let y = kb.buffer("y", F32, 64, Access::Read);
    let out = kb.buffer("out", I32, 8 * SLOTS, Access::Write);
    let outf = kb.buffer("outf", F32, 8 * SLOTS, Access::Write);
    kb.grid([2, 1, 1], [4, 1, 1]);
    let gid = kb.global_id(0, I32);
    let lid = kb.local_id(0, I32);
    let acc = kb.reg(I32, 2);
    let zero = kb.constant(0);
    let one = kb.constant(1);
    kb.store(acc, zero, zero);
    kb.store(acc, one, zero);
    let y0 = kb.load(y, gid);
    let mut g = Gen {
        rng: SplitMix64(seed),
        ints: vec![vec![gid, lid, zero, one]],
        floats: vec![vec![y0]],
        loop_vars: Vec::new(),
        ifs_open: 0,
        slot: 0,
        gid,
        x: x.into(),
        y: y.into(),
        out: out.into(),
        outf: outf.into(),
        acc,
    };
    for _ in 0..4 {
        g.block(&mut kb, 0, None);
    }
    if let Some(at) = g.next_slot(&mut kb) {
        let total = kb.load(acc, zero);
        kb.store(out, at, total);
    }
    kb.build()
        .unwrap_or_else(|e| panic!("random kernel {seed}: {e}"))
}
