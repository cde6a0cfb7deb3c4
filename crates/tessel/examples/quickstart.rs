//! A two-layer MLP forward pass on random data: `cargo run --release --example quickstart`.
//!
//! Set `TESSEL_LOG=debug` to see the kernels Tessel builds, their IR and their source.

use tessel::prelude::*;

fn main() -> Result<()> {
    init_logging();
    Tensor::manual_seed(42);

    // A batch of 64 inputs with 128 features, a hidden layer of 256, 10 classes.
    let x = Tensor::randn([64, 128], DType::F32)?;
    let w1 = (Tensor::randn([128, 256], DType::F32)? * (1.0 / 128f64.sqrt()))?;
    let b1 = Tensor::zeros([256], DType::F32);
    let w2 = (Tensor::randn([256, 10], DType::F32)? * (1.0 / 256f64.sqrt()))?;
    let b2 = Tensor::zeros([10], DType::F32);

    let hidden = (x.matmul(&w1)? + &b1)?.relu();
    let logits = (hidden.matmul(&w2)? + &b2)?;
    let probs = logits.softmax(-1)?;

    let report = probs.realize()?;
    println!("x: {}  w1: {}  w2: {}", x.shape(), w1.shape(), w2.shape());
    println!("probs: {} on {}", probs.shape(), probs.device());
    let p: Vec<f32> = probs.to_vec()?;
    println!("first row: {:?}", &p[..10]);
    println!(
        "row sums: {:?}",
        probs.sum(&[-1], false)?.to_vec::<f32>()?[..4].to_vec()
    );
    println!(
        "predicted classes: {:?}",
        &probs.argmax(-1, false)?.to_vec::<i64>()?[..8]
    );
    println!(
        "kernels run: {} ({} compiled, {} from the kernel cache)",
        report.kernels, report.compiled, report.cached
    );
    Ok(())
}

/// `TESSEL_LOG=debug` turns on Tessel's tracing output.
fn init_logging() {
    if let Ok(filter) = std::env::var("TESSEL_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}
