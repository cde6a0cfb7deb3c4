//! `cargo xtask bench --bundle DIR`: the GPU comparison packed for a GPU host without a
//! Rust toolchain. The bundle holds the GPU and real-model benches and the CUDA kernels'
//! conformance tests (release, stripped, CUDA on), PyTorch's side of both benches, and a
//! `run` script that runs them most important first, each step under a time limit, its
//! output in a log folder, with a summary printed last.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::test_gpu::{cargo, make_executable, test_artifact};

/// The bundle's binaries, as (package, target); each is named by its target in the bundle.
const BINARIES: [(&str, &str); 4] = [
    ("tessel-cuda", "attention"),
    ("tessel-cuda", "cuda"),
    ("tessel-benches", "gpu"),
    ("tessel-benches", "models"),
];

/// PyTorch's side of the benches, copied beside the binaries.
const SCRIPTS: [&str; 2] = ["benches/gpu_torch.py", "benches/models_torch.py"];

const USAGE: &str = "usage: cargo xtask bench --bundle DIR";

/// `cargo xtask bench --bundle DIR`.
pub(crate) fn main(root: &Path, args: &[String]) -> Result<(), String> {
    let dir = match args {
        [flag, dir] if flag == "--bundle" => Path::new(dir),
        _ => return Err(USAGE.into()),
    };
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root)
        .args([
            "test",
            "--no-run",
            "--release",
            "--message-format=json-render-diagnostics",
        ])
        .args(["-p", "tessel-benches", "-p", "tessel-cuda"])
        .args(["--features", "tessel-tensor/cuda,tessel-benches/cuda"])
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false");
    for (package, target) in BINARIES {
        let kind = if package == "tessel-benches" {
            "--bench"
        } else {
            "--test"
        };
        cmd.args([kind, target]);
    }
    eprintln!("xtask: building the benches and the CUDA kernels' tests");
    let output = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("building the benches failed ({})", output.status));
    }
    let built: Vec<_> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(test_artifact)
        .collect();
    let io = |what: String, e: std::io::Error| format!("{what}: {e}");
    fs::create_dir_all(dir).map_err(|e| io(format!("creating {}", dir.display()), e))?;
    for (package, target) in BINARIES {
        let binary = built
            .iter()
            .find(|b| b.package == package && b.target == target)
            .ok_or_else(|| format!("cargo built no {package} `{target}`"))?;
        fs::copy(&binary.path, dir.join(target))
            .map_err(|e| io(format!("copying {}", binary.path.display()), e))?;
    }
    for script in SCRIPTS {
        let name = Path::new(script).file_name().expect("a file name");
        fs::copy(root.join(script), dir.join(name))
            .map_err(|e| io(format!("copying {script}"), e))?;
    }
    let run = dir.join("run");
    fs::write(&run, RUN_SCRIPT).map_err(|e| io("writing run".into(), e))?;
    make_executable(&run)?;
    eprintln!(
        "xtask: bench bundle ready in {}; run `{}/run [STEP...]` on the GPU host",
        dir.display(),
        dir.display()
    );
    Ok(())
}

const RUN_SCRIPT: &str = r#"#!/bin/sh
# Tessel against PyTorch on this host's GPU, most important first, each step under a time
# limit: the CUDA attention and matmul kernels against their f64 references, the GPU bench
# (PyTorch's side, then Tessel's with each candidate's measured time logged), then GPT-2's
# AdamW steps (PyTorch, then Tessel in f32 and bf16 with the chosen plan logged), then the
# MLP's AdamW step and GPT-2's greedy decoding (PyTorch's side comes with the GPT-2 steps').
# `run STEP...` runs only the steps named (attention cuda gpu_torch gpu models_torch
# gpt2_f32 gpt2_bf16 small). Output goes to $OUT if set, else logs/ beside this script:
# per step STEP.txt (stdout) and STEP.log (stderr); the summary (each step's exit status,
# then the figures) is printed last and kept in summary.txt.
here="$(cd "$(dirname "$0")" && pwd)"
logs="${OUT:-$here/logs}"
mkdir -p "$logs"
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/tessel-bench-cache}"
steps=" $* "
cd "$here" || exit 1
: > "$logs/status.txt"
step() {
    name=$1 limit=$2
    shift 2
    case "$steps" in "  " | *" $name "*) ;; *) return ;; esac
    echo "== $name" >&2
    timeout "$limit" "$@" > "$logs/$name.txt" 2> "$logs/$name.log"
    echo "$name: exit $?" >> "$logs/status.txt"
}
step attention 200 ./attention --test-threads 8
step cuda 300 ./cuda --test-threads 8
step gpu_torch 150 python3 gpu_torch.py
step gpu 300 env TESSEL_LOG=tessel::measure=debug ./gpu --devices cuda --compiled \
    --only "small op,sdpa causal,transformer block,matmul"
step models_torch 260 env MODELS_ONLY="AdamW step,decode" python3 models_torch.py /tmp/models
step gpt2_f32 200 env TESSEL_LOG=tessel::plan=info ./models /tmp/models --device cuda \
    --only gpt2-train-f32 --runs 5
step gpt2_bf16 200 env TESSEL_LOG=tessel::plan=info ./models /tmp/models --device cuda \
    --only gpt2-train-bf16 --runs 5
step small 200 ./models /tmp/models --device cuda --only mlp-train,gpt2-decode --runs 5
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
    cat "$logs/status.txt"
    for f in attention cuda; do
        [ -f "$logs/$f.txt" ] && grep -h "^test result\|FAILED\|panicked" "$logs/$f.txt"
    done
    for f in gpu_torch gpu models_torch gpt2_f32 gpt2_bf16 small; do
        [ -f "$logs/$f.txt" ] && sed 's/\x1b\[[0-9;]*m//g' "$logs/$f.txt" | grep -v "^$"
    done
} > "$logs/summary.txt" 2>&1
cat "$logs/summary.txt"
"#;

#[cfg(test)]
mod tests {
    use super::{BINARIES, RUN_SCRIPT};

    #[test]
    fn the_run_script_runs_every_binary_and_script() {
        for (_, target) in BINARIES {
            assert!(RUN_SCRIPT.contains(&format!(" ./{target} ")), "{target}");
        }
        for script in ["gpu_torch.py", "models_torch.py"] {
            assert!(
                RUN_SCRIPT.contains(&format!("python3 {script}")),
                "{script}"
            );
        }
    }
}
