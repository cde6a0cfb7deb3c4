//! Reverse-mode gradients, recorded as ordinary graph nodes.
//!
//! [`grad`] walks the recorded graph from the loss back to the requested tensors and adds,
//! for every primitive node on the way, the nodes of its vector-Jacobian product. The
//! gradients are lazy tensors like any other: they fuse with each other and with the
//! forward pass, go through the e-graph and the plan cache, and can be differentiated
//! again. Every composite op of the Tensor API (softmax, conv2d, gather, ...) is built
//! from the primitives below, so it is differentiable without a rule of its own.
//!
//! There is no `requires_grad` state: what is differentiated is the graph as recorded
//! between the loss and the tensors asked for. A tensor that was realized in between (read,
//! printed, [`Tensor::realize`]) is a computed buffer from then on, a constant to `grad`
//! (like `.detach()` in PyTorch). The loss itself is the exception: a realized one-element
//! float tensor keeps its recorded ops (and their inputs alive) for as long as it lives,
//! so reading a loss before taking its gradients works, as in PyTorch.

mod attention;

use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};
use tessel_graph::{
    AtomicOp, AttentionNodes, Node, NodeId, Op, ReduceOp, attention_nodes, find_plain_matmuls,
};
use tessel_shape::{BinaryOp, DType, Dim, Scalar, Shape, TernaryOp, UnaryOp};

use crate::ops::movement::{pad_axis, shrink};
use crate::ops::reduce::leading_in_blocks;
use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};
use tessel_runtime::{Runtime, runtime};

/// The fewest rows whose gradient sum (a bias or layer-norm weight broadcast over every
/// token) runs in blocks ([`leading_in_blocks`]): one pass gives each column one
/// invocation, and GPT-2's 768 columns of 4088 rows took 1–2.7 ms each on the H200.
const GRADIENT_ROWS_MIN: i64 = 256;

/// The gradients of a one-element `loss` with respect to each tensor of `wrt`
/// (`torch.autograd.grad(loss, wrt)`), as lazy tensors of the same shapes and dtypes.
///
/// Realize the loss and the gradients (and whatever uses them, like an optimizer's update)
/// together with [`Tensor::realize_all`], so one plan computes the forward and backward
/// passes, sharing their work.
///
/// Errors if the loss is not a one-element float tensor, if a tensor of `wrt` is not a
/// float tensor, lives on another device, or does not take part in computing the loss. A
/// loss that was already read still has its recorded ops.
///
/// ```
/// # use tessel_tensor::Tensor;
/// # fn main() -> tessel_tensor::Result<()> {
/// let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], [3])?;
/// let loss = (&x * &x)?.sum_all()?; // Σ x²
/// let [dx] = <[Tensor; 1]>::try_from(tessel_tensor::grad(&loss, &[&x])?).unwrap();
/// // A gradient is a tensor like any other: differentiate it again (before reading it:
/// // reading realizes it, and a realized tensor is a constant to `grad`).
/// let second = tessel_tensor::grad(&dx.sum_all()?, &[&x])?;
/// assert_eq!(dx.to_vec::<f64>()?, vec![2.0, 4.0, 6.0]);
/// assert_eq!(second[0].to_vec::<f64>()?, vec![2.0, 2.0, 2.0]);
/// # Ok(())
/// # }
/// ```
pub fn grad(loss: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
    const OP: &str = "grad";
    if loss.numel() != 1 || !loss.dtype().is_float() {
        return Err(Error::InvalidArgument {
            op: OP,
            reason: format!(
                "the loss must be a float tensor with one element, got {} {}; reduce it first (e.g. .sum_all() or .mean_all())",
                loss.shape(),
                loss.dtype()
            ),
        });
    }
    for (i, w) in wrt.iter().enumerate() {
        loss.same_device(w, OP)?;
        if !w.dtype().is_float() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "wrt[{i}] is a {} tensor; gradients exist only for float tensors",
                    w.dtype()
                ),
            });
        }
    }
    let targets: FxHashSet<NodeId> = wrt.iter().map(|w| w.node()).collect();
    let tape = Tape::record(loss, &targets);
    if let Some(i) = wrt.iter().position(|w| !tape.needs(w.node())) {
        let reason = if matches!(tape.node(loss.node()).op, Op::Leaf(_)) {
            "the loss is a tensor of data with no recorded ops (made from values, or computed from tensors realized before it)".to_string()
        } else {
            format!(
                "wrt[{i}] ({} {}) does not take part in computing the loss, or only through a tensor that was realized in between (realized tensors are constants to grad)",
                wrt[i].shape(),
                wrt[i].dtype()
            )
        };
        return Err(Error::InvalidArgument { op: OP, reason });
    }
    let grads = tape.backward(loss)?;
    Ok(wrt
        .iter()
        .map(|w| {
            tape.position(w.node())
                .and_then(|i| grads[i].clone())
                .unwrap_or_else(|| w.zeros_like())
        })
        .collect())
}

