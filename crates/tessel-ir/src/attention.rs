//! The portable fused attention kernel: an [`Attention`] written in the kernel IR, so every
//! backend (and the interpreter) runs `softmax(scale·q kᵀ [+ mask] [causal]) v` without
//! storing the `[l, s]` scores.
//!
//! A backend with a faster kernel of its own offers it through
//! [`Backend::vendor`](crate::Backend::vendor); the planner compiles this one for devices
//! that offer none, and measures it against the unfused composition like any candidate.
//!
//! One invocation owns one query row; a workgroup owns [`ROWS`] consecutive rows of one
//! (batch, head) pair and walks the keys in tiles that its invocations copy into local
//! memory together (as `f32`, so half-precision operands are converted once per tile).
//! Each row keeps its query and its output accumulators in registers and the softmax
//! online: per tile, the scores go to registers, the running max grows by the tile's max,
//! the sum and accumulators are rescaled once, then each key's weight adds its value row.
//! All arithmetic is `f32`. A causal workgroup stops at the last key its last row sees.
//!
//! Semantics match the composition: a key hidden from a query (causal, a `-inf` in a float
//! mask, `true` in a bool mask) weighs 0; a row whose every key is hidden is `0 / 0 = NaN`, as `softmax` of a row of
//! `-inf` is.

use tessel_shape::{BinaryOp, DType, Dim, Scalar, TernaryOp, UnaryOp};

use crate::builder::{Buf, KernelBuilder};
use crate::kernel::{Access, Kernel, Mem, Param, Value};
use crate::vendor::{Attention, AttentionDropout, AttentionMask};

/// Query rows per workgroup (one per invocation).
pub const ROWS: usize = 32;

/// Largest `e + ev` the kernel keeps in registers; longer heads use the composition.
pub(crate) const MAX_HEAD: usize = 512;

/// Local memory per workgroup the key and value tiles may fill: 16 KiB, the least every
/// backend offers (WebGPU's default limit).
pub(crate) const TILE_BYTES: usize = 16 << 10;

/// What both kernels start from: the checks, the builder with the buffer parameters
/// declared, and the index dtype.
struct Setup<'a> {
    kb: KernelBuilder,
    q: Buf,
    k: Buf,
    v: Buf,
    mask: Option<(Buf, &'a AttentionMask)>,
    /// The dropout draw's key buffer (four `u32`).
    key: Option<Buf>,
    out: Buf,
    idx: DType,
    e: usize,
    ev: usize,
}

