//! Data-parallel training across processes: process groups, collectives on tensors, and
//! [`DistributedDataParallel`] (PyTorch's `torch.distributed` and `DDP`).
//!
//! Each process trains the same model on its own part of every batch; gradients are
//! averaged over the processes before each optimizer step, so every process takes the same
//! step.
//!
//! ```no_run
//! use tessel_distributed::{DistributedDataParallel, ProcessGroup};
//! # fn main() -> tessel_tensor::Result<()> {
//! # let (model_params, mut opt, loss): (Vec<tessel_tensor::Tensor>, tessel_nn::optim::Sgd, tessel_tensor::Tensor) = todo!();
//! // RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun sets them.
//! let group = ProcessGroup::from_env()?;
//! let ddp = DistributedDataParallel::new(&group, model_params)?;
//! // Per step, this rank's loss on its own samples:
//! ddp.step(&mut opt, &loss)?;
//! # Ok(())
//! # }
//! ```
//!
//! - [`ProcessGroup`]: rank, world size, and `all_reduce`, `broadcast`, `all_gather`,
//!   `reduce_scatter`, `barrier` on tensors of any device.
//! - [`Collective`]: the transport under a group. The built-in one is TCP through rank 0
//!   (host memory; see `tcp.rs`); a group of one needs none.
//! - [`DistributedDataParallel`]: rank 0's parameters broadcast at start, gradients averaged
//!   in buckets, communication overlapped with reading the next bucket.
//!
//! Failures are errors, never hangs: a rank that exits, stops answering for the timeout
//! ([`InitOptions::timeout`], `TESSEL_DIST_TIMEOUT`), or calls a different collective or
//! size makes the call fail with [`Error::Collective`](tessel_tensor::Error::Collective) on
//! every rank still running.
//!
//! Not built yet: an NCCL transport for CUDA tensors (collectives then move device memory
//! directly, ordered with the plan's kernels); today CUDA tensors go through host memory.

mod ddp;
mod group;
mod reduce;
mod tcp;

pub use ddp::{DEFAULT_BUCKET_BYTES, DistributedDataParallel};
pub use group::{Collective, InitOptions, ProcessGroup};
pub use reduce::ReduceOp;
