//! Hand-built kernels: worked examples of [`KernelBuilder`] and the shared test corpus that
//! the reference interpreter and every backend run.
//!
//! Each function documents its parameter layout (buffers in parameter order, then dims) and
//! its launch grid, and returns a kernel that has passed the verifier. Index arithmetic is
//! `i32`, as generated code on every device prefers it; sizes whose indices would not fit
//! in `i32`, zero sizes and other unusable arguments are rejected with a [`VerifyError`] of
//! kind [`VerifyErrorKind::Param`] naming the argument, rather than a panic.
//!
//! ```
//! use tessel_ir::samples;
//! use tessel_shape::DType;
//!
//! let kernel = samples::vector_add(DType::F32, 1000, 64).unwrap();
//! assert_eq!(kernel.params.len(), 3);
//! assert!(samples::tiled_matmul(30, 32, 32, 8).is_err()); // 30 is not a multiple of 8
//! ```

// `VerifyError` is what `KernelBuilder::build` returns; its size is the verifier's to choose.
#![allow(clippy::result_large_err)]

use tessel_shape::{BinaryOp, DType, Expr, Scalar, TernaryOp, Var};

use crate::builder::KernelBuilder;
use crate::kernel::{Access, AtomicOp, Kernel};
use crate::verify::{VerifyError, VerifyErrorKind};

/// The dtype of every index computed by the samples.
const INDEX: DType = DType::I32;

/// Invocations per workgroup for the samples whose workgroup size is not a parameter.
const LOCAL: usize = 64;

/// The error for an unusable sample argument, attributed to the kernel it would have built.
fn invalid(kernel: &str, why: String) -> VerifyError {
    VerifyError {
        kernel: kernel.to_owned(),
        at: None,
        text: String::new(),
        kind: VerifyErrorKind::Param(why),
    }
}

/// `value` as an index constant, if it is positive and fits [`INDEX`].
fn index_size(kernel: &str, what: &str, value: usize) -> Result<i64, VerifyError> {
    if value == 0 {
        return Err(invalid(kernel, format!("{what} must be positive")));
    }
    match i32::try_from(value) {
        Ok(v) => Ok(i64::from(v)),
        Err(_) => Err(invalid(
            kernel,
            format!("{what} = {value} does not fit the i32 index arithmetic"),
        )),
    }
}

/// The product of `sizes`, if it is positive and fits [`INDEX`].
fn index_product(kernel: &str, what: &str, sizes: &[usize]) -> Result<i64, VerifyError> {
    let product = sizes
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .ok_or_else(|| invalid(kernel, format!("{what} overflows")))?;
    index_size(kernel, what, product)
}

/// `out[i] = a[i] + b[i]` for `i < n`, one invocation per element.
///
/// - Parameters: `a: dtype[n] read`, `b: dtype[n] read`, `out: dtype[n] write`.
/// - Grid: `ceil(n / local)` workgroups of `local` invocations along x; the last workgroup
///   may over-cover `n`, so the body is guarded by `if i < n`.
///
/// `add` on `bool` is logical or (see [`BinaryOp::Add`]), so every dtype works.
pub fn vector_add(dtype: DType, n: usize, local: usize) -> Result<Kernel, VerifyError> {
    const NAME: &str = "vector_add";
    let n_c = index_size(NAME, "n", n)?;
    let local_c = index_size(NAME, "local", local)?;
    let groups = n.div_ceil(local);
    // The over-covering invocations compute their global id too, so it must fit as well.
    index_product(NAME, "the grid's invocation count", &[groups, local])?;
    let groups_c = groups as i64;

    let mut kb = KernelBuilder::new(NAME);
    let a = kb.buffer("a", dtype, n_c, Access::Read);
    let b = kb.buffer("b", dtype, n_c, Access::Read);
    let out = kb.buffer("out", dtype, n_c, Access::Write);
    // The grid comes before `global_id`, which reads the local size from it.
    kb.grid([groups_c, 1, 1], [local_c, 1, 1]);
    let i = kb.global_id(0, INDEX);
    let n_v = kb.constant_as(n_c, INDEX);
    let in_range = kb.lt(i, n_v);
    kb.if_(in_range, |kb| {
        let x = kb.load(a, i);
        let y = kb.load(b, i);
        let sum = kb.add(x, y);
        kb.store(out, i, sum);
    });
    kb.build()
}

