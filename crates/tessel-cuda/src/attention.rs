//! Fused attention (flash attention forward): an [`Attention`] as CUDA C of our own,
//! `attention.cu`, configured per program by the macros written here (head dim, dtype,
//! causal). In `f16`/`bf16` the two products run on tensor cores (`mma.sync.m16n8k16`,
//! `f32` sums, the probabilities rounded to the operand dtype as flash attention does); in
//! `f32` on the CUDA cores, one query row per thread. Where registers allow, more programs
//! are offered and measured against the first: half, two 16-row query tiles per warp; f32,
//! two threads sharing two rows (each split along the head dim), and both products on
//! tensor cores as three TF32 products each (3xTF32: every f32 operand split into two TF32
//! parts, near-f32 sums; PyTorch's f32 attention kernels compute the same way). The
//! sequence lengths and strides are kernel arguments, so one compiled program serves every
//! length of its configuration.
//!
//! It runs an attention whose `q`/`k` and `v` vectors have one length, a constant small
//! enough for registers, with every row starting 16 bytes aligned; anything else is left
//! to the composition of kernels and library products ([`supports`] says why not).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tessel_ir::handles;
use tessel_ir::{
    Attention, AttentionBackward, AttentionPart, AttentionSizes, BackendError, BufferId,
    ProgramOrigin, VendorProgram,
};
use tessel_shape::{Bindings, DType};

use crate::attention_decode::{self, Decode};
use crate::device::CudaDevice;
use crate::ffi::{ArgSlot, Module};
use crate::{CudaBackend, DeviceBuffer, Program, Timing, queue_timed};

/// The kernel text, configured by the macros [`source`] prepends.
pub(crate) const TEMPLATE: &str = include_str!("attention.cu");

/// The kernel's entry point.
const ENTRY: &str = "tessel_attention";

/// Query rows per block of the f32 kernels, and per warp tile of the half ones.
const BLOCK_ROWS: usize = 64;

/// The largest head dim whose half kernel keeps two 16-row query tiles per warp in
/// registers (`FA_WM 2`): at 128 its accumulators alone would take 256 registers a thread.
const WIDE_MAX_HEAD_DIM: i64 = 64;

/// Which of `attention.cu`'s forward kernels a program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// f16/bf16 on tensor cores, this many 16-row query tiles per warp (`FA_WM`).
    Half(usize),
    /// f32 on the CUDA cores, this many query rows per thread (`FA_WM`).
    Cores(usize),
    /// f32 on tensor cores, each product as three TF32 products (`FA_TF32`).
    Tf32,
}

impl Kernel {
    /// The plain kernel of `dtype`: one query tile per warp, or one row per thread.
    pub(crate) fn plain(dtype: DType) -> Kernel {
        match dtype {
            DType::F32 => Kernel::Cores(1),
            _ => Kernel::Half(1),
        }
    }

    /// `FA_WM`.
    fn wm(self) -> usize {
        match self {
            Kernel::Half(wm) | Kernel::Cores(wm) => wm,
            Kernel::Tf32 => 1,
        }
    }

    /// Query rows per block.
    fn block_rows(self) -> usize {
        match self {
            Kernel::Half(wm) => BLOCK_ROWS * wm,
            Kernel::Cores(_) | Kernel::Tf32 => BLOCK_ROWS,
        }
    }

    /// Threads per block and dynamic shared memory: the query tile (half only) and two
    /// stages of key and value tiles, rows padded as `attention.cu` lays them out.
    fn block(self, head_dim: usize) -> (u32, u32) {
        match self {
            Kernel::Cores(_) => (64, (2 * 2 * 32 * head_dim * 4) as u32),
            Kernel::Tf32 => (128, (2 * 2 * 64 * (head_dim + 4) * 4) as u32),
            Kernel::Half(_) => (
                128,
                ((self.block_rows() + 2 * 2 * 64) * (head_dim + 8) * 2) as u32,
            ),
        }
    }

