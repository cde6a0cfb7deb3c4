//! `Sequential`: layers applied one after another.

use tessel_tensor::{Result, Tensor};

use super::Forward;
use crate::{Module, Visitor};

/// Layers applied in order (`torch.nn.Sequential`). Their tensors are named by position,
/// `"0.weight"`, `"2.bias"`, ..., as in PyTorch's `state_dict`, so weight files carry over;
/// a parameter-free layer (an activation) still takes its index.
///
/// [`Module::train`] on a `Sequential` reaches every layer in it.
///
/// ```
/// # use tessel_nn::{Linear, Module, ReLU, Sequential};
/// # use tessel_tensor::{DType, Tensor};
/// # fn main() -> tessel_tensor::Result<()> {
/// let mlp = Sequential::new()
///     .layer(Linear::new(4, 8)?)
///     .layer(ReLU)
///     .layer(Linear::new(8, 2)?);
/// let names: Vec<String> = mlp.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
/// assert_eq!(mlp.forward(&Tensor::ones([3, 4], DType::F32))?.dims(), vec![3, 2]);
/// # Ok(())
/// # }
/// ```
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Forward>>,
}

impl Sequential {
    /// An empty sequence; its `forward` returns the input.
    pub fn new() -> Sequential {
        Sequential { layers: Vec::new() }
    }

    /// The sequence with `layer` appended (builder style).
    #[must_use]
    pub fn layer(mut self, layer: impl Forward + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// Appends a boxed layer (`Sequential.append`).
    pub fn append(&mut self, layer: Box<dyn Forward>) {
        self.layers.push(layer);
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether the sequence has no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The layer at `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<&dyn Forward> {
        self.layers.get(index).map(AsRef::as_ref)
    }

    /// Every layer applied to `x` in turn.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for layer in &self.layers {
            y = layer.forward(&y)?;
        }
        Ok(y)
    }
}

impl Module for Sequential {
    fn visit(&self, v: &mut Visitor<'_>) {
        for (i, layer) in self.layers.iter().enumerate() {
            let module: &dyn Module = layer.as_ref();
            v.module(&i.to_string(), module);
        }
    }
}

impl Forward for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Sequential::forward(self, x)
    }
}
