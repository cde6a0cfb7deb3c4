//! WGSL for wgpu: the kernel IR printed as one compute shader, plus the host side of its
//! ABI (what to bind where, what goes in the uniform, how many workgroups to dispatch).
//!
//! # ABI
//!
//! - Bind group 0. The `k`-th `Param::Buffer` of the kernel (counting buffers only) is at
//!   `@binding(k)`, `var<storage, read>` when the parameter is read-only, else
//!   `var<storage, read_write>`. Then one `var<uniform>` at binding `buffers.len()`
//!   ([`WgslShader::uniform_binding`]), always present, whose bytes
//!   [`WgslShader::uniform_bytes`] produces.
//! - Buffers hold the same bytes as on the host (little-endian, `bool` one byte 0 or 1,
//!   `f16` and `bf16` two bytes of bits). 32- and 64-bit element types are WGSL arrays of
//!   their own type; 8- and 16-bit element types are packed four or two to a `u32` word
//!   (`array<u32>` when read-only, `array<atomic<u32>>` when written, see below), so the
//!   backend must allocate every buffer rounded up to a multiple of 4 bytes (at least 4).
//! - The uniform is `struct TslUniform { words: array<vec4<u32>, N> }`, read as a flat
//!   array of `u32` words: words 0, 1, 2 are the logical workgroup counts
//!   (`LaunchArgs::grid[0..3]`), word 3 their product, words 4..8 zero (word 4 is read
//!   as an opaque zero, see below), and dim parameter `d` (counting dims only, in
//!   parameter order) is the two words `8 + 2d` (low) and `9 + 2d` (high) of its value as
//!   a 64-bit two's complement integer. [`WgslShader::uniform_size`] is `16 * N`, at
//!   least 32.
//! - Dispatch: the logical workgroups are numbered linearly, x fastest
//!   (`x + groups[0] * (y + groups[1] * z)`), and spread over the dispatch's three axes so
//!   that none exceeds [`WgslShader::max_groups_per_dim`]
//!   ([`WgslShader::dispatch`]); the shader numbers the dispatched workgroups the same
//!   way from `workgroup_id` and `num_workgroups`, rebuilds the logical group id from the
//!   linear number and the logical counts in the uniform, and skips the surplus
//!   workgroups of the last row. The skip is one `if` around the whole body whose
//!   condition is workgroup-uniform (it depends only on `workgroup_id`,
//!   `num_workgroups` and the uniform), so barriers stay in uniform control flow.
//! - One `@compute` entry point, [`entry_name`](super::entry_name)'s name, with the
//!   kernel's local sizes as `@workgroup_size` (they must be constants).
//!
//! # Values
//!
//! - `f32`, `i32`, `u32` and `bool` are native. `u8`/`u16` values are held in `u32` and
//!   `i8`/`i16` in `i32`, always in canonical form (zero- or sign-extended): every op that
//!   can leave the range masks or sign-extends its result again.
//! - `f16` and `bf16` values are their bits in a `u32`; every op converts to `f32` with
//!   exact integer code, computes there and rounds back to nearest even with integer code,
//!   as [`Scalar`](tessel_shape::Scalar) does. WGSL's `f16` type and `pack2x16float` are
//!   not used: the first needs a device feature, the second's rounding is unspecified.
//!   The float8 dtypes are their bits in a `u32` too (packed four to a word in buffers,
//!   like `u8`); they only cast, through `f32` with integer code, move and select.
//! - `i64`/`u64` need [`WgslTarget::int64`] (naga's `i64`/`u64`,
//!   `Capabilities::SHADER_INT64`); `f64` needs both [`WgslTarget::f64`] and
//!   [`WgslTarget::int64`] (naga's `f64`, `Capabilities::FLOAT64`), since NaN tests,
//!   `max`/`min`, `%` and conversions work on its bits. Without them a kernel that uses the
//!   type fails with [`CodegenError::UnsupportedOp`] naming the first op and dtype.
//! - Vectors are `array<T, W>` values, and every op on them is written lane by lane.
//! - Workgroup arrays (`DefineLocal`) and register arrays (`DefineReg`) hold one value per
//!   element in its WGSL type (no packing: 8- and 16-bit locals take 4 bytes an element).
//! - Packed buffers: a load reads the word and extracts the element with a shift and a
//!   mask (sign-extending signed types); a store is `atomicAnd` clearing the element's bits
//!   then `atomicOr` setting them, so stores by different invocations to neighbouring
//!   elements of one word never lose each other's bits.
//!
//! # Semantics
//!
//! Generated code computes what [`Scalar`](tessel_shape::Scalar) computes, with the same
//! guards as the C-family emitter where WGSL differs: integer `/` and `%` go through
//! helpers (`a / 0 == a`, `a % 0 == 0`, `MIN / -1 == MIN`), float `/` (and `1 / x`,
//! `1 / sqrt(x)`) by a zero divisor gives IEEE's result from the bits (NaN for `0 / 0` and
//! `NaN / 0`, else an infinity signed by both signs: WGSL leaves it to the implementation,
//! and Mesa folds `x / 0.0` to zero), shift amounts are masked to the
//! width (WGSL rejects over-wide constant shifts), float-to-integer casts saturate with
//! NaN to 0 explicitly, integer-to-float casts round to nearest even with integer code
//! (WGSL lets an implementation pick either neighbour), float `max`/`min` let NaN win and
//! order `-0 < +0`, `%` on floats is an exact `fmod` (musl's algorithm: WGSL's `%` is
//! `x - y * trunc(x / y)`), `pow` handles C's special cases (zeros, infinities, negative
//! bases) explicitly and calls WGSL's `pow` only on a positive finite base, and every NaN
//! test looks at the bits, since WGSL lets implementations assume no NaN in comparisons
//! (float comparisons are guarded the same way). `erf` on `f32` (and the half types, in
//! `f32`) is fdlibm's `erff` (FreeBSD's coefficients) on WGSL's `exp`; `log` and `log2` are
//! musl's `logf`/`log2f` (WGSL's built-ins are only within an absolute 2^-21 on [0.5, 2],
//! many ulps near 1); `sin`, `cos` and `tan` on `f32` (and the half types, in `f32`) reduce
//! the argument by π/2 with a Payne–Hanek reduction in 32-bit integer arithmetic (192 bits
//! of 2/π, a 64-bit fraction times π/2, so exact enough at every |x| up to `f32::MAX`)
//! and evaluate Cephes' `sinf`/`cosf`/`tanf` polynomials on [-π/4, π/4] (`tan` takes
//! `-1 / tan` in the odd quadrants), NaN for infinities, `x` (`1` for `cos`) below
//! |x| = 2^-12, signed zeros and subnormals included; `tanh` is a Taylor polynomial below
//! |x| = 1/8, where `tanh` built
//! from `exp` cancels. `mad` on `f32`/`f64` with finite factors and an infinite addend is
//! the addend (an `fma` rounding the product first may overflow it into `inf - inf`).
//!
//! Products are never fused with the sums they feed: naga marks no SPIR-V `NoContraction`,
//! and NVIDIA's compiler contracts a float multiply feeding an add into one `fma`, rounding
//! once where the reference rounds twice. So every float `*` (on `f32` and `f64`, and in
//! `f32` for the half types) is written `tsl_opaque_T(a * b)`: the XOR of the product's bits
//! with the uniform's zero word (word 4), one integer operation that no compiler can see
//! through, which makes `a * b + c` two roundings on every device (the conformance check
//! `products_and_sums_are_not_fused` holds on wgpu). Only `mad` fuses. The helpers' own
//! products are either exact (the half types' `mad`, `log2`'s split constant), where a
//! contraction changes nothing, or inside functions with an ulp bound anyway (`erf`,
//! `log`, `tanh`'s polynomial, `sin`/`cos`/`tan`'s polynomials: their range reduction is
//! integer arithmetic, with no float error-free step a compiler could contract).
//!
//! Subnormals: WGSL lets a device flush `f32` (and `f64`) subnormal operands and results of
//! float operations to zero, and NVIDIA's Vulkan driver does (lavapipe does only in its
//! built-ins). Where that is cheap to avoid, the emitter does no float arithmetic on values
//! that may be subnormal: negation and `abs` (of every float type) flip or clear the sign
//! bit, `sign` is built on the bits, `max`/`min` order the bits as integers (a flushed
//! comparison would pick the wrong one of two subnormals), `f32` to `f64` and `f64` to
//! `f32` (nearest even, or to odd on the way to a half type) are integer code, and so are
//! the half types' conversions (a `bf16` subnormal is an `f32` subnormal, widened to `f64`
//! exactly for `bf16`'s `mad`). Float `/` by a divisor of magnitude `2^126` (`f64`:
//! `2^1022`) or more scales both by `2^-8` first, since a device computing `a * (1 / b)`
//! flushes the subnormal reciprocal (WGSL bounds `/` only for smaller divisors). The rest
//! (`+`, `-`, `*`, `/`, comparisons, `sqrt`, the transcendentals, rounding) may flush; the
//! wgpu backend reports it with
//! [`Features::subnormals_may_flush`](crate::Features::subnormals_may_flush).
//! `mad` on `f16` rounds once, exactly, in
//! `f32` (the product of two `f16` values is exact there; the sum is rounded to odd with
//! its error, then to `f16`). Two more precautions, both found on Mesa's lavapipe: float
//! results whose sign of zero matters (`sign`) are built on the bits, since Vulkan drivers
//! need not keep signed zeros through float operations; and the two-sum's error terms go
//! through an XOR with the uniform's zero word, which compilers cannot see through, since
//! naga marks no operation exact and Mesa rewrites `s - (s - p)` to `p`. Also for
//! lavapipe: `i32` to `i64`/`u64` sign extension is spelled out with 32-bit operations
//! (lavapipe answered every signed comparison of WGSL's `i64(x)` with false), and `exp`,
//! `exp2` and `pow` reach subnormal results as the square of the function at half the
//! exponent (lavapipe's built-ins flush them to zero), `pow` of a subnormal base through
//! `log2`.
//!
//! Differences that remain, which WGSL gives no way around:
//!
//! - Float `/`, `sqrt`, `1 / sqrt` are within WGSL's bounds (2.5 ulp for `/`), not
//!   correctly rounded; `exp`, `exp2`, `tanh` (from 1/8 on) and the positive-base `pow`
//!   are WGSL's built-ins, within their (loose) bounds: `exp` and `exp2` 3 + 2|x| ulps,
//!   `pow` inherited from `exp2(y * log2(x))`. `erf`, `log` and `log2` are within a few
//!   ulps (they use WGSL's `/` and `exp`); `sin` and `cos` within 1 ulp and `tan` 2 (its
//!   odd quadrants use WGSL's `/`) at every |x| (measured; the conformance test allows 2).
//!   Results on `f16`/`bf16` are those `f32` results rounded.
//! - `mad` on `f32` and `f64` is WGSL's `fma`, which GPUs compute fused, but which
//!   WGSL's accuracy rules allow to round twice (lavapipe does).
//! - Devices may flush `f32` (and `f64`) subnormal operands and results of float
//!   arithmetic, comparisons and built-ins to zero (NVIDIA's Vulkan driver does; lavapipe's
//!   built-ins do, which the `exp`/`log`/`pow` helpers above work around; its arithmetic
//!   does not). Bit-level work, negation, `abs`, `sign`, `max`/`min`, and casts between
//!   float types stay exact (see above); a subnormal result of `exp`, `/` or `*` (e.g.
//!   `sigmoid(-100)`, 3.7e-44) may come back as zero, and a subnormal operand count as
//!   zero.
//!
//! Not supported, with [`CodegenError::UnsupportedOp`]:
//!
//! - `erf` on `f64`: fdlibm's `erf` needs an `f64` `exp`, and WGSL has none that backends
//!   can lower (see the next point).
//! - `exp`, `exp2`, `log`, `log2`, `sin`, `cos`, `tan`, `tanh` and `pow` on `f64`: naga's
//!   validator accepts them, but SPIR-V's `GLSL.std.450` versions are defined for 16- and
//!   32-bit floats only (and HLSL and MSL have none), so no backend can run them.
//! - `mad` on `bf16` without `f64`: it rounds once only through `f64` (the product of two
//!   `bf16` values may underflow `f32`).
//! - Symbolic local sizes ([`CodegenError::Unsupported`]): `@workgroup_size` must be
//!   a constant here, and so must fit [`WgslTarget::max_invocations`].
//!
//! naga 30's validator does not check that barriers are in uniform control flow; the
//! emitted code keeps them where the IR verifier proved them uniform. A barrier inside a
//! block whose bound or condition was loaded from a `read_write` buffer or workgroup
//! memory is uniform by the verifier's rules but not by the WGSL specification's analysis,
//! which a stricter compiler (Tint) would reject.

