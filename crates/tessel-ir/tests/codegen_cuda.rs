//! The CUDA C++ dialect's output: snapshots of sample kernels, every sample and every
//! op × dtype rendering, and (where a host C++ compiler is installed) all of that compiled
//! as C++ against a small shim standing in for CUDA's built-ins, which catches C++ errors
//! (narrowing, missing `__device__`-style declarations, keyword clashes) without a GPU.
//! Whether the code *computes* the right thing is tested by running it: `tessel-cuda`'s
//! tests compare it with the interpreter on every CUDA device found.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use tessel_ir::codegen::{self, CUDA};
use tessel_ir::{Access, Kernel, KernelBuilder, samples};
use tessel_shape::{BinaryOp, DType, TernaryOp, UnaryOp, Var};

#[track_caller]
fn check(name: &str, kernel: &Kernel) {
    let source = codegen::render(kernel, &CUDA).unwrap();
    insta::assert_snapshot!(name, source);
}

#[test]
fn vector_add_f32() {
    check(
        "vector_add_f32",
        &samples::vector_add(DType::F32, 1000, 64).unwrap(),
    );
}

#[test]
fn vector_add_f16() {
    check(
        "vector_add_f16",
        &samples::vector_add(DType::F16, 1000, 64).unwrap(),
    );
}

#[test]
fn tree_reduce() {
    check("tree_reduce", &samples::tree_reduce(1000, 64).unwrap());
}

#[test]
fn dynamic_vector_add() {
    let n = Var::new("n", 1, 1 << 20).unwrap();
    check(
        "dynamic_vector_add",
        &samples::dynamic_vector_add(n, 64).unwrap(),
    );
}

#[test]
fn upcast_kernels_access_whole_vectors() {
    for (dtype, per, ty) in [(DType::F32, 4, "tsl_f32x4"), (DType::BF16, 8, "tsl_bf16x8")] {
        let source =
            codegen::render(&samples::upcast_add(dtype, 1024, per, 64).unwrap(), &CUDA).unwrap();
        for needle in [
            "typedef struct __align__(16) {".to_string(),
            format!("*(const {ty} *)(b0_a + "),
            format!("*(const {ty} *)(b1_b + "),
            format!("*({ty} *)(b2_out + "),
        ] {
            assert!(source.contains(&needle), "no `{needle}` in\n{source}");
        }
    }
}

#[test]
fn kernels_use_cuda_builtins() {
    let source = codegen::render(&samples::tiled_matmul(64, 64, 64, 16).unwrap(), &CUDA).unwrap();
    assert!(
        source.contains("extern \"C\" __global__ void tessel_tiled_matmul("),
        "{source}"
    );
    for needle in [
        "__shared__ float",
        "__syncthreads();",
        "blockIdx.x",
        "blockIdx.y",
        "threadIdx.x",
        "typedef long long int64_t;",
    ] {
        assert!(source.contains(needle), "missing `{needle}`:\n{source}");
    }
    assert!(!source.contains("__restrict__"), "{source}");
    assert!(
        !source.contains("#include"),
        "NVRTC has no libc headers:\n{source}"
    );
    let f64_erf = one_op(
        "erf_f64",
        DType::F64,
        &[(Op::Unary(UnaryOp::Erf), DType::F64)],
    );
    let source = codegen::render(&f64_erf, &CUDA).unwrap();
    assert!(
        source.contains("static __device__ __forceinline__ double tsl_erf(double x)"),
        "{source}"
    );
}

/// Every sample kernel, on every dtype where it takes one.
fn sample_kernels() -> Vec<Kernel> {
    let n = Var::new("n", 1, 1 << 20).unwrap();
    let mut kernels = vec![
        samples::permuted_copy([4, 8, 16], [2, 0, 1]).unwrap(),
        samples::tree_reduce(1000, 64).unwrap(),
        samples::tiled_matmul(64, 64, 64, 16).unwrap(),
        samples::dynamic_vector_add(n, 64).unwrap(),
    ];
    for dtype in DType::ALL {
        kernels.push(samples::vector_add(dtype, 1000, 64).unwrap());
        kernels.push(samples::upcast_add(dtype, 1024, 4, 64).unwrap());
    }
    kernels.push(samples::upcast_add(DType::BF16, 1024, 8, 64).unwrap());
    for dtype in [DType::F32, DType::F64, DType::F16, DType::I32] {
        if let Ok(k) = samples::row_sum(100, 37, dtype) {
            kernels.push(k);
        }
    }
    kernels
}

/// What one output of a test kernel computes.
#[derive(Clone, Copy, Debug)]
enum Op {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Ternary(TernaryOp),
    Cast(DType),
    Bitcast(DType),
}

