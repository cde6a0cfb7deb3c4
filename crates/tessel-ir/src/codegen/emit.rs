//! The walk that prints a kernel: first a [`Plan`] (which instructions run once per
//! workgroup, which regions the rest fall into, and how values cross regions; see the
//! [module docs](super)), then one pass that writes each instruction where the plan puts it.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use tessel_shape::{DType, Dim};

use super::cstyle::{CStyle, Launch};
use super::exprs::Exprs;
use super::helpers::Helper;
use super::{CodegenError, c_ident, entry_name};
use crate::kernel::{Inst, Kernel, Mem, Param, Special, Ty, Value};
use crate::verify::Def;

/// Where an instruction runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    /// Once per workgroup.
    Group,
    /// Once per invocation, inside the local-id loops of this region.
    Item(u32),
}

/// The result of classifying a kernel's instructions. Vectors are indexed by instruction.
struct Plan {
    level: Vec<Level>,
    /// Per-invocation values read in a later region, kept in `v<i>_s[LOCAL]`.
    spill: Vec<bool>,
    /// Per-invocation values read at workgroup level, copied to `v<i>_u`.
    shadow: Vec<bool>,
    /// Per-invocation values recomputed in the regions that read them.
    remat: Vec<bool>,
    /// Per region, the values recomputed at its start, in instruction order.
    remat_at: Vec<BTreeSet<usize>>,
    /// Whether any `DefineReg` runs at workgroup level (and so needs `[LOCAL]`).
    group_regs: bool,
}

impl Plan {
    /// Classifies `kernel` (see the module docs). `serial` is whether invocations become
    /// loops; without it, values never need to cross regions by memory.
    fn new(kernel: &Kernel, defs: &[Def], serial: bool) -> Plan {
        let insts = &kernel.insts;
        let n = insts.len();
        // Which blocks contain a barrier, at any depth.
        let mut barrier_block = vec![false; n];
        let mut open = Vec::new();
        let mut any_barrier = false;
        for (i, inst) in insts.iter().enumerate() {
            match inst {
                Inst::Range { .. } | Inst::If(_) => open.push(i),
                Inst::EndRange(_) | Inst::EndIf(_) => {
                    open.pop();
                }
                Inst::Barrier => {
                    any_barrier = true;
                    for &o in &open {
                        barrier_block[o] = true;
                    }
                }
                _ => {}
            }
        }

        let mut level = Vec::with_capacity(n);
        // Whether the instruction is inside a per-invocation block (not its opener).
        let mut nested = Vec::with_capacity(n);
        let mut item_depth = 0usize;
        let mut item_region = 0u32;
        let mut current: Option<u32> = None;
        let mut regions = 0u32;
        for (i, inst) in insts.iter().enumerate() {
            if item_depth > 0 {
                // Everything inside a per-invocation block is per-invocation.
                level.push(Level::Item(item_region));
                nested.push(true);
                match inst {
                    Inst::Range { .. } | Inst::If(_) => item_depth += 1,
                    Inst::EndRange(_) | Inst::EndIf(_) => item_depth -= 1,
                    _ => {}
                }
                continue;
            }
            nested.push(false);
            let group = match inst {
                Inst::Range { .. } | Inst::If(_) => barrier_block[i],
                // At this depth, blocks that are closed were opened at workgroup level:
                // a per-invocation block is closed inside the branch above.
                Inst::EndRange(_) | Inst::EndIf(_) | Inst::Barrier | Inst::DefineLocal { .. } => {
                    true
                }
                Inst::DefineReg { .. } => any_barrier,
                Inst::Special(Special::LocalId(_), _) => false,
                _ => {
                    inst.is_pure()
                        && inst
                            .operands()
                            .iter()
                            .all(|v| level[v.index()] == Level::Group)
                }
            };
            if group {
                level.push(Level::Group);
                if matches!(
                    inst,
                    Inst::Range { .. }
                        | Inst::If(_)
                        | Inst::EndRange(_)
                        | Inst::EndIf(_)
                        | Inst::Barrier
                ) {
                    current = None;
                }
            } else {
                let region = *current.get_or_insert_with(|| {
                    regions += 1;
                    regions - 1
                });
                level.push(Level::Item(region));
                if matches!(inst, Inst::Range { .. } | Inst::If(_)) {
                    item_depth = 1;
                    item_region = region;
                }
            }
        }

        let group_regs = insts
            .iter()
            .zip(&level)
            .any(|(inst, l)| matches!(inst, Inst::DefineReg { .. }) && *l == Level::Group);
        let mut plan = Plan {
            level,
            spill: vec![false; n],
            shadow: vec![false; n],
            remat: vec![false; n],
            remat_at: vec![BTreeSet::new(); regions as usize],
            group_regs,
        };
        if !serial {
            return plan;
        }
        for (i, inst) in insts.iter().enumerate() {
            // Cheap to recompute: a pure integer or bool scalar of the local ids and
            // workgroup-level values.
            let cheap = defs[i]
                .ty()
                .is_some_and(|t| t.width == 1 && (t.dtype.is_int() || t.dtype == DType::Bool));
            plan.remat[i] = matches!(plan.level[i], Level::Item(_))
                && !nested[i]
                && cheap
                && inst.is_pure()
                && inst
                    .operands()
                    .iter()
                    .all(|v| plan.level[v.index()] == Level::Group || plan.remat[v.index()]);
        }
        for (i, inst) in insts.iter().enumerate() {
            for v in inst.operands() {
                let Level::Item(defined) = plan.level[v.index()] else {
                    continue;
                };
                match plan.level[i] {
                    Level::Group => plan.shadow[v.index()] = true,
                    Level::Item(used) if used != defined => {
                        if plan.remat[v.index()] {
                            plan.rematerialize(insts, v.index(), used);
                        } else {
                            plan.spill[v.index()] = true;
                        }
                    }
                    Level::Item(_) => {}
                }
            }
        }
        plan
    }