/// `out[i] = a[i] + b[i]` for `i < n`, `per` consecutive elements per invocation, as
/// lowering writes an upcast elementwise kernel: every invocation loads its `per`
/// elements of `a` and `b` one at a time at `per·g + j`, adds, then stores the `per`
/// sums (the shape `passes::vectorize` merges into vector accesses).
///
/// - Parameters: `a: dtype[n] read`, `b: dtype[n] read`, `out: dtype[n] write`; `n` a
///   multiple of `per`.
/// - Grid: `ceil(n / per / local)` workgroups of `local` invocations along x, guarded by
///   `if g < n / per`.
pub fn upcast_add(dtype: DType, n: usize, per: usize, local: usize) -> Result<Kernel, VerifyError> {
    const NAME: &str = "upcast_add";
    let n_c = index_size(NAME, "n", n)?;
    let per_c = index_size(NAME, "per", per)?;
    let local_c = index_size(NAME, "local", local)?;
    if !n.is_multiple_of(per) {
        return Err(invalid(
            NAME,
            format!("n = {n} is not a multiple of per = {per}"),
        ));
    }
    let groups = (n / per).div_ceil(local);
    index_product(NAME, "the grid's invocation count", &[groups, local])?;

    let mut kb = KernelBuilder::new(NAME);
    let a = kb.buffer("a", dtype, n_c, Access::Read);
    let b = kb.buffer("b", dtype, n_c, Access::Read);
    let out = kb.buffer("out", dtype, n_c, Access::Write);
    kb.grid([groups as i64, 1, 1], [local_c, 1, 1]);
    let g = kb.global_id(0, INDEX);
    let count = kb.constant_as(n_c / per_c, INDEX);
    let in_range = kb.lt(g, count);
    kb.if_(in_range, |kb| {
        let per_v = kb.constant_as(per_c, INDEX);
        let base = kb.mul(g, per_v);
        let mut sums = Vec::new();
        for j in 0..per_c {
            let at = if j == 0 {
                base
            } else {
                let j = kb.constant_as(j, INDEX);
                kb.add(base, j)
            };
            let (x, y) = (kb.load(a, at), kb.load(b, at));
            sums.push((at, kb.add(x, y)));
        }
        for (at, sum) in sums {
            kb.store(out, at, sum);
        }
    });
    kb.build()
}

