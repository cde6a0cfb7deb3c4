//! The GPU comparison bench: the baseline workloads on every device given, timed around
//! realize + `Device::synchronize` (host overhead included, as a user sees it), median of
//! several runs after a warm-up that compiles. `benches/gpu_torch.py` times the same
//! workloads with PyTorch on the same GPU; `benches/gpu.sh` runs both (see README.md there).
//!
//! ```text
//! cargo bench -p tessel-benches --bench gpu --features cuda,wgpu -- --devices cuda,wgpu,cpu
//! ```
//!
//! Options: `--devices LIST` (default: every device found), `--small` (sizes divided by
//! 16, for a quick check on a CPU), `--only NAME[,NAME]` (workloads by name), `--compiled`
//! (each workload also as a `tessel::Compiled` function: recorded and planned once, each
//! run a call + synchronize; a row `NAME [compiled]` whose first time includes compiling).

use std::time::{Duration, Instant};

use tessel_tensor::{
    Compiled, Conv2dOptions, DType, Device, Float32MatmulPrecision, Padding, PoolOptions, Result,
    Tensor, set_float32_matmul_precision,
};

/// One workload: builds its output from its inputs, and says how much work it is.
struct Workload {
    name: &'static str,
    /// What the throughput figure counts: `"GB/s"` (bytes read + written once) or
    /// `"GFLOP/s"`.
    unit: &'static str,
    /// The work per run in that unit's base (bytes or flops).
    amount: f64,
    inputs: Vec<Vec<usize>>,
    /// The dtype every float input is cast to (on the device) before the timed runs.
    dtype: DType,
    init: Init,
    /// `set_float32_matmul_precision` while the workload runs.
    f32_matmul: Float32MatmulPrecision,
    run: Run,
}

/// What a workload computes: one output, or several realized together (all of them the
/// work; a compiled function returns them all).
enum Run {
    One(fn(&[Tensor]) -> Result<Tensor>),
    Many(fn(&[Tensor]) -> Result<Vec<Tensor>>),
}

impl Run {
    fn outputs(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        match self {
            Run::One(f) => Ok(vec![f(inputs)?]),
            Run::Many(f) => f(inputs),
        }
    }
}

/// How a workload's inputs are filled.
#[derive(Clone, Copy)]
enum Init {
    /// Every input in `[-1, 1)`.
    Unit,
    /// The first input in `[-1, 1)`; each weight `[in, out]` and the bias after it in
    /// `±1/√in`, as `torch.nn.Linear` initializes them. Unscaled weights would make
    /// attention logits of a few hundred, whose softmax flips between keys on bf16
    /// rounding: no two correct kernels would agree.
    Linear,
}

impl Init {
    /// The bound of input `i` among `inputs`.
    fn bound(self, i: usize, inputs: &[Vec<usize>]) -> f32 {
        match self {
            Init::Unit => 1.0,
            Init::Linear if i == 0 => 1.0,
            Init::Linear => {
                let weight = if inputs[i].len() == 1 { i - 1 } else { i };
                1.0 / (inputs[weight][0] as f32).sqrt()
            }
        }
    }
}

