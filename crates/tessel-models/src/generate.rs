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

    /// The token chosen from one row of logits. Errors on an empty row, a temperature
    /// that is neither 0 nor positive, a `top_p` outside `(0, 1]`, and (when sampling) a
    /// NaN or infinite logit among the candidates.
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
        if logits.is_empty() {
            return Err(Error::InvalidArgument {
                op: "generate",
                reason: "cannot pick a token from an empty row of logits".into(),
            });
        }
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
        if let Some(p) = opts.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(Error::InvalidArgument {
                op: "generate",
                reason: format!("top_p must be in (0, 1], got {p}"),
            });
        }
        // Candidates: every token, or the `top_k` largest logits (ties to the lower index).
        // Selection, not a sort: a sort of a 50k vocabulary costs more per token than a
        // decoding step on a GPU.
        let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let k = opts.top_k.map_or(order.len(), |k| k.clamp(1, order.len()));
        if k < order.len() {
            order.select_nth_unstable_by(k - 1, by_logit);
            order.truncate(k);
        }
        let top = order
            .iter()
            .map(|&i| logits[i])
            .fold(f32::NEG_INFINITY, f32::max);
        if !top.is_finite() || order.iter().any(|&i| logits[i].is_nan()) {
            return Err(Error::InvalidArgument {
                op: "generate",
                reason: format!(
                    "cannot sample from {} logits whose largest is {top}: they must be finite (a NaN or infinite logit usually means the model overflowed)",
                    logits.len()
                ),
            });
        }
        // Softmax weights relative to the largest (which weighs 1), in f32 as PyTorch's,
        // by token.
        let inv_t = (1.0 / opts.temperature) as f32;
        let mut weights = vec![0.0f32; logits.len()];
        for &i in &order {
            weights[i] = ((logits[i] - top) * inv_t).exp();
        }
        let weight = |i: usize| f64::from(weights[i]);
        let total: f64 = order.iter().map(|&i| weight(i)).sum();
        let kept = if let Some(p) = opts.top_p {
            let n = nucleus(&mut order, p * total, weight, by_logit);
            &order[..n]
        } else {
            if opts.top_k.is_some() {
                order.sort_unstable_by(by_logit);
            }
            &order[..]
        };
        let total: f64 = kept.iter().map(|&i| weight(i)).sum();
        let mut u = self.uniform() * total;
        for &i in kept {
            u -= weight(i);
            if u < 0.0 {
                return Ok(i as i64);
            }
        }
        Ok(*kept.last().expect("at least one candidate") as i64)
    }
}

