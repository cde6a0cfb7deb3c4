//! [`Tensor`]: a cheap, lazy handle to a node of the graph.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tessel_graph::{Node, NodeId, Op};
use tessel_shape::{DType, Scalar, Shape};

use crate::dynamic::DimValues;
use crate::element::Element;
use tessel_runtime::Device;
use tessel_runtime::{Error, Result};
use tessel_runtime::{RealizeReport, runtime};

/// A lazy n-dimensional array.
///
/// A `Tensor` is a handle: cloning it is cheap and shares the value; dropping the last
/// handle frees whatever the value held. Ops record graph nodes and check shapes and
/// dtypes immediately (returning [`Error`] at the call that made the mistake); nothing runs
/// until data is read ([`Tensor::to_vec`], [`Tensor::item`], `Display`) or
/// [`Tensor::realize`] is called.
///
/// Conventions: methods that can fail on their arguments return [`Result`]; so do the
/// operators (`&a + &b` is a `Result<Tensor>`), which is why they compose with `?`.
///
/// ```
/// use tessel_tensor::{DType, Tensor};
/// # fn main() -> tessel_tensor::Result<()> {
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
/// let b = (&a * 2.0)?;
/// assert_eq!(b.to_vec::<f32>()?, vec![2.0, 4.0, 6.0, 8.0]);
/// assert_eq!(b.dtype(), DType::F32);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Tensor(Arc<Handle>);

pub(crate) struct Handle {
    /// The node the handle holds one count of; [`Tensor::assign`] swaps it.
    node: AtomicU32,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
    /// The values of the dynamic dims the shape or the inputs name.
    pub(crate) values: DimValues,
}

impl Drop for Handle {
    fn drop(&mut self) {
        runtime().release(NodeId(*self.node.get_mut()));
    }
}

// The graph lives behind the runtime's mutex and `Handle` holds only ids and metadata.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tensor>();
};

impl Tensor {
    /// Wraps a node the caller holds one count of.
    pub(crate) fn from_node(node: NodeId, shape: Shape, dtype: DType, device: Device) -> Tensor {
        Self::from_node_with(node, shape, dtype, device, DimValues::default())
    }

    /// [`Tensor::from_node`] for a node whose shape may name dynamic dims with `values`.
    pub(crate) fn from_node_with(
        node: NodeId,
        shape: Shape,
        dtype: DType,
        device: Device,
        values: DimValues,
    ) -> Tensor {
        Tensor(Arc::new(Handle {
            node: AtomicU32::new(node.0),
            shape,
            dtype,
            device,
            values,
        }))
    }

    /// Records an op producing `dtype` values of `shape` on this tensor's device; the
    /// result keeps this tensor's dynamic-dim values.
    pub(crate) fn record(&self, op: Op, dtype: DType, shape: Shape) -> Tensor {
        let node = runtime().add(Node {
            op,
            dtype,
            shape: shape.clone(),
        });
        Tensor::from_node_with(node, shape, dtype, self.device(), self.dim_values().clone())
    }

    /// [`Tensor::record`] for an op whose other operands are `others`: the result keeps
    /// every operand's dynamic-dim values. Public ops check first that the operands agree
    /// ([`DimValues::merge`]); should they not, the first value is kept here, and the
    /// realize rejects any input whose size contradicts it.
    pub(crate) fn record_with(
        &self,
        others: &[&Tensor],
        op: Op,
        dtype: DType,
        shape: Shape,
    ) -> Tensor {
        let mut values = self.dim_values().clone();
        for t in others {
            values = values.merge_keeping(t.dim_values());
        }
        let node = runtime().add(Node {
            op,
            dtype,
            shape: shape.clone(),
        });
        Tensor::from_node_with(node, shape, dtype, self.device(), values)
    }

    /// The values of the dynamic dims this tensor's shape or its inputs name.
    pub(crate) fn dim_values(&self) -> &DimValues {
        &self.0.values
    }

    pub(crate) fn record_on(device: Device, op: Op, dtype: DType, shape: Shape) -> Tensor {
        let node = runtime().add(Node {
            op,
            dtype,
            shape: shape.clone(),
        });
        Tensor::from_node(node, shape, dtype, device)
    }

    pub(crate) fn node(&self) -> NodeId {
        NodeId(self.0.node.load(Ordering::Acquire))
    }

