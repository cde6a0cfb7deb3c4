//! The portable kernels of an attention's backward pass ([`AttentionBackward`]), in the
//! kernel IR: no `[l, s]` matrix is stored; each kernel recomputes the scores it needs from
//! `q` and `k` and the probabilities from each query's log-sum-exp.
//!
//! Two kernel shapes, both with an invocation per row and [`ROWS`] rows per workgroup of one
//! (batch, head) pair, tiles of the other side copied into local memory as `f32`:
//!
//! - **Query rows** ([`AttentionPart::LogSumExp`], [`AttentionPart::Query`]): as the
//!   forward kernel, over key (and value) tiles. The log-sum-exp keeps the forward's
//!   online max and sum; the query gradient accumulates `ds_ij k_j` in registers.
//! - **Key rows** ([`AttentionPart::Key`], [`AttentionPart::Value`]): over tiles of
//!   queries (with their output gradients, log-sum-exps and `delta`s), accumulating
//!   `ds_ij q_i` (stored transposed) or `p_ij f_ij dO_i` for the invocation's key. A causal
//!   workgroup starts at the first query that sees its first key. Dropout factors take one
//!   Philox block per (query, key).
//!
//! Every tile is stored transposed, so the dot products of a row with a tile's rows run
//! over the tile's rows innermost (contiguous, independent sums: a CPU compiler vectorizes
//! them); the weighted sums of a tile's rows loop in the order that measured faster on the
//! CPU for each kernel (`Order`). All arithmetic is `f32`.

use tessel_shape::{BinaryOp, DType, Dim, Scalar, TernaryOp, UnaryOp};

use crate::attention::{
    Dropper, ROWS, Scorer, TILE_BYTES, checked_heads, copy_tile, exp_shift, index_dtype, load_f32,
    store_as,
};
use crate::builder::{Buf, KernelBuilder};
use crate::kernel::{Access, Kernel, Mem, Value};
use crate::vendor::{AttentionBackward, AttentionPart};

/// The kernel computing `op`, its buffer parameters declared with the element counts
/// `lens` (those the launch binds, in [`AttentionBackward`]'s order). `Err` says why there
/// is none (as for [`attention_kernel`](crate::attention::attention_kernel)).
pub fn attention_backward_kernel(op: &AttentionBackward, lens: &[Dim]) -> Result<Kernel, String> {
    let fwd = &op.forward;
    match op.part {
        AttentionPart::Gradients => {
            return Err(format!(
                "{op}: the portable kernels compute the gradients one at a time (dq, dk and dv)"
            ));
        }
        AttentionPart::OutputAndLogSumExp => {
            return Err(format!(
                "{op}: the portable kernels compute the output and the log-sum-exps apart"
            ));
        }
        _ => {}
    }
    let (e, ev) = checked_heads(fwd)?;
    if fwd.layout.is_some() {
        return Err(format!(
            "{op}: the backward reads contiguous operands (the batch strides), not rows in place"
        ));
    }
    let masked = usize::from(fwd.mask.is_some());
    let want = match op.part {
        AttentionPart::LogSumExp => 3 + masked,
        _ => 7 + masked + usize::from(fwd.dropout.is_some()),
    };
    if lens.len() != want {
        return Err(format!(
            "{want} buffer lengths needed, {} given",
            lens.len()
        ));
    }
    let idx = index_dtype(lens);
    let name = match op.part {
        AttentionPart::LogSumExp => "attention_lse",
        AttentionPart::Query => "attention_dq",
        AttentionPart::Key => "attention_dk",
        AttentionPart::Value | AttentionPart::Gradients | AttentionPart::OutputAndLogSumExp => {
            "attention_dv"
        }
    };
    let mut kb = KernelBuilder::new(name);
    let mut next = lens.iter().copied();
    let mut buffer = |kb: &mut KernelBuilder, name: &str, dtype: DType, access| {
        let len = next.next().unwrap_or_else(|| Dim::constant(0));
        kb.buffer(name, dtype, len, access)
    };
    let q = buffer(&mut kb, "q", fwd.dtype, Access::Read);
    let k = buffer(&mut kb, "k", fwd.dtype, Access::Read);
    let grads = op.part != AttentionPart::LogSumExp;
    let v = grads.then(|| buffer(&mut kb, "v", fwd.dtype, Access::Read));
    let mask = fwd
        .mask
        .as_ref()
        .map(|m| (buffer(&mut kb, "mask", m.dtype, Access::Read), m));
    let key = fwd
        .dropout
        .filter(|_| grads)
        .map(|_| buffer(&mut kb, "key", DType::U32, Access::Read));
    let b = match v {
        Some(v) => {
            let d_out = buffer(&mut kb, "d_out", fwd.dtype, Access::Read);
            let lse = buffer(&mut kb, "lse", DType::F32, Access::Read);
            let delta = buffer(&mut kb, "delta", DType::F32, Access::Read);
            Some(GradBuffers {
                v,
                d_out,
                lse,
                delta,
            })
        }
        None => None,
    };
    let out_dtype = if grads { fwd.dtype } else { DType::F32 };
    let out = buffer(&mut kb, "out", out_dtype, Access::Write);
    let ctx = Ctx {
        op,
        q,
        k,
        mask,
        key,
        out,
        idx,
        e,
        ev,
    };
    let kb = match (op.part, b) {
        (AttentionPart::Key | AttentionPart::Value, Some(b)) => key_rows(kb, &ctx, b),
        (_, b) => query_rows(kb, &ctx, b),
    };
    kb.build().map_err(|e| e.to_string())
}

