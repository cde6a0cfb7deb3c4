//! `cargo xtask test-gpu`: the conformance suite once per backend present, one table.
//!
//! The suite is every test binary of `tessel-tensor`, `tessel-runtime` and `tessel-models` (run once per
//! backend, with `TESSEL_DEVICE` naming it) plus each backend crate's own tests (run in that
//! backend's row). Which backends exist is learnt at run time from the suite's device listing
//! (`tessel-device:` lines), so the same binaries serve every machine. A dtype a device
//! cannot compute is skipped by the tests with a `tessel-skip:` line, counted here.
//!
//! `--bundle DIR` builds the same binaries (release, stripped), a release build of this
//! program and a `run` script into `DIR`, for a GPU host without a Rust toolchain:
//! `DIR/run` prints the same table.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Instant;

/// Every backend, in table order.
const BACKENDS: [&str; 4] = ["cpu", "wgpu", "opencl", "cuda"];

/// The package whose tests run on every backend, and whose features select the backends.
const SUITE: &str = "tessel-tensor";

/// The other packages whose tests also run on every backend: the runtime's (plans placed
/// on a second device, runner-up plans) and real models against PyTorch's outputs.
const ON_EVERY_BACKEND: [&str; 2] = ["tessel-runtime", "tessel-models"];

/// One test executable.
#[derive(Clone, Debug)]
pub(crate) struct Binary {
    /// The Cargo package it tests.
    pub(crate) package: String,
    /// The test target's name (`suite`, `memory`, or the package's for unit tests).
    pub(crate) target: String,
    pub(crate) path: PathBuf,
}

/// What the command line asked for.
struct Options {
    /// The backends named with `--backends`, if any.
    backends: Option<Vec<String>>,
    bundle: Option<PathBuf>,
    release: bool,
    /// Processes per test binary: each runs a share of its tests. Above 1 it helps where
    /// kernel compiles are slow and do not overlap within a process (NVIDIA's OpenCL).
    jobs: usize,
    /// Skip each backend crate's own tests (CI runs them in `cargo test --workspace`,
    /// where they find every driver present).
    suite_only: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        backends: None,
        bundle: None,
        release: false,
        jobs: 1,
        suite_only: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--backends" => {
                let list = args
                    .next()
                    .ok_or("--backends needs a list, as in cpu,wgpu")?;
                let names: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(bad) = names.iter().find(|n| !BACKENDS.contains(&n.as_str())) {
                    return Err(format!(
                        "unknown backend `{bad}` in --backends; known: {}",
                        BACKENDS.join(",")
                    ));
                }
                options.backends = Some(names);
            }
            "--bundle" => {
                let dir = args.next().ok_or("--bundle needs a directory")?;
                options.bundle = Some(PathBuf::from(dir));
            }
            "--release" => options.release = true,
            "--suite-only" => options.suite_only = true,
            "--jobs" => {
                options.jobs = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--jobs needs a positive number of processes, as in --jobs 8")?;
            }
            other => return Err(format!("test-gpu: unknown option `{other}`")),
        }
    }
    Ok(options)
}

/// `cargo xtask test-gpu [--backends LIST] [--bundle DIR] [--release]`.
pub(crate) fn main(root: &Path, args: &[String]) -> Result<(), String> {
    let options = parse(args)?;
    let build_for: Vec<String> = options
        .backends
        .clone()
        .unwrap_or_else(|| BACKENDS.iter().map(|b| (*b).to_string()).collect());
    let release = options.release || options.bundle.is_some();
    let binaries = build(root, &build_for, release)?;
    if let Some(dir) = &options.bundle {
        return bundle(root, dir, &binaries);
    }
    run_suite(
        &binaries,
        options.backends.as_deref(),
        options.jobs,
        options.suite_only,
        &target_dir(root).join("test-gpu"),
    )
}

/// `DIR/xtask run-bundle DIR [--backends LIST]`: what the bundle's `run` script does.
pub(crate) fn run_bundle(args: &[String]) -> Result<(), String> {
    let dir = PathBuf::from(
        args.first()
            .ok_or("run-bundle needs the bundle directory")?,
    );
    let options = parse(&args[1..])?;
    let manifest = fs::read_to_string(dir.join("manifest"))
        .map_err(|e| format!("cannot read {}: {e}", dir.join("manifest").display()))?;
    let binaries = manifest
        .lines()
        .filter_map(|line| {
            let mut parts = line.split('\t');
            Some(Binary {
                package: parts.next()?.to_string(),
                target: parts.next()?.to_string(),
                path: dir.join(parts.next()?),
            })
        })
        .collect::<Vec<_>>();
    run_suite(
        &binaries,
        options.backends.as_deref(),
        options.jobs,
        options.suite_only,
        &dir.join("logs"),
    )
}