mod emit;
mod exact;
mod helpers;
mod ops;
mod trig;

use tessel_shape::DType;

use super::CodegenError;
use crate::kernel::Kernel;
use crate::launch::LaunchArgs;

/// The dialect name in errors.
const DIALECT: &str = "wgsl";

/// Words of the uniform before the dims: the three logical group counts, their product, a
/// zero the shader's compiler cannot know is zero, and three reserved zeros.
const HEADER_WORDS: usize = 8;

/// The uniform word that is always zero (see [`HEADER_WORDS`]).
const ZERO_WORD: usize = 4;

/// What the target device supports, which decides how (and whether) a kernel renders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgslTarget {
    /// `wgpu::Features::SHADER_F64`: `f64` values and buffers (together with `int64`).
    pub f64: bool,
    /// `wgpu::Features::SHADER_INT64`: `i64`/`u64` values and buffers.
    pub int64: bool,
    /// The most workgroups per dispatch dimension (`max_compute_workgroups_per_dimension`).
    pub max_groups_per_dim: u32,
    /// The most invocations per workgroup (`max_compute_invocations_per_workgroup`).
    pub max_invocations: u32,
}

/// One buffer binding of a shader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslBuffer {
    /// The `@binding` number.
    pub binding: u32,
    /// Whether the shader only reads it (`var<storage, read>`).
    pub read_only: bool,
    /// The element dtype of the kernel parameter.
    pub dtype: DType,
}

