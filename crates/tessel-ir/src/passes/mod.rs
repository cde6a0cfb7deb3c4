//! Optimization passes over the kernel IR.
//!
//! Every pass is a pure function from a [`Kernel`] to a new [`Kernel`]:
//!
//! - [`fold`]: constant folding through [`Scalar`]'s op semantics, plus algebraic identities
//!   that are exact for every input (mostly integer ones), constant `If`s and empty `Range`s;
//! - [`cse`]: common subexpression elimination of pure instructions, respecting scopes;
//! - [`dce`]: dead code elimination (unused pure values and loads, stores to memory nobody
//!   reads, empty blocks);
//! - [`licm`]: loop-invariant code motion of pure instructions out of `Range`s;
//! - [`unroll`]: full unrolling of small constant `Range`s;
//! - [`guard`]: accesses the verifier cannot prove in bounds made safe (loads outside read
//!   zeros, stores outside are dropped), run by every backend before it compiles;
//! - [`merge_buffers`]: several buffer parameters made one, each access shifted by the
//!   lengths before its own (a kernel's several outputs as one graph value);
//! - [`vectorize`]: scalar loads and stores of consecutive elements merged into vector
//!   accesses (run by the dialects that read vectors in one instruction, not by `optimize`);
//! - [`optimize`]: the standard pipeline of all of them.
//!
//! Two guarantees hold for every pass: the output verifies whenever the input does, and the
//! output computes bit for bit what the input computes, as the reference interpreter defines
//! it. (A pass may remove an instruction whose only effect would be an interpreter error,
//! such as an unused load out of bounds, like any compiler removes undefined behaviour.)
//! A malformed input never panics a pass; it gives an output the verifier rejects.
//!
//! All passes rebuild the instruction list through one `Rewriter`, which renumbers values
//! consistently: a pass decides, per input instruction, to copy it, to drop it, to replace
//! its value by another (new) value, or to emit new instructions in its place.

mod cse;
mod dce;
mod fold;
mod guard;
mod licm;
mod merge;
mod unroll;
mod vectorize;

pub use self::cse::cse;
pub use self::dce::dce;
pub use self::fold::fold;
pub use self::guard::guard;
pub use self::licm::licm;
pub use self::merge::merge_buffers;
pub use self::unroll::unroll;
pub(crate) use self::vectorize::multiples;
pub use self::vectorize::vectorize;

use tessel_shape::{DType, Scalar};

use crate::kernel::{Inst, Kernel, Mem, Param, Ty, Value};

/// The largest trip count [`optimize`] unrolls.
pub const OPTIMIZE_MAX_UNROLL: usize = 8;

/// A pass without parameters.
type Pass = fn(&Kernel) -> Kernel;

/// The standard pipeline, in order; each step's output feeds the next.
///
/// - `fold` first, so that constants are visible to everything after it;
/// - `cse` merges duplicated index math, so `licm` moves each expression once;
/// - `licm` before `unroll`, so invariant code is hoisted once instead of replicated;
/// - `unroll` small constant loops, turning loop variables into constants;
/// - `fold` again, on the index math those constants feed;
/// - `cse` again, merging what the unrolled copies and folding duplicated;
/// - `licm` again, hoisting what unrolling and folding made invariant;
/// - `dce` last, removing everything the steps before orphaned.
const PIPELINE: [(&str, Pass); 8] = [
    ("fold", fold),
    ("cse", cse),
    ("licm", licm),
    ("unroll", unroll_small),
    ("fold", fold),
    ("cse", cse),
    ("licm", licm),
    ("dce", dce),
];

fn unroll_small(kernel: &Kernel) -> Kernel {
    unroll(kernel, OPTIMIZE_MAX_UNROLL)
}