/// How many of `order`'s tokens top-p sampling keeps: the fewest of the most likely (by
/// `by_logit`) whose weights sum to at least `need`, or all. Rearranges `order` so that
/// they come first, the last of them in order; a quickselect on the cumulative weight,
/// linear in the vocabulary where a sort would not be.
fn nucleus(
    order: &mut [usize],
    need: f64,
    weight: impl Fn(usize) -> f64,
    by_logit: impl Fn(&usize, &usize) -> std::cmp::Ordering + Copy,
) -> usize {
    // The kept tokens are a prefix by logit, so where the tokens weighing at least a floor
    // already sum to `need`, they lie among those: a peaked distribution's few.
    let mut hi = order.len();
    for floor in [1e-6, 1e-12] {
        let mut heavy = 0;
        let mut sum = 0.0;
        for j in 0..order.len() {
            let w = weight(order[j]);
            if w >= floor {
                sum += w;
                order.swap(heavy, j);
                heavy += 1;
            }
        }
        if sum >= need {
            hi = heavy;
            break;
        }
    }
    // The crossing lies in `lo..hi`; `before` sums the weights of `order[..lo]`.
    let (mut lo, mut before) = (0, 0.0);
    while hi - lo > 64 {
        let mid = lo + (hi - lo) / 2;
        order[lo..hi].select_nth_unstable_by(mid - lo, by_logit);
        let left: f64 = order[lo..mid].iter().map(|&i| weight(i)).sum();
        if before + left >= need {
            hi = mid;
        } else {
            before += left;
            lo = mid;
        }
    }
    order[lo..hi].sort_unstable_by(by_logit);
    for (j, &i) in order[lo..hi].iter().enumerate() {
        before += weight(i);
        if before >= need {
            return lo + j + 1;
        }
    }
    hi
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
    use super::{GenerateOptions, Sampler, nucleus};

    fn sampling(temperature: f64) -> GenerateOptions {
        GenerateOptions {
            temperature,
            ..GenerateOptions::greedy(1)
        }
    }

    /// `n` distinct logits in `0..scale`, in a scrambled order (7919 is prime, so
    /// `i · 7919 mod n` visits every residue once where `n` is not a multiple of it).
    fn logits(n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| (i * 7919 % n) as f32 / n as f32 * scale)
            .collect()
    }

    #[test]
    fn draws_follow_the_softmax_of_logits_over_temperature() {
        let logits = [1.0f32, 0.0, 2.0, -1.0, 0.5];
        let t = 0.7;
        let weights: Vec<f64> = logits.iter().map(|&l| (f64::from(l) / t).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut s = Sampler::new(11);
        let draws = 40_000;
        let mut counts = [0usize; 5];
        for _ in 0..draws {
            counts[s.sample(&logits, &sampling(t)).unwrap() as usize] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            let p = weights[i] / total;
            let sigma = (p * (1.0 - p) / draws as f64).sqrt();
            let got = c as f64 / draws as f64;
            assert!(
                (got - p).abs() < 4.0 * sigma,
                "token {i}: {got} drawn, {p} expected"
            );
        }
    }

    #[test]
    fn top_p_keeps_the_fewest_most_likely_tokens_reaching_p() {
        // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
        let logits = [0.5f32, 0.3, 0.15, 0.05].map(f32::ln);
        let opts = GenerateOptions {
            top_p: Some(0.75),
            ..sampling(1.0)
        };
        let mut s = Sampler::new(3);
        let mut counts = [0usize; 4];
        for _ in 0..8000 {
            counts[s.sample(&logits, &opts).unwrap() as usize] += 1;
        }
        assert_eq!(counts[2] + counts[3], 0, "{counts:?}");
        let share = counts[0] as f64 / 8000.0;
        assert!((share - 0.625).abs() < 0.03, "{counts:?}");
    }

    #[test]
    fn nucleus_matches_a_full_sort() {
        for (n, scale, p) in [
            (1000, 8.0f32, 0.9),
            (5000, 30.0, 0.5),
            (70, 1.0, 0.99),
            (3, 1.0, 0.2),
        ] {
            let logits = logits(n, scale);
            let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
            let weight = |i: usize| f64::from(logits[i]).exp();
            let total: f64 = (0..n).map(weight).sum();
            let mut sorted: Vec<usize> = (0..n).collect();
            sorted.sort_by(by_logit);
            let mut cum = 0.0;
            let want = sorted
                .iter()
                .position(|&i| {
                    cum += weight(i);
                    cum >= p * total
                })
                .map_or(n, |j| j + 1);
            let mut order: Vec<usize> = (0..n).collect();
            let got = nucleus(&mut order, p * total, weight, by_logit);
            assert!(
                got.abs_diff(want) <= 1,
                "n {n}: kept {got}, a sort keeps {want}"
            );
            let mut kept = order[..got].to_vec();
            kept.sort_by(by_logit);
            assert_eq!(
                kept,
                sorted[..got],
                "n {n}: the kept tokens are the most likely"
            );
        }
    }

    #[test]
    fn bad_logits_and_options_are_errors() {
        let mut s = Sampler::new(0);
        assert!(s.sample(&[], &sampling(1.0)).is_err());
        assert!(s.sample(&[], &GenerateOptions::greedy(1)).is_err());
        assert!(s.sample(&[0.0, f32::NAN], &sampling(1.0)).is_err());
        assert!(s.sample(&[0.0, f32::INFINITY], &sampling(1.0)).is_err());
        for p in [0.0, 1.5, f64::NAN] {
            let opts = GenerateOptions {
                top_p: Some(p),
                ..sampling(1.0)
            };
            assert!(s.sample(&[0.0, 1.0], &opts).is_err(), "top_p {p}");
        }
        assert!(s.sample(&[0.0, 1.0], &sampling(-1.0)).is_err());
    }

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
