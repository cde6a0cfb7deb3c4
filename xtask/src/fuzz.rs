//! `cargo xtask fuzz`: the public-API fuzzing campaign of `tessel-tensor/tests/fuzz.rs` at
//! length, in release: `--minutes N` (default 10) from `--seed S` (default 1).

use std::path::Path;
use std::process::Command;

/// Runs the campaign; an error when it found a panic, an abort or a hang (the test's
/// failure message lists each with the call that caused it).
pub(crate) fn main(root: &Path, args: &[String]) -> Result<(), String> {
    let mut minutes = 10u64;
    let mut seed = 1u64;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("fuzz: {flag} needs a value"))?;
        let number = value
            .parse::<u64>()
            .map_err(|_| format!("fuzz: {flag} takes a whole number, got {value:?}"))?;
        match flag.as_str() {
            "--minutes" => minutes = number,
            "--seed" => seed = number,
            other => return Err(format!("fuzz: unknown option {other:?}")),
        }
    }
    let status = Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "test",
            "--release",
            "-p",
            "tessel-tensor",
            "--test",
            "fuzz",
            "fuzz_public_api",
            "--",
            "--nocapture",
        ])
        .env("TESSEL_FUZZ_SECONDS", (minutes * 60).to_string())
        .env("TESSEL_FUZZ_SEED", seed.to_string())
        .status()
        .map_err(|e| format!("fuzz: cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "fuzz: the campaign failed ({status}); see the list above"
        ))
    }
}
