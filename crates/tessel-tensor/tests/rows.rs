//! The row kernelizer on graphs that tensors record: layer norms, softmaxes, biases and
//! masks of a transformer block fuse into the row kernels around the library products.

use tessel_graph::{find_matmuls, kernelize_rows, materialized_for};
use tessel_tensor::{DType, Result, Tensor, inspect};

fn layer_norm(x: &Tensor) -> Result<Tensor> {
    let centered = (x - &x.mean(&[-1], true)?)?;
    let var = (&centered * &centered)?.mean(&[-1], true)?;
    &centered * &(&var + 1e-5)?.rsqrt()
}

/// In a causal attention block, both layer norms and the attention softmax become row
/// kernels in the rows partition: the masked softmax too, whose mask is built from
/// coordinates.
#[test]
fn a_blocks_norms_and_softmax_fuse_as_rows() -> Result<()> {
    let (s, e) = (256, 256);
    let x = Tensor::randn([s, e], DType::F32)?;
    let w = Tensor::randn([e, e], DType::F32)?;
    let q = layer_norm(&x)?.matmul(&w)?;
    let scores = q.matmul(&q.t()?)?;
    let hidden = scores.ones_like().cast(DType::Bool).triu(1)?;
    let probs = scores
        .masked_fill(&hidden, f64::NEG_INFINITY)?
        .softmax(-1)?;
    let out = layer_norm(&probs.matmul(&q)?)?;
    let (graph, targets) = inspect::graph_of(&[&out]);
    let separate = materialized_for(&find_matmuls(&graph, &graph.toposort(&targets)));
    let rows = kernelize_rows(&graph, &targets, &separate)
        .unwrap()
        .expect("row statistics to fuse");
    let names: Vec<&str> = rows
        .kernels
        .iter()
        .map(|k| k.kernel.name.as_str())
        .collect();
    assert_eq!(
        names.iter().filter(|n| n.ends_with("_row")).count(),
        3,
        "{names:?}"
    );
    Ok(())
}

/// A pre-norm GPT block between library products: every bias, the scores' scaling and
/// causal mask, and the residual adds fuse into the kernels reading them (the head
/// copies, the softmax and layer-norm row kernels, GELU), so each kernel writes one
/// value and none is a bare elementwise pass over a product.
#[test]
fn a_blocks_biases_and_masks_fuse_into_their_readers() -> Result<()> {
    let (n, s, e, heads) = (1i64, 256i64, 256i64, 4i64);
    let r = |d: &[usize]| Tensor::randn(d, DType::F32);
    let x = r(&[1, 256, 256])?;
    let (w_qkv, b_qkv, w_o, b_o) = (r(&[256, 768])?, r(&[768])?, r(&[256, 256])?, r(&[256])?);
    let (w_up, b_up, w_down, b_down) =
        (r(&[256, 1024])?, r(&[1024])?, r(&[1024, 256])?, r(&[256])?);
    Tensor::realize_all(&[
        &x, &w_qkv, &b_qkv, &w_o, &b_o, &w_up, &b_up, &w_down, &b_down,
    ])?;
    let qkv = (&layer_norm(&x)?.matmul(&w_qkv)? + &b_qkv)?;
    let split = |i: i64| -> Result<Tensor> {
        qkv.narrow(2, i * e, e)?
            .reshape(&[n, s, heads, e / heads])?
            .permute(&[0, 2, 1, 3])
    };
    let scores = (split(0)?.matmul(&split(1)?.transpose(-2, -1)?)? * 0.125)?;
    let hidden = scores.ones_like().cast(DType::Bool).triu(1)?;
    let probs = scores
        .masked_fill(&hidden, f64::NEG_INFINITY)?
        .softmax(-1)?;
    let merged = probs
        .matmul(&split(2)?)?
        .permute(&[0, 2, 1, 3])?
        .reshape(&[n, s, e])?;
    let h = (&x + &(&merged.matmul(&w_o)? + &b_o)?)?;
    let up = (&layer_norm(&h)?.matmul(&w_up)? + &b_up)?.gelu();
    let out = (&h + &(&up.matmul(&w_down)? + &b_down)?)?;
    let (graph, targets) = inspect::graph_of(&[&out]);
    let separate = materialized_for(&find_matmuls(&graph, &graph.toposort(&targets)));
    let rows = kernelize_rows(&graph, &targets, &separate)
        .unwrap()
        .expect("row statistics to fuse");
    let kernels: Vec<(&str, usize)> = rows
        .kernels
        .iter()
        .map(|k| (k.kernel.name.as_str(), k.writes.len()))
        .collect();
    assert!(kernels.iter().all(|k| k.1 == 1), "{kernels:?}");
    // Six products, three head copies, the head merge, two layer norms, the softmax,
    // GELU and the output: fifteen kernels.
    assert_eq!(kernels.len(), 15, "{kernels:?}");
    Ok(())
}
