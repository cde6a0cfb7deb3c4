//! The text form read back: [`Kernel::parse`] turns what `Display` prints into the kernel
//! again, so a plan stored on disk can carry its kernels (see `tessel-runtime`'s plan
//! cache).
//!
//! Dynamic dims read back as the variables their parameters declare (`n: dim i32 in 1..=4096`
//! is `Var::new("n", 1, 4096)`, the same variable wherever it is made), and sizes as
//! expressions of them. A caller that must rely on the result compares
//! `Kernel::parse(&k.to_string())` with `k`: the text form drops nothing else, but a `NaN`
//! constant's payload prints as `NaN`, and a size names only the kernel's dim parameters.

use std::fmt;

use tessel_shape::{BinaryOp, DType, Dim, Scalar, TernaryOp, UnaryOp, Var};

use crate::kernel::{Access, AtomicOp, Grid, Inst, Kernel, Mem, Param, Special, Value};

/// Why a text is not a kernel: the line (1-based) and what is wrong there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The line of the text, counting from 1.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel text, line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for ParseError {}

type Parsed<T> = Result<T, String>;

impl Kernel {
    /// The kernel whose text form (`Display`) is `text`. Dim parameters read back as
    /// `Var::new(name, lo, hi)` (the same variable wherever it is made) and sizes as
    /// expressions of them; a `NaN` constant's payload does not survive the text, so a
    /// caller that relies on the result compares it with the kernel printed.
    pub fn parse(text: &str) -> Result<Kernel, ParseError> {
        let mut lines = text.lines().enumerate();
        let at = |line: usize| {
            move |reason: String| ParseError {
                line: line + 1,
                reason,
            }
        };
        let (n, header) = lines.next().ok_or_else(|| at(0)("empty text".into()))?;
        let (name, params) = header_of(header).map_err(at(n))?;
        let (n, grid) = lines
            .next()
            .ok_or_else(|| at(n + 1)("no grid line".into()))?;
        let grid = grid_of(grid, &params).map_err(at(n))?;
        let mut kernel = Kernel {
            name,
            params,
            grid,
            insts: Vec::new(),
        };
        for (n, line) in lines {
            let inst = inst_of(&kernel, line.trim()).map_err(at(n))?;
            kernel.insts.push(inst);
        }
        Ok(kernel)
    }
}

/// `kernel NAME(PARAM, ...)`: dim parameters first (buffer lengths name them), then every
/// parameter in order.
fn header_of(line: &str) -> Parsed<(String, Vec<Param>)> {
    let rest = line
        .strip_prefix("kernel ")
        .ok_or("expected `kernel NAME(...)`")?;
    let (name, rest) = rest.split_once('(').ok_or("expected `(` after the name")?;
    let list = rest.strip_suffix(')').ok_or("expected `)` at the end")?;
    let texts = if list.is_empty() {
        Vec::new()
    } else {
        split_top(list)
    };
    let mut vars = Vec::new();
    for text in &texts {
        if let Some((name, rest)) = text.split_once(": dim ") {
            let (dtype, bounds) = rest
                .split_once(" in ")
                .ok_or_else(|| format!("dim parameter `{text}`"))?;
            let (lo, hi) = bounds
                .split_once("..=")
                .ok_or_else(|| format!("bounds `{bounds}`"))?;
            let var = Var::new(name, int_of(lo)?, int_of(hi)?).map_err(|e| e.to_string())?;
            vars.push((var, dtype_of(dtype)?));
        }
    }
    let params = texts
        .iter()
        .map(|text| param_of(text, &vars))
        .collect::<Parsed<_>>()?;
    Ok((name.to_string(), params))
}

