//! The verifier: a kernel either passes or gets one precise error.
//!
//! Checks, in one forward walk: operands are defined earlier and still in scope; blocks are
//! balanced; every instruction is well typed (and its op supports the dtype, per
//! [`tessel_shape::Scalar`]'s op table); parameters are used as declared; barriers are not
//! under invocation-dependent control flow. Then, for kernels whose grid and buffer
//! lengths are constant, an interval analysis proves every load and store in bounds,
//! narrowing values by the conditions of enclosing `If`s.

use rustc_hash::FxHashMap;
use tessel_shape::{BinaryOp, DType, Expr, TernaryOp};

use crate::kernel::{Access, Inst, Kernel, Mem, Param, Special, Ty, Value};

/// Why a kernel failed verification.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("kernel `{kernel}`: {}{kind}", .at.map(|v| format!("at %{v} (`{}`): ", .text)).unwrap_or_default())]
pub struct VerifyError {
    /// The kernel's name.
    pub kernel: String,
    /// The offending instruction, if the error is about one.
    pub at: Option<u32>,
    /// The offending instruction's text form (empty when `at` is `None`).
    pub text: String,
    /// What is wrong.
    pub kind: VerifyErrorKind,
}

/// What a [`VerifyError`] found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyErrorKind {
    /// An operand refers to an instruction at or after its user.
    #[error("operand {0} is used before it is defined")]
    UseBeforeDef(Value),
    /// An operand was defined inside a block that has already ended.
    #[error("operand {0} is out of scope (its block has ended)")]
    OutOfScope(Value),
    /// An operand names an instruction that defines no usable value of the right kind.
    #[error("operand {value} is not {expected}")]
    WrongKind {
        /// The operand.
        value: Value,
        /// What was expected ("a data value", "a `DefineLocal`", ...).
        expected: &'static str,
    },
    /// An `EndRange`/`EndIf` doesn't close the innermost open block, or a block is never closed.
    #[error("unbalanced blocks: {0}")]
    Unbalanced(String),
    /// Operand types don't fit the instruction.
    #[error("type error: {0}")]
    Type(String),
    /// A parameter is missing or used against its declaration.
    #[error("parameter error: {0}")]
    Param(String),
    /// A barrier inside control flow that may differ between invocations of a workgroup.
    #[error(
        "barrier inside invocation-dependent control flow (opened at %{0}); every invocation of a workgroup must reach each barrier"
    )]
    DivergentBarrier(u32),
    /// An index provably or possibly outside its memory.
    #[error("index range {lo}..={hi} (width {width}) exceeds {mem} of {len} elements")]
    OutOfBounds {
        /// The memory accessed.
        mem: String,
        /// The smallest possible index (saturated to `i64`).
        lo: i64,
        /// The largest possible index (saturated to `i64`).
        hi: i64,
        /// The access width.
        width: u8,
        /// The memory's length.
        len: usize,
    },
}

/// What each instruction defines, as the verifier inferred it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Def {
    /// Nothing usable (`EndRange`, `EndIf`, `Store`, `Barrier`, `If`).
    None,
    /// A data value of this type (the loop variable, for a `Range`).
    Data(Ty),
    /// Workgroup-local memory.
    Local(DType, usize),
    /// Register memory.
    Reg(DType, usize),
}

impl Def {
    /// The data type, if this is a data value.
    pub fn ty(&self) -> Option<Ty> {
        match self {
            Def::Data(ty) => Some(*ty),
            _ => None,
        }
    }
}

/// Verifies `kernel`, returning what each instruction defines.
pub fn verify(kernel: &Kernel) -> Result<Vec<Def>, VerifyError> {
    let defs = Checker::new(kernel).run()?;
    check_bounds(kernel, &defs)?;
    Ok(defs)
}

struct Checker<'k> {
    kernel: &'k Kernel,
    defs: Vec<Def>,
    /// Scope depth at which each value was defined, and whether that scope has ended.
    scope_of: Vec<usize>,
    /// The open blocks: the opening instruction, and whether it is invocation-dependent.
    open: Vec<(u32, bool)>,
    /// Ids of blocks that have ended, by value.
    closed_scopes: Vec<bool>,
    /// Values whose result may differ between invocations of one workgroup.
    divergent: Vec<bool>,
}

impl<'k> Checker<'k> {
    fn new(kernel: &'k Kernel) -> Self {
        Checker {
            kernel,
            defs: Vec::with_capacity(kernel.insts.len()),
            scope_of: Vec::with_capacity(kernel.insts.len()),
            open: Vec::new(),
            closed_scopes: vec![false],
            divergent: Vec::with_capacity(kernel.insts.len()),
        }
    }

    fn err(&self, at: Option<usize>, kind: VerifyErrorKind) -> VerifyError {
        VerifyError {
            kernel: self.kernel.name.clone(),
            at: at.map(|i| i as u32),
            text: at
                .map(|i| crate::display::inst_text(self.kernel, i))
                .unwrap_or_default(),
            kind,
        }
    }

