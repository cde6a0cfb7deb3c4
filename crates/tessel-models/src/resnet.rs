//! ResNet-18/34/50 (and any depth or width of the same family) with torchvision's
//! state-dict names (`layer1.0.conv1.weight`, `layer2.0.downsample.0.weight`, ...),
//! torchvision's v1.5 layout (a bottleneck's stride on its 3×3 conv).

use std::path::Path;

use tessel_nn::{BatchNorm2d, BatchNormOptions, Conv2d, Linear, Module, ParamOptions, Weights};
use tessel_tensor::{ConvOptions, DType, Device, Padding, PoolOptions, Result, Tensor};

use crate::config::unsupported;

/// The residual block of a ResNet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResNetBlock {
    /// Two 3×3 convolutions (ResNet-18, -34).
    Basic,
    /// 1×1, 3×3, 1×1 with 4× wider outputs (ResNet-50, -101, -152).
    Bottleneck,
}

impl ResNetBlock {
    fn expansion(self) -> usize {
        match self {
            ResNetBlock::Basic => 1,
            ResNetBlock::Bottleneck => 4,
        }
    }
}

/// A ResNet's shape: block kind, blocks per stage, stage widths, stem width, classes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResNetConfig {
    /// The block kind.
    pub block: ResNetBlock,
    /// Blocks in each of the four stages (`[2, 2, 2, 2]` for ResNet-18).
    pub layers: [usize; 4],
    /// Each stage's width before expansion (`[64, 128, 256, 512]` in torchvision).
    pub widths: [usize; 4],
    /// The stem convolution's output channels (64 in torchvision).
    pub stem_width: usize,
    /// Outputs of the classifier.
    pub num_classes: usize,
}

impl ResNetConfig {
    fn torchvision(block: ResNetBlock, layers: [usize; 4], num_classes: usize) -> ResNetConfig {
        ResNetConfig {
            block,
            layers,
            widths: [64, 128, 256, 512],
            stem_width: 64,
            num_classes,
        }
    }

    /// torchvision's `resnet18`.
    pub fn resnet18(num_classes: usize) -> ResNetConfig {
        Self::torchvision(ResNetBlock::Basic, [2, 2, 2, 2], num_classes)
    }

    /// torchvision's `resnet34`.
    pub fn resnet34(num_classes: usize) -> ResNetConfig {
        Self::torchvision(ResNetBlock::Basic, [3, 4, 6, 3], num_classes)
    }

    /// torchvision's `resnet50`.
    pub fn resnet50(num_classes: usize) -> ResNetConfig {
        Self::torchvision(ResNetBlock::Bottleneck, [3, 4, 6, 3], num_classes)
    }

    /// The config a torchvision state dict describes (read from its names and shapes).
    pub fn infer(weights: &Weights) -> Result<ResNetConfig> {
        let shape = |name: &str| {
            weights.info(name).map(|(_, s)| s).ok_or_else(|| {
                unsupported(
                    "ResNet",
                    format!(
                        "{} has no `{name}`; is it a torchvision ResNet state dict?",
                        weights.source().display()
                    ),
                )
            })
        };
        let stem_width = shape("conv1.weight")?[0];
        let block = if weights.contains("layer1.0.conv3.weight") {
            ResNetBlock::Bottleneck
        } else {
            ResNetBlock::Basic
        };
        let mut layers = [0; 4];
        let mut widths = [0; 4];
        for s in 0..4 {
            widths[s] = shape(&format!("layer{}.0.conv1.weight", s + 1))?[0];
            while weights.contains(&format!("layer{}.{}.conv1.weight", s + 1, layers[s])) {
                layers[s] += 1;
            }
        }
        Ok(ResNetConfig {
            block,
            layers,
            widths,
            stem_width,
            num_classes: shape("fc.weight")?[0],
        })
    }
}

/// torchvision's `downsample`: a strided 1×1 convolution and a batch norm, named `0`, `1`.
#[derive(Module)]
struct Downsample {
    #[module(rename = "0")]
    conv: Conv2d,
    #[module(rename = "1")]
    bn: BatchNorm2d,
}

#[derive(Module)]
struct Block {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    conv2: Conv2d,
    bn2: BatchNorm2d,
    conv3: Option<Conv2d>,
    bn3: Option<BatchNorm2d>,
    downsample: Option<Downsample>,
}

impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.bn1.forward(&self.conv1.forward(x)?)?.relu();
        h = self.bn2.forward(&self.conv2.forward(&h)?)?;
        if let (Some(conv3), Some(bn3)) = (&self.conv3, &self.bn3) {
            h = bn3.forward(&conv3.forward(&h.relu())?)?;
        }
        let identity = match &self.downsample {
            Some(d) => d.bn.forward(&d.conv.forward(x)?)?,
            None => x.clone(),
        };
        Ok((&h + &identity)?.relu())
    }
}

/// A ResNet image classifier, torchvision's module tree and names. It starts in
/// evaluation mode (batch norm uses its running statistics); `train(true)` switches.
#[derive(Module)]
pub struct ResNet {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    layer1: Vec<Block>,
    layer2: Vec<Block>,
    layer3: Vec<Block>,
    layer4: Vec<Block>,
    fc: Linear,
    #[module(skip)]
    config: ResNetConfig,
}

/// Builds layers of a checkpoint: each made with its shape, then loaded from its prefix.
struct Loader<'a> {
    weights: &'a Weights,
    params: ParamOptions,
}

