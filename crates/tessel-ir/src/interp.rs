//! The reference interpreter: what a kernel means, executed directly.
//!
//! [`run`] executes a verified [`Kernel`] on host buffers. Every backend's results must
//! agree with it (bit for bit where the ops are exact; see [`tessel_shape::Scalar`]), and
//! the CPU backend falls back to it when no C compiler is available.
//!
//! # Semantics
//!
//! - **Values** are per invocation. ALU ops, casts and bitcasts compute through
//!   [`Scalar`]'s [`unary`](Scalar::unary), [`binary`](Scalar::binary),
//!   [`ternary`](Scalar::ternary), [`cast`](Scalar::cast) and [`bitcast`](Scalar::bitcast),
//!   lane by lane for vectors.
//! - **Memory.** Buffers hold raw little-endian elements of their dtype (`bool` is one byte;
//!   any non-zero byte loads as `true`, and stores write 0 or 1; `f16`/`bf16` are two
//!   bytes, the float8 dtypes one). A load or store of width `w` at index `i` moves elements `i..i + w`. An access
//!   outside `0..len` of its memory (the buffer's *declared* length, not the length of the
//!   slice passed) is an [`InterpError::OutOfBounds`], never undefined behaviour.
//! - **Initial contents.** Local memory (`DefineLocal`) is zeroed at the start of each
//!   workgroup; registers (`DefineReg`) are zeroed each time their definition executes.
//!   Zeroing is this interpreter's choice, so that a kernel reading before writing still
//!   has a deterministic result here; backends may leave both uninitialized, so kernels must
//!   write before they read (the verifier does not check this).
//! - **Control flow.** `Range { start, end }` runs its body for `start, start + 1, ..,
//!   end - 1` (not at all when `end <= start`); both bounds are read once, on entry. `If(c)`
//!   skips to just past its `EndIf` when `c` is false.
//! - **Barriers.** The invocations of one workgroup run in lockstep phases: each runs, in
//!   order of its linear local id (x fastest), until it reaches a barrier or the end; when
//!   every invocation is waiting at the same barrier, all resume. Invocations waiting at
//!   different barriers, or some waiting while others have finished, is an
//!   [`InterpError::BarrierDivergence`]: the verifier rejects barriers under
//!   invocation-dependent control flow, but a condition computed from racing memory
//!   accesses can still diverge.
//! - **Workgroups** run one after another, in order of their linear id (x fastest), on the
//!   calling thread. Running them in parallel would be valid only when no buffer element is
//!   written by more than one workgroup, which the interpreter cannot cheaply prove; the
//!   sequential order also makes racy kernels deterministic here.
//!
//! Each invocation keeps an explicit state (program counter and value slots) instead of
//! recursing through blocks, which is what lets it stop at a barrier and resume later. No
//! loop stack is needed: a loop's variable lives in the `Range`'s own value slot, and its
//! end bound is a value defined before the loop, which the body cannot redefine.

use tessel_shape::{BinaryOp, Bindings, DType, EvalError, Expr, Scalar, ScalarError};

use crate::kernel::{Access, AtomicOp, Inst, Kernel, Mem, Param, Special, Value};
use crate::verify::{Def, VerifyError, verify};

