//! Results of devices that flush subnormals to zero
//! ([`Features::subnormals_may_flush`](tessel_ir::Features::subnormals_may_flush)).
//!
//! Such a device may read any subnormal operand of a float operation as a zero of the same
//! sign, and may return a zero for a subnormal result, while bit-level operations, loads,
//! stores and selects move subnormals unchanged. So where its result differs from the
//! reference's, it is still accepted when it is what the reference computes with some of the
//! subnormal inputs read as zeros (which ones depends on where they flow: `where(c < a, a,
//! b)` flushes `c` and `a` in the comparison but selects `b` as it is), or a zero of either
//! sign where one of those reference results is subnormal. Everything else stays exact (or
//! within the backend's ulps).
//!
//! "Subnormal" means subnormal in the type the arithmetic is done in: `f32` for `f32` and
//! `bf16` (whose range is `f32`'s), `f64` for `f64`. `f16` values are computed in `f32`,
//! where even `f16`'s subnormals are normal, and a backend converts them exactly.

use std::cell::OnceCell;

use tessel_ir::Kernel;
use tessel_shape::{Bindings, DType};

use crate::data::agrees;

/// Whether `bytes`, an element of `dtype`, is a subnormal that a device flushing subnormals
/// may read as zero: a nonzero `f32` or `bf16` below `f32`'s smallest normal, or a nonzero
/// `f64` below `f64`'s. Never for `f16` (computed in `f32`, where its subnormals are normal),
/// integers or `bool`.
pub fn flushable(dtype: DType, bytes: &[u8]) -> bool {
    match dtype {
        DType::BF16 => {
            let b = u16::from_le_bytes([bytes[0], bytes[1]]);
            b & 0x7f80 == 0 && b & 0x007f != 0
        }
        DType::F32 => {
            let b = u32::from_le_bytes(bytes.try_into().unwrap());
            b & 0x7f80_0000 == 0 && b & 0x007f_ffff != 0
        }
        DType::F64 => {
            let b = u64::from_le_bytes(bytes.try_into().unwrap());
            b & 0x7ff0_0000_0000_0000 == 0 && b & 0x000f_ffff_ffff_ffff != 0
        }
        _ => false,
    }
}

/// Whether `bytes`, an element of a float `dtype`, is a zero of either sign.
fn is_zero(dtype: DType, bytes: &[u8]) -> bool {
    let mut magnitude = bytes.to_vec();
    // The sign bit is the top bit of the last (most significant) byte.
    if let Some(top) = magnitude.last_mut() {
        *top &= 0x7f;
    }
    dtype.is_float() && magnitude.iter().all(|&b| b == 0)
}

/// `bytes` (elements of `dtype`) with every [`flushable`] element replaced by a zero of the
/// same sign.
pub fn flush_subnormals(dtype: DType, bytes: &[u8]) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut out = bytes.to_vec();
    for element in out.chunks_exact_mut(size) {
        if flushable(dtype, element) {
            let sign = element[size - 1] & 0x80;
            element.fill(0);
            element[size - 1] = sign;
        }
    }
    out
}

/// Whether `got`, an element of `dtype` from a device that may flush subnormals, is
/// acceptable against `candidates`: the reference's results on the inputs as they are and
/// with subnormal inputs read as zeros. It is when it [`agrees`] (within `ulps`) with one of
/// them, or when it is a zero of either sign and one of them is [`flushable`] (a flushed
/// result).
pub fn agrees_flushed<'a>(
    dtype: DType,
    ulps: u64,
    got: &[u8],
    candidates: impl IntoIterator<Item = &'a [u8]>,
) -> bool {
    candidates.into_iter().any(|want| {
        agrees(dtype, ulps, got, want)
            || (dtype.is_float() && is_zero(dtype, got) && flushable(dtype, want))
    })
}

/// The reference's results for one kernel run, and (computed when first needed) its results
/// with subnormal inputs flushed, for comparing a device's results element by element.
pub(crate) struct Reference<'a> {
    kernel: &'a Kernel,
    /// The buffers the kernel ran on.
    pub(crate) buffers: &'a [Vec<u8>],
    /// The input buffers (positions in `buffers`) whose subnormals a device may flush.
    inputs: Vec<(usize, DType)>,
    dims: &'a Bindings,
    /// Whether the device may flush subnormals.
    pub(crate) flush: bool,
    /// The interpreter's buffers after running on `buffers` as they are.
    pub(crate) want: Vec<Vec<u8>>,
    /// The interpreter's buffers after running with the subnormals of each nonempty subset
    /// of the inputs that have any flushed.
    flushed: OnceCell<Vec<Vec<Vec<u8>>>>,
}

