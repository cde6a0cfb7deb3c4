//! [`KvCache`]: the keys and values of every past token, per layer, whose length is a
//! dynamic dim, so that each decoding step records the same graph and replays one plan.

use tessel_tensor::{DType, Device, Error, Result, Tensor, Var};

/// Keys and values of the tokens seen so far, per layer, and which of them are real tokens
/// (left padding of a batch is not).
///
/// The cached length is the dynamic dim `past`: after each step [`KvCache::commit`] renames
/// the grown length (`past + 1`) back to `past` with its new value, so step after step
/// records the same graph, and decoding compiles nothing after its first token.
pub struct KvCache {
    past: Var,
    layers: Vec<Option<(Tensor, Tensor)>>,
    pending: Vec<Option<(Tensor, Tensor)>>,
    /// Per row, whether each cached position is a real token.
    attended: Vec<Vec<bool>>,
    /// Per row, the same for the tokens of the step being recorded.
    new: Vec<Vec<bool>>,
    len: usize,
}

fn invalid(reason: String) -> Error {
    Error::InvalidArgument {
        op: "KvCache",
        reason,
    }
}

impl KvCache {
    /// An empty cache for `layers` layers holding up to `max_len` positions.
    pub fn new(layers: usize, max_len: usize) -> Result<KvCache> {
        Ok(KvCache {
            past: Var::new("past", 1, max_len.max(1) as i64)?,
            layers: vec![None; layers],
            pending: vec![None; layers],
            attended: Vec::new(),
            new: Vec::new(),
            len: 0,
        })
    }

    /// The number of cached positions (padding included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Starts a step over tokens of which `mask[row][i]` says which are real (`false`: left
    /// padding). Every row has the same length, `T`; after the first step `T` must be 1.
    pub fn begin(&mut self, mask: Vec<Vec<bool>>) -> Result<()> {
        let t = mask.first().map_or(0, Vec::len);
        if t == 0 || mask.iter().any(|r| r.len() != t) {
            return Err(invalid(format!(
                "a step needs at least one token and rows of one length, got lengths {:?}",
                mask.iter().map(Vec::len).collect::<Vec<_>>()
            )));
        }
        if self.len > 0 && (t != 1 || mask.len() != self.attended.len()) {
            return Err(invalid(format!(
                "after the prompt, steps add one token per row to the same {} rows; got {} rows of {t}",
                self.attended.len(),
                mask.len()
            )));
        }
        if self.len + t > self.past.bounds().hi as usize {
            return Err(invalid(format!(
                "{} cached positions plus {t} exceed the model's {} positions",
                self.len,
                self.past.bounds().hi
            )));
        }
        self.new = mask;
        Ok(())
    }

    /// The batch size of the step.
    pub fn batch(&self) -> usize {
        self.new.len()
    }

    /// The tokens of the step per row.
    pub fn step_len(&self) -> usize {
        self.new.first().map_or(0, Vec::len)
    }

