//! The weight loader ([`Weights`]) and `#[derive(Module)]`: prefixes, shards, casts,
//! missing and unexpected names, truncated files, and derived names as PyTorch's.

use std::path::PathBuf;

use tessel_nn::{LayerNorm, Linear, Module, ParamKind, Weights, load, save};
use tessel_tensor::{DType, Tensor, bf16, save_safetensors};

/// A directory in the temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("tessel-nn-weights-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn t(values: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims).unwrap()
}

fn named(pairs: &[(&str, Tensor)]) -> Vec<(String, Tensor)> {
    pairs
        .iter()
        .map(|(n, t)| ((*n).to_string(), t.clone()))
        .collect()
}

/// A model directory with a sharded checkpoint: two shards and the index, as
/// `save_pretrained(max_shard_size=...)` writes them.
fn sharded(dir: &TempDir) {
    save_safetensors(
        dir.0.join("model-00001-of-00002.safetensors"),
        &named(&[
            (
                "h.0.mlp.weight",
                t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]),
            ),
            ("h.0.mlp.bias", t(&[0.5, -0.5], &[2])),
        ]),
    )
    .unwrap();
    save_safetensors(
        dir.0.join("model-00002-of-00002.safetensors"),
        &named(&[
            ("h.1.mlp.weight", t(&[-1.0; 6], &[2, 3])),
            (
                "position_ids",
                Tensor::from_slice(&[0i64, 1, 2], [3]).unwrap(),
            ),
        ]),
    )
    .unwrap();
    let index = r#"{"metadata": {"total_size": 60}, "weight_map": {
        "h.0.mlp.weight": "model-00001-of-00002.safetensors",
        "h.0.mlp.bias": "model-00001-of-00002.safetensors",
        "h.1.mlp.weight": "model-00002-of-00002.safetensors",
        "position_ids": "model-00002-of-00002.safetensors"}}"#;
    std::fs::write(dir.0.join("model.safetensors.index.json"), index).unwrap();
}

#[test]
fn a_sharded_directory_reads_by_prefix_and_casts_floats_only() {
    let dir = TempDir::new("sharded");
    sharded(&dir);
    let weights = Weights::open(&dir.0).unwrap().with_dtype(DType::BF16);
    assert_eq!(
        weights.pp("h").names(),
        ["0.mlp.bias", "0.mlp.weight", "1.mlp.weight"]
    );
    let mlp = weights.pp("h.0").pp("mlp");
    let w = mlp.get("weight", &[2, 3]).unwrap();
    assert_eq!(w.dtype(), DType::BF16);
    assert_eq!(
        w.to_vec::<bf16>().unwrap(),
        [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].map(bf16::from_f32)
    );
    // Integer tensors keep their dtype.
    let ids = weights.get_any("position_ids").unwrap();
    assert_eq!(
        (ids.dtype(), ids.to_vec::<i64>().unwrap()),
        (DType::I64, vec![0, 1, 2])
    );
    // A wrong shape names the tensor, the file and both shapes.
    let e = mlp.get("bias", &[3]).unwrap_err().to_string();
    assert!(
        e.contains("`h.0.mlp.bias`") && e.contains("[2]") && e.contains("[3]"),
        "{e}"
    );
    // A missing name lists what the same prefix holds.
    let e = mlp.get("gamma", &[2]).unwrap_err().to_string();
    assert!(
        e.contains("no tensor `h.0.mlp.gamma`") && e.contains("h.0.mlp.weight"),
        "{e}"
    );
    // Strict: two names were never read.
    let e = weights.finish().unwrap_err().to_string();
    assert!(
        e.contains("h.1.mlp.weight") && !e.contains("h.0.mlp.weight"),
        "{e}"
    );
    assert!(weights.clone().strict(false).finish().is_ok());
    weights.get_any("h.1.mlp.weight").unwrap();
    weights.finish().unwrap();
}

