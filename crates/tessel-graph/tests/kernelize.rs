//! The kernelizer: fusion decisions (kernel counts) and the values the kernels compute,
//! run on the reference interpreter and compared with plain Rust loops in f64.

use rustc_hash::FxHashMap;
use tessel_graph::{
    Graph, Knobs, LeafId, Lowerings, Node, NodeId, Op, ReduceOp, SHARED_MIN_OPS, Schedule, Search,
    Slot, kernelize, kernelize_cooperative, kernelize_rows, kernelize_shared, signature,
};
use tessel_shape::{BinaryOp, Bindings, DType, Dim, Scalar, Shape, UnaryOp};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// A graph plus the data of its leaves.
struct Env {
    g: Graph,
    data: FxHashMap<LeafId, Vec<f32>>,
    next_leaf: u64,
}

impl Env {
    fn new() -> Self {
        Env {
            g: Graph::new(),
            data: FxHashMap::default(),
            next_leaf: 0,
        }
    }

    fn leaf(&mut self, shape: &[usize], values: Vec<f32>) -> NodeId {
        let id = LeafId(self.next_leaf);
        self.next_leaf += 1;
        self.data.insert(id, values);
        self.g.add(Node {
            op: Op::Leaf(id),
            dtype: DType::F32,
            shape: Shape::from(shape),
        })
    }

    fn shape(&self, n: NodeId) -> Shape {
        self.g.node(n).shape.clone()
    }

    fn add(&mut self, op: Op, shape: Shape) -> NodeId {
        self.g.add(Node {
            op,
            dtype: DType::F32,
            shape,
        })
    }

    fn unary(&mut self, op: UnaryOp, a: NodeId) -> NodeId {
        let s = self.shape(a);
        self.add(Op::Unary(op, a), s)
    }

    fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        let s = self.shape(a);
        assert_eq!(s, self.shape(b));
        self.add(Op::Binary(op, a, b), s)
    }

    /// `softmax(x)` over the last axis of a 2-D `x`, as `Tensor::softmax` records it.
    fn softmax_rows(&mut self, x: NodeId) -> NodeId {
        let s = self.shape(x);
        let max = self.reduce(ReduceOp::Max, x, &[1]);
        let me = self.expand(max, &s);
        let shifted = self.binary(BinaryOp::Sub, x, me);
        let e = self.unary(UnaryOp::Exp, shifted);
        let sum = self.reduce(ReduceOp::Sum, e, &[1]);
        let se = self.expand(sum, &s);
        self.binary(BinaryOp::Div, e, se)
    }

    fn constant(&mut self, v: f32, shape: &Shape) -> NodeId {
        self.add(Op::Const(Scalar::F32(v)), shape.clone())
    }

    fn reduce(&mut self, op: ReduceOp, a: NodeId, axes: &[usize]) -> NodeId {
        let mut dims = self.shape(a).dims().to_vec();
        for &ax in axes {
            dims[ax] = Dim::constant(1);
        }
        self.add(Op::Reduce(op, a, axes.into()), Shape::new(dims))
    }

    fn expand(&mut self, a: NodeId, shape: &Shape) -> NodeId {
        self.add(Op::Expand(a), shape.clone())
    }

    /// Runs the schedule for `targets` on the interpreter and returns their values.
    fn realize(&self, targets: &[NodeId]) -> (Vec<Vec<f32>>, usize) {
        let schedule = kernelize(&self.g, targets).unwrap();
        self.run(targets, &schedule)
    }

    /// Runs `schedule`, made for `targets`, on the interpreter.
    fn run(&self, targets: &[NodeId], schedule: &Schedule) -> (Vec<Vec<f32>>, usize) {
        let (_, leaves) = signature(&self.g, targets);
        let mut bufs: FxHashMap<Slot, Vec<u8>> = FxHashMap::default();
        for (i, leaf) in leaves.iter().enumerate() {
            bufs.insert(
                Slot::Input(i),
                self.data[leaf]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            );
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
        let out = targets
            .iter()
            .map(|t| {
                let bytes = match self.g.node(*t).op {
                    Op::Leaf(l) => return self.data[&l].clone(),
                    _ => &bufs[&Slot::Node(*t)],
                };
                bytes
                    .chunks(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            })
            .collect();
        (out, schedule.kernels.len())
    }
}

#[track_caller]
fn assert_close(got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs() / w.abs().max(1.0);
        assert!(
            err <= tol,
            "element {i}: got {g}, want {w} (rel err {err:e})"
        );
    }
}