impl Tensor {
    /// The gradients of this one-element tensor with respect to each tensor of `wrt`; see
    /// [`grad`].
    pub fn backward(&self, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
        grad(self, wrt)
    }
}

/// The recorded graph between the loss and the tensors differentiated for.
///
/// Per-node facts are vectors in `order`'s order, found through one index: `grad` runs
/// on every training step, and one hash map per fact cost more than the gradients' own
/// recording.
struct Tape {
    /// Nodes in dependency order (operands first), the loss last.
    order: Vec<NodeId>,
    /// Each node's position in `order`.
    position: FxHashMap<NodeId, u32>,
    /// Each node's structure, captured at the call.
    nodes: Vec<Node>,
    /// A handle to every node, holding it live while gradients are built.
    handles: Vec<Tensor>,
    /// Whether each node is on a path from a differentiated tensor to the loss.
    on_path: Vec<bool>,
    /// The attentions recorded between them, by the reduce node of their second product.
    attentions: FxHashMap<NodeId, AttentionNodes>,
}

impl Tape {
    fn record(loss: &Tensor, targets: &FxHashSet<NodeId>) -> Tape {
        let device = loss.device();
        let (order, nodes, attentions) = {
            let mut st = runtime().lock();
            // A loss read before `grad` is a leaf that kept its recorded structure.
            let root = loss.node();
            let history = Runtime::history(&st, root);
            let mut order = match &history {
                Some(h) => st.graph.toposort(&h.op.children()),
                None => st.graph.toposort(&[root]),
            };
            if history.is_some() {
                order.push(root);
            }
            let mut nodes = Vec::with_capacity(order.len());
            for &id in &order {
                st.graph.retain(id);
                nodes.push(match &history {
                    Some(h) if id == root => h.clone(),
                    _ => st.graph.node(id).clone(),
                });
            }
            let matmuls = find_plain_matmuls(&st.graph, &order);
            let attentions: FxHashMap<NodeId, AttentionNodes> =
                attention_nodes(&st.graph, &matmuls)
                    .into_iter()
                    .map(|a| (a.products[1], a))
                    .collect();
            (order, nodes, attentions)
        };
        let handles = order
            .iter()
            .zip(&nodes)
            .map(|(&id, n)| {
                let values = loss.dim_values().clone();
                Tensor::from_node_with(id, n.shape.clone(), n.dtype, device, values)
            })
            .collect();
        let mut position = FxHashMap::with_capacity_and_hasher(order.len(), FxBuildHasher);
        let mut on_path = Vec::with_capacity(order.len());
        for (i, (&id, node)) in order.iter().zip(&nodes).enumerate() {
            position.insert(id, i as u32);
            // Operands come first in `order`, so each one's position is known here.
            on_path.push(
                targets.contains(&id)
                    || (node.dtype.is_float()
                        && node.op.operands().any(|c| on_path[position[&c] as usize])),
            );
        }
        Tape {
            order,
            position,
            nodes,
            handles,
            on_path,
            attentions,
        }
    }

    /// `id`'s position in the tape's order, `None` for a node outside it.
    fn position(&self, id: NodeId) -> Option<usize> {
        self.position.get(&id).map(|&i| i as usize)
    }