/// `out = x.permute(perm)` materialized contiguously: a strided gather.
///
/// `x` is a contiguous `f32` tensor of `shape`; `out` is contiguous with shape
/// `[shape[perm[0]], shape[perm[1]], shape[perm[2]]]`, and output axis `j` walks input axis
/// `perm[j]` (`torch.permute`'s convention). Each invocation owns one output element: it
/// splits its linear index into output coordinates with `div`/`rem` and dots them with the
/// input strides of the axes they walk.
///
/// - Parameters: `x: f32[N] read`, `out: f32[N] write`, with `N` the product of `shape`.
/// - Grid: `ceil(N / 64)` workgroups of 64 invocations along x, guarded by `if i < N`.
pub fn permuted_copy(shape: [usize; 3], perm: [usize; 3]) -> Result<Kernel, VerifyError> {
    const NAME: &str = "permuted_copy";
    let mut seen = [false; 3];
    for &p in &perm {
        if p >= 3 || seen[p] {
            return Err(invalid(
                NAME,
                format!("perm {perm:?} is not a permutation of [0, 1, 2]"),
            ));
        }
        seen[p] = true;
    }
    for (axis, &d) in shape.iter().enumerate() {
        index_size(NAME, &format!("shape[{axis}]"), d)?;
    }
    let total = index_product(NAME, "the element count", &shape)?;
    let groups = (total as usize).div_ceil(LOCAL);
    index_product(NAME, "the grid's invocation count", &[groups, LOCAL])?;
    // Contiguous strides of the input, and the output's shape; all fit i32 as `total` does.
    let in_strides = [shape[1] * shape[2], shape[2], 1].map(|s| s as i64);
    let out_shape = perm.map(|p| shape[p] as i64);

    let mut kb = KernelBuilder::new(NAME);
    let x = kb.buffer("x", DType::F32, total, Access::Read);
    let out = kb.buffer("out", DType::F32, total, Access::Write);
    kb.grid([groups as i64, 1, 1], [LOCAL as i64, 1, 1]);
    let i = kb.global_id(0, INDEX);
    let total_v = kb.constant_as(total, INDEX);
    let in_range = kb.lt(i, total_v);
    kb.if_(in_range, |kb| {
        // Row-major output coordinates (o0, o1, o2) of element i.
        let d2 = kb.constant_as(out_shape[2], INDEX);
        let o2 = kb.rem(i, d2);
        let rest = kb.div(i, d2);
        let d1 = kb.constant_as(out_shape[1], INDEX);
        let o1 = kb.rem(rest, d1);
        let o0 = kb.div(rest, d1);
        // Output axis j walks input axis perm[j], so it steps by that axis's input stride.
        let s0 = kb.constant_as(in_strides[perm[0]], INDEX);
        let src = kb.mul(o0, s0);
        let s1 = kb.constant_as(in_strides[perm[1]], INDEX);
        let src = kb.ternary(TernaryOp::MulAdd, o1, s1, src);
        let s2 = kb.constant_as(in_strides[perm[2]], INDEX);
        let src = kb.ternary(TernaryOp::MulAdd, o2, s2, src);
        let v = kb.load(x, src);
        kb.store(out, i, v);
    });
    kb.build()
}

/// `out[r] = Σ_c x[r, c]` for a row-major `rows × cols` matrix, one invocation per row,
/// accumulating in a one-element register array.
///
/// - Parameters: `x: dtype[rows * cols] read`, `out: dtype[rows] write`.
/// - Grid: `ceil(rows / 64)` workgroups of 64 invocations along x, guarded by `if r < rows`.
///
/// The sum runs in `dtype` itself, left to right: wrapping for integers, logical or for
/// `bool`, and rounded after every addition for floats.
pub fn row_sum(rows: usize, cols: usize, dtype: DType) -> Result<Kernel, VerifyError> {
    const NAME: &str = "row_sum";
    let rows_c = index_size(NAME, "rows", rows)?;
    let cols_c = index_size(NAME, "cols", cols)?;
    let len = index_product(NAME, "rows * cols", &[rows, cols])?;
    let groups = rows.div_ceil(LOCAL);
    index_product(NAME, "the grid's invocation count", &[groups, LOCAL])?;

    let mut kb = KernelBuilder::new(NAME);
    let x = kb.buffer("x", dtype, len, Access::Read);
    let out = kb.buffer("out", dtype, rows_c, Access::Write);
    kb.grid([groups as i64, 1, 1], [LOCAL as i64, 1, 1]);
    let acc = kb.reg(dtype, 1);
    let r = kb.global_id(0, INDEX);
    let rows_v = kb.constant_as(rows_c, INDEX);
    let in_range = kb.lt(r, rows_v);
    kb.if_(in_range, |kb| {
        let zero = kb.constant_as(0, INDEX);
        // Registers are not initialized on every backend: write before reading.
        let zero_acc = kb.constant(Scalar::zero(dtype));
        kb.store(acc, zero, zero_acc);
        let cols_v = kb.constant_as(cols_c, INDEX);
        kb.range(zero, cols_v, |kb, c| {
            let at = kb.ternary(TernaryOp::MulAdd, r, cols_v, c);
            let v = kb.load(x, at);
            let sum = kb.load(acc, zero);
            let sum = kb.add(sum, v);
            kb.store(acc, zero, sum);
        });
        let sum = kb.load(acc, zero);
        kb.store(out, r, sum);
    });
    kb.build()
}