    /// The position of each token of the step, `[batch * step_len]` row-major: the number
    /// of real tokens before it in its row (padding gets 1), as `transformers` derives
    /// `position_ids` from the attention mask.
    pub fn positions(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.batch() * self.step_len());
        for (row, new) in self.new.iter().enumerate() {
            let mut seen = self
                .attended
                .get(row)
                .map_or(0, |r| r.iter().filter(|&&a| a).count() as i64);
            for &real in new {
                seen += i64::from(real);
                out.push(if real { seen - 1 } else { 1 });
            }
        }
        out
    }

    /// [`KvCache::positions`] as an `i64` tensor `[batch, step_len]` on `device`. A first step
    /// without padding counts `0..step_len` in every row: an `arange`, computed on the device
    /// where it is used, so nothing is built on the host or uploaded for it.
    pub fn position_ids(&self, device: &Device) -> Result<Tensor> {
        let (b, t) = (self.batch() as i64, self.step_len() as i64);
        if self.len == 0 && self.new.iter().all(|row| row.iter().all(|&real| real)) {
            return Tensor::arange(0i64, t, 1i64)?
                .reshape(&[1, t])?
                .expand(&[b, t])?
                .to(device);
        }
        Tensor::from_vec(self.positions(), [b as usize, t as usize])?.to(device)
    }

    /// Whether this step's attention must hide later tokens of the step from earlier ones
    /// by itself (`is_causal`): a first step of several tokens, none of them padding, for
    /// which [`KvCache::attention_mask`] gives no mask.
    pub fn causal(&self) -> bool {
        self.len == 0
            && self.step_len() > 1
            && self.new.iter().all(|row| row.iter().all(|&real| real))
    }

    /// The additive mask of the step's attention, `[batch, 1, step_len, past + step_len]`
    /// in `dtype` (0 where a query sees a key, the dtype's lowest value where causality or
    /// padding hides it, as `transformers` builds it), or `None` when nothing is hidden
    /// or, on a first step without padding, causality alone hides keys: the attention
    /// applies that itself where [`KvCache::causal`] says so.
    pub fn attention_mask(&self, dtype: DType, device: &Device) -> Result<Option<Tensor>> {
        let (b, t, past) = (self.batch(), self.step_len(), self.len);
        let lowest = dtype.min_value().to_f64();
        if past == 0 {
            // Every token real: the causal part alone, which the attention computes on the
            // device from positions ([`KvCache::causal`]); no `[b, t, t]` mask is built
            // on the host and uploaded for every call.
            if self.new.iter().all(|row| row.iter().all(|&real| real)) {
                return Ok(None);
            }
            let mut hidden = Vec::with_capacity(b * t * t);
            for row in &self.new {
                for i in 0..t {
                    for (j, &real) in row.iter().enumerate() {
                        hidden.push(f32::from(u8::from(j > i || !real)));
                    }
                }
            }
            if hidden.iter().all(|&h| h == 0.0) {
                return Ok(None);
            }
            let hidden = Tensor::from_vec(hidden, [b, 1, t, t])?.to(device)?;
            return Ok(Some((&hidden.cast(dtype) * lowest)?));
        }
        if self.attended.iter().all(|r| r.iter().all(|&a| a)) {
            return Ok(None);
        }
        let hidden: Vec<f32> = self
            .attended
            .iter()
            .flat_map(|r| r.iter().map(|&a| f32::from(u8::from(!a))))
            .collect();
        let hidden = Tensor::from_vec(hidden, [b, 1, 1, past])?
            .to(device)?
            .mark_dynamic(3, self.past)?;
        let hidden = Tensor::cat(
            &[
                &hidden,
                &Tensor::zeros([b, 1, 1, 1], DType::F32).to(device)?,
            ],
            3,
        )?;
        Ok(Some((&hidden.cast(dtype) * lowest)?))
    }

    /// Layer `layer`'s keys and values over every position: the cached ones followed by
    /// this step's `k` and `v` (`[batch, heads, step_len, head_dim]`), concatenated along
    /// the length.
    pub fn append(&mut self, layer: usize, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let Some(slot) = self.layers.get(layer) else {
            return Err(invalid(format!(
                "layer {layer} of a cache for {} layers",
                self.layers.len()
            )));
        };
        let (k, v) = match slot {
            None => (k, v),
            Some((pk, pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
        };
        self.pending[layer] = Some((k.clone(), v.clone()));
        Ok((k, v))
    }

    /// The keys and values this step computed, to realize together with its output.
    pub fn pending(&self) -> Vec<&Tensor> {
        self.pending
            .iter()
            .flatten()
            .flat_map(|(k, v)| [k, v])
            .collect()
    }

    /// Ends the step: its keys and values become the cache, their length the new value of
    /// the dynamic dim.
    pub fn commit(&mut self) -> Result<()> {
        Tensor::realize_all(&self.pending())?;
        for (slot, pending) in self.layers.iter_mut().zip(&mut self.pending) {
            if let Some((k, v)) = pending.take() {
                *slot = Some((k.mark_dynamic(2, self.past)?, v.mark_dynamic(2, self.past)?));
            }
        }
        let new = std::mem::take(&mut self.new);
        if self.attended.is_empty() {
            self.attended = new;
        } else {
            for (row, n) in self.attended.iter_mut().zip(new) {
                row.extend(n);
            }
        }
        self.len = self.attended.first().map_or(0, Vec::len);
        Ok(())
    }
}
