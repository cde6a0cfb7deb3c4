//! Test data: a seeded generator, element bytes of every dtype, and the few results the
//! checks compute directly in Rust.

use tessel_shape::{DType, F8E4M3, F8E5M2, bf16, f16};

/// splitmix64: a tiny, fixed-seed generator, so every run (and every backend) sees the
/// same data.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// `n` values uniform in `[-1, 1)`.
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit() as f32).collect()
    }
}

/// Little-endian elements of `dtype`, each value rounded to it (to nearest, as a cast).
pub fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    let size = dtype.size_bytes();
    values
        .iter()
        .flat_map(|&v| {
            let bits = tessel_shape::Scalar::F64(v).cast(dtype).to_bits();
            bits.to_le_bytes().into_iter().take(size)
        })
        .collect()
}

/// The little-endian elements of `dtype` in `bytes`, widened to `f64`.
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(dtype.size_bytes())
        .map(|c| tessel_shape::Scalar::from_le_bytes(dtype, c).to_f64())
        .collect()
}

/// Little-endian bytes of `f32`s.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `f32`s from little-endian bytes.
pub fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `n` random elements of `dtype`: any bits for integers, 0 or 1 for `bool`, and finite
/// values in `[-100, 100)` for floats (so that sums are ordinary numbers).
pub fn random_elements(rng: &mut Rng, dtype: DType, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size_bytes());
    for _ in 0..n {
        let bits = rng.next_u64();
        let x = rng.unit() * 100.0;
        match dtype {
            DType::Bool => out.push((bits & 1) as u8),
            DType::F16 => out.extend(f16::from_f64(x).to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f64(x).to_le_bytes()),
            DType::F32 => out.extend((x as f32).to_le_bytes()),
            DType::F64 => out.extend(x.to_le_bytes()),
            DType::F8E4M3 => out.push(F8E4M3::from_f64(x).to_bits()),
            DType::F8E5M2 => out.push(F8E5M2::from_f64(x).to_bits()),
            _ => out.extend(&bits.to_le_bytes()[..dtype.size_bytes()]),
        }
    }
    out
}

/// `a + b` element by element, as Rust computes it for `dtype` (wrapping for integers, `or`
/// for `bool`).
pub fn add_in_rust(dtype: DType, a: &[u8], b: &[u8]) -> Vec<u8> {
    macro_rules! elementwise {
        ($t:ty, |$x:ident, $y:ident| $e:expr) => {
            a.chunks_exact(size_of::<$t>())
                .zip(b.chunks_exact(size_of::<$t>()))
                .flat_map(|(x, y)| {
                    let $x = <$t>::from_le_bytes(x.try_into().unwrap());
                    let $y = <$t>::from_le_bytes(y.try_into().unwrap());
                    $e.to_le_bytes()
                })
                .collect()
        };
    }
    match dtype {
        DType::Bool => a.iter().zip(b).map(|(x, y)| x | y).collect(),
        DType::U8 => elementwise!(u8, |x, y| x.wrapping_add(y)),
        DType::U16 => elementwise!(u16, |x, y| x.wrapping_add(y)),
        DType::U32 => elementwise!(u32, |x, y| x.wrapping_add(y)),
        DType::U64 => elementwise!(u64, |x, y| x.wrapping_add(y)),
        DType::I8 => elementwise!(i8, |x, y| x.wrapping_add(y)),
        DType::I16 => elementwise!(i16, |x, y| x.wrapping_add(y)),
        DType::I32 => elementwise!(i32, |x, y| x.wrapping_add(y)),
        DType::I64 => elementwise!(i64, |x, y| x.wrapping_add(y)),
        DType::F16 => elementwise!(f16, |x, y| x + y),
        DType::BF16 => elementwise!(bf16, |x, y| x + y),
        DType::F32 => elementwise!(f32, |x, y| x + y),
        DType::F64 => elementwise!(f64, |x, y| x + y),
        // No arithmetic on float8: cast to a wider float and back, as a user would.
        DType::F8E4M3 => a
            .iter()
            .zip(b)
            .map(|(&x, &y)| {
                let sum = F8E4M3::from_bits(x).to_f32() + F8E4M3::from_bits(y).to_f32();
                F8E4M3::from_f32(sum).to_bits()
            })
            .collect(),
        DType::F8E5M2 => a
            .iter()
            .zip(b)
            .map(|(&x, &y)| {
                let sum = F8E5M2::from_bits(x).to_f32() + F8E5M2::from_bits(y).to_f32();
                F8E5M2::from_f32(sum).to_bits()
            })
            .collect(),
    }
}

