//! The measured plan of causal self-attention, as Graphviz DOT on stdout:
//! `cargo run --release --example inspect_plan > plan.dot && dot -Tsvg plan.dot > plan.svg`.
//!
//! Every value is a node; every program the planner compiled for it (generated kernels
//! from each form of the e-graph and each partition, library matrix products) is a box
//! with its measured time, and the chosen ones are filled. `TESSEL_DEVICE=cuda` (with the
//! `cuda` feature) shows the plan on a GPU; `TESSEL_LOG=tessel::plan=info` prints the same
//! table as text.

use tessel::inspect;
use tessel::prelude::*;

fn main() -> Result<()> {
    if let Ok(filter) = std::env::var("TESSEL_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    Tensor::manual_seed(7);
    let (batch, seq, heads, head_dim) = (2, 128, 4, 32);
    let embed = heads * head_dim;
    let x = Tensor::randn([batch, seq, embed], DType::F32)?;
    let w_qkv = (Tensor::randn([embed, 3 * embed], DType::F32)? * (1.0 / (embed as f64).sqrt()))?;
    Tensor::realize_all(&[&x, &w_qkv])?;

    // [batch, seq, 3, heads, head_dim] → q, k, v as [batch, heads, seq, head_dim].
    let qkv =
        x.matmul(&w_qkv)?
            .reshape(&[batch as i64, seq as i64, 3, heads as i64, head_dim as i64])?;
    let part = |i: i64| -> Result<Tensor> {
        qkv.narrow(2, i, 1)?
            .reshape(&[batch as i64, seq as i64, heads as i64, head_dim as i64])?
            .permute(&[0, 2, 1, 3])
    };
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let scores = (q.matmul(&k.transpose(-2, -1)?)? * (1.0 / (head_dim as f64).sqrt()))?;
    let hidden = scores.ones_like().cast(DType::Bool).triu(1)?;
    let probs = scores
        .masked_fill(&hidden, f64::NEG_INFINITY)?
        .softmax(-1)?;
    let out = probs.matmul(&v)?;

    let dot = inspect::plan_to_dot(&[&out])?.expect("out is not realized yet");
    println!("{dot}");
    let report = out.realize()?;
    eprintln!(
        "attention on {}: {} kernels, {} prepared by the realize (the plan was cached)",
        out.device(),
        report.kernels,
        report.kernels_prepared()
    );
    Ok(())
}