/// A rendered shader and the host side of its ABI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslShader {
    /// The WGSL source.
    pub source: String,
    /// The compute entry point's name.
    pub entry_point: String,
    /// `@workgroup_size`.
    pub workgroup_size: [u32; 3],
    /// The buffer bindings, in kernel buffer-parameter order.
    pub buffers: Vec<WgslBuffer>,
    /// The binding of the uniform buffer.
    pub uniform_binding: u32,
    /// The uniform buffer's size in bytes (a multiple of 16).
    pub uniform_size: u32,
    /// The target's per-dimension workgroup limit the shader was rendered for.
    pub max_groups_per_dim: u32,
}

impl WgslShader {
    /// The uniform buffer's contents for one launch (see the module docs for the layout):
    /// `uniform_size` bytes.
    pub fn uniform_bytes(&self, args: &LaunchArgs) -> Vec<u8> {
        let mut words = vec![0u32; (self.uniform_size as usize / 4).max(HEADER_WORDS)];
        // Counts past u32 never launch: `dispatch` rejects them.
        for (word, &groups) in words.iter_mut().zip(&args.grid[..3]) {
            *word = groups as u32;
        }
        words[3] = args.groups as u32;
        for (d, &value) in args.dims.iter().enumerate() {
            let at = HEADER_WORDS + 2 * d;
            if at + 1 < words.len() {
                words[at] = value as u32;
                words[at + 1] = (value >> 32) as u32;
            }
        }
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.resize(self.uniform_size as usize, 0);
        bytes
    }