#[test]
fn ten_elementwise_ops_fuse_into_one_kernel() {
    let mut env = Env::new();
    let mut rng = Rng(1);
    let (a_data, b_data) = (rng.vec(45 * 65), rng.vec(45 * 65));
    let a = env.leaf(&[45, 65], a_data.clone());
    let b = env.leaf(&[45, 65], b_data.clone());
    let s = env.shape(a);
    let half = env.constant(0.5, &s);
    let mut x = env.binary(BinaryOp::Add, a, b);
    x = env.binary(BinaryOp::Mul, x, half);
    x = env.unary(UnaryOp::Exp, x);
    x = env.binary(BinaryOp::Sub, x, a);
    x = env.unary(UnaryOp::Abs, x);
    x = env.unary(UnaryOp::Sqrt, x);
    x = env.binary(BinaryOp::Max, x, b);
    x = env.unary(UnaryOp::Neg, x);
    x = env.unary(UnaryOp::Tanh, x);
    x = env.binary(BinaryOp::Add, x, half);
    let (out, kernels) = env.realize(&[x]);
    assert_eq!(kernels, 1);
    let want: Vec<f64> = a_data
        .iter()
        .zip(&b_data)
        .map(|(&a, &b)| {
            let (a, b) = (f64::from(a), f64::from(b));
            let y = (((a + b) * 0.5).exp() - a).abs().sqrt().max(b);
            (-y).tanh() + 0.5
        })
        .collect();
    assert_close(&out[0], &want, 1e-5);
}

#[test]
fn softmax_is_two_kernels() {
    let mut env = Env::new();
    let mut rng = Rng(2);
    let (rows, cols) = (7, 13);
    let data = rng.vec(rows * cols);
    let x = env.leaf(&[rows, cols], data.clone());
    let y = env.softmax_rows(x);
    let (out, kernels) = env.realize(&[y]);
    assert!(kernels <= 2, "softmax took {kernels} kernels");
    let mut want = Vec::new();
    for r in 0..rows {
        let row: Vec<f64> = data[r * cols..(r + 1) * cols]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
        want.extend(row.iter().map(|v| (v - m).exp() / z));
    }
    assert_close(&out[0], &want, 1e-5);
}

#[test]
fn mean_and_variance_take_at_most_two_kernels() {
    let mut env = Env::new();
    let mut rng = Rng(3);
    let (rows, cols) = (5, 33);
    let data = rng.vec(rows * cols);
    let x = env.leaf(&[rows, cols], data.clone());
    let s = env.shape(x);
    let sum = env.reduce(ReduceOp::Sum, x, &[1]);
    let rs = env.shape(sum);
    let inv_n = env.constant(1.0 / cols as f32, &rs);
    let mean = env.binary(BinaryOp::Mul, sum, inv_n);
    let me = env.expand(mean, &s);
    let d = env.binary(BinaryOp::Sub, x, me);
    let d2 = env.binary(BinaryOp::Mul, d, d);
    let ss = env.reduce(ReduceOp::Sum, d2, &[1]);
    let var = env.binary(BinaryOp::Mul, ss, inv_n);
    let ve = env.expand(var, &s);
    let eps = env.constant(1e-5, &s);
    let denom = env.binary(BinaryOp::Add, ve, eps);
    let rstd = env.unary(UnaryOp::Rsqrt, denom);
    let y = env.binary(BinaryOp::Mul, d, rstd);
    let (out, kernels) = env.realize(&[y]);
    assert!(kernels <= 2, "layer norm took {kernels} kernels");
    let mut want = Vec::new();
    for r in 0..rows {
        let row: Vec<f64> = data[r * cols..(r + 1) * cols]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
        want.extend(row.iter().map(|v| (v - mean) / (var + 1e-5).sqrt()));
    }
    assert_close(&out[0], &want, 1e-4);
}

