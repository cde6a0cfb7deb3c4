//! Backend conformance tests shared by every backend crate.
//!
//! Every [`Backend`] must compute what the reference interpreter ([`tessel_ir::interp`])
//! computes: bit for bit for the exact ops, within the backend's documented ulps for its
//! transcendentals. On a device whose
//! [`Features::subnormals_may_flush`](tessel_ir::Features::subnormals_may_flush) is set, the
//! op and vector checks also accept a result that flushing explains: the reference's result
//! with some subnormal float inputs read as zeros of the same sign, or a zero of either sign
//! where that result is subnormal ([`agrees_flushed`]); nothing else is relaxed. [`Conformance`] holds one device of one backend and has one method per
//! check (every op, cast and bitcast on every dtype with special values, the sample kernels,
//! barriers, local memory, dynamic dims, aliasing, timing, the error paths, memory and
//! transfers); a check panics with the backend, device and failing case in its message.
//!
//! # Using it in a backend crate
//!
//! Add `tessel-testkit = { workspace = true }` under `[dev-dependencies]`, and in
//! `tests/<backend>.rs`:
//!
//! ```ignore
//! use tessel_shape::{BinaryOp, DType};
//! use tessel_testkit::{Check, Op, Tolerance};
//!
//! /// How this backend may differ from the interpreter: per op, per backend (see
//! /// [`Tolerance`]; the OpenCL and CPU test files have real ones).
//! const TOLERANCE: Tolerance = Tolerance {
//!     ulps: |op, input, out| match op {
//!         Op::Binary(BinaryOp::Div) if out == DType::F32 => 3, // e.g. WGSL: 2.5 ulps
//!         _ if op.is_transcendental(input) => 4,
//!         _ => 0,
//!     },
//!     ..Tolerance::EXACT
//! };
//!
//! /// Runs one check on every device of the backend (a `tessel-skip:` line without any).
//! fn run(test: &str, check: Check) {
//!     tessel_testkit::on_every_device(&MyBackend::new(), TOLERANCE, test, check);
//! }
//!
//! // One `#[test]` per check, named like the check...
//! tessel_testkit::conformance_tests!(run);
//! // ...or only the checks named: `conformance_tests!(run; row_sum, permuted_copy);`
//! ```
//!
//! The same by hand, for one check:
//!
//! ```ignore
//! for device in 0..backend.devices().len() {
//!     Conformance::new(&backend, device, TOLERANCE).alu_ops_match_the_interpreter();
//! }
//! ```
//!
//! Backend-specific tests (caches, device selection, build logs, compile counts around a
//! check) stay in the backend crate; they can build on [`Conformance::execute`], [`Rng`]
//! and the other helpers here.
//!
//! # Refusals and skips
//!
//! A device may lack a dtype or an op: the backend then refuses the kernel with
//! [`BackendError::Unsupported`] (or a compile error carrying codegen's "failed to render"
//! message). A check treats such a refusal as a *skip*, printing a [`skip`] line
//! (`tessel-skip: <backend>::<test>: ...` on stderr, naming the device, the op or kernel, the
//! dtype and the reason, so a CI runner can count them), but only where it is excused: the
//! kernel uses a dtype the device's [`Features::supports`](tessel_ir::Features::supports)
//! denies, or the backend's [`Tolerance::may_refuse`] allows it. Any other error, and any
//! wrong result, fails the test.

mod attention;
mod attention_backward;
mod checks;
mod data;
mod flush;
mod ops;

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use tessel_ir::{Backend, BackendError, DeviceInfo, Kernel, interp};
use tessel_shape::{Bindings, DType};

pub use attention::{attention_op, check_attention, with_heads_in_place};
pub use attention_backward::check_attention_backward;
pub use data::{Rng, add_in_rust, agrees, decode, encode, f32_bytes, f32_values, random_elements};
pub use flush::{agrees_flushed, flush_subnormals, flushable};
pub use ops::Op;

/// How a backend's results may differ from the interpreter's, and what it may refuse. One
/// constant per backend (and per device class where they differ), passed to every check.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    /// The largest distance, in ulps of the result dtype, allowed between the backend's
    /// result of `op` on inputs of the first dtype, producing the second, and the
    /// reference's; 0 means bit for bit (NaN payloads aside). Integers and `bool` are always
    /// exact. Examples: an OpenCL built-in `exp` (3 ulps plus the host libm's error), WGSL's
    /// `f32` division (2.5 ulps) and `sqrt`, CUDA's libdevice bounds.
    pub ulps: fn(Op, DType, DType) -> u64,
    /// Whether the backend may refuse `op` on inputs of `dtype` on this device although the
    /// device's [`Features`](tessel_ir::Features) support the dtypes involved (OpenCL without
    /// doubles refuses `erf` on `f32`, which the reference computes through `f64`). Refusals
    /// of dtypes the features deny are always excused.
    pub may_refuse: fn(&DeviceInfo, Op, DType) -> bool,
}

