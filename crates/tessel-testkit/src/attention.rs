//! Fused attention against [`Attention::reference`] in `f64`: [`check_attention`] for any
//! program that runs an [`Attention`] (a backend's own kernel or the portable one), and the
//! conformance check of the portable kernel ([`tessel_ir::attention`]).

use tessel_ir::attention::{DECODE_MAX_QUERIES, attention_decode_kernel, attention_kernel};
use tessel_ir::{
    Attention, AttentionDropout, AttentionLayout, AttentionMask, AttentionSizes, Backend, ProgramId,
};
use tessel_shape::{Bindings, DType, Dim, Scalar, Var};

use crate::{Conformance, Rng, decode, encode};

/// An attention over `batch` pairs of `l` queries and `s` keys of `e` elements, each of
/// `k` and `v` batched unless its flag in `shared` says one matrix serves every pair.
pub fn attention_op(
    dtype: DType,
    [batch, l, s, e]: [i64; 4],
    causal: bool,
    shared: [bool; 2],
) -> Attention {
    let stride = |one: bool, rows: i64| Dim::from(if one { 0 } else { rows * e });
    Attention {
        dtype,
        batch: batch.into(),
        l: l.into(),
        s: s.into(),
        e: e.into(),
        ev: e.into(),
        q_batch_stride: (l * e).into(),
        k_batch_stride: stride(shared[0], s),
        v_batch_stride: stride(shared[1], s),
        kv_group: 1.into(),
        scale: Scalar::F32(1.0 / (e as f32).sqrt()),
        causal,
        mask: None,
        dropout: None,
        layout: None,
    }
}

/// `op` (over `outer · heads` pairs) reading its rows in place as heads split out of
/// projections: `q` from a `[outer, l, 3, heads, e]` buffer of queries, keys and values
/// side by side (GPT-2's `c_attn`), `k` and `v` from `[outer, s, kv_heads, e]` ones of
/// `heads / kv_group` heads, the output written as `[outer, l, heads, ev]`.
pub fn with_heads_in_place(mut op: Attention, heads: i64) -> Attention {
    let (l, s, e, ev) = (op.l, op.s, op.e, op.ev);
    let kv_heads = Dim::constant(heads) / op.kv_group;
    let h = Dim::constant(heads);
    let q_row = Dim::constant(3) * h * e;
    op.layout = Some(Box::new(AttentionLayout {
        heads: h,
        q: [h * e, l * q_row, e, q_row],
        k: [Dim::constant(0), s * kv_heads * e, e, kv_heads * e],
        v: [Dim::constant(0), s * kv_heads * ev, ev, kv_heads * ev],
        out: [Dim::constant(0), l * h * ev, ev, h * ev],
    }));
    op
}

