//! Finding NVRTC, compiling with it, and the on-disk cache of compiled kernels.
//!
//! cudarc opens NVRTC by bare file names through the dynamic loader (`LD_LIBRARY_PATH`,
//! `ldconfig`), which misses the places CUDA and Python wheels put it when they are not on
//! the loader path. So before cudarc's first NVRTC call this module looks for the library
//! itself and opens it by absolute path, NVRTC's builtins library first (NVRTC opens that
//! one by name while compiling); once a library with NVRTC's soname is loaded, cudarc's
//! `dlopen` by name finds it. The handles are kept for the life of the process.
//!
//! Compiled kernels are CUBIN for the device's exact architecture, cached on disk under a
//! key that hashes everything the bytes depend on.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tessel_ir::cache::{Fnv128, temp_suffix};

use crate::ffi;

/// NVRTC, once found.
pub(crate) struct Nvrtc {
    /// `(major, minor)`.
    pub(crate) version: (i32, i32),
    /// Where it was loaded from (`None`: by name, through the loader path).
    pub(crate) path: Option<PathBuf>,
    /// Libraries opened by path, kept open for the process's life.
    _libraries: Vec<libloading::Library>,
}

/// NVRTC for the process: found on first use, with `explicit` (from `TESSEL_NVRTC_PATH`)
/// as the only candidate when given. `Err` names every place searched.
pub(crate) fn nvrtc(explicit: Option<&Path>) -> Result<&'static Nvrtc, String> {
    static NVRTC: OnceLock<Result<Nvrtc, String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| locate(explicit))
        .as_ref()
        .map_err(Clone::clone)
}

fn locate(explicit: Option<&Path>) -> Result<Nvrtc, String> {
    let mut tried = Vec::new();
    if explicit.is_none() {
        if ffi::nvrtc_on_loader_path() {
            return finish(None, Vec::new());
        }
        tried.push(
            "the loader path (libnvrtc.so.13 and other names, by LD_LIBRARY_PATH and ldconfig)"
                .to_owned(),
        );
    }
    let candidates = match explicit {
        Some(path) => vec![path.to_owned()],
        None => search_dirs(),
    };
    for candidate in candidates {
        let (dir, file) = if candidate.is_file() {
            (
                candidate.parent().map(Path::to_owned).unwrap_or_default(),
                Some(candidate.clone()),
            )
        } else {
            (candidate.clone(), None)
        };
        tried.push(candidate.display().to_string());
        let Some(library) = file.or_else(|| find_in(&dir, "libnvrtc.so")) else {
            continue;
        };
        let mut libraries = Vec::new();
        // NVRTC opens its builtins by soname while compiling; loaded first, they are found.
        if let Some(builtins) = find_in(&dir, "libnvrtc-builtins.so") {
            match ffi::open_library(&builtins) {
                Ok(lib) => libraries.push(lib),
                Err(e) => tracing::debug!("tessel-cuda: cannot open {}: {e}", builtins.display()),
            }
        }
        match ffi::open_library(&library) {
            Ok(lib) => libraries.push(lib),
            Err(e) => {
                tried.push(format!("{} (failed to load: {e})", library.display()));
                continue;
            }
        }
        if ffi::nvrtc_on_loader_path() {
            return finish(Some(library), libraries);
        }
        tried.push(format!(
            "{} (loaded, but its soname is not one cudarc opens)",
            library.display()
        ));
    }
    Err(format!(
        "NVRTC (libnvrtc.so) was not found; searched: {}. Install the CUDA toolkit or \
         `pip install nvidia-cuda-nvrtc`, or set TESSEL_NVRTC_PATH to the library or its folder",
        tried.join(", ")
    ))
}

fn finish(path: Option<PathBuf>, libraries: Vec<libloading::Library>) -> Result<Nvrtc, String> {
    let version = ffi::nvrtc_version()?;
    tracing::debug!(?version, ?path, "tessel-cuda: NVRTC loaded");
    Ok(Nvrtc {
        version,
        path,
        _libraries: libraries,
    })
}

/// The newest file in `dir` named `prefix` or `prefix.<version>` (`libnvrtc.so.13`).
fn find_in(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == prefix || n.starts_with(&format!("{prefix}.")))
        })
        .collect();
    // Longest, then greatest, name last: `libnvrtc.so.13.0.88` over `libnvrtc.so.13`.
    found.sort_by_key(|p| (p.as_os_str().len(), p.clone()));
    found.pop()
}

