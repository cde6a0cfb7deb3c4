//! The generated tensor-core matmul: a [`Matmul`] as CUDA C of our own, operand tiles
//! staged in shared memory by a `cp.async` pipeline, and the
//! [`Epilogue`](tessel_ir::Epilogue) (bias, activation, the rounding to the output dtype)
//! applied to the accumulators before the one store. `f16` and `bf16` run on
//! `mma.sync.m16n8k16` with `f32` accumulation; `f32` as 3xTF32 (each operand split into
//! two TF32 parts, three `mma.sync.m16n8k8` per product: each term within about 2⁻²⁰ of
//! its exact value, summed in `f32`; CUTLASS's 3xTF32 GEMMs and PyTorch's f32 attention
//! kernels compute so), which cuBLAS's `f32` GEMM, on the CUDA cores, does not use.
//!
//! The kernel is `mma.cu`, configured per program by macros written here: the block and
//! warp [`Tile`], the operands' layouts, the dtype, the bias and the activation. Sizes and
//! strides are kernel arguments, so one compiled program serves every shape of its
//! configuration; the planner measures each of [`tiles`] against cuBLAS per shape and
//! keeps the fastest.
//!
//! It runs a product only where every stored operand row starts 16 bytes aligned (rows and
//! batch strides of a multiple of 16 bytes) and the output rows have an even length, with
//! those sizes constant; anything else is left to cuBLAS ([`supports`] says why not).

use tessel_ir::{Activation, BackendError, Matmul, MatmulSizes};
use tessel_shape::{DType, Dim};

/// The kernel text, configured by the macros [`source`] prepends.
const TEMPLATE: &str = include_str!("mma.cu");

/// The kernel's entry point.
pub(crate) const ENTRY: &str = "tessel_mma";

/// A block tile and how its warps split it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Tile {
    /// Output rows per block.
    pub(crate) bm: u32,
    /// Output columns per block.
    pub(crate) bn: u32,
    /// Contracted length per pipeline stage.
    pub(crate) bk: u32,
    /// Output rows per warp.
    pub(crate) wm: u32,
    /// Output columns per warp.
    pub(crate) wn: u32,
    /// Stages in flight.
    pub(crate) stages: u32,
}

/// The tiles offered for every half product, each measured: large tiles for large outputs,
/// a small one for small or batched outputs (on the H200, `128×256` is the fastest at
/// 4096³, `128×128` for `[4096, 3072]` outputs of `k = 768`, `64×64` for `[96, 512, 64]`).
const HALF_TILES: [Tile; 3] = [
    Tile::new(128, 256, 32, 64, 64, 3),
    Tile::new(128, 128, 32, 64, 64, 4),
    Tile::new(64, 64, 32, 32, 32, 4),
];

/// The 3xTF32 tiles: each split fragment takes twice the registers of a half one, so warps
/// cover half as many columns. (`128×96`, one wave of two blocks per SM for `[4096, 768]`
/// outputs on an H100, measured 1.2–1.6× slower than the best of these on every product.)
const TF32_TILES: [Tile; 3] = [
    Tile::new(128, 128, 32, 64, 32, 3),
    Tile::new(128, 64, 32, 64, 32, 4),
    Tile::new(64, 64, 32, 32, 32, 4),
];

/// The tiles offered for a product in `dtype`, each measured.
pub(crate) fn tiles(dtype: DType) -> &'static [Tile] {
    if dtype == DType::F32 {
        &TF32_TILES
    } else {
        &HALF_TILES
    }
}

/// Tile rows per group of consecutively numbered blocks (blocks running at once then share
/// operand tiles in L2).
const GROUP: u32 = 8;

impl Tile {
    const fn new(bm: u32, bn: u32, bk: u32, wm: u32, wn: u32, stages: u32) -> Tile {
        Tile {
            bm,
            bn,
            bk,
            wm,
            wn,
            stages,
        }
    }

    /// Threads per block: one warp per warp tile.
    pub(crate) fn threads(&self) -> u32 {
        32 * (self.bm / self.wm) * (self.bn / self.wn)
    }

