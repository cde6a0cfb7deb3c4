//! The float8 storage dtypes (`f8e4m3` = `torch.float8_e4m3fn`, `f8e5m2` =
//! `torch.float8_e5m2`): casts to and from every float dtype against a reference written
//! here from the formats' definitions (every bit pattern, and rounding of random values,
//! ties, subnormals, overflow, NaN and signed zeros), movement ops, `where`, safetensors,
//! and the errors for arithmetic.
//!
//! Every cast runs on tensors of one length, so the suite adds few distinct kernels.

use crate::common::{Rng, assert_err, promotion, unsupported};
use tessel_tensor::{
    Conv2dOptions, DType, Device, Error, F8E4M3, F8E5M2, PoolOptions, Result, Tensor, bf16, f16,
    load_safetensors, save_safetensors,
};

/// Elements of every cast test tensor.
const N: usize = 4096;

/// One float8 format, described by its exponent width.
#[derive(Clone, Copy, Debug)]
struct Format {
    dtype: DType,
    exponent_bits: u32,
    /// The largest finite pattern.
    max_finite: u8,
    /// What past the top of the grid becomes: NaN (`0x7f`) for e4m3fn, infinity (`0x7c`)
    /// for e5m2.
    overflow: u8,
}

const E4M3: Format = Format {
    dtype: DType::F8E4M3,
    exponent_bits: 4,
    max_finite: 0x7e,
    overflow: 0x7f,
};

const E5M2: Format = Format {
    dtype: DType::F8E5M2,
    exponent_bits: 5,
    max_finite: 0x7b,
    overflow: 0x7c,
};

impl Format {
    /// The value of a bit pattern, from the definition: bias `2^(e-1) - 1`, subnormals at
    /// exponent 0; e4m3fn has no infinity and only `S.1111.111` as NaN, e5m2 is IEEE-like.
    fn value(self, bits: u8) -> f64 {
        let m_bits = 7 - self.exponent_bits;
        let bias = (1i32 << (self.exponent_bits - 1)) - 1;
        let sign = if bits & 0x80 == 0 { 1.0 } else { -1.0 };
        let e = i32::from(bits >> m_bits) & ((1 << self.exponent_bits) - 1);
        let m = f64::from(bits & ((1 << m_bits) - 1)) / f64::from(1u8 << m_bits);
        let top = (1 << self.exponent_bits) - 1;
        // NaNs keep their sign, as PyTorch's conversions do.
        if self.exponent_bits == 4 && bits & 0x7f == 0x7f {
            f64::NAN.copysign(sign)
        } else if self.exponent_bits == 5 && e == top {
            if m == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN.copysign(sign)
            }
        } else if e == 0 {
            sign * m * 2f64.powi(1 - bias)
        } else {
            sign * (1.0 + m) * 2f64.powi(e - bias)
        }
    }

    /// The pattern nearest to `x`, ties to even, found by a linear search over the finite
    /// patterns; past the grid's top (as if it continued) the overflow pattern, with `x`'s
    /// sign, as PyTorch's conversion gives.
    fn nearest(self, x: f64) -> u8 {
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        if x.is_nan() {
            return 0x7f | sign;
        }
        let ax = x.abs();
        let max = self.value(self.max_finite);
        let tie = max + (max - self.value(self.max_finite - 1)) / 2.0;
        // The next grid point has an odd pattern for e4m3 and an even one (infinity) for
        // e5m2, so only e5m2 overflows at the tie itself.
        if ax > tie || (ax == tie && self.exponent_bits == 5) {
            return self.overflow | sign;
        }
        let below = (0..=self.max_finite)
            .rev()
            .find(|&b| self.value(b) <= ax)
            .unwrap_or(0);
        if below == self.max_finite || self.value(below) == ax {
            return below | sign;
        }
        let (down, up) = (ax - self.value(below), self.value(below + 1) - ax);
        let pick = if down < up || (down == up && below.is_multiple_of(2)) {
            below
        } else {
            below + 1
        };
        pick | sign
    }

    /// A tensor of this format holding the bit patterns.
    fn tensor(self, bits: &[u8], dims: &[usize]) -> Result<Tensor> {
        if self.exponent_bits == 4 {
            Tensor::from_vec(bits.iter().map(|&b| F8E4M3::from_bits(b)).collect(), dims)
        } else {
            Tensor::from_vec(bits.iter().map(|&b| F8E5M2::from_bits(b)).collect(), dims)
        }
    }

    /// A float8 tensor's bit patterns.
    fn bits(self, t: &Tensor) -> Result<Vec<u8>> {
        Ok(if self.exponent_bits == 4 {
            t.to_vec::<F8E4M3>()?.iter().map(|x| x.to_bits()).collect()
        } else {
            t.to_vec::<F8E5M2>()?.iter().map(|x| x.to_bits()).collect()
        })
    }
}

