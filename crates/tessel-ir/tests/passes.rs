//! The optimization passes: each keeps every kernel verifying and computing the same bits
//! (checked through the reference interpreter on random inputs), and each does its job on
//! kernels built to need it. Random kernels cover rule combinations no hand-built kernel
//! thought of.

use tessel_ir::passes::{self, cse, dce, fold, licm, optimize, unroll, vectorize};
use tessel_ir::{Access, Inst, Kernel, KernelBuilder, Mem, Param, Value, interp, samples, verify};
use tessel_shape::{BinaryOp, Bindings, DType, Scalar, TernaryOp, UnaryOp, Var};

// A crate root's modules are its siblings, and a sibling file would be a test of its own.
#[path = "passes/random.rs"]
mod random;

const I32: DType = DType::I32;
const F32: DType = DType::F32;

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

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `1 / n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// One random element of `dtype`: small values and arbitrary bits for integers; for
    /// floats mostly values in `[-8, 8)`, with NaN, infinities and `-0.0` mixed in, since
    /// those are what float identities get wrong.
    fn element(&mut self, dtype: DType) -> Scalar {
        if dtype.is_bool() {
            return Scalar::Bool(self.one_in(2));
        }
        if dtype.is_float() {
            let x = match self.below(16) {
                0 => f64::NAN,
                1 => -0.0,
                2 => f64::INFINITY,
                3 => f64::NEG_INFINITY,
                _ => (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 16.0 - 8.0,
            };
            return Scalar::F64(x).cast(dtype);
        }
        if self.one_in(2) {
            Scalar::I64(self.below(17) as i64 - 8).cast(dtype)
        } else {
            Scalar::U64(self.next()).cast(dtype)
        }
    }
}

/// Random contents for every buffer parameter, inputs and outputs alike (so that elements
/// a kernel leaves alone are compared too).
fn random_buffers(kernel: &Kernel, dims: &Bindings, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = SplitMix64(seed);
    let mut buffers = Vec::new();
    for param in &kernel.params {
        if let Param::Buffer { dtype, len, .. } = param {
            let len = len.eval(dims).expect("buffer length evaluates");
            let mut bytes = Vec::new();
            for _ in 0..len {
                let bits = rng.element(*dtype).to_bits().to_le_bytes();
                bytes.extend_from_slice(&bits[..dtype.size_bytes()]);
            }
            buffers.push(bytes);
        }
    }
    buffers
}

/// The buffers after running `kernel` on `inputs`.
fn run(kernel: &Kernel, inputs: &[Vec<u8>], dims: &Bindings) -> Vec<Vec<u8>> {
    let mut buffers = inputs.to_vec();
    let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
    if let Err(e) = interp::run(kernel, &mut slices, dims) {
        panic!("{e}\n{kernel}");
    }
    buffers
}

/// A kernel to test, with the dims to launch it with.
struct Case {
    kernel: Kernel,
    dims: Vec<Bindings>,
}

impl Case {
    fn new(kernel: Kernel) -> Self {
        Case {
            kernel,
            dims: vec![Bindings::new()],
        }
    }
}

/// Asserts that `after` verifies and computes exactly what `before` does, on several random
/// inputs per launch.
fn assert_equivalent(pass: &str, case: &Case, after: &Kernel) {
    let before = &case.kernel;
    if let Err(e) = verify(after) {
        panic!("`{pass}` broke verification: {e}\nbefore:\n{before}\nafter:\n{after}");
    }
    for dims in &case.dims {
        for seed in 0..3 {
            let inputs = random_buffers(before, dims, seed);
            let (want, got) = (run(before, &inputs, dims), run(after, &inputs, dims));
            assert!(
                want == got,
                "`{pass}` changed the results (seed {seed})\nbefore:\n{before}\nafter:\n{after}"
            );
        }
    }
}

type Pass = (&'static str, fn(&Kernel) -> Kernel);

fn unroll8(kernel: &Kernel) -> Kernel {
    unroll(kernel, 8)
}

fn unroll2(kernel: &Kernel) -> Kernel {
    unroll(kernel, 2)
}

fn vectorize16(kernel: &Kernel) -> Kernel {
    vectorize(kernel, 16)
}

fn optimize_vectorize(kernel: &Kernel) -> Kernel {
    vectorize(&optimize(kernel), 16)
}

const PASSES: [Pass; 9] = [
    ("fold", fold),
    ("cse", cse),
    ("dce", dce),
    ("licm", licm),
    ("unroll(8)", unroll8),
    ("unroll(2)", unroll2),
    ("optimize", optimize),
    ("vectorize(16)", vectorize16),
    ("optimize, vectorize(16)", optimize_vectorize),
];

/// Every sample kernel, over dtypes and shapes that reach each pass's rules.
fn sample_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for dtype in [F32, I32, DType::Bool, DType::F16, DType::U8, DType::I64] {
        cases.push(Case::new(samples::vector_add(dtype, 100, 32).unwrap()));
    }
    cases.push(Case::new(samples::vector_add(F32, 64, 64).unwrap()));
    for (dtype, per) in [
        (F32, 4),
        (DType::BF16, 8),
        (DType::I64, 2),
        (DType::Bool, 4),
    ] {
        cases.push(Case::new(samples::upcast_add(dtype, 96, per, 8).unwrap()));
    }
    cases.push(Case::new(
        samples::permuted_copy([2, 3, 5], [2, 0, 1]).unwrap(),
    ));
    cases.push(Case::new(
        samples::permuted_copy([4, 1, 3], [1, 2, 0]).unwrap(),
    ));
    for (cols, dtype) in [(4, F32), (8, I32), (13, F32), (1, DType::Bool)] {
        cases.push(Case::new(samples::row_sum(70, cols, dtype).unwrap()));
    }
    cases.push(Case::new(samples::tree_reduce(200, 64).unwrap()));
    cases.push(Case::new(samples::tree_reduce(7, 4).unwrap()));
    cases.push(Case::new(samples::tiled_matmul(8, 12, 16, 4).unwrap()));
    cases.push(Case::new(samples::tiled_matmul(16, 16, 16, 8).unwrap()));
    let n = Var::new("n", 0, 500).unwrap();
    cases.push(Case {
        kernel: samples::dynamic_vector_add(n, 32).unwrap(),
        dims: [0, 1, 77, 500].map(|v| Bindings::new().with(n, v)).to_vec(),
    });
    cases
}

/// Runs every pass over `cases`, checking each result.
fn check_all_passes(cases: &[Case]) {
    for case in cases {
        for (name, pass) in PASSES {
            assert_equivalent(name, case, &pass(&case.kernel));
        }
    }
}

fn count(kernel: &Kernel, pred: impl Fn(&Inst) -> bool) -> usize {
    kernel.insts.iter().filter(|i| pred(i)).count()
}

fn is_const(kernel: &Kernel, v: Value, want: Scalar) -> bool {
    matches!(kernel.inst(v), Inst::Const(c) if *c == want)
}

/// The number of `Range`s around each instruction (a `Range` counts itself).
fn loop_depths(kernel: &Kernel) -> Vec<usize> {
    let mut depth = 0;
    kernel
        .insts
        .iter()
        .map(|inst| {
            match inst {
                Inst::Range { .. } => depth += 1,
                Inst::EndRange(_) => depth -= 1,
                _ => {}
            }
            depth + usize::from(matches!(inst, Inst::EndRange(_)))
        })
        .collect()
}

#[test]
fn every_pass_preserves_the_samples() {
    check_all_passes(&sample_cases());
}

// ---------------------------------------------------------------------------------------
// fold
// ---------------------------------------------------------------------------------------

/// Constant chains, integer identities next to the float ones that must stay, constant
/// conditions, empty loops and an axis of extent 1.
fn folding_kernel() -> Kernel {
    let mut kb = KernelBuilder::new("folding");
    let xi = kb.buffer("xi", I32, 8, Access::Read);
    let xf = kb.buffer("xf", F32, 8, Access::Read);
    let out = kb.buffer("out", I32, 16, Access::Write);
    let outf = kb.buffer("outf", F32, 8, Access::Write);
    kb.grid([2, 1, 1], [4, 1, 1]);
    let i = kb.global_id(0, I32);
    let [zero_c, one, two, three, four, five, twenty] =
        [0, 1, 2, 3, 4, 5, 20].map(|c| kb.constant(c));
    // (2 + 3) * 4 - 20 == 0, but only a folder knows.
    let sum = kb.add(two, three);
    let product = kb.mul(sum, four);
    let zero = kb.sub(product, twenty);
    let x = kb.load(xi, i);
    let x0 = kb.add(x, zero);
    let x1 = kb.mul(x0, one);
    let x_times_zero = kb.mul(x1, zero);
    let x_minus_x = kb.sub(x1, x1);
    let zeros = kb.add(x_times_zero, x_minus_x);
    let v = kb.add(x1, zeros);
    let i2 = kb.mul(i, two);
    let yes = kb.lt(two, three);
    let picked = kb.select(yes, v, zero_c);
    kb.store(out, i2, picked);
    let i2p1 = kb.add(i2, one);
    kb.if_(yes, |kb| kb.store(out, i2p1, v));
    // (`eq`, since the verifier narrows `lt`'s operands to empty intervals here.)
    let no = kb.binary(BinaryOp::Eq, two, three);
    kb.if_(no, |kb| {
        let junk = kb.constant(12345);
        kb.store(out, i2p1, junk);
    });
    kb.range(five, five, |kb, r| kb.store(out, i2, r));
    kb.range(five, two, |kb, r| kb.store(out, r, r));
    // A group id along an axis with one workgroup is 0.
    let gy = kb.group_id(1, I32);
    let gy_i = kb.add(i2, gy);
    kb.store(out, gy_i, v);
    // Casts and bitcasts of constants, and a same-dtype cast.
    let f = kb.cast(three, F32);
    let bits = kb.bitcast(f, DType::U32);
    let back = kb.bitcast(bits, F32);
    let same = kb.cast(back, F32);
    // Float identities are not exact (NaN, -0.0): none of these may go.
    let y = kb.load(xf, i);
    let zf = kb.constant(0.0f32);
    let onef = kb.constant(1.0f32);
    let y0 = kb.add(y, zf);
    let y1 = kb.mul(y0, onef);
    let y_times_zero = kb.mul(y1, zf);
    let y_minus_y = kb.sub(y1, y1);
    let ys = kb.add(y_times_zero, y_minus_y);
    let ys = kb.add(ys, same);
    kb.store(outf, i, ys);
    // A condition only known at run time stays.
    let small = kb.lt(x, one);
    kb.if_(small, |kb| kb.store(out, i2, one));
    kb.build().unwrap()
}

#[test]
fn fold_folds_constants_and_exact_identities() {
    let kernel = folding_kernel();
    let folded = fold(&kernel);
    assert_equivalent("fold", &Case::new(kernel.clone()), &folded);
    let text = folded.to_string();
    assert!(folded.insts.len() < kernel.insts.len() - 10, "{folded}");
    // Constant conditions and empty loops are gone; the runtime condition stays.
    assert_eq!(count(&folded, |i| matches!(i, Inst::If(_))), 1, "{folded}");
    assert_eq!(
        count(&folded, |i| matches!(i, Inst::Range { .. })),
        0,
        "{folded}"
    );
    assert!(!text.contains("12345"), "{folded}");
    // (2 + 3) * 4 - 20 became 0 and the integer identities collapsed to x itself.
    let both_const = |i: &Inst| {
        let c = |v: &Value| matches!(folded.inst(*v), Inst::Const(_));
        matches!(i, Inst::Binary(_, a, b) if c(a) && c(b))
    };
    assert_eq!(count(&folded, both_const), 0, "{folded}");
    assert!(!text.contains("group_id.y"), "{folded}");
    assert_eq!(
        count(&folded, |i| matches!(i, Inst::Binary(_, a, b) if a == b)),
        1,
        "only the float y - y stays:\n{folded}"
    );
    // The float chain keeps every op: add, mul, mul, sub, add, add.
    let defs = verify(&folded).unwrap();
    let float_ops = count(
        &folded,
        |inst| matches!(inst, Inst::Binary(_, a, _) if defs[a.index()].ty().is_some_and(|t| t.dtype == F32)),
    );
    assert_eq!(float_ops, 6, "{folded}");
    // Casts and bitcasts of constants folded.
    assert_eq!(
        count(&folded, |i| matches!(i, Inst::Cast(..) | Inst::Bitcast(..))),
        0,
        "{folded}"
    );
    assert!(text.contains("const 3.0 : f32"), "{folded}");
}

#[test]
fn fold_never_folds_an_op_that_fails() {
    // The verifier rejects bitcasts to `bool`, so this kernel cannot verify; it is the one
    // pure op whose evaluation can fail, and folding must leave it alone rather than panic.
    let mut kb = KernelBuilder::new("failing");
    let byte = kb.constant(2u8);
    let b = kb.bitcast(byte, DType::Bool);
    let ok = kb.constant(1u8);
    let _ = kb.bitcast(ok, DType::Bool);
    let _ = kb.extract(b, 0);
    let folded = fold(&kb.finish_unverified());
    assert_eq!(
        count(&folded, |i| matches!(i, Inst::Bitcast(..))),
        1,
        "{folded}"
    );
    assert!(folded.to_string().contains("const true : bool"), "{folded}");
}

#[test]
fn fold_mad_identities_and_vector_lanes() {
    let mut kb = KernelBuilder::new("mads");
    let x = kb.buffer("x", I32, 8, Access::Read);
    let out = kb.buffer("out", I32, 8, Access::Write);
    kb.grid([1, 1, 1], [2, 1, 1]);
    let i = kb.local_id(0, I32);
    let [zero, one, four] = [0, 1, 4].map(|c| kb.constant(c));
    let v = kb.load(x, i);
    // mad(x, 1, z) -> x + z -> x when z == 0; mad(0, y, z) -> z; mad(x, y, 0) -> x * y.
    let a = kb.ternary(TernaryOp::MulAdd, v, one, zero);
    let b = kb.ternary(TernaryOp::MulAdd, zero, v, a);
    let c = kb.ternary(TernaryOp::MulAdd, b, v, zero);
    // extract(vec(c, v), 0) -> c; not(not(c)) -> c; neg(neg(c)) -> c.
    let pair = kb.vectorize(vec![c, v]);
    let first = kb.extract(pair, 0);
    let not = kb.unary(UnaryOp::Not, first);
    let not = kb.unary(UnaryOp::Not, not);
    let neg = kb.unary(UnaryOp::Neg, not);
    let neg = kb.unary(UnaryOp::Neg, neg);
    let at = kb.mul(i, four);
    kb.store(out, at, neg);
    let kernel = kb.build().unwrap();
    let folded = fold(&kernel);
    assert_equivalent("fold", &Case::new(kernel), &folded);
    // Folding leaves the instructions it bypassed for `dce`.
    let folded = dce(&folded);
    let store_value = folded
        .insts
        .iter()
        .find_map(|i| match i {
            Inst::Store { value, .. } => Some(*value),
            _ => None,
        })
        .unwrap();
    // Everything reduced to one multiply of the loaded value by itself.
    assert!(
        matches!(folded.inst(store_value), Inst::Binary(BinaryOp::Mul, a, b)
            if a == b && matches!(folded.inst(*a), Inst::Load { .. })),
        "{folded}"
    );
    assert_eq!(
        count(&folded, |i| matches!(
            i,
            Inst::Unary(..) | Inst::Ternary(..)
        )),
        0,
        "{folded}"
    );
}

// ---------------------------------------------------------------------------------------
// cse
// ---------------------------------------------------------------------------------------

/// Repeated subexpressions: plain, commuted (exact on integers only), in scope through a
/// loop, and out of scope after a block.
fn duplicates_kernel() -> Kernel {
    let mut kb = KernelBuilder::new("duplicates");
    let xi = kb.buffer("xi", I32, 8, Access::Read);
    let xf = kb.buffer("xf", F32, 8, Access::Read);
    let out = kb.buffer("out", I32, 64, Access::Write);
    let outf = kb.buffer("outf", F32, 16, Access::Write);
    kb.grid([2, 1, 1], [4, 1, 1]);
    let i = kb.global_id(0, I32);
    let eight = kb.constant(8);
    let base = kb.mul(i, eight);
    let seven = kb.constant(7);
    let j = kb.sub(seven, i);
    let (x, y) = (kb.load(xi, i), kb.load(xi, j));
    let a = kb.add(x, y);
    let b = kb.add(x, y);
    let c = kb.add(y, x);
    let ab = kb.mul(a, b);
    let abc = kb.mul(ab, c);
    kb.store(out, base, abc);
    // Again, computed from scratch: the index math and constants merge too.
    let eight2 = kb.constant(8);
    let base2 = kb.mul(i, eight2);
    let one = kb.constant(1);
    let at = kb.add(base2, one);
    let (p, q) = (kb.load(xf, i), kb.load(xf, j));
    let pq = kb.add(p, q);
    let qp = kb.add(q, p);
    let pq2 = kb.add(p, q);
    let two = kb.constant(2);
    let i2 = kb.mul(i, two);
    kb.store(outf, i2, pq);
    let i2p1 = kb.add(i2, one);
    let s = kb.sub(qp, pq2);
    kb.store(outf, i2p1, s);
    let cond = kb.lt(x, y);
    kb.if_(cond, |kb| {
        // Inside a block: merges with the outer `a`...
        let again = kb.add(x, y);
        // ...but this product is new, and is forgotten when the block ends.
        let prod = kb.mul(x, y);
        let both = kb.add(again, prod);
        kb.store(out, at, both);
    });
    let prod_after = kb.mul(x, y);
    let three = kb.constant(3);
    let at3 = kb.add(base, three);
    kb.store(out, at3, prod_after);
    let zero = kb.constant(0);
    kb.range(zero, three, |kb, r| {
        let sum = kb.add(y, x);
        let at = kb.add(at3, r);
        let at = kb.add(at, one);
        let v = kb.add(sum, r);
        kb.store(out, at, v);
    });
    kb.build().unwrap()
}

#[test]
fn cse_merges_duplicates_in_scope() {
    let kernel = duplicates_kernel();
    let merged = cse(&kernel);
    assert_equivalent("cse", &Case::new(kernel.clone()), &merged);
    let int_adds_of_xy = |k: &Kernel| {
        count(k, |inst| match inst {
            Inst::Binary(BinaryOp::Add, a, b) => {
                matches!(
                    k.inst(*a),
                    Inst::Load {
                        mem: Mem::Global(0),
                        ..
                    }
                ) && matches!(
                    k.inst(*b),
                    Inst::Load {
                        mem: Mem::Global(0),
                        ..
                    }
                )
            }
            _ => false,
        })
    };
    assert_eq!(int_adds_of_xy(&kernel), 5);
    assert_eq!(int_adds_of_xy(&merged), 1, "{merged}");
    // `p + q` twice merges; `q + p` on floats does not.
    let float_adds = count(&merged, |inst| {
        matches!(inst, Inst::Binary(BinaryOp::Add, a, _)
            if matches!(merged.inst(*a), Inst::Load { mem: Mem::Global(1), .. }))
    });
    assert_eq!(float_adds, 2, "{merged}");
    // `x * y` inside the `If` cannot serve the one after it.
    let products = count(&merged, |inst| {
        matches!(inst, Inst::Binary(BinaryOp::Mul, a, _)
            if matches!(merged.inst(*a), Inst::Load { mem: Mem::Global(0), .. }))
    });
    assert_eq!(products, 2, "{merged}");
    let eights = count(
        &merged,
        |i| matches!(i, Inst::Const(c) if *c == Scalar::I32(8)),
    );
    assert_eq!(eights, 1, "{merged}");
    // b, c, the second 8, its product, the second p + q, and the sums in the block and loop.
    assert_eq!(merged.insts.len() + 7, kernel.insts.len(), "{merged}");
}

#[test]
fn cse_keeps_verifying_when_it_merges_a_constant_a_dead_condition_narrows() {
    // Inside `if lid < 0` the verifier narrows `zero` to the empty interval 1..=0; the
    // second `zero` is not narrowed, until `cse` merges the two. An empty interval means the
    // block never runs, which the verifier must not read as an index range.
    let mut kb = KernelBuilder::new("dead_condition");
    let out = kb.buffer("out", I32, 8, Access::Write);
    kb.grid([1, 1, 1], [4, 1, 1]);
    let lid = kb.local_id(0, I32);
    let zero = kb.constant(0);
    let never = kb.lt(lid, zero);
    kb.if_(never, |kb| {
        let zero_again = kb.constant(0);
        let eight = kb.constant(8);
        let at = kb.mul(zero_again, eight);
        kb.store(out, at, lid);
    });
    let kernel = kb.build().unwrap();
    let merged = cse(&kernel);
    assert_eq!(merged.insts.len() + 1, kernel.insts.len());
    assert_equivalent("cse", &Case::new(kernel), &merged);
}

// ---------------------------------------------------------------------------------------
// licm
// ---------------------------------------------------------------------------------------

/// Index math invariant in one loop, in two nested loops, and inside an `If` in a loop
/// (which must stay).
fn invariant_kernel() -> Kernel {
    let mut kb = KernelBuilder::new("invariant");
    let x = kb.buffer("x", I32, 256, Access::Read);
    let out = kb.buffer("out", I32, 512, Access::Write);
    kb.grid([2, 1, 1], [4, 1, 1]);
    let i = kb.global_id(0, I32);
    let zero = kb.constant(0);
    let sixteen = kb.constant(16);
    let four = kb.constant(4);
    kb.range(zero, sixteen, |kb, r| {
        let c16 = kb.constant(16);
        let row = kb.mul(i, c16);
        let at = kb.add(row, r);
        let v = kb.load(x, at);
        let c64 = kb.constant(64);
        let out_row = kb.mul(i, c64);
        kb.range(zero, four, |kb, s| {
            let c5 = kb.constant(5);
            let twice_inv = kb.mul(i, c5);
            let per_r = kb.mul(r, four);
            let per_s = kb.add(per_r, s);
            let at = kb.add(out_row, per_s);
            let w = kb.add(v, twice_inv);
            kb.store(out, at, w);
            let small = kb.lt(s, four);
            kb.if_(small, |kb| {
                let c7 = kb.constant(7);
                let guarded = kb.mul(i, c7);
                let flag = kb.lt(guarded, v);
                let g = kb.select(flag, guarded, v);
                kb.store(out, at, g);
            });
        });
    });
    kb.build().unwrap()
}

/// The loop depth of the first `mul` of the global id by the constant `k`.
fn depth_of_mul_by(kernel: &Kernel, k: i32) -> usize {
    let depths = loop_depths(kernel);
    let at = kernel
        .insts
        .iter()
        .position(|inst| matches!(inst, Inst::Binary(BinaryOp::Mul, _, c) if is_const(kernel, *c, Scalar::I32(k))))
        .unwrap_or_else(|| panic!("no mul by {k}:\n{kernel}"));
    depths[at]
}

#[test]
fn licm_hoists_invariants_out_of_loops_only() {
    let kernel = invariant_kernel();
    let hoisted = licm(&kernel);
    assert_equivalent("licm", &Case::new(kernel.clone()), &hoisted);
    assert_eq!(hoisted.insts.len(), kernel.insts.len());
    assert_eq!(
        (depth_of_mul_by(&kernel, 16), depth_of_mul_by(&hoisted, 16)),
        (1, 0)
    );
    assert_eq!(
        (depth_of_mul_by(&kernel, 64), depth_of_mul_by(&hoisted, 64)),
        (1, 0)
    );
    // Invariant in both loops: leaves both at once.
    assert_eq!(
        (depth_of_mul_by(&kernel, 5), depth_of_mul_by(&hoisted, 5)),
        (2, 0)
    );
    // Depends on the outer loop's variable: leaves the inner loop only.
    let depths = loop_depths(&hoisted);
    let per_r = hoisted
        .insts
        .iter()
        .position(|inst| matches!(inst, Inst::Binary(BinaryOp::Mul, a, _) if matches!(hoisted.inst(*a), Inst::Range { .. })))
        .unwrap();
    assert_eq!(depths[per_r], 1, "{hoisted}");
    // Inside the `If`: stays.
    assert_eq!(depth_of_mul_by(&hoisted, 7), 2, "{hoisted}");
    // Hoisting again finds nothing more.
    assert_eq!(licm(&hoisted), hoisted);
}

// ---------------------------------------------------------------------------------------
// unroll
// ---------------------------------------------------------------------------------------

/// Small constant loops (nested, dependent, with registers) and loops that must stay: one
/// with a barrier, one too long.
fn loops_kernel() -> Kernel {
    let mut kb = KernelBuilder::new("loops");
    let x = kb.buffer("x", I32, 128, Access::Read);
    let out = kb.buffer("out", I32, 128, Access::ReadWrite);
    kb.grid([2, 1, 1], [4, 1, 1]);
    let i = kb.global_id(0, I32);
    let sixteen = kb.constant(16);
    let base = kb.mul(i, sixteen);
    let [zero, one, two, three, four] = [0, 1, 2, 3, 4].map(|c| kb.constant(c));
    kb.range(zero, four, |kb, r| {
        let at = kb.add(base, r);
        let v = kb.load(x, at);
        let v = kb.add(v, r);
        kb.store(out, at, v);
    });
    // A 2 x 3 nest, and a triangle whose inner bound is the outer variable.
    kb.range(zero, two, |kb, a| {
        kb.range(zero, three, |kb, b| {
            let ab = kb.ternary(TernaryOp::MulAdd, a, three, b);
            let at = kb.add(base, ab);
            let at = kb.add(at, four);
            let old = kb.load(out, at);
            let v = kb.mul(old, three);
            kb.store(out, at, v);
        });
    });
    kb.range(zero, four, |kb, a| {
        kb.range(zero, a, |kb, b| {
            let at = kb.add(base, b);
            let old = kb.load(out, at);
            let v = kb.add(old, a);
            kb.store(out, at, v);
        });
    });
    // Registers defined in the body: each iteration's are fresh.
    kb.range(one, four, |kb, r| {
        let reg = kb.reg(I32, 1);
        let at = kb.add(base, r);
        let old = kb.load(out, at);
        kb.store(reg, zero, old);
        let got = kb.load(reg, zero);
        let v = kb.mul(got, r);
        kb.store(out, at, v);
    });
    kb.range(two, two, |kb, r| kb.store(out, base, r));
    // Stays: a barrier in the body.
    kb.range(zero, two, |kb, r| {
        kb.barrier();
        let at = kb.add(base, r);
        kb.store(out, at, r);
    });
    // Stays: 16 iterations.
    kb.range(zero, sixteen, |kb, r| {
        let at = kb.add(base, r);
        let old = kb.load(out, at);
        let v = kb.sub(old, r);
        kb.store(out, at, v);
    });
    kb.build().unwrap()
}

#[test]
fn unroll_replicates_small_constant_loops() {
    let kernel = loops_kernel();
    let unrolled = unroll(&kernel, 8);
    assert_equivalent("unroll", &Case::new(kernel.clone()), &unrolled);
    let ranges = |k: &Kernel| count(k, |i| matches!(i, Inst::Range { .. }));
    assert_eq!(ranges(&kernel), 9);
    assert_eq!(ranges(&unrolled), 2, "{unrolled}");
    let stores = |k: &Kernel| count(k, |i| matches!(i, Inst::Store { .. }));
    // 4 + 2 * 3 + (0 + 1 + 2 + 3) + 3 * 2 unrolled stores, then the two loops' own.
    assert_eq!(stores(&unrolled), 4 + 6 + 6 + 6 + 2, "{unrolled}");
    assert_eq!(count(&unrolled, |i| matches!(i, Inst::DefineReg { .. })), 3);
    // A limit of 2 unrolls the 2 x 3 nest's outer loop only (leaving two inner loops) and
    // keeps the triangle, whose inner bound is a loop variable then.
    let partly = unroll(&kernel, 2);
    assert_equivalent("unroll(2)", &Case::new(kernel.clone()), &partly);
    assert_eq!(ranges(&partly), 8, "{partly}");
    // Nothing is unrolled with a limit of 0, but empty loops still go.
    let none = unroll(&kernel, 0);
    assert_eq!(ranges(&none), 8, "{none}");
}

// ---------------------------------------------------------------------------------------
// dce
// ---------------------------------------------------------------------------------------

/// Unused values and loads, memory written and never read, an accumulator whose total is
/// never stored, and a block left empty.
fn dead_kernel() -> Kernel {
    let mut kb = KernelBuilder::new("dead");
    let x = kb.buffer("x", I32, 8, Access::Read);
    let out = kb.buffer("out", I32, 8, Access::Write);
    kb.grid([2, 1, 1], [4, 1, 1]);
    let scratch = kb.local(I32, 4);
    let lid = kb.local_id(0, I32);
    let i = kb.global_id(0, I32);
    let v = kb.load(x, i);
    let unused = kb.mul(v, v);
    let _ = kb.add(unused, i);
    let _ = kb.load(x, lid);
    let reg = kb.reg(I32, 2);
    let [zero, one, four] = [0, 1, 4].map(|c| kb.constant(c));
    kb.store(reg, one, v);
    kb.store(scratch, lid, v);
    kb.barrier();
    let acc = kb.reg(I32, 1);
    kb.store(acc, zero, zero);
    kb.range(zero, four, |kb, r| {
        let s = kb.load(acc, zero);
        let s = kb.add(s, r);
        kb.store(acc, zero, s);
    });
    let cond = kb.lt(v, zero);
    kb.if_(cond, |kb| {
        let _ = kb.add(v, one);
    });
    kb.store(out, i, v);
    kb.build().unwrap()
}

#[test]
fn dce_removes_everything_unobservable() {
    let kernel = dead_kernel();
    let cleaned = dce(&kernel);
    assert_equivalent("dce", &Case::new(kernel.clone()), &cleaned);
    assert_eq!(
        cleaned.to_string(),
        "kernel dead(x: i32[8] read, out: i32[8] write)\n\
         grid groups(2, 1, 1) local(4, 1, 1)\n  \
           %0 = group_id.x : i32\n  \
           %1 = const 4 : i32\n  \
           %2 = local_id.x : i32\n  \
           %3 = mad %0, %1, %2\n  \
           %4 = load x[%3]\n  \
           barrier\n  \
           store out[%3], %4\n"
    );
    assert_eq!(dce(&cleaned), cleaned);
}

// ---------------------------------------------------------------------------------------
// optimize
// ---------------------------------------------------------------------------------------

#[test]
fn every_pass_preserves_the_exercise_kernels() {
    let cases = [
        folding_kernel(),
        duplicates_kernel(),
        invariant_kernel(),
        loops_kernel(),
        dead_kernel(),
    ]
    .map(Case::new);
    check_all_passes(&cases);
    for (i, case) in cases.iter().enumerate() {
        let optimized = optimize(&case.kernel);
        // Unrolling grows the kernels with loops; the others only shrink.
        if matches!(case.kernel.name.as_str(), "folding" | "dead") {
            assert!(
                optimized.insts.len() < case.kernel.insts.len() / 2,
                "{i}: {optimized}"
            );
        }
        // A second run may still hoist what unrolling exposed, but finds nothing to grow.
        let again = optimize(&optimized);
        assert!(again.insts.len() <= optimized.insts.len(), "{again}");
    }
}

#[test]
fn optimize_snapshot_row_sum() {
    let kernel = optimize(&samples::row_sum(100, 4, F32).unwrap());
    insta::assert_snapshot!(kernel.to_string());
}

#[test]
fn optimize_snapshot_tiled_matmul() {
    let kernel = optimize(&samples::tiled_matmul(16, 16, 16, 4).unwrap());
    insta::assert_snapshot!(kernel.to_string());
}

#[test]
fn passes_leave_unverifiable_kernels_unverifiable_without_panicking() {
    let mut kb = KernelBuilder::new("broken");
    let one = kb.constant(1);
    let two = kb.constant(2);
    kb.push(Inst::Binary(BinaryOp::Add, Value(7), one));
    kb.push(Inst::Range {
        start: one,
        end: two,
    });
    kb.push(Inst::EndIf(Value(0)));
    kb.push(Inst::Store {
        mem: Mem::Reg(Value(1)),
        index: one,
        value: Value(40),
    });
    let broken = kb.finish_unverified();
    for (name, pass) in PASSES {
        let out = pass(&broken);
        assert!(
            verify(&out).is_err(),
            "`{name}` made a broken kernel verify:\n{out}"
        );
    }
    assert_eq!(passes::OPTIMIZE_MAX_UNROLL, 8);
}

// ---------------------------------------------------------------------------------------
// Random kernels
// ---------------------------------------------------------------------------------------

#[test]
fn every_pass_preserves_random_kernels() {
    let cases: Vec<Case> = (0..300)
        .map(|seed| Case::new(random::random_kernel(seed)))
        .collect();
    check_all_passes(&cases);
    // The pipeline has something to do on random code.
    let before: usize = cases.iter().map(|c| c.kernel.insts.len()).sum();
    let after: usize = cases.iter().map(|c| optimize(&c.kernel).insts.len()).sum();
    assert!(after < before, "{after} >= {before}");
}

// ---------------------------------------------------------------------------------------
// vectorize
// ---------------------------------------------------------------------------------------

/// What lowering writes for four outputs per invocation: `out[4g + j] = x[4g + j] +
/// bias[(4g % 8) + j] + z[4g + 1 + j]` for `j` in `0..4`, every load first, then the
/// stores; `z`'s reads start one element past a multiple of 4. With `store_between`, a
/// store to another buffer sits between the loads.
fn upcast_kernel(dtype: DType, store_between: bool) -> Kernel {
    let mut kb = KernelBuilder::new("upcast");
    let out = kb.buffer("out", dtype, 64, Access::Write);
    let x = kb.buffer("x", dtype, 64, Access::Read);
    let bias = kb.buffer("bias", dtype, 16, Access::Read);
    let z = kb.buffer("z", dtype, 68, Access::Read);
    let side = kb.buffer("side", dtype, 16, Access::Write);
    kb.grid([4, 1, 1], [4, 1, 1]);
    let g = kb.global_id(0, I32);
    let four = kb.constant(4i32);
    let eight = kb.constant(8i32);
    let base = kb.mul(g, four);
    let row = kb.binary(BinaryOp::Rem, base, eight);
    let one = kb.constant(1i32);
    let shifted = kb.add(base, one);
    let mut sums = Vec::new();
    for j in 0..4 {
        let at = |kb: &mut KernelBuilder, b: Value| {
            if j == 0 {
                b
            } else {
                let c = kb.constant(j);
                kb.add(b, c)
            }
        };
        let (xi, bi, zi) = (at(&mut kb, base), at(&mut kb, row), at(&mut kb, shifted));
        let a = kb.load(x, xi);
        if store_between && j == 0 {
            kb.store(side, g, a);
        }
        let b = kb.load(bias, bi);
        let c = kb.load(z, zi);
        let ab = kb.add(a, b);
        sums.push((xi, kb.add(ab, c)));
    }
    for (at, v) in sums {
        kb.store(out, at, v);
    }
    kb.build().unwrap()
}

