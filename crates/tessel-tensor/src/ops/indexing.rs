//! Indexing ops: reads at positions held in index tensors (the writes are in `scatter.rs`),
//! and checked indexing.
//!
//! A read is an [`Op::Gather`]: a load whose address is another buffer's value, fused into
//! its consumers like any load (an embedding lookup, the positions added and the first
//! layer norm take at most two kernels, with no gathered intermediate in memory). A write
//! with a sum is an [`Op::ScatterAdd`]: a kernel over the sources adding each value
//! atomically into a buffer the launch zeroes (repeated indices add up, in no fixed
//! order). The gradient of a gather is a scatter-add (or, for
//! one read per row, as cross-entropy's target logit, the comparison with the position,
//! fused where it is consumed), and the gradient of a scatter-add is a gather.
//! `scatter` (last write wins) and `scatter_reduce` with `"prod"`, `"amax"` or `"amin"`
//! still select through a one-hot mask over the axis (`O(index × size)` work), as do
//! 64-bit scatter-adds on devices without 64-bit atomics (WGSL, OpenCL C).
//!
//! **Out-of-range indices.** `PyTorch` raises. Checking needs the index values, which are
//! lazy (possibly on a GPU), so by default nothing is checked and the behaviour is defined
//! instead: an index outside `0..n` for an axis of `n` (negative ones included: they are
//! **not** wrapped Python-style) reads `0` (`false` for `bool`) and a write from it is
//! dropped; each op's docs say what that means for it. Every generated load and atomic add
//! is clamped into its buffer, so no index reaches memory outside it.
//! **Checked mode** ([`Tensor::set_checked_indexing`], or `TESSEL_CHECK_INDICES=1`) turns
//! that into an error without a round trip per op: each index op records a check that runs
//! on the device with the rest of the work, and the next read to the host on that thread
//! (`to_vec`, `item`, ...) or [`crate::Device::synchronize`] reads every pending check in
//! one transfer and returns `Err(Error::InvalidArgument)` naming the op, the first bad
//! index, its position and the valid range (as CUDA reports device-side asserts at the next
//! synchronization). [`Tensor::check_index_range`] checks at once, synchronizing.
//!
//! [`Tensor::masked_select`] and [`Tensor::nonzero`], whose result sizes depend on the
//! data, read one count back from the device (synchronizing, as `PyTorch` does).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use tessel_graph::{Op, ReduceOp};
use tessel_shape::{BinaryOp, DType, Dim, Shape, ShapeError, rules};

use crate::ops::ScalarOperand;
use crate::tensor::Tensor;
use tessel_runtime::Device;
use tessel_runtime::{Error, Result};

const INDEX_HINT: &str = "index tensors must be i32 or i64; cast with .cast(DType::I64)";

