//! Random tensors and dropout, from counter-based bits computed where they are used.
//!
//! A draw (one `rand`, `randn` or `dropout` call) takes the process-wide seed and the next
//! stream number; its element at row-major position `i` is a function of `(seed, stream,
//! i)` alone: Philox4x32-10 bits ([`Philox`]), turned into floats by ordinary ops. The bits
//! are a graph node whose one input is the draw's 16-byte key, so a kernel computes them in
//! registers and fuses them into their consumer (a dropout mask is never a buffer and never
//! leaves the device), a new draw is new data for a cached plan, and every backend draws
//! the same values for a seed. A device without 64-bit integers (which the
//! bits' wide multiplies need) gets the same bits computed on the host and uploaded.

use std::cell::{Cell, RefCell};
use std::sync::{Mutex, PoisonError};

use tessel_graph::{Op, Philox, Words};
use tessel_runtime::{Device, Error, Result};
use tessel_shape::{BinaryOp, DType, Scalar, Shape, UnaryOp};

use crate::tensor::Tensor;

/// PyTorch's default CPU generator seed, so an unseeded process is reproducible too.
const DEFAULT_SEED: u64 = 67_280_421_310_721;

/// The process-wide generator: the seed, and the stream the next draw takes.
static GENERATOR: Mutex<(u64, u64)> = Mutex::new((DEFAULT_SEED, 0));

thread_local! {
    /// Draws made on this thread.
    static DRAWS: Cell<u64> = const { Cell::new(0) };
    /// While a function compiles on this thread ([`collect_keys`]): the keys of its draws.
    static KEYS: RefCell<Option<Vec<Tensor>>> = const { RefCell::new(None) };
}

/// The seed and a fresh stream for one draw.
fn next_draw() -> (u64, u64) {
    DRAWS.with(|n| n.set(n.get() + 1));
    let mut generator = GENERATOR.lock().unwrap_or_else(PoisonError::into_inner);
    let draw = *generator;
    generator.1 = generator.1.wrapping_add(1);
    draw
}

/// `f`'s result, the keys of the draws it made (in order), and whether every draw it made
/// has such a key (a device without 64-bit integers draws its bits on the host: no key).
/// What `Compiled` binds anew on every call, so that a compiled function draws as the
/// same code recorded each time would.
pub(crate) fn collect_keys<T>(f: impl FnOnce() -> T) -> (T, Vec<Tensor>, bool) {
    let before = DRAWS.with(Cell::get);
    let outer = KEYS.with(|k| k.replace(Some(Vec::new())));
    let out = f();
    let keys = KEYS.with(|k| k.replace(outer)).unwrap_or_default();
    let keyed = DRAWS.with(Cell::get) - before == keys.len() as u64;
    (out, keys, keyed)
}

/// The key of a new draw on `device` (which computes 64-bit integers), as [`draw`] makes it.
pub(crate) fn fresh_key(device: Device) -> Tensor {
    let (seed, stream) = next_draw();
    key_tensor(Philox { seed, stream }, device)
}

fn key_tensor(philox: Philox, device: Device) -> Tensor {
    let key: Vec<u8> = philox
        .key_operand()
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    Tensor::from_bytes_on(key, DType::U32, Shape::from([4]), device)
}

/// Significand bits a uniform of `dtype` carries: every value is exact in the dtype and
/// below 1.
const fn digits(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        DType::F64 => 53,
        _ => 24,
    }
}

/// Which Philox words the bits of `uniforms` uniforms of `dtype` take (see [`Words`]): a
/// uniform takes one word (two for f64). Elements share blocks where they can: four
/// elements per block for one word each, two for two words each; below f64, normals come
/// in pairs of consecutive elements sharing their two uniforms (words 0, 1 for the first
/// pair of a block, 2, 3 for the second); a normal's two uniforms take all four words of
/// its own block in f64.
fn layout(dtype: DType, uniforms: u8) -> Vec<Words> {
    match (dtype == DType::F64, uniforms) {
        (false, 1) => vec![Words::new(4, 1, 0)],
        (false, _) => vec![Words::pairs(0), Words::pairs(1)],
        (true, 1) => vec![Words::new(2, 2, 0), Words::new(2, 2, 1)],
        (true, _) => (0..4).map(Words::single).collect(),
    }
}

