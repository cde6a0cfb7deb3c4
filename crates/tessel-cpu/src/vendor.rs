//! Library routines in place of generated kernels ([`tessel_ir::vendor`]): the matrix
//! product through the `gemm` crate, for `f32` and `f64`, and for `f16`/`bf16` as the
//! generated kernels compute them: operands widened to `f32`, summed in `f32` by gemm's
//! `f32` routine, rounded once at the end (gemm's own f16 routine sums in f16, and it has
//! no bf16 one). Integers get no program. An [`Epilogue`] (bias, `relu`, GELU) runs over the
//! finished sums in `f64` before they are stored (for halves, before they are rounded).
//!
//! A launch evaluates the op's sizes, locks its three buffers in id order (as kernel
//! launches do: `lhs` and `rhs` for reading, `out` for writing), checks every length, and
//! calls `gemm` once per product. Where to parallelize is chosen per launch: inside each
//! product when one is large enough for `gemm` to split, else across the batch, else not
//! at all (a hop to the pool costs more than a tiny product takes).

use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use gemm::Parallelism;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use rayon::ThreadPool;
use rayon::prelude::*;
use tessel_ir::{BackendError, BufferId, Epilogue, Matmul, MatmulSizes, VendorOp};
use tessel_shape::{Bindings, DType};

use crate::memory::{self, HostBuffer, Memory};

/// A vendor program: a [`Matmul`] whose element type `gemm` supports.
pub(crate) struct VendorProgram {
    op: Matmul,
}

