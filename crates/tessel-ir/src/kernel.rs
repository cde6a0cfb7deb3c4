//! The kernel IR: one linear, typed SSA language that every backend speaks.
//!
//! A [`Kernel`] is a name, positional [`Param`]s, a launch [`Grid`] and a flat list of
//! [`Inst`]s. Instruction `i` defines [`Value`] `i` (if it produces a value); operands only
//! refer to earlier instructions, and a value defined inside a `Range` or `If` block is
//! visible only until that block ends. Structure is explicit: `Range`/`EndRange` and
//! `If`/`EndIf` pairs nest like brackets.
//!
//! Memory is uniform: global buffers (parameters), workgroup-local arrays (`DefineLocal`)
//! and per-invocation register arrays (`DefineReg`, which also serve as accumulators) are
//! all read with [`Inst::Load`] and written with [`Inst::Store`] at an element index. A load
//! or store of width `w` moves `w` consecutive elements as one vector value.
//!
//! Later schedules (tiling into local memory, upcasting, vectorized access, split
//! reductions) are compositions of these instructions; matrix instructions will join as
//! new `Inst` variants without changing the rest.

use std::fmt;

pub use tessel_shape::{BinaryOp, TernaryOp, UnaryOp};
use tessel_shape::{DType, Dim, Scalar, Var};

/// A reference to the value defined by instruction number `.0`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub u32);

impl Value {
    /// The instruction index that defines this value.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// The type of a value: a dtype and a vector width (1 for scalars).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ty {
    /// The element dtype.
    pub dtype: DType,
    /// Lanes: 1, 2, 4 or 8.
    pub width: u8,
}

impl Ty {
    /// A scalar of `dtype`.
    pub const fn scalar(dtype: DType) -> Ty {
        Ty { dtype, width: 1 }
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.width == 1 {
            write!(f, "{}", self.dtype)
        } else {
            write!(f, "{}x{}", self.dtype, self.width)
        }
    }
}

/// How a kernel may use a buffer parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Loads only.
    Read,
    /// Stores only.
    Write,
    /// Loads and stores.
    ReadWrite,
    /// Atomic updates only ([`Inst::Atomic`]), onto zeros: every launch clears the buffer
    /// before the kernel runs, so a launch computes the same result however often it runs.
    /// Zero is the identity of both [`AtomicOp`]s (a sum, an unsigned maximum).
    Accumulate,
}

impl Access {
    /// Whether loads are allowed.
    pub const fn can_read(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    /// Whether stores are allowed.
    pub const fn can_write(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }

    /// Whether the kernel changes the buffer (stores or atomic adds).
    pub const fn mutates(self) -> bool {
        !matches!(self, Access::Read)
    }
}

/// A kernel parameter. Parameters bind positionally at launch: buffers to device buffers,
/// dims to the value of their variable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    /// A global buffer of `len` elements of `dtype`.
    Buffer {
        /// The name in the text form and generated source.
        name: String,
        /// The element dtype.
        dtype: DType,
        /// The number of elements (symbolic in the kernel's dim params).
        len: Dim,
        /// Allowed uses.
        access: Access,
    },
    /// A dynamic dimension: the launch binds `var` and passes its value as `dtype`
    /// (an integer dtype), readable in the body through [`Inst::DimParam`].
    Dim {
        /// The variable; its name names the parameter.
        var: Var,
        /// The integer dtype the value is passed as.
        dtype: DType,
    },
}

impl Param {
    /// The parameter's name.
    pub fn name(&self) -> String {
        match self {
            Param::Buffer { name, .. } => name.clone(),
            Param::Dim { var, .. } => var.name().to_string(),
        }
    }
}

/// The launch grid: `groups[a]` workgroups along axis `a`, each of `local[a]` invocations.
/// An invocation's global id along `a` is `group_id[a] * local[a] + local_id[a]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Grid {
    /// Workgroups per axis.
    pub groups: [Dim; 3],
    /// Invocations per workgroup per axis.
    pub local: [Dim; 3],
}

impl Default for Grid {
    fn default() -> Self {
        let one = Dim::constant(1);
        Grid {
            groups: [one; 3],
            local: [one; 3],
        }
    }
}

/// A built-in index of the executing invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Special {
    /// The workgroup's index along an axis (0..3).
    GroupId(u8),
    /// The invocation's index within its workgroup along an axis (0..3).
    LocalId(u8),
}

/// Where a load or store goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mem {
    /// The buffer parameter with this position.
    Global(usize),
    /// A workgroup-shared array defined by a `DefineLocal`.
    Local(Value),
    /// A per-invocation register array defined by a `DefineReg`.
    Reg(Value),
}