    /// Dynamic shared memory per block: `stages` copies of both operand tiles, rows along
    /// `m` or `n` padded by 8 elements, rows along `k` by 16 bytes (as `mma.cu` lays them
    /// out).
    pub(crate) fn shared_bytes(&self, op: &Matmul) -> u32 {
        let size = op.dtype.size_bytes() as u32;
        let (pad_mn, pad_k) = (8, 16 / size);
        let a = if op.lhs_transposed {
            self.bk * (self.bm + pad_mn)
        } else {
            self.bm * (self.bk + pad_k)
        };
        let b = if op.rhs_transposed {
            self.bn * (self.bk + pad_k)
        } else {
            self.bk * (self.bn + pad_mn)
        };
        self.stages * (a + b) * size
    }

    /// The program's variant name for a product in `dtype`: `mma 128×256×32/3`, or
    /// `mma 3xtf32 128×128×32/3` for `f32`.
    pub(crate) fn label(&self, dtype: DType) -> String {
        let tf32 = if dtype == DType::F32 { "3xtf32 " } else { "" };
        format!(
            "mma {tf32}{}×{}×{}/{}",
            self.bm, self.bn, self.bk, self.stages
        )
    }
}

/// Why the generated kernel cannot run `op` on a device of compute capability
/// `capability`, or `None` when it can.
pub(crate) fn supports(op: &Matmul, capability: (i32, i32)) -> Option<String> {
    if capability.0 < 8 {
        return Some(format!(
            "mma.sync on bf16/f16/tf32 and cp.async need compute capability 8.0 (this device has {}.{})",
            capability.0, capability.1
        ));
    }
    if !matches!(op.dtype, DType::F16 | DType::BF16 | DType::F32) {
        return Some(format!(
            "it computes f16, bf16 and f32 only, not {}",
            op.dtype
        ));
    }
    let constant = |d: Dim| d.as_const().filter(|&v| v >= 0);
    let (Some(batch), Some(m), Some(n), Some(k), Some(lhs_stride), Some(rhs_stride)) = (
        constant(op.batch),
        constant(op.m),
        constant(op.n),
        constant(op.k),
        constant(op.lhs_batch_stride),
        constant(op.rhs_batch_stride),
    ) else {
        return Some("its sizes are not constants".into());
    };
    let lhs_row = if op.lhs_transposed { m } else { k };
    let rhs_row = if op.rhs_transposed { k } else { n };
    let chunk = 16 / op.dtype.size_bytes() as i64;
    let aligned = |v: i64| v % chunk == 0;
    if !(aligned(lhs_row) && aligned(rhs_row) && aligned(lhs_stride) && aligned(rhs_stride)) {
        return Some(format!(
            "operand rows of {lhs_row} and {rhs_row} elements and batch strides of \
             {lhs_stride} and {rhs_stride} are not all multiples of {chunk} (16 bytes)"
        ));
    }
    if n % 2 != 0 {
        return Some(format!("output rows of {n} elements are odd"));
    }
    let fits = |v: i64| i32::try_from(v).is_ok();
    if !(fits(m) && fits(n) && fits(k)) || batch > 65_535 {
        return Some(format!(
            "batch {batch}, m {m}, n {n}, k {k} exceed the kernel's 32-bit sizes or 65535 products"
        ));
    }
    None
}

/// The CUDA C of `op` with `tile`: `mma.cu` after its configuration. The text names no
/// size, so every product of one configuration shares one compiled module (modules are
/// cached by their source).
pub(crate) fn source(op: &Matmul, tile: &Tile) -> String {
    let activation = match op.epilogue.activation {
        Activation::Identity => "return x;",
        Activation::Relu => "return fmaxf(x, 0.0f);",
        // The same form and constants as `Activation::apply`; `tanhf` is correctly rounded
        // to within 2 ulp.
        Activation::GeluTanh => {
            "return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));"
        }
        // `erff` is within 2 ulp.
        Activation::Gelu => "return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));",
    };
    let flag = |b: bool| u8::from(b);
    let helpers = crate::tf32_helpers(op.dtype == DType::F32);
    format!(
        "#define TC_BM {}\n#define TC_BN {}\n#define TC_BK {}\n#define TC_WM {}\n#define TC_WN {}\n\
         #define TC_STAGES {}\n#define TC_GROUP {GROUP}\n#define TC_A_T {}\n#define TC_B_T {}\n\
         #define TC_F16 {}\n#define TC_TF32 {}\n#define TC_BIAS {}\n\
         __device__ __forceinline__ float tc_activation(float x) {{ {activation} }}\n{helpers}{TEMPLATE}",
        tile.bm,
        tile.bn,
        tile.bk,
        tile.wm,
        tile.wn,
        tile.stages,
        flag(op.lhs_transposed),
        flag(op.rhs_transposed),
        flag(op.dtype == DType::F16),
        flag(op.dtype == DType::F32),
        flag(op.epilogue.bias),
    )
}

