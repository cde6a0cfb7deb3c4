//! Scatters: writes at positions held in index tensors (`scatter`, `scatter_add`,
//! `scatter_reduce`, `index_add`, `index_put`), and the ops whose result sizes depend on
//! the data (`masked_select`, `nonzero`), which place their elements with a scatter.
//!
//! A sum is an [`Op::Scatter`] with [`AtomicOp::Add`]: one kernel over the sources adding
//! each value atomically into a buffer the launch zeroes, so repeated indices add up (in no
//! fixed order). `scatter` (the last write wins) and the `"amax"`/`"amin"` reductions take
//! atomic maxima of unsigned keys instead ([`AtomicOp::Max`]): the largest ordered key of
//! the values at each position, then the last source position that reaches it, whose value
//! a gather reads back bit for bit (so the result is differentiable like any gather). Where
//! a device has no 64-bit atomic adds (WGSL; OpenCL C without `cl_khr_int64_*_atomics`) and
//! for `"prod"`, the sources are selected through a one-hot mask over the axis:
//! `O(index × size)` work. Out-of-range indices and checked mode are described in
//! `indexing.rs`.

use tessel_graph::{AtomicOp, Op, ReduceOp};
use tessel_shape::{BinaryOp, DType, Dim, Shape, rules};

use super::indexing::{check_index, check_mask, check_range, concrete, i64_of, invalid, pick};
use super::movement::pad_axis;
use crate::ops::ScalarOperand;
use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

/// The dtype a scatter-add accumulates `dtype` in: the device adds atomically in 32 or 64
/// bits, so narrow integers widen (wrapping sums agree modulo their width) and `f16`/`bf16`
/// add in `f32`, as the reductions do.
pub(crate) fn scatter_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        DType::Bool | DType::U8 | DType::U16 => DType::U32,
        DType::I8 | DType::I16 => DType::I32,
        d => d,
    }
}

/// Zeros of `index`'s shape with `n` along `axis`, plus each `src` element added at its
/// index along `axis`; `src` has `index`'s shape. Accumulates in [`scatter_dtype`] and
/// returns that dtype.
///
/// One [`Op::Scatter`] of atomic adds, unless the sum must be computed in a fixed order:
/// float sums under [`use_deterministic_algorithms`](crate::use_deterministic_algorithms),
/// and 64-bit sums on a device without 64-bit atomic adds (WGSL, OpenCL C without
/// `cl_khr_int64_*_atomics`), take [`reduce_sorted`].
pub(crate) fn scatter_add_into_zeros(
    index: &Tensor,
    src: &Tensor,
    axis: usize,
    n: Dim,
) -> Result<Tensor> {
    let work = scatter_dtype(src.dtype());
    let src = if work == src.dtype() {
        src.clone()
    } else {
        src.cast_to(work)
    };
    let mut dims = index.shape().clone().into_dims();
    dims[axis] = n;
    let ordered = work.is_float() && crate::are_deterministic_algorithms_enabled();
    if ordered || !src.device().atomic_adds(work) {
        let (sums, written) = reduce_sorted("scatter_add", index, &src, axis, n, ReduceOp::Sum)?;
        let zero = sums.full_like_scalar(tessel_shape::Scalar::zero(work), work);
        return Ok(written.raw_where(&sums, &zero));
    }
    Ok(src.record(
        Op::Scatter(AtomicOp::Add, index.node(), src.node(), axis),
        work,
        Shape::new(dims),
    ))
}