/// `N` bit patterns: every one of the 256 repeatedly, shuffled.
fn every_pattern(rng: &mut Rng) -> Vec<u8> {
    let mut bits: Vec<u8> = (0..N).map(|i| (i % 256) as u8).collect();
    for i in (1..N).rev() {
        bits.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    bits
}

/// Floats that stress rounding to `format`: every midpoint between neighbours (ties) and
/// its f32 neighbours, the values themselves, the overflow boundary, far out of range,
/// below half the smallest subnormal, NaN, infinities and both zeros; the rest random
/// across the whole exponent range.
fn hard_values(rng: &mut Rng, format: Format) -> Vec<f64> {
    let mut v = vec![
        0.0,
        -0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e30,
        -1e30,
        1e-30,
        448.0,
        464.0,
        -464.0,
        465.0,
        479.0,
        480.0,
        57344.0,
        61439.0,
        61440.0,
        -61440.0,
        65536.0,
    ];
    for b in 0..format.max_finite {
        let (lo, hi) = (format.value(b), format.value(b + 1));
        let mid = f64::midpoint(lo, hi);
        let mid32 = mid as f32;
        v.extend([
            mid,
            -mid,
            lo,
            f64::from(mid32.next_up()),
            f64::from(mid32.next_down()),
        ]);
    }
    while v.len() < N {
        let magnitude = 2f64.powi(rng.int(-22, 17) as i32) * rng.uniform(1.0, 2.0);
        v.push(if rng.next_u64().is_multiple_of(2) {
            magnitude
        } else {
            -magnitude
        });
    }
    v.truncate(N);
    v
}

/// Checks a widened tensor's values against the reference values of `bits`.
fn assert_widened(what: &str, got: &[f64], bits: &[u8], format: Format) {
    for (&g, &b) in got.iter().zip(bits) {
        let want = format.value(b);
        assert!(
            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
            "{what}: pattern {b:#04x} gave {g}, expected {want}"
        );
    }
}

#[test]
fn every_bit_pattern_widens_exactly() -> Result<()> {
    let mut rng = Rng::new(81);
    for format in [E4M3, E5M2] {
        let bits = every_pattern(&mut rng);
        let x = format.tensor(&bits, &[N])?;
        assert_eq!(x.dtype(), format.dtype);
        let (a, b, c, d) = (
            x.cast(DType::F32),
            x.cast(DType::F64),
            x.cast(DType::F16),
            x.cast(DType::BF16),
        );
        Tensor::realize_all(&[&a, &b, &c, &d])?;
        let as_f64 = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
        assert_widened("to f32", &as_f64(a.to_vec::<f32>()?), &bits, format);
        assert_widened("to f64", &b.to_vec::<f64>()?, &bits, format);
        let halves: Vec<f64> = c.to_vec::<f16>()?.iter().map(|h| h.to_f64()).collect();
        assert_widened("to f16", &halves, &bits, format);
        let brains: Vec<f64> = d.to_vec::<bf16>()?.iter().map(|h| h.to_f64()).collect();
        assert_widened("to bf16", &brains, &bits, format);
    }
    Ok(())
}

#[test]
fn casts_round_to_nearest_even_like_pytorch() -> Result<()> {
    let mut rng = Rng::new(82);
    for format in [E4M3, E5M2] {
        let values = hard_values(&mut rng, format);
        let from_f64 = Tensor::from_vec(values.clone(), [N])?;
        let f32s: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        let from_f32 = Tensor::from_vec(f32s.clone(), [N])?;
        // Every f8 value is exact in f16 and bf16, and so are the ties between them;
        // other values round on the way in, and the reference starts from that.
        let halves: Vec<f16> = values.iter().map(|&v| f16::from_f64(v)).collect();
        let brains: Vec<bf16> = values.iter().map(|&v| bf16::from_f64(v)).collect();
        let from_f16 = Tensor::from_vec(halves.clone(), [N])?;
        let from_bf16 = Tensor::from_vec(brains.clone(), [N])?;
        let outs = [
            from_f64.cast(format.dtype),
            from_f32.cast(format.dtype),
            from_f16.cast(format.dtype),
            from_bf16.cast(format.dtype),
        ];
        Tensor::realize_all(&outs.iter().collect::<Vec<_>>())?;
        let exact: [Vec<f64>; 4] = [
            values.clone(),
            f32s.iter().map(|&v| f64::from(v)).collect(),
            halves.iter().map(|h| h.to_f64()).collect(),
            brains.iter().map(|h| h.to_f64()).collect(),
        ];
        for ((source, out), exact) in ["f64", "f32", "f16", "bf16"].iter().zip(&outs).zip(&exact) {
            let got = format.bits(out)?;
            for (i, (&g, &x)) in got.iter().zip(exact).enumerate() {
                let want = format.nearest(x);
                assert_eq!(
                    g,
                    want,
                    "{source} {x:e} (element {i}) to {}: got {g:#04x} ({}), expected \
                     {want:#04x} ({})",
                    format.dtype,
                    format.value(g),
                    format.value(want)
                );
            }
        }
    }
    Ok(())
}

#[test]
fn casts_between_the_float8_formats_and_back() -> Result<()> {
    let mut rng = Rng::new(83);
    for (from, to) in [(E4M3, E5M2), (E5M2, E4M3)] {
        let bits = every_pattern(&mut rng);
        let x = from.tensor(&bits, &[N])?;
        let there = x.cast(to.dtype);
        // Through f32 and back: the identity on every non-NaN pattern.
        let back = x.cast(DType::F32).cast(from.dtype);
        Tensor::realize_all(&[&there, &back])?;
        for ((&b, &g), &r) in bits.iter().zip(&to.bits(&there)?).zip(&from.bits(&back)?) {
            assert_eq!(g, to.nearest(from.value(b)), "{b:#04x} to {}", to.dtype);
            if from.value(b).is_nan() {
                assert_eq!(r & 0x7f, 0x7f, "NaN {b:#04x} stays NaN");
            } else {
                assert_eq!(r, b, "{b:#04x} through f32");
            }
        }
    }
    Ok(())
}

#[test]
fn movement_ops_move_the_bits() -> Result<()> {
    let mut rng = Rng::new(84);
    for format in [E4M3, E5M2] {
        let bits: Vec<u8> = (0..24).map(|_| (rng.next_u64() & 0xff) as u8).collect();
        let other: Vec<u8> = (0..8).map(|_| (rng.next_u64() & 0xff) as u8).collect();
        let x = format.tensor(&bits, &[2, 3, 4])?;
        let y = format.tensor(&other, &[2, 1, 4])?;
        // x[i, j, k] = bits[12 i + 4 j + k].
        let at = |i: usize, j: usize, k: usize| bits[12 * i + 4 * j + k];
        let permuted = x.permute(&[2, 0, 1])?.reshape(&[4, 6])?;
        let joined = Tensor::cat(&[&x, &y], 1)?;
        let padded = x.pad(&[(1, 0), (0, 2)], 0.0)?;
        let flipped = x.flip(&[2])?;
        let mask = Tensor::from_vec((0..24).map(|i| i % 3 == 0).collect::<Vec<_>>(), [2, 3, 4])?;
        let selected = Tensor::where_cond(&mask, &x, &x.flip(&[0])?)?;
        let outs = [&permuted, &joined, &padded, &flipped, &selected];
        Tensor::realize_all(&outs)?;
        for t in outs {
            assert_eq!(t.dtype(), format.dtype);
        }

        let mut want = Vec::new();
        for k in 0..4 {
            for i in 0..2 {
                for j in 0..3 {
                    want.push(at(i, j, k));
                }
            }
        }
        assert_eq!(format.bits(&permuted)?, want, "permute + reshape");

        want.clear();
        for i in 0..2 {
            for j in 0..4 {
                for k in 0..4 {
                    want.push(if j < 3 { at(i, j, k) } else { other[4 * i + k] });
                }
            }
        }
        assert_eq!(format.bits(&joined)?, want, "cat");

        want.clear();
        for i in 0..2 {
            for j in 0..4 {
                for k in 0..6 {
                    want.push(if j >= 1 && k < 4 { at(i, j - 1, k) } else { 0 });
                }
            }
        }
        assert_eq!(format.bits(&padded)?, want, "pad");

        want = (0..24).map(|n| at(n / 12, n / 4 % 3, 3 - n % 4)).collect();
        assert_eq!(format.bits(&flipped)?, want, "flip");

        want = (0..24)
            .map(|n| {
                if n % 3 == 0 {
                    bits[n]
                } else {
                    at(1 - n / 12, n / 4 % 3, n % 4)
                }
            })
            .collect();
        assert_eq!(format.bits(&selected)?, want, "where");
    }
    Ok(())
}

#[test]
fn arithmetic_is_an_error_and_float_functions_compute_in_f32() -> Result<()> {
    let x = Tensor::from_vec(vec![F8E4M3::from_f32(1.5), F8E4M3::from_f32(-2.0)], [2])?;
    let y = Tensor::from_vec(vec![F8E5M2::from_f32(1.5), F8E5M2::from_f32(-2.0)], [2])?;
    for t in [&x, &y] {
        let d = t.dtype();
        let cast_hint = ["float8", "cast"];
        assert_err("add", t.add(t), unsupported("add", d), &cast_hint);
        assert_err("mul scalar", t.mul(2.0), unsupported("mul", d), &cast_hint);
        assert_err("neg", t.neg(), unsupported("neg", d), &cast_hint);
        assert_err("lt", t.lt(t), unsupported("lt", d), &cast_hint);
        assert_err("sum", t.sum(&[0], false), unsupported("sum", d), &cast_hint);
        assert_err("max", t.max(&[0], false), unsupported("max", d), &cast_hint);
        assert_err("mean", t.mean(&[0], false), unsupported("mean", d), &[]);
        assert_err("matmul", t.matmul(t), unsupported("matmul", d), &cast_hint);
        // The index ops too: their kernels order and combine values.
        let at = Tensor::from_vec(vec![1i64, 0], [2])?;
        assert_err(
            "gather",
            t.gather(0, &at),
            unsupported("gather", d),
            &cast_hint,
        );
        assert_err(
            "index_select",
            t.index_select(0, &at),
            unsupported("index_select", d),
            &cast_hint,
        );
        assert_err(
            "take_along_dim",
            t.take_along_dim(&at, Some(0)),
            unsupported("take_along_dim", d),
            &cast_hint,
        );
        let table = t.reshape(&[2, 1])?;
        assert_err(
            "embedding",
            Tensor::embedding(&table, &at),
            unsupported("embedding", d),
            &cast_hint,
        );
        assert_err(
            "scatter",
            t.scatter(0, &at, t),
            unsupported("scatter", d),
            &cast_hint,
        );
        assert_err(
            "scatter_add",
            t.scatter_add(0, &at, t),
            unsupported("scatter_add", d),
            &cast_hint,
        );
        assert_err(
            "scatter_reduce mean",
            t.scatter_reduce(0, &at, t, "mean", true),
            unsupported("scatter_reduce", d),
            &["float8", "cast"],
        );
        assert_err(
            "nonzero",
            t.nonzero(),
            unsupported("nonzero", d),
            &cast_hint,
        );
        let mask = Tensor::from_vec(vec![true, false], [2])?;
        assert_err(
            "masked_select",
            t.masked_select(&mask),
            unsupported("masked_select", d),
            &cast_hint,
        );
        // Like torch.promote_types, no promotion with float8.
        let f = Tensor::from_vec(vec![1.0f32, 2.0], [2])?;
        assert_err(
            "add f32",
            t.add(&f),
            promotion("add"),
            &["float8", d.name()],
        );
        // Float functions compute in f32, as they do for integer inputs.
        let e = t.exp();
        assert_eq!(e.dtype(), DType::F32);
        let got = e.to_vec::<f32>()?;
        for (g, w) in got.iter().zip([1.5f64.exp(), (-2.0f64).exp()]) {
            assert!((f64::from(*g) - w).abs() <= 1e-5 * w, "exp: {g} vs {w}");
        }
    }
    let image = Tensor::zeros([1, 1, 4, 4], DType::F8E4M3);
    let kernel = Tensor::zeros([1, 1, 3, 3], DType::F8E4M3);
    assert_err(
        "conv2d",
        image.conv2d(&kernel, None, &Conv2dOptions::default()),
        unsupported("conv2d", DType::F8E4M3),
        &["float8"],
    );
    assert_err(
        "max_pool2d",
        image.max_pool2d(&PoolOptions::new([2, 2])),
        unsupported("max_pool2d", DType::F8E4M3),
        &["float8"],
    );
    // isclose compares float8 values exactly in f64.
    let close = x.isclose(&x.flip(&[0])?, 0.0, 3.5, false)?;
    assert_eq!(close.to_vec::<bool>()?, vec![true, true]);
    let far = x.isclose(&x.flip(&[0])?, 0.0, 3.0, false)?;
    assert_eq!(far.to_vec::<bool>()?, vec![false, false]);
    assert_err(
        "cat f8e4m3 with f8e5m2",
        Tensor::cat(&[&x, &y], 0),
        promotion("cat"),
        &["f8e4m3", "f8e5m2"],
    );
    assert!(matches!("f8e5m2".parse::<DType>(), Ok(DType::F8E5M2)));
    Ok(())
}

#[test]
fn safetensors_round_trip_keeps_the_bits() -> Result<()> {
    let mut rng = Rng::new(85);
    let dir = std::env::temp_dir().join(format!("tessel-float8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::InvalidArgument {
        op: "test",
        reason: e.to_string(),
    })?;
    let path = dir.join("f8.safetensors");
    let bits: Vec<u8> = (0..12).map(|_| (rng.next_u64() & 0xff) as u8).collect();
    let a = E4M3.tensor(&bits, &[3, 4])?;
    let b = E5M2.tensor(&bits, &[4, 3])?;
    save_safetensors(&path, &[("a".into(), a), ("b".into(), b)])?;
    let raw = std::fs::read(&path).unwrap_or_default();
    let header = String::from_utf8_lossy(&raw);
    assert!(header.contains("\"F8_E4M3\"") && header.contains("\"F8_E5M2\""));
    let loaded = load_safetensors(&path, &Device::default())?;
    for (name, t) in &loaded {
        let (format, dims) = if name == "a" {
            (E4M3, vec![3, 4])
        } else {
            (E5M2, vec![4, 3])
        };
        assert_eq!((t.dtype(), t.dims()), (format.dtype, dims), "{name}");
        assert_eq!(format.bits(t)?, bits, "{name}");
    }
    assert_eq!(loaded.len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn exact_elementwise_ops_keep_the_dtype() -> Result<()> {
    // 1.5, -2, +0, -0, NaN, -NaN, and for e5m2 +inf, -inf (e4m3: 448, -448).
    for format in [E4M3, E5M2] {
        let top = if format.exponent_bits == 5 {
            0x7c
        } else {
            0x7e
        };
        let bits = [
            format.nearest(1.5),
            format.nearest(-2.0),
            0x00,
            0x80,
            0x7f,
            0xff,
            top,
            top | 0x80,
        ];
        let x = format.tensor(&bits, &[8])?;
        let (relu, sign, nan, inf) = (x.relu(), x.sign(), x.isnan(), x.isinf());
        let cleaned = x.nan_to_num(0.5, None, None);
        Tensor::realize_all(&[&relu, &sign, &nan, &inf, &cleaned])?;
        let values: Vec<f64> = bits.iter().map(|&b| format.value(b)).collect();
        let relu_want: Vec<u8> = values
            .iter()
            .zip(bits)
            .map(|(&v, b)| if v.is_nan() || v > 0.0 { b } else { 0 })
            .collect();
        assert_eq!(relu.dtype(), format.dtype);
        for ((g, w), v) in format.bits(&relu)?.iter().zip(&relu_want).zip(&values) {
            // NaN stays a NaN; its sign is not specified (CUDA's and NVIDIA OpenCL's
            // max return the canonical NaN).
            assert!(
                g == w || (v.is_nan() && format.value(*g).is_nan()),
                "relu {v}: {g:#04x}"
            );
        }
        let sign_want: Vec<u8> = values
            .iter()
            .zip(bits)
            .map(|(&v, b)| match v {
                _ if v.is_nan() => b,
                v if v > 0.0 => format.nearest(1.0),
                v if v < 0.0 => format.nearest(-1.0),
                // Both zeros give +0, as on the other float dtypes.
                _ => 0,
            })
            .collect();
        let got_sign = format.bits(&sign)?;
        for ((g, w), v) in got_sign.iter().zip(&sign_want).zip(&values) {
            // NaN stays a NaN (its sign is not specified).
            assert!(
                g == w || (v.is_nan() && g & 0x7f == 0x7f),
                "sign {v}: {g:#04x}"
            );
        }
        let nan_want: Vec<bool> = values.iter().map(|v| v.is_nan()).collect();
        let inf_want: Vec<bool> = values.iter().map(|v| v.is_infinite()).collect();
        assert_eq!(nan.to_vec::<bool>()?, nan_want);
        assert_eq!(inf.to_vec::<bool>()?, inf_want);
        // NaN to 0.5; infinities to the largest finite values, as for other floats.
        let max = format.value(format.max_finite);
        let cleaned_want: Vec<u8> = values
            .iter()
            .zip(bits)
            .map(|(&v, b)| match v {
                v if v.is_nan() => format.nearest(0.5),
                v if v == f64::INFINITY => format.nearest(max),
                v if v == f64::NEG_INFINITY => format.nearest(-max),
                _ => b,
            })
            .collect();
        assert_eq!(format.bits(&cleaned)?, cleaned_want, "nan_to_num");
    }
    Ok(())
}