fn vector_loads(kernel: &Kernel, width: u8) -> usize {
    count(
        kernel,
        |i| matches!(i, Inst::Load { width: w, .. } if *w == width),
    )
}

#[test]
fn vectorize_merges_aligned_runs_of_loads_and_stores() {
    for dtype in [F32, DType::BF16, I32] {
        let before = upcast_kernel(dtype, false);
        let after = vectorize(&before, 16);
        assert_equivalent("vectorize(16)", &Case::new(before), &after);
        // `x` and `bias` in one load each; `z`, not provably aligned, as it was.
        assert_eq!(vector_loads(&after, 4), 2, "{after}");
        assert_eq!(vector_loads(&after, 1), 4, "{after}");
        let stores = count(&after, |i| matches!(i, Inst::Store { .. }));
        assert_eq!(stores, 1, "{after}");
    }
    // 8 bytes at most: pairs of f32.
    let narrow = vectorize(&upcast_kernel(F32, false), 8);
    assert_eq!(vector_loads(&narrow, 4), 0, "{narrow}");
    assert_eq!(vector_loads(&narrow, 2), 4, "{narrow}");
}

#[test]
fn vectorize_keeps_loads_a_store_separates() {
    let before = upcast_kernel(F32, true);
    let after = vectorize(&before, 16);
    assert_equivalent("vectorize(16)", &Case::new(before), &after);
    // The store after `x[4g]` keeps `x`'s loads apart; `bias`'s all follow it and merge.
    assert_eq!(vector_loads(&after, 4), 1, "{after}");
    assert_eq!(
        count(&after, |i| matches!(i, Inst::Store { .. })),
        2,
        "{after}"
    );
}