    /// The structure of a node of the tape.
    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[self.position[&id] as usize]
    }

    fn needs(&self, id: NodeId) -> bool {
        self.position(id).is_some_and(|i| self.on_path[i])
    }

    /// Every on-path node's gradient by position, from the loss's (one) down.
    fn backward(&self, loss: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let mut grads: Vec<Option<Tensor>> = vec![None; self.order.len()];
        if let Some(i) = self.position(loss.node()) {
            grads[i] = Some(loss.ones_like());
        }
        let mut halves = Halves::default();
        for (i, &id) in self.order.iter().enumerate().rev() {
            if !self.on_path[i] {
                continue;
            }
            let Some(g) = grads[i].clone() else {
                continue;
            };
            for (child, contribution) in self.vjp(id, &self.nodes[i], &g, &mut halves)? {
                let Some(c) = self.position(child).filter(|&c| self.on_path[c]) else {
                    continue;
                };
                grads[c] = Some(match grads[c].take() {
                    Some(acc) => acc.raw_binary(BinaryOp::Add, &contribution),
                    None => contribution,
                });
            }
        }
        Ok(grads)
    }

    fn tensor(&self, id: NodeId) -> &Tensor {
        &self.handles[self.position[&id] as usize]
    }

    /// The gradient contributions of node `id` (with gradient `g`) to its operands.
    fn vjp(
        &self,
        id: NodeId,
        node: &Node,
        g: &Tensor,
        halves: &mut Halves,
    ) -> Result<Vec<(NodeId, Tensor)>> {
        let out = self.tensor(id);
        Ok(match &node.op {
            Op::Leaf(_)
            | Op::Const(_)
            | Op::Index(_)
            | Op::Random(..)
            | Op::Bitcast(_)
            | Op::Argsort(_) => vec![],
            Op::Custom(call, inputs) => {
                custom_vjp(call, inputs, &|n| self.tensor(n).clone(), out, g)?
            }
            Op::Unary(op, a) => unary_vjp(*op, self.tensor(*a), out, g)
                .map(|d| vec![(*a, d)])
                .unwrap_or_default(),
            Op::Binary(op, a, b) => binary_vjp(*op, self.tensor(*a), self.tensor(*b), out, g)
                .into_iter()
                .zip([*a, *b])
                .filter_map(|(d, c)| d.map(|d| (c, d)))
                .collect(),
            Op::Ternary(TernaryOp::Where, c, a, b) => {
                let cond = self.tensor(*c);
                let zero = g.constant(0.0);
                vec![
                    (*a, cond.raw_where(g, &zero)),
                    (*b, cond.raw_where(&zero, g)),
                ]
            }
            Op::Ternary(TernaryOp::MulAdd, a, b, c) => {
                let (ta, tb) = (self.tensor(*a), self.tensor(*b));
                vec![(*a, mul(g, tb)), (*b, mul(g, ta)), (*c, g.clone())]
            }
            Op::Cast(a) => {
                let x = self.tensor(*a);
                if !x.dtype().is_float() {
                    vec![]
                } else if let Some(narrow) = halves.narrow(g, x.dtype()) {
                    vec![(*a, narrow)]
                } else {
                    let cast = g.cast_to(x.dtype());
                    halves.widened(&cast, g);
                    vec![(*a, cast)]
                }
            }
            Op::Reshape(a) => vec![(*a, g.reshape_to(self.tensor(*a).shape().clone()))],
            Op::Permute(a, perm) => {
                let mut inverse = vec![0; perm.len()];
                for (k, &p) in perm.iter().enumerate() {
                    inverse[p] = k;
                }
                let x = self.tensor(*a);
                vec![(
                    *a,
                    g.record(
                        Op::Permute(g.node(), inverse.into()),
                        g.dtype(),
                        x.shape().clone(),
                    ),
                )]
            }
            Op::Expand(a) => {
                let x = self.tensor(*a);
                let axes: Vec<usize> = (0..x.ndim())
                    .filter(|&k| x.shape()[k] != node.shape[k])
                    .collect();
                let leading = !axes.is_empty() && axes.iter().enumerate().all(|(i, &a)| a == i);
                let split = leading && g.dtype().is_float();
                let summed = split
                    .then(|| leading_in_blocks(g, ReduceOp::Sum, axes.len(), GRADIENT_ROWS_MIN))
                    .flatten();
                let sum = match summed {
                    Some(sum) => sum.reshape_to(x.shape().clone()),
                    None => reduce(g, ReduceOp::Sum, &axes, x.shape().clone()),
                };
                vec![(*a, sum)]
            }
            Op::Pad(a, pads, _) => {
                let x = self.tensor(*a);
                let ranges = pads
                    .iter()
                    .map(|&(before, _)| (before, Dim::constant(1)))
                    .collect();
                vec![(*a, shrink(g, ranges, x.shape().clone()))]
            }
            Op::Shrink(a, ranges) => vec![(*a, unshrink(g, ranges, self.tensor(*a).shape())?)],
            Op::Flip(a, axes) => {
                let x = self.tensor(*a);
                vec![(
                    *a,
                    g.record(
                        Op::Flip(g.node(), axes.clone()),
                        g.dtype(),
                        x.shape().clone(),
                    ),
                )]
            }
            Op::Reduce(op, a, axes) => {
                let attention = match self.attentions.get(&id) {
                    Some(att) => self.attention_vjp(att, node, g, halves)?,
                    None => None,
                };
                match attention {
                    Some(contributions) => contributions,
                    None => match self.matmul_vjp(node, g, halves)? {
                        Some(contributions) => contributions,
                        None => vec![(*a, reduce_vjp(*op, self.tensor(*a), out, g, axes))],
                    },
                }
            }
            // Each read element's gradient adds into the position it was read from
            // (out-of-range reads read nothing, and their gradient is dropped).
            Op::Gather(src, index, axis) => {
                let (x, index) = (self.tensor(*src), self.tensor(*index));
                vec![(*src, gather_vjp(x, index, *axis, g)?)]
            }
            // Keys of maxima are integers, which carry no gradient.
            Op::Scatter(AtomicOp::Max, ..) => Vec::new(),
            Op::Scatter(AtomicOp::Add, index, src, axis) => {
                let index = self.tensor(*index);
                let read = g.record(
                    Op::Gather(g.node(), index.node(), *axis),
                    g.dtype(),
                    index.shape().clone(),
                );
                vec![(*src, read)]
            }
        })
    }
}

