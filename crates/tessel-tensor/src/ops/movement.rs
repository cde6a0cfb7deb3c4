//! Movement ops: views that change how elements are addressed, never their values.
//!
//! Every op here records a movement node (`Reshape`, `Permute`, `Expand`, `Pad`, `Shrink`,
//! `Flip`) or a small composition of them; the kernelizer folds movement into the index
//! arithmetic of the kernels that read it, so a view costs no copy and no kernel of its own.
//! Shapes are checked by `tessel_shape::rules`, so errors name the op, the shapes and the
//! rule broken. Axes are `i64` and may be negative, as in `PyTorch`.

use tessel_graph::Op;
use tessel_shape::{BinaryOp, DType, Dim, Scalar, Shape, ShapeError, TernaryOp, rules};

use crate::ops::ScalarOperand;
use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

impl Tensor {
    // === Shape changes ===

    /// The same elements in row-major order in a new shape; one entry may be `-1`, inferred
    /// from the others (`Tensor.reshape`). Never copies.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec((0..6).collect::<Vec<i32>>(), [2, 3])?;
    /// assert_eq!(t.reshape(&[3, -1])?.dims(), vec![3, 2]);
    /// assert!(t.reshape(&[4, -1]).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        let out = rules::reshape(self.shape(), shape)?;
        Ok(self.reshape_to(out))
    }

    /// [`Tensor::reshape`] with dims that may be dynamic (see [`Tensor::mark_dynamic`]),
    /// such as another tensor's `shape()[0]`; one may be `Dim::from(-1)`.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Dim, Tensor, Var};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let seq = Var::new("seq", 1, 512)?;
    /// let x = Tensor::ones([6, 8], DType::F32).mark_dynamic(0, seq)?;
    /// let heads = x.reshape_dims(&[x.shape()[0], Dim::from(2), Dim::from(4)])?;
    /// assert_eq!(heads.shape().to_string(), "[seq, 2, 4]");
    /// assert_eq!(heads.dims(), vec![6, 2, 4]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn reshape_dims(&self, dims: &[Dim]) -> Result<Tensor> {
        let out = rules::reshape(self.shape(), dims)?;
        Ok(self.reshape_to(out))
    }

    /// [`Tensor::reshape`] under `PyTorch`'s other name. Tessel views never need contiguous
    /// memory, so `view` accepts every shape `reshape` does.
    pub fn view(&self, shape: &[i64]) -> Result<Tensor> {
        self.reshape(shape)
    }

    /// The tensor with its axes reordered: axis `i` of the result is axis `axes[i]` of
    /// `self` (`Tensor.permute`).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec((0..6).collect::<Vec<i32>>(), [2, 3])?;
    /// let p = t.permute(&[1, 0])?;
    /// assert_eq!(p.to_vec::<i32>()?, vec![0, 3, 1, 4, 2, 5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn permute(&self, axes: &[i64]) -> Result<Tensor> {
        let out = rules::permute(self.shape(), axes)?;
        let perm = rules::normalize_axes("permute", axes, self.shape())?;
        Ok(permute_to(self, perm, out))
    }

    /// The tensor with axes `a` and `b` swapped (`Tensor.transpose`).
    pub fn transpose(&self, a: i64, b: i64) -> Result<Tensor> {
        let out = rules::transpose(self.shape(), a, b)?;
        if self.ndim() == 0 {
            return Ok(self.clone());
        }
        let a = rules::normalize_axis("transpose", a, self.shape())?;
        let b = rules::normalize_axis("transpose", b, self.shape())?;
        let mut perm: Vec<usize> = (0..self.ndim()).collect();
        perm.swap(a, b);
        Ok(permute_to(self, perm, out))
    }

    /// The transpose of a matrix (`Tensor.t`): 0-d and 1-d tensors are returned as they are,
    /// 2-d ones transposed; more dims are an error (use [`Tensor::transpose`] or
    /// [`Tensor::permute`]).
    pub fn t(&self) -> Result<Tensor> {
        match self.ndim() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            _ => Err(Error::Shape(ShapeError::RankMismatch {
                op: "t",
                shape: self.shape().clone(),
                expected: "at most 2; use transpose(a, b) or permute for more dims".to_owned(),
            })),
        }
    }

    /// The tensor with size-1 dims repeated to `sizes` (`Tensor.expand`): `-1` keeps a dim,
    /// and new leading dims may be added. Never copies.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2], [2, 1])?;
    /// assert_eq!(t.expand(&[2, 2, -1, 3])?.dims(), vec![2, 2, 2, 3]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn expand(&self, sizes: &[i64]) -> Result<Tensor> {
        let out = rules::expand(self.shape(), sizes)?;
        check_numel("expand", self.shape(), &out)?;
        Ok(self.broadcast_to_shape(&out))
    }

    /// The tensor broadcast to `shape` (`torch.broadcast_to`): [`Tensor::expand`] with every
    /// size given.
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let target: Shape = shape.into();
        let out = rules::expand(self.shape(), target.dims())?;
        check_numel("broadcast_to", self.shape(), &out)?;
        Ok(self.broadcast_to_shape(&out))
    }

    /// The tensor without size-1 dims (`Tensor.squeeze`): every one for `None`, else those
    /// of the listed axes that have size 1 (a listed axis of another size stays, as in
    /// `PyTorch`).
    pub fn squeeze(&self, axes: Option<&[i64]>) -> Result<Tensor> {
        let out = rules::squeeze(self.shape(), axes)?;
        Ok(self.reshape_to(out))
    }

    /// The tensor with a size-1 dim inserted at `axis`, in `-ndim-1..=ndim`
    /// (`Tensor.unsqueeze`).
    pub fn unsqueeze(&self, axis: i64) -> Result<Tensor> {
        let out = rules::unsqueeze(self.shape(), axis)?;
        Ok(self.reshape_to(out))
    }

    /// The dims `start..=end` merged into one (`Tensor.flatten`); `flatten(0, -1)` makes a
    /// 1-d tensor.
    pub fn flatten(&self, start: i64, end: i64) -> Result<Tensor> {
        let out = rules::flatten(self.shape(), start, end)?;
        Ok(self.reshape_to(out))
    }

    /// The same value: Tessel tensors are lazy views, and every realized value is stored
    /// contiguously, so there is nothing to do (`Tensor.contiguous`).
    pub fn contiguous(&self) -> Tensor {
        self.clone()
    }

    // === Pad, narrow, slice, flip ===

    /// Constant padding: `pads[k] = (before, after)` elements of `value` around each of the
    /// **last** `pads.len()` dims, in natural dim order (`pads[0]` pads dim
    /// `ndim - pads.len()`). The value is converted to the tensor's dtype. Negative pads
    /// crop.
    ///
    /// `torch.nn.functional.pad` lists pairs from the last dim backwards, flat:
    /// `F.pad(x, (l1, r1, l0, r0), value=v)` on the last two dims is
    /// `x.pad(&[(l0, r0), (l1, r1)], v)`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2, 3], [1, 3])?;
    /// assert_eq!(t.pad(&[(1, -1)], 9)?.to_vec::<i32>()?, vec![9, 1, 2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn pad(&self, pads: &[(i64, i64)], value: impl ScalarOperand) -> Result<Tensor> {
        const OP: &str = "pad";
        let out = rules::pad(self.shape(), pads)?;
        check_numel(OP, self.shape(), &out)?;
        let first = self.ndim() - pads.len();
        // Crop first (negative pads), then pad (positive ones).
        let mut ranges: Vec<(Dim, Dim)> = vec![(Dim::constant(0), Dim::constant(1)); self.ndim()];
        let mut cropped = self.shape().clone().into_dims();
        let mut grow = vec![(Dim::constant(0), Dim::constant(0)); self.ndim()];
        for (k, &(before, after)) in pads.iter().enumerate() {
            let axis = first + k;
            let (cut_before, cut_after) = (
                0i64.saturating_sub(before).max(0),
                0i64.saturating_sub(after).max(0),
            );
            let kept = cropped[axis] - cut_before - cut_after;
            if kept.bounds().lo < 0 {
                return Err(Error::Shape(ShapeError::InvalidArgument {
                    op: OP,
                    shape: self.shape().clone(),
                    reason: format!(
                        "padding dim {axis} ({}) by ({before}, {after}) crops {} elements, more than it has",
                        cropped[axis],
                        cut_before + cut_after
                    ),
                }));
            }
            ranges[axis].0 = Dim::constant(cut_before);
            cropped[axis] = kept;
            grow[axis] = (Dim::constant(before.max(0)), Dim::constant(after.max(0)));
        }
        let (scalar, _) = value.to_operand();
        let value = scalar.cast(self.dtype());
        let mut res = shrink(self, ranges, Shape::new(cropped));
        for (axis, &(before, after)) in grow.iter().enumerate() {
            if before.as_const() != Some(0) || after.as_const() != Some(0) {
                res = pad_axis(&res, axis, before, after, value);
            }
        }
        debug_assert_eq!(res.shape(), &out);
        Ok(res)
    }

    /// `length` elements of `axis` from `start` (negative counts from the end), as
    /// `Tensor.narrow`.
    pub fn narrow(&self, axis: i64, start: i64, length: i64) -> Result<Tensor> {
        let out = rules::narrow(self.shape(), axis, start, length)?;
        let a = rules::normalize_axis("narrow", axis, self.shape())?;
        let begin = if start < 0 {
            self.shape()[a] + start
        } else {
            Dim::constant(start)
        };
        Ok(shrink_axis(self, a, begin, 1, out))
    }

    /// `t[start:stop:step]` along `axis`, with Python's rules: `None` is the start (or end) of
    /// the axis, negative indices count from the end, indices past either end are clamped,
    /// and `step` must be positive (use [`Tensor::flip`] to reverse).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec((0..10).collect::<Vec<i64>>(), [10])?;
    /// assert_eq!(t.slice(0, Some(-7), None, 3)?.to_vec::<i64>()?, vec![3, 6, 9]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn slice(
        &self,
        axis: i64,
        start: Option<i64>,
        stop: Option<i64>,
        step: i64,
    ) -> Result<Tensor> {
        let out = rules::slice(self.shape(), axis, start, stop, step)?;
        let a = rules::normalize_axis("slice", axis, self.shape())?;
        let d = self.shape()[a];
        // The same clamping as the shape rule.
        let begin = start.map_or(Dim::constant(0), |i| {
            if i < 0 { (d + i).max(0) } else { d.min(i) }
        });
        Ok(shrink_axis(self, a, begin, step, out))
    }

    /// The tensor with the listed axes reversed (`Tensor.flip`).
    pub fn flip(&self, axes: &[i64]) -> Result<Tensor> {
        let out = rules::flip(self.shape(), axes)?;
        if self.ndim() == 0 || axes.is_empty() {
            return Ok(self.clone());
        }
        let mut axes = rules::normalize_axes("flip", axes, self.shape())?;
        axes.sort_unstable();
        Ok(self.record(Op::Flip(self.node(), axes.into()), self.dtype(), out))
    }

    // === Joining and splitting ===

    /// The tensors joined along `axis` (`torch.cat`). Dtypes promote like `torch.cat`; every
    /// dim but `axis` must match, and 1-d tensors of shape `[0]` are skipped as in `PyTorch`.
    /// Values are selected, never summed, so `-0.0` and NaN payloads survive; the result is
    /// one fused kernel.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::from_vec(vec![1i32, 2], [1, 2])?;
    /// let b = Tensor::from_vec(vec![0.5f32, -0.0], [1, 2])?;
    /// let c = Tensor::cat(&[&a, &b], 0)?;
    /// assert_eq!(c.dtype(), DType::F32);
    /// assert_eq!(c.to_vec::<f32>()?, vec![1.0, 2.0, 0.5, -0.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn cat(tensors: &[&Tensor], axis: i64) -> Result<Tensor> {
        const OP: &str = "cat";
        let shapes: Vec<&Shape> = tensors.iter().map(|t| t.shape()).collect();
        let out = rules::cat(&shapes, axis)?;
        let first = tensors[0];
        let mut dtype = first.dtype();
        for t in &tensors[1..] {
            first.same_device(t, OP)?;
            dtype = dtype
                .promote(t.dtype())
                .map_err(|source| Error::Promotion { op: OP, source })?;
        }
        let legacy = |t: &Tensor| t.ndim() == 1 && t.shape()[0].as_const() == Some(0);
        let Some(reference) = tensors.iter().find(|t| !legacy(t)) else {
            return Ok(first.cast_to(dtype));
        };
        let a = rules::normalize_axis(OP, axis, reference.shape())?;
        let parts: Vec<Tensor> = tensors
            .iter()
            .filter(|t| !legacy(t) && t.shape()[a].as_const() != Some(0))
            .map(|t| t.cast_to(dtype))
            .collect();
        let (last, init) = match parts.as_slice() {
            [] => {
                return Ok(Tensor::record_on(
                    first.device(),
                    Op::Const(Scalar::zero(dtype)),
                    dtype,
                    out,
                ));
            }
            [only] => return Ok(only.clone()),
            [init @ .., last] => (last, init),
        };
        // Each part padded to the full length at its offset; an index along the axis picks
        // the part whose range holds it.
        let total = out[a];
        let index = Tensor::record_on(first.device(), Op::Index(a), DType::I64, out.clone());
        let pad_at = |p: &Tensor, offset: Dim| {
            pad_axis(
                p,
                a,
                offset,
                total - offset - p.shape()[a],
                Scalar::zero(dtype),
            )
        };
        // Each earlier part with the offset where the next one starts.
        let mut padded = Vec::with_capacity(init.len());
        let mut offset = Dim::constant(0);
        for p in init {
            let padded_part = pad_at(p, offset);
            offset += p.shape()[a];
            padded.push((padded_part, offset));
        }
        let mut res = pad_at(last, offset);
        for (p, end) in padded.iter().rev() {
            // A symbolic offset (a KV cache's length) has no constant to compare the index
            // with: `true` over the first `end` positions, padded with `false`.
            let mask = if let Some(end) = end.as_const() {
                let bound = index.full_like_scalar(Scalar::I64(end), DType::I64);
                index.binary_aligned(&bound, BinaryOp::Lt, OP, "")?
            } else {
                let mut dims = out.dims().to_vec();
                dims[a] = *end;
                let head = Tensor::record_on(
                    first.device(),
                    Op::Const(Scalar::Bool(true)),
                    DType::Bool,
                    Shape::new(dims),
                );
                pad_axis(
                    &head,
                    a,
                    Dim::constant(0),
                    total - *end,
                    Scalar::Bool(false),
                )
            };
            res = mask.record_with(
                &[p, &res],
                Op::Ternary(TernaryOp::Where, mask.node(), p.node(), res.node()),
                dtype,
                out.clone(),
            );
        }
        Ok(res)
    }

    /// Equal-shaped tensors joined along a new axis at `axis`, in `-ndim-1..=ndim`
    /// (`torch.stack`); dtypes promote as in [`Tensor::cat`].
    pub fn stack(tensors: &[&Tensor], axis: i64) -> Result<Tensor> {
        let shapes: Vec<&Shape> = tensors.iter().map(|t| t.shape()).collect();
        rules::stack(&shapes, axis)?;
        let parts = tensors
            .iter()
            .map(|t| t.unsqueeze(axis))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        Tensor::cat(&refs, axis)
    }

    /// Pieces of `size` elements along `axis`, the last one smaller if `size` doesn't divide
    /// the dim (`torch.split` with an int). Every piece is a view.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec((0..5).collect::<Vec<i32>>(), [5])?;
    /// let parts = t.split(2, 0)?;
    /// assert_eq!(parts.len(), 3);
    /// assert_eq!(parts[2].to_vec::<i32>()?, vec![4]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn split(&self, size: usize, axis: i64) -> Result<Vec<Tensor>> {
        let sizes = rules::split(self.shape(), axis, size)?;
        pieces(self, "split", axis, &sizes)
    }

    /// Pieces with the listed sizes along `axis`, which must add up to the dim
    /// (`torch.split` with a list).
    pub fn split_sizes(&self, sizes: &[usize], axis: i64) -> Result<Vec<Tensor>> {
        let sizes = rules::split_sizes(self.shape(), axis, sizes)?;
        pieces(self, "split", axis, &sizes)
    }

    /// At most `chunks` pieces of `ceil(dim / chunks)` elements along `axis`, the last one
    /// smaller (`torch.chunk`; there may be fewer than `chunks`).
    pub fn chunk(&self, chunks: usize, axis: i64) -> Result<Vec<Tensor>> {
        let sizes = rules::chunk(self.shape(), axis, chunks)?;
        pieces(self, "chunk", axis, &sizes)
    }

    /// The tensor tiled `repeats[i]` times along each dim (`Tensor.repeat`); extra leading
    /// repeats add dims. Built from reshape, expand and reshape, so it stays a view.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2], [2])?;
    /// assert_eq!(t.repeat(&[2, 2])?.to_vec::<i32>()?, vec![1, 2, 1, 2, 1, 2, 1, 2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn repeat(&self, repeats: &[usize]) -> Result<Tensor> {
        let out = rules::repeat(self.shape(), repeats)?;
        let lead = repeats.len().saturating_sub(self.ndim());
        check_scaled(
            "repeat",
            self.shape(),
            repeats.iter().enumerate().map(|(i, &r)| {
                let d = if i < lead {
                    Dim::constant(1)
                } else {
                    self.shape()[i - lead]
                };
                (d, r)
            }),
        )?;
        check_numel("repeat", self.shape(), &out)?;
        let lead = repeats.len() - self.ndim();
        // [d0, d1] -> [1, d0, 1, d1] -> [r0, d0, r1, d1] -> [r0 * d0, r1 * d1].
        let mut split = Vec::with_capacity(2 * repeats.len());
        let mut tiled = Vec::with_capacity(2 * repeats.len());
        for (i, &r) in repeats.iter().enumerate() {
            let d = if i < lead {
                Dim::constant(1)
            } else {
                self.shape()[i - lead]
            };
            split.extend([Dim::constant(1), d]);
            tiled.extend([Dim::from(r), d]);
        }
        let tiled = self
            .reshape_to(Shape::new(split))
            .broadcast_to_shape(&Shape::new(tiled));
        Ok(tiled.reshape_to(out))
    }

    /// Each element repeated `repeats` times in place along `dim`
    /// (`torch.repeat_interleave(x, repeats, dim)` with an int): `[a, b]` becomes
    /// `[a, a, b, b]`. A view (unsqueeze, expand, reshape), so it fuses into its reader;
    /// grouped-query attention's `repeat_kv` is this on the head dim.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2])?;
    /// assert_eq!(t.repeat_interleave(2, 0)?.to_vec::<i32>()?, vec![1, 2, 1, 2, 3, 4, 3, 4]);
    /// assert_eq!(t.repeat_interleave(3, -1)?.dims(), vec![2, 6]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn repeat_interleave(&self, repeats: usize, dim: i64) -> Result<Tensor> {
        const OP: &str = "repeat_interleave";
        let a = rules::normalize_axis(OP, dim, self.shape())?;
        let dims = self.shape().dims();
        let mut split = dims.to_vec();
        split.insert(a + 1, Dim::constant(1));
        let mut tiled = split.clone();
        tiled[a + 1] = Dim::from(repeats);
        check_scaled(OP, self.shape(), std::iter::once((dims[a], repeats)))?;
        let mut out = dims.to_vec();
        out[a] = dims[a] * Dim::from(repeats);
        let out = Shape::new(out);
        check_numel(OP, self.shape(), &out)?;
        let tiled = self
            .reshape_to(Shape::new(split))
            .broadcast_to_shape(&Shape::new(tiled));
        Ok(tiled.reshape_to(out))
    }
}

