//! Compiling generated C into shared libraries, with an on-disk cache.
//!
//! A library's cache key hashes everything its bytes depend on: the source, the compiler's
//! path and its `--version` output, the flags, and this crate's version (which pins the
//! emitter). So a new compiler, new flags or a new Tessel never load a stale library, and a
//! second process finds every kernel the first one compiled.
//!
//! Writes are atomic: the compiler writes a uniquely named temporary file, which is then
//! renamed to its final name, so a concurrent reader (another thread or process) sees
//! either no library or a complete one, never a partial one.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use tessel_ir::cache::{Fnv128, temp_suffix};

/// Flags for every kernel. `-fwrapv` and `-ffp-contract=off` keep C's arithmetic equal to
/// the interpreter's (wrapping integers, no fused multiply-adds the IR did not ask for);
/// `-fno-math-errno` lets `sqrt` compile to one instruction and `-fno-trapping-math` lets
/// the vectorizer compute both arms of a select (nothing reads the floating-point
/// exception flags), neither changing any result. No `-ffast-math`: it would trade IEEE
/// results for speed.
pub(crate) const FLAGS: &[&str] = &[
    "-std=c11",
    "-O3",
    "-march=native",
    "-fPIC",
    "-shared",
    "-fwrapv",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-trapping-math",
];

/// Flags used where the compiler accepts them (GCC's, which Clang rejects).
/// `-fno-thread-jumps`: GCC threads the jumps of consecutive selects on one value (the
/// range clamps in `tsl_expf`) into control flow its vectorizer then refuses.
const OPTIONAL_FLAGS: &[&str] = &["-fno-thread-jumps"];

/// Libraries linked after the source.
const LIBS: &[&str] = &["-lm"];

/// A C compiler that ran `--version` successfully.
#[derive(Clone, Debug)]
pub(crate) struct Compiler {
    pub(crate) path: PathBuf,
    /// Its `--version` output: part of the cache key, since a different compiler may
    /// generate different code from the same source.
    version: String,
    /// The macros it predefines with [`FLAGS`]: part of the cache key, because
    /// `-march=native` means this machine's instruction set (`__AVX512F__` or not), and a
    /// library built for another machine's may not run here (a cache directory shared
    /// between machines, a container image).
    target: String,
    /// [`FLAGS`] and the [`OPTIONAL_FLAGS`] this compiler accepts.
    flags: Vec<&'static str>,
}

impl Compiler {
    /// `path` if it runs `--version` successfully.
    pub(crate) fn probe(path: &Path) -> Option<Compiler> {
        let out = Command::new(path).arg("--version").output().ok()?;
        if !out.status.success() {
            return None;
        }
        // `-E -dM` on an empty file prints the predefined macros, with gcc and clang alike.
        let macros = |flags: &[&str]| {
            Command::new(path)
                .args(flags.iter().filter(|f| **f != "-shared"))
                .args(["-E", "-dM", "-x", "c", "/dev/null"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        };
        let mut flags = FLAGS.to_vec();
        for &flag in OPTIONAL_FLAGS {
            if macros(&[flag]).is_some() {
                flags.push(flag);
            }
        }
        Some(Compiler {
            path: path.to_owned(),
            version: String::from_utf8_lossy(&out.stdout).into_owned(),
            target: macros(&flags).unwrap_or_default(),
            flags,
        })
    }

    /// `explicit` if given (and it works), otherwise the first of `cc`, `gcc`, `clang`
    /// that works.
    pub(crate) fn discover(explicit: Option<&Path>) -> Option<Compiler> {
        match explicit {
            Some(path) => Compiler::probe(path),
            None => ["cc", "gcc", "clang"]
                .into_iter()
                .find_map(|name| Compiler::probe(Path::new(name))),
        }
    }

    /// The cache key of the library built from `source`.
    pub(crate) fn key(&self, source: &str) -> u128 {
        let mut hash = Fnv128::new();
        hash.field(source.as_bytes());
        hash.field(self.path.as_os_str().as_encoded_bytes());
        hash.field(self.version.as_bytes());
        hash.field(self.target.as_bytes());
        for flag in self.flags.iter().chain(LIBS) {
            hash.field(flag.as_bytes());
        }
        hash.field(env!("CARGO_PKG_VERSION").as_bytes());
        hash.finish()
    }

    /// Compiles `source` into the library `dir/<key>.so`, unless it is already there.
    /// Returns whether a compile ran. The source is kept next to it as `<key>.c`, for
    /// whoever debugs a kernel.
    pub(crate) fn build(&self, dir: &Path, key: u128, source: &str) -> Result<bool, BuildError> {
        let library = library_path(dir, key);
        if library.is_file() {
            return Ok(false);
        }
        fs::create_dir_all(dir)
            .map_err(|e| BuildError::Io(format!("cannot create {}: {e}", dir.display())))?;
        let unique = temp_suffix();
        let c_temp = dir.join(format!("{key:032x}.{unique}.c"));
        let lib_temp = dir.join(format!(
            "{key:032x}.{unique}{}",
            std::env::consts::DLL_SUFFIX
        ));
        let io = |what: &str, path: &Path, e: io::Error| {
            BuildError::Io(format!("cannot {what} {}: {e}", path.display()))
        };
        fs::write(&c_temp, source).map_err(|e| io("write", &c_temp, e))?;
        let out = Command::new(&self.path)
            .args(&self.flags)
            .arg("-o")
            .arg(&lib_temp)
            .arg(&c_temp)
            .args(LIBS)
            .output();
        let result = match out {
            Err(e) => Err(BuildError::Io(format!(
                "cannot run {}: {e}",
                self.path.display()
            ))),
            Ok(out) if !out.status.success() || !lib_temp.is_file() => {
                let mut log = String::from_utf8_lossy(&out.stderr).into_owned();
                log.push_str(&String::from_utf8_lossy(&out.stdout));
                Err(BuildError::Compiler(format!(
                    "{} exited with {}:\n{}",
                    command_line(&self.path, &self.flags, &lib_temp, &c_temp),
                    out.status,
                    log.trim_end()
                )))
            }
            Ok(_) => {
                fs::rename(&lib_temp, &library).map_err(|e| io("rename into place", &library, e))
            }
        };
        if let Err(e) = result {
            let _ = fs::remove_file(&lib_temp);
            let _ = fs::remove_file(&c_temp);
            return Err(e);
        }
        // The source is for reading only; losing it to a concurrent rename is harmless.
        let _ = fs::rename(&c_temp, dir.join(format!("{key:032x}.c")));
        Ok(true)
    }
}

/// Why a library could not be built.
#[derive(Debug)]
pub(crate) enum BuildError {
    /// The compiler rejected the source; the message includes its diagnostics.
    Compiler(String),
    /// The file system or process spawning failed.
    Io(String),
}

/// The path of the library with cache key `key` in `dir`.
pub(crate) fn library_path(dir: &Path, key: u128) -> PathBuf {
    dir.join(format!("{key:032x}{}", std::env::consts::DLL_SUFFIX))
}

/// The compiler invocation as a shell would show it, for error messages.
fn command_line(cc: &Path, flags: &[&str], out: &Path, input: &Path) -> String {
    let mut parts: Vec<&OsStr> = vec![cc.as_os_str()];
    parts.extend(flags.iter().map(OsStr::new));
    parts.push(OsStr::new("-o"));
    parts.push(out.as_os_str());
    parts.push(input.as_os_str());
    parts.extend(LIBS.iter().map(OsStr::new));
    parts
        .iter()
        .map(|p| p.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