impl VendorProgram {
    /// The program for `op`, or `None` where this backend has no routine for it.
    pub(crate) fn new(op: &VendorOp) -> Option<Self> {
        match op {
            VendorOp::Matmul(m) => {
                matches!(m.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
                    .then(|| VendorProgram { op: m.clone() })
            }
            // The composition's kernels and `gemm` products run attention here.
            VendorOp::Attention(_) | VendorOp::AttentionBackward(_) => None,
        }
    }

    /// Runs the op on `buffers` (`[lhs, rhs, out]`, or `[lhs, rhs, bias, out]`) with the
    /// sizes `dims` gives. `pool`
    /// has `threads` workers; without a pool every product runs on the calling thread.
    pub(crate) fn launch(
        &self,
        memory: &Memory,
        pool: Option<&ThreadPool>,
        threads: usize,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<(), BackendError> {
        let op = &self.op;
        let invalid = |reason: String| BackendError::InvalidArgument(format!("{op}: {reason}"));
        let (lhs, rhs, bias, out) = match (op.epilogue.bias, buffers) {
            (false, &[lhs, rhs, out]) => (lhs, rhs, None, out),
            (true, &[lhs, rhs, bias, out]) => (lhs, rhs, Some(bias), out),
            _ => {
                let names = if op.epilogue.bias {
                    "4 buffers [lhs, rhs, bias, out]"
                } else {
                    "3 buffers [lhs, rhs, out]"
                };
                return Err(invalid(format!(
                    "takes {names}, but {} were bound",
                    buffers.len()
                )));
            }
        };
        // `gemm` reads the inputs while it writes the output, so an output that is also an
        // input would be read after it was partly overwritten (and a shared and a mutable
        // borrow of one buffer cannot both exist anyway).
        if out == lhs || out == rhs || Some(out) == bias {
            return Err(invalid(format!(
                "the output buffer {} is also bound as an input; bind a separate buffer",
                out.0
            )));
        }
        let sizes = op.sizes(dims).map_err(|e| invalid(e.to_string()))?;
        if !fits(&sizes) {
            return Err(invalid(format!(
                "{} overflow the address space",
                describe(&sizes)
            )));
        }
        // One lock per distinct buffer (lhs and rhs may be one), taken in id order so that
        // launches and copies locking overlapping sets cannot deadlock.
        let shared = memory.get_sorted(buffers)?;
        let mut reads: Vec<(BufferId, RwLockReadGuard<'_, HostBuffer>)> = Vec::with_capacity(3);
        let mut write: Option<RwLockWriteGuard<'_, HostBuffer>> = None;
        for (id, buffer) in &shared {
            if *id == out {
                write = Some(memory::write(buffer));
            } else {
                reads.push((*id, memory::read(buffer)));
            }
        }
        let read = |id: BufferId| reads.iter().find(|(r, _)| *r == id).map(|(_, g)| g.bytes());
        let (Some(lhs_bytes), Some(rhs_bytes), Some(out_guard)) =
            (read(lhs), read(rhs), &mut write)
        else {
            // `get_sorted` returned every id or failed, so this is not reached.
            return Err(invalid("a bound buffer could not be locked".into()));
        };
        let bias = match bias {
            Some(id) => {
                let bytes =
                    read(id).ok_or_else(|| invalid("the bias could not be locked".into()))?;
                Some(bias_values(op.dtype, bytes, sizes.n).ok_or_else(|| {
                    invalid(format!(
                        "bias buffer {} has {} bytes, but {} need {} elements of {}",
                        id.0,
                        bytes.len(),
                        describe(&sizes),
                        sizes.n,
                        op.dtype
                    ))
                })?)
            }
            None => None,
        };
        let operands = Operands {
            ids: [lhs, rhs, out],
            sizes,
            epilogue: op.epilogue,
            bias,
            lhs_transposed: op.lhs_transposed,
            rhs_transposed: op.rhs_transposed,
            pool: pool.filter(|_| threads > 1),
            threads,
        };
        let out_bytes = out_guard.bytes_mut();
        match op.dtype {
            DType::F32 => operands.run::<f32>(lhs_bytes, rhs_bytes, out_bytes),
            DType::F64 => operands.run::<f64>(lhs_bytes, rhs_bytes, out_bytes),
            DType::F16 => operands.run_widened::<half::f16>(lhs_bytes, rhs_bytes, out_bytes),
            DType::BF16 => operands.run_widened::<half::bf16>(lhs_bytes, rhs_bytes, out_bytes),
            other => Err(format!("no gemm routine for {other}")),
        }
        .map_err(invalid)
    }
}

/// An element type `gemm` has a routine for. Only `f32` and `f64` implement it: `gemm`
/// panics on any other type.
trait Element: bytemuck::Pod + Send + Sync + 'static {
    const ONE: Self;
    const NAME: &'static str;
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
}

impl Element for f32 {
    const ONE: Self = 1.0;
    const NAME: &'static str = "f32";
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

impl Element for f64 {
    const ONE: Self = 1.0;
    const NAME: &'static str = "f64";
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(x: f64) -> Self {
        x
    }
}

/// The first `n` elements of a bias of `dtype`, as `f64`s; `None` if `bytes` is shorter.
fn bias_values(dtype: DType, bytes: &[u8], n: usize) -> Option<Vec<f64>> {
    let size = dtype.size_bytes();
    let bytes = bytes.get(..n.checked_mul(size)?)?;
    let mut values = Vec::new();
    values.try_reserve_exact(n).ok()?;
    for e in bytes.chunks_exact(size) {
        values.push(match dtype {
            DType::F32 => f64::from(f32::from_ne_bytes(e.try_into().ok()?)),
            DType::F64 => f64::from_ne_bytes(e.try_into().ok()?),
            DType::F16 => half::f16::from_ne_bytes(e.try_into().ok()?).to_f64(),
            DType::BF16 => half::bf16::from_ne_bytes(e.try_into().ok()?).to_f64(),
            _ => return None,
        });
    }
    Some(values)
}

/// A half-precision type, stored as its 16 bits.
trait Half {
    const NAME: &'static str;
    /// `wide[i] = bits[i]` as `f32` (exact).
    fn widen(bits: &[u16], wide: &mut [f32]);
    /// `bits[i] = wide[i]` rounded to nearest even.
    fn narrow(wide: &[f32], bits: &mut [u16]);
}

impl Half for half::f16 {
    const NAME: &'static str = "f16";
    fn widen(bits: &[u16], wide: &mut [f32]) {
        bits.reinterpret_cast::<half::f16>()
            .convert_to_f32_slice(wide);
    }
    fn narrow(wide: &[f32], bits: &mut [u16]) {
        bits.reinterpret_cast_mut::<half::f16>()
            .convert_from_f32_slice(wide);
    }
}

impl Half for half::bf16 {
    const NAME: &'static str = "bf16";
    fn widen(bits: &[u16], wide: &mut [f32]) {
        bits.reinterpret_cast::<half::bf16>()
            .convert_to_f32_slice(wide);
    }
    fn narrow(wide: &[f32], bits: &mut [u16]) {
        bits.reinterpret_cast_mut::<half::bf16>()
            .convert_from_f32_slice(wide);
    }
}

/// One launch's sizes and layout, checked to fit ([`fits`]).
struct Operands<'p> {
    /// `[lhs, rhs, out]`, for error messages.
    ids: [BufferId; 3],
    sizes: MatmulSizes,
    /// Applied to every sum before it is stored.
    epilogue: Epilogue,
    /// The epilogue's bias, `n` values, where it has one.
    bias: Option<Vec<f64>>,
    lhs_transposed: bool,
    rhs_transposed: bool,
    /// `None` where there is no pool or it has one thread.
    pool: Option<&'p ThreadPool>,
    threads: usize,
}

impl Operands<'_> {
    /// A half-precision product: the spans of both operands widened to `f32`, multiplied by
    /// [`run`](Self::run) into an `f32` scratch matrix, rounded to `H` into `out`.
    fn run_widened<H: Half>(&self, lhs: &[u8], rhs: &[u8], out: &mut [u8]) -> Result<(), String> {
        let s = &self.sizes;
        let (need_lhs, need_rhs, need_out) = if s.batch == 0 {
            (0, 0, 0)
        } else {
            s.min_elements()
        };
        let widen = |slot: usize, bytes: &[u8], need: usize| {
            self.halves::<H>(slot, bytes, need).map(|bits| {
                let mut wide = vec![0f32; need];
                H::widen(bits, &mut wide);
                wide
            })
        };
        let lhs = widen(0, lhs, need_lhs)?;
        let rhs = widen(1, rhs, need_rhs)?;
        // Checked before the product runs, so a short output costs no work.
        self.halves::<H>(2, out, need_out)?;
        let mut wide = vec![0f32; need_out];
        self.run::<f32>(
            bytemuck::cast_slice(&lhs),
            bytemuck::cast_slice(&rhs),
            bytemuck::cast_slice_mut(&mut wide),
        )?;
        let out = bytemuck::try_cast_slice_mut::<u8, u16>(&mut out[..need_out * 2])
            .map_err(|e| format!("the output buffer is misaligned: {e}"))?;
        H::narrow(&wide, out);
        Ok(())
    }

    /// The first `need` elements of operand `slot` of a half-precision product, as bits.
    fn halves<'a, H: Half>(
        &self,
        slot: usize,
        bytes: &'a [u8],
        need: usize,
    ) -> Result<&'a [u16], String> {
        bytes
            .get(..need.saturating_mul(2))
            .and_then(|b| bytemuck::try_cast_slice::<u8, u16>(b).ok())
            .ok_or_else(|| {
                format!(
                    "{} buffer {} has {} bytes, but {} need {need} elements of {} = {} bytes",
                    ["lhs", "rhs", "out"][slot],
                    self.ids[slot].0,
                    bytes.len(),
                    describe(&self.sizes),
                    H::NAME,
                    need.saturating_mul(2),
                )
            })
    }

    fn run<T: Element>(&self, lhs: &[u8], rhs: &[u8], out: &mut [u8]) -> Result<(), String> {
        let s = &self.sizes;
        // `min_elements` asks for one matrix of each operand even when `batch` is 0, but
        // an empty batch reads nothing, so it needs no elements.
        let (need_lhs, need_rhs, need_out) = if s.batch == 0 {
            (0, 0, 0)
        } else {
            s.min_elements()
        };
        let lhs = self.elements::<T>("lhs", 0, lhs, need_lhs)?;
        let rhs = self.elements::<T>("rhs", 1, rhs, need_rhs)?;
        let out_len = out.len();
        let out: &mut [T] = elements_mut(out)
            .and_then(|o| o.get_mut(..need_out))
            .ok_or_else(|| self.too_small::<T>("out", 2, out_len, need_out))?;
        if s.m == 0 || s.n == 0 || s.batch == 0 {
            return Ok(());
        }
        if s.k == 0 {
            // An empty sum: gemm would zero the output too, but saying so here is plainer.
            out.fill(T::zeroed());
            self.finish(out);
            return Ok(());
        }
        let (mn, mk, kn) = (s.m * s.n, s.m * s.k, s.k * s.n);
        let product = |b: usize, out: &mut [T], parallelism: Parallelism| {
            let at = |stride: usize, len: usize| b * stride..b * stride + len;
            let (Some(l), Some(r)) = (
                lhs.get(at(s.lhs_batch_stride, mk)),
                rhs.get(at(s.rhs_batch_stride, kn)),
            ) else {
                // `elements` checked the spans of every batch; not reached.
                return Err(format!("batch {b} lies outside the operands"));
            };
            self.product(l, r, out, parallelism)
        };
        // gemm's own cut-off below which it runs a product on one thread.
        let threshold = gemm::get_threading_threshold();
        let work = mn.saturating_mul(s.k);
        let done = match self.pool {
            Some(pool) if work >= threshold => pool.install(|| {
                out.chunks_exact_mut(mn)
                    .enumerate()
                    .try_for_each(|(b, o)| product(b, o, Parallelism::Rayon(self.threads)))
            }),
            Some(pool) if s.batch > 1 && work.saturating_mul(s.batch) >= threshold => {
                pool.install(|| {
                    out.par_chunks_exact_mut(mn)
                        .enumerate()
                        .try_for_each(|(b, o)| product(b, o, Parallelism::None))
                })
            }
            _ => out
                .chunks_exact_mut(mn)
                .enumerate()
                .try_for_each(|(b, o)| product(b, o, Parallelism::None)),
        };
        done?;
        self.finish(out);
        Ok(())
    }

    /// Applies the epilogue to the finished sums `out` (row-major rows of `n`), in `f64`,
    /// across the pool's threads where the output is large.
    fn finish<T: Element>(&self, out: &mut [T]) {
        let (e, n) = (self.epilogue, self.sizes.n);
        if e.is_none() || n == 0 {
            return;
        }
        let bias = self.bias.as_deref();
        let row = |r: &mut [T]| {
            for (j, o) in r.iter_mut().enumerate() {
                let b = bias.map_or(0.0, |b| b[j]);
                *o = T::from_f64(e.apply(o.to_f64(), b));
            }
        };
        match self.pool {
            Some(pool) if out.len() >= 1 << 16 => {
                pool.install(|| out.par_chunks_exact_mut(n).for_each(row));
            }
            _ => out.chunks_exact_mut(n).for_each(row),
        }
    }

    /// `out = lhs · rhs` for one product: `lhs` holds the `m × k` matrix (transposed or
    /// not), `rhs` the `k × n` one, `out` the row-major `m × n` result.
    fn product<T: Element>(
        &self,
        lhs: &[T],
        rhs: &[T],
        out: &mut [T],
        parallelism: Parallelism,
    ) -> Result<(), String> {
        let MatmulSizes { m, n, k, .. } = self.sizes;
        let stride = |x: usize| isize::try_from(x).map_err(|_| format!("stride {x} overflows"));
        // (column stride, row stride) of each operand, in elements: a transposed `m × k`
        // matrix is stored as `k` rows of `m`, so a step along a row of it is a step of `m`.
        let (lhs_cs, lhs_rs) = if self.lhs_transposed {
            (stride(m)?, 1)
        } else {
            (1, stride(k)?)
        };
        let (rhs_cs, rhs_rs) = if self.rhs_transposed {
            (stride(k)?, 1)
        } else {
            (1, stride(n)?)
        };
        let out_rs = stride(n)?;
        // `fits` checked these products do not overflow.
        if lhs.len() < m * k || rhs.len() < k * n || out.len() < m * n {
            return Err(format!(
                "a product's operands are shorter than {}",
                describe(&self.sizes)
            ));
        }
        // SAFETY: `run` checked every buffer against `MatmulSizes::min_elements()` (after
        // `fits` checked that none of its products overflow) and sliced each batch's
        // matrices out of them, and the line above checks each slice again: `lhs` holds
        // `m·k` elements, `rhs` `k·n` and `out` `m·n`. With the strides above, the
        // farthest element gemm touches is `(m-1)·lhs_rs + (k-1)·lhs_cs = m·k - 1` in
        // `lhs` in either layout, likewise `k·n - 1` in `rhs` and `m·n - 1` in `out`, all
        // in bounds; each length fits in `isize` (a slice's does), so no offset
        // overflows. `out` is a `&mut` slice of the write-locked output buffer, which is
        // not an input (`launch` rejects that), so it aliases neither `lhs` nor `rhs`,
        // and the locks are held until gemm returns (also with `Parallelism::Rayon`,
        // which joins its tasks before returning). `T` is `f32` or `f64` (the only
        // `Element`s), which gemm supports. `read_dst` is false, so gemm never reads
        // `out`; alpha (its factor for `out`) is then ignored and beta is 1.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                out.as_mut_ptr(),
                1,
                out_rs,
                false,
                lhs.as_ptr(),
                lhs_cs,
                lhs_rs,
                rhs.as_ptr(),
                rhs_cs,
                rhs_rs,
                T::zeroed(),
                T::ONE,
                false,
                false,
                false,
                parallelism,
            );
        }
        Ok(())
    }

    /// The first `need` elements of the operand `name` (position `slot`) as `T`s.
    fn elements<'a, T: Element>(
        &self,
        name: &str,
        slot: usize,
        bytes: &'a [u8],
        need: usize,
    ) -> Result<&'a [T], String> {
        // Trailing bytes short of a whole element are not part of any element.
        let whole = bytes.len() / size_of::<T>() * size_of::<T>();
        bytes
            .get(..whole)
            .and_then(|b| bytemuck::try_cast_slice::<u8, T>(b).ok())
            .and_then(|e| e.get(..need))
            .ok_or_else(|| self.too_small::<T>(name, slot, bytes.len(), need))
    }

    fn too_small<T: Element>(&self, name: &str, slot: usize, bytes: usize, need: usize) -> String {
        format!(
            "{name} buffer {} has {bytes} bytes, but {} need {need} elements of {} = {} bytes",
            self.ids[slot].0,
            describe(&self.sizes),
            T::NAME,
            need.saturating_mul(size_of::<T>()),
        )
    }
}

