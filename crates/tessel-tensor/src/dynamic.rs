//! Dynamic dims: a shape axis named by a variable ([`Var`]) instead of a number, so that
//! one recorded graph, one plan and one set of compiled kernels serve every value of it.
//!
//! [`Tensor::mark_dynamic`] names an axis of a tensor's data. The graph then records the
//! variable in every shape computed from it; the plan is cached under that symbolic
//! structure, and its kernels take the variable as a launch parameter. Each tensor carries
//! the values of the variables its shape (or any input it was computed from) names, as
//! [`DimValues`]; a realize binds them at launch, so running the same model with another
//! batch size or sequence length replays the cached plan and compiles nothing.

use std::sync::Arc;

use tessel_shape::{Bindings, Dim, Shape, Var};

use crate::tensor::Tensor;
use tessel_runtime::runtime;
use tessel_runtime::{Error, Result};

/// The values of the dynamic dims that a tensor's shape, or any input it was computed
/// from, names. Empty (and free to clone) for tensors of concrete shape.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DimValues(Option<Arc<Vec<(Var, i64)>>>);

impl DimValues {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    fn entries(&self) -> &[(Var, i64)] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }

    pub(crate) fn get(&self, var: Var) -> Option<i64> {
        self.entries()
            .iter()
            .find(|(v, _)| *v == var)
            .map(|&(_, value)| value)
    }

    /// Both sets of values; `Err` naming `op` when they give one variable two values.
    pub(crate) fn merge(&self, other: &DimValues, op: &'static str) -> Result<DimValues> {
        if other.is_empty() || self == other {
            return Ok(self.clone());
        }
        if self.is_empty() {
            return Ok(other.clone());
        }
        let mut out = self.clone();
        for &(var, value) in other.entries() {
            out = out.with(var, value, op)?;
        }
        Ok(out)
    }

    /// Both sets of values, keeping this one's where they disagree.
    pub(crate) fn merge_keeping(&self, other: &DimValues) -> DimValues {
        if other.is_empty() || self == other {
            return self.clone();
        }
        if self.is_empty() {
            return other.clone();
        }
        let mut entries = self.entries().to_vec();
        for &(var, value) in other.entries() {
            if self.get(var).is_none() {
                entries.push((var, value));
            }
        }
        DimValues(Some(Arc::new(entries)))
    }

    /// These values and `var = value`.
    pub(crate) fn with(&self, var: Var, value: i64, op: &'static str) -> Result<DimValues> {
        match self.get(var) {
            Some(v) if v == value => Ok(self.clone()),
            Some(v) => Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "the dynamic dim `{}` is {v} in one operand and {value} in another; \
                     tensors combined in one op must agree on every dynamic dim",
                    var.name()
                ),
            }),
            None => {
                let mut entries = self.entries().to_vec();
                entries.push((var, value));
                Ok(DimValues(Some(Arc::new(entries))))
            }
        }
    }

    /// These values less `var`'s.
    fn without(&self, var: Var) -> DimValues {
        let entries: Vec<(Var, i64)> = self
            .entries()
            .iter()
            .copied()
            .filter(|&(v, _)| v != var)
            .collect();
        if entries.is_empty() {
            DimValues::default()
        } else {
            DimValues(Some(Arc::new(entries)))
        }
    }

    pub(crate) fn bindings(&self) -> Bindings {
        self.entries().iter().copied().collect()
    }

    /// `shape` with every dim evaluated, or `None` if it names a variable without a value.
    pub(crate) fn eval(&self, shape: &Shape) -> Option<Vec<usize>> {
        if let Some(dims) = shape.as_usizes() {
            return Some(dims);
        }
        let bindings = self.bindings();
        shape
            .iter()
            .map(|d| d.eval(&bindings).ok().and_then(|v| usize::try_from(v).ok()))
            .collect()
    }
}

