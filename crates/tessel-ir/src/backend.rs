//! The interface every runtime implements.
//!
//! [`Backend`] is a trait object (`dyn Backend`), not an enum: the backends live in their own
//! crates, which depend on this one, so an enum here would have to name crates above it.
//! The facade registers whichever backends its features enable, and the runtime holds them
//! as `Arc<dyn Backend>`. Every method takes `&self`: a backend synchronizes internally, so
//! one instance serves every thread, and no lock is held across a compile or a device wait.
//!
//! Buffers and programs are opaque ids the backend hands out. A launch binds a program's
//! parameters positionally: its `Param::Buffer`s, in order, to `buffers`; its
//! `Param::Dim`s to the values `dims` gives their variables.

use std::time::Duration;

use tessel_shape::Bindings;

use crate::kernel::Kernel;
use crate::vendor::{VendorOp, VendorProgram};

/// A device buffer, as its backend identifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u64);

/// A compiled kernel, as its backend identifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProgramId(pub u64);

/// A list of launches a caller may run more than once ([`Backend::launch_sequence`]): one
/// id per list of programs in one order, never reused in a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceId(pub u64);

impl SequenceId {
    /// An id no other sequence of this process has.
    pub fn new() -> SequenceId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        SequenceId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl Default for SequenceId {
    fn default() -> Self {
        Self::new()
    }
}

/// One launch of a sequence: a program and one buffer per parameter.
pub type SequenceLaunch<'a> = (ProgramId, &'a [BufferId]);

/// What a device can do.
// Capabilities are independent yes/no facts, so bools are the honest type here.
#[allow(clippy::struct_excessive_bools)]
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Features {
    /// Arithmetic in f16 (storage of f16 works everywhere).
    pub f16: bool,
    /// f64 arithmetic.
    pub f64: bool,
    /// Transcendental functions (`exp`, `log`, `sin`, ...) on f64, beyond its arithmetic:
    /// WGSL (SPIR-V's `GLSL.std.450`) defines them for 32-bit floats only.
    pub f64_math: bool,
    /// 64-bit integers (`i64`, `u64`): values and buffers.
    pub int64: bool,
    /// The subgroup (warp, SIMD) width, if subgroup operations are available.
    pub subgroup_size: Option<u32>,
    /// Matrix-multiply instructions (tensor cores and the like).
    pub matrix_units: bool,
    /// f32/f64 subnormal inputs and results of float arithmetic may be flushed to zero
    /// (WGSL allows it; NVIDIA's Vulkan driver does). Bit-level operations, loads, stores
    /// and selects still move subnormals unchanged.
    pub subnormals_may_flush: bool,
    /// The invocations of a workgroup run concurrently (a GPU's), so a kernel that gives
    /// each output or row a whole workgroup (cooperative reductions, row kernels) can pay
    /// off and the planner measures such kernels. The CPU backend runs a workgroup's
    /// invocations one after another, where they only add barriers.
    pub cooperative_workgroups: bool,
    /// Atomic adds of 64-bit values (`i64`, `u64`, `f64`) and maxima of `u64` (see `Inst::Atomic`). The
    /// 32-bit ones (adds of `f32`, `i32`, `u32`, maxima of `u32`) every backend has.
    pub atomics64: bool,
}

impl Features {
    /// Whether kernels on the device can hold values of `dtype` (every dtype but the
    /// 64-bit ones is always available: f16 and bf16 compute in f32 where needed).
    pub fn supports(&self, dtype: tessel_shape::DType) -> bool {
        use tessel_shape::DType;
        match dtype {
            DType::F64 => self.f64,
            DType::I64 | DType::U64 => self.int64,
            _ => true,
        }
    }
}

/// What kind of processor a device is, as its driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A CPU: the CPU backend's host, PoCL, a software Vulkan driver such as lavapipe.
    /// Compiling is costly there and launch shapes matter little, so kernels are tuned
    /// only when tuning is exhaustive.
    Cpu,
    /// A GPU (discrete, integrated or virtual) or another accelerator.
    Gpu,
}