/// Why a kernel could not be interpreted. Every message names the kernel.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InterpError {
    /// The kernel failed verification. (Boxed: a verifier error is large, and every
    /// `Result` of the interpreter would carry its size.)
    #[error(transparent)]
    Verify(#[from] Box<VerifyError>),
    /// The number of buffers passed differs from the kernel's buffer parameters.
    #[error(
        "kernel `{kernel}` takes {expected} buffers (one per buffer parameter, in order), \
         but {actual} were passed"
    )]
    BufferCount {
        /// The kernel's name.
        kernel: String,
        /// The number of `Param::Buffer`s.
        expected: usize,
        /// The number of buffers passed.
        actual: usize,
    },
    /// A buffer passed is shorter than its parameter's declared length.
    #[error(
        "kernel `{kernel}`: buffer `{param}` needs at least {expected} bytes, but the one \
         passed has {actual}"
    )]
    BufferTooSmall {
        /// The kernel's name.
        kernel: String,
        /// The buffer parameter's name.
        param: String,
        /// The declared length in bytes.
        expected: usize,
        /// The length of the slice passed.
        actual: usize,
    },
    /// A dim, buffer length or grid size could not be evaluated with the bindings given.
    #[error("kernel `{kernel}`: cannot evaluate {what}: {source}")]
    Eval {
        /// The kernel's name.
        kernel: String,
        /// What was being evaluated.
        what: String,
        /// Why it failed (most often an unbound dim).
        #[source]
        source: EvalError,
    },
    /// A size or dim value is unusable: negative, too large for memory, or not
    /// representable in its parameter's dtype.
    #[error("kernel `{kernel}`: {reason}")]
    InvalidArgument {
        /// The kernel's name.
        kernel: String,
        /// What is wrong.
        reason: String,
    },
    /// A load or store reached outside its memory.
    #[error(
        "kernel `{kernel}`: at %{at}, {invocation}: {width} element(s) at index {index} lie \
         outside {mem} of {len} elements"
    )]
    OutOfBounds {
        /// The kernel's name.
        kernel: String,
        /// The offending instruction.
        at: u32,
        /// Which invocation, as `group (x, y, z) local (x, y, z)`.
        invocation: String,
        /// The memory accessed, as the message names it: a buffer by its name, local memory
        /// or registers by the value defining them.
        mem: String,
        /// The first element index accessed (saturated to the `i64` range).
        index: i64,
        /// The access width.
        width: u8,
        /// The memory's length in elements.
        len: usize,
    },
    /// The invocations of a workgroup did not all reach the same barrier.
    #[error(
        "kernel `{kernel}`: barrier divergence in workgroup ({}, {}, {}): {detail}; every \
         invocation of a workgroup must reach every barrier",
        .group[0], .group[1], .group[2]
    )]
    BarrierDivergence {
        /// The kernel's name.
        kernel: String,
        /// The workgroup's id.
        group: [u64; 3],
        /// Which invocations were where.
        detail: String,
    },
    /// An op failed on its operands' values (a bitcast to `bool` of a byte other than 0 or
    /// 1; type errors cannot reach here, since the kernel was verified).
    #[error("kernel `{kernel}`: at %{at}: {source}")]
    Op {
        /// The kernel's name.
        kernel: String,
        /// The offending instruction.
        at: u32,
        /// What went wrong.
        #[source]
        source: ScalarError,
    },
}

/// Runs `kernel` over its whole grid.
///
/// `buffers[i]` backs the `i`-th `Param::Buffer` in parameter order, as little-endian
/// bytes of its dtype, and must hold at least its declared length; `dims` binds the
/// variable of every `Param::Dim` (and so every buffer length and grid size). The kernel
/// is verified first. See the [module docs](self) for the semantics.
///
/// ```
/// use tessel_ir::{interp, samples};
/// use tessel_shape::{Bindings, DType};
///
/// let kernel = samples::vector_add(DType::I32, 3, 2).unwrap();
/// let bytes = |v: [i32; 3]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
/// let (mut a, mut b, mut out) = (bytes([1, 2, 3]), bytes([10, 20, 30]), vec![0u8; 12]);
/// interp::run(&kernel, &mut [&mut a, &mut b, &mut out], &Bindings::new()).unwrap();
/// assert_eq!(out, bytes([11, 22, 33]));
/// ```
pub fn run(kernel: &Kernel, buffers: &mut [&mut [u8]], dims: &Bindings) -> Result<(), InterpError> {
    let defs = verify(kernel).map_err(Box::new)?;
    let program = Program::new(kernel, &defs, buffers, dims)?;
    // Accumulate buffers start at zero, as on every backend.
    let params = kernel.params.iter().filter_map(|p| match p {
        Param::Buffer {
            dtype, len, access, ..
        } => Some((*dtype, *len, *access)),
        Param::Dim { .. } => None,
    });
    for ((dtype, len, access), buffer) in params.zip(buffers.iter_mut()) {
        if access == Access::Accumulate {
            let bytes =
                usize::try_from(len.eval(dims).unwrap_or(0)).unwrap_or(0) * dtype.size_bytes();
            let len = buffer.len();
            buffer[..bytes.min(len)].fill(0);
        }
    }
    program.execute(buffers)
}

