//! [`Shape`]: a list of (possibly symbolic) dims, with row-major layout helpers.

use std::fmt;
use std::ops::{Deref, Index};
use std::slice::SliceIndex;
use std::sync::Arc;

use crate::Dim;

/// The shape of a tensor: one [`Dim`] per axis, outermost first.
///
/// Dims may be symbolic ([`Expr`](crate::Expr)s over [`Var`](crate::Var)s). Two shapes are
/// equal when their dims are equal after canonicalization. A shape with no dims is a scalar
/// (0-d) shape with one element. Building a shape from `usize` dims panics for a dim above
/// `i64::MAX`, which no real tensor reaches.
///
/// ```
/// use tessel_shape::{Dim, Shape, Var};
///
/// let b = Var::new("b", 1, 64).unwrap();
/// let s = Shape::new(vec![Dim::from(b), Dim::from(3)]);
/// assert_eq!(s.to_string(), "[b, 3]");
/// assert_eq!(Shape::from([2, 3]).numel(), Dim::from(6));
/// ```
///
/// The dims are shared: a clone (an elementwise op's output, a node's shape) copies a
/// pointer, and dropping a recorded graph frees each distinct shape once.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(Arc<[Dim]>);

impl Shape {
    /// A shape with the given dims.
    pub fn new(dims: Vec<Dim>) -> Self {
        Self(dims.into())
    }

    /// The 0-d shape `[]` of a scalar.
    pub fn scalar() -> Self {
        Self(Arc::from([]))
    }

    /// The number of dims (0 for a scalar).
    pub fn ndim(&self) -> usize {
        self.0.len()
    }

    /// The dims, outermost first.
    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    /// The dims as an owned vector.
    pub fn into_dims(self) -> Vec<Dim> {
        self.0.to_vec()
    }

    /// The number of elements: the product of the dims (1 for a scalar).
    pub fn numel(&self) -> Dim {
        self.0.iter().fold(Dim::constant(1), |acc, &d| acc * d)
    }

    /// The dims as `usize`s, or `None` if any dim is symbolic or negative.
    pub fn as_usizes(&self) -> Option<Vec<usize>> {
        self.0
            .iter()
            .map(|d| d.as_const().and_then(|v| usize::try_from(v).ok()))
            .collect()
    }

    /// The row-major (C-contiguous) strides of this shape, in elements.
    ///
    /// Like `PyTorch`, a dim of size 0 counts as 1 when computing the strides of the dims
    /// before it, so `[2, 0, 3]` has strides `[3, 3, 1]`.
    pub fn contiguous_strides(&self) -> Vec<Dim> {
        let mut strides = vec![Dim::constant(1); self.0.len()];
        let mut acc = Dim::constant(1);
        for (stride, &d) in strides.iter_mut().zip(self.0.iter()).rev() {
            *stride = acc;
            acc *= at_least_one(d);
        }
        strides
    }

    /// Whether `strides` describe a row-major contiguous layout of this shape.
    ///
    /// As in `PyTorch`, the strides of size-1 dims don't matter, and every layout of a shape
    /// with no elements (a dim of size 0) is contiguous. Symbolic strides must equal the
    /// expected ones after canonicalization; a `strides` of the wrong length is never
    /// contiguous.
    pub fn is_contiguous(&self, strides: &[Dim]) -> bool {
        if strides.len() != self.0.len() {
            return false;
        }
        if self.0.iter().any(|d| d.as_const() == Some(0)) {
            return true;
        }
        let mut expected = Dim::constant(1);
        for (&d, &stride) in self.0.iter().zip(strides).rev() {
            if d.as_const() == Some(1) {
                continue;
            }
            if stride != expected {
                return false;
            }
            expected *= d;
        }
        true
    }
}

/// `max(d, 1)`, skipping the `max` when `d` is provably at least 1.
fn at_least_one(d: Dim) -> Dim {
    match d.as_const() {
        Some(v) => Dim::constant(v.max(1)),
        None if d.bounds().lo >= 1 => d,
        None => d.max(1),
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl Deref for Shape {
    type Target = [Dim];

    fn deref(&self) -> &[Dim] {
        &self.0
    }
}

/// Indexing by position (`shape[0]`) or by range (`shape[1..]`), like a slice.
impl<I: SliceIndex<[Dim]>> Index<I> for Shape {
    type Output = I::Output;

    fn index(&self, index: I) -> &I::Output {
        &self.0[index]
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Self(dims.into_iter().map(Dim::from).collect())
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Self(dims.iter().map(|&d| Dim::from(d)).collect())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Self(dims.into_iter().map(Dim::from).collect())
    }
}

impl From<Vec<Dim>> for Shape {
    fn from(dims: Vec<Dim>) -> Self {
        Self(dims.into())
    }
}

impl From<&[Dim]> for Shape {
    fn from(dims: &[Dim]) -> Self {
        Self(dims.into())
    }
}

impl From<Shape> for Vec<Dim> {
    fn from(shape: Shape) -> Self {
        shape.0.to_vec()
    }
}

impl FromIterator<Dim> for Shape {
    fn from_iter<I: IntoIterator<Item = Dim>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a Shape {
    type Item = &'a Dim;
    type IntoIter = std::slice::Iter<'a, Dim>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