/// The buffers a gradient reads besides `q`, `k` and the mask.
#[derive(Clone, Copy)]
struct GradBuffers {
    v: Buf,
    d_out: Buf,
    lse: Buf,
    delta: Buf,
}

struct Ctx<'a> {
    op: &'a AttentionBackward,
    q: Buf,
    k: Buf,
    mask: Option<(Buf, &'a crate::vendor::AttentionMask)>,
    key: Option<Buf>,
    out: Buf,
    idx: DType,
    e: usize,
    ev: usize,
}

/// Loads `width` elements of `src` from `base` into a new `f32` register array, zeros where
/// `valid` is false.
fn load_row(
    kb: &mut KernelBuilder,
    src: Buf,
    base: Value,
    width: usize,
    valid: Value,
    idx: DType,
) -> Mem {
    let row = kb.reg(DType::F32, width);
    let zero = kb.constant(Scalar::F32(0.0));
    let (from, to) = (kb.constant_as(0, idx), kb.constant_as(width as i64, idx));
    kb.range(from, to, |kb, d| {
        kb.store(row, d, zero);
        kb.if_(valid, |kb| {
            let at = kb.add(base, d);
            let x = load_f32(kb, src, at);
            kb.store(row, d, x);
        });
    });
    row
}

/// A new `f32` register array of `width` zeros.
fn zeros(kb: &mut KernelBuilder, width: usize, idx: DType) -> Mem {
    let acc = kb.reg(DType::F32, width);
    let zero = kb.constant(Scalar::F32(0.0));
    let (from, to) = (kb.constant_as(0, idx), kb.constant_as(width as i64, idx));
    kb.range(from, to, |kb, x| kb.store(acc, x, zero));
    acc
}

/// How [`accumulate`] orders its loops.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// A tile row at a time, added to every accumulator (independent adds, strided loads).
    RowsOutermost,
    /// An accumulator at a time, summing the tile's rows (contiguous loads, but a chain of
    /// dependent adds a CPU compiler may not reorder). On the 2-core CPU this was faster
    /// for the key-row kernels' 16-row tiles (38 against 73 ms for `dkᵀ` at [1,12,512,64])
    /// and slower for the query-row kernel's 32-row tiles (85 against 53 ms for `dq`).
    RowsInnermost,
}