#[test]
fn matmul_bias_relu_is_one_kernel() {
    let mut env = Env::new();
    let mut rng = Rng(4);
    let (m, k, n) = (9, 17, 5);
    let (xd, wd, bd) = (rng.vec(m * k), rng.vec(k * n), rng.vec(n));
    let x = env.leaf(&[m, k], xd.clone());
    let w = env.leaf(&[k, n], wd.clone());
    let b = env.leaf(&[n], bd.clone());
    // x[m,k,1] * w[1,k,n] summed over k.
    let x3 = env.add(Op::Reshape(x), Shape::from([m, k, 1]));
    let w3 = env.add(Op::Reshape(w), Shape::from([1, k, n]));
    let full = Shape::from([m, k, n]);
    let xe = env.expand(x3, &full);
    let we = env.expand(w3, &full);
    let prod = env.binary(BinaryOp::Mul, xe, we);
    let summed = env.reduce(ReduceOp::Sum, prod, &[1]);
    let mm = env.add(Op::Reshape(summed), Shape::from([m, n]));
    let b2 = env.add(Op::Reshape(b), Shape::from([1, n]));
    let be = env.expand(b2, &Shape::from([m, n]));
    let y = env.binary(BinaryOp::Add, mm, be);
    let zero = env.constant(0.0, &Shape::from([m, n]));
    let y = env.binary(BinaryOp::Max, y, zero);
    let (out, kernels) = env.realize(&[y]);
    assert_eq!(kernels, 1);
    let mut want = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|p| f64::from(xd[i * k + p]) * f64::from(wd[p * n + j]))
                .sum();
            want[i * n + j] = (dot + f64::from(bd[j])).max(0.0);
        }
    }
    assert_close(&out[0], &want, 1e-4 * (k as f64).sqrt());
}

#[test]
fn movement_ops_fold_into_indices() {
    let mut env = Env::new();
    let mut rng = Rng(5);
    let data = rng.vec(7 * 13 * 3);
    let x = env.leaf(&[7, 13, 3], data.clone());
    // permute(2, 0, 1) -> [3, 7, 13], flip axis 2, shrink rows 1..7 step 2 -> [3, 3, 13],
    // pad the last axis by (2, 1) with -1 -> [3, 3, 16], sum over axis 1 -> [3, 1, 16].
    let p = env.add(Op::Permute(x, [2, 0, 1].into()), Shape::from([3, 7, 13]));
    let f = env.add(Op::Flip(p, [2].into()), Shape::from([3, 7, 13]));
    let c = |v: i64| Dim::constant(v);
    let sh = env.add(
        Op::Shrink(f, [(c(0), c(1)), (c(1), c(2)), (c(0), c(1))].into()),
        Shape::from([3, 3, 13]),
    );
    let pd = env.add(
        Op::Pad(
            sh,
            [(c(0), c(0)), (c(0), c(0)), (c(2), c(1))].into(),
            Scalar::F32(-1.0),
        ),
        Shape::from([3, 3, 16]),
    );
    let y = env.reduce(ReduceOp::Sum, pd, &[1]);
    let (out, kernels) = env.realize(&[y]);
    assert_eq!(kernels, 1, "a reduction over views is one kernel");
    let at = |a: usize, b: usize, cc: usize| f64::from(data[(a * 13 + b) * 3 + cc]);
    let mut want = Vec::new();
    for c2 in 0..3 {
        for j in 0..16 {
            let mut s = 0.0;
            for r in 0..3 {
                s += if (2..15).contains(&j) {
                    // permuted[c2][row][col] = x[row][col][c2]; row = 1 + 2r; col flipped.
                    at(1 + 2 * r, 12 - (j - 2), c2)
                } else {
                    -1.0
                };
            }
            want.push(s);
        }
    }
    assert_close(&out[0], &want, 1e-5);
}