impl<'a> Reference<'a> {
    /// Runs `kernel` in the interpreter on `buffers`; `inputs` are the float input buffers
    /// (position and dtype), and `flush` whether the device may flush subnormals.
    pub(crate) fn new(
        kernel: &'a Kernel,
        buffers: &'a [Vec<u8>],
        inputs: &[(usize, DType)],
        dims: &'a Bindings,
        flush: bool,
    ) -> Self {
        Reference {
            kernel,
            buffers,
            inputs: inputs.to_vec(),
            dims,
            flush,
            want: crate::interpret(kernel, buffers, dims),
            flushed: OnceCell::new(),
        }
    }

    /// The runs with flushed inputs, computed on first use.
    fn flushed(&self) -> &[Vec<Vec<u8>>] {
        self.flushed.get_or_init(|| {
            let flushed: Vec<(usize, Vec<u8>)> = self
                .inputs
                .iter()
                .map(|&(k, dtype)| (k, flush_subnormals(dtype, &self.buffers[k])))
                .filter(|(k, bytes)| *bytes != self.buffers[*k])
                .collect();
            (1..1usize << flushed.len())
                .map(|subset| {
                    let mut buffers = self.buffers.to_vec();
                    for (bit, (k, bytes)) in flushed.iter().enumerate() {
                        if subset >> bit & 1 == 1 {
                            buffers[*k].clone_from(bytes);
                        }
                    }
                    crate::interpret(self.kernel, &buffers, self.dims)
                })
                .collect()
        })
    }

    /// The reference's element `e` of buffer `k`, elements of `dtype`.
    pub(crate) fn element(&self, k: usize, e: usize, dtype: DType) -> &[u8] {
        let size = dtype.size_bytes();
        &self.want[k][e * size..][..size]
    }

    /// Whether `got` is acceptable as element `e` of buffer `k` (elements of `dtype`): it
    /// [`agrees`] with the reference within `ulps`, or, on a device that may flush
    /// subnormals, it [`agrees_flushed`] with the reference's results on flushed inputs.
    pub(crate) fn accepts(&self, k: usize, e: usize, dtype: DType, ulps: u64, got: &[u8]) -> bool {
        let want = self.element(k, e, dtype);
        if agrees(dtype, ulps, got, want) {
            return true;
        }
        if !self.flush {
            return false;
        }
        let size = dtype.size_bytes();
        let candidates = std::iter::once(want)
            .chain(self.flushed().iter().map(|run| &run[k][e * size..][..size]));
        agrees_flushed(dtype, ulps, got, candidates)
    }
}

#[cfg(test)]
mod tests {
    use tessel_ir::{Access, KernelBuilder};
    use tessel_shape::{BinaryOp, Bindings, DType, bf16};

    use super::{Reference, agrees_flushed, flush_subnormals, flushable};

    const TINY: f32 = 1e-40;

    fn f(x: f32) -> [u8; 4] {
        x.to_le_bytes()
    }

    #[test]
    fn subnormals_are_those_of_the_arithmetic_type() {
        assert!(flushable(DType::F32, &f(TINY)));
        assert!(flushable(DType::F32, &f(-f32::from_bits(1))));
        assert!(!flushable(DType::F32, &f(f32::MIN_POSITIVE)));
        assert!(!flushable(DType::F32, &f(0.0)));
        assert!(!flushable(DType::F32, &f(f32::NAN)));
        assert!(flushable(DType::BF16, &bf16::from_bits(1).to_le_bytes()));
        assert!(!flushable(DType::BF16, &bf16::from_f32(1.0).to_le_bytes()));
        // f16 computes in f32, where its subnormals are normal.
        assert!(!flushable(DType::F16, &[1, 0]));
        assert!(flushable(DType::F64, &1e-310f64.to_le_bytes()));
        assert!(!flushable(DType::F64, &1e-300f64.to_le_bytes()));
        assert!(!flushable(DType::I32, &1i32.to_le_bytes()));
        let bytes: Vec<u8> = [TINY, -TINY, 1.0].iter().flat_map(|x| f(*x)).collect();
        let flushed: Vec<u8> = [0.0, -0.0, 1.0f32].iter().flat_map(|x| f(*x)).collect();
        assert_eq!(flush_subnormals(DType::F32, &bytes), flushed);
    }

