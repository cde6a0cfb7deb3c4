//! Reading and writing `.safetensors` files: the weight format of Hugging Face and of
//! PyTorch's `safetensors.torch.save_file`, so weights move between Tessel and PyTorch
//! bit for bit.

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::safetensors::tensor::TensorView;
use ::safetensors::{Dtype, SafeTensorError, SafeTensors};
use memmap2::Mmap;
use tessel_shape::{DType, Shape};

use crate::tensor::Tensor;
use tessel_runtime::Device;
use tessel_runtime::HostBytes;
use tessel_runtime::runtime;
use tessel_runtime::{Error, Result};

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
/// Tessel does not have (8-bit floats, complex numbers) are an error naming the tensor. The
/// file is memory-mapped ([`SafetensorsFile`]): nothing is copied before the upload.
pub fn load_safetensors(path: impl AsRef<Path>, device: &Device) -> Result<Vec<(String, Tensor)>> {
    runtime().backend(*device)?;
    let file = SafetensorsFile::open(path)?;
    file.names()
        .map(|name| Ok((name.to_string(), file.tensor(name, device)?)))
        .collect()
}

/// One tensor's entry in a [`SafetensorsFile`].
#[derive(Clone, Debug)]
struct Entry {
    dtype: DType,
    shape: Vec<usize>,
    /// The data's byte range within the file.
    range: Range<usize>,
}

/// An open `.safetensors` file, memory-mapped: its header is parsed and checked at
/// [`SafetensorsFile::open`]; a tensor's bytes are read from the mapping when the tensor is
/// first used on a device, never copied before.
///
/// The mapping assumes the file is not changed while it is open (every memory-mapping
/// loader assumes this; a file truncated by another process meanwhile ends the process).
pub struct SafetensorsFile {
    path: PathBuf,
    map: Arc<Mmap>,
    /// Sorted by name.
    entries: Vec<(String, Entry)>,
}

impl SafetensorsFile {
    /// Opens and checks `path`: a truncated file, a malformed header or a dtype Tessel does
    /// not have is an error naming the file (and the tensor).
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        const OP: &str = "load_safetensors";
        let path = path.as_ref();
        let cannot_read = |e: std::io::Error| Error::InvalidArgument {
            op: OP,
            reason: format!("cannot read {}: {e}", path.display()),
        };
        let file = std::fs::File::open(path).map_err(cannot_read)?;
        // SAFETY: the mapping is read-only and private; its contents are only ever read as
        // bytes. Another process changing the file while it is mapped is outside what any
        // memory-mapping reader can guard against (documented on the type).
        let map = unsafe { Mmap::map(&file) }.map_err(cannot_read)?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&map).map_err(|e| invalid_file(path, &map, &e))?;
        let base = 8 + header_len;
        let mut entries = Vec::with_capacity(metadata.tensors().len());
        for (name, info) in metadata.tensors() {
            let Some(dtype) = from_file_dtype(info.dtype) else {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "{}: tensor `{name}` has dtype {:?}, which Tessel does not support; convert it to a supported dtype (f32, f16, bf16, ...) before saving",
                        path.display(),
                        info.dtype
                    ),
                });
            };
            let (start, end) = info.data_offsets;
            entries.push((
                name,
                Entry {
                    dtype,
                    shape: info.shape.clone(),
                    range: base + start..base + end,
                },
            ));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map: Arc::new(map),
            entries,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| &self.entries[i].1)
    }

    /// The stored dtype and shape of `name`, if the file has it.
    pub fn info(&self, name: &str) -> Option<(DType, &[usize])> {
        self.entry(name).map(|e| (e.dtype, e.shape.as_slice()))
    }

    /// The stored bytes of `name` (little-endian, row-major), shared with the mapping.
    pub fn bytes(&self, name: &str) -> Option<HostBytes> {
        let e = self.entry(name)?;
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = self.map.clone();
        HostBytes::new(owner, e.range.clone()).ok()
    }

    /// `name` as a tensor of its stored dtype and shape on `device`.
    pub fn tensor(&self, name: &str, device: &Device) -> Result<Tensor> {
        let (Some(e), Some(bytes)) = (self.entry(name), self.bytes(name)) else {
            return Err(Error::InvalidArgument {
                op: "load_safetensors",
                reason: format!("{} has no tensor `{name}`", self.path.display()),
            });
        };
        Tensor::from_host_bytes(bytes, e.dtype, Shape::from(e.shape.clone()), device)
    }
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SafetensorsFile({}, {} tensors)",
            self.path.display(),
            self.entries.len()
        )
    }
}

/// The error for a file the safetensors reader rejects. A file cut short names the first
/// tensor whose data it lacks (the header is still readable then).
fn invalid_file(path: &Path, bytes: &[u8], e: &SafeTensorError) -> Error {
    let mut reason = format!("{} is not a valid safetensors file: {e}", path.display());
    if matches!(e, SafeTensorError::MetadataIncompleteBuffer)
        && let Some(cut) = first_cut_tensor(bytes)
    {
        reason = format!(
            "{} is truncated: it holds {} bytes, but tensor `{}` ends at byte {}; download or copy the file again",
            path.display(),
            bytes.len(),
            cut.0,
            cut.1
        );
    }
    Error::InvalidArgument {
        op: "load_safetensors",
        reason,
    }
}

/// The first tensor (by data offset) that ends past the file's end, and where it ends.
fn first_cut_tensor(bytes: &[u8]) -> Option<(String, usize)> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let header: serde_json::Value =
        serde_json::from_slice(bytes.get(8..8usize.checked_add(n)?)?).ok()?;
    let base = 8 + n;
    let mut ends: Vec<(usize, String)> = header
        .as_object()?
        .iter()
        .filter_map(|(name, v)| {
            let end = v.get("data_offsets")?.get(1)?.as_u64()? as usize;
            Some((base + end, name.clone()))
        })
        .collect();
    ends.sort();
    ends.into_iter()
        .find(|(end, _)| *end > bytes.len())
        .map(|(end, name)| (name, end))
}
