//! Source code for kernels: one C-family emitter, many dialects.
//!
//! [`render`] prints a verified [`Kernel`] in a [`CStyle`] dialect. Dialects are data
//! (see [`CStyle`]): [`C`] for the CPU backend, [`OPENCL`] and [`OPENCL_NO_FP64`] for the
//! OpenCL backend, [`CUDA`] for the CUDA backend; each overrides names, qualifiers and a few
//! hooks, never the emitter.
//!
//! # Semantics
//!
//! Generated code computes exactly what [`Scalar`](tessel_shape::Scalar) computes, which is
//! what the reference interpreter runs: the expression layer (`exprs.rs`) guards every C
//! operator whose C meaning differs (integer division by zero, `MIN / -1`, over-wide
//! shifts, NaN in `max`, out-of-range float-to-integer casts, signed overflow), and a small
//! library of helpers (`helpers.rs`) supplies what C lacks: `f16`/`bf16` conversions with
//! round-to-nearest-even, NaN and subnormal handling, a single-rounding `mad` on half types,
//! and fdlibm's `erf` in the reference's operation order. Only the helpers a kernel uses
//! are emitted. Values of width `w > 1` are small structs (`tsl_f32x4 { float v[4]; }`),
//! and every op on them is written lane by lane.
//!
//! Names in the source: instruction `i`'s value is `v<i>`, buffer parameter `p` is
//! `b<p>_<name>`, and the kernel function is [`entry_name`]. Constants are written inline.
//!
//! # Running workgroups on a CPU ([`Launch::Serial`])
//!
//! A CPU runs the invocations of one workgroup one after another, so the emitter turns
//! them into loops over the local ids (x innermost, so consecutive invocations touch
//! consecutive memory and the C compiler can vectorize the loop).
//!
//! Without barriers that is the whole story: the kernel body becomes the body of the
//! local-id loops. With barriers, every invocation must finish the code before a barrier
//! before any starts the code after it, so the body is split (loop fission):
//!
//! - **Workgroup-level instructions** run once per workgroup, outside the local-id loops:
//!   constants, group ids, dims, pure ops on such values, `DefineLocal`, and the `Range`
//!   and `If` blocks that contain a barrier. The verifier guarantees those blocks'
//!   bounds and conditions are the same for every invocation, so running them once is
//!   exact. A barrier itself emits nothing: it only ends a region.
//! - **Regions**: every maximal barrier-free run of the other (per-invocation)
//!   instructions at one nesting level becomes one `for (lid...) { ... }` nest. Pure
//!   workgroup-level instructions met inside a run are hoisted in front of its loops.
//! - **Values crossing regions**: a per-invocation value defined in one region and used in
//!   a later one is *rematerialized* at the start of the later region when it is a cheap
//!   integer or `bool` function of the local ids and workgroup-level values (an index,
//!   `lid < stride`), and otherwise *kept*, in a per-invocation array `T v<i>_s[LOCAL]`
//!   indexed by the linear local id. Register arrays (`DefineReg`) at workgroup level
//!   become `T v<i>[LOCAL][len]` for the same reason. Both need constant local sizes; a
//!   kernel that would need them with symbolic local sizes is rejected with
//!   [`CodegenError::Unsupported`].
//! - A per-invocation value used by a workgroup-level instruction (a loop bound loaded
//!   from memory) is uniform by the verifier's rules, and is copied to a scalar `v<i>_u`.
//!
//! # Launching on a GPU ([`Launch::Native`])
//!
//! The same walk prints the instructions in order, with the dialect's built-in ids and
//! barrier statement; nothing needs splitting, since the device runs every invocation.
//! Workgroup-level pure values (constants, group ids) may be printed earlier than their
//! instruction position, which is harmless: they depend only on earlier values.
//!
//! # The OpenCL C dialect ([`OPENCL`], [`OPENCL_NO_FP64`])
//!
//! OpenCL C 1.2, the version both PoCL and NVIDIA's driver compile. One work-item runs one
//! invocation:
//!
//! ```text
//! __kernel void tessel_k(__global const float *b0_x, __global float *b1_out, const int d2)
//! ```
//!
//! - Buffer parameters are `__global` pointers in parameter order (`const` when read-only),
//!   then each `Param::Dim` by value in its dtype. The host launches global size
//!   `groups[a] * local[a]` with local size `local[a]` on each axis, so `get_group_id(a)`
//!   and `get_local_id(a)` are the IR's `GroupId(a)` and `LocalId(a)`.
//! - `DefineLocal` is a `__local` array at kernel scope (the verifier keeps it at the top
//!   level); `Barrier` is `barrier(CLK_LOCAL_MEM_FENCE)`.
//! - Types: `uchar`..`ulong`, `char`..`long` (64-bit integers are core OpenCL C), `float`,
//!   and `double` only in [`OPENCL`], for devices with `cl_khr_fp64`. `bool` values are
//!   OpenCL's `bool`, but `bool` buffers are `uchar` (OpenCL C gives `bool` no size).
//! - `f16`/`bf16` values are `ushort` bits and every op computes in `float` and rounds back,
//!   as in C. `f16` converts through `vload_half`/`vstore_half_rte` (the dialect's
//!   [`HalfBuiltins`]; no `cl_khr_fp16` needed, and PoCL and NVIDIA lack it); `bf16` through
//!   the portable helpers.
//! - The float8 dtypes (`f8e4m3`, `f8e5m2`) are `uchar` bits in every C dialect; they only
//!   cast (through `float`, with integer-only helpers that match PyTorch's conversions),
//!   move and select.
//! - `#pragma OPENCL FP_CONTRACT OFF`: OpenCL C allows contracting `a * b + c` by default.
//! - Without `double` ([`OPENCL_NO_FP64`]), a kernel needing it fails with
//!   [`CodegenError::UnsupportedOp`] naming the op and dtype: any `f64` value, and `erf` on
//!   `f32`/`f16`/`bf16` and `mad` on `f16`/`bf16`, which the reference computes through `f64`
//!   to round once. Never a different result.
//!
//! The host side is part of the semantics: build with
//! `-cl-fp32-correctly-rounded-divide-sqrt` (else `float` `/` and `sqrt` may be off by
//! ulps), never with fast-math, `-cl-mad-enable` or `-cl-denorms-are-zero`. Then every op is
//! bit-identical to the interpreter except the built-in transcendentals (`exp`, `exp2`,
//! `log`, `log2`, `sin`, `cos`, `tan`, `tanh`, `pow`, and `erf` through the `exp` it calls),
//! which are within OpenCL's ulp bounds rather than equal to the host's libm.
//!
//! # The CUDA C++ dialect ([`CUDA`])
//!
//! CUDA C++ as NVRTC compiles it, one thread per invocation:
//!
//! ```text
//! extern "C" __global__ void tessel_k(const float *b0_x, float *b1_out, const int32_t d2)
//! ```
//!
//! - Buffers are plain pointers in parameter order (`const` when read-only; never
//!   `__restrict__`, since one buffer may be bound to two parameters), then each
//!   `Param::Dim` by value. The host launches `groups` blocks of `local` threads, so
//!   `blockIdx` and `threadIdx` are the IR's ids; `DefineLocal` is `__shared__`, `Barrier`
//!   is `__syncthreads()`.
//! - NVRTC has no libc headers: the prelude typedefs `uint8_t`..`int64_t` and defines
//!   `INFINITY`. Helpers are `static __device__ __forceinline__`. Math functions are CUDA's
//!   built-ins with C's names (`sqrtf`, `sqrt`); `f64` and 64-bit integers are native;
//!   `f16`/`bf16` are `unsigned short` bits computed on in `float` through the portable
//!   helpers, as in C.
//! - The emitted code never overflows a signed integer (see `exprs.rs`), so CUDA's lack of
//!   `-fwrapv` changes nothing.
//!
//! The host side: compile with `--fmad=false` (NVRTC fuses `a * b + c` by default) and
//! without `--use_fast_math`, keeping NVRTC's `--ftz=false --prec-div=true
//! --prec-sqrt=true`. Then every op is bit-identical to the interpreter except CUDA's
//! transcendentals (the same list as OpenCL's), which are within CUDA's documented ulp bounds.
//!
//! # WGSL ([`render_wgsl`])
//!
//! WGSL is not a C dialect, so it has its own emitter (`wgsl/`), written to the same
//! semantics: one `@compute` entry point per kernel with the constant local sizes as
//! `@workgroup_size`, buffers at `@binding(k)` of group 0 in buffer-parameter order, and
//! one uniform after them holding the dims and the logical workgroup counts, so that a
//! grid larger than the device's per-dimension limit is dispatched as a linear range
//! ([`WgslShader::dispatch`]) and reassembled in the shader. 8- and 16-bit buffers are
//! packed into `u32` words (atomic read-modify-writes when written), `f16`/`bf16` are
//! bits computed on in `f32` with integer-only conversions, and 64-bit types need the
//! target's `int64`/`f64` features ([`WgslTarget`]), else [`CodegenError::UnsupportedOp`].
//! Integer division, shifts, float-to-integer casts, `max`/`min`, `fmod`, `pow` and every
//! NaN test are guarded or rewritten as in C; float `/` by zero gives IEEE's infinities and
//! NaNs explicitly (WGSL leaves it to the implementation); `erf` on `f32` and the half
//! types is fdlibm's `erff`, `log`/`log2` are musl's, and `sin`/`cos`/`tan` on `f32` are
//! Cephes' polynomials after a Payne–Hanek reduction in integer arithmetic (a couple of ulps
//! at any |x|, where WGSL's built-ins have only an absolute 2^-11 on [-π, π]), all
//! computed in the shader. Every
//! float product passes through an identity on its bits that compilers cannot see through
//! (an XOR with a uniform word that is zero), so no driver contracts `a * b + c` into a
//! fused multiply-add: only `mad` fuses. Negation, `abs`, `sign`, `max`/`min`, conversions
//! between `f32` and `f64` and those of the half types work on the bits, so they stay exact
//! where a device flushes subnormals (WGSL allows that, and NVIDIA's Vulkan driver does it);
//! float arithmetic itself may still flush, which backends declare in
//! [`Features::subnormals_may_flush`](crate::Features::subnormals_may_flush). What WGSL
//! cannot promise (`/`, `sqrt` and the remaining transcendentals are within WGSL's bounds,
//! not exact; `mad` may round twice; subnormals may flush; the `f64` transcendentals and
//! `erf` are refused) is listed at the top of `codegen/wgsl/mod.rs`.

