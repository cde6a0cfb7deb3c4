//! Matrix products recognized as library routines: operands read in place (row-major or
//! transposed), computed operands materialized, and the product's reshapes as writes.

use tessel_graph::{Graph, LeafId, Node, NodeId, Op, ReduceOp, find_matmuls};
use tessel_ir::{Matmul, VendorOp};
use tessel_shape::{BinaryOp, DType, Dim, Shape};

fn node(g: &mut Graph, op: Op, dtype: DType, dims: &[usize]) -> NodeId {
    g.add(Node {
        op,
        dtype,
        shape: Shape::from(dims),
    })
}

/// `a @ b` as `Tensor::matmul` records it for 2-D operands: `[m, k] → [m, k, 1]` and
/// `[k, n] → [1, k, n]`, both expanded to `[m, k, n]`, multiplied, summed over `k`, and
/// reshaped to `[m, n]`.
fn matmul(g: &mut Graph, a: NodeId, b: NodeId, m: usize, k: usize, n: usize) -> (NodeId, NodeId) {
    let f = DType::F32;
    let a3 = node(g, Op::Reshape(a), f, &[m, k, 1]);
    let ae = node(g, Op::Expand(a3), f, &[m, k, n]);
    let b3 = node(g, Op::Reshape(b), f, &[1, k, n]);
    let be = node(g, Op::Expand(b3), f, &[m, k, n]);
    let p = node(g, Op::Binary(BinaryOp::Mul, ae, be), f, &[m, k, n]);
    let r = node(
        g,
        Op::Reduce(ReduceOp::Sum, p, vec![1].into()),
        f,
        &[m, 1, n],
    );
    let out = node(g, Op::Reshape(r), f, &[m, n]);
    (r, out)
}

fn spec(m: usize, k: usize, n: usize, lhs_t: bool, rhs_t: bool) -> VendorOp {
    let c = |v: usize| Dim::constant(v as i64);
    VendorOp::Matmul(Matmul {
        dtype: DType::F32,
        batch: c(1),
        m: c(m),
        n: c(n),
        k: c(k),
        lhs_transposed: lhs_t,
        rhs_transposed: rhs_t,
        lhs_batch_stride: c(m * k),
        rhs_batch_stride: c(k * n),
        allow_tf32: false,
        epilogue: tessel_ir::Epilogue::NONE,
    })
}

#[test]
fn a_plain_product_reads_its_leaves_and_writes_the_reshape() {
    let mut g = Graph::new();
    let a = node(&mut g, Op::Leaf(LeafId(0)), DType::F32, &[4, 3]);
    let b = node(&mut g, Op::Leaf(LeafId(1)), DType::F32, &[3, 5]);
    let (r, out) = matmul(&mut g, a, b, 4, 3, 5);
    let found = find_matmuls(&g, &g.toposort(&[out]));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].op, spec(4, 3, 5, false, false));
    assert_eq!(found[0].operands, [a, b]);
    assert_eq!(found[0].writes, vec![r, out]);
    assert_eq!(found[0].materialize, vec![out]);
}

#[test]
fn transposed_leaves_are_read_in_place() {
    let mut g = Graph::new();
    let at = node(&mut g, Op::Leaf(LeafId(0)), DType::F32, &[3, 4]);
    let bt = node(&mut g, Op::Leaf(LeafId(1)), DType::F32, &[5, 3]);
    let a = node(
        &mut g,
        Op::Permute(at, vec![1, 0].into()),
        DType::F32,
        &[4, 3],
    );
    let b = node(
        &mut g,
        Op::Permute(bt, vec![1, 0].into()),
        DType::F32,
        &[3, 5],
    );
    let (_, out) = matmul(&mut g, a, b, 4, 3, 5);
    let found = find_matmuls(&g, &g.toposort(&[out]));
    assert_eq!(found[0].op, spec(4, 3, 5, true, true));
    assert_eq!(found[0].operands, [at, bt]);
}

#[test]
fn computed_operands_are_materialized_first() {
    let mut g = Graph::new();
    let a16 = node(&mut g, Op::Leaf(LeafId(0)), DType::F16, &[4, 3]);
    let a = node(&mut g, Op::Cast(a16), DType::F32, &[4, 3]);
    let b = node(&mut g, Op::Leaf(LeafId(1)), DType::F32, &[3, 5]);
    let (_, out) = matmul(&mut g, a, b, 4, 3, 5);
    let exp = node(
        &mut g,
        Op::Unary(tessel_shape::UnaryOp::Exp, out),
        DType::F32,
        &[4, 5],
    );
    let found = find_matmuls(&g, &g.toposort(&[exp]));
    assert_eq!(found[0].operands, [a, b]);
    assert_eq!(found[0].materialize, vec![a, out]);
}

