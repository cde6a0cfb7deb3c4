//! The C-family dialects, as data.
//!
//! A [`CStyle`] lists everything that differs between C, OpenCL C and CUDA C: how the kernel
//! is entered, qualifiers, the barrier, built-in ids, type names and math-function names.
//! The emitter in [`super`] reads only this table, so a new dialect is a new `const`, plus
//! small hook functions where a name is not a plain string.

use tessel_shape::DType;

use crate::kernel::AtomicOp;

/// How a dialect runs workgroups and their invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// The device runs every invocation itself (GPUs): the kernel is written for one
    /// invocation, with the dialect's built-in ids and barrier, and one parameter per
    /// kernel parameter.
    Native,
    /// The host runs a range of workgroups, one invocation after another (the CPU).
    ///
    /// The kernel is one C function with the fixed signature
    /// `void name(void *const *bufs, const int64_t *dims, const int64_t *grid,
    /// int64_t group_begin, int64_t group_end)`:
    ///
    /// - `bufs`: the buffer parameters' base pointers, in parameter order;
    /// - `dims`: the values of the `Param::Dim`s, in parameter order, as `int64_t`;
    /// - `grid`: `groups[0..3]` then `local[0..3]`, evaluated at launch;
    /// - `[group_begin, group_end)`: the workgroups to run, linearly numbered with x
    ///   fastest (`linear = x + groups[0] * (y + groups[1] * z)`).
    ///
    /// Invocations become loops; see the [module docs](super) for barriers.
    Serial,
}

/// A C-family dialect, as data: everything that differs between C, OpenCL C and CUDA C
/// (how the kernel is entered, qualifiers, the barrier, built-in ids, type names and
/// math-function names). The emitter reads only this table, so a new dialect is a new
/// `const`, plus small hook functions where a name is not a plain string.
///
/// Every field is public so that a dialect can be written as a struct update of another:
/// `CStyle { name: "my-c", prelude: MY_PRELUDE, ..C }`.
#[derive(Clone, Copy, Debug)]
pub struct CStyle {
    /// The dialect's name, used in errors (`"c"`, `"opencl"`, `"cuda"`).
    pub name: &'static str,
    /// How workgroups and invocations run.
    pub launch: Launch,
    /// Text at the top of every source: includes, pragmas, typedefs.
    pub prelude: &'static str,
    /// Written in front of every helper function (`"static inline "`).
    pub helper_prefix: &'static str,
    /// Written in front of the kernel function (`"__kernel "`, `"extern \"C\" __global__ "`).
    pub kernel_prefix: &'static str,
    /// The address-space qualifier of buffer parameters (`""`, `"__global "`).
    pub buffer_qualifier: &'static str,
    /// The qualifier of workgroup-local arrays (`""`, `"__local "`, `"__shared__ "`).
    pub local_qualifier: &'static str,
    /// The workgroup barrier statement (unused by [`Launch::Serial`], whose invocations
    /// reach every barrier in order by construction).
    pub barrier: &'static str,
    /// The expression for the workgroup id along an axis (0, 1 or 2).
    pub group_id: fn(u8) -> String,
    /// The expression for the invocation's id within its workgroup along an axis.
    pub local_id: fn(u8) -> String,
    /// The name of the type that holds one value of a dtype, or `None` if the dialect has
    /// none (an `f64` on a device without doubles). `f16` and `bf16` values are held as
    /// their 16-bit patterns in an unsigned integer type and computed on in `float`.
    pub type_name: fn(DType) -> Option<&'static str>,
    /// The type buffers of `bool` are stored as (a byte holding 0 or 1); loads compare it
    /// with zero, so a dialect whose `bool` has no fixed size still reads them right.
    pub bool_storage: &'static str,
    /// Appended to a math function's name for `f32` (`"f"` in C: `sqrtf`; `""` in OpenCL).
    pub f32_math_suffix: &'static str,
    /// Appended to a math function's name for `f64`.
    pub f64_math_suffix: &'static str,
    /// Built-in `f16` conversions, where the dialect has them (OpenCL C's
    /// `vload_half`/`vstore_half_rte`); `None` uses the portable bit-manipulating helpers.
    /// Either way `f16` values are held as bits and computed on in `float`.
    pub f16_builtins: Option<HalfBuiltins>,
    /// Built-in `bf16` conversions, where the dialect has them (CUDA's `cvt.rn.bf16.f32`
    /// on `sm_80` and later); `None` uses the portable helpers. The bits are the same,
    /// NaN payloads aside.
    pub bf16_builtins: Option<HalfBuiltins>,
    /// `erf` on `f32` (and `f16`/`bf16`, computed in `float`) is the dialect's own
    /// (`erff`, OpenCL C's `erf`), within its documented ulp bound, like the dialect's other
    /// transcendentals; else it is the reference's: fdlibm's `erf` in `double`, rounded once,
    /// bit-identical to the interpreter but an order of magnitude slower on a GPU (GELU).
    pub native_f32_erf: bool,
    /// Signed `int32_t`/`int64_t` arithmetic wraps in this dialect (C compiled with
    /// `-fwrapv`), so `+ - *` on them are written plainly instead of through the unsigned
    /// type: the loop vectorizer then sees the indices as affine in the loop counter.
    pub signed_wraps: bool,
    /// `exp`, `exp2`, `log`, `log2` and `tanh` on `float` are Tessel's branch-free helpers
    /// (`tsl_expf`, ...: at most 2 ulps from the exact value), which a C compiler
    /// vectorizes, instead of the math library's scalar calls, which it cannot.
    pub own_f32_math: bool,
    /// The statement combining `value` atomically by an op into the element `at` points
    /// to, for a dtype (`None` where the dialect has no such atomic of that width).
    pub atomic: fn(op: AtomicOp, dtype: DType, at: &str, value: &str) -> Option<String>,
    /// The attribute aligning a struct to a number of bytes (`__align__(16)`), where the
    /// dialect reads and writes a whole vector in one instruction through an aligned
    /// pointer: vector typedefs are then aligned to their size (at most 16 bytes), global
    /// accesses of vectors at indices proven to be multiples of that alignment go through
    /// such a pointer, and kernels first run [`passes::vectorize`](crate::passes::vectorize).
    /// `None` writes every lane as its own access (C, where the compiler's loop vectorizer
    /// does better with scalars).
    pub vector_align: Option<fn(usize) -> String>,
}