impl<'a> Setup<'a> {
    fn new(op: &'a Attention, lens: &[Dim], name: &str) -> Result<Setup<'a>, String> {
        let (e, ev) = checked_heads(op)?;
        let want = 4 + usize::from(op.mask.is_some()) + usize::from(op.dropout.is_some());
        if lens.len() != want {
            return Err(format!(
                "{want} buffer lengths needed, {} given",
                lens.len()
            ));
        }
        let idx = index_dtype(lens);
        let mut kb = KernelBuilder::new(name);
        let q = kb.buffer("q", op.dtype, lens[0], Access::Read);
        let k = kb.buffer("k", op.dtype, lens[1], Access::Read);
        let v = kb.buffer("v", op.dtype, lens[2], Access::Read);
        let mask = op
            .mask
            .as_ref()
            .map(|m| (kb.buffer("mask", m.dtype, lens[3], Access::Read), m));
        let key = op
            .dropout
            .map(|_| kb.buffer("key", DType::U32, lens[lens.len() - 2], Access::Read));
        let out = kb.buffer("out", op.dtype, lens[lens.len() - 1], Access::Write);
        Ok(Setup {
            kb,
            q,
            k,
            v,
            mask,
            key,
            out,
            idx,
            e,
            ev,
        })
    }
}

/// The head dims `(e, ev)` of `op`, or why no portable kernel computes it: head dims that
/// are not constants or are longer than the registers hold, operands other than f16, bf16
/// and f32, masks other than those or bool.
pub(crate) fn checked_heads(op: &Attention) -> Result<(usize, usize), String> {
    let (Some(e), Some(ev)) = (op.e.as_const(), op.ev.as_const()) else {
        return Err(format!(
            "head dims {} and {} are not constants",
            op.e, op.ev
        ));
    };
    if e < 1 || ev < 1 || (e + ev) as usize > MAX_HEAD {
        return Err(format!("head dims {e} + {ev} outside 2..={MAX_HEAD}"));
    }
    // Everything is computed in f32: f64 operands keep the exact composition.
    let kernel_dtype = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
    if !kernel_dtype(op.dtype) {
        return Err(format!("{op}: operands must be f16, bf16 or f32"));
    }
    if let Some(m) = &op.mask
        && !(m.dtype == DType::Bool || kernel_dtype(m.dtype))
    {
        return Err(format!("{op}: the mask must be bool, f16, bf16 or f32"));
    }
    Ok((e as usize, ev as usize))
}

/// `i32` indices where every buffer length fits them, else `i64`.
pub(crate) fn index_dtype(lens: &[Dim]) -> DType {
    if lens.iter().all(|n| n.bounds().hi < i64::from(i32::MAX)) {
        DType::I32
    } else {
        DType::I64
    }
}

/// The scaled score of query `i` against key `j` from their dot product `dot`, with the
/// mask added (read where `readable`) and `-inf` where the key is hidden: past `s`,
/// causally, or by the mask.
pub(crate) struct Scorer {
    scale: Value,
    neg_inf: Value,
    zero: Value,
    s: Value,
    causal: bool,
    /// The mask's buffer and dtype, its offset for the pair, and its query and key strides.
    mask: Option<(Buf, DType, Value, [Value; 2])>,
}

impl Scorer {
    pub(crate) fn new(
        kb: &mut KernelBuilder,
        op: &Attention,
        setup_mask: Option<(Buf, &AttentionMask)>,
        pair: Value,
        idx: DType,
    ) -> Scorer {
        let mask = setup_mask.map(|(buf, m)| {
            let heads = kb.expr(m.heads, idx);
            let [so, sh, si, sj] = m.strides.map(|st| kb.expr(st, idx));
            let outer = kb.div(pair, heads);
            let head = kb.rem(pair, heads);
            let base = kb.mul(outer, so);
            let base = kb.ternary(TernaryOp::MulAdd, head, sh, base);
            (buf, m.dtype, base, [si, sj])
        });
        Scorer {
            scale: kb.constant(Scalar::F32(op.scale.to_f64() as f32)),
            neg_inf: kb.constant(Scalar::F32(f32::NEG_INFINITY)),
            zero: kb.constant(Scalar::F32(0.0)),
            s: kb.expr(op.s, idx),
            causal: op.causal,
            mask,
        }
    }

    pub(crate) fn score(
        &self,
        kb: &mut KernelBuilder,
        dot: Value,
        i: Value,
        j: Value,
        readable: Value,
    ) -> Value {
        let score = kb.mul(dot, self.scale);
        let mut visible = kb.lt(j, self.s);
        let score = match self.mask {
            Some((buf, dtype, base, [si, sj])) => {
                let added = kb.reg(DType::F32, 1);
                let first = kb.constant_as(0, DType::I32);
                kb.store(added, first, self.zero);
                let readable = kb.binary(BinaryOp::And, visible, readable);
                kb.if_(readable, |kb| {
                    let at = kb.ternary(TernaryOp::MulAdd, i, si, base);
                    let at = kb.ternary(TernaryOp::MulAdd, j, sj, at);
                    let m = if dtype == DType::Bool {
                        let hides = kb.load(buf, at);
                        kb.select(hides, self.neg_inf, self.zero)
                    } else {
                        load_f32(kb, buf, at)
                    };
                    kb.store(added, first, m);
                });
                let added = kb.load(added, first);
                kb.add(score, added)
            }
            None => score,
        };
        if self.causal {
            let seen = kb.binary(BinaryOp::Le, j, i);
            visible = kb.binary(BinaryOp::And, visible, seen);
        }
        kb.select(visible, score, self.neg_inf)
    }
}

/// Dropout of a probability at `(query i, key j)` of the invocation's pair: the Philox word
/// at its row-major position in `[batch, l, s]`, compared with the threshold.
pub(crate) struct Dropper {
    key: [Value; 4],
    /// `pair · l` as `u64`.
    row0: Value,
    s: Value,
    threshold: Value,
    scale: Value,
    zero: Value,
}

impl Dropper {
    pub(crate) fn new(
        kb: &mut KernelBuilder,
        op: &Attention,
        d: AttentionDropout,
        key: Buf,
        pair: Value,
    ) -> Dropper {
        let key = [0, 1, 2, 3].map(|w| {
            let at = kb.constant_as(w, DType::I32);
            kb.load(key, at)
        });
        let pair = kb.cast(pair, DType::U64);
        let l = kb.expr(op.l, DType::U64);
        Dropper {
            key,
            row0: kb.mul(pair, l),
            s: kb.expr(op.s, DType::U64),
            threshold: kb.constant(Scalar::U32(d.threshold)),
            scale: kb.constant(Scalar::F32(d.scale.to_f64() as f32)),
            zero: kb.constant(Scalar::F32(0.0)),
        }
    }

