//! Tessel's lazy tensor graph and the kernelizer that fuses it into kernel IR.
//!
//! - [`graph`]: hash-consed, reference-counted nodes ([`Graph`], [`Node`], [`Op`]).
//! - [`kernelize`](mod@kernelize): which values get buffers, which ops fuse, and the
//!   lowering of each kernel to `tessel_ir` ([`kernelize()`], [`Schedule`]).
//!
//! **Architecture Invariant:** `tessel-graph` never emits source code and never touches a
//! device: it produces `tessel_ir::Kernel`s and a schedule of buffer slots.

pub mod graph;
pub mod kernelize;
mod lower;

pub use graph::{Graph, LeafId, Node, NodeId, Op, ReduceOp};
pub use kernelize::{
    KernelizeError, Schedule, ScheduledKernel, Signature, Slot, kernelize, signature,
};
