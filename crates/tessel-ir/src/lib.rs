//! Tessel's kernel IR: the one language every backend speaks.
//!
//! - [`kernel`]: the IR itself — [`Kernel`], [`Param`], [`Grid`], [`Inst`], [`Value`].
//! - [`builder`]: [`KernelBuilder`], for writing kernels by hand.
//! - [`verify`](mod@verify): the verifier, one precise [`VerifyError`] per broken kernel.
//! - The text form: `Display` for [`Kernel`], stable and snapshot-tested, and
//!   [`Kernel::parse`], which reads it back (kernels of constant sizes); routines as one
//!   line that reads back ([`VendorOp::record`]).
//! - [`backend`]: the [`Backend`] trait every runtime implements, and [`LaunchArgs`], the
//!   launch-argument checks every backend shares.
//! - [`handles`]: [`Handles`], the table of live buffers or programs every backend keeps,
//!   with the device and byte-range checks they share.
//! - [`attention`]: the portable fused attention kernel.
//! - [`philox`]: the Philox4x32-10 random bits, on the host and in kernels.
//! - [`cache`]: the key hash and temporary-file names of the on-disk kernel caches.
//!
//! **Architecture Invariant:** `tessel-ir` knows nothing about graphs or tensors, and
//! nothing about any particular device: backends depend on it, never the reverse.

pub mod attention;
pub mod attention_backward;
pub mod backend;
mod bounds;
pub mod builder;
pub mod cache;
pub mod codegen;
pub mod compare;
mod display;
pub mod handles;
pub mod interp;
pub mod kernel;
pub mod launch;
mod parse;
pub mod passes;
pub mod philox;
mod record;
pub mod samples;
pub mod vendor;
pub mod verify;

pub use backend::{
    Backend, BackendError, BufferId, DeviceInfo, DeviceKind, Features, ProgramId, ProgramOrigin,
    SequenceId, SequenceLaunch,
};
pub use builder::{Buf, KernelBuilder};
pub use display::inst_text;
pub use handles::Handles;
pub use kernel::{Access, AtomicOp, Grid, Inst, Kernel, Mem, Param, Special, Ty, Value};
pub use launch::LaunchArgs;
pub use parse::ParseError;
pub use vendor::{
    Activation, Attention, AttentionBackward, AttentionDropout, AttentionGrads, AttentionLayout,
    AttentionMask, AttentionPart, AttentionSizes, Epilogue, Matmul, MatmulSizes, RowLayout,
    VendorOp, VendorProgram,
};
pub use verify::{Def, VerifyError, VerifyErrorKind, verify};