/// The sum or product (`rop`) of the `src` values sent to each position along `axis`
/// (`index`'s shape with `n` there), in an order fixed by the data alone, and whether any
/// was sent: the sources are sorted by destination (a stable sort of the indices along
/// `axis`), each run of one destination is combined left to right in a log-step
/// segmented scan (Hillis–Steele: step `k` combines each element with the one `2^k`
/// before it where both belong to one run), and each run's last element is read back at
/// its destination, found by an atomic maximum of positions (whose order does not
/// matter). Bit-identical run to run, differentiable like its gathers and sums, and no
/// atomic add of the values' dtype is needed.
fn reduce_sorted(
    op: &'static str,
    index: &Tensor,
    src: &Tensor,
    axis: usize,
    n: Dim,
    rop: ReduceOp,
) -> Result<(Tensor, Tensor)> {
    use tessel_shape::Scalar;
    let Some(m) = index.shape()[axis].as_const() else {
        return Err(invalid(
            op,
            format!(
                "this scatter sums in a fixed order (deterministic algorithms, a product, or no 64-bit atomic adds on the device), which needs a fixed number of sources along dim {axis}, but index {} is dynamic there; use a fixed size (or turn deterministic algorithms off)",
                index.shape()
            ),
        ));
    };
    // Sorted once per source row where the index is a broadcast, then spread again.
    let rows = compact_index(index, axis).unwrap_or_else(|| index.clone());
    let full = src.shape().clone();
    // Out-of-range indices form runs of their own, at key -1, which nothing reads back.
    let idx = rows.dtype();
    let hi = rows.full_like_scalar(Scalar::I64(n.bounds().hi), idx);
    let inside = rows
        .ge(0i64)?
        .logical_and(rows.raw_binary(BinaryOp::Lt, &hi))?;
    let keys = inside.raw_where(&rows, &rows.full_like_scalar(Scalar::I64(-1), idx));
    let order = keys.argsort(i64_of(axis), false)?;
    let keys = pick(&keys, &order, axis);
    let mut values = pick(src, &order.broadcast_to_shape(&full), axis);
    let identity = rop.identity(src.dtype());
    let m = usize::try_from(m).unwrap_or(0);
    let mut shift = 1;
    while shift < m {
        let earlier = |t: &Tensor, fill: Scalar| {
            pad_axis(t, axis, Dim::from(shift), Dim::constant(0), fill).narrow(
                i64_of(axis),
                0,
                i64_of(m),
            )
        };
        let same_run = keys
            .raw_binary(BinaryOp::Eq, &earlier(&keys, Scalar::I64(-2))?)
            .broadcast_to_shape(&full);
        let before = earlier(&values, identity)?;
        let combined = match rop {
            ReduceOp::Prod => before.raw_binary(BinaryOp::Mul, &values),
            _ => before.raw_binary(BinaryOp::Add, &values),
        };
        values = same_run.raw_where(&combined, &values);
        shift *= 2;
    }
    let mut spread = full.into_dims();
    spread[axis] = n;
    let writer = last_writer(op, &keys, axis, n, None)?.broadcast_to_shape(&Shape::new(spread));
    Ok(read_last(&values, &keys, &writer, axis))
}

/// Zeros of `index`'s shape with `n` along `axis`, each element the largest of the `keys`
/// (`u32` or `u64`, `index`'s shape) sent to it: one [`Op::Scatter`] of atomic maxima.
pub(super) fn scatter_max_into_zeros(index: &Tensor, keys: &Tensor, axis: usize, n: Dim) -> Tensor {
    let mut dims = index.shape().clone().into_dims();
    dims[axis] = n;
    keys.record(
        Op::Scatter(AtomicOp::Max, index.node(), keys.node(), axis),
        keys.dtype(),
        Shape::new(dims),
    )
}

/// `index` as recorded before a broadcast along dims other than `axis` (the spread index of
/// `index_add`, `index_put` and an embedding's gradient), so that what depends on the index
/// alone (the last writer of each position, the sort by destination) is computed once per
/// source row instead of once per element; `None` where the graph recorded no such
/// broadcast.
fn compact_index(index: &Tensor, axis: usize) -> Option<Tensor> {
    let mut st = tessel_runtime::runtime().lock();
    let Op::Expand(child) = st.graph.node(index.node()).op else {
        return None;
    };
    let narrow = st.graph.node(child);
    if narrow.shape.ndim() != index.ndim() || narrow.shape[axis] != index.shape()[axis] {
        return None;
    }
    let (shape, dtype) = (narrow.shape.clone(), narrow.dtype);
    st.graph.retain(child);
    drop(st);
    let values = index.dim_values().clone();
    Some(Tensor::from_node_with(
        child,
        shape,
        dtype,
        index.device(),
        values,
    ))
}

/// One more than each source's position along `axis` (`index`'s shape), as `dtype` (`u32`
/// or `u64`); at most `u32::MAX - 1` positions, so that the low 32 bits hold it.
fn positions(op: &'static str, index: &Tensor, axis: usize, dtype: DType) -> Result<Tensor> {
    if index.shape()[axis].bounds().hi >= i64::from(u32::MAX) {
        return Err(invalid(
            op,
            format!(
                "index {} has {} positions along dim {axis}; at most {} are supported",
                index.shape(),
                index.shape()[axis],
                u32::MAX - 1
            ),
        ));
    }
    let at = Tensor::record_on(
        index.device(),
        Op::Index(axis),
        dtype,
        index.shape().clone(),
    );
    let one = at.full_like_scalar(tessel_shape::Scalar::one(dtype), dtype);
    Ok(at.raw_binary(BinaryOp::Add, &one))
}

/// For each position along `axis` (`index`'s shape with `n` there): one more than the last
/// source position along `axis` whose index names it, among those `eligible` (all if
/// `None`), or `0` where none does. `u32`: one atomic maximum per source.
fn last_writer(
    op: &'static str,
    index: &Tensor,
    axis: usize,
    n: Dim,
    eligible: Option<&Tensor>,
) -> Result<Tensor> {
    let mut position = positions(op, index, axis, DType::U32)?;
    if let Some(eligible) = eligible {
        let none = position.full_like_scalar(tessel_shape::Scalar::U32(0), DType::U32);
        position = eligible.raw_where(&position, &none);
    }
    Ok(scatter_max_into_zeros(index, &position, axis, n))
}