/// Where CUDA installs put NVRTC, and where Python wheels do, in order.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"] {
        if let Some(root) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let root = PathBuf::from(root);
            dirs.push(root.join("lib64"));
            dirs.push(root.join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    dirs.push(PathBuf::from("/usr/local/cuda/targets/sbsa-linux/lib"));
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    dirs.push(PathBuf::from("/usr/lib/aarch64-linux-gnu"));
    for site in site_packages() {
        for sub in ["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"] {
            dirs.push(site.join(sub));
        }
    }
    dirs
}

/// Python package directories where NVIDIA's wheels may be: the active virtual or conda
/// environment's, the user's, and the system's.
fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|v| std::env::var_os(v).filter(|v| !v.is_empty()))
        .map(|p| PathBuf::from(p).join("lib"))
        .collect();
    if let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        roots.push(PathBuf::from(home).join(".local/lib"));
    }
    roots.push(PathBuf::from("/usr/local/lib"));
    roots.push(PathBuf::from("/usr/lib"));
    let mut out = Vec::new();
    for root in roots {
        let Ok(entries) = fs::read_dir(&root) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for python in pythons.into_iter().rev() {
            out.push(python.join("site-packages"));
            out.push(python.join("dist-packages"));
        }
    }
    out
}

/// NVRTC's options for a device of compute capability `(major, minor)`.
///
/// - CUBIN for the exact architecture (`sm_XY`, not `compute_XY`): no PTX is left for the
///   driver to JIT, so an NVRTC newer than the driver never produces "PTX too new" errors.
/// - `--fmad=false`: NVRTC contracts `a * b + c` into an `fma` by default, one rounding
///   where the reference interpreter does two.
/// - `--ftz=false --prec-div=true --prec-sqrt=true`: NVRTC's defaults, stated so that the
///   key of every cached kernel records them: subnormals kept, `float` `/` and `sqrtf`
///   correctly rounded. Never `--use_fast_math`.
/// - `--std=c++17`: hexadecimal float literals (the `erf` helper's coefficients).
pub(crate) fn options(capability: (i32, i32)) -> Vec<String> {
    vec![
        format!("--gpu-architecture=sm_{}{}", capability.0, capability.1),
        "--fmad=false".into(),
        "--ftz=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--std=c++17".into(),
    ]
}

