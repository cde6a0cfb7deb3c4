//! Tessel's CPU backend, the embedded default: kernels are rendered in the C dialect
//! ([`tessel_ir::codegen::C`]), compiled by the system C compiler into shared libraries,
//! loaded, and run on a thread pool.
//!
//! ```no_run
//! use tessel_cpu::CpuBackend;
//! use tessel_ir::{Backend, samples};
//! use tessel_shape::{Bindings, DType};
//!
//! let cpu = CpuBackend::new();
//! let kernel = samples::vector_add(DType::F32, 1024, 64)?;
//! let program = cpu.compile(0, &kernel)?;
//! let [a, b, out] = [0; 3].map(|_| cpu.alloc(0, 4096).unwrap());
//! cpu.write(a, 0, &[0; 4096])?;
//! cpu.write(b, 0, &[0; 4096])?;
//! cpu.launch(program, &[a, b, out], &Bindings::new())?;
//! let mut result = vec![0u8; 4096];
//! cpu.read(out, 0, &mut result)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - **Compiler.** [`CpuConfig::cc`] (`$TESSEL_CC`), else the first of `cc`, `gcc`, `clang`
//!   that runs `--version`. Without one, every kernel runs in the reference interpreter
//!   ([`tessel_ir::interp`]): correct, much slower, and announced once with
//!   `tracing::warn!`.
//! - **Caches.** Libraries are cached on disk under [`CpuConfig::cache_dir`], keyed by
//!   source, compiler identity, flags, the instruction set `-march=native` selects and
//!   this crate's version (not by the kernel's name), so a second process compiles
//!   nothing; loaded libraries are also kept in memory (bounded, see [`LIBRARY_CACHE`]).
//!   [`Backend::compile_many`] builds its uncached kernels with one compiler run.
//!   [`CpuBackend::stats`] counts compiles, compiler runs and hits.
//! - **Memory.** 64-byte-aligned host buffers with a bounded cache of freed ones, each
//!   buffer behind its own lock (see `memory.rs`).
//! - **Launches** are synchronous: workgroups are split into contiguous ranges run on a
//!   `rayon` pool of [`CpuConfig::threads`] threads. [`Backend::time`] is a host wall clock
//!   around the launch, which on a CPU is the kernel's time (there is no device queue).
//! - **Vendor matmul.** [`Backend::vendor`] gives f32 and f64 [`VendorOp::Matmul`]s a
//!   program that calls the `gemm` crate (on the same pool; serially for tiny products),
//!   with buffers `[lhs, rhs, out]`; `out` may not also be an input. Other element types
//!   get `Ok(None)`.

mod compiler;
mod device;
mod launch;
mod memory;
mod vendor;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use libloading::Library;
use rustc_hash::FxHashMap;
use tessel_ir::codegen::{self, CodegenError};
use tessel_ir::handles::{check_range, lock};
use tessel_ir::{
    Backend, BackendError, BufferId, DeviceInfo, Handles, Kernel, LaunchArgs, Param, ProgramId,
    ProgramOrigin, VendorOp, handles, interp,
};
use tessel_shape::Bindings;

use crate::compiler::{BuildError, Compiler, Part, load};
use crate::launch::KernelFn;
use crate::memory::{HostBuffer, Memory};
use crate::vendor::VendorProgram;

/// The most loaded libraries kept in memory for reuse. Libraries of live programs stay
/// loaded regardless; this bounds only those kept for future compiles of the same source.
pub const LIBRARY_CACHE: usize = 512;

/// The most kernels one compiler run builds: a failed batch is built again one by one, and
/// one slow kernel holds back every other kernel of its batch.
const MAX_BATCH: usize = 32;

/// How a [`CpuBackend`] is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuConfig {
    /// The C compiler; `None` tries `cc`, `gcc` and `clang`, in that order. A compiler
    /// that does not run `--version` successfully counts as absent.
    pub cc: Option<PathBuf>,
    /// Where compiled libraries are cached (in its `cpu/` subdirectory).
    pub cache_dir: PathBuf,
    /// Worker threads for launches.
    pub threads: usize,
}

