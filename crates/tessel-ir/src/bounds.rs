//! The bounds analysis: an interval analysis over a kernel's integer values, narrowed by
//! the conditions of enclosing `If`s, that proves loads and stores in bounds.
//!
//! Two uses: [`crate::verify()`] rejects a kernel with constant sizes whose index the
//! analysis bounds outside its memory (`check_bounds`); [`crate::passes::guard`] guards
//! every access the analysis cannot prove for every launch (`unproven_accesses`), where
//! unknown integers span their dtype, dim parameters their variables' bounds, and symbolic
//! lengths are compared in closed form against symbolic upper bounds of the index.

use rustc_hash::FxHashMap;
use tessel_shape::{BinaryOp, DType, Expr, TernaryOp};

use crate::kernel::{Inst, Kernel, Mem, Param, Special, Value};
use crate::verify::{Def, VerifyError, VerifyErrorKind};

type Interval = (i128, i128);

/// Proves every access in bounds when the grid and buffer lengths are constant and the
/// kernel has no dynamic dims (symbolic sizes are checked at launch instead). An access
/// whose index the analysis cannot bound (data, say) passes here; [`guard_unproven`] makes
/// it safe before a backend compiles the kernel.
pub(crate) fn check_bounds(kernel: &Kernel, defs: &[Def]) -> Result<(), VerifyError> {
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
