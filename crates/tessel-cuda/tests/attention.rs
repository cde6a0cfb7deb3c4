//! The fused attention kernel ([`Backend::vendor`] on a [`VendorOp::Attention`]) against
//! [`Attention::reference`] in `f64`: odd lengths (no multiple of a tile), causal or not,
//! more queries than keys and the reverse, batch strides of 0 (one `k`/`v` for every
//! pair), grouped-query heads, one query against many keys (split into ranges), additive masks with broadcast strides, a dynamic length, every dtype it runs, and the head dims it has registers for;
//! the fused backward pieces ([`VendorOp::AttentionBackward`]) against
//! [`AttentionBackward::reference`](tessel_ir::AttentionBackward::reference) likewise.
//! Without a GPU (or below compute capability 8.0) every test passes after a skip line.

use tessel_cuda::CudaBackend;
use tessel_ir::{Attention, AttentionMask, AttentionPart, Backend, VendorOp};
use tessel_shape::{Bindings, DType, Dim, Var};
use tessel_testkit::{
    attention_op, check_attention, check_attention_backward, with_heads_in_place,
};

/// The devices that run the kernel, or none after a skip line.
fn devices(cuda: &CudaBackend, test: &str) -> Vec<usize> {
    let found: Vec<usize> = (0..cuda.devices().len())
        .filter(|&d| cuda.compute_capability(d).is_some_and(|c| c.0 >= 8))
        .collect();
    if found.is_empty() {
        tessel_testkit::skip(
            &format!("cuda::{test}"),
            "no CUDA device of compute capability 8.0 or newer",
        );
    }
    found
}

/// Runs each of `op`'s fused programs on `device` with `dims` against the `f64` reference
/// ([`check_attention`], `f32` within `2e-5` of the largest value); `false` when the device
/// has none.
fn check(cuda: &CudaBackend, device: usize, op: &Attention, dims: &Bindings) -> bool {
    let programs = cuda
        .vendor(device, &VendorOp::Attention(op.clone()))
        .unwrap();
    for program in &programs {
        check_attention(cuda, device, program.program, op, dims, 2e-5);
        cuda.release(program.program).unwrap();
    }
    !programs.is_empty()
}

#[test]
fn fused_attention_matches_the_reference() {
    let cuda = CudaBackend::new();
    let test = "fused_attention_matches_the_reference";
    for device in devices(&cuda, test) {
        let shapes: [([i64; 4], [bool; 2]); 5] = [
            ([3, 37, 53, 64], [false, false]),
            ([2, 70, 45, 64], [false, false]),
            ([1, 1, 130, 64], [false, false]),
            ([4, 65, 65, 32], [true, true]),
            ([2, 129, 200, 16], [false, true]),
        ];
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for (sizes, shared) in shapes {
                for causal in [false, true] {
                    let op = attention_op(dtype, sizes, causal, shared);
                    assert!(check(&cuda, device, &op, &Bindings::new()), "{op}");
                }
            }
        }
        // The widest head dims.
        assert!(check(
            &cuda,
            device,
            &attention_op(DType::BF16, [2, 77, 77, 128], true, [false; 2]),
            &Bindings::new()
        ));
        assert!(!check(
            &cuda,
            device,
            &attention_op(DType::F32, [2, 77, 77, 128], true, [false; 2]),
            &Bindings::new()
        ));
    }
}

/// Grouped-query heads: pairs `2g` and `2g + 1` (or `3g..3g + 2`) read keys and values `g`.
#[test]
fn grouped_query_heads_share_keys_and_values() {
    let cuda = CudaBackend::new();
    let test = "grouped_query_heads_share_keys_and_values";
    for device in devices(&cuda, test) {
        for (dtype, group) in [(DType::BF16, 2), (DType::F32, 3)] {
            let mut op = attention_op(dtype, [6, 40, 70, 32], true, [false; 2]);
            op.kv_group = group.into();
            assert!(check(&cuda, device, &op, &Bindings::new()), "{op}");
        }
    }
}

/// Rows read and written in place: heads split out of wider rows (`q` at an offset in rows
/// of three projections, as GPT-2's `c_attn` writes them), the output written as
/// `[outer, l, heads, e]`, with grouped-query heads.
#[test]
fn rows_in_place_are_read_and_written_with_their_strides() {
    let cuda = CudaBackend::new();
    let test = "rows_in_place_are_read_and_written_with_their_strides";
    for device in devices(&cuda, test) {
        for (dtype, group) in [(DType::BF16, 1), (DType::F16, 3), (DType::F32, 1)] {
            for causal in [false, true] {
                let mut op = attention_op(dtype, [6, 77, 77, 64], causal, [false; 2]);
                op.kv_group = group.into();
                let op = with_heads_in_place(op, 3);
                assert!(check(&cuda, device, &op, &Bindings::new()), "{op}");
            }
        }
    }
}

