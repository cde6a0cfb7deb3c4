//! [`ShapeError`]: the one error type of the shape layer.
//!
//! Every variant carries the op that failed and the shapes or values it was given, and its
//! message names the op, the input shapes and the rule broken (and, where useful, the fix).
//! Messages never end with a period, so callers can wrap them.

use crate::{Dim, Shape};

/// An error from a shape rule, an axis check or a symbolic variable.
///
/// `op` is the user-facing name of the operation (`"matmul"`, `"reshape"`, ...); the other
/// fields are the shapes and values that broke the rule, so callers can match on them
/// instead of parsing the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShapeError {
    // === Broadcasting and expansion ===
    /// Two shapes can't be broadcast together (`NumPy` rules: right-aligned, each pair of dims
    /// equal or one of them 1).
    #[error(
        "{op}: cannot broadcast shapes {lhs} and {rhs}: at dim {axis} (counted from the right), {}",
        broadcast_reason(*.lhs_dim, *.rhs_dim)
    )]
    Broadcast {
        /// The op that broadcast.
        op: &'static str,
        /// The left-hand shape.
        lhs: Shape,
        /// The right-hand shape.
        rhs: Shape,
        /// The offending dim, counted from the right: `-1` is the last dim.
        axis: isize,
        /// The left-hand dim at `axis`.
        lhs_dim: Dim,
        /// The right-hand dim at `axis`.
        rhs_dim: Dim,
    },

    /// `expand` was asked to change a dim that isn't 1.
    #[error(
        "{op}: cannot expand shape {shape} to {target}: dim {axis} is {dim} but the target is \
         {target_dim}; only dims of size 1 can be expanded (pass -1 to keep a dim)"
    )]
    Expand {
        /// The op that expanded.
        op: &'static str,
        /// The shape being expanded.
        shape: Shape,
        /// The requested sizes (`-1` keeps a dim).
        target: Shape,
        /// The offending axis of `shape`.
        axis: usize,
        /// The dim of `shape` at `axis`.
        dim: Dim,
        /// The requested size for `axis`.
        target_dim: Dim,
    },

    // === Axes ===
    /// An axis outside `-ndim..ndim`.
    #[error("{op}: axis {axis} is out of range for shape {shape}: {}", axis_range(*.ndim))]
    AxisOutOfRange {
        /// The op that was given the axis.
        op: &'static str,
        /// The axis as given (negative counts from the end).
        axis: i64,
        /// The number of valid axes: the shape's ndim, or one more for ops that insert an axis.
        ndim: usize,
        /// The shape the axis refers to.
        shape: Shape,
    },

    /// The same axis was named twice (`[0, -2]` on a 2-d shape names axis 0 twice).
    #[error(
        "{op}: axes {axes:?} name axis {axis} of shape {shape} more than once; each axis may \
         appear only once"
    )]
    DuplicateAxis {
        /// The op that was given the axes.
        op: &'static str,
        /// The repeated axis, normalized to `0..ndim`.
        axis: usize,
        /// The axes as given.
        axes: Vec<i64>,
        /// The shape the axes refer to.
        shape: Shape,
    },

    /// A permutation whose length isn't the shape's ndim.
    #[error(
        "{op}: {perm:?} is not a permutation of the axes of shape {shape}: it has {} entries, \
         expected {}",
        .perm.len(),
        .shape.ndim()
    )]
    InvalidPermutation {
        /// The op that was given the permutation.
        op: &'static str,
        /// The shape being permuted.
        shape: Shape,
        /// The permutation as given.
        perm: Vec<i64>,
    },

    // === Reshape ===
    /// A reshape that changes the number of elements.
    #[error(
        "{op}: cannot reshape {from} into {to}: {}",
        numel_reason(*.from_numel, *.to_numel)
    )]
    ReshapeNumel {
        /// The op that reshaped.
        op: &'static str,
        /// The input shape.
        from: Shape,
        /// The requested shape.
        to: Shape,
        /// The element count of `from`.
        from_numel: Dim,
        /// The element count of `to`.
        to_numel: Dim,
    },

    /// A reshape whose `-1` dim can't be inferred: two `-1`s, an element count not divisible
    /// by the other dims, or a zero-element tensor where any size would do.
    #[error("{op}: cannot infer the -1 dim reshaping {from} into {to}: {reason}")]
    ReshapeInfer {
        /// The op that reshaped.
        op: &'static str,
        /// The input shape.
        from: Shape,
        /// The requested shape, `-1` included.
        to: Shape,
        /// Why the dim can't be inferred.
        reason: String,
    },

    // === Matmul ===
    /// The contraction dims of a matrix product differ.
    #[error(
        "{op}: shapes {lhs} and {rhs} cannot be multiplied: {}",
        matmul_reason(*.lhs_dim, *.rhs_dim)
    )]
    MatmulMismatch {
        /// The op that multiplied.
        op: &'static str,
        /// The left-hand shape.
        lhs: Shape,
        /// The right-hand shape.
        rhs: Shape,
        /// The lhs's last dim.
        lhs_dim: Dim,
        /// The rhs's contraction dim (its second-to-last, or only, dim).
        rhs_dim: Dim,
    },

    // === Rank, joins and nn ===
    /// A shape with the wrong number of dims for the op.
    #[error("{op}: shape {shape} has {} dims, expected {expected}", .shape.ndim())]
    RankMismatch {
        /// The op that checked the rank.
        op: &'static str,
        /// The offending shape.
        shape: Shape,
        /// The ranks the op accepts, in words (`"at least 1"`, `"3, 4 or 5"`).
        expected: String,
    },

    /// Shapes that `cat` or `stack` can't join.
    #[error(
        "{op}: tensor {index} has shape {other}, incompatible with tensor {first_index}'s shape \
         {first}: {reason}"
    )]
    ConcatMismatch {
        /// The op that joined.
        op: &'static str,
        /// The index of the reference tensor (the first one that takes part).
        first_index: usize,
        /// The reference shape.
        first: Shape,
        /// The index of the offending tensor.
        index: usize,
        /// The offending shape.
        other: Shape,
        /// The rule broken.
        reason: String,
    },

    /// `cat` or `stack` of zero tensors.
    #[error("{op}: expected a non-empty list of tensors, got none")]
    Empty {
        /// The op that joined.
        op: &'static str,
    },

    /// A convolution whose input and weight don't fit (channels, groups, spatial rank).
    #[error("{op}: input {input} does not fit weight {weight}: {reason}")]
    ConvMismatch {
        /// The op that convolved.
        op: &'static str,
        /// The input shape (`N, C, spatial...`, or `C, spatial...` unbatched).
        input: Shape,
        /// The weight shape (`O, C / groups, kernel...`).
        weight: Shape,
        /// The rule broken.
        reason: String,
    },

    // === Other checks ===
    /// Any other invalid argument: negative sizes, a bad step, a window larger than the
    /// input, an unprovable symbolic condition...
    #[error("{op}: invalid argument for shape {shape}: {reason}")]
    InvalidArgument {
        /// The op that checked the argument.
        op: &'static str,
        /// The input shape.
        shape: Shape,
        /// The rule broken.
        reason: String,
    },

    /// A symbolic variable whose lower bound exceeds its upper bound.
    #[error("Var::new: variable {name:?} has lower bound {lo} greater than upper bound {hi}")]
    InvalidVarBounds {
        /// The variable's name.
        name: String,
        /// The requested lower bound.
        lo: i64,
        /// The requested upper bound.
        hi: i64,
    },
}

