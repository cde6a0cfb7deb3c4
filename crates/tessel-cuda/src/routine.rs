//! Matrix-product programs: the checks before a launch, and the launch itself, by cuBLAS
//! (cuBLASLt with an epilogue, split into padded parts where `matmul::padded` says so) or
//! by the generated tensor-core kernel (`mma.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cudarc::driver::result::DriverError;
use tessel_ir::handles::{self, lock};
use tessel_ir::{BackendError, BufferId, Matmul, ProgramOrigin, VendorProgram};
use tessel_shape::{Bindings, DType};

use crate::device::CudaDevice;
use crate::ffi::{self, ArgSlot, Module};
use crate::matmul::{self, Gemm, Plan, Precision};
use crate::{CudaBackend, GeneratedMatmul, Program, Timing, mma, queue_timed};

/// A matrix product, run by cuBLAS or by the generated tensor-core kernel.
pub(crate) struct MatmulProgram {
    op: Matmul,
    precision: Precision,
    device: Arc<CudaDevice>,
    /// `op` as text: the program's name in errors.
    name: String,
    by: MatmulBy,
}

/// What runs a [`MatmulProgram`].
enum MatmulBy {
    /// cuBLAS (cuBLASLt with an epilogue), on a device whose handles exist.
    Library,
    /// The generated tensor-core kernel ([`mma`]) with one tile shape.
    Generated {
        module: Arc<Module>,
        tile: mma::Tile,
        origin: ProgramOrigin,
    },
}

