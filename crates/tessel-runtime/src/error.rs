//! Tessel's user-facing error: every fallible call returns [`Result`].

use tessel_ir::BackendError;
use tessel_shape::{DType, DTypeError, Shape, ShapeError};

/// Everything that can go wrong in a tensor call, with the op, the shapes or dtypes
/// involved and, where there is one, the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A shape rule was broken (broadcast, reshape, axis, matmul, ...).
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// Two dtypes have no common type.
    #[error("{op}: {source}")]
    Promotion {
        /// The op.
        op: &'static str,
        /// Why.
        source: DTypeError,
    },
    /// The op is not defined for the dtype.
    #[error("{op} is not supported for {dtype}{}", hint_suffix(.hint))]
    UnsupportedDType {
        /// The op.
        op: &'static str,
        /// The offending dtype.
        dtype: DType,
        /// What to do instead.
        hint: &'static str,
    },
    /// Data of one dtype was asked for as another.
    #[error(
        "{op}: the tensor holds {actual}, but {requested} was requested; call .cast(DType::{requested_variant}) first or read it as {actual}"
    )]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// The tensor's dtype.
        actual: DType,
        /// The dtype asked for.
        requested: DType,
        /// The requested dtype's `DType` variant name.
        requested_variant: String,
    },
    /// The number of elements given doesn't fit the shape.
    #[error("{op}: {len} elements cannot fill shape {shape} ({numel} elements)")]
    DataLength {
        /// The op.
        op: &'static str,
        /// Elements given.
        len: usize,
        /// The requested shape.
        shape: Shape,
        /// Elements the shape holds.
        numel: String,
    },
    /// An argument is outside what the op accepts.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The op.
        op: &'static str,
        /// What is wrong, and the fix.
        reason: String,
    },
    /// Tensors on different devices were combined.
    #[error("{op}: tensors are on different devices ({lhs} and {rhs}); move one with .to(&device)")]
    DeviceMismatch {
        /// The op.
        op: &'static str,
        /// One device.
        lhs: String,
        /// The other.
        rhs: String,
    },
    /// The device or backend asked for is not available.
    #[error("device {device} is not available: {reason}")]
    NoDevice {
        /// The device asked for.
        device: String,
        /// Why, and how to enable it.
        reason: String,
    },
    /// A collective across processes failed: a rank exited or stopped answering within the
    /// timeout, or the ranks called different collectives or passed different sizes.
    #[error("{op}: {reason}")]
    Collective {
        /// The collective (`all_reduce`, `broadcast`, ...).
        op: &'static str,
        /// What happened, naming the rank and the collective's sequence number.
        reason: String,
    },
    /// The backend failed (out of memory, compile error, launch failure).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A bug in Tessel, reported as a value instead of a panic.
    #[error("internal error (please report it): {0}")]
    Internal(String),
}

impl Error {
    /// A size that did not evaluate during a realize: a user's mistake where a dynamic dim
    /// has no value (a tensor made from a symbolic shape instead of by `mark_dynamic`) or a
    /// value outside its variable's bounds; anything else is internal.
    pub fn from_eval(e: tessel_shape::EvalError) -> Error {
        match e {
            tessel_shape::EvalError::Unbound { .. } => Error::InvalidArgument {
                op: "realize",
                reason: format!(
                    "{e}: a dynamic dim has no value; make dynamic tensors with mark_dynamic"
                ),
            },
            tessel_shape::EvalError::OutOfBounds { .. } => Error::InvalidArgument {
                op: "realize",
                reason: e.to_string(),
            },
            other => Error::Internal(other.to_string()),
        }
    }
}

fn hint_suffix(hint: &str) -> String {
    if hint.is_empty() {
        String::new()
    } else {
        format!("; {hint}")
    }
}

/// `Result` with Tessel's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
