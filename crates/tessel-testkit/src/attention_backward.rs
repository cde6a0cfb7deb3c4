//! The portable kernels of an attention's backward pass
//! ([`tessel_ir::attention_backward`]) against [`AttentionBackward::reference`] in `f64`.

use tessel_ir::attention_backward::attention_backward_kernel;
use tessel_ir::{
    Attention, AttentionBackward, AttentionDropout, AttentionMask, AttentionPart, Backend,
    BufferId, ProgramId,
};
use tessel_shape::{Bindings, DType, Dim, Scalar};

use crate::attention::{Operands, attention_op, operands, portable_lens};
use crate::{Conformance, Rng, decode, encode};

impl Conformance<'_> {
    /// The log-sum-exp and the gradients of `q`, `k` and `v`
    /// ([`attention_backward_kernel`]) against the `f64` reference, fed the reference's
    /// log-sum-exps and `delta`s rounded to `f32`: odd lengths, causal or not, grouped-query
    /// heads (gradients per query head), additive and boolean masks, dropout, `f32` and
    /// `bf16` (a refused half dtype is a skip). `f32` within `1e-4` of the largest value of
    /// each result, `bf16` within `2⁻⁷`.
    pub fn attention_backward_matches_the_reference(&self) {
        let none = Bindings::new();
        for (dtype, sizes, causal) in [
            (DType::F32, [3, 37, 53, 16], true),
            (DType::F32, [2, 70, 45, 8], false),
            (DType::BF16, [2, 33, 40, 16], true),
        ] {
            self.check_backward(&attention_op(dtype, sizes, causal, [false; 2]), &none);
        }
        let mut op = attention_op(DType::F32, [6, 21, 40, 8], true, [false; 2]);
        op.kv_group = 3.into();
        self.check_backward(&op, &none);
        for (strides, dtype) in [([27, 0, 0, 1], DType::F32), ([0, 0, 27, 1], DType::Bool)] {
            let mut op = attention_op(DType::F32, [6, 19, 27, 8], false, [false; 2]);
            op.mask = Some(AttentionMask {
                dtype,
                heads: 3.into(),
                strides: strides.map(Dim::from),
            });
            self.check_backward(&op, &none);
        }
        let mut op = attention_op(DType::F32, [2, 37, 45, 16], true, [false; 2]);
        op.dropout = Some(AttentionDropout {
            threshold: (0.3f64 * 4_294_967_296.0).round() as u32,
            scale: Scalar::F32((1.0 / 0.7f64) as f32),
        });
        self.check_backward(&op, &none);
    }

    fn check_backward(&self, fwd: &Attention, dims: &Bindings) {
        let (backend, device) = (self.backend(), self.device());
        check_attention_backward(backend, device, fwd, dims, |op, lens| {
            let kernel = match attention_backward_kernel(op, lens) {
                Ok(kernel) => kernel,
                // The portable kernels compute the gradients one at a time, and the
                // output apart from the log-sum-exps.
                Err(_)
                    if matches!(
                        op.part,
                        AttentionPart::Gradients | AttentionPart::OutputAndLogSumExp
                    ) =>
                {
                    return Vec::new();
                }
                Err(e) => panic!("{op}: {e}"),
            };
            match backend.compile(device, &kernel) {
                Ok(p) => vec![p],
                Err(e) => {
                    self.refused(&op.to_string(), None, &[fwd.dtype], &e);
                    Vec::new()
                }
            }
        });
    }
}