/// Runs the standard pipeline: `fold`, `cse`, `licm`, `unroll` (trip counts up to
/// [`OPTIMIZE_MAX_UNROLL`]), `fold`, `cse`, `licm`, `dce`.
///
/// Each step is logged at `debug` level with the instruction counts before and after. In
/// debug builds, every step's output is checked to verify whenever the kernel given
/// verifies.
///
/// ```
/// use tessel_ir::{Access, KernelBuilder, passes};
/// use tessel_shape::DType;
///
/// let mut kb = KernelBuilder::new("scale");
/// let out = kb.buffer("out", DType::I32, 4, Access::Write);
/// let (zero, four) = (kb.constant(0i32), kb.constant(4i32));
/// kb.range(zero, four, |kb, i| {
///     let two = kb.constant(2i32);
///     let v = kb.mul(i, two);
///     kb.store(out, i, v);
/// });
/// let kernel = kb.build().unwrap();
/// let optimized = passes::optimize(&kernel);
/// // The loop is unrolled into four stores of constants.
/// assert!(!format!("{optimized}").contains("range"));
/// ```
pub fn optimize(kernel: &Kernel) -> Kernel {
    let check = cfg!(debug_assertions) && crate::verify(kernel).is_ok();
    let mut current = kernel.clone();
    for (name, pass) in PIPELINE {
        let before = current.insts.len();
        current = pass(&current);
        tracing::debug!(
            kernel = %current.name,
            pass = name,
            before,
            after = current.insts.len(),
            "pass"
        );
        if check && let Err(e) = crate::verify(&current) {
            panic!("pass `{name}` broke a verified kernel: {e}\n{current}");
        }
    }
    current
}

/// The value of an operand with no new value (only in malformed input): a dangling
/// reference, which the verifier rejects as a use before definition.
const DANGLING: Value = Value(u32::MAX);

/// Rebuilds a kernel's instruction list, renumbering values.
///
/// The rewriter maps each value of the input (*old* values) to a value of the output
/// (*new* values). Operands of copied instructions are renamed through that map, so a pass
/// only decides what happens to each instruction; the output's types are tracked as it
/// grows, so a pass can ask the type of any new value.
pub(crate) struct Rewriter<'k> {
    kernel: &'k Kernel,
    /// Old value index to new value, where one has been set.
    map: Vec<Option<Value>>,
    out: Vec<Inst>,
    /// The type of each new value (`None` for non-data instructions and malformed ones).
    tys: Vec<Option<Ty>>,
}

impl<'k> Rewriter<'k> {
    /// An empty rewrite of `kernel`.
    pub(crate) fn new(kernel: &'k Kernel) -> Self {
        Rewriter {
            kernel,
            map: vec![None; kernel.insts.len()],
            out: Vec::with_capacity(kernel.insts.len()),
            tys: Vec::with_capacity(kernel.insts.len()),
        }
    }

