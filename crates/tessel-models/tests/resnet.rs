//! ResNets against torchvision's own `ResNet` (basic and bottleneck blocks) on the same
//! state dict, in evaluation mode: logits in f32 and bf16, and the architecture read from
//! the weights.

mod common;

use common::{assert_close, dir, reference};
use tessel_models::{ResNet, ResNetBlock};
use tessel_tensor::{DType, Device};

#[test]
fn resnet_logits_match_torchvision_in_f32_and_bf16() {
    for (name, block, layers) in [
        ("resnet18", ResNetBlock::Basic, [2, 2, 2, 2]),
        ("resnet50", ResNetBlock::Bottleneck, [3, 4, 6, 3]),
    ] {
        let r = reference(name);
        let model = ResNet::from_file(dir(name), DType::F32, &Device::default()).unwrap();
        assert_eq!(
            (model.config().block, model.config().layers),
            (block, layers)
        );
        let logits = model.forward(&r["images"]).unwrap();
        assert_close(&format!("{name} f32 logits"), &logits, &r["logits"], 1e-4);

        let model = ResNet::from_file(dir(name), DType::BF16, &Device::default()).unwrap();
        let logits = model.forward(&r["images"].cast(DType::BF16)).unwrap();
        assert_close(
            &format!("{name} bf16 logits"),
            &logits,
            &r["logits_bf16"],
            5e-2,
        );
    }
}