#[test]
fn integer_products_and_other_reductions_are_not_matched() {
    let mut g = Graph::new();
    let a = node(&mut g, Op::Leaf(LeafId(0)), DType::F32, &[4, 3]);
    let s = node(
        &mut g,
        Op::Reduce(ReduceOp::Sum, a, vec![1].into()),
        DType::F32,
        &[4, 1],
    );
    assert!(find_matmuls(&g, &g.toposort(&[s])).is_empty());
    let ai = node(&mut g, Op::Leaf(LeafId(1)), DType::I32, &[4, 3]);
    let bi = node(&mut g, Op::Leaf(LeafId(2)), DType::I32, &[3, 5]);
    let i = DType::I32;
    let a3 = node(&mut g, Op::Reshape(ai), i, &[4, 3, 1]);
    let ae = node(&mut g, Op::Expand(a3), i, &[4, 3, 5]);
    let b3 = node(&mut g, Op::Reshape(bi), i, &[1, 3, 5]);
    let be = node(&mut g, Op::Expand(b3), i, &[4, 3, 5]);
    let p = node(&mut g, Op::Binary(BinaryOp::Mul, ae, be), i, &[4, 3, 5]);
    let r = node(
        &mut g,
        Op::Reduce(ReduceOp::Sum, p, vec![1].into()),
        i,
        &[4, 1, 5],
    );
    assert!(find_matmuls(&g, &g.toposort(&[r])).is_empty());
}

/// A batch of row-major matrices times one shared matrix (a linear layer over
/// `[batch, seq, in]`) is one taller product: batch 1, `batch·m` rows.
#[test]
fn a_shared_rhs_folds_the_batch_into_the_rows() {
    let f = DType::F32;
    let mut g = Graph::new();
    let a = node(&mut g, Op::Leaf(LeafId(0)), f, &[2, 4, 3]);
    let b = node(&mut g, Op::Leaf(LeafId(1)), f, &[3, 5]);
    let a4 = node(&mut g, Op::Reshape(a), f, &[2, 4, 3, 1]);
    let ae = node(&mut g, Op::Expand(a4), f, &[2, 4, 3, 5]);
    let b4 = node(&mut g, Op::Reshape(b), f, &[1, 1, 3, 5]);
    let be = node(&mut g, Op::Expand(b4), f, &[2, 4, 3, 5]);
    let p = node(&mut g, Op::Binary(BinaryOp::Mul, ae, be), f, &[2, 4, 3, 5]);
    let r = node(
        &mut g,
        Op::Reduce(ReduceOp::Sum, p, vec![2].into()),
        f,
        &[2, 4, 1, 5],
    );
    let found = find_matmuls(&g, &g.toposort(&[r]));
    let VendorOp::Matmul(m) = &found[0].op else {
        panic!("{:?}", found[0].op)
    };
    let c = |v: i64| Dim::constant(v);
    assert_eq!((m.batch, m.m, m.k, m.n), (c(1), c(8), c(3), c(5)));
    assert_eq!(m.rhs_batch_stride, c(0));
}

/// A bf16 product as `Tensor::matmul` records it, `cast(sum(cast(a)·cast(b)))` in f32, is a
/// bf16 routine: it reads the bf16 values (through a transpose below the cast) and writes
/// the narrowed product and its reshape, never an f32 copy.
#[test]
fn a_half_product_between_casts_is_a_half_routine() {
    let (f, h) = (DType::F32, DType::BF16);
    let mut g = Graph::new();
    let a = node(&mut g, Op::Leaf(LeafId(0)), h, &[4, 3]);
    let bt = node(&mut g, Op::Leaf(LeafId(1)), h, &[5, 3]);
    let b = node(&mut g, Op::Permute(bt, vec![1, 0].into()), h, &[3, 5]);
    let aw = node(&mut g, Op::Cast(a), f, &[4, 3]);
    let bw = node(&mut g, Op::Cast(b), f, &[3, 5]);
    let (r, wide) = matmul(&mut g, aw, bw, 4, 3, 5);
    // `matmul` reshaped the f32 sum; the tensor layer narrows the sum, then reshapes.
    let narrowed = node(&mut g, Op::Cast(r), h, &[4, 1, 5]);
    let out = node(&mut g, Op::Reshape(narrowed), h, &[4, 5]);
    let found = find_matmuls(&g, &g.toposort(&[out]));
    assert_eq!(found.len(), 1, "{found:?}");
    let VendorOp::Matmul(m) = &found[0].op else {
        panic!("{:?}", found[0].op)
    };
    assert_eq!(
        (m.dtype, m.rhs_transposed, m.lhs_transposed),
        (h, true, false)
    );
    assert_eq!(found[0].operands, [a, bt]);
    assert_eq!(found[0].writes, vec![narrowed, out]);
    assert_eq!(found[0].materialize, vec![out]);

    // An f32 product whose sum is also read in f32 stays an f32 routine over the casts.
    let g2 = g.toposort(&[out, wide]);
    let found = find_matmuls(&g, &g2);
    let VendorOp::Matmul(m) = &found[0].op else {
        panic!("{:?}", found[0].op)
    };
    assert_eq!(m.dtype, f);
    assert_eq!(found[0].operands, [aw, bw]);
}
