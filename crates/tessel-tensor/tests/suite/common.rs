//! Helpers shared by the tensor test suites: a seeded generator, typed inputs built and
//! references computed with plain Rust (never Tessel ops), views that exercise
//! non-contiguous layouts, and tolerance checks with the project's numbers.
//!
//! Every test file includes this module; helpers one file doesn't use are expected.
//! Add new helpers at the end, in their own section.
#![allow(dead_code)]

use tessel_tensor::{DType, Error, Tensor, bf16, f16};

// =====================================================================================
// Random data
// =====================================================================================

/// `SplitMix64`: a small, seedable generator for test data.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub(crate) fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * u
    }

    /// A uniform integer in `[lo, hi]`.
    pub(crate) fn int(&mut self, lo: i64, hi: i64) -> i64 {
        let span = (hi - lo + 1) as u64;
        lo + (self.next_u64() % span) as i64
    }
}

/// Where random values come from: floats are drawn from `float` and rounded to the dtype;
/// integers from `int`, clipped to the dtype's range; `bool`s are fair coins.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Domain {
    pub(crate) float: (f64, f64),
    pub(crate) int: (i64, i64),
    /// Round floats to multiples of this (0 for none), so equal values occur.
    pub(crate) quantum: f64,
}

impl Domain {
    pub(crate) const fn new(float: (f64, f64), int: (i64, i64)) -> Domain {
        Domain {
            float,
            int,
            quantum: 0.0,
        }
    }

    pub(crate) const fn quantized(self, quantum: f64) -> Domain {
        Domain { quantum, ..self }
    }
}

/// The default domain: floats in `[-4, 4)`, integers in `[-20, 20]`.
pub(crate) const DEFAULT: Domain = Domain::new((-4.0, 4.0), (-20, 20));

/// The smallest and largest value of an integer dtype, as `f64` (exact for the ranges
/// tests use).
pub(crate) fn int_range(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::Bool => (0, 1),
        DType::U8 => (0, u8::MAX.into()),
        DType::U16 => (0, u16::MAX.into()),
        DType::U32 => (0, u32::MAX.into()),
        DType::U64 => (0, i64::MAX),
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    }
}

/// `n` random values exactly representable in `dtype`.
pub(crate) fn random(rng: &mut Rng, dtype: DType, n: usize, domain: Domain) -> Vec<f64> {
    (0..n)
        .map(|_| {
            if dtype == DType::Bool {
                (rng.next_u64() >> 63) as f64
            } else if dtype.is_float() {
                let mut x = rng.uniform(domain.float.0, domain.float.1);
                if domain.quantum > 0.0 {
                    x = (x / domain.quantum).round() * domain.quantum;
                }
                round_to(dtype, x)
            } else {
                let (lo, hi) = int_range(dtype);
                rng.int(domain.int.0.max(lo), domain.int.1.min(hi)) as f64
            }
        })
        .collect()
}

// =====================================================================================
// Conversions in plain Rust
// =====================================================================================

/// `x` converted to `dtype` with Rust's `as` semantics (floats round to nearest, integers
/// wrap, floats to integers truncate and saturate, anything to `bool` is `!= 0`), back as
/// `f64`. `x` must be exact in `f64`, and integers must be integral.
pub(crate) fn round_to(dtype: DType, x: f64) -> f64 {
    let wrap = |x: f64| -> i128 { if x.is_nan() { 0 } else { x as i128 } };
    match dtype {
        DType::Bool => f64::from(u8::from(x != 0.0)),
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        DType::F32 => f64::from(x as f32),
        DType::F64 => x,
        DType::U8 => f64::from(wrap(x) as u8),
        DType::U16 => f64::from(wrap(x) as u16),
        DType::U32 => f64::from(wrap(x) as u32),
        DType::U64 => wrap(x) as u64 as f64,
        DType::I8 => f64::from(wrap(x) as i8),
        DType::I16 => f64::from(wrap(x) as i16),
        DType::I32 => f64::from(wrap(x) as i32),
        DType::I64 => wrap(x) as i64 as f64,
        DType::F8E4M3 => tessel_tensor::F8E4M3::from_f64(x).to_f64(),
        DType::F8E5M2 => tessel_tensor::F8E5M2::from_f64(x).to_f64(),
    }
}