/// One device of a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's name, as its driver reports it.
    pub name: String,
    /// The kind of processor it is.
    pub kind: DeviceKind,
    /// What else decides how fast a program runs there: the driver's version (for the
    /// CPU, the backend's version and thread count). Measured kernel times are cached
    /// under it, so an upgrade measures again.
    pub driver: String,
    /// Global memory, in bytes.
    pub memory_bytes: u64,
    /// Compute units (cores, SMs, CUs); 0 where the API cannot tell (wgpu).
    pub compute_units: u32,
    /// The most invocations in one workgroup.
    pub max_workgroup_size: u32,
    /// The most invocations per workgroup along each axis.
    pub max_local_size: [u32; 3],
    /// The most workgroups along each axis.
    pub max_groups: [u64; 3],
    /// Workgroup-local memory, in bytes.
    pub local_memory_bytes: u64,
    /// Optional capabilities.
    pub features: Features,
}

/// A backend operation that failed. Errors are values: nothing in a backend panics on a
/// driver failure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// An allocation did not fit.
    #[error(
        "out of memory on {device}: requested {requested} bytes; free tensors or use a smaller batch"
    )]
    OutOfMemory {
        /// The device's name.
        device: String,
        /// The size requested, in bytes.
        requested: usize,
    },
    /// A kernel failed to compile.
    #[error("kernel `{kernel}` failed to compile:\n{log}\n--- source ---\n{code}")]
    Compile {
        /// The kernel's name.
        kernel: String,
        /// The generated source code.
        code: String,
        /// The compiler's diagnostics.
        log: String,
    },
    /// A launch was rejected or failed.
    #[error("launch of kernel `{kernel}` failed: {reason}")]
    Launch {
        /// The kernel's name.
        kernel: String,
        /// Why.
        reason: String,
    },
    /// The device stopped working.
    #[error("device {device} lost: {reason}")]
    DeviceLost {
        /// The device's name.
        device: String,
        /// The driver's explanation.
        reason: String,
    },
    /// The backend cannot do what was asked.
    #[error("unsupported by the {backend} backend: {what}")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// What is unsupported, and where possible what to do instead.
        what: String,
    },
    /// An argument does not fit the call (an unknown id, a size mismatch).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// Where [`Backend::compile`] got a program from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProgramOrigin {
    /// The device's compiler built it in that call.
    Compiled,
    /// A cache of built programs had it, on disk or in memory: nothing was compiled.
    Cached,
    /// The backend runs it with the reference interpreter: nothing was compiled (the CPU
    /// backend without a C compiler).
    Interpreted,
}

/// A compute backend: devices, memory, programs and launches. See the module docs.
pub trait Backend: Send + Sync {
    /// The backend's name (`"cpu"`, `"cuda"`, ...).
    fn name(&self) -> &'static str;

    /// The devices present; empty when the driver is absent.
    fn devices(&self) -> &[DeviceInfo];

    /// Allocates `bytes` on device `device`.
    fn alloc(&self, device: usize, bytes: usize) -> Result<BufferId, BackendError>;

    /// Frees a buffer; its id becomes invalid.
    fn free(&self, buffer: BufferId) -> Result<(), BackendError>;

    /// Allocates a buffer on device `device` holding `data`. The default allocates and
    /// writes; a backend whose allocation touches its memory (host memory, zeroed) fills
    /// it in one pass.
    fn upload(&self, device: usize, data: &[u8]) -> Result<BufferId, BackendError> {
        let buffer = self.alloc(device, data.len().max(1))?;
        if !data.is_empty()
            && let Err(e) = self.write(buffer, 0, data)
        {
            let _ = self.free(buffer);
            return Err(e);
        }
        Ok(buffer)
    }

    /// Host to device: copies `data` into `buffer` at byte `offset`.
    fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<(), BackendError>;

    /// Sets the first `bytes` bytes of `buffer` to `value`, in order with other work on
    /// its device. The default writes them from the host; backends with a device-side
    /// fill override it.
    fn fill(&self, buffer: BufferId, value: u8, bytes: usize) -> Result<(), BackendError> {
        self.write(buffer, 0, &vec![value; bytes])
    }

    /// Device to host: fills `out` from `buffer` at byte `offset`, after pending work.
    fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<(), BackendError>;

    /// Device to device: copies the first `bytes` of `src` into `dst` (same device).
    fn copy(&self, src: BufferId, dst: BufferId, bytes: usize) -> Result<(), BackendError>;

    /// Compiles a kernel for device `device`. Every backend verifies it and compiles it
    /// through [`prepare`]: an access the verifier cannot prove in bounds is guarded (a
    /// load outside its memory reads zeros, a store outside is dropped), so no kernel,
    /// hand-written ones included, can reach memory it does not own.
    fn compile(&self, device: usize, kernel: &Kernel) -> Result<ProgramId, BackendError>;

