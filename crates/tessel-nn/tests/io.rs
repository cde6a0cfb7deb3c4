//! Weight files: `.safetensors` round trips bit-exactly for every dtype, module save/load,
//! and the errors for mismatched or foreign files.

use std::path::PathBuf;

use tessel_nn::{Module, Visitor, load, save};
use tessel_tensor::{
    DType, Device, Element, F8E4M3, F8E5M2, Tensor, bf16, f16, load_safetensors, save_safetensors,
};

/// A file in the temp dir, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> TempFile {
        TempFile(std::env::temp_dir().join(format!(
            "tessel-nn-io-{}-{name}.safetensors",
            std::process::id()
        )))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A small LCG over all 64 bits.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 ^ (self.0 >> 29)
    }
}

/// A tensor of `T`s made from raw bit patterns.
fn make<T: Element>(bits: &[u64], f: impl Fn(u64) -> T, dims: &[usize]) -> Tensor {
    Tensor::from_vec(
        bits.iter().map(|&b| f(b)).collect::<Vec<T>>(),
        dims.to_vec(),
    )
    .unwrap()
}

/// Random elements of every bit pattern (NaNs and infinities included for floats) and the
/// bytes that represent them.
fn random_tensor(dtype: DType, dims: &[usize], rng: &mut Lcg) -> (Tensor, Vec<u64>) {
    let n: usize = dims.iter().product();
    let bits: Vec<u64> = (0..n)
        .map(|_| {
            let r = rng.next();
            match dtype {
                DType::Bool => r & 1,
                _ => r & (u64::MAX >> (64 - dtype.bits())),
            }
        })
        .collect();
    let t = match dtype {
        DType::Bool => make(&bits, |b| b != 0, dims),
        DType::U8 => make(&bits, |b| b as u8, dims),
        DType::U16 => make(&bits, |b| b as u16, dims),
        DType::U32 => make(&bits, |b| b as u32, dims),
        DType::U64 => make(&bits, |b| b, dims),
        DType::I8 => make(&bits, |b| b as u8 as i8, dims),
        DType::I16 => make(&bits, |b| b as u16 as i16, dims),
        DType::I32 => make(&bits, |b| b as u32 as i32, dims),
        DType::I64 => make(&bits, |b| b as i64, dims),
        DType::F16 => make(&bits, |b| f16::from_bits(b as u16), dims),
        DType::BF16 => make(&bits, |b| bf16::from_bits(b as u16), dims),
        DType::F32 => make(&bits, |b| f32::from_bits(b as u32), dims),
        DType::F64 => make(&bits, f64::from_bits, dims),
        DType::F8E4M3 => make(&bits, |b| F8E4M3::from_bits(b as u8), dims),
        DType::F8E5M2 => make(&bits, |b| F8E5M2::from_bits(b as u8), dims),
    };
    (t, bits)
}

/// A tensor's elements as raw bits, so NaNs compare too.
fn bits_of(t: &Tensor) -> Vec<u64> {
    fn conv<T: Element>(t: &Tensor, f: impl Fn(T) -> u64) -> Vec<u64> {
        t.to_vec::<T>().unwrap().into_iter().map(f).collect()
    }
    match t.dtype() {
        DType::Bool => conv(t, <u64 as From<bool>>::from),
        DType::U8 => conv(t, <u64 as From<u8>>::from),
        DType::U16 => conv(t, <u64 as From<u16>>::from),
        DType::U32 => conv(t, <u64 as From<u32>>::from),
        DType::U64 => conv(t, |v: u64| v),
        DType::I8 => conv(t, |v: i8| u64::from(v as u8)),
        DType::I16 => conv(t, |v: i16| u64::from(v as u16)),
        DType::I32 => conv(t, |v: i32| u64::from(v as u32)),
        DType::I64 => conv(t, |v: i64| v as u64),
        DType::F16 => conv(t, |v: f16| u64::from(v.to_bits())),
        DType::BF16 => conv(t, |v: bf16| u64::from(v.to_bits())),
        DType::F32 => conv(t, |v: f32| u64::from(v.to_bits())),
        DType::F64 => conv(t, f64::to_bits),
        DType::F8E4M3 => conv(t, |v: F8E4M3| u64::from(v.to_bits())),
        DType::F8E5M2 => conv(t, |v: F8E5M2| u64::from(v.to_bits())),
    }
}