impl Tape {
    /// The gradients of a product recorded by [`Tensor::matmul`] (the sum over `k` of
    /// `[..batch, m, k, n]` elementwise products of two broadcast operands), given to the
    /// operands before their broadcast as products themselves: `g · yᵀ` and `xᵀ · g`, as
    /// PyTorch computes them. The primitive rules would give the same values as reductions
    /// of broadcast products, which no library routine matches: a weight's gradient would
    /// run as a generated reduction over every token. Where an operand is shared by the
    /// whole batch (a linear layer's weight), its gradient is one product over the batch
    /// folded into rows. A half-precision product (operands widened to `f32` from the
    /// same `f16`/`bf16` dtype, as [`Tensor::matmul`] records it) gets half-precision
    /// gradient products, as in PyTorch: `g` rounded to that dtype (exact, when it is the
    /// widened gradient of the product's half output), each result given straight to the
    /// half operand the product widened.
    /// `None` for any other reduction.
    fn matmul_vjp(
        &self,
        node: &Node,
        g: &Tensor,
        halves: &mut Halves,
    ) -> Result<Option<Vec<(NodeId, Tensor)>>> {
        let Some(f) = self.factors(node, g, halves) else {
            return Ok(None);
        };
        let want = [self.needs(f.to[0]), self.needs(f.to[1])];
        self.product_grads(&f, want).map(Some)
    }

    /// The factors of a product recorded by [`Tensor::matmul`] with gradient `g` (see
    /// [`Tape::matmul_vjp`]), `None` for any other node.
    fn factors(&self, node: &Node, g: &Tensor, halves: &mut Halves) -> Option<Factors> {
        let Op::Reduce(ReduceOp::Sum, product, axes) = &node.op else {
            return None;
        };
        let Op::Binary(BinaryOp::Mul, ex, ey) = self.node(*product).op else {
            return None;
        };
        let space = self.node(*product).shape.dims().to_vec();
        let rank = space.len().checked_sub(3)?;
        if axes.as_ref() != [rank + 1] || !node.dtype.is_float() {
            return None;
        }
        let unbroadcast = |e: NodeId| match self.node(e).op {
            Op::Expand(v) => v,
            _ => e,
        };
        let (vx, vy) = (unbroadcast(ex), unbroadcast(ey));
        let (sx, sy) = (self.node(vx).shape.dims(), self.node(vy).shape.dims());
        let one = Dim::constant(1);
        let (m, k, n) = (space[rank], space[rank + 1], space[rank + 2]);
        let batch = &space[..rank];
        // Each batch dim of an operand is the batch's or 1.
        let fits = |s: &[Dim], tail: [Dim; 3]| {
            s.len() == rank + 3
                && s[rank..] == tail
                && s[..rank]
                    .iter()
                    .zip(batch)
                    .all(|(d, b)| d == b || *d == one)
        };
        if !fits(sx, [m, k, one]) || !fits(sy, [one, k, n]) {
            return None;
        }
        let matrices = |t: &Tensor, s: &[Dim], rows: Dim, cols: Dim| {
            t.reshape_to(s[..rank].iter().copied().chain([rows, cols]).collect())
        };
        let half = match (self.widened_from(vx), self.widened_from(vy)) {
            (Some(a), Some(b)) if self.node(a).dtype == self.node(b).dtype => Some((a, b)),
            _ => None,
        };
        let (x, y, g) = match half {
            Some((a, b)) => {
                let dtype = self.node(a).dtype;
                let g = halves.narrow(g, dtype).unwrap_or_else(|| g.cast_to(dtype));
                (self.tensor(a), self.tensor(b), g)
            }
            None => (self.tensor(vx), self.tensor(vy), g.clone()),
        };
        // A half product's gradients go straight to the half operands the product widened
        // (the gradient of a reshape of a widening cast is the same values, reshaped).
        let (to_x, to_y) = half.unwrap_or((vx, vy));
        Some(Factors {
            x: matrices(x, sx, m, k),
            y: matrices(y, sy, k, n),
            g: matrices(&g, batch, m, n),
            to: [to_x, to_y],
            own: [sx[..rank].to_vec(), sy[..rank].to_vec()],
            batch: batch.to_vec(),
            mkn: [m, k, n],
        })
    }