/// Runs each piece of `fwd`'s backward pass ([`AttentionBackward`]: the log-sum-exps, the
/// gradients of `q`, `k` and `v`, the three at once, and the output with the log-sum-exps;
/// the key gradient stored transposed and as rows)
/// with each program `program` gives for it (given the element counts of the buffers the
/// piece binds; none skips the piece) against the `f64` reference, fed the reference's
/// log-sum-exps and `delta`s rounded to `f32`: `f32` within `1e-4` of the largest value of
/// each result, half dtypes within `2⁻⁷`. Each program is released after its check.
/// Returns how many pieces ran.
pub fn check_attention_backward(
    backend: &dyn Backend,
    device: usize,
    fwd: &Attention,
    dims: &Bindings,
    mut program: impl FnMut(&AttentionBackward, &[Dim]) -> Vec<ProgramId>,
) -> usize {
    let sizes = fwd.sizes(dims).unwrap();
    let Operands {
        q,
        k,
        v,
        mask,
        key,
        key_values,
    } = operands(fwd, &sizes);
    let mut rng = Rng(0xd0d0 ^ sizes.l as u64);
    let raw: Vec<f64> = (0..sizes.batch * sizes.l * sizes.ev)
        .map(|_| rng.unit())
        .collect();
    let d_out = decode(fwd.dtype, &encode(fwd.dtype, &raw));
    let want = AttentionBackward::reference(fwd, &sizes, [&q, &k, &v, &mask, &d_out], key);
    let f32_of = |x: &[f64]| decode(DType::F32, &encode(DType::F32, x));
    let (lse, delta) = (f32_of(&want.lse), f32_of(&want.delta));
    let fwd_lens = portable_lens(fwd, dims);
    let stats = fwd.batch * fwd.l;
    let dk_rows = want.dk_rows(sizes.s, sizes.e);
    let mut ran = 0;
    // Each part; the key gradient's in both layouts.
    let ops = (AttentionPart::ALL.into_iter()).flat_map(|part| {
        part.key_layouts()
            .iter()
            .map(move |&key_rows| (part, key_rows))
    });
    for (part, key_rows) in ops {
        let op = AttentionBackward {
            forward: fwd.clone(),
            part,
            key_rows,
        };
        // Buffers as the part binds them.
        let masked = fwd.mask.as_ref().map(|m| (m.dtype, &mask[..], fwd_lens[3]));
        let mut data: Vec<(DType, &[f64], Dim)> =
            vec![(fwd.dtype, &q, fwd_lens[0]), (fwd.dtype, &k, fwd_lens[1])];
        let outputs: Vec<(DType, &[f64], Dim)> = if part == AttentionPart::LogSumExp {
            data.extend(masked);
            vec![(DType::F32, &want.lse, stats)]
        } else if part == AttentionPart::OutputAndLogSumExp {
            data.push((fwd.dtype, &v, fwd_lens[2]));
            data.extend(masked);
            if fwd.dropout.is_some() {
                data.push((DType::U32, &key_values, 4.into()));
            }
            vec![
                (fwd.dtype, &want.out, stats * fwd.ev),
                (DType::F32, &want.lse, stats),
            ]
        } else {
            data.push((fwd.dtype, &v, fwd_lens[2]));
            data.extend(masked);
            if fwd.dropout.is_some() {
                data.push((DType::U32, &key_values, 4.into()));
            }
            data.push((fwd.dtype, &d_out, stats * fwd.ev));
            data.push((DType::F32, &lse, stats));
            data.push((DType::F32, &delta, stats));
            let dq = (fwd.dtype, &want.dq[..], stats * fwd.e);
            let dk_want = if key_rows { &dk_rows[..] } else { &want.dk[..] };
            let dk = (fwd.dtype, dk_want, fwd.batch * fwd.s * fwd.e);
            let dv = (fwd.dtype, &want.dv[..], fwd.batch * fwd.s * fwd.ev);
            match part {
                AttentionPart::Query => vec![dq],
                AttentionPart::Key => vec![dk],
                AttentionPart::Gradients => vec![dq, dk, dv],
                _ => vec![dv],
            }
        };
        let lens: Vec<Dim> = data.iter().chain(&outputs).map(|d| d.2).collect();
        let programs = program(&op, &lens);
        if programs.is_empty() {
            continue;
        }
        for program in programs {
            run_piece(backend, device, program, &op, dims, &data, &outputs);
        }
        ran += 1;
    }
    ran
}

/// Launches `program` for `op` on `data` (the operands) and checks each result against
/// `outputs`' expected values, then frees the buffers and releases `program`.
fn run_piece(
    backend: &dyn Backend,
    device: usize,
    program: ProgramId,
    op: &AttentionBackward,
    dims: &Bindings,
    data: &[(DType, &[f64], Dim)],
    outputs: &[(DType, &[f64], Dim)],
) {
    let name = backend.name();
    let sizes = op.forward.sizes(dims).unwrap();
    let mut ids: Vec<BufferId> = data
        .iter()
        .map(|(dtype, values, _)| {
            let id = backend
                .alloc(device, values.len().max(1) * dtype.size_bytes())
                .unwrap();
            backend.write(id, 0, &encode(*dtype, values)).unwrap();
            id
        })
        .collect();
    let counts = op.out_elements(&sizes);
    let first_out = ids.len();
    for (&(out_dtype, _, _), &count) in outputs.iter().zip(&counts) {
        let out = backend
            .alloc(device, count.max(1) * out_dtype.size_bytes())
            .unwrap();
        backend
            .write(out, 0, &encode(out_dtype, &vec![f64::NAN; count]))
            .unwrap();
        ids.push(out);
    }
    backend
        .launch(program, &ids, dims)
        .unwrap_or_else(|e| panic!("{name}: {op}: {e}"));
    for (n, (&(out_dtype, expected, _), &count)) in outputs.iter().zip(&counts).enumerate() {
        let mut bytes = vec![0u8; count * out_dtype.size_bytes()];
        backend.read(ids[first_out + n], 0, &mut bytes).unwrap();
        let got = decode(out_dtype, &bytes);
        let largest = expected.iter().fold(0.0f64, |m, w| m.max(w.abs()));
        let allowed = match out_dtype {
            DType::BF16 | DType::F16 => 2f64.powi(-7) * largest,
            _ => 1e-4 * largest,
        };
        for (i, (g, w)) in got.iter().zip(expected.iter()).enumerate() {
            assert!(
                (g - w).abs() <= allowed,
                "{name}: {op} with {sizes:?}: result {n}, element {i} is {g}, want {w} (tolerance {allowed})"
            );
        }
    }
    for id in ids {
        backend.free(id).unwrap();
    }
    backend.release(program).unwrap();
}
