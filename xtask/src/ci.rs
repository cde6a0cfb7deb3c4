//! `cargo xtask ci`: a fixed list of commands run in order from the workspace root; the
//! first failure stops the task and its exit status becomes ours.

use std::path::Path;
use std::process::Command;

/// One command of the task.
struct Step {
    args: Vec<&'static str>,
    /// Run only when this returns true.
    when: Option<fn() -> bool>,
}

impl Step {
    fn new(args: &[&'static str]) -> Step {
        Step {
            args: args.to_vec(),
            when: None,
        }
    }
}

fn steps() -> Vec<Step> {
    vec![
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
        // The conformance suite on lavapipe and PoCL (the CPU's ran in the step before, and
        // so did the backend crates' own tests, on every driver present).
        Step {
            when: Some(|| has_vulkan_driver() && has_opencl_platform()),
            ..Step::new(&[
                "cargo",
                "xtask",
                "test-gpu",
                "--backends",
                "wgpu,opencl",
                "--jobs",
                "2",
                "--suite-only",
            ])
        },
        Step::new(&["cargo", "doc", "--workspace", "--no-deps"]),
    ]
}

/// Whether an OpenCL ICD is registered (as PoCL's package does).
pub(crate) fn has_opencl_platform() -> bool {
    std::fs::read_dir("/etc/OpenCL/vendors").is_ok_and(|mut d| d.next().is_some())
}

/// Whether a Vulkan driver is registered (as Mesa's lavapipe package does).
pub(crate) fn has_vulkan_driver() -> bool {
    std::fs::read_dir("/usr/share/vulkan/icd.d").is_ok_and(|mut d| d.next().is_some())
}

pub(crate) fn run(root: &Path) -> Result<(), String> {
    for step in steps() {
        let line = step.args.join(" ");
        if step.when.is_some_and(|when| !when()) {
            eprintln!("xtask: skipping `{line}` (no driver for it here)");
            continue;
        }
        eprintln!("xtask: running `{line}`");
        let status = Command::new(step.args[0])
            .args(&step.args[1..])
            .current_dir(root)
            .env("CI", "true")
            .env("RUSTDOCFLAGS", "-D warnings")
            .status()
            .map_err(|e| format!("cannot run `{}`: {e}", step.args[0]))?;
        if !status.success() {
            return Err(format!("`{line}` failed ({status})"));
        }
    }
    Ok(())
}