/// Where a load or store goes, resolved once per run.
#[derive(Clone, Copy)]
enum Target {
    /// The buffer with this ordinal among the buffers passed.
    Global { buffer: usize, dtype: DType },
    /// Local memory starting at this element of the workgroup's local array.
    Local { base: usize },
    /// Registers starting at this element of the invocation's register array.
    Reg { base: usize },
}

/// A resolved memory operand: where, and how many elements it has.
#[derive(Clone, Copy)]
struct MemRef {
    target: Target,
    len: usize,
}

/// Why an invocation stopped running.
enum Stop {
    /// It reached the barrier at this instruction (its program counter is past it).
    Barrier(usize),
    /// It ran off the end of the kernel.
    Done,
}

/// Where an invocation is between phases.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Running,
    /// Waiting at the barrier at this instruction.
    Waiting(usize),
    Done,
}

/// Everything about a kernel that does not change during a run, precomputed once.
struct Program<'k> {
    kernel: &'k Kernel,
    /// For a `Range` or `If`, the position of its `EndRange` or `EndIf`.
    jump: Vec<usize>,
    /// The first lane slot of each instruction's value (meaningful where `width > 0`).
    slot: Vec<usize>,
    /// Lanes of each instruction's value: 0 for instructions without a data value.
    width: Vec<u8>,
    /// Lane slots per invocation.
    lanes: usize,
    /// The memory operand of each `Load` and `Store`, and the registers of each
    /// `DefineReg`.
    mem: Vec<Option<MemRef>>,
    /// The zero of each `DefineReg`'s dtype, where a `DefineReg` is.
    reg_zero: Vec<Scalar>,
    /// Register elements per invocation.
    regs: usize,
    /// The initial (zero) contents of all local memory, concatenated.
    local_init: Vec<Scalar>,
    /// The value of each `Param::Dim`, by parameter position (`Bool(false)` elsewhere).
    dims: Vec<Scalar>,
    /// Workgroups and invocations per workgroup along each axis.
    groups: [u64; 3],
    local: [u64; 3],
}