/// Per-workgroup sums of `x`: workgroup `g` writes `partial[g] = Σ x[g*local .. (g+1)*local]`
/// (elements past `n` count as 0), by a tree reduction in local memory.
///
/// Each invocation stages one element in local memory; then `log2(local)` steps halve the
/// active stride, invocations below the stride adding in their partner's element, with a
/// barrier after each step. The steps are a `Range` with constant bounds and the stride is
/// computed from the step (`local >> (step + 1)`), so every invocation of a workgroup runs
/// the loop the same number of times and reaches every barrier; the invocation-dependent
/// `if lid < stride` blocks contain no barrier.
///
/// - Parameters: `x: f32[n] read`, `partial: f32[ceil(n / local)] write`.
/// - Grid: `ceil(n / local)` workgroups of `local` invocations along x; `local` must be a
///   power of two.
pub fn tree_reduce(n: usize, local: usize) -> Result<Kernel, VerifyError> {
    const NAME: &str = "tree_reduce";
    let n_c = index_size(NAME, "n", n)?;
    let local_c = index_size(NAME, "local", local)?;
    if !local.is_power_of_two() {
        return Err(invalid(
            NAME,
            format!("local = {local} must be a power of two"),
        ));
    }
    let groups = n.div_ceil(local);
    index_product(NAME, "the grid's invocation count", &[groups, local])?;
    let groups_c = groups as i64;
    let steps = i64::from(local.trailing_zeros());

    let mut kb = KernelBuilder::new(NAME);
    let x = kb.buffer("x", DType::F32, n_c, Access::Read);
    let partial = kb.buffer("partial", DType::F32, groups_c, Access::Write);
    kb.grid([groups_c, 1, 1], [local_c, 1, 1]);
    let scratch = kb.local(DType::F32, local);
    let lid = kb.local_id(0, INDEX);
    let i = kb.global_id(0, INDEX);
    let zero_f = kb.constant(0.0f32);
    kb.store(scratch, lid, zero_f);
    let n_v = kb.constant_as(n_c, INDEX);
    let in_range = kb.lt(i, n_v);
    kb.if_(in_range, |kb| {
        let v = kb.load(x, i);
        kb.store(scratch, lid, v);
    });
    kb.barrier();
    let zero = kb.constant_as(0, INDEX);
    let steps_v = kb.constant_as(steps, INDEX);
    let one = kb.constant_as(1, INDEX);
    let local_v = kb.constant_as(local_c, INDEX);
    kb.range(zero, steps_v, |kb, step| {
        let shift = kb.add(step, one);
        let stride = kb.binary(BinaryOp::Shr, local_v, shift);
        let active = kb.lt(lid, stride);
        kb.if_(active, |kb| {
            let partner = kb.add(lid, stride);
            let mine = kb.load(scratch, lid);
            let theirs = kb.load(scratch, partner);
            let sum = kb.add(mine, theirs);
            kb.store(scratch, lid, sum);
        });
        kb.barrier();
    });
    let first = kb.binary(BinaryOp::Eq, lid, zero);
    kb.if_(first, |kb| {
        let g = kb.group_id(0, INDEX);
        let total = kb.load(scratch, zero);
        kb.store(partial, g, total);
    });
    kb.build()
}