/// Runs `program` (which computes `op`, buffers `[q, k, v, mask?, out]`) on `device` with
/// `dims` on seeded random operands in `[-2, 2)` (every seventh float mask value the mask
/// dtype's lowest, about a quarter of a bool mask true: hidden keys) and checks every output element against the `f64` reference from
/// the operands as rounded to the dtype: within `f32_tolerance` relative to the largest
/// value in `f32`; in half precision the probabilities may be rounded before the second
/// product and the output once, so within `2⁻⁸` (bf16) or `2⁻¹¹` (f16) relative to the
/// largest value, twice. The output starts as NaN, so an element left unwritten fails.
pub fn check_attention(
    backend: &dyn Backend,
    device: usize,
    program: ProgramId,
    op: &Attention,
    dims: &Bindings,
    f32_tolerance: f64,
) {
    let name = backend.name();
    let sizes = op.sizes(dims).unwrap();
    let counts = sizes.min_elements();
    let Operands {
        q,
        k,
        v,
        mask,
        key,
        key_values,
    } = operands(op, &sizes);
    let mask_dtype = op.mask.as_ref().map(|m| m.dtype);
    let size = op.dtype.size_bytes();
    let mut data: Vec<(DType, &[f64])> = vec![(op.dtype, &q), (op.dtype, &k), (op.dtype, &v)];
    if let Some(dtype) = mask_dtype {
        data.push((dtype, &mask));
    }
    if op.dropout.is_some() {
        data.push((DType::U32, &key_values));
    }
    let mut ids: Vec<_> = data
        .iter()
        .map(|(dtype, values)| {
            let id = backend
                .alloc(device, values.len().max(1) * dtype.size_bytes())
                .unwrap();
            backend.write(id, 0, &encode(*dtype, values)).unwrap();
            id
        })
        .collect();
    let out = backend.alloc(device, counts[3].max(1) * size).unwrap();
    backend
        .write(out, 0, &encode(op.dtype, &vec![f64::NAN; counts[3]]))
        .unwrap();
    ids.push(out);
    backend
        .launch(program, &ids, dims)
        .unwrap_or_else(|e| panic!("{name}: {op}: {e}"));
    let mut bytes = vec![0u8; counts[3] * size];
    backend.read(out, 0, &mut bytes).unwrap();
    let got = decode(op.dtype, &bytes);
    let want = op.reference(&sizes, [&q, &k, &v, &mask], key);
    // Only the output's rows: a layout may leave elements between them unwritten.
    let rows: Vec<usize> = (0..sizes.batch)
        .flat_map(|b| (0..sizes.l).map(move |i| (b, i)))
        .map(|(b, i)| sizes.rows.row(3, b, sizes.kv_group, i))
        .collect();
    let written = || {
        rows.iter()
            .flat_map(|&at| (at..at + sizes.ev).map(|i| (i, got[i], want[i])))
    };
    let largest = written().fold(0.0f64, |m, (_, _, w)| m.max(w.abs()));
    let allowed = match op.dtype {
        DType::BF16 => 2.0 * 2f64.powi(-8) * largest,
        DType::F16 => 2.0 * 2f64.powi(-11) * largest,
        _ => f32_tolerance * largest,
    };
    for (i, g, w) in written() {
        assert!(
            (g - w).abs() <= allowed,
            "{name}: {op} with {sizes:?}: element {i} is {g}, want {w} (tolerance {allowed})"
        );
    }
    for id in ids {
        backend.free(id).unwrap();
    }
}

/// Seeded random operands of an attention (see [`check_attention`]).
pub(crate) struct Operands {
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    /// Empty without a mask.
    pub mask: Vec<f64>,
    /// A dropout draw's key, and its words as `f64`.
    pub key: [u32; 4],
    pub key_values: Vec<f64>,
}

/// `q`, `k`, `v` in `[-2, 2)` rounded to the dtype, the mask (every seventh float value the
/// mask dtype's lowest, about a quarter of a bool mask true), and a draw's key.
pub(crate) fn operands(op: &Attention, sizes: &AttentionSizes) -> Operands {
    let counts = sizes.min_elements();
    let mut rng = Rng(0xa77e ^ (sizes.l * 1009 + sizes.s * 31 + sizes.e) as u64);
    let mut values = |n: usize| -> Vec<f64> {
        let raw: Vec<f64> = (0..n).map(|_| 2.0 * rng.unit()).collect();
        decode(op.dtype, &encode(op.dtype, &raw))
    };
    let (q, k, v) = (values(counts[0]), values(counts[1]), values(counts[2]));
    let mask: Vec<f64> = match op.mask.as_ref().map(|m| m.dtype) {
        Some(dtype) => {
            let raw: Vec<f64> = (0..sizes.mask_elements())
                .map(|i| {
                    let x = 2.0 * rng.unit();
                    if dtype == DType::Bool {
                        // About a quarter of the keys hidden.
                        f64::from(u8::from(x > 1.0))
                    } else if i % 7 == 3 {
                        dtype.min_value().to_f64()
                    } else {
                        x
                    }
                })
                .collect();
            decode(dtype, &encode(dtype, &raw))
        }
        None => Vec::new(),
    };
    // A dropout draw's key: any four words.
    let key: [u32; 4] = [0, 1, 2, 3].map(|_| (rng.unit().abs() * 4_294_967_295.0) as u32);
    let key_values = key.iter().map(|&w| f64::from(w)).collect();
    Operands {
        q,
        k,
        v,
        mask,
        key,
        key_values,
    }
}

