//! Sorting and selection: `sort`, `argsort`, `topk`, `kthvalue`, `median`, `searchsorted`
//! and `unique`.
//!
//! Sorting runs on every backend, in three forms:
//!
//! * **In local memory** (rows of up to [`ARGSORT_ROW_MAX`] = 1024 elements): an
//!   [`Op::Argsort`] of the elements' [`order_key`]s, one workgroup per row running a
//!   bitonic network over (key, position) pairs in local memory, gives the stable order;
//!   the values are gathered by it. `n·log2²(n)` work per row in one kernel.
//! * **By radix** (longer rows): a least-significant-digit radix sort of the order keys,
//!   8 bits per pass (4 passes for dtypes of 32 bits or fewer, 8 for the 64-bit ones).
//!   Each pass sorts blocks of 1024 by the digit in local memory (an [`Op::Argsort`]),
//!   counts each block's digits, and moves every (key, position) pair to the destination
//!   that a prefix sum of the counts gives: `O(n)` work per pass, a few kernels each.
//! * **Bitonic network** (longer rows whose batch dims are symbolic). The row is padded to
//!   a power of two `m` with a sentinel that sorts last, each element carries its position,
//!   and `log2(m)·(log2(m) + 1) / 2` compare-exchange stages, each a reshape/flip view of
//!   the previous one and a `where`, sort it; the position breaks ties. `m·log2²(m)` work;
//!   the kernelizer materializes every second stage, so about one kernel per stage.
//!
//! `topk`, `kthvalue` and `median` of rows longer than 1024 (dtypes of 32 bits or fewer)
//! select by radix instead of sorting: an order-preserving 32-bit key per element, four
//! byte-wise histogram passes that locate the wanted key, `O(n)` per row.
//!
//! All are stable; `-0.0` and `+0.0` compare equal (they keep their order), and NaN sorts
//! after everything ascending and before everything descending, as in `PyTorch`.
//!
//! `unique` sorts on the device and reads back only its number of values.

use tessel_graph::{ARGSORT_ROW_MAX, Op};
use tessel_shape::{DType, Dim, Scalar, Shape, ShapeError};

use super::indexing::i64_of;
use super::movement::pad_axis;
use super::scan::{axis_len, filled, from_last, index, to_last};
use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

