//! [`HostBytes`]: host memory a tensor's leaf reads from until its first upload, shared with
//! its owner (a `Vec`, a memory-mapped weight file) instead of copied.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use tessel_shape::{DType, Scalar};

use crate::error::{Error, Result};

/// A byte range of memory owned elsewhere (a `Vec<u8>`, a memory map, a file buffer), shared
/// by reference count: a tensor made from it (`Tensor::from_host_bytes`) reads these
/// bytes when it is first used on a device and copies nothing before that upload.
#[derive(Clone)]
pub struct HostBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl HostBytes {
    /// The bytes `range` of `owner`; fails if the range is not inside it.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Result<Self> {
        let len = (*owner).as_ref().len();
        if range.start > range.end || range.end > len {
            return Err(Error::InvalidArgument {
                op: "HostBytes::new",
                reason: format!(
                    "the range {}..{} is outside the {len} bytes given",
                    range.start, range.end
                ),
            });
        }
        Ok(HostBytes { owner, range })
    }

    /// The same values converted from `from` to `to`, element by element with
    /// [`Scalar::cast`](tessel_shape::Scalar::cast) (the rounding every backend's cast
    /// kernel uses), in a new buffer; the same bytes, shared, when the dtypes agree.
    pub fn cast(&self, from: DType, to: DType) -> Result<HostBytes> {
        if from == to {
            return Ok(self.clone());
        }
        let (fs, ts) = (from.size_bytes(), to.size_bytes());
        if !self.len().is_multiple_of(fs) {
            return Err(Error::InvalidArgument {
                op: "HostBytes::cast",
                reason: format!(
                    "{} bytes are not a whole number of {from} elements ({fs} bytes each)",
                    self.len()
                ),
            });
        }
        let n = self.len() / fs;
        let mut out = Vec::new();
        out.try_reserve_exact(n * ts)
            .map_err(|_| Error::InvalidArgument {
                op: "HostBytes::cast",
                reason: format!("cannot allocate {} bytes of host memory", n * ts),
            })?;
        for chunk in self.chunks_exact(fs) {
            let bits = Scalar::from_le_bytes(from, chunk).cast(to).to_bits();
            out.extend_from_slice(&bits.to_le_bytes()[..ts]);
        }
        Ok(HostBytes::from(out))
    }
}

impl From<Vec<u8>> for HostBytes {
    fn from(bytes: Vec<u8>) -> Self {
        let range = 0..bytes.len();
        HostBytes {
            owner: Arc::new(bytes),
            range,
        }
    }
}

impl Deref for HostBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

impl fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBytes({} bytes)", self.len())
    }
}