impl CpuConfig {
    /// The configuration from the environment: `$TESSEL_CC`, `$TESSEL_CACHE_DIR` (else
    /// `$XDG_CACHE_HOME/tessel`, else `$HOME/.cache/tessel`, else the temporary
    /// directory's `tessel`), and one thread per available core.
    pub fn from_env() -> CpuConfig {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let cache_dir = tessel_ir::cache::default_root();
        CpuConfig {
            cc: var("TESSEL_CC"),
            cache_dir,
            threads: std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        }
    }
}

/// Counters of what a [`CpuBackend`] did, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuStats {
    /// Kernels compiled by the C compiler.
    pub compiles: u64,
    /// Runs of the C compiler (one builds every kernel of a [`Backend::compile_many`] batch).
    pub builds: u64,
    /// Kernels whose library was found in the disk cache.
    pub disk_hits: u64,
    /// Kernels whose library was already loaded.
    pub memory_hits: u64,
    /// Launches run (compiled, interpreted or vendor).
    pub launches: u64,
    /// Kernels the compiler rejected, left to the interpreter.
    pub compile_failures: u64,
}

#[derive(Default)]
struct Counters {
    compiles: AtomicU64,
    builds: AtomicU64,
    disk_hits: AtomicU64,
    memory_hits: AtomicU64,
    launches: AtomicU64,
    compile_failures: AtomicU64,
}

/// What a [`ProgramId`] names: a kernel, or a library routine ([`Backend::vendor`]).
enum Program {
    Kernel(KernelProgram),
    Vendor(VendorProgram),
}

/// A compiled (or interpreted) kernel.
struct KernelProgram {
    kernel: Kernel,
    /// The compiled entry point; `None` runs the interpreter.
    native: Option<Native>,
    origin: ProgramOrigin,
}

/// A library loaded for one kernel (possibly shared with the kernels built with it).
struct Loaded {
    library: Arc<Library>,
    origin: ProgramOrigin,
    /// The kernel's cache key, which names its entry function ([`compiler::symbol`]).
    key: u128,
}

struct Native {
    entry: KernelFn,
    /// Keeps `entry`'s code loaded.
    _library: Arc<Library>,
}

/// Loaded libraries by cache key, oldest first for eviction.
#[derive(Default)]
struct Libraries {
    map: FxHashMap<u128, Arc<Library>>,
    order: VecDeque<u128>,
}

/// The CPU backend. See the [crate docs](crate).
pub struct CpuBackend {
    config: CpuConfig,
    devices: Vec<DeviceInfo>,
    /// Discovered on first use, so that a backend that never compiles spawns nothing.
    compiler: OnceLock<Option<Compiler>>,
    /// `None` if the pool could not be built (no threads); launches then fail.
    pool: Option<rayon::ThreadPool>,
    memory: Memory,
    programs: Handles<ProgramId, Program>,
    libraries: Mutex<Libraries>,
    counters: Counters,
    /// The cache directory was found unusable and said so once.
    warned_cache: AtomicBool,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// A backend configured from the environment ([`CpuConfig::from_env`]).
    pub fn new() -> Self {
        Self::with_config(CpuConfig::from_env())
    }

