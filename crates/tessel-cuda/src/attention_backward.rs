//! Fused attention backward (flash attention 2): the pieces of an [`AttentionBackward`] as
//! CUDA C of our own, `attention_backward.cu` after `attention.cu` (whose copies and
//! `mma.sync` helpers it uses), configured per program by macros. Half operands (`f16`,
//! `bf16`) on tensor cores with `f32` sums; the probabilities recomputed from the scores and
//! each query's log-sum-exp, so no `[l, s]` matrix is stored.
//!
//! - the log-sum-exps and `dq`: a block per tile of 64 queries, walking the key tiles;
//! - `dk` and `dv`: a block per tile of 64 keys, walking the query tiles that see it
//!   (causal: from the tile's first key on).
//!
//! It runs what the forward kernel ([`crate::attention`]) runs in half precision, without
//! a mask or dropout and with head dims up to 64 (the accumulators of `dk`/`dv` stay in
//! registers); anything else is left to the portable kernels and the composition
//! ([`supports`] says why not).

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

/// Rows (queries or keys) per block.
const BLOCK_ROWS: usize = 64;

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
    if !matches!(fwd.dtype, DType::F16 | DType::BF16) {
        return Some(format!(
            "the fused backward runs f16 and bf16, not {}",
            fwd.dtype
        ));
    }
    if fwd.mask.is_some() {
        return Some("the fused backward reads no mask".into());
    }
    if fwd.layout.is_some() {
        return Some("the fused backward reads contiguous operands, not rows in place".into());
    }
    match fwd.e.as_const() {
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
        AttentionPart::LogSumExp => 0,
        AttentionPart::Query => 1,
        AttentionPart::Key => 2,
        AttentionPart::Value => 3,
    };
    format!(
        "// {op}\n#define FA_D {head_dim}\n#define FA_HALF 1\n#define FA_F16 {}\n#define FA_CAUSAL {}\n#define FA_MASK 0\n#define FAB_PART {part}\n{}\n{TEMPLATE}",
        u8::from(fwd.dtype == DType::F16),
        u8::from(fwd.causal),
        crate::attention::TEMPLATE,
    )
}

/// Dynamic shared memory: tiles of `q`, `k`, `v` and `dO` (rows padded as the kernels lay
/// them out), then the query tile's statistics.
fn shared_bytes(head_dim: usize) -> u32 {
    (4 * BLOCK_ROWS * (head_dim + 8) * 2 + 2 * BLOCK_ROWS * 4) as u32
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
        let shared = shared_bytes(head_dim as usize);
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
        }])
    }

    /// Checks a launch of a backward piece against its buffers (`[q, k, lse]` for the
    /// log-sum-exps, `[q, k, v, dO, lse, delta, out]` for a gradient) and queues it.
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
        let names = if op.part == AttentionPart::LogSumExp {
            ["q", "k", "lse"].as_slice()
        } else {
            ["q", "k", "v", "dO", "lse", "delta", "out"].as_slice()
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
        let result = op.out_elements(&sizes).saturating_mul(match op.part {
            AttentionPart::LogSumExp => 4,
            _ => element,
        });
        let needs: Vec<usize> = if op.part == AttentionPart::LogSumExp {
            vec![q, k, result]
        } else {
            vec![q, k, v, d_out, stats, stats, result]
        };
        let bound = self.attention_buffers(dev, name, buffers, names, &needs, &sizes)?;
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
            AttentionPart::LogSumExp | AttentionPart::Query => sizes.l,
            AttentionPart::Key | AttentionPart::Value => sizes.s,
        };
        let int = |v: usize| i32::try_from(v).ok();
        let blocks = sizes
            .batch
            .checked_mul(rows.div_ceil(BLOCK_ROWS))
            .filter(|&b| i32::try_from(b).is_ok());
        let (Some(l), Some(keys), Some(group), Some(blocks)) =
            (int(sizes.l), int(sizes.s), int(sizes.kv_group), blocks)
        else {
            return Err(unsupported(format!(
                "sizes {sizes:?} are past the fused kernel's 32-bit lengths"
            )));
        };
        let pointer = |j: Option<usize>| ArgSlot(j.map_or(0, |j| bound[j].ptr).to_ne_bytes());
        let slots_of = |indices: [Option<usize>; 7]| indices.map(pointer).to_vec();
        let mut slots = if op.part == AttentionPart::LogSumExp {
            slots_of([Some(0), Some(1), None, None, None, None, Some(2)])
        } else {
            slots_of([
                Some(0),
                Some(1),
                Some(2),
                Some(3),
                Some(4),
                Some(5),
                Some(6),
            ])
        };
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
        let shared = shared_bytes(sizes.e);
        let shape = [[blocks as u32, 1, 1], [128, 1, 1]];
        self.queue_fused(dev, &program.module, name, shape, shared, slots, timed)
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
    fn half_heads_up_to_64_without_masks_are_fused() {
        let sm90 = (9, 0);
        assert_eq!(
            supports(&op(DType::BF16, 64, AttentionPart::Key), sm90),
            None
        );
        assert_eq!(
            supports(&op(DType::F16, 16, AttentionPart::Query), sm90),
            None
        );
        assert!(supports(&op(DType::F32, 64, AttentionPart::Key), sm90).is_some());
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
        assert!(shared_bytes(64) <= 48 << 10);
    }
}