impl Loader<'_> {
    fn conv(&self, name: &str, inp: usize, out: usize, k: usize, stride: usize) -> Result<Conv2d> {
        let opts = ConvOptions {
            stride: [stride; 2],
            padding: Padding::Explicit([k / 2; 2]),
            ..ConvOptions::default()
        };
        let conv = Conv2d::with_options(inp, out, [k, k], opts, false, &self.params)?;
        self.weights.pp(name).load_into(&conv)?;
        Ok(conv)
    }

    fn bn(&self, name: &str, channels: usize) -> Result<BatchNorm2d> {
        let bn = BatchNorm2d::with_options(channels, BatchNormOptions::default(), &self.params)?;
        self.weights.pp(name).load_into(&bn)?;
        Ok(bn)
    }
}

impl ResNet {
    /// Loads a torchvision state dict saved as safetensors (a file, or a directory holding
    /// `model.safetensors`), with float weights as `dtype` on `device`; the architecture is
    /// read from the weights ([`ResNetConfig::infer`]).
    pub fn from_file(path: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<ResNet> {
        let weights = Weights::open(path)?.with_dtype(dtype).with_device(device);
        let model = ResNet::load(&ResNetConfig::infer(&weights)?, &weights)?;
        weights.finish()?;
        Ok(model)
    }

    /// Builds the model from `weights` for `config`.
    pub fn load(config: &ResNetConfig, weights: &Weights) -> Result<ResNet> {
        let c = config;
        let dtype = match weights.dtype() {
            Some(d) => d,
            None => weights.info("conv1.weight").map_or(DType::F32, |(d, _)| d),
        };
        let l = Loader {
            weights,
            params: ParamOptions {
                dtype,
                device: weights.device(),
            },
        };
        let conv1 = l.conv("conv1", 3, c.stem_width, 7, 2)?;
        let bn1 = l.bn("bn1", c.stem_width)?;
        let e = c.block.expansion();
        let mut inplanes = c.stem_width;
        let mut stages: Vec<Vec<Block>> = Vec::with_capacity(4);
        for s in 0..4 {
            let (width, stride) = (c.widths[s], if s == 0 { 1 } else { 2 });
            let mut blocks = Vec::with_capacity(c.layers[s]);
            for j in 0..c.layers[s] {
                let p = format!("layer{}.{j}", s + 1);
                let stride = if j == 0 { stride } else { 1 };
                let out = width * e;
                let downsample = if j == 0 && (stride != 1 || inplanes != out) {
                    Some(Downsample {
                        conv: l.conv(&format!("{p}.downsample.0"), inplanes, out, 1, stride)?,
                        bn: l.bn(&format!("{p}.downsample.1"), out)?,
                    })
                } else {
                    None
                };
                let block = match c.block {
                    ResNetBlock::Basic => Block {
                        conv1: l.conv(&format!("{p}.conv1"), inplanes, width, 3, stride)?,
                        bn1: l.bn(&format!("{p}.bn1"), width)?,
                        conv2: l.conv(&format!("{p}.conv2"), width, width, 3, 1)?,
                        bn2: l.bn(&format!("{p}.bn2"), width)?,
                        conv3: None,
                        bn3: None,
                        downsample,
                    },
                    ResNetBlock::Bottleneck => Block {
                        conv1: l.conv(&format!("{p}.conv1"), inplanes, width, 1, 1)?,
                        bn1: l.bn(&format!("{p}.bn1"), width)?,
                        conv2: l.conv(&format!("{p}.conv2"), width, width, 3, stride)?,
                        bn2: l.bn(&format!("{p}.bn2"), width)?,
                        conv3: Some(l.conv(&format!("{p}.conv3"), width, out, 1, 1)?),
                        bn3: Some(l.bn(&format!("{p}.bn3"), out)?),
                        downsample,
                    },
                };
                blocks.push(block);
                inplanes = out;
            }
            stages.push(blocks);
        }
        let fc = Linear::from_tensors(
            weights.get("fc.weight", &[c.num_classes, inplanes])?,
            Some(weights.get("fc.bias", &[c.num_classes])?),
        )?;
        let mut stages = stages.into_iter();
        let mut next = || stages.next().unwrap_or_default();
        let model = ResNet {
            conv1,
            bn1,
            layer1: next(),
            layer2: next(),
            layer3: next(),
            layer4: next(),
            fc,
            config: c.clone(),
        };
        model.eval();
        Ok(model)
    }

    /// The config the model was built from.
    pub fn config(&self) -> &ResNetConfig {
        &self.config
    }

    /// The class logits `[N, num_classes]` of images `[N, 3, H, W]` (normalized as the
    /// weights expect; torchvision's `ImageNet` weights: mean `[0.485, 0.456, 0.406]`, std
    /// `[0.229, 0.224, 0.225]`).
    pub fn forward(&self, images: &Tensor) -> Result<Tensor> {
        let x = self.bn1.forward(&self.conv1.forward(images)?)?.relu();
        let pool = PoolOptions {
            stride: Some([2, 2]),
            padding: [1, 1],
            ..PoolOptions::new([3, 3])
        };
        let mut x = x.max_pool2d(&pool)?;
        for block in [&self.layer1, &self.layer2, &self.layer3, &self.layer4]
            .into_iter()
            .flatten()
        {
            x = block.forward(&x)?;
        }
        let x = x.adaptive_avg_pool2d([1, 1])?.flatten(1, -1)?;
        self.fc.forward(&x)
    }
}