/// The bodies of the two `f16` conversion helpers, for a dialect with built-in conversions.
///
/// Both must be exact where [`Scalar`](tessel_shape::Scalar) is: `f16` to `float` is exact
/// for every value, and `float` to `f16` rounds to nearest, ties to even (NaN payloads
/// may differ, as they may between any two IEEE implementations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HalfBuiltins {
    /// The body of `float tsl_f16_to_f32(U16 h)`, where `U16` is the dialect's name for
    /// `u16` and `h` holds the bits.
    pub to_f32: &'static str,
    /// The body of `U16 tsl_f32_to_f16(float value)`, returning the bits of `value` rounded
    /// to nearest even.
    pub from_f32: &'static str,
}

/// C11 for the host compiler: the CPU backend's dialect.
///
/// Needs a compiler invoked with `-fwrapv -ffp-contract=off` and without `-ffast-math`:
/// signed `int32_t`/`int64_t` arithmetic is written plainly and must wrap, and contraction
/// into `fma` or fast-math reassociation would change results against the interpreter.
pub const C: CStyle = CStyle {
    name: "c",
    launch: Launch::Serial,
    prelude: C_PRELUDE,
    helper_prefix: "static inline ",
    kernel_prefix: "",
    buffer_qualifier: "",
    local_qualifier: "",
    barrier: "",
    group_id: serial_group_id,
    local_id: serial_local_id,
    type_name: c_type_name,
    bool_storage: "uint8_t",
    f32_math_suffix: "f",
    f64_math_suffix: "",
    f16_builtins: None,
    bf16_builtins: None,
    // The CPU keeps the reference's bits.
    native_f32_erf: false,
    signed_wraps: true,
    own_f32_math: true,
    atomic: c_atomic,
    vector_align: None,
};