/// `acc[x] += Σ_t weights[t] · tile[x·n + t]` for `x < width`, `t < n`: a transposed
/// tile's rows, weighted.
fn accumulate(
    kb: &mut KernelBuilder,
    acc: Mem,
    weights: Mem,
    tile: Mem,
    (width, n): (usize, usize),
    order: Order,
    idx: DType,
) {
    let from = kb.constant_as(0, idx);
    let (n_v, width_v) = (
        kb.constant_as(n as i64, idx),
        kb.constant_as(width as i64, idx),
    );
    let add = |kb: &mut KernelBuilder, t: Value, x: Value| {
        let w = kb.load(weights, t);
        let at = kb.ternary(TernaryOp::MulAdd, x, n_v, t);
        let y = kb.load(tile, at);
        let a = kb.load(acc, x);
        let a = kb.ternary(TernaryOp::MulAdd, w, y, a);
        kb.store(acc, x, a);
    };
    match order {
        Order::RowsOutermost => {
            kb.range(from, n_v, |kb, t| {
                kb.range(from, width_v, |kb, x| add(kb, t, x));
            });
        }
        Order::RowsInnermost => {
            kb.range(from, width_v, |kb, x| {
                kb.range(from, n_v, |kb, t| add(kb, t, x));
            });
        }
    }
}

/// `scores[t] = Σ_d row[d] · tile[d·n + t]` for `t < n`: the dot products of one row with
/// the `n` rows of a transposed tile, the tile's rows innermost (vectorizable).
fn tile_dots(
    kb: &mut KernelBuilder,
    row: Mem,
    tile: Mem,
    width: usize,
    n: usize,
    idx: DType,
) -> Mem {
    let scores = kb.reg(DType::F32, n);
    let zero = kb.constant(Scalar::F32(0.0));
    let from = kb.constant_as(0, idx);
    let (n_v, width_v) = (
        kb.constant_as(n as i64, idx),
        kb.constant_as(width as i64, idx),
    );
    kb.range(from, n_v, |kb, t| kb.store(scores, t, zero));
    kb.range(from, width_v, |kb, d| {
        let x = kb.load(row, d);
        let base = kb.mul(d, n_v);
        kb.range(from, n_v, |kb, t| {
            let at = kb.add(base, t);
            let y = kb.load(tile, at);
            let sum = kb.load(scores, t);
            let sum = kb.ternary(TernaryOp::MulAdd, x, y, sum);
            kb.store(scores, t, sum);
        });
    });
    scores
}