/// `c = a · b` for row-major `f32` matrices `a: m × k`, `b: k × n`, `c: m × n`, tiled
/// through local memory.
///
/// Workgroup `(gx, gy)` computes the `tile × tile` block of `c` at rows `gy*tile..`, columns
/// `gx*tile..`; invocation `(tx, ty)` owns element `(gy*tile + ty, gx*tile + tx)`. For each
/// of the `k / tile` steps the workgroup stages one tile of `a` and one of `b` in local
/// memory (each invocation loads one element of each), waits at a barrier, accumulates its
/// dot product over the tile into a register, and waits again before the tiles are
/// overwritten.
///
/// - Parameters: `a: f32[m * k] read`, `b: f32[k * n] read`, `c: f32[m * n] write`.
/// - Grid: `(n / tile, m / tile, 1)` workgroups of `(tile, tile, 1)` invocations.
///
/// `m`, `n` and `k` must be multiples of `tile` (no edge handling), or an error is returned.
pub fn tiled_matmul(m: usize, n: usize, k: usize, tile: usize) -> Result<Kernel, VerifyError> {
    const NAME: &str = "tiled_matmul";
    let tile_c = index_size(NAME, "tile", tile)?;
    for (what, size) in [("m", m), ("n", n), ("k", k)] {
        index_size(NAME, what, size)?;
        if size % tile != 0 {
            return Err(invalid(
                NAME,
                format!("{what} = {size} is not a multiple of tile = {tile}"),
            ));
        }
    }
    let a_len = index_product(NAME, "m * k", &[m, k])?;
    let b_len = index_product(NAME, "k * n", &[k, n])?;
    let c_len = index_product(NAME, "m * n", &[m, n])?;
    let tile_len = index_product(NAME, "tile * tile", &[tile, tile])?;
    let (m_c, n_c, k_c) = (m as i64, n as i64, k as i64);

    let mut kb = KernelBuilder::new(NAME);
    let a = kb.buffer("a", DType::F32, a_len, Access::Read);
    let b = kb.buffer("b", DType::F32, b_len, Access::Read);
    let c = kb.buffer("c", DType::F32, c_len, Access::Write);
    kb.grid([n_c / tile_c, m_c / tile_c, 1], [tile_c, tile_c, 1]);
    let a_tile = kb.local(DType::F32, tile_len as usize);
    let b_tile = kb.local(DType::F32, tile_len as usize);
    let acc = kb.reg(DType::F32, 1);
    let tx = kb.local_id(0, INDEX);
    let ty = kb.local_id(1, INDEX);
    let col = kb.global_id(0, INDEX);
    let row = kb.global_id(1, INDEX);
    let zero = kb.constant_as(0, INDEX);
    let zero_f = kb.constant(0.0f32);
    kb.store(acc, zero, zero_f);
    let tile_v = kb.constant_as(tile_c, INDEX);
    let k_v = kb.constant_as(k_c, INDEX);
    let n_v = kb.constant_as(n_c, INDEX);
    // This invocation's slot in both tiles: row ty, column tx.
    let slot = kb.ternary(TernaryOp::MulAdd, ty, tile_v, tx);
    let steps = kb.constant_as(k_c / tile_c, INDEX);
    kb.range(zero, steps, |kb, t| {
        let t0 = kb.mul(t, tile_v);
        // a[row, t0 + tx] and b[t0 + ty, col].
        let a_col = kb.add(t0, tx);
        let a_at = kb.ternary(TernaryOp::MulAdd, row, k_v, a_col);
        let a_val = kb.load(a, a_at);
        kb.store(a_tile, slot, a_val);
        let b_row = kb.add(t0, ty);
        let b_at = kb.ternary(TernaryOp::MulAdd, b_row, n_v, col);
        let b_val = kb.load(b, b_at);
        kb.store(b_tile, slot, b_val);
        kb.barrier();
        kb.range(zero, tile_v, |kb, kk| {
            let a_at = kb.ternary(TernaryOp::MulAdd, ty, tile_v, kk);
            let b_at = kb.ternary(TernaryOp::MulAdd, kk, tile_v, tx);
            let x = kb.load(a_tile, a_at);
            let y = kb.load(b_tile, b_at);
            let sum = kb.load(acc, zero);
            let sum = kb.ternary(TernaryOp::MulAdd, x, y, sum);
            kb.store(acc, zero, sum);
        });
        // The next step overwrites the tiles, which others may still be reading.
        kb.barrier();
    });
    let c_at = kb.ternary(TernaryOp::MulAdd, row, n_v, col);
    let sum = kb.load(acc, zero);
    kb.store(c, c_at, sum);
    kb.build()
}

