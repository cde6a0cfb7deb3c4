//! Graphs for the runtime's unit tests, recorded as `tessel-tensor` records them (the
//! runtime cannot use tensors: that crate depends on this one).

use tessel_graph::{Node, NodeId, Op, ReduceOp};
use tessel_shape::{BinaryOp, Bindings, DType, Scalar, Shape};

use crate::{Device, HostBytes, runtime};

/// A node of the runtime's graph, `f32`.
pub(crate) fn node(op: Op, dims: &[usize]) -> NodeId {
    runtime().add(Node {
        op,
        dtype: DType::F32,
        shape: Shape::from(dims),
    })
}

/// A leaf of `dims` holding reproducible values in `[-1, 1)` drawn from `seed`.
pub(crate) fn random_leaf(seed: u64, dims: &[usize]) -> NodeId {
    let n: usize = dims.iter().product();
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let bytes: Vec<u8> = (0..n)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            v.to_le_bytes()
        })
        .collect();
    runtime().add_host_leaf(HostBytes::from(bytes), DType::F32, Shape::from(dims))
}

/// `c` broadcast to `dims`.
pub(crate) fn constant(c: f32, dims: &[usize]) -> NodeId {
    node(Op::Const(Scalar::F32(c)), dims)
}

/// `a @ b` for `[batch.., m, k] @ [batch.., k, n]` as `Tensor::matmul` records it: both
/// operands reshaped to `[batch.., m, k, 1]` and `[batch.., 1, k, n]`, expanded to
/// `[batch.., m, k, n]`, multiplied, summed over `k` and reshaped to `[batch.., m, n]`.
pub(crate) fn matmul(
    a: NodeId,
    b: NodeId,
    batch: &[usize],
    m: usize,
    k: usize,
    n: usize,
) -> NodeId {
    let dims = |tail: [usize; 3]| -> Vec<usize> { batch.iter().copied().chain(tail).collect() };
    let a3 = node(Op::Reshape(a), &dims([m, k, 1]));
    let ae = node(Op::Expand(a3), &dims([m, k, n]));
    let b3 = node(Op::Reshape(b), &dims([1, k, n]));
    let be = node(Op::Expand(b3), &dims([m, k, n]));
    let p = node(Op::Binary(BinaryOp::Mul, ae, be), &dims([m, k, n]));
    let r = node(
        Op::Reduce(ReduceOp::Sum, p, vec![batch.len() + 1].into()),
        &dims([m, 1, n]),
    );
    let out: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
    node(Op::Reshape(r), &out)
}

/// Realizes `node` on `device` and reads its `f32` values back.
pub(crate) fn values(node: NodeId, device: Device) -> Vec<f32> {
    let rt = runtime();
    rt.realize(&[node], device, &Bindings::default())
        .expect("the realize succeeds");
    rt.read(node, &Bindings::default())
        .expect("the read succeeds")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
