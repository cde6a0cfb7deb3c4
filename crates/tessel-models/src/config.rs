//! [`Config`]: a model's `config.json`, read field by field with the defaults
//! `transformers` uses.

use std::path::{Path, PathBuf};

use tessel_tensor::{Error, Result};

/// A parsed `config.json`; missing fields fall back to the caller's defaults, and a field
/// of the wrong type is an error naming the file and the field.
#[derive(Clone, Debug)]
pub struct Config {
    path: PathBuf,
    json: serde_json::Value,
}

fn invalid(reason: String) -> Error {
    Error::InvalidArgument {
        op: "config.json",
        reason,
    }
}

impl Config {
    /// Reads `path` (a `config.json`, or a directory holding one).
    pub fn open(path: impl AsRef<Path>) -> Result<Config> {
        let path = path.as_ref();
        let path = if path.is_dir() {
            path.join("config.json")
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text, path)
    }

    /// Parses the text of a `config.json` (`path` names it in messages).
    pub fn parse(text: &str, path: impl Into<PathBuf>) -> Result<Config> {
        let path = path.into();
        let json: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| invalid(format!("{} is not valid JSON: {e}", path.display())))?;
        if !json.is_object() {
            return Err(invalid(format!("{} is not a JSON object", path.display())));
        }
        Ok(Config { path, json })
    }

    /// The raw JSON value of `key`, if present and not `null`.
    pub fn get(&self, key: &str) -> Option<&serde_json::Value> {
        self.json.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, want: &str) -> Error {
        invalid(format!(
            "{}: `{key}` must be {want}, got {}",
            self.path.display(),
            self.json[key]
        ))
    }

    /// A required non-negative integer.
    pub fn usize(&self, key: &str) -> Result<usize> {
        match self.get(key) {
            None => Err(invalid(format!(
                "{} has no `{key}`; is this the config of another model?",
                self.path.display()
            ))),
            Some(v) => v
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| self.wrong(key, "a non-negative integer")),
        }
    }

    /// An optional non-negative integer, `default` when absent.
    pub fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        self.get(key).map_or(Ok(default), |_| self.usize(key))
    }

    /// An optional integer (token ids), `None` when absent; a list gives its first entry.
    pub fn token_id(&self, key: &str) -> Result<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(serde_json::Value::Array(a)) => Ok(a.first().and_then(serde_json::Value::as_i64)),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "an integer")),
        }
    }

    /// An optional number, `default` when absent.
    pub fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.wrong(key, "a number")),
        }
    }

    /// An optional boolean, `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.wrong(key, "true or false")),
        }
    }

    /// An optional string, `default` when absent.
    pub fn str_or<'a>(&'a self, key: &str, default: &'a str) -> Result<&'a str> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_str().ok_or_else(|| self.wrong(key, "a string")),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// An error of a model's config, naming the model and the fix.
pub(crate) fn unsupported(model: &'static str, reason: String) -> Error {
    Error::InvalidArgument { op: model, reason }
}

/// A model from a Hugging Face directory: its `config.json` read by `config`, its weights
/// (float ones as `dtype`, on `device`) by `load`, every weight used (a strict load).
pub(crate) fn load_dir<C, M>(
    dir: &Path,
    dtype: tessel_tensor::DType,
    device: &tessel_tensor::Device,
    config: impl FnOnce(&Config) -> Result<C>,
    load: impl FnOnce(&C, &tessel_nn::Weights) -> Result<M>,
) -> Result<M> {
    let config = config(&Config::open(dir)?)?;
    let weights = tessel_nn::Weights::open(dir)?
        .with_dtype(dtype)
        .with_device(device);
    let model = load(&config, &weights)?;
    weights.finish()?;
    Ok(model)
}