/// The disk-cache key of a kernel: the source, the options (which name the architecture),
/// NVRTC's and the driver's versions, and this crate's version (which pins the emitter).
pub(crate) fn cache_key(source: &str, options: &[String], nvrtc: (i32, i32), driver: i32) -> u128 {
    let mut hash = Fnv128::new();
    hash.field(source.as_bytes());
    for option in options {
        hash.field(option.as_bytes());
    }
    hash.field(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    hash.field(format!("driver {driver}").as_bytes());
    hash.field(env!("CARGO_PKG_VERSION").as_bytes());
    hash.finish()
}

/// Bytes after a cached CUBIN: its length (u64) and its `Fnv128` checksum (u128), little
/// endian. The driver finds an image's length in its ELF header, so a truncated or damaged
/// file must never reach it: one that does not match its trailer is not loaded.
const TRAILER: usize = 24;

/// The cached CUBIN of `key` in `dir`, if present and whole (its trailer matches).
pub(crate) fn read_cached(dir: &Path, key: u128) -> Option<Vec<u8>> {
    let path = dir.join(format!("{key:032x}.cubin"));
    let mut file = fs::read(&path).ok()?;
    let verified = verify_trailer(&file);
    if verified.is_none() {
        tracing::debug!(
            "tessel-cuda: the cached kernel {} is damaged ({} bytes); compiling it again",
            path.display(),
            file.len()
        );
        return None;
    }
    file.truncate(file.len() - TRAILER);
    Some(file)
}

/// `Some(())` when `file` ends in the trailer of the bytes before it.
fn verify_trailer(file: &[u8]) -> Option<()> {
    let body_len = file.len().checked_sub(TRAILER)?;
    let (body, trailer) = file.split_at(body_len);
    let len = u64::from_le_bytes(trailer[..8].try_into().ok()?);
    let sum = u128::from_le_bytes(trailer[8..].try_into().ok()?);
    (len == body_len as u64 && sum == checksum(body) && body_len > 0).then_some(())
}

fn checksum(bytes: &[u8]) -> u128 {
    let mut hash = Fnv128::new();
    hash.bytes(bytes);
    hash.finish()
}

/// `cubin` followed by its trailer: what the cache stores.
fn with_trailer(cubin: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(cubin.len() + TRAILER);
    file.extend_from_slice(cubin);
    file.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    file.extend_from_slice(&checksum(cubin).to_le_bytes());
    file
}

/// Stores a CUBIN with its trailer (and its source, for whoever debugs the kernel) under
/// `key`. Writes go to
/// a uniquely named file that is then renamed, so a concurrent reader sees either nothing or
/// the whole file. Failures only cost a later recompile, so they are logged, not returned.
pub(crate) fn write_cached(dir: &Path, key: u128, cubin: &[u8], source: &str) {
    let unique = temp_suffix();
    let result = fs::create_dir_all(dir).and_then(|()| {
        let temp = dir.join(format!("{key:032x}.{unique}"));
        fs::write(&temp, with_trailer(cubin))?;
        fs::rename(&temp, dir.join(format!("{key:032x}.cubin"))).inspect_err(|_| {
            let _ = fs::remove_file(&temp);
        })?;
        let temp = dir.join(format!("{key:032x}.{unique}.cu"));
        fs::write(&temp, source)?;
        fs::rename(&temp, dir.join(format!("{key:032x}.cu")))
    });
    if let Err(e) = result {
        tracing::debug!(
            "tessel-cuda: cannot write the kernel cache in {}: {e}",
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{TRAILER, cache_key, find_in, options, read_cached, with_trailer, write_cached};

    #[test]
    fn damaged_cache_entries_are_not_loaded() {
        let dir = std::env::temp_dir().join(format!("tessel-cuda-trailer-{}", std::process::id()));
        let cubin: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        write_cached(&dir, 7, &cubin, "source");
        assert_eq!(read_cached(&dir, 7).as_deref(), Some(&cubin[..]));
        let path = dir.join(format!("{:032x}.cubin", 7u128));
        let whole = with_trailer(&cubin);
        let mut flipped = whole.clone();
        flipped[500] ^= 1;
        for (case, bytes) in [
            ("empty", Vec::new()),
            ("garbage", b"not a cubin at all, and long enough".to_vec()),
            ("truncated", whole[..700].to_vec()),
            ("no trailer", cubin.clone()),
            ("one bit flipped", flipped),
            ("an empty image", with_trailer(&[])),
            ("the trailer alone", whole[whole.len() - TRAILER..].to_vec()),
        ] {
            std::fs::write(&path, bytes).unwrap();
            assert_eq!(read_cached(&dir, 7), None, "{case}");
        }
        assert_eq!(read_cached(&dir, 8), None, "missing");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn keys_cover_every_input() {
        let opts = options((9, 0));
        assert_eq!(opts[0], "--gpu-architecture=sm_90");
        assert!(opts.contains(&"--fmad=false".to_owned()));
        let key = cache_key("src", &opts, (13, 0), 13000);
        assert_ne!(key, cache_key("src2", &opts, (13, 0), 13000));
        assert_ne!(key, cache_key("src", &options((8, 0)), (13, 0), 13000));
        assert_ne!(key, cache_key("src", &opts, (13, 1), 13000));
        assert_ne!(key, cache_key("src", &opts, (13, 0), 13010));
        assert_eq!(key, cache_key("src", &opts, (13, 0), 13000));
    }

    #[test]
    fn finds_versioned_libraries() {
        let dir = std::env::temp_dir().join(format!("tessel-cuda-find-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "libnvrtc.so.13",
            "libnvrtc-builtins.so.13.0",
            "libnvrtc.so.13.0.88",
        ] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let found = find_in(&dir, "libnvrtc.so").unwrap();
        assert_eq!(found.file_name().unwrap(), "libnvrtc.so.13.0.88");
        let builtins = find_in(&dir, "libnvrtc-builtins.so").unwrap();
        assert_eq!(builtins.file_name().unwrap(), "libnvrtc-builtins.so.13.0");
        assert!(find_in(&dir, "libcuda.so").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