/// Additive masks read in place: BERT's padding mask `[batch, 1, 1, s]` (one row per
/// outer index, broadcast over heads and queries), a full `[heads, l, s]` one, and an
/// `[l, s]` one shared by every pair, in f32, bf16 and f16; with the causal mask too.
#[test]
fn additive_masks_are_read_with_their_strides() {
    let cuda = CudaBackend::new();
    let test = "additive_masks_are_read_with_their_strides";
    let (heads, l, s) = (3i64, 37i64, 45i64);
    let layouts: [[i64; 4]; 3] = [[s, 0, 0, 1], [0, l * s, s, 1], [0, 0, s, 1]];
    for device in devices(&cuda, test) {
        for (dtype, mask_dtype) in [
            (DType::BF16, DType::BF16),
            (DType::F16, DType::F32),
            (DType::F32, DType::F32),
            (DType::F32, DType::F16),
        ] {
            for strides in layouts {
                for causal in [false, true] {
                    let mut op = attention_op(dtype, [2 * heads, l, s, 32], causal, [false; 2]);
                    op.mask = Some(AttentionMask {
                        dtype: mask_dtype,
                        heads: heads.into(),
                        strides: strides.map(Dim::from),
                    });
                    assert!(check(&cuda, device, &op, &Bindings::new()), "{op}");
                }
            }
        }
    }
}

/// One program serves every length: the lengths are launch arguments.
#[test]
fn one_fused_program_serves_every_length() {
    let cuda = CudaBackend::new();
    let test = "one_fused_program_serves_every_length";
    let t = Var::new("t", 1, 4096).unwrap();
    for device in devices(&cuda, test) {
        for dtype in [DType::BF16, DType::F32] {
            let mut op = attention_op(dtype, [3, 1, 1, 64], true, [false; 2]);
            op.l = t.into();
            op.s = t.into();
            op.q_batch_stride = Dim::from(t) * Dim::constant(64);
            op.k_batch_stride = op.q_batch_stride;
            op.v_batch_stride = op.q_batch_stride;
            for len in [1, 63, 64, 200] {
                let dims: Bindings = [(t, len)].into_iter().collect();
                assert!(check(&cuda, device, &op, &dims), "{op} at t = {len}");
            }
        }
    }
}

/// A few query rows against many keys (decoding with a KV cache): every program splits
/// each row's keys into ranges and joins them (two launches a call), in every dtype, with
/// head dims from one 16-byte chunk a row to 128, causal (the one query sees key 0 only),
/// additive masks, grouped-query heads, rows in place and a dynamic cache length.
#[test]
fn few_queries_against_long_caches_split_their_keys() {
    let cuda = CudaBackend::new();
    let test = "few_queries_against_long_caches_split_their_keys";
    let split = |device: usize, op: &Attention, dims: &Bindings| {
        let programs = cuda
            .vendor(device, &VendorOp::Attention(op.clone()))
            .unwrap();
        assert!(!programs.is_empty(), "{op}");
        for program in &programs {
            let before = cuda.stats().vendor_launches;
            check_attention(&cuda, device, program.program, op, dims, 2e-5);
            let launches = cuda.stats().vendor_launches - before;
            assert_eq!(
                launches, 2,
                "{op}: {launches} launches, want a split and a join"
            );
            cuda.release(program.program).unwrap();
        }
    };
    let none = Bindings::new();
    for device in devices(&cuda, test) {
        for (dtype, sizes) in [
            (DType::BF16, [2, 1, 1000, 64]),
            (DType::BF16, [12, 1, 4097, 64]),
            (DType::F16, [3, 3, 777, 128]),
            (DType::BF16, [2, 1, 333, 16]),
            (DType::F32, [2, 1, 1000, 64]),
            (DType::F32, [3, 2, 555, 32]),
            (DType::F32, [2, 1, 300, 4]),
        ] {
            for causal in [false, true] {
                split(
                    device,
                    &attention_op(dtype, sizes, causal, [false; 2]),
                    &none,
                );
            }
        }
        for (dtype, group) in [(DType::BF16, 4), (DType::F32, 2)] {
            let mut op = attention_op(dtype, [8, 1, 1500, 64], false, [false; 2]);
            op.kv_group = group.into();
            split(device, &with_heads_in_place(op, 8), &none);
        }
        // BERT's padding mask, one row of keys per outer index.
        let (heads, s) = (3i64, 900i64);
        for (dtype, mask_dtype) in [(DType::BF16, DType::BF16), (DType::F32, DType::F32)] {
            let mut op = attention_op(dtype, [2 * heads, 1, s, 64], false, [false; 2]);
            op.mask = Some(AttentionMask {
                dtype: mask_dtype,
                heads: heads.into(),
                strides: [s, 0, 0, 1].map(Dim::from),
            });
            split(device, &op, &none);
        }
        // One program over a growing cache.
        let t = Var::new("t", 1, 8192).unwrap();
        for dtype in [DType::BF16, DType::F32] {
            let mut op = attention_op(dtype, [12, 1, 1, 64], false, [false; 2]);
            op.s = t.into();
            op.k_batch_stride = Dim::from(t) * Dim::constant(64);
            op.v_batch_stride = op.k_batch_stride;
            for len in [129, 2000, 8192] {
                let dims: Bindings = [(t, len)].into_iter().collect();
                split(device, &op, &dims);
            }
        }
    }
}

