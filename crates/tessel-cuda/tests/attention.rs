//! The fused attention kernel ([`Backend::vendor`] on a [`VendorOp::Attention`]) against
//! [`Attention::reference`] in `f64`: odd lengths (no multiple of a tile), causal or not,
//! more queries than keys and the reverse, batch strides of 0 (one `k`/`v` for every
//! pair), grouped-query heads, additive masks with broadcast strides, a dynamic length, every dtype it runs, and the head dims it has registers for.
//! Without a GPU (or below compute capability 8.0) every test passes after a skip line.

use tessel_cuda::CudaBackend;
use tessel_ir::{Attention, AttentionMask, Backend, VendorOp};
use tessel_shape::{Bindings, DType, Dim, Scalar, Var};
use tessel_testkit::{Rng, decode, encode};

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

/// An attention over `batch` pairs of `l` queries and `s` keys of `e` elements, each
/// operand batched unless its flag in `shared` says one matrix serves every pair.
fn attention(
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
    }
}

/// Runs `op`'s fused program on `device` with `dims` on seeded random operands in
/// `[-2, 2)` and checks every output element against the `f64` reference (from the
/// operands as rounded to the dtype): within `2e-5` in `f32`; in half precision the
/// probabilities are rounded before the second product and the output once, so within
/// `2⁻⁸` (bf16) or `2⁻¹¹` (f16) relative to the largest value, twice. The output starts
/// as NaN, so an element left unwritten fails. `false` when the device has no program.
fn check(cuda: &CudaBackend, device: usize, op: &Attention, dims: &Bindings) -> bool {
    let programs = cuda
        .vendor(device, &VendorOp::Attention(op.clone()))
        .unwrap();
    let Some(program) = programs.first() else {
        return false;
    };
    assert_eq!(programs.len(), 1);
    let sizes = op.sizes(dims).unwrap();
    let counts = sizes.min_elements();
    let mut rng = Rng(0xa77e ^ (sizes.l * 1009 + sizes.s * 31 + sizes.e) as u64);
    let mut values = |n: usize| -> Vec<f64> {
        let raw: Vec<f64> = (0..n).map(|_| 2.0 * rng.unit()).collect();
        decode(op.dtype, &encode(op.dtype, &raw))
    };
    let (q, k, v) = (values(counts[0]), values(counts[1]), values(counts[2]));
    // Mask values in [-2, 2), every seventh the mask dtype's lowest (a hidden key).
    let mask_dtype = op.mask.as_ref().map(|m| m.dtype);
    let mask: Vec<f64> = match mask_dtype {
        Some(dtype) => {
            let raw: Vec<f64> = (0..sizes.mask_elements())
                .map(|i| {
                    let x = 2.0 * rng.unit();
                    if i % 7 == 3 {
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
    let size = op.dtype.size_bytes();
    let mut data: Vec<(DType, &[f64])> = vec![(op.dtype, &q), (op.dtype, &k), (op.dtype, &v)];
    if let Some(dtype) = mask_dtype {
        data.push((dtype, &mask));
    }
    let mut ids: Vec<_> = data
        .iter()
        .map(|(dtype, values)| {
            let id = cuda
                .alloc(device, values.len().max(1) * dtype.size_bytes())
                .unwrap();
            cuda.write(id, 0, &encode(*dtype, values)).unwrap();
            id
        })
        .collect();
    let out = cuda.alloc(device, counts[3].max(1) * size).unwrap();
    cuda.write(out, 0, &encode(op.dtype, &vec![f64::NAN; counts[3]]))
        .unwrap();
    ids.push(out);
    cuda.launch(program.program, &ids, dims).unwrap();
    let mut bytes = vec![0u8; counts[3] * size];
    cuda.read(out, 0, &mut bytes).unwrap();
    let got = decode(op.dtype, &bytes);
    let want = op.reference(&sizes, [&q, &k, &v, &mask]);
    let largest = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    let allowed = match op.dtype {
        DType::BF16 => 2.0 * 2f64.powi(-8) * largest,
        DType::F16 => 2.0 * 2f64.powi(-11) * largest,
        _ => 2e-5 * largest,
    };
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= allowed,
            "{op} with {sizes:?}: element {i} is {g}, want {w} (tolerance {allowed})"
        );
    }
    for id in ids {
        cuda.free(id).unwrap();
    }
    cuda.release(program.program).unwrap();
    true
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
                    let op = attention(dtype, sizes, causal, shared);
                    assert!(check(&cuda, device, &op, &Bindings::new()), "{op}");
                }
            }
        }
        // The widest head dims.
        assert!(check(
            &cuda,
            device,
            &attention(DType::BF16, [2, 77, 77, 128], true, [false; 2]),
            &Bindings::new()
        ));
        assert!(!check(
            &cuda,
            device,
            &attention(DType::F32, [2, 77, 77, 128], true, [false; 2]),
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
            let mut op = attention(dtype, [6, 40, 70, 32], true, [false; 2]);
            op.kv_group = group.into();
            assert!(check(&cuda, device, &op, &Bindings::new()), "{op}");
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
                    let mut op = attention(dtype, [2 * heads, l, s, 32], causal, [false; 2]);
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
            let mut op = attention(dtype, [3, 1, 1, 64], true, [false; 2]);
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