    /// The factors (the scale, or 0 where dropped) of query `i`'s probabilities at keys
    /// `j0..j0 + keys`, in registers: one Philox block per four consecutive positions,
    /// each block's words stored at the positions of the tile they cover.
    pub(crate) fn factors(&self, kb: &mut KernelBuilder, i: Value, j0: Value, keys: usize) -> Mem {
        let factors = kb.reg(DType::F32, keys);
        let (i, j0) = (kb.cast(i, DType::U64), kb.cast(j0, DType::U64));
        let row = kb.add(self.row0, i);
        let first = kb.ternary(TernaryOp::MulAdd, row, self.s, j0);
        let four = kb.constant(Scalar::U64(4));
        let first_block = kb.div(first, four);
        let end = kb.constant(Scalar::U64(keys as u64));
        let end = kb.add(first, end);
        let (zero, blocks) = (
            kb.constant(Scalar::U64(0)),
            kb.constant(Scalar::U64(keys.div_ceil(4) as u64 + 1)),
        );
        kb.range(zero, blocks, |kb, b| {
            let block = kb.add(first_block, b);
            let words = crate::philox::emit(kb, block, self.key);
            let base = kb.mul(block, four);
            for (w, word) in words.into_iter().enumerate() {
                let lane = kb.constant(Scalar::U64(w as u64));
                let pos = kb.add(base, lane);
                let after = kb.binary(BinaryOp::Ge, pos, first);
                let before = kb.lt(pos, end);
                let inside = kb.binary(BinaryOp::And, after, before);
                kb.if_(inside, |kb| {
                    let jj = kb.sub(pos, first);
                    let jj = kb.cast(jj, DType::I32);
                    let kept = kb.binary(BinaryOp::Ge, word, self.threshold);
                    let factor = kb.select(kept, self.scale, self.zero);
                    kb.store(factors, jj, factor);
                });
            }
        });
        factors
    }

