//! Tessel's lazy tensor graph and the kernelizer that fuses it into kernel IR.
//!
//! - [`custom`]: hand-written kernels as graph nodes ([`CustomKernel`]).
//! - [`egraph`]: every equivalent form of a value in one class ([`EGraph`]), rewrites as
//!   data ([`Rewrite`], [`rules()`]), saturation within an [`egraph::Budget`], and
//!   extraction of the cheapest form back into a graph ([`simplify()`]), and of several
//!   forms whose nodes name their e-class, for the planner to measure ([`egraph::forms`]).
//! - [`exact`]: the float sums whose two computations a comparison would tell apart
//!   ([`exact::compared_sums`]), which a plan computes once.
//! - [`extract`](mod@extract): the cheapest closed, acyclic set of measured candidates
//!   that produces the wanted values ([`extract::extract`]).
//! - [`placement`]: extraction over several devices, with measured transfers inserted
//!   where a producer and its consumer live apart ([`placement::place`]).
//! - [`graph`]: hash-consed, reference-counted nodes ([`Graph`], [`Node`], [`Op`]).
//! - [`kernelize`](mod@kernelize): which values get buffers, which ops fuse, and the
//!   lowering of each kernel to `tessel_ir` ([`kernelize()`], [`Schedule`]).
//! - [`random`]: counter-based random bits ([`Philox`]), computed where they are used.
//! - [`spec`]: a kernel before scheduling ([`KernelSpec`]: its iteration space and its
//!   reads as index expressions), which every knob is checked against.
//! - [`tune`]: the schedule's knobs ([`Knobs`]: launch shape, outputs per invocation,
//!   lanes, local-memory tiles) and a kernel's variants for a tuner to measure
//!   ([`ScheduledKernel::variants`]).
//! - [`vendor`]: values a library routine can compute (matrix products), as alternatives
//!   to the generated kernels ([`find_matmuls`]), and attention over two of them
//!   ([`find_attention`]), with the pieces of its backward pass that autograd records.
//! - [`view`]: a chain of movement ops read as offsets and strides of the value below it
//!   ([`strided_view`]), so attention can read heads in place.
//!
//! **Architecture Invariant:** `tessel-graph` never emits source code and never touches a
//! device: it produces `tessel_ir::Kernel`s and a schedule of buffer slots.

mod attention;
mod attention_backward;
mod consumers;
pub mod custom;
pub mod egraph;
mod epilogue;
pub mod exact;
pub mod extract;
pub mod graph;
pub mod kernelize;
mod lower;
pub mod placement;
pub mod random;
pub mod signature;
pub mod spec;
pub mod tune;
pub mod vendor;
pub mod view;

pub use attention::{AttentionNodes, attention_nodes, find_attention};
pub use custom::CustomKernel;
pub use egraph::{EGraph, Rewrite, Simplified, rules, simplify};
pub use graph::{ARGSORT_ROW_MAX, Graph, LeafId, Node, NodeId, Op, ReduceOp};
pub use kernelize::{
    KernelizeError, Lowerings, SHARED_MIN_OPS, Schedule, ScheduledKernel, Slot, kernelize,
    kernelize_cooperative, kernelize_rows, kernelize_shared, kernelize_with, views_to_split,
};
pub use random::{Philox, Words};
pub use signature::{Signature, Walk, signature};
pub use spec::{KernelSpec, ScheduleError, SpecAccess};
pub use tessel_ir::AtomicOp;
pub use tune::{Knobs, Search};
pub use vendor::{VendorMatch, find_matmuls, find_plain_matmuls, materialized_for};
pub use view::{StridedView, strided_view};