    fn run(mut self) -> Result<Vec<Def>, VerifyError> {
        let kernel = self.kernel;
        for (i, inst) in kernel.insts.iter().enumerate() {
            for v in inst.operands() {
                if v.index() >= i {
                    return Err(self.err(Some(i), VerifyErrorKind::UseBeforeDef(v)));
                }
                if self.closed_scopes[self.scope_of[v.index()]] {
                    return Err(self.err(Some(i), VerifyErrorKind::OutOfScope(v)));
                }
            }
            let def = self
                .check(i, inst)
                .map_err(|kind| self.err(Some(i), kind))?;
            let divergent = match inst {
                Inst::Special(Special::LocalId(_), _) => true,
                Inst::Load {
                    mem: Mem::Reg(_), ..
                } => true,
                _ => inst.operands().iter().any(|v| self.divergent[v.index()]),
            };
            // A block's own value (loop variable, condition) lives inside the block.
            match inst {
                Inst::Range { .. } | Inst::If(_) => {
                    self.open.push((i as u32, divergent));
                    self.closed_scopes.push(false);
                    self.scope_of.push(self.closed_scopes.len() - 1);
                }
                Inst::EndRange(_) | Inst::EndIf(_) => {
                    let scope = self.scope_of[self.open_block(i, inst)?];
                    self.closed_scopes[scope] = true;
                    self.open.pop();
                    self.scope_of.push(self.current_scope());
                }
                _ => self.scope_of.push(self.current_scope()),
            }
            if matches!(inst, Inst::Barrier)
                && let Some(&(at, _)) = self.open.iter().find(|(_, div)| *div)
            {
                return Err(self.err(Some(i), VerifyErrorKind::DivergentBarrier(at)));
            }
            self.defs.push(def);
            self.divergent.push(divergent);
        }
        if let Some(&(at, _)) = self.open.last() {
            return Err(self.err(
                Some(at as usize),
                VerifyErrorKind::Unbalanced("block is never closed".into()),
            ));
        }
        Ok(self.defs)
    }

    fn current_scope(&self) -> usize {
        self.open
            .last()
            .map_or(0, |&(at, _)| self.scope_of[at as usize])
    }

    /// Checks that an `EndRange`/`EndIf` closes the innermost block; returns its opener.
    fn open_block(&self, i: usize, inst: &Inst) -> Result<usize, VerifyError> {
        let (Inst::EndRange(v) | Inst::EndIf(v)) = inst else {
            unreachable!("only block ends close blocks")
        };
        match self.open.last() {
            Some(&(at, _)) if at == v.0 => Ok(at as usize),
            Some(&(at, _)) => Err(self.err(
                Some(i),
                VerifyErrorKind::Unbalanced(format!(
                    "closes {v} but the innermost open block is %{at}"
                )),
            )),
            None => Err(self.err(
                Some(i),
                VerifyErrorKind::Unbalanced(format!("closes {v} but no block is open")),
            )),
        }
    }

    fn data(&self, v: Value) -> Result<Ty, VerifyErrorKind> {
        self.defs[v.index()].ty().ok_or(VerifyErrorKind::WrongKind {
            value: v,
            expected: "a data value",
        })
    }

    fn int_scalar(&self, v: Value, what: &str) -> Result<Ty, VerifyErrorKind> {
        let ty = self.data(v)?;
        if ty.width != 1 || !ty.dtype.is_int() {
            return Err(VerifyErrorKind::Type(format!(
                "{what} {v} must be an integer scalar, found {ty}"
            )));
        }
        Ok(ty)
    }

    fn memory(&self, mem: Mem, store: bool) -> Result<(DType, Option<usize>), VerifyErrorKind> {
        match mem {
            Mem::Global(p) => match self.kernel.params.get(p) {
                Some(Param::Buffer {
                    dtype,
                    access,
                    name,
                    ..
                }) => {
                    let allowed = if store {
                        access.can_write()
                    } else {
                        access.can_read()
                    };
                    if !allowed {
                        let verb = if store { "stores to" } else { "loads from" };
                        return Err(VerifyErrorKind::Param(format!(
                            "{verb} buffer `{name}` declared {access:?}"
                        )));
                    }
                    Ok((*dtype, None))
                }
                _ => Err(VerifyErrorKind::Param(format!(
                    "parameter {p} is not a buffer"
                ))),
            },
            Mem::Local(v) => match self.defs[v.index()] {
                Def::Local(d, len) => Ok((d, Some(len))),
                _ => Err(VerifyErrorKind::WrongKind {
                    value: v,
                    expected: "a DefineLocal",
                }),
            },
            Mem::Reg(v) => match self.defs[v.index()] {
                Def::Reg(d, len) => Ok((d, Some(len))),
                _ => Err(VerifyErrorKind::WrongKind {
                    value: v,
                    expected: "a DefineReg",
                }),
            },
        }
    }

