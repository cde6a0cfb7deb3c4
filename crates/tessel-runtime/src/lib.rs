//! Tessel's runtime: where a lazy graph becomes kernels that run.
//!
//! One process-wide [`Runtime`] (see [`runtime()`]) holds the lazy graph, the data behind
//! its leaves and the backends the features enable. Realizing nodes plans them (the
//! planner: rewrites, partitions, kernels and library routines per device), compiles the
//! candidates, measures them with device timers and extracts the cheapest plan
//! (measurement), tunes the launch shapes of large kernels ([`Tuning`]), and caches plans,
//! timings and tuning winners in memory and on disk. `tessel-tensor` builds its `Tensor`
//! API on top; nothing here knows about tensors.
//!
//! **Architecture Invariant:** the runtime computes nothing itself: every value is computed
//! by a kernel or a library routine the planner chose by measuring it.

mod captured;
mod determinism;
mod device;
mod error;
mod execute;
mod host;
mod measure;
mod plan_cache;
mod plan_view;
mod planner;
mod plans;
mod precision;
mod program;
mod progress;
mod runtime;
mod stored_plans;
#[cfg(test)]
mod test_graph;
mod tuning;

pub use captured::Captured;
pub use determinism::{are_deterministic_algorithms_enabled, use_deterministic_algorithms};
pub use device::{Device, on_synchronize};
pub use error::{Error, Result};
pub use execute::{host_bytes, out_of_host_memory};
pub use host::HostBytes;
pub use planner::set_placement;
pub use precision::{
    Float32MatmulPrecision, float32_matmul_precision, set_float32_matmul_precision,
};
pub use runtime::{PLAN_CACHE_LIMIT, RealizeReport, Runtime, RuntimeStats, runtime, stats};
pub use tessel_ir::{BackendError, DeviceInfo, DeviceKind, Features};
pub use tuning::{Tuning, set_tuning, tuning};