#[test]
fn common_subexpressions_share_nodes_and_the_graph_stays_flat() {
    let mut env = Env::new();
    let a = env.leaf(&[4], vec![1.0, 2.0, 3.0, 4.0]);
    let e1 = env.unary(UnaryOp::Exp, a);
    let e2 = env.unary(UnaryOp::Exp, a);
    assert_eq!(e1, e2);
    assert!(env.g.release(e2).is_empty());
    assert!(env.g.release(e1).is_empty());
    let before = env.g.len();
    for i in 0..10_000u64 {
        let x = env.unary(UnaryOp::Exp, a);
        let y = env.unary(UnaryOp::Neg, x);
        assert!(env.g.release(x).is_empty());
        assert!(env.g.make_leaf(y, LeafId(1_000_000 + i)).is_empty());
        assert_eq!(env.g.release(y), vec![LeafId(1_000_000 + i)]);
    }
    assert_eq!(env.g.len(), before, "every temporary node was freed");
}

/// Cooperative reductions (a workgroup per output element, partial results combined in
/// local memory) compute what the serial ones do: row sums and maxima of rows longer and
/// shorter than a workgroup, softmax (a max hoisted out of a sum), a mean of squares.
#[test]
fn cooperative_reductions_match_the_serial_ones() {
    for cols in [300, 512, 2000] {
        let mut env = Env::new();
        let mut rng = Rng(cols as u64);
        let rows = 3;
        let x = env.leaf(&[rows, cols], rng.vec(rows * cols));
        let sum = env.reduce(ReduceOp::Sum, x, &[1]);
        // The same max node as softmax's (the graph hash-conses).
        let max = env.reduce(ReduceOp::Max, x, &[1]);
        let softmax = env.softmax_rows(x);
        let sq = env.binary(BinaryOp::Mul, x, x);
        let all = env.reduce(ReduceOp::Sum, sq, &[0, 1]);
        let targets = [sum, max, softmax, all];
        let (serial, _) = env.realize(&targets);
        let schedule = kernelize_cooperative(&env.g, &targets).unwrap();
        let names: Vec<&str> = schedule
            .kernels
            .iter()
            .map(|k| k.kernel.name.as_str())
            .collect();
        assert!(
            names.iter().filter(|n| n.ends_with("_g")).count() >= 3,
            "{cols} columns: kernels {names:?}"
        );
        let (cooperative, _) = env.run(&targets, &schedule);
        for (k, (a, b)) in serial.iter().zip(&cooperative).enumerate() {
            let want: Vec<f64> = a.iter().map(|&v| f64::from(v)).collect();
            assert_close(b, &want, 1e-5);
            assert!(!b.is_empty(), "target {k}");
        }
    }
}

/// Row statistics fused into their readers: softmax is one kernel (a workgroup per row),
/// and so is a layer norm; both match the default partition.
#[test]
fn row_kernels_match_the_serial_ones() {
    for cols in [256, 300, 1024] {
        let mut env = Env::new();
        let mut rng = Rng(7 + cols as u64);
        let rows = 5;
        let x = env.leaf(&[rows, cols], rng.vec(rows * cols));
        let s = env.shape(x);
        let softmax = env.softmax_rows(x);
        // (x - mean) * rsqrt(mean((x - mean)^2) + eps)
        let total = env.reduce(ReduceOp::Sum, x, &[1]);
        let kept = env.shape(total);
        let n = env.constant(cols as f32, &kept);
        let mean = env.binary(BinaryOp::Div, total, n);
        let mean_e = env.expand(mean, &s);
        let centered = env.binary(BinaryOp::Sub, x, mean_e);
        let sq = env.binary(BinaryOp::Mul, centered, centered);
        let ss = env.reduce(ReduceOp::Sum, sq, &[1]);
        let var = env.binary(BinaryOp::Div, ss, n);
        let eps = env.constant(1e-5, &kept);
        let var_eps = env.binary(BinaryOp::Add, var, eps);
        let inv = env.unary(UnaryOp::Rsqrt, var_eps);
        let inv_e = env.expand(inv, &s);
        let norm = env.binary(BinaryOp::Mul, centered, inv_e);
        for (what, target) in [("softmax", softmax), ("layer norm", norm)] {
            let (serial, _) = env.realize(&[target]);
            let schedule = kernelize_rows(&env.g, &[target], &[])
                .unwrap()
                .expect("row statistics to fuse");
            let names: Vec<&str> = schedule
                .kernels
                .iter()
                .map(|k| k.kernel.name.as_str())
                .collect();
            assert_eq!(names.len(), 1, "{what}, {cols} columns: kernels {names:?}");
            assert!(names[0].ends_with("_row"), "{what}: {names:?}");
            let (rows_out, _) = env.run(&[target], &schedule);
            let want: Vec<f64> = serial[0].iter().map(|&v| f64::from(v)).collect();
            assert_close(&rows_out[0], &want, 1e-5);
        }
    }
}