/// Rust's `as` from a float to an integer dtype (truncating, saturating, NaN to 0), as
/// `f64`.
pub(crate) fn saturate_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::U8 => f64::from(x as u8),
        DType::U16 => f64::from(x as u16),
        DType::U32 => f64::from(x as u32),
        DType::U64 => x as u64 as f64,
        DType::I8 => f64::from(x as i8),
        DType::I16 => f64::from(x as i16),
        DType::I32 => f64::from(x as i32),
        DType::I64 => x as i64 as f64,
        _ => round_to(dtype, x),
    }
}

/// A tensor of `dtype` holding `values` (each exactly representable) in `dims`, built from
/// a typed `Vec` with Rust casts.
pub(crate) fn tensor(dtype: DType, values: &[f64], dims: &[usize]) -> Tensor {
    fn build<T: tessel_tensor::Element>(
        values: &[f64],
        dims: &[usize],
        f: impl Fn(f64) -> T,
    ) -> Tensor {
        let data: Vec<T> = values.iter().map(|&v| f(v)).collect();
        Tensor::from_vec(data, dims).unwrap_or_else(|e| panic!("test input {dims:?}: {e}"))
    }
    match dtype {
        DType::Bool => build(values, dims, |v| v != 0.0),
        DType::U8 => build(values, dims, |v| v as u8),
        DType::U16 => build(values, dims, |v| v as u16),
        DType::U32 => build(values, dims, |v| v as u32),
        DType::U64 => build(values, dims, |v| v as u64),
        DType::I8 => build(values, dims, |v| v as i8),
        DType::I16 => build(values, dims, |v| v as i16),
        DType::I32 => build(values, dims, |v| v as i32),
        DType::I64 => build(values, dims, |v| v as i64),
        DType::F16 => build(values, dims, f16::from_f64),
        DType::BF16 => build(values, dims, bf16::from_f64),
        DType::F32 => build(values, dims, |v| v as f32),
        DType::F64 => build(values, dims, |v| v),
        DType::F8E4M3 => build(values, dims, tessel_tensor::F8E4M3::from_f64),
        DType::F8E5M2 => build(values, dims, tessel_tensor::F8E5M2::from_f64),
    }
}

/// The tensor's values as `f64`, in row-major order.
// `Scalar::to_f64` can't be named here: tessel-shape is not a dependency of the tests.
#[allow(clippy::redundant_closure_for_method_calls)]
pub(crate) fn read(t: &Tensor) -> Vec<f64> {
    t.to_scalars()
        .unwrap_or_else(|e| panic!("reading {t:?}: {e}"))
        .into_iter()
        .map(|s| s.to_f64())
        .collect()
}

// =====================================================================================
// Broadcasting references
// =====================================================================================

/// The NumPy broadcast of two shapes.
pub(crate) fn broadcast_dims(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                1
            };
            let db = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                1
            };
            assert!(
                da == db || da == 1 || db == 1,
                "test shapes {a:?} and {b:?} don't broadcast"
            );
            if da == 1 { db } else { da }
        })
        .collect()
}

/// The flat index into a tensor of `dims` (right-aligned, size-1 dims broadcast) of the
/// element at coordinate `coord` of the broadcast shape.
fn source_index(coord: &[usize], dims: &[usize]) -> usize {
    let offset = coord.len() - dims.len();
    dims.iter().enumerate().fold(0, |acc, (k, &d)| {
        acc * d + if d == 1 { 0 } else { coord[offset + k] }
    })
}

/// The coordinate of flat index `i` in `dims`.
fn coord_of(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut coord = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        coord[k] = i % dims[k];
        i /= dims[k];
    }
    coord
}

/// `f` applied to every element of the broadcast of `inputs` (values with their dims).
pub(crate) fn broadcast_map(
    inputs: &[(&[f64], &[usize])],
    f: impl Fn(&[f64]) -> f64,
) -> (Vec<f64>, Vec<usize>) {
    let dims = inputs
        .iter()
        .fold(Vec::new(), |acc, (_, d)| broadcast_dims(&acc, d));
    let numel: usize = dims.iter().product();
    let mut args = vec![0.0; inputs.len()];
    let out = (0..numel)
        .map(|i| {
            let coord = coord_of(i, &dims);
            for (arg, (values, d)) in args.iter_mut().zip(inputs) {
                *arg = values[source_index(&coord, d)];
            }
            f(&args)
        })
        .collect();
    (out, dims)
}