impl Tensor {
    /// The elements sorted along `dim` and their original `i64` indices (`torch.sort` with
    /// `stable=True`): ascending, or `descending`. Equal elements keep their order, NaN
    /// sorts last ascending and first descending. Every dtype; `n²` work per row up to
    /// 1024 elements, `n·log2²(n)` beyond (see the module docs).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![3.0f32, f32::NAN, 1.0, 3.0], [4])?;
    /// let (v, i) = t.sort(0, false)?;
    /// assert_eq!(i.to_vec::<i64>()?, vec![2, 0, 3, 1]);
    /// assert_eq!(&v.to_vec::<f32>()?[..3], &[1.0, 3.0, 3.0]);
    /// let (_, i) = t.sort(-1, true)?;
    /// assert_eq!(i.to_vec::<i64>()?, vec![1, 0, 3, 2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn sort(&self, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
        select_ranked(self, "sort", dim, descending, Target::All, false)
    }

    /// The indices that sort `self` along `dim` (`torch.argsort` with `stable=True`), as
    /// `i64`; see [`Tensor::sort`].
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![2u8, 0, 1, 1], [2, 2])?;
    /// assert_eq!(t.argsort(0, false)?.to_vec::<i64>()?, vec![1, 0, 0, 1]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn argsort(&self, dim: i64, descending: bool) -> Result<Tensor> {
        Ok(select_ranked(self, "argsort", dim, descending, Target::All, false)?.1)
    }

    /// The `k` largest (or, unless `largest`, smallest) elements along `dim` and their
    /// `i64` indices (`torch.topk`). The result is always sorted (what `sorted=true` asks
    /// for; with `sorted=false` `PyTorch` leaves the order unspecified) and ties keep their
    /// input order. NaN counts as the largest. `k` may not exceed the dim's size.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, 9, 4, 7], [4])?;
    /// let (v, i) = t.topk(2, 0, true, true)?;
    /// assert_eq!(v.to_vec::<i32>()?, vec![9, 7]);
    /// assert_eq!(i.to_vec::<i64>()?, vec![1, 3]);
    /// assert!(t.topk(5, 0, true, true).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn topk(
        &self,
        k: usize,
        dim: i64,
        largest: bool,
        sorted: bool,
    ) -> Result<(Tensor, Tensor)> {
        // Sorted output is one valid answer to both `sorted` values.
        let _ = sorted;
        let (axis, n) = axis_len(self, "topk", dim)?;
        if n > ARGSORT_ROW_MAX && (1..n).contains(&k) && radix_key(self).is_some() {
            let (v, i) = radix_topk(&to_last(self, axis)?, n, k, largest)?;
            return Ok((
                from_last(&v, axis, self.shape())?,
                from_last(&i, axis, self.shape())?,
            ));
        }
        select_ranked(self, "topk", dim, largest, Target::First(k), false)
    }

    /// The `k`-th smallest element (1-based) along `dim` and its `i64` index
    /// (`torch.kthvalue`), keeping `dim` as size 1 when `keepdim`. NaN counts as the
    /// largest; among equal elements the earliest in input order is taken first.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![5.0f64, 1.0, 4.0, 2.0], [2, 2])?;
    /// let (v, i) = t.kthvalue(1, 1, false)?;
    /// assert_eq!(v.to_vec::<f64>()?, vec![1.0, 2.0]);
    /// assert_eq!(i.to_vec::<i64>()?, vec![1, 1]);
    /// assert!(t.kthvalue(3, 1, false).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn kthvalue(&self, k: usize, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        select_ranked(self, "kthvalue", dim, false, Target::Kth(k), keepdim)
    }

    /// The lower median along `dim` and its `i64` index (`torch.median(dim)`): element
    /// `(n - 1) / 2` of the sorted row. A row holding NaN gives NaN and the index of its
    /// first NaN, as `PyTorch` does. An empty dim is an error.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![4i64, 1, 3, 2], [4])?;
    /// let (v, i) = t.median(0, false)?;
    /// assert_eq!((v.item::<i64>()?, i.item::<i64>()?), (2, 3));
    /// # Ok(())
    /// # }
    /// ```
    pub fn median(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        select_ranked(self, "median", dim, false, Target::Median, keepdim)
    }

    /// The lower median of every element, as a 0-d tensor (`torch.median()`); NaN if any
    /// element is NaN. An empty tensor is an error (`PyTorch` returns NaN there).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![4.0f32, 1.0, 3.0, 2.0], [2, 2])?;
    /// assert_eq!(t.median_all()?.item::<f32>()?, 2.0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn median_all(&self) -> Result<Tensor> {
        let n = self.shape().numel();
        let flat = self.reshape_to(Shape::new(vec![n]));
        let (v, _) = select_ranked(&flat, "median", 0, false, Target::Median, false)?;
        Ok(v)
    }

    /// For each of `values`, the index where it would be inserted into `self`, a sequence
    /// sorted ascending along its last dim, to keep it sorted (`torch.searchsorted`): the
    /// count of elements `< v` (or `<= v` with `right`), as `i64`. A 1-d sequence serves
    /// `values` of any shape; otherwise every dim but the last must match `values`'. The
    /// dtypes promote together. A binary search, `m·log2(n)` work per row. NaN orders as
    /// the largest value, as the sorts place it (a NaN value gets the sequence's length,
    /// as in `PyTorch`); `-0.0` equals `+0.0`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let s = Tensor::from_vec(vec![1.0f32, 3.0, 3.0, 7.0], [4])?;
    /// let v = Tensor::from_vec(vec![3.0f32, 0.0, 9.0], [3])?;
    /// assert_eq!(s.searchsorted(&v, false)?.to_vec::<i64>()?, vec![1, 0, 4]);
    /// assert_eq!(s.searchsorted(&v, true)?.to_vec::<i64>()?, vec![3, 0, 4]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn searchsorted(&self, values: &Tensor, right: bool) -> Result<Tensor> {
        searchsorted_impl(self, values, right)
    }

    /// The distinct elements of the flattened tensor, ascending, as a 1-d tensor
    /// (`torch.unique` with `dim=None`). The result is sorted whatever `sorted` says (one
    /// valid answer to `sorted=false` too). `-0.0` and `+0.0` are one value (the first met
    /// in sorted order is kept); every NaN is its own value, last, as `PyTorch` does on the
    /// CPU. Computed on the device (a sort, a prefix sum, scatters); the number of values
    /// depends on the data and is read back, which **synchronizes**.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![3i32, 1, 3, 2, 1], [5])?;
    /// assert_eq!(t.unique(true)?.to_vec::<i32>()?, vec![1, 2, 3]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn unique(&self, sorted: bool) -> Result<Tensor> {
        // Sorted output is one valid answer to both `sorted` values.
        let _ = sorted;
        Ok(unique_impl(self)?.0)
    }

    /// [`Tensor::unique`] with `return_inverse=True, return_counts=True`: the distinct
    /// values, the `i64` index into them of every input element (in the input's shape),
    /// and how often each value occurs (`i64`).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![3i32, 1, 3, 2], [2, 2])?;
    /// let (values, inverse, counts) = t.unique_with_inverse_and_counts()?;
    /// assert_eq!(values.to_vec::<i32>()?, vec![1, 2, 3]);
    /// assert_eq!(inverse.to_vec::<i64>()?, vec![2, 0, 2, 1]);
    /// assert_eq!(inverse.dims(), vec![2, 2]);
    /// assert_eq!(counts.to_vec::<i64>()?, vec![1, 1, 2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn unique_with_inverse_and_counts(&self) -> Result<(Tensor, Tensor, Tensor)> {
        unique_impl(self)
    }
}

/// [`Tensor::unique_with_inverse_and_counts`] on the device: the flattened input sorted
/// (stable), a new value wherever an element differs from the one before it (NaN differs
/// from everything, `-0.0` equals `+0.0`), each element's value number by a prefix sum, and
/// the values, inverse indices and counts placed by scatters. Only the number of values is
/// read back.
fn unique_impl(x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    use tessel_shape::BinaryOp;
    x.check_size("unique")?;
    super::indexing::no_float8("unique", x)?;
    let n = x.numel();
    let flat = x.reshape_to(Shape::new(vec![Dim::from(n)]));
    if n == 0 {
        let empty_i64 = Tensor::zeros([0], DType::I64).to(&x.device())?;
        return Ok((flat, empty_i64.reshape_to(x.shape().clone()), empty_i64));
    }
    let (sorted, from) = flat.sort(0, false)?;
    let n_i = i64_of(n);
    let differs = if n > 1 {
        let (later, earlier) = (sorted.narrow(0, 1, n_i - 1)?, sorted.narrow(0, 0, n_i - 1)?);
        let ne = if x.dtype() == DType::Bool {
            later.logical_xor(&earlier)?
        } else {
            later.raw_binary(BinaryOp::Ne, &earlier)
        };
        Tensor::cat(
            &[&Tensor::full([1], true, DType::Bool).to(&x.device())?, &ne],
            0,
        )?
    } else {
        Tensor::full([1], true, DType::Bool).to(&x.device())?
    };
    let number = differs.cast_to(DType::I64).cumsum(0)?.sub(1)?;
    let count = usize::try_from(number.narrow(0, n_i - 1, 1)?.item::<i64>()? + 1).unwrap_or(0);
    let at_new = Tensor::where_cond(&differs, &number, -1i64)?;
    let values = super::scatter::place_bits(&sorted, &at_new, count);
    let inverse = super::scatter::place_bits(&number, &from, n).reshape_to(x.shape().clone());
    let ones = number.full_like_scalar(Scalar::I32(1), DType::I32);
    let counts = super::scatter::scatter_add_into_zeros(&number, &ones, 0, Dim::from(count))?
        .cast_to(DType::I64);
    Ok((values, inverse, counts))
}

