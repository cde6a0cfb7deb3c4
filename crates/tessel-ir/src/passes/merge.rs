//! Merging buffer parameters: several outputs of a kernel written into one buffer, each at
//! its own offset, which is how a kernel with several outputs becomes one value of a graph.

use tessel_shape::{DType, Expr};

use crate::builder::KernelBuilder;
use crate::kernel::{Inst, Kernel, Mem, Param, Value};
use crate::verify::verify;

/// `kernel` with its buffer parameters `first..first + count` (counted among the buffer
/// parameters) replaced by one parameter `name`, as long as their lengths together, each
/// access to the `k`-th at its index plus the lengths of the ones before it. The merged
/// parameters must share a dtype and an access, and every offset must fit the index dtype
/// of the accesses it shifts; `Err` says which rule a kernel breaks.
pub fn merge_buffers(
    kernel: &Kernel,
    first: usize,
    count: usize,
    name: &str,
) -> Result<Kernel, String> {
    let defs = verify(kernel).map_err(|e| e.to_string())?;
    let buffers: Vec<usize> = (0..kernel.params.len())
        .filter(|&p| matches!(kernel.params[p], Param::Buffer { .. }))
        .collect();
    let merged = buffers
        .get(first..first + count)
        .ok_or_else(|| format!("it has no buffer parameters {first}..{}", first + count))?;
    let Some(&head) = merged.first() else {
        return Ok(kernel.clone());
    };
    let Param::Buffer { dtype, access, .. } = kernel.params[head].clone() else {
        unreachable!("listed as a buffer")
    };
    // New position and offset of every old parameter.
    let mut params = Vec::with_capacity(kernel.params.len());
    let mut moved: Vec<(usize, Expr)> = Vec::with_capacity(kernel.params.len());
    let mut total = Expr::constant(0);
    for (p, param) in kernel.params.iter().enumerate() {
        if !merged.contains(&p) {
            moved.push((params.len(), Expr::constant(0)));
            params.push(param.clone());
            continue;
        }
        let Param::Buffer {
            name: each,
            dtype: d,
            len,
            access: a,
        } = param
        else {
            unreachable!("listed as a buffer")
        };
        if (*d, *a) != (dtype, access) {
            return Err(format!(
                "buffer `{each}` is {a:?} {d}, but the buffers merged with it are {access:?} {dtype}"
            ));
        }
        if p == head {
            params.push(param.clone());
        }
        moved.push((params.len() - 1, total));
        total += *len;
    }
    let at = moved[head].0;
    params[at] = Param::Buffer {
        name: name.to_owned(),
        dtype,
        len: total,
        access,
    };
    let mut kb = KernelBuilder::with_params(kernel, params);
    let mut map: Vec<Value> = Vec::with_capacity(kernel.insts.len());
    for (i, inst) in kernel.insts.iter().enumerate() {
        let renamed = inst.map_operands(|v| map[v.index()]);
        let new = match renamed {
            Inst::DimParam(p) => kb.push(Inst::DimParam(moved[p].0)),
            Inst::Load {
                mem: Mem::Global(p),
                index,
                width,
            } => {
                let (mem, index) = shift(&mut kb, kernel, &defs, &moved, (p, index, i))?;
                kb.push(Inst::Load { mem, index, width })
            }
            Inst::Store {
                mem: Mem::Global(p),
                index,
                value,
            } => {
                let (mem, index) = shift(&mut kb, kernel, &defs, &moved, (p, index, i))?;
                kb.push(Inst::Store { mem, index, value })
            }
            Inst::Atomic {
                op,
                mem: Mem::Global(p),
                index,
                value,
            } => {
                let (mem, index) = shift(&mut kb, kernel, &defs, &moved, (p, index, i))?;
                kb.push(Inst::Atomic {
                    op,
                    mem,
                    index,
                    value,
                })
            }
            other => kb.push_scoped(other),
        };
        map.push(new);
    }
    kb.build().map_err(|e| e.to_string())
}

/// The new memory and index of an access to old parameter `p` at (new) `index`, old
/// instruction `at`.
fn shift(
    kb: &mut KernelBuilder,
    kernel: &Kernel,
    defs: &[crate::verify::Def],
    moved: &[(usize, Expr)],
    (p, index, at): (usize, Value, usize),
) -> Result<(Mem, Value), String> {
    let (to, offset) = moved[p];
    if offset.as_const() == Some(0) {
        return Ok((Mem::Global(to), index));
    }
    let old_index = kernel.insts[at].operands();
    // The index is the access's first operand (global memory has no memory operand).
    let dtype = defs[old_index[0].index()]
        .ty()
        .map_or(DType::I64, |t| t.dtype);
    let max = match dtype {
        DType::U64 => i128::from(i64::MAX),
        _ => i128::from(dtype.max_value().to_i64()),
    };
    let Param::Buffer { len, .. } = &kernel.params[p] else {
        unreachable!("accesses name buffers")
    };
    if i128::from((offset + *len).bounds().hi) > max {
        return Err(format!(
            "the merged buffer's indices reach {}, past the {dtype} index of instruction %{at}",
            (offset + *len).bounds().hi
        ));
    }
    let shift = kb.expr(offset, dtype);
    Ok((Mem::Global(to), kb.add(index, shift)))
}

#[cfg(test)]
mod tests {
    use tessel_shape::{Bindings, DType};

    use super::merge_buffers;
    use crate::{Access, KernelBuilder, interp};

    #[test]
    fn two_outputs_become_one_buffer() {
        // a[i] = x[i] + 1 over 3 elements, b[i] = 2 x[i] over 2.
        let mut kb = KernelBuilder::new("two");
        let x = kb.buffer("x", DType::I32, 3, Access::Read);
        let a = kb.buffer("a", DType::I32, 3, Access::Write);
        let b = kb.buffer("b", DType::I32, 2, Access::Write);
        kb.grid([1, 1, 1], [3, 1, 1]);
        let i = kb.local_id(0, DType::I32);
        let v = kb.load(x, i);
        let one = kb.constant(1i32);
        let inc = kb.add(v, one);
        kb.store(a, i, inc);
        let two = kb.constant(2i32);
        let inside = kb.lt(i, two);
        kb.if_(inside, |kb| {
            let d = kb.mul(v, two);
            kb.store(b, i, d);
        });
        let merged = merge_buffers(&kb.build().unwrap(), 1, 2, "out").unwrap();
        assert_eq!(merged.params.len(), 2);
        let ints = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (mut xs, mut out) = (ints(&[5, 6, 7]), ints(&[0; 5]));
        interp::run(&merged, &mut [&mut xs, &mut out], &Bindings::new()).unwrap();
        assert_eq!(out, ints(&[6, 7, 8, 10, 12]));
    }

    #[test]
    fn merged_buffers_share_a_dtype() {
        let mut kb = KernelBuilder::new("mixed");
        let a = kb.buffer("a", DType::I32, 1, Access::Write);
        let b = kb.buffer("b", DType::F32, 1, Access::Write);
        let zero = kb.constant(0i32);
        let (one, half) = (kb.constant(1i32), kb.constant(0.5f32));
        kb.store(a, zero, one);
        kb.store(b, zero, half);
        let err = merge_buffers(&kb.build().unwrap(), 0, 2, "out").unwrap_err();
        assert!(err.contains("`b`") && err.contains("f32"), "{err}");
    }
}