impl Tensor {
    /// Values along `dim` at the positions `index` holds (`torch.gather`):
    /// `out[i][j][k] = self[i][index[i][j][k]][k]` for `dim = 1`. `index` (i32 or i64) has
    /// `self`'s rank and is no larger than `self` in every other dim; the result has its
    /// shape and `self`'s dtype. An index outside `0..self.size(dim)` (a negative one
    /// included) reads `0` (`false` for `bool`), or is an error in checked mode (see
    /// [`Tensor::set_checked_indexing`]).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
    /// let i = Tensor::from_vec(vec![0i64, 0, 1, 0], [2, 2])?;
    /// assert_eq!(t.gather(1, &i)?.to_vec::<f32>()?, vec![1.0, 1.0, 4.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn gather(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        const OP: &str = "gather";
        check_index(OP, self, index)?;
        if self.ndim() == 0 && index.ndim() == 0 {
            let one = Shape::new(vec![Dim::constant(1)]);
            let out = self
                .reshape_to(one.clone())
                .gather(0, &index.reshape_to(one))?;
            return Ok(out.reshape_to(Shape::new(Vec::new())));
        }
        if index.ndim() != self.ndim() {
            return Err(invalid(
                OP,
                format!(
                    "index {} must have the rank of the input {}; unsqueeze or reshape it",
                    index.shape(),
                    self.shape()
                ),
            ));
        }
        let axis = rules::normalize_axis(OP, dim, self.shape())?;
        check_range(OP, index, self.shape()[axis])?;
        let mut src = self.clone();
        for d in (0..self.ndim()).filter(|&d| d != axis) {
            let (sd, id) = (self.shape()[d], index.shape()[d]);
            if sd == id {
                // Symbolic sizes (a dynamic batch) agree by name.
                continue;
            }
            let (Some(sd), Some(id)) = (sd.as_const(), id.as_const()) else {
                return Err(invalid(
                    OP,
                    format!(
                        "index {} and input {} differ in dim {d}, which is symbolic; they must agree there",
                        index.shape(),
                        self.shape()
                    ),
                ));
            };
            if id > sd {
                return Err(invalid(
                    OP,
                    format!(
                        "index {} is larger than the input {} in dim {d}; index.size(d) <= input.size(d) is needed for every d != dim",
                        index.shape(),
                        self.shape()
                    ),
                ));
            }
            src = src.narrow(i64_of(d), 0, id)?;
        }
        Ok(pick(&src, index, axis))
    }

    /// [`Tensor::gather`] with broadcasting (`torch.take_along_dim`): `self` and `indices`
    /// broadcast in every dim but `dim`. With `dim = None` both are flattened first.
    /// Out-of-range indices as in [`Tensor::gather`].
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![10i32, 30, 20, 5, 7, 6], [2, 3])?;
    /// let best = t.argmax(1, true)?;
    /// assert_eq!(t.take_along_dim(&best, Some(1))?.to_vec::<i32>()?, vec![30, 7]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn take_along_dim(&self, indices: &Tensor, dim: Option<i64>) -> Result<Tensor> {
        const OP: &str = "take_along_dim";
        check_index(OP, self, indices)?;
        let Some(dim) = dim else {
            check_range(OP, indices, self.shape().numel())?;
            let flat = |t: &Tensor| t.reshape_to(Shape::new(vec![t.shape().numel()]));
            return flat(self).gather(0, &flat(indices));
        };
        if indices.ndim() != self.ndim() {
            return Err(invalid(
                OP,
                format!(
                    "indices {} must have the rank of the input {}",
                    indices.shape(),
                    self.shape()
                ),
            ));
        }
        let axis = rules::normalize_axis(OP, dim, self.shape())?;
        check_range(OP, indices, self.shape()[axis])?;
        let (sd, id) = (concrete(OP, self)?, concrete(OP, indices)?);
        let mut src_dims = Vec::with_capacity(sd.len());
        let mut idx_dims = Vec::with_capacity(sd.len());
        for d in 0..sd.len() {
            if d == axis {
                src_dims.push(i64_of(sd[d]));
                idx_dims.push(i64_of(id[d]));
            } else if sd[d] == id[d] || sd[d] == 1 || id[d] == 1 {
                let b = i64_of(sd[d].max(id[d]) * usize::from(sd[d] != 0 && id[d] != 0));
                src_dims.push(b);
                idx_dims.push(b);
            } else {
                return Err(invalid(
                    OP,
                    format!(
                        "input {} and indices {} do not broadcast in dim {d}",
                        self.shape(),
                        indices.shape()
                    ),
                ));
            }
        }
        Ok(pick(
            &self.expand(&src_dims)?,
            &indices.expand(&idx_dims)?,
            axis,
        ))
    }

    /// The slices of `dim` at the positions in the 1-d (or 0-d) `index`
    /// (`torch.index_select`); the result's `dim` has `index`'s length. A position outside
    /// `0..self.size(dim)` (a negative one included) gives a slice of `0` (`false` for
    /// `bool`), or is an error in checked mode (see [`Tensor::set_checked_indexing`]).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [3, 2])?;
    /// let i = Tensor::from_vec(vec![2i32, 0, 2], [3])?;
    /// assert_eq!(t.index_select(0, &i)?.to_vec::<i32>()?, vec![5, 6, 1, 2, 5, 6]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        index_select_impl("index_select", self, dim, index)
    }

    /// Rows of `weight` (`[num_embeddings, embedding_dim]`) at `indices`, as
    /// `F.embedding(indices, weight)`: the result has shape `indices.shape + [embedding_dim]`.
    /// An index outside `0..num_embeddings` (a negative one included) gives a row of
    /// zeros, or is an error in checked mode (see [`Tensor::set_checked_indexing`]).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let w = Tensor::from_vec(vec![0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5], [3, 2])?;
    /// let i = Tensor::from_vec(vec![2i64, 1], [1, 2])?;
    /// let e = Tensor::embedding(&w, &i)?;
    /// assert_eq!(e.dims(), vec![1, 2, 2]);
    /// assert_eq!(e.to_vec::<f32>()?, vec![2.0, 2.5, 1.0, 1.5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn embedding(weight: &Tensor, indices: &Tensor) -> Result<Tensor> {
        const OP: &str = "embedding";
        check_index(OP, weight, indices)?;
        if weight.ndim() != 2 {
            return Err(invalid(
                OP,
                format!(
                    "weight must be 2-d [num_embeddings, embedding_dim], got {}",
                    weight.shape()
                ),
            ));
        }
        let flat = indices.reshape_to(Shape::new(vec![indices.shape().numel()]));
        let rows = index_select_impl(OP, weight, 0, &flat)?;
        let mut dims = indices.shape().clone().into_dims();
        dims.push(weight.shape()[1]);
        Ok(rows.reshape_to(Shape::new(dims)))
    }

    /// `F.one_hot(self, num_classes)`: a trailing dim of `num_classes` with a 1 at each
    /// index, as `i64`. `self` holds i32 or i64 class indices; one outside
    /// `0..num_classes` (a negative one included) gives a row of zeros (`PyTorch` raises),
    /// or is an error in checked mode (see [`Tensor::set_checked_indexing`]).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let c = Tensor::from_vec(vec![2i64, 0], [2])?;
    /// assert_eq!(c.one_hot(3)?.to_vec::<i64>()?, vec![0, 0, 1, 1, 0, 0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn one_hot(&self, num_classes: usize) -> Result<Tensor> {
        const OP: &str = "one_hot";
        check_index(OP, self, self)?;
        let fits = i64::try_from(num_classes).ok().and_then(|c| {
            self.shape().iter().try_fold(c, |acc, d| {
                d.as_const().map_or(Some(acc), |d| acc.checked_mul(d))
            })
        });
        if fits.is_none() {
            return Err(invalid(
                OP,
                format!(
                    "{num_classes} classes for indices of shape {} exceed i64::MAX elements",
                    self.shape()
                ),
            ));
        }
        check_range(OP, self, Dim::from(num_classes))?;
        let mut dims = self.shape().clone().into_dims();
        dims.push(Dim::constant(1));
        let idx = self.reshape_to(Shape::new(dims.clone()));
        let last = dims.len() - 1;
        dims[last] = Dim::constant(i64_of(num_classes));
        let classes = Tensor::record_on(
            self.device(),
            Op::Index(last),
            self.dtype(),
            Shape::new(dims),
        );
        Ok(idx.eq(&classes)?.cast_to(DType::I64))
    }

    /// `value` where `mask` is true, else `self` (`Tensor.masked_fill`). `mask` is `bool`
    /// and broadcasts to `self`'s shape; `value` is converted to `self`'s dtype.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
    /// let m = Tensor::from_vec(vec![true, false], [2])?;
    /// let f = t.masked_fill(&m, f32::NEG_INFINITY)?;
    /// assert_eq!(f.to_vec::<f32>()?, vec![f32::NEG_INFINITY, 2.0, f32::NEG_INFINITY, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn masked_fill(&self, mask: &Tensor, value: impl ScalarOperand) -> Result<Tensor> {
        const OP: &str = "masked_fill";
        let mask = mask_to(OP, self, mask)?;
        let fill = self.full_like_scalar(value.to_operand().0, self.dtype());
        Ok(mask.raw_where(&fill, self))
    }

    /// The lower triangle of the last two dims (`torch.tril`): elements with
    /// `col - row <= k` kept, the rest zero. Batch dims are allowed.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2])?;
    /// assert_eq!(t.tril(0)?.to_vec::<i32>()?, vec![1, 0, 3, 4]);
    /// assert_eq!(t.triu(1)?.to_vec::<i32>()?, vec![0, 2, 0, 0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tril(&self, k: i64) -> Result<Tensor> {
        triangle(self, "tril", k, BinaryOp::Le)
    }

    /// The upper triangle of the last two dims (`torch.triu`): elements with
    /// `col - row >= k` kept, the rest zero.
    pub fn triu(&self, k: i64) -> Result<Tensor> {
        triangle(self, "triu", k, BinaryOp::Ge)
    }
}

