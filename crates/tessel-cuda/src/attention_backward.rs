//! Fused attention backward (flash attention 2): the pieces of an [`AttentionBackward`] as
//! CUDA C of our own, `attention_backward.cu` after `attention.cu` (whose copies and
//! `mma.sync` helpers it uses), configured per program by macros. The probabilities are
//! recomputed from the scores and each query's log-sum-exp, so no `[l, s]` matrix is stored.
//!
//! - Half operands (`f16`, `bf16`) on tensor cores with `f32` sums, in four pieces: the
//!   log-sum-exps and `dq` with a block per tile of 64 queries walking the key tiles; `dkᵀ`
//!   and `dv` with a block per tile of 64 keys walking the query tiles that see it (causal:
//!   from the tile's first key on).
//! - `f32` on the CUDA cores: the log-sum-exps with a thread per query row, and the three
//!   gradients in one pass ([`AttentionPart::Gradients`]) with a block per tile of 64 keys:
//!   `dkᵀ` and `dv` summed in registers, `dq` added atomically (the program zeroes it
//!   first), so each `(query, key)` pair costs five products of the head dim instead of the
//!   nine three separate passes recompute.
//!
//! It runs what the forward kernel ([`crate::attention`]) runs, without a mask or dropout
//! and with head dims up to 64 (the accumulators of `dk`/`dv` stay in registers); anything
//! else is left to the portable kernels and the composition ([`supports`] says why not).

use std::sync::Arc;

use tessel_ir::{AttentionBackward, AttentionPart, BackendError, BufferId, VendorProgram};
use tessel_shape::{Bindings, DType};

use crate::device::CudaDevice;
use crate::ffi::{ArgSlot, Module};
use crate::{CudaBackend, Program, Timing};

/// The kernel text, after `attention.cu` and the macros [`source`] writes.
const TEMPLATE: &str = include_str!("attention_backward.cu");

/// The kernel's entry point (one per program: the part is a macro).
const ENTRY: &str = "tessel_attention_backward";

/// Rows (queries or keys) per block of the half kernels and of the f32 gradients.
const BLOCK_ROWS: usize = 64;

/// Threads per block of the half kernels, and of the f32 log-sum-exps (a query row each).
const THREADS: usize = 128;

/// Threads sharing a key in the f32 gradients' kernel (`FAB_SPLIT`), each holding a part
/// of the head dim.
const SPLIT: usize = 2;

/// Queries per step of the f32 gradients' kernel (`FAB_BM`) and keys per tile of its
/// log-sum-exps (`FAB_KEYS`), as `attention_backward.cu` defines them.
const F32_STEP: usize = 32;

/// A compiled piece of an attention's backward pass.
pub(crate) struct AttentionBackwardProgram {
    op: AttentionBackward,
    device: Arc<CudaDevice>,
    module: Arc<Module>,
    origin: tessel_ir::ProgramOrigin,
    /// `op` as text: the program's name in errors.
    name: String,
}

impl AttentionBackwardProgram {
    pub(crate) fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    pub(crate) fn origin(&self) -> tessel_ir::ProgramOrigin {
        self.origin
    }
}

/// Why the kernels cannot run `op` on a device of compute capability `capability`, or
/// `None` when they can.
pub(crate) fn supports(op: &AttentionBackward, capability: (i32, i32)) -> Option<String> {
    let fwd = &op.forward;
    if let Some(why) = crate::attention::supports(fwd, capability) {
        return Some(why);
    }
    let half = matches!(fwd.dtype, DType::F16 | DType::BF16);
    match op.part {
        AttentionPart::OutputAndLogSumExp => {
            return Some("the forward's kernels write the output and the log-sum-exps".into());
        }
        AttentionPart::Gradients if half => {
            return Some(format!(
                "in {} the gradients are separate pieces (dq, dk, dv)",
                fwd.dtype
            ));
        }
        AttentionPart::Query | AttentionPart::Key | AttentionPart::Value if !half => {
            return Some(format!(
                "in {} the gradients are computed together (dq, dk and dv)",
                fwd.dtype
            ));
        }
        _ => {}
    }
    if fwd.mask.is_some() {
        return Some("the fused backward reads no mask".into());
    }
    if fwd.layout.is_some() {
        return Some("the fused backward reads contiguous operands, not rows in place".into());
    }
    match fwd.e.as_const() {
        Some(e) if e % (4 * SPLIT as i64) != 0 && op.part == AttentionPart::Gradients => Some(
            format!("a head dim of {e} does not split into {SPLIT} whole 16-byte chunks"),
        ),
        Some(e) if e <= 64 => None,
        e => Some(format!(
            "a head dim of {e:?} is past the 64 the fused backward keeps in registers"
        )),
    }
}