    /// How many of `kernels` kernels to compile, on `threads` threads, one
    /// [`Backend::compile_many`] call should build together: 1 (the default) where each
    /// compile stands alone, more where every call to the compiler has a fixed cost (an
    /// OpenCL driver parses its whole builtin header per program; a C compiler starts,
    /// reads its headers and links).
    fn compile_batch(&self, kernels: usize, threads: usize) -> usize {
        let _ = (kernels, threads);
        1
    }

    /// Compiles `kernels` for device `device`: one result per kernel, in order, each as
    /// [`Backend::compile`] gives it. The default compiles them one by one.
    fn compile_many(
        &self,
        device: usize,
        kernels: &[&Kernel],
    ) -> Vec<Result<ProgramId, BackendError>> {
        kernels.iter().map(|k| self.compile(device, k)).collect()
    }

    /// Launches a program; may return before it finishes.
    fn launch(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<(), BackendError>;

    /// Launches `launches` in order, as one [`Backend::launch`] each, and may return before
    /// they finish. The caller runs `sequence` with the same programs in the same order
    /// every time (buffers and dims may change), so a backend that can record a sequence
    /// once and replay it in one submission (CUDA graphs) keys its recordings by it. The
    /// default launches one by one.
    fn launch_sequence(
        &self,
        sequence: SequenceId,
        launches: &[SequenceLaunch<'_>],
        dims: &Bindings,
    ) -> Result<(), BackendError> {
        let _ = sequence;
        launches
            .iter()
            .try_for_each(|&(program, buffers)| self.launch(program, buffers, dims))
    }

    /// Launches a program and measures its execution with the device's own timer.
    fn time(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<Duration, BackendError>;

    /// Like [`Backend::time`], but may stop once the run has taken `limit`: `Ok(None)` says
    /// the program is slower than `limit`, and what it wrote is unspecified. Planning uses
    /// it to stop a candidate that has already lost (a generated product next to a library
    /// routine). Backends whose launches cannot stop early run to the end.
    fn time_within(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
        limit: Duration,
    ) -> Result<Option<Duration>, BackendError> {
        let _ = limit;
        self.time(program, buffers, dims).map(Some)
    }

    /// Waits for all work submitted to device `device`.
    fn synchronize(&self, device: usize) -> Result<(), BackendError>;

    /// Drops a compiled program.
    fn release(&self, program: ProgramId) -> Result<(), BackendError>;

    /// Where [`Backend::compile`] got `program` from; [`ProgramOrigin::Compiled`] for a
    /// backend that does not say.
    fn origin(&self, program: ProgramId) -> Result<ProgramOrigin, BackendError> {
        let _ = program;
        Ok(ProgramOrigin::Compiled)
    }

    /// The programs that run `op` on device `device`, each a different way (a library
    /// routine, a kernel the backend generates for the op in several tile shapes): empty
    /// where the backend has none (see [`crate::vendor`]). Each launches, times and
    /// releases like a compiled kernel, and the planner measures every one. A library that
    /// is missing at run time means fewer programs, not an error.
    fn vendor(&self, device: usize, op: &VendorOp) -> Result<Vec<VendorProgram>, BackendError> {
        let _ = (device, op);
        Ok(Vec::new())
    }

    /// The name and version of the library behind [`Backend::vendor`]'s programs on
    /// `device` (`"cuBLAS 130100"`), once one has been made: part of the key under which
    /// their measured times are cached, so a new library version is measured anew. Empty
    /// where there is none.
    fn vendor_library(&self, device: usize) -> String {
        let _ = device;
        String::new()
    }
}

/// What every backend compiles instead of `kernel`: the kernel verified, with each access
/// the verifier cannot prove in bounds guarded ([`crate::passes::guard`]). A kernel that
/// fails verification is a [`BackendError::Compile`] naming it, with its text and the
/// verifier's message. Launches bind the prepared kernel's parameters (guards may read
/// dims that only buffer lengths named, appended as parameters).
pub fn prepare(kernel: &Kernel) -> Result<Kernel, BackendError> {
    let defs = crate::verify(kernel).map_err(|e| BackendError::Compile {
        kernel: kernel.name.clone(),
        code: kernel.to_string(),
        log: e.to_string(),
    })?;
    Ok(crate::passes::guard(kernel, &defs).0)
}