    /// A backend with an explicit configuration (tests use this: environment variables
    /// are process-wide, so tests that set them race).
    pub fn with_config(config: CpuConfig) -> Self {
        let threads = config.threads.max(1);
        // rayon's work-stealing pool runs the workgroup ranges: it gives scoped parallel
        // iteration over borrowed launch arguments, and balances uneven ranges, without
        // hand-written thread management.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .stack_size(launch::STACK_BYTES)
            .thread_name(|i| format!("tessel-cpu-{i}"))
            .build()
            .map_err(|e| tracing::error!("tessel-cpu: cannot start worker threads: {e}"))
            .ok();
        let device = device::host(threads);
        CpuBackend {
            memory: Memory::new(device.name.clone()),
            devices: vec![device],
            config: CpuConfig { threads, ..config },
            compiler: OnceLock::new(),
            pool,
            programs: Handles::new("cpu"),
            libraries: Mutex::default(),
            counters: Counters::default(),
            warned_cache: AtomicBool::new(false),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &CpuConfig {
        &self.config
    }

    /// What the backend has done so far.
    pub fn stats(&self) -> CpuStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CpuStats {
            compiles: get(&self.counters.compiles),
            builds: get(&self.counters.builds),
            disk_hits: get(&self.counters.disk_hits),
            memory_hits: get(&self.counters.memory_hits),
            launches: get(&self.counters.launches),
            compile_failures: get(&self.counters.compile_failures),
        }
    }

    /// The C compiler in use, or `None` when kernels run in the interpreter.
    pub fn compiler_path(&self) -> Option<&Path> {
        self.compiler().map(|c| c.path.as_path())
    }

    fn compiler(&self) -> Option<&Compiler> {
        self.compiler
            .get_or_init(|| {
                let found = Compiler::discover(self.config.cc.as_deref());
                if let Some(c) = &found {
                    tracing::debug!(
                        "tessel-cpu: compiling kernels with {} (linking {})",
                        c.path.display(),
                        c.libs.join(" ")
                    );
                } else {
                    tracing::warn!(
                        "tessel-cpu: no working C compiler ({}); kernels run in the reference \
                         interpreter, which is much slower. Install cc, gcc or clang, or set \
                         TESSEL_CC",
                        self.config.cc.as_ref().map_or_else(
                            || "tried cc, gcc and clang".to_owned(),
                            |p| format!("`{}` does not run `--version`", p.display())
                        )
                    );
                }
                found
            })
            .as_ref()
    }

    fn library_dir(&self) -> PathBuf {
        self.config.cache_dir.join("cpu")
    }

    /// Builds (or finds) the libraries of `parts` in the cache directory, else, where that
    /// directory cannot be used (a file, unwritable), in the temporary directory's
    /// `tessel-<user>/cpu`, with a warning the first time. Returns the directory used and,
    /// per part, whether a compile built it.
    fn build(
        &self,
        compiler: &Compiler,
        parts: &[Part<'_>],
    ) -> Result<(PathBuf, Vec<bool>), BuildError> {
        let dir = self.library_dir();
        let built = match compiler.build(&dir, parts) {
            Ok(compiled) => Ok((dir, compiled)),
            Err(BuildError::Io(msg)) => {
                let fallback = fallback_cache_dir();
                if !self.warned_cache.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "tessel-cpu: cannot use the kernel cache ({msg}); caching kernels in {} \
                         instead. Set TESSEL_CACHE_DIR to a writable directory to keep them",
                        fallback.display()
                    );
                }
                compiler
                    .build(&fallback, parts)
                    .map(|compiled| (fallback, compiled))
            }
            Err(e) => Err(e),
        };
        if let Ok((_, compiled)) = &built
            && compiled.contains(&true)
        {
            self.counters.builds.fetch_add(1, Ordering::Relaxed);
        }
        built
    }

