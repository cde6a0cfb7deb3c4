//! Programs a plan runs: a backend's compiled program, released when the last plan
//! holding it is dropped, or one compiled on first use.

use std::sync::{Arc, OnceLock};

use tessel_ir::{Backend, BackendError, Kernel, ProgramId};

use crate::device::Device;

/// A compiled program, released when the last plan holding it is dropped.
pub(crate) struct Program {
    /// The backend's program, once built.
    built: OnceLock<std::result::Result<ProgramId, BackendError>>,
    /// What to build on first use, for a program whose compile waits until measurement
    /// wants it (another launch shape of a kernel, see [`crate::tuning`]).
    deferred: Option<Kernel>,
    backend: Arc<dyn Backend>,
    device: Device,
}

impl Program {
    pub(crate) fn built(backend: Arc<dyn Backend>, device: Device, id: ProgramId) -> Program {
        Program {
            built: OnceLock::from(Ok(id)),
            deferred: None,
            backend,
            device,
        }
    }

    /// A program compiled from `kernel` the first time [`Program::id`] is asked for.
    pub(crate) fn deferred(backend: Arc<dyn Backend>, device: Device, kernel: Kernel) -> Program {
        Program {
            built: OnceLock::new(),
            deferred: Some(kernel),
            backend,
            device,
        }
    }

    /// The backend's id of the program, compiling it first if it was deferred.
    pub(crate) fn id(&self) -> std::result::Result<ProgramId, BackendError> {
        self.built
            .get_or_init(|| match &self.deferred {
                Some(kernel) => {
                    tracing::debug!(target: "tessel::kernels", "compiling {} on {}:\n{kernel}", kernel.name, self.device);
                    self.backend.compile(self.device.ordinal, kernel)
                }
                None => Err(BackendError::InvalidArgument(
                    "a program without a kernel was never built".into(),
                )),
            })
            .clone()
    }

    /// Whether the program is built (or failed to build): a deferred one asked for.
    pub(crate) fn is_built(&self) -> bool {
        self.built.get().is_some()
    }

    /// A program id the backend never handed out: launching it fails. For tests of what
    /// happens when a plan fails at execution.
    #[cfg(test)]
    pub(crate) fn unbuilt(backend: Arc<dyn Backend>, device: Device) -> Program {
        Program::built(backend, device, ProgramId(u64::MAX))
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        if let Some(Ok(id)) = self.built.get()
            && let Err(e) = self.backend.release(*id)
        {
            tracing::warn!("releasing a program on {}: {e}", self.device);
        }
    }
}

/// A built program's handle.
pub(crate) fn program(backend: &Arc<dyn Backend>, device: Device, id: ProgramId) -> Arc<Program> {
    Arc::new(Program::built(backend.clone(), device, id))
}