#[test]
fn a_stale_index_and_a_truncated_file_are_errors_naming_the_file_and_tensor() {
    let dir = TempDir::new("broken");
    sharded(&dir);
    let index = dir.0.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(
        &index,
        text.replace(
            "\"h.0.mlp.bias\": \"model-00001",
            "\"h.0.mlp.bias\": \"model-00002",
        ),
    )
    .unwrap();
    let e = Weights::open(&dir.0).err().unwrap().to_string();
    assert!(
        e.contains("`h.0.mlp.bias`") && e.contains("model-00002-of-00002"),
        "{e}"
    );

    let shard = dir.0.join("model-00001-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 5]).unwrap();
    let e = Weights::open(&shard).err().unwrap().to_string();
    assert!(
        e.contains("is truncated")
            && e.contains("model-00001-of-00002")
            && e.contains("`h.0.mlp.weight`"),
        "{e}"
    );

    let e = Weights::open(std::env::temp_dir())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("neither model.safetensors nor"), "{e}");
}

/// A block with a renamed field, a buffer, an optional and a skipped field.
#[derive(Module)]
struct Block {
    #[module(rename = "LayerNorm")]
    norm: LayerNorm,
    fc: Linear,
    extra: Option<Linear>,
    #[module(buffer)]
    steps: Tensor,
    #[module(skip)]
    #[allow(dead_code)]
    width: usize,
}

#[derive(Module)]
struct Net {
    layers: Vec<Block>,
    head: Tensor,
}

fn net(with_extra: bool) -> Net {
    let block = || Block {
        norm: LayerNorm::new(&[3]).unwrap(),
        fc: Linear::new(3, 2).unwrap(),
        extra: with_extra.then(|| Linear::new(2, 2).unwrap()),
        steps: Tensor::from_slice(&[0i64], [1]).unwrap(),
        width: 3,
    };
    Net {
        layers: vec![block(), block()],
        head: Tensor::randn([2], DType::F32).unwrap(),
    }
}

#[test]
fn derived_modules_name_every_field_as_pytorch_does() {
    let m = net(true);
    let names: Vec<(String, ParamKind)> = {
        let mut out = Vec::new();
        m.visit(&mut tessel_nn::Visitor::new(&mut |n, k, _| {
            out.push((n.to_string(), k));
        }));
        out
    };
    let want = [
        "layers.0.LayerNorm.weight",
        "layers.0.LayerNorm.bias",
        "layers.0.fc.weight",
        "layers.0.fc.bias",
        "layers.0.extra.weight",
        "layers.0.extra.bias",
        "layers.0.steps",
    ];
    assert_eq!(
        names
            .iter()
            .take(7)
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        want
    );
    assert_eq!(names.len(), 15);
    assert_eq!(names[6].1, ParamKind::Buffer);
    assert_eq!(names[14], ("head".to_string(), ParamKind::Parameter));
    assert_eq!(m.parameters().len(), 13);
    assert_eq!(m.named_buffers().len(), 2);
    assert!(net(false).state().iter().all(|(n, _)| !n.contains("extra")));
}

#[test]
fn load_casts_floats_and_non_strict_loads_report_what_they_skipped() {
    let dir = TempDir::new("load");
    let a = net(true);
    let file = dir.0.join("net.safetensors");
    save(&a, &file).unwrap();

    // Into a bf16 copy of the head: float values are cast, as `load_state_dict` does.
    let b = net(true);
    load(&b, &file).unwrap();
    let got = b.layers[1].fc.weight().to_vec::<f32>().unwrap();
    assert_eq!(got, a.layers[1].fc.weight().to_vec::<f32>().unwrap());

    // The file has `extra`, a module without it is stricter than the file.
    let c = net(false);
    let e = load(&c, &file).unwrap_err().to_string();
    assert!(
        e.contains("in the file but not in the module: layers.0.extra.bias"),
        "{e}"
    );
    let report = Weights::open(&file)
        .unwrap()
        .strict(false)
        .load_into(&c)
        .unwrap();
    assert!(report.missing.is_empty());
    assert_eq!(report.unexpected.len(), 4);
    assert_eq!(
        c.layers[0].norm.weight().unwrap().to_vec::<f32>().unwrap(),
        a.layers[0].norm.weight().unwrap().to_vec::<f32>().unwrap()
    );
    // ... and a module with more than the file loads what there is, non-strict.
    let small = dir.0.join("small.safetensors");
    save(&c, &small).unwrap();
    let d = net(true);
    let report = Weights::open(&small)
        .unwrap()
        .strict(false)
        .load_into(&d)
        .unwrap();
    assert_eq!(report.missing.len(), 4);
    assert!(report.unexpected.is_empty());
}