impl Tensor {
    /// This tensor's data with axis `axis` named by the dynamic dim `var`, like
    /// `torch._dynamo.mark_dynamic`: everything computed from the result records `var`
    /// instead of the size, so the plan and the kernels compiled for it serve every value
    /// of `var` within its bounds. Mark the inputs of a model whose batch size or
    /// sequence length changes from call to call; the first call compiles, the others
    /// replay.
    ///
    /// Tensors combined in one op must agree on the value of each variable. Shapes you pass
    /// to ops must then be consistent with `var` (reshape the dynamic axis with `-1`);
    /// [`Tensor::dims`] still returns numbers. Ops that need a concrete size on a dynamic
    /// axis (convolutions, pooling, sorting along it, ...) return an error saying so.
    ///
    /// `var`'s lower bound must be at least 1 (an error otherwise: sizes divide index
    /// arithmetic).
    ///
    /// An axis that is already a dynamic expression (`past + 1`, the length of a KV cache
    /// after a `cat`) is renamed `var` with its value: decoding re-marks its cache each step
    /// so the next step records the same graph as the last.
    ///
    /// The data is realized, and shared with `self` (host data) or copied once on its
    /// device.
    ///
    /// ```
    /// use tessel_tensor::{Tensor, Var};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let batch = Var::new("batch", 1, 1024)?;
    /// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3, 1])?;
    /// for n in [2, 5] {
    ///     let x = Tensor::ones([n, 3], tessel_tensor::DType::F32).mark_dynamic(0, batch)?;
    ///     let y = x.matmul(&w)?;
    ///     assert_eq!(y.dims(), vec![n, 1]);
    ///     let report = y.realize()?;
    ///     assert!(n == 2 || report.kernels_prepared() == 0, "the second size compiles nothing");
    ///     assert_eq!(y.to_vec::<f32>()?, vec![6.0; n]);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn mark_dynamic(&self, axis: usize, var: Var) -> Result<Tensor> {
        const OP: &str = "mark_dynamic";
        let Some(&dim) = self.shape().dims().get(axis) else {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "axis {axis} is out of range for shape {} ({} dims)",
                    self.shape(),
                    self.ndim()
                ),
            });
        };
        // A symbolic axis (a KV cache's `past + 1` after a `cat`) is renamed by its value.
        let value = match dim.as_const() {
            Some(value) => value,
            None if dim.as_var() == Some(var) => {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "axis {axis} of shape {} is already the dynamic dim `{dim}`",
                        self.shape()
                    ),
                });
            }
            None => {
                dim.eval(&self.dim_values().bindings())
                    .map_err(|e| Error::InvalidArgument {
                        op: OP,
                        reason: format!("axis {axis} of shape {}: {e}", self.shape()),
                    })?
            }
        };
        let others_name_var = self
            .shape()
            .dims()
            .iter()
            .enumerate()
            .any(|(i, d)| i != axis && d.vars().contains(&var));
        if others_name_var {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "another axis of shape {} names `{}`; mark one axis per variable",
                    self.shape(),
                    var.name()
                ),
            });
        }
        let bounds = var.bounds();
        if bounds.lo < 1 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "`{}` may be {} (its bounds are {}..={}), but a dynamic size must be at \
                     least 1: index arithmetic divides by it. Declare it as \
                     Var::new(\"{}\", 1, {})",
                    var.name(),
                    bounds.lo,
                    bounds.lo,
                    bounds.hi,
                    var.name(),
                    bounds.hi.max(1)
                ),
            });
        }
        if !bounds.contains(value) {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "axis {axis} of shape {} has size {value}, outside the bounds {}..={} of `{}`; \
                     declare the variable with wider bounds",
                    self.shape(),
                    bounds.lo,
                    bounds.hi,
                    var.name()
                ),
            });
        }
        let values = self.dim_values().without(var).with(var, value, OP)?;
        let mut dims = self.shape().dims().to_vec();
        dims[axis] = Dim::from(var);
        let shape = Shape::new(dims);
        self.realize()?;
        let node = runtime().relabel_leaf(self.node(), shape.clone())?;
        Ok(Tensor::from_node_with(
            node,
            shape,
            self.dtype(),
            self.device(),
            values,
        ))
    }
}