    fn check(&self, i: usize, inst: &Inst) -> Result<Def, VerifyErrorKind> {
        let ty_err = |msg: String| Err(VerifyErrorKind::Type(msg));
        Ok(match inst {
            Inst::Const(s) => Def::Data(Ty::scalar(s.dtype())),
            Inst::DimParam(p) => match self.kernel.params.get(*p) {
                Some(Param::Dim { dtype, .. }) if dtype.is_int() => Def::Data(Ty::scalar(*dtype)),
                Some(Param::Dim { dtype, .. }) => {
                    return Err(VerifyErrorKind::Param(format!(
                        "dim parameter {p} has non-integer dtype {dtype}"
                    )));
                }
                _ => {
                    return Err(VerifyErrorKind::Param(format!(
                        "parameter {p} is not a dim"
                    )));
                }
            },
            Inst::Special(s, dtype) => {
                let (Special::GroupId(axis) | Special::LocalId(axis)) = s;
                if *axis > 2 {
                    return ty_err(format!("axis {axis} is not 0, 1 or 2"));
                }
                if !dtype.is_int() {
                    return ty_err(format!("built-in index must be an integer, not {dtype}"));
                }
                Def::Data(Ty::scalar(*dtype))
            }
            Inst::Range { start, end } => {
                let (a, b) = (
                    self.int_scalar(*start, "range start")?,
                    self.int_scalar(*end, "range end")?,
                );
                if a != b {
                    return ty_err(format!("range bounds differ in type: {a} and {b}"));
                }
                Def::Data(a)
            }
            Inst::EndRange(v) => {
                if !matches!(self.kernel.inst(*v), Inst::Range { .. }) {
                    return Err(VerifyErrorKind::WrongKind {
                        value: *v,
                        expected: "a Range",
                    });
                }
                Def::None
            }
            Inst::If(c) => {
                let ty = self.data(*c)?;
                if ty != Ty::scalar(DType::Bool) {
                    return ty_err(format!("if condition must be a bool scalar, found {ty}"));
                }
                Def::None
            }
            Inst::EndIf(v) => {
                if !matches!(self.kernel.inst(*v), Inst::If(_)) {
                    return Err(VerifyErrorKind::WrongKind {
                        value: *v,
                        expected: "an If",
                    });
                }
                Def::None
            }
            Inst::DefineLocal { dtype, len } | Inst::DefineReg { dtype, len } => {
                if *len == 0 {
                    return ty_err("memory of 0 elements".into());
                }
                if matches!(inst, Inst::DefineLocal { .. }) {
                    if !self.open.is_empty() {
                        return ty_err("DefineLocal must be at the kernel's top level".into());
                    }
                    Def::Local(*dtype, *len)
                } else {
                    Def::Reg(*dtype, *len)
                }
            }
            Inst::Load { mem, index, width } => {
                check_width(*width)?;
                self.int_scalar(*index, "index")?;
                let (dtype, _) = self.memory(*mem, false)?;
                Def::Data(Ty {
                    dtype,
                    width: *width,
                })
            }
            Inst::Store { mem, index, value } => {
                self.int_scalar(*index, "index")?;
                let (dtype, _) = self.memory(*mem, true)?;
                let ty = self.data(*value)?;
                if ty.dtype != dtype {
                    return ty_err(format!("stores {ty} into memory of {dtype}"));
                }
                Def::None
            }
            Inst::Atomic {
                op,
                mem,
                index,
                value,
            } => {
                let name = op.name();
                self.int_scalar(*index, "index")?;
                let Mem::Global(p) = *mem else {
                    return ty_err(format!("atomic {name}s go to global buffers only"));
                };
                let Some(Param::Buffer {
                    dtype,
                    access: Access::Accumulate,
                    ..
                }) = self.kernel.params.get(p)
                else {
                    return Err(VerifyErrorKind::Param(format!(
                        "atomic {name} into parameter {p}, which is not a buffer declared accumulate"
                    )));
                };
                let ty = self.data(*value)?;
                if ty != Ty::scalar(*dtype) {
                    return ty_err(format!("atomic {name} of {ty} into a buffer of {dtype}"));
                }
                if !op.takes(*dtype) {
                    return ty_err(format!("no atomic {name} for {dtype}"));
                }
                Def::None
            }
            Inst::Barrier => Def::None,
            Inst::Unary(op, a) => {
                let ty = self.data(*a)?;
                match op.result_dtype(ty.dtype) {
                    Some(d) => Def::Data(Ty {
                        dtype: d,
                        width: ty.width,
                    }),
                    None => return ty_err(format!("{op} is not defined for {}", ty.dtype)),
                }
            }
            Inst::Binary(op, a, b) => {
                let (ta, tb) = (self.data(*a)?, self.data(*b)?);
                if ta != tb {
                    return ty_err(format!("{op} operands differ: {ta} and {tb}"));
                }
                match op.result_dtype(ta.dtype) {
                    Some(d) => Def::Data(Ty {
                        dtype: d,
                        width: ta.width,
                    }),
                    None => return ty_err(format!("{op} is not defined for {}", ta.dtype)),
                }
            }
            Inst::Ternary(op, a, b, c) => {
                let (ta, tb, tc) = (self.data(*a)?, self.data(*b)?, self.data(*c)?);
                match op {
                    TernaryOp::Where => {
                        if ta.dtype != DType::Bool || ta.width != tb.width || tb != tc {
                            return ty_err(format!(
                                "where needs (bool, T, T) of one width, found ({ta}, {tb}, {tc})"
                            ));
                        }
                    }
                    TernaryOp::MulAdd => {
                        if ta != tb || tb != tc {
                            return ty_err(format!(
                                "mad needs three operands of one type, found ({ta}, {tb}, {tc})"
                            ));
                        }
                        if !op.supports(ta.dtype) {
                            return ty_err(format!("mad is not defined for {}", ta.dtype));
                        }
                    }
                }
                Def::Data(tb)
            }
            Inst::Cast(a, d) => Def::Data(Ty {
                dtype: *d,
                width: self.data(*a)?.width,
            }),
            Inst::Bitcast(a, d) => {
                let ty = self.data(*a)?;
                if ty.dtype.size_bytes() != d.size_bytes() {
                    return ty_err(format!("bitcast from {} to {d} changes the size", ty.dtype));
                }
                Def::Data(Ty {
                    dtype: *d,
                    width: ty.width,
                })
            }
            Inst::Vectorize(vs) => {
                if !matches!(vs.len(), 2 | 4 | 8) {
                    return ty_err(format!(
                        "a vector needs 2, 4 or 8 lanes, found {}",
                        vs.len()
                    ));
                }
                let first = self.data(vs[0])?;
                for &v in vs {
                    let ty = self.data(v)?;
                    if ty != Ty::scalar(first.dtype) {
                        return ty_err(format!(
                            "vectorize needs scalars of one dtype, found {first} and {ty}"
                        ));
                    }
                }
                Def::Data(Ty {
                    dtype: first.dtype,
                    width: vs.len() as u8,
                })
            }
            Inst::Extract(v, lane) => {
                let ty = self.data(*v)?;
                if *lane >= ty.width {
                    return ty_err(format!("lane {lane} of a {ty}"));
                }
                let _ = i;
                Def::Data(Ty::scalar(ty.dtype))
            }
        })
    }
}