/// The CUDA C of `op`: `attention.cu` and `attention_backward.cu` after the configuration.
fn source(op: &AttentionBackward, head_dim: i64) -> String {
    let fwd = &op.forward;
    let part = match op.part {
        // `supports` leaves the output to the forward's kernels.
        AttentionPart::LogSumExp | AttentionPart::OutputAndLogSumExp => 0,
        AttentionPart::Query => 1,
        AttentionPart::Key => 2,
        AttentionPart::Value => 3,
        AttentionPart::Gradients => 4,
    };
    let half = matches!(fwd.dtype, DType::F16 | DType::BF16);
    let f32_config = if half {
        String::new()
    } else {
        format!(
            "#define FA_HELPERS_ONLY\n#define FA_THREADS {}\n#define FAB_SPLIT {SPLIT}\n",
            threads(op)
        )
    };
    format!(
        "// {op}\n#define FA_D {head_dim}\n#define FA_HALF {}\n#define FA_F16 {}\n#define FA_CAUSAL {}\n#define FA_MASK 0\n#define FAB_PART {part}\n#define FAB_KEY_ROWS {}\n{f32_config}{}\n{TEMPLATE}",
        u8::from(half),
        u8::from(fwd.dtype == DType::F16),
        u8::from(fwd.causal),
        u8::from(op.key_rows),
        crate::attention::TEMPLATE,
    )
}

/// Threads per block of `op`'s kernel.
fn threads(op: &AttentionBackward) -> usize {
    match op.part {
        AttentionPart::Gradients => BLOCK_ROWS * SPLIT,
        _ => THREADS,
    }
}

/// Rows (queries or keys) per block of `op`'s kernel.
fn rows_per_block(op: &AttentionBackward) -> usize {
    match (op.forward.dtype, op.part) {
        (DType::F32, AttentionPart::LogSumExp) => THREADS,
        _ => BLOCK_ROWS,
    }
}

/// Dynamic shared memory of `op`'s kernel at head dim `e`: half, tiles of `q`, `k`, `v` and
/// `dO` (rows padded as the kernels lay them out), then a query tile's statistics; f32, two
/// key tiles (log-sum-exps), or two steps of `q`, `dO` and statistics, the key tile and
/// `dsᵀ` (gradients).
fn shared_bytes(op: &AttentionBackward, e: usize) -> u32 {
    let floats = match (op.forward.dtype, op.part) {
        (DType::F32, AttentionPart::LogSumExp) => 2 * F32_STEP * e,
        (DType::F32, _) => {
            2 * (2 * F32_STEP * e + 2 * F32_STEP) + BLOCK_ROWS * e + BLOCK_ROWS * (F32_STEP + 1)
        }
        _ => return (4 * BLOCK_ROWS * (e + 8) * 2 + 2 * BLOCK_ROWS * 4) as u32,
    };
    (floats * 4) as u32
}

impl CudaBackend {
    /// The program for `op` on `device` ([`Backend::vendor`](tessel_ir::Backend::vendor)):
    /// the fused kernel where [`supports`] allows it, else none.
    pub(crate) fn attention_backward_programs(
        &self,
        device: usize,
        op: &AttentionBackward,
    ) -> Result<Vec<VendorProgram>, BackendError> {
        let dev = self.device(device)?;
        if let Some(why) = supports(op, dev.capability) {
            tracing::trace!("tessel-cuda: no fused kernel for {op}: {why}");
            return Ok(Vec::new());
        }
        let head_dim = op.forward.e.as_const().unwrap_or(0);
        let name = op.to_string();
        let (module, origin) = self.module(dev, &name, ENTRY, &source(op, head_dim))?;
        let shared = shared_bytes(op, head_dim as usize);
        module
            .allow_shared(shared)
            .map_err(|e| BackendError::Compile {
                kernel: name.clone(),
                code: String::new(),
                log: format!(
                    "{shared} bytes of shared memory are more than the device allows: {e}"
                ),
            })?;
        let program = AttentionBackwardProgram {
            op: op.clone(),
            device: Arc::clone(dev),
            module,
            origin,
            name,
        };
        Ok(vec![VendorProgram {
            program: self.programs.insert(Program::AttentionBackward(program)),
            variant: "flash".into(),
            // The three gradients add each key tile's share of dq atomically.
            deterministic: op.part != AttentionPart::Gradients,
        }])
    }

