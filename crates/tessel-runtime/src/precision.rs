//! How precisely `f32` matrix products must be computed: PyTorch's
//! `torch.set_float32_matmul_precision`.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

use tessel_ir::Matmul;
use tessel_shape::DType;

use crate::error::{Error, Result};

/// The internal precision `f32` matrix products may use, as in
/// `torch.set_float32_matmul_precision`. Set it with [`set_float32_matmul_precision`].
///
/// It is a permission, read when a plan is made: `High` and `Medium` let a library routine
/// round `f32` operands to TF32 (10-bit mantissa, sums still in `f32`) on tensor cores, as
/// cuBLAS does on NVIDIA GPUs from Ampere on; a device without TF32 (the CPU's `gemm`
/// routine, generated kernels) computes in full `f32` whatever the setting. Products of
/// other dtypes are unaffected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Float32MatmulPrecision {
    /// Full `f32` arithmetic (the default, as in PyTorch).
    #[default]
    Highest,
    /// TF32 allowed.
    High,
    /// TF32 allowed (PyTorch's `"medium"` also allows bf16 internally where a backend
    /// offers it; none of Tessel's does, so it means the same as `High`).
    Medium,
}

impl Float32MatmulPrecision {
    /// Whether products may round `f32` operands to TF32.
    pub fn allows_tf32(self) -> bool {
        self != Float32MatmulPrecision::Highest
    }

    /// PyTorch's name: `"highest"`, `"high"` or `"medium"`.
    pub fn name(self) -> &'static str {
        match self {
            Float32MatmulPrecision::Highest => "highest",
            Float32MatmulPrecision::High => "high",
            Float32MatmulPrecision::Medium => "medium",
        }
    }

    const ALL: [Float32MatmulPrecision; 3] = [
        Float32MatmulPrecision::Highest,
        Float32MatmulPrecision::High,
        Float32MatmulPrecision::Medium,
    ];

    /// `op` with this precision's TF32 permission (only `f32` products take it).
    pub(crate) fn apply(self, mut op: Matmul) -> Matmul {
        op.allow_tf32 = op.dtype == DType::F32 && self.allows_tf32();
        op
    }
}

impl fmt::Display for Float32MatmulPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Float32MatmulPrecision {
    type Err = Error;

    /// Parses PyTorch's names.
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::InvalidArgument {
                op: "set_float32_matmul_precision",
                reason: format!("unknown precision {s:?}; use \"highest\", \"high\" or \"medium\""),
            })
    }
}

static PRECISION: AtomicU8 = AtomicU8::new(0);

/// Sets the internal precision of `f32` matrix products for plans made from now on, as
/// `torch.set_float32_matmul_precision` does. Plans already made for the other setting are
/// kept, keyed by it, so switching back and forth replans nothing.
///
/// ```
/// use tessel_runtime::{Float32MatmulPrecision, float32_matmul_precision, set_float32_matmul_precision};
/// # fn main() -> tessel_runtime::Result<()> {
/// set_float32_matmul_precision("high".parse()?);
/// assert!(float32_matmul_precision().allows_tf32());
/// set_float32_matmul_precision(Float32MatmulPrecision::Highest);
/// # Ok(())
/// # }
/// ```
pub fn set_float32_matmul_precision(precision: Float32MatmulPrecision) {
    PRECISION.store(precision as u8, Ordering::SeqCst);
}

/// The precision [`set_float32_matmul_precision`] set (`Highest` by default).
#[must_use]
pub fn float32_matmul_precision() -> Float32MatmulPrecision {
    // Only `set_float32_matmul_precision` stores, and it stores a discriminant.
    Float32MatmulPrecision::ALL[usize::from(PRECISION.load(Ordering::SeqCst))]
}