// =====================================================================================
// Tolerances and comparison
// =====================================================================================

/// The project's relative tolerance for an elementwise result of `dtype`: exact for
/// integers and `bool`, `1e-5` for `f32` (`1e-4` for transcendental functions), `1e-2` for
/// `f16`/`bf16`, and tighter for `f64`.
pub(crate) fn tolerance(dtype: DType, transcendental: bool) -> f64 {
    match (dtype, transcendental) {
        (DType::F16 | DType::BF16, _) => 1e-2,
        (DType::F32, false) => 1e-5,
        (DType::F32, true) => 1e-4,
        (DType::F64, false) => 1e-12,
        (DType::F64, true) => 1e-9,
        _ => 0.0,
    }
}

/// Whether `got` matches `want` within relative tolerance `rel`: NaN matches NaN, equal
/// infinities match, and values near zero compare absolutely (at `rel * floor`).
pub(crate) fn close(got: f64, want: f64, rel: f64, floor: f64) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= rel * want.abs().max(floor)
}

/// Asserts `got` matches `want` elementwise (see [`close`], with a floor of `1e-3`),
/// printing the first mismatches with `what` and the inputs at that index.
#[track_caller]
pub(crate) fn assert_close(what: &str, got: &[f64], want: &[f64], rel: f64) {
    assert_close_floor(what, got, want, rel, 1e-3);
}

/// [`assert_close`] with an explicit floor below which errors are absolute.
#[track_caller]
pub(crate) fn assert_close_floor(what: &str, got: &[f64], want: &[f64], rel: f64, floor: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {} values, expected {}",
        got.len(),
        want.len()
    );
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|&(_, (&g, &w))| !close(g, w, rel, floor))
        .take(5)
        .map(|(i, (g, w))| format!("[{i}] got {g:e}, want {w:e}"))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: mismatches (rel {rel:e}): {}",
        bad.join("; ")
    );
}

/// Asserts a call failed with the expected error variant, named by `check`, and that its
/// message mentions every string in `mentions`.
#[track_caller]
pub(crate) fn assert_err(
    what: &str,
    res: tessel_tensor::Result<Tensor>,
    check: impl Fn(&Error) -> bool,
    mentions: &[&str],
) {
    match res {
        Ok(t) => panic!("{what}: expected an error, got {t:?}"),
        Err(e) => {
            assert!(check(&e), "{what}: unexpected error variant: {e:?}");
            let msg = e.to_string();
            for m in mentions {
                assert!(
                    msg.contains(m),
                    "{what}: error {msg:?} doesn't mention {m:?}"
                );
            }
        }
    }
}

/// For [`assert_err`]: an [`Error::UnsupportedDType`] from `op` for `dtype`.
pub(crate) fn unsupported(op: &'static str, dtype: DType) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::UnsupportedDType { op: o, dtype: d, .. } if *o == op && *d == dtype)
}

/// For [`assert_err`]: an [`Error::InvalidArgument`] from `op`.
pub(crate) fn invalid(op: &'static str) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::InvalidArgument { op: o, .. } if *o == op)
}

/// For [`assert_err`]: an [`Error::Promotion`] from `op`.
pub(crate) fn promotion(op: &'static str) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::Promotion { op: o, .. } if *o == op)
}

/// For [`assert_err`]: a shape rule broken ([`Error::Shape`]).
pub(crate) fn shape_error(e: &Error) -> bool {
    matches!(e, Error::Shape(_))
}

// =====================================================================================
// Layouts: the same logical values behind different views
// =====================================================================================

/// How a 2-d test input is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// A plain row-major buffer.
    Contiguous,
    /// `permute([1, 0])` of the transposed buffer.
    Permuted,
    /// `flip([0, 1])` of the reversed buffer.
    Flipped,
    /// `narrow` of a larger buffer on both axes.
    Narrowed,
    /// `pad` by one row of ones above and below (the first and last rows become 1).
    Padded,
    /// Every other row of a buffer twice as tall (`slice` with step 2).
    Strided,
    /// One row `expand`ed (every row becomes the first).
    Expanded,
}

