//! Test support: a seeded generator, a graph with leaf data, and running schedules on
//! the IR interpreter.

use rustc_hash::FxHashMap;
use tessel_graph::{Graph, LeafId, NodeId, Op, ReduceOp, Schedule, Slot, kernelize, signature};
use tessel_shape::{BinaryOp, Bindings, DType, Dim, Scalar, Shape, UnaryOp};

/// A seeded linear congruential generator (Knuth's MMIX constants).
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.next() as usize % n
    }

    pub(crate) fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    /// A value in [-2, 2), a multiple of 2^-20.
    pub(crate) fn f32(&mut self) -> f32 {
        (self.next() >> 10) as f32 / (1u32 << 20) as f32 - 2.0
    }
}

/// A graph plus its leaves' data (little-endian bytes).
pub(crate) struct Env {
    pub(crate) g: Graph,
    pub(crate) data: FxHashMap<LeafId, Vec<u8>>,
    pub(crate) next_leaf: u64,
}

impl Env {
    pub(crate) fn new() -> Self {
        Env {
            g: Graph::new(),
            data: FxHashMap::default(),
            next_leaf: 0,
        }
    }

    /// A leaf of random data (seeded by its id: the same in every `Env`).
    pub(crate) fn leaf(&mut self, dtype: DType, dims: &[usize]) -> NodeId {
        let id = LeafId(self.next_leaf);
        self.next_leaf += 1;
        let mut rng = Lcg(id.0 * 7919 + 17);
        let n: usize = dims.iter().product();
        let bytes = (0..n)
            .flat_map(|_| match dtype {
                DType::F32 => rng.f32().to_le_bytes(),
                _ => (rng.below(9) as i32 - 4).to_le_bytes(),
            })
            .collect();
        self.data.insert(id, bytes);
        self.node(Op::Leaf(id), dtype, Shape::from(dims))
    }

    pub(crate) fn node(&mut self, op: Op, dtype: DType, shape: Shape) -> NodeId {
        self.g.add(tessel_graph::Node { op, dtype, shape })
    }

    pub(crate) fn dtype(&self, n: NodeId) -> DType {
        self.g.node(n).dtype
    }

    pub(crate) fn shape(&self, n: NodeId) -> Shape {
        self.g.node(n).shape.clone()
    }

    pub(crate) fn dims(&self, n: NodeId) -> Vec<usize> {
        self.shape(n).as_usizes().expect("constant shapes")
    }

    pub(crate) fn unary(&mut self, op: UnaryOp, a: NodeId) -> NodeId {
        let dtype = op.result_dtype(self.dtype(a)).expect("supported");
        let shape = self.shape(a);
        self.node(Op::Unary(op, a), dtype, shape)
    }

    pub(crate) fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        assert_eq!(self.shape(a), self.shape(b));
        let dtype = op.result_dtype(self.dtype(a)).expect("supported");
        let shape = self.shape(a);
        self.node(Op::Binary(op, a, b), dtype, shape)
    }

    pub(crate) fn constant(&mut self, value: Scalar, like: NodeId) -> NodeId {
        let shape = self.shape(like);
        self.node(Op::Const(value), value.dtype(), shape)
    }

    pub(crate) fn reduce(&mut self, op: ReduceOp, a: NodeId, axes: &[usize]) -> NodeId {
        let mut dims = self.shape(a).dims().to_vec();
        for &ax in axes {
            dims[ax] = Dim::constant(1);
        }
        let dtype = self.dtype(a);
        self.node(Op::Reduce(op, a, axes.into()), dtype, Shape::new(dims))
    }

    pub(crate) fn permute(&mut self, a: NodeId, perm: &[usize]) -> NodeId {
        let shape = self.shape(a);
        let dims: Vec<Dim> = perm.iter().map(|&p| shape[p]).collect();
        let dtype = self.dtype(a);
        self.node(Op::Permute(a, perm.into()), dtype, Shape::new(dims))
    }

    pub(crate) fn reshape(&mut self, a: NodeId, dims: &[usize]) -> NodeId {
        let dtype = self.dtype(a);
        self.node(Op::Reshape(a), dtype, Shape::from(dims))
    }

    pub(crate) fn expand(&mut self, a: NodeId, dims: &[usize]) -> NodeId {
        let dtype = self.dtype(a);
        self.node(Op::Expand(a), dtype, Shape::from(dims))
    }
}

/// Runs the schedule of `targets` on the interpreter and returns their bytes.
pub(crate) fn realize(
    g: &Graph,
    data: &FxHashMap<LeafId, Vec<u8>>,
    targets: &[NodeId],
) -> Vec<Vec<u8>> {
    run(g, data, targets, &kernelize(g, targets).unwrap())
}

/// Runs `schedule` (a partition of `targets`) on the interpreter and returns the targets'
/// bytes.
pub(crate) fn run(
    g: &Graph,
    data: &FxHashMap<LeafId, Vec<u8>>,
    targets: &[NodeId],
    schedule: &Schedule,
) -> Vec<Vec<u8>> {
    let (_, leaves) = signature(g, targets);
    let mut bufs: FxHashMap<Slot, Vec<u8>> = FxHashMap::default();
    for (i, leaf) in leaves.iter().enumerate() {
        bufs.insert(Slot::Input(i), data[leaf].clone());
    }
    for (n, dtype, numel) in &schedule.buffers {
        let len = numel.as_const().unwrap() as usize * dtype.size_bytes();
        bufs.insert(Slot::Node(*n), vec![0; len]);
    }
    for k in &schedule.kernels {
        let mut taken: Vec<Vec<u8>> = k
            .args
            .iter()
            .map(|a| std::mem::take(bufs.get_mut(a).unwrap()))
            .collect();
        let mut refs: Vec<&mut [u8]> = taken.iter_mut().map(Vec::as_mut_slice).collect();
        tessel_ir::interp::run(&k.kernel, &mut refs, &Bindings::new())
            .unwrap_or_else(|e| panic!("{e}\n{}", k.kernel));
        for (a, b) in k.args.iter().zip(taken) {
            bufs.insert(a.clone(), b);
        }
    }
    targets
        .iter()
        .map(|t| match g.node(*t).op {
            Op::Leaf(l) => data[&l].clone(),
            _ => bufs[&Slot::Node(*t)].clone(),
        })
        .collect()
}

/// Compares two outputs of `dtype`: integers exactly, `f32` within `1e-5` relative plus
/// `1e-5 * scale` absolute (`scale` bounds the magnitudes that went into the value, so
/// reassociated sums may cancel differently), NaN equal to NaN.
#[track_caller]
pub(crate) fn assert_same(what: &str, dtype: DType, got: &[u8], want: &[u8], scale: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if dtype != DType::F32 {
        assert_eq!(got, want, "{what}: {dtype} values differ");
        return;
    }
    for (i, (g, w)) in got.chunks(4).zip(want.chunks(4)).enumerate() {
        let g = f32::from_le_bytes(g.try_into().unwrap());
        let w = f32::from_le_bytes(w.try_into().unwrap());
        let ok = (g.is_nan() && w.is_nan())
            || g == w
            || (f64::from(g) - f64::from(w)).abs()
                <= 1e-5 * f64::from(w).abs() + 1e-5 * scale.max(1.0);
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}
