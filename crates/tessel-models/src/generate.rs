//! Text generation: [`CausalLm`] (a decoder stepping through a [`KvCache`]), token
//! sampling ([`Sampler`]: greedy, temperature, top-k, top-p, seeded) and [`generate`].

use tessel_tensor::{DType, Error, Result, Tensor};

use crate::cache::KvCache;

/// A decoder-only language model that runs a step over new tokens through a cache.
pub trait CausalLm {
    /// The logits `[B, T, vocab]` of `input_ids` (`[B, T]` i64, on any device: they are
    /// moved to the model's), the tokens of the step [`KvCache::begin`] opened; appends their keys and values to `cache` (committed by
    /// the caller after realizing).
    fn forward_cached(&self, input_ids: &Tensor, cache: &mut KvCache) -> Result<Tensor>;

    /// An empty cache for this model.
    fn new_cache(&self) -> Result<KvCache>;

    /// The vocabulary size.
    fn vocab_size(&self) -> usize;
}

/// How [`generate`] picks tokens and when it stops.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// Tokens to add to each prompt.
    pub max_new_tokens: usize,
    /// `0`: greedy (the most likely token, as `do_sample=False`); else logits are divided by
    /// it before sampling.
    pub temperature: f64,
    /// Sample only among the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probabilities sum to at least `p`.
    pub top_p: Option<f64>,
    /// The sampler's seed: the same seed gives the same tokens.
    pub seed: u64,
    /// A row that produces this token is finished; it is padded from then on.
    pub eos_token_id: Option<i64>,
    /// The token that left-pads shorter prompts and finished rows.
    pub pad_token_id: i64,
}

impl GenerateOptions {
    /// Greedy decoding of `max_new_tokens` tokens, never stopping early.
    pub fn greedy(max_new_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens,
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
            eos_token_id: None,
            pad_token_id: 0,
        }
    }
}

/// Picks tokens from logits with a seeded generator (`SplitMix64`): greedy, or softmax
/// sampling after temperature, top-k and top-p filtering, in `transformers`' order. The
/// random stream is Tessel's own: a seed reproduces Tessel's samples, not PyTorch's.
#[derive(Clone, Debug)]
pub struct Sampler {
    state: u64,
}

