//! cuBLAS, through cudarc: finding the library, one handle per device that queues on the
//! device's stream, and the GEMM calls (`f32`/`f64` routines, `GemmEx` for half types and TF32). Part of [`ffi`](super), under the same
//! rule: each `unsafe` block says why it is sound.
//!
//! cudarc opens cuBLAS on first use, by bare file names through the dynamic loader, and
//! **panics** when it cannot, or when a function it looks up is missing. So [`load`] checks
//! both first, once per process, and nothing else here runs before it has succeeded.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use cudarc::cublas::result as blas;
use cudarc::cublas::sys as bsys;
use cudarc::driver::result as cu;
use cudarc::driver::sys;

use super::{Context, Stream};
use crate::matmul::{Gemm, Precision};

/// Every cuBLAS entry point called here, directly or inside cudarc.
const SYMBOLS: &[&str] = &[
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSetMathMode",
    "cublasSetWorkspace_v2",
    "cublasGetVersion_v2",
    "cublasGetProperty",
    "cublasSgemm_v2",
    "cublasDgemm_v2",
    "cublasSgemmStridedBatched",
    "cublasDgemmStridedBatched",
    "cublasGemmEx",
    "cublasGemmStridedBatchedEx",
];

/// Whether cuBLAS can be used; `Err` says why not. It is looked for once per process, and
/// the outcome is logged once.
pub(crate) fn load() -> Result<(), &'static str> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let found = find();
            match &found {
                Ok(()) => tracing::debug!("tessel-cuda: cuBLAS loaded"),
                Err(why) => tracing::info!(
                    "tessel-cuda: {why}: no cuBLAS matmul; generated kernels run matrix products"
                ),
            }
            found
        })
        .as_ref()
        .copied()
        .map_err(String::as_str)
}

/// cuBLAS's version as `10000·major + 100·minor + patch` (what `cublasGetVersion` gives),
/// read without a handle, or `None` without cuBLAS. Once per process.
pub(crate) fn library_version() -> Option<i32> {
    static VERSION: OnceLock<Option<i32>> = OnceLock::new();
    *VERSION.get_or_init(|| {
        load().ok()?;
        let mut parts = [0 as c_int; 3];
        let kinds = [
            bsys::libraryPropertyType::MAJOR_VERSION,
            bsys::libraryPropertyType::MINOR_VERSION,
            bsys::libraryPropertyType::PATCH_LEVEL,
        ];
        for (kind, part) in kinds.into_iter().zip(&mut parts) {
            // SAFETY: `load` found the library and this symbol in it; writes one int through
            // a valid pointer.
            unsafe { bsys::cublasGetProperty(kind, std::ptr::from_mut(part)) }
                .result()
                .ok()?;
        }
        Some(10000 * parts[0] + 100 * parts[1] + parts[2])
    })
}

fn find() -> Result<(), String> {
    // SAFETY: dlopens cuBLAS by cudarc's names and closes it again; loading it runs only its
    // own initializers, as in any CUDA program.
    if !unsafe { bsys::is_culib_present() } {
        return Err(format!(
            "cuBLAS (libcublas.so.13) is not on the loader path; cudarc looks for {}",
            cudarc::get_lib_name_candidates("cublas").join(", ")
        ));
    }
    // SAFETY: a loadable library was just found, so `culib` (which panics when none loads)
    // returns one; cudarc keeps it loaded for the process.
    let lib = unsafe { bsys::culib() };
    match super::missing_symbol(lib, SYMBOLS) {
        Some(name) => Err(format!("the cuBLAS library found lacks `{name}`")),
        None => Ok(()),
    }
}

/// Half-precision products accumulate in `f32` (tensor cores; `alpha`/`beta` are `f32`), as
/// the generated kernels do; `CUBLAS_COMPUTE_32F_FAST_16F` would round partial sums to half.
const F32_ACCUMULATION: bsys::cublasComputeType_t = bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F;

/// `f32` products where TF32 is allowed: operands rounded to TF32 on tensor cores, sums in
/// `f32` (`alpha`/`beta` are `f32`).
const TF32_OPERANDS: bsys::cublasComputeType_t =
    bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32;

/// Scratch memory given to cuBLAS per device, as PyTorch gives it on Hopper (32 MiB): without
/// one, cuBLAS falls back to kernels that need none, slower for some shapes.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle bound to one device's stream, with its workspace; destroyed on drop.
pub(crate) struct Blas {
    handle: bsys::cublasHandle_t,
    /// The workspace's device address (0 until allocated).
    workspace: u64,
    /// The context the handle was created in, made current again to destroy it.
    ctx: sys::CUcontext,
    /// cuBLAS's version, `10000·major + 100·minor + patch`.
    pub(crate) version: i32,
}

