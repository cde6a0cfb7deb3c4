//! Non-constant padding modes (`F.pad(mode="reflect" | "replicate" | "circular")`), plus
//! [`Tensor::roll`] and [`Tensor::diagonal`], all composed from movement ops: every padded
//! strip is a `narrow` of the input (flipped for reflect, expanded for replicate), joined
//! to it with [`Tensor::cat`], so the result folds into whatever kernel reads it. Constant
//! padding is [`Tensor::pad`].
//!
//! `pads` follow [`Tensor::pad`]: `pads[k] = (before, after)` for the last `pads.len()`
//! dims in natural order. Negative pads crop first; the positive pads then read from the
//! cropped tensor (as PyTorch's circular mode does).

use tessel_shape::{Shape, ShapeError, rules};

use super::indexing::{concrete, i64_of, invalid, usize_of};

use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

/// Which non-constant mode a pad uses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Reflect,
    Replicate,
    Circular,
}

impl Mode {
    const fn name(self) -> &'static str {
        match self {
            Mode::Reflect => "pad_reflect",
            Mode::Replicate => "pad_replicate",
            Mode::Circular => "pad_circular",
        }
    }
}

impl Tensor {
    /// Reflection padding (`F.pad(x, .., mode="reflect")`): the strip before dim `d` is
    /// `x[b], x[b-1], .., x[1]` (the edge element is not repeated). Each positive pad must
    /// be smaller than its (cropped) dim, as in `PyTorch`. Pads any number of trailing
    /// dims (`PyTorch` limits this to 3).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2, 3, 4], [1, 4])?;
    /// assert_eq!(t.pad_reflect(&[(2, 1)])?.to_vec::<i32>()?, vec![3, 2, 1, 2, 3, 4, 3]);
    /// assert!(t.pad_reflect(&[(4, 0)]).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn pad_reflect(&self, pads: &[(i64, i64)]) -> Result<Tensor> {
        pad_with(self, pads, Mode::Reflect)
    }

    /// Replication padding (`F.pad(x, .., mode="replicate")`): the edge element repeated.
    /// A dim padded this way must not be empty.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2, 3], [3])?;
    /// assert_eq!(t.pad_replicate(&[(2, 1)])?.to_vec::<i32>()?, vec![1, 1, 1, 2, 3, 3]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn pad_replicate(&self, pads: &[(i64, i64)]) -> Result<Tensor> {
        pad_with(self, pads, Mode::Replicate)
    }

    /// Circular padding (`F.pad(x, .., mode="circular")`): the dim wrapped around, so the
    /// strip before it is its end and the strip after it its start. A pad may not exceed
    /// its (cropped) dim, as in `PyTorch` (it would wrap more than once).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2, 3], [3])?;
    /// assert_eq!(t.pad_circular(&[(2, 1)])?.to_vec::<i32>()?, vec![2, 3, 1, 2, 3, 1]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn pad_circular(&self, pads: &[(i64, i64)]) -> Result<Tensor> {
        pad_with(self, pads, Mode::Circular)
    }
}