impl Layout {
    /// The non-contiguous layouts.
    pub(crate) const VIEWS: [Layout; 6] = [
        Layout::Permuted,
        Layout::Flipped,
        Layout::Narrowed,
        Layout::Padded,
        Layout::Strided,
        Layout::Expanded,
    ];
}

/// A `[rows, cols]` tensor of `dtype` laid out as `layout`, whose logical values are
/// `values` adjusted as the layout requires (returned). `junk` fills memory that the view
/// must skip.
pub(crate) fn view(
    layout: Layout,
    dtype: DType,
    values: &[f64],
    rows: usize,
    cols: usize,
    junk: f64,
) -> (Tensor, Vec<f64>) {
    assert_eq!(values.len(), rows * cols);
    assert!(rows >= 3 && cols >= 1);
    let at = |i: usize, j: usize| values[i * cols + j];
    let junk = round_to(dtype, junk);
    let ok = |r: tessel_tensor::Result<Tensor>| {
        r.unwrap_or_else(|e| panic!("building a {layout:?} view: {e}"))
    };
    match layout {
        Layout::Contiguous => (tensor(dtype, values, &[rows, cols]), values.to_vec()),
        Layout::Permuted => {
            let base: Vec<f64> = (0..cols)
                .flat_map(|j| (0..rows).map(move |i| (i, j)))
                .map(|(i, j)| at(i, j))
                .collect();
            (
                ok(tensor(dtype, &base, &[cols, rows]).permute(&[1, 0])),
                values.to_vec(),
            )
        }
        Layout::Flipped => {
            let base: Vec<f64> = values.iter().rev().copied().collect();
            (
                ok(tensor(dtype, &base, &[rows, cols]).flip(&[0, 1])),
                values.to_vec(),
            )
        }
        Layout::Narrowed => {
            let (r, c) = (rows + 2, cols + 3);
            let mut base = vec![junk; r * c];
            for i in 0..rows {
                for j in 0..cols {
                    base[(i + 1) * c + j + 2] = at(i, j);
                }
            }
            let t = tensor(dtype, &base, &[r, c]);
            (
                ok(ok(t.narrow(0, 1, rows as i64)).narrow(1, 2, cols as i64)),
                values.to_vec(),
            )
        }
        Layout::Padded => {
            let mut logical = values.to_vec();
            logical[..cols].fill(1.0);
            logical[(rows - 1) * cols..].fill(1.0);
            let base = &logical[cols..(rows - 1) * cols];
            (
                ok(tensor(dtype, base, &[rows - 2, cols]).pad(&[(1, 1), (0, 0)], 1)),
                logical,
            )
        }
        Layout::Strided => {
            let mut base = vec![junk; 2 * rows * cols];
            for i in 0..rows {
                base[2 * i * cols..(2 * i + 1) * cols]
                    .copy_from_slice(&values[i * cols..(i + 1) * cols]);
            }
            (
                ok(tensor(dtype, &base, &[2 * rows, cols]).slice(0, None, None, 2)),
                values.to_vec(),
            )
        }
        Layout::Expanded => {
            let row = &values[..cols];
            let logical: Vec<f64> = (0..rows).flat_map(|_| row.iter().copied()).collect();
            (
                ok(tensor(dtype, row, &[1, cols]).expand(&[rows as i64, cols as i64])),
                logical,
            )
        }
    }
}

// =====================================================================================
// Reference functions missing from `std`
// =====================================================================================

/// The error function in `f64`, accurate to about `1e-15`: its Maclaurin series for
/// `|x| < 2.5`, else `1 - erfc(x)` from erfc's continued fraction.
pub(crate) fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let value = if a < 2.5 {
        // erf x = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -a * a / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else if a.is_infinite() {
        1.0
    } else {
        // erfc x = e^-x^2 / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...))))
        let t = (1..=300).rev().fold(a, |t, n| a + f64::from(n) / 2.0 / t);
        1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / t
    };
    value.copysign(x)
}

// =====================================================================================
// Reference n-d arrays (movement, reduction and matmul tests)
// =====================================================================================

/// Independent f64 references for the movement, reduction and matmul tests: a row-major
/// n-d array and plain loops, sharing no code with Tessel.
pub(crate) mod nd {
    use super::{Domain, Rng, close, random, read, tensor};
    use tessel_tensor::{DType, Tensor};