impl<'k> Program<'k> {
    /// Checks the arguments against the kernel and resolves everything a run needs.
    fn new(
        kernel: &'k Kernel,
        defs: &[Def],
        buffers: &[&mut [u8]],
        bindings: &Bindings,
    ) -> Result<Self, InterpError> {
        let name = || kernel.name.clone();
        let invalid = |reason: String| InterpError::InvalidArgument {
            kernel: name(),
            reason,
        };
        let eval = |e: Expr, what: &dyn Fn() -> String| {
            e.eval(bindings).map_err(|source| InterpError::Eval {
                kernel: name(),
                what: what(),
                source,
            })
        };

        let expected = kernel
            .params
            .iter()
            .filter(|p| matches!(p, Param::Buffer { .. }))
            .count();
        if buffers.len() != expected {
            return Err(InterpError::BufferCount {
                kernel: name(),
                expected,
                actual: buffers.len(),
            });
        }

        // Parameters: dim values first (an unbound dim is reported as such, rather than
        // through the first buffer length that mentions it), then buffers.
        let mut dims = vec![Scalar::Bool(false); kernel.params.len()];
        for (p, param) in kernel.params.iter().enumerate() {
            if let Param::Dim { var, dtype } = param {
                let value = eval(Expr::from(*var), &|| format!("dim `{var}`"))?;
                let scalar = Scalar::I64(value).cast(*dtype);
                if int_of(scalar) != i128::from(value) {
                    return Err(invalid(format!(
                        "dim `{var}` = {value} does not fit its parameter dtype {dtype}"
                    )));
                }
                dims[p] = scalar;
            }
        }
        let mut buffer_of_param = vec![usize::MAX; kernel.params.len()];
        let mut buffer_lens = Vec::new();
        for (p, param) in kernel.params.iter().enumerate() {
            if let Param::Buffer {
                name: buf,
                dtype,
                len,
                ..
            } = param
            {
                buffer_of_param[p] = buffer_lens.len();
                let len = eval(*len, &|| format!("the length of buffer `{buf}`"))?;
                let bytes = usize::try_from(len)
                    .ok()
                    .and_then(|l| l.checked_mul(dtype.size_bytes()))
                    .ok_or_else(|| invalid(format!("buffer `{buf}` has length {len}")))?;
                let passed = buffers[buffer_lens.len()].len();
                if passed < bytes {
                    return Err(InterpError::BufferTooSmall {
                        kernel: name(),
                        param: buf.clone(),
                        expected: bytes,
                        actual: passed,
                    });
                }
                buffer_lens.push(len as usize);
            }
        }

        // The grid.
        let mut sizes = [0u64; 6];
        for (a, dim) in kernel
            .grid
            .groups
            .iter()
            .chain(&kernel.grid.local)
            .enumerate()
        {
            let what = || {
                let kind = if a < 3 {
                    "workgroup count"
                } else {
                    "workgroup size"
                };
                format!("the {kind} along {}", ['x', 'y', 'z'][a % 3])
            };
            let value = eval(*dim, &what)?;
            sizes[a] = u64::try_from(value)
                .map_err(|_| invalid(format!("{} is negative ({value})", what())))?;
        }
        let groups = [sizes[0], sizes[1], sizes[2]];
        let local = [sizes[3], sizes[4], sizes[5]];

        // Value slots, memory layout and block structure.
        let n = kernel.insts.len();
        let mut program = Program {
            kernel,
            jump: vec![0; n],
            slot: vec![0; n],
            width: vec![0; n],
            lanes: 0,
            mem: vec![None; n],
            reg_zero: vec![Scalar::Bool(false); n],
            regs: 0,
            local_init: Vec::new(),
            dims,
            groups,
            local,
        };
        for (i, (inst, def)) in kernel.insts.iter().zip(defs).enumerate() {
            if let Def::Data(ty) = def {
                program.slot[i] = program.lanes;
                program.width[i] = ty.width;
                program.lanes += usize::from(ty.width);
            }
            match *inst {
                Inst::EndRange(v) | Inst::EndIf(v) => program.jump[v.index()] = i,
                Inst::DefineReg { dtype, .. } => program.reg_zero[i] = Scalar::zero(dtype),
                _ => {}
            }
        }
        let mut reg_base = vec![0; n];
        let mut local_base = vec![0; n];
        for (i, def) in defs.iter().enumerate() {
            match *def {
                Def::Local(dtype, len) => {
                    local_base[i] = program.local_init.len();
                    program
                        .local_init
                        .extend(std::iter::repeat_n(Scalar::zero(dtype), len));
                }
                Def::Reg(_, len) => {
                    reg_base[i] = program.regs;
                    // Recorded at the definition too, for zeroing when it executes.
                    program.mem[i] = Some(MemRef {
                        target: Target::Reg { base: program.regs },
                        len,
                    });
                    program.regs += len;
                }
                _ => {}
            }
        }
        for (i, inst) in kernel.insts.iter().enumerate() {
            let (Inst::Load { mem, .. } | Inst::Store { mem, .. } | Inst::Atomic { mem, .. }) =
                *inst
            else {
                continue;
            };
            program.mem[i] = Some(match mem {
                Mem::Global(p) => {
                    let Param::Buffer { dtype, .. } = kernel.params[p] else {
                        continue;
                    };
                    let buffer = buffer_of_param[p];
                    MemRef {
                        target: Target::Global { buffer, dtype },
                        len: buffer_lens[buffer],
                    }
                }
                Mem::Local(v) | Mem::Reg(v) => match defs[v.index()] {
                    Def::Local(_, len) => MemRef {
                        target: Target::Local {
                            base: local_base[v.index()],
                        },
                        len,
                    },
                    Def::Reg(_, len) => MemRef {
                        target: Target::Reg {
                            base: reg_base[v.index()],
                        },
                        len,
                    },
                    _ => continue,
                },
            });
        }
        Ok(program)
    }

    /// Runs every workgroup in order.
    fn execute(&self, buffers: &mut [&mut [u8]]) -> Result<(), InterpError> {
        let invocations = self
            .local
            .iter()
            .try_fold(1usize, |acc, &l| acc.checked_mul(usize::try_from(l).ok()?))
            .filter(|&n| n.checked_mul(self.lanes.max(self.regs)).is_some())
            .ok_or_else(|| InterpError::InvalidArgument {
                kernel: self.kernel.name.clone(),
                reason: format!("a workgroup of {:?} invocations is too large", self.local),
            })?;
        if invocations == 0 || self.groups.contains(&0) {
            return Ok(());
        }
        let mut wg = Workgroup {
            vals: vec![Scalar::Bool(false); invocations * self.lanes],
            regs: vec![Scalar::Bool(false); invocations * self.regs],
            local: self.local_init.clone(),
            pc: vec![0; invocations],
            status: vec![Status::Running; invocations],
            local_ids: (0..invocations as u64)
                .map(|l| {
                    let [x, y, _] = self.local;
                    [l % x, l / x % y, l / (x * y)]
                })
                .collect(),
            group: [0; 3],
        };
        for z in 0..self.groups[2] {
            for y in 0..self.groups[1] {
                for x in 0..self.groups[0] {
                    wg.group = [x, y, z];
                    self.run_workgroup(&mut wg, buffers)?;
                }
            }
        }
        Ok(())
    }