/// The log-sum-exp (`grads` absent) or the query gradient, a query row per invocation.
fn query_rows(mut kb: KernelBuilder, ctx: &Ctx, grads: Option<GradBuffers>) -> KernelBuilder {
    let fwd = &ctx.op.forward;
    let (e, ev, idx) = (ctx.e, ctx.ev, ctx.idx);
    let width = if grads.is_some() { e + ev } else { e };
    let keys = (TILE_BYTES / 4 / width).clamp(1, 32);
    let keys = 1 << keys.ilog2();
    let f32 = DType::F32;
    kb.grid(
        [fwd.l.ceil_div(ROWS as i64), fwd.batch, Dim::constant(1)],
        [ROWS, 1, 1],
    );
    let c = |kb: &mut KernelBuilder, x: usize| kb.constant_as(x as i64, idx);
    let neg_inf = kb.constant(Scalar::F32(f32::NEG_INFINITY));
    let zero = kb.constant(Scalar::F32(0.0));
    let (zero_i, first, second) = (c(&mut kb, 0), c(&mut kb, 0), c(&mut kb, 1));
    let group = kb.group_id(0, idx);
    let rows = c(&mut kb, ROWS);
    let row0 = kb.mul(group, rows);
    let lid = kb.local_id(0, idx);
    let i = kb.add(row0, lid);
    let pair = kb.group_id(1, idx);
    let kv_group = kb.expr(fwd.kv_group, idx);
    let kv_pair = kb.div(pair, kv_group);
    let (l, s) = (kb.expr(fwd.l, idx), kb.expr(fwd.s, idx));
    let row_valid = kb.lt(i, l);
    let (e_v, ev_v, keys_v) = (c(&mut kb, e), c(&mut kb, ev), c(&mut kb, keys));

    let q_stride = kb.expr(fwd.q_batch_stride, idx);
    let q_base = kb.mul(pair, q_stride);
    let q_base = kb.ternary(TernaryOp::MulAdd, i, e_v, q_base);
    let q_row = load_row(&mut kb, ctx.q, q_base, e, row_valid, idx);
    let stat = kb.mul(pair, l);
    let stat = kb.add(stat, i);
    // The gradient's inputs for the row: dO, lse and delta.
    let row_inputs = grads.map(|b| {
        let l_ev = kb.mul(l, ev_v);
        let base = kb.mul(pair, l_ev);
        let base = kb.ternary(TernaryOp::MulAdd, i, ev_v, base);
        let d_out = load_row(&mut kb, b.d_out, base, ev, row_valid, idx);
        let scalars = load_row(&mut kb, b.lse, stat, 1, row_valid, idx);
        let lse = kb.load(scalars, first);
        let scalars = load_row(&mut kb, b.delta, stat, 1, row_valid, idx);
        let delta = kb.load(scalars, first);
        (b.v, d_out, lse, delta)
    });
    let stats = kb.reg(f32, 2);
    kb.store(stats, first, neg_inf);
    kb.store(stats, second, zero);
    let acc = zeros(&mut kb, e, idx);

    let k_tile = kb.local(f32, keys * e);
    let v_tile = grads.map(|_| kb.local(f32, keys * ev));
    let key_end = if fwd.causal {
        let last = kb.add(row0, rows);
        kb.binary(BinaryOp::Min, last, s)
    } else {
        s
    };
    let one = c(&mut kb, 1);
    let tiles = kb.add(key_end, keys_v);
    let tiles = kb.sub(tiles, one);
    let tiles = kb.div(tiles, keys_v);
    let k_stride = kb.expr(fwd.k_batch_stride, idx);
    let k_base = kb.mul(kv_pair, k_stride);
    let v_stride = kb.expr(fwd.v_batch_stride, idx);
    let v_base = kb.mul(kv_pair, v_stride);
    let scorer = Scorer::new(&mut kb, fwd, ctx.mask, pair, idx);
    let dropper = fwd
        .dropout
        .zip(ctx.key)
        .map(|(d, key)| Dropper::new(&mut kb, fwd, d, key, pair));

    kb.range(zero_i, tiles, |kb, t| {
        let j0 = kb.mul(t, keys_v);
        let row = c(kb, e);
        copy_tile(
            kb,
            k_tile,
            ctx.k,
            (k_base, row, j0, s),
            (keys, e),
            true,
            idx,
        );
        if let (Some(tile), Some((v, ..))) = (v_tile, row_inputs) {
            let row = c(kb, ev);
            copy_tile(kb, tile, v, (v_base, row, j0, s), (keys, ev), true, idx);
        }
        kb.barrier();
        let scores = tile_dots(kb, q_row, k_tile, e, keys, idx);
        let keys_end = c(kb, keys);
        if let (Some((_, d_out, lse, delta)), Some(v_tile)) = (row_inputs, v_tile) {
            {
                let factors = dropper.as_ref().map(|d| d.factors(kb, i, j0, keys));
                let dps = tile_dots(kb, d_out, v_tile, ev, keys, idx);
                kb.range(zero_i, keys_end, |kb, jj| {
                    let qk = kb.load(scores, jj);
                    let j = kb.add(j0, jj);
                    let score = scorer.score(kb, qk, i, j, row_valid);
                    let lifted = kb.sub(score, lse);
                    let p = kb.unary(UnaryOp::Exp, lifted);
                    let dp = kb.load(dps, jj);
                    let dp = match factors {
                        Some(factors) => {
                            let f = kb.load(factors, jj);
                            kb.mul(dp, f)
                        }
                        None => dp,
                    };
                    let ds = kb.sub(dp, delta);
                    let ds = kb.mul(p, ds);
                    kb.store(dps, jj, ds);
                });
                accumulate(kb, acc, dps, k_tile, (e, keys), Order::RowsOutermost, idx);
            }
        } else {
            {
                // The online max and sum, as the forward kernel keeps them.
                let tile_max = kb.reg(f32, 1);
                kb.store(tile_max, first, neg_inf);
                kb.range(zero_i, keys_end, |kb, jj| {
                    let qk = kb.load(scores, jj);
                    let j = kb.add(j0, jj);
                    let score = scorer.score(kb, qk, i, j, row_valid);
                    kb.store(scores, jj, score);
                    let m = kb.load(tile_max, first);
                    let m = kb.binary(BinaryOp::Max, m, score);
                    kb.store(tile_max, first, m);
                });
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
                kb.range(zero_i, keys_end, |kb, jj| {
                    let score = kb.load(scores, jj);
                    let lifted = kb.sub(score, shift);
                    let weight = kb.unary(UnaryOp::Exp, lifted);
                    let sum = kb.load(stats, second);
                    let sum = kb.add(sum, weight);
                    kb.store(stats, second, sum);
                });
            }
        }
        kb.barrier();
    });

    kb.if_(row_valid, |kb| {
        if grads.is_some() {
            let scale = kb.constant(Scalar::F32(fwd.scale.to_f64() as f32));
            let l_e = kb.mul(l, e_v);
            let base = kb.mul(pair, l_e);
            let base = kb.ternary(TernaryOp::MulAdd, i, e_v, base);
            kb.range(zero_i, e_v, |kb, d| {
                let a = kb.load(acc, d);
                let y = kb.mul(a, scale);
                let at = kb.add(base, d);
                store_as(kb, ctx.out, at, y, fwd.dtype);
            });
        } else {
            let max = kb.load(stats, first);
            let sum = kb.load(stats, second);
            let log = kb.unary(UnaryOp::Log, sum);
            let lse = kb.add(max, log);
            kb.store(ctx.out, stat, lse);
        }
    });
    kb
}