    /// A row-major n-d array of `f64`.
    #[derive(Clone, Debug, PartialEq)]
    pub(crate) struct Nd {
        pub(crate) dims: Vec<usize>,
        pub(crate) data: Vec<f64>,
    }

    /// Row-major strides of `dims`.
    pub(crate) fn strides(dims: &[usize]) -> Vec<usize> {
        let mut s = vec![1; dims.len()];
        for i in (0..dims.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * dims[i + 1];
        }
        s
    }

    /// The coordinates of row-major position `flat` in `dims`.
    pub(crate) fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
        let mut idx = vec![0; dims.len()];
        for i in (0..dims.len()).rev() {
            if dims[i] > 0 {
                idx[i] = flat % dims[i];
                flat /= dims[i];
            }
        }
        idx
    }

    /// Python's `range(len)[start:stop:step]` for a positive step: (first index, count).
    pub(crate) fn py_slice(
        len: usize,
        start: Option<i64>,
        stop: Option<i64>,
        step: usize,
    ) -> (usize, usize) {
        let len = len as i64;
        let clamp = |i: i64| if i < 0 { (i + len).max(0) } else { i.min(len) };
        let begin = start.map_or(0, clamp);
        let end = stop.map_or(len, clamp);
        let count = if end > begin {
            (end - begin + step as i64 - 1) / step as i64
        } else {
            0
        };
        (begin as usize, count as usize)
    }

    impl Nd {
        /// `dims` of random values of `dtype` from `domain` (exact in `dtype`).
        pub(crate) fn random(rng: &mut Rng, dtype: DType, dims: &[usize], domain: Domain) -> Nd {
            let n = dims.iter().product();
            Nd::new(dims, random(rng, dtype, n, domain))
        }

        /// An array from row-major data.
        pub(crate) fn new(dims: &[usize], data: Vec<f64>) -> Nd {
            assert_eq!(
                dims.iter().product::<usize>(),
                data.len(),
                "reference data length"
            );
            Nd {
                dims: dims.to_vec(),
                data,
            }
        }

        /// An array whose element at each coordinate is `f(coordinate)`.
        pub(crate) fn from_fn(dims: &[usize], f: impl Fn(&[usize]) -> f64) -> Nd {
            let n: usize = dims.iter().product();
            let data = (0..n).map(|flat| f(&unravel(flat, dims))).collect();
            Nd {
                dims: dims.to_vec(),
                data,
            }
        }

        /// The values a tensor holds (a leaf or a computed value).
        pub(crate) fn of(t: &Tensor) -> Nd {
            Nd {
                dims: t.dims(),
                data: read(t),
            }
        }

        /// The element at `idx`.
        pub(crate) fn at(&self, idx: &[usize]) -> f64 {
            let flat: usize = idx
                .iter()
                .zip(strides(&self.dims))
                .map(|(i, s)| i * s)
                .sum();
            self.data[flat]
        }

        /// The number of elements.
        pub(crate) fn numel(&self) -> usize {
            self.data.len()
        }

        /// The data in a tensor of `dtype` (each value must be exact in it).
        pub(crate) fn tensor(&self, dtype: DType) -> Tensor {
            tensor(dtype, &self.data, &self.dims)
        }

        /// The same data in new dims.
        pub(crate) fn reshape(&self, dims: &[usize]) -> Nd {
            Nd::new(dims, self.data.clone())
        }

        /// Axis `k` of the result is axis `perm[k]` of `self`.
        pub(crate) fn permute(&self, perm: &[usize]) -> Nd {
            let dims: Vec<usize> = perm.iter().map(|&p| self.dims[p]).collect();
            Nd::from_fn(&dims, |o| {
                let mut idx = vec![0; o.len()];
                for (k, &p) in perm.iter().enumerate() {
                    idx[p] = o[k];
                }
                self.at(&idx)
            })
        }

        /// Constant padding of the trailing `pads.len()` dims (negative pads crop).
        pub(crate) fn pad(&self, pads: &[(i64, i64)], value: f64) -> Nd {
            let first = self.dims.len() - pads.len();
            let mut dims = self.dims.clone();
            for (k, &(b, a)) in pads.iter().enumerate() {
                dims[first + k] = (self.dims[first + k] as i64 + b + a) as usize;
            }
            Nd::from_fn(&dims, |o| {
                let mut idx = o.to_vec();
                for (k, &(b, _)) in pads.iter().enumerate() {
                    let x = o[first + k] as i64 - b;
                    if x < 0 || x >= self.dims[first + k] as i64 {
                        return value;
                    }
                    idx[first + k] = x as usize;
                }
                self.at(&idx)
            })
        }

        /// The listed axes reversed.
        pub(crate) fn flip(&self, axes: &[usize]) -> Nd {
            Nd::from_fn(&self.dims, |o| {
                let mut idx = o.to_vec();
                for &a in axes {
                    idx[a] = self.dims[a] - 1 - o[a];
                }
                self.at(&idx)
            })
        }

        /// `count` elements along `axis` from `start`, every `step`.
        pub(crate) fn slice(&self, axis: usize, start: usize, step: usize, count: usize) -> Nd {
            let mut dims = self.dims.clone();
            dims[axis] = count;
            Nd::from_fn(&dims, |o| {
                let mut idx = o.to_vec();
                idx[axis] = start + o[axis] * step;
                self.at(&idx)
            })
        }

        /// Size-1 dims repeated to `dims` (same rank).
        pub(crate) fn expand(&self, dims: &[usize]) -> Nd {
            let lead = dims.len() - self.dims.len();
            Nd::from_fn(dims, |o| {
                let idx: Vec<usize> = self
                    .dims
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if d == 1 { 0 } else { o[lead + i] })
                    .collect();
                self.at(&idx)
            })
        }

        /// The parts joined along `axis`.
        pub(crate) fn cat(parts: &[&Nd], axis: usize) -> Nd {
            let mut dims = parts[0].dims.clone();
            dims[axis] = parts.iter().map(|p| p.dims[axis]).sum();
            Nd::from_fn(&dims, |o| {
                let mut idx = o.to_vec();
                for p in parts {
                    if idx[axis] < p.dims[axis] {
                        return p.at(&idx);
                    }
                    idx[axis] -= p.dims[axis];
                }
                unreachable!("the index lies in some part")
            })
        }

        /// `f` of the values over `axes` (row-major order), for every other coordinate.
        pub(crate) fn reduce(
            &self,
            axes: &[usize],
            keepdim: bool,
            f: impl Fn(&[f64]) -> f64,
        ) -> Nd {
            let kept: Vec<usize> = self
                .dims
                .iter()
                .enumerate()
                .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
                .collect();
            let rdims: Vec<usize> = axes.iter().map(|&a| self.dims[a]).collect();
            let rn: usize = rdims.iter().product();
            let mut sorted = axes.to_vec();
            sorted.sort_unstable();
            let out = Nd::from_fn(&kept, |o| {
                let mut idx = o.to_vec();
                let vals: Vec<f64> = (0..rn)
                    .map(|r| {
                        let ri =
                            unravel(r, &sorted.iter().map(|&a| self.dims[a]).collect::<Vec<_>>());
                        for (j, &a) in sorted.iter().enumerate() {
                            idx[a] = ri[j];
                        }
                        self.at(&idx)
                    })
                    .collect();
                f(&vals)
            });
            if keepdim {
                out
            } else {
                let dims: Vec<usize> = self
                    .dims
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !axes.contains(i))
                    .map(|(_, &d)| d)
                    .collect();
                out.reshape(&dims)
            }
        }

        /// `torch.matmul`, by its definition.
        pub(crate) fn matmul(&self, rhs: &Nd) -> Nd {
            let a = if self.dims.len() == 1 {
                self.reshape(&[1, self.dims[0]])
            } else {
                self.clone()
            };
            let b = if rhs.dims.len() == 1 {
                rhs.reshape(&[rhs.dims[0], 1])
            } else {
                rhs.clone()
            };
            let (ab, bb) = (&a.dims[..a.dims.len() - 2], &b.dims[..b.dims.len() - 2]);
            let rank = ab.len().max(bb.len());
            let pad1 = |d: &[usize]| -> Vec<usize> {
                std::iter::repeat_n(1, rank - d.len())
                    .chain(d.iter().copied())
                    .collect()
            };
            let (ab, bb) = (pad1(ab), pad1(bb));
            let batch: Vec<usize> = ab
                .iter()
                .zip(&bb)
                .map(|(&x, &y)| if x == 1 { y } else { x })
                .collect();
            let (m, k, n) = (
                a.dims[a.dims.len() - 2],
                a.dims[a.dims.len() - 1],
                b.dims[b.dims.len() - 1],
            );
            let full: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
            let a = a.reshape(&ab.iter().copied().chain([m, k]).collect::<Vec<_>>());
            let b = b.reshape(&bb.iter().copied().chain([k, n]).collect::<Vec<_>>());
            let out = Nd::from_fn(&full, |o| {
                let pick = |d: &[usize]| -> Vec<usize> {
                    d.iter()
                        .zip(o)
                        .map(|(&s, &i)| if s == 1 { 0 } else { i })
                        .collect()
                };
                let (ia, ib) = (pick(&ab), pick(&bb));
                (0..k)
                    .map(|kk| {
                        let mut x = ia.clone();
                        x.extend([o[rank], kk]);
                        let mut y = ib.clone();
                        y.extend([kk, o[rank + 1]]);
                        a.at(&x) * b.at(&y)
                    })
                    .sum()
            });
            let mut dims = batch;
            if self.dims.len() > 1 {
                dims.push(m);
            }
            if rhs.dims.len() > 1 {
                dims.push(n);
            }
            out.reshape(&dims)
        }
    }

    /// Asserts `got` has `want`'s dims and values: equal, both NaN, or within `tol`
    /// relative to `max(1, |want|)` (reductions of values of magnitude about 1 compare
    /// absolutely near 0, where cancellation leaves no relative accuracy).
    #[track_caller]
    pub(crate) fn assert_nd(what: &str, got: &Nd, want: &Nd, tol: f64) {
        assert_eq!(got.dims, want.dims, "{what}: dims");
        let bad: Vec<String> = got
            .data
            .iter()
            .zip(&want.data)
            .enumerate()
            .filter(|&(_, (&g, &w))| !(g == w || close(g, w, tol, 1.0)))
            .take(5)
            .map(|(i, (g, w))| format!("[{i}] got {g:e}, want {w:e}"))
            .collect();
        assert!(
            bad.is_empty(),
            "{what} {:?}: mismatches (tolerance {tol:e}): {}",
            got.dims,
            bad.join("; ")
        );
    }

    /// The tolerance for a reduction of `n` values in `dtype`: exact for integers and
    /// `bool`, 1e-4·√n for `f32`, 1e-2·√n for `f16`/`bf16` (accumulated in `f32`, then
    /// rounded, so not growing), 1e-10·√n for `f64`.
    pub(crate) fn reduce_tol(dtype: DType, n: usize) -> f64 {
        let root = (n.max(1) as f64).sqrt();
        match dtype {
            DType::F16 | DType::BF16 => 1e-2,
            DType::F32 => 1e-4 * root,
            DType::F64 => 1e-10 * root,
            _ => 0.0,
        }
    }
}