    /// The program's variant: what measurement reports it as.
    fn variant(self) -> String {
        match self {
            Kernel::Half(1) | Kernel::Cores(1) => "flash".into(),
            Kernel::Half(_) => format!("flash {} rows", self.block_rows()),
            Kernel::Cores(_) => "flash 2 rows/thread".into(),
            Kernel::Tf32 => "flash 3xtf32".into(),
        }
    }
}

/// A compiled attention kernel.
pub(crate) struct AttentionProgram {
    op: Attention,
    device: Arc<CudaDevice>,
    module: Arc<Module>,
    origin: ProgramOrigin,
    /// The kernel it runs.
    kernel: Kernel,
    /// `op` as text: the program's name in errors.
    name: String,
    /// The split-key kernels for launches with few query rows, where `op` may have them.
    decode: Option<Arc<Decode>>,
    /// Whether it writes each query's log-sum-exp after the output
    /// ([`AttentionPart::OutputAndLogSumExp`]).
    saves_lse: bool,
}

impl AttentionProgram {
    pub(crate) fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    pub(crate) fn origin(&self) -> ProgramOrigin {
        self.origin
    }
}

/// Why the kernel cannot run `op` on a device of compute capability `capability`, or
/// `None` when it can.
pub(crate) fn supports(op: &Attention, capability: (i32, i32)) -> Option<String> {
    if capability.0 < 8 {
        return Some(format!(
            "cp.async and bf16/f16 mma.sync need compute capability 8.0 (this device has {}.{})",
            capability.0, capability.1
        ));
    }
    let (Some(e), Some(ev)) = (op.e.as_const(), op.ev.as_const()) else {
        return Some("its head dims are not constants".into());
    };
    if e != ev {
        return Some(format!(
            "q/k vectors of {e} and v vectors of {ev} elements differ"
        ));
    }
    let fits = match op.dtype {
        DType::F16 | DType::BF16 => e % 16 == 0 && (16..=128).contains(&e),
        DType::F32 => e % 4 == 0 && (4..=64).contains(&e),
        other => return Some(format!("it computes f32, f16 and bf16, not {other}")),
    };
    if !fits {
        return Some(format!(
            "a head dim of {e} is not one it has registers for (f16/bf16: a multiple of 16 up to 128; f32: of 4 up to 64)"
        ));
    }
    if let Some(m) = &op.mask
        && !matches!(m.dtype, DType::F32 | DType::F16 | DType::BF16)
    {
        return Some(format!("it reads f32, f16 and bf16 masks, not {}", m.dtype));
    }
    if op.dropout.is_some() {
        return Some("it has no dropout".into());
    }
    let scale = op.scale.to_f64();
    if !scale.is_finite() {
        return Some(format!("the scale {scale} is not finite"));
    }
    None
}

/// The CUDA C of `op` run by `kernel`: `attention.cu` after its configuration (and, for
/// 3xTF32, the TF32 helpers).
fn source(op: &Attention, head_dim: i64, kernel: Kernel) -> String {
    let helpers = crate::tf32_helpers(kernel == Kernel::Tf32);
    format!("{}{helpers}{TEMPLATE}", macros(op, head_dim, kernel))
}

/// The configuration of `attention.cu` (and of the kernels built on its helpers) for `op`
/// run by `kernel`: one `#define` a line, after a comment naming `op`.
pub(crate) fn macros(op: &Attention, head_dim: i64, kernel: Kernel) -> String {
    let flag = |b: bool| u8::from(b);
    let half = op.dtype != DType::F32;
    // Half: the hardware's 2^x, and (no mask, a positive scale) the scale folded into the
    // exponent's fma, as flash attention computes it.
    let fold = half && op.mask.is_none() && op.scale.to_f64() > 0.0;
    format!(
        "// {op}\n#define FA_D {head_dim}\n#define FA_HALF {}\n#define FA_TF32 {}\n#define FA_F16 {}\n#define FA_CAUSAL {}\n#define FA_MASK {}\n#define FA_WM {}\n#define FA_FAST_EXP {}\n#define FA_FOLD {}\n",
        flag(half),
        flag(kernel == Kernel::Tf32),
        flag(op.dtype == DType::F16),
        flag(op.causal),
        match op.mask.as_ref().map(|m| m.dtype) {
            None => 0,
            Some(DType::BF16) => 2,
            Some(DType::F16) => 3,
            Some(_) => 1,
        },
        kernel.wm(),
        flag(half),
        flag(fold),
    )
}

