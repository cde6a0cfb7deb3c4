//! Tessel's symbolic layer: the ground every other crate stands on.
//!
//! - [`DType`] names an element type and carries PyTorch's type promotion.
//! - [`Scalar`] is one typed value; with the op enums in [`ops`] it *defines* what every
//!   operation computes, so constant folding, the reference interpreter and compiled
//!   kernels agree bit for bit.
//! - [`Expr`] (alias [`Dim`]) is a hash-consed symbolic integer expression for dimensions and
//!   index arithmetic, canonicalized as it is built; [`Var`] is a named dimension with
//!   bounds, bound to a value only at launch.
//! - [`Shape`] is a list of dims; [`rules`] holds the shape rule of every tensor op, each
//!   returning a [`ShapeError`] that names the op, the shapes and the rule broken.
//!
//! ```
//! use tessel_shape::{Expr, Var};
//!
//! let batch = Var::new("batch", 1, 4096).unwrap();
//! let i = Var::new("i", 0, 63).unwrap();
//! let idx = Expr::from(batch) * 64 + i;
//! assert_eq!((idx % 64).to_string(), "i");
//! assert_eq!((idx / 64).to_string(), "batch");
//! ```

mod dtype;
mod error;
mod expr;
mod float8;
pub mod ops;
pub mod rules;
mod scalar;
mod shape;

pub use dtype::{DType, DTypeError, ScalarKind};
pub use error::ShapeError;
pub use expr::{Bindings, Bounds, Dim, EvalError, Expr, ExprView, Var};
pub use float8::{F8E4M3, F8E5M2};
pub use ops::{BinaryOp, TernaryOp, UnaryOp};
pub use scalar::{Scalar, ScalarError, erf};
pub use shape::Shape;

/// `half`'s float types, re-exported so users need no direct dependency.
pub use half::{bf16, f16};
