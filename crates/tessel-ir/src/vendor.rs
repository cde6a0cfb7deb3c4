//! Library routines a backend may offer in place of a generated kernel.
//!
//! The graph layer recognizes a pattern (a matrix product) and asks each backend for
//! [`VendorOp`] programs through [`Backend::vendor`](crate::Backend::vendor). A backend
//! returns every way it has to run the op as a [`VendorProgram`]: a library routine (the
//! `gemm` crate on the CPU, cuBLAS on CUDA), or a kernel of its own written for the op
//! (CUDA's tensor-core matmul, one program per tile shape). Each launches, times and
//! releases like any compiled kernel; a backend with none returns an empty list, and the
//! generated kernel of the graph is the only candidate. Vendor programs are measured like
//! every other candidate, never assumed faster.
//!
//! Buffers bind positionally, as for kernels: a matmul takes `[lhs, rhs, out]`, and
//! `[lhs, rhs, bias, out]` when its [`Epilogue`] adds a bias.

use std::fmt;

use tessel_shape::{Bindings, DType, Dim, EvalError};

use crate::ProgramId;

/// One way a backend runs a [`VendorOp`] (see [`Backend::vendor`](crate::Backend::vendor)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VendorProgram {
    /// The program.
    pub program: ProgramId,
    /// What tells it from the other programs for the same op (`"cuBLAS"`,
    /// `"mma 128×256×32/3"`): shown in plans, and part of the key its measured time is
    /// cached under.
    pub variant: String,
}

/// A library operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum VendorOp {
    /// A (batched) matrix product; see [`Matmul`].
    Matmul(Matmul),
}

impl fmt::Display for VendorOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VendorOp::Matmul(m) => m.fmt(f),
        }
    }
}

/// `out[b] = op(lhs[b]) · op(rhs[b])` for `b < batch`, every matrix dense.
///
/// - `out[b]` is row-major `m × n`, at element offset `b·m·n`: `out` is contiguous.
/// - `lhs[b]` is `m × k` at element offset `b·lhs_batch_stride`; row-major (`m` rows of
///   `k`) or, when `lhs_transposed`, stored as its row-major transpose (`k` rows of `m`).
/// - `rhs[b]` is `k × n` at offset `b·rhs_batch_stride`; row-major (`k` rows of `n`) or,
///   when `rhs_transposed`, stored as `n` rows of `k`.
///
/// A batch stride of 0 broadcasts one matrix to every batch. Every operand and the output
/// have element type `dtype`. Sizes are symbolic; a launch evaluates them with its dims.
/// Sums run in `dtype` (the generated kernel does the same), in whatever order the
/// library chooses. With [`allow_tf32`](Matmul::allow_tf32), an `f32` product may round its
/// operands to TF32 instead. An [`Epilogue`] applies to each sum before it is stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Matmul {
    /// Element type of the operands and the result.
    pub dtype: DType,
    /// Number of products.
    pub batch: Dim,
    /// Rows of the result.
    pub m: Dim,
    /// Columns of the result.
    pub n: Dim,
    /// The contracted length.
    pub k: Dim,
    /// Whether `lhs` is stored transposed (`k × m`).
    pub lhs_transposed: bool,
    /// Whether `rhs` is stored transposed (`n × k`).
    pub rhs_transposed: bool,
    /// Elements between consecutive `lhs` matrices (0: one matrix for every batch).
    pub lhs_batch_stride: Dim,
    /// Elements between consecutive `rhs` matrices (0: one matrix for every batch).
    pub rhs_batch_stride: Dim,
    /// An `f32` product may round its operands to TF32 (10-bit mantissa) on tensor cores,
    /// still summing in `f32`, as `torch.backends.cuda.matmul.allow_tf32` permits. A
    /// permission: a backend without TF32 computes in full `f32`. Meaningless for other
    /// dtypes.
    pub allow_tf32: bool,
    /// What happens to each sum before it is stored.
    pub epilogue: Epilogue,
}

/// Elementwise work a matmul does on each sum before storing it, in the accumulation
/// precision (at least `f32`), with one rounding to the output dtype at the end:
/// `out[b, i, j] = activation(sum + bias[j])`. The bias, when there is one, is a contiguous
/// vector of `n` elements of the matmul's dtype, bound after the operands and shared by
/// every batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Epilogue {
    /// A bias vector along the output's rows is added.
    pub bias: bool,
    /// The activation applied last.
    pub activation: Activation,
}