/// Every launch shape the tuner may try (`ScheduledKernel::variants`, exhaustive) of
/// cooperative reductions, row kernels and a wide elementwise kernel computes what the
/// default kernels compute: the same parameters, the same values.
#[test]
fn every_tuning_variant_matches_the_default_kernel() {
    let mut env = Env::new();
    let mut rng = Rng(11);
    let (rows, cols) = (6, 1024);
    let x = env.leaf(&[rows, cols], rng.vec(rows * cols));
    let y = env.leaf(&[rows, cols], rng.vec(rows * cols));
    let softmax = env.softmax_rows(x);
    let sum = env.reduce(ReduceOp::Sum, x, &[1]);
    let prod = env.binary(BinaryOp::Mul, x, y);
    let wide = env.unary(UnaryOp::Tanh, prod);
    // Transposes: of an odd-sized matrix plus a matrix read in order, and of the last two
    // axes of a batch; tiles through local memory apply to both.
    let z = env.leaf(&[37, 45], rng.vec(37 * 45));
    let w = env.leaf(&[45, 37], rng.vec(45 * 37));
    let zt = env.add(Op::Permute(z, vec![1, 0].into()), Shape::from([45, 37]));
    let transposed = env.binary(BinaryOp::Add, zt, w);
    let b = env.leaf(&[3, 20, 24], rng.vec(3 * 20 * 24));
    let bt = env.add(
        Op::Permute(b, vec![0, 2, 1].into()),
        Shape::from([3, 24, 20]),
    );
    let batch = env.unary(UnaryOp::Exp, bt);
    let targets = [softmax, sum, wide, transposed, batch];
    let (want, _) = env.realize(&targets);
    let schedules = [
        kernelize(&env.g, &targets).unwrap(),
        kernelize_cooperative(&env.g, &targets).unwrap(),
        kernelize_rows(&env.g, &targets, &[]).unwrap().unwrap(),
    ];
    let mut tried = FxHashMap::default();
    for schedule in schedules {
        for (k, kernel) in schedule.kernels.iter().enumerate() {
            for (knobs, variant) in kernel.variants(&env.g, Search::Exhaustive) {
                assert_eq!(variant.args, kernel.args, "{knobs}");
                assert!(variant.kernel.name.ends_with(&knobs.to_string()));
                let mut one = schedule.clone();
                one.kernels[k] = variant;
                let (got, _) = env.run(&targets, &one);
                for (got, want) in got.iter().zip(&want) {
                    let want: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
                    assert_close(got, &want, 1e-5);
                }
                *tried.entry(kernel.kernel.name.clone()).or_insert(0) += 1;
            }
        }
    }
    // Lanes of the cooperative and row kernels, local sizes, upcasts and tiles of the
    // others.
    assert!(tried.keys().any(|n| n.ends_with("_g")), "{tried:?}");
    for edge in ["_t8", "_t16", "_t32"] {
        let tiled: Vec<_> = schedules_tiled(&env, &targets, edge);
        assert_eq!(tiled.len(), 2, "{edge}: {tiled:?}");
    }
    assert!(tried.keys().any(|n| n.ends_with("_row")), "{tried:?}");
    assert!(tried.values().any(|&n| n >= 20), "{tried:?}");
}