mod cstyle;
mod emit;
mod exprs;
mod fastmath;
mod helpers;
mod wgsl;

use tessel_shape::DType;

pub use wgsl::{WgslBuffer, WgslShader, WgslTarget, render_wgsl};

pub use cstyle::{
    C, CStyle, CUDA, HalfBuiltins, Launch, OPENCL, OPENCL_NO_FP64, c_type_name, opencl_type_name,
};

use crate::kernel::Kernel;
use crate::verify::{VerifyError, verify};

/// Why a kernel could not be rendered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    /// The kernel failed verification; nothing is rendered for an invalid kernel.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// The dialect has no rendering for an op on a dtype (its device lacks the type).
    #[error("kernel `{kernel}`: failed to render {op} on {dtype} in the {dialect} dialect")]
    UnsupportedOp {
        /// The kernel's name.
        kernel: String,
        /// The dialect's name.
        dialect: &'static str,
        /// The op's (or helper's) name.
        op: String,
        /// The dtype it was applied to.
        dtype: DType,
    },
    /// The kernel needs something the dialect cannot express.
    #[error("kernel `{kernel}` cannot be rendered in the {dialect} dialect: {reason}")]
    Unsupported {
        /// The kernel's name.
        kernel: String,
        /// The dialect's name.
        dialect: &'static str,
        /// What is missing, and what to change.
        reason: String,
    },
}

