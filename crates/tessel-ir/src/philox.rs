//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011),
//! the counter-based generator behind PyTorch's and JAX's device sampling: the block
//! function on the host ([`philox4x32_10`]) and in a kernel ([`emit`]), which compute the
//! same bits.
//!
//! The multiplications are 32×32→64-bit products (`u64` arithmetic), which compilers
//! turn into one wide multiply; a device without 64-bit integers cannot run such a kernel.

use tessel_shape::{BinaryOp, DType, Scalar};

use crate::builder::KernelBuilder;
use crate::kernel::Value;

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;
const ROUNDS: u32 = 10;

/// The low and the high 32-bit word of `x`.
pub fn split(x: u64) -> [u32; 2] {
    // Truncation is the point: the low and the high word.
    #[allow(clippy::cast_possible_truncation)]
    [x as u32, (x >> 32) as u32]
}

/// The Philox4x32 block function with 10 rounds.
pub fn philox4x32_10(mut ctr: [u32; 4], mut key: [u32; 2]) -> [u32; 4] {
    for round in 0..ROUNDS {
        if round > 0 {
            key = [key[0].wrapping_add(W0), key[1].wrapping_add(W1)];
        }
        let p0 = u64::from(M0) * u64::from(ctr[0]);
        let p1 = u64::from(M1) * u64::from(ctr[2]);
        let ([lo0, hi0], [lo1, hi1]) = (split(p0), split(p1));
        ctr = [hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0];
    }
    ctr
}

/// Emits the four Philox words for the row-major position `index` (a non-negative
/// integer value of any dtype) under `key` (four `u32` values: seed low and high words,
/// stream low and high words) into `kb`.
pub fn emit(kb: &mut KernelBuilder, index: Value, key: [Value; 4]) -> [Value; 4] {
    let wide = kb.cast(index, DType::U64);
    let shift = kb.constant(Scalar::U64(32));
    let i_lo = kb.cast(wide, DType::U32);
    let i_hi = kb.binary(BinaryOp::Shr, wide, shift);
    let i_hi = kb.cast(i_hi, DType::U32);
    let mut ctr = [i_lo, i_hi, key[2], key[3]];
    let mut k = [key[0], key[1]];
    let mulhilo = |kb: &mut KernelBuilder, m: u32, x: Value| {
        let m = kb.constant(Scalar::U64(u64::from(m)));
        let x = kb.cast(x, DType::U64);
        let p = kb.mul(m, x);
        let shift = kb.constant(Scalar::U64(32));
        let hi = kb.binary(BinaryOp::Shr, p, shift);
        (kb.cast(hi, DType::U32), kb.cast(p, DType::U32))
    };
    let (w0, w1) = (kb.constant(Scalar::U32(W0)), kb.constant(Scalar::U32(W1)));
    for round in 0..ROUNDS {
        if round > 0 {
            k = [kb.add(k[0], w0), kb.add(k[1], w1)];
        }
        let (hi0, lo0) = mulhilo(kb, M0, ctr[0]);
        let (hi1, lo1) = mulhilo(kb, M1, ctr[2]);
        let xor3 = |kb: &mut KernelBuilder, a: Value, b: Value, key: Value| {
            let ab = kb.binary(BinaryOp::Xor, a, b);
            kb.binary(BinaryOp::Xor, ab, key)
        };
        ctr = [
            xor3(kb, hi1, ctr[1], k[0]),
            lo1,
            xor3(kb, hi0, ctr[3], k[1]),
            lo0,
        ];
    }
    ctr
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors from Random123's `kat_vectors` (philox4x32, 10 rounds).
    #[test]
    fn matches_the_random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }
}
