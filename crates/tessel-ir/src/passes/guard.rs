//! Guards for the accesses the verifier cannot prove in bounds: what makes any verified
//! kernel memory-safe to run, whoever wrote it.
//!
//! The verifier's interval analysis proves most accesses of generated kernels in bounds
//! for every launch (dynamic dims contribute their variables' bounds, and a symbolic
//! buffer length is compared in closed form). An access it cannot prove — an index read
//! from data, a hand-written kernel's arithmetic, a wrapped value — is rewritten here:
//!
//! - a load of `w` lanes reads zeros unless `0 <= index <= len - w`;
//! - a store or an atomic update outside that range is dropped.
//!
//! Every backend compiles the guarded kernel ([`crate::backend::Backend::compile`]), so an
//! out-of-range access means the same thing everywhere and is never undefined behaviour.
//! A guard costs a comparison and a branch; kernels whose accesses are all proven are
//! returned unchanged.

use tessel_shape::{BinaryOp, DType, Expr, Scalar};

use crate::bounds::unproven_accesses;
use crate::builder::KernelBuilder;
use crate::kernel::{Inst, Kernel, Mem, Param, Value};
use crate::verify::Def;

/// `kernel` (verified, with `defs` from [`crate::verify()`]) with every access the verifier
/// cannot prove in bounds guarded, and the number of accesses guarded.
pub fn guard(kernel: &Kernel, defs: &[Def]) -> (Kernel, usize) {
    let unproven = unproven_accesses(kernel, defs);
    if unproven.is_empty() {
        return (kernel.clone(), 0);
    }
    let mut kb = KernelBuilder::with_signature(kernel);
    let mut map: Vec<Value> = Vec::with_capacity(kernel.insts.len());
    let mut next = unproven.iter().copied().peekable();
    for (i, inst) in kernel.insts.iter().enumerate() {
        let renamed = inst.map_operands(|v| map[v.index()]);
        let new = if next.peek() == Some(&i) {
            next.next();
            guarded(&mut kb, kernel, defs, &renamed, i)
        } else {
            kb.push_scoped(renamed)
        };
        map.push(new);
    }
    let guards = unproven.len();
    tracing::debug!(kernel = %kernel.name, guards, "guarded accesses the verifier cannot prove in bounds");
    (kb.finish_unverified(), guards)
}

/// Emits `inst` (operands already renamed), old instruction `at`, under its guard.
fn guarded(kb: &mut KernelBuilder, kernel: &Kernel, defs: &[Def], inst: &Inst, at: usize) -> Value {
    let (mem, index) = match inst {
        Inst::Load { mem, index, .. }
        | Inst::Store { mem, index, .. }
        | Inst::Atomic { mem, index, .. } => (*mem, *index),
        _ => unreachable!("only accesses are guarded"),
    };
    let width = match &kernel.insts[at] {
        Inst::Load { width, .. } => *width,
        Inst::Store { value, .. } => defs[value.index()].ty().map_or(1, |t| t.width),
        _ => 1,
    };
    let len: Expr = match mem {
        Mem::Global(p) => match &kernel.params[p] {
            Param::Buffer { len, .. } => *len,
            Param::Dim { .. } => unreachable!("the verifier checked that accesses name buffers"),
        },
        Mem::Local(v) | Mem::Reg(v) => match defs[v.index()] {
            Def::Local(_, len) | Def::Reg(_, len) => Expr::constant(len as i64),
            _ => unreachable!("the verifier checked local and register memory"),
        },
    };
    // In i64: an unsigned index past i64::MAX reads as negative and fails `>= 0`.
    let wide = kb.cast(index, DType::I64);
    let zero = kb.constant(Scalar::I64(0));
    let limit = kb.expr(len - i64::from(width), DType::I64);
    let above = kb.binary(BinaryOp::Ge, wide, zero);
    let below = kb.binary(BinaryOp::Le, wide, limit);
    let ok = kb.binary(BinaryOp::And, above, below);
    if !matches!(inst, Inst::Load { .. }) {
        let open = kb.begin_if(ok);
        kb.push(inst.clone());
        kb.end_if(open);
        return Value(u32::MAX);
    }
    // A register holds zeros unless the load runs.
    let dtype = defs[at].ty().map_or(DType::U8, |t| t.dtype);
    let reg = kb.reg(dtype, usize::from(width));
    let nothing = kb.constant(Scalar::zero(dtype));
    for lane in 0..width {
        let lane = kb.constant(Scalar::I64(i64::from(lane)));
        kb.store(reg, lane, nothing);
    }
    let open = kb.begin_if(ok);
    let value = kb.push(inst.clone());
    kb.store(reg, zero, value);
    kb.end_if(open);
    if width == 1 {
        kb.load(reg, zero)
    } else {
        kb.load_vec(reg, zero, width)
    }
}

#[cfg(test)]
mod tests {
    use tessel_shape::{Bindings, DType, Expr, Var};

    use super::guard;
    use crate::{Access, KernelBuilder, interp, samples, verify};