/// Which ranks a selection picks along the axis.
#[derive(Clone, Copy)]
enum Target {
    /// Every rank: a sort.
    All,
    /// Ranks `0..k`.
    First(usize),
    /// Rank `k - 1`, the dim reduced.
    Kth(usize),
    /// The lower median (or the first NaN), the dim reduced.
    Median,
}

/// `x` in a dtype that compares like it: `bool` as 0/1 bytes.
fn comparable(x: &Tensor) -> Tensor {
    if x.dtype().is_bool() {
        x.cast_to(DType::U8)
    } else {
        x.clone()
    }
}

/// The positions that sort the last axis of `last` (at most [`ARGSORT_ROW_MAX`] long)
/// stably, ascending or `descending`, NaN last ascending and first descending, as `i64`:
/// one [`Op::Argsort`] kernel per row, in local memory, over the elements' order keys.
fn argsort_rows(last: &Tensor, descending: bool) -> Tensor {
    let key = order_key(last);
    // Inverted keys sort descending; equal keys stay equal, so ties keep their order, and
    // NaN's key, the largest, becomes the smallest.
    let key = if descending {
        key.raw_unary(tessel_shape::UnaryOp::Not)
    } else {
        key
    };
    key.record(Op::Argsort(key.node()), DType::I64, last.shape().clone())
}

fn select_ranked(
    x: &Tensor,
    op: &'static str,
    dim: i64,
    descending: bool,
    target: Target,
    keepdim: bool,
) -> Result<(Tensor, Tensor)> {
    let (axis, n) = axis_len(x, op, dim)?;
    let out_len = match target {
        Target::All => n,
        Target::First(k) if k <= n => k,
        Target::Kth(k) if (1..=n).contains(&k) => 1,
        Target::Median if n > 0 => 1,
        Target::First(k) | Target::Kth(k) => return Err(bad_k(x, op, axis, n, k)),
        Target::Median => {
            return Err(Error::Shape(ShapeError::InvalidArgument {
                op,
                shape: x.shape().clone(),
                reason: format!(
                    "dim {} has size 0, and an empty median has no value (PyTorch raises too); take the median of a non-empty dim",
                    axis.unwrap_or(0)
                ),
            }));
        }
    };
    let key = comparable(x);
    let last = to_last(&key, axis)?;
    let mut out = last.shape().clone().into_dims();
    let nd = out.len();
    out[nd - 1] = Dim::from(out_len);
    let res = if out.iter().any(|d| d.as_const() == Some(0)) || n == 0 {
        // Nothing to select; no kernel needs to read the input.
        let shape = Shape::new(out);
        let empty = Tensor::record_on(
            x.device(),
            tessel_graph::Op::Const(Scalar::zero(x.dtype())),
            x.dtype(),
            shape.clone(),
        );
        let idx = Tensor::record_on(
            x.device(),
            tessel_graph::Op::Const(Scalar::I64(0)),
            DType::I64,
            shape,
        );
        (empty, idx)
    } else if n > ARGSORT_ROW_MAX
        && matches!(target, Target::Kth(_) | Target::Median)
        && radix_key(&last).is_some()
    {
        let rank = match target {
            Target::Kth(k) => {
                filled(&last, Scalar::I64(i64_of(k) - 1), DType::I64).narrow(-1, 0, 1)?
            }
            _ => median_rank(&last, n)?,
        };
        radix_rank(&last, n, &rank)?
    } else {
        let (sorted, from) = if n > ARGSORT_ROW_MAX {
            match radix_sort(&last, n, descending)? {
                Some(sorted) => sorted,
                None => bitonic(&last, n, descending)?,
            }
        } else {
            let from = argsort_rows(&last, descending);
            (gather_last(&last, &from), from)
        };
        match target {
            Target::All => (sorted, from),
            Target::First(k) => (
                sorted.narrow(-1, 0, i64_of(k))?,
                from.narrow(-1, 0, i64_of(k))?,
            ),
            Target::Kth(k) => (
                sorted.narrow(-1, i64_of(k) - 1, 1)?,
                from.narrow(-1, i64_of(k) - 1, 1)?,
            ),
            Target::Median => {
                // The median's position depends on the row's NaN count: gather it.
                let at = median_rank(&last, n)?;
                (gather_last(&sorted, &at), gather_last(&from, &at))
            }
        }
    };
    let (v, i) = (res.0.cast_to(x.dtype()), res.1);
    let reduced = matches!(target, Target::Kth(_) | Target::Median);
    let finish = |t: &Tensor| -> Result<Tensor> {
        let mut dims = x.shape().clone().into_dims();
        match axis {
            // A 0-d input gives 0-d results, except `topk(0)`'s empty one.
            None if out_len == 0 => Ok(t.clone()),
            None => Ok(t.reshape_to(x.shape().clone())),
            Some(a) if reduced => {
                // Moved-last then reduced to 1: restore the order, then drop it unless kept.
                let back = from_last(t, axis, x.shape())?;
                dims[a] = Dim::constant(1);
                let kept = back.reshape_to(Shape::new(dims.clone()));
                if keepdim {
                    Ok(kept)
                } else {
                    dims.remove(a);
                    Ok(kept.reshape_to(Shape::new(dims)))
                }
            }
            Some(_) => from_last(t, axis, x.shape()),
        }
    };
    Ok((finish(&v)?, finish(&i)?))
}