/// The fused backward's pieces: in `bf16` and `f16` five (log-sum-exps, `dq`, `dk`
/// transposed and as rows, `dv`), in `f32` three (log-sum-exps; `dq`, `dk` and `dv` in one
/// program, `dk` in either layout), and in every dtype the forward's programs writing the
/// log-sum-exps with the output:
/// odd lengths, causal or not, more queries than keys and the reverse, grouped-query heads,
/// a dynamic length; within `2⁻⁷` (half) or `1e-4` (f32) of each result's largest value.
#[test]
fn fused_attention_backward_matches_the_reference() {
    let cuda = CudaBackend::new();
    let test = "fused_attention_backward_matches_the_reference";
    let fused = |device: usize, op: &Attention, dims: &Bindings| {
        check_attention_backward(&cuda, device, op, dims, |piece, _| {
            let programs = cuda
                .vendor(device, &VendorOp::AttentionBackward(piece.clone()))
                .unwrap();
            // The output with the log-sum-exps has each forward program; the rest one.
            if piece.part != AttentionPart::OutputAndLogSumExp {
                assert!(programs.len() <= 1, "{piece}");
            }
            // Only the three gradients in one pass sum atomically.
            for p in &programs {
                assert_eq!(
                    p.deterministic,
                    piece.part != AttentionPart::Gradients,
                    "{piece}"
                );
            }
            programs.iter().map(|p| p.program).collect()
        })
    };
    for device in devices(&cuda, test) {
        let none = Bindings::new();
        for (dtype, sizes, causal) in [
            (DType::BF16, [3, 37, 53, 64], true),
            (DType::BF16, [2, 70, 45, 64], false),
            (DType::F16, [2, 130, 130, 32], true),
            (DType::BF16, [2, 129, 200, 16], false),
            (DType::BF16, [4, 200, 70, 64], true),
        ] {
            let op = attention_op(dtype, sizes, causal, [false; 2]);
            assert_eq!(fused(device, &op, &none), 6, "{op}");
        }
        for (sizes, causal) in [
            ([3, 37, 53, 64], true),
            ([2, 70, 45, 64], false),
            ([2, 130, 130, 32], true),
            ([2, 129, 200, 16], false),
            ([4, 200, 70, 64], true),
            ([2, 33, 33, 8], true),
        ] {
            let op = attention_op(DType::F32, sizes, causal, [false; 2]);
            assert_eq!(fused(device, &op, &none), 4, "{op}");
        }
        let mut op = attention_op(DType::F32, [6, 40, 70, 32], true, [false; 2]);
        op.kv_group = 3.into();
        assert_eq!(fused(device, &op, &none), 4, "{op}");
        let mut op = attention_op(DType::BF16, [6, 40, 70, 32], true, [false; 2]);
        op.kv_group = 3.into();
        assert_eq!(fused(device, &op, &none), 6, "{op}");
        let t = Var::new("t", 1, 4096).unwrap();
        for (dtype, pieces) in [(DType::BF16, 6), (DType::F32, 4)] {
            let mut op = attention_op(dtype, [3, 1, 1, 64], true, [false; 2]);
            op.l = t.into();
            op.s = t.into();
            op.q_batch_stride = Dim::from(t) * Dim::constant(64);
            op.k_batch_stride = op.q_batch_stride;
            op.v_batch_stride = op.q_batch_stride;
            for len in [1, 64, 97] {
                let dims: Bindings = [(t, len)].into_iter().collect();
                assert_eq!(fused(device, &op, &dims), pieces, "{op} at t = {len}");
            }
        }
        // Heads past 64 are left to the portable kernels, but for the forward's output
        // with the log-sum-exps.
        let op = attention_op(DType::BF16, [2, 33, 33, 128], true, [false; 2]);
        assert_eq!(fused(device, &op, &none), 1);
    }
}
