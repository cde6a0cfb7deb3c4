//! Counter-based random bits: Philox4x32-10 (Salmon et al., "Parallel random numbers: as
//! easy as 1, 2, 3", SC 2011), the generator behind PyTorch's and JAX's device sampling.
//!
//! An [`crate::Op::Random`] node's element at row-major position `i` is one output word of
//! the Philox4x32-10 block function applied to the counter `(i_lo, i_hi, stream_lo,
//! stream_hi)` under the key `(seed_lo, seed_hi)`, both read from the node's 4-element key
//! operand. Every element is a pure function of its position, so a kernel computes it where
//! it is needed (no buffer of bits, fused into its consumer), every backend computes the
//! same bits, and [`Philox::at`] computes them on the host.
//!
//! The multiplications are 32×32→64-bit products (`u64` arithmetic), which compilers
//! turn into one wide multiply; a device without 64-bit integers cannot run the kernel,
//! and the tensor layer computes such tensors on the host instead (the same bits).

use tessel_ir::KernelBuilder;
use tessel_ir::kernel::Value;
use tessel_shape::{BinaryOp, DType, Scalar};

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;
const ROUNDS: u32 = 10;

/// About how many instructions a kernel spends on one element's bits: what recomputing a
/// random value in each of its consumers costs, for the kernelizer's sharing decision.
pub(crate) const OPS: usize = 120;

/// Which Philox word each element of an [`crate::Op::Random`] node takes: element `i`
/// takes word `base + step · ⌊(i mod group) / run⌋` of the block at counter `⌊i / group⌋`.
/// Groups of 2 or 4 elements share one block, so a kernel computing consecutive outputs
/// computes each block once (its copies merge), instead of once per element; runs of 2
/// consecutive elements may share a word (a pair of normals from one pair of uniforms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Words {
    group: u8,
    step: u8,
    base: u8,
    run: u8,
}

impl Words {
    /// One word per element of its own block: word `w`.
    pub const fn single(w: u8) -> Words {
        Words::new(1, 1, w)
    }

    /// Words `base + step · (i mod group)`; `group` is 1, 2 or 4 and every word named is
    /// below 4 (checked in debug builds: the callers are this crate's users' internals).
    pub const fn new(group: u8, step: u8, base: u8) -> Words {
        debug_assert!(matches!(group, 1 | 2 | 4) && base + step * (group - 1) < 4);
        Words {
            group,
            step,
            base,
            run: 1,
        }
    }

    /// Pairs of consecutive elements sharing a word, two pairs per block: elements `4b`,
    /// `4b + 1` take word `base` of block `b`, elements `4b + 2`, `4b + 3` word `base + 2`
    /// (`base` is 0 or 1).
    pub const fn pairs(base: u8) -> Words {
        debug_assert!(base < 2);
        Words {
            group: 4,
            step: 2,
            base,
            run: 2,
        }
    }

    /// How many consecutive elements share a block.
    pub const fn group(&self) -> u8 {
        self.group
    }

    /// The counter of element `i`'s block and its word.
    pub fn of(&self, i: u64) -> (u64, usize) {
        let group = u64::from(self.group);
        let m = (i % group) as u8 / self.run;
        (i / group, usize::from(self.base + self.step * m))
    }
}

/// One draw's bits, for computing them on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Philox {
    /// The key.
    pub seed: u64,
    /// The upper half of the counter: one per draw, so draws under one seed never overlap.
    pub stream: u64,
}

impl Philox {
    /// Element `index` of a random node taking `words`.
    pub fn at(&self, words: Words, index: u64) -> u32 {
        let (block, word) = words.of(index);
        philox4x32_10(counter(block, self.stream), key(self.seed))[word]
    }

    /// The key operand of [`crate::Op::Random`] for this draw:
    /// `[seed_lo, seed_hi, stream_lo, stream_hi]`.
    pub fn key_operand(&self) -> [u32; 4] {
        let ([s_lo, s_hi], [t_lo, t_hi]) = (split(self.seed), split(self.stream));
        [s_lo, s_hi, t_lo, t_hi]
    }
}

fn counter(index: u64, stream: u64) -> [u32; 4] {
    let [i_lo, i_hi] = split(index);
    let [s_lo, s_hi] = split(stream);
    [i_lo, i_hi, s_lo, s_hi]
}

fn key(seed: u64) -> [u32; 2] {
    split(seed)
}

fn split(x: u64) -> [u32; 2] {
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

/// Emits the word `words` gives element `index` (an integer value), from the block at
/// counter `block` (`index / group`, computed by the caller so that its copies merge) and
/// `lane` (`index mod group`), both of the integer dtype `index`.
pub(crate) fn emit_word(
    kb: &mut KernelBuilder,
    (block, lane, index): (Value, Value, DType),
    key: [Value; 4],
    words: Words,
) -> Value {
    let block = emit(kb, block, key);
    let word = |j: u8| block[usize::from(words.base + words.step * (j / words.run))];
    let mut value = word(words.group - 1);
    for j in (0..words.group - 1).rev() {
        let j_value = kb.constant_as(i64::from(j), index);
        let here = kb.binary(BinaryOp::Eq, lane, j_value);
        value = kb.select(here, word(j), value);
    }
    value
}

/// Emits the four Philox words for the row-major position `index` (a non-negative
/// integer value of any dtype) under `key` (four `u32` values: seed low and high words,
/// stream low and high words) into `kb`.
fn emit(kb: &mut KernelBuilder, index: Value, key: [Value; 4]) -> [Value; 4] {
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