    /// Checks a launch of a backward piece against its buffers (`[q, k, lse]` for the
    /// log-sum-exps, `[q, k, v, dO, lse, delta, out]` for a gradient, `[q, k, v, dO, lse,
    /// delta, dq, dk, dv]` for the three) and queues it.
    pub(crate) fn enqueue_attention_backward(
        &self,
        program: &AttentionBackwardProgram,
        buffers: &[BufferId],
        dims: &Bindings,
        timed: bool,
    ) -> Result<Option<Timing>, BackendError> {
        let dev = &program.device;
        let name = &program.name;
        let op = &program.op;
        let invalid = |why: String| BackendError::InvalidArgument(format!("cuda {name}: {why}"));
        let names = match op.part {
            AttentionPart::LogSumExp => ["q", "k", "lse"].as_slice(),
            AttentionPart::Gradients => {
                ["q", "k", "v", "dO", "lse", "delta", "dq", "dk", "dv"].as_slice()
            }
            _ => ["q", "k", "v", "dO", "lse", "delta", "out"].as_slice(),
        };
        let sizes = op
            .forward
            .sizes(dims)
            .map_err(|e| invalid(format!("cannot evaluate its sizes: {e}")))?;
        let element = op.forward.dtype.size_bytes();
        let [q, k, v, _] = sizes.min_elements().map(|n| n.saturating_mul(element));
        let stats = sizes.batch.saturating_mul(sizes.l).saturating_mul(4);
        let d_out = sizes
            .batch
            .saturating_mul(sizes.l)
            .saturating_mul(sizes.ev)
            .saturating_mul(element);
        let results = op.out_elements(&sizes).into_iter().map(|n| {
            n.saturating_mul(match op.part {
                AttentionPart::LogSumExp => 4,
                _ => element,
            })
        });
        let needs: Vec<usize> = if op.part == AttentionPart::LogSumExp {
            vec![q, k]
        } else {
            vec![q, k, v, d_out, stats, stats]
        }
        .into_iter()
        .chain(results)
        .collect();
        let results = op.out_elements(&sizes).len();
        let bound = self.attention_buffers(dev, name, buffers, names, &needs, results, &sizes)?;
        if sizes.batch == 0 || sizes.l == 0 || sizes.s == 0 {
            // Nothing to compute, or (no keys) gradients of zero the composition gives.
            return if sizes.s == 0 && op.part != AttentionPart::LogSumExp {
                Err(BackendError::Unsupported {
                    backend: "cuda",
                    what: format!("{name}: an attention over no keys"),
                })
            } else {
                Ok(None)
            };
        }
        let unsupported = |why: String| BackendError::Unsupported {
            backend: "cuda",
            what: format!("{name}: {why}"),
        };
        let chunk = 16 / element;
        if sizes.batch_strides.iter().any(|st| st % chunk != 0) {
            return Err(unsupported(format!(
                "batch strides {:?} are not multiples of {chunk} elements (16 bytes)",
                sizes.batch_strides
            )));
        }
        let rows = match op.part {
            AttentionPart::LogSumExp | AttentionPart::Query | AttentionPart::OutputAndLogSumExp => {
                sizes.l
            }
            AttentionPart::Key | AttentionPart::Value | AttentionPart::Gradients => sizes.s,
        };
        let int = |v: usize| i32::try_from(v).ok();
        let blocks = sizes
            .batch
            .checked_mul(rows.div_ceil(rows_per_block(op)))
            .filter(|&b| i32::try_from(b).is_ok());
        let (Some(l), Some(keys), Some(group), Some(blocks)) =
            (int(sizes.l), int(sizes.s), int(sizes.kv_group), blocks)
        else {
            return Err(unsupported(format!(
                "sizes {sizes:?} are past the fused kernel's 32-bit lengths"
            )));
        };
        // The kernels' pointer parameters: `[q, k, v, dO, lse, delta, out…]`.
        let pointers: Vec<Option<usize>> = match op.part {
            AttentionPart::LogSumExp => vec![Some(0), Some(1), None, None, None, None, Some(2)],
            _ => (0..buffers.len()).map(Some).collect(),
        };
        let mut slots: Vec<ArgSlot> = pointers
            .iter()
            .map(|j| ArgSlot(j.map_or(0, |j| bound[j].ptr).to_ne_bytes()))
            .collect();
        let mut word = |bytes: &[u8]| {
            let mut slot = ArgSlot::default();
            slot.0[..bytes.len()].copy_from_slice(bytes);
            slots.push(slot);
        };
        let scale = op.forward.scale.to_f64();
        word(&l.to_ne_bytes());
        word(&keys.to_ne_bytes());
        word(&((scale * std::f64::consts::LOG2_E) as f32).to_ne_bytes());
        word(&(scale as f32).to_ne_bytes());
        for stride in sizes.batch_strides {
            word(&(stride as i64).to_ne_bytes());
        }
        word(&group.to_ne_bytes());
        let shared = shared_bytes(op, sizes.e);
        let shape = [[blocks as u32, 1, 1], [threads(op) as u32, 1, 1]];
        // `dq` is summed atomically across key tiles: zero it first, in stream order.
        let zeroed = (op.part == AttentionPart::Gradients).then(|| (bound[6].ptr, needs[6]));
        self.queue_fused(
            dev,
            &program.module,
            name,
            shape,
            shared,
            slots,
            zeroed,
            timed,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{shared_bytes, source, supports};
    use tessel_ir::{AttentionBackward, AttentionMask, AttentionPart};
    use tessel_shape::{DType, Dim};

    fn op(dtype: DType, e: i64, part: AttentionPart) -> AttentionBackward {
        let l = Dim::constant(100);
        AttentionBackward {
            key_rows: false,
            forward: tessel_ir::Attention {
                dtype,
                batch: 6.into(),
                l,
                s: l,
                e: e.into(),
                ev: e.into(),
                q_batch_stride: l * Dim::constant(e),
                k_batch_stride: l * Dim::constant(e),
                v_batch_stride: l * Dim::constant(e),
                kv_group: 1.into(),
                scale: tessel_shape::Scalar::F32(0.125),
                causal: true,
                mask: None,
                dropout: None,
                layout: None,
            },
            part,
        }
    }

    #[test]
    fn heads_up_to_64_without_masks_are_fused() {
        let sm90 = (9, 0);
        assert_eq!(
            supports(&op(DType::BF16, 64, AttentionPart::Key), sm90),
            None
        );
        assert_eq!(
            supports(&op(DType::F16, 16, AttentionPart::Query), sm90),
            None
        );
        // f32 computes the three gradients together, half dtypes one at a time.
        assert!(supports(&op(DType::F32, 64, AttentionPart::Key), sm90).is_some());
        assert_eq!(
            supports(&op(DType::F32, 64, AttentionPart::Gradients), sm90),
            None
        );
        assert_eq!(
            supports(&op(DType::F32, 36, AttentionPart::LogSumExp), sm90),
            None
        );
        assert!(supports(&op(DType::F32, 36, AttentionPart::Gradients), sm90).is_some());
        assert!(supports(&op(DType::BF16, 64, AttentionPart::Gradients), sm90).is_some());
        assert!(supports(&op(DType::BF16, 128, AttentionPart::Key), sm90).is_some());
        assert!(supports(&op(DType::BF16, 64, AttentionPart::Key), (7, 5)).is_some());
        let mut masked = op(DType::BF16, 64, AttentionPart::Value);
        masked.forward.mask = Some(AttentionMask {
            dtype: DType::F32,
            heads: 1.into(),
            strides: [0, 0, 100, 1].map(Dim::from),
        });
        assert!(supports(&masked, sm90).is_some());
    }

    #[test]
    fn the_source_names_its_part_and_fits_default_shared_memory() {
        let text = source(&op(DType::BF16, 64, AttentionPart::Key), 64);
        for line in [
            "#define FAB_PART 2",
            "#define FA_F16 0",
            "#define FA_CAUSAL 1",
        ] {
            assert!(text.contains(line), "{line}");
        }
        assert!(text.contains("tessel_attention_backward"));
        let key = op(DType::BF16, 64, AttentionPart::Key);
        assert!(shared_bytes(&key, 64) <= 48 << 10);
        let grads = op(DType::F32, 64, AttentionPart::Gradients);
        let text = source(&grads, 64);
        for line in [
            "#define FAB_PART 4",
            "#define FA_HALF 0",
            "#define FA_THREADS 128",
        ] {
            assert!(text.contains(line), "{line}");
        }
        // Two blocks of the f32 gradients fit an SM of compute capability 8.0 or later.
        assert!(2 * shared_bytes(&grads, 64) <= 163 << 10);
    }
}