fn check_width(width: u8) -> Result<(), VerifyErrorKind> {
    if matches!(width, 1 | 2 | 4 | 8) {
        Ok(())
    } else {
        Err(VerifyErrorKind::Type(format!(
            "width {width} is not 1, 2, 4 or 8"
        )))
    }
}

// ---------------------------------------------------------------------------------------
// Bounds
// ---------------------------------------------------------------------------------------

type Interval = (i128, i128);

/// Proves every access in bounds when the grid and buffer lengths are constant and the
/// kernel has no dynamic dims (symbolic sizes are checked at launch instead). An access
/// whose index the analysis cannot bound (data, say) passes here; [`guard_unproven`] makes
/// it safe before a backend compiles the kernel.
fn check_bounds(kernel: &Kernel, defs: &[Def]) -> Result<(), VerifyError> {
    if !kernel.dim_vars().is_empty()
        || kernel
            .grid
            .groups
            .iter()
            .chain(&kernel.grid.local)
            .any(|d| d.as_const().is_none())
    {
        return Ok(());
    }
    let mut failure = None;
    walk_accesses(kernel, defs, false, |access| {
        if failure.is_none()
            && let (Some((lo, hi)), Some(len)) = (access.range, access.exact_len)
            && (lo < 0 || hi + i128::from(access.width) > len as i128)
        {
            failure = Some(VerifyError {
                kernel: kernel.name.clone(),
                at: Some(access.at as u32),
                text: crate::display::inst_text(kernel, access.at),
                kind: VerifyErrorKind::OutOfBounds {
                    mem: access.mem_name(kernel),
                    lo: lo.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
                    hi: hi.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
                    width: access.width,
                    len,
                },
            });
        }
    });
    failure.map_or(Ok(()), Err)
}

/// The loads, stores and atomics of a verified `kernel` that the interval analysis cannot
/// prove in bounds for every launch: indices it cannot bound (read from data, or wrapped),
/// and indices that may exceed the smallest length a symbolic buffer can have. A dynamic
/// dim contributes its variable's bounds, a symbolic grid size its bounds.
pub(crate) fn unproven_accesses(kernel: &Kernel, defs: &[Def]) -> Vec<usize> {
    let mut unproven = Vec::new();
    walk_accesses(kernel, defs, true, |access| {
        let proven = access.symbolic_proof
            || access
                .range
                .is_some_and(|(lo, hi)| lo >= 0 && hi + i128::from(access.width) <= access.min_len);
        if !proven {
            unproven.push(access.at);
        }
    });
    unproven
}

