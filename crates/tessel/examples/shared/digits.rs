//! The UCI handwritten digits (1797 8×8 images, scikit-learn's `load_digits`), shared by
//! the training examples: the data, a fixed train/test split, and a seeded shuffle.

use tessel::prelude::*;

const DATA: &str = include_str!("../data/optdigits.tes");
const TEST_SIZE: usize = 360;

/// The images (scaled to `[0, 1]`) and their classes.
pub(crate) struct Digits {
    pixels: Vec<f32>,
    labels: Vec<i64>,
}

impl Digits {
    pub(crate) fn len(&self) -> usize {
        self.labels.len()
    }

    /// The samples at `idx`, as `[n, 64]` pixels and `[n]` classes.
    pub(crate) fn batch(&self, idx: &[usize]) -> Result<(Tensor, Tensor)> {
        let mut pixels = Vec::with_capacity(idx.len() * 64);
        for &i in idx {
            pixels.extend_from_slice(&self.pixels[i * 64..(i + 1) * 64]);
        }
        let labels: Vec<i64> = idx.iter().map(|&i| self.labels[i]).collect();
        Ok((
            Tensor::from_vec(pixels, [idx.len(), 64])?,
            Tensor::from_vec(labels, [idx.len()])?,
        ))
    }
}

pub(crate) fn load() -> (Digits, Digits) {
    let mut all = Digits {
        pixels: Vec::new(),
        labels: Vec::new(),
    };
    for line in DATA.lines().filter(|l| !l.trim().is_empty()) {
        let values: Vec<i64> = line
            .split(',')
            .map(|v| v.trim().parse().expect("the data file holds integers"))
            .collect();
        assert_eq!(values.len(), 65, "64 pixels and a class per line");
        all.pixels
            .extend(values[..64].iter().map(|&p| p as f32 / 16.0));
        all.labels.push(values[64]);
    }
    // A fixed shuffle, then the last 360 samples (20%) are the test set.
    let mut order: Vec<usize> = (0..all.len()).collect();
    shuffle(&mut order, &mut Rng(2024));
    let split = |idx: &[usize]| Digits {
        pixels: idx
            .iter()
            .flat_map(|&i| all.pixels[i * 64..(i + 1) * 64].to_vec())
            .collect(),
        labels: idx.iter().map(|&i| all.labels[i]).collect(),
    };
    let (train, test) = order.split_at(all.len() - TEST_SIZE);
    (split(train), split(test))
}

/// `SplitMix64`, for the data shuffle.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

pub(crate) fn shuffle(v: &mut [usize], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i + 1));
    }
}