/// [`last_writer`] among the sources holding their position's largest (`largest`) or
/// smallest value, NaN counting as the extreme either way. With 64-bit atomic maxima and
/// 32-bit keys, one pass: the key in the high word, the position in the low one, so the
/// largest pair is the last source holding the largest key. Else [`reaches_extreme`]
/// first.
fn extreme_writer(
    op: &'static str,
    index: &Tensor,
    src: &Tensor,
    axis: usize,
    n: Dim,
    largest: bool,
) -> Result<Tensor> {
    let keys = ordered_keys(src, largest);
    if let [key] = keys.as_slice()
        && src.device().atomic_adds(DType::U64)
    {
        let k32 = src.full_like_scalar(tessel_shape::Scalar::U64(32), DType::U64);
        let pair = key
            .cast_to(DType::U64)
            .raw_binary(BinaryOp::Shl, &k32)
            .raw_binary(BinaryOp::Or, &positions(op, index, axis, DType::U64)?);
        return Ok(scatter_max_into_zeros(index, &pair, axis, n).cast_to(DType::U32));
    }
    let reached = reaches_extreme(index, src, axis, n, largest)?;
    last_writer(op, index, axis, n, Some(&reached))
}

/// `src` (`index`'s shape) read at the source position [`last_writer`] found for each
/// destination, and whether there was one.
fn read_last(src: &Tensor, index: &Tensor, writer: &Tensor, axis: usize) -> (Tensor, Tensor) {
    let zero = writer.full_like_scalar(tessel_shape::Scalar::U32(0), DType::U32);
    let written = writer.raw_binary(BinaryOp::Gt, &zero);
    let one = writer.full_like_scalar(tessel_shape::Scalar::U32(1), DType::U32);
    let at = written
        .raw_where(&writer.raw_binary(BinaryOp::Sub, &one), &zero)
        .cast_to(index.dtype());
    (pick(src, &at, axis), written)
}

/// Unsigned keys of `x` whose order is `x`'s (`largest`) or its reverse, with NaN above
/// everything either way (so a maximum of keys propagates NaN, as `amax` and `amin` do):
/// one `u32` key for dtypes of 32 bits or fewer, the high and low `u32` halves of a `u64`
/// key for the 64-bit ones (so that every device's 32-bit atomics suffice).
fn ordered_keys(x: &Tensor, largest: bool) -> Vec<Tensor> {
    use tessel_shape::Scalar;
    let (wide, word) = match x.dtype() {
        DType::F8E4M3 | DType::F8E5M2 | DType::F16 | DType::BF16 | DType::F32 => {
            (DType::F32, DType::U32)
        }
        DType::I8 | DType::I16 | DType::I32 => (DType::I32, DType::U32),
        DType::Bool | DType::U8 | DType::U16 | DType::U32 => (DType::U32, DType::U32),
        DType::F64 => (DType::F64, DType::U64),
        DType::I64 => (DType::I64, DType::U64),
        DType::U64 => (DType::U64, DType::U64),
    };
    let wide_x = x.cast_to(wide);
    let bits = wide_x.reinterpret(word);
    let k = |v: u64| match word {
        DType::U32 => bits.full_like_scalar(Scalar::U32(v as u32), word),
        _ => bits.full_like_scalar(Scalar::U64(v), word),
    };
    let width = 8 * word.size_bytes() as u64;
    let sign = 1u64 << (width - 1);
    let all = if width == 64 {
        u64::MAX
    } else {
        (1 << width) - 1
    };
    let mut key = if wide.is_float() {
        // Negative floats order reversed in their bits: flip them all; flip the sign of
        // the others.
        let negative = bits
            .raw_binary(BinaryOp::Shr, &k(width - 1))
            .raw_binary(BinaryOp::Eq, &k(1));
        bits.raw_binary(BinaryOp::Xor, &negative.raw_where(&k(all), &k(sign)))
    } else if wide.is_signed() {
        bits.raw_binary(BinaryOp::Xor, &k(sign))
    } else {
        bits.clone()
    };
    if !largest {
        key = key.raw_binary(BinaryOp::Xor, &k(all));
    }
    if wide.is_float() {
        key = wide_x.isnan().raw_where(&k(all), &key);
    }
    if word == DType::U32 {
        return vec![key];
    }
    let high = key.raw_binary(BinaryOp::Shr, &k(32)).cast_to(DType::U32);
    vec![high, key.cast_to(DType::U32)]
}

