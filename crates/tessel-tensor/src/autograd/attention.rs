//! The gradient of an attention, `dropout(softmax(x)) @ v` with `x` the scaled, masked
//! scores `q kᵀ`, recorded in flash attention's form.
//!
//! The primitive rules would carry the output's gradient back through the softmax's
//! quotient rule over `[l, s]` matrices that only a generated kernel can fuse. Instead, at
//! the second product (where the tape finds an attention through `tessel_graph`'s matcher),
//! the gradient of `x` is written from the softmax's closed form, with the row sums of
//! `dp · p` taken from the output (`delta = sum(dO · out)`, since `out = p v`) and the
//! probabilities recomputed from the row log-sum-exp:
//!
//! ```text
//! dp    = dO @ vᵀ,  then where(keep, dp · c, 0) with dropout
//! lse   = max + log(sum)          (the softmax's own detached max and row sum)
//! dx    = exp(x - lse) · (dp - delta)
//! ```
//!
//! and the gradients of `q` and `k` are the first product's, for `dx · scale`. This is the
//! form `tessel_graph`'s `attention_backward.rs` matches into fused kernels; unfused it
//! computes what the primitive rules do, in fewer passes. The values' gradient is the second
//! product's own. The rewrite applies where the mask takes no gradient (a learned additive
//! mask keeps the primitive rules).

use tessel_graph::{AttentionNodes, Node, NodeId, ReduceOp};
use tessel_shape::{BinaryOp, Dim, Shape, UnaryOp};

use super::{Halves, Tape, mul, reduce, scaled};
use crate::tensor::Tensor;
use tessel_runtime::Result;

impl Tape {
    /// The contributions of the attention whose second product is `node` (the attention
    /// `a`), with the output's gradient `g`; `None` where the primitive rules apply
    /// instead.
    pub(super) fn attention_vjp(
        &self,
        a: &AttentionNodes,
        node: &Node,
        g: &Tensor,
        halves: &mut Halves,
    ) -> Result<Option<Vec<(NodeId, Tensor)>>> {
        if a.mask.is_some_and(|m| self.needs(m)) {
            return Ok(None);
        }
        let [qk, pv] = a.products;
        let Some(values) = self.factors(node, g, halves) else {
            return Ok(None);
        };
        let scores = self.tensor(a.scores);
        let qk_node = self.node(qk);
        // `d_probs` (the probabilities' gradient) has `x`'s shape.
        if values.batch.len() + 2 != scores.ndim()
            || self.tensor(a.factors[2]).shape() != scores.shape()
        {
            return Ok(None);
        }
        let wants_scores = self.needs(a.scores);
        let mut out = self.product_grads(&values, [false, self.needs(values.to[1])])?;
        if !wants_scores {
            return Ok(Some(out));
        }
        // The softmax's dtype: f32 for half products.
        let wide = scores.dtype();
        let d_probs = values.g.matmul(&values.y.transpose(-1, -2)?)?.cast_to(wide);
        let d_probs = match a.keep {
            Some((keep, factor)) => {
                let zero = d_probs.constant(0.0);
                self.tensor(keep)
                    .raw_where(&scaled(&d_probs, factor.to_f64()), &zero)
            }
            None => d_probs,
        };
        // delta = sum(dO · out) per row, from the product's `[.., l, 1, ev]` gradient and
        // output as recorded (a half product's rounded one: reading its `f32` sum too would
        // leave it no longer a half product), in the softmax's dtype.
        let rows: Shape = scores
            .shape()
            .iter()
            .copied()
            .take(scores.ndim() - 1)
            .chain([Dim::constant(1)])
            .collect();
        let last = node.shape.ndim() - 1;
        let mut kept = node.shape.dims().to_vec();
        kept[last] = Dim::constant(1);
        let output = self.tensor(*a.writes.first().unwrap_or(&pv));
        let product = mul(&g.cast_to(wide), &output.cast_to(wide));
        let delta = reduce(&product, ReduceOp::Sum, &[last], Shape::new(kept)).reshape_to(rows);
        let lse = self.tensor(a.row_max).raw_binary(
            BinaryOp::Add,
            &self.tensor(a.row_sum).raw_unary(UnaryOp::Log),
        );
        let probs = scores
            .raw_binary(BinaryOp::Sub, &lse.broadcast_to_shape(scores.shape()))
            .raw_unary(UnaryOp::Exp);
        let diff = d_probs.raw_binary(BinaryOp::Sub, &delta.broadcast_to_shape(scores.shape()));
        let d_scores = scaled(&mul(&probs, &diff), a.op.scale.to_f64());
        let d_product = d_scores.reshape_to(qk_node.shape.clone());
        let Some(products) = self.factors(qk_node, &d_product, halves) else {
            return Ok(None);
        };
        let want = [self.needs(products.to[0]), self.needs(products.to[1])];
        out.extend(self.product_grads(&products, want)?);
        Ok(Some(out))
    }
}