/// `x` along its last axis at the positions `at` (`[.., K]`): one gather.
fn gather_last(x: &Tensor, at: &Tensor) -> Tensor {
    super::indexing::pick(x, at, x.ndim() - 1)
}

/// Bits of the digit each pass of [`radix_sort`] orders by.
const RADIX_BITS: u32 = 8;

/// The stable ascending (or `descending`) sort of the last axis of `last` (`n` long, more
/// than [`ARGSORT_ROW_MAX`]) by a least-significant-digit radix sort of the elements'
/// [`order_key`]s: the sorted values and their `i64` positions in the row; `None` where
/// the batch dims are symbolic (the [`bitonic`] network sorts those).
///
/// Rows are padded with the largest key to whole blocks of `ARGSORT_ROW_MAX` elements.
/// Each pass orders (key, position) pairs stably by one 8-bit digit, from the lowest:
/// 1. every block sorts itself by the digit in local memory (an [`Op::Argsort`]);
/// 2. a histogram counts each block's digits (a scatter-add into 256 bins per block), and
///    an atomic maximum finds where each digit starts in the sorted block;
/// 3. an exclusive prefix sum of the histograms in (row, digit, block) order gives each
///    block's first destination for each digit;
/// 4. each pair moves to its block's destination for its digit plus its rank among the
///    block's equal digits (a scatter of the bits).
///
/// `key bits / 8` passes of `O(n)` work (4 for dtypes of 32 bits or fewer, 8 for the
/// 64-bit ones). Each pass keeps equal digits in their order, so equal keys keep their row
/// order: the sort is stable. Descending sorts the inverted keys ascending.
fn radix_sort(last: &Tensor, n: usize, descending: bool) -> Result<Option<(Tensor, Tensor)>> {
    use tessel_shape::{BinaryOp, UnaryOp};
    let nd = last.ndim();
    let Some(dims) = last.shape().as_usizes() else {
        return Ok(None);
    };
    let rows: usize = dims[..nd - 1].iter().product();
    let block = ARGSORT_ROW_MAX;
    let (per_row, bins) = (n.div_ceil(block), 1usize << RADIX_BITS);
    let (m, blocks) = (per_row * block, rows * per_row);
    let shape = |d: &[usize]| Shape::new(d.iter().map(|&v| Dim::from(v)).collect());
    let key = order_key(last);
    let word = key.dtype();
    let key = if descending {
        key.raw_unary(UnaryOp::Not)
    } else {
        key
    };
    let largest = match word {
        DType::U32 => Scalar::U32(u32::MAX),
        _ => Scalar::U64(u64::MAX),
    };
    let key = key.reshape_to(shape(&[rows, n]));
    // Pads take the largest key and the row's last positions: they sort after everything.
    let mut keys = if m > n {
        pad_axis(&key, 1, Dim::constant(0), Dim::from(m - n), largest)
    } else {
        key
    };
    // Positions in i32 where they fit: half the traffic, and devices without 64-bit
    // integers sort too.
    let pos_dtype = if i32::try_from(m).is_ok() {
        DType::I32
    } else {
        DType::I64
    };
    let mut pos = Tensor::record_on(last.device(), Op::Index(1), pos_dtype, shape(&[rows, m]));
    let grid = shape(&[blocks, block]);
    let whole = shape(&[rows * m]);
    let split = shape(&[rows, per_row, block]);
    // Per element of the [blocks, block] grid: its block, its place in it, its row's start.
    let block_of = index(&keys, 0, grid.dims());
    let place = index(&keys, 1, grid.dims());
    let row_start = index(&keys, 0, split.dims())
        .reshape_to(grid.clone())
        .mul(i64_of(m))?;
    let word_c = |like: &Tensor, v: u64| match word {
        DType::U32 => like.full_like_scalar(Scalar::U32(v as u32), word),
        _ => like.full_like_scalar(Scalar::U64(v), word),
    };
    let digit = |x: &Tensor, shift: u64| {
        x.raw_binary(BinaryOp::Shr, &word_c(x, shift))
            .raw_binary(BinaryOp::And, &word_c(x, bins as u64 - 1))
    };
    let passes = 8 * word.size_bytes() as u64 / u64::from(RADIX_BITS);
    for pass in 0..passes {
        let shift = pass * u64::from(RADIX_BITS);
        let (k, p) = (keys.reshape_to(grid.clone()), pos.reshape_to(grid.clone()));
        let d = digit(&k, shift);
        let order = d.record(Op::Argsort(d.node()), DType::I64, grid.clone());
        let (k, p) = (gather_last(&k, &order), gather_last(&p, &order));
        let bin = block_of
            .mul(i64_of(bins))?
            .add(digit(&k, shift).cast_to(DType::I64))?
            .reshape_to(whole.clone());
        let ones = bin.full_like_scalar(Scalar::I32(1), DType::I32);
        let counts =
            super::scatter::scatter_add_into_zeros(&bin, &ones, 0, Dim::from(blocks * bins))?;
        // The largest `block - place` of each bin: where its digit starts in the block.
        let from_end = place.neg()?.add(i64_of(block))?.cast_to(DType::U32);
        let start = super::scatter::scatter_max_into_zeros(
            &bin,
            &from_end.reshape_to(whole.clone()),
            0,
            Dim::from(blocks * bins),
        )
        .cast_to(DType::I64)
        .neg()?
        .add(i64_of(block))?;
        // Destinations before each (block, digit): the counts of smaller digits in the
        // row, and of this digit in the row's earlier blocks.
        let by_digit = counts
            .reshape_to(shape(&[rows, per_row, bins]))
            .permute(&[0, 2, 1])?
            .reshape(&[i64_of(rows), i64_of(bins * per_row)])?;
        let before = by_digit
            .cumsum(-1)?
            .sub(&by_digit)?
            .reshape_to(shape(&[rows, bins, per_row]))
            .permute(&[0, 2, 1])?
            .reshape(&[i64_of(blocks * bins)])?;
        let dest = gather_last(&before, &bin)
            .sub(gather_last(&start, &bin))?
            .add(place.reshape_to(whole.clone()))?
            .add(row_start.reshape_to(whole.clone()))?;
        let placed = |x: &Tensor| {
            super::scatter::place_bits(&x.reshape_to(whole.clone()), &dest, rows * m)
                .reshape_to(shape(&[rows, m]))
        };
        (keys, pos) = (placed(&k), placed(&p));
    }
    let from = pos.narrow(-1, 0, i64_of(n))?.cast_to(DType::I64);
    let from = from.reshape_to(last.shape().clone());
    Ok(Some((gather_last(last, &from), from)))
}

