//! A transformer block with a dynamic batch size and sequence length: five shapes, one
//! compilation, and the same values as the block run on static shapes.

mod common;

use common::Rng;
use tessel_nn::{AttentionMasks, LayerNorm, Linear, MultiheadAttention};
use tessel_tensor::{DType, Result, Tensor, Var};

struct Block {
    norm1: LayerNorm,
    attn: MultiheadAttention,
    norm2: LayerNorm,
    up: Linear,
    down: Linear,
}

impl Block {
    fn new(width: usize, heads: usize) -> Result<Block> {
        Tensor::manual_seed(11);
        Ok(Block {
            norm1: LayerNorm::new(&[width])?,
            attn: MultiheadAttention::new(width, heads)?.batch_first(true),
            norm2: LayerNorm::new(&[width])?,
            up: Linear::new(width, 4 * width)?,
            down: Linear::new(4 * width, width)?,
        })
    }

    /// Pre-norm: `x + attn(norm(x))`, then `x + mlp(norm(x))`, causal.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.norm1.forward(x)?;
        let causal = AttentionMasks {
            is_causal: true,
            ..AttentionMasks::default()
        };
        let x = (x + &self.attn.forward(&h, &h, &h, &causal)?)?;
        let h = self.norm2.forward(&x)?;
        &x + &self.down.forward(&self.up.forward(&h)?.gelu())?
    }
}

#[test]
fn a_transformer_block_over_five_shapes_compiles_once() -> Result<()> {
    let (batch, seq) = (Var::new("batch", 1, 64)?, Var::new("seq", 1, 256)?);
    let width = 16;
    let block = Block::new(width, 4)?;
    let mut rng = Rng(5);
    for (i, (n, t)) in [(2, 9), (1, 1), (3, 33), (4, 17), (2, 64)]
        .into_iter()
        .enumerate()
    {
        let data: Vec<f32> = rng
            .vec(n * t * width)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        let x = Tensor::from_vec(data, [n, t, width])?;
        let dynamic = x.mark_dynamic(0, batch)?.mark_dynamic(1, seq)?;
        let got = block.forward(&dynamic)?;
        assert_eq!(got.shape().to_string(), "[batch, seq, 16]");
        let report = got.realize()?;
        if i > 0 {
            assert_eq!(report.kernels_prepared(), 0, "[{n}, {t}] compiled kernels");
        }
        let want = block.forward(&x)?.to_vec::<f32>()?;
        let got = got.to_vec::<f32>()?;
        assert_eq!(got.len(), want.len());
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "[{n}, {t}] element {k}: {g} vs static {w}"
            );
        }
    }
    Ok(())
}

#[test]
fn dynamic_and_static_inputs_do_not_mix() {
    let batch = Var::new("batch", 1, 64).unwrap();
    let a = Tensor::ones([3, 4], DType::F32)
        .mark_dynamic(0, batch)
        .unwrap();
    let b = Tensor::ones([3, 4], DType::F32);
    let err = (&a + &b).unwrap_err().to_string();
    assert!(err.contains("batch") && err.contains('3'), "{err}");
}