    /// The gradients of a product's factors (those `want` asks for) as [`Tape::matmul_vjp`]
    /// describes them, each for the node it goes to.
    fn product_grads(&self, f: &Factors, want: [bool; 2]) -> Result<Vec<(NodeId, Tensor)>> {
        let one = Dim::constant(1);
        let rank = f.batch.len();
        let [m, k, n] = f.mkn;
        let [sx, sy] = [&f.own[0][..], &f.own[1][..]];
        let (x, y, g) = (&f.x, &f.y, &f.g);
        let to = |t: Tensor, v: NodeId| {
            let like = self.tensor(v);
            (v, t.cast_to(like.dtype()).reshape_to(like.shape().clone()))
        };
        let shared = |s: &[Dim]| rank > 0 && s.iter().all(|d| *d == one);
        let whole = |s: &[Dim]| s == f.batch;
        let rows = f.batch.iter().fold(one, |acc, d| acc * *d);
        // `t` of shape [..batch, r, c] as [r, batch·c]: the batch moved into the columns.
        let batch_into_columns = |t: &Tensor, r: Dim, c: Dim| -> Result<Tensor> {
            let mut axes: Vec<i64> = vec![rank as i64];
            axes.extend((0..rank as i64).chain([rank as i64 + 1]));
            Ok(t.permute(&axes)?.reshape_to(Shape::new(vec![r, rows * c])))
        };
        let mut out = Vec::new();
        if want[0] {
            let dx = if shared(sx) && whole(sy) {
                batch_into_columns(g, m, n)?.matmul(&batch_into_columns(y, k, n)?.t()?)?
            } else {
                summed_to(&g.matmul(&y.transpose(-1, -2)?)?, sx, [m, k])
            };
            out.push(to(dx, f.to[0]));
        }
        if want[1] {
            let dy = if shared(sy) && whole(sx) {
                let flat = |t: &Tensor, c: Dim| t.reshape_to(Shape::new(vec![rows * m, c]));
                flat(x, k).t()?.matmul(&flat(g, n))?
            } else {
                summed_to(&x.transpose(-1, -2)?.matmul(g)?, sy, [k, n])
            };
            out.push(to(dy, f.to[1]));
        }
        Ok(out)
    }
}

/// A product's operands and gradient as matrices ([`Tape::factors`]).
struct Factors {
    /// `[..own batch, m, k]` (a half product: the half operand).
    x: Tensor,
    /// `[..own batch, k, n]`.
    y: Tensor,
    /// The product's gradient, `[..batch, m, n]` (a half product: in the half dtype).
    g: Tensor,
    /// The nodes the gradients of `x` and `y` go to.
    to: [NodeId; 2],
    /// The batch dims of `x` and `y` (each the product's or 1).
    own: [Vec<Dim>; 2],
    /// The product's batch dims.
    batch: Vec<Dim>,
    mkn: [Dim; 3],
}

/// Gradients that are casts of narrower ones, by node: a cast of such a gradient back to the
/// narrower dtype is the narrower gradient itself (the round trip is exact), with no cast
/// recorded.
#[derive(Default)]
struct Halves(FxHashMap<NodeId, Tensor>);

impl Halves {
    /// Notes that `wide` is `narrow` cast to a wider float dtype (ignored otherwise: a
    /// rounding is no round trip).
    fn widened(&mut self, wide: &Tensor, narrow: &Tensor) {
        let (w, n) = (wide.dtype(), narrow.dtype());
        if w.is_float() && n.is_float() && w.size_bytes() > n.size_bytes() {
            self.0.insert(wide.node(), narrow.clone());
        }
    }

    /// The narrower gradient `g` was cast from, if it has dtype `dtype`.
    fn narrow(&self, g: &Tensor, dtype: DType) -> Option<Tensor> {
        self.0
            .get(&g.node())
            .filter(|n| n.dtype() == dtype && n.shape() == g.shape())
            .cloned()
    }
}