/// `out[i] = a[i] + b[i]` in `f32` for a length `n` bound only at launch.
///
/// - Parameters: `a: f32[n] read`, `b: f32[n] read`, `out: f32[n] write`, then the dim
///   `n: i32` (declared by the guard's use of it).
/// - Grid: `ceil(n / local)` workgroups of `local` invocations along x, guarded by
///   `if i < n`.
///
/// `var` must be non-negative, and `var`'s upper bound plus `local` must fit `i32`.
pub fn dynamic_vector_add(var: Var, local: usize) -> Result<Kernel, VerifyError> {
    const NAME: &str = "dynamic_vector_add";
    let local_c = index_size(NAME, "local", local)?;
    let bounds = var.bounds();
    if bounds.lo < 0 {
        return Err(invalid(
            NAME,
            format!(
                "the length `{var}` may be negative (lower bound {})",
                bounds.lo
            ),
        ));
    }
    // The largest global id is below hi + local.
    if bounds
        .hi
        .checked_add(local_c)
        .is_none_or(|top| top > i64::from(i32::MAX))
    {
        return Err(invalid(
            NAME,
            format!(
                "the length `{var}` (up to {}) does not fit the i32 index arithmetic",
                bounds.hi
            ),
        ));
    }
    let n = Expr::from(var);

    let mut kb = KernelBuilder::new(NAME);
    let a = kb.buffer("a", DType::F32, n, Access::Read);
    let b = kb.buffer("b", DType::F32, n, Access::Read);
    let out = kb.buffer("out", DType::F32, n, Access::Write);
    kb.grid(
        [n.ceil_div(local_c), Expr::constant(1), Expr::constant(1)],
        [local_c, 1, 1],
    );
    let i = kb.global_id(0, INDEX);
    let n_v = kb.expr(n, INDEX);
    let in_range = kb.lt(i, n_v);
    kb.if_(in_range, |kb| {
        let x = kb.load(a, i);
        let y = kb.load(b, i);
        let sum = kb.add(x, y);
        kb.store(out, i, sum);
    });
    kb.build()
}

/// `out[idx[i]] = op(out[idx[i]], x[i])` for every `i < n` whose `idx[i]` lies in
/// `0..bins`, by atomic updates of a buffer the launch zeroes: a histogram-like scatter
/// where many invocations hit one element.
///
/// - Parameters: `idx: i32[n] read`, `x: dtype[n] read`, `out: dtype[bins] accumulate`.
/// - Grid: `ceil(n / 64)` workgroups of 64 invocations along x, guarded by `if i < n`.
pub fn scatter(op: AtomicOp, dtype: DType, n: usize, bins: usize) -> Result<Kernel, VerifyError> {
    const NAME: &str = "scatter";
    let n_c = index_size(NAME, "n", n)?;
    let bins_c = index_size(NAME, "bins", bins)?;
    let groups = n.div_ceil(LOCAL);
    index_product(NAME, "the grid's invocation count", &[groups, LOCAL])?;
    let mut kb = KernelBuilder::new(NAME);
    let idx = kb.buffer("idx", INDEX, n_c, Access::Read);
    let x = kb.buffer("x", dtype, n_c, Access::Read);
    let out = kb.buffer("out", dtype, bins_c, Access::Accumulate);
    kb.grid([groups as i64, 1, 1], [LOCAL as i64, 1, 1]);
    let i = kb.global_id(0, INDEX);
    let n_v = kb.constant_as(n_c, INDEX);
    let in_range = kb.lt(i, n_v);
    kb.if_(in_range, |kb| {
        let at = kb.load(idx, i);
        let v = kb.load(x, i);
        let zero = kb.constant_as(0, INDEX);
        let bins_v = kb.constant_as(bins_c, INDEX);
        let above = kb.binary(BinaryOp::Ge, at, zero);
        let below = kb.lt(at, bins_v);
        let inside = kb.binary(BinaryOp::And, above, below);
        kb.if_(inside, |kb| {
            let last = kb.constant_as(bins_c - 1, INDEX);
            let at = kb.binary(BinaryOp::Max, at, zero);
            let at = kb.binary(BinaryOp::Min, at, last);
            kb.atomic(op, out, at, v);
        });
    });
    kb.build()
}