impl Tensor {
    /// Sets the seed of the process-wide generator behind [`Tensor::rand`],
    /// [`Tensor::randn`] and [`Tensor::dropout`] (`torch.manual_seed`), and restarts its
    /// sequence of draws.
    ///
    /// The same seed followed by the same calls, in the same order, gives the same tensors,
    /// on every backend. Threads share the generator, so concurrent draws interleave in
    /// whatever order they run. A process that never seeds starts from PyTorch's default
    /// seed, so it is reproducible too (its values differ from PyTorch's: the generators
    /// are the same kind, Philox4x32-10, but consume counters differently).
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// Tensor::manual_seed(42);
    /// let a = Tensor::rand([3], DType::F32)?.to_vec::<f32>()?;
    /// Tensor::manual_seed(42);
    /// let b = Tensor::rand([3], DType::F32)?.to_vec::<f32>()?;
    /// assert_eq!(a, b);
    /// # Ok(())
    /// # }
    /// ```
    pub fn manual_seed(seed: u64) {
        *GENERATOR.lock().unwrap_or_else(PoisonError::into_inner) = (seed, 0);
    }

    /// Values drawn uniformly from `[0, 1)` (`torch.rand`), for a float `dtype`, on the
    /// default device. Every value is a multiple of `2^-p` for the dtype's significand width
    /// `p` (53 for f64, 24 for f32, 11 for f16, 8 for bf16), so none rounds up to 1; the
    /// value at position `i` is the top `p` bits of word `i mod 4` of the Philox block at
    /// counter `⌊i / 4⌋` in the draw's stream (f64: 27 and 26 bits of words `2 (i mod 2)`
    /// and `2 (i mod 2) + 1` of block `⌊i / 2⌋`), identical on every backend.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let u = Tensor::rand([2, 3], DType::F32)?.to_vec::<f32>()?;
    /// assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    /// assert!(Tensor::rand([2], DType::I32).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn rand(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        float_dtype("rand", dtype)?;
        let bits = draw(
            &Device::default(),
            &shape.into(),
            dtype,
            "rand",
            &layout(dtype, 1),
        )?;
        Ok(uniform(&bits, 0, dtype))
    }

    /// Values drawn from the standard normal distribution (`torch.randn`), for a float
    /// `dtype`, on the default device: the Box-Muller transform of two uniforms, in f32
    /// (f64 for f64), rounded once to `dtype`. Below f64, consecutive positions `2p` and
    /// `2p + 1` (row-major) share their uniforms and take `r cos θ` and `r sin θ` with
    /// `r = sqrt(-2 ln(1 - u1))`, `θ = 2π u2`, where `u1` and `u2` are the top 24 bits of
    /// words `2 (p mod 2)` and `2 (p mod 2) + 1` of the block at counter `⌊p / 2⌋`; in f64
    /// every position takes `r cos θ` from 27 + 26 bits of words 0, 1 and 2, 3 of block `i`.
    /// Backends agree to the last few ulps of their `log`, `sqrt` and `cos`.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let z = Tensor::randn([1000], DType::F64)?.to_vec::<f64>()?;
    /// let mean = z.iter().sum::<f64>() / 1000.0;
    /// assert!(mean.abs() < 0.2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn randn(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        normal_on(&Device::default(), &shape.into(), dtype, "randn")
    }

    /// Uniform values in `[0, 1)` of this tensor's shape and float dtype, on its device
    /// (`torch.rand_like`). See [`Tensor::rand`].
    pub fn rand_like(&self) -> Result<Tensor> {
        float_dtype("rand_like", self.dtype())?;
        let words = layout(self.dtype(), 1);
        let bits = draw(
            &self.device(),
            self.shape(),
            self.dtype(),
            "rand_like",
            &words,
        )?;
        Ok(uniform(&bits, 0, self.dtype()))
    }

    /// Standard normal values of this tensor's shape and float dtype, on its device
    /// (`torch.randn_like`). See [`Tensor::randn`].
    pub fn randn_like(&self) -> Result<Tensor> {
        normal_on(&self.device(), self.shape(), self.dtype(), "randn_like")
    }

    /// Each element zeroed with probability `p` and the rest scaled by `1 / (1 - p)`
    /// (`torch.nn.functional.dropout` in training). Element `i` is kept when word `i mod 4`
    /// of the Philox block at counter `⌊i / 4⌋` is at least `round(p · 2³²)`: the mask is
    /// computed inside the kernel that consumes it, on the tensor's device, and never
    /// stored. Differentiable in `self`.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::ones([1000], DType::F32);
    /// let y = x.dropout(0.25)?.to_vec::<f32>()?;
    /// assert!(y.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
    /// assert!(x.dropout(1.5).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn dropout(&self, p: f64) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::InvalidArgument {
                op: "dropout",
                reason: format!("the probability p must be in [0, 1], got {p}"),
            });
        }
        if !self.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: "dropout",
                dtype: self.dtype(),
                hint: "dropout scales by 1 / (1 - p); use a float dtype",
            });
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        if p == 1.0 {
            return self * 0.0;
        }
        let words = [Words::new(4, 1, 0)];
        let bits = draw(&self.device(), self.shape(), DType::U32, "dropout", &words)?.remove(0);
        // p < 1, so the threshold is below 2^32.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let threshold = (p * 4_294_967_296.0).round() as u32;
        let keep = bits.raw_binary(
            BinaryOp::Ge,
            &bits.full_like_scalar(Scalar::U32(threshold), DType::U32),
        );
        let scaled = (self * (1.0 / (1.0 - p)))?;
        Ok(keep.raw_where(
            &scaled,
            &scaled.full_like_scalar(Scalar::zero(self.dtype()), self.dtype()),
        ))
    }
}

