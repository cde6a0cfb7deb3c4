//! Tessel's kernel IR: the one language every backend speaks.
//!
//! - [`kernel`]: the IR itself — [`Kernel`], [`Param`], [`Grid`], [`Inst`], [`Value`].
//! - [`builder`]: [`KernelBuilder`], for writing kernels by hand.
//! - [`verify`](mod@verify): the verifier, one precise [`VerifyError`] per broken kernel.
//! - The text form: `Display` for [`Kernel`], stable and snapshot-tested.
//! - [`backend`]: the [`Backend`] trait every runtime implements, and [`LaunchArgs`], the
//!   launch-argument checks every backend shares.
//!
//! **Architecture Invariant:** `tessel-ir` knows nothing about graphs or tensors, and
//! nothing about any particular device: backends depend on it, never the reverse.

pub mod backend;
pub mod builder;
pub mod codegen;
mod display;
pub mod interp;
pub mod kernel;
pub mod launch;
pub mod passes;
pub mod samples;
pub mod verify;

pub use backend::{Backend, BackendError, BufferId, DeviceInfo, Features, ProgramId};
pub use builder::{Buf, KernelBuilder};
pub use display::inst_text;
pub use kernel::{Access, Grid, Inst, Kernel, Mem, Param, Special, Ty, Value};
pub use launch::LaunchArgs;
pub use verify::{Def, VerifyError, VerifyErrorKind, verify};
