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

/// A callback that sees each sub-module.
type ModuleHook<'a> = &'a mut dyn FnMut(&dyn Module);

/// Walks a module's named tensors; names are dotted paths (`"layers.0.weight"`), as in
/// PyTorch's `state_dict`.
pub struct Visitor<'a> {
    prefix: String,
    f: &'a mut dyn FnMut(&str, ParamKind, &Tensor),
    /// Called with every sub-module before it is visited ([`Module::train`] uses it).
    on_module: Option<ModuleHook<'a>>,
}

impl<'a> Visitor<'a> {
    /// A visitor calling `f` with each full name, kind and tensor.
    pub fn new(f: &'a mut dyn FnMut(&str, ParamKind, &Tensor)) -> Self {
        Visitor {
            prefix: String::new(),
            f,
            on_module: None,
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

    pub(crate) fn tensor(&mut self, name: &str, kind: ParamKind, tensor: &Tensor) {
        let full = format!("{}{name}", self.prefix);
        (self.f)(&full, kind, tensor);
    }

    /// Visits a sub-module whose tensors get `name.` prefixed.
    pub fn module(&mut self, name: &str, module: &dyn Module) {
        let len = self.prefix.len();
        self.prefix.push_str(name);
        self.prefix.push('.');
        if let Some(on_module) = self.on_module.as_mut() {
            on_module(module);
        }
        module.visit(self);
        self.prefix.truncate(len);
    }
}

/// A field of a module that [`derive(Module)`](macro@crate::Module) visits: a tensor, a
/// module, or an `Option` or `Vec` of those (`Vec` elements are named `name.0`, `name.1`,
/// ... as in PyTorch's `ModuleList`).
pub trait VisitField {
    /// Reports this field to `v` under `name`; `kind` applies to tensors.
    fn visit_field(&self, name: &str, kind: ParamKind, v: &mut Visitor<'_>);
}

impl VisitField for Tensor {
    fn visit_field(&self, name: &str, kind: ParamKind, v: &mut Visitor<'_>) {
        v.tensor(name, kind, self);
    }
}

impl<M: Module> VisitField for M {
    fn visit_field(&self, name: &str, _: ParamKind, v: &mut Visitor<'_>) {
        v.module(name, self);
    }
}

impl<T: VisitField> VisitField for Option<T> {
    fn visit_field(&self, name: &str, kind: ParamKind, v: &mut Visitor<'_>) {
        if let Some(x) = self {
            x.visit_field(name, kind, v);
        }
    }
}

impl<T: VisitField> VisitField for Vec<T> {
    fn visit_field(&self, name: &str, kind: ParamKind, v: &mut Visitor<'_>) {
        for (i, x) in self.iter().enumerate() {
            x.visit_field(&format!("{name}.{i}"), kind, v);
        }
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
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
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

    /// The buffers (untrained state such as `BatchNorm`'s running statistics) with their
    /// dotted names, in visiting order.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit(&mut Visitor::new(&mut |name, kind, t| {
            if kind == ParamKind::Buffer {
                out.push((name.to_string(), t.clone()));
            }
        }));
        out
    }

    /// The buffers, in visiting order. Buffers a training forward updates (`BatchNorm`'s
    /// running statistics) are realized by the next optimizer step by themselves.
    fn buffers(&self) -> Vec<Tensor> {
        self.named_buffers().into_iter().map(|(_, t)| t).collect()
    }

    /// Parameters and buffers with their dotted names: what a weight file holds.
    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit(&mut Visitor::new(&mut |name, _, t| {
            out.push((name.to_string(), t.clone()));
        }));
        out
    }

    /// Switches this module alone between training (`true`) and evaluation behaviour.
    ///
    /// Only layers that behave differently in training override it (`Dropout`,
    /// `BatchNorm`, holding the flag in an `AtomicBool` so they stay `Send + Sync`); the
    /// default does nothing. Call [`Module::train`] instead, which reaches sub-modules.
    fn set_training_local(&self, training: bool) {
        let _ = training;
    }

    /// Puts this module and every sub-module it visits into training (`true`) or
    /// evaluation (`false`) mode, like PyTorch's `module.train(mode)`. Layers start in
    /// training mode. The switch walks [`Module::visit`], so a custom module that visits
    /// its sub-modules with [`Visitor::module`] needs nothing more.
    fn train(&self, training: bool) {
        self.set_training_local(training);
        let mut on_module = |m: &dyn Module| m.set_training_local(training);
        let mut ignore = |_: &str, _: ParamKind, _: &Tensor| {};
        let mut visitor = Visitor::new(&mut ignore);
        visitor.on_module = Some(&mut on_module);
        self.visit(&mut visitor);
    }

    /// Evaluation mode: `train(false)` (PyTorch's `module.eval()`).
    fn eval(&self) {
        self.train(false);
    }
}