// =====================================================================================
// Building
// =====================================================================================

/// Builds the test binaries of the suite and of the backends' crates, with the backends'
/// features on, and returns them.
fn build(root: &Path, backends: &[String], release: bool) -> Result<Vec<Binary>, String> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root)
        .args([
            "test",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(["-p", SUITE]);
    for package in ON_EVERY_BACKEND {
        cmd.args(["-p", package]);
    }
    let mut features = Vec::new();
    for backend in backends {
        cmd.args(["-p", &format!("tessel-{backend}")]);
        if backend != "cpu" {
            features.push(format!("{SUITE}/{backend}"));
        }
    }
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    if release {
        // `cargo test --release` builds tests with the release profile's settings.
        cmd.arg("--release")
            .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
            .env("CARGO_PROFILE_RELEASE_DEBUG", "false");
    }
    eprintln!("xtask: building the suite for {}", backends.join(", "));
    let output = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("building the suite failed ({})", output.status));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let binaries: Vec<Binary> = stdout.lines().filter_map(test_artifact).collect();
    if binaries.is_empty() {
        return Err("cargo built no test binaries".into());
    }
    Ok(binaries)
}

pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The test executable a `compiler-artifact` message of `cargo --message-format=json`
/// describes, if it is one. Cargo's JSON is parsed by hand to keep xtask dependency-free:
/// the fields read are flat strings without escapes in them.
pub(crate) fn test_artifact(line: &str) -> Option<Binary> {
    if !line.contains(r#""reason":"compiler-artifact""#) || !line.contains(r#""test":true"#) {
        return None;
    }
    let field = |name: &str| {
        let key = format!(r#""{name}":""#);
        let start = line.find(&key)? + key.len();
        let end = start + line[start..].find('"')?;
        Some(line[start..end].to_string())
    };
    let path = PathBuf::from(field("executable")?);
    // `path+file:///dir/tessel-tensor#0.1.0` or `...#name@0.1.0`.
    let id = field("package_id")?;
    let (location, version) = id.rsplit_once('#')?;
    let package = match version.split_once('@') {
        Some((name, _)) => name.to_string(),
        None => location.rsplit('/').next()?.to_string(),
    };
    // The target's name is the first `"name"` after `"target"`.
    let target_at = line.find(r#""target":"#)?;
    let rest = &line[target_at..];
    let start = rest.find(r#""name":""#)? + r#""name":""#.len();
    let target = rest[start..start + rest[start..].find('"')?].to_string();
    Some(Binary {
        package,
        target,
        path,
    })
}

/// Cargo's target directory: `$CARGO_TARGET_DIR`, else `target/` under the workspace.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Copies the binaries, a release xtask and the `run` script into `dir`.
fn bundle(root: &Path, dir: &Path, binaries: &[Binary]) -> Result<(), String> {
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).map_err(|e| io("creating the bundle directory", e))?;
    let mut manifest = String::new();
    for b in binaries {
        let file = format!("bin/{}__{}", b.package, b.target);
        fs::copy(&b.path, dir.join(&file))
            .map_err(|e| io(&format!("copying {}", b.path.display()), e))?;
        writeln!(manifest, "{}\t{}\t{file}", b.package, b.target).expect("writing to a String");
    }
    fs::write(dir.join("manifest"), manifest).map_err(|e| io("writing the manifest", e))?;

    let status = Command::new(cargo())
        .current_dir(root)
        .args(["build", "--release", "-p", "xtask"])
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .status()
        .map_err(|e| io("building xtask", e))?;
    if !status.success() {
        return Err(format!("building xtask failed ({status})"));
    }
    fs::copy(target_dir(root).join("release/xtask"), dir.join("xtask"))
        .map_err(|e| io("copying xtask", e))?;
    let script = dir.join("run");
    fs::write(&script, RUN_SCRIPT).map_err(|e| io("writing run", e))?;
    make_executable(&script)?;
    eprintln!(
        "xtask: bundle ready in {} ({} test binaries); run `{}/run` on the GPU host",
        dir.display(),
        binaries.len(),
        dir.display()
    );
    Ok(())
}

const RUN_SCRIPT: &str = r#"#!/bin/sh
# Runs Tessel's conformance suite on every backend this host has and prints one table.
# Options: --backends cpu,wgpu,opencl,cuda (a named backend that is absent fails the run);
# --jobs N runs each test binary as N processes sharing its tests (for slow compilers).
# Logs go to logs/ beside this script.
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/xtask" run-bundle "$here" "$@"
"#;

#[cfg(unix)]
pub(crate) fn make_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

#[cfg(not(unix))]
pub(crate) fn make_executable(_: &Path) -> Result<(), String> {
    Ok(())
}

// =====================================================================================
// Running
// =====================================================================================

/// One backend's results.
#[derive(Default)]
struct Row {
    backend: String,
    device: String,
    passed: u64,
    failed: u64,
    skipped: u64,
    seconds: f64,
    failures: Vec<String>,
}

/// Runs every binary for each backend present and prints the table. `requested` is the
/// explicit `--backends` list: those must all be present.
fn run_suite(
    binaries: &[Binary],
    requested: Option<&[String]>,
    jobs: usize,
    suite_only: bool,
    logs: &Path,
) -> Result<(), String> {
    fs::create_dir_all(logs).map_err(|e| format!("creating {}: {e}", logs.display()))?;
    let devices = probe(binaries)?;
    let wanted: Vec<String> = match requested {
        Some(list) => list.to_vec(),
        None => BACKENDS.iter().map(|b| (*b).to_string()).collect(),
    };
    let mut rows = Vec::new();
    let mut absent = Vec::new();
    for backend in &wanted {
        let Some(device) = devices.iter().find(|(b, _)| b == backend) else {
            absent.push(backend.clone());
            continue;
        };
        rows.push(run_backend(
            binaries,
            backend,
            &device.1,
            (jobs, suite_only),
            logs,
        )?);
    }

    let mut table = String::from(
        "\nbackend  device                                    passed  failed  skipped     time\n",
    );
    for r in &rows {
        writeln!(
            table,
            "{:<8} {:<40} {:>7} {:>7} {:>8} {:>7.1} s",
            r.backend,
            truncate(&r.device, 40),
            r.passed,
            r.failed,
            r.skipped,
            r.seconds
        )
        .expect("writing to a String");
    }
    for b in &absent {
        let note = if requested.is_some() {
            "ABSENT (requested)"
        } else {
            "absent"
        };
        writeln!(table, "{b:<8} {note}").expect("writing to a String");
    }
    println!("{table}");
    for r in rows.iter().filter(|r| r.failed > 0) {
        println!(
            "{} failures (log: {}):",
            r.backend,
            logs.join(format!("{}.log", r.backend)).display()
        );
        for f in &r.failures {
            println!("  {f}");
        }
    }
    let failed: u64 = rows.iter().map(|r| r.failed).sum();
    if failed > 0 {
        return Err(format!("{failed} test(s) failed"));
    }
    if requested.is_some() && !absent.is_empty() {
        return Err(format!(
            "requested backend(s) not present on this machine: {}",
            absent.join(", ")
        ));
    }
    if rows.is_empty() {
        return Err("no backend was present".into());
    }
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}

/// The first device of each backend present: `(backend, "backend:0 name")`, from the
/// suite's device listing.
fn probe(binaries: &[Binary]) -> Result<Vec<(String, String)>, String> {
    let suite = binaries
        .iter()
        .find(|b| b.package == SUITE && b.target == "suite")
        .ok_or("the bundle has no tessel-tensor `suite` binary")?;
    let output = Command::new(&suite.path)
        .args(["devices::", "--show-output", "--test-threads=1"])
        .env_remove("TESSEL_DEVICE")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", suite.path.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "listing devices failed:\n{text}{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let mut found: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("tessel-device: ") else {
            continue;
        };
        let backend = rest.split(':').next().unwrap_or_default().to_string();
        if !found.iter().any(|(b, _)| *b == backend) {
            found.push((backend, rest.to_string()));
        }
    }
    Ok(found)
}

/// Runs the suite on `backend` and, unless `suite_only`, the backend crate's own tests.
fn run_backend(
    binaries: &[Binary],
    backend: &str,
    device: &str,
    (jobs, suite_only): (usize, bool),
    logs: &Path,
) -> Result<Row, String> {
    let own = format!("tessel-{backend}");
    let mut row = Row {
        backend: backend.to_string(),
        device: device.to_string(),
        ..Row::default()
    };
    // Written after every binary, so a run cut short still leaves its logs.
    let path = logs.join(format!("{backend}.log"));
    let mut log =
        fs::File::create(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    let start = Instant::now();
    for b in binaries.iter().filter(|b| {
        b.package == SUITE
            || ON_EVERY_BACKEND.contains(&b.package.as_str())
            || (b.package == own && !suite_only)
    }) {
        let (passed, failed, skipped) = (row.passed, row.failed, row.skipped);
        let binary_start = Instant::now();
        for output in run_binary(b, backend, jobs)? {
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            // A log that cannot be written loses diagnostics, not results.
            let _ = writeln!(
                log,
                "==== {} {} ({})\n{stdout}{stderr}",
                b.package, b.target, output.status
            );
            tally(&mut row, b, output.status, &stdout, &stderr);
        }
        eprintln!(
            "xtask: {backend}: {} {}: {} passed, {} failed, {} skipped in {:.1} s",
            b.package,
            b.target,
            row.passed - passed,
            row.failed - failed,
            row.skipped - skipped,
            binary_start.elapsed().as_secs_f64()
        );
    }
    row.seconds = start.elapsed().as_secs_f64();
    Ok(row)
}

/// Runs one test binary on `backend`: as one process, or with `jobs > 1` as up to `jobs`
/// concurrent processes that each run every `jobs`-th test (`--exact` names).
fn run_binary(b: &Binary, backend: &str, jobs: usize) -> Result<Vec<Output>, String> {
    let command = || {
        let mut cmd = Command::new(&b.path);
        cmd.arg("--show-output").env("TESSEL_DEVICE", backend).env(
            "XDG_RUNTIME_DIR",
            std::env::var("XDG_RUNTIME_DIR").unwrap_or("/tmp".into()),
        );
        cmd
    };
    let cannot_run = |e: std::io::Error| format!("cannot run {}: {e}", b.path.display());
    if jobs == 1 {
        return Ok(vec![command().output().map_err(cannot_run)?]);
    }
    let listing = Command::new(&b.path)
        .args(["--list", "--format", "terse"])
        .output()
        .map_err(cannot_run)?;
    let names: Vec<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test").map(str::to_string))
        .collect();
    if names.is_empty() {
        return Ok(vec![command().output().map_err(cannot_run)?]);
    }
    let shards = jobs.min(names.len());
    let children = (0..shards)
        .map(|k| {
            let mut cmd = command();
            cmd.arg("--exact")
                .args(names.iter().skip(k).step_by(shards))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd.spawn().map_err(cannot_run)
        })
        .collect::<Result<Vec<_>, _>>()?;
    children
        .into_iter()
        .map(|c| c.wait_with_output().map_err(cannot_run))
        .collect()
}

/// Adds one libtest run's results to `row`: its summary, `tessel-skip:` lines and the
/// names of failed tests; a run that ended without a summary counts as one failure.
fn tally(row: &mut Row, b: &Binary, status: ExitStatus, stdout: &str, stderr: &str) {
    let failures_before = row.failures.len();
    let mut saw_result = false;
    for line in stdout.lines().chain(stderr.lines()) {
        if let Some(summary) = line.strip_prefix("test result: ") {
            saw_result = true;
            row.passed += count(summary, "passed");
            row.failed += count(summary, "failed");
            row.skipped += count(summary, "ignored");
        } else if line.contains("tessel-skip:") {
            row.skipped += 1;
        } else if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|l| l.strip_suffix(" ... FAILED"))
        {
            row.failures
                .push(format!("{} {}: {name}", b.package, b.target));
        }
    }
    if !saw_result || (!status.success() && row.failures.len() == failures_before) {
        row.failed += 1;
        row.failures.push(format!(
            "{} {}: the binary exited with {status} before reporting",
            b.package, b.target
        ));
    }
}

/// The number before `what` in a libtest summary (`ok. 49 passed; 0 failed; ...`).
fn count(summary: &str, what: &str) -> u64 {
    let words: Vec<&str> = summary.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[1].trim_end_matches(';') == what)
        .and_then(|w| w[0].parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_test_artifacts() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/tessel-tensor#0.1.0","manifest_path":"/w/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"suite","src_path":"/w/tests/suite/main.rs"},"profile":{"opt_level":"0","test":true},"executable":"/w/target/debug/deps/suite-123","fresh":true}"#;
        let b = test_artifact(line).unwrap();
        assert_eq!(
            (b.package.as_str(), b.target.as_str()),
            ("tessel-tensor", "suite")
        );
        assert_eq!(b.path, PathBuf::from("/w/target/debug/deps/suite-123"));
        let renamed = line.replace("#0.1.0", "#tessel-x@0.1.0");
        assert_eq!(test_artifact(&renamed).unwrap().package, "tessel-x");
        assert!(test_artifact(&line.replace(r#""test":true"#, r#""test":false"#)).is_none());
    }

    #[test]
    fn counts_libtest_summaries() {
        let s = "ok. 49 passed; 2 failed; 3 ignored; 0 measured; 0 filtered out; finished in 4.63s";
        assert_eq!(
            (count(s, "passed"), count(s, "failed"), count(s, "ignored")),
            (49, 2, 3)
        );
    }
}