impl Tape {
    /// The `f16`/`bf16` node that `v` widens to `f32` through reshapes, if it does: how
    /// [`Tensor::matmul`] records a half-precision operand.
    fn widened_from(&self, mut v: NodeId) -> Option<NodeId> {
        loop {
            let node = &self.nodes[self.position(v)?];
            match node.op {
                Op::Reshape(a) => v = a,
                Op::Cast(a) if node.dtype == DType::F32 => {
                    let from = self.nodes[self.position(a)?].dtype;
                    return matches!(from, DType::F16 | DType::BF16).then_some(a);
                }
                _ => return None,
            }
        }
    }
}

/// `t` of shape `[..batch, r, c]` summed over the batch axes where `own` (an operand's
/// batch dims) is 1.
fn summed_to(t: &Tensor, own: &[Dim], [r, c]: [Dim; 2]) -> Tensor {
    let axes: Vec<usize> = (0..own.len())
        .filter(|&a| own[a] == Dim::constant(1) && t.shape()[a] != Dim::constant(1))
        .collect();
    if axes.is_empty() {
        return t.clone();
    }
    reduce(
        t,
        ReduceOp::Sum,
        &axes,
        own.iter().copied().chain([r, c]).collect(),
    )
}

/// The gradient of `x` read by a gather at `index` along `axis`. One read per row of the
/// axis (cross-entropy's target logit) touches each position of the row at most once, so
/// the gradient is `g` where the position equals the index, else 0: a comparison fused
/// into whatever consumes it, with no buffer. Otherwise reads may repeat a position, and
/// their gradients add up in a scatter-add.
fn gather_vjp(x: &Tensor, index: &Tensor, axis: usize, g: &Tensor) -> Result<Tensor> {
    if index.shape()[axis].as_const() == Some(1) {
        let position = Tensor::record_on(
            x.device(),
            Op::Index(axis),
            index.dtype(),
            x.shape().clone(),
        );
        let at = index
            .broadcast_to_shape(x.shape())
            .raw_binary(BinaryOp::Eq, &position);
        let zero = g.constant(0.0);
        return Ok(at.raw_where(
            &g.broadcast_to_shape(x.shape()),
            &zero.broadcast_to_shape(x.shape()),
        ));
    }
    let n = x.shape()[axis];
    Ok(crate::ops::scatter_add_into_zeros(index, g, axis, n)?.cast_to(x.dtype()))
}

fn mul(a: &Tensor, b: &Tensor) -> Tensor {
    a.raw_binary(BinaryOp::Mul, b)
}

fn div(a: &Tensor, b: &Tensor) -> Tensor {
    a.raw_binary(BinaryOp::Div, b)
}

fn neg(a: &Tensor) -> Tensor {
    a.raw_unary(UnaryOp::Neg)
}

fn scaled(a: &Tensor, factor: f64) -> Tensor {
    mul(a, &a.constant(factor))
}

/// A reduction of `x` over `axes` to `shape` (those axes size 1).
fn reduce(x: &Tensor, op: ReduceOp, axes: &[usize], shape: Shape) -> Tensor {
    if axes.is_empty() {
        return x.clone();
    }
    x.record(Op::Reduce(op, x.node(), axes.into()), x.dtype(), shape)
}

/// The gradient through a unary op, `None` where it is zero (piecewise-constant ops).
fn unary_vjp(op: UnaryOp, x: &Tensor, out: &Tensor, g: &Tensor) -> Option<Tensor> {
    use std::f64::consts::{LN_2, PI};
    Some(match op {
        UnaryOp::Neg => neg(g),
        UnaryOp::Abs => mul(g, &x.raw_unary(UnaryOp::Sign)),
        UnaryOp::Reciprocal => neg(&mul(g, &mul(out, out))),
        UnaryOp::Sqrt => div(&scaled(g, 0.5), out),
        UnaryOp::Rsqrt => scaled(&mul(g, &mul(out, &mul(out, out))), -0.5),
        UnaryOp::Exp => mul(g, out),
        UnaryOp::Exp2 => scaled(&mul(g, out), LN_2),
        UnaryOp::Log => div(g, x),
        UnaryOp::Log2 => div(g, &scaled(x, LN_2)),
        UnaryOp::Sin => mul(g, &x.raw_unary(UnaryOp::Cos)),
        UnaryOp::Cos => neg(&mul(g, &x.raw_unary(UnaryOp::Sin))),
        UnaryOp::Tan => mul(
            g,
            &out.constant(1.0).raw_binary(BinaryOp::Add, &mul(out, out)),
        ),
        UnaryOp::Tanh => mul(
            g,
            &out.constant(1.0).raw_binary(BinaryOp::Sub, &mul(out, out)),
        ),
        UnaryOp::Erf => {
            let gauss = neg(&mul(x, x)).raw_unary(UnaryOp::Exp);
            scaled(&mul(g, &gauss), 2.0 / PI.sqrt())
        }
        UnaryOp::Sign
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Round
        | UnaryOp::Trunc
        | UnaryOp::Not
        | UnaryOp::IsNan
        | UnaryOp::IsInf => return None,
    })
}