    /// The factor of query `i`'s probability at key `j` alone (one Philox block).
    pub(crate) fn factor(&self, kb: &mut KernelBuilder, i: Value, j: Value) -> Value {
        let (i, j) = (kb.cast(i, DType::U64), kb.cast(j, DType::U64));
        let row = kb.add(self.row0, i);
        let pos = kb.ternary(TernaryOp::MulAdd, row, self.s, j);
        let four = kb.constant(Scalar::U64(4));
        let block = kb.div(pos, four);
        let lane = kb.rem(pos, four);
        let words = crate::philox::emit(kb, block, self.key);
        let mut word = words[3];
        for w in (0..3).rev() {
            let at = kb.constant(Scalar::U64(w as u64));
            let here = kb.binary(BinaryOp::Eq, lane, at);
            word = kb.select(here, words[w], word);
        }
        let kept = kb.binary(BinaryOp::Ge, word, self.threshold);
        kb.select(kept, self.scale, self.zero)
    }
}

/// The kernel computing `op`, its buffer parameters `[q, k, v, mask (when the op has
/// one), key (with dropout), out]` declared with the element counts `lens` (those of the buffers the launch
/// binds, in the same order): a query row per invocation, key and value tiles shared
/// through local memory. `Err` says why there is none: head dims that are not constants
/// or are longer than the registers hold, operands other than f16, bf16 and f32, masks
/// other than those or bool.
pub fn attention_kernel(op: &Attention, lens: &[Dim]) -> Result<Kernel, String> {
    let Setup {
        mut kb,
        q,
        k,
        v,
        mask,
        key,
        out,
        idx,
        e,
        ev,
    } = Setup::new(op, lens, "attention")?;
    let keys = (TILE_BYTES / 4 / (e + ev)).clamp(1, 32);
    let keys = 1 << keys.ilog2();
    let f32 = DType::F32;
    kb.grid(
        [op.l.ceil_div(ROWS as i64), op.batch, Dim::constant(1)],
        [ROWS, 1, 1],
    );

    let c = |kb: &mut KernelBuilder, x: usize| kb.constant_as(x as i64, idx);
    let neg_inf = kb.constant(Scalar::F32(f32::NEG_INFINITY));
    let zero = kb.constant(Scalar::F32(0.0));
    let group = kb.group_id(0, idx);
    let rows = c(&mut kb, ROWS);
    let row0 = kb.mul(group, rows);
    let lid = kb.local_id(0, idx);
    let i = kb.add(row0, lid);
    let pair = kb.group_id(1, idx);
    let [
        (q_base, q_row_stride),
        (k_base, k_row),
        (v_base, v_row),
        (out_base, out_row),
    ] = pair_rows(&mut kb, op, pair, idx);
    let (l, s) = (kb.expr(op.l, idx), kb.expr(op.s, idx));
    let row_valid = kb.lt(i, l);

    // The row's query (zeros past `l`: such rows only help copy tiles).
    let q_row = kb.reg(f32, e);
    let ev_v = c(&mut kb, ev);
    let q_base = kb.ternary(TernaryOp::MulAdd, i, q_row_stride, q_base);
    let (zero_i, e_end) = (c(&mut kb, 0), c(&mut kb, e));
    kb.range(zero_i, e_end, |kb, d| {
        kb.store(q_row, d, zero);
        kb.if_(row_valid, |kb| {
            let at = kb.add(q_base, d);
            let x = load_f32(kb, q, at);
            kb.store(q_row, d, x);
        });
    });
    // Running max, sum, and the output accumulators.
    let stats = kb.reg(f32, 2);
    let (first, second) = (c(&mut kb, 0), c(&mut kb, 1));
    kb.store(stats, first, neg_inf);
    kb.store(stats, second, zero);
    let acc = kb.reg(f32, ev);
    let ev_end = c(&mut kb, ev);
    kb.range(zero_i, ev_end, |kb, x| kb.store(acc, x, zero));

    let k_tile = kb.local(f32, keys * e);
    let v_tile = kb.local(f32, keys * ev);
    let key_end = if op.causal {
        let last = kb.add(row0, rows);
        kb.binary(BinaryOp::Min, last, s)
    } else {
        s
    };
    let keys_v = c(&mut kb, keys);
    let one = c(&mut kb, 1);
    let tiles = kb.add(key_end, keys_v);
    let tiles = kb.sub(tiles, one);
    let tiles = kb.div(tiles, keys_v);
    let scorer = Scorer::new(&mut kb, op, mask, pair, idx);
    let dropper = op
        .dropout
        .zip(key)
        .map(|(d, key)| Dropper::new(&mut kb, op, d, key, pair));

    kb.range(zero_i, tiles, |kb, t| {
        let j0 = kb.mul(t, keys_v);
        copy_tile(kb, k_tile, k, (k_base, k_row, j0, s), (keys, e), true, idx);
        copy_tile(
            kb,
            v_tile,
            v,
            (v_base, v_row, j0, s),
            (keys, ev),
            false,
            idx,
        );
        kb.barrier();

        // Scores of this tile, and their max.
        let scores = kb.reg(f32, keys);
        let tile_max = kb.reg(f32, 1);
        kb.store(tile_max, first, neg_inf);
        let keys_end = c(kb, keys);
        // Dot products with the keys' elements outermost: the inner loop runs over keys
        // (contiguous in the transposed tile, independent sums a CPU compiler vectorizes).
        kb.range(zero_i, keys_end, |kb, jj| kb.store(scores, jj, zero));
        kb.range(zero_i, e_end, |kb, d| {
            let x = kb.load(q_row, d);
            let row = kb.mul(d, keys_end);
            kb.range(zero_i, keys_end, |kb, jj| {
                let at = kb.add(row, jj);
                let y = kb.load(k_tile, at);
                let sum = kb.load(scores, jj);
                let sum = kb.ternary(TernaryOp::MulAdd, x, y, sum);
                kb.store(scores, jj, sum);
            });
        });
        kb.range(zero_i, keys_end, |kb, jj| {
            let dot = kb.load(scores, jj);
            let j = kb.add(j0, jj);
            let score = scorer.score(kb, dot, i, j, row_valid);
            kb.store(scores, jj, score);
            let m = kb.load(tile_max, first);
            let m = kb.binary(BinaryOp::Max, m, score);
            kb.store(tile_max, first, m);
        });

        // The online softmax step: rescale by the grown max, then add the tile's weights.
        let old = kb.load(stats, first);
        let grown = kb.load(tile_max, first);
        let new = kb.binary(BinaryOp::Max, old, grown);
        let shift = exp_shift(kb, new, neg_inf, zero);
        let lost = kb.sub(old, shift);
        let rescale = kb.unary(UnaryOp::Exp, lost);
        kb.store(stats, first, new);
        let sum = kb.load(stats, second);
        let sum = kb.mul(sum, rescale);
        kb.store(stats, second, sum);
        kb.range(zero_i, ev_end, |kb, x| {
            let a = kb.load(acc, x);
            let a = kb.mul(a, rescale);
            kb.store(acc, x, a);
        });
        let factors = dropper.as_ref().map(|d| d.factors(kb, i, j0, keys));
        kb.range(zero_i, keys_end, |kb, jj| {
            let score = kb.load(scores, jj);
            let lifted = kb.sub(score, shift);
            let weight = kb.unary(UnaryOp::Exp, lifted);
            let sum = kb.load(stats, second);
            let sum = kb.add(sum, weight);
            kb.store(stats, second, sum);
            // Dropout scales what the value rows get, not the normalizing sum.
            let weight = match factors {
                Some(factors) => {
                    let factor = kb.load(factors, jj);
                    kb.mul(weight, factor)
                }
                None => weight,
            };
            let row = kb.mul(jj, ev_v);
            kb.range(zero_i, ev_end, |kb, x| {
                let at = kb.add(row, x);
                let value = kb.load(v_tile, at);
                let a = kb.load(acc, x);
                let a = kb.ternary(TernaryOp::MulAdd, weight, value, a);
                kb.store(acc, x, a);
            });
        });
        kb.barrier();
    });

    kb.if_(row_valid, |kb| {
        let sum = kb.load(stats, second);
        let base = kb.ternary(TernaryOp::MulAdd, i, out_row, out_base);
        kb.range(zero_i, ev_end, |kb, x| {
            let a = kb.load(acc, x);
            let y = kb.div(a, sum);
            let at = kb.add(base, x);
            store_as(kb, out, at, y, op.dtype);
        });
    });
    kb.build().map_err(|e| e.to_string())
}

/// Most queries per pair [`attention_decode_kernel`] takes: it runs a workgroup per query.
pub const DECODE_MAX_QUERIES: i64 = 16;

/// The kernel computing `op` for a few queries against many keys (decoding: one new token
/// against the cache), buffers as [`attention_kernel`]'s: a workgroup per (query, pair)
/// whose invocations split the keys (invocation `t` takes keys `t, t + T, ...`), each
/// keeping an online softmax of its own in registers; the partial results are then
/// combined through local memory (each partial sum rescaled by `exp(its max − the max)`),
/// the invocations sharing the output columns. `Err` where [`attention_kernel`] has none,
/// or where the number of queries is not a constant of at most [`DECODE_MAX_QUERIES`].
pub fn attention_decode_kernel(op: &Attention, lens: &[Dim]) -> Result<Kernel, String> {
    if !op
        .l
        .as_const()
        .is_some_and(|l| (1..=DECODE_MAX_QUERIES).contains(&l))
    {
        return Err(format!(
            "{} queries: the decode kernel takes a constant 1..={DECODE_MAX_QUERIES}",
            op.l
        ));
    }
    if op.dropout.is_some() {
        return Err(format!("{op}: the decode kernel has no dropout"));
    }
    let Setup {
        mut kb,
        q,
        k,
        v,
        mask,
        key: _,
        out,
        idx,
        e,
        ev,
    } = Setup::new(op, lens, "attention_decode")?;
    // Invocations per workgroup: their partial accumulators fill at most the tile budget.
    let lanes = (TILE_BYTES / 4 / (ev + 2)).clamp(1, 64);
    let lanes = 1 << lanes.ilog2();
    let f32 = DType::F32;
    kb.grid([op.l, op.batch, Dim::constant(1)], [lanes, 1, 1]);
    let c = |kb: &mut KernelBuilder, x: usize| kb.constant_as(x as i64, idx);
    let neg_inf = kb.constant(Scalar::F32(f32::NEG_INFINITY));
    let zero = kb.constant(Scalar::F32(0.0));
    let (zero_i, first, second) = (c(&mut kb, 0), c(&mut kb, 0), c(&mut kb, 1));
    let (e_v, ev_v, lanes_v) = (c(&mut kb, e), c(&mut kb, ev), c(&mut kb, lanes));
    let i = kb.group_id(0, idx);
    let pair = kb.group_id(1, idx);
    let lid = kb.local_id(0, idx);
    let [
        (q_base, q_row_stride),
        (k_base, k_row),
        (v_base, v_row),
        (out_base, out_row),
    ] = pair_rows(&mut kb, op, pair, idx);
    let s = kb.expr(op.s, idx);
    let always = kb.constant(Scalar::Bool(true));

    let q_row = kb.reg(f32, e);
    let q_base = kb.ternary(TernaryOp::MulAdd, i, q_row_stride, q_base);
    kb.range(zero_i, e_v, |kb, d| {
        let at = kb.add(q_base, d);
        let x = load_f32(kb, q, at);
        kb.store(q_row, d, x);
    });
    let stats = kb.reg(f32, 2);
    kb.store(stats, first, neg_inf);
    kb.store(stats, second, zero);
    let acc = kb.reg(f32, ev);
    kb.range(zero_i, ev_v, |kb, x| kb.store(acc, x, zero));

    let key_end = if op.causal {
        let one = c(&mut kb, 1);
        let seen = kb.add(i, one);
        kb.binary(BinaryOp::Min, seen, s)
    } else {
        s
    };
    let scorer = Scorer::new(&mut kb, op, mask, pair, idx);
    let one = c(&mut kb, 1);
    let steps = kb.add(key_end, lanes_v);
    let steps = kb.sub(steps, one);
    let steps = kb.div(steps, lanes_v);
    kb.range(zero_i, steps, |kb, t| {
        let j = kb.ternary(TernaryOp::MulAdd, t, lanes_v, lid);
        let inside = kb.lt(j, key_end);
        kb.if_(inside, |kb| {
            let dot = kb.reg(f32, 1);
            kb.store(dot, first, zero);
            let row = kb.ternary(TernaryOp::MulAdd, j, k_row, k_base);
            kb.range(zero_i, e_v, |kb, d| {
                let x = kb.load(q_row, d);
                let at = kb.add(row, d);
                let y = load_f32(kb, k, at);
                let sum = kb.load(dot, first);
                let sum = kb.ternary(TernaryOp::MulAdd, x, y, sum);
                kb.store(dot, first, sum);
            });
            let dot = kb.load(dot, first);
            let score = scorer.score(kb, dot, i, j, always);
            let old = kb.load(stats, first);
            let new = kb.binary(BinaryOp::Max, old, score);
            let shift = exp_shift(kb, new, neg_inf, zero);
            let lost = kb.sub(old, shift);
            let rescale = kb.unary(UnaryOp::Exp, lost);
            let lifted = kb.sub(score, shift);
            let weight = kb.unary(UnaryOp::Exp, lifted);
            kb.store(stats, first, new);
            let sum = kb.load(stats, second);
            let sum = kb.ternary(TernaryOp::MulAdd, sum, rescale, weight);
            kb.store(stats, second, sum);
            let row = kb.ternary(TernaryOp::MulAdd, j, v_row, v_base);
            kb.range(zero_i, ev_v, |kb, x| {
                let at = kb.add(row, x);
                let value = load_f32(kb, v, at);
                let a = kb.load(acc, x);
                let a = kb.mul(a, rescale);
                let a = kb.ternary(TernaryOp::MulAdd, weight, value, a);
                kb.store(acc, x, a);
            });
        });
    });

    // Combine the invocations' partial softmaxes.
    let maxes = kb.local(f32, lanes);
    let sums = kb.local(f32, lanes);
    let partial = kb.local(f32, lanes * ev);
    let m = kb.load(stats, first);
    kb.store(maxes, lid, m);
    let l_part = kb.load(stats, second);
    kb.store(sums, lid, l_part);
    let own = kb.mul(lid, ev_v);
    kb.range(zero_i, ev_v, |kb, x| {
        let a = kb.load(acc, x);
        let at = kb.add(own, x);
        kb.store(partial, at, a);
    });
    kb.barrier();
    let top = kb.reg(f32, 1);
    kb.store(top, first, neg_inf);
    kb.range(zero_i, lanes_v, |kb, w| {
        let m = kb.load(maxes, w);
        let t = kb.load(top, first);
        let t = kb.binary(BinaryOp::Max, t, m);
        kb.store(top, first, t);
    });
    let top = kb.load(top, first);
    let shift = exp_shift(&mut kb, top, neg_inf, zero);
    // Each invocation's weight, and the total.
    let weights = kb.reg(f32, lanes);
    let total = kb.reg(f32, 1);
    kb.store(total, first, zero);
    kb.range(zero_i, lanes_v, |kb, w| {
        let m = kb.load(maxes, w);
        let lifted = kb.sub(m, shift);
        let weight = kb.unary(UnaryOp::Exp, lifted);
        kb.store(weights, w, weight);
        let part = kb.load(sums, w);
        let t = kb.load(total, first);
        let t = kb.ternary(TernaryOp::MulAdd, part, weight, t);
        kb.store(total, first, t);
    });
    let total = kb.load(total, first);
    let out_base = kb.ternary(TernaryOp::MulAdd, i, out_row, out_base);
    let columns = c(&mut kb, ev.div_ceil(lanes));
    kb.range(zero_i, columns, |kb, r| {
        let x = kb.ternary(TernaryOp::MulAdd, r, lanes_v, lid);
        let inside = kb.lt(x, ev_v);
        kb.if_(inside, |kb| {
            let sum = kb.reg(f32, 1);
            kb.store(sum, first, zero);
            kb.range(zero_i, lanes_v, |kb, w| {
                let at = kb.ternary(TernaryOp::MulAdd, w, ev_v, x);
                let a = kb.load(partial, at);
                let weight = kb.load(weights, w);
                let t = kb.load(sum, first);
                let t = kb.ternary(TernaryOp::MulAdd, a, weight, t);
                kb.store(sum, first, t);
            });
            let y = kb.load(sum, first);
            let y = kb.div(y, total);
            let at = kb.add(out_base, x);
            store_as(kb, out, at, y, op.dtype);
        });
    });
    kb.build().map_err(|e| e.to_string())
}

/// What exponentials subtract for a running max `max`: the max itself, or 0 while every key
/// so far is hidden (`max` is `-inf`), so their weights are 0 rather than NaN.
pub(crate) fn exp_shift(kb: &mut KernelBuilder, max: Value, neg_inf: Value, zero: Value) -> Value {
    let none_seen = kb.binary(BinaryOp::Eq, max, neg_inf);
    kb.select(none_seen, zero, max)
}

/// Stores the `f32` value `y` at element `at` of `buf`, rounded to `dtype`.
pub(crate) fn store_as(kb: &mut KernelBuilder, buf: Buf, at: Value, y: Value, dtype: DType) {
    let y = if dtype == DType::F32 {
        y
    } else {
        kb.cast(y, dtype)
    };
    kb.store(buf, at, y);
}

/// Loads element `at` of `buf` as `f32`.
pub(crate) fn load_f32(kb: &mut KernelBuilder, buf: Buf, at: Value) -> Value {
    let x = kb.load(buf, at);
    let (Param::Buffer { dtype, .. } | Param::Dim { dtype, .. }) = kb.kernel().params[buf.0];
    if dtype == DType::F32 {
        x
    } else {
        kb.cast(x, DType::F32)
    }
}

/// For pair `pair`, where row 0 of `q`, `k`, `v` and the output starts and the elements
/// between their rows ([`Attention::rows`]).
pub(crate) fn pair_rows(
    kb: &mut KernelBuilder,
    op: &Attention,
    pair: Value,
    idx: DType,
) -> [(Value, Value); 4] {
    let layout = op.rows();
    let heads = kb.expr(layout.heads, idx);
    let kv_group = kb.expr(op.kv_group, idx);
    let outer = kb.div(pair, heads);
    let head = kb.rem(pair, heads);
    let kv_head = kb.div(head, kv_group);
    [
        (&layout.q, head),
        (&layout.k, kv_head),
        (&layout.v, kv_head),
        (&layout.out, head),
    ]
    .map(|(strides, head)| {
        let [offset, outer_stride, head_stride, row] = strides.map(|d| kb.expr(d, idx));
        let base = kb.ternary(TernaryOp::MulAdd, outer, outer_stride, offset);
        let base = kb.ternary(TernaryOp::MulAdd, head, head_stride, base);
        (base, row)
    })
}

/// Copies rows `j0..j0 + rows` of `width` elements, starting at element `base` of `src`
/// and `row_stride` apart,
/// into `tile` as `f32`, the workgroup's invocations sharing the elements; rows at or past
/// `len` read as zeros; `transposed`: element `(row, col)` goes to `col·rows + row`.
pub(crate) fn copy_tile(
    kb: &mut KernelBuilder,
    tile: Mem,
    src: Buf,
    (base, row_stride, j0, len): (Value, Value, Value, Value),
    (rows, width): (usize, usize),
    transposed: bool,
    idx: DType,
) {
    let total = rows * width;
    let zero_i = kb.constant_as(0, idx);
    let steps = kb.constant_as(total.div_ceil(ROWS) as i64, idx);
    let (lid, stride) = (kb.local_id(0, idx), kb.constant_as(ROWS as i64, idx));
    let (width_v, total_v) = (
        kb.constant_as(width as i64, idx),
        kb.constant_as(total as i64, idx),
    );
    let zero = kb.constant(Scalar::F32(0.0));
    kb.range(zero_i, steps, |kb, step| {
        let at = kb.ternary(TernaryOp::MulAdd, step, stride, lid);
        let inside = kb.lt(at, total_v);
        kb.if_(inside, |kb| {
            let row = kb.div(at, width_v);
            let col = kb.rem(at, width_v);
            let to = if transposed {
                let rows = kb.constant_as(rows as i64, idx);
                kb.ternary(TernaryOp::MulAdd, col, rows, row)
            } else {
                at
            };
            kb.store(tile, to, zero);
            let j = kb.add(j0, row);
            let present = kb.lt(j, len);
            kb.if_(present, |kb| {
                let from = kb.ternary(TernaryOp::MulAdd, j, row_stride, base);
                let from = kb.add(from, col);
                let x = load_f32(kb, src, from);
                kb.store(tile, to, x);
            });
        });
    });
}