fn workloads(scale: usize) -> Vec<Workload> {
    let n = (256 << 20) / scale;
    let rows = 16384 / scale.isqrt();
    let soft = 8192 / scale.isqrt();
    let m = 4096 / scale.isqrt();
    let small_m = 1024 / scale.isqrt();
    // `--small` keeps the conv/pool shapes and cuts the batch (2 at scale 16).
    let batch = 32 / scale;
    let sort_n = (16 << 20) / scale;
    let tokens = 8 * 512 / scale;
    let ce_rows = 4096 / scale;
    let scatter_rows = (1 << 20) / scale;
    let sort_rows = 8192 / scale;
    vec![
        Workload {
            name: "small op [16] f32 (one realize + synchronize)",
            unit: "GB/s",
            amount: 4.0 * 3.0 * 16.0,
            inputs: vec![vec![16], vec![16]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| &(&x[0] * 2.0)? + &x[1]),
        },
        Workload {
            name: "chain8 f32 (8 fused elementwise ops)",
            unit: "GB/s",
            amount: 2.0 * 4.0 * n as f64,
            inputs: vec![vec![n]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| chain8(&x[0])),
        },
        Workload {
            name: "sum last axis f32",
            unit: "GB/s",
            amount: 4.0 * (rows * rows + rows) as f64,
            inputs: vec![vec![rows, rows]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| x[0].sum(&[-1], false)),
        },
        Workload {
            name: "sum axis 0 f32 (column sums)",
            unit: "GB/s",
            amount: 4.0 * (rows * rows + rows) as f64,
            inputs: vec![vec![rows, rows]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| x[0].sum(&[0], false)),
        },
        Workload {
            name: "bias add rows f32",
            unit: "GB/s",
            amount: 4.0 * (2 * soft * soft + soft) as f64,
            inputs: vec![vec![soft, soft], vec![soft]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| &x[0] + &x[1]),
        },
        Workload {
            name: "transpose copy f32",
            unit: "GB/s",
            amount: 2.0 * 4.0 * (soft * soft) as f64,
            inputs: vec![vec![soft, soft]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| Ok(x[0].t()?.contiguous())),
        },
        Workload {
            name: "chain8 bf16 (8 fused elementwise ops)",
            unit: "GB/s",
            amount: 2.0 * 2.0 * n as f64,
            inputs: vec![vec![n]],
            dtype: DType::BF16,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| chain8(&x[0])),
        },
        Workload {
            name: "bias add rows bf16",
            unit: "GB/s",
            amount: 2.0 * (2 * soft * soft + soft) as f64,
            inputs: vec![vec![soft, soft], vec![soft]],
            dtype: DType::BF16,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| &x[0] + &x[1]),
        },
        Workload {
            name: "transpose copy bf16",
            unit: "GB/s",
            amount: 2.0 * 2.0 * (soft * soft) as f64,
            inputs: vec![vec![soft, soft]],
            dtype: DType::BF16,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| Ok(x[0].t()?.contiguous())),
        },
        Workload {
            name: "softmax rows f32",
            unit: "GB/s",
            amount: 2.0 * 4.0 * (soft * soft) as f64,
            inputs: vec![vec![soft, soft]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| x[0].softmax(-1)),
        },
        Workload {
            name: "layer_norm rows f32",
            unit: "GB/s",
            amount: 2.0 * 4.0 * (soft * soft) as f64,
            inputs: vec![vec![soft, soft]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| layer_norm(&x[0])),
        },
        Workload {
            name: "matmul f32 (large)",
            unit: "GFLOP/s",
            amount: 2.0 * (m * m * m) as f64,
            inputs: vec![vec![m, m], vec![m, m]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| x[0].matmul(&x[1])),
        },
        Workload {
            name: "matmul f32 tf32 (large)",
            unit: "GFLOP/s",
            amount: 2.0 * (m * m * m) as f64,
            inputs: vec![vec![m, m], vec![m, m]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::High,
            run: Run::One(|x| x[0].matmul(&x[1])),
        },
        Workload {
            name: "matmul f32 (1024)",
            unit: "GFLOP/s",
            amount: 2.0 * (small_m * small_m * small_m) as f64,
            inputs: vec![vec![small_m, small_m], vec![small_m, small_m]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| x[0].matmul(&x[1])),
        },
        // Half-precision products: the library's tensor-core routines where there is one.
        Workload {
            name: "matmul bf16 (large)",
            unit: "GFLOP/s",
            amount: 2.0 * (m * m * m) as f64,
            inputs: vec![vec![m, m], vec![m, m]],
            dtype: DType::BF16,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| x[0].matmul(&x[1])),
        },
        Workload {
            name: "matmul f16 (large)",
            unit: "GFLOP/s",
            amount: 2.0 * (m * m * m) as f64,
            inputs: vec![vec![m, m], vec![m, m]],
            dtype: DType::F16,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| x[0].matmul(&x[1])),
        },
        // A linear layer with its bias and GELU (tanh form), GPT-2's MLP up-projection: a
        // routine with the epilogue against PyTorch's `addmm` then GELU.
        Workload {
            name: "linear+gelu bf16 [4096,768]x[768,3072]",
            unit: "GFLOP/s",
            amount: 2.0 * (tokens * 768 * 3072) as f64,
            inputs: vec![vec![tokens, 768], vec![768, 3072], vec![3072]],
            dtype: DType::BF16,
            init: Init::Linear,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| Ok((&x[0].matmul(&x[1])? + &x[2])?.gelu_tanh())),
        },
        Workload {
            name: "linear+gelu f32 [4096,768]x[768,3072]",
            unit: "GFLOP/s",
            amount: 2.0 * (tokens * 768 * 3072) as f64,
            inputs: vec![vec![tokens, 768], vec![768, 3072], vec![3072]],
            dtype: DType::F32,
            init: Init::Linear,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| Ok((&x[0].matmul(&x[1])? + &x[2])?.gelu_tanh())),
        },
        // Issue 9: a ResNet-50 stage convolution, a stem max-pool, and a long sort.
        Workload {
            name: "conv2d f32 [32,64,56,56] 3x3 p1",
            unit: "GFLOP/s",
            amount: 2.0 * (batch * 64 * 56 * 56 * 64 * 9) as f64,
            inputs: vec![vec![batch, 64, 56, 56], vec![64, 64, 3, 3]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| {
                let opts = Conv2dOptions {
                    padding: Padding::Explicit([1, 1]),
                    ..Conv2dOptions::default()
                };
                x[0].conv2d(&x[1], None, &opts)
            }),
        },
        Workload {
            name: "max_pool2d f32 [32,64,112,112] 3x3 s2 p1",
            unit: "GB/s",
            amount: 4.0 * (batch * 64 * (112 * 112 + 56 * 56)) as f64,
            inputs: vec![vec![batch, 64, 112, 112]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| {
                x[0].max_pool2d(&PoolOptions {
                    stride: Some([2, 2]),
                    padding: [1, 1],
                    ..PoolOptions::new([3, 3])
                })
            }),
        },
        Workload {
            name: "sort f32 16M (values + i64 indices)",
            unit: "GB/s",
            // Read once; values (4 bytes) and indices (8 bytes) written once.
            amount: 16.0 * sort_n as f64,
            inputs: vec![vec![sort_n]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::Many(|x| {
                let (values, indices) = x[0].sort(0, false)?;
                Ok(vec![values, indices])
            }),
        },
        // Rows a workgroup sorts in local memory.
        Workload {
            name: "argsort rows f32 [8192,1024]",
            unit: "GB/s",
            // Read once; i64 indices written once.
            amount: 12.0 * (sort_rows * 1024) as f64,
            inputs: vec![vec![sort_rows, 1024]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| x[0].argsort(-1, false)),
        },
        // Issue 20: indexing and losses over GPT-2's vocabulary.
        Workload {
            name: "embedding f32 [8,512] of [50257,768]",
            unit: "GB/s",
            // Each row read once and written once.
            amount: 2.0 * 4.0 * (tokens * 768) as f64,
            inputs: vec![vec![tokens], vec![VOCAB, 768]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| Tensor::embedding(&x[1], &token_ids(&x[0])?)),
        },
        Workload {
            name: "embedding backward f32 [8,512] into [50257,768]",
            unit: "GB/s",
            // The table's gradient written once, the rows' gradients read once.
            amount: 4.0 * ((VOCAB + tokens) * 768) as f64,
            inputs: vec![vec![tokens], vec![VOCAB, 768], vec![tokens, 768]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| {
                let rows = Tensor::embedding(&x[1], &token_ids(&x[0])?)?;
                let loss = (&rows * &x[2])?.sum_all()?;
                Ok(tessel_tensor::grad(&loss, &[&x[1]])?.remove(0))
            }),
        },
        Workload {
            name: "embedding backward deterministic f32 [8,512] into [50257,768]",
            unit: "GB/s",
            amount: 4.0 * ((VOCAB + tokens) * 768) as f64,
            inputs: vec![vec![tokens], vec![VOCAB, 768], vec![tokens, 768]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| {
                // Read when the ops are recorded: on for this graph only.
                tessel_tensor::use_deterministic_algorithms(true);
                let rows = Tensor::embedding(&x[1], &token_ids(&x[0])?)?;
                let loss = (&rows * &x[2])?.sum_all()?;
                let g = tessel_tensor::grad(&loss, &[&x[1]]).map(|mut g| g.remove(0));
                tessel_tensor::use_deterministic_algorithms(false);
                g
            }),
        },
        // Message aggregation as graph networks do it: 1M rows of 64 into 16384 nodes.
        Workload {
            name: "scatter_reduce amax f32 [1M,64] into [16384,64]",
            unit: "GB/s",
            // The messages read once, the nodes written once.
            amount: 4.0 * ((scatter_rows + 16384) * 64) as f64,
            inputs: vec![vec![scatter_rows], vec![scatter_rows, 64]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| {
                let index = node_ids(&x[0])?;
                Tensor::zeros([16384, 64], DType::F32)
                    .to(&x[1].device())?
                    .scatter_reduce(0, &index, &x[1], "amax", false)
            }),
        },
        Workload {
            name: "scatter f32 [1M,64] into [16384,64]",
            unit: "GB/s",
            amount: 4.0 * ((scatter_rows + 16384) * 64) as f64,
            inputs: vec![vec![scatter_rows], vec![scatter_rows, 64]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| {
                let index = node_ids(&x[0])?;
                Tensor::zeros([16384, 64], DType::F32)
                    .to(&x[1].device())?
                    .scatter(0, &index, &x[1])
            }),
        },
        Workload {
            name: "cross_entropy fwd+bwd f32 [4096,50257]",
            unit: "GB/s",
            // The logits read once and their gradient written once.
            amount: 2.0 * 4.0 * (ce_rows * VOCAB) as f64,
            inputs: vec![vec![ce_rows, VOCAB], vec![ce_rows]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::Many(|x| {
                let loss = tessel_nn::loss::cross_entropy(
                    &x[0],
                    &token_ids(&x[1])?,
                    &tessel_nn::loss::CrossEntropyOptions::default(),
                )?;
                let g = tessel_tensor::grad(&loss, &[&x[0]])?.remove(0);
                Ok(vec![loss, g])
            }),
        },
        Workload {
            name: "topk k=50 f32 [64,50257]",
            unit: "GB/s",
            amount: 4.0 * (64 * VOCAB) as f64,
            inputs: vec![vec![64, VOCAB]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::Many(|x| {
                let (values, indices) = x[0].topk(50, -1, true, true)?;
                Ok(vec![values, indices])
            }),
        },
        // Device random numbers: Philox bits computed in the kernel that uses them.
        dropout_workload("dropout p=0.1 f32 [8,512,768]", DType::F32, scale),
        dropout_workload("dropout p=0.1 bf16 [8,512,768]", DType::BF16, scale),
        Workload {
            name: "randn f32 [16M]",
            unit: "GB/s",
            amount: 4.0 * (16_777_216 / scale) as f64,
            inputs: vec![vec![16_777_216 / scale]],
            dtype: DType::F32,
            init: Init::Unit,
            f32_matmul: Float32MatmulPrecision::Highest,
            run: Run::One(|x| x[0].randn_like()),
        },
        sdpa_workload("sdpa causal fwd f32 [8,12,512,64]", DType::F32, scale),
        sdpa_workload("sdpa causal fwd bf16 [8,12,512,64]", DType::BF16, scale),
        sdpa_backward_workload("sdpa causal fwd+bwd f32 [8,12,512,64]", DType::F32, scale),
        sdpa_backward_workload("sdpa causal fwd+bwd bf16 [8,12,512,64]", DType::BF16, scale),
        decode_workload(
            "sdpa decode f32 q [1,12,1,64] kv [1,12,4096,64]",
            DType::F32,
            scale,
        ),
        decode_workload(
            "sdpa decode bf16 q [1,12,1,64] kv [1,12,4096,64]",
            DType::BF16,
            scale,
        ),
        // DESIGN.md's target: a transformer block forward faster than PyTorch eager.
        block_workload("transformer block fwd f32 [8,512,768]", DType::F32, scale),
        block_workload("transformer block fwd bf16 [8,512,768]", DType::BF16, scale),
    ]
}

/// `dropout(0.1)` over `8·512·768 / scale` elements of `dtype`: bytes read and written.
fn dropout_workload(name: &'static str, dtype: DType, scale: usize) -> Workload {
    let n = 8 * 512 * 768 / scale;
    Workload {
        name,
        unit: "GB/s",
        amount: 2.0 * dtype.size_bytes() as f64 * n as f64,
        inputs: vec![vec![n]],
        dtype,
        init: Init::Unit,
        f32_matmul: Float32MatmulPrecision::Highest,
        run: Run::One(|x| x[0].dropout(0.1)),
    }
}

/// The GPT-2-small [`block`] on `8 / scale` sequences of 512 tokens, inputs in `dtype`.
fn block_workload(name: &'static str, dtype: DType, scale: usize) -> Workload {
    let batch = 8 / scale.min(8);
    Workload {
        name,
        unit: "GFLOP/s",
        amount: block_flops(batch, 512, 768),
        inputs: vec![
            vec![batch, 512, 768],
            vec![768, 3 * 768],
            vec![3 * 768],
            vec![768, 768],
            vec![768],
            vec![768, 4 * 768],
            vec![4 * 768],
            vec![4 * 768, 768],
            vec![768],
        ],
        dtype,
        init: Init::Linear,
        f32_matmul: Float32MatmulPrecision::Highest,
        run: Run::One(block),
    }
}

/// Causal `scaled_dot_product_attention` over `8 / scale` sequences of 12 heads of 512
/// positions of 64 (GPT-2 small's attention), inputs in `dtype`. The work counts both
/// products in full (`4·b·h·l·s·d`), as `gpu_torch.py` does.
fn sdpa_workload(name: &'static str, dtype: DType, scale: usize) -> Workload {
    let batch = 8 / scale.min(8);
    Workload {
        name,
        unit: "GFLOP/s",
        amount: 4.0 * (batch * 12 * 512 * 512 * 64) as f64,
        inputs: vec![vec![batch, 12, 512, 64]; 3],
        dtype,
        init: Init::Unit,
        f32_matmul: Float32MatmulPrecision::Highest,
        run: Run::One(|t| {
            tessel_nn::scaled_dot_product_attention(
                &t[0], &t[1], &t[2], None, 0.0, true, None, false,
            )
        }),
    }
}

/// [`sdpa_workload`]'s attention and the gradients of `q`, `k` and `v` for a given output
/// gradient (the fourth input), realized together. The work counts the forward's two
/// products and the backward's four in full (`12·b·h·l·s·d`), as `gpu_torch.py` does.
fn sdpa_backward_workload(name: &'static str, dtype: DType, scale: usize) -> Workload {
    let batch = 8 / scale.min(8);
    Workload {
        name,
        unit: "GFLOP/s",
        amount: 12.0 * (batch * 12 * 512 * 512 * 64) as f64,
        inputs: vec![vec![batch, 12, 512, 64]; 4],
        dtype,
        init: Init::Unit,
        f32_matmul: Float32MatmulPrecision::Highest,
        run: Run::Many(|t| {
            let y = tessel_nn::scaled_dot_product_attention(
                &t[0], &t[1], &t[2], None, 0.0, true, None, false,
            )?;
            let loss = (&y * &t[3])?.cast(DType::F32).sum_all()?;
            let grads = tessel_tensor::grad(&loss, &[&t[0], &t[1], &t[2]])?;
            Ok(grads)
        }),
    }
}

/// One query per head against a cache of `4096 / scale` positions (a decoding step of
/// GPT-2 small's attention), inputs in `dtype`. The work counts both products
/// (`4·h·s·d`), as `gpu_torch.py` does.
fn decode_workload(name: &'static str, dtype: DType, scale: usize) -> Workload {
    let cache = 4096 / scale;
    Workload {
        name,
        unit: "GFLOP/s",
        amount: 4.0 * (12 * cache * 64) as f64,
        inputs: vec![
            vec![1, 12, 1, 64],
            vec![1, 12, cache, 64],
            vec![1, 12, cache, 64],
        ],
        dtype,
        init: Init::Unit,
        f32_matmul: Float32MatmulPrecision::Highest,
        run: Run::One(|t| {
            tessel_nn::scaled_dot_product_attention(
                &t[0], &t[1], &t[2], None, 0.0, false, None, false,
            )
        }),
    }
}

/// `(x - mean) / sqrt(var + 1e-5)` over the last axis (`F.layer_norm` without affine).
fn layer_norm(x: &Tensor) -> Result<Tensor> {
    let centered = (x - &x.mean(&[-1], true)?)?;
    let var = (&centered * &centered)?.mean(&[-1], true)?;
    &centered * &(&var + 1e-5)?.rsqrt()
}

/// Multiply-adds of one block forward, ×2: the four projections and the two attention
/// products (the causal half is still computed).
fn block_flops(batch: usize, seq: usize, width: usize) -> f64 {
    let tokens = (batch * seq) as f64;
    let w = width as f64;
    let projections = tokens * w * (3.0 * w + w + 4.0 * w + 4.0 * w);
    let attention = 2.0 * batch as f64 * (seq * seq) as f64 * w;
    2.0 * (projections + attention)
}

/// A pre-norm GPT-2-small block (12 heads, causal, exact GELU), layer norms without
/// affine: `x + attn(ln(x))`, then `h + mlp(ln(h))`. Inputs: x, then each weight ([in,
/// out]) with its bias.
fn block(t: &[Tensor]) -> Result<Tensor> {
    let [x, w_qkv, b_qkv, w_o, b_o, w_up, b_up, w_down, b_down] = t else {
        unreachable!("nine inputs")
    };
    let (n, s, e, heads) = (x.dims()[0] as i64, x.dims()[1] as i64, 768, 12);
    let qkv = (&layer_norm(x)?.matmul(w_qkv)? + b_qkv)?;
    let split = |i: i64| -> Result<Tensor> {
        qkv.narrow(2, i * e, e)?
            .reshape(&[n, s, heads, e / heads])?
            .permute(&[0, 2, 1, 3])
    };
    let attn = tessel_nn::scaled_dot_product_attention(
        &split(0)?,
        &split(1)?,
        &split(2)?,
        None,
        0.0,
        true,
        None,
        false,
    )?;
    let merged = attn.permute(&[0, 2, 1, 3])?.reshape(&[n, s, e])?;
    let h = (x + &(&merged.matmul(w_o)? + b_o)?)?;
    let up = (&layer_norm(&h)?.matmul(w_up)? + b_up)?.gelu();
    &h + &(&up.matmul(w_down)? + b_down)?
}

/// Eight elementwise ops that no rewrite folds together; PyTorch eager runs them as eight
/// kernels, Tessel fuses them into one.
fn chain8(x: &Tensor) -> Result<Tensor> {
    let y = x
        .mul(1.5)?
        .add(0.25)?
        .relu()
        .mul(x)?
        .sub(0.5)?
        .abs()?
        .add(x)?;
    y.neg()
}

/// GPT-2's vocabulary.
const VOCAB: usize = 50_257;

/// Token ids in `0..VOCAB` from data in `[-1, 1)` (the cast fuses into the reader).
fn token_ids(x: &Tensor) -> Result<Tensor> {
    Ok(((x + 1.0)? * (VOCAB as f64 / 2.0))?
        .floor()?
        .cast(tessel_tensor::DType::I64))
}

/// Node ids in `0..16384` from data in `[-1, 1)`, one per row, spread over 64 columns.
fn node_ids(x: &Tensor) -> Result<Tensor> {
    let ids = ((x + 1.0)? * 8192.0)?.floor()?.cast(DType::I64);
    let rows = i64::try_from(x.dims()[0]).unwrap_or(i64::MAX);
    ids.unsqueeze(1)?.expand(&[rows, 64])
}

/// Cheap, reproducible data in `[-1, 1)`.
fn data(len: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(747_796_405).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// The first run's time (planning and compiling included) and the median of `runs` runs
/// of `w` on `device` after a second warm-up run.
fn time(w: &Workload, device: Device, runs: usize, compiled: bool) -> Result<(Duration, Duration)> {
    let inputs = w
        .inputs
        .iter()
        .enumerate()
        .map(|(i, dims)| {
            let bound = w.init.bound(i, &w.inputs);
            let values = data(dims.iter().product(), i as u32)
                .into_iter()
                .map(|v| v * bound)
                .collect();
            let t = Tensor::from_vec(values, dims.as_slice())?
                .to(&device)?
                .cast(w.dtype);
            t.realize()?;
            Ok(t)
        })
        .collect::<Result<Vec<_>>>()?;
    device.synchronize()?;
    set_float32_matmul_precision(w.f32_matmul);
    let timed = if compiled {
        run_compiled(w, &inputs, device, runs)
    } else {
        run_timed(w, &inputs, device, runs)
    };
    set_float32_matmul_precision(Float32MatmulPrecision::Highest);
    timed
}

/// [`time`]'s runs, on `inputs`.
fn run_timed(
    w: &Workload,
    inputs: &[Tensor],
    device: Device,
    runs: usize,
) -> Result<(Duration, Duration)> {
    median_of(runs, Instant::now(), || {
        let out = w.run.outputs(inputs)?;
        Tensor::realize_all(&out.iter().collect::<Vec<_>>())?;
        device.synchronize()
    })
}

/// [`time`]'s runs of the workload as a [`Compiled`] function of `inputs`; the first
/// includes compiling it.
fn run_compiled(
    w: &Workload,
    inputs: &[Tensor],
    device: Device,
    runs: usize,
) -> Result<(Duration, Duration)> {
    let args: Vec<&Tensor> = inputs.iter().collect();
    let start = Instant::now();
    let f = Compiled::new(&args, |a| w.run.outputs(a))?;
    median_of(runs, start, || {
        f.call(&args)?;
        device.synchronize()
    })
}

/// Runs `one` `runs + 2` times: the first run's time counted from `first_from` (so it may
/// include setup), and the median of the runs after the two warm-up ones.
fn median_of(
    runs: usize,
    first_from: Instant,
    mut one: impl FnMut() -> Result<()>,
) -> Result<(Duration, Duration)> {
    let mut times = Vec::new();
    let mut first = Duration::ZERO;
    for k in 0..runs + 2 {
        let start = Instant::now();
        one()?;
        if k == 0 {
            first = first_from.elapsed();
        }
        if k >= 2 {
            times.push(start.elapsed());
        }
    }
    times.sort();
    Ok((first, times[times.len() / 2]))
}

fn main() -> std::process::ExitCode {
    // `TESSEL_LOG=tessel::plan=info` shows each plan's measured candidates on stderr.
    if let Ok(filter) = std::env::var("TESSEL_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let scale = if args.iter().any(|a| a == "--small") {
        16
    } else {
        1
    };
    let devices: Vec<Device> = match value("--devices") {
        Some(list) => match list.split(',').map(Device::parse).collect() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("gpu bench: {e}");
                return std::process::ExitCode::FAILURE;
            }
        },
        None => Device::all(),
    };
    let only = value("--only");
    let compiled = args.iter().any(|a| a == "--compiled");
    let mut table = String::from(
        "workload                                 device    median ms    throughput    first s\n",
    );
    for w in workloads(scale) {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|n| w.name.starts_with(n)))
        {
            continue;
        }
        let modes: &[bool] = if compiled { &[false, true] } else { &[false] };
        for (&device, &as_compiled) in devices
            .iter()
            .flat_map(|d| modes.iter().map(move |m| (d, m)))
        {
            let runs = if w.amount > 1e11 { 5 } else { 10 };
            let name = if as_compiled {
                format!("{} [compiled]", w.name)
            } else {
                w.name.to_string()
            };
            let line = match time(&w, device, runs, as_compiled) {
                Ok((first, t)) => {
                    let per_s = w.amount / t.as_secs_f64();
                    // Both units are 1e9 of their base.
                    let value = per_s / 1e9;
                    format!(
                        "{name:<40} {:<9} {:>9.3}    {value:>8.2} {:<7} {:>7.2}",
                        device.to_string(),
                        t.as_secs_f64() * 1e3,
                        w.unit,
                        first.as_secs_f64()
                    )
                }
                Err(e) => format!("{name:<40} {:<9} error: {e}", device.to_string()),
            };
            eprintln!("{line}");
            table.push_str(&line);
            table.push('\n');
        }
    }
    println!("\n{table}");
    std::process::ExitCode::SUCCESS
}
