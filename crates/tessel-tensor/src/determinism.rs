//! Deterministic algorithms: PyTorch's `torch.use_deterministic_algorithms`.

use std::sync::atomic::{AtomicBool, Ordering};

static DETERMINISTIC: AtomicBool = AtomicBool::new(false);

/// Makes every op that has a deterministic form record it from now on, process-wide (as
/// `torch.use_deterministic_algorithms(True)`; `TESSEL_DETERMINISTIC=1` sets it at start).
///
/// The ops it changes are the float scatter-adds: `scatter_add`, `index_add`, `index_put`
/// with `accumulate`, `scatter_reduce` with `"sum"`/`"mean"`, and the gradients of every
/// gather (`gather`, `index_select`, `embedding`, the losses that pick a target). Their
/// default adds atomically, in whatever order the device runs the sources, so float sums
/// may differ in their last bits run to run. The deterministic form sorts the sources by
/// destination (a stable sort of the indices), sums each destination's run in a fixed tree
/// order (a segmented scan), and reads back each run's total: bit-identical results on
/// every run, at the cost of the sort (see the guide's indexing section). Integer sums,
/// `amax`/`amin`, `prod` and `scatter` are deterministic either way. It does not cover the
/// fused `f32` attention backward on CUDA, which adds each key tile's share of `dq`
/// atomically: a plan that chooses it gives attention gradients whose last bits may
/// differ run to run.
///
/// It is read when an op is recorded, not when a graph is realized: a tensor recorded
/// before the switch keeps the form it was recorded with.
///
/// ```
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// tessel_tensor::use_deterministic_algorithms(true);
/// let t = Tensor::from_vec(vec![0.0f32; 2], [2])?;
/// let i = Tensor::from_vec(vec![1i64, 1, 0], [3])?;
/// let s = Tensor::from_vec(vec![0.5f32, 0.25, 2.0], [3])?;
/// assert_eq!(t.scatter_add(0, &i, &s)?.to_vec::<f32>()?, vec![2.0, 0.75]);
/// tessel_tensor::use_deterministic_algorithms(false);
/// # Ok(())
/// # }
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