/// Interesting values of `dtype`, as little-endian bytes: zeros of both signs, infinities,
/// NaNs, subnormals, `MIN`, `MAX`, `-1`, shift amounts around the width.
pub(crate) fn specials(dtype: DType) -> Vec<Vec<u8>> {
    let f64s = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.5,
        -2.5,
        3.0,
        1e-40,
        -1e-310,
        65504.0,
        1e30,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MAX,
        f64::MIN_POSITIVE,
    ];
    match dtype {
        DType::Bool => vec![vec![0], vec![1]],
        DType::F16 => f64s
            .iter()
            .map(|&x| f16::from_f64(x).to_le_bytes().to_vec())
            .chain([vec![1, 0], vec![0xff, 0x03]])
            .collect(),
        DType::BF16 => f64s
            .iter()
            .map(|&x| bf16::from_f64(x).to_le_bytes().to_vec())
            .chain([vec![1, 0]])
            .collect(),
        DType::F32 => f64s
            .iter()
            .map(|&x| (x as f32).to_le_bytes().to_vec())
            .chain([f32::from_bits(1).to_le_bytes().to_vec()])
            .collect(),
        DType::F64 => f64s.iter().map(|&x| x.to_le_bytes().to_vec()).collect(),
        // Zeros, the largest finite values, NaNs, infinity (e5m2), the smallest subnormal.
        DType::F8E4M3 | DType::F8E5M2 => {
            [0x00, 0x80, 0x7e, 0xfe, 0x7b, 0x7c, 0xfc, 0x7f, 0xff, 0x01]
                .iter()
                .map(|&b| vec![b])
                .collect()
        }
        _ => {
            let size = dtype.size_bytes();
            let bits = dtype.bits() as u64;
            let (min, max) = (dtype.min_value().to_bits(), dtype.max_value().to_bits());
            [0, 1, 2, u64::MAX, min, max, bits - 1, bits, bits + 1, 7]
                .iter()
                .map(|v: &u64| v.to_le_bytes()[..size].to_vec())
                .collect()
        }
    }
}

/// `n` elements of `dtype` for the op checks: a quarter special values, the rest random
/// bits (random small values for floats' second quarter, so that transcendentals see
/// ordinary arguments).
pub(crate) fn op_data(rng: &mut Rng, dtype: DType, n: usize) -> Vec<u8> {
    let specials = specials(dtype);
    let mut out = Vec::with_capacity(n * dtype.size_bytes());
    for _ in 0..n {
        let bits = rng.next_u64().to_le_bytes();
        let x = rng.unit() * 8.0;
        let element = match (rng.below(4), dtype) {
            (0, _) => specials[rng.below(specials.len() as u64) as usize].clone(),
            (_, DType::Bool) => vec![bits[0] & 1],
            (1, DType::F16) => f16::from_f64(x).to_le_bytes().to_vec(),
            (1, DType::BF16) => bf16::from_f64(x).to_le_bytes().to_vec(),
            (1, DType::F32) => (x as f32).to_le_bytes().to_vec(),
            (1, DType::F64) => x.to_le_bytes().to_vec(),
            _ => bits[..dtype.size_bytes()].to_vec(),
        };
        out.extend(element);
    }
    out
}