/// One launch: the grid, the block, the shared memory and the size arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    pub(crate) grid: [u32; 3],
    pub(crate) block: [u32; 3],
    pub(crate) shared: u32,
    /// `m`, `n`, `k`, as the kernel's `int`s.
    pub(crate) sizes: [i32; 3],
    /// The operands' batch strides, in elements.
    pub(crate) strides: [i64; 2],
}

/// The launch of `op` with `tile` at sizes `s` (already checked against the buffers), or
/// `None` when the output is empty. Sizes past the kernel's are
/// [`BackendError::Unsupported`] (`supports` keeps such products away; symbolic ones never
/// get here).
pub(crate) fn launch(
    op: &Matmul,
    tile: &Tile,
    s: &MatmulSizes,
    name: &str,
) -> Result<Option<Launch>, BackendError> {
    if s.batch == 0 || s.m == 0 || s.n == 0 {
        return Ok(None);
    }
    let unsupported = || BackendError::Unsupported {
        backend: "cuda",
        what: format!("{name}: sizes {s:?} are past the generated matmul's limits"),
    };
    let blocks = s.m.div_ceil(tile.bm as usize) * s.n.div_ceil(tile.bn as usize);
    let int = |v: usize| i32::try_from(v).map_err(|_| unsupported());
    let long = |v: usize| i64::try_from(v).map_err(|_| unsupported());
    if s.batch > 65_535 || blocks > i32::MAX as usize {
        return Err(unsupported());
    }
    Ok(Some(Launch {
        grid: [blocks as u32, s.batch as u32, 1],
        block: [tile.threads(), 1, 1],
        shared: tile.shared_bytes(op),
        sizes: [int(s.m)?, int(s.n)?, int(s.k)?],
        strides: [long(s.lhs_batch_stride)?, long(s.rhs_batch_stride)?],
    }))
}

#[cfg(test)]
mod tests {
    use super::{launch, source, supports, tiles};
    use tessel_ir::{Epilogue, Matmul};
    use tessel_shape::{Bindings, DType, Dim};

    fn op(dtype: DType, [batch, m, n, k]: [i64; 4], t: (bool, bool)) -> Matmul {
        Matmul {
            dtype,
            batch: batch.into(),
            m: m.into(),
            n: n.into(),
            k: k.into(),
            lhs_transposed: t.0,
            rhs_transposed: t.1,
            lhs_batch_stride: (m * k).into(),
            rhs_batch_stride: (k * n).into(),
            allow_tf32: false,
            epilogue: Epilogue::NONE,
        }
    }

    #[test]
    fn only_aligned_constant_float_products_are_generated() {
        let sm90 = (9, 0);
        assert_eq!(
            supports(&op(DType::BF16, [2, 200, 72, 40], (false, false)), sm90),
            None
        );
        assert_eq!(
            supports(&op(DType::F16, [1, 8, 8, 8], (true, true)), sm90),
            None
        );
        assert!(supports(&op(DType::BF16, [1, 8, 8, 8], (false, false)), (7, 5)).is_some());
        assert!(supports(&op(DType::F64, [1, 8, 8, 8], (false, false)), sm90).is_some());
        // f32 rows are 16 bytes at 4 elements: k = 12 is aligned, k = 6 is not.
        assert_eq!(
            supports(&op(DType::F32, [1, 8, 8, 12], (false, false)), sm90),
            None
        );
        assert!(supports(&op(DType::F32, [1, 8, 8, 6], (false, false)), sm90).is_some());
        assert!(supports(&op(DType::F32, [1, 8, 8, 8], (false, false)), (7, 5)).is_some());
        // lhs rows of k = 12 elements are not 16-byte aligned; transposed, its rows are m
        // (and the rhs's rows are n unless it is transposed too).
        assert!(supports(&op(DType::BF16, [1, 8, 8, 12], (false, false)), sm90).is_some());
        assert_eq!(
            supports(&op(DType::BF16, [1, 8, 8, 12], (true, false)), sm90),
            None
        );
        assert!(supports(&op(DType::BF16, [1, 8, 8, 12], (true, true)), sm90).is_some());
        // rhs rows of n = 20.
        assert!(supports(&op(DType::BF16, [1, 8, 20, 8], (false, false)), sm90).is_some());
        // Odd output rows.
        assert!(supports(&op(DType::BF16, [1, 8, 7, 8], (false, true)), sm90).is_some());
        let mut symbolic = op(DType::BF16, [1, 8, 8, 8], (false, false));
        symbolic.m = Dim::from(tessel_shape::Var::new("rows", 0, 64).unwrap());
        assert!(supports(&symbolic, sm90).is_some());
    }

