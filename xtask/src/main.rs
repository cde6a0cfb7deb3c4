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

    fn steps(&self) -> Vec<Vec<&'static str>> {
        match self {
            Task::Ci => vec![
                vec!["cargo", "fmt", "--all", "--", "--check"],
                vec![
                    "cargo",
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ],
                // The README's test command, verbatim.
                vec!["cargo", "test", "--workspace"],
                vec!["cargo", "doc", "--workspace", "--no-deps"],
            ],
        }
    }
}

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  ci    cargo fmt --check, cargo clippy -D warnings, cargo test --workspace,
        cargo doc -D warnings (what .ci/run runs)";

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
        eprintln!("xtask: running `{}`", step.join(" "));
        let status = Command::new(step[0])
            .args(&step[1..])
            .current_dir(&root)
            .env("CI", "true")
            .env("RUSTDOCFLAGS", "-D warnings")
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                eprintln!("xtask: `{}` failed ({s})", step.join(" "));
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("xtask: cannot run `{}`: {e}", step[0]);
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
