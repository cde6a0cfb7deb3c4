//! ResNets against torchvision's own `ResNet` (basic and bottleneck blocks) on the same
//! state dict, in evaluation mode: logits in f32 and bf16, and the architecture read from
//! the weights. One test per model and dtype, so test runners spread them.

mod common;

use common::{assert_close, assert_half_close, dir, reference};
use tessel_models::{ResNet, ResNetBlock};
use tessel_tensor::{DType, Device};

fn check(name: &str, dtype: DType, block: ResNetBlock, layers: [usize; 4]) {
    let r = reference(name);
    let model = ResNet::from_file(dir(name), dtype, &Device::default()).unwrap();
    assert_eq!(
        (model.config().block, model.config().layers),
        (block, layers)
    );
    let logits = model.forward(&r["images"].cast(dtype)).unwrap();
    assert_eq!(logits.dtype(), dtype);
    if dtype == DType::F32 {
        assert_close(&format!("{name} f32 logits"), &logits, &r["logits"], 1e-4);
    } else {
        let what = format!("{name} {dtype} logits");
        assert_half_close(&what, &logits, &r["logits_bf16"], &r["logits"], 2.0);
    }
}

#[test]
fn resnet18_matches_torchvision_in_f32() {
    check("resnet18", DType::F32, ResNetBlock::Basic, [2, 2, 2, 2]);
}

#[test]
fn resnet18_matches_torchvision_in_bf16() {
    check("resnet18", DType::BF16, ResNetBlock::Basic, [2, 2, 2, 2]);
}

#[test]
fn resnet50_matches_torchvision_in_f32() {
    check(
        "resnet50",
        DType::F32,
        ResNetBlock::Bottleneck,
        [3, 4, 6, 3],
    );
}

#[test]
fn resnet50_matches_torchvision_in_bf16() {
    check(
        "resnet50",
        DType::BF16,
        ResNetBlock::Bottleneck,
        [3, 4, 6, 3],
    );
}