/// GCC's and Clang's `__atomic` built-ins: integers add directly (wrapping), floats loop
/// on a compare-and-swap of the whole value, and so does the unsigned maximum (GCC has no
/// `__atomic_fetch_max`), which stops as soon as the element is no smaller.
fn c_atomic(op: AtomicOp, dtype: DType, at: &str, value: &str) -> Option<String> {
    if op == AtomicOp::Max {
        let ty = match dtype {
            DType::U32 => "uint32_t",
            DType::U64 => "uint64_t",
            _ => return None,
        };
        return Some(format!(
            "{{ {ty} *tsl_at = {at}; {ty} tsl_new = ({value}); \
             {ty} tsl_old = __atomic_load_n(tsl_at, __ATOMIC_RELAXED); \
             while (tsl_old < tsl_new && !__atomic_compare_exchange_n(tsl_at, &tsl_old, tsl_new, \
             1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {{}} }}"
        ));
    }
    let float = match dtype {
        DType::I32 | DType::U32 | DType::I64 | DType::U64 => {
            return Some(format!(
                "__atomic_fetch_add({at}, {value}, __ATOMIC_RELAXED);"
            ));
        }
        DType::F32 => "float",
        DType::F64 => "double",
        _ => return None,
    };
    Some(format!(
        "{{ {float} *tsl_at = {at}; {float} tsl_old, tsl_new; \
         __atomic_load(tsl_at, &tsl_old, __ATOMIC_RELAXED); \
         do {{ tsl_new = tsl_old + ({value}); }} while (!__atomic_compare_exchange(tsl_at, \
         &tsl_old, &tsl_new, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)); }}"
    ))
}

/// `<math.h>`'s names that C kernels use, declared here (the libm functions, which GCC and
/// Clang know as builtins) or defined through the compilers' builtins, as glibc's header
/// does: parsing the header is a fifth of a small kernel's compile. The CPU backend compiles
/// with `-Werror=implicit-function-declaration`, so a name missing here fails the build
/// instead of being called with the wrong types.
const C_PRELUDE: &str = r#"#include <stdbool.h>
#include <stdint.h>
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define isinf(x) __builtin_isinf(x)
#define isnan(x) __builtin_isnan(x)
#define isfinite(x) __builtin_isfinite(x)
#define signbit(x) __builtin_signbit(x)
double fabs(double); float fabsf(float);
double sqrt(double); float sqrtf(float);
double cbrt(double); float cbrtf(float);
double exp(double); float expf(float);
double exp2(double); float exp2f(float);
double expm1(double); float expm1f(float);
double log(double); float logf(float);
double log2(double); float log2f(float);
double log10(double); float log10f(float);
double log1p(double); float log1pf(float);
double sin(double); float sinf(float);
double cos(double); float cosf(float);
double tan(double); float tanf(float);
double asin(double); float asinf(float);
double acos(double); float acosf(float);
double atan(double); float atanf(float);
double sinh(double); float sinhf(float);
double cosh(double); float coshf(float);
double tanh(double); float tanhf(float);
double erf(double); float erff(float);
double erfc(double); float erfcf(float);
double floor(double); float floorf(float);
double ceil(double); float ceilf(float);
double rint(double); float rintf(float);
double round(double); float roundf(float);
double trunc(double); float truncf(float);
double nearbyint(double); float nearbyintf(float);
double fmod(double, double); float fmodf(float, float);
double remainder(double, double); float remainderf(float, float);
double pow(double, double); float powf(float, float);
double atan2(double, double); float atan2f(float, float);
double hypot(double, double); float hypotf(float, float);
double copysign(double, double); float copysignf(float, float);
double fmax(double, double); float fmaxf(float, float);
double fmin(double, double); float fminf(float, float);
double fma(double, double, double); float fmaf(float, float, float);
"#;

/// The serial launch's loop variables, which [`Launch::Serial`] kernels define.
fn serial_group_id(axis: u8) -> String {
    format!("gid{axis}")
}

fn serial_local_id(axis: u8) -> String {
    format!("lid{axis}")
}

/// C's `<stdint.h>` names; `f16`/`bf16` and the float8 dtypes hold their bits.
pub fn c_type_name(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Bool => "bool",
        DType::U8 | DType::F8E4M3 | DType::F8E5M2 => "uint8_t",
        DType::U16 | DType::F16 | DType::BF16 => "uint16_t",
        DType::U32 => "uint32_t",
        DType::U64 => "uint64_t",
        DType::I8 => "int8_t",
        DType::I16 => "int16_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        DType::F32 => "float",
        DType::F64 => "double",
    })
}

