//! Writing kernels by hand: the builder behind hand-written and custom kernels.
//!
//! Blocks are closures, so they always balance; symbolic dims lower to instructions with
//! [`KernelBuilder::expr`]; [`KernelBuilder::build`] verifies the result.
//!
//! ```
//! use tessel_ir::{Access, KernelBuilder};
//! use tessel_shape::DType;
//!
//! // out[i] = a[i] + b[i] for 1024 elements, 64 per workgroup.
//! let mut kb = KernelBuilder::new("vector_add");
//! let a = kb.buffer("a", DType::F32, 1024, Access::Read);
//! let b = kb.buffer("b", DType::F32, 1024, Access::Read);
//! let out = kb.buffer("out", DType::F32, 1024, Access::Write);
//! kb.grid([16, 1, 1], [64, 1, 1]);
//! let i = kb.global_id(0, DType::I32);
//! let (x, y) = (kb.load(a, i), kb.load(b, i));
//! let sum = kb.add(x, y);
//! kb.store(out, i, sum);
//! let kernel = kb.build().unwrap();
//! assert_eq!(kernel.params.len(), 3);
//! ```

use rustc_hash::FxHashMap;
use tessel_shape::{BinaryOp, DType, Dim, Expr, ExprView, Scalar, TernaryOp, UnaryOp, Var};

use crate::kernel::{Access, AtomicOp, Grid, Inst, Kernel, Mem, Param, Special, Value};
use crate::verify::{VerifyError, VerifyErrorKind, verify};

/// A buffer parameter, by position; usable wherever a [`Mem`] is expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buf(pub usize);

impl From<Buf> for Mem {
    fn from(b: Buf) -> Mem {
        Mem::Global(b.0)
    }
}

/// Builds a [`Kernel`] instruction by instruction. See the module docs.
pub struct KernelBuilder {
    kernel: Kernel,
    /// Lowered symbolic expressions per requested dtype, one map per open block
    /// (innermost last): a value is reused only while the block defining it is open.
    exprs: Vec<FxHashMap<(Expr, DType), Value>>,
    depth: usize,
    /// Variables read from existing values rather than dim parameters.
    bound: FxHashMap<Var, (Value, DType)>,
    error: Option<VerifyErrorKind>,
}

impl KernelBuilder {
    /// An empty kernel with a 1×1×1 grid.
    pub fn new(name: &str) -> Self {
        KernelBuilder {
            kernel: Kernel {
                name: name.to_owned(),
                params: Vec::new(),
                grid: Grid::default(),
                insts: Vec::new(),
            },
            exprs: vec![FxHashMap::default()],
            depth: 0,
            bound: FxHashMap::default(),
            error: None,
        }
    }

    /// An empty body with `kernel`'s name, parameters and grid, for passes that rebuild a
    /// kernel through the builder.
    pub(crate) fn with_signature(kernel: &Kernel) -> Self {
        Self::with_params(kernel, kernel.params.clone())
    }

    /// An empty body with `kernel`'s name and grid and the parameters `params`.
    pub(crate) fn with_params(kernel: &Kernel, params: Vec<Param>) -> Self {
        let mut kb = KernelBuilder::new(&kernel.name);
        kb.kernel.params = params;
        kb.kernel.grid = kernel.grid.clone();
        kb
    }

    /// Declares the next buffer parameter.
    pub fn buffer(&mut self, name: &str, dtype: DType, len: impl Into<Dim>, access: Access) -> Buf {
        self.kernel.params.push(Param::Buffer {
            name: name.to_owned(),
            dtype,
            len: len.into(),
            access,
        });
        Buf(self.kernel.params.len() - 1)
    }

    /// Declares `var` as the next dim parameter (if it isn't one yet) and reads its value
    /// as `dtype`.
    pub fn dim(&mut self, var: Var, dtype: DType) -> Value {
        let existing = self
            .kernel
            .params
            .iter()
            .position(|p| matches!(p, Param::Dim { var: v, .. } if *v == var));
        let declared = existing.and_then(|pos| match self.kernel.params[pos] {
            Param::Dim { dtype, .. } => Some((pos, dtype)),
            Param::Buffer { .. } => None,
        });
        let (pos, declared) = declared.unwrap_or_else(|| {
            self.kernel.params.push(Param::Dim { var, dtype });
            (self.kernel.params.len() - 1, dtype)
        });
        let v = self.push(Inst::DimParam(pos));
        if declared == dtype {
            v
        } else {
            self.cast(v, dtype)
        }
    }