impl CudaBackend {
    /// The programs for `op` on `device` ([`Backend::vendor`](tessel_ir::Backend::vendor)):
    /// the fused kernel where [`supports`] allows it, else none.
    pub(crate) fn attention_programs(
        &self,
        device: usize,
        op: &Attention,
    ) -> Result<Vec<VendorProgram>, BackendError> {
        self.forward_programs(device, op, None)
    }

    /// The programs for `piece`, an [`AttentionPart::OutputAndLogSumExp`]: the forward's
    /// programs writing the log-sum-exps too, for attentions the backward's kernels take
    /// (no mask or dropout).
    pub(crate) fn output_and_lse_programs(
        &self,
        device: usize,
        piece: &AttentionBackward,
    ) -> Result<Vec<VendorProgram>, BackendError> {
        debug_assert_eq!(piece.part, AttentionPart::OutputAndLogSumExp);
        if piece.forward.mask.is_some() || piece.forward.dropout.is_some() {
            tracing::trace!(
                "tessel-cuda: no fused kernel for {piece}: the backward's kernels take no mask or dropout"
            );
            return Ok(Vec::new());
        }
        self.forward_programs(device, &piece.forward, Some(piece))
    }

    /// The forward programs of `op`, writing the log-sum-exps too for `piece`.
    fn forward_programs(
        &self,
        device: usize,
        op: &Attention,
        piece: Option<&AttentionBackward>,
    ) -> Result<Vec<VendorProgram>, BackendError> {
        let dev = self.device(device)?;
        if let Some(why) = supports(op, dev.capability) {
            tracing::trace!("tessel-cuda: no fused kernel for {op}: {why}");
            return Ok(Vec::new());
        }
        let what = piece.map_or_else(|| op.to_string(), ToString::to_string);
        let head_dim = op.e.as_const().unwrap_or(0);
        // Besides the plain kernel, where the registers allow: half, two query tiles per
        // warp; f32, two threads sharing two rows (each k and v element read from shared
        // memory feeding two rows in both), and the 3xTF32 kernel (8-wide slices of the
        // head dim). Every program is measured.
        let kernels: &[Kernel] = match op.dtype {
            DType::F32 if head_dim % 8 == 0 => &[Kernel::Cores(1), Kernel::Cores(2), Kernel::Tf32],
            DType::F32 => &[Kernel::Cores(1)],
            _ if head_dim <= WIDE_MAX_HEAD_DIM => &[Kernel::Half(1), Kernel::Half(2)],
            _ => &[Kernel::Half(1)],
        };
        // The split-key kernels write no log-sum-exps.
        let decode = match piece {
            None => self.decode_kernels(dev, op, head_dim),
            Some(_) => None,
        };
        let mut programs = Vec::with_capacity(kernels.len());
        for &kernel in kernels {
            let variant = kernel.variant();
            let name = if kernel == Kernel::plain(op.dtype) {
                what.clone()
            } else {
                format!("{what} [{variant}]")
            };
            let compiled = self
                .module(dev, &name, ENTRY, &source(op, head_dim, kernel))
                .and_then(|(module, origin)| {
                    let (_, shared) = kernel.block(head_dim as usize);
                    module.allow_shared(shared).map_err(|e| BackendError::Compile {
                        kernel: name.clone(),
                        code: String::new(),
                        log: format!(
                            "{shared} bytes of shared memory are more than the device allows: {e}"
                        ),
                    })?;
                    Ok((module, origin))
                });
            // The plain kernel's failure is the op's; a variant's only drops the variant.
            let (module, origin) = match compiled {
                Ok(built) => built,
                Err(e) if !programs.is_empty() => {
                    tracing::warn!("tessel-cuda: dropping the {variant} program of {what}: {e}");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let program = AttentionProgram {
                op: op.clone(),
                device: Arc::clone(dev),
                module,
                origin,
                kernel,
                name,
                decode: decode.clone(),
                saves_lse: piece.is_some(),
            };
            programs.push(VendorProgram {
                program: self.programs.insert(Program::Attention(program)),
                variant,
                deterministic: true,
            });
        }
        Ok(programs)
    }

    /// The buffers bound to a fused attention launch of `name` (`names` says what each is,
    /// the last `results` being what it writes), checked: as many as `names`, all on `dev`,
    /// no result bound twice, each holding at least its `needs` bytes (what `sizes` ask).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_buffers(
        &self,
        dev: &CudaDevice,
        name: &str,
        buffers: &[BufferId],
        names: &[&str],
        needs: &[usize],
        results: usize,
        sizes: &dyn std::fmt::Debug,
    ) -> Result<Vec<Arc<DeviceBuffer>>, BackendError> {
        let invalid = |why: String| BackendError::InvalidArgument(format!("cuda {name}: {why}"));
        debug_assert_eq!(names.len(), needs.len());
        if buffers.len() != names.len() {
            return Err(invalid(format!(
                "takes {} buffers, [{}], but {} were bound",
                names.len(),
                names.join(", "),
                buffers.len()
            )));
        }
        let bound = self.buffers.get_all(buffers)?;
        handles::check_launch_devices(
            "cuda",
            name,
            dev.index,
            buffers,
            bound.iter().map(|b| b.device.index),
        )?;
        let first = names.len() - results;
        for (n, out) in buffers[first..].iter().enumerate() {
            if buffers[..first + n].contains(out) {
                return Err(invalid(format!(
                    "buffer {} is bound both as a result and as another buffer",
                    out.0
                )));
            }
        }
        for ((need, b), what) in needs.iter().zip(&bound).zip(names) {
            if *need > b.bytes {
                return Err(invalid(format!(
                    "the {what} buffer holds {} bytes, but sizes {sizes:?} need {need}",
                    b.bytes
                )));
            }
        }
        Ok(bound)
    }

    /// Checks an attention launch against its buffers and queues it.
    pub(crate) fn enqueue_attention(
        &self,
        program: &AttentionProgram,
        buffers: &[BufferId],
        dims: &Bindings,
        timed: bool,
    ) -> Result<Option<Timing>, BackendError> {
        let dev = &program.device;
        let name = &program.name;
        let invalid = |why: String| BackendError::InvalidArgument(format!("cuda {name}: {why}"));
        let names = match (program.op.mask.is_some(), program.saves_lse) {
            (true, _) => ["q", "k", "v", "mask", "out"].as_slice(),
            (false, false) => ["q", "k", "v", "out"].as_slice(),
            (false, true) => ["q", "k", "v", "out", "lse"].as_slice(),
        };
        let sizes = program
            .op
            .sizes(dims)
            .map_err(|e| invalid(format!("cannot evaluate its sizes: {e}")))?;
        let element = program.op.dtype.size_bytes();
        let [q, k, v, o] = sizes.min_elements().map(|n| n.saturating_mul(element));
        let mask_bytes = program
            .op
            .mask
            .as_ref()
            .map(|m| sizes.mask_elements().saturating_mul(m.dtype.size_bytes()));
        let lse_bytes = program
            .saves_lse
            .then(|| sizes.batch.saturating_mul(sizes.l).saturating_mul(4));
        let needs: Vec<usize> = [q, k, v]
            .into_iter()
            .chain(mask_bytes)
            .chain([o])
            .chain(lse_bytes)
            .collect();
        let results = 1 + usize::from(program.saves_lse);
        let bound = self.attention_buffers(dev, name, buffers, names, &needs, results, &sizes)?;
        let out_at = names.len() - results;
        let Some(launch) = launch(&program.op, &sizes, name, program.kernel)? else {
            return Ok(None);
        };
        let ranges = program
            .decode
            .as_ref()
            .and_then(|_| attention_decode::ranges(&sizes, dev.info.compute_units as usize));
        // Each operand's pointer at its first element (the layout's offset).
        let pointer = |(which, j): (usize, usize)| {
            let offset = (launch.offsets[which] * element) as u64;
            ArgSlot(bound[j].ptr.wrapping_add(offset).to_ne_bytes())
        };
        let mut slots: Vec<ArgSlot> = [(0, 0), (1, 1), (2, 2), (3, out_at)].map(pointer).to_vec();
        let mut word = |bytes: &[u8]| {
            let mut slot = ArgSlot::default();
            slot.0[..bytes.len()].copy_from_slice(bytes);
            slots.push(slot);
        };
        word(&launch.lengths[0].to_ne_bytes());
        word(&launch.lengths[1].to_ne_bytes());
        word(&launch.scale_log2.to_ne_bytes());
        for stride in launch.strides.as_flattened() {
            word(&stride.to_ne_bytes());
        }
        word(&launch.heads.to_ne_bytes());
        word(&launch.group.to_ne_bytes());
        // The mask: its pointer (0 without one), strides and heads.
        let (mask_heads, mask_strides) = sizes.mask.unwrap_or((1, [0; 4]));
        let mask_pointer = match program.op.mask {
            Some(_) => bound[3].ptr,
            None => 0,
        };
        word(&mask_pointer.to_ne_bytes());
        for stride in mask_strides {
            word(&(stride as i64).to_ne_bytes());
        }
        word(&i32::try_from(mask_heads).unwrap_or(i32::MAX).to_ne_bytes());
        if let (Some(decode), Some(ranges)) = (&program.decode, ranges) {
            let out = pointer((3, out_at));
            return self.queue_decode(
                dev, decode, name, &sizes, &launch, out, slots, ranges, timed,
            );
        }
        // The log-sum-exps' pointer (0: none).
        let lse_pointer = if program.saves_lse {
            bound[out_at + 1].ptr
        } else {
            0
        };
        word(&lse_pointer.to_ne_bytes());
        let shape = [launch.grid, launch.block];
        self.queue_fused(
            dev,
            &program.module,
            name,
            shape,
            launch.shared,
            slots,
            None,
            timed,
        )
    }

    /// Queues one fused attention kernel (`module`'s entry) with its argument `slots`,
    /// after zeroing `zeroed` (a device address and a byte count) where given, timed with
    /// events when `timed`, counting it as a vendor launch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn queue_fused(
        &self,
        dev: &Arc<CudaDevice>,
        module: &Module,
        name: &str,
        [grid, block]: [[u32; 3]; 2],
        shared: u32,
        mut slots: Vec<ArgSlot>,
        zeroed: Option<(u64, usize)>,
        timed: bool,
    ) -> Result<Option<Timing>, BackendError> {
        queue_timed(dev, name, timed, || {
            if let Some((ptr, bytes)) = zeroed {
                crate::ffi::fill(&dev.ctx, &dev.stream, ptr, 0, bytes)
                    .map_err(|e| dev.lost("cuMemsetD8Async", e))?;
            }
            module
                .launch(&dev.ctx, &dev.stream, [grid, block], shared, &mut slots)
                .map_err(|e| BackendError::Launch {
                    kernel: name.to_string(),
                    reason: format!("cuLaunchKernel failed: {e}"),
                })?;
            self.counters
                .vendor_launches
                .fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }
}

/// One launch's grid, block, shared memory and arguments.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Launch {
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    /// `l`, `s`.
    lengths: [i32; 2],
    /// `scale · log2(e)`.
    scale_log2: f32,
    /// The element offsets of `q`, `k`, `v` and the output (added to their pointers).
    offsets: [usize; 4],
    /// The outer, head and row strides of `q`, `k`, `v` and the output, in elements.
    pub(crate) strides: [[i64; 3]; 4],
    /// Pairs per outer index.
    pub(crate) heads: i32,
    /// Consecutive heads sharing one `k` and `v`.
    group: i32,
}

/// The launch of `op` at sizes `s` (checked against the buffers) by `kernel`, or `None`
/// when the output is empty. Sizes past the kernel's 32-bit lengths
/// and strides the 16-byte copies cannot read are [`BackendError::Unsupported`].
fn launch(
    op: &Attention,
    s: &AttentionSizes,
    name: &str,
    kernel: Kernel,
) -> Result<Option<Launch>, BackendError> {
    if s.batch == 0 || s.l == 0 || s.ev == 0 {
        return Ok(None);
    }
    let unsupported = |why: String| BackendError::Unsupported {
        backend: "cuda",
        what: format!("{name}: {why}"),
    };
    let chunk = 16 / op.dtype.size_bytes();
    if s.rows
        .strides
        .as_flattened()
        .iter()
        .any(|st| st % chunk != 0)
    {
        return Err(unsupported(format!(
            "row offsets and strides {:?} are not multiples of {chunk} elements (16 bytes)",
            s.rows.strides
        )));
    }
    let int = |v: usize| i32::try_from(v).ok();
    let blocks = s
        .batch
        .checked_mul(s.l.div_ceil(kernel.block_rows()))
        .filter(|&b| i32::try_from(b).is_ok());
    let (Some(l), Some(keys), Some(heads), Some(group), Some(blocks)) = (
        int(s.l),
        int(s.s),
        int(s.rows.heads),
        int(s.kv_group),
        blocks,
    ) else {
        return Err(unsupported(format!(
            "sizes {s:?} are past the fused kernel's 32-bit lengths"
        )));
    };
    let (threads, shared) = kernel.block(s.e);
    let offsets = s.rows.strides.map(|[offset, ..]| offset);
    let strides = s
        .rows
        .strides
        .map(|[_, outer, head, row]| [outer, head, row].map(|x| x as i64));
    Ok(Some(Launch {
        grid: [blocks as u32, 1, 1],
        block: [threads, 1, 1],
        shared,
        lengths: [l, keys],
        heads,
        group,
        scale_log2: (op.scale.to_f64() * std::f64::consts::LOG2_E) as f32,
        offsets,
        strides,
    }))
}

#[cfg(test)]
mod tests {
    use super::{Kernel, launch, source, supports};
    use tessel_ir::{Attention, AttentionSizes, RowLayout};
    use tessel_shape::{DType, Dim, Scalar, Var};

