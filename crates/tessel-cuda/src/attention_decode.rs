//! Fused attention for a few query rows against many keys (decoding with a KV cache, as
//! flash decoding does it): `attention_decode.cu` after `attention.cu`'s helpers. The
//! forward kernel gives each pair's query tile one block, so one query row against a long
//! cache keeps a handful of multiprocessors busy; here each (query row, range of keys) is a
//! block of its own, the ranges write partial softmaxes to scratch memory, and a second
//! kernel joins them.
//!
//! Every fused attention program ([`crate::attention`]) whose op may have that few query
//! rows carries these two kernels and launches them instead of its own whenever a call's
//! sizes ask for it ([`ranges`]). The lengths are launch arguments (one program serves a
//! whole decode loop), so the choice is made per call from the sizes, not once per
//! measured program.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tessel_ir::{Attention, AttentionSizes, BackendError};

use crate::attention::{self, Launch};
use crate::device::CudaDevice;
use crate::ffi::{ArgSlot, Module};
use crate::{CudaBackend, Timing, lock, queue_timed};

/// The kernel text, after `attention.cu`'s helpers and the macros [`source`] writes.
const TEMPLATE: &str = include_str!("attention_decode.cu");

/// Both kernels' entry point (the part is a macro).
const ENTRY: &str = "tessel_attention_decode";

/// `FD_THREADS`: threads per block of both kernels.
const THREADS: u32 = 128;

/// The most query rows per pair the split kernel takes; longer queries fill the device as
/// tiles of the forward kernel.
const MAX_QUERIES: usize = 4;

/// The fewest keys a range gets: a shorter one costs more to join than it saves.
const MIN_RANGE_KEYS: usize = 128;

/// Blocks per multiprocessor the ranges aim for (enough loads in flight to hide memory
/// latency).
const BLOCKS_PER_UNIT: usize = 4;

/// The most ranges of one row.
const MAX_RANGES: usize = 256;

/// The split kernel and the kernel joining its ranges, of one attention configuration.
pub(crate) struct Decode {
    split: Arc<Module>,
    join: Arc<Module>,
}

/// Whether the split kernel can run `op` (already [`attention::supports`]ed) with head dim
/// `head_dim` and `op` may have few enough query rows for it: a key row must be a
/// power-of-two number of 16-byte chunks, at most a warp's lanes.
fn applies(op: &Attention, head_dim: i64) -> bool {
    let lanes = head_dim * op.dtype.size_bytes() as i64 / 16;
    lanes > 0 && 32 % lanes == 0 && op.l.bounds().lo <= MAX_QUERIES as i64
}

/// The CUDA C of part `part` (0 the split kernel, 1 the join) for `op`.
fn source(op: &Attention, head_dim: i64, part: u8) -> String {
    format!(
        "{}#define FA_HELPERS_ONLY\n{}\n#define FD_PART {part}\n{TEMPLATE}",
        attention::macros(op, head_dim, attention::Kernel::plain(op.dtype)),
        attention::TEMPLATE,
    )
}

/// How many ranges a call at sizes `s` splits each row's keys into on a device of `units`
/// multiprocessors, or `None` when the forward kernel serves it (more than
/// [`MAX_QUERIES`] query rows).
pub(crate) fn ranges(s: &AttentionSizes, units: usize) -> Option<usize> {
    if s.l > MAX_QUERIES {
        return None;
    }
    let rows = (s.batch * s.l).max(1);
    let wanted = (BLOCKS_PER_UNIT * units.max(1)).div_ceil(rows);
    Some(
        wanted
            .min(s.s.div_ceil(MIN_RANGE_KEYS))
            .clamp(1, MAX_RANGES),
    )
}

impl CudaBackend {
    /// The split-key kernels for `op` where they apply, or `None` (also, with a warning,
    /// when they fail to compile: the forward kernel then serves every call).
    pub(crate) fn decode_kernels(
        &self,
        dev: &CudaDevice,
        op: &Attention,
        head_dim: i64,
    ) -> Option<Arc<Decode>> {
        if !applies(op, head_dim) {
            return None;
        }
        let build = |part: u8| {
            let name = format!("{op} [split keys, part {part}]");
            self.module(dev, &name, ENTRY, &source(op, head_dim, part))
                .map(|(module, _)| module)
        };
        match build(0).and_then(|split| Ok((split, build(1)?))) {
            Ok((split, join)) => Some(Arc::new(Decode { split, join })),
            Err(e) => {
                tracing::warn!("tessel-cuda: no split-key kernels for {op}: {e}");
                None
            }
        }
    }