impl Conformance<'_> {
    /// The portable fused attention kernels ([`attention_kernel`], and
    /// [`attention_decode_kernel`] where there are at most [`DECODE_MAX_QUERIES`] queries)
    /// against the `f64` reference: odd lengths (no multiple of a tile), more queries than keys and the
    /// reverse, causal or not, `k`/`v` shared by every pair, grouped-query heads, additive
    /// and boolean masks broadcast over heads and queries (BERT's padding mask) or full, a dynamic
    /// length (of the queries and keys, or of the keys alone when decoding) served by one
    /// program, dropout of the probabilities (the rows kernel, against the same Philox
    /// bits), in `f32`, `bf16` and `f16` (refusals of a half dtype
    /// the device lacks are skips). `f32` within `1e-4` of the largest value (the
    /// transcendentals' tolerance).
    pub fn fused_attention_matches_the_reference(&self) {
        // Compiled once, checked at each of `runs`' bindings.
        // Both kernels where the decode one applies (a few queries).
        let run_at = |op: &Attention, runs: &[Bindings]| {
            let lens = portable_lens(op, &runs[0]);
            let mut kernels =
                vec![attention_kernel(op, &lens).unwrap_or_else(|e| panic!("{op}: {e}"))];
            if op.dropout.is_none() && op.l.as_const().is_some_and(|l| l <= DECODE_MAX_QUERIES) {
                kernels.push(
                    attention_decode_kernel(op, &lens).unwrap_or_else(|e| panic!("{op}: {e}")),
                );
            }
            let dtypes: Vec<DType> = [op.dtype]
                .into_iter()
                .chain(op.mask.as_ref().map(|m| m.dtype))
                .collect();
            for kernel in kernels {
                let program = match self.backend().compile(self.device(), &kernel) {
                    Ok(p) => p,
                    Err(e) => return self.refused(&op.to_string(), None, &dtypes, &e),
                };
                for dims in runs {
                    check_attention(self.backend(), self.device(), program, op, dims, 1e-4);
                }
                self.ok(self.backend().release(program), "release");
            }
        };
        let run = |op: &Attention, dims: &Bindings| run_at(op, std::slice::from_ref(dims));
        let none = Bindings::new();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (sizes, shared, causal) in [
                ([3, 37, 53, 16], [false, false], true),
                ([2, 70, 45, 16], [false, true], false),
                ([1, 1, 33, 8], [true, true], false),
            ] {
                run(&attention_op(dtype, sizes, causal, shared), &none);
            }
        }
        // Grouped-query heads: pairs 3g..3g + 2 read keys and values g.
        let mut op = attention_op(DType::F32, [6, 21, 40, 8], true, [false; 2]);
        op.kv_group = 3.into();
        run(&op, &none);
        // Masks: [batch, 1, 1, s] broadcast over heads and queries, and a full one.
        let (heads, l, s) = (3i64, 19i64, 27i64);
        for (strides, dtype) in [
            ([s, 0, 0, 1], DType::F32),
            ([0, l * s, s, 1], DType::BF16),
            ([s, 0, 0, 1], DType::Bool),
            ([0, 0, s, 1], DType::Bool),
        ] {
            let mut op = attention_op(DType::F32, [2 * heads, l, s, 8], false, [false; 2]);
            op.mask = Some(AttentionMask {
                dtype,
                heads: heads.into(),
                strides: strides.map(Dim::from),
            });
            run(&op, &none);
        }
        // Dropout of the probabilities (p = 0.3), with a causal and with a padding mask.
        for (dtype, causal) in [(DType::F32, true), (DType::BF16, false)] {
            let mut op = attention_op(dtype, [2, 37, 45, 16], causal, [false; 2]);
            op.dropout = Some(AttentionDropout {
                threshold: (0.3f64 * 4_294_967_296.0).round() as u32,
                scale: Scalar::F32((1.0 / 0.7f64) as f32),
            });
            if !causal {
                op.mask = Some(AttentionMask {
                    dtype: DType::Bool,
                    heads: 1.into(),
                    strides: [45, 0, 0, 1].map(Dim::from),
                });
            }
            run(&op, &none);
        }
        // Decoding: a few queries against more keys than a workgroup has invocations,
        // grouped-query heads, a padding mask, and one program for every cache length.
        for (sizes, causal) in [([4, 1, 200, 16], false), ([2, 3, 150, 8], true)] {
            for dtype in [DType::F32, DType::BF16] {
                run(&attention_op(dtype, sizes, causal, [false; 2]), &none);
            }
        }
        let mut op = attention_op(DType::F32, [6, 1, 90, 16], false, [false; 2]);
        op.kv_group = 3.into();
        op.mask = Some(AttentionMask {
            dtype: DType::Bool,
            heads: 3.into(),
            strides: [90, 0, 0, 1].map(Dim::from),
        });
        run(&op, &none);
        let past = Var::new("past", 1, 4096).unwrap();
        let mut op = attention_op(DType::F32, [2, 1, 1, 16], false, [false; 2]);
        op.s = past.into();
        op.k_batch_stride = Dim::from(past) * Dim::constant(16);
        op.v_batch_stride = op.k_batch_stride;
        let runs: Vec<Bindings> = [1, 33, 300]
            .map(|n| [(past, n)].into_iter().collect())
            .into();
        run_at(&op, &runs);
        // One program, a dynamic length.
        let t = Var::new("t", 1, 4096).unwrap();
        let mut op = attention_op(DType::F32, [2, 1, 1, 16], true, [false; 2]);
        op.l = t.into();
        op.s = t.into();
        op.q_batch_stride = Dim::from(t) * Dim::constant(16);
        op.k_batch_stride = op.q_batch_stride;
        op.v_batch_stride = op.q_batch_stride;
        let runs: Vec<Bindings> = [1, 40, 100].map(|n| [(t, n)].into_iter().collect()).into();
        run_at(&op, &runs);
        // Rows read and written in place: heads split out of wider rows (GPT-2's q at
        // an offset in its `c_attn` rows), grouped-query heads, decoding.
        for (dtype, sizes, causal, group) in [
            (DType::F32, [6, 37, 37, 16], true, 1),
            (DType::BF16, [6, 21, 40, 16], false, 3),
            (DType::F32, [6, 1, 70, 8], false, 1),
        ] {
            let mut op = attention_op(dtype, sizes, causal, [false; 2]);
            op.kv_group = group.into();
            run(&with_heads_in_place(op, 3), &none);
        }
    }
}