/// The stable ascending (or `descending`) sort of the last axis of `x` (`n` long) by a
/// bitonic sorting network: the sorted values and their `i64` positions in the row.
///
/// The axis is padded to a power of two `len` with a sentinel that sorts after every
/// element (NaN, or the largest value of the dtype, placed at the highest positions, so the
/// position tie-break puts it last), and each element carries its position. Every
/// compare-exchange stage views the axis as `[len / 2h, 2, h]` and compares each element
/// with its partner in the other half: the mirrored one (`flip` of both inner axes) in the
/// first stage of each merge, the opposite one (`flip` of the size-2 axis) in the others.
/// The first half keeps the element that comes first (smaller key, or equal key and smaller
/// position), the second half the other. With the position as the tie-break the order is
/// total and the sort stable. `log2(len)·(log2(len) + 1) / 2` stages, each `len` work.
///
/// Descending sorts the reversed row ascending and reverses the result: equal keys then
/// come out in ascending position order as a stable descending sort wants, NaN first, and
/// only the first stage's kernel differs from an ascending sort's.
fn bitonic(x: &Tensor, n: usize, descending: bool) -> Result<(Tensor, Tensor)> {
    let len = n.next_power_of_two();
    let nd = x.ndim();
    let dtype = x.dtype();
    let src = if descending {
        x.flip(&[-1])?
    } else {
        x.clone()
    };
    let sentinel = if dtype.is_float() {
        Scalar::F64(f64::NAN).cast(dtype)
    } else {
        tessel_graph::ReduceOp::Min.identity(dtype)
    };
    let mut keys = if len > n {
        pad_axis(&src, nd - 1, Dim::constant(0), Dim::from(len - n), sentinel)
    } else {
        src
    };
    // Positions fit i32 for any row a device can hold; i32 halves the traffic and runs on
    // devices without 64-bit integers.
    let pos_dtype = if i32::try_from(len).is_ok() {
        DType::I32
    } else {
        DType::I64
    };
    let row = keys.shape().clone();
    let mut pos = Tensor::record_on(
        x.device(),
        tessel_graph::Op::Index(nd - 1),
        pos_dtype,
        row.clone(),
    );
    let mut block = 2;
    while block <= len {
        let mut half = block / 2;
        let mut mirror = true;
        while half >= 1 {
            (keys, pos) = exchange(&keys, &pos, len, half, mirror)?;
            mirror = false;
            half /= 2;
        }
        block *= 2;
    }
    let mut vals = keys.narrow(-1, 0, i64_of(n))?;
    let mut from = pos.narrow(-1, 0, i64_of(n))?.cast_to(DType::I64);
    if descending {
        vals = vals.flip(&[-1])?;
        from = from.flip(&[-1])?.neg()?.add(i64_of(n) - 1)?;
    }
    Ok((vals, from))
}

/// One compare-exchange stage of [`bitonic`] on pairs `half` apart (mirrored pairs when
/// `mirror`): the new keys and positions, in the row's shape.
fn exchange(
    keys: &Tensor,
    pos: &Tensor,
    len: usize,
    half: usize,
    mirror: bool,
) -> Result<(Tensor, Tensor)> {
    let row = keys.shape().clone();
    let nd = keys.ndim();
    let mut dims = row.dims()[..nd - 1].to_vec();
    dims.extend([len / (2 * half), 2, half].map(Dim::from));
    let split = Shape::new(dims);
    let (k, p) = (
        keys.reshape_to(split.clone()),
        pos.reshape_to(split.clone()),
    );
    let axes: &[i64] = if mirror { &[-2, -1] } else { &[-2] };
    let (kp, pp) = (k.flip(axes)?, p.flip(axes)?);
    let in_first = Tensor::record_on(
        keys.device(),
        tessel_graph::Op::Index(nd),
        DType::I32,
        split,
    )
    .eq(0i32)?;
    // The first half keeps whichever comes first, the second half the other one. The keys
    // and the positions decide that in two forms (self before partner, partner before
    // self; equal, as the order is total): one test shared by both would be materialized
    // as a mask of its own, and the stage's outputs, which the next stage reads twice,
    // recomputed there instead.
    let keep = comes_first(&k, &p, &kp, &pp)?.eq(&in_first)?;
    let swap = comes_first(&kp, &pp, &k, &p)?.eq(&in_first)?;
    Ok((
        keep.raw_where(&k, &kp).reshape_to(row.clone()),
        swap.raw_where(&pp, &p).reshape_to(row),
    ))
}

