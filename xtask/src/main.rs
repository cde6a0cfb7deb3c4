//! Developer tasks, run as `cargo xtask <task>` (an alias in `.cargo/config.toml`).
//!
//! Each task is a fixed list of commands run in order from the workspace root; the first
//! failure stops the task and its exit status becomes ours. `cargo xtask ci` is exactly
//! what `.ci/run` and the GitHub workflow run.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The tasks, one per subcommand.
enum Task {
    /// Format check, clippy with warnings denied, the README's test command, and docs.
    Ci,
}

impl Task {
    fn parse(arg: Option<&str>) -> Option<Task> {
        match arg {
            Some("ci") => Some(Task::Ci),
            _ => None,
        }
    }

    fn steps(&self) -> Vec<Step> {
        match self {
            Task::Ci => vec![
                Step::new(&["cargo", "fmt", "--all", "--", "--check"]),
                Step::new(&[
                    "cargo",
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ]),
                // The README's test command, verbatim.
                Step::new(&["cargo", "test", "--workspace"]),
                // The Tensor conformance suite once more, on OpenCL, where a platform exists.
                Step {
                    env: &[("TESSEL_DEVICE", "opencl")],
                    when: Some(has_opencl_platform),
                    ..Step::new(&[
                        "cargo",
                        "test",
                        "-p",
                        "tessel-tensor",
                        "--features",
                        "opencl",
                    ])
                },
                Step::new(&["cargo", "doc", "--workspace", "--no-deps"]),
            ],
        }
    }
}

/// One command of a task.
struct Step {
    args: Vec<&'static str>,
    /// Extra environment variables.
    env: &'static [(&'static str, &'static str)],
    /// Run only when this returns true.
    when: Option<fn() -> bool>,
}

impl Step {
    fn new(args: &[&'static str]) -> Step {
        Step {
            args: args.to_vec(),
            env: &[],
            when: None,
        }
    }
}

/// Whether an OpenCL ICD is registered (as PoCL's package does).
fn has_opencl_platform() -> bool {
    std::fs::read_dir("/etc/OpenCL/vendors").is_ok_and(|mut d| d.next().is_some())
}

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  ci    cargo fmt --check, cargo clippy -D warnings, cargo test --workspace,
        the Tensor suite on OpenCL where a platform exists, cargo doc -D warnings
        (what .ci/run runs)";

fn main() -> ExitCode {
    let arg = std::env::args().nth(1);
    let Some(task) = Task::parse(arg.as_deref()) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf();
    for step in task.steps() {
        if step.when.is_some_and(|when| !when()) {
            eprintln!(
                "xtask: skipping `{}` (not applicable here)",
                step.args.join(" ")
            );
            continue;
        }
        let line = step.args.join(" ");
        eprintln!("xtask: running `{line}`");
        let status = Command::new(step.args[0])
            .args(&step.args[1..])
            .current_dir(&root)
            .env("CI", "true")
            .env("RUSTDOCFLAGS", "-D warnings")
            .envs(step.env.iter().copied())
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                eprintln!("xtask: `{line}` failed ({s})");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("xtask: cannot run `{}`: {e}", step.args[0]);
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
