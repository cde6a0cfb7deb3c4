//! Developer tasks, run as `cargo xtask <task>` (an alias in `.cargo/config.toml`).
//!
//! - `cargo xtask ci`: exactly what `.ci/run` and the GitHub workflow run.
//! - `cargo xtask test-gpu`: the conformance suite once per backend this machine has, with
//!   one summary table; `--bundle DIR` packs it for a GPU host without a Rust toolchain.
//! - `cargo xtask fuzz`: the seeded public-API fuzzing campaign at length, in release.
//! - `cargo xtask bench --bundle DIR`: the GPU and real-model benches with PyTorch's side,
//!   packed for a GPU host without a Rust toolchain.

mod bench;
mod ci;
mod fuzz;
mod test_gpu;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <task> [options]   (any task with --help prints this)

tasks:
  ci          cargo fmt --check, cargo clippy -D warnings, cargo test --workspace,
              cargo xtask test-gpu --backends wgpu,opencl --suite-only where those
              drivers exist (the CPU's suite ran in cargo test --workspace),
              cargo doc -D warnings (what .ci/run runs)
  test-gpu    build the conformance suite with the GPU backends' features and run it once
              per backend present, then print one table (backend, device, passed, failed,
              skipped, time)
      --backends LIST   comma-separated subset of cpu,wgpu,opencl,cuda (default: all four,
                        absent ones reported, not failed); a backend named here that is
                        absent fails the task
      --bundle DIR      instead of running, build the same test binaries (release,
                        stripped) plus a runner into DIR; `DIR/run [--backends LIST]` on a
                        GPU host without Rust prints the same table
      --jobs N          run each test binary as N processes that share its tests (for
                        drivers with slow kernel compiles, such as NVIDIA's OpenCL);
                        also accepted by `DIR/run`
      --release         build the suite with the release profile
      --suite-only      skip each backend crate's own tests (`cargo test --workspace`
                        runs them on every driver present)
  fuzz        the seeded public-API fuzzing campaign (tessel-tensor/tests/fuzz.rs) in
              release: random calls from 14 op families in child processes; fails on any
              panic, abort or hang and names the call
      --minutes N       how long (default 10)
      --seed S          the first child's seed (default 1; each child takes the next)
  bench       pack the GPU comparison for a GPU host without Rust: the GPU and real-model
              benches and the CUDA kernels' tests (release, stripped, CUDA on), PyTorch's
              side (gpu_torch.py, models_torch.py) and a `run` script (steps most
              important first, each under a time limit; `DIR/run STEP...` runs some;
              output in $OUT or DIR/logs, the summary printed last)
      --bundle DIR      where to put it (required)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf();
    // Every task answers `--help` (or `-h`) with the usage, and runs nothing.
    if args.iter().any(|a| a == "--help" || a == "-h")
        || args.first().map(String::as_str) == Some("help")
    {
        // A closed pipe (`| head`) is not an error worth a panic.
        let _ = writeln!(std::io::stdout(), "{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match args.first().map(String::as_str) {
        Some("ci") if args.len() == 1 => ci::run(&root),
        Some("test-gpu") => test_gpu::main(&root, &args[1..]),
        Some("fuzz") => fuzz::main(&root, &args[1..]),
        Some("bench") => bench::main(&root, &args[1..]),
        // The bundle's `run` script calls the bundled xtask binary this way.
        Some("run-bundle") => test_gpu::run_bundle(&args[1..]),
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}
