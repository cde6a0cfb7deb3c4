//! What recording folds on the spot: a constant cast without loss is a constant of the
//! new dtype, and the triangle of an all-true mask is the index comparison itself (so a
//! causal mask records as five nodes, not nine), with the same values.

use tessel_graph::Op;
use tessel_tensor::{DType, Result, Tensor, inspect};

#[test]
fn a_constant_cast_without_loss_is_a_constant() -> Result<()> {
    let x = Tensor::randn([3, 4], DType::F32)?;
    let ones = x.ones_like().cast(DType::Bool);
    let (graph, targets) = inspect::graph_of(&[&ones]);
    assert_eq!(graph.len(), 1);
    assert!(
        matches!(graph.node(targets[0]).op, Op::Const(c) if c == tessel_shape::Scalar::Bool(true))
    );
    // 0.1 has no exact bf16: the cast stays, for the device to round.
    let tenth = x.full_like(0.1f32).cast(DType::BF16);
    let (graph, targets) = inspect::graph_of(&[&tenth]);
    assert!(matches!(graph.node(targets[0]).op, Op::Cast(_)));
    assert_eq!(
        tenth.cast(DType::F32).to_vec::<f32>()?,
        vec![0.100097656; 12]
    );
    Ok(())
}

#[test]
fn the_triangle_of_an_all_true_mask_is_the_comparison() -> Result<()> {
    let x = Tensor::randn([2, 3, 4], DType::F32)?;
    let hidden = x.ones_like().cast(DType::Bool).triu(1)?;
    let (graph, targets) = inspect::graph_of(&[&hidden]);
    assert_eq!(graph.len(), 5, "index, index, sub, bound, compare");
    assert!(matches!(graph.node(targets[0]).op, Op::Binary(..)));
    let want: Vec<bool> = (0..24).map(|i| (i % 4) > (i / 4) % 3).collect();
    assert_eq!(hidden.to_vec::<bool>()?, want);
    // A mask that is not all true keeps the `where`.
    let some = x.gt(0.0)?.tril(0)?;
    let picked = x.gt(0.0)?.to_vec::<bool>()?;
    let want: Vec<bool> = (0..24)
        .map(|i| picked[i] && (i % 4) <= (i / 4) % 3)
        .collect();
    assert_eq!(some.to_vec::<bool>()?, want);
    Ok(())
}
