//! Saving and loading a module's weights as `.safetensors` files, named by the module's
//! dotted paths as in PyTorch's `state_dict`, so weights move between the two.

use std::path::Path;

use tessel_tensor::{Result, save_safetensors};

use crate::module::Module;
use crate::weights::Weights;

/// Writes every parameter and buffer of `module` ([`Module::state`]) to a `.safetensors`
/// file at `path`, computing any that is not yet realized.
///
/// ```
/// use tessel_nn::{Module, Visitor};
/// use tessel_tensor::Tensor;
/// struct Affine { weight: Tensor, bias: Tensor }
/// impl Module for Affine {
///     fn visit(&self, v: &mut Visitor<'_>) {
///         v.param("weight", &self.weight);
///         v.param("bias", &self.bias);
///     }
/// }
/// # fn main() -> tessel_tensor::Result<()> {
/// let path = std::env::temp_dir().join(format!("tessel-nn-doc-{}.safetensors", std::process::id()));
/// let a = Affine { weight: Tensor::from_vec(vec![1.0f32, 2.0], [2])?, bias: Tensor::scalar(0.5f32) };
/// tessel_nn::save(&a, &path)?;
/// let b = Affine { weight: Tensor::from_vec(vec![0.0f32, 0.0], [2])?, bias: Tensor::scalar(0.0f32) };
/// tessel_nn::load(&b, &path)?;
/// assert_eq!(b.weight.to_vec::<f32>()?, vec![1.0, 2.0]);
/// # std::fs::remove_file(&path).ok();
/// # Ok(())
/// # }
/// ```
pub fn save(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    save_safetensors(path, &module.state())
}

/// Loads weights into `module`'s parameters and buffers, in place (every handle to them,
/// an optimizer's included, sees the loaded values): `path` is a `.safetensors` file, a
/// sharded checkpoint's index, or a model directory ([`Weights::open`]).
///
/// The weights must hold exactly the module's names, each with the module tensor's shape;
/// float values are cast to the module's dtype, as PyTorch's `load_state_dict` does.
/// Otherwise nothing is changed and the error lists every missing and unexpected name and
/// every mismatch. For a non-strict load, a prefix or a device, use
/// `Weights::open(path)?.strict(false).pp("prefix").load_into(&module)`.
pub fn load(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    Weights::open(path)?.load_into(module).map(|_| ())
}