// SAFETY: cuBLAS handles may be used from any thread once their context is current (every
// method binds it first); the owner serializes the calls through a mutex.
unsafe impl Send for Blas {}

impl Blas {
    /// A handle for `ctx`'s device that queues its work on `stream`, so that it runs in
    /// order with the kernels and copies queued there, with cuBLAS's default math mode.
    pub(crate) fn new(ctx: &Context, stream: &Stream) -> Result<Blas, String> {
        load().map_err(str::to_owned)?;
        ctx.bind()
            .map_err(|e| format!("cuCtxSetCurrent failed: {e}"))?;
        // cuBLAS takes the device of the current context.
        let handle = blas::create_handle().map_err(|e| format!("cublasCreate failed: {e}"))?;
        // From here on, dropping `this` destroys the handle, on the error paths too.
        let mut this = Blas {
            handle,
            workspace: 0,
            ctx: ctx.ctx,
            version: 0,
        };
        // SAFETY: the handle is live; the stream is live and belongs to the handle's context.
        unsafe { blas::set_stream(handle, stream.0.cast()) }
            .map_err(|e| format!("cublasSetStream failed: {e}"))?;
        // A new handle already has the default mode; stating it keeps the precision promise
        // here, where it is made: `Sgemm` runs in full `f32`, never on TF32 tensor cores
        // (PyTorch's default for matmul too); TF32 is asked for per call, through
        // `GemmEx`'s compute type, only where a matmul allows it.
        // SAFETY: the handle is live; the mode is one of the enum's values.
        unsafe { bsys::cublasSetMathMode(handle, bsys::cublasMath_t::CUBLAS_DEFAULT_MATH) }
            .result()
            .map_err(|e| format!("cublasSetMathMode failed: {e}"))?;
        this.workspace = super::malloc(ctx, WORKSPACE_BYTES)
            .map_err(|e| format!("allocating cuBLAS's {WORKSPACE_BYTES}-byte workspace: {e}"))?;
        let workspace = std::ptr::with_exposed_provenance_mut::<c_void>(this.workspace as usize);
        // SAFETY: the handle is live; the workspace is a live allocation of its context of
        // `WORKSPACE_BYTES`, owned by this handle and freed only after it is destroyed.
        unsafe { bsys::cublasSetWorkspace_v2(handle, workspace, WORKSPACE_BYTES) }
            .result()
            .map_err(|e| format!("cublasSetWorkspace failed: {e}"))?;
        let mut version: c_int = 0;
        // SAFETY: the handle is live; writes one int through a valid pointer.
        unsafe { bsys::cublasGetVersion_v2(handle, &raw mut version) }
            .result()
            .map_err(|e| format!("cublasGetVersion failed: {e}"))?;
        this.version = version;
        Ok(this)
    }