/// The gradients through a binary op to each operand, `None` where there is none.
fn binary_vjp(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
    g: &Tensor,
) -> [Option<Tensor>; 2] {
    if !a.dtype().is_float() {
        return [None, None];
    }
    let zero = g.constant(0.0);
    match op {
        BinaryOp::Add => [Some(g.clone()), Some(g.clone())],
        BinaryOp::Sub => [Some(g.clone()), Some(neg(g))],
        BinaryOp::Mul => [Some(mul(g, b)), Some(mul(g, a))],
        BinaryOp::Div => [Some(div(g, b)), Some(neg(&div(&mul(g, out), b)))],
        // fmod: a - trunc(a / b) * b.
        BinaryOp::Rem => [
            Some(g.clone()),
            Some(neg(&mul(g, &div(a, b).raw_unary(UnaryOp::Trunc)))),
        ],
        BinaryOp::Pow => {
            // PyTorch's conventions: no base gradient where the exponent is 0, no
            // exponent gradient where the base is 0 and the exponent is not negative.
            let b_minus_1 = b.raw_binary(BinaryOp::Sub, &b.constant(1.0));
            let base = mul(g, &mul(b, &a.raw_binary(BinaryOp::Pow, &b_minus_1)));
            let exp_zero = b.raw_binary(BinaryOp::Eq, &zero);
            let base = exp_zero.raw_where(&zero, &base);
            let exponent = mul(g, &mul(out, &a.raw_unary(UnaryOp::Log)));
            let no_exp = a
                .raw_binary(BinaryOp::Eq, &zero)
                .raw_binary(BinaryOp::And, &b.raw_binary(BinaryOp::Ge, &zero));
            [Some(base), Some(no_exp.raw_where(&zero, &exponent))]
        }
        // Ties share the gradient equally, like torch.maximum/minimum.
        BinaryOp::Max | BinaryOp::Min => {
            let wins = if op == BinaryOp::Max {
                BinaryOp::Gt
            } else {
                BinaryOp::Lt
            };
            let half = scaled(g, 0.5);
            let tie = a.raw_binary(BinaryOp::Eq, b);
            let share = |x: &Tensor, y: &Tensor| {
                let won = x.raw_binary(wins, y).raw_where(g, &zero);
                tie.raw_where(&half, &won)
            };
            [Some(share(a, b)), Some(share(b, a))]
        }
        _ => [None, None],
    }
}

/// The gradient through a reduction of `x` to `out` over `axes`.
fn reduce_vjp(op: ReduceOp, x: &Tensor, out: &Tensor, g: &Tensor, axes: &[usize]) -> Tensor {
    let shape = x.shape();
    let g_full = g.broadcast_to_shape(shape);
    match op {
        ReduceOp::Sum => g_full,
        // Ties share the gradient equally, like torch.amax / max without dim.
        ReduceOp::Max | ReduceOp::Min => {
            let hit = x
                .raw_binary(BinaryOp::Eq, &out.broadcast_to_shape(shape))
                .cast_to(x.dtype());
            let count = reduce(&hit, ReduceOp::Sum, axes, out.shape().clone());
            mul(&hit, &div(g, &count).broadcast_to_shape(shape))
        }
        // The product of the other elements: out / x without zeros; with exactly one zero
        // only that element has a gradient (the product of the rest); with more, none.
        ReduceOp::Prod => {
            let zero = x.constant(0.0);
            let is_zero = x.raw_binary(BinaryOp::Eq, &zero);
            let nonzero = is_zero.raw_where(&x.constant(1.0), x);
            let prod_nonzero = reduce(&nonzero, ReduceOp::Prod, axes, out.shape().clone());
            let zeros = reduce(
                &is_zero.cast_to(x.dtype()),
                ReduceOp::Sum,
                axes,
                out.shape().clone(),
            )
            .broadcast_to_shape(shape);
            let others_if_none = div(&out.broadcast_to_shape(shape), x);
            let one_zero = zeros
                .raw_binary(BinaryOp::Eq, &zero.constant(1.0))
                .raw_binary(BinaryOp::And, &is_zero);
            let others_if_one = one_zero.raw_where(&prod_nonzero.broadcast_to_shape(shape), &zero);
            let others = zeros
                .raw_binary(BinaryOp::Eq, &zero)
                .raw_where(&others_if_none, &others_if_one);
            mul(&g_full, &others)
        }
    }
}

