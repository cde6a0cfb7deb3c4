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
use tessel_ir::philox::{emit, philox4x32_10, split};
use tessel_shape::{BinaryOp, DType};

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