/// OpenCL C 1.2 for a device with `cl_khr_fp64`: one work-item per invocation
/// ([`Launch::Native`]).
///
/// - Kernels are `__kernel` functions taking the buffer parameters (`__global`) in order,
///   then the dims by value in their dtype; workgroup-local arrays are `__local`, the
///   barrier is `barrier(CLK_LOCAL_MEM_FENCE)`, and ids come from `get_group_id` and
///   `get_local_id`. The host launches global size `groups * local` with local size
///   `local` on each axis, so `get_group_id` is the IR's workgroup id.
/// - Types are OpenCL C's (`uchar` .. `ulong`, `char` .. `long`; 64-bit integers are
///   core). `bool` has no defined size in OpenCL C, so `bool` buffers are `uchar`.
/// - `f16` and `bf16` are held as `ushort` bits and computed on in `float`, rounding back
///   after every op exactly as the C dialect does. `f16` converts with `vload_half` and
///   `vstore_half_rte` on a private variable (the device's conversion instructions, which
///   need no `cl_khr_fp16`); `bf16` uses the portable helpers.
/// - The prelude turns `FP_CONTRACT` off (OpenCL C defaults it on, which would fuse
///   `a * b + c` into a single rounding the reference does not do) and enables
///   `cl_khr_fp64`.
///
/// The host must build with `-cl-fp32-correctly-rounded-divide-sqrt` (OpenCL's `/` and
/// `sqrt` on `float` may otherwise be off by up to 3 ulp) and never with
/// `-cl-fast-relaxed-math`, `-cl-mad-enable`, `-cl-unsafe-math-optimizations` or
/// `-cl-denorms-are-zero`. Built-in transcendentals (`exp`, `sin`, `pow`, ...) are within
/// the OpenCL specification's ulp bounds, not bit-identical to the host's libm.
pub const OPENCL: CStyle = CStyle {
    name: "opencl",
    launch: Launch::Native,
    prelude: OPENCL_PRELUDE,
    // `static` is allowed on functions from OpenCL C 1.2 on; plain `inline` would have C99's
    // meaning, which needs an external definition when a call is not inlined.
    helper_prefix: "static inline ",
    kernel_prefix: "__kernel ",
    buffer_qualifier: "__global ",
    local_qualifier: "__local ",
    barrier: "barrier(CLK_LOCAL_MEM_FENCE);",
    group_id: opencl_group_id,
    local_id: opencl_local_id,
    type_name: opencl_type_name,
    bool_storage: "uchar",
    // OpenCL C's math functions are overloaded on `float` and `double`.
    f32_math_suffix: "",
    f64_math_suffix: "",
    f16_builtins: Some(OPENCL_HALF),
    bf16_builtins: None,
    // OpenCL C's `erf` on `float`: 16 ulp at most (OpenCL C 1.2, 7.4), no `double` needed.
    native_f32_erf: true,
    signed_wraps: false,
    own_f32_math: false,
    atomic: opencl_atomic,
    vector_align: Some(opencl_align),
};

fn opencl_align(bytes: usize) -> String {
    format!("__attribute__((aligned({bytes}))) ")
}

/// OpenCL C 1.2's 32-bit atomics: `atomic_add` and `atomic_max` on integers, a loop on
/// `atomic_cmpxchg` of the bits for `float`. The 64-bit ones are `cl_khr_int64_base_atomics`'
/// `atom_add` and `atom_cmpxchg` and `cl_khr_int64_extended_atomics`' `atom_max`, which a
/// kernel uses only on a device that has both (`Features::atomics64`).
fn opencl_atomic(op: AtomicOp, dtype: DType, at: &str, value: &str) -> Option<String> {
    let cas_add = |word: &str, cmpxchg: &str, as_word: &str, as_float: &str| {
        format!(
            "{{ volatile __global {word} *tsl_at = (volatile __global {word} *)({at}); \
             {word} tsl_old = *tsl_at, tsl_seen; do {{ tsl_seen = tsl_old; \
             tsl_old = {cmpxchg}(tsl_at, tsl_seen, {as_word}({as_float}(tsl_seen) + ({value}))); \
             }} while (tsl_old != tsl_seen); }}"
        )
    };
    Some(match (op, dtype) {
        (AtomicOp::Add, DType::I32) => {
            format!("atomic_add((volatile __global int *)({at}), {value});")
        }
        (AtomicOp::Add, DType::U32) => {
            format!("atomic_add((volatile __global uint *)({at}), {value});")
        }
        (AtomicOp::Add, DType::I64) => {
            format!("atom_add((volatile __global long *)({at}), {value});")
        }
        (AtomicOp::Add, DType::U64) => {
            format!("atom_add((volatile __global ulong *)({at}), {value});")
        }
        (AtomicOp::Add, DType::F32) => cas_add("uint", "atomic_cmpxchg", "as_uint", "as_float"),
        (AtomicOp::Add, DType::F64) => cas_add("ulong", "atom_cmpxchg", "as_ulong", "as_double"),
        (AtomicOp::Max, DType::U32) => {
            format!("atomic_max((volatile __global uint *)({at}), {value});")
        }
        (AtomicOp::Max, DType::U64) => {
            format!("atom_max((volatile __global ulong *)({at}), {value});")
        }
        _ => return None,
    })
}