    fn op(dtype: DType, e: i64, ev: i64) -> Attention {
        let l = Dim::from(Var::new("l", 1, 4096).unwrap());
        Attention {
            dtype,
            batch: 6.into(),
            l,
            s: l,
            e: e.into(),
            ev: ev.into(),
            q_batch_stride: l * Dim::constant(e),
            k_batch_stride: l * Dim::constant(e),
            v_batch_stride: l * Dim::constant(ev),
            kv_group: 1.into(),
            scale: Scalar::F32(0.125),
            causal: true,
            mask: None,
            dropout: None,
            layout: None,
        }
    }

    #[test]
    fn head_dims_with_registers_and_aligned_rows_are_fused() {
        let sm90 = (9, 0);
        assert_eq!(supports(&op(DType::BF16, 64, 64), sm90), None);
        assert_eq!(supports(&op(DType::F16, 128, 128), sm90), None);
        assert_eq!(supports(&op(DType::F32, 64, 64), sm90), None);
        assert!(supports(&op(DType::BF16, 64, 64), (7, 5)).is_some());
        assert!(supports(&op(DType::BF16, 40, 40), sm90).is_some());
        assert!(supports(&op(DType::BF16, 256, 256), sm90).is_some());
        assert!(supports(&op(DType::F32, 128, 128), sm90).is_some());
        assert!(supports(&op(DType::BF16, 64, 32), sm90).is_some());
        assert!(supports(&op(DType::F64, 64, 64), sm90).is_some());
        let mut dynamic = op(DType::BF16, 64, 64);
        dynamic.e = Dim::from(Var::new("e", 1, 64).unwrap());
        assert!(supports(&dynamic, sm90).is_some());
    }