impl Tensor {
    /// The diagonal `offset` (above the main one if positive) of the matrices in dims
    /// `dim1` and `dim2` (`torch.diagonal`), as a view: those dims are removed and the
    /// diagonal appended as the last dim.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec((0..6).collect::<Vec<i32>>(), [2, 3])?;
    /// assert_eq!(t.diagonal(0, 0, 1)?.to_vec::<i32>()?, vec![0, 4]);
    /// assert_eq!(t.diagonal(1, 0, 1)?.to_vec::<i32>()?, vec![1, 5]);
    /// assert_eq!(t.diagonal(-1, 0, 1)?.to_vec::<i32>()?, vec![3]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn diagonal(&self, offset: i64, dim1: i64, dim2: i64) -> Result<Tensor> {
        const OP: &str = "diagonal";
        let a1 = rules::normalize_axis(OP, dim1, self.shape())?;
        let a2 = rules::normalize_axis(OP, dim2, self.shape())?;
        if a1 == a2 {
            return Err(invalid(
                OP,
                format!(
                    "dim1 and dim2 are both dim {a1} of {}; give two different dims",
                    self.shape()
                ),
            ));
        }
        let dims = concrete(OP, self)?;
        let mut perm: Vec<i64> = (0..dims.len())
            .filter(|&d| d != a1 && d != a2)
            .map(i64_of)
            .collect();
        let mut batch: Vec<i64> = perm.iter().map(|&d| i64_of(dims[usize_of(d)])).collect();
        perm.extend([i64_of(a1), i64_of(a2)]);
        let x = self.permute(&perm)?;
        let (rows, cols) = (i64_of(dims[a1]), i64_of(dims[a2]));
        let (r0, c0) = (
            0i64.max(offset.saturating_neg()).min(rows),
            offset.max(0).min(cols),
        );
        let len = (rows - r0).min(cols - c0).max(0);
        let square = x.narrow(-2, r0, len)?.narrow(-1, c0, len)?;
        let flat = square.flatten(-2, -1)?;
        if len == 0 {
            return Ok(flat);
        }
        // Rows of `len + 1` over the flattened square (padded by `len`) start with its
        // diagonal elements.
        let mut wide = batch.clone();
        wide.extend([len, len + 1]);
        let diag = flat.pad(&[(0, len)], 0)?.reshape(&wide)?.narrow(-1, 0, 1)?;
        batch.push(len);
        diag.reshape(&batch)
    }

    /// The tensor rotated by `shifts[k]` along `dims[k]` (`torch.roll`); with `dims`
    /// empty, the flattened tensor is rolled by the single shift and reshaped back.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec((0..5).collect::<Vec<i32>>(), [5])?;
    /// assert_eq!(t.roll(&[2], &[0])?.to_vec::<i32>()?, vec![3, 4, 0, 1, 2]);
    /// assert_eq!(t.roll(&[-1], &[])?.to_vec::<i32>()?, vec![1, 2, 3, 4, 0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn roll(&self, shifts: &[i64], dims: &[i64]) -> Result<Tensor> {
        const OP: &str = "roll";
        if dims.is_empty() {
            if shifts.len() != 1 {
                return Err(invalid(
                    OP,
                    format!(
                        "without dims, exactly one shift is needed, got {shifts:?}; give one dim per shift"
                    ),
                ));
            }
            let flat = self.reshape_to(Shape::new(vec![self.shape().numel()]));
            return Ok(flat.roll(shifts, &[0])?.reshape_to(self.shape().clone()));
        }
        if shifts.len() != dims.len() {
            return Err(invalid(
                OP,
                format!(
                    "{} shifts for {} dims; give one shift per dim",
                    shifts.len(),
                    dims.len()
                ),
            ));
        }
        let sizes = concrete(OP, self)?;
        let mut res = self.clone();
        for (&shift, &dim) in shifts.iter().zip(dims) {
            let axis = rules::normalize_axis(OP, dim, self.shape())?;
            let n = i64_of(sizes[axis]);
            if n == 0 || shift.rem_euclid(n) == 0 {
                continue;
            }
            let s = shift.rem_euclid(n);
            let ax = i64_of(axis);
            let (tail, head) = (res.narrow(ax, n - s, s)?, res.narrow(ax, 0, n - s)?);
            res = Tensor::cat(&[&tail, &head], ax)?;
        }
        Ok(res)
    }
}

fn pad_error(x: &Tensor, op: &'static str, reason: String) -> Error {
    Error::Shape(ShapeError::InvalidArgument {
        op,
        shape: x.shape().clone(),
        reason,
    })
}

fn pad_with(x: &Tensor, pads: &[(i64, i64)], mode: Mode) -> Result<Tensor> {
    let op = mode.name();
    if pads.len() > x.ndim() {
        return Err(pad_error(
            x,
            op,
            format!(
                "{} (before, after) pairs given for a {}-d tensor; give at most one per dim",
                pads.len(),
                x.ndim()
            ),
        ));
    }
    // Crop with the constant pad (negative entries only), which checks the crop fits.
    let crops: Vec<(i64, i64)> = pads.iter().map(|&(b, a)| (b.min(0), a.min(0))).collect();
    let mut res = x.pad(&crops, 0)?;
    let first = x.ndim() - pads.len();
    for (k, &(before, after)) in pads.iter().enumerate() {
        let (before, after) = (before.max(0), after.max(0));
        if before == 0 && after == 0 {
            continue;
        }
        let axis = first + k;
        let n = res.shape()[axis].as_const().ok_or_else(|| {
            pad_error(
                x,
                op,
                format!("dim {axis} is symbolic; {op} needs known sizes"),
            )
        })?;
        let ax = i64::try_from(axis).map_err(|e| Error::Internal(e.to_string()))?;
        let fits = match mode {
            Mode::Reflect => before < n && after < n,
            Mode::Replicate => n > 0,
            Mode::Circular => before <= n && after <= n,
        };
        if !fits {
            let rule = match mode {
                Mode::Reflect => "reflect padding must be smaller than the dim it pads",
                Mode::Replicate => "replicate padding needs a non-empty dim",
                Mode::Circular => "circular padding may not exceed the dim it pads",
            };
            return Err(pad_error(
                x,
                op,
                format!(
                    "padding dim {axis} (size {n} after cropping) by ({before}, {after}): {rule}; use smaller pads or constant padding with pad()"
                ),
            ));
        }
        let (lead, tail) = match mode {
            Mode::Reflect => (
                res.narrow(ax, 1, before)?.flip(&[ax])?,
                res.narrow(ax, n - 1 - after, after)?.flip(&[ax])?,
            ),
            Mode::Replicate => {
                let edge = |start: i64, len: i64| -> Result<Tensor> {
                    if len == 0 {
                        return res.narrow(ax, 0, 0);
                    }
                    let mut sizes: Vec<i64> = vec![-1; res.ndim()];
                    sizes[axis] = len;
                    res.narrow(ax, start, 1)?.expand(&sizes)
                };
                (edge(0, before)?, edge(n - 1, after)?)
            }
            Mode::Circular => (
                res.narrow(ax, n - before, before)?,
                res.narrow(ax, 0, after)?,
            ),
        };
        res = Tensor::cat(&[&lead, &res, &tail], ax)?;
    }
    Ok(res)
}