/// [`Tensor::index_select`], reporting as `op`.
fn index_select_impl(op: &'static str, x: &Tensor, dim: i64, index: &Tensor) -> Result<Tensor> {
    check_index(op, x, index)?;
    if index.ndim() > 1 || x.ndim() == 0 {
        return Err(invalid(
            op,
            format!(
                "needs an input with at least one dim and a 1-d index, got input {} and index {}; flatten the index and reshape the result",
                x.shape(),
                index.shape()
            ),
        ));
    }
    let axis = rules::normalize_axis(op, dim, x.shape())?;
    check_range(op, index, x.shape()[axis])?;
    let mut out = x.shape().clone().into_dims();
    out[axis] = index.shape().numel();
    let mut along = vec![Dim::constant(1); x.ndim()];
    along[axis] = out[axis];
    let index = index
        .reshape_to(Shape::new(along))
        .broadcast_to_shape(&Shape::new(out));
    Ok(pick(x, &index, axis))
}

// === Checked mode ===

/// Whether [`Tensor::set_checked_indexing`] turned checking on.
static CHECKED: AtomicBool = AtomicBool::new(false);

/// Whether `TESSEL_CHECK_INDICES` asks for checking (`1`, `true`, `yes` or `on`), read once.
fn checked_by_env() -> bool {
    static ENV: OnceLock<bool> = OnceLock::new();
    *ENV.get_or_init(|| {
        std::env::var("TESSEL_CHECK_INDICES").is_ok_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
    })
}