/// A kernel's spec lists its reads as index expressions of the output coordinates, finds
/// the one a transpose walks across, and rules out knobs that do not apply.
#[test]
fn a_spec_describes_reads_and_rules_out_knobs() {
    let mut env = Env::new();
    let mut rng = Rng(12);
    let z = env.leaf(&[37, 45], rng.vec(37 * 45));
    let w = env.leaf(&[45, 37], rng.vec(45 * 37));
    let zt = env.add(Op::Permute(z, vec![1, 0].into()), Shape::from([45, 37]));
    let transposed = env.binary(BinaryOp::Add, zt, w);
    let sum = env.reduce(ReduceOp::Sum, w, &[1]);
    let schedule = kernelize(&env.g, &[transposed, sum]).unwrap();
    let specs: Vec<_> = schedule
        .kernels
        .iter()
        .map(|k| k.spec(&env.g).unwrap())
        .collect();
    let t = specs.iter().find(|s| s.root == transposed).unwrap();
    assert!(!t.reduces && !t.gathers && !t.cooperative);
    assert_eq!(t.accesses.len(), 2, "{t:?}");
    let (read, axis) = t.transposed_read().expect("z is read across");
    assert_eq!((read.slot.clone(), axis), (Slot::Input(0), 0));
    let (o0, o1) = (t.space[0].0, t.space[1].0);
    assert_eq!((read.stride(o0), read.stride(o1)), (Some(1), Some(45)));
    let tile = |edge| Knobs {
        tile: Some(edge),
        ..Knobs::default()
    };
    assert!(t.check(tile(16)).is_ok());
    assert!(t.check(tile(12)).is_err(), "not an edge tiles use");
    let upcast = Knobs {
        upcast: Some(8),
        ..Knobs::default()
    };
    // 37 is not a multiple of 8.
    assert!(t.check(upcast).is_err());
    let r = specs.iter().find(|s| s.root == sum).unwrap();
    assert!(r.reduces);
    let err = r.check(tile(16)).unwrap_err();
    assert!(err.to_string().contains("elementwise"), "{err}");
    let lanes = Knobs {
        lanes: Some(256),
        ..Knobs::default()
    };
    assert!(r.check(lanes).is_err(), "a serial reduction has no lanes");
}

/// The names of the `edge` tiled variants of the default schedule's kernels.
fn schedules_tiled(env: &Env, targets: &[NodeId], edge: &str) -> Vec<String> {
    kernelize(&env.g, targets)
        .unwrap()
        .kernels
        .iter()
        .flat_map(|k| k.variants(&env.g, Search::Exhaustive))
        .map(|(_, v)| v.kernel.name)
        .filter(|n| n.ends_with(edge))
        .collect()
}

/// A shared value of 16 ops is inlined into each consumer's kernel by default and
/// computed once by the shared partition; both give the same values.
#[test]
fn the_shared_partition_computes_a_shared_value_once() {
    let mut env = Env::new();
    let mut rng = Rng(41);
    let x = env.leaf(&[6, 9], rng.vec(54));
    let a = env.unary(UnaryOp::Sin, x);
    // 16 ops: a value worth computing once.
    let mut shared = a;
    for _ in 0..5 {
        let b = env.unary(UnaryOp::Exp, shared);
        let c = env.binary(BinaryOp::Mul, b, x);
        shared = env.unary(UnaryOp::Tanh, c);
    }
    let rows = env.reduce(ReduceOp::Sum, shared, &[1]);
    let cols = env.reduce(ReduceOp::Max, shared, &[0]);
    let targets = [rows, cols];
    let (want, inlined) = env.realize(&targets);
    assert_eq!(
        inlined, 2,
        "by default the shared value is inlined into both kernels"
    );
    let schedule = kernelize_shared(&env.g, &targets, SHARED_MIN_OPS)
        .unwrap()
        .expect("a shared value of 16 ops");
    assert_eq!(schedule.kernels.len(), 3, "computed once, read by both");
    let (got, _) = env.run(&targets, &schedule);
    for (g, w) in got.iter().zip(&want) {
        let w: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
        assert_close(g, &w, 1e-6);
    }
    assert!(
        kernelize_shared(&env.g, &[a], SHARED_MIN_OPS)
            .unwrap()
            .is_none(),
        "nothing shared"
    );
}

