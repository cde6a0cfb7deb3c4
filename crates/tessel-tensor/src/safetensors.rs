//! Reading and writing `.safetensors` files: the weight format of Hugging Face and of
//! PyTorch's `safetensors.torch.save_file`, so weights move between Tessel and PyTorch
//! bit for bit.

use std::collections::HashSet;
use std::path::Path;

use ::safetensors::tensor::TensorView;
use ::safetensors::{Dtype, SafeTensors};
use tessel_shape::{DType, Shape};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::runtime::runtime;
use crate::tensor::Tensor;

/// The safetensors dtype of a Tessel dtype; every Tessel dtype has one.
fn to_file_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
        DType::U16 => Dtype::U16,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
        DType::I8 => Dtype::I8,
        DType::I16 => Dtype::I16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        // PyTorch's safetensors writer names `float8_e4m3fn` `F8_E4M3`.
        DType::F8E4M3 => Dtype::F8_E4M3,
        DType::F8E5M2 => Dtype::F8_E5M2,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
    }
}

/// The Tessel dtype of a safetensors dtype, if Tessel has it (not the 4- and 6-bit floats,
/// the `FNUZ` float8 variants, nor complex numbers).
fn from_file_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::U16 => DType::U16,
        Dtype::U32 => DType::U32,
        Dtype::U64 => DType::U64,
        Dtype::I8 => DType::I8,
        Dtype::I16 => DType::I16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::F8_E4M3 => DType::F8E4M3,
        Dtype::F8_E5M2 => DType::F8E5M2,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        _ => return None,
    })
}

/// The little-endian bytes of a tensor's value, computing it first if needed.
fn host_bytes(t: &Tensor) -> Result<Vec<u8>> {
    t.realize()?;
    runtime().read(t.node(), &t.dim_values().bindings())
}

/// Writes named tensors to a `.safetensors` file at `path` (replacing it), computing any
/// tensor that is not yet realized.
///
/// Names must be unique; the file stores every tensor in its own dtype and shape.
///
/// ```
/// # use tessel_tensor::{Device, Tensor, load_safetensors, save_safetensors};
/// # fn main() -> tessel_tensor::Result<()> {
/// let path = std::env::temp_dir().join(format!("tessel-doc-{}.safetensors", std::process::id()));
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
/// save_safetensors(&path, &[("w".to_string(), w)])?;
/// let loaded = load_safetensors(&path, &Device::cpu())?;
/// assert_eq!(loaded[0].0, "w");
/// assert_eq!(loaded[0].1.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
/// # std::fs::remove_file(&path).ok();
/// # Ok(())
/// # }
/// ```
pub fn save_safetensors(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    const OP: &str = "save_safetensors";
    let path = path.as_ref();
    let mut seen = HashSet::new();
    for (name, _) in tensors {
        if !seen.insert(name.as_str()) {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "the name `{name}` is given twice; every tensor in a file needs its own name"
                ),
            });
        }
    }
    let mut data = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let Some(dims) = t.shape().as_usizes() else {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "`{name}` has the symbolic shape {}; only tensors with concrete shapes can be saved",
                    t.shape()
                ),
            });
        };
        data.push((
            name.as_str(),
            to_file_dtype(t.dtype()),
            dims,
            host_bytes(t)?,
        ));
    }
    let mut views = Vec::with_capacity(data.len());
    for (name, dtype, dims, bytes) in &data {
        let view = TensorView::new(*dtype, dims.clone(), bytes)
            .map_err(|e| Error::Internal(format!("{OP}: `{name}`: {e}")))?;
        views.push((*name, view));
    }
    ::safetensors::serialize_to_file(views, None, path).map_err(|e| Error::InvalidArgument {
        op: OP,
        reason: format!("cannot write {}: {e}", path.display()),
    })
}

/// Reads every tensor of a `.safetensors` file, sorted by name, as tensors on `device`
/// (uploaded when first used).
///
/// Files written by PyTorch, Hugging Face or [`save_safetensors`] load bit-exactly; dtypes
/// Tessel does not have (8-bit floats, complex numbers) are an error naming the tensor.
pub fn load_safetensors(path: impl AsRef<Path>, device: &Device) -> Result<Vec<(String, Tensor)>> {
    const OP: &str = "load_safetensors";
    let path = path.as_ref();
    runtime().backend(*device)?;
    let buffer = std::fs::read(path).map_err(|e| Error::InvalidArgument {
        op: OP,
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    let file = SafeTensors::deserialize(&buffer).map_err(|e| Error::InvalidArgument {
        op: OP,
        reason: format!("{} is not a valid safetensors file: {e}", path.display()),
    })?;
    let mut out = Vec::with_capacity(file.len());
    for (name, view) in file.iter() {
        let Some(dtype) = from_file_dtype(view.dtype()) else {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "{}: tensor `{name}` has dtype {:?}, which Tessel does not support; convert it to a supported dtype (f32, f16, bf16, ...) before saving",
                    path.display(),
                    view.dtype()
                ),
            });
        };
        let mut bytes = view.data().to_vec();
        if dtype == DType::Bool {
            // A bool is one byte, but only 0 and 1 are values: normalize like PyTorch's
            // loader does when it reinterprets the bytes.
            for b in &mut bytes {
                *b = u8::from(*b != 0);
            }
        }
        let shape = Shape::from(view.shape().to_vec());
        out.push((
            name.to_string(),
            Tensor::from_bytes_on(bytes, dtype, shape, *device),
        ));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}
