//! Which epilogues the graph layer finds above a matrix product (`tessel_graph::find_matmuls`
//! on graphs recorded through the public API): a bias and an activation are recognized by
//! what they compute, in `f32` and between the casts of a `bf16` layer, and GELU's two forms
//! (erf and tanh) are told apart.

use tessel_graph::find_matmuls;
use tessel_ir::{Activation, Epilogue, VendorOp};
use tessel_tensor::{DType, Result, Tensor, inspect};

/// The epilogues of the matches writing `y`'s node.
fn epilogues_writing(y: &Tensor) -> Vec<Epilogue> {
    let (graph, targets) = inspect::graph_of(&[y]);
    find_matmuls(&graph, &graph.toposort(&targets))
        .into_iter()
        .filter(|m| m.writes.contains(&targets[0]))
        .filter_map(|m| match m.op {
            VendorOp::Matmul(op) => Some(op.epilogue),
            VendorOp::Attention(_) | VendorOp::AttentionBackward(_) => None,
        })
        .collect()
}

fn with(bias: bool, activation: Activation) -> Epilogue {
    Epilogue { bias, activation }
}

#[test]
fn a_linear_layers_bias_and_activation_are_epilogues() -> Result<()> {
    for dtype in [DType::F32, DType::BF16] {
        let x = Tensor::randn([2, 5, 8], dtype)?;
        let w = Tensor::randn([12, 8], dtype)?;
        let b = Tensor::randn([12], dtype)?;
        Tensor::realize_all(&[&x, &w, &b])?;
        let linear = (&x.matmul(&w.t()?)? + &b)?;
        assert_eq!(
            epilogues_writing(&linear),
            [with(true, Activation::Identity)],
            "{dtype}"
        );
        assert_eq!(
            epilogues_writing(&linear.relu()),
            [with(true, Activation::Relu)],
            "{dtype}"
        );
        assert_eq!(
            epilogues_writing(&linear.gelu_tanh()),
            [with(true, Activation::GeluTanh)],
            "{dtype}"
        );
        assert_eq!(
            epilogues_writing(&linear.gelu()),
            [with(true, Activation::Gelu)],
            "{dtype}: erf GELU"
        );
        assert_eq!(
            epilogues_writing(&x.matmul(&w.t()?)?.gelu()),
            [with(false, Activation::Gelu)],
            "{dtype}: erf GELU"
        );
        assert_eq!(
            epilogues_writing(&x.matmul(&w.t()?)?.gelu_tanh()),
            [with(false, Activation::GeluTanh)],
            "{dtype}"
        );
        // A bias along the other axis is not a routine's bias.
        let c = Tensor::randn([5, 1], dtype)?;
        assert_eq!(
            epilogues_writing(&(&x.matmul(&w.t()?)? + &c)?),
            [],
            "{dtype}: column bias"
        );
    }
    Ok(())
}