// =====================================================================================
// The device under test
// =====================================================================================

/// `dtypes` without those the test device cannot compute (see `Device::supports`). Each
/// one left out is reported on stderr as `tessel-skip: <test>: <reason>`, the line
/// `cargo xtask test-gpu` counts, so a skip is never silent.
pub(crate) fn on_device(dtypes: impl IntoIterator<Item = DType>) -> Vec<DType> {
    let device = tessel_tensor::Device::default();
    dtypes
        .into_iter()
        .filter(|&dtype| {
            let ok = device.supports(dtype);
            if !ok {
                let test = std::thread::current().name().unwrap_or("?").to_string();
                eprintln!("tessel-skip: {test}: {dtype} is not supported on {device}");
            }
            ok
        })
        .collect()
}

/// Realizes `t`. When the device refuses a kernel as unsupported (an op its language has
/// no exact rendering for, such as `exp` on f64 in WGSL), reports a `tessel-skip:` line and
/// returns true, so the caller skips the case. The CPU supports everything: a refusal
/// there fails the test, as does any other error.
pub(crate) fn skipped(t: &Tensor, what: &str) -> bool {
    match t.realize() {
        Ok(_) => false,
        Err(Error::Backend(e @ tessel_tensor::BackendError::Unsupported { .. }))
            if t.device() != tessel_tensor::Device::cpu() =>
        {
            let test = std::thread::current().name().unwrap_or("?").to_string();
            eprintln!("tessel-skip: {test}: {what}: {e}");
            true
        }
        Err(e) => panic!("{what}: {e}"),
    }
}
