//! `Embedding`: a lookup table of learned vectors.

use tessel_tensor::{Result, Tensor};

use super::{impl_forward, invalid};
use crate::init::{ParamOptions, normal};
use crate::{Module, Visitor};

/// A table of `num_embeddings` vectors of size `embedding_dim` (`torch.nn.Embedding`),
/// drawn from `N(0, 1)` as in PyTorch.
///
/// Indices are `i32` or `i64`; one outside `0..num_embeddings` cannot be checked without
/// reading the (lazy) indices, so it reads a row of zeros instead of raising.
///
/// ```
/// # use tessel_nn::Embedding;
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let emb = Embedding::new(10, 4)?;
/// let y = emb.forward(&Tensor::from_vec(vec![1i64, 7, 7], [3])?)?;
/// assert_eq!(y.dims(), vec![3, 4]);
/// # Ok(())
/// # }
/// ```
pub struct Embedding {
    weight: Tensor,
}

impl Embedding {
    /// A table of `f32` vectors on the default device.
    pub fn new(num_embeddings: usize, embedding_dim: usize) -> Result<Embedding> {
        Embedding::with_options(num_embeddings, embedding_dim, &ParamOptions::default())
    }

    /// A table with parameters of `opts`' dtype and device.
    pub fn with_options(
        num_embeddings: usize,
        embedding_dim: usize,
        opts: &ParamOptions,
    ) -> Result<Embedding> {
        if num_embeddings == 0 || embedding_dim == 0 {
            return Err(invalid(
                "Embedding::new",
                format!(
                    "num_embeddings and embedding_dim must be positive, got {num_embeddings} and {embedding_dim}"
                ),
            ));
        }
        let weight = normal(&[num_embeddings, embedding_dim], 0.0, 1.0, opts)?;
        Ok(Embedding { weight })
    }

    /// A table holding `weight` (`Embedding.from_pretrained`), `[num_embeddings, dim]`.
    pub fn from_pretrained(weight: Tensor) -> Result<Embedding> {
        if weight.ndim() != 2 || !weight.dtype().is_float() {
            return Err(invalid(
                "Embedding::from_pretrained",
                format!(
                    "weight must be a 2-d float tensor [num_embeddings, embedding_dim], got {} {}",
                    weight.shape(),
                    weight.dtype()
                ),
            ));
        }
        Ok(Embedding { weight })
    }

    /// The table, `[num_embeddings, embedding_dim]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The rows at `indices` (`i32` or `i64`, any shape), giving `[..., embedding_dim]`.
    pub fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        if !matches!(
            indices.dtype(),
            tessel_tensor::DType::I32 | tessel_tensor::DType::I64
        ) {
            return Err(invalid(
                "Embedding",
                format!(
                    "indices must be i32 or i64, got {} {}; cast with .cast(DType::I64)",
                    indices.shape(),
                    indices.dtype()
                ),
            ));
        }
        Tensor::embedding(&self.weight, indices)
    }
}

impl Module for Embedding {
    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("weight", &self.weight);
    }
}

impl_forward!(Embedding);