    /// Schedules `v`, and the per-invocation values it is computed from, for
    /// recomputation at the start of `region`.
    fn rematerialize(&mut self, insts: &[Inst], v: usize, region: u32) {
        let mut work = vec![v];
        while let Some(v) = work.pop() {
            if self.remat_at[region as usize].insert(v) {
                work.extend(
                    insts[v]
                        .operands()
                        .into_iter()
                        .map(Value::index)
                        .filter(|&u| matches!(self.level[u], Level::Item(_))),
                );
            }
        }
    }

    fn needs_lid(&self) -> bool {
        self.group_regs || self.spill.iter().any(|&s| s)
    }
}

/// One line of output, or a block boundary.
enum Piece {
    Line(String),
    /// A line ending in `{`; what follows is indented.
    Open(String),
    /// The `}` that closes the innermost open block.
    Close,
}

/// Indented lines.
#[derive(Default)]
struct Writer {
    lines: Vec<(usize, String)>,
    indent: usize,
}

impl Writer {
    fn line(&mut self, text: impl Into<String>) {
        self.lines.push((self.indent, text.into()));
    }

    fn open(&mut self, text: impl Into<String>) {
        self.line(text);
        self.indent += 1;
    }

    fn close(&mut self) {
        self.indent = self.indent.saturating_sub(1);
        self.line("}");
    }

    fn piece(&mut self, piece: Piece) {
        match piece {
            Piece::Line(s) => self.line(s),
            Piece::Open(s) => self.open(s),
            Piece::Close => self.close(),
        }
    }

    fn finish(self) -> String {
        let mut out = String::new();
        for (indent, text) in self.lines {
            let _ = writeln!(out, "{:width$}{text}", "", width = 4 * indent);
        }
        out
    }
}

/// Prints one kernel in one dialect.
pub(super) struct Emitter<'k> {
    kernel: &'k Kernel,
    defs: Vec<Def>,
    x: Exprs<'k>,
    plan: Plan,
    serial: bool,
    /// The local sizes that are constant.
    local: [Option<i64>; 3],
    /// Per parameter: the buffer's variable name (`None` for dims).
    buffers: Vec<Option<String>>,
    /// Per parameter: its position among the dim parameters.
    dim_index: Vec<usize>,
    /// Workgroup-level code.
    group: Writer,
    /// The open region's code, written into `group` when the region ends.
    region: Writer,
    current: Option<u32>,
    /// Where the dialect aligns vectors: the largest power of two known to divide each
    /// integer value (`passes::multiples`), which decides the vector accesses made through
    /// an aligned pointer. Empty otherwise.
    multiples: Vec<u64>,
}