    fn guarded(kernel: &crate::Kernel) -> (crate::Kernel, usize) {
        let defs = verify(kernel).unwrap();
        let (out, n) = guard(kernel, &defs);
        verify(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
        (out, n)
    }

    fn i32s(values: &[i32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn read_i32s(bytes: &[u8]) -> Vec<i32> {
        bytes
            .chunks(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// `out[i] = src[idx[i]]` and `hits[idx[i]] = i`: indices that are data.
    fn data_indexed() -> crate::Kernel {
        let mut kb = KernelBuilder::new("data_indexed");
        let src = kb.buffer("src", DType::I32, 4, Access::Read);
        let idx = kb.buffer("idx", DType::I32, 6, Access::Read);
        let out = kb.buffer("out", DType::I32, 6, Access::Write);
        let hits = kb.buffer("hits", DType::I32, 4, Access::Write);
        kb.grid([1, 1, 1], [6, 1, 1]);
        let i = kb.local_id(0, DType::I32);
        let j = kb.load(idx, i);
        let v = kb.load(src, j);
        kb.store(out, i, v);
        kb.store(hits, j, i);
        kb.build().unwrap()
    }

    #[test]
    fn indices_read_from_data_are_guarded() {
        let (kernel, n) = guarded(&data_indexed());
        assert_eq!(n, 2, "the load and the store at a data index\n{kernel}");
        let mut src = i32s(&[10, 11, 12, 13]);
        let mut idx = i32s(&[3, -1, 4, 0, i32::MAX, 2]);
        let mut out = i32s(&[7; 6]);
        let mut hits = i32s(&[-5; 4]);
        interp::run(
            &kernel,
            &mut [&mut src, &mut idx, &mut out, &mut hits],
            &Bindings::new(),
        )
        .unwrap();
        // Outside 0..4 a load reads 0 and a store is dropped.
        assert_eq!(read_i32s(&out), [13, 0, 0, 10, 0, 12]);
        assert_eq!(read_i32s(&hits), [3, -5, 5, 0]);
        // The unguarded kernel reads out of bounds: the interpreter refuses.
        let (mut src, mut idx) = (i32s(&[10, 11, 12, 13]), i32s(&[3, -1, 4, 0, 9, 2]));
        let (mut out, mut hits) = (i32s(&[7; 6]), i32s(&[-5; 4]));
        assert!(
            interp::run(
                &data_indexed(),
                &mut [&mut src, &mut idx, &mut out, &mut hits],
                &Bindings::new()
            )
            .is_err()
        );
    }

    #[test]
    fn proven_kernels_are_unchanged_also_with_dynamic_dims() {
        let n = Var::new("n", 1, 1 << 20).unwrap();
        for kernel in [
            samples::vector_add(DType::F32, 1000, 64).unwrap(),
            samples::dynamic_vector_add(n, 64).unwrap(),
        ] {
            let (out, guards) = guarded(&kernel);
            assert_eq!((guards, &out), (0, &kernel), "{kernel}");
        }
        // A load clamped into `0..n` by `min(max(x, 0), n - 1)`, x read from data: the
        // form generated kernels use, proven in closed form against the length `n`.
        let mut kb = KernelBuilder::new("clamped");
        let src = kb.buffer("src", DType::F32, n, Access::Read);
        let idx = kb.buffer("idx", DType::I32, 64, Access::Read);
        let out = kb.buffer("out", DType::F32, 64, Access::Write);
        kb.grid([1, 1, 1], [64, 1, 1]);
        let i = kb.local_id(0, DType::I32);
        let x = kb.load(idx, i);
        let clamped = kb.expr(Expr::from(n) - 1, DType::I32);
        let zero = kb.constant(0i32);
        let low = kb.binary(tessel_shape::BinaryOp::Max, x, zero);
        let j = kb.binary(tessel_shape::BinaryOp::Min, low, clamped);
        let v = kb.load(src, j);
        kb.store(out, i, v);
        let kernel = kb.build().unwrap();
        assert_eq!(guarded(&kernel).1, 0, "{kernel}");
    }

    #[test]
    fn a_dynamic_length_the_grid_may_exceed_is_guarded() {
        // 64 invocations read `src[i]` from a buffer of `n` elements, with no condition.
        let n = Var::new("n", 1, 100).unwrap();
        let mut kb = KernelBuilder::new("unchecked");
        let src = kb.buffer("src", DType::I32, n, Access::Read);
        let out = kb.buffer("out", DType::I32, 64, Access::Write);
        kb.grid([1, 1, 1], [64, 1, 1]);
        let i = kb.local_id(0, DType::I32);
        let v = kb.load(src, i);
        kb.store(out, i, v);
        let (kernel, guards) = guarded(&kb.build().unwrap());
        assert_eq!(guards, 1, "{kernel}");
        let mut src = i32s(&(1..=10).collect::<Vec<_>>());
        let mut out = i32s(&[-1; 64]);
        interp::run(
            &kernel,
            &mut [&mut src, &mut out],
            &Bindings::new().with(n, 10),
        )
        .unwrap();
        let got = read_i32s(&out);
        assert_eq!(&got[..10], &(1..=10).collect::<Vec<_>>()[..]);
        assert!(got[10..].iter().all(|&v| v == 0), "{got:?}");
    }
}