    /// Queues `op`'s attention at sizes `s` as `ranges` ranges of keys per query row (one
    /// when there is no scratch memory for more) and their join. `slots` hold the forward
    /// kernel's arguments, `out` the output's pointer, `launch` the forward's launch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn queue_decode(
        &self,
        dev: &Arc<CudaDevice>,
        decode: &Decode,
        name: &str,
        s: &AttentionSizes,
        launch: &Launch,
        out: ArgSlot,
        mut slots: Vec<ArgSlot>,
        ranges: usize,
        timed: bool,
    ) -> Result<Option<Timing>, BackendError> {
        let rows = s.batch * s.l;
        let (Ok(rows_i32), Ok(l)) = (i32::try_from(rows), i32::try_from(s.l)) else {
            return Err(BackendError::Unsupported {
                backend: "cuda",
                what: format!("{name}: {rows} query rows are past the kernel's 32-bit grid"),
            });
        };
        // Per range: a record of 4 floats and the unnormalized output row.
        let record_bytes = (4 + s.e) * 4;
        let scratch = (ranges > 1)
            .then(|| {
                let bytes = rows.checked_mul(ranges)?.checked_mul(record_bytes)?;
                lock(&dev.pool).alloc(&dev.ctx, &dev.stream, bytes).ok()
            })
            .flatten();
        let split_keys =
            s.s.div_ceil(if scratch.is_some() { ranges } else { 1 })
                .max(1);
        // Ranges of `split_keys` (as few as cover the keys: none is left empty).
        let ranges = s.s.div_ceil(split_keys).max(1);
        let partial = scratch.map_or(0, |(ptr, _)| ptr);
        let word = |bytes: &[u8]| {
            let mut slot = ArgSlot::default();
            slot.0[..bytes.len()].copy_from_slice(bytes);
            slot
        };
        slots.push(word(&(split_keys as i32).to_ne_bytes()));
        slots.push(word(&partial.to_ne_bytes()));
        let [o_outer, o_head, o_row] = launch.strides[3];
        let mut join_slots = vec![
            word(&partial.to_ne_bytes()),
            out,
            word(&l.to_ne_bytes()),
            word(&rows_i32.to_ne_bytes()),
            word(&(ranges as i32).to_ne_bytes()),
            word(&o_outer.to_ne_bytes()),
            word(&o_head.to_ne_bytes()),
            word(&o_row.to_ne_bytes()),
            word(&launch.heads.to_ne_bytes()),
        ];
        let block = [THREADS, 1, 1];
        let join_blocks = (rows * s.e).div_ceil(THREADS as usize) as u32;
        let queued = queue_timed(dev, name, timed, || {
            let failed = |e| BackendError::Launch {
                kernel: name.to_string(),
                reason: format!("cuLaunchKernel failed: {e}"),
            };
            let grid = [rows as u32, ranges as u32, 1];
            decode
                .split
                .launch(&dev.ctx, &dev.stream, [grid, block], 0, &mut slots)
                .map_err(failed)?;
            let mut launches = 1;
            if ranges > 1 {
                decode
                    .join
                    .launch(
                        &dev.ctx,
                        &dev.stream,
                        [[join_blocks, 1, 1], block],
                        0,
                        &mut join_slots,
                    )
                    .map_err(failed)?;
                launches += 1;
            }
            self.counters
                .vendor_launches
                .fetch_add(launches, Ordering::Relaxed);
            Ok(())
        });
        if let Some((ptr, class)) = scratch {
            dev.release_scratch(ptr, class);
        }
        queued
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_RANGES, ranges};
    use tessel_ir::{AttentionSizes, RowLayout};

    fn sizes(batch: usize, l: usize, s: usize) -> AttentionSizes {
        AttentionSizes {
            batch,
            l,
            s,
            e: 64,
            ev: 64,
            batch_strides: [l * 64, s * 64, s * 64],
            kv_group: 1,
            rows: RowLayout {
                heads: 1,
                strides: [
                    [0, l * 64, l * 64, 64],
                    [0, s * 64, s * 64, 64],
                    [0, s * 64, s * 64, 64],
                    [0, l * 64, l * 64, 64],
                ],
            },
            mask: None,
        }
    }

    #[test]
    fn few_query_rows_split_their_keys_to_fill_the_device() {
        // GPT-2's twelve heads, one new token against 4096 cached keys, on 132 SMs:
        // 44 ranges of 94 keys (at least 128 keys a range caps it at 32).
        assert_eq!(ranges(&sizes(12, 1, 4096), 132), Some(32));
        assert_eq!(ranges(&sizes(12, 1, 100_000), 132), Some(44));
        // Short caches keep one range; many rows need none.
        assert_eq!(ranges(&sizes(12, 1, 100), 132), Some(1));
        assert_eq!(ranges(&sizes(4096, 1, 4096), 132), Some(1));
        assert_eq!(ranges(&sizes(1, 1, 1 << 30), 132), Some(MAX_RANGES));
        // Prefill is the forward kernel's.
        assert_eq!(ranges(&sizes(12, 5, 4096), 132), None);
        assert_eq!(ranges(&sizes(12, 512, 512), 132), None);
    }
}
