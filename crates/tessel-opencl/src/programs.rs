//! Building OpenCL programs, and the bounded cache of built ones.
//!
//! A program is built for one device from one source, so the cache is keyed by the device
//! and a hash of the source; the source itself is kept and compared on a hit, so a hash
//! collision costs a rebuild, never a wrong kernel. Entries are evicted least recently used
//! first; a live `ProgramId` holds its own reference, so eviction never invalidates one.

use std::sync::Arc;
use std::time::Instant;

use opencl3::program::Program;
use tessel_ir::cache::BuiltCache;
use tessel_ir::{BackendError, Inst, Kernel, codegen};
use tessel_shape::{DType, Dim};

use crate::device::ClDevice;

/// A kernel's program built for one device (shared by the kernels built together with it).
pub(crate) struct Built {
    pub(crate) program: Arc<Program>,
    /// The kernel's own source, the cache's key.
    source: String,
    /// The kernel function's name in `program` where it is not the source's own
    /// ([`codegen::entry_name`]): renamed when built with others.
    pub(crate) entry: Option<String>,
}

/// Built programs by device and source (see [`BuiltCache`]).
pub(crate) type ProgramCache = BuiltCache<Built>;

/// A [`ProgramCache`] of at most `capacity` programs.
pub(crate) fn program_cache(capacity: usize) -> ProgramCache {
    BuiltCache::new(capacity, |b| &b.source)
}

/// Builds `source` for `device`; a failure carries the driver's build log.
pub(crate) fn build(device: &ClDevice, kernel: &str, source: &str) -> Result<Built, BackendError> {
    Ok(Built {
        program: Arc::new(build_program(device, kernel, source)?),
        source: source.to_owned(),
        entry: None,
    })
}

/// Builds the kernels `(name, source, entry)` of `parts` as one program: the driver's fixed
/// cost per build (PoCL parses clang's whole `opencl-c.h` for every program, about 0.2 s)
/// is paid once. An error names every kernel; the caller builds them one by one to learn
/// which failed.
pub(crate) fn build_together(
    device: &ClDevice,
    parts: &[(&str, &str, &str)],
) -> Result<Vec<Built>, BackendError> {
    let names: Vec<&str> = parts.iter().map(|&(n, _, _)| n).collect();
    // Renamed `{entry}_{i}`: two candidates may share a name.
    let entries: Vec<String> = (parts.iter().enumerate())
        .map(|(i, &(_, _, entry))| format!("{entry}_{i}"))
        .collect();
    let combined: Vec<(&str, &str, &str)> = (parts.iter().zip(&entries))
        .map(|(&(_, source, entry), renamed)| (source, entry, renamed.as_str()))
        .collect();
    let Some(source) = codegen::combine(&combined) else {
        return Err(BackendError::Compile {
            kernel: names.join(", "),
            code: String::new(),
            log: "a source that does not define its entry function cannot be built with others"
                .into(),
        });
    };
    let program = Arc::new(build_program(device, &names.join(", "), &source)?);
    Ok(parts
        .iter()
        .zip(entries)
        .map(|(&(_, source, _), entry)| Built {
            program: Arc::clone(&program),
            source: source.to_owned(),
            entry: Some(entry),
        })
        .collect())
}

/// Builds one program from `source`; `kernel` names what it holds in errors and logs.
fn build_program(device: &ClDevice, kernel: &str, source: &str) -> Result<Program, BackendError> {
    let fail = |log: String| BackendError::Compile {
        kernel: kernel.to_owned(),
        code: source.to_owned(),
        log,
    };
    let started = Instant::now();
    let mut program = Program::create_from_source(&device.context, source)
        .map_err(|e| fail(format!("clCreateProgramWithSource failed: {e}")))?;
    let id = device.device.id();
    let result = program.build(&[id], &device.build_options);
    let log = program.get_build_log(id).unwrap_or_default();
    let log = log.trim();
    if let Err(e) = result {
        let log = if log.is_empty() {
            "(the driver gave no build log)"
        } else {
            log
        };
        return Err(fail(format!("clBuildProgram failed: {e}\n{log}")));
    }
    if !log.is_empty() {
        tracing::debug!(kernel, "tessel-opencl: build log:\n{log}");
    }
    tracing::debug!(kernel, elapsed = ?started.elapsed(), device = %device.info.name, "tessel-opencl: program built");
    Ok(program)
}

/// Checks what the device's limits decide before a launch: the kernel's local memory and,
/// when constant, its workgroup size.
pub(crate) fn check_limits(device: &ClDevice, kernel: &Kernel) -> Result<(), BackendError> {
    let unsupported = |what: String| BackendError::Unsupported {
        backend: "opencl",
        what: format!("kernel `{}` on {}: {what}", kernel.name, device.info.name),
    };
    let local_bytes: u64 = kernel
        .insts
        .iter()
        .map(|inst| match inst {
            // `bool` arrays are OpenCL's `bool`, one byte on every known device.
            Inst::DefineLocal { dtype, len } => {
                (*len as u64).saturating_mul(if *dtype == DType::Bool {
                    1
                } else {
                    dtype.size_bytes() as u64
                })
            }
            _ => 0,
        })
        .fold(0, u64::saturating_add);
    if local_bytes > device.info.local_memory_bytes {
        return Err(unsupported(format!(
            "needs {local_bytes} bytes of local memory, and the device has {}",
            device.info.local_memory_bytes
        )));
    }
    let local = kernel.grid.local.map(Dim::as_const);
    if let [Some(x), Some(y), Some(z)] = local {
        let max = device.info.max_local_size;
        let fits = [x, y, z]
            .iter()
            .zip(max)
            .all(|(&size, max)| size <= i64::from(max));
        let total = x.saturating_mul(y).saturating_mul(z);
        if !fits || total > i64::from(device.info.max_workgroup_size) {
            return Err(unsupported(format!(
                "workgroups of ({x}, {y}, {z}) invocations exceed the device's limits of \
                 {max:?} per axis and {} in all",
                device.info.max_workgroup_size
            )));
        }
    }
    Ok(())
}