/// [`OPENCL`] for a device without `cl_khr_fp64`: `f64` has no type, so any kernel that
/// needs `double` fails to render with [`CodegenError::UnsupportedOp`](super::CodegenError)
/// naming the op and dtype. That includes ops the reference computes through `f64` on other
/// dtypes: `mad` on `f16`/`bf16` (`erf` uses OpenCL C's own).
pub const OPENCL_NO_FP64: CStyle = CStyle {
    name: "opencl-no-fp64",
    prelude: OPENCL_NO_FP64_PRELUDE,
    type_name: opencl_type_name_no_fp64,
    ..OPENCL
};

/// Enables the 64-bit atomics a device has; kernels use them only where
/// `Features::atomics64` says both extensions are there.
macro_rules! opencl_int64_atomics {
    () => {
        "\
#ifdef cl_khr_int64_base_atomics
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
#endif
#ifdef cl_khr_int64_extended_atomics
#pragma OPENCL EXTENSION cl_khr_int64_extended_atomics : enable
#endif
"
    };
}

const OPENCL_PRELUDE: &str = concat!(
    "#pragma OPENCL FP_CONTRACT OFF\n#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n",
    opencl_int64_atomics!()
);

const OPENCL_NO_FP64_PRELUDE: &str =
    concat!("#pragma OPENCL FP_CONTRACT OFF\n", opencl_int64_atomics!());

/// `f16` through the half-precision load and store built-ins, which OpenCL C 1.2 has
/// without `cl_khr_fp16`; `half` may only be used as a pointee there, so the bits go through
/// a private `ushort`.
const OPENCL_HALF: HalfBuiltins = HalfBuiltins {
    to_f32: "return vload_half(0, (const half *)&h);",
    from_f32: "ushort h;\n    vstore_half_rte(value, 0, (half *)&h);\n    return h;",
};

/// `bf16` on CUDA: a widening shift, and `cvt.rn.bf16.f32` (one instruction, round to
/// nearest even, from `sm_80` on) instead of the portable helper's integer rounding, which
/// made bf16 elementwise kernels compute-bound (a fused 8-op chain ran at 600 GB/s on the
/// H200). Before `sm_80` the portable rounding.
const CUDA_BF16: HalfBuiltins = HalfBuiltins {
    to_f32: "union { unsigned int u; float f; } c;\n    c.u = ((unsigned int)h) << 16;\n    return c.f;",
    from_f32: "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short r;
    asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(r) : \"f\"(value));
    return r;
#else
    union { float f; unsigned int u; } c;
    c.f = value;
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((c.u >> 16) | 0x0040u);
    return (unsigned short)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
#endif",
};

fn opencl_group_id(axis: u8) -> String {
    format!("get_group_id({axis})")
}

fn opencl_local_id(axis: u8) -> String {
    format!("get_local_id({axis})")
}

/// OpenCL C's scalar type names; `f16`/`bf16` and the float8 dtypes hold their bits.
pub fn opencl_type_name(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Bool => "bool",
        DType::U8 | DType::F8E4M3 | DType::F8E5M2 => "uchar",
        DType::U16 | DType::F16 | DType::BF16 => "ushort",
        DType::U32 => "uint",
        DType::U64 => "ulong",
        // OpenCL C's `char` is signed, unlike C's.
        DType::I8 => "char",
        DType::I16 => "short",
        DType::I32 => "int",
        DType::I64 => "long",
        DType::F32 => "float",
        DType::F64 => "double",
    })
}

fn opencl_type_name_no_fp64(dtype: DType) -> Option<&'static str> {
    if dtype == DType::F64 {
        None
    } else {
        opencl_type_name(dtype)
    }
}