/// How an [`Inst::Atomic`] combines its value with the element it updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// The sum. Integers wrap. Element types: `f32`, `f64`, `i32`, `u32`, `i64`, `u64`.
    Add,
    /// The larger, compared as unsigned integers. Element types: `u32`, `u64`. Ordered
    /// keys of other dtypes (a float's bits with the sign folded in) make it a maximum or
    /// minimum of any dtype, and `position + 1` keys pick the last of several writers.
    Max,
}

impl AtomicOp {
    /// The name in the text form (`atomic_add`, `atomic_max`).
    pub const fn name(self) -> &'static str {
        match self {
            AtomicOp::Add => "add",
            AtomicOp::Max => "max",
        }
    }

    /// Whether `dtype` elements can be updated by this op.
    pub const fn takes(self, dtype: DType) -> bool {
        match self {
            AtomicOp::Add => matches!(
                dtype,
                DType::F32 | DType::F64 | DType::I32 | DType::U32 | DType::I64 | DType::U64
            ),
            AtomicOp::Max => matches!(dtype, DType::U32 | DType::U64),
        }
    }
}

/// One instruction. See the module docs for scoping and memory.
#[derive(Clone, Debug, PartialEq)]
pub enum Inst {
    /// A constant.
    Const(Scalar),
    /// The value of the `Param::Dim` at this parameter position.
    DimParam(usize),
    /// A built-in index, of the given integer dtype.
    Special(Special, DType),
    /// Opens a loop; the value is the loop variable, running `start..end` by 1. Both
    /// bounds have the loop variable's integer dtype.
    Range {
        /// The first value.
        start: Value,
        /// One past the last value.
        end: Value,
    },
    /// Closes the `Range` that defined the given value.
    EndRange(Value),
    /// Opens a block run only where the `bool` condition holds.
    If(Value),
    /// Closes the `If` instruction at the given value.
    EndIf(Value),
    /// A workgroup-shared array of `len` elements.
    DefineLocal {
        /// The element dtype.
        dtype: DType,
        /// The number of elements.
        len: usize,
    },
    /// A per-invocation array of `len` elements (registers; `len == 1` is an accumulator).
    DefineReg {
        /// The element dtype.
        dtype: DType,
        /// The number of elements.
        len: usize,
    },
    /// Reads `width` consecutive elements starting at element `index`.
    Load {
        /// The memory read.
        mem: Mem,
        /// The element index (an integer scalar).
        index: Value,
        /// Lanes read: 1, 2, 4 or 8.
        width: u8,
    },
    /// Writes `value` (of `width` lanes) to consecutive elements starting at `index`.
    Store {
        /// The memory written.
        mem: Mem,
        /// The element index (an integer scalar).
        index: Value,
        /// The value written; its width is the store's width.
        value: Value,
    },
    /// Combines the scalar `value` into the element at `index` of a global buffer with
    /// [`Access::Accumulate`] by `op`, atomically: concurrent updates of one element all
    /// land (in no fixed order). See [`AtomicOp`] for the element types; a backend without
    /// atomics of a width fails to compile the kernel.
    Atomic {
        /// How the value combines with the element.
        op: AtomicOp,
        /// The memory updated (a `Mem::Global` buffer).
        mem: Mem,
        /// The element index (an integer scalar).
        index: Value,
        /// The value combined in.
        value: Value,
    },
    /// Waits until every invocation of the workgroup reaches this point; local memory
    /// writes before it are visible to every invocation after it.
    Barrier,
    /// A unary ALU op, lane-wise.
    Unary(UnaryOp, Value),
    /// A binary ALU op on operands of one type, lane-wise.
    Binary(BinaryOp, Value, Value),
    /// A ternary ALU op, lane-wise.
    Ternary(TernaryOp, Value, Value, Value),
    /// A value converted to another dtype ([`Scalar::cast`] semantics), lane-wise.
    Cast(Value, DType),
    /// A value's bits reinterpreted as another dtype of the same size, lane-wise.
    Bitcast(Value, DType),
    /// A vector built from scalars of one dtype (2, 4 or 8 of them).
    Vectorize(Vec<Value>),
    /// One lane of a vector.
    Extract(Value, u8),
}

impl Inst {
    /// The values this instruction reads, in order.
    pub fn operands(&self) -> Vec<Value> {
        let mem_operand = |mem: &Mem| match *mem {
            Mem::Local(v) | Mem::Reg(v) => Some(v),
            Mem::Global(_) => None,
        };
        match self {
            Inst::Const(_)
            | Inst::DimParam(_)
            | Inst::Special(..)
            | Inst::Barrier
            | Inst::DefineLocal { .. }
            | Inst::DefineReg { .. } => vec![],
            Inst::Range { start, end } => vec![*start, *end],
            Inst::EndRange(v) | Inst::If(v) | Inst::EndIf(v) => vec![*v],
            Inst::Load { mem, index, .. } => mem_operand(mem).into_iter().chain([*index]).collect(),
            Inst::Store { mem, index, value }
            | Inst::Atomic {
                mem, index, value, ..
            } => mem_operand(mem)
                .into_iter()
                .chain([*index, *value])
                .collect(),
            Inst::Unary(_, a) | Inst::Cast(a, _) | Inst::Bitcast(a, _) | Inst::Extract(a, _) => {
                vec![*a]
            }
            Inst::Binary(_, a, b) => vec![*a, *b],
            Inst::Ternary(_, a, b, c) => vec![*a, *b, *c],
            Inst::Vectorize(vs) => vs.clone(),
        }
    }

