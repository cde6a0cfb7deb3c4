//! Comparing a candidate's output with the reference: on the device for large float
//! buffers, else on the host (in parallel over the elements).

use std::sync::Arc;

use rustc_hash::FxHashMap;
use tessel_ir::{Backend, ProgramId, compare};
use tessel_shape::{Bindings, DType, Dim};

use crate::error::{Error, Result};

/// Buffers from this size on are compared on their device
/// ([`Measurer::on_device_differences`]); smaller ones on the host, where reading them
/// costs less than a launch.
pub(super) const DEVICE_COMPARISON_MIN: usize = 8 << 20;

/// The [`compare::differences`] program of `dtype` on device `ordinal` of `backend`,
/// compiled once per process (`None` where the device refused it or would interpret it).
pub(super) fn difference_program(
    backend: &Arc<dyn Backend>,
    ordinal: usize,
    dtype: DType,
) -> Option<ProgramId> {
    type Programs = FxHashMap<(usize, usize, DType), Option<ProgramId>>;
    static PROGRAMS: std::sync::Mutex<Option<Programs>> = std::sync::Mutex::new(None);
    // Backends live as long as the process: the address names one.
    let key = (Arc::as_ptr(backend).cast::<u8>() as usize, ordinal, dtype);
    let lock = || {
        PROGRAMS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    if let Some(&known) = lock().as_ref().and_then(|m| m.get(&key)) {
        return known;
    }
    // Compiled outside the lock; a racing thread's duplicate is released.
    let compiled = compare::differences(dtype)
        .map_err(|e| e.to_string())
        .and_then(|kernel| backend.compile(ordinal, &kernel).map_err(|e| e.to_string()))
        .inspect_err(|e| tracing::debug!(target: "tessel::measure", "{}: no device comparison of {dtype}: {e}", backend.name()))
        .ok()
        // An interpreted comparison is slower than the host's.
        .filter(|&p| {
            let interpreted = matches!(backend.origin(p), Ok(tessel_ir::ProgramOrigin::Interpreted));
            if interpreted {
                let _ = backend.release(p);
            }
            !interpreted
        });
    let mut programs = lock();
    let programs = programs.get_or_insert_with(FxHashMap::default);
    if let Some(&known) = programs.get(&key) {
        if let Some(p) = compiled {
            let _ = backend.release(p);
        }
        return known;
    }
    programs.insert(key, compiled);
    compiled
}

pub(super) fn eval(numel: Dim, dims: &Bindings) -> Result<usize> {
    let n = numel.eval(dims).map_err(Error::from_eval)?;
    Ok(n.max(0) as usize)
}

pub(super) fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// `f` on contiguous ranges of `0..elements`, one per available core for large ranges,
/// at once, in range order: a first call compares outputs of hundreds of megabytes on the
/// host (a cross-entropy's gradient over a vocabulary), which one core does in seconds.
pub(super) fn in_parallel<R: Send>(
    elements: usize,
    f: impl Fn(std::ops::Range<usize>) -> R + Sync,
) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let threads = cores.min(elements.div_ceil(1 << 18)).max(1);
    if threads == 1 {
        return vec![f(0..elements)];
    }
    let per = elements.div_ceil(threads);
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = (0..threads)
            .map(|t| scope.spawn(move || f(t * per..((t + 1) * per).min(elements))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// The largest finite magnitude among `bytes`' elements, and `floor`.
pub(super) fn largest_magnitude(
    bytes: &[u8],
    width: usize,
    decode: fn(&[u8]) -> f64,
    floor: f64,
) -> f64 {
    in_parallel(bytes.len() / width, |range| {
        bytes[range.start * width..range.end * width]
            .chunks_exact(width)
            .map(decode)
            .filter(|v| v.is_finite())
            .fold(floor, |m, v| m.max(v.abs()))
    })
    .into_iter()
    .fold(floor, f64::max)
}

/// How to read one element of a float dtype as f64, `None` for other dtypes.
pub(super) fn float_decoder(dtype: DType) -> Option<fn(&[u8]) -> f64> {
    Some(match dtype {
        DType::F32 => |b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::F64 => |b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        DType::F16 => |b| half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        _ => return None,
    })
}
