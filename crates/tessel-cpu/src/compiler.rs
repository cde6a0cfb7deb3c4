//! Compiling generated C into shared libraries, with an on-disk cache.
//!
//! A library's cache key hashes everything its bytes depend on: the source, the compiler's
//! path and its `--version` output, the flags, and this crate's version (which pins the
//! emitter). So a new compiler, new flags or a new Tessel never load a stale library, and a
//! second process finds every kernel the first one compiled.
//!
//! Kernels compiled together share one library file, linked under each kernel's key, so a
//! later process finds each kernel alone whatever it was built with. Writes are atomic: the
//! compiler writes a uniquely named temporary file, which is then linked and renamed to each
//! final name, so a concurrent reader (another thread or process) sees either no library or
//! a complete one, never a partial one.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use tessel_ir::cache::{Fnv128, temp_suffix};
use tessel_ir::codegen;

/// Flags for every kernel. `-fwrapv` and `-ffp-contract=off` keep C's arithmetic equal to
/// the interpreter's (wrapping integers, no fused multiply-adds the IR did not ask for);
/// `-fno-math-errno` lets `sqrt` compile to one instruction and `-fno-trapping-math` lets
/// the vectorizer compute both arms of a select (nothing reads the floating-point
/// exception flags), neither changing any result. No `-ffast-math`: it would trade IEEE
/// results for speed. The C dialect declares the `<math.h>` functions it calls itself;
/// `-Werror=implicit-function-declaration` makes one it missed a compile error, never a
/// call through an implicit `int` declaration.
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
    "-Werror=implicit-function-declaration",
];

/// Flags used where the compiler accepts them (GCC's, which Clang rejects).
/// `-fno-thread-jumps`: GCC threads the jumps of consecutive selects on one value (the
/// range clamps in `tsl_expf`) into control flow its vectorizer then refuses.
const OPTIONAL_FLAGS: &[&str] = &["-fno-thread-jumps"];

/// How a library names what it defines ([`symbol`]): part of the cache key, so a library
/// from a build that named its entry functions otherwise is never loaded.
const LAYOUT: &str = "entry functions named tessel_kernel_{key}";

/// Libraries linked after the source.
const LIBS: &[&str] = &["-lm"];

/// A lean link, used where a probe library linked so loads ([`links_lean`]): no C runtime
/// start files or default libraries, only libm and libgcc's static helpers (the C library's
/// functions a compiler may call, `memcpy`, resolve against the process's own). The
/// default link is a fifth of a small kernel's build.
const LEAN_LIBS: &[&str] = &["-nostdlib", "-lm", "-lgcc"];

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
    /// [`LEAN_LIBS`] where they link a library that loads, else [`LIBS`].
    pub(crate) libs: &'static [&'static str],
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
        let libs = if links_lean(path, &flags) {
            LEAN_LIBS
        } else {
            LIBS
        };
        Some(Compiler {
            path: path.to_owned(),
            version: String::from_utf8_lossy(&out.stdout).into_owned(),
            target: macros(&flags).unwrap_or_default(),
            flags,
            libs,
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
        for flag in self.flags.iter().chain(self.libs) {
            hash.field(flag.as_bytes());
        }
        hash.field(env!("CARGO_PKG_VERSION").as_bytes());
        hash.field(LAYOUT.as_bytes());
        hash.finish()
    }

    /// Builds the library `dir/<key>.so` of every part that is not there yet, with one
    /// compiler run: the sources are combined into one ([`codegen::combine`]), each entry
    /// function renamed [`symbol`]`(key)`, and the library is linked under each
    /// missing key. Returns, per part, whether a compile built it. Each source is kept next
    /// to its library as `<key>.c`, for whoever debugs a kernel.
    ///
    /// A compiler run costs about 50 ms before its first kernel (starting the compiler,
    /// reading the headers, linking), the same again as an average kernel's own code: a
    /// planner's candidates built together cost half as much.
    pub(crate) fn build(&self, dir: &Path, parts: &[Part<'_>]) -> Result<Vec<bool>, BuildError> {
        let mut seen = std::collections::HashSet::new();
        let missing: Vec<bool> = parts
            .iter()
            .map(|p| !library_path(dir, p.key).is_file())
            .collect();
        let pending: Vec<&Part<'_>> = (parts.iter().zip(&missing))
            .filter(|&(p, &missing)| missing && seen.insert(p.key))
            .map(|(p, _)| p)
            .collect();
        if pending.is_empty() {
            return Ok(missing);
        }
        fs::create_dir_all(dir)
            .map_err(|e| BuildError::Io(format!("cannot create {}: {e}", dir.display())))?;
        let symbols: Vec<String> = pending.iter().map(|p| symbol(p.key)).collect();
        let combined: Vec<(&str, &str, &str)> = (pending.iter().zip(&symbols))
            .map(|(p, symbol)| (p.source, ENTRY, symbol.as_str()))
            .collect();
        let source = codegen::combine(&combined)
            .ok_or_else(|| BuildError::Compiler(format!("a source does not define `{ENTRY}`")))?;
        let unique = temp_suffix();
        let first = pending[0].key;
        let c_temp = dir.join(format!("{first:032x}.{unique}.c"));
        let lib_temp = dir.join(format!(
            "{first:032x}.{unique}{}",
            std::env::consts::DLL_SUFFIX
        ));
        let io = |what: &str, path: &Path, e: io::Error| {
            BuildError::Io(format!("cannot {what} {}: {e}", path.display()))
        };
        fs::write(&c_temp, &source).map_err(|e| io("write", &c_temp, e))?;
        let out = Command::new(&self.path)
            .args(&self.flags)
            .arg("-o")
            .arg(&lib_temp)
            .arg(&c_temp)
            .args(self.libs)
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
                    command_line(self, &lib_temp, &c_temp),
                    out.status,
                    log.trim_end()
                )))
            }
            Ok(_) => pending
                .iter()
                .try_for_each(|p| publish(&lib_temp, &library_path(dir, p.key), &unique))
                .map_err(|(path, e)| io("put into place", &path, e)),
        };
        let _ = fs::remove_file(&lib_temp);
        let _ = fs::remove_file(&c_temp);
        result?;
        for p in &pending {
            // For reading only; losing it to a concurrent writer of the same text is harmless.
            let _ = fs::write(dir.join(format!("{:032x}.c", p.key)), p.source);
        }
        Ok(missing)
    }
}