    /// Queues the GEMM `g` on the handle's stream, in `precision`: `C'` at device address
    /// `c` from `A'` at `a` and `B'` at `b` (see [`Gemm`]), `alpha = 1`, `beta = 0`. The
    /// caller has checked, with [`crate::matmul::plan`], that each address starts a live
    /// allocation of this context holding every element the call reads or writes, and that
    /// `c`'s allocation is neither input's. `Err` names the call that failed.
    pub(crate) fn gemm(
        &self,
        ctx: &Context,
        precision: Precision,
        g: &Gemm,
        [a, b, c]: [u64; 3],
    ) -> Result<(), String> {
        ctx.bind()
            .map_err(|e| format!("cuCtxSetCurrent failed: {e}"))?;
        let op = |transposed: bool| {
            if transposed {
                bsys::cublasOperation_t::CUBLAS_OP_T
            } else {
                bsys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (ta, tb) = (op(g.transa), op(g.transb));
        let h = self.handle;
        // Device addresses, never dereferenced on the host.
        let input = |addr: u64| std::ptr::with_exposed_provenance::<c_void>(addr as usize);
        let (a, b) = (input(a), input(b));
        let c = std::ptr::with_exposed_provenance_mut::<c_void>(c as usize);
        let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
        let batched = g.batch > 1;
        // `GemmEx`'s storage type of operands and output, and its compute type (unused for
        // `Sgemm`/`Dgemm`).
        let (storage, compute) = match precision {
            Precision::F16 => (bsys::cudaDataType::CUDA_R_16F, F32_ACCUMULATION),
            Precision::Tf32 => (bsys::cudaDataType::CUDA_R_32F, TF32_OPERANDS),
            _ => (bsys::cudaDataType::CUDA_R_16BF, F32_ACCUMULATION),
        };
        // SAFETY: the handle is live and its context current. `a`, `b` and `c` lie in live
        // allocations of this context, large enough for every element the sizes, leading
        // dimensions and batch strides of `g` reach (the caller's checks), and the memory
        // pool keeps them allocated until the work queued on this stream before their reuse
        // has run. `alpha` and `beta` point to host locals: in cuBLAS's default (host)
        // pointer mode they are read before the call returns; for `GemmEx` with
        // `CUBLAS_COMPUTE_32F` and `CUBLAS_COMPUTE_32F_FAST_TF32` they are `f32`, as passed.
        let (routine, result) = unsafe {
            match (precision, batched) {
                (Precision::F32, false) => (
                    "cublasSgemm_v2",
                    blas::sgemm(
                        h,
                        ta,
                        tb,
                        g.m,
                        g.n,
                        g.k,
                        &raw const one32,
                        a.cast(),
                        g.lda,
                        b.cast(),
                        g.ldb,
                        &raw const zero32,
                        c.cast(),
                        g.ldc,
                    ),
                ),
                (Precision::F64, false) => (
                    "cublasDgemm_v2",
                    blas::dgemm(
                        h,
                        ta,
                        tb,
                        g.m,
                        g.n,
                        g.k,
                        &raw const one64,
                        a.cast(),
                        g.lda,
                        b.cast(),
                        g.ldb,
                        &raw const zero64,
                        c.cast(),
                        g.ldc,
                    ),
                ),
                (Precision::F32, true) => (
                    "cublasSgemmStridedBatched",
                    blas::sgemm_strided_batched(
                        h,
                        ta,
                        tb,
                        g.m,
                        g.n,
                        g.k,
                        &raw const one32,
                        a.cast(),
                        g.lda,
                        g.stride_a,
                        b.cast(),
                        g.ldb,
                        g.stride_b,
                        &raw const zero32,
                        c.cast(),
                        g.ldc,
                        g.stride_c,
                        g.batch,
                    ),
                ),
                (Precision::F64, true) => (
                    "cublasDgemmStridedBatched",
                    blas::dgemm_strided_batched(
                        h,
                        ta,
                        tb,
                        g.m,
                        g.n,
                        g.k,
                        &raw const one64,
                        a.cast(),
                        g.lda,
                        g.stride_a,
                        b.cast(),
                        g.ldb,
                        g.stride_b,
                        &raw const zero64,
                        c.cast(),
                        g.ldc,
                        g.stride_c,
                        g.batch,
                    ),
                ),
                (Precision::F16 | Precision::BF16 | Precision::Tf32, false) => (
                    "cublasGemmEx",
                    blas::gemm_ex(
                        h,
                        ta,
                        tb,
                        g.m,
                        g.n,
                        g.k,
                        (&raw const one32).cast(),
                        a,
                        storage,
                        g.lda,
                        b,
                        storage,
                        g.ldb,
                        (&raw const zero32).cast(),
                        c,
                        storage,
                        g.ldc,
                        compute,
                        bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                    ),
                ),
                (Precision::F16 | Precision::BF16 | Precision::Tf32, true) => (
                    "cublasGemmStridedBatchedEx",
                    blas::gemm_strided_batched_ex(
                        h,
                        ta,
                        tb,
                        g.m,
                        g.n,
                        g.k,
                        (&raw const one32).cast(),
                        a,
                        storage,
                        g.lda,
                        g.stride_a,
                        b,
                        storage,
                        g.ldb,
                        g.stride_b,
                        (&raw const zero32).cast(),
                        c,
                        storage,
                        g.ldc,
                        g.stride_c,
                        g.batch,
                        compute,
                        bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                    ),
                ),
            }
        };
        result.map_err(|e| format!("{routine} failed: {e}"))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the context outlives the handle (its device destroys the handle before
        // releasing the context, after synchronizing its stream, so no queued GEMM still
        // uses the workspace); the handle and the workspace are released once, here.
        let result = unsafe {
            cu::ctx::set_current(self.ctx)
                .map_err(|e| e.to_string())
                .and_then(|()| blas::destroy_handle(self.handle).map_err(|e| e.to_string()))
                .and_then(|()| match self.workspace {
                    0 => Ok(()),
                    w => cu::free_sync(w).map_err(|e| e.to_string()),
                })
        };
        if let Err(e) = result {
            tracing::debug!("tessel-cuda: destroying a cuBLAS handle failed: {e}");
        }
    }
}