impl Tensor {
    /// Turns checked indexing on or off for the whole process (it starts off unless the
    /// environment variable `TESSEL_CHECK_INDICES=1` is set, which keeps it on). When on,
    /// `gather`, `take_along_dim`, `index_select`, `embedding`, `one_hot`, `scatter`,
    /// `scatter_add`, `scatter_reduce` and `index_add` record a check of their indices that
    /// runs on the device with their work, without waiting for it; the next read to the
    /// host on the same thread (`to_vec`, `item`, ...) or `Device::synchronize` then
    /// returns an `Err` naming the first op whose indices were out of range, the index, its
    /// position and the valid range, instead of the unchecked behaviour each op documents.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0], [2])?;
    /// let i = Tensor::from_vec(vec![5i64], [1])?;
    /// // Unchecked (the default): an index that names no position reads 0.
    /// # if !Tensor::checked_indexing() {
    /// assert_eq!(t.index_select(0, &i)?.to_vec::<f32>()?, vec![0.0]);
    /// # }
    /// // The check on its own, whatever the mode.
    /// assert!(i.check_index_range(2, "index_select").is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_checked_indexing(on: bool) {
        CHECKED.store(on, Ordering::SeqCst);
    }

    /// Whether index ops check their indices: [`Tensor::set_checked_indexing`] turned it
    /// on, or `TESSEL_CHECK_INDICES=1` is set.
    #[must_use]
    pub fn checked_indexing() -> bool {
        CHECKED.load(Ordering::SeqCst) || checked_by_env()
    }

    /// Checks that every element of this index tensor (`i32` or `i64`) lies in
    /// `0..dim_size`, reporting for `op`. Realizes the tensor and reads it to the host,
    /// **synchronizing** with its device. The error names `op`, the first bad index in
    /// row-major order, its coordinates and the valid range; negative indices are errors
    /// too, as index ops do not wrap them.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let i = Tensor::from_vec(vec![0i32, 3, -1, 2], [2, 2])?;
    /// assert!(i.check_index_range(4, "gather").is_err());
    /// let e = i.check_index_range(4, "gather").unwrap_err().to_string();
    /// assert!(e.contains("-1") && e.contains("[1, 0]") && e.contains("0..4"), "{e}");
    /// assert!(i.abs()?.check_index_range(4, "gather").is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub fn check_index_range(&self, dim_size: usize, op: &'static str) -> Result<()> {
        if !matches!(self.dtype(), DType::I32 | DType::I64) {
            return Err(Error::UnsupportedDType {
                op,
                dtype: self.dtype(),
                hint: INDEX_HINT,
            });
        }
        let dims = concrete(op, self)?;
        if dims.contains(&0) {
            return Ok(());
        }
        let values = self.cast_to(DType::I64).to_vec::<i64>()?;
        let bound = i64_of(dim_size);
        let Some((flat, &bad)) = values
            .iter()
            .enumerate()
            .find(|&(_, &v)| !(0..bound).contains(&v))
        else {
            return Ok(());
        };
        let mut coords = vec![0usize; dims.len()];
        let mut rest = flat;
        for (c, &d) in coords.iter_mut().zip(&dims).rev() {
            *c = rest % d;
            rest /= d;
        }
        Err(invalid(
            op,
            format!(
                "index {bad} at position {coords:?} of the index tensor {} is out of range for a dim of size {dim_size}; valid indices are 0..{dim_size} (negative indices are not wrapped)",
                self.shape()
            ),
        ))
    }
}