/// The key or value gradient, a key row per invocation (per query pair).
fn key_rows(mut kb: KernelBuilder, ctx: &Ctx, b: GradBuffers) -> KernelBuilder {
    let fwd = &ctx.op.forward;
    let (e, ev, idx) = (ctx.e, ctx.ev, ctx.idx);
    let of_keys = ctx.op.part == AttentionPart::Key;
    // Per query of a tile: q, dO, lse and delta.
    let queries = (TILE_BYTES / 4 / (e + ev + 2)).clamp(1, 32);
    let queries = 1 << queries.ilog2();
    let f32 = DType::F32;
    kb.grid(
        [fwd.s.ceil_div(ROWS as i64), fwd.batch, Dim::constant(1)],
        [ROWS, 1, 1],
    );
    let c = |kb: &mut KernelBuilder, x: usize| kb.constant_as(x as i64, idx);
    let zero_i = c(&mut kb, 0);
    let group = kb.group_id(0, idx);
    let rows = c(&mut kb, ROWS);
    let row0 = kb.mul(group, rows);
    let lid = kb.local_id(0, idx);
    let j = kb.add(row0, lid);
    let pair = kb.group_id(1, idx);
    let kv_group = kb.expr(fwd.kv_group, idx);
    let kv_pair = kb.div(pair, kv_group);
    let (l, s) = (kb.expr(fwd.l, idx), kb.expr(fwd.s, idx));
    let key_valid = kb.lt(j, s);
    let (e_v, ev_v, queries_v) = (c(&mut kb, e), c(&mut kb, ev), c(&mut kb, queries));

    let k_stride = kb.expr(fwd.k_batch_stride, idx);
    let k_base = kb.mul(kv_pair, k_stride);
    let k_base = kb.ternary(TernaryOp::MulAdd, j, e_v, k_base);
    let k_row = load_row(&mut kb, ctx.k, k_base, e, key_valid, idx);
    let v_row = of_keys.then(|| {
        let v_stride = kb.expr(fwd.v_batch_stride, idx);
        let v_base = kb.mul(kv_pair, v_stride);
        let v_base = kb.ternary(TernaryOp::MulAdd, j, ev_v, v_base);
        load_row(&mut kb, b.v, v_base, ev, key_valid, idx)
    });
    let width = if of_keys { e } else { ev };
    let acc = zeros(&mut kb, width, idx);

    let q_tile = kb.local(f32, queries * e);
    let d_out_tile = kb.local(f32, queries * ev);
    let lse_tile = kb.local(f32, queries);
    let delta_tile = kb.local(f32, queries);
    let q_stride = kb.expr(fwd.q_batch_stride, idx);
    let q_base = kb.mul(pair, q_stride);
    let l_ev = kb.mul(l, ev_v);
    let d_out_base = kb.mul(pair, l_ev);
    let stat_base = kb.mul(pair, l);
    // A causal workgroup's first key is seen from query `row0` on.
    let first_tile = if fwd.causal {
        kb.div(row0, queries_v)
    } else {
        zero_i
    };
    let one = c(&mut kb, 1);
    let tiles = kb.add(l, queries_v);
    let tiles = kb.sub(tiles, one);
    let tiles = kb.div(tiles, queries_v);
    let scorer = Scorer::new(&mut kb, fwd, ctx.mask, pair, idx);
    let dropper = fwd
        .dropout
        .zip(ctx.key)
        .map(|(d, key)| Dropper::new(&mut kb, fwd, d, key, pair));

    kb.range(first_tile, tiles, |kb, t| {
        let i0 = kb.mul(t, queries_v);
        let (e_row, ev_row, one_row) = (c(kb, e), c(kb, ev), c(kb, 1));
        copy_tile(
            kb,
            q_tile,
            ctx.q,
            (q_base, e_row, i0, l),
            (queries, e),
            true,
            idx,
        );
        copy_tile(
            kb,
            d_out_tile,
            b.d_out,
            (d_out_base, ev_row, i0, l),
            (queries, ev),
            true,
            idx,
        );
        copy_tile(
            kb,
            lse_tile,
            b.lse,
            (stat_base, one_row, i0, l),
            (queries, 1),
            false,
            idx,
        );
        copy_tile(
            kb,
            delta_tile,
            b.delta,
            (stat_base, one_row, i0, l),
            (queries, 1),
            false,
            idx,
        );
        kb.barrier();
        let scores = tile_dots(kb, k_row, q_tile, e, queries, idx);
        let queries_end = c(kb, queries);
        // The weight of each query's row: `ds` for the key gradient (with the products
        // `dO_i · v_j` of the whole tile first), `p · f` for the value gradient.
        let weights = match v_row {
            Some(v_row) => tile_dots(kb, v_row, d_out_tile, ev, queries, idx),
            None => kb.reg(f32, queries),
        };
        kb.range(zero_i, queries_end, |kb, ii| {
            let i = kb.add(i0, ii);
            let present = kb.lt(i, l);
            let readable = kb.binary(BinaryOp::And, present, key_valid);
            let qk = kb.load(scores, ii);
            let score = scorer.score(kb, qk, i, j, readable);
            let lse = kb.load(lse_tile, ii);
            let lifted = kb.sub(score, lse);
            let p = kb.unary(UnaryOp::Exp, lifted);
            // Queries past `l` read zeros (their dO and delta too): they add nothing.
            let factor = dropper.as_ref().map(|d| d.factor(kb, i, j));
            let weight = if v_row.is_some() {
                let dp = kb.load(weights, ii);
                let dp = match factor {
                    Some(f) => kb.mul(dp, f),
                    None => dp,
                };
                let delta = kb.load(delta_tile, ii);
                let ds = kb.sub(dp, delta);
                kb.mul(p, ds)
            } else {
                match factor {
                    Some(f) => kb.mul(p, f),
                    None => p,
                }
            };
            kb.store(weights, ii, weight);
        });
        let tile = if v_row.is_some() { q_tile } else { d_out_tile };
        accumulate(
            kb,
            acc,
            weights,
            tile,
            (width, queries),
            Order::RowsInnermost,
            idx,
        );
        kb.barrier();
    });

    kb.if_(key_valid, |kb| {
        let factor = if of_keys {
            kb.constant(Scalar::F32(fwd.scale.to_f64() as f32))
        } else {
            kb.constant(Scalar::F32(1.0))
        };
        // `dk` transposed (`e × s` per pair: consecutive keys, consecutive elements) unless
        // stored as rows; `dv` row-major.
        let width_v = c(kb, width);
        let s_w = kb.mul(s, width_v);
        let base = kb.mul(pair, s_w);
        let (base, step) = if of_keys && !ctx.op.key_rows {
            (kb.add(base, j), s)
        } else {
            (kb.ternary(TernaryOp::MulAdd, j, width_v, base), one)
        };
        kb.range(zero_i, width_v, |kb, x| {
            let a = kb.load(acc, x);
            let y = kb.mul(a, factor);
            let at = kb.ternary(TernaryOp::MulAdd, x, step, base);
            store_as(kb, ctx.out, at, y, fwd.dtype);
        });
    });
    kb
}
