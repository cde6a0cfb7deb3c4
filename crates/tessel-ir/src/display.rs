//! The stable text form of kernels, used in logs, errors and snapshot tests.
//!
//! ```text
//! kernel add(a: f32[1024] read, out: f32[1024] write)
//! grid groups(16, 1, 1) local(64, 1, 1)
//!   %0 = group_id.x : i32
//!   %1 = range %0, %2
//!     store out[%1], %3
//!   end_range %1
//! ```
//! Blocks indent their bodies; ALU lines print op and operands only (types follow from the
//! operands), while instructions that introduce a type print it after ` : `.

use std::fmt::{self, Write};

use crate::kernel::{Access, Inst, Kernel, Mem, Param, Special};

const AXES: [char; 3] = ['x', 'y', 'z'];

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel {}(", self.name)?;
        for (i, p) in self.params.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match p {
                Param::Buffer {
                    name,
                    dtype,
                    len,
                    access,
                } => {
                    let access = match access {
                        Access::Read => "read",
                        Access::Write => "write",
                        Access::ReadWrite => "read_write",
                        Access::Accumulate => "accumulate",
                    };
                    write!(f, "{name}: {dtype}[{len}] {access}")?;
                }
                Param::Dim { var, dtype } => {
                    let b = var.bounds();
                    write!(f, "{var}: dim {dtype} in {}..={}", b.lo, b.hi)?;
                }
            }
        }
        let [gx, gy, gz] = &self.grid.groups;
        let [lx, ly, lz] = &self.grid.local;
        writeln!(
            f,
            ")\ngrid groups({gx}, {gy}, {gz}) local({lx}, {ly}, {lz})"
        )?;
        let mut depth = 1;
        for i in 0..self.insts.len() {
            if matches!(self.insts[i], Inst::EndRange(_) | Inst::EndIf(_)) {
                depth -= 1;
            }
            writeln!(f, "{:width$}{}", "", inst_text(self, i), width = 2 * depth)?;
            if matches!(self.insts[i], Inst::Range { .. } | Inst::If(_)) {
                depth += 1;
            }
        }
        Ok(())
    }
}

fn mem_text(kernel: &Kernel, mem: Mem) -> String {
    match mem {
        Mem::Global(p) => kernel
            .params
            .get(p)
            .map_or_else(|| format!("param{p}"), Param::name),
        Mem::Local(v) | Mem::Reg(v) => v.to_string(),
    }
}

/// The text of instruction `i`, without indentation.
pub fn inst_text(kernel: &Kernel, i: usize) -> String {
    let mut s = String::new();
    let inst = &kernel.insts[i];
    if inst.has_value() && !matches!(inst, Inst::If(_)) {
        let _ = write!(s, "%{i} = ");
    }
    let _ = match inst {
        Inst::Const(c) => write!(s, "const {c} : {}", c.dtype()),
        Inst::DimParam(p) => write!(
            s,
            "dim {}",
            kernel
                .params
                .get(*p)
                .map_or_else(|| format!("param{p}"), Param::name)
        ),
        Inst::Special(Special::GroupId(a), d) => {
            write!(
                s,
                "group_id.{} : {d}",
                AXES.get(*a as usize).unwrap_or(&'?')
            )
        }
        Inst::Special(Special::LocalId(a), d) => {
            write!(
                s,
                "local_id.{} : {d}",
                AXES.get(*a as usize).unwrap_or(&'?')
            )
        }
        Inst::Range { start, end } => write!(s, "range {start}, {end}"),
        Inst::EndRange(v) => write!(s, "end_range {v}"),
        Inst::If(c) => write!(s, "if {c}  // %{i}"),
        Inst::EndIf(v) => write!(s, "end_if {v}"),
        Inst::DefineLocal { dtype, len } => write!(s, "define_local {dtype}[{len}]"),
        Inst::DefineReg { dtype, len } => write!(s, "define_reg {dtype}[{len}]"),
        Inst::Load { mem, index, width } => {
            let lanes = if *width > 1 {
                format!(" x{width}")
            } else {
                String::new()
            };
            write!(s, "load {}[{index}]{lanes}", mem_text(kernel, *mem))
        }
        Inst::Store { mem, index, value } => {
            write!(s, "store {}[{index}], {value}", mem_text(kernel, *mem))
        }
        Inst::Atomic {
            op,
            mem,
            index,
            value,
        } => {
            let (op, mem) = (op.name(), mem_text(kernel, *mem));
            write!(s, "atomic_{op} {mem}[{index}], {value}")
        }
        Inst::Barrier => write!(s, "barrier"),
        Inst::Unary(op, a) => write!(s, "{op} {a}"),
        Inst::Binary(op, a, b) => write!(s, "{op} {a}, {b}"),
        Inst::Ternary(op, a, b, c) => write!(s, "{op} {a}, {b}, {c}"),
        Inst::Cast(a, d) => write!(s, "cast {a} : {d}"),
        Inst::Bitcast(a, d) => write!(s, "bitcast {a} : {d}"),
        Inst::Vectorize(vs) => {
            let parts: Vec<String> = vs.iter().map(ToString::to_string).collect();
            write!(s, "vec {}", parts.join(", "))
        }
        Inst::Extract(v, lane) => write!(s, "extract {v}, {lane}"),
    };
    s
}