    /// The loaded library of each `(kernel, source)`, from memory, from disk, or compiled:
    /// every missing one in one compiler run, else (a source the compiler rejects) each
    /// alone, so that each error is the kernel's own.
    fn libraries(
        &self,
        compiler: &Compiler,
        kernels: &[(&Kernel, &str)],
    ) -> Vec<Result<Loaded, BackendError>> {
        let sources: Vec<String> = kernels
            .iter()
            .map(|(k, s)| compiler::anonymous(s, &codegen::entry_name(k)))
            .collect();
        let keys: Vec<u128> = sources.iter().map(|s| compiler.key(s)).collect();
        let mut results: Vec<Option<Result<Loaded, BackendError>>> = {
            let cache = lock(&self.libraries);
            keys.iter()
                .map(|key| {
                    let library = cache.map.get(key)?;
                    self.counters.memory_hits.fetch_add(1, Ordering::Relaxed);
                    Some(Ok(Loaded {
                        library: Arc::clone(library),
                        origin: ProgramOrigin::Cached,
                        key: *key,
                    }))
                })
                .collect()
        };
        let pending: Vec<usize> = (0..kernels.len())
            .filter(|&i| results[i].is_none())
            .collect();
        let part = |i: usize| Part {
            key: keys[i],
            source: &sources[i],
        };
        for &i in &pending {
            let (kernel, source) = kernels[i];
            tracing::debug!(target: "tessel::kernels", kernel = %kernel.name, "C source:\n{source}");
        }
        if pending.len() > 1 {
            let started = Instant::now();
            // No lock is held here: compiling takes long, and other kernels may compile meanwhile.
            let parts: Vec<Part<'_>> = pending.iter().map(|&i| part(i)).collect();
            match self.build(compiler, &parts) {
                Ok((dir, compiled)) => {
                    tracing::debug!(kernels = pending.len(), elapsed = ?started.elapsed(), "tessel-cpu: libraries ready");
                    for (&i, compiled) in pending.iter().zip(compiled) {
                        results[i] = Some(self.load(compiler, &dir, kernels[i], part(i), compiled));
                    }
                }
                Err(e) => tracing::debug!(
                    "tessel-cpu: building {} kernels together failed, building each alone: {}",
                    pending.len(),
                    match e {
                        BuildError::Compiler(log) | BuildError::Io(log) => log,
                    }
                ),
            }
        }
        for i in pending {
            if results[i].is_none() {
                let (kernel, source) = kernels[i];
                let started = Instant::now();
                let built = self
                    .build(compiler, &[part(i)])
                    .map_err(|e| compile_error(kernel, source, e));
                results[i] = Some(built.and_then(|(dir, compiled)| {
                    tracing::debug!(kernel = %kernel.name, compiled = compiled[0], elapsed = ?started.elapsed(), "tessel-cpu: library ready");
                    self.load(compiler, &dir, kernels[i], part(i), compiled[0])
                }));
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| unreachable!("every kernel's library was looked up")))
            .collect()
    }