/// Standard normal values of `shape` and `dtype` on `device`: on the device where it can
/// take an f64 `log` and `cos` (f32 always can), else computed here from the same bits by
/// the same formula (f64 on a wgpu adapter: WGSL has no f64 transcendentals).
fn normal_on(device: &Device, shape: &Shape, dtype: DType, op: &'static str) -> Result<Tensor> {
    float_dtype(op, dtype)?;
    let on_device = dtype != DType::F64 || device.info().is_ok_and(|i| i.features.f64_math);
    if on_device {
        // Drawn flat, so a pair is two consecutive elements of the row-major order.
        let flat = Shape::from([count(shape, dtype, op)?]);
        let bits = draw(device, &flat, dtype, op, &layout(dtype, 2))?;
        return Ok(normal(&bits, dtype).reshape_to(shape.clone()));
    }
    let numel = count(shape, dtype, op)?;
    let (seed, stream) = next_draw();
    let philox = Philox { seed, stream };
    let bytes = numel * 8;
    let mut host = Vec::new();
    host.try_reserve_exact(bytes)
        .map_err(|_| tessel_runtime::out_of_host_memory(bytes))?;
    // The device formula: 27 + 26 bits of two words per uniform, words 0..4 of block `i`.
    let uniform = |i: u64, w: u8| {
        let (hi, lo) = (
            philox.at(Words::single(w), i) >> 5,
            philox.at(Words::single(w + 1), i) >> 6,
        );
        f64::from(hi) * 2f64.powi(-27) + f64::from(lo) * 2f64.powi(-53)
    };
    for i in 0..numel as u64 {
        let (u1, u2) = (uniform(i, 0), uniform(i, 2));
        let z = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        host.extend_from_slice(&z.to_le_bytes());
    }
    Ok(Tensor::from_bytes_on(host, dtype, shape.clone(), *device))
}

/// Checks that random values can be drawn as `dtype`.
fn float_dtype(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op,
            dtype,
            hint: "random values are drawn as floats; use a float dtype (f16, bf16, f32, f64) and .cast() the result",
        })
    }
}

/// One tensor of Philox bits (u32) of `shape` on `device` per entry of `words`, from one
/// draw, after checking that `dtype` (what the bits become) can hold `shape` (concrete, and
/// countable).
fn draw(
    device: &Device,
    shape: &Shape,
    dtype: DType,
    op: &'static str,
    words: &[Words],
) -> Result<Vec<Tensor>> {
    let numel = count(shape, dtype, op)?;
    let (seed, stream) = next_draw();
    let philox = Philox { seed, stream };
    if device.supports(DType::U64) {
        let key = key_tensor(philox, *device);
        KEYS.with(|k| {
            if let Some(keys) = k.borrow_mut().as_mut() {
                keys.push(key.clone());
            }
        });
        return Ok(words
            .iter()
            .map(|&w| key.record(Op::Random(key.node(), w), DType::U32, shape.clone()))
            .collect());
    }
    // The same bits, computed here.
    words
        .iter()
        .map(|&w| {
            let bytes = numel * 4;
            let mut host = Vec::new();
            host.try_reserve_exact(bytes)
                .map_err(|_| tessel_runtime::out_of_host_memory(bytes))?;
            for i in 0..numel as u64 {
                host.extend_from_slice(&philox.at(w, i).to_le_bytes());
            }
            Ok(Tensor::from_bytes_on(
                host,
                DType::U32,
                shape.clone(),
                *device,
            ))
        })
        .collect()
}