    /// Whether `self` and `other` are the same tensor: clones of one handle, which
    /// [`Tensor::assign`] updates together (Python's `a is b`), not merely equal values.
    pub fn is_same(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether every tensor of `tensors` holds computed data (a leaf) rather than recorded
    /// ops (one lock for all: a compiled step asks this of every parameter on every call).
    pub(crate) fn all_realized(tensors: &[&Tensor]) -> bool {
        let st = runtime().lock();
        (tensors.iter()).all(|t| matches!(st.graph.node(t.node()).op, tessel_graph::Op::Leaf(_)))
    }

    /// Makes this tensor — and every clone of it — hold `value` from now on, like
    /// PyTorch's in-place `copy_` on a parameter. Work recorded earlier from this tensor
    /// keeps the value it had then (the old value stays alive as long as such work does),
    /// so an optimizer step cannot change a loss computed before it.
    ///
    /// `value` must have this tensor's shape, dtype and device. Nothing is computed: an
    /// optimizer realizes its updates first, so each step runs one cached plan and the
    /// parameter afterwards is a realized buffer, not a growing expression.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let w = Tensor::from_vec(vec![1.0f32, 2.0], [2])?;
    /// let view = w.clone();
    /// let before = (&w * 10.0)?;
    /// w.assign(&(&w + 1.0)?)?;
    /// assert_eq!(view.to_vec::<f32>()?, vec![2.0, 3.0]);
    /// assert_eq!(before.to_vec::<f32>()?, vec![10.0, 20.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn assign(&self, value: &Tensor) -> Result<()> {
        if value.shape() != self.shape() || value.dtype() != self.dtype() {
            return Err(Error::InvalidArgument {
                op: "assign",
                reason: format!(
                    "the value is {} {} but the tensor is {} {}; cast or reshape the value first",
                    value.shape(),
                    value.dtype(),
                    self.shape(),
                    self.dtype()
                ),
            });
        }
        if value.device() != self.device() {
            return Err(Error::DeviceMismatch {
                op: "assign",
                lhs: self.device().to_string(),
                rhs: value.device().to_string(),
            });
        }
        let new = value.node();
        runtime().retain(new);
        let old = self.0.node.swap(new.0, Ordering::AcqRel);
        runtime().release(NodeId(old));
        Ok(())
    }

    /// The shape (dims may be symbolic).
    pub fn shape(&self) -> &Shape {
        &self.0.shape
    }

    /// The dims as numbers (dynamic dims give their current values).
    ///
    /// A dynamic dim with no value (a tensor made directly from a symbolic shape,
    /// `Tensor::full([Dim::from(var)], ..)`, rather than by [`Tensor::mark_dynamic`] or an
    /// op on such a tensor) reads as 0; realizing or reading such a tensor is an error that
    /// names the dim.
    pub fn dims(&self) -> Vec<usize> {
        self.0.values.eval(&self.0.shape).unwrap_or_else(|| {
            let bindings = self.0.values.bindings();
            self.0
                .shape
                .iter()
                .map(|d| {
                    d.eval(&bindings)
                        .ok()
                        .and_then(|v| usize::try_from(v).ok())
                        .unwrap_or(0)
                })
                .collect()
        })
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.0.shape.ndim()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        // Saturating: a shape past `usize::MAX` elements (only a lazy constant can have
        // one) reads as the largest count, never a wrapped small one.
        let dims = self.dims();
        if dims.contains(&0) {
            return 0;
        }
        dims.iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .unwrap_or(usize::MAX)
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> Device {
        self.0.device
    }

    /// A tensor from row-major data.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// let t = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [2, 3]).unwrap();
    /// assert_eq!(t.dims(), vec![2, 3]);
    /// assert!(Tensor::from_vec(vec![1i32, 2, 3], [2, 2]).is_err());
    /// ```
    #[allow(clippy::needless_pass_by_value)] // By value, like `torch.tensor(list)`: the
    // caller's vector is consumed, whatever the storage does with it.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        Self::from_slice(&data, shape)
    }