/// In checked mode, records a device-side check of `index` against an axis of size `n`
/// (a symbolic size is left to the unchecked behaviour): see [`verify_pending_indices`].
/// Never fails; the `Result` keeps the callers' shape for checks that may.
#[allow(clippy::unnecessary_wraps)]
pub(super) fn check_range(op: &'static str, index: &Tensor, n: Dim) -> Result<()> {
    if let Some(n) = n.as_const()
        && Tensor::checked_indexing()
    {
        defer_check(op, index, usize_of(n));
    }
    Ok(())
}

/// A check recorded by an index op in checked mode: the first out-of-range position of
/// `index` (in row-major order), computed on the device with the rest of the work.
struct PendingCheck {
    op: &'static str,
    index: Tensor,
    size: usize,
    /// `[1]` `i64`: that position, or the index's element count when every index is in
    /// range.
    first_bad: Tensor,
}

/// More checks than this waiting on one thread are verified at once (a loop that never
/// reads anything back would otherwise keep every index tensor alive).
const MAX_PENDING_CHECKS: usize = 256;

thread_local! {
    /// Checks recorded on this thread and not verified yet.
    static PENDING: std::cell::RefCell<Vec<PendingCheck>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn defer_check(op: &'static str, index: &Tensor, size: usize) {
    let numel = index.shape().numel();
    let Some(count) = numel.as_const().filter(|&c| c > 0) else {
        return;
    };
    tessel_runtime::on_synchronize(verify_pending_indices);
    let flat = index.reshape_to(Shape::new(vec![numel]));
    let int = |v: i64| flat.full_like_scalar(tessel_shape::Scalar::I64(v), index.dtype());
    let outside = flat.raw_binary(BinaryOp::Lt, &int(0)).raw_binary(
        BinaryOp::Or,
        &flat.raw_binary(BinaryOp::Ge, &int(i64_of(size))),
    );
    let position = Tensor::record_on(
        index.device(),
        Op::Index(0),
        DType::I64,
        flat.shape().clone(),
    );
    let none = position.full_like_scalar(tessel_shape::Scalar::I64(count), DType::I64);
    let first_bad = reduce_axis(&outside.raw_where(&position, &none), ReduceOp::Min, 0);
    let full = PENDING.with(|p| {
        let mut p = p.borrow_mut();
        p.push(PendingCheck {
            op,
            index: index.clone(),
            size,
            first_bad,
        });
        p.len() >= MAX_PENDING_CHECKS
    });
    if full && let Err(e) = verify_pending_indices() {
        // Reported again by the next read: the check is kept for it.
        tracing::debug!("checked indexing: {e}");
    }
}

/// Verifies the checks index ops recorded on this thread in checked mode (see
/// [`Tensor::set_checked_indexing`]): their results are computed together and read back
/// in one transfer, and the first failing check becomes an `Err` naming its op, the bad
/// index, its position and the valid range. Every read to the host (`to_vec`, `item`, ...)
/// and [`crate::Device::synchronize`] runs it first.
pub(crate) fn verify_pending_indices() -> Result<()> {
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if pending.is_empty() {
        return Ok(());
    }
    // One read per device the checks ran on (almost always one).
    let mut devices: Vec<Device> = pending.iter().map(|c| c.index.device()).collect();
    devices.dedup();
    for device in devices {
        let here: Vec<&PendingCheck> = pending
            .iter()
            .filter(|c| c.index.device() == device)
            .collect();
        let firsts: Vec<&Tensor> = here.iter().map(|c| &c.first_bad).collect();
        let all = Tensor::cat(&firsts, 0)?.to_vec::<i64>()?;
        for (check, first) in here.iter().zip(all) {
            let count = check.index.shape().numel().as_const().map_or(0, usize_of);
            if usize::try_from(first).is_ok_and(|f| f < count) {
                // The message (value, coordinates, range) from the synchronizing check.
                return check.index.check_index_range(check.size, check.op);
            }
        }
    }
    Ok(())
}

// === Helpers ===

pub(super) fn invalid(op: &'static str, reason: String) -> Error {
    Error::InvalidArgument { op, reason }
}

pub(super) fn i64_of(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(super) fn usize_of(n: i64) -> usize {
    usize::try_from(n).unwrap_or(0)
}

/// Fails for float8 `x`: the index ops' kernels compare and combine values (the scatters'
/// ordered keys, out-of-range zeros), which float8, a storage type, does not do.
pub(super) fn no_float8(op: &'static str, x: &Tensor) -> Result<()> {
    if x.dtype().is_float8() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: x.dtype(),
            hint: "float8 is a storage type; cast first, e.g. .cast(DType::BF16), and back after",
        });
    }
    Ok(())
}