impl ShapeError {
    /// The name of the op that failed (`"Var::new"` for [`ShapeError::InvalidVarBounds`]).
    pub fn op(&self) -> &'static str {
        match self {
            Self::Broadcast { op, .. }
            | Self::Expand { op, .. }
            | Self::AxisOutOfRange { op, .. }
            | Self::DuplicateAxis { op, .. }
            | Self::InvalidPermutation { op, .. }
            | Self::ReshapeNumel { op, .. }
            | Self::ReshapeInfer { op, .. }
            | Self::MatmulMismatch { op, .. }
            | Self::RankMismatch { op, .. }
            | Self::ConcatMismatch { op, .. }
            | Self::Empty { op }
            | Self::ConvMismatch { op, .. }
            | Self::InvalidArgument { op, .. } => op,
            Self::InvalidVarBounds { .. } => "Var::new",
        }
    }
}

/// Whether two dims are both constants, so a mismatch is certain rather than unproven.
fn both_const(a: Dim, b: Dim) -> bool {
    a.is_const() && b.is_const()
}

fn broadcast_reason(a: Dim, b: Dim) -> String {
    if both_const(a, b) {
        format!("sizes {a} and {b} differ and neither is 1")
    } else {
        format!("dims {a} and {b} can't be proven compatible (equal, or either of them 1)")
    }
}

fn numel_reason(a: Dim, b: Dim) -> String {
    if both_const(a, b) {
        format!("it has {a} elements but the target shape has {b}")
    } else {
        format!("the element counts {a} and {b} can't be proven equal")
    }
}

fn matmul_reason(a: Dim, b: Dim) -> String {
    if both_const(a, b) {
        format!("the lhs's last dim ({a}) must equal the rhs's contraction dim ({b})")
    } else {
        format!(
            "the lhs's last dim ({a}) and the rhs's contraction dim ({b}) can't be proven equal"
        )
    }
}

fn axis_range(ndim: usize) -> String {
    if ndim == 0 {
        "a 0-d shape has no axes".to_owned()
    } else {
        format!("expected an axis in -{ndim}..{ndim}")
    }
}