    /// Loads the library `part` in `dir`, just built (`compiled`) or found there, and keeps
    /// it in memory.
    fn load(
        &self,
        compiler: &Compiler,
        dir: &Path,
        (kernel, source): (&Kernel, &str),
        part: Part<'_>,
        compiled: bool,
    ) -> Result<Loaded, BackendError> {
        let counter = if compiled {
            &self.counters.compiles
        } else {
            &self.counters.disk_hits
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let fail = |log: String| compile_error(kernel, source, BuildError::Compiler(log));
        let path = compiler::library_path(dir, part.key);
        let library = match load(&path) {
            Ok(library) => library,
            // A cached library that does not load (truncated, empty, garbage) is built
            // again once, instead of failing every later run until someone deletes it.
            Err(e) if !compiled => {
                tracing::warn!(
                    "tessel-cpu: the cached kernel library {} does not load ({e}); building it again",
                    path.display()
                );
                let _ = std::fs::remove_file(&path);
                let key = part.key;
                compiler
                    .build(dir, &[part])
                    .map_err(|e| compile_error(kernel, source, e))?;
                self.counters.compiles.fetch_add(1, Ordering::Relaxed);
                self.counters.builds.fetch_add(1, Ordering::Relaxed);
                return load(&path)
                    .map_err(|e| fail(format!("cannot load {}: {e}", path.display())))
                    .map(|library| self.keep(key, library, ProgramOrigin::Compiled));
            }
            Err(e) => return Err(fail(format!("cannot load {}: {e}", path.display()))),
        };
        let origin = if compiled {
            ProgramOrigin::Compiled
        } else {
            ProgramOrigin::Cached
        };
        Ok(self.keep(part.key, library, origin))
    }

    /// Keeps a loaded library in memory (bounded by [`LIBRARY_CACHE`]).
    fn keep(&self, key: u128, library: Library, origin: ProgramOrigin) -> Loaded {
        let library = Arc::new(library);
        let mut cache = lock(&self.libraries);
        if cache.map.insert(key, Arc::clone(&library)).is_none() {
            cache.order.push_back(key);
        }
        while cache.order.len() > LIBRARY_CACHE {
            if let Some(old) = cache.order.pop_front() {
                cache.map.remove(&old);
            }
        }
        Loaded {
            library,
            origin,
            key,
        }
    }

    /// The program of a prepared kernel: its compiled entry point, or, where the compiler
    /// rejected the source (or the toolchain is broken), the interpreter, which costs speed,
    /// not the realize.
    fn program(
        &self,
        kernel: Kernel,
        source: &str,
        loaded: Result<Loaded, BackendError>,
    ) -> Result<ProgramId, BackendError> {
        let native = match loaded {
            Ok(loaded) => {
                let symbol = compiler::symbol(loaded.key);
                // SAFETY: `codegen::render` defines the entry function with the
                // `Launch::Serial` signature, which `KernelFn` spells exactly, and
                // `Compiler::build` names it `symbol`.
                let entry = unsafe { loaded.library.get::<KernelFn>(symbol.as_bytes()) }
                    .map(|f| *f)
                    .map_err(|e| BackendError::Compile {
                        kernel: kernel.name.clone(),
                        code: source.to_owned(),
                        log: format!("the compiled library lacks `{symbol}`: {e}"),
                    })?;
                let native = Native {
                    entry,
                    _library: loaded.library,
                };
                (Some(native), loaded.origin)
            }
            Err(e @ BackendError::Compile { .. }) => {
                tracing::warn!(
                    "tessel-cpu: {e}\n(running the kernel in the reference interpreter \
                     instead, which is much slower)"
                );
                self.counters
                    .compile_failures
                    .fetch_add(1, Ordering::Relaxed);
                (None, ProgramOrigin::Interpreted)
            }
            Err(e) => return Err(e),
        };
        let (native, origin) = native;
        Ok(self.programs.insert(Program::Kernel(KernelProgram {
            kernel,
            native,
            origin,
        })))
    }

    fn check_device(&self, device: usize) -> Result<(), BackendError> {
        handles::device("cpu", &self.devices, device).map(drop)
    }
}

/// The error of a kernel whose library could not be built.
fn compile_error(kernel: &Kernel, source: &str, e: BuildError) -> BackendError {
    BackendError::Compile {
        kernel: kernel.name.clone(),
        code: source.to_owned(),
        log: match e {
            BuildError::Compiler(log) => log,
            BuildError::Io(msg) => format!("cannot use the kernel cache: {msg}"),
        },
    }
}

/// Where libraries are cached when the configured directory cannot be used: per user, so
/// two users of one machine never load each other's files.
fn fallback_cache_dir() -> PathBuf {
    let user = std::env::var("USER").unwrap_or_else(|_| "user".into());
    std::env::temp_dir()
        .join(format!("tessel-{user}"))
        .join("cpu")
}

/// A lock on one buffer for the length of a launch.
enum Guard<'a> {
    Read(RwLockReadGuard<'a, HostBuffer>),
    Write(RwLockWriteGuard<'a, HostBuffer>),
}

impl Guard<'_> {
    fn buffer(&self) -> &HostBuffer {
        match self {
            Guard::Read(g) => g,
            Guard::Write(g) => g,
        }
    }
}

impl CpuBackend {
    /// Runs `program`; with a `deadline`, workgroups not started by then are skipped and
    /// `Ok(false)` says so (library routines and the interpreter always finish).
    fn launch_until(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
        deadline: Option<Instant>,
    ) -> Result<bool, BackendError> {
        let program = self.programs.get(program)?;
        let program = match &*program {
            Program::Kernel(kernel) => kernel,
            Program::Vendor(op) => {
                // No pool: `gemm` runs on this thread rather than failing the launch.
                op.launch(
                    &self.memory,
                    self.pool.as_ref(),
                    self.config.threads,
                    buffers,
                    dims,
                )?;
                self.counters.launches.fetch_add(1, Ordering::Relaxed);
                return Ok(true);
            }
        };
        let kernel = &program.kernel;
        let params: Vec<&Param> = kernel
            .params
            .iter()
            .filter(|p| matches!(p, Param::Buffer { .. }))
            .collect();
        // Which buffers the kernel may write; the interpreter takes every buffer mutably.
        let writes = |id: BufferId| {
            program.native.is_none()
                || buffers.iter().zip(&params).any(|(b, p)| {
                    *b == id && matches!(p, Param::Buffer { access, .. } if access.mutates())
                })
        };
        // One lock per distinct buffer (a buffer may be bound to several parameters), taken
        // in id order; the table's lock is not held while the kernel runs.
        let shared = self.memory.get_sorted(buffers)?;
        let mut guards: Vec<(BufferId, Guard<'_>)> = shared
            .iter()
            .map(|(id, buffer)| {
                let guard = if writes(*id) {
                    Guard::Write(memory::write(buffer))
                } else {
                    Guard::Read(memory::read(buffer))
                };
                (*id, guard)
            })
            .collect();
        // Where each parameter's buffer sits among the (sorted, distinct) guards.
        let slots: Vec<usize> = buffers
            .iter()
            .map(|b| guards.binary_search_by_key(b, |(id, _)| *id).unwrap_or(0))
            .collect();
        let sizes: Vec<usize> = slots.iter().map(|&s| guards[s].1.buffer().len()).collect();
        let args = LaunchArgs::evaluate(kernel, buffers, &sizes, dims)?;
        self.counters.launches.fetch_add(1, Ordering::Relaxed);
        for &(j, bytes) in &args.zeroed {
            if let Guard::Write(g) = &mut guards[slots[j]].1 {
                g.bytes_mut()[..bytes].fill(0);
            }
        }

        let Some(native) = &program.native else {
            return run_interpreter(kernel, buffers, &mut guards, dims).map(|()| true);
        };
        let addrs: Vec<usize> = slots
            .iter()
            .map(|&s| match &mut guards[s].1 {
                Guard::Write(g) => g.addr_mut(),
                Guard::Read(g) => g.addr(),
            })
            .collect();
        let Some(pool) = &self.pool else {
            return Err(BackendError::Launch {
                kernel: kernel.name.clone(),
                reason: "the cpu backend could not start its worker threads".into(),
            });
        };
        Ok(launch::run(
            pool,
            self.config.threads,
            native.entry,
            &addrs,
            &args,
            deadline,
        ))
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn alloc(&self, device: usize, bytes: usize) -> Result<BufferId, BackendError> {
        self.check_device(device)?;
        self.memory.alloc(bytes)
    }

    fn upload(&self, device: usize, data: &[u8]) -> Result<BufferId, BackendError> {
        self.check_device(device)?;
        if data.is_empty() {
            // As `alloc` gives every buffer at least a byte.
            return self.memory.alloc(1);
        }
        self.memory.upload(data)
    }

    fn free(&self, buffer: BufferId) -> Result<(), BackendError> {
        self.memory.free(buffer)
    }

    fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        let shared = self.memory.get(buffer)?;
        let mut guard = memory::write(&shared);
        check_range("write", buffer, offset, data.len(), guard.len())?;
        guard.bytes_mut()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn fill(&self, buffer: BufferId, value: u8, bytes: usize) -> Result<(), BackendError> {
        let shared = self.memory.get(buffer)?;
        let mut guard = memory::write(&shared);
        check_range("fill", buffer, 0, bytes, guard.len())?;
        guard.bytes_mut()[..bytes].fill(value);
        Ok(())
    }

    fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        let shared = self.memory.get(buffer)?;
        let guard = memory::read(&shared);
        check_range("read", buffer, offset, out.len(), guard.len())?;
        out.copy_from_slice(&guard.bytes()[offset..offset + out.len()]);
        Ok(())
    }

    fn copy(&self, src: BufferId, dst: BufferId, bytes: usize) -> Result<(), BackendError> {
        if src == dst {
            let shared = self.memory.get(src)?;
            return check_range("copy", src, 0, bytes, memory::read(&shared).len());
        }
        let (source, target) = (self.memory.get(src)?, self.memory.get(dst)?);
        // Locks are taken in id order, so opposite copies between two buffers can't deadlock.
        let (from, mut to) = if src < dst {
            let from = memory::read(&source);
            (from, memory::write(&target))
        } else {
            let to = memory::write(&target);
            (memory::read(&source), to)
        };
        check_range("copy source", src, 0, bytes, from.len())?;
        check_range("copy destination", dst, 0, bytes, to.len())?;
        to.bytes_mut()[..bytes].copy_from_slice(&from.bytes()[..bytes]);
        Ok(())
    }

    fn compile(&self, device: usize, kernel: &Kernel) -> Result<ProgramId, BackendError> {
        let mut built = self.compile_many(device, &[kernel]);
        debug_assert_eq!(built.len(), 1, "one result per kernel");
        built
            .pop()
            .unwrap_or_else(|| unreachable!("one result per kernel"))
    }

    /// One compiler run costs about 50 ms before its first kernel: batches share it, one
    /// per thread, so that every core compiles.
    fn compile_batch(&self, kernels: usize, threads: usize) -> usize {
        kernels.div_ceil(threads.max(1)).clamp(1, MAX_BATCH)
    }

    /// Builds the kernels that are not cached with one compiler run; if that fails, each
    /// alone, so each error is the kernel's own.
    fn compile_many(
        &self,
        device: usize,
        kernels: &[&Kernel],
    ) -> Vec<Result<ProgramId, BackendError>> {
        if let Err(e) = self.check_device(device) {
            let mut errors = vec![Err(e)];
            errors.extend(kernels.iter().skip(1).map(|k| self.compile(device, k)));
            return errors;
        }
        let mut results: Vec<Option<Result<ProgramId, BackendError>>> =
            kernels.iter().map(|_| None).collect();
        let mut rendered: Vec<(usize, Kernel, String)> = Vec::new();
        for (i, kernel) in kernels.iter().enumerate() {
            // Verify first: an invalid kernel is reported the same way with or without a
            // compiler.
            let kernel = match tessel_ir::backend::prepare(kernel) {
                Ok(kernel) => kernel,
                Err(e) => {
                    results[i] = Some(Err(e));
                    continue;
                }
            };
            if self.compiler().is_none() {
                results[i] = Some(Ok(self.programs.insert(Program::Kernel(KernelProgram {
                    kernel,
                    native: None,
                    origin: ProgramOrigin::Interpreted,
                }))));
                continue;
            }
            match codegen::render(&kernel, &codegen::C) {
                Ok(source) => rendered.push((i, kernel, source)),
                Err(CodegenError::Verify(e)) => {
                    results[i] = Some(Err(BackendError::Compile {
                        kernel: kernel.name.clone(),
                        code: kernel.to_string(),
                        log: e.to_string(),
                    }));
                }
                Err(other) => {
                    results[i] = Some(Err(BackendError::Unsupported {
                        backend: "cpu",
                        what: other.to_string(),
                    }));
                }
            }
        }
        if let Some(compiler) = self.compiler() {
            let sources: Vec<(&Kernel, &str)> =
                rendered.iter().map(|(_, k, s)| (k, s.as_str())).collect();
            let loaded = self.libraries(compiler, &sources);
            for ((i, kernel, source), loaded) in rendered.into_iter().zip(loaded) {
                results[i] = Some(self.program(kernel, &source, loaded));
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| unreachable!("every kernel was compiled or failed")))
            .collect()
    }

    fn launch(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<(), BackendError> {
        self.launch_until(program, buffers, dims, None).map(drop)
    }

    fn time_within(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
        limit: Duration,
    ) -> Result<Option<Duration>, BackendError> {
        let started = Instant::now();
        let finished = self.launch_until(program, buffers, dims, Some(started + limit))?;
        Ok(finished.then(|| started.elapsed()))
    }

    fn time(
        &self,
        program: ProgramId,
        buffers: &[BufferId],
        dims: &Bindings,
    ) -> Result<Duration, BackendError> {
        // Launches are synchronous, so the host clock around one is the kernel's time.
        let started = Instant::now();
        self.launch(program, buffers, dims)?;
        Ok(started.elapsed())
    }

    fn synchronize(&self, device: usize) -> Result<(), BackendError> {
        // Every operation has finished when its call returns.
        self.check_device(device)
    }

    fn release(&self, program: ProgramId) -> Result<(), BackendError> {
        self.programs.remove(program).map(drop)
    }

    fn origin(&self, program: ProgramId) -> Result<ProgramOrigin, BackendError> {
        Ok(match &*self.programs.get(program)? {
            Program::Kernel(kernel) => kernel.origin,
            // A library routine: nothing of it is compiled.
            Program::Vendor(_) => ProgramOrigin::Cached,
        })
    }

    fn vendor(
        &self,
        device: usize,
        op: &VendorOp,
    ) -> Result<Vec<tessel_ir::VendorProgram>, BackendError> {
        self.check_device(device)?;
        Ok(VendorProgram::new(op)
            .map(|p| tessel_ir::VendorProgram {
                program: self.programs.insert(Program::Vendor(p)),
                variant: "gemm".into(),
                // Each output element is summed by one thread in a fixed order.
                deterministic: true,
            })
            .into_iter()
            .collect())
    }

    fn vendor_library(&self, _device: usize) -> String {
        // The `gemm` crate's major version (Cargo.toml pins `0.19`).
        "gemm 0.19".to_owned()
    }
}

/// Runs `kernel` in the interpreter on the locked buffers (all write-locked).
///
/// The interpreter needs one mutable slice per buffer parameter; a buffer bound to several
/// parameters gets its real storage at the first and a copy at the others, and copies of
/// parameters the kernel may write are written back afterwards, in parameter order. That
/// equals true aliasing for kernels where each element is read and written by one
/// invocation (in-place elementwise updates); other aliasing would race on a GPU anyway.
fn run_interpreter(
    kernel: &Kernel,
    buffers: &[BufferId],
    guards: &mut [(BufferId, Guard<'_>)],
    dims: &Bindings,
) -> Result<(), BackendError> {
    let mut first: FxHashMap<BufferId, usize> = FxHashMap::default();
    let mut copies: Vec<Vec<u8>> = Vec::new();
    for (j, &b) in buffers.iter().enumerate() {
        if let std::collections::hash_map::Entry::Vacant(slot) = first.entry(b) {
            slot.insert(j);
        } else {
            let original = guards
                .iter()
                .find(|(g, _)| *g == b)
                .map(|(_, g)| g.buffer().bytes().to_vec());
            copies.push(original.unwrap_or_default());
        }
    }
    let mut real: FxHashMap<BufferId, &mut [u8]> = guards
        .iter_mut()
        .filter_map(|(id, guard)| match guard {
            Guard::Write(g) => Some((*id, g.bytes_mut())),
            Guard::Read(_) => None,
        })
        .collect();
    let mut copies = copies.iter_mut();
    let mut slices: Vec<&mut [u8]> = Vec::with_capacity(buffers.len());
    for (j, b) in buffers.iter().enumerate() {
        let slice = if first.get(b) == Some(&j) {
            real.remove(b)
        } else {
            copies.next().map(Vec::as_mut_slice)
        };
        slices.push(slice.unwrap_or_default());
    }
    interp::run(kernel, &mut slices, dims).map_err(|e| BackendError::Launch {
        kernel: kernel.name.clone(),
        reason: e.to_string(),
    })?;
    let params: Vec<&Param> = kernel
        .params
        .iter()
        .filter(|p| matches!(p, Param::Buffer { .. }))
        .collect();
    for (j, b) in buffers.iter().enumerate() {
        let origin = first.get(b).copied().unwrap_or(j);
        let writable =
            matches!(params.get(j), Some(Param::Buffer { access, .. }) if access.mutates());
        if origin < j && writable {
            let (head, tail) = slices.split_at_mut(j);
            head[origin].copy_from_slice(tail[0]);
        }
    }
    Ok(())
}