impl CudaBackend {
    /// The programs for `matmul` on `device` ([`Backend::vendor`]).
    pub(crate) fn matmul_programs(
        &self,
        device: usize,
        matmul: &Matmul,
    ) -> Result<Vec<VendorProgram>, BackendError> {
        let dev = self.device(device)?;
        let Some(precision) = Precision::of(matmul) else {
            return Ok(Vec::new());
        };
        let program = |by| MatmulProgram {
            op: matmul.clone(),
            precision,
            device: Arc::clone(dev),
            name: matmul.to_string(),
            by,
        };
        let mut out = Vec::new();
        // Epilogues run on cuBLASLt, in the precisions it has tensor-core routines for, and
        // f32.
        if dev.ensure_blas()?
            && (matmul.epilogue.is_none()
                || (precision != Precision::F64
                    && ffi::cublaslt::has_epilogue(matmul.epilogue)
                    && dev.ensure_lt()?))
        {
            out.push(VendorProgram {
                program: self
                    .programs
                    .insert(Program::Matmul(program(MatmulBy::Library))),
                variant: "cuBLAS".into(),
                // One stream, one workspace: cuBLAS repeats its results bit for bit.
                deterministic: true,
            });
        }
        let wanted = match self.config.generated_matmul {
            GeneratedMatmul::Always => true,
            // Full-precision f32: cuBLAS runs it on the CUDA cores, 3xTF32 on tensor cores.
            GeneratedMatmul::Fallback => {
                out.is_empty() || (matmul.dtype == DType::F32 && !matmul.allow_tf32)
            }
            GeneratedMatmul::Never => false,
        };
        if !wanted {
            return Ok(out);
        }
        if let Some(why) = mma::supports(matmul, dev.capability) {
            tracing::trace!("tessel-cuda: no generated matmul for {matmul}: {why}");
            return Ok(out);
        }
        let built: Vec<_> = std::thread::scope(|scope| {
            let workers: Vec<_> = mma::tiles(matmul.dtype)
                .iter()
                .map(|tile| scope.spawn(move || (tile, self.generated_module(dev, matmul, tile))))
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        for (tile, module) in built {
            match module {
                Ok((module, origin)) => out.push(VendorProgram {
                    program: self
                        .programs
                        .insert(Program::Matmul(program(MatmulBy::Generated {
                            module,
                            tile: *tile,
                            origin,
                        }))),
                    variant: tile.label(matmul.dtype),
                    deterministic: true,
                }),
                // A tile this device cannot hold (too much shared memory) is left out.
                Err(e) => tracing::warn!(
                    "tessel-cuda: {matmul}: no {}: {e}",
                    tile.label(matmul.dtype)
                ),
            }
        }
        Ok(out)
    }

    /// The generated matmul kernel for `op` with `tile`, compiled (or from a cache) and
    /// allowed its shared memory.
    fn generated_module(
        &self,
        dev: &CudaDevice,
        op: &Matmul,
        tile: &mma::Tile,
    ) -> Result<(Arc<Module>, ProgramOrigin), BackendError> {
        let name = format!("{op} [{}]", tile.label(op.dtype));
        let (module, origin) = self.module(dev, &name, mma::ENTRY, &mma::source(op, tile))?;
        module
            .allow_shared(tile.shared_bytes(op))
            .map_err(|e| BackendError::Compile {
                kernel: name,
                code: String::new(),
                log: format!(
                    "{} bytes of shared memory are more than the device allows: {e}",
                    tile.shared_bytes(op)
                ),
            })?;
        Ok((module, origin))
    }

    /// Checks a matmul launch ([`matmul::plan`]) and queues it: one cuBLAS call, or a zero
    /// fill when `k == 0`, or nothing for an empty output.
    pub(crate) fn enqueue_matmul(
        &self,
        program: &MatmulProgram,
        buffers: &[BufferId],
        dims: &Bindings,
        timed: bool,
    ) -> Result<Option<Timing>, BackendError> {
        let dev = &program.device;
        let name = &program.name;
        let invalid = |why: String| BackendError::InvalidArgument(format!("cuda {name}: {why}"));
        let epilogue = program.op.epilogue;
        let (lhs, rhs, bias, out) = match (epilogue.bias, buffers) {
            (false, &[lhs, rhs, out]) => (lhs, rhs, None, out),
            (true, &[lhs, rhs, bias, out]) => (lhs, rhs, Some(bias), out),
            _ => {
                let names = if epilogue.bias {
                    "4 buffers, [lhs, rhs, bias, out]"
                } else {
                    "3 buffers, [lhs, rhs, out]"
                };
                return Err(invalid(format!(
                    "takes {names}, but {} were bound",
                    buffers.len()
                )));
            }
        };
        let bound = self.buffers.get_all(buffers)?;
        handles::check_launch_devices(
            "cuda",
            name,
            dev.index,
            buffers,
            bound.iter().map(|b| b.device.index),
        )?;
        // cuBLAS would read operand elements it has already overwritten.
        if out == lhs || out == rhs || Some(out) == bias {
            return Err(invalid(format!(
                "buffer {} is bound both as the output and as an operand",
                out.0
            )));
        }
        let sizes = program
            .op
            .sizes(dims)
            .map_err(|e| invalid(format!("cannot evaluate its sizes: {e}")))?;
        let last = bound.len() - 1;
        let plan = matmul::plan(
            &program.op,
            name,
            program.precision,
            &sizes,
            [bound[0].bytes, bound[1].bytes, bound[last].bytes],
        )?;
        if plan == Plan::Nothing {
            return Ok(None);
        }
        // The bias holds one element per output column.
        let bias = match bias {
            Some(_) => {
                let need = sizes.n.saturating_mul(program.precision.size_bytes());
                if bound[2].bytes < need {
                    return Err(invalid(format!(
                        "the bias buffer holds {} bytes, but n = {} needs {need}",
                        bound[2].bytes, sizes.n
                    )));
                }
                bound[2].ptr
            }
            None => 0,
        };
        let [lhs, rhs, out] = [0, 1, last].map(|j| bound[j].ptr);
        if let MatmulBy::Generated { module, tile, .. } = &program.by {
            // The kernel zero-fills past `k`, so an empty sum needs nothing special.
            let Some(launch) = mma::launch(&program.op, tile, &sizes, name)? else {
                return Ok(None);
            };
            return queue_timed(dev, name, timed, || {
                launch_generated(dev, module, &launch, [lhs, rhs, bias, out]).map_err(|e| {
                    BackendError::Launch {
                        kernel: name.clone(),
                        reason: format!("cuLaunchKernel failed: {e}"),
                    }
                })?;
                self.counters
                    .vendor_launches
                    .fetch_add(1, Ordering::Relaxed);
                Ok(())
            });
        }
        let work = || {
            match plan {
                Plan::Nothing => {}
                Plan::Zero { bytes } if epilogue.is_none() => {
                    ffi::fill(&dev.ctx, &dev.stream, out, 0, bytes)
                        .map_err(|e| dev.lost("cuMemsetD8Async", e))?;
                }
                // An empty sum with an epilogue is `activation(bias)`: no routine for it.
                Plan::Zero { .. } => {
                    return Err(BackendError::Unsupported {
                        backend: "cuda",
                        what: format!("{name}: an epilogue over an empty sum (k = 0)"),
                    });
                }
                Plan::Gemm(gemm) => program.run(&gemm, [rhs, lhs, bias, out])?,
            }
            self.counters
                .vendor_launches
                .fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        queue_timed(dev, name, timed, work)
    }
}

impl MatmulProgram {
    pub(crate) fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Where the program came from: a generated kernel's module origin; a cuBLAS call has
    /// nothing compiled.
    pub(crate) fn origin(&self) -> ProgramOrigin {
        match &self.by {
            MatmulBy::Generated { origin, .. } => *origin,
            MatmulBy::Library => ProgramOrigin::Cached,
        }
    }

    /// Queues the GEMM `g` (see [`MatmulProgram::call`]): split into parts writing rows
    /// padded to 16 bytes, then copied into place, where [`matmul::padded`] says that runs
    /// faster; directly when there is no memory for the padded rows.
    fn run(&self, g: &Gemm, [a, b, bias, c]: [u64; 4]) -> Result<(), BackendError> {
        let dev = &self.device;
        let Some(padded) = matmul::padded(self.precision, g) else {
            return self.call(g, [a, b, bias, c]);
        };
        let element = self.precision.size_bytes();
        let [rows, row, padded_row] =
            [g.n, g.m, padded.main.ldc].map(|v| v.unsigned_abs() as usize);
        let rows = rows * g.batch.unsigned_abs() as usize;
        let scratch = rows
            .checked_mul(padded_row * element)
            .and_then(|bytes| lock(&dev.pool).alloc(&dev.ctx, &dev.stream, bytes).ok());
        let Some((scratch, class)) = scratch else {
            return self.call(g, [a, b, bias, c]);
        };
        let (rest, a_offset, c_offset) = padded.rest;
        let at = |base: u64, elements: i64| base + elements.unsigned_abs() * element as u64;
        let bias_rest = if bias == 0 { 0 } else { at(bias, c_offset) };
        let ran = self
            .call(&padded.main, [a, b, bias, scratch])
            .and_then(|()| {
                self.call(
                    &rest,
                    [at(a, a_offset), b, bias_rest, at(scratch, c_offset)],
                )
            })
            .and_then(|()| {
                ffi::copy_rows(
                    &dev.ctx,
                    &dev.stream,
                    [c, (row * element) as u64],
                    [scratch, (padded_row * element) as u64],
                    [row * element, rows],
                )
                .map_err(|e| dev.lost("cuMemcpy2DAsync", e))
            });
        dev.release_scratch(scratch, class);
        ran
    }

    /// Queues one GEMM of this program as `g` describes it: cuBLAS without an epilogue,
    /// cuBLASLt with one. `[a, b, bias, c]` are cuBLAS's `A'` (the rhs), `B'` (the lhs),
    /// the bias (0 without one) and the output, checked by the caller against `g`.
    fn call(&self, g: &Gemm, [a, b, bias, c]: [u64; 4]) -> Result<(), BackendError> {
        let dev = &self.device;
        let failed = |reason: String| BackendError::Launch {
            kernel: self.name.clone(),
            reason,
        };
        let epilogue = self.op.epilogue;
        if epilogue.is_none() {
            let blas = lock(&dev.blas);
            // `vendor` made the handle before it made the program, and it stays until the
            // device goes.
            let blas = blas
                .as_ref()
                .ok_or_else(|| failed("the device has no cuBLAS handle".into()))?;
            blas.gemm(&dev.ctx, self.precision, g, [a, b, c])
                .map_err(failed)
        } else {
            let mut lt = lock(&dev.lt);
            let lt = lt
                .as_mut()
                .ok_or_else(|| failed("the device has no cuBLASLt handle".into()))?;
            lt.matmul(
                &dev.ctx,
                &dev.stream,
                self.precision,
                g,
                epilogue,
                [a, b, bias, c],
            )
            .map_err(failed)
        }
    }
}

/// Queues one launch of the generated matmul kernel on `dev`'s stream with the pointers
/// `[lhs, rhs, bias, out]` (bias 0 without one), in the kernel's parameter order.
fn launch_generated(
    dev: &CudaDevice,
    module: &Module,
    launch: &mma::Launch,
    pointers: [u64; 4],
) -> Result<(), DriverError> {
    let mut slots: Vec<ArgSlot> = pointers.iter().map(|p| ArgSlot(p.to_ne_bytes())).collect();
    for size in launch.sizes {
        let mut slot = ArgSlot::default();
        slot.0[..4].copy_from_slice(&size.to_ne_bytes());
        slots.push(slot);
    }
    slots.extend(launch.strides.map(|s| ArgSlot(s.to_ne_bytes())));
    module.launch(
        &dev.ctx,
        &dev.stream,
        [launch.grid, launch.block],
        launch.shared,
        &mut slots,
    )
}
