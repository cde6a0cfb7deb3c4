//! Saving and loading a module's weights as `.safetensors` files, named by the module's
//! dotted paths as in PyTorch's `state_dict`, so weights move between the two.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use tessel_tensor::{Device, Error, Result, load_safetensors, save_safetensors};

use crate::module::Module;

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

/// Loads a `.safetensors` file into `module`'s parameters and buffers, in place: every
/// handle to them (an optimizer's included) sees the loaded values.
///
/// The file must hold exactly the module's names, each with the module tensor's shape and
/// dtype; otherwise nothing is changed and the error lists every missing and unexpected
/// name and every mismatch.
pub fn load(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    const OP: &str = "load";
    let path = path.as_ref();
    let state = module.state();
    let loaded: HashMap<String, _> = load_safetensors(path, &Device::cpu())?
        .into_iter()
        .collect();
    let expected: HashSet<&str> = state.iter().map(|(n, _)| n.as_str()).collect();

    let mut problems = Vec::new();
    let missing: Vec<&str> = state
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !loaded.contains_key(*n))
        .collect();
    if !missing.is_empty() {
        problems.push(format!("missing from the file: {}", missing.join(", ")));
    }
    let mut unexpected: Vec<&str> = loaded
        .keys()
        .map(String::as_str)
        .filter(|n| !expected.contains(n))
        .collect();
    unexpected.sort_unstable();
    if !unexpected.is_empty() {
        problems.push(format!(
            "in the file but not in the module: {}",
            unexpected.join(", ")
        ));
    }
    for (name, target) in &state {
        if let Some(value) = loaded.get(name)
            && (value.shape() != target.shape() || value.dtype() != target.dtype())
        {
            problems.push(format!(
                "`{name}` is {} {} in the file but {} {} in the module",
                value.shape(),
                value.dtype(),
                target.shape(),
                target.dtype()
            ));
        }
    }
    if !problems.is_empty() {
        return Err(Error::InvalidArgument {
            op: OP,
            reason: format!(
                "{} does not match the module: {}",
                path.display(),
                problems.join("; ")
            ),
        });
    }

    // Move everything first, so a failing device leaves the module unchanged.
    let mut values = Vec::with_capacity(state.len());
    for (name, target) in &state {
        values.push(loaded[name].to(&target.device())?);
    }
    for ((_, target), value) in state.iter().zip(&values) {
        target.assign(value)?;
    }
    Ok(())
}