    /// Every tile meets `mma.cu`'s static assertions (which NVRTC checks only on a GPU host)
    /// and fits a block of a device of compute capability 8.0 or later, in every layout.
    #[test]
    fn every_tile_fits_the_kernel() {
        for dtype in [DType::BF16, DType::F32] {
            let (k_step, vec) = if dtype == DType::F32 { (8, 4) } else { (16, 8) };
            for tile in tiles(dtype) {
                let label = tile.label(dtype);
                assert_eq!(tile.bk % (2 * k_step), 0, "{label}");
                assert!(tile.wm % 16 == 0 && tile.wn % 16 == 0, "{label}");
                assert!(tile.bm % tile.wm == 0 && tile.bn % tile.wn == 0, "{label}");
                let threads = tile.threads();
                assert!(threads <= 1024 && threads % (tile.bn / vec) == 0, "{label}");
                for t in [(false, false), (true, false), (false, true), (true, true)] {
                    let product = op(dtype, [1, 256, 256, 256], t);
                    let shared = tile.shared_bytes(&product);
                    let size = dtype.size_bytes() as u32;
                    assert!(
                        tile.bm * (tile.bn + 8) * size <= shared,
                        "{label}: output tile"
                    );
                    // Compute capability 8.0 gives a block 163 KiB of shared memory (9.0: 227).
                    assert!(shared <= 163 * 1024, "{label}: {shared} bytes");
                }
            }
        }
    }

    #[test]
    fn sources_and_launches_follow_the_tile() {
        let product = op(DType::BF16, [3, 200, 72, 40], (false, true));
        let text = source(&product, &tiles(DType::BF16)[0]);
        // Sizes are arguments: another product of the configuration has the same text.
        let other = op(DType::BF16, [1, 8, 16, 24], (false, true));
        assert_eq!(source(&other, &tiles(DType::BF16)[0]), text);
        assert!(text.contains("#define TC_BM 128\n#define TC_BN 256\n"));
        assert!(text.contains("#define TC_B_T 1\n") && text.contains("#define TC_F16 0\n"));
        assert!(text.contains("extern \"C\" __global__"));
        let s = product.sizes(&Bindings::new()).unwrap();
        let l = launch(&product, &tiles(DType::BF16)[2], &s, "test")
            .unwrap()
            .unwrap();
        // 64×64 tiles: 4 tile rows × 2 tile columns, one grid row per product.
        assert_eq!(l.grid, [8, 3, 1]);
        assert_eq!(l.block, [128, 1, 1]);
        assert_eq!(l.sizes, [200, 72, 40]);
        assert_eq!(l.strides, [200 * 40, 40 * 72]);
        // Four stages of a 64×40 lhs tile and a 64×40 rhs tile (stored n × k).
        assert_eq!(l.shared, 4 * (64 * 40 + 64 * 40) * 2);
        // f32: rows along k padded by 4 floats, along m or n by 8; the 3xTF32 define set.
        let single = op(DType::F32, [3, 200, 72, 40], (true, false));
        let tile = &tiles(DType::F32)[0];
        let f32_text = source(&single, tile);
        assert!(f32_text.contains("#define TC_F16 0\n#define TC_TF32 1\n"));
        assert!(f32_text.contains(crate::TF32_HELPERS) && !text.contains(crate::TF32_HELPERS));
        assert_eq!(
            tile.shared_bytes(&single),
            3 * (32 * (128 + 8) + 32 * (128 + 8)) * 4
        );
        let rows = op(DType::F32, [3, 200, 72, 40], (false, true));
        assert_eq!(
            tile.shared_bytes(&rows),
            3 * (128 * (32 + 4) + 128 * (32 + 4)) * 4
        );
        assert_eq!(tile.label(DType::F32), "mma 3xtf32 128×128×32/3");
        let empty = op(DType::BF16, [3, 0, 72, 40], (false, true));
        let s = empty.sizes(&Bindings::new()).unwrap();
        assert_eq!(launch(&empty, &tiles(DType::BF16)[0], &s, "test"), Ok(None));
    }
}