    /// Runs one workgroup in lockstep phases between barriers.
    fn run_workgroup(
        &self,
        wg: &mut Workgroup,
        buffers: &mut [&mut [u8]],
    ) -> Result<(), InterpError> {
        wg.local.copy_from_slice(&self.local_init);
        wg.pc.fill(0);
        wg.status.fill(Status::Running);
        loop {
            for inv in 0..wg.status.len() {
                if wg.status[inv] == Status::Running {
                    wg.status[inv] = match self.run_invocation(wg, inv, buffers)? {
                        Stop::Barrier(at) => Status::Waiting(at),
                        Stop::Done => Status::Done,
                    };
                }
            }
            // Every invocation now waits at a barrier or is done.
            let first_waiting = wg
                .status
                .iter()
                .position(|s| matches!(s, Status::Waiting(_)));
            let Some(first) = first_waiting else {
                return Ok(());
            };
            let Status::Waiting(at) = wg.status[first] else {
                unreachable!("found waiting")
            };
            if let Some(other) = wg.status.iter().position(|s| *s != Status::Waiting(at)) {
                let local = |inv: usize| {
                    let [x, y, z] = wg.local_ids[inv];
                    format!("({x}, {y}, {z})")
                };
                let whereabouts = match wg.status[other] {
                    Status::Waiting(b) => format!("waits at the barrier %{b}"),
                    _ => "has finished".to_owned(),
                };
                return Err(InterpError::BarrierDivergence {
                    kernel: self.kernel.name.clone(),
                    group: wg.group,
                    detail: format!(
                        "invocation {} waits at the barrier %{at} while invocation {} {whereabouts}",
                        local(first),
                        local(other)
                    ),
                });
            }
            wg.status.fill(Status::Running);
        }
    }