/// A residual stream `h_l = h_{l-1} + p_l` whose every value is also read by a row sum
/// (a layer norm's statistics): each `h_l` is a few adds but reads every earlier `p`, so
/// it is materialized (it reads 4 distinct buffers of its size) instead of inlined into
/// each later kernel, and no row sum's kernel reads more than a handful of buffers however
/// deep the stream (without the rule the widest binds 11). The values match an f64
/// reference.
#[test]
fn a_shared_value_reading_many_buffers_is_computed_once() {
    let mut env = Env::new();
    let mut rng = Rng(43);
    let layers = 10;
    let first = rng.vec(24);
    let mut h = env.leaf(&[4, 6], first.clone());
    let mut targets = Vec::new();
    let mut parts = Vec::new();
    for _ in 0..layers {
        parts.push(rng.vec(24));
        let p = env.leaf(&[4, 6], parts[parts.len() - 1].clone());
        h = env.binary(BinaryOp::Add, h, p);
        targets.push(env.reduce(ReduceOp::Sum, h, &[1]));
    }
    targets.push(h);
    let schedule = kernelize(&env.g, &targets).unwrap();
    // The row sums' kernels; the stream itself may be one kernel storing every
    // materialized `h_l` as it passes it.
    let widest = schedule
        .kernels
        .iter()
        .filter(|k| k.kernel.name.starts_with("r_"))
        .map(|k| {
            k.kernel
                .params
                .iter()
                .filter(|p| matches!(p, tessel_ir::Param::Buffer { .. }))
                .count()
        })
        .max()
        .unwrap();
    assert!(
        widest <= 5,
        "a row sum's kernel binds {widest} buffers: the stream is recomputed from its start"
    );
    let (got, _) = env.run(&targets, &schedule);
    // The reference: every partial sum in f64, from the leaves.
    let mut stream: Vec<f64> = first.iter().map(|&v| f64::from(v)).collect();
    for l in 0..layers {
        for (s, &p) in stream.iter_mut().zip(&parts[l]) {
            *s += f64::from(p);
        }
        let sums: Vec<f64> = stream.chunks(6).map(|r| r.iter().sum()).collect();
        assert_close(&got[l], &sums, 1e-5);
    }
    assert_close(&got[layers], &stream, 1e-5);
}

/// A log-sum-exp written beside its max and sum (as attention's autograd records it): one
/// cooperative kernel computes the row statistics once and writes all three, the serial
/// kernel's values.
#[test]
fn a_cooperative_kernel_writes_the_statistics_it_absorbs() {
    for cols in [512, 2000] {
        let mut env = Env::new();
        let mut rng = Rng(3 + cols as u64);
        let rows = 4;
        let x = env.leaf(&[rows, cols], rng.vec(rows * cols));
        let s = env.shape(x);
        let max = env.reduce(ReduceOp::Max, x, &[1]);
        let max_e = env.expand(max, &s);
        let shifted = env.binary(BinaryOp::Sub, x, max_e);
        let e = env.unary(UnaryOp::Exp, shifted);
        let sum = env.reduce(ReduceOp::Sum, e, &[1]);
        let log = env.unary(UnaryOp::Log, sum);
        let lse = env.binary(BinaryOp::Add, max, log);
        let targets = [lse, max, sum];
        let (serial, _) = env.realize(&targets);
        let schedule = kernelize_cooperative(&env.g, &targets).unwrap();
        let kernels: Vec<(&str, usize)> = schedule
            .kernels
            .iter()
            .map(|k| (k.kernel.name.as_str(), k.writes.len()))
            .collect();
        assert!(
            kernels.len() == 1 && kernels[0].0.ends_with("_g") && kernels[0].1 == 3,
            "{cols} columns: kernels {kernels:?}"
        );
        let (cooperative, _) = env.run(&targets, &schedule);
        for (a, b) in serial.iter().zip(&cooperative) {
            let want: Vec<f64> = a.iter().map(|&v| f64::from(v)).collect();
            assert_close(b, &want, 1e-5);
        }
    }
}