/// Whether each source's value is the largest (`largest`) or smallest of those sent to
/// its position, NaN counting as the extreme either way: atomic maxima of ordered keys,
/// compared back at each source through a gather (two rounds for 64-bit keys).
fn reaches_extreme(
    index: &Tensor,
    src: &Tensor,
    axis: usize,
    n: Dim,
    largest: bool,
) -> Result<Tensor> {
    let mut reached: Option<Tensor> = None;
    for key in ordered_keys(src, largest) {
        let candidate = match &reached {
            Some(r) => r.raw_where(
                &key,
                &key.full_like_scalar(tessel_shape::Scalar::U32(0), DType::U32),
            ),
            None => key.clone(),
        };
        let best = scatter_max_into_zeros(index, &candidate, axis, n);
        let equal = key.raw_binary(BinaryOp::Eq, &pick(&best, index, axis));
        reached = Some(match reached {
            Some(r) => r.logical_and(&equal)?,
            None => equal,
        });
    }
    Ok(reached.expect("ordered_keys gives one or two keys"))
}

// === Scatters and data-dependent sizes ===

impl Tensor {
    /// `self` with `src[.., j, ..]` written at `index[.., j, ..]` along `dim`
    /// (`Tensor.scatter`). Where several `j` name one position, the last one wins (`PyTorch`
    /// leaves that order undefined). Shapes follow [`Tensor::scatter_add`]. A write to an
    /// index outside `0..self.size(dim)` (a negative one included) is dropped, or is an
    /// error in checked mode (see [`Tensor::set_checked_indexing`]).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![0i32; 4], [4])?;
    /// let i = Tensor::from_vec(vec![3i64, 1, 3], [3])?;
    /// let s = Tensor::from_vec(vec![7i32, 8, 9], [3])?;
    /// assert_eq!(t.scatter(0, &i, &s)?.to_vec::<i32>()?, vec![0, 8, 0, 9]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn scatter(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        const OP: &str = "scatter";
        let plan = ScatterPlan::new(OP, self, dim, index, src)?;
        let axis = plan.axis;
        // The last source position that writes each destination: an atomic maximum, once
        // per source row where the index is a broadcast.
        let n = self.shape()[axis];
        let writer = match compact_index(index, axis) {
            Some(rows) => {
                let mut spread = index.shape().clone().into_dims();
                spread[axis] = n;
                last_writer(OP, &rows, axis, n, None)?.broadcast_to_shape(&Shape::new(spread))
            }
            None => last_writer(OP, index, axis, n, None)?,
        };
        let (value, written) = read_last(&plan.src, index, &writer, axis);
        let (written, value) = (plan.pad(&written, false)?, plan.pad(&value, 0)?);
        Ok(written.raw_where(&value, self))
    }

    /// `self` plus every `src[.., j, ..]` added at `index[.., j, ..]` along `dim`
    /// (`Tensor.scatter_add`); repeated indices add up. `index` has the rank of `self`
    /// and `src`, is no larger than `src` in any dim, and no larger than `self` in the
    /// others; `src` has `self`'s dtype. Integers wrap; `f16`/`bf16` add in `f32`. A value
    /// sent to an index outside `0..self.size(dim)` (a negative one included) is dropped,
    /// or is an error in checked mode (see [`Tensor::set_checked_indexing`]).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1.0f32; 3], [3])?;
    /// let i = Tensor::from_vec(vec![0i64, 2, 0], [3])?;
    /// let s = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3])?;
    /// assert_eq!(t.scatter_add(0, &i, &s)?.to_vec::<f32>()?, vec![5.0, 1.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        scatter_reduce_impl(self, "scatter_add", dim, index, src, "sum", true)
    }

    /// `self` plus each slice `source[.., j, ..]` along `dim` added at slice `index[j]`
    /// (`Tensor.index_add`; multiply `source` for PyTorch's `alpha`): `index` is 1-d (i32
    /// or i64) with one entry per slice of `source` along `dim`, and `source` has `self`'s
    /// shape in every other dim and `self`'s dtype. Repeated indices add up, by atomic adds
    /// on the device (in no fixed order); integers wrap, `f16`/`bf16` add in `f32`. A slice
    /// sent to an index outside `0..self.size(dim)` is dropped, or is an error in checked
    /// mode (see [`Tensor::set_checked_indexing`]). This is embedding's gradient.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![0.0f32; 6], [3, 2])?;
    /// let i = Tensor::from_vec(vec![2i64, 0, 2], [3])?;
    /// let s = Tensor::from_vec(vec![1.0f32, 1.0, 2.0, 2.0, 3.0, 3.0], [3, 2])?;
    /// assert_eq!(t.index_add(0, &i, &s)?.to_vec::<f32>()?, vec![2.0, 2.0, 0.0, 0.0, 4.0, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn index_add(&self, dim: i64, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        const OP: &str = "index_add";
        check_index(OP, self, index)?;
        let axis = rules::normalize_axis(OP, dim, self.shape())?;
        let fits = index.ndim() == 1
            && source.ndim() == self.ndim()
            && source.shape()[axis] == index.shape()[0]
            && (0..self.ndim()).all(|d| d == axis || source.shape()[d] == self.shape()[d]);
        if !fits {
            return Err(invalid(
                OP,
                format!(
                    "needs a 1-d index with one entry per slice of source along dim {axis} and a source shaped like the input elsewhere; got input {}, index {}, source {}",
                    self.shape(),
                    index.shape(),
                    source.shape()
                ),
            ));
        }
        let mut along = vec![Dim::constant(1); self.ndim()];
        along[axis] = index.shape()[0];
        let spread = index
            .reshape_to(Shape::new(along))
            .broadcast_to_shape(source.shape());
        scatter_reduce_impl(self, OP, dim, &spread, source, "sum", true)
    }

    /// `self` with `values` written at the positions the index tensors name in its leading
    /// dims (`Tensor.index_put` with a tuple of index tensors, as `t[i, j] = v`):
    /// `indices[d]` (i32 or i64) indexes dim `d`; they broadcast together to a shape `B`,
    /// and `values` broadcasts to `B` followed by the dims the indices do not cover. With
    /// `accumulate`, repeated positions add up (atomic adds, as [`Tensor::index_add`]);
    /// without, one of the writes to a repeated position wins (`PyTorch` leaves which
    /// undefined; here the last). A position with any index outside its dim (negative ones
    /// included) is dropped, or is an error in checked mode.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![0i32; 6], [2, 3])?;
    /// let (i, j) = (Tensor::from_vec(vec![0i64, 1, 1], [3])?, Tensor::from_vec(vec![2i64, 0, 0], [3])?);
    /// let v = Tensor::from_vec(vec![5i32, 7, 1], [3])?;
    /// assert_eq!(t.index_put(&[&i, &j], &v, true)?.to_vec::<i32>()?, vec![0, 0, 5, 8, 0, 0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn index_put(
        &self,
        indices: &[&Tensor],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor> {
        const OP: &str = "index_put";
        if indices.is_empty() || indices.len() > self.ndim() {
            return Err(invalid(
                OP,
                format!(
                    "needs between 1 and {} index tensors for an input {}, got {}",
                    self.ndim(),
                    self.shape(),
                    indices.len()
                ),
            ));
        }
        let mut batch = indices[0].shape().clone();
        for i in indices {
            check_index(OP, self, i)?;
            batch = rules::broadcast(OP, &batch, i.shape())?;
        }
        let dims = concrete(OP, self)?;
        let k = indices.len();
        // The leading dims as one flat position; -1 where any index is out of its dim.
        let mut flat: Option<Tensor> = None;
        let mut inside: Option<Tensor> = None;
        for (d, i) in indices.iter().enumerate() {
            check_range(OP, i, self.shape()[d])?;
            let i = i.broadcast_to_shape(&batch).cast_to(DType::I64);
            let ok = i.ge(0)?.logical_and(&i.lt(i64_of(dims[d]))?)?;
            let stride: usize = dims[d + 1..k].iter().product();
            let term = (&i * i64_of(stride))?;
            flat = Some(match flat {
                Some(f) => (&f + &term)?,
                None => term,
            });
            inside = Some(match inside {
                Some(a) => a.logical_and(&ok)?,
                None => ok,
            });
        }
        let (Some(flat), Some(inside)) = (flat, inside) else {
            unreachable!("at least one index tensor, checked above")
        };
        let positions = Tensor::where_cond(&inside, &flat, -1i64)?;
        let m = batch.numel();
        let positions = positions.reshape_to(Shape::new(vec![m]));
        let rest: Vec<Dim> = self.shape().dims()[k..].to_vec();
        let lead: usize = dims[..k].iter().product();
        let mut target = vec![Dim::from(lead)];
        target.extend(rest.iter().copied());
        let view = self.reshape_to(Shape::new(target));
        let mut spread = batch.clone().into_dims();
        spread.extend(rest.iter().copied());
        let spread = Shape::new(spread);
        if rules::broadcast(OP, values.shape(), &spread)? != spread {
            return Err(invalid(
                OP,
                format!(
                    "values {} must broadcast to {spread} (the indices' shape, then the dims they do not index)",
                    values.shape()
                ),
            ));
        }
        let values = values.broadcast_to_shape(&spread);
        let mut rows = vec![m];
        rows.extend(rest.iter().copied());
        let values = values.reshape_to(Shape::new(rows));
        let out = if accumulate {
            view.index_add(0, &positions, &values)?
        } else {
            let mut along = vec![Dim::constant(1); values.ndim()];
            along[0] = m;
            let index = positions
                .reshape_to(Shape::new(along))
                .broadcast_to_shape(values.shape());
            view.scatter(0, &index, &values)?
        };
        Ok(out.reshape_to(self.shape().clone()))
    }

    /// `Tensor.scatter_reduce`: every `src[.., j, ..]` combined into position
    /// `index[.., j, ..]` along `dim` by `reduce`, one of `"sum"`, `"prod"`, `"mean"`,
    /// `"amax"`, `"amin"`; with `include_self` the value of `self` there takes part, else
    /// only the scattered values do (positions no index names keep `self`'s value).
    /// `"mean"` needs a float dtype. Shapes and out-of-range indices as in
    /// [`Tensor::scatter_add`].
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![5.0f32, 5.0], [2])?;
    /// let i = Tensor::from_vec(vec![0i64, 0, 1], [3])?;
    /// let s = Tensor::from_vec(vec![1.0f32, 9.0, 2.0], [3])?;
    /// let m = t.scatter_reduce(0, &i, &s, "amax", false)?;
    /// assert_eq!(m.to_vec::<f32>()?, vec![9.0, 2.0]);
    /// let m = t.scatter_reduce(0, &i, &s, "mean", true)?;
    /// assert_eq!(m.to_vec::<f32>()?, vec![5.0, 3.5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn scatter_reduce(
        &self,
        dim: i64,
        index: &Tensor,
        src: &Tensor,
        reduce: &str,
        include_self: bool,
    ) -> Result<Tensor> {
        scatter_reduce_impl(
            self,
            "scatter_reduce",
            dim,
            index,
            src,
            reduce,
            include_self,
        )
    }

    /// The elements where `mask` is true, as a 1-d tensor (`torch.masked_select`);
    /// `self` and `mask` broadcast together. The result's length depends on the mask's
    /// values: the positions are a prefix sum of the mask on the device, and only their
    /// count is read back (which **synchronizes**, as in `PyTorch`); the values are then
    /// placed by a scatter, bit for bit.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![1i32, -2, 3, -4], [2, 2])?;
    /// assert_eq!(t.masked_select(&t.gt(0)?)?.to_vec::<i32>()?, vec![1, 3]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn masked_select(&self, mask: &Tensor) -> Result<Tensor> {
        const OP: &str = "masked_select";
        check_mask(OP, self, mask)?;
        super::indexing::no_float8(OP, self)?;
        let shape = rules::broadcast(OP, self.shape(), mask.shape())?;
        let flat = |t: &Tensor| {
            t.broadcast_to_shape(&shape)
                .reshape_to(Shape::new(vec![shape.numel()]))
        };
        let (positions, count) = compacted(&flat(mask))?;
        Ok(place_bits(&flat(self), &positions, count))
    }

    /// The coordinates of the non-zero elements, one row each in row-major order, as an
    /// `i64` tensor of shape `[count, ndim]` (`torch.nonzero`). NaN counts as non-zero,
    /// `-0.0` as zero. Computed on the device (a prefix sum places each element); only the
    /// count is read back, which **synchronizes**, as in `PyTorch`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from_vec(vec![0.0f32, 1.5, -2.0, 0.0], [2, 2])?;
    /// assert_eq!(t.nonzero()?.to_vec::<i64>()?, vec![0, 1, 1, 0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn nonzero(&self) -> Result<Tensor> {
        const OP: &str = "nonzero";
        super::indexing::no_float8(OP, self)?;
        let dims = concrete(OP, self)?;
        let flags = if self.dtype() == DType::Bool {
            self.clone()
        } else {
            let zero =
                self.full_like_scalar(tessel_shape::Scalar::zero(self.dtype()), self.dtype());
            self.raw_binary(BinaryOp::Ne, &zero)
        };
        let n = self.shape().numel();
        let flags = flags.reshape_to(Shape::new(vec![n]));
        let (positions, count) = compacted(&flags)?;
        // The flat index of each element, placed at its position among the non-zero ones.
        let flat = Tensor::record_on(self.device(), Op::Index(0), DType::I64, Shape::new(vec![n]));
        let found = place_bits(&flat, &positions, count).unsqueeze(1)?;
        // Row-major coordinates of each flat index, one column per dim.
        let mut columns = Vec::with_capacity(dims.len());
        let mut stride = 1i64;
        let int = |v: i64| found.full_like_scalar(tessel_shape::Scalar::I64(v), DType::I64);
        for &d in dims.iter().rev() {
            let coordinate = found
                .raw_binary(BinaryOp::Div, &int(stride))
                .raw_binary(BinaryOp::Rem, &int(i64_of(d)));
            columns.push(coordinate);
            stride *= i64_of(d);
        }
        columns.reverse();
        if columns.is_empty() {
            // A 0-d tensor has one element and no coordinates.
            return Tensor::zeros([count, 0], DType::I64).to(&self.device());
        }
        Tensor::cat(&columns.iter().collect::<Vec<_>>(), 1)
    }
}