impl<'k> Emitter<'k> {
    pub(super) fn new(
        kernel: &'k Kernel,
        defs: Vec<Def>,
        dialect: &'k CStyle,
    ) -> Result<Self, CodegenError> {
        let serial = dialect.launch == Launch::Serial;
        let plan = Plan::new(kernel, &defs, serial);
        let local = kernel.grid.local.map(Dim::as_const);
        if serial && plan.needs_lid() && local.iter().any(Option::is_none) {
            let [x, y, z] = &kernel.grid.local;
            return Err(CodegenError::Unsupported {
                kernel: kernel.name.clone(),
                dialect: dialect.name,
                reason: format!(
                    "values live across a barrier, and a CPU keeps them in per-invocation \
                     arrays, which need constant local sizes; found local({x}, {y}, {z}), \
                     so make the local sizes constant"
                ),
            });
        }
        let mut dims = 0;
        let mut dim_index = Vec::with_capacity(kernel.params.len());
        let buffers = kernel
            .params
            .iter()
            .enumerate()
            .map(|(p, param)| {
                dim_index.push(dims);
                match param {
                    Param::Buffer { name, .. } => Some(format!("b{p}_{}", c_ident(name))),
                    Param::Dim { .. } => {
                        dims += 1;
                        None
                    }
                }
            })
            .collect();
        let group = Writer {
            lines: Vec::new(),
            indent: if serial { 2 } else { 1 },
        };
        Ok(Emitter {
            kernel,
            defs,
            x: Exprs::new(dialect, &kernel.name),
            plan,
            serial,
            local,
            buffers,
            dim_index,
            group,
            region: Writer::default(),
            current: None,
            multiples: if dialect.vector_align.is_some() {
                crate::passes::multiples(kernel)
            } else {
                Vec::new()
            },
        })
    }

    /// The pointer through which a global vector access of `ty` at `index` reads or
    /// writes the whole vector in one instruction (`*(T *)(base + index)`), where the
    /// dialect aligns vectors and `index` is a proven multiple of that alignment; `None`
    /// where each lane is its own access.
    fn vector_pointer(
        &mut self,
        mem: Mem,
        index: Value,
        ty: Ty,
        site: Level,
        constant: bool,
    ) -> Result<Option<String>, CodegenError> {
        let Mem::Global(_) = mem else {
            return Ok(None);
        };
        let Some(&multiple) = self.multiples.get(index.index()) else {
            return Ok(None);
        };
        let align = super::helpers::vector_alignment(ty.dtype, ty.width);
        let proven = multiple.saturating_mul(ty.dtype.size_bytes() as u64) >= align as u64;
        if ty.width == 1 || ty.dtype == DType::Bool || !proven {
            return Ok(None);
        }
        let t = self.ty(ty)?;
        let base = self.mem(mem);
        let idx = self.operand(index, 0, site)?;
        let q = self.dialect().buffer_qualifier;
        let c = if constant { "const " } else { "" };
        Ok(Some(format!("*({q}{c}{t} *)({base} + {idx})")))
    }