    #[test]
    fn flushed_results_may_be_zeros_of_either_sign() {
        // sigmoid(-100) = 3.7e-44 is subnormal: a flushing device may return ±0.
        let want = f(3.7e-44);
        for got in [f(0.0), f(-0.0), f(3.7e-44)] {
            assert!(agrees_flushed(DType::F32, 0, &got, [want.as_slice()]));
        }
        assert!(!agrees_flushed(DType::F32, 0, &f(1e-30), [want.as_slice()]));
        // A normal result is never flushed.
        assert!(!agrees_flushed(
            DType::F32,
            0,
            &f(0.0),
            [f(1e-30).as_slice()]
        ));
        // Ulps still count against each candidate.
        let next = f32::from_bits(1.0f32.to_bits() + 1);
        assert!(agrees_flushed(DType::F32, 1, &f(next), [f(1.0).as_slice()]));
        assert!(!agrees_flushed(
            DType::F32,
            0,
            &f(next),
            [f(1.0).as_slice()]
        ));
    }

    /// A fake device's results for `out = x + y` and `out2 = where(y < x, x, z)`, checked
    /// element by element as the op checks do.
    #[test]
    fn a_fake_flushing_device_is_accepted_only_where_flushing_explains_it() {
        let n = 6;
        let mut kb = KernelBuilder::new("flush");
        let [x, y, z] = ["x", "y", "z"].map(|name| kb.buffer(name, DType::F32, n, Access::Read));
        let sum = kb.buffer("sum", DType::F32, n, Access::Write);
        let pick = kb.buffer("pick", DType::F32, n, Access::Write);
        kb.grid([1, 1, 1], [n as i64, 1, 1]);
        let i = kb.global_id(0, DType::I32);
        let [a, b, c] = [x, y, z].map(|buf| kb.load(buf, i));
        let s = kb.binary(BinaryOp::Add, a, b);
        kb.store(sum, i, s);
        let cond = kb.lt(b, a);
        let p = kb.select(cond, a, c);
        kb.store(pick, i, p);
        let kernel = kb.build().unwrap();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let xs = [TINY, 1.0, TINY, -TINY, 2.0 * TINY, 5.0];
        let ys = [1.0, TINY, TINY, 1e-37, TINY, 1.0];
        let zs = [7.0, 7.0, 7.0, 7.0, 3.0 * TINY, 7.0];
        let buffers = vec![
            bytes(&xs),
            bytes(&ys),
            bytes(&zs),
            vec![0; n * 4],
            vec![0; n * 4],
        ];
        let dims = Bindings::new();
        let inputs = [(0, DType::F32), (1, DType::F32), (2, DType::F32)];
        let flushing = Reference::new(&kernel, &buffers, &inputs, &dims, true);
        let exact = Reference::new(&kernel, &buffers, &inputs, &dims, false);
        let check = |k: usize, e: usize, got: f32| {
            (
                flushing.accepts(k, e, DType::F32, 0, &f(got)),
                exact.accepts(k, e, DType::F32, 0, &f(got)),
            )
        };
        // The reference itself is always right.
        for (k, e) in [(3, 0), (3, 2), (4, 4)] {
            let want = flushing.element(k, e, DType::F32).to_vec();
            let got = f32::from_le_bytes(want.try_into().unwrap());
            assert_eq!(check(k, e, got), (true, true));
        }
        // 1e-40 + 1 rounds to 1 anyway; a flushed 1e-40 + 1e-40 is 0 (flushed inputs), and
        // so is the subnormal sum itself flushed.
        assert_eq!(check(3, 2, 0.0), (true, false));
        assert_eq!(check(3, 2, -0.0), (true, false));
        // -1e-40 + 1e-37 with -1e-40 flushed is 1e-37.
        assert_eq!(check(3, 3, 1e-37), (true, false));
        // Nothing explains other values (1e-40 would be one of the two flushed).
        assert_eq!(check(3, 2, 3.0 * TINY), (false, false));
        assert_eq!(check(3, 0, 0.0), (false, false));
        assert_eq!(check(3, 5, 5.0), (false, false));
        // where(1e-40 < 2e-40, 2e-40, 3e-40): a flushed comparison is false and selects z
        // unflushed, which only flushing x and y (not z) explains.
        assert_eq!(check(4, 4, 3.0 * TINY), (true, false));
        assert_eq!(check(4, 4, 0.0), (true, false));
        assert_eq!(check(4, 4, 7.0), (false, false));
        // where(1e-40 < 1.0, 1.0, 7.0) is 1.0 whatever is flushed.
        assert_eq!(check(4, 1, 7.0), (false, false));
    }
}
