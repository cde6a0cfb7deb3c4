//! Deterministic algorithms: PyTorch's `torch.use_deterministic_algorithms`.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::precision::{Float32MatmulPrecision, float32_matmul_precision};

static DETERMINISTIC: AtomicBool = AtomicBool::new(false);

/// Makes every computation that has a deterministic form use it from now on, process-wide
/// (as `torch.use_deterministic_algorithms(True)`; `TESSEL_DETERMINISTIC=1` sets it at
/// start): float results are then bit-identical run to run on the same device.
///
/// Two things read it:
/// - **Recording** the float scatter-adds: `scatter_add`, `index_add`, `index_put` with
///   `accumulate`, `scatter_reduce` with `"sum"`/`"mean"`, and the gradients of every
///   gather (`gather`, `index_select`, `embedding`, the losses that pick a target). Their
///   default adds atomically, in whatever order the device runs the sources, so float sums
///   may differ in their last bits run to run. The deterministic form sorts the sources by
///   destination (a stable sort of the indices), sums each destination's run in a fixed
///   tree order (a segmented scan), and reads back each run's total, at the cost of the
///   sort (see the guide's indexing section). A tensor recorded before the switch keeps
///   the form it was recorded with. Integer sums, `amax`/`amin`, `prod` and `scatter` are
///   deterministic either way.
/// - **Planning**: a plan made while it is on leaves out every library routine whose
///   results vary run to run (`VendorProgram::deterministic` false: the fused `f32`
///   attention backward on CUDA, which adds each key tile's share of `dq` atomically); the
///   planner measures the others instead. Plans are cached per setting, so switching back
///   and forth replans nothing.
///
/// ```
/// use tessel_runtime::{are_deterministic_algorithms_enabled, use_deterministic_algorithms};
/// use_deterministic_algorithms(true);
/// assert!(are_deterministic_algorithms_enabled());
/// use_deterministic_algorithms(false);
/// ```
pub fn use_deterministic_algorithms(on: bool) {
    DETERMINISTIC.store(on, Ordering::Relaxed);
    ENV_READ.store(true, Ordering::Relaxed);
}

/// Whether [`use_deterministic_algorithms`] is on (`torch.are_deterministic_algorithms_enabled`).
pub fn are_deterministic_algorithms_enabled() -> bool {
    if !ENV_READ.swap(true, Ordering::Relaxed)
        && std::env::var("TESSEL_DETERMINISTIC").is_ok_and(|v| v == "1")
    {
        DETERMINISTIC.store(true, Ordering::Relaxed);
    }
    DETERMINISTIC.load(Ordering::Relaxed)
}

/// Whether the environment has been consulted (once, at the first query, unless a call to
/// [`use_deterministic_algorithms`] came first and decides).
static ENV_READ: AtomicBool = AtomicBool::new(false);

/// What a plan's numbers may be: the `f32` product precision and whether every program
/// must repeat its results bit for bit. Read when a plan is made; part of every plan key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Numerics {
    pub(crate) precision: Float32MatmulPrecision,
    pub(crate) deterministic: bool,
}

impl Numerics {
    /// The process-wide settings now.
    pub(crate) fn current() -> Numerics {
        Numerics {
            precision: float32_matmul_precision(),
            deterministic: are_deterministic_algorithms_enabled(),
        }
    }

    /// Stable text for on-disk keys: the precision's name, with `" deterministic"` after it
    /// where that is on.
    pub(crate) fn name(self) -> String {
        let deterministic = if self.deterministic {
            " deterministic"
        } else {
            ""
        };
        format!("{}{deterministic}", self.precision.name())
    }
}
