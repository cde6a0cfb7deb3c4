//! The C-family dialects, as data.
//!
//! A [`CStyle`] lists everything that differs between C, OpenCL C and CUDA C: how the kernel
//! is entered, qualifiers, the barrier, built-in ids, type names and math-function names.
//! The emitter in [`super`] reads only this table, so a new dialect is a new `const`, plus
//! small hook functions where a name is not a plain string.

use tessel_shape::DType;

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
}

/// C11 for the host compiler: the CPU backend's dialect.
///
/// Needs a compiler invoked with `-fwrapv -ffp-contract=off` and without `-ffast-math`:
/// the emitted code already avoids signed overflow, but contraction into `fma` or fast-math
/// reassociation would change results against the interpreter.
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
};

const C_PRELUDE: &str = "\
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
";

/// The serial launch's loop variables, which [`Launch::Serial`] kernels define.
fn serial_group_id(axis: u8) -> String {
    format!("gid{axis}")
}

fn serial_local_id(axis: u8) -> String {
    format!("lid{axis}")
}

/// C's `<stdint.h>` names; `f16`/`bf16` hold their bits.
pub fn c_type_name(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Bool => "bool",
        DType::U8 => "uint8_t",
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