/// Checks `index` is an integer index tensor on `x`'s device (and `x` not float8).
pub(super) fn check_index(op: &'static str, x: &Tensor, index: &Tensor) -> Result<()> {
    x.same_device(index, op)?;
    no_float8(op, x)?;
    if matches!(index.dtype(), DType::I32 | DType::I64) {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op,
            dtype: index.dtype(),
            hint: INDEX_HINT,
        })
    }
}

/// The tensor's dims as numbers; index ops need them known.
pub(super) fn concrete(op: &'static str, x: &Tensor) -> Result<Vec<usize>> {
    x.check_size(op)?;
    x.shape().as_usizes().ok_or_else(|| {
        Error::Shape(ShapeError::InvalidArgument {
            op,
            shape: x.shape().clone(),
            reason: format!("{op} needs known sizes; bind the symbolic dims first"),
        })
    })
}

/// Checks that `mask` is a bool tensor on `x`'s device.
pub(super) fn check_mask(op: &'static str, x: &Tensor, mask: &Tensor) -> Result<()> {
    x.same_device(mask, op)?;
    if mask.dtype() != DType::Bool {
        return Err(invalid(
            op,
            format!(
                "the mask must be bool, got {}; compare it first, e.g. mask.ne(0)",
                mask.dtype()
            ),
        ));
    }
    Ok(())
}

