//! The verifier: a kernel either passes or gets one precise error.
//!
//! Checks, in one forward walk: operands are defined earlier and still in scope; blocks are
//! balanced; every instruction is well typed (and its op supports the dtype, per
//! [`tessel_shape::Scalar`]'s op table); parameters are used as declared; barriers are not
//! under invocation-dependent control flow. Then, for kernels whose grid and buffer
//! lengths are constant, the bounds analysis (`bounds.rs`) rejects an index it bounds
//! outside its memory.

use tessel_shape::{DType, TernaryOp};

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
    crate::bounds::check_bounds(kernel, &defs)?;
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