    /// The workgroup counts to dispatch for one launch (each at most
    /// `max_groups_per_dim`; `[0, 0, 0]` when the grid is empty).
    ///
    /// The logical workgroups are spread over the axes as evenly as the limit allows: `y * z`
    /// rows of `x` workgroups, with fewer than `y * z` surplus workgroups in all. Fails when
    /// the local sizes differ from the shader's, or when the workgroups cannot be numbered
    /// in a `u32` or do not fit `max_groups_per_dim` cubed.
    pub fn dispatch(&self, args: &LaunchArgs) -> Result<[u32; 3], CodegenError> {
        let fail = |reason: String| CodegenError::Unsupported {
            kernel: self.entry_point.clone(),
            dialect: DIALECT,
            reason,
        };
        let local = [args.grid[3], args.grid[4], args.grid[5]];
        if local != self.workgroup_size.map(i64::from) {
            return Err(fail(format!(
                "the launch's local sizes {local:?} differ from the shader's workgroup size {:?}",
                self.workgroup_size
            )));
        }
        let total = args.groups;
        if total == 0 {
            return Ok([0, 0, 0]);
        }
        let Ok(total) = u32::try_from(total) else {
            return Err(fail(format!(
                "{total} workgroups {:?} cannot be numbered in a u32; launch fewer, larger ones",
                &args.grid[..3]
            )));
        };
        let max = u64::from(self.max_groups_per_dim.max(1));
        let total = u64::from(total);
        let rows = total.div_ceil(max);
        let x = total.div_ceil(rows);
        let y = rows.min(max);
        let z = rows.div_ceil(y);
        if z > max || x * y * z > u64::from(u32::MAX) {
            return Err(fail(format!(
                "{total} workgroups do not fit a dispatch of at most {max} per dimension"
            )));
        }
        Ok([x as u32, y as u32, z as u32])
    }
}

/// Renders `kernel` as a WGSL compute shader for `target`, after verifying it.
///
/// ```
/// use tessel_ir::codegen::{WgslTarget, render_wgsl};
/// use tessel_ir::samples;
/// use tessel_shape::DType;
///
/// let target = WgslTarget { f64: false, int64: false, max_groups_per_dim: 65535, max_invocations: 256 };
/// let kernel = samples::vector_add(DType::F32, 1000, 64).unwrap();
/// let shader = render_wgsl(&kernel, &target).unwrap();
/// assert_eq!(shader.workgroup_size, [64, 1, 1]);
/// assert_eq!(shader.uniform_binding, 3);
/// assert!(shader.source.contains("@compute @workgroup_size(64, 1, 1)"));
/// ```
pub fn render_wgsl(kernel: &Kernel, target: &WgslTarget) -> Result<WgslShader, CodegenError> {
    let defs = crate::verify::verify(kernel)?;
    emit::Emitter::new(kernel, defs, target)?.render()
}