    /// The instruction with every operand passed through `f`.
    #[must_use]
    pub fn map_operands(&self, mut f: impl FnMut(Value) -> Value) -> Inst {
        let mut mem = |m: Mem| match m {
            Mem::Local(v) => Mem::Local(f(v)),
            Mem::Reg(v) => Mem::Reg(f(v)),
            Mem::Global(p) => Mem::Global(p),
        };
        match self {
            Inst::Const(_)
            | Inst::DimParam(_)
            | Inst::Special(..)
            | Inst::Barrier
            | Inst::DefineLocal { .. }
            | Inst::DefineReg { .. } => self.clone(),
            Inst::Range { start, end } => {
                let start = f(*start);
                Inst::Range {
                    start,
                    end: f(*end),
                }
            }
            Inst::EndRange(v) => Inst::EndRange(f(*v)),
            Inst::If(v) => Inst::If(f(*v)),
            Inst::EndIf(v) => Inst::EndIf(f(*v)),
            Inst::Load {
                mem: m,
                index,
                width,
            } => {
                let m = mem(*m);
                Inst::Load {
                    mem: m,
                    index: f(*index),
                    width: *width,
                }
            }
            Inst::Store {
                mem: m,
                index,
                value,
            } => {
                let m = mem(*m);
                let index = f(*index);
                Inst::Store {
                    mem: m,
                    index,
                    value: f(*value),
                }
            }
            Inst::Atomic {
                op,
                mem: m,
                index,
                value,
            } => {
                let m = mem(*m);
                let index = f(*index);
                Inst::Atomic {
                    op: *op,
                    mem: m,
                    index,
                    value: f(*value),
                }
            }
            Inst::Unary(op, a) => Inst::Unary(*op, f(*a)),
            Inst::Binary(op, a, b) => {
                let a = f(*a);
                Inst::Binary(*op, a, f(*b))
            }
            Inst::Ternary(op, a, b, c) => {
                let a = f(*a);
                let b = f(*b);
                Inst::Ternary(*op, a, b, f(*c))
            }
            Inst::Cast(a, d) => Inst::Cast(f(*a), *d),
            Inst::Bitcast(a, d) => Inst::Bitcast(f(*a), *d),
            Inst::Vectorize(vs) => Inst::Vectorize(vs.iter().map(|&v| f(v)).collect()),
            Inst::Extract(a, lane) => Inst::Extract(f(*a), *lane),
        }
    }

    /// Whether the instruction is free of effects and depends only on its operands (and the
    /// invocation's identity), so it may be deduplicated, removed when unused, or moved.
    pub fn is_pure(&self) -> bool {
        matches!(
            self,
            Inst::Const(_)
                | Inst::DimParam(_)
                | Inst::Special(..)
                | Inst::Unary(..)
                | Inst::Binary(..)
                | Inst::Ternary(..)
                | Inst::Cast(..)
                | Inst::Bitcast(..)
                | Inst::Vectorize(_)
                | Inst::Extract(..)
        )
    }

    /// Whether the instruction defines a value other instructions can use.
    pub fn has_value(&self) -> bool {
        !matches!(
            self,
            Inst::EndRange(_)
                | Inst::EndIf(_)
                | Inst::Store { .. }
                | Inst::Atomic { .. }
                | Inst::Barrier
        )
    }
}

/// A kernel: the unit of compilation and launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The kernel's name (a C identifier).
    pub name: String,
    /// Positional parameters.
    pub params: Vec<Param>,
    /// The launch grid.
    pub grid: Grid,
    /// The body; instruction `i` defines `Value(i)`.
    pub insts: Vec<Inst>,
}

impl Kernel {
    /// The instruction defining `v`.
    pub fn inst(&self, v: Value) -> &Inst {
        &self.insts[v.index()]
    }

    /// The variables of the kernel's `Param::Dim`s, in parameter order.
    pub fn dim_vars(&self) -> Vec<Var> {
        self.params
            .iter()
            .filter_map(|p| match p {
                Param::Dim { var, .. } => Some(*var),
                Param::Buffer { .. } => None,
            })
            .collect()
    }
}