impl Sampler {
    /// A sampler seeded with `seed`.
    pub fn new(seed: u64) -> Sampler {
        Sampler { state: seed }
    }

    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The token chosen from one row of logits.
    pub fn sample(&mut self, logits: &[f32], opts: &GenerateOptions) -> Result<i64> {
        // The first maximum, NaN counting as the largest, as `torch.argmax` (and
        // `Tensor::argmax`, which `generate` runs on the device for greedy decoding).
        let argmax = |xs: &[f32]| {
            let mut best = 0;
            for (i, &x) in xs.iter().enumerate() {
                if xs[best].is_nan() {
                    break;
                }
                if x > xs[best] || x.is_nan() {
                    best = i;
                }
            }
            best as i64
        };
        if opts.temperature == 0.0 {
            return Ok(argmax(logits));
        }
        if !(opts.temperature > 0.0 && opts.temperature.is_finite()) {
            return Err(Error::InvalidArgument {
                op: "generate",
                reason: format!(
                    "temperature must be 0 (greedy) or positive, got {}",
                    opts.temperature
                ),
            });
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if let Some(k) = opts.top_k {
            order.truncate(k.max(1));
        }
        let top = f64::from(logits[order[0]]);
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| ((f64::from(logits[i]) - top) / opts.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut keep = weights.len();
        if let Some(p) = opts.top_p {
            let mut cum = 0.0;
            for (n, w) in weights.iter().enumerate() {
                cum += w / total;
                if cum >= p {
                    keep = n + 1;
                    break;
                }
            }
        }
        let total: f64 = weights[..keep].iter().sum();
        let mut u = self.uniform() * total;
        for (n, w) in weights[..keep].iter().enumerate() {
            u -= w;
            if u < 0.0 {
                return Ok(order[n] as i64);
            }
        }
        Ok(order[keep - 1] as i64)
    }
}

/// Continues every prompt by `opts.max_new_tokens` tokens and returns each row as
/// `transformers`' `generate` does: the prompt left-padded to the longest with
/// `opts.pad_token_id`, then the new tokens (padding after a row's end-of-sequence token).
///
/// The prompt runs as one step; then each new token is one step through the model's
/// [`KvCache`], whose length is a dynamic dim: decoding compiles for the first new token and
/// replays that plan for every later one. `on_token(row, token)` sees each token as it is
/// chosen.
pub fn generate(
    model: &dyn CausalLm,
    prompts: &[Vec<i64>],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(usize, i64),
) -> Result<Vec<Vec<i64>>> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(Error::InvalidArgument {
            op: "generate",
            reason: "every prompt needs at least one token".into(),
        });
    }
    let vocab = model.vocab_size() as i64;
    if let Some(bad) = prompts
        .iter()
        .flatten()
        .find(|&&t| !(0..vocab).contains(&t))
    {
        return Err(Error::InvalidArgument {
            op: "generate",
            reason: format!("token {bad} is outside the vocabulary of {vocab}"),
        });
    }
    let b = prompts.len();
    let mut rows: Vec<Vec<i64>> = Vec::with_capacity(b);
    let mut mask = Vec::with_capacity(b);
    for p in prompts {
        let pad = longest - p.len();
        let mut row = vec![opts.pad_token_id; pad];
        row.extend(p);
        rows.push(row);
        let mut m = vec![false; pad];
        m.extend(vec![true; p.len()]);
        mask.push(m);
    }
    let mut cache = model.new_cache()?;
    let mut sampler = Sampler::new(opts.seed);
    let mut finished = vec![false; b];
    let mut step: Vec<i64> = rows.iter().flatten().copied().collect();
    let mut width = longest;
    let greedy = opts.temperature == 0.0;
    for _ in 0..opts.max_new_tokens {
        cache.begin(mask)?;
        let ids = Tensor::from_vec(step, [b, width])?;
        let logits = model.forward_cached(&ids, &mut cache)?;
        let last = logits.narrow(1, width as i64 - 1, 1)?;
        // Greedy decoding picks each row's token on the device (`torch.argmax`'s choice):
        // a step reads back one index per row instead of a row of logits.
        let last = if greedy {
            last.argmax(2, false)?
        } else {
            last.cast(DType::F32)
        };
        let mut outputs = vec![&last];
        outputs.extend(cache.pending());
        Tensor::realize_all(&outputs)?;
        cache.commit()?;
        let (values, chosen) = if greedy {
            (Vec::new(), last.to_vec::<i64>()?)
        } else {
            (last.to_vec::<f32>()?, Vec::new())
        };
        let v = model.vocab_size();
        step = Vec::with_capacity(b);
        for (r, row) in rows.iter_mut().enumerate() {
            let token = if finished[r] {
                opts.pad_token_id
            } else {
                let t = if greedy {
                    chosen[r]
                } else {
                    sampler.sample(&values[r * v..(r + 1) * v], opts)?
                };
                on_token(r, t);
                finished[r] = opts.eos_token_id == Some(t);
                t
            };
            row.push(token);
            step.push(token);
        }
        mask = vec![vec![true]; b];
        width = 1;
        if finished.iter().all(|&f| f) {
            break;
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::{GenerateOptions, Sampler};

    #[test]
    fn greedy_takes_the_first_maximum_and_nan_as_torch_argmax() {
        let greedy = GenerateOptions::greedy(1);
        let mut s = Sampler::new(0);
        assert_eq!(s.sample(&[0.5, 2.0, -1.0, 2.0], &greedy).unwrap(), 1);
        assert_eq!(
            s.sample(&[0.5, f32::NAN, 3.0, f32::NAN], &greedy).unwrap(),
            1
        );
        assert_eq!(s.sample(&[f32::NAN, 9.0], &greedy).unwrap(), 0);
    }

    #[test]
    fn sampling_is_seeded_and_filters_by_top_k_and_top_p() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 50) as f32 / 10.0).collect();
        let sampling = GenerateOptions {
            temperature: 1.0,
            ..GenerateOptions::greedy(1)
        };
        let draw = |opts: &GenerateOptions, seed| {
            let mut s = Sampler::new(seed);
            (0..64)
                .map(|_| s.sample(&logits, opts).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(&sampling, 7), draw(&sampling, 7));
        assert_ne!(draw(&sampling, 7), draw(&sampling, 8));
        let top = Sampler::new(0)
            .sample(&logits, &GenerateOptions::greedy(1))
            .unwrap();
        let top_k = GenerateOptions {
            top_k: Some(1),
            ..sampling.clone()
        };
        assert!(draw(&top_k, 3).iter().all(|&t| t == top));
        let top_p = GenerateOptions {
            top_p: Some(1e-6),
            ..sampling.clone()
        };
        assert!(draw(&top_p, 3).iter().all(|&t| t == top));
        let two = GenerateOptions {
            top_k: Some(2),
            ..sampling
        };
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let best_two = [order[0] as i64, order[1] as i64];
        let drawn = draw(&two, 5);
        assert!(drawn.iter().all(|t| best_two.contains(t)));
        assert!(best_two.iter().all(|t| drawn.contains(t)), "{drawn:?}");
    }
}