/// One access, as the interval analysis sees it.
struct AccessBounds {
    /// The instruction.
    at: usize,
    mem: Mem,
    /// The index's interval, if known.
    range: Option<Interval>,
    width: u8,
    /// The memory's length, when it is a constant.
    exact_len: Option<usize>,
    /// The smallest length the memory can have.
    min_len: i128,
    /// Whether a symbolic upper bound of the index proves it below a symbolic length.
    symbolic_proof: bool,
}

impl AccessBounds {
    fn mem_name(&self, kernel: &Kernel) -> String {
        match self.mem {
            Mem::Global(p) => format!("buffer `{}`", kernel.params[p].name()),
            Mem::Local(v) => format!("local memory {v}"),
            Mem::Reg(v) => format!("registers {v}"),
        }
    }
}

/// Runs the interval analysis over `kernel`, calling `f` for every access.
/// `total` makes unknown integers span their dtype (see `Ranges::total`).
fn walk_accesses(kernel: &Kernel, defs: &[Def], total: bool, mut f: impl FnMut(AccessBounds)) {
    let grid = kernel
        .grid
        .groups
        .iter()
        .chain(&kernel.grid.local)
        .map(|d| {
            let b = d.bounds();
            (i128::from(b.lo), i128::from(b.hi))
        })
        .collect();
    let mut ranges = Ranges {
        kernel,
        defs,
        grid,
        narrowed: Vec::new(),
        memo: FxHashMap::default(),
        total,
        sym_narrowed: Vec::new(),
        sym_memo: FxHashMap::default(),
    };
    for (i, inst) in kernel.insts.iter().enumerate() {
        match inst {
            Inst::If(c) => {
                let mut narrowed = FxHashMap::default();
                ranges.narrow(*c, &mut narrowed);
                ranges.narrowed.push((i, narrowed));
                let mut sym = FxHashMap::default();
                ranges.sym_narrow(*c, &mut sym);
                ranges.sym_narrowed.push(sym);
                ranges.memo.clear();
                ranges.sym_memo.clear();
            }
            Inst::EndIf(v)
                if ranges
                    .narrowed
                    .last()
                    .is_some_and(|(at, _)| *at == v.index()) =>
            {
                ranges.narrowed.pop();
                ranges.sym_narrowed.pop();
                ranges.memo.clear();
                ranges.sym_memo.clear();
            }
            Inst::Load { mem, index, .. }
            | Inst::Store { mem, index, .. }
            | Inst::Atomic { mem, index, .. } => {
                let width = match inst {
                    Inst::Load { width, .. } => *width,
                    Inst::Store { value, .. } => defs[value.index()].ty().map_or(1, |t| t.width),
                    _ => 1,
                };
                let (exact_len, min_len, symbolic) = match *mem {
                    Mem::Global(p) => match &kernel.params[p] {
                        Param::Buffer { len, .. } => (
                            len.as_const().and_then(|l| usize::try_from(l).ok()),
                            i128::from(len.bounds().lo),
                            len.as_const().is_none().then_some(*len),
                        ),
                        Param::Dim { .. } => continue,
                    },
                    Mem::Local(v) | Mem::Reg(v) => match defs[v.index()] {
                        Def::Local(_, len) | Def::Reg(_, len) => (Some(len), len as i128, None),
                        _ => continue,
                    },
                };
                let range = ranges.of(*index);
                // A symbolic length: `len - hi - width >= 0` for every binding, in closed
                // form, for some symbolic upper bound `hi` of the index.
                let symbolic_proof = symbolic.is_some_and(|len| {
                    range.is_some_and(|(lo, _)| lo >= 0)
                        && small(len)
                        && ranges
                            .sym_hi(*index)
                            .into_iter()
                            .any(|hi| (len - hi - i64::from(width)).bounds().lo >= 0)
                });
                f(AccessBounds {
                    at: i,
                    mem: *mem,
                    range,
                    width,
                    exact_len,
                    min_len,
                    symbolic_proof,
                });
            }
            _ => {}
        }
    }
}

struct Ranges<'k> {
    kernel: &'k Kernel,
    defs: &'k [Def],
    /// The bounds of the groups (0..3) then the local sizes (3..6).
    grid: Vec<Interval>,
    /// Narrowed intervals from the conditions of enclosing `If`s, innermost last.
    narrowed: Vec<(usize, FxHashMap<Value, Interval>)>,
    memo: FxHashMap<Value, Option<Interval>>,
    /// Whether an integer the analysis cannot bound counts as its dtype's whole range (for
    /// proofs) rather than unknown (for the verifier's errors, which only concern indices
    /// the analysis bounds).
    total: bool,
    /// Symbolic upper bounds implied by the conditions of enclosing `If`s, innermost last.
    sym_narrowed: Vec<FxHashMap<Value, Vec<Expr>>>,
    sym_memo: FxHashMap<Value, Vec<Expr>>,
}