    /// Sets the launch grid: workgroups and invocations per workgroup along each axis.
    pub fn grid<G: Into<Dim>, L: Into<Dim>>(&mut self, groups: [G; 3], local: [L; 3]) {
        self.kernel.grid = Grid {
            groups: groups.map(Into::into),
            local: local.map(Into::into),
        };
    }

    /// Appends `inst` like [`KernelBuilder::push`], opening and closing the builder's
    /// scopes at `Range`/`If` and their ends, for passes that replay a kernel's
    /// instructions (so expressions lowered inside a block are not reused after it).
    pub(crate) fn push_scoped(&mut self, inst: Inst) -> Value {
        match inst {
            Inst::Range { start, end } => self.begin_range(start, end),
            Inst::If(cond) => self.begin_if(cond),
            Inst::EndRange(_) | Inst::EndIf(_) => {
                self.close_scope();
                self.push(inst)
            }
            other => self.push(other),
        }
    }

    /// Appends an instruction and returns its value.
    pub fn push(&mut self, inst: Inst) -> Value {
        self.kernel.insts.push(inst);
        Value(self.kernel.insts.len() as u32 - 1)
    }

    /// A constant.
    pub fn constant(&mut self, value: impl Into<Scalar>) -> Value {
        self.push(Inst::Const(value.into()))
    }

    /// The constant `value` as `dtype` (cast with [`Scalar::cast`] semantics).
    pub fn constant_as(&mut self, value: i64, dtype: DType) -> Value {
        self.push(Inst::Const(Scalar::I64(value).cast(dtype)))
    }

    /// The workgroup index along `axis`.
    pub fn group_id(&mut self, axis: u8, dtype: DType) -> Value {
        self.push(Inst::Special(Special::GroupId(axis), dtype))
    }

    /// The invocation's index within its workgroup along `axis`.
    pub fn local_id(&mut self, axis: u8, dtype: DType) -> Value {
        self.push(Inst::Special(Special::LocalId(axis), dtype))
    }

    /// `group_id * local_size + local_id` along `axis`.
    pub fn global_id(&mut self, axis: u8, dtype: DType) -> Value {
        let group = self.group_id(axis, dtype);
        let size = self
            .kernel
            .grid
            .local
            .get(axis as usize)
            .copied()
            .unwrap_or(Dim::constant(1));
        let size = self.expr(size, dtype);
        let local = self.local_id(axis, dtype);
        self.ternary(TernaryOp::MulAdd, group, size, local)
    }

    /// A loop over `start..end`; `body` receives the loop variable.
    pub fn range<R>(
        &mut self,
        start: Value,
        end: Value,
        body: impl FnOnce(&mut Self, Value) -> R,
    ) -> R {
        let var = self.begin_range(start, end);
        let out = body(self, var);
        self.end_range(var);
        out
    }

    /// A block run where the `bool` `cond` holds.
    pub fn if_<R>(&mut self, cond: Value, body: impl FnOnce(&mut Self) -> R) -> R {
        let open = self.begin_if(cond);
        let out = body(self);
        self.end_if(open);
        out
    }

    /// Opens a loop over `start..end` and returns the loop variable; close it with
    /// [`KernelBuilder::end_range`]. Prefer [`KernelBuilder::range`] where a closure fits.
    pub fn begin_range(&mut self, start: Value, end: Value) -> Value {
        let var = self.push(Inst::Range { start, end });
        self.depth += 1;
        self.exprs.push(FxHashMap::default());
        var
    }

    /// Closes the loop opened by [`KernelBuilder::begin_range`].
    pub fn end_range(&mut self, var: Value) {
        self.close_scope();
        self.push(Inst::EndRange(var));
    }

    /// Opens a block run where `cond` holds; close it with [`KernelBuilder::end_if`].
    pub fn begin_if(&mut self, cond: Value) -> Value {
        let open = self.push(Inst::If(cond));
        self.depth += 1;
        self.exprs.push(FxHashMap::default());
        open
    }

    /// Closes the block opened by [`KernelBuilder::begin_if`].
    pub fn end_if(&mut self, open: Value) {
        self.close_scope();
        self.push(Inst::EndIf(open));
    }

    fn close_scope(&mut self) {
        self.depth = self.depth.saturating_sub(1);
        if self.exprs.len() > 1 {
            self.exprs.pop();
        }
    }

    /// Makes [`KernelBuilder::expr`] read `var` from `value` (of integer dtype `dtype`)
    /// instead of declaring it a dim parameter: how loop and invocation indices enter
    /// symbolic index expressions.
    pub fn bind(&mut self, var: Var, value: Value, dtype: DType) {
        if self.bound.insert(var, (value, dtype)).is_some() {
            // Lowered expressions may name the old value.
            self.exprs.iter_mut().for_each(FxHashMap::clear);
        }
    }