impl Tensor {
    /// The same bits as `dtype`, which has this tensor's element size (checked by the
    /// callers): `bitcast` without its checks.
    pub(super) fn reinterpret(&self, dtype: DType) -> Tensor {
        debug_assert_eq!(self.dtype().size_bytes(), dtype.size_bytes());
        self.record(Op::Bitcast(self.node()), dtype, self.shape().clone())
    }
}

/// For a 1-d `bool` mask: each true element's position among the true ones (`-1` for the
/// others, which a scatter drops), by a prefix sum on the device, and their count, read
/// back from the device (the one synchronization a data-dependent size needs).
fn compacted(flags: &Tensor) -> Result<(Tensor, usize)> {
    let n = flags.shape().numel();
    if n.as_const() == Some(0) {
        return Ok((flags.cast_to(DType::I64), 0));
    }
    let running = flags.cast_to(DType::I64).cumsum(0)?;
    let count = running.narrow(0, -1, 1)?.item::<i64>()?;
    let positions = flags.raw_where(
        &running.raw_binary(
            BinaryOp::Sub,
            &running.full_like_scalar(tessel_shape::Scalar::I64(1), DType::I64),
        ),
        &running.full_like_scalar(tessel_shape::Scalar::I64(-1), DType::I64),
    );
    Ok((positions, usize::try_from(count).unwrap_or(0)))
}