#[test]
fn every_dtype_round_trips_bit_exactly() {
    let mut rng = Lcg(42);
    let shapes: [&[usize]; 4] = [&[2, 3, 4], &[7], &[], &[0, 3]];
    let mut saved = Vec::new();
    for (i, dtype) in DType::ALL.into_iter().chain(DType::FLOAT8).enumerate() {
        let (t, bits) = random_tensor(dtype, shapes[i % shapes.len()], &mut rng);
        saved.push((format!("t{i:02}.{}", dtype.name()), t, bits));
    }
    let file = TempFile::new("all-dtypes");
    let named: Vec<(String, Tensor)> = saved
        .iter()
        .map(|(n, t, _)| (n.clone(), t.clone()))
        .collect();
    save_safetensors(&file.0, &named).unwrap();
    let loaded = load_safetensors(&file.0, &Device::cpu()).unwrap();
    assert_eq!(loaded.len(), saved.len());
    // Sorted by name, which is the order they were saved in.
    for ((name, t, bits), (lname, l)) in saved.iter().zip(&loaded) {
        assert_eq!(name, lname);
        assert_eq!(l.dtype(), t.dtype(), "{name}");
        assert_eq!(l.shape(), t.shape(), "{name}");
        assert_eq!(&bits_of(l), bits, "{name}");
    }
}

/// The file layout is the published format: an 8-byte little-endian header length, a JSON
/// header with dtype, shape and data offsets, then the raw little-endian data. A file
/// written by hand this way (as PyTorch's `safetensors.torch.save_file` writes it) loads.
#[test]
fn reads_a_file_written_by_hand() {
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},"__metadata__":{"format":"pt"}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for v in [1.5f32, -2.25] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    for v in [3.0f32, -0.5] {
        bytes.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes());
    }
    let file = TempFile::new("by-hand");
    std::fs::write(&file.0, &bytes).unwrap();
    let loaded = load_safetensors(&file.0, &Device::cpu()).unwrap();
    assert_eq!(loaded[0].0, "a");
    assert_eq!(loaded[0].1.to_vec::<f32>().unwrap(), vec![1.5, -2.25]);
    assert_eq!(loaded[1].0, "b");
    assert_eq!(loaded[1].1.dims(), vec![1, 2]);
    assert_eq!(
        loaded[1].1.to_vec::<bf16>().unwrap(),
        vec![bf16::from_f32(3.0), bf16::from_f32(-0.5)]
    );

    // And what Tessel writes parses the same way: header, then data at its offsets.
    let file2 = TempFile::new("by-tessel");
    save_safetensors(&file2.0, &loaded).unwrap();
    let written = std::fs::read(&file2.0).unwrap();
    let n = u64::from_le_bytes(written[..8].try_into().unwrap()) as usize;
    let json = std::str::from_utf8(&written[8..8 + n]).unwrap();
    assert!(
        json.contains(r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#),
        "{json}"
    );
    assert_eq!(&written[8 + n..8 + n + 4], &1.5f32.to_le_bytes());
}

#[test]
fn file_errors_name_the_problem() {
    let missing = std::env::temp_dir().join("tessel-nn-io-no-such-file.safetensors");
    let e = load_safetensors(&missing, &Device::cpu())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot read") && e.contains("no-such-file"),
        "{e}"
    );

    let file = TempFile::new("garbage");
    std::fs::write(&file.0, b"not a safetensors file").unwrap();
    let e = load_safetensors(&file.0, &Device::cpu())
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a valid safetensors file"), "{e}");

    // An 8-bit float Tessel does not have (it has PyTorch's F8_E4M3 and F8_E5M2).
    let header = r#"{"q":{"dtype":"F8_E4M3FNUZ","shape":[4],"data_offsets":[0,4]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[1, 2, 3, 4]);
    let f8 = TempFile::new("f8");
    std::fs::write(&f8.0, &bytes).unwrap();
    let e = load_safetensors(&f8.0, &Device::cpu())
        .unwrap_err()
        .to_string();
    assert!(e.contains("`q`") && e.contains("F8_E4M3FNUZ"), "{e}");

    let t = Tensor::from_vec(vec![1.0f32], [1]).unwrap();
    let e = save_safetensors(&file.0, &[("x".into(), t.clone()), ("x".into(), t.clone())])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`x` is given twice"), "{e}");
    let e = save_safetensors(
        std::env::temp_dir().join("tessel-no-such-dir/x.safetensors"),
        &[("x".into(), t)],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("cannot write") && e.contains("tessel-no-such-dir"),
        "{e}"
    );
}