impl Ranges<'_> {
    /// The interval of an integer value, or `None` when unknown (loaded data, floats).
    fn of(&mut self, v: Value) -> Option<Interval> {
        if let Some(&r) = self.memo.get(&v) {
            return r;
        }
        let mut r = self.compute(v);
        // A value that may leave its dtype's range has wrapped: nothing is known about it.
        // This also keeps every known interval within i64, so products fit in i128.
        if let (Some((lo, hi)), Some(ty)) = (r, self.defs[v.index()].ty())
            && ty.dtype.is_int()
            && (lo < i128::from(ty.dtype.min_value().to_i64()) || hi > int_max(ty.dtype))
        {
            r = None;
        }
        // For proofs, an unknown integer is anywhere in its dtype (u64 excepted, whose range
        // leaves i64): what makes `min(max(x, 0), n - 1)` in `0..n` whatever `x` is.
        if r.is_none()
            && self.total
            && let Some(ty) = self.defs[v.index()].ty()
            && (ty.dtype.is_int() || ty.dtype == DType::Bool)
            && ty.dtype != DType::U64
        {
            r = Some((i128::from(ty.dtype.min_value().to_i64()), int_max(ty.dtype)));
        }
        for (_, narrowed) in &self.narrowed {
            if let (Some((lo, hi)), Some(&(nlo, nhi))) = (r, narrowed.get(&v)) {
                r = Some((lo.max(nlo), hi.min(nhi)));
            }
        }
        // An empty interval means the enclosing conditions cannot all hold: the code never
        // runs, so nothing is known (and the arithmetic above must not see lo > hi). For
        // proofs, any access there is vacuously in bounds: the value reads as 0.
        if r.is_some_and(|(lo, hi)| lo > hi) {
            r = self.total.then_some((0, 0));
        }
        self.memo.insert(v, r);
        r
    }

    fn compute(&mut self, v: Value) -> Option<Interval> {
        use BinaryOp as B;
        let inst = self.kernel.inst(v).clone();
        match inst {
            Inst::Const(s) if s.dtype().is_int() || s.dtype() == DType::Bool => {
                Some((i128::from(s.to_i64()), i128::from(s.to_i64())))
            }
            Inst::Special(Special::GroupId(a), _) => Some((0, self.grid[a as usize].1 - 1)),
            Inst::Special(Special::LocalId(a), _) => Some((0, self.grid[3 + a as usize].1 - 1)),
            Inst::DimParam(p) => match &self.kernel.params[p] {
                Param::Dim { var, .. } => {
                    let b = var.bounds();
                    Some((i128::from(b.lo), i128::from(b.hi)))
                }
                Param::Buffer { .. } => None,
            },
            Inst::Range { start, end } => Some((self.of(start)?.0, self.of(end)?.1 - 1)),
            Inst::Binary(op, a, b) => {
                let ((alo, ahi), (blo, bhi)) = (self.of(a)?, self.of(b)?);
                match op {
                    B::Add => Some((alo + blo, ahi + bhi)),
                    B::Sub => Some((alo - bhi, ahi - blo)),
                    B::Mul => corners([alo * blo, alo * bhi, ahi * blo, ahi * bhi]),
                    B::Div if blo > 0 => corners([alo / blo, alo / bhi, ahi / blo, ahi / bhi]),
                    B::Rem if blo > 0 && alo >= 0 => Some((0, ahi.min(bhi - 1))),
                    B::Rem if blo > 0 => Some((-(bhi - 1), bhi - 1)),
                    B::Min => Some((alo.min(blo), ahi.min(bhi))),
                    B::Max => Some((alo.max(blo), ahi.max(bhi))),
                    B::And if blo >= 0 => Some((0, bhi)),
                    B::Shl if blo >= 0 && bhi < 63 && alo >= 0 => Some((alo << blo, ahi << bhi)),
                    B::Shr if blo >= 0 && bhi < 63 && alo >= 0 => Some((alo >> bhi, ahi >> blo)),
                    B::Eq | B::Ne | B::Lt | B::Le | B::Gt | B::Ge => Some((0, 1)),
                    _ => None,
                }
            }
            Inst::Ternary(TernaryOp::Where, c, a, b) => {
                // Each branch is only selected where the condition has its value, which is
                // what makes `where(r < 0, r + m, r)` (floor modulo) land in `0..m`.
                let (alo, ahi) = self.under(c, true, a)?;
                let (blo, bhi) = self.under(c, false, b)?;
                Some((alo.min(blo), ahi.max(bhi)))
            }
            Inst::Ternary(TernaryOp::MulAdd, a, b, c) => {
                let ((alo, ahi), (blo, bhi), (clo, chi)) = (self.of(a)?, self.of(b)?, self.of(c)?);
                let (plo, phi) = corners([alo * blo, alo * bhi, ahi * blo, ahi * bhi])?;
                Some((plo + clo, phi + chi))
            }
            Inst::Cast(a, d) if d.is_int() => {
                let r = self.of(a)?;
                let (min, max) = (i128::from(d.min_value().to_i64()), int_max(d));
                (r.0 >= min && r.1 <= max).then_some(r)
            }
            _ => None,
        }
    }

    /// The interval of `v` where `cond == truth`.
    fn under(&mut self, cond: Value, truth: bool, v: Value) -> Option<Interval> {
        let mut narrowed = FxHashMap::default();
        self.narrow_to(cond, truth, &mut narrowed);
        if narrowed.is_empty() {
            return self.of(v);
        }
        // Intervals memoized so far hold without the condition; start afresh under it.
        let saved = std::mem::take(&mut self.memo);
        self.narrowed.push((usize::MAX, narrowed));
        let r = self.of(v);
        self.narrowed.pop();
        self.memo = saved;
        r
    }

    /// Records what `cond` being true implies about its operands.
    fn narrow(&mut self, cond: Value, out: &mut FxHashMap<Value, Interval>) {
        self.narrow_to(cond, true, out);
    }

    /// Records what `cond == truth` implies about its operands.
    fn narrow_to(&mut self, cond: Value, truth: bool, out: &mut FxHashMap<Value, Interval>) {
        let Inst::Binary(op, a, b) = self.kernel.inst(cond).clone() else {
            return;
        };
        let op = match (truth, op) {
            (true, op) => op,
            // `!(a < b)` is `a >= b`, and so on; a false `and` implies nothing simple.
            (false, BinaryOp::Lt) => BinaryOp::Ge,
            (false, BinaryOp::Le) => BinaryOp::Gt,
            (false, BinaryOp::Gt) => BinaryOp::Le,
            (false, BinaryOp::Ge) => BinaryOp::Lt,
            (false, _) => return,
        };
        let upper = |x: Value, hi: i128, out: &mut FxHashMap<Value, Interval>| {
            let e = out.entry(x).or_insert((i128::MIN, i128::MAX));
            e.1 = e.1.min(hi);
        };
        match op {
            BinaryOp::And => {
                self.narrow(a, out);
                self.narrow(b, out);
            }
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
                // Normalize to `small <= big - k`.
                let (small, big, k) = match op {
                    BinaryOp::Lt => (a, b, 1),
                    BinaryOp::Le => (a, b, 0),
                    BinaryOp::Gt => (b, a, 1),
                    _ => (b, a, 0),
                };
                if let Some((_, bhi)) = self.of(big) {
                    upper(small, bhi - k, out);
                }
                if let Some((slo, _)) = self.of(small) {
                    let e = out.entry(big).or_insert((i128::MIN, i128::MAX));
                    e.0 = e.0.max(slo + k);
                }
            }
            _ => {}
        }
    }
}