/// Layers of the same structure over different weights are lowered once per
/// kernelization (their kernels moved over by position): every layer's kernels, and their
/// tuning variants, still read and write their own layer's values.
#[test]
fn repeated_layers_read_their_own_values() {
    let mut env = Env::new();
    let mut rng = Rng(23);
    let (rows, cols, layers) = (5, 300, 3);
    let x = rng.vec(rows * cols);
    let mut h = env.leaf(&[rows, cols], x.clone());
    let mut weights = Vec::new();
    let mut targets = Vec::new();
    for _ in 0..layers {
        weights.push(rng.vec(rows * cols));
        let w = env.leaf(&[rows, cols], weights[weights.len() - 1].clone());
        let a = env.binary(BinaryOp::Mul, h, w);
        let s = env.softmax_rows(a);
        h = env.binary(BinaryOp::Add, s, h);
        targets.push(env.reduce(ReduceOp::Sum, h, &[1]));
    }
    targets.push(h);
    // The same in f64.
    let mut want_h: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let mut want = Vec::new();
    for w in &weights {
        let mut next = want_h.clone();
        for r in 0..rows {
            let row = r * cols..(r + 1) * cols;
            let a: Vec<f64> = row.clone().map(|i| want_h[i] * f64::from(w[i])).collect();
            let max = a.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = a.iter().map(|v| (v - max).exp()).sum();
            for (i, v) in row.zip(&a) {
                next[i] += (v - max).exp() / sum;
            }
        }
        want_h = next;
        want.push(
            (0..rows)
                .map(|r| want_h[r * cols..(r + 1) * cols].iter().sum())
                .collect::<Vec<f64>>(),
        );
    }
    want.push(want_h);
    let schedule = kernelize(&env.g, &targets).unwrap();
    let check = |schedule: &Schedule, what: &str| {
        let (got, _) = env.run(&targets, schedule);
        for (got, want) in got.iter().zip(&want) {
            assert_eq!(got.len(), want.len(), "{what}");
            assert_close(got, want, 1e-4);
        }
    };
    check(&schedule, "default");
    // Some kernel serves two layers (the same text over other slots).
    let kernels = &schedule.kernels;
    let shared = kernels.iter().enumerate().any(|(i, a)| {
        kernels[i + 1..]
            .iter()
            .any(|b| a.kernel == b.kernel && a.args != b.args)
    });
    assert!(shared, "{kernels:#?}");
    for (k, kernel) in schedule.kernels.iter().enumerate() {
        for (knobs, variant) in kernel.variants(&env.g, Search::Default) {
            assert_eq!(variant.args, kernel.args, "{knobs}");
            let mut one = schedule.clone();
            one.kernels[k] = variant;
            check(&one, &format!("kernel {k} {knobs}"));
        }
    }
}

/// Kernels of equal cones print the same source whichever cone was lowered first: a
/// `Lowerings` handle that lowered `exp(c + d)` alone (its leaves the first inputs) gives
/// `exp(a + b)` and `exp(c + d)` the same kernels as a fresh handle, whose leaves number
/// differently. The planner shares one handle between partitions kernelized on several
/// threads, and the kernels' source is part of the plan cache's key.
#[test]
fn moved_lowerings_print_the_same_source_as_fresh_ones() {
    let mut env = Env::new();
    let mut rng = Rng(7);
    let [a, b, c, d] = [0; 4].map(|_| env.leaf(&[4, 8], rng.vec(32)));
    let first = env.binary(BinaryOp::Add, a, b);
    let first = env.unary(UnaryOp::Exp, first);
    let second = env.binary(BinaryOp::Add, c, d);
    let second = env.unary(UnaryOp::Exp, second);
    let texts =
        |s: &Schedule| -> Vec<String> { s.kernels.iter().map(|k| k.kernel.to_string()).collect() };
    let fresh = Lowerings::default()
        .kernelize(&env.g, &[first, second])
        .unwrap();
    let warmed = Lowerings::default();
    warmed.kernelize(&env.g, &[second]).unwrap();
    let moved = warmed.kernelize(&env.g, &[first, second]).unwrap();
    assert_eq!(fresh.kernels.len(), 2);
    assert_eq!(texts(&moved), texts(&fresh));
    let (values, _) = env.run(&[first, second], &moved);
    for (got, (x, y)) in values.iter().zip([(a, b), (c, d)]) {
        let want: Vec<f64> = env.data[&leaf_of(&env, x)]
            .iter()
            .zip(&env.data[&leaf_of(&env, y)])
            .map(|(&p, &q)| (f64::from(p) + f64::from(q)).exp())
            .collect();
        assert_close(got, &want, 1e-5);
    }
}

fn leaf_of(env: &Env, n: NodeId) -> LeafId {
    match env.g.node(n).op {
        Op::Leaf(l) => l,
        _ => panic!("not a leaf"),
    }
}