/// One kernel of a [`Compiler::build`].
pub(crate) struct Part<'a> {
    /// [`Compiler::key`] of `source`.
    pub(crate) key: u128,
    /// The kernel's source, [`anonymous`].
    pub(crate) source: &'a str,
}

/// The entry function's name in an [`anonymous`] source.
const ENTRY: &str = "tessel_kernel";

/// `source`, a kernel that [`codegen::render`] printed, without what names the kernel: the
/// leading comment, and the entry function `entry` named [`ENTRY`]. Kernels that differ only
/// in name (a suite's tests record the same reduction under several) share one library.
pub(crate) fn anonymous(source: &str, entry: &str) -> String {
    let body = match source.strip_prefix("/*") {
        Some(rest) => rest.find("*/\n").map_or(source, |end| &rest[end + 3..]),
        None => source,
    };
    body.replacen(&format!(" {entry}("), &format!(" {ENTRY}("), 1)
}

/// The name the library `<key>.so` gives the entry function of the [`anonymous`] source with
/// key `key`: unique in a library built from several sources, and the same whichever other
/// kernels a library was built with.
pub(crate) fn symbol(key: u128) -> String {
    format!("{ENTRY}_{key:032x}")
}

/// Puts the built library `built` at `library`, atomically: a hard link (or, where the file
/// system has none, a copy) under a temporary name, renamed into place, so a concurrent
/// reader sees no library or a complete one.
fn publish(built: &Path, library: &Path, unique: &str) -> Result<(), (PathBuf, io::Error)> {
    let temp = library.with_extension(format!("{unique}.link"));
    fs::hard_link(built, &temp)
        .or_else(|_| fs::copy(built, &temp).map(drop))
        .and_then(|()| fs::rename(&temp, library))
        .map_err(|e| {
            let _ = fs::remove_file(&temp);
            (library.to_owned(), e)
        })
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
fn command_line(cc: &Compiler, out: &Path, input: &Path) -> String {
    let mut parts: Vec<&OsStr> = vec![cc.path.as_os_str()];
    parts.extend(cc.flags.iter().map(OsStr::new));
    parts.push(OsStr::new("-o"));
    parts.push(out.as_os_str());
    parts.push(input.as_os_str());
    parts.extend(cc.libs.iter().map(OsStr::new));
    parts
        .iter()
        .map(|p| p.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `cc` with `flags` and [`LEAN_LIBS`] links a library that loads: one calling libm
/// and a loop the compiler turns into `memcpy`, in a temporary directory removed after.
fn links_lean(cc: &Path, flags: &[&str]) -> bool {
    let dir = std::env::temp_dir().join(format!("tessel-cc-probe.{}", temp_suffix()));
    let source = dir.join("probe.c");
    let library = dir.join(format!("probe{}", std::env::consts::DLL_SUFFIX));
    let probe = "double erf(double);\n\
                 double tsl_probe(double x) { return erf(x); }\n\
                 void tsl_copy(char *restrict d, const char *restrict s, long n) { for (long i = 0; i < n; ++i) d[i] = s[i]; }\n";
    let linked = fs::create_dir_all(&dir).is_ok()
        && fs::write(&source, probe).is_ok()
        && Command::new(cc)
            .args(flags)
            .arg("-o")
            .arg(&library)
            .arg(&source)
            .args(LEAN_LIBS)
            .output()
            .is_ok_and(|out| out.status.success())
        && load(&library).is_ok();
    let _ = fs::remove_dir_all(&dir);
    linked
}

/// Loads the library at `path`, resolving every symbol now: a symbol missing from the
/// process is an error here, never a crash at a kernel's first call.
pub(crate) fn load(path: &Path) -> Result<libloading::Library, libloading::Error> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: the library was built by `Compiler::build` from source that
        // `codegen::render` generated (or by `links_lean` from its probe): plain C
        // functions, with no initializers or destructors that could run on load or unload.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Into::into)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above.
        unsafe { libloading::Library::new(path) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GCC on Linux links kernels lean, and the probe leaves no files behind.
    #[test]
    fn gcc_on_linux_links_lean() {
        let Some(gcc) = Compiler::probe(Path::new("gcc")) else {
            return;
        };
        if cfg!(target_os = "linux") {
            assert_eq!(gcc.libs, LEAN_LIBS);
        }
        let probes = fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("tessel-cc-probe.")
                    && name.contains(&format!(".{}.", std::process::id()))
            })
            .count();
        assert_eq!(probes, 0);
    }
}