    #[test]
    fn the_source_is_configured_by_macros() {
        let text = source(&op(DType::F16, 64, 64), 64, Kernel::Half(2));
        for line in [
            "#define FA_D 64",
            "#define FA_WM 2",
            "#define FA_HALF 1",
            "#define FA_TF32 0",
            "#define FA_F16 1",
            "#define FA_CAUSAL 1",
            "#define FA_FAST_EXP 1",
            "#define FA_FOLD 1",
        ] {
            assert!(text.contains(line), "{line}");
        }
        // f32 keeps exp2f; a negative scale cannot be folded past the row maximum.
        let f32_text = source(&op(DType::F32, 64, 64), 64, Kernel::Cores(1));
        assert!(
            f32_text.contains("#define FA_FAST_EXP 0") && f32_text.contains("#define FA_FOLD 0")
        );
        let tf32_text = source(&op(DType::F32, 64, 64), 64, Kernel::Tf32);
        assert!(tf32_text.contains("#define FA_TF32 1") && tf32_text.contains("#define FA_WM 1"));
        // The shared TF32 helpers come with the 3xTF32 kernel only.
        assert!(tf32_text.contains(crate::TF32_HELPERS) && !f32_text.contains(crate::TF32_HELPERS));
        let mut negative = op(DType::BF16, 64, 64);
        negative.scale = Scalar::F32(-0.125);
        assert!(source(&negative, 64, Kernel::Half(1)).contains("#define FA_FOLD 0"));
    }

