//! [`Module`]: parameters enumerated by name.

use tessel_tensor::Tensor;

/// What a named tensor of a module is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// Trained by optimizers and saved in weight files.
    Parameter,
    /// State that is saved but not trained (`BatchNorm`'s running statistics).
    Buffer,
}

/// Walks a module's named tensors; names are dotted paths (`"layers.0.weight"`), as in
/// PyTorch's `state_dict`.
pub struct Visitor<'a> {
    prefix: String,
    f: &'a mut dyn FnMut(&str, ParamKind, &Tensor),
}

impl<'a> Visitor<'a> {
    /// A visitor calling `f` with each full name, kind and tensor.
    pub fn new(f: &'a mut dyn FnMut(&str, ParamKind, &Tensor)) -> Self {
        Visitor {
            prefix: String::new(),
            f,
        }
    }

    /// Reports a trained parameter.
    pub fn param(&mut self, name: &str, tensor: &Tensor) {
        self.tensor(name, ParamKind::Parameter, tensor);
    }

    /// Reports a saved, untrained buffer.
    pub fn buffer(&mut self, name: &str, tensor: &Tensor) {
        self.tensor(name, ParamKind::Buffer, tensor);
    }

    fn tensor(&mut self, name: &str, kind: ParamKind, tensor: &Tensor) {
        let full = format!("{}{name}", self.prefix);
        (self.f)(&full, kind, tensor);
    }

    /// Visits a sub-module whose tensors get `name.` prefixed.
    pub fn module(&mut self, name: &str, module: &dyn Module) {
        let len = self.prefix.len();
        self.prefix.push_str(name);
        self.prefix.push('.');
        module.visit(self);
        self.prefix.truncate(len);
    }
}

/// A model or layer: something holding named tensors.
///
/// Implement [`Module::visit`] by reporting each parameter and sub-module; everything else
/// (`parameters`, `named_parameters`, `state`) follows.
///
/// ```
/// use tessel_nn::{Module, Visitor};
/// use tessel_tensor::Tensor;
///
/// struct Affine { weight: Tensor, bias: Tensor }
/// impl Module for Affine {
///     fn visit(&self, v: &mut Visitor<'_>) {
///         v.param("weight", &self.weight);
///         v.param("bias", &self.bias);
///     }
/// }
/// # fn main() -> tessel_tensor::Result<()> {
/// let m = Affine { weight: Tensor::ones([2, 2], tessel_tensor::DType::F32), bias: Tensor::zeros([2], tessel_tensor::DType::F32) };
/// let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["weight", "bias"]);
/// # Ok(())
/// # }
/// ```
pub trait Module {
    /// Reports every parameter, buffer and sub-module to `v`, in a fixed order.
    fn visit(&self, v: &mut Visitor<'_>);

    /// The trained parameters, in visiting order. The tensors are handles to the module's
    /// own: [`Tensor::assign`] on one updates the module.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// The trained parameters with their dotted names.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit(&mut Visitor::new(&mut |name, kind, t| {
            if kind == ParamKind::Parameter {
                out.push((name.to_string(), t.clone()));
            }
        }));
        out
    }

    /// Parameters and buffers with their dotted names: what a weight file holds.
    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit(&mut Visitor::new(&mut |name, _, t| {
            out.push((name.to_string(), t.clone()));
        }));
        out
    }
}