/// Whether key `a` at position `pa` sorts before key `b` at position `pb`: a smaller key
/// (NaN the largest, equal to NaN), or an equal key and a smaller position.
fn comes_first(a: &Tensor, pa: &Tensor, b: &Tensor, pb: &Tensor) -> Result<Tensor> {
    let mut lt = a.lt(b)?;
    let mut eq = a.eq(b)?;
    if a.dtype().is_float() {
        let (nan_a, nan_b) = (a.isnan(), b.isnan());
        lt = lt.logical_or(&nan_b.logical_and(nan_a.logical_not())?)?;
        eq = eq.logical_or(&nan_a.logical_and(&nan_b)?)?;
    }
    lt.logical_or(&eq.logical_and(pa.lt(pb)?)?)
}

/// The rank of the lower median of each row (`[.., 1]`), or of the row's first NaN.
fn median_rank(last: &Tensor, n: usize) -> Result<Tensor> {
    let lower = ((n - 1) / 2) as i64;
    let zero = filled(last, Scalar::I64(0), DType::I64);
    if !last.dtype().is_float() {
        return zero.add(lower)?.narrow(-1, 0, 1);
    }
    // NaNs rank last, so the first NaN has rank n - (number of NaNs).
    let nans = last.isnan().sum(&[-1], true)?;
    let nan_rank = nans.neg()?.add(n as i64)?;
    let rank = Tensor::where_cond(&nans.gt(0i64)?, &nan_rank, lower)?;
    Ok(rank)
}

fn bad_k(x: &Tensor, op: &'static str, axis: Option<usize>, n: usize, k: usize) -> Error {
    let range = if matches!(op, "topk") {
        format!("0..={n}")
    } else {
        format!("1..={n}")
    };
    Error::Shape(ShapeError::InvalidArgument {
        op,
        shape: x.shape().clone(),
        reason: format!(
            "k = {k} is out of range for dim {} of size {n}; pick k in {range}",
            axis.unwrap_or(0)
        ),
    })
}

fn searchsorted_impl(seq: &Tensor, values: &Tensor, right: bool) -> Result<Tensor> {
    const OP: &str = "searchsorted";
    seq.same_device(values, OP)?;
    if seq.ndim() == 0 {
        return Err(Error::Shape(ShapeError::InvalidArgument {
            op: OP,
            shape: seq.shape().clone(),
            reason: "the sorted sequence is 0-d; give it at least one dim, e.g. .reshape(&[1])"
                .to_owned(),
        }));
    }
    let batch = &seq.shape().dims()[..seq.ndim() - 1];
    if seq.ndim() > 1
        && (values.ndim() != seq.ndim() || &values.shape().dims()[..values.ndim() - 1] != batch)
    {
        return Err(Error::Shape(ShapeError::InvalidArgument {
            op: OP,
            shape: values.shape().clone(),
            reason: format!(
                "the sorted sequence has shape {}, so the values need the same leading dims and any last dim, or use a 1-d sequence",
                seq.shape()
            ),
        }));
    }
    let (s, v) = {
        let dtype = seq
            .dtype()
            .promote(values.dtype())
            .map_err(|source| Error::Promotion { op: OP, source })?;
        (
            comparable(&seq.cast_to(dtype)),
            comparable(&values.cast_to(dtype)),
        )
    };
    if values.ndim() == 0 || seq.ndim() == 1 {
        // A 1-d sequence: every value searches it.
        let n = values.shape().numel();
        let flat = v.reshape_to(Shape::new(vec![n]));
        let res = search_rows(&s, &flat, right)?;
        return Ok(res.reshape_to(values.shape().clone()));
    }
    search_rows(&s, &v, right)
}

/// `#{j: s[.., j] < v[.., m]}` (or `<=`) for sequences `s` `[.., n]` and values `[.., m]`,
/// comparing [`order_key`]s (so NaN is the largest value, as sorts place it): a binary
/// search of `ceil(log2(n + 1))` steps, each a gather of the sequence at the candidate
/// count, fused into one kernel. `m·log2(n)` work per row.
fn search_rows(s: &Tensor, v: &Tensor, right: bool) -> Result<Tensor> {
    let len = s.shape()[s.ndim() - 1];
    if v.shape().iter().any(|d| d.as_const() == Some(0)) || len.as_const() == Some(0) {
        return Ok(filled(v, Scalar::I64(0), DType::I64));
    }
    let Some(n) = len.as_const() else {
        return Err(Error::Shape(ShapeError::InvalidArgument {
            op: "searchsorted",
            shape: s.shape().clone(),
            reason: "the sorted sequence's last dim is dynamic; searchsorted needs its length fixed (realize it first, or search a fixed-size sequence)".to_owned(),
        }));
    };
    let (keys, key) = (order_key(s), order_key(v));
    let count = |c: i64| filled(v, Scalar::I64(c), DType::I64);
    let mut found = count(0);
    let mut step = 1i64 << (63 - n.leading_zeros());
    while step >= 1 {
        // Take `step` more elements where the last of them is still below the value.
        let candidate = found.add(step)?;
        let last = candidate.sub(1i64)?.minimum(n - 1)?;
        let at = gather_last(&keys, &last);
        let below = if right { at.le(&key)? } else { at.lt(&key)? };
        let fits = candidate.le(n)?.logical_and(&below)?;
        found = Tensor::where_cond(&fits, &candidate, &found)?;
        step /= 2;
    }
    Ok(found)
}