    #[test]
    fn a_launch_covers_every_query_tile_of_every_pair() {
        let sizes = AttentionSizes {
            batch: 96,
            l: 129,
            s: 129,
            e: 64,
            ev: 64,
            batch_strides: [129 * 64; 3],
            kv_group: 1,
            rows: RowLayout {
                heads: 1,
                strides: [[0, 129 * 64, 129 * 64, 64]; 4],
            },
            mask: None,
        };
        let l = launch(&op(DType::BF16, 64, 64), &sizes, "t", Kernel::Half(1))
            .unwrap()
            .unwrap();
        assert_eq!(l.grid, [96 * 3, 1, 1]);
        let wide = launch(&op(DType::BF16, 64, 64), &sizes, "t", Kernel::Half(2))
            .unwrap()
            .unwrap();
        assert_eq!(wide.grid, [96 * 2, 1, 1]);
        assert_eq!(wide.shared, ((128 + 4 * 64) * 72 * 2) as u32);
        assert_eq!((l.block[0], l.lengths), (128, [129, 129]));
        assert!((l.scale_log2 - 0.125 * std::f32::consts::LOG2_E).abs() < 1e-7);
        for kernel in [Kernel::Cores(1), Kernel::Cores(2)] {
            let f32_launch = launch(&op(DType::F32, 64, 64), &sizes, "t", kernel)
                .unwrap()
                .unwrap();
            assert_eq!((f32_launch.grid, f32_launch.block[0]), ([96 * 3, 1, 1], 64));
        }
        let tf32 = launch(&op(DType::F32, 64, 64), &sizes, "t", Kernel::Tf32)
            .unwrap()
            .unwrap();
        assert_eq!((tf32.grid, tf32.block[0]), ([96 * 3, 1, 1], 128));
        assert_eq!(tf32.shared, (4 * 64 * 68 * 4) as u32);
        let empty = AttentionSizes { l: 0, ..sizes };
        assert_eq!(
            launch(&op(DType::BF16, 64, 64), &empty, "t", Kernel::Half(1)).unwrap(),
            None
        );
        let mut odd = sizes;
        odd.rows.strides[1][3] = 64 + 4;
        assert!(launch(&op(DType::BF16, 64, 64), &odd, "t", Kernel::Half(1)).is_err());
    }
}