    /// Runs invocation `inv` from its program counter to the next barrier or the end.
    fn run_invocation(
        &self,
        wg: &mut Workgroup,
        inv: usize,
        buffers: &mut [&mut [u8]],
    ) -> Result<Stop, InterpError> {
        let insts = &self.kernel.insts;
        let vals = &mut wg.vals[inv * self.lanes..(inv + 1) * self.lanes];
        let regs = &mut wg.regs[inv * self.regs..(inv + 1) * self.regs];
        let local = &mut wg.local;
        let ids = Ids {
            group: wg.group,
            local: wg.local_ids[inv],
        };
        let op_err = |at: usize, source: ScalarError| InterpError::Op {
            kernel: self.kernel.name.clone(),
            at: at as u32,
            source,
        };
        let slot = |v: Value| self.slot[v.index()];
        let mut pc = wg.pc[inv];
        while let Some(inst) = insts.get(pc) {
            let out = self.slot[pc];
            match inst {
                Inst::Const(c) => vals[out] = *c,
                Inst::DimParam(p) => vals[out] = self.dims[*p],
                Inst::Special(special, dtype) => {
                    let id = match *special {
                        Special::GroupId(a) => ids.group[usize::from(a)],
                        Special::LocalId(a) => ids.local[usize::from(a)],
                    };
                    vals[out] = Scalar::U64(id).cast(*dtype);
                }
                Inst::Range { start, end } => {
                    if int_of(vals[slot(*start)]) < int_of(vals[slot(*end)]) {
                        vals[out] = vals[slot(*start)];
                    } else {
                        pc = self.jump[pc];
                    }
                }
                Inst::EndRange(var) => {
                    let Inst::Range { end, .. } = insts[var.index()] else {
                        unreachable!("verified: EndRange closes a Range")
                    };
                    let current = vals[slot(*var)];
                    let next = int_of(current) + 1;
                    if next < int_of(vals[slot(end)]) {
                        vals[slot(*var)] = int_as(next, current.dtype());
                        pc = var.index();
                    }
                }
                Inst::If(cond) => {
                    if !matches!(vals[slot(*cond)], Scalar::Bool(true)) {
                        pc = self.jump[pc];
                    }
                }
                Inst::EndIf(_) | Inst::DefineLocal { .. } => {}
                Inst::DefineReg { len, .. } => {
                    let Some(MemRef {
                        target: Target::Reg { base },
                        ..
                    }) = self.reg_ref(pc)
                    else {
                        unreachable!("resolved in Program::new")
                    };
                    regs[base..base + len].fill(self.reg_zero[pc]);
                }
                Inst::Load { index, width, .. } => {
                    let (m, first) = self.access(pc, vals[slot(*index)], *width, ids)?;
                    for lane in 0..usize::from(*width) {
                        vals[out + lane] = match m.target {
                            Target::Global { buffer, dtype } => {
                                read_elem(buffers[buffer], first + lane, dtype)
                            }
                            Target::Local { base } => local[base + first + lane],
                            Target::Reg { base } => regs[base + first + lane],
                        };
                    }
                }
                Inst::Store { index, value, .. } => {
                    let width = self.width[value.index()];
                    let (m, first) = self.access(pc, vals[slot(*index)], width, ids)?;
                    for lane in 0..usize::from(width) {
                        let v = vals[slot(*value) + lane];
                        match m.target {
                            Target::Global { buffer, dtype } => {
                                write_elem(buffers[buffer], first + lane, dtype, v);
                            }
                            Target::Local { base } => local[base + first + lane] = v,
                            Target::Reg { base } => regs[base + first + lane] = v,
                        }
                    }
                }
                Inst::Atomic {
                    op, index, value, ..
                } => {
                    let (m, at) = self.access(pc, vals[slot(*index)], 1, ids)?;
                    let Target::Global { buffer, dtype } = m.target else {
                        unreachable!("verified: atomic updates go to global buffers")
                    };
                    // Unsigned dtypes only for `Max` (verified), whose `Max` is unsigned.
                    let op = match op {
                        AtomicOp::Add => BinaryOp::Add,
                        AtomicOp::Max => BinaryOp::Max,
                    };
                    let combined = read_elem(buffers[buffer], at, dtype)
                        .binary(op, vals[slot(*value)])
                        .map_err(|e| op_err(pc, e))?;
                    write_elem(buffers[buffer], at, dtype, combined);
                }
                Inst::Barrier => {
                    wg.pc[inv] = pc + 1;
                    return Ok(Stop::Barrier(pc));
                }
                Inst::Unary(op, a) => {
                    for lane in 0..usize::from(self.width[pc]) {
                        vals[out + lane] = vals[slot(*a) + lane]
                            .unary(*op)
                            .map_err(|e| op_err(pc, e))?;
                    }
                }
                Inst::Binary(op, a, b) => {
                    for lane in 0..usize::from(self.width[pc]) {
                        let (x, y) = (vals[slot(*a) + lane], vals[slot(*b) + lane]);
                        vals[out + lane] = x.binary(*op, y).map_err(|e| op_err(pc, e))?;
                    }
                }
                Inst::Ternary(op, a, b, c) => {
                    for lane in 0..usize::from(self.width[pc]) {
                        let (x, y, z) = (
                            vals[slot(*a) + lane],
                            vals[slot(*b) + lane],
                            vals[slot(*c) + lane],
                        );
                        vals[out + lane] =
                            Scalar::ternary(*op, x, y, z).map_err(|e| op_err(pc, e))?;
                    }
                }
                Inst::Cast(a, dtype) => {
                    for lane in 0..usize::from(self.width[pc]) {
                        vals[out + lane] = vals[slot(*a) + lane].cast(*dtype);
                    }
                }
                Inst::Bitcast(a, dtype) => {
                    for lane in 0..usize::from(self.width[pc]) {
                        vals[out + lane] = vals[slot(*a) + lane]
                            .bitcast(*dtype)
                            .map_err(|e| op_err(pc, e))?;
                    }
                }
                Inst::Vectorize(parts) => {
                    for (lane, part) in parts.iter().enumerate() {
                        vals[out + lane] = vals[slot(*part)];
                    }
                }
                Inst::Extract(v, lane) => vals[out] = vals[slot(*v) + usize::from(*lane)],
            }
            pc += 1;
        }
        wg.pc[inv] = pc;
        Ok(Stop::Done)
    }

