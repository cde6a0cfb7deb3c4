//! Rust element types and their dtypes.

use half::{bf16, f16};
use tessel_shape::{DType, F8E4M3, F8E5M2, Scalar};

/// A Rust type that can be a tensor element: `bool`, the integer types, the float8 types
/// ([`F8E4M3`], [`F8E5M2`]), `f16`, `bf16`, `f32` and `f64`.
pub trait Element: Copy + Send + Sync + 'static + Into<Scalar> {
    /// The matching dtype.
    const DTYPE: DType;
    /// Appends the little-endian bytes of `self`.
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads a value from its little-endian bytes (`DTYPE.size_bytes()` of them).
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! numeric_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$t>()];
                raw.copy_from_slice(&bytes[..std::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(raw)
            }
        }
    )*};
}

numeric_element!(
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    f16 => F16, bf16 => BF16, f32 => F32, f64 => F64,
);

macro_rules! float8_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn write_le(self, out: &mut Vec<u8>) {
                out.push(self.to_bits());
            }
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_bits(bytes[0])
            }
        }
    )*};
}

float8_element!(F8E4M3 => F8E4M3, F8E5M2 => F8E5M2);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}
