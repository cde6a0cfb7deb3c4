//! [`Weights`]: a model's tensors by name, from the files users have (a Hugging Face model
//! directory, a sharded checkpoint, one `.safetensors` file).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tessel_tensor::{DType, Device, Error, Result, SafetensorsFile, Tensor};

use crate::module::Module;

/// The tensors of one or more memory-mapped `.safetensors` files, looked up by full name.
struct Store {
    /// Where the weights came from, for messages.
    source: PathBuf,
    files: Vec<SafetensorsFile>,
    /// Every name, with the index of the file holding it.
    index: BTreeMap<String, usize>,
    /// The names read so far (what [`Weights::unused`] leaves out).
    used: Mutex<BTreeSet<String>>,
}

/// Named weights as PyTorch and Hugging Face store them, read lazily from memory-mapped
/// `.safetensors` files: a tensor's bytes are read from the page cache when it is first used
/// on a device, with no copy before (unless a cast was asked for).
///
/// Open a model directory as the Hugging Face hub gives it (`model.safetensors`, or
/// `model.safetensors.index.json` and its shards), or a single file. Names are PyTorch's:
/// [`Weights::pp`] pushes a prefix, so a layer reads `weight` and `bias` under its own path.
/// Every read is recorded; [`Weights::finish`] reports the names nobody read (a strict load,
/// PyTorch's `load_state_dict(strict=True)`), unless [`Weights::strict`] turned that off.
///
/// ```
/// # use tessel_nn::Weights;
/// # use tessel_tensor::{DType, Tensor, save_safetensors};
/// # fn main() -> tessel_tensor::Result<()> {
/// let path = std::env::temp_dir().join(format!("tessel-weights-doc-{}.safetensors", std::process::id()));
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
/// save_safetensors(&path, &[("h.0.mlp.weight".to_string(), w)])?;
///
/// let weights = Weights::open(&path)?.with_dtype(DType::BF16);
/// let mlp = weights.pp("h.0").pp("mlp");
/// let weight = mlp.get("weight", &[2, 2])?;
/// assert_eq!(weight.dtype(), DType::BF16);
/// weights.finish()?; // every tensor of the file was read
/// # std::fs::remove_file(&path).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Weights {
    store: Arc<Store>,
    prefix: String,
    dtype: Option<DType>,
    device: Device,
    strict: bool,
}

/// What [`Weights::load_into`] did not match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// The module's names the weights lack (left unchanged; only in a non-strict load).
    pub missing: Vec<String>,
    /// The weights' names the module lacks (ignored; only in a non-strict load).
    pub unexpected: Vec<String>,
}

fn invalid(op: &'static str, reason: String) -> Error {
    Error::InvalidArgument { op, reason }
}

impl Weights {
    /// Opens `path`: a directory holding `model.safetensors.index.json` (a sharded
    /// checkpoint) or `model.safetensors`, an index file, or one `.safetensors` file. Every
    /// file's header is read and checked now; the data is mapped, not read.
    pub fn open(path: impl AsRef<Path>) -> Result<Weights> {
        const OP: &str = "Weights::open";
        let path = path.as_ref();
        if path.is_dir() {
            let index = path.join("model.safetensors.index.json");
            if index.is_file() {
                return Self::open_index(&index);
            }
            let single = path.join("model.safetensors");
            if single.is_file() {
                return Self::from_files(&[single]);
            }
            return Err(invalid(
                OP,
                format!(
                    "{} holds neither model.safetensors nor model.safetensors.index.json; download the safetensors weights (e.g. `huggingface-cli download <model> --include '*.safetensors' '*.json'`) or convert a `.bin` checkpoint with `safetensors.torch.save_file`",
                    path.display()
                ),
            ));
        }
        if path.extension().is_some_and(|e| e == "json") {
            return Self::open_index(path);
        }
        Self::from_files(&[path])
    }