/// The gradient of a shrink: `g` placed back at the kept positions, zeros elsewhere.
fn unshrink(g: &Tensor, ranges: &[(Dim, Dim)], input: &Shape) -> Result<Tensor> {
    let zero = Scalar::zero(g.dtype());
    let mut t = g.clone();
    for (axis, &(start, step)) in ranges.iter().enumerate() {
        let (len, kept) = (input[axis], t.shape()[axis]);
        if start.as_const() == Some(0) && step.as_const() == Some(1) && kept == len {
            continue;
        }
        let step = step.as_const().filter(|&s| s >= 1).ok_or_else(|| {
            Error::Internal(format!(
                "grad of a shrink with step {step} along axis {axis}"
            ))
        })?;
        if step > 1 {
            // Interleave: each kept element followed by step - 1 zeros.
            let mut dims = t.shape().dims().to_vec();
            dims.insert(axis + 1, Dim::constant(1));
            let split = t.reshape_to(Shape::new(dims.clone()));
            let spread = pad_axis(
                &split,
                axis + 1,
                Dim::constant(0),
                Dim::constant(step - 1),
                zero,
            );
            dims.remove(axis + 1);
            dims[axis] = kept * Dim::constant(step);
            t = spread.reshape_to(Shape::new(dims));
        }
        // Now t covers [start, start + kept * step) of the axis; fit it to the input.
        let covered = t.shape()[axis];
        let after = len - start - covered;
        match after.as_const() {
            Some(a) if a < 0 => {
                let mut dims = t.shape().dims().to_vec();
                dims[axis] = covered + Dim::constant(a);
                let keep_front = vec![(Dim::constant(0), Dim::constant(1)); t.ndim()];
                t = shrink(&t, keep_front, Shape::new(dims));
                t = pad_axis(&t, axis, start, Dim::constant(0), zero);
            }
            _ => t = pad_axis(&t, axis, start, after, zero),
        }
    }
    Ok(t)
}

/// The gradients a custom kernel's backward gives its inputs, checked against them.
fn custom_vjp(
    call: &tessel_graph::CustomKernel,
    inputs: &[NodeId],
    tensor: &dyn Fn(NodeId) -> Tensor,
    out: &Tensor,
    g: &Tensor,
) -> Result<Vec<(NodeId, Tensor)>> {
    let name = &call.kernel().name;
    let Some(backward) = call
        .extra()
        .and_then(|e| e.downcast_ref::<crate::ops::Backward>())
    else {
        return Err(Error::InvalidArgument {
            op: "grad",
            reason: format!(
                "the custom kernel `{name}` has no backward; give it one with \
                 CustomOp::with_backward, or detach its output"
            ),
        });
    };
    let xs: Vec<Tensor> = inputs.iter().map(|&n| tensor(n)).collect();
    let (outs, gs) = if call.outputs().is_empty() {
        (vec![out.clone()], vec![g.clone()])
    } else {
        (
            crate::ops::split_outputs(out, call.outputs()),
            crate::ops::split_outputs(g, call.outputs()),
        )
    };
    let grads = (backward.0)(&xs, &outs, &gs)?;
    if grads.len() != xs.len() {
        return Err(Error::InvalidArgument {
            op: "grad",
            reason: format!(
                "the backward of custom kernel `{name}` gave {} gradients for {} inputs",
                grads.len(),
                xs.len()
            ),
        });
    }
    let mut out = Vec::new();
    for (k, (x, dx)) in xs.iter().zip(grads).enumerate() {
        let Some(dx) = dx else { continue };
        if dx.shape() != x.shape() || dx.dtype() != x.dtype() {
            return Err(Error::InvalidArgument {
                op: "grad",
                reason: format!(
                    "the backward of custom kernel `{name}` gave input {k} a gradient of \
                     shape {} and dtype {}, but the input is {} of {}",
                    dx.shape(),
                    dx.dtype(),
                    x.shape(),
                    x.dtype()
                ),
            });
        }
        out.push((inputs[k], dx));
    }
    Ok(out)
}