/// [`order_key`] where it has 32 bits (dtypes of 32 bits or fewer); `None` for the 64-bit
/// dtypes.
fn radix_key(x: &Tensor) -> Option<Tensor> {
    (x.dtype().size_bytes() <= 4).then(|| order_key(x))
}

/// An unsigned key per element that orders like the values in the sorts here: `-0.0`
/// equals `+0.0`, every NaN is one key above `+inf`. `u32` for dtypes of 32 bits or fewer,
/// `u64` for the 64-bit ones. Floats map their bits (sign-magnitude) to an order-preserving
/// unsigned integer; `f16`, `bf16` and float8 widen to `f32` first (exactly), narrow
/// integers to 32 bits.
pub(super) fn order_key(x: &Tensor) -> Tensor {
    use tessel_shape::BinaryOp;
    let (wide, word) = match x.dtype() {
        DType::F8E4M3 | DType::F8E5M2 | DType::F16 | DType::BF16 | DType::F32 => {
            (DType::F32, DType::U32)
        }
        DType::F64 => (DType::F64, DType::U64),
        DType::I8 | DType::I16 | DType::I32 => (DType::I32, DType::U32),
        DType::I64 => (DType::I64, DType::U64),
        DType::Bool | DType::U8 | DType::U16 | DType::U32 => (DType::U32, DType::U32),
        DType::U64 => (DType::U64, DType::U64),
    };
    let x = x.cast_to(wide);
    let k = |like: &Tensor, v: u64| match word {
        DType::U32 => like.full_like_scalar(Scalar::U32(v as u32), word),
        _ => like.full_like_scalar(Scalar::U64(v), word),
    };
    let bits = 8 * word.size_bytes() as u64;
    let sign = 1u64 << (bits - 1);
    if wide.is_float() {
        let zero = x.full_like_scalar(Scalar::zero(wide), wide);
        let nan = x.full_like_scalar(Scalar::F64(f64::NAN).cast(wide), wide);
        // One zero and one NaN, so equal values get equal keys.
        let x = x.raw_binary(BinaryOp::Eq, &zero).raw_where(&zero, &x);
        let x = x.isnan().raw_where(&nan, &x);
        let b = x.reinterpret(word);
        // Negative floats order reversed in their bits: flip them all; flip the sign of
        // the others.
        let negative = b
            .raw_binary(BinaryOp::Shr, &k(&b, bits - 1))
            .raw_binary(BinaryOp::Eq, &k(&b, 1));
        let flip = negative.raw_where(&k(&b, u64::MAX), &k(&b, sign));
        b.raw_binary(BinaryOp::Xor, &flip)
    } else if wide.is_signed() {
        let b = x.reinterpret(word);
        b.raw_binary(BinaryOp::Xor, &k(&b, sign))
    } else {
        x
    }
}

/// The keys of the last axis of `last` as `[rows, n]` (inverted for `largest`, so the
/// wanted elements always have the largest keys), and the rows' shape.
fn radix_rows(last: &Tensor, n: usize, largest: bool) -> Result<(Tensor, Vec<usize>)> {
    use tessel_shape::UnaryOp;
    let Some(key) = radix_key(last) else {
        return Err(Error::Internal("radix selection on a 64-bit dtype".into()));
    };
    let key = if largest {
        key
    } else {
        key.raw_unary(UnaryOp::Not)
    };
    let nd = last.ndim();
    let dims = last
        .shape()
        .as_usizes()
        .ok_or_else(|| Error::Internal("symbolic batch dims reached the radix selection".into()))?;
    let rows: usize = dims[..nd - 1].iter().product();
    let flat = Shape::new(vec![Dim::from(rows), Dim::from(n)]);
    Ok((key.reshape_to(flat), dims[..nd - 1].to_vec()))
}

/// Radix selection on `key` (`[rows, n]` `u32`): per row, the `need`-th largest key
/// (`need` is `[rows, 1]` `i64`, 1-based), and how many of the elements equal to it, in row
/// order, are still to be taken. Four passes, one per byte from the top, each a histogram
/// of the candidates' next byte (a scatter-add into 256 bins per row) whose suffix sums
/// locate the byte of the wanted key. `O(n)` per row.
fn radix_select(key: &Tensor, need: &Tensor) -> Result<(Tensor, Tensor)> {
    use tessel_shape::BinaryOp;
    let dims = key.shape().as_usizes().unwrap_or_default();
    let (rows, n) = (dims[0], dims[1]);
    let flat = key.shape().clone();
    let u32c = |like: &Tensor, v: u32| like.full_like_scalar(Scalar::U32(v), DType::U32);
    let i64c = |like: &Tensor, v: i64| like.full_like_scalar(Scalar::I64(v), DType::I64);
    let row = index(key, 0, flat.dims());
    let mut prefix = need.full_like_scalar(Scalar::U32(0), DType::U32);
    let mut need = need.clone();
    for pass in 0..4u32 {
        let shift = 24 - 8 * pass;
        let digit = key
            .raw_binary(BinaryOp::Shr, &u32c(key, shift))
            .raw_binary(BinaryOp::And, &u32c(key, 255))
            .cast_to(DType::I64);
        let mut bin = row
            .raw_binary(BinaryOp::Mul, &i64c(&row, 256))
            .raw_binary(BinaryOp::Add, &digit);
        if pass > 0 {
            let high = u32c(key, shift + 8);
            let same = key.raw_binary(BinaryOp::Shr, &high).raw_binary(
                BinaryOp::Eq,
                &prefix
                    .broadcast_to_shape(&flat)
                    .raw_binary(BinaryOp::Shr, &high),
            );
            bin = same.raw_where(&bin, &i64c(&bin, -1));
        }
        let ones = key.full_like_scalar(Scalar::I32(1), DType::I32);
        let whole = Shape::new(vec![Dim::from(rows * n)]);
        let hist = super::scatter::scatter_add_into_zeros(
            &bin.reshape_to(whole.clone()),
            &ones.reshape_to(whole),
            0,
            Dim::from(rows * 256),
        )?
        .reshape_to(Shape::new(vec![Dim::from(rows), Dim::constant(256)]));
        // at_least[d]: candidates whose byte is d or above.
        let at_least = hist.flip(&[-1])?.cumsum(-1)?.flip(&[-1])?;
        let byte = at_least
            .ge(&need)?
            .cast(DType::I64)
            .sum(&[-1], true)?
            .sub(1)?;
        // Candidates strictly above that byte (a gather past the last bin reads 0: an
        // internal gather, which checked indexing must not report).
        let above = gather_last(&at_least, &byte.add(1)?);
        need = need.sub(&above)?;
        prefix = prefix.raw_binary(
            BinaryOp::Or,
            &byte
                .cast_to(DType::U32)
                .raw_binary(BinaryOp::Shl, &u32c(&prefix, shift)),
        );
    }
    Ok((prefix, need))
}