/// Renders `kernel` as source code in `dialect`, after verifying it.
///
/// ```
/// use tessel_ir::codegen::{self, C};
/// use tessel_ir::samples;
/// use tessel_shape::DType;
///
/// let kernel = samples::vector_add(DType::F32, 1000, 64).unwrap();
/// let source = codegen::render(&kernel, &C).unwrap();
/// assert!(source.contains("void tessel_vector_add(void *const *bufs"));
/// ```
///
/// A dialect with [`CStyle::vector_align`] first merges consecutive scalar accesses into
/// vector ones ([`passes::vectorize`](crate::passes::vectorize), up to 16 bytes).
pub fn render(kernel: &Kernel, dialect: &CStyle) -> Result<String, CodegenError> {
    verify(kernel)?;
    let vectorized;
    let kernel = if dialect.vector_align.is_some() {
        vectorized = crate::passes::vectorize(kernel, 16);
        &vectorized
    } else {
        kernel
    };
    let defs = verify(kernel)?;
    emit::Emitter::new(kernel, defs, dialect)?.render()
}

/// The name of the function [`render`] defines for `kernel`: `tessel_` and the kernel's
/// name with every character outside `[A-Za-z0-9_]` replaced by `_`.
///
/// The prefix keeps a kernel named like a C keyword or a libc function (`int`, `free`)
/// from clashing with it.
pub fn entry_name(kernel: &Kernel) -> String {
    format!("tessel_{}", c_ident(&kernel.name))
}