    /// The register memory a `DefineReg` at `at` occupies.
    fn reg_ref(&self, at: usize) -> Option<MemRef> {
        self.mem.get(at).copied().flatten()
    }

    /// Resolves a `width`-element access by the `Load` or `Store` at `at`, checking bounds;
    /// returns the memory and the first element's index.
    fn access(
        &self,
        at: usize,
        index: Scalar,
        width: u8,
        ids: Ids,
    ) -> Result<(MemRef, usize), InterpError> {
        let Some(m) = self.mem[at] else {
            unreachable!("resolved in Program::new")
        };
        let first = int_of(index);
        if first < 0 || first + i128::from(width) > m.len as i128 {
            let mem = match self.kernel.insts[at] {
                Inst::Load { mem, .. } | Inst::Store { mem, .. } | Inst::Atomic { mem, .. } => {
                    match mem {
                        Mem::Global(p) => format!("buffer `{}`", self.kernel.params[p].name()),
                        Mem::Local(v) => format!("local memory {v}"),
                        Mem::Reg(v) => format!("registers {v}"),
                    }
                }
                _ => unreachable!("only loads and stores access memory"),
            };
            let [gx, gy, gz] = ids.group;
            let [lx, ly, lz] = ids.local;
            return Err(InterpError::OutOfBounds {
                kernel: self.kernel.name.clone(),
                at: at as u32,
                invocation: format!("group ({gx}, {gy}, {gz}) local ({lx}, {ly}, {lz})"),
                mem,
                index: i64::try_from(first).unwrap_or(if first < 0 { i64::MIN } else { i64::MAX }),
                width,
                len: m.len,
            });
        }
        Ok((m, first as usize))
    }
}

/// The identity of an invocation.
#[derive(Clone, Copy)]
struct Ids {
    group: [u64; 3],
    local: [u64; 3],
}

/// The mutable state of one workgroup's run, reused across workgroups.
struct Workgroup {
    /// Value lanes, `Program::lanes` per invocation.
    vals: Vec<Scalar>,
    /// Register elements, `Program::regs` per invocation.
    regs: Vec<Scalar>,
    /// The workgroup's local memory.
    local: Vec<Scalar>,
    /// Each invocation's next instruction.
    pc: Vec<usize>,
    status: Vec<Status>,
    /// Each invocation's local id, by linear local id.
    local_ids: Vec<[u64; 3]>,
    group: [u64; 3],
}

/// The exact value of an integer (or `bool`) scalar. Other dtypes cannot reach here in a
/// verified kernel; they convert like [`Scalar::to_i64`].
fn int_of(s: Scalar) -> i128 {
    match s {
        Scalar::Bool(x) => i128::from(x),
        Scalar::U8(x) => i128::from(x),
        Scalar::U16(x) => i128::from(x),
        Scalar::U32(x) => i128::from(x),
        Scalar::U64(x) => i128::from(x),
        Scalar::I8(x) => i128::from(x),
        Scalar::I16(x) => i128::from(x),
        Scalar::I32(x) => i128::from(x),
        Scalar::I64(x) => i128::from(x),
        _ => i128::from(s.to_i64()),
    }
}

/// `value` as a scalar of the integer `dtype`; `value` must be representable.
fn int_as(value: i128, dtype: DType) -> Scalar {
    if dtype == DType::U64 {
        Scalar::U64(value as u64)
    } else {
        Scalar::I64(value as i64).cast(dtype)
    }
}

/// Element `index` of a buffer of `dtype` (in bounds, checked by the caller).
fn read_elem(bytes: &[u8], index: usize, dtype: DType) -> Scalar {
    let size = dtype.size_bytes();
    Scalar::from_le_bytes(dtype, &bytes[index * size..(index + 1) * size])
}

/// Writes `value` (of `dtype`, as the verifier guarantees) to element `index`.
fn write_elem(bytes: &mut [u8], index: usize, dtype: DType, value: Scalar) {
    let size = dtype.size_bytes();
    let raw = value.to_bits().to_le_bytes();
    bytes[index * size..(index + 1) * size].copy_from_slice(&raw[..size]);
}