    fn dialect(&self) -> &'k CStyle {
        self.x.dialect
    }

    /// The whole source: prelude, helpers, kernel.
    pub(super) fn render(mut self) -> Result<String, CodegenError> {
        for i in 0..self.kernel.insts.len() {
            let level = self.plan.level[i];
            if level == Level::Group {
                if matches!(
                    self.kernel.insts[i],
                    Inst::Range { .. }
                        | Inst::If(_)
                        | Inst::EndRange(_)
                        | Inst::EndIf(_)
                        | Inst::Barrier
                ) {
                    self.flush_region();
                }
                for piece in self.inst(i, level)? {
                    self.group.piece(piece);
                }
            } else {
                if self.current != Some(level_region(level)) {
                    self.flush_region();
                    self.start_region(level_region(level))?;
                }
                for piece in self.inst(i, level)? {
                    self.region.piece(piece);
                }
            }
        }
        self.flush_region();
        let signature = self.signature()?;
        let body = std::mem::take(&mut self.group).finish();
        let dialect = self.dialect();
        // The name is free text: a `*/` in it would end the comment early.
        let mut out = format!(
            "/* Kernel `{}`, generated by tessel-ir for the {} dialect. */\n{}\n",
            self.kernel.name.replace("*/", "* /"),
            dialect.name,
            dialect.prelude
        );
        out.push_str(&self.x.helpers.render(dialect, &self.kernel.name)?);
        out.push_str(&signature);
        out.push_str(&body);
        if self.serial {
            out.push_str("    }\n");
        }
        out.push_str("}\n");
        Ok(out)
    }

    /// The function header, and for serial kernels the setup and the workgroup loop's head.
    fn signature(&mut self) -> Result<String, CodegenError> {
        let dialect = self.dialect();
        let mut out = String::new();
        let mut params = Vec::new();
        let mut setup = Vec::new();
        for (p, param) in self.kernel.params.iter().enumerate() {
            match param {
                Param::Buffer { dtype, access, .. } => {
                    let t = if *dtype == DType::Bool {
                        dialect.bool_storage
                    } else {
                        self.x.ty_for("buffer", *dtype)?
                    };
                    let t = if access.mutates() {
                        t.to_owned()
                    } else {
                        format!("const {t}")
                    };
                    let name = self.buffers[p].clone().unwrap_or_default();
                    if self.serial {
                        setup.push(format!(
                            "{t} *const {name} = ({t} *)bufs[{}];",
                            p - self.dim_index[p]
                        ));
                    } else {
                        params.push(format!("{}{t} *{name}", dialect.buffer_qualifier));
                    }
                }
                Param::Dim { dtype, .. } => {
                    if !self.serial {
                        params.push(format!("const {} d{p}", self.x.ty_for("dim", *dtype)?));
                    }
                }
            }
        }
        let name = entry_name(self.kernel);
        if !self.serial {
            let _ = writeln!(
                out,
                "{}void {name}({}) {{",
                dialect.kernel_prefix,
                params.join(", ")
            );
            return Ok(out);
        }
        let _ = writeln!(
            out,
            "void {name}(void *const *bufs, const int64_t *dims, const int64_t *grid, int64_t group_begin, int64_t group_end) {{"
        );
        for line in setup {
            let _ = writeln!(out, "    {line}");
        }
        let groups = self.kernel.grid.groups.map(Dim::as_const);
        for (axis, size) in groups.iter().enumerate() {
            let value = size.map_or_else(|| format!("grid[{axis}]"), |c| c.to_string());
            let _ = writeln!(out, "    const int64_t groups{axis} = {value};");
        }
        for (axis, size) in self.local.iter().enumerate() {
            let value = size.map_or_else(|| format!("grid[{}]", 3 + axis), |c| c.to_string());
            let _ = writeln!(out, "    const int64_t local{axis} = {value};");
        }
        let local_len = self.local_len();
        for i in 0..self.kernel.insts.len() {
            if self.plan.spill[i] {
                let t = self.value_type(i)?;
                let _ = writeln!(out, "    {t} v{i}_s[{local_len}];");
            }
            if self.plan.shadow[i] {
                let t = self.value_type(i)?;
                let _ = writeln!(out, "    {t} v{i}_u;");
            }
        }
        let _ = writeln!(
            out,
            "    for (int64_t group = group_begin; group < group_end; ++group) {{"
        );
        // Linear workgroup numbers run x fastest.
        let _ = writeln!(out, "        const int64_t gid0 = group % groups0;");
        let _ = writeln!(
            out,
            "        const int64_t gid1 = group / groups0 % groups1;"
        );
        let _ = writeln!(
            out,
            "        const int64_t gid2 = group / groups0 / groups1;"
        );
        Ok(out)
    }

    /// The number of invocations per workgroup, when every local size is constant.
    fn local_len(&self) -> i64 {
        self.local.iter().map(|s| s.unwrap_or(1)).product()
    }

    /// The C type of instruction `i`'s data value.
    fn value_type(&mut self, i: usize) -> Result<String, CodegenError> {
        let Some(ty) = self.defs[i].ty() else {
            return Err(CodegenError::Unsupported {
                kernel: self.kernel.name.clone(),
                dialect: self.dialect().name,
                reason: format!("%{i} is used across a barrier but is not a data value"),
            });
        };
        self.ty(ty)
    }

    /// The C type of values of `ty` (a vector typedef for `width > 1`).
    fn ty(&mut self, ty: Ty) -> Result<String, CodegenError> {
        let scalar = self.x.ty_for("value", ty.dtype)?;
        Ok(if ty.width == 1 {
            scalar.to_owned()
        } else {
            self.x.helpers.call(Helper::Vector(ty.dtype, ty.width))
        })
    }

    /// Opens region `r`, recomputing the values it needs from earlier regions.
    fn start_region(&mut self, r: u32) -> Result<(), CodegenError> {
        self.current = Some(r);
        let remat: Vec<usize> = self.plan.remat_at[r as usize].iter().copied().collect();
        for v in remat {
            for piece in self.inst(v, Level::Item(r))? {
                self.region.piece(piece);
            }
        }
        Ok(())
    }

    /// Ends the open region: its code goes into the workgroup-level code, inside the
    /// local-id loops for serial kernels.
    fn flush_region(&mut self) {
        if self.current.take().is_none() {
            return;
        }
        let body = std::mem::take(&mut self.region);
        if !self.serial {
            for (indent, text) in body.lines {
                self.group.lines.push((self.group.indent + indent, text));
            }
            return;
        }
        // x innermost: consecutive invocations touch consecutive elements.
        let mut loops = 0;
        for axis in (0..3).rev() {
            if self.local[axis] != Some(1) {
                self.group.open(format!(
                    "for (int64_t lid{axis} = 0; lid{axis} < local{axis}; ++lid{axis}) {{"
                ));
                loops += 1;
            }
        }
        if self.plan.needs_lid() {
            // The linear local id, (lid2 * local1 + lid1) * local0 + lid0, without the
            // axes that have no loop.
            let mut linear: Option<String> = None;
            for axis in (0..3).rev() {
                let scaled = linear.map(|e| format!("{e} * local{axis}"));
                let id = (self.local[axis] != Some(1)).then(|| format!("lid{axis}"));
                linear = match (scaled, id) {
                    (Some(s), Some(id)) => Some(format!("({s} + {id})")),
                    (s, id) => s.or(id),
                };
            }
            let linear = linear.unwrap_or_else(|| "0".into());
            self.group.line(format!("const int64_t lid = {linear};"));
        }
        for (indent, text) in body.lines {
            self.group.lines.push((self.group.indent + indent, text));
        }
        for _ in 0..loops {
            self.group.close();
        }
    }

    /// The name of value `v` as code at `site` reads it.
    fn name(&self, v: Value, site: Level) -> String {
        let n = v.index();
        if !self.serial {
            return format!("v{n}");
        }
        match (self.plan.level[n], site) {
            (Level::Item(defined), Level::Item(used)) if defined != used && !self.plan.remat[n] => {
                format!("v{n}_s[lid]")
            }
            (Level::Item(_), Level::Group) => format!("v{n}_u"),
            _ => format!("v{n}"),
        }
    }

    /// Lane `lane` of operand `v` at `site` (the whole value for scalars).
    fn operand(&mut self, v: Value, lane: u8, site: Level) -> Result<String, CodegenError> {
        if let Inst::Const(c) = self.kernel.inst(v) {
            return self.x.constant(*c);
        }
        let name = self.name(v, site);
        Ok(if self.width(v) > 1 {
            format!("{name}.v[{lane}]")
        } else {
            name
        })
    }

    fn width(&self, v: Value) -> u8 {
        self.defs[v.index()].ty().map_or(1, |t| t.width)
    }

    fn dtype(&self, v: Value) -> DType {
        self.defs[v.index()].ty().map_or(DType::Bool, |t| t.dtype)
    }

    /// The array expression for `mem` at `site`.
    fn mem(&self, mem: Mem) -> String {
        match mem {
            Mem::Global(p) => self.buffers.get(p).cloned().flatten().unwrap_or_default(),
            Mem::Local(v) => format!("v{}", v.index()),
            Mem::Reg(v) if self.serial && self.plan.level[v.index()] == Level::Group => {
                format!("v{}[lid]", v.index())
            }
            Mem::Reg(v) => format!("v{}", v.index()),
        }
    }

    /// `const T v<i> = <lanes>;`, plus the copies the plan asks for.
    fn define(&mut self, i: usize, lanes: Vec<String>) -> Result<Vec<Piece>, CodegenError> {
        let ty = self.value_type(i)?;
        let value = if lanes.len() == 1 {
            lanes.into_iter().next().unwrap_or_default()
        } else {
            format!("{{{{{}}}}}", lanes.join(", "))
        };
        let mut pieces = vec![Piece::Line(format!("const {ty} v{i} = {value};"))];
        if self.serial && self.plan.spill[i] {
            pieces.push(Piece::Line(format!("v{i}_s[lid] = v{i};")));
        }
        if self.serial && self.plan.shadow[i] {
            pieces.push(Piece::Line(format!("v{i}_u = v{i};")));
        }
        Ok(pieces)
    }

    /// The code for instruction `i`, written at `site`.
    fn inst(&mut self, i: usize, site: Level) -> Result<Vec<Piece>, CodegenError> {
        let kernel = self.kernel;
        let width = self.defs[i].ty().map_or(1, |t| t.width);
        let lanes = 0..width;
        Ok(match &kernel.insts[i] {
            Inst::Const(_) => Vec::new(),
            Inst::DimParam(p) => {
                let t = self.value_type(i)?;
                let value = if self.serial {
                    format!("({t})dims[{}]", self.dim_index[*p])
                } else {
                    format!("d{p}")
                };
                self.define(i, vec![value])?
            }
            Inst::Special(special, _) => {
                let t = self.value_type(i)?;
                let dialect = self.dialect();
                let value = match *special {
                    Special::GroupId(axis) => format!("({t}){}", (dialect.group_id)(axis)),
                    Special::LocalId(axis)
                        if self.serial && self.local.get(axis as usize) == Some(&Some(1)) =>
                    {
                        format!("({t})0")
                    }
                    Special::LocalId(axis) => format!("({t}){}", (dialect.local_id)(axis)),
                };
                self.define(i, vec![value])?
            }
            Inst::Range { start, end } => {
                let t = self.value_type(i)?;
                let (s, e) = (self.operand(*start, 0, site)?, self.operand(*end, 0, site)?);
                vec![Piece::Open(format!(
                    "for ({t} v{i} = {s}; v{i} < {e}; ++v{i}) {{"
                ))]
            }
            Inst::EndRange(_) | Inst::EndIf(_) => vec![Piece::Close],
            Inst::If(c) => vec![Piece::Open(format!(
                "if ({}) {{",
                self.operand(*c, 0, site)?
            ))],
            Inst::DefineLocal { dtype, len } => {
                let t = self.x.ty_for("define_local", *dtype)?;
                vec![Piece::Line(format!(
                    "{}{t} v{i}[{len}];",
                    self.dialect().local_qualifier
                ))]
            }
            Inst::DefineReg { dtype, len } => {
                let t = self.x.ty_for("define_reg", *dtype)?;
                // Zeroed as the interpreter zeroes them, though kernels must not rely on it:
                // it costs little here and keeps a racy or buggy kernel deterministic.
                if self.serial && site == Level::Group {
                    vec![Piece::Line(format!(
                        "{t} v{i}[{}][{len}] = {{{{0}}}};",
                        self.local_len()
                    ))]
                } else {
                    vec![Piece::Line(format!("{t} v{i}[{len}] = {{0}};"))]
                }
            }
            Inst::Load { mem, index, width } => {
                if let Some(ty) = self.defs[i].ty()
                    && let Some(pointer) = self.vector_pointer(*mem, *index, ty, site, true)?
                {
                    return self.define(i, vec![pointer]);
                }
                let base = self.mem(*mem);
                let idx = self.operand(*index, 0, site)?;
                let is_bool_buffer = matches!(mem, Mem::Global(_))
                    && self.defs[i].ty().is_some_and(|t| t.dtype == DType::Bool);
                let values = (0..*width)
                    .map(|k| {
                        let at = if k == 0 {
                            format!("{base}[{idx}]")
                        } else {
                            format!("{base}[{idx} + {k}]")
                        };
                        // Buffers hold bools as bytes; any nonzero byte reads as true.
                        if is_bool_buffer {
                            format!("({at} != 0)")
                        } else {
                            at
                        }
                    })
                    .collect();
                self.define(i, values)?
            }
            Inst::Store { mem, index, value } => {
                if let Some(ty) = self.defs[value.index()].ty()
                    && let Some(pointer) = self.vector_pointer(*mem, *index, ty, site, false)?
                {
                    let v = self.name(*value, site);
                    return Ok(vec![Piece::Line(format!("{pointer} = {v};"))]);
                }
                let base = self.mem(*mem);
                let idx = self.operand(*index, 0, site)?;
                let cast = if matches!(mem, Mem::Global(_)) && self.dtype(*value) == DType::Bool {
                    format!("({})", self.dialect().bool_storage)
                } else {
                    String::new()
                };
                let mut pieces = Vec::new();
                for k in 0..self.width(*value) {
                    let v = self.operand(*value, k, site)?;
                    let at = if k == 0 {
                        format!("{base}[{idx}]")
                    } else {
                        format!("{base}[{idx} + {k}]")
                    };
                    pieces.push(Piece::Line(format!("{at} = {cast}{v};")));
                }
                pieces
            }
            Inst::Atomic {
                op,
                mem,
                index,
                value,
            } => {
                let base = self.mem(*mem);
                let idx = self.operand(*index, 0, site)?;
                let v = self.operand(*value, 0, site)?;
                let dtype = self.dtype(*value);
                let dialect = self.dialect();
                let line = (dialect.atomic)(*op, dtype, &format!("&{base}[{idx}]"), &v)
                    .ok_or_else(|| CodegenError::UnsupportedOp {
                        kernel: self.kernel.name.clone(),
                        dialect: dialect.name,
                        op: format!("atomic_{}", op.name()),
                        dtype,
                    })?;
                vec![Piece::Line(line)]
            }
            Inst::Barrier => {
                if self.serial {
                    // The regions before and after are separate loops: nothing to wait for.
                    vec![Piece::Line("/* barrier */".into())]
                } else {
                    vec![Piece::Line(self.dialect().barrier.to_owned())]
                }
            }
            Inst::Unary(op, a) => {
                let d = self.dtype(*a);
                let mut values = Vec::new();
                for k in lanes {
                    let a = self.operand(*a, k, site)?;
                    values.push(self.x.unary(*op, d, &a)?);
                }
                self.define(i, values)?
            }
            Inst::Binary(op, a, b) => {
                let d = self.dtype(*a);
                let mut values = Vec::new();
                for k in lanes {
                    let (a, b) = (self.operand(*a, k, site)?, self.operand(*b, k, site)?);
                    values.push(self.x.binary(*op, d, &a, &b)?);
                }
                self.define(i, values)?
            }
            Inst::Ternary(op, a, b, c) => {
                let d = self.dtype(*b);
                let mut values = Vec::new();
                for k in lanes {
                    let a = self.operand(*a, k, site)?;
                    let (b, c) = (self.operand(*b, k, site)?, self.operand(*c, k, site)?);
                    values.push(self.x.ternary(*op, d, &a, &b, &c)?);
                }
                self.define(i, values)?
            }
            Inst::Cast(a, to) | Inst::Bitcast(a, to) => {
                let from = self.dtype(*a);
                let bitcast = matches!(kernel.insts[i], Inst::Bitcast(..));
                let mut values = Vec::new();
                for k in lanes {
                    let a = self.operand(*a, k, site)?;
                    values.push(if bitcast {
                        self.x.bitcast(from, *to, &a)?
                    } else {
                        self.x.cast(from, *to, &a)?
                    });
                }
                self.define(i, values)?
            }
            Inst::Vectorize(vs) => {
                let values = vs
                    .iter()
                    .map(|v| self.operand(*v, 0, site))
                    .collect::<Result<_, _>>()?;
                self.define(i, values)?
            }
            Inst::Extract(v, lane) => {
                let value = self.operand(*v, *lane, site)?;
                self.define(i, vec![value])?
            }
        })
    }
}

fn level_region(level: Level) -> u32 {
    match level {
        Level::Item(r) => r,
        Level::Group => 0,
    }
}