/// `name` with every character that may not appear in a C identifier replaced by `_`.
fn c_ident(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// One source defining the entry functions of several sources that [`render`] printed in
/// one dialect, so that one compiler run builds them all (a run's fixed cost, a C compiler
/// starting or an OpenCL driver parsing its builtin header, is paid once).
///
/// Each part is `(source, entry, renamed)`: the entry function named `entry` (its
/// [`entry_name`]) is defined as `renamed` instead, since two kernels may share a name.
/// What precedes each entry function (includes, pragmas, helper functions: blocks between
/// blank lines, the same text in every source that uses them) is written once per distinct
/// block; the leading comment naming the kernel is dropped. `None` where a source defines
/// no function `entry`.
///
/// ```
/// use tessel_ir::codegen::{self, C};
/// use tessel_ir::samples;
/// use tessel_shape::DType;
///
/// let add = codegen::render(&samples::vector_add(DType::F32, 1000, 64).unwrap(), &C).unwrap();
/// let entry = "tessel_vector_add";
/// let both = codegen::combine(&[(&add, entry, "add_0"), (&add, entry, "add_1")]).unwrap();
/// assert_eq!(both.matches("#include <stdint.h>").count(), 1);
/// assert!(both.contains(" add_0(") && both.contains(" add_1(") && !both.contains(entry));
/// ```
pub fn combine(parts: &[(&str, &str, &str)]) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    let mut preamble = String::new();
    let mut functions = String::new();
    for &(source, entry, renamed) in parts {
        let name = format!(" {entry}(");
        let at = source[..source.find(&name)?]
            .rfind('\n')
            .map_or(0, |n| n + 1);
        let shared = match source[..at].strip_prefix("/*") {
            Some(rest) => &rest[rest.find("*/\n")? + 3..],
            None => &source[..at],
        };
        for block in shared.split("\n\n") {
            let block = block.trim_matches('\n');
            if !block.is_empty() && seen.insert(block) {
                preamble.push_str(block);
                preamble.push_str("\n\n");
            }
        }
        functions.push_str(&source[at..].replacen(&name, &format!(" {renamed}("), 1));
        functions.push('\n');
    }
    Some(preamble + &functions)
}