/// A kernel reading `x`, `y`, `z` of `dtype` and writing one output per op (the shape of
/// `tessel-opencl`'s op tests), with a width-4 vector of each input as well.
fn one_op(name: &str, dtype: DType, ops: &[(Op, DType)]) -> Kernel {
    const N: i64 = 256;
    let mut kb = KernelBuilder::new(name);
    let inputs = ["x", "y", "z"].map(|n| kb.buffer(n, dtype, N, Access::Read));
    let outputs: Vec<_> = ops
        .iter()
        .enumerate()
        .map(|(k, (_, d))| kb.buffer(&format!("out{k}"), *d, N, Access::Write))
        .collect();
    kb.grid([N / 64, 1, 1], [64, 1, 1]);
    let i = kb.global_id(0, DType::I32);
    let [a, b, c] = inputs.map(|buf| kb.load(buf, i));
    for ((op, _), out) in ops.iter().zip(outputs) {
        let value = match *op {
            Op::Unary(op) => kb.unary(op, a),
            Op::Binary(op) => kb.binary(op, a, b),
            Op::Ternary(TernaryOp::Where) => {
                let cond = kb.lt(c, a);
                kb.select(cond, a, b)
            }
            Op::Ternary(op) => kb.ternary(op, a, b, c),
            Op::Cast(to) => kb.cast(a, to),
            Op::Bitcast(to) => kb.bitcast(a, to),
        };
        kb.store(out, i, value);
    }
    kb.build().unwrap()
}

/// Every op on every dtype, and every cast and bitcast from every dtype: one kernel per
/// dtype and kind, each with a unique name.
fn op_kernels() -> Vec<Kernel> {
    let mut kernels = Vec::new();
    for dtype in DType::ALL {
        let mut ops = Vec::new();
        for op in UnaryOp::ALL {
            if let Some(d) = op.result_dtype(dtype) {
                ops.push((Op::Unary(op), d));
            }
        }
        for op in BinaryOp::ALL {
            if let Some(d) = op.result_dtype(dtype) {
                ops.push((Op::Binary(op), d));
            }
        }
        ops.push((Op::Ternary(TernaryOp::Where), dtype));
        // The verifier accepts `mad` on numbers only.
        if dtype != DType::Bool {
            ops.push((Op::Ternary(TernaryOp::MulAdd), dtype));
        }
        kernels.push(one_op(&format!("alu_{dtype}"), dtype, &ops));
        let mut casts: Vec<(Op, DType)> = DType::ALL.iter().map(|&to| (Op::Cast(to), to)).collect();
        for to in DType::ALL {
            if to != dtype
                && to != DType::Bool
                && dtype != DType::Bool
                && to.size_bytes() == dtype.size_bytes()
            {
                casts.push((Op::Bitcast(to), to));
            }
        }
        kernels.push(one_op(&format!("cast_{dtype}"), dtype, &casts));
    }
    kernels
}

#[test]
fn every_sample_and_op_renders() {
    let kernels: Vec<Kernel> = sample_kernels().into_iter().chain(op_kernels()).collect();
    for kernel in &kernels {
        let source = codegen::render(kernel, &CUDA)
            .unwrap_or_else(|e| panic!("kernel `{}`: {e}", kernel.name));
        assert!(source.contains("extern \"C\" __global__ void tessel_"));
    }
}

/// Declarations that make CUDA C++ valid host C++: the qualifiers vanish, ids are plain
/// variables, and `<math.h>` supplies the math built-ins (whose CUDA versions have the same
/// names and overloads).
const SHIM: &str = r"#include <math.h>
#include <string.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
struct tsl_dim3 { unsigned int x, y, z; };
static tsl_dim3 blockIdx, threadIdx;
static void __syncthreads() {}
static float __int_as_float(int x) { float f; memcpy(&f, &x, sizeof f); return f; }
";

/// A C++ compiler, if the host has one.
fn cxx() -> Option<PathBuf> {
    ["g++", "clang++", "c++"].into_iter().find_map(|name| {
        let ok = Command::new(name)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        ok.then(|| PathBuf::from(name))
    })
}

/// Compiles every sample and op kernel as C++17 (NVRTC's default dialect) with the host's
/// compiler, each source in its own namespace of one translation unit (kernel names are
/// made unique, since `extern "C"` names are global). Narrowing conversions are errors, as
/// in NVRTC.
#[test]
fn sources_compile_as_cxx() {
    let Some(cxx) = cxx() else {
        eprintln!("sources_compile_as_cxx: no C++ compiler (g++, clang++, c++); nothing to test");
        return;
    };
    let mut unit = String::from(SHIM);
    let kernels: Vec<Kernel> = sample_kernels().into_iter().chain(op_kernels()).collect();
    for (k, kernel) in kernels.into_iter().enumerate() {
        let mut kernel = kernel;
        kernel.name = format!("{}_{k}", kernel.name);
        let source = codegen::render(&kernel, &CUDA).unwrap();
        let _ = writeln!(unit, "namespace unit{k} {{\n{source}}}");
    }
    let dir = std::env::temp_dir().join(format!("tessel-codegen-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kernels.cpp");
    std::fs::write(&path, &unit).unwrap();
    let out = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-fsyntax-only",
            "-Wall",
            "-Wno-unused-function",
            "-Wno-unused-variable",
            "-Werror",
            "-Werror=narrowing",
        ])
        .arg(&path)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{} rejected the CUDA sources:\n{}",
        cxx.display(),
        log.lines().take(60).collect::<Vec<_>>().join("\n")
    );
}
