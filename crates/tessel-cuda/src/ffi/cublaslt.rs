//! cuBLASLt, through cudarc: matrix products with an epilogue (bias, `relu`, GELU) done
//! before the product is stored. Part of [`ffi`](super), under the same rule: each `unsafe`
//! block says why it is sound.
//!
//! cudarc opens cuBLASLt on first use by bare file names and **panics** when it cannot, or
//! when a function it looks up is missing; [`load`] checks both first, once per process.
//! A call describes the GEMM (descriptors made and destroyed per call: host objects, a few
//! microseconds), and runs the algorithm cuBLASLt's heuristic picked for that shape, which
//! is asked for once per shape, alignment and epilogue and kept.

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as lsys;
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use rustc_hash::FxHashMap;
use tessel_ir::{Activation, Epilogue};

use super::{Context, Stream};
use crate::matmul::{Gemm, Precision};

/// Every cuBLASLt entry point called here, directly or inside cudarc.
const SYMBOLS: &[&str] = &[
    "cublasLtCreate",
    "cublasLtDestroy",
    "cublasLtGetVersion",
    "cublasLtMatmulDescCreate",
    "cublasLtMatmulDescDestroy",
    "cublasLtMatmulDescSetAttribute",
    "cublasLtMatrixLayoutCreate",
    "cublasLtMatrixLayoutDestroy",
    "cublasLtMatrixLayoutSetAttribute",
    "cublasLtMatmulPreferenceCreate",
    "cublasLtMatmulPreferenceDestroy",
    "cublasLtMatmulPreferenceSetAttribute",
    "cublasLtMatmulAlgoGetHeuristic",
    "cublasLtMatmul",
];

/// Scratch memory cuBLASLt's algorithms may use, per device (PyTorch gives it 32 MiB on
/// Hopper too).
const WORKSPACE_BYTES: usize = 32 << 20;

/// Whether cuBLASLt can be used; `Err` says why not. Looked for once per process.
pub(crate) fn load() -> Result<(), &'static str> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let found = find();
            match &found {
                Ok(()) => tracing::debug!("tessel-cuda: cuBLASLt loaded"),
                Err(why) => tracing::info!(
                    "tessel-cuda: {why}: no cuBLASLt epilogues; generated kernels run them"
                ),
            }
            found
        })
        .as_ref()
        .copied()
        .map_err(String::as_str)
}

fn find() -> Result<(), String> {
    // SAFETY: dlopens cuBLASLt by cudarc's names and closes it again; loading it runs only
    // its own initializers.
    if !unsafe { lsys::is_culib_present() } {
        return Err(format!(
            "cuBLASLt (libcublasLt.so.13) is not on the loader path; cudarc looks for {}",
            cudarc::get_lib_name_candidates("cublasLt").join(", ")
        ));
    }
    // SAFETY: a loadable library was just found, so `culib` returns one; cudarc keeps it
    // loaded for the process.
    let lib = unsafe { lsys::culib() };
    match super::missing_symbol(lib, SYMBOLS) {
        Some(name) => Err(format!("the cuBLASLt library found lacks `{name}`")),
        None => Ok(()),
    }
}

/// What the heuristic's choice depends on besides the descriptors' fixed parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    gemm: Gemm,
    precision: Precision,
    epilogue: Epilogue,
    /// Byte alignment of `[A', B', C', bias]` (at most 256).
    alignments: [u32; 4],
}

/// A cuBLASLt handle for one device, with its workspace; destroyed on drop.
pub(crate) struct Lt {
    handle: lsys::cublasLtHandle_t,
    /// The context the handle and workspace belong to, bound again to release them.
    ctx: sys::CUcontext,
    workspace: u64,
    /// The heuristic's algorithm for each shape met so far.
    algos: FxHashMap<Shape, lsys::cublasLtMatmulAlgo_t>,
    /// cuBLASLt's version, `10000·major + 100·minor + patch`.
    pub(crate) version: usize,
}