    /// Workgroup-shared memory of `len` elements.
    pub fn local(&mut self, dtype: DType, len: usize) -> Mem {
        Mem::Local(self.push(Inst::DefineLocal { dtype, len }))
    }

    /// Per-invocation registers of `len` elements.
    pub fn reg(&mut self, dtype: DType, len: usize) -> Mem {
        Mem::Reg(self.push(Inst::DefineReg { dtype, len }))
    }

    /// Loads one element.
    pub fn load(&mut self, mem: impl Into<Mem>, index: Value) -> Value {
        self.load_vec(mem, index, 1)
    }

    /// Loads `width` consecutive elements as a vector.
    pub fn load_vec(&mut self, mem: impl Into<Mem>, index: Value, width: u8) -> Value {
        self.push(Inst::Load {
            mem: mem.into(),
            index,
            width,
        })
    }

    /// Stores a value (scalar or vector) at `index`.
    pub fn store(&mut self, mem: impl Into<Mem>, index: Value, value: Value) {
        self.push(Inst::Store {
            mem: mem.into(),
            index,
            value,
        });
    }

    /// Adds a scalar atomically at `index` of a buffer declared [`Access::Accumulate`].
    pub fn atomic_add(&mut self, mem: impl Into<Mem>, index: Value, value: Value) {
        self.atomic(AtomicOp::Add, mem, index, value);
    }

    /// Combines a scalar atomically by `op` at `index` of a buffer declared
    /// [`Access::Accumulate`].
    pub fn atomic(&mut self, op: AtomicOp, mem: impl Into<Mem>, index: Value, value: Value) {
        self.push(Inst::Atomic {
            op,
            mem: mem.into(),
            index,
            value,
        });
    }

    /// A workgroup barrier.
    pub fn barrier(&mut self) {
        self.push(Inst::Barrier);
    }

    /// A unary op.
    pub fn unary(&mut self, op: UnaryOp, a: Value) -> Value {
        self.push(Inst::Unary(op, a))
    }