/// Whether `bytes` is a NaN of `dtype` (never for non-floats).
pub(crate) fn is_nan(dtype: DType, bytes: &[u8]) -> bool {
    match dtype {
        DType::F16 => f16::from_le_bytes([bytes[0], bytes[1]]).is_nan(),
        DType::BF16 => bf16::from_le_bytes([bytes[0], bytes[1]]).is_nan(),
        DType::F32 => f32::from_le_bytes(bytes.try_into().unwrap()).is_nan(),
        DType::F64 => f64::from_le_bytes(bytes.try_into().unwrap()).is_nan(),
        DType::F8E4M3 => F8E4M3::from_bits(bytes[0]).is_nan(),
        DType::F8E5M2 => F8E5M2::from_bits(bytes[0]).is_nan(),
        _ => false,
    }
}

/// A float's bits mapped to integers that order like the values (`-0` and `+0` both 0), so
/// that the difference of two is their distance in ulps.
fn ordered(dtype: DType, bytes: &[u8]) -> i128 {
    let (bits, sign) = match dtype {
        DType::F8E4M3 | DType::F8E5M2 => (u64::from(bytes[0]), 7),
        DType::F16 | DType::BF16 => (u64::from(u16::from_le_bytes([bytes[0], bytes[1]])), 15),
        DType::F32 => (u64::from(u32::from_le_bytes(bytes.try_into().unwrap())), 31),
        _ => (u64::from_le_bytes(bytes.try_into().unwrap()), 63),
    };
    let magnitude = i128::from(bits & ((1 << sign) - 1));
    if bits >> sign == 1 {
        -magnitude
    } else {
        magnitude
    }
}

/// Whether `got` is an acceptable element of `dtype` for the reference's `want`: equal bits,
/// NaN in both (payloads aside), or, when `ulps > 0`, two non-NaN floats at most `ulps`
/// apart (`-0` and `+0` count as equal only then).
pub fn agrees(dtype: DType, ulps: u64, got: &[u8], want: &[u8]) -> bool {
    if got == want || (is_nan(dtype, got) && is_nan(dtype, want)) {
        return true;
    }
    if ulps == 0 || !dtype.is_float() || is_nan(dtype, got) || is_nan(dtype, want) {
        return false;
    }
    ordered(dtype, got).abs_diff(ordered(dtype, want)) <= u128::from(ulps)
}

#[cfg(test)]
mod tests {
    use super::{DType, agrees, f16};

    #[test]
    fn ulps_are_counted_across_zero_and_nans_never_match_numbers() {
        let f = |x: f32| x.to_le_bytes();
        let next = f32::from_bits(1.0f32.to_bits() + 1);
        assert!(agrees(DType::F32, 0, &f(1.0), &f(1.0)));
        assert!(agrees(DType::F32, 0, &f(f32::NAN), &f(-f32::NAN)));
        assert!(!agrees(DType::F32, 0, &f(next), &f(1.0)));
        assert!(agrees(DType::F32, 1, &f(next), &f(1.0)));
        // Bit for bit tells the zeros apart; with a tolerance they are 0 ulps apart.
        assert!(!agrees(DType::F32, 0, &f(-0.0), &f(0.0)));
        assert!(agrees(DType::F32, 1, &f(-0.0), &f(0.0)));
        let tiny = f32::from_bits(1);
        assert!(agrees(DType::F32, 2, &f(-tiny), &f(tiny)));
        assert!(!agrees(DType::F32, 1, &f(-tiny), &f(tiny)));
        assert!(!agrees(DType::F32, 100, &f(f32::NAN), &f(1.0)));
        assert!(agrees(DType::F32, 1, &f(f32::INFINITY), &f(f32::MAX)));
        let h = |x: f32| f16::from_f32(x).to_le_bytes();
        assert!(agrees(DType::F16, 1, &h(1.0), &h(1.000_977)));
        // Integers are always exact.
        assert!(!agrees(
            DType::I32,
            5,
            &1i32.to_le_bytes(),
            &2i32.to_le_bytes()
        ));
    }
}