/// At most this many symbolic bounds are kept per value (`min` and sums multiply them).
const SYM_CANDIDATES: usize = 4;

/// Whether every value `e` can take lies well inside `i64`, so that sums and differences
/// of two such expressions cannot wrap (`Expr` arithmetic wraps).
fn small(e: Expr) -> bool {
    let b = e.bounds();
    b.lo > -(1 << 61) && b.hi < (1 << 61)
}

impl Ranges<'_> {
    /// Symbolic upper bounds of an integer value, as expressions in the kernel's dim
    /// variables: each holds for every launch. Several candidates, because `min(a, b)` is
    /// at most either and only one may make a proof go through. Empty when unknown.
    fn sym_hi(&mut self, v: Value) -> Vec<Expr> {
        if let Some(r) = self.sym_memo.get(&v) {
            return r.clone();
        }
        let mut out = if self.of(v).is_some() {
            self.sym_compute(v)
        } else {
            Vec::new()
        };
        for narrowed in &self.sym_narrowed {
            if let Some(extra) = narrowed.get(&v) {
                out.extend(extra.iter().copied());
            }
        }
        out.retain(|e| small(*e));
        out.dedup();
        out.truncate(SYM_CANDIDATES);
        self.sym_memo.insert(v, out.clone());
        out
    }

    fn sym_compute(&mut self, v: Value) -> Vec<Expr> {
        use BinaryOp as B;
        let pairs = |a: Vec<Expr>, b: Vec<Expr>, f: &dyn Fn(Expr, Expr) -> Option<Expr>| {
            let mut out = Vec::new();
            for &x in &a {
                for &y in &b {
                    out.extend(f(x, y));
                }
            }
            out
        };
        let nonneg = |r: Option<Interval>| r.is_some_and(|(lo, _)| lo >= 0);
        match self.kernel.inst(v).clone() {
            Inst::Const(s) if s.dtype().is_int() => vec![Expr::constant(s.to_i64())],
            Inst::DimParam(p) => match &self.kernel.params[p] {
                Param::Dim { var, .. } => vec![Expr::from(*var)],
                Param::Buffer { .. } => Vec::new(),
            },
            Inst::Special(Special::GroupId(a), _) => vec![self.kernel.grid.groups[a as usize] - 1],
            Inst::Special(Special::LocalId(a), _) => vec![self.kernel.grid.local[a as usize] - 1],
            Inst::Range { end, .. } => self.sym_hi(end).into_iter().map(|e| e - 1).collect(),
            Inst::Cast(a, d) if d.is_int() => self.sym_hi(a),
            Inst::Binary(op, a, b) => {
                let (ra, rb) = (self.of(a), self.of(b));
                let (ha, hb) = (self.sym_hi(a), self.sym_hi(b));
                let product = |x: Expr, y: Expr| {
                    let (bx, by) = (x.bounds(), y.bounds());
                    let m = |b: tessel_shape::Bounds| {
                        i128::from(b.lo.unsigned_abs().max(b.hi.unsigned_abs()))
                    };
                    (m(bx) * m(by) < 1 << 61).then(|| x * y)
                };
                match op {
                    B::Add => pairs(ha, hb, &|x, y| Some(x + y)),
                    // hi(a - b) = hi(a) - lo(b), with lo(b) numeric.
                    B::Sub => match rb {
                        Some((blo, _)) if blo.unsigned_abs() < 1 << 61 => {
                            ha.into_iter().map(|x| x - blo as i64).collect()
                        }
                        _ => Vec::new(),
                    },
                    B::Mul if nonneg(ra) && nonneg(rb) => pairs(ha, hb, &product),
                    B::Div if nonneg(ra) && rb.is_some_and(|(lo, hi)| lo > 0 && lo == hi) => {
                        let d = rb.map_or(1, |(lo, _)| lo as i64);
                        ha.into_iter().map(|x| x.floor_div(d)).collect()
                    }
                    B::Rem if nonneg(ra) && rb.is_some_and(|(lo, _)| lo > 0) => {
                        let mut out: Vec<Expr> = hb.into_iter().map(|y| y - 1).collect();
                        out.extend(ha);
                        out
                    }
                    B::Min => {
                        let mut out = ha;
                        out.extend(hb);
                        out
                    }
                    B::Max => pairs(ha, hb, &|x, y| Some(x.max(y))),
                    _ => Vec::new(),
                }
            }
            Inst::Ternary(TernaryOp::Where, _, a, b) => {
                let (ha, hb) = (self.sym_hi(a), self.sym_hi(b));
                let mut out = Vec::new();
                for &x in &ha {
                    for &y in &hb {
                        out.push(x.max(y));
                    }
                }
                out
            }
            Inst::Ternary(TernaryOp::MulAdd, a, b, c)
                if nonneg(self.of(a)) && nonneg(self.of(b)) =>
            {
                let (ha, hb, hc) = (self.sym_hi(a), self.sym_hi(b), self.sym_hi(c));
                let mut out = Vec::new();
                for &x in &ha {
                    for &y in &hb {
                        let (bx, by) = (x.bounds(), y.bounds());
                        let m = |b: tessel_shape::Bounds| {
                            i128::from(b.lo.unsigned_abs().max(b.hi.unsigned_abs()))
                        };
                        if m(bx) * m(by) < 1 << 61 {
                            out.extend(hc.iter().map(|&z| x * y + z));
                        }
                    }
                }
                out
            }
            _ => Vec::new(),
        }
    }

    /// Records the symbolic upper bounds that `cond` being true implies.
    fn sym_narrow(&mut self, cond: Value, out: &mut FxHashMap<Value, Vec<Expr>>) {
        let Inst::Binary(op, a, b) = self.kernel.inst(cond).clone() else {
            return;
        };
        let (small_side, big, k) = match op {
            BinaryOp::And => {
                self.sym_narrow(a, out);
                self.sym_narrow(b, out);
                return;
            }
            BinaryOp::Lt => (a, b, 1),
            BinaryOp::Le => (a, b, 0),
            BinaryOp::Gt => (b, a, 1),
            BinaryOp::Ge => (b, a, 0),
            _ => return,
        };
        let bounds: Vec<Expr> = self.sym_hi(big).into_iter().map(|e| e - k).collect();
        if !bounds.is_empty() {
            out.entry(small_side).or_default().extend(bounds);
        }
    }
}

fn corners(c: [i128; 4]) -> Option<Interval> {
    Some((*c.iter().min()?, *c.iter().max()?))
}

fn int_max(d: DType) -> i128 {
    match d.max_value() {
        tessel_shape::Scalar::U64(v) => i128::from(v),
        s => i128::from(s.to_i64()),
    }
}