/// A 1-d tensor of `len` elements where element `positions[i]` is `values[i]` (each
/// position named at most once; `-1` names none), bit for bit in every dtype: the bits go
/// through a scatter-add into zeros in 32-bit words, which only atomic adds of 32 bits
/// need.
pub(super) fn place_bits(values: &Tensor, positions: &Tensor, len: usize) -> Tensor {
    let dtype = values.dtype();
    let shape = Shape::new(vec![Dim::from(len)]);
    let scatter = |word: &Tensor| {
        word.record(
            Op::Scatter(AtomicOp::Add, positions.node(), word.node(), 0),
            DType::U32,
            shape.clone(),
        )
    };
    let word = |x: &Tensor| -> Tensor {
        match dtype.size_bytes() {
            4 => x.reinterpret(DType::U32),
            2 => x.reinterpret(DType::U16).cast_to(DType::U32),
            _ if dtype == DType::Bool => x.cast_to(DType::U32),
            _ => x.reinterpret(DType::U8).cast_to(DType::U32),
        }
    };
    if dtype.size_bytes() == 8 {
        let bits = values.reinterpret(DType::U64);
        let k32 = bits.full_like_scalar(tessel_shape::Scalar::U64(32), DType::U64);
        let lo = scatter(&bits.cast_to(DType::U32)).cast_to(DType::U64);
        let hi =
            scatter(&bits.raw_binary(BinaryOp::Shr, &k32).cast_to(DType::U32)).cast_to(DType::U64);
        let k32 = lo.full_like_scalar(tessel_shape::Scalar::U64(32), DType::U64);
        return hi
            .raw_binary(BinaryOp::Shl, &k32)
            .raw_binary(BinaryOp::Or, &lo)
            .reinterpret(dtype);
    }
    let placed = scatter(&word(values));
    match dtype.size_bytes() {
        4 => placed.reinterpret(dtype),
        2 => placed.cast_to(DType::U16).reinterpret(dtype),
        _ if dtype == DType::Bool => placed.cast_to(DType::Bool),
        _ => placed.cast_to(DType::U8).reinterpret(dtype),
    }
}