// === Helpers ===

/// Fails if a result shape of `op` on `input` would hold more than `i64::MAX` elements
/// (possible with huge expand, pad or repeat sizes), which no index could address.
fn check_numel(op: &'static str, input: &Shape, out: &Shape) -> Result<()> {
    let fits = out.iter().try_fold(1i64, |acc, d| {
        d.as_const().map_or(Some(acc), |c| acc.checked_mul(c))
    });
    if fits.is_some() {
        return Ok(());
    }
    Err(Error::Shape(ShapeError::InvalidArgument {
        op,
        shape: input.clone(),
        reason: format!("the result {out} would have more than i64::MAX elements"),
    }))
}

/// Fails if a size `d × r` (constant `d`) would exceed `i64::MAX`: computed in `Dim`
/// arithmetic it would wrap to a wrong (even negative) size, which [`check_numel`] cannot
/// see once a zero elsewhere makes the product 0.
pub(super) fn check_scaled(
    op: &'static str,
    input: &Shape,
    sizes: impl Iterator<Item = (Dim, usize)>,
) -> Result<()> {
    for (d, r) in sizes {
        let Some(d) = d.as_const() else { continue };
        let fits = i64::try_from(r)
            .ok()
            .and_then(|r| d.checked_mul(r))
            .is_some();
        if !fits {
            return Err(Error::Shape(ShapeError::InvalidArgument {
                op,
                shape: input.clone(),
                reason: format!("a size of {d} × {r} exceeds i64::MAX elements"),
            }));
        }
    }
    Ok(())
}