impl Epilogue {
    /// No epilogue: the sum is stored as it is.
    pub const NONE: Epilogue = Epilogue {
        bias: false,
        activation: Activation::Identity,
    };

    /// Whether the sum is stored as it is.
    pub fn is_none(&self) -> bool {
        *self == Epilogue::NONE
    }

    /// `activation(sum + bias)` in `f64`, the definition every backend's epilogue is
    /// tested against.
    pub fn apply(&self, sum: f64, bias: f64) -> f64 {
        let x = if self.bias { sum + bias } else { sum };
        self.activation.apply(x)
    }
}

/// An activation a matmul epilogue may apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// None.
    #[default]
    Identity,
    /// `max(x, 0)` (`torch.relu`).
    Relu,
    /// GELU's tanh approximation, `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`
    /// (`torch.nn.functional.gelu(x, approximate="tanh")`, GPT-2's `gelu_new`).
    GeluTanh,
}

impl Activation {
    /// The activation of `x`, in `f64`.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Activation::Identity => x,
            Activation::Relu => x.max(0.0),
            Activation::GeluTanh => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (k * (x + 0.044_715 * x * x * x)).tanh())
            }
        }
    }
}

impl fmt::Display for Epilogue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bias {
            f.write_str(" + bias")?;
        }
        match self.activation {
            Activation::Identity => Ok(()),
            Activation::Relu => f.write_str(", relu"),
            Activation::GeluTanh => f.write_str(", gelu (tanh)"),
        }
    }
}

/// A [`Matmul`] with its sizes evaluated for one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulSizes {
    /// Number of products.
    pub batch: usize,
    /// Rows of the result.
    pub m: usize,
    /// Columns of the result.
    pub n: usize,
    /// The contracted length.
    pub k: usize,
    /// Elements between consecutive `lhs` matrices.
    pub lhs_batch_stride: usize,
    /// Elements between consecutive `rhs` matrices.
    pub rhs_batch_stride: usize,
}

impl MatmulSizes {
    /// Elements each operand must hold at least: `(lhs, rhs, out)`. Saturates instead of
    /// overflowing, so absurd sizes fail a buffer-length check rather than passing it.
    pub fn min_elements(&self) -> (usize, usize, usize) {
        if self.batch == 0 {
            return (0, 0, 0);
        }
        let last = self.batch - 1;
        let mk = self.m.saturating_mul(self.k);
        let kn = self.k.saturating_mul(self.n);
        let span = |stride: usize, one: usize| {
            if one == 0 {
                0
            } else {
                last.saturating_mul(stride).saturating_add(one)
            }
        };
        (
            span(self.lhs_batch_stride, mk),
            span(self.rhs_batch_stride, kn),
            self.batch.saturating_mul(self.m).saturating_mul(self.n),
        )
    }
}

impl Matmul {
    /// The sizes for one launch.
    pub fn sizes(&self, dims: &Bindings) -> Result<MatmulSizes, EvalError> {
        let eval = |d: Dim| d.eval(dims).map(|v| v.max(0) as usize);
        Ok(MatmulSizes {
            batch: eval(self.batch)?,
            m: eval(self.m)?,
            n: eval(self.n)?,
            k: eval(self.k)?,
            lhs_batch_stride: eval(self.lhs_batch_stride)?,
            rhs_batch_stride: eval(self.rhs_batch_stride)?,
        })
    }

    /// Floating-point operations of one launch (`2·batch·m·n·k`).
    pub fn flops(&self, dims: &Bindings) -> Result<f64, EvalError> {
        let s = self.sizes(dims)?;
        Ok(2.0 * s.batch as f64 * s.m as f64 * s.n as f64 * s.k as f64)
    }
}

impl fmt::Display for Matmul {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = |b: bool| if b { "ᵀ" } else { "" };
        write!(
            f,
            "matmul {} [{}] {}×{}{} · {}×{}{} (batch strides {}, {})",
            self.dtype,
            self.batch,
            self.m,
            self.k,
            t(self.lhs_transposed),
            self.k,
            self.n,
            t(self.rhs_transposed),
            self.lhs_batch_stride,
            self.rhs_batch_stride
        )?;
        if self.allow_tf32 && self.dtype == DType::F32 {
            f.write_str(" allowing tf32")?;
        }
        self.epilogue.fmt(f)
    }
}