    /// A sharded checkpoint's index (`{"weight_map": {name: file}}`), its shards beside it.
    fn open_index(index: &Path) -> Result<Weights> {
        const OP: &str = "Weights::open";
        let text = std::fs::read_to_string(index)
            .map_err(|e| invalid(OP, format!("cannot read {}: {e}", index.display())))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| invalid(OP, format!("{} is not valid JSON: {e}", index.display())))?;
        let Some(map) = json.get("weight_map").and_then(|m| m.as_object()) else {
            return Err(invalid(
                OP,
                format!("{} has no `weight_map` object", index.display()),
            ));
        };
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut shards = BTreeSet::new();
        for (name, file) in map {
            let Some(file) = file.as_str() else {
                return Err(invalid(
                    OP,
                    format!(
                        "{}: the shard of `{name}` is not a file name",
                        index.display()
                    ),
                ));
            };
            shards.insert(file.to_string());
        }
        let paths: Vec<PathBuf> = shards.iter().map(|f| dir.join(f)).collect();
        let weights = Self::build(&paths, index.to_path_buf())?;
        let store = &weights.store;
        for (name, file) in map {
            let shard = dir.join(file.as_str().unwrap_or_default());
            match store.index.get(name) {
                Some(&i) if store.files[i].path() == shard => {}
                _ => {
                    return Err(invalid(
                        OP,
                        format!(
                            "{} places `{name}` in {}, which does not hold it; the checkpoint is incomplete or its index is stale",
                            index.display(),
                            shard.display()
                        ),
                    ));
                }
            }
        }
        Ok(weights)
    }

    /// The tensors of several `.safetensors` files as one set; a name in two files is an
    /// error.
    pub fn from_files(paths: &[impl AsRef<Path>]) -> Result<Weights> {
        let source = paths
            .first()
            .map_or_else(PathBuf::new, |p| p.as_ref().to_path_buf());
        Self::build(paths, source)
    }

    fn build(paths: &[impl AsRef<Path>], source: PathBuf) -> Result<Weights> {
        const OP: &str = "Weights::open";
        let mut files = Vec::with_capacity(paths.len());
        let mut index = BTreeMap::new();
        for path in paths {
            let file = SafetensorsFile::open(path)?;
            for name in file.names() {
                if let Some(&other) = index.get(name) {
                    let other: &SafetensorsFile = &files[other];
                    return Err(invalid(
                        OP,
                        format!(
                            "`{name}` is in both {} and {}",
                            other.path().display(),
                            file.path().display()
                        ),
                    ));
                }
                index.insert(name.to_string(), files.len());
            }
            files.push(file);
        }
        Ok(Weights {
            store: Arc::new(Store {
                source,
                files,
                index,
                used: Mutex::new(BTreeSet::new()),
            }),
            prefix: String::new(),
            dtype: None,
            device: Device::default(),
            strict: true,
        })
    }

    /// Float tensors are read as `dtype` (cast on the host, rounding like every backend's
    /// cast); integer and bool tensors keep their dtype, as PyTorch's `module.to(dtype)`.
    pub fn with_dtype(mut self, dtype: DType) -> Weights {
        self.dtype = Some(dtype);
        self
    }

    /// Tensors are placed on `device` (default: [`Device::default`]).
    pub fn with_device(mut self, device: &Device) -> Weights {
        self.device = *device;
        self
    }

    /// `false`: [`Weights::finish`] accepts names nobody read, and
    /// [`Weights::load_into`] skips missing and unexpected names (PyTorch's
    /// `strict=False`). Strict is the default.
    pub fn strict(mut self, strict: bool) -> Weights {
        self.strict = strict;
        self
    }

    /// The same weights seen under `name.` (`weights.pp("transformer").pp("h.0")`).
    pub fn pp(&self, name: &str) -> Weights {
        let mut w = self.clone();
        w.prefix = self.full(name);
        w.prefix.push('.');
        w
    }

    /// The dtype float tensors are cast to, if one was set.
    pub fn dtype(&self) -> Option<DType> {
        self.dtype
    }

    /// The device tensors are placed on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Where the weights came from (the file or index opened).
    pub fn source(&self) -> &Path {
        &self.store.source
    }

    fn full(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Whether `name` (under the prefix) exists.
    pub fn contains(&self, name: &str) -> bool {
        self.store.index.contains_key(&self.full(name))
    }

    /// Every name under the prefix, relative to it, sorted.
    pub fn names(&self) -> Vec<String> {
        self.store
            .index
            .range(self.prefix.clone()..)
            .take_while(|(n, _)| n.starts_with(&self.prefix))
            .map(|(n, _)| n[self.prefix.len()..].to_string())
            .collect()
    }

    /// The stored dtype and shape of `name`, if it exists.
    pub fn info(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        let full = self.full(name);
        let file = &self.store.files[*self.store.index.get(&full)?];
        file.info(&full).map(|(d, s)| (d, s.to_vec()))
    }

    /// `name` (under the prefix), which must have `shape`; cast to the requested dtype if it
    /// is a float tensor. A missing name or another shape is an error naming the file.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.get_any(name)?;
        if t.dims() != shape {
            return Err(invalid(
                "Weights::get",
                format!(
                    "`{}` in {} has shape {:?}, but the model expects {shape:?}; the config does not describe these weights",
                    self.full(name),
                    self.store.source.display(),
                    t.dims()
                ),
            ));
        }
        Ok(t)
    }

    /// `name` with whatever shape it is stored with.
    pub fn get_any(&self, name: &str) -> Result<Tensor> {
        let target = self.dtype;
        self.read(name, |stored| match target {
            Some(to) if stored.is_float() => to,
            _ => stored,
        })
    }

    /// `name` read as `dtype` (any stored dtype is cast).
    pub fn get_as(&self, name: &str, dtype: DType) -> Result<Tensor> {
        self.read(name, |_| dtype)
    }

    fn read(&self, name: &str, dtype_of: impl Fn(DType) -> DType) -> Result<Tensor> {
        let full = self.full(name);
        let Some(&i) = self.store.index.get(&full) else {
            return Err(self.missing(&full));
        };
        let file = &self.store.files[i];
        let (Some((stored, dims)), Some(bytes)) = (file.info(&full), file.bytes(&full)) else {
            return Err(self.missing(&full));
        };
        let dims = dims.to_vec();
        let dtype = dtype_of(stored);
        let bytes = bytes.cast(stored, dtype)?;
        let t = Tensor::from_host_bytes(bytes, dtype, dims, &self.device)?;
        self.store
            .used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(full);
        Ok(t)
    }

    /// The error for a name the files lack, listing what the same prefix does hold.
    fn missing(&self, full: &str) -> Error {
        let parent = full.rsplit_once('.').map_or("", |(p, _)| p);
        let siblings: Vec<&str> = self
            .store
            .index
            .keys()
            .filter(|n| !parent.is_empty() && n.starts_with(parent))
            .take(8)
            .map(String::as_str)
            .collect();
        let mut reason = format!("{} has no tensor `{full}`", self.store.source.display());
        if siblings.is_empty() {
            let first: Vec<&str> = self
                .store
                .index
                .keys()
                .take(5)
                .map(String::as_str)
                .collect();
            let _ = write!(
                reason,
                "; its names start {}: is the prefix right, or is this another model's checkpoint?",
                first.join(", ")
            );
        } else {
            let _ = write!(reason, "; under `{parent}` it has {}", siblings.join(", "));
        }
        invalid("Weights::get", reason)
    }

    /// Marks `name` (under the prefix) as read without reading it, if it exists: a tensor a
    /// model recomputes instead (an old checkpoint's causal-mask buffer, `position_ids`).
    pub fn skip(&self, name: &str) {
        let full = self.full(name);
        if self.store.index.contains_key(&full) {
            self.store
                .used
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(full);
        }
    }

    /// The names nobody has read yet, sorted (over all prefixes).
    pub fn unused(&self) -> Vec<String> {
        let used = self
            .store
            .used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.store
            .index
            .keys()
            .filter(|n| !used.contains(*n))
            .cloned()
            .collect()
    }

    /// Ends a strict load: an error listing every name nobody read (weights the model does
    /// not use: the wrong model, or a config that describes fewer layers). Non-strict
    /// weights accept them.
    pub fn finish(&self) -> Result<()> {
        let unused = self.unused();
        if !self.strict || unused.is_empty() {
            return Ok(());
        }
        Err(invalid(
            "Weights::finish",
            format!(
                "{} holds tensors the model does not use: {}; check that the config matches the weights, or open them with `.strict(false)` to ignore extras",
                self.store.source.display(),
                list(&unused)
            ),
        ))
    }

    /// Loads every parameter and buffer of `module` ([`Module::state`], names under the
    /// prefix), in place: every handle to them (an optimizer's) sees the loaded values.
    /// Float values are cast to the module tensor's dtype, as PyTorch's `load_state_dict`
    /// does; shapes must match.
    ///
    /// Strict (the default), the weights must hold exactly the module's names; otherwise
    /// nothing changes and the error lists every missing and unexpected name and every
    /// mismatch. Non-strict, missing and unexpected names are skipped and reported.
    pub fn load_into(&self, module: &dyn Module) -> Result<LoadReport> {
        const OP: &str = "load";
        let state = module.state();
        let ours: BTreeSet<String> = state.iter().map(|(n, _)| self.full(n)).collect();
        let mut report = LoadReport::default();
        let mut problems = Vec::new();
        for (name, _) in &state {
            if !self.contains(name) {
                report.missing.push(name.clone());
            }
        }
        report.unexpected = self
            .names()
            .into_iter()
            .filter(|n| !ours.contains(&self.full(n)))
            .collect();
        if self.strict {
            if !report.missing.is_empty() {
                problems.push(format!("missing from the file: {}", list(&report.missing)));
            }
            if !report.unexpected.is_empty() {
                problems.push(format!(
                    "in the file but not in the module: {}",
                    list(&report.unexpected)
                ));
            }
        }
        for (name, target) in &state {
            let Some((dtype, dims)) = self.info(name) else {
                continue;
            };
            let castable =
                dtype == target.dtype() || (dtype.is_float() && target.dtype().is_float());
            if dims != target.dims() || !castable {
                problems.push(format!(
                    "`{name}` is {dims:?} {dtype} in the file but {} {} in the module",
                    target.shape(),
                    target.dtype()
                ));
            }
        }
        if !problems.is_empty() {
            return Err(invalid(
                OP,
                format!(
                    "{} does not match the module: {}",
                    self.store.source.display(),
                    problems.join("; ")
                ),
            ));
        }
        // Read and move everything first, so a failing device leaves the module unchanged.
        let mut values = Vec::with_capacity(state.len());
        for (name, target) in &state {
            if self.contains(name) {
                let value = self
                    .clone()
                    .with_device(&target.device())
                    .get_as(name, target.dtype())?;
                values.push((target, value));
            }
        }
        for (target, value) in values {
            target.assign(&value)?;
        }
        Ok(report)
    }
}

/// Names for a message: all of a short list, the first 20 and a count of a long one.
fn list(names: &[String]) -> String {
    const SHOWN: usize = 20;
    let mut s = names
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        let _ = write!(s, " and {} more", names.len() - SHOWN);
    }
    s
}