/// CUDA C++ as NVRTC compiles it: one CUDA thread per invocation ([`Launch::Native`]).
///
/// - Kernels are `extern "C" __global__` functions (C linkage, so the host finds them by
///   [`entry_name`](super::entry_name)) taking the buffer parameters as plain pointers in
///   order (`const` when read-only), then the dims by value in their dtype. Never
///   `__restrict__`: the runtime may bind one buffer to two parameters.
/// - The host launches `groups` blocks of `local` threads, so `blockIdx` and `threadIdx`
///   are the IR's workgroup and local ids; workgroup-local arrays are `__shared__`, the
///   barrier is `__syncthreads()`.
/// - NVRTC has no C library headers, so the prelude typedefs the fixed-width integer types
///   itself (`long long` is 64 bits on every CUDA platform) and defines `INFINITY` from its
///   bits where no header did. `bool` is C++'s; `bool` buffers are bytes.
/// - Math functions are CUDA's device built-ins, named as in C (`sqrtf`, `sqrt`).
///   `f16`/`bf16` are held as `unsigned short` bits and computed on in `float` through the
///   portable helpers (exact, and no `cuda_fp16.h` needed); `f64` and 64-bit integers are
///   native.
/// - Helpers are `static __device__ __forceinline__` functions: device code may call only
///   `__device__` functions, and `static` keeps them out of the module's symbol table.
/// - Signed overflow: CUDA C++ has no `-fwrapv`, but the emitted code never overflows a
///   signed type (integer `+ - * neg mad` and left shifts run in unsigned types; division,
///   remainder and float-to-integer casts are guarded), so it needs none.
///
/// The host must compile with `--fmad=false` (NVRTC contracts `a * b + c` into an `fma` by
/// default, one rounding where the reference does two) and never with `--use_fast_math`;
/// `--ftz=false --prec-div=true --prec-sqrt=true` (NVRTC's defaults) keep subnormals and
/// correctly rounded `float` `/` and `sqrtf`. Then every op is bit-identical to the
/// interpreter except CUDA's transcendentals (`exp`, `exp2`, `log`, `log2`, `sin`, `cos`,
/// `tan`, `tanh`, `pow`, `erff`, and `f64` `erf` through `exp`), which are within the ulp
/// bounds of the CUDA C++ Programming Guide.
pub const CUDA: CStyle = CStyle {
    name: "cuda",
    launch: Launch::Native,
    prelude: CUDA_PRELUDE,
    helper_prefix: "static __device__ __forceinline__ ",
    kernel_prefix: "extern \"C\" __global__ ",
    buffer_qualifier: "",
    local_qualifier: "__shared__ ",
    barrier: "__syncthreads();",
    group_id: cuda_group_id,
    local_id: cuda_local_id,
    type_name: c_type_name,
    bool_storage: "uint8_t",
    f32_math_suffix: "f",
    f64_math_suffix: "",
    f16_builtins: None,
    bf16_builtins: Some(CUDA_BF16),
    // `erff`: 2 ulp at most (CUDA C++ Programming Guide, mathematical functions).
    native_f32_erf: true,
    signed_wraps: false,
    own_f32_math: false,
    atomic: cuda_atomic,
    vector_align: Some(cuda_align),
};

fn cuda_align(bytes: usize) -> String {
    format!("__align__({bytes}) ")
}

/// CUDA's `atomicAdd` and `atomicMax` overloads (`double` adds need `sm_60`, which every
/// supported device has); 64-bit integers add through the `unsigned long long` overload,
/// which wraps the same way.
fn cuda_atomic(op: AtomicOp, dtype: DType, at: &str, value: &str) -> Option<String> {
    match (op, dtype) {
        (AtomicOp::Add, DType::F32 | DType::F64 | DType::I32 | DType::U32 | DType::U64)
        | (AtomicOp::Max, DType::U32 | DType::U64) => Some(format!(
            "atomic{}({at}, {value});",
            if op == AtomicOp::Add { "Add" } else { "Max" }
        )),
        (AtomicOp::Add, DType::I64) => Some(format!(
            "atomicAdd((unsigned long long *)({at}), (unsigned long long)({value}));"
        )),
        _ => None,
    }
}

/// NVRTC compiles without the C library's headers: the `<stdint.h>` names are defined here
/// (the same types `<stdint.h>` gives on every platform CUDA supports), and `INFINITY`,
/// which `<math.h>` would define, from its bits.
const CUDA_PRELUDE: &str = "\
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
";

fn cuda_group_id(axis: u8) -> String {
    format!("blockIdx.{}", axis_letter(axis))
}

fn cuda_local_id(axis: u8) -> String {
    format!("threadIdx.{}", axis_letter(axis))
}

fn axis_letter(axis: u8) -> char {
    match axis {
        0 => 'x',
        1 => 'y',
        _ => 'z',
    }
}