    /// The kernel being rewritten.
    pub(crate) fn kernel(&self) -> &'k Kernel {
        self.kernel
    }

    /// The new value of `old`.
    pub(crate) fn value(&self, old: Value) -> Value {
        self.map
            .get(old.index())
            .copied()
            .flatten()
            .unwrap_or(DANGLING)
    }

    /// Makes `new` the value of `old` from now on.
    pub(crate) fn set(&mut self, old: Value, new: Value) {
        if let Some(slot) = self.map.get_mut(old.index()) {
            *slot = Some(new);
        }
    }

    /// Input instruction `old` with its operands renamed to new values.
    pub(crate) fn renamed(&self, old: Value) -> Inst {
        self.kernel.insts[old.index()].map_operands(|v| self.value(v))
    }

    /// Appends `inst`, whose operands are new values, and returns its value.
    pub(crate) fn push(&mut self, inst: Inst) -> Value {
        let ty = self.infer(&inst);
        self.out.push(inst);
        self.tys.push(ty);
        Value(self.out.len() as u32 - 1)
    }

    /// Copies input instruction `old` (renamed) and makes the copy its new value.
    pub(crate) fn copy(&mut self, old: Value) -> Value {
        let new = self.push(self.renamed(old));
        self.set(old, new);
        new
    }

    /// The output instruction defining `new`.
    pub(crate) fn inst(&self, new: Value) -> Option<&Inst> {
        self.out.get(new.index())
    }

    /// The constant `new` is, if it is one.
    pub(crate) fn constant(&self, new: Value) -> Option<Scalar> {
        match self.inst(new) {
            Some(Inst::Const(c)) => Some(*c),
            _ => None,
        }
    }

    /// The type of the new value `new`, if it is a well-typed data value.
    pub(crate) fn ty(&self, new: Value) -> Option<Ty> {
        self.tys.get(new.index()).copied().flatten()
    }

    /// The output kernel: the input's name, parameters and grid with the new instructions.
    pub(crate) fn finish(self) -> Kernel {
        Kernel {
            name: self.kernel.name.clone(),
            params: self.kernel.params.clone(),
            grid: self.kernel.grid.clone(),
            insts: self.out,
        }
    }

    /// The element dtype of memory `mem` (operands are new values).
    fn mem_dtype(&self, mem: Mem) -> Option<DType> {
        match mem {
            Mem::Global(p) => match self.kernel.params.get(p)? {
                Param::Buffer { dtype, .. } => Some(*dtype),
                Param::Dim { .. } => None,
            },
            Mem::Local(v) | Mem::Reg(v) => match self.inst(v)? {
                Inst::DefineLocal { dtype, .. } | Inst::DefineReg { dtype, .. } => Some(*dtype),
                _ => None,
            },
        }
    }

    /// The type `inst` defines, following the verifier's typing rules without checking
    /// them (a pass only asks types of instructions whose input verified).
    fn infer(&self, inst: &Inst) -> Option<Ty> {
        let with_dtype = |ty: Ty, dtype: DType| Ty {
            dtype,
            width: ty.width,
        };
        match inst {
            Inst::Const(c) => Some(Ty::scalar(c.dtype())),
            Inst::DimParam(p) => match self.kernel.params.get(*p)? {
                Param::Dim { dtype, .. } => Some(Ty::scalar(*dtype)),
                Param::Buffer { .. } => None,
            },
            Inst::Special(_, dtype) => Some(Ty::scalar(*dtype)),
            Inst::Range { start, .. } => self.ty(*start),
            Inst::Load { mem, width, .. } => Some(Ty {
                dtype: self.mem_dtype(*mem)?,
                width: *width,
            }),
            Inst::Unary(op, a) => {
                let ty = self.ty(*a)?;
                Some(with_dtype(ty, op.result_dtype(ty.dtype)?))
            }
            Inst::Binary(op, a, _) => {
                let ty = self.ty(*a)?;
                Some(with_dtype(ty, op.result_dtype(ty.dtype)?))
            }
            Inst::Ternary(_, _, b, _) => self.ty(*b),
            Inst::Cast(a, dtype) | Inst::Bitcast(a, dtype) => {
                Some(with_dtype(self.ty(*a)?, *dtype))
            }
            Inst::Vectorize(lanes) => Some(Ty {
                dtype: self.ty(*lanes.first()?)?.dtype,
                width: lanes.len() as u8,
            }),
            Inst::Extract(v, _) => Some(Ty::scalar(self.ty(*v)?.dtype)),
            Inst::EndRange(_)
            | Inst::If(_)
            | Inst::EndIf(_)
            | Inst::DefineLocal { .. }
            | Inst::DefineReg { .. }
            | Inst::Store { .. }
            | Inst::Atomic { .. }
            | Inst::Barrier => None,
        }
    }
}

/// For each instruction index, the index of the instruction closing the block it opens
/// (`insts.len()` for non-openers and for blocks that are never closed).
pub(crate) fn block_ends(insts: &[Inst]) -> Vec<usize> {
    let mut ends = vec![insts.len(); insts.len()];
    for (i, inst) in insts.iter().enumerate() {
        if let Inst::EndRange(v) | Inst::EndIf(v) = inst
            && v.index() < i
        {
            ends[v.index()] = i;
        }
    }
    ends
}

/// The value of an integer constant, exactly (`None` for floats and `bool`).
pub(crate) fn int_value(c: Scalar) -> Option<i128> {
    match c {
        // `to_i64` would wrap the top half of `u64`.
        Scalar::U64(x) => Some(i128::from(x)),
        _ if c.dtype().is_int() => Some(i128::from(c.to_i64())),
        _ => None,
    }
}

/// Whether the instruction is pure and also can never fail in the interpreter, so it may be
/// evaluated where the input would not have evaluated it.
///
/// Every pure op is total on the types the verifier admits. The one that can fail, a
/// bitcast to `bool` of a byte other than 0 or 1, is excluded in case the verifier ever
/// admits it (today it rejects bitcasts to and from `bool`).
pub(crate) fn is_speculatable(inst: &Inst) -> bool {
    inst.is_pure() && !matches!(inst, Inst::Bitcast(_, DType::Bool))
}