// SAFETY: cuBLASLt handles may be used from any thread once their context is current
// (every method binds it first); the owner serializes the calls through a mutex.
unsafe impl Send for Lt {}

impl Lt {
    /// A handle for `ctx`'s device and its workspace.
    pub(crate) fn new(ctx: &Context) -> Result<Lt, String> {
        load().map_err(str::to_owned)?;
        ctx.bind()
            .map_err(|e| format!("cuCtxSetCurrent failed: {e}"))?;
        let handle = lt::create_handle().map_err(|e| format!("cublasLtCreate failed: {e}"))?;
        let mut this = Lt {
            handle,
            ctx: ctx.ctx,
            workspace: 0,
            algos: FxHashMap::default(),
            // SAFETY: a plain query of the loaded library.
            version: unsafe { lsys::cublasLtGetVersion() },
        };
        this.workspace = super::malloc(ctx, WORKSPACE_BYTES)
            .map_err(|e| format!("allocating cuBLASLt's {WORKSPACE_BYTES}-byte workspace: {e}"))?;
        Ok(this)
    }

    /// Queues `D' = epilogue(op_a(A')·op_b(B') + bias)` for the GEMM `g` (see [`Gemm`]) on
    /// `stream`: `A'` at `a`, `B'` at `b`, the bias (`g.m` elements, where the epilogue has
    /// one) at `bias`, the output at `c`. The caller has checked, with
    /// [`crate::matmul::plan`], that each address starts a live allocation of this context
    /// holding every element the call reads or writes, and that `c`'s allocation is no
    /// input's. `Err` names the call that failed.
    pub(crate) fn matmul(
        &mut self,
        ctx: &Context,
        stream: &Stream,
        precision: Precision,
        g: &Gemm,
        epilogue: Epilogue,
        [a, b, bias, c]: [u64; 4],
    ) -> Result<(), String> {
        ctx.bind()
            .map_err(|e| format!("cuCtxSetCurrent failed: {e}"))?;
        let (storage, compute) = match precision {
            Precision::F32 => (
                lsys::cudaDataType::CUDA_R_32F,
                lsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            Precision::Tf32 => (
                lsys::cudaDataType::CUDA_R_32F,
                lsys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            ),
            Precision::F16 => (
                lsys::cudaDataType::CUDA_R_16F,
                lsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            Precision::BF16 => (
                lsys::cudaDataType::CUDA_R_16BF,
                lsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            Precision::F64 => return Err("cuBLASLt epilogues take no f64 here".into()),
        };
        let desc = Desc::new(compute)?;
        let op = |t: bool| i32::from(t);
        desc.set(
            lsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &op(g.transa),
        )?;
        desc.set(
            lsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            &op(g.transb),
        )?;
        desc.set(
            lsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &(epilogue_of(epilogue).ok_or("cuBLASLt has no erf GELU epilogue")? as u32),
        )?;
        if epilogue.bias {
            let pointer = std::ptr::with_exposed_provenance::<c_void>(bias as usize);
            desc.set(
                lsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &pointer,
            )?;
        }
        let (m, n, k) = (g.m as u64, g.n as u64, g.k as u64);
        let [rows_a, cols_a] = if g.transa { [k, m] } else { [m, k] };
        let [rows_b, cols_b] = if g.transb { [n, k] } else { [k, n] };
        let layout_a = Layout::new(storage, rows_a, cols_a, g.lda, g.batch, g.stride_a)?;
        let layout_b = Layout::new(storage, rows_b, cols_b, g.ldb, g.batch, g.stride_b)?;
        let layout_c = Layout::new(storage, m, n, g.ldc, g.batch, g.stride_c)?;
        let shape = Shape {
            gemm: *g,
            precision,
            epilogue,
            alignments: [a, b, c, if epilogue.bias { bias } else { 256 }].map(alignment),
        };
        let algo = if let Some(algo) = self.algos.get(&shape) {
            *algo
        } else {
            let algo = self.heuristic(&desc, [&layout_a, &layout_b, &layout_c], &shape)?;
            self.algos.insert(shape, algo);
            algo
        };
        let (one, zero) = (1.0f32, 0.0f32);
        let input = |addr: u64| std::ptr::with_exposed_provenance::<c_void>(addr as usize);
        let out = std::ptr::with_exposed_provenance_mut::<c_void>(c as usize);
        let workspace = std::ptr::with_exposed_provenance_mut::<c_void>(self.workspace as usize);
        // SAFETY: the handle, descriptors and layouts are live; the context is current. `a`,
        // `b`, the bias and `c` lie in live allocations of this context large enough for
        // every element the layouts reach (the caller's checks; the bias holds `g.m`
        // elements), and the memory pool keeps them until the work queued on this stream
        // before their reuse has run; the workspace is this handle's, used by one call at a
        // time in stream order. `alpha` and `beta` are host `f32`s (the scale type), read
        // before the call returns. C is D with `beta = 0`, which cuBLASLt allows.
        unsafe {
            lt::matmul(
                self.handle,
                desc.0,
                (&raw const one).cast(),
                (&raw const zero).cast(),
                input(a),
                layout_a.0,
                input(b),
                layout_b.0,
                out.cast_const(),
                layout_c.0,
                out,
                layout_c.0,
                &raw const algo,
                workspace,
                WORKSPACE_BYTES,
                stream.0.cast(),
            )
        }
        .map_err(|e| format!("cublasLtMatmul failed: {e}"))
    }

    /// The algorithm cuBLASLt's heuristic ranks first for `shape`.
    fn heuristic(
        &self,
        desc: &Desc,
        [a, b, c]: [&Layout; 3],
        shape: &Shape,
    ) -> Result<lsys::cublasLtMatmulAlgo_t, String> {
        use lsys::cublasLtMatmulPreferenceAttributes_t as P;
        let pref = Preference::new()?;
        pref.set(
            P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &(WORKSPACE_BYTES as u64),
        )?;
        let [align_a, align_b, align_c, _] = shape.alignments;
        for (attr, value) in [
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c),
        ] {
            pref.set(attr, &value)?;
        }
        // SAFETY: every descriptor is live and describes the call about to be made.
        let result = unsafe {
            lt::get_matmul_algo_heuristic(self.handle, desc.0, a.0, b.0, c.0, c.0, pref.0)
        }
        .map_err(|e| {
            format!("cublasLtMatmulAlgoGetHeuristic found no algorithm for {shape:?}: {e}")
        })?;
        Ok(result.algo)
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the context outlives the handle (its device drops this first, after
        // synchronizing its stream, so no queued call still uses the workspace); both are
        // released once, here.
        let result = unsafe {
            cu::ctx::set_current(self.ctx)
                .map_err(|e| e.to_string())
                .and_then(|()| match self.workspace {
                    0 => Ok(()),
                    w => cu::free_sync(w).map_err(|e| e.to_string()),
                })
                .and_then(|()| lt::destroy_handle(self.handle).map_err(|e| e.to_string()))
        };
        if let Err(e) = result {
            tracing::debug!("tessel-cuda: releasing a cuBLASLt handle failed: {e}");
        }
    }
}

/// cuBLASLt's name for `e`; `None` for the erf GELU (cuBLASLt's GELU is the tanh form).
fn epilogue_of(e: Epilogue) -> Option<lsys::cublasLtEpilogue_t> {
    use lsys::cublasLtEpilogue_t as E;
    Some(match (e.bias, e.activation) {
        (false, Activation::Identity) => E::CUBLASLT_EPILOGUE_DEFAULT,
        (true, Activation::Identity) => E::CUBLASLT_EPILOGUE_BIAS,
        (false, Activation::Relu) => E::CUBLASLT_EPILOGUE_RELU,
        (true, Activation::Relu) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
        (false, Activation::GeluTanh) => E::CUBLASLT_EPILOGUE_GELU,
        (true, Activation::GeluTanh) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
        (_, Activation::Gelu) => return None,
    })
}

/// Whether cuBLASLt has a routine for `e`.
pub(crate) fn has_epilogue(e: Epilogue) -> bool {
    epilogue_of(e).is_some()
}

/// The largest power of two dividing `addr`, at most 256 (cuBLASLt's largest requirement).
fn alignment(addr: u64) -> u32 {
    1 << addr.trailing_zeros().min(8)
}

/// A matmul descriptor, destroyed on drop.
struct Desc(lsys::cublasLtMatmulDesc_t);

impl Desc {
    /// `f32` scaling (`alpha`, `beta`) for every precision taken here.
    fn new(compute: lsys::cublasComputeType_t) -> Result<Desc, String> {
        lt::create_matmul_desc(compute, lsys::cudaDataType::CUDA_R_32F)
            .map(Desc)
            .map_err(|e| format!("cublasLtMatmulDescCreate failed: {e}"))
    }

    fn set<T>(&self, attr: lsys::cublasLtMatmulDescAttributes_t, value: &T) -> Result<(), String> {
        // SAFETY: the descriptor is live; `value` is the attribute's documented type (an
        // `int32` operation, a `uint32` epilogue, a pointer), read for its size only.
        unsafe {
            lt::set_matmul_desc_attribute(
                self.0,
                attr,
                std::ptr::from_ref(value).cast(),
                size_of::<T>(),
            )
        }
        .map_err(|e| format!("cublasLtMatmulDescSetAttribute({attr:?}) failed: {e}"))
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: made by `Desc::new`, destroyed once.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

/// A column-major matrix layout, destroyed on drop.
struct Layout(lsys::cublasLtMatrixLayout_t);

impl Layout {
    /// `rows × cols` with leading dimension `ld`; `batch` matrices `stride` elements apart.
    fn new(
        storage: lsys::cudaDataType,
        rows: u64,
        cols: u64,
        ld: i32,
        batch: i32,
        stride: i64,
    ) -> Result<Layout, String> {
        let layout = lt::create_matrix_layout(storage, rows, cols, i64::from(ld))
            .map(Layout)
            .map_err(|e| format!("cublasLtMatrixLayoutCreate failed: {e}"))?;
        if batch > 1 {
            use lsys::cublasLtMatrixLayoutAttribute_t as L;
            layout.set(L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch)?;
            layout.set(L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride)?;
        }
        Ok(layout)
    }

    fn set<T>(&self, attr: lsys::cublasLtMatrixLayoutAttribute_t, value: &T) -> Result<(), String> {
        // SAFETY: the layout is live; `value` has the attribute's documented type (`int32`
        // batch count, `int64` stride).
        unsafe {
            lt::set_matrix_layout_attribute(
                self.0,
                attr,
                std::ptr::from_ref(value).cast(),
                size_of::<T>(),
            )
        }
        .map_err(|e| format!("cublasLtMatrixLayoutSetAttribute({attr:?}) failed: {e}"))
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: made by `Layout::new`, destroyed once.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

/// Heuristic search preferences, destroyed on drop.
struct Preference(lsys::cublasLtMatmulPreference_t);

impl Preference {
    fn new() -> Result<Preference, String> {
        lt::create_matmul_pref()
            .map(Preference)
            .map_err(|e| format!("cublasLtMatmulPreferenceCreate failed: {e}"))
    }

    fn set<T>(
        &self,
        attr: lsys::cublasLtMatmulPreferenceAttributes_t,
        value: &T,
    ) -> Result<(), String> {
        // SAFETY: the preference is live; `value` has the attribute's documented type
        // (`uint64` workspace bytes, `uint32` alignments).
        unsafe {
            lt::set_matmul_pref_attribute(
                self.0,
                attr,
                std::ptr::from_ref(value).cast(),
                size_of::<T>(),
            )
        }
        .map_err(|e| format!("cublasLtMatmulPreferenceSetAttribute({attr:?}) failed: {e}"))
    }
}

impl Drop for Preference {
    fn drop(&mut self) {
        // SAFETY: made by `Preference::new`, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}