/// `x` permuted by the normalized `perm`, whose result shape is `out`.
fn permute_to(x: &Tensor, perm: Vec<usize>, out: Shape) -> Tensor {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return x.clone();
    }
    x.record(Op::Permute(x.node(), perm.into()), x.dtype(), out)
}

/// Elements `start, start + step, ...` of every axis (`ranges[axis] = (start, step)`), `out`
/// giving how many.
pub(crate) fn shrink(x: &Tensor, ranges: Vec<(Dim, Dim)>, out: Shape) -> Tensor {
    if &out == x.shape() && ranges.iter().all(|&(s, _)| s.as_const() == Some(0)) {
        return x.clone();
    }
    x.record(Op::Shrink(x.node(), ranges.into()), x.dtype(), out)
}

/// [`shrink`] along one axis.
fn shrink_axis(x: &Tensor, axis: usize, start: Dim, step: i64, out: Shape) -> Tensor {
    let mut ranges = vec![(Dim::constant(0), Dim::constant(1)); x.ndim()];
    ranges[axis] = (start, Dim::constant(step));
    shrink(x, ranges, out)
}

/// `x` padded by `before` and `after` elements of `value` along `axis`.
///
/// The last axis is padded in place. Any other axis is padded on the 2-d view
/// `[outer, axis * inner]` of `x`, along that view's last axis: the result is the same, but
/// the kernel's validity mask then tests the very index expression the guarded load uses.
/// (Padding an outer axis of the N-d shape directly lets the load index simplify to a form
/// the IR verifier cannot bound by the mask, and the kernel fails verification.)
pub(crate) fn pad_axis(x: &Tensor, axis: usize, before: Dim, after: Dim, value: Scalar) -> Tensor {
    let dims = x.shape().dims();
    let d = dims[axis];
    let mut out = dims.to_vec();
    out[axis] = d + before + after;
    if axis + 1 == dims.len() {
        let mut pads = vec![(Dim::constant(0), Dim::constant(0)); dims.len()];
        pads[axis] = (before, after);
        return x.record(
            Op::Pad(x.node(), pads.into(), value),
            x.dtype(),
            Shape::new(out),
        );
    }
    let outer: Dim = dims[..axis].iter().copied().product();
    let inner: Dim = dims[axis + 1..].iter().copied().product();
    let flat = x.reshape_to(Shape::new(vec![outer, d * inner]));
    let padded_len = (d + before + after) * inner;
    let pads: Box<[(Dim, Dim)]> = Box::new([
        (Dim::constant(0), Dim::constant(0)),
        (before * inner, after * inner),
    ]);
    let padded = flat.record(
        Op::Pad(flat.node(), pads, value),
        x.dtype(),
        Shape::new(vec![outer, padded_len]),
    );
    padded.reshape_to(Shape::new(out))
}

/// Consecutive pieces of `sizes` along `axis`.
fn pieces(x: &Tensor, op: &'static str, axis: i64, sizes: &[Dim]) -> Result<Vec<Tensor>> {
    let a = rules::normalize_axis(op, axis, x.shape())?;
    let mut start = Dim::constant(0);
    let mut out = Vec::with_capacity(sizes.len());
    for &len in sizes {
        let mut dims = x.shape().clone().into_dims();
        dims[a] = len;
        out.push(shrink_axis(x, a, start, 1, Shape::new(dims)));
        start += len;
    }
    Ok(out)
}