/// The element count of a concrete `shape` whose elements of `dtype` (and 32-bit words) the
/// host can address.
fn count(shape: &Shape, dtype: DType, op: &'static str) -> Result<usize> {
    let Some(dims) = shape.as_usizes() else {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("random tensors need a concrete shape, got {shape}"),
        });
    };
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n.checked_mul(dtype.size_bytes().max(4)).is_some())
        .filter(|&n| i64::try_from(n).is_ok())
        .ok_or_else(|| Error::InvalidArgument {
            op,
            reason: format!(
                "shape {shape} holds more elements of {dtype} than the host can address"
            ),
        })
}

/// `bits >> shift` as a float of `dtype`, times `scale`.
fn scaled_bits(bits: &Tensor, shift: u32, dtype: DType, scale: f64) -> Tensor {
    let shifted = bits.raw_binary(
        BinaryOp::Shr,
        &bits.full_like_scalar(Scalar::U32(shift), DType::U32),
    );
    let x = shifted.cast_to(dtype);
    x.raw_binary(
        BinaryOp::Mul,
        &x.full_like_scalar(Scalar::F64(scale), dtype),
    )
}

/// A uniform in `[0, 1)` of `dtype` from `words[first..]`: the top `p` bits of one word in
/// f32 (exact, then rounded to `dtype` exactly), or 27 + 26 bits of two words for f64.
fn uniform(words: &[Tensor], first: usize, dtype: DType) -> Tensor {
    if dtype == DType::F64 {
        let high = scaled_bits(&words[first], 5, DType::F64, 2f64.powi(-27));
        let low = scaled_bits(&words[first + 1], 6, DType::F64, 2f64.powi(-53));
        return high.raw_binary(BinaryOp::Add, &low);
    }
    let p = digits(dtype);
    scaled_bits(&words[first], 32 - p, DType::F32, 2f64.powi(-(p as i32))).cast_to(dtype)
}

/// Box-Muller over two uniforms of the compute dtype (f64 for f64, f32 otherwise), of a
/// flat draw: in f64 `r cos θ` for every element; otherwise the elements of a pair share
/// `r` and `θ`, the first taking `r cos θ`, the second `r sin θ`, computed as
/// `r cos(θ − π/2)` so each element needs one `cos` and a pair one `log` and `sqrt`.
fn normal(words: &[Tensor], dtype: DType) -> Tensor {
    let compute = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let (u1, u2) = if compute == DType::F64 {
        (uniform(words, 0, compute), uniform(words, 2, compute))
    } else {
        (uniform(words, 0, compute), uniform(words, 1, compute))
    };
    let c = |t: &Tensor, v: f64| t.full_like_scalar(Scalar::F64(v), compute);
    // 1 - u1 lies in (0, 1], so the log is finite.
    let log = c(&u1, 1.0)
        .raw_binary(BinaryOp::Sub, &u1)
        .raw_unary(UnaryOp::Log);
    let radius = log
        .raw_binary(BinaryOp::Mul, &c(&log, -2.0))
        .raw_unary(UnaryOp::Sqrt);
    let mut angle = u2.raw_binary(BinaryOp::Mul, &c(&u2, std::f64::consts::TAU));
    if compute == DType::F32 {
        // The second of a pair (odd position) turns its angle by -π/2: cos becomes sin.
        let index = Tensor::record_on(u2.device(), Op::Index(0), DType::I64, u2.shape().clone());
        let odd = index
            .raw_binary(
                BinaryOp::Rem,
                &index.full_like_scalar(Scalar::I64(2), DType::I64),
            )
            .cast_to(compute);
        let turn = odd.raw_binary(BinaryOp::Mul, &c(&odd, std::f64::consts::FRAC_PI_2));
        angle = angle.raw_binary(BinaryOp::Sub, &turn);
    }
    radius
        .raw_binary(BinaryOp::Mul, &angle.raw_unary(UnaryOp::Cos))
        .cast_to(dtype)
}