impl Tolerance {
    /// Bit for bit everywhere, and nothing refused beyond what the device's features deny.
    pub const EXACT: Tolerance = Tolerance {
        ulps: |_, _, _| 0,
        may_refuse: |_, _, _| false,
    };
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance::EXACT
    }
}

/// A check, as [`on_every_device`] and [`conformance_tests!`] take it.
pub type Check = fn(&Conformance<'_>);

/// Skips counted in this process by [`skip`].
static SKIPS: AtomicUsize = AtomicUsize::new(0);

/// Reports a skipped test (or part of one): prints `tessel-skip: <test>: <reason>` to stderr,
/// where a runner can count skips, and counts it in [`skips`].
pub fn skip(test: &str, reason: &str) {
    SKIPS.fetch_add(1, Ordering::Relaxed);
    eprintln!("tessel-skip: {test}: {reason}");
}

/// How many [`skip`]s this process has reported.
pub fn skips() -> usize {
    SKIPS.load(Ordering::Relaxed)
}

/// Why `error` is a refusal (the backend cannot run the kernel on this device) rather than a
/// failure: [`BackendError::Unsupported`], or a compile error whose log is codegen's
/// `UnsupportedOp` (`failed to render <op> on <dtype> in the <dialect> dialect`).
pub fn refusal(error: &BackendError) -> Option<&str> {
    match error {
        BackendError::Unsupported { what, .. } => Some(what),
        BackendError::Compile { log, .. }
            if log.contains("failed to render") && log.contains("dialect") =>
        {
            Some(log)
        }
        _ => None,
    }
}

/// Runs `check` on every device of `backend`, as test `test` (its name in messages and skip
/// lines); a backend without devices is one skip.
pub fn on_every_device(backend: &dyn Backend, tolerance: Tolerance, test: &str, check: Check) {
    if backend.devices().is_empty() {
        skip(
            &format!("{}::{test}", backend.name()),
            "no device found; nothing to test",
        );
    }
    for device in 0..backend.devices().len() {
        check(&Conformance::new(backend, device, tolerance).named(test));
    }
}

/// One `#[test]` per check, each calling `$run(test_name, check)`, where `$run:
/// fn(&str, Check)` runs the check on the backend's devices (usually through
/// [`on_every_device`]). Without a list, every check; with `; name, name, ...`, those.
#[macro_export]
macro_rules! conformance_tests {
    ($run:expr) => {
        $crate::conformance_tests!(
            $run;
            alu_ops_match_the_interpreter,
            casts_and_bitcasts_match_the_interpreter,
            vectors_match_the_interpreter,
            barriers_in_loops_match_the_interpreter,
            symbolic_local_sizes_match_the_interpreter,
            products_and_sums_are_not_fused,
            vector_add_every_dtype,
            permuted_copy,
            row_sum,
            atomic_adds_collide,
            buffer_differences_on_the_device,
            tree_reduce_with_barriers,
            tiled_matmul_with_local_memory,
            dynamic_dims_compile_once,
            one_buffer_bound_twice,
            launches_are_timed,
            kernels_failing_verification_are_compile_errors,
            any_kernel_name_compiles,
            too_small_buffers_are_rejected,
            unproven_accesses_are_guarded,
            memory_and_transfers_are_checked,
            fused_attention_matches_the_reference,
            attention_backward_matches_the_reference,
        );
    };
    ($run:expr; $($check:ident),+ $(,)?) => {
        $(
            #[test]
            fn $check() {
                ($run)(stringify!($check), |kit: &$crate::Conformance<'_>| kit.$check());
            }
        )+
    };
}

/// One device of one backend under test: the checks are its methods (see the crate docs).
pub struct Conformance<'b> {
    backend: &'b dyn Backend,
    device: usize,
    tolerance: Tolerance,
    test: String,
    skipped: Cell<usize>,
}

impl<'b> Conformance<'b> {
    /// Checks device `device` of `backend`, allowing the differences `tolerance` allows.
    pub fn new(backend: &'b dyn Backend, device: usize, tolerance: Tolerance) -> Self {
        assert!(
            device < backend.devices().len(),
            "the {} backend has no device {device}",
            backend.name()
        );
        Conformance {
            backend,
            device,
            tolerance,
            test: "conformance".to_owned(),
            skipped: Cell::new(0),
        }
    }

    /// Names the test in messages and skip lines (`<backend>::<test>`).
    pub fn named(mut self, test: &str) -> Self {
        test.clone_into(&mut self.test);
        self
    }

    /// The backend under test.
    pub fn backend(&self) -> &'b dyn Backend {
        self.backend
    }

    /// The device under test.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The device's description.
    pub fn info(&self) -> &'b DeviceInfo {
        &self.backend.devices()[self.device]
    }

    /// How many cases the checks run so far skipped.
    pub fn skipped(&self) -> usize {
        self.skipped.get()
    }

    /// `<backend>::<test>: device <k> (<name>)`, the prefix of every failure message.
    pub fn label(&self) -> String {
        format!("{}: {}", self.test_name(), self.device_name())
    }

    /// `<backend>::<test>`.
    fn test_name(&self) -> String {
        format!("{}::{}", self.backend.name(), self.test)
    }

    /// `device <k> (<name>)`.
    fn device_name(&self) -> String {
        format!("device {} ({})", self.device, self.info().name)
    }

    /// Compiles `kernel` for the device, uploads `buffers` (one per buffer parameter),
    /// launches, and returns every buffer's contents afterwards. Buffers and the program are
    /// freed whether or not the launch succeeds.
    pub fn execute(
        &self,
        kernel: &Kernel,
        buffers: &[Vec<u8>],
        dims: &Bindings,
    ) -> Result<Vec<Vec<u8>>, BackendError> {
        let b = self.backend;
        let program = b.compile(self.device, kernel)?;
        let mut ids = Vec::with_capacity(buffers.len());
        let mut uploaded = Ok(());
        for data in buffers {
            match b.alloc(self.device, data.len()) {
                Ok(id) => {
                    ids.push(id);
                    if let Err(e) = b.write(id, 0, data) {
                        uploaded = Err(e);
                        break;
                    }
                }
                Err(e) => {
                    uploaded = Err(e);
                    break;
                }
            }
        }
        let launched = uploaded.and_then(|()| b.launch(program, &ids, dims));
        let mut out = Vec::with_capacity(buffers.len());
        for (id, data) in ids.iter().zip(buffers) {
            let mut bytes = vec![0; data.len()];
            if launched.is_ok() {
                b.read(*id, 0, &mut bytes)?;
            }
            b.free(*id)?;
            out.push(bytes);
        }
        b.release(program)?;
        launched.map(|()| out)
    }

    /// [`Conformance::execute`], where a refusal excused for `dtypes` (and `op`, if given)
    /// is a skip (`None`) and any other error a panic naming `what`.
    pub(crate) fn execute_or_skip(
        &self,
        what: &str,
        op: Option<Op>,
        dtypes: &[DType],
        kernel: &Kernel,
        buffers: &[Vec<u8>],
        dims: &Bindings,
    ) -> Option<Vec<Vec<u8>>> {
        match self.execute(kernel, buffers, dims) {
            Ok(out) => Some(out),
            Err(e) => {
                self.refused(what, op, dtypes, &e);
                None
            }
        }
    }

    /// Handles error `e` of running `what`: a skip when it is an excused refusal, else a
    /// panic.
    pub(crate) fn refused(&self, what: &str, op: Option<Op>, dtypes: &[DType], e: &BackendError) {
        let label = self.label();
        let Some(reason) = refusal(e) else {
            panic!("{label}: {what} failed: {e}");
        };
        let info = self.info();
        let denied: Vec<DType> = dtypes
            .iter()
            .copied()
            .filter(|&d| !info.features.supports(d))
            .collect();
        let allowed = op.is_some_and(|op| {
            dtypes
                .first()
                .is_some_and(|&d| (self.tolerance.may_refuse)(info, op, d))
        });
        assert!(
            !denied.is_empty() || allowed,
            "{label}: {what} was refused although the device supports {dtypes:?} and the \
             backend's tolerance does not allow the refusal: {e}"
        );
        self.skipped.set(self.skipped.get() + 1);
        skip(
            &self.test_name(),
            &format!("{}: {what}: refused: {reason}", self.device_name()),
        );
    }

    /// `result`'s value, or a panic naming the device and `what`.
    pub(crate) fn ok<T>(&self, result: Result<T, BackendError>, what: &str) -> T {
        result.unwrap_or_else(|e| panic!("{}: {what}: {e}", self.label()))
    }

    /// `result`'s error, or a panic naming the device and `what`, which succeeded.
    pub(crate) fn fails<T>(&self, result: Result<T, BackendError>, what: &str) -> BackendError {
        match result {
            Ok(_) => panic!("{}: {what} succeeded", self.label()),
            Err(e) => e,
        }
    }

    /// The tolerance in effect.
    pub fn tolerance(&self) -> Tolerance {
        self.tolerance
    }
}

/// Runs `kernel` in the reference interpreter on copies of `buffers`.
pub fn interpret(kernel: &Kernel, buffers: &[Vec<u8>], dims: &Bindings) -> Vec<Vec<u8>> {
    let mut out = buffers.to_vec();
    let mut slices: Vec<&mut [u8]> = out.iter_mut().map(Vec::as_mut_slice).collect();
    interp::run(kernel, &mut slices, dims)
        .unwrap_or_else(|e| panic!("the interpreter failed on `{}`: {e}", kernel.name));
    out
}
