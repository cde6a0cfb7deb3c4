"""The GPU comparison bench's PyTorch side: the same workloads as benches/gpu.rs, timed
with CUDA events (median of several runs after a warm-up), plus the device's copy
bandwidth, which the elementwise and reduction figures are measured against.

    python3 benches/gpu_torch.py
"""
import time

import torch

torch.backends.cuda.matmul.allow_tf32 = False  # f32 matmul in true f32, as Tessel's
dev = "cuda"


def time_ms(fn, runs=10):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def host_ms(fn, runs=200):
    """Median host time of `fn` plus a synchronize: what a loop of small steps pays."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e3


def chain8(x):
    y = (x * 1.5 + 0.25).relu() * x
    return -((y - 0.5).abs() + x)


n = 256 << 20
x = torch.rand(n, device=dev) * 2 - 1
out = torch.empty_like(x)
rows = [("device copy f32 (256M)", time_ms(lambda: out.copy_(x)), 2 * 4 * n, "GB/s")]
sx, sb = torch.rand(16, device=dev), torch.rand(16, device=dev)
rows.append(("small op [16] f32 (op calls + synchronize, host clock)", host_ms(lambda: sx * 2 + sb), 4 * 3 * 16, "GB/s"))
rows.append(("chain8 f32 eager", time_ms(lambda: chain8(x)), 2 * 4 * n, "GB/s"))
try:
    compiled = torch.compile(chain8)
    rows.append(("chain8 f32 torch.compile", time_ms(lambda: compiled(x)), 2 * 4 * n, "GB/s"))
except Exception as e:  # no compiler toolchain on the host
    print(f"torch.compile unavailable: {e}")
xb = x.to(torch.bfloat16)
rows.append(("chain8 bf16 eager", time_ms(lambda: chain8(xb)), 2 * 2 * n, "GB/s"))
try:
    rows.append(("chain8 bf16 torch.compile", time_ms(lambda: compiled(xb)), 2 * 2 * n, "GB/s"))
except Exception as e:
    print(f"torch.compile unavailable: {e}")
del x, xb, out
a = torch.rand(16384, 16384, device=dev)
rows.append(("sum last axis f32", time_ms(lambda: a.sum(-1)), 4 * (16384 * 16384 + 16384), "GB/s"))
rows.append(("sum axis 0 f32 (column sums)", time_ms(lambda: a.sum(0)), 4 * (16384 * 16384 + 16384), "GB/s"))
del a
s = torch.rand(8192, 8192, device=dev)
bias = torch.rand(8192, device=dev)
rows.append(("bias add rows f32", time_ms(lambda: s + bias), 4 * (2 * 8192 * 8192 + 8192), "GB/s"))
rows.append(("transpose copy f32", time_ms(lambda: s.t().contiguous()), 2 * 4 * 8192 * 8192, "GB/s"))
sb, biasb = s.to(torch.bfloat16), bias.to(torch.bfloat16)
rows.append(("bias add rows bf16", time_ms(lambda: sb + biasb), 2 * (2 * 8192 * 8192 + 8192), "GB/s"))
rows.append(("transpose copy bf16", time_ms(lambda: sb.t().contiguous()), 2 * 2 * 8192 * 8192, "GB/s"))
del sb, biasb
rows.append(("softmax rows f32", time_ms(lambda: s.softmax(-1)), 2 * 4 * 8192 * 8192, "GB/s"))
ln = lambda: torch.nn.functional.layer_norm(s, (8192,))
rows.append(("layer_norm rows f32", time_ms(ln), 2 * 4 * 8192 * 8192, "GB/s"))
del s
for m in (4096, 1024):
    p, q = torch.rand(m, m, device=dev), torch.rand(m, m, device=dev)
    rows.append((f"matmul f32 {m}", time_ms(lambda: p @ q), 2 * m**3, "GFLOP/s"))
    if m == 4096:
        torch.backends.cuda.matmul.allow_tf32 = True  # as set_float32_matmul_precision(High)
        rows.append((f"matmul f32 tf32 {m}", time_ms(lambda: p @ q), 2 * m**3, "GFLOP/s"))
        torch.backends.cuda.matmul.allow_tf32 = False
for dtype in (torch.bfloat16, torch.float16):
    p, q = (torch.rand(4096, 4096, device=dev).to(dtype) for _ in range(2))
    name = str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float16", "f16")
    rows.append((f"matmul {name} 4096", time_ms(lambda: p @ q), 2 * 4096**3, "GFLOP/s"))
del p, q

# Issue 9: the same names as benches/gpu.rs.
torch.backends.cudnn.benchmark = True  # cuDNN picks its fastest conv algorithm, once
torch.backends.cudnn.allow_tf32 = False  # f32 convolution in true f32, as Tessel's
cx = torch.rand(32, 64, 56, 56, device=dev) * 2 - 1
cw = torch.rand(64, 64, 3, 3, device=dev) * 2 - 1
conv = lambda: torch.nn.functional.conv2d(cx, cw, padding=1)
rows.append(("conv2d f32 [32,64,56,56] 3x3 p1", time_ms(conv), 2 * 32 * 64 * 56 * 56 * 64 * 9, "GFLOP/s"))
del cx, cw
px = torch.rand(32, 64, 112, 112, device=dev) * 2 - 1
pool = lambda: torch.nn.functional.max_pool2d(px, 3, stride=2, padding=1)
rows.append(("max_pool2d f32 [32,64,112,112] 3x3 s2 p1", time_ms(pool), 4 * 32 * 64 * (112 * 112 + 56 * 56), "GB/s"))
del px
sx = torch.rand(16 << 20, device=dev) * 2 - 1
# stable=True: Tessel's sort is stable too; values and int64 indices, as there.
rows.append(("sort f32 16M (values + i64 indices)", time_ms(lambda: torch.sort(sx, stable=True)), 16 * (16 << 20), "GB/s"))
del sx

sr = torch.rand(8192, 1024, device=dev) * 2 - 1
rows.append(("argsort rows f32 [8192,1024]", time_ms(lambda: torch.argsort(sr, dim=-1, stable=True)), 12 * 8192 * 1024, "GB/s"))
del sr

# Issue 20: indexing and losses over GPT-2's vocabulary, the same names as benches/gpu.rs.
V = 50257
ids = torch.randint(0, V, (8 * 512,), device=dev)
table = torch.rand(V, 768, device=dev) * 2 - 1
rows.append(("embedding f32 [8,512] of [50257,768]", time_ms(lambda: torch.nn.functional.embedding(ids, table)), 2 * 4 * 8 * 512 * 768, "GB/s"))
tg = table.clone().requires_grad_()
rg = torch.rand(8 * 512, 768, device=dev) * 2 - 1
emb_bwd = lambda: torch.autograd.grad((torch.nn.functional.embedding(ids, tg) * rg).sum(), tg)
rows.append(("embedding backward f32 [8,512] into [50257,768]", time_ms(emb_bwd), 4 * (V + 8 * 512) * 768, "GB/s"))
torch.use_deterministic_algorithms(True)
rows.append(("embedding backward deterministic f32 [8,512] into [50257,768]", time_ms(emb_bwd), 4 * (V + 8 * 512) * 768, "GB/s"))
torch.use_deterministic_algorithms(False)
del tg, rg
nodes = torch.randint(0, 16384, (1 << 20, 1), device=dev).expand(1 << 20, 64)
msgs = torch.rand(1 << 20, 64, device=dev) * 2 - 1
amax = lambda: torch.zeros(16384, 64, device=dev).scatter_reduce(0, nodes, msgs, "amax", include_self=False)
rows.append(("scatter_reduce amax f32 [1M,64] into [16384,64]", time_ms(amax), 4 * ((1 << 20) + 16384) * 64, "GB/s"))
scat = lambda: torch.zeros(16384, 64, device=dev).scatter(0, nodes, msgs)
rows.append(("scatter f32 [1M,64] into [16384,64]", time_ms(scat), 4 * ((1 << 20) + 16384) * 64, "GB/s"))
del nodes, msgs
logits = (torch.rand(4096, V, device=dev) * 2 - 1).requires_grad_()
targets = torch.randint(0, V, (4096,), device=dev)
ce = lambda: torch.autograd.grad(torch.nn.functional.cross_entropy(logits, targets), logits)
rows.append(("cross_entropy fwd+bwd f32 [4096,50257]", time_ms(ce), 2 * 4 * 4096 * V, "GB/s"))
del logits
tk = torch.rand(64, V, device=dev) * 2 - 1
rows.append(("topk k=50 f32 [64,50257]", time_ms(lambda: torch.topk(tk, 50, dim=-1)), 4 * 64 * V, "GB/s"))
del tk, table

# A pre-norm GPT-2-small block forward, as benches/benches/gpu.rs builds it (eager).
F = torch.nn.functional
# GPT-2's MLP up-projection with its bias and GELU (tanh form): addmm, then GELU; and
# torch.compile of the same.
lt, lin, lout = 8 * 512, 768, 3072
lin_flops = 2 * lt * lin * lout
def linear_gelu(x, w, b):
    return F.gelu(torch.addmm(b, x, w), approximate="tanh")
for dtype, tag in [(torch.bfloat16, "bf16"), (torch.float32, "f32")]:
    lx = (torch.rand(lt, lin, device=dev) * 2 - 1).to(dtype)
    lw = ((torch.rand(lin, lout, device=dev) * 2 - 1) / lin ** 0.5).to(dtype)
    lb = ((torch.rand(lout, device=dev) * 2 - 1) / lin ** 0.5).to(dtype)
    with torch.no_grad():
        rows.append((f"linear+gelu {tag} [4096,768]x[768,3072]", time_ms(lambda: linear_gelu(lx, lw, lb)), lin_flops, "GFLOP/s"))
        rows.append((f"  addmm alone {tag}", time_ms(lambda: torch.addmm(lb, lx, lw)), lin_flops, "GFLOP/s"))
        try:
            compiled = torch.compile(linear_gelu)
            compiled(lx, lw, lb)
            rows.append((f"  torch.compile {tag}", time_ms(lambda: compiled(lx, lw, lb)), lin_flops, "GFLOP/s"))
        except Exception as e:
            print(f"torch.compile unavailable: {e}")

# Device random numbers (gpu.rs's dropout and randn rows): bytes read + written.
dn = 8 * 512 * 768
dx = torch.rand(dn, device=dev) * 2 - 1
for dtype, tag, size in [(torch.float32, "f32", 4), (torch.bfloat16, "bf16", 2)]:
    xd = dx.to(dtype)
    rows.append((f"dropout p=0.1 {tag} [8,512,768]", time_ms(lambda: F.dropout(xd, 0.1, training=True)), 2 * size * dn, "GB/s"))
rows.append(("randn f32 [16M]", time_ms(lambda: torch.randn(16_777_216, device=dev)), 4 * 16_777_216, "GB/s"))
del dx

# Causal SDPA over GPT-2 small's heads (gpu.rs's sdpa rows): PyTorch's flash kernel in
# bf16, its memory-efficient kernel in f32.
sq = [torch.rand(8, 12, 512, 64, device=dev) * 2 - 1 for _ in range(3)]
sdpa_flops = 4 * 8 * 12 * 512 * 512 * 64
with torch.no_grad():
    for dtype, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        q, k, v = (t.to(dtype) for t in sq)
        rows.append((f"sdpa causal fwd {tag} [8,12,512,64]", time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), sdpa_flops, "GFLOP/s"))
        # Timed as gpu.rs times Tessel (host clock around the call and a synchronize):
        # the events above leave out the synchronize's latency.
        rows.append((f"sdpa causal fwd {tag} (call + synchronize, host clock)", host_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), sdpa_flops, "GFLOP/s"))
# Forward and backward (the gradients of q, k, v for a given output gradient): the work
# counts the forward's two products and the backward's four, in full.
for dtype, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
    q, k, v = (t.to(dtype).requires_grad_() for t in sq)
    d_out = (torch.rand(8, 12, 512, 64, device=dev) * 2 - 1).to(dtype)
    def fwd_bwd():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.autograd.grad(y, (q, k, v), d_out)
    rows.append((f"sdpa causal fwd+bwd {tag} [8,12,512,64]", time_ms(fwd_bwd), 3 * sdpa_flops, "GFLOP/s"))
del sq, q, k, v, d_out

# One query per head against a cache of 4096 (gpu.rs's sdpa decode rows).
dq = torch.rand(1, 12, 1, 64, device=dev) * 2 - 1
dkv = [torch.rand(1, 12, 4096, 64, device=dev) * 2 - 1 for _ in range(2)]
with torch.no_grad():
    for dtype, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        q, k, v = dq.to(dtype), dkv[0].to(dtype), dkv[1].to(dtype)
        rows.append((f"sdpa decode {tag} q [1,12,1,64] kv [1,12,4096,64]", time_ms(lambda: F.scaled_dot_product_attention(q, k, v)), 4 * 12 * 4096 * 64, "GFLOP/s"))
del dq, dkv

bn, bs, be, bh = 8, 512, 768, 12
bx = torch.rand(bn, bs, be, device=dev) * 2 - 1
# Weights and biases in ±1/√in, as torch.nn.Linear initializes them (gpu.rs's Init::Linear).
bw = [(torch.rand(*d, device=dev) * 2 - 1) / fan_in ** 0.5 for d, fan_in in
      [((be, 3 * be), be), ((3 * be,), be), ((be, be), be), ((be,), be),
       ((be, 4 * be), be), ((4 * be,), be), ((4 * be, be), 4 * be), ((be,), 4 * be)]]
def block(x, w_qkv, b_qkv, w_o, b_o, w_up, b_up, w_down, b_down):
    qkv = F.layer_norm(x, (be,)) @ w_qkv + b_qkv
    q, k, v = (t.reshape(bn, bs, bh, be // bh).transpose(1, 2) for t in qkv.split(be, dim=2))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    h = x + a.transpose(1, 2).reshape(bn, bs, be) @ w_o + b_o
    return h + F.gelu(F.layer_norm(h, (be,)) @ w_up + b_up) @ w_down + b_down
tokens = bn * bs
block_flops = 2 * (tokens * be * 12 * be + 2 * bn * bs * bs * be)
with torch.no_grad():
    rows.append(("transformer block fwd f32 [8,512,768]", time_ms(lambda: block(bx, *bw)), block_flops, "GFLOP/s"))
    hx, hw = bx.bfloat16(), [w.bfloat16() for w in bw]
    rows.append(("transformer block fwd bf16 [8,512,768]", time_ms(lambda: block(hx, *hw)), block_flops, "GFLOP/s"))
    try:
        compiled_block = torch.compile(block)
        for tag, args in [("f32", (bx, *bw)), ("bf16", (hx, *hw))]:
            start = time.perf_counter()
            compiled_block(*args)
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            rows.append((f"block {tag} torch.compile (first {first:.1f} s)", time_ms(lambda: compiled_block(*args)), block_flops, "GFLOP/s"))
    except Exception as e:
        print(f"torch.compile unavailable: {e}")

print(f"\n{'workload (PyTorch ' + torch.__version__ + ')':<40} {'median ms':>10}    throughput")
for name, ms, amount, unit in rows:
    per_s = amount / (ms / 1e3)
    value = per_s / 1e9  # GB/s or GFLOP/s
    print(f"{name:<40} {ms:>10.3f}    {value:>8.2f} {unit}")