/// The checked operands of a scatter: the axis, `src` cut to `index`'s shape, and the
/// pads that grow an `index`-shaped result (with `self`'s size along the axis) to `self`.
struct ScatterPlan {
    axis: usize,
    src: Tensor,
    pads: Vec<(i64, i64)>,
}

impl ScatterPlan {
    fn new(op: &'static str, x: &Tensor, dim: i64, index: &Tensor, src: &Tensor) -> Result<Self> {
        check_index(op, x, index)?;
        x.same_device(src, op)?;
        if src.dtype() != x.dtype() {
            return Err(invalid(
                op,
                format!(
                    "src is {} but the input is {}; cast src with .cast(DType::{:?})",
                    src.dtype(),
                    x.dtype(),
                    x.dtype()
                ),
            ));
        }
        if index.ndim() != x.ndim() || src.ndim() != x.ndim() {
            return Err(invalid(
                op,
                format!(
                    "input {}, index {} and src {} must have one rank",
                    x.shape(),
                    index.shape(),
                    src.shape()
                ),
            ));
        }
        let axis = rules::normalize_axis(op, dim, x.shape())?;
        let (xd, id, sd) = (concrete(op, x)?, concrete(op, index)?, concrete(op, src)?);
        let mut cut = src.clone();
        let mut pads = Vec::with_capacity(xd.len());
        for d in 0..xd.len() {
            if id[d] > sd[d] || (d != axis && id[d] > xd[d]) {
                return Err(invalid(
                    op,
                    format!(
                        "index {} is larger than src {} or (in a dim other than {axis}) the input {} in dim {d}; the index may not exceed them",
                        index.shape(),
                        src.shape(),
                        x.shape()
                    ),
                ));
            }
            cut = cut.narrow(i64_of(d), 0, i64_of(id[d]))?;
            pads.push((0, if d == axis { 0 } else { i64_of(xd[d] - id[d]) }));
        }
        check_range(op, index, x.shape()[axis])?;
        Ok(ScatterPlan {
            axis,
            src: cut,
            pads,
        })
    }