/// The element counts `[q, k, v, mask?, out]` of `op`'s buffers, symbolic where `op` is
/// (contiguous operands; the mask's count, and every count of rows in place, as evaluated
/// at `dims`).
pub(crate) fn portable_lens(op: &Attention, dims: &Bindings) -> Vec<Dim> {
    if op.layout.is_some() {
        let sizes = op.sizes(dims).unwrap();
        let [q, k, v, out] = sizes.min_elements().map(|n| Dim::from(n.max(1) as i64));
        let mut lens = vec![q, k, v];
        if op.mask.is_some() {
            lens.push((sizes.mask_elements().max(1) as i64).into());
        }
        if op.dropout.is_some() {
            lens.push(4.into());
        }
        lens.push(out);
        return lens;
    }
    let matrices = |stride: Dim, rows: Dim, width: Dim, count: Dim| {
        if stride == Dim::constant(0) {
            rows * width
        } else {
            count * stride
        }
    };
    let pairs = op.batch;
    let kv = pairs / op.kv_group;
    let mut lens = vec![
        matrices(op.q_batch_stride, op.l, op.e, pairs),
        matrices(op.k_batch_stride, op.s, op.e, kv),
        matrices(op.v_batch_stride, op.s, op.ev, kv),
    ];
    if op.mask.is_some() {
        let count = op.sizes(dims).unwrap().mask_elements().max(1);
        lens.push(count.into());
    }
    if op.dropout.is_some() {
        lens.push(4.into());
    }
    lens.push(pairs * op.l * op.ev);
    lens
}