/// `mask` (bool) broadcast to `x`'s shape, which must not grow.
pub(super) fn mask_to(op: &'static str, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    check_mask(op, x, mask)?;
    let shape = rules::broadcast(op, x.shape(), mask.shape())?;
    if &shape != x.shape() {
        return Err(invalid(
            op,
            format!(
                "mask {} must broadcast to the input {} (it would make {shape})",
                mask.shape(),
                x.shape()
            ),
        ));
    }
    Ok(mask.broadcast_to_shape(&shape))
}

/// `op` over `axis` in `x`'s own dtype, the axis kept as size 1.
pub(super) fn reduce_axis(x: &Tensor, op: ReduceOp, axis: usize) -> Tensor {
    let mut kept = x.shape().clone().into_dims();
    kept[axis] = Dim::constant(1);
    let kept = Shape::new(kept);
    if x.shape().iter().any(|d| d.as_const() == Some(0)) {
        // No kernel needs to read an empty input; every output is the identity.
        return x.record(Op::Const(op.identity(x.dtype())), x.dtype(), kept);
    }
    x.record(Op::Reduce(op, x.node(), Box::new([axis])), x.dtype(), kept)
}

/// `out = src[.., index[.., i, ..], ..]` along `axis`, where `src` and `index` agree in
/// every other dim: one [`Op::Gather`], a load whose address is the index's value.
pub(super) fn pick(src: &Tensor, index: &Tensor, axis: usize) -> Tensor {
    src.record(
        Op::Gather(src.node(), index.node(), axis),
        src.dtype(),
        index.shape().clone(),
    )
}

fn triangle(x: &Tensor, op: &'static str, k: i64, keep: BinaryOp) -> Result<Tensor> {
    if x.ndim() < 2 {
        return Err(Error::Shape(ShapeError::RankMismatch {
            op,
            shape: x.shape().clone(),
            expected: "at least 2 (the last two dims are the matrix)".to_owned(),
        }));
    }
    let n = x.ndim();
    // At most (dynamic dims at their upper bounds).
    let (rows, cols) = (x.shape()[n - 2].bounds().hi, x.shape()[n - 1].bounds().hi);
    // `col - row` lies in `-(rows - 1)..cols`, so `k` clamped to `-rows..=cols` keeps the
    // same elements; in i32 when that fits, for devices without 64-bit integers.
    let (dtype, k) = if rows < i64::from(i32::MAX) && cols < i64::from(i32::MAX) {
        (DType::I32, k.clamp(-rows, cols))
    } else {
        (DType::I64, k)
    };
    let at = |axis| x.record(Op::Index(axis), dtype, x.shape().clone());
    let diff = at(n - 1).raw_binary(BinaryOp::Sub, &at(n - 2));
    let bound = diff.full_like_scalar(tessel_shape::Scalar::I64(k), dtype);
    let kept = diff.raw_binary(keep, &bound);
    // The triangle of an all-true mask (a causal mask) is the comparison itself.
    if x.constant_value() == Some(tessel_shape::Scalar::Bool(true)) {
        return Ok(kept);
    }
    let zero = x.full_like_scalar(tessel_shape::Scalar::zero(x.dtype()), x.dtype());
    Ok(kept.raw_where(x, &zero))
}