    fn pad(&self, t: &Tensor, value: impl ScalarOperand) -> Result<Tensor> {
        t.pad(&self.pads, value)
    }
}

fn scatter_reduce_impl(
    x: &Tensor,
    op: &'static str,
    dim: i64,
    index: &Tensor,
    src: &Tensor,
    reduce: &str,
    include_self: bool,
) -> Result<Tensor> {
    let plan = ScatterPlan::new(op, x, dim, index, src)?;
    let rop = match reduce {
        "sum" | "mean" => ReduceOp::Sum,
        "prod" => ReduceOp::Prod,
        "amax" => ReduceOp::Max,
        "amin" => ReduceOp::Min,
        other => {
            return Err(invalid(
                op,
                format!(
                    "unknown reduce {other:?}; use \"sum\", \"prod\", \"mean\", \"amax\" or \"amin\""
                ),
            ));
        }
    };
    if x.dtype() == DType::Bool
        || x.dtype().is_float8()
        || (reduce == "mean" && !x.dtype().is_float())
    {
        return Err(Error::UnsupportedDType {
            op,
            dtype: x.dtype(),
            hint: "scatter reductions take numeric tensors other than float8 (\"mean\" a float one); cast first",
        });
    }
    let axis = plan.axis;
    let n = x.shape()[axis];
    let work = scatter_dtype(x.dtype());
    let base = x.cast_to(work);
    if rop == ReduceOp::Sum {
        // Atomic adds on the device: one pass over the sources, no [index, n] selection.
        let reduced = plan.pad(&scatter_add_into_zeros(index, &plan.src, axis, n)?, 0)?;
        // Integers add exactly; a float position nothing is added to keeps its value,
        // `-0.0` included (`-0.0 + 0.0` would be `+0.0`), which needs the counts.
        if reduce == "sum" && include_self && !x.dtype().is_float() {
            return Ok(base.add(&reduced)?.cast_to(x.dtype()));
        }
        let ones = index.full_like_scalar(tessel_shape::Scalar::I32(1), DType::I32);
        let counts = plan.pad(&scatter_add_into_zeros(index, &ones, axis, n)?, 0)?;
        let combined = match (reduce, include_self) {
            ("sum", true) => base.add(&reduced)?,
            ("sum", false) => reduced,
            (_, true) => base.add(&reduced)?.div(counts.add(1)?.cast_to(work))?,
            (_, false) => reduced.div(counts.cast_to(work))?,
        };
        let written = counts.gt(0)?;
        return Ok(written.raw_where(&combined, &base).cast_to(x.dtype()));
    }
    if matches!(rop, ReduceOp::Max | ReduceOp::Min) {
        // The last source holding each position's extreme, read back by a gather.
        let largest = rop == ReduceOp::Max;
        let writer = extreme_writer(op, index, &plan.src, axis, n, largest)?;
        let (value, written) = read_last(&plan.src, index, &writer, axis);
        let (written, value) = (plan.pad(&written, false)?, plan.pad(&value, 0)?);
        let combined = match (include_self, largest) {
            (false, _) => value,
            (true, true) => x.maximum(&value)?,
            (true, false) => x.minimum(&value)?,
        };
        return Ok(written.raw_where(&combined, x));
    }
    // Products: no atomic multiply; the sorted form is exact to a reassociation and
    // differentiable, zeros included.
    let src = plan.src.cast_to(work);
    let (reduced, written) = reduce_sorted(op, index, &src, axis, n, ReduceOp::Prod)?;
    let (reduced, written) = (plan.pad(&reduced, 1)?, plan.pad(&written, false)?);
    let combined = if include_self {
        base.mul(&reduced)?
    } else {
        reduced
    };
    Ok(written.raw_where(&combined, &base).cast_to(x.dtype()))
}