/// `text` split at the `, ` outside parentheses and brackets.
fn split_top(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    let bytes = text.as_bytes();
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b',' if depth == 0 && bytes.get(i + 1) == Some(&b' ') => {
                parts.push(&text[start..i]);
                start = i + 2;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// `name: dtype[len] access` or `name: dim dtype in lo..=hi` (its variable among `vars`).
fn param_of(text: &str, vars: &[(Var, DType)]) -> Parsed<Param> {
    let (name, rest) = text
        .split_once(": ")
        .ok_or_else(|| format!("parameter `{text}`"))?;
    if rest.starts_with("dim ") {
        let &(var, dtype) = vars
            .iter()
            .find(|(v, _)| &*v.name() == name)
            .ok_or_else(|| format!("dim parameter `{text}`"))?;
        return Ok(Param::Dim { var, dtype });
    }
    let (ty, access) = rest
        .rsplit_once(' ')
        .ok_or_else(|| format!("parameter `{text}`"))?;
    let (dtype, len) = indexed(ty)?;
    let access = match access {
        "read" => Access::Read,
        "write" => Access::Write,
        "read_write" => Access::ReadWrite,
        "accumulate" => Access::Accumulate,
        other => return Err(format!("access `{other}`")),
    };
    Ok(Param::Buffer {
        name: name.to_string(),
        dtype: dtype_of(dtype)?,
        len: size_of(len, vars)?,
        access,
    })
}

/// A size: an expression of the dim parameters' variables.
fn size_of(text: &str, vars: &[(Var, DType)]) -> Parsed<Dim> {
    Dim::parse(text, |name| {
        vars.iter()
            .find(|(v, _)| &*v.name() == name)
            .map(|(v, _)| *v)
    })
    .ok_or_else(|| format!("`{text}` is not a size of the kernel's dims"))
}

/// `grid groups(a, b, c) local(d, e, f)`.
fn grid_of(line: &str, params: &[Param]) -> Parsed<Grid> {
    let vars: Vec<(Var, DType)> = params
        .iter()
        .filter_map(|p| match p {
            Param::Dim { var, dtype } => Some((*var, *dtype)),
            Param::Buffer { .. } => None,
        })
        .collect();
    let rest = line
        .strip_prefix("grid groups(")
        .ok_or("expected `grid groups(...)`")?;
    let (groups, rest) = rest.split_once(") local(").ok_or("expected `local(...)`")?;
    let local = rest.strip_suffix(')').ok_or("expected `)` at the end")?;
    let three = |text: &str| -> Parsed<[Dim; 3]> {
        let dims: Vec<Dim> = split_top(text)
            .into_iter()
            .map(|d| size_of(d, &vars))
            .collect::<Parsed<_>>()?;
        dims.try_into()
            .map_err(|_| format!("`{text}` is not three sizes"))
    };
    Ok(Grid {
        groups: three(groups)?,
        local: three(local)?,
    })
}

/// One instruction line, without indentation.
fn inst_of(kernel: &Kernel, line: &str) -> Parsed<Inst> {
    let here = kernel.insts.len();
    let body = match line.split_once(" = ") {
        Some((lhs, body)) if lhs.starts_with('%') => {
            if value_of(lhs)? != Value(here as u32) {
                return Err(format!("`{lhs}` defined as instruction {here}"));
            }
            body
        }
        _ => line,
    };
    let (body, ty) = match body.rsplit_once(" : ") {
        Some((b, t)) => (b, Some(dtype_of(t)?)),
        None => (body, None),
    };
    let (word, args) = body.split_once(' ').unwrap_or((body, ""));
    let typed = || ty.ok_or_else(|| format!("`{word}` without ` : dtype`"));
    let values = || args.split(", ").map(value_of).collect::<Parsed<Vec<_>>>();
    let one = || -> Parsed<Value> {
        match values()?[..] {
            [v] => Ok(v),
            _ => Err(format!("`{word}` takes one value")),
        }
    };
    Ok(match word {
        "const" => Inst::Const(scalar_of(args, typed()?)?),
        "dim" => Inst::DimParam(
            kernel
                .params
                .iter()
                .position(|p| matches!(p, Param::Dim { var, .. } if &*var.name() == args))
                .ok_or_else(|| format!("no dim parameter `{args}`"))?,
        ),
        "group_id.x" | "group_id.y" | "group_id.z" => {
            Inst::Special(Special::GroupId(axis(word)), typed()?)
        }
        "local_id.x" | "local_id.y" | "local_id.z" => {
            Inst::Special(Special::LocalId(axis(word)), typed()?)
        }
        "range" => match values()?[..] {
            [start, end] => Inst::Range { start, end },
            _ => return Err("`range` takes two values".into()),
        },
        "end_range" => Inst::EndRange(one()?),
        "if" => {
            let cond = args.split_once("  // ").map_or(args, |(c, _)| c);
            Inst::If(value_of(cond)?)
        }
        "end_if" => Inst::EndIf(one()?),
        "define_local" | "define_reg" => {
            let (dtype, len) = indexed(args)?;
            let (dtype, len) = (dtype_of(dtype)?, usize_of(len)?);
            if word == "define_local" {
                Inst::DefineLocal { dtype, len }
            } else {
                Inst::DefineReg { dtype, len }
            }
        }
        "load" => {
            let (access, width) = match args.rsplit_once(" x") {
                Some((a, w)) => (a, w.parse().map_err(|_| format!("width `{w}`"))?),
                None => (args, 1),
            };
            let (mem, index) = indexed(access)?;
            Inst::Load {
                mem: mem_of(kernel, mem)?,
                index: value_of(index)?,
                width,
            }
        }
        "store" | "atomic_add" | "atomic_max" => {
            let (access, value) = args.rsplit_once(", ").ok_or("expected `, value`")?;
            let (mem, index) = indexed(access)?;
            let (mem, index, value) = (mem_of(kernel, mem)?, value_of(index)?, value_of(value)?);
            match word {
                "store" => Inst::Store { mem, index, value },
                "atomic_add" => Inst::Atomic {
                    op: AtomicOp::Add,
                    mem,
                    index,
                    value,
                },
                _ => Inst::Atomic {
                    op: AtomicOp::Max,
                    mem,
                    index,
                    value,
                },
            }
        }
        "barrier" => Inst::Barrier,
        "cast" => Inst::Cast(one()?, typed()?),
        "bitcast" => Inst::Bitcast(one()?, typed()?),
        "vec" => Inst::Vectorize(values()?),
        "extract" => {
            let (v, lane) = args.split_once(", ").ok_or("expected `extract %v, lane`")?;
            Inst::Extract(
                value_of(v)?,
                lane.parse().map_err(|_| format!("lane `{lane}`"))?,
            )
        }
        op => {
            let vs = values()?;
            if let (Some(u), [a]) = (UnaryOp::ALL.iter().find(|u| u.name() == op), &vs[..]) {
                Inst::Unary(*u, *a)
            } else if let (Some(b), [x, y]) =
                (BinaryOp::ALL.iter().find(|b| b.name() == op), &vs[..])
            {
                Inst::Binary(*b, *x, *y)
            } else if let (Some(t), [x, y, z]) = (
                [TernaryOp::Where, TernaryOp::MulAdd]
                    .iter()
                    .find(|t| t.name() == op),
                &vs[..],
            ) {
                Inst::Ternary(*t, *x, *y, *z)
            } else {
                return Err(format!("unknown instruction `{op}` of {} values", vs.len()));
            }
        }
    })
}

/// `a[b]` → `("a", "b")`.
fn indexed(text: &str) -> Parsed<(&str, &str)> {
    let (a, rest) = text
        .split_once('[')
        .ok_or_else(|| format!("`{text}`: no `[`"))?;
    let b = rest
        .strip_suffix(']')
        .ok_or_else(|| format!("`{text}`: no `]` at the end"))?;
    Ok((a, b))
}

fn axis(word: &str) -> u8 {
    match word.as_bytes().last() {
        Some(b'y') => 1,
        Some(b'z') => 2,
        _ => 0,
    }
}

fn value_of(text: &str) -> Parsed<Value> {
    text.strip_prefix('%')
        .and_then(|n| n.parse().ok())
        .map(Value)
        .ok_or_else(|| format!("`{text}` is not a value (`%N`)"))
}

/// A buffer parameter by name, or a local or register array by its defining value.
fn mem_of(kernel: &Kernel, text: &str) -> Parsed<Mem> {
    if text.starts_with('%') {
        let v = value_of(text)?;
        return match kernel.insts.get(v.index()) {
            Some(Inst::DefineLocal { .. }) => Ok(Mem::Local(v)),
            Some(Inst::DefineReg { .. }) => Ok(Mem::Reg(v)),
            _ => Err(format!("`{text}` is not a local or register array")),
        };
    }
    kernel
        .params
        .iter()
        .position(|p| matches!(p, Param::Buffer { name, .. } if name == text))
        .map(Mem::Global)
        .ok_or_else(|| format!("no buffer parameter `{text}`"))
}

fn dtype_of(text: &str) -> Parsed<DType> {
    text.parse().map_err(|_| format!("`{text}` is not a dtype"))
}

fn int_of(text: &str) -> Parsed<i64> {
    text.parse()
        .map_err(|_| format!("`{text}` is not a constant size (dynamic sizes do not read back)"))
}

fn usize_of(text: &str) -> Parsed<usize> {
    text.parse()
        .map_err(|_| format!("`{text}` is not a length"))
}

/// A constant of `dtype` as `Scalar`'s `Display` prints it.
fn scalar_of(text: &str, dtype: DType) -> Parsed<Scalar> {
    fn num<T: std::str::FromStr>(text: &str) -> Parsed<T> {
        text.parse()
            .map_err(|_| format!("`{text}` is not a constant"))
    }
    Ok(match dtype {
        DType::Bool => Scalar::Bool(num(text)?),
        DType::U8 => Scalar::U8(num(text)?),
        DType::U16 => Scalar::U16(num(text)?),
        DType::U32 => Scalar::U32(num(text)?),
        DType::U64 => Scalar::U64(num(text)?),
        DType::I8 => Scalar::I8(num(text)?),
        DType::I16 => Scalar::I16(num(text)?),
        DType::I32 => Scalar::I32(num(text)?),
        DType::I64 => Scalar::I64(num(text)?),
        DType::F32 => Scalar::F32(num(text)?),
        DType::F64 => Scalar::F64(num(text)?),
        // Narrow floats print their exact `f32` value.
        DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => {
            Scalar::F32(num(text)?).cast(dtype)
        }
    })
}