/// `bytes` as `T`s; `None` if misaligned (host buffers are 64-byte aligned, so never).
fn elements_mut<T: Element>(bytes: &mut [u8]) -> Option<&mut [T]> {
    let whole = bytes.len() / size_of::<T>() * size_of::<T>();
    bytemuck::try_cast_slice_mut(bytes.get_mut(..whole)?).ok()
}

/// Whether every product and span [`MatmulSizes::min_elements`] computes fits in `usize`.
/// It multiplies unchecked, and sizes bound at launch can be anything.
fn fits(s: &MatmulSizes) -> bool {
    let span = |stride: usize, one: usize| {
        s.batch
            .saturating_sub(1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(one))
    };
    let products = (s.m.checked_mul(s.k), s.k.checked_mul(s.n));
    let (Some(mk), Some(kn)) = products else {
        return false;
    };
    span(s.lhs_batch_stride, mk).is_some()
        && span(s.rhs_batch_stride, kn).is_some()
        && s.batch
            .checked_mul(s.m)
            .and_then(|x| x.checked_mul(s.n))
            .is_some()
}

/// The sizes, for error messages.
fn describe(s: &MatmulSizes) -> String {
    format!(
        "sizes batch {}, m {}, n {}, k {} (batch strides {}, {})",
        s.batch, s.m, s.n, s.k, s.lhs_batch_stride, s.rhs_batch_stride
    )
}
