//! Tensors over host memory owned elsewhere ([`HostBytes`]): a `Vec`, a memory-mapped
//! weight file.

use tessel_shape::{DType, Shape};

use crate::tensor::Tensor;
use tessel_runtime::Device;
use tessel_runtime::HostBytes;
use tessel_runtime::runtime;
use tessel_runtime::{Error, Result};

impl Tensor {
    /// A tensor whose value is the little-endian `bytes` as `dtype` elements of `shape`,
    /// placed on `device` when first used. The bytes are shared, not copied: a tensor made
    /// from a memory-mapped file reads the file when it is uploaded.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use tessel_tensor::{DType, Device, HostBytes, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let file: Arc<Vec<u8>> = Arc::new([1.5f32, 2.5, 3.5].iter().flat_map(|v| v.to_le_bytes()).collect());
    /// let last_two = HostBytes::new(file, 4..12)?;
    /// let t = Tensor::from_host_bytes(last_two, DType::F32, [2], &Device::cpu())?;
    /// assert_eq!(t.to_vec::<f32>()?, vec![2.5, 3.5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_host_bytes(
        bytes: HostBytes,
        dtype: DType,
        shape: impl Into<Shape>,
        device: &Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let numel = shape.numel();
        let want = numel
            .as_const()
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|n| n.checked_mul(dtype.size_bytes()));
        if want != Some(bytes.len()) {
            return Err(Error::DataLength {
                op: "from_host_bytes",
                len: bytes.len() / dtype.size_bytes().max(1),
                shape,
                numel: numel.to_string(),
            });
        }
        runtime().backend(*device)?;
        let bytes = if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
            // A bool is one byte, but only 0 and 1 are values.
            HostBytes::from(bytes.iter().map(|&b| u8::from(b != 0)).collect::<Vec<u8>>())
        } else {
            bytes
        };
        let node = runtime().add_host_leaf(bytes, dtype, shape.clone());
        Ok(Tensor::from_node(node, shape, dtype, *device))
    }
}
