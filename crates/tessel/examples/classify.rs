//! Image classification with a torchvision ResNet state dict saved as safetensors:
//!
//! ```sh
//! python -c "import torchvision, safetensors.torch as st; st.save_file(torchvision.models.resnet50(weights='DEFAULT').state_dict(), 'resnet50.safetensors')"
//! cargo run --release --example classify -- resnet50.safetensors
//! cargo run --release --example classify -- crates/tessel-models/tests/fixtures/resnet18
//! ```
//!
//! Classifies a seeded random batch of 224×224 images (or `--size N`) and prints the top 5
//! classes of the first and the images/s of the batch.

use std::time::Instant;

use tessel::models::ResNet;
use tessel::{DType, Device, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        return Err("usage: classify WEIGHTS.safetensors|MODEL_DIR [--size N] [--batch B] [--dtype f32|bf16]".into());
    };
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let size: usize = flag("--size").map_or(Ok(224), |s| s.parse())?;
    let batch: usize = flag("--batch").map_or(Ok(8), |s| s.parse())?;
    let dtype = match flag("--dtype").map_or("f32", String::as_str) {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        other => return Err(format!("--dtype {other}: use f32 or bf16").into()),
    };
    let model = ResNet::from_file(path, dtype, &Device::default())?;
    eprintln!("{:?}", model.config());
    Tensor::manual_seed(0);
    let images = Tensor::randn([batch, 3, size, size], DType::F32)?.cast(dtype);
    let started = Instant::now();
    let logits = model.forward(&images)?;
    logits.realize()?;
    let first = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let logits = model.forward(&images)?;
    let probs = logits.cast(DType::F32).softmax(-1)?;
    let (p, i) = probs.narrow(0, 0, 1)?.topk(5, -1, true, true)?;
    let (p, i) = (p.to_vec::<f32>()?, i.to_vec::<i64>()?);
    let steady = started.elapsed().as_secs_f64();
    for (class, prob) in i.iter().zip(&p) {
        println!("class {class:4}: {prob:.4}");
    }
    eprintln!(
        "batch of {batch}: first call {first:.2} s (plan and compile), then {steady:.3} s ({:.1} images/s)",
        batch as f64 / steady
    );
    Ok(())
}