    /// A binary op.
    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        self.push(Inst::Binary(op, a, b))
    }

    /// A ternary op.
    pub fn ternary(&mut self, op: TernaryOp, a: Value, b: Value, c: Value) -> Value {
        self.push(Inst::Ternary(op, a, b, c))
    }

    /// `a + b`.
    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Add, a, b)
    }

    /// `a - b`.
    pub fn sub(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Sub, a, b)
    }

    /// `a * b`.
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Mul, a, b)
    }

    /// `a / b`.
    pub fn div(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Div, a, b)
    }

    /// `a % b` (sign of the dividend).
    pub fn rem(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Rem, a, b)
    }

    /// `a < b`.
    pub fn lt(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Lt, a, b)
    }

    /// `if cond { a } else { b }`.
    pub fn select(&mut self, cond: Value, a: Value, b: Value) -> Value {
        self.ternary(TernaryOp::Where, cond, a, b)
    }

    /// A dtype conversion.
    pub fn cast(&mut self, a: Value, dtype: DType) -> Value {
        self.push(Inst::Cast(a, dtype))
    }

    /// A bit reinterpretation.
    pub fn bitcast(&mut self, a: Value, dtype: DType) -> Value {
        self.push(Inst::Bitcast(a, dtype))
    }

    /// A vector of 2, 4 or 8 scalars.
    pub fn vectorize(&mut self, lanes: Vec<Value>) -> Value {
        self.push(Inst::Vectorize(lanes))
    }

    /// One lane of a vector.
    pub fn extract(&mut self, v: Value, lane: u8) -> Value {
        self.push(Inst::Extract(v, lane))
    }

    /// Lowers a symbolic integer expression to instructions computing it as `dtype`.
    ///
    /// Variables become dim parameters (declared on first use). Floor division and modulo
    /// lower to the truncating `div`/`rem` when the dividend is provably non-negative, and
    /// to a corrected form otherwise. A divisor that may be negative is an error at `build`.
    pub fn expr(&mut self, e: Expr, dtype: DType) -> Value {
        if let Some(v) = self.exprs.iter().rev().find_map(|m| m.get(&(e, dtype))) {
            return *v;
        }
        let v = match e.view() {
            ExprView::Const(c) => self.constant_as(c, dtype),
            ExprView::Var(var) => match self.bound.get(&var) {
                Some(&(v, d)) if d == dtype => v,
                Some(&(v, _)) => self.cast(v, dtype),
                None => self.dim(var, dtype),
            },
            ExprView::Sum { constant, terms } => {
                let mut acc: Option<Value> = None;
                for (term, coeff) in terms {
                    let t = self.expr(term, dtype);
                    let t = if coeff == 1 {
                        t
                    } else {
                        let k = self.constant_as(coeff, dtype);
                        self.mul(t, k)
                    };
                    acc = Some(match acc {
                        Some(a) => self.add(a, t),
                        None => t,
                    });
                }
                let acc = acc.expect("a sum has terms");
                if constant == 0 {
                    acc
                } else {
                    let k = self.constant_as(constant, dtype);
                    self.add(acc, k)
                }
            }
            ExprView::Prod(factors) => {
                let mut vals = factors
                    .into_iter()
                    .map(|f| self.expr(f, dtype))
                    .collect::<Vec<_>>()
                    .into_iter();
                let first = vals.next().expect("a product has factors");
                vals.fold(first, |a, b| self.mul(a, b))
            }
            ExprView::Div(a, b) | ExprView::Mod(a, b) => {
                let is_div = matches!(e.view(), ExprView::Div(..));
                self.floor_div_mod(a, b, dtype, is_div)
            }
            ExprView::Min(a, b) | ExprView::Max(a, b) => {
                let op = if matches!(e.view(), ExprView::Min(..)) {
                    BinaryOp::Min
                } else {
                    BinaryOp::Max
                };
                let (a, b) = (self.expr(a, dtype), self.expr(b, dtype));
                self.binary(op, a, b)
            }
            ExprView::Lt(a, b) | ExprView::Eq(a, b) => {
                let op = if matches!(e.view(), ExprView::Lt(..)) {
                    BinaryOp::Lt
                } else {
                    BinaryOp::Eq
                };
                let (a, b) = (self.expr(a, dtype), self.expr(b, dtype));
                let c = self.binary(op, a, b);
                self.cast(c, dtype)
            }
        };
        self.exprs
            .last_mut()
            .expect("the top-level scope is never popped")
            .insert((e, dtype), v);
        v
    }

    fn floor_div_mod(&mut self, a: Expr, b: Expr, dtype: DType, is_div: bool) -> Value {
        let bb = b.bounds();
        if bb.lo <= 0 {
            self.error.get_or_insert(VerifyErrorKind::Type(format!(
                "cannot lower `{a} {} {b}`: the divisor may be zero or negative",
                if is_div { "/" } else { "%" }
            )));
        }
        let nonneg = a.bounds().lo >= 0;
        let (av, bv) = (self.expr(a, dtype), self.expr(b, dtype));
        if nonneg {
            // Truncation and floor agree on a non-negative dividend.
            return if is_div {
                self.div(av, bv)
            } else {
                self.rem(av, bv)
            };
        }
        let zero = self.constant_as(0, dtype);
        if is_div {
            // floor(a / b) for b > 0: (a - (b - 1)) / b when a < 0, a / b otherwise.
            let one = self.constant_as(1, dtype);
            let bm1 = self.sub(bv, one);
            let shifted = self.sub(av, bm1);
            let neg_q = self.div(shifted, bv);
            let q = self.div(av, bv);
            let neg = self.lt(av, zero);
            self.select(neg, neg_q, q)
        } else {
            // a mod b for b > 0: the truncated remainder, moved into 0..b when negative.
            let r = self.rem(av, bv);
            let neg = self.lt(r, zero);
            let fixed = self.add(r, bv);
            self.select(neg, fixed, r)
        }
    }

    /// Verifies and returns the kernel.
    pub fn build(self) -> Result<Kernel, VerifyError> {
        if let Some(kind) = self.error {
            return Err(VerifyError {
                kernel: self.kernel.name,
                at: None,
                text: String::new(),
                kind,
            });
        }
        verify(&self.kernel)?;
        Ok(self.kernel)
    }

    /// [`KernelBuilder::build`], failing with the error followed by the kernel's text form
    /// (printed only then: printing every kernel cost lowering a tenth of its time).
    pub fn build_with_listing(self) -> Result<Kernel, String> {
        if self.error.is_none() && verify(&self.kernel).is_ok() {
            return Ok(self.kernel);
        }
        let listing = self.kernel.to_string();
        Err(match self.build() {
            Err(e) => format!("{e}\n{listing}"),
            Ok(_) => listing,
        })
    }

    /// The kernel built so far (for error reports).
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Returns the kernel without verifying it (for tests of the verifier itself).
    pub fn finish_unverified(self) -> Kernel {
        self.kernel
    }
}