/// Two sub-modules, a buffer and mixed dtypes: like a small model with normalization.
struct Block {
    weight: Tensor,
    bias: Tensor,
    running: Tensor,
}

impl Module for Block {
    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("weight", &self.weight);
        v.param("bias", &self.bias);
        v.buffer("running", &self.running);
    }
}

struct Model {
    layers: Vec<Block>,
    scale: Tensor,
}

impl Module for Model {
    fn visit(&self, v: &mut Visitor<'_>) {
        for (i, l) in self.layers.iter().enumerate() {
            v.module(&format!("layers.{i}"), l);
        }
        v.param("scale", &self.scale);
    }
}

fn model(rng: &mut Lcg) -> Model {
    let block = |rng: &mut Lcg| Block {
        weight: random_tensor(DType::F32, &[3, 2], rng).0,
        bias: random_tensor(DType::BF16, &[3], rng).0,
        running: random_tensor(DType::I64, &[1], rng).0,
    };
    Model {
        layers: vec![block(rng), block(rng)],
        scale: random_tensor(DType::F16, &[], rng).0,
    }
}

#[test]
fn module_save_then_load_restores_every_tensor() {
    let mut rng = Lcg(7);
    let a = model(&mut rng);
    let b = model(&mut rng);
    let file = TempFile::new("module");
    save(&a, &file.0).unwrap();

    // A handle taken before loading (an optimizer's) sees the loaded value.
    let handle = b.layers[1].weight.clone();
    load(&b, &file.0).unwrap();
    for ((name, ta), (_, tb)) in a.state().iter().zip(b.state().iter()) {
        assert_eq!(bits_of(ta), bits_of(tb), "{name}");
    }
    assert_eq!(bits_of(&handle), bits_of(&a.layers[1].weight));

    let names: Vec<String> = load_safetensors(&file.0, &Device::cpu())
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "layers.0.bias",
            "layers.0.running",
            "layers.0.weight",
            "layers.1.bias",
            "layers.1.running",
            "layers.1.weight",
            "scale"
        ]
    );
}

#[test]
fn load_mismatches_list_every_problem_and_change_nothing() {
    let mut rng = Lcg(9);
    let a = model(&mut rng);
    let file = TempFile::new("mismatch");

    // The file lacks `scale`, has an extra tensor, one wrong shape and one integer tensor
    // where the module has a float (float to float is a cast, as in PyTorch).
    let mut state = a.state();
    state.retain(|(n, _)| n != "scale");
    state.push((
        "extra.weight".into(),
        Tensor::from_vec(vec![1.0f32], [1]).unwrap(),
    ));
    for (n, t) in &mut state {
        if n == "layers.0.weight" {
            *t = random_tensor(DType::F32, &[2, 3], &mut rng).0;
        }
        if n == "layers.1.bias" {
            *t = random_tensor(DType::I32, &[3], &mut rng).0;
        }
    }
    save_safetensors(&file.0, &state).unwrap();

    let b = model(&mut rng);
    let before: Vec<Vec<u64>> = b.state().iter().map(|(_, t)| bits_of(t)).collect();
    let e = load(&b, &file.0).unwrap_err().to_string();
    assert!(e.contains("missing from the file: scale"), "{e}");
    assert!(
        e.contains("in the file but not in the module: extra.weight"),
        "{e}"
    );
    assert!(
        e.contains("`layers.0.weight` is [2, 3] f32 in the file but [3, 2] f32 in the module"),
        "{e}"
    );
    assert!(
        e.contains("`layers.1.bias` is [3] i32 in the file but [3] bf16 in the module"),
        "{e}"
    );
    let after: Vec<Vec<u64>> = b.state().iter().map(|(_, t)| bits_of(t)).collect();
    assert_eq!(before, after, "a failed load must not change the module");
}