    /// A tensor from a row-major slice.
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        let numel = shape.numel();
        if numel.as_const() != Some(data.len() as i64) {
            return Err(Error::DataLength {
                op: "from_vec",
                len: data.len(),
                shape,
                numel: numel.to_string(),
            });
        }
        let mut bytes = Vec::with_capacity(data.len() * T::DTYPE.size_bytes());
        for &v in data {
            v.write_le(&mut bytes);
        }
        Ok(Self::from_bytes(bytes, T::DTYPE, shape))
    }

    pub(crate) fn from_bytes(bytes: Vec<u8>, dtype: DType, shape: Shape) -> Tensor {
        Self::from_bytes_on(bytes, dtype, shape, Device::default())
    }

    /// A leaf holding host bytes, uploaded to `device` on first use.
    pub(crate) fn from_bytes_on(
        bytes: Vec<u8>,
        dtype: DType,
        shape: Shape,
        device: Device,
    ) -> Tensor {
        let node = runtime().add_host_leaf(bytes.into(), dtype, shape.clone());
        Tensor::from_node(node, shape, dtype, device)
    }

    /// Computes the tensor's value now (a no-op if it is already computed).
    pub fn realize(&self) -> Result<RealizeReport> {
        Self::realize_all(&[self])
    }

    /// Computes several tensors in one schedule, sharing their common work.
    pub fn realize_all(tensors: &[&Tensor]) -> Result<RealizeReport> {
        let mut total = RealizeReport::default();
        if Self::all_realized(tensors) {
            return Ok(total);
        }
        let mut devices: Vec<Device> = tensors.iter().map(|t| t.device()).collect();
        devices.dedup();
        for device in devices {
            let nodes: Vec<NodeId> = tensors
                .iter()
                .filter(|t| t.device() == device)
                .map(|t| t.node())
                .collect();
            let mut values = DimValues::default();
            for t in tensors.iter().filter(|t| t.device() == device) {
                values = values.merge(t.dim_values(), "realize")?;
            }
            let r = runtime().realize(&nodes, device, &values.bindings())?;
            total.kernels += r.kernels;
            total.compiled += r.compiled;
            total.cached += r.cached;
            total.interpreted += r.interpreted;
            total.copies += r.copies;
            total.tuned += r.tuned;
        }
        Ok(total)
    }

    /// The elements in row-major order, as `T`, which must be the tensor's dtype.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// let t = Tensor::from_vec(vec![1.5f64, -2.0], [2]).unwrap();
    /// assert_eq!(t.to_vec::<f64>().unwrap(), vec![1.5, -2.0]);
    /// assert!(t.to_vec::<f32>().is_err());
    /// ```
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(dtype_mismatch("to_vec", self.dtype(), T::DTYPE));
        }
        let bytes = self.bytes()?;
        let mut out = Vec::new();
        out.try_reserve_exact(bytes.len() / T::DTYPE.size_bytes())
            .map_err(|_| tessel_runtime::out_of_host_memory(bytes.len()))?;
        out.extend(bytes.chunks_exact(T::DTYPE.size_bytes()).map(T::read_le));
        Ok(out)
    }

    /// The value of a one-element tensor, as `T`, which must be the tensor's dtype.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::InvalidArgument {
                op: "item",
                reason: format!(
                    "item() needs a tensor with exactly one element, this one has shape {} ({} elements); index or reduce it first",
                    self.shape(),
                    self.numel()
                ),
            });
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// The elements as scalars of the tensor's dtype, in row-major order.
    pub fn to_scalars(&self) -> Result<Vec<Scalar>> {
        let dtype = self.dtype();
        let bytes = self.bytes()?;
        let n = bytes.len() / dtype.size_bytes();
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| {
            tessel_runtime::out_of_host_memory(n.saturating_mul(size_of::<Scalar>()))
        })?;
        out.extend(
            bytes
                .chunks_exact(dtype.size_bytes())
                .map(|b| Scalar::from_le_bytes(dtype, b)),
        );
        Ok(out)
    }

    fn bytes(&self) -> Result<Vec<u8>> {
        crate::ops::verify_pending_indices()?;
        self.realize()?;
        runtime().read(self.node(), &self.dim_values().bindings())
    }

    /// The tensor on `device` (the same handle if it is already there). The data moves
    /// through host memory; a value made only of constants and indices (`arange`, `zeros`,
    /// `full` and expressions over them) moves without computing or copying anything: the
    /// target device computes it where it is used, as `torch.arange(n, device=d)` would.
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        if *device == self.device() {
            return Ok(self.clone());
        }
        runtime().backend(*device)?;
        if runtime().is_data_free(self.node(), DATA_FREE_LIMIT, |d| device.supports(d)) {
            runtime().retain(self.node());
            return Ok(Tensor::from_node_with(
                self.node(),
                self.shape().clone(),
                self.dtype(),
                *device,
                self.dim_values().clone(),
            ));
        }
        let bytes = self.bytes()?;
        let node = runtime().add_host_leaf(bytes.into(), self.dtype(), self.shape().clone());
        Ok(Tensor::from_node_with(
            node,
            self.shape().clone(),
            self.dtype(),
            *device,
            self.dim_values().clone(),
        ))
    }
}

/// The largest data-free expression (in nodes) [`Tensor::to`] moves without realizing it.
const DATA_FREE_LIMIT: usize = 64;

pub(crate) fn dtype_mismatch(op: &'static str, actual: DType, requested: DType) -> Error {
    Error::DTypeMismatch {
        op,
        actual,
        requested,
        requested_variant: format!("{requested:?}"),
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({}, {}, {})",
            self.shape(),
            self.dtype(),
            self.device()
        )
    }
}

/// Prints like PyTorch: `tensor([[1.0, 2.0], [3.0, 4.0]], dtype=f32)`. Printing realizes
/// the tensor; if that fails, the error is printed instead of the values.
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = match self.to_scalars() {
            Ok(v) => v,
            Err(e) => return write!(f, "tensor(<error: {e}>)"),
        };
        let dims = self.dims();
        f.write_str("tensor(")?;
        write_nested(f, &values, &dims)?;
        write!(f, ", dtype={})", self.dtype())
    }
}

fn write_nested(f: &mut fmt::Formatter<'_>, values: &[Scalar], dims: &[usize]) -> fmt::Result {
    const EDGE: usize = 3;
    let Some((&n, rest)) = dims.split_first() else {
        return write!(
            f,
            "{}",
            values.first().map_or_else(String::new, ToString::to_string)
        );
    };
    let inner: usize = rest.iter().product();
    f.write_str("[")?;
    let show = |i: usize| n <= 2 * EDGE + 1 || i < EDGE || i >= n - EDGE;
    for i in 0..n {
        if !show(i) {
            if i == EDGE {
                f.write_str(", ...")?;
            }
            continue;
        }
        if i > 0 {
            f.write_str(", ")?;
        }
        write_nested(f, &values[i * inner..(i + 1) * inner], rest)?;
    }
    f.write_str("]")
}