/// `topk` of the last axis (`n` long) by [`radix_select`] instead of a sort: the elements
/// above the `k`-th key, and the first of those equal to it in row order, placed in row
/// order by a prefix sum and a scatter, then those `k` sorted (stable: equal values keep
/// row order, as the full sort's `topk`).
fn radix_topk(last: &Tensor, n: usize, k: usize, largest: bool) -> Result<(Tensor, Tensor)> {
    use tessel_shape::BinaryOp;
    let (key, batch) = radix_rows(last, n, largest)?;
    let rows: usize = batch.iter().product();
    let flat = key.shape().clone();
    let i64c = |like: &Tensor, v: i64| like.full_like_scalar(Scalar::I64(v), DType::I64);
    let need = Tensor::full([rows, 1], i64_of(k), DType::I64).to(&last.device())?;
    let (kth, need) = radix_select(&key, &need)?;
    let kth = kth.broadcast_to_shape(&flat);
    let greater = key.raw_binary(BinaryOp::Gt, &kth);
    let equal = key.raw_binary(BinaryOp::Eq, &kth);
    // One prefix sum counts both, greater elements in the high 32 bits and equal ones in
    // the low (a row's counts fit 32 bits): an element's place among the taken ones is
    // the greater ones up to it plus the equal ones up to it, at most `need` of those.
    let both = greater
        .cast_to(DType::I64)
        .raw_binary(BinaryOp::Shl, &i64c(&key, 32))
        .raw_binary(BinaryOp::Or, &equal.cast_to(DType::I64))
        .cumsum(-1)?;
    let equal_rank = both.raw_binary(BinaryOp::And, &i64c(&both, u32::MAX.into()));
    let greater_rank = both.raw_binary(BinaryOp::Shr, &i64c(&both, 32));
    let take = greater.logical_or(&equal.logical_and(&equal_rank.le(&need)?)?)?;
    let at = greater_rank
        .add(&equal_rank.minimum(need.broadcast_to_shape(&flat))?)?
        .sub(1)?;
    let row = index(&key, 0, flat.dims());
    let dest = take.raw_where(
        &row.raw_binary(BinaryOp::Mul, &i64c(&row, i64_of(k)))
            .raw_binary(BinaryOp::Add, &at),
        &i64c(&at, -1),
    );
    let whole = Shape::new(vec![Dim::from(rows * n)]);
    let dest = dest.reshape_to(whole.clone());
    let positions = index(&key, 1, flat.dims());
    let mut out = batch.iter().map(|&d| Dim::from(d)).collect::<Vec<_>>();
    out.push(Dim::from(k));
    let out = Shape::new(out);
    let values = super::scatter::place_bits(&last.reshape_to(whole.clone()), &dest, rows * k)
        .reshape_to(out.clone());
    let indices =
        super::scatter::place_bits(&positions.reshape_to(whole), &dest, rows * k).reshape_to(out);
    let (sorted, order) = values.sort(-1, largest)?;
    Ok((sorted, gather_last(&indices, &order)))
}

/// The element of each row of the last axis (`n` long) at 0-based ascending `rank`
/// (`[.., 1]` `i64`, per row) and its index, by [`radix_select`]: `kthvalue` and `median`
/// of long rows without a sort. Among equal elements the earliest in row order comes
/// first, as in the stable sort.
fn radix_rank(last: &Tensor, n: usize, rank: &Tensor) -> Result<(Tensor, Tensor)> {
    use tessel_shape::BinaryOp;
    // Ascending rank r is the (r + 1)-th largest of the inverted keys.
    let (key, batch) = radix_rows(last, n, false)?;
    let rows: usize = batch.iter().product();
    let flat = key.shape().clone();
    let column = Shape::new(vec![Dim::from(rows), Dim::constant(1)]);
    let need = rank.reshape_to(column).add(1)?;
    let (kth, need) = radix_select(&key, &need)?;
    let equal = key.raw_binary(BinaryOp::Eq, &kth.broadcast_to_shape(&flat));
    let equal_rank = equal.cast_to(DType::I64).cumsum(-1)?;
    let hit = equal.logical_and(&equal_rank.eq(&need)?)?;
    let positions = index(&key, 1, flat.dims());
    let at = Tensor::where_cond(&hit, &positions, -1i64)?.max(&[-1], true)?;
    let mut out = batch.iter().map(|&d| Dim::from(d)).collect::<Vec<_>>();
    out.push(Dim::constant(1));
    let out = Shape::new(out);
    let value = gather_last(&last.reshape_to(flat), &at).reshape_to(out.clone());
    Ok((value, at.reshape_to(out)))
}
