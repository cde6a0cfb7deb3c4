"""The models bench's PyTorch side: writes random-initialized full-size models with
transformers/torchvision (GPT-2 small, BERT-base, ResNet-50) into DIR, with inputs and
reference outputs, and times them with PyTorch eager and torch.compile on the GPU: first
call and steady state (median of several runs, CUDA-synchronized wall time, as the Tessel
side measures). `benches/benches/models.rs` then loads the same files.

    python3 benches/models_torch.py DIR

`MODELS_WRITE_ONLY=1` writes the files and reference outputs without timing anything;
`MODELS_DEVICE=cpu` computes them on the CPU; `MODELS_ONLY=AdamW` times only the workloads
whose names contain the text (`MODELS_ONLY=mlp,gpt2`: either); `MODELS_DTYPES=bf16` times
the models' forwards in bf16 only (default `f32,bf16`).
"""
import copy
import os
import sys
import time

import safetensors.torch as st
import torch
import torchvision
import transformers

out = sys.argv[1] if len(sys.argv) > 1 else "models"
dev = os.environ.get("MODELS_DEVICE", "cuda")  # `cpu` for the CPU figures
torch.backends.cuda.matmul.allow_tf32 = False  # true f32, as Tessel's default
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.benchmark = True
rows = []


def timed(fn, runs=10):
    """(first call s, median ms) of `fn`, synchronized wall time."""
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    fn()
    times = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return first, times[len(times) // 2]


WRITE_ONLY = os.environ.get("MODELS_WRITE_ONLY") == "1"  # files and references, no timing
# Time only workloads whose names contain this text (or one of several, comma-separated).
ONLY = [o for o in os.environ.get("MODELS_ONLY", "").split(",") if o]
# The dtypes models run in (`MODELS_DTYPES=bf16`: bf16 alone).
DTYPES = [d for d in os.environ.get("MODELS_DTYPES", "f32,bf16").split(",") if d in ("f32", "bf16")]


def wanted(name):
    return not ONLY or any(o in name for o in ONLY)


def bench(name, fn, unit=None, amount=None, runs=10):
    if WRITE_ONLY or not wanted(name):
        return
    try:
        first, ms = timed(fn, runs)
    except Exception as e:  # torch.compile without a toolchain, out of memory
        print(f"{name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return
    extra = f"  {amount / (ms / 1e3):.1f} {unit}" if unit else ""
    print(f"{name:<44} first {first:7.2f} s  steady {ms:9.3f} ms{extra}", flush=True)
    rows.append((name, first, ms))


def variants(name, model, inputs, unit, amount):
    if WRITE_ONLY or not wanted(name):
        return
    for label in DTYPES:
        m = model if label == "f32" else copy.deepcopy(model).to(torch.bfloat16)
        with torch.no_grad():
            bench(f"{name} {label} eager", lambda: m(*inputs(m)), unit, amount)
            c = torch.compile(m)
            bench(f"{name} {label} torch.compile", lambda: c(*inputs(m)), unit, amount)
        del m


torch.manual_seed(0)
g = torch.Generator().manual_seed(0)

# models.rs's mlp-train: one AdamW step of a 784-128-10 MLP on a batch of 64.
mlp = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(dev)
mlp_opt = torch.optim.AdamW(mlp.parameters())
mlp_x, mlp_y = torch.rand(64, 784, device=dev), torch.arange(64, device=dev) % 10
def mlp_step():
    torch.nn.functional.cross_entropy(mlp(mlp_x), mlp_y).backward()
    mlp_opt.step()
    mlp_opt.zero_grad(set_to_none=True)
bench("mlp 784-128-10 AdamW step [64] f32 eager", mlp_step, "samples/s", 64, runs=50)
del mlp, mlp_opt

# GPT-2 small (124M), dropout off so eager, compiled and Tessel compute the same.
cfg = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
gpt2 = transformers.GPT2LMHeadModel(cfg).eval()
gpt2.save_pretrained(f"{out}/gpt2", safe_serialization=True)
ids = torch.randint(0, cfg.vocab_size, (8, 512), generator=g)
prompt = torch.randint(0, cfg.vocab_size, (1, 16), generator=g)
gpt2 = gpt2.to(dev)
with torch.no_grad():
    last = gpt2(ids.to(dev)).logits[:, -1, :].float().cpu()
    greedy = gpt2.generate(prompt.to(dev), max_new_tokens=128, min_new_tokens=128, do_sample=False,
                           pad_token_id=0, eos_token_id=None).cpu()
st.save_file({"input_ids": ids, "last_logits": last.contiguous(), "prompt": prompt, "greedy": greedy},
             f"{out}/gpt2/reference.safetensors")
variants("gpt2 forward [8,512]", gpt2, lambda m: (ids.to(dev),), "tokens/s", 8 * 512)
with torch.no_grad():
    gen = lambda: gpt2.generate(prompt.to(dev), max_new_tokens=128, min_new_tokens=128,
                                do_sample=False, pad_token_id=0, eos_token_id=None)
    bench("gpt2 greedy decode 128 tokens, batch 1", gen, "tokens/s", 128, runs=3)
# One AdamW step on [8, 512] (labels = inputs, transformers' shifted loss).
gpt2.train()
opt = torch.optim.AdamW(gpt2.parameters(), lr=1e-4)
def train_step():
    loss = gpt2(ids.to(dev), labels=ids.to(dev)).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
bench("gpt2 AdamW step [8,512] f32 eager", train_step, "tokens/s", 8 * 512, runs=5)
def autocast_step():
    with torch.autocast(torch.device(dev).type, dtype=torch.bfloat16):
        loss = gpt2(ids.to(dev), labels=ids.to(dev)).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
bench("gpt2 AdamW step [8,512] bf16 autocast eager", autocast_step, "tokens/s", 8 * 512, runs=5)
del gpt2, opt

# BERT-base, batch 64 x 128 tokens.
cfg = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
bert = transformers.BertModel(cfg, add_pooling_layer=True).eval()
bert.save_pretrained(f"{out}/bert", safe_serialization=True)
bids = torch.randint(0, cfg.vocab_size, (64, 128), generator=g)
mask = torch.ones(64, 128, dtype=torch.int64)
bert = bert.to(dev)
with torch.no_grad():
    cls = bert(bids.to(dev), attention_mask=mask.to(dev)).last_hidden_state[:, 0, :].float().cpu()
st.save_file({"input_ids": bids, "attention_mask": mask, "cls": cls.contiguous()},
             f"{out}/bert/reference.safetensors")
variants("bert-base [64,128]", bert, lambda m: (bids.to(dev), mask.to(dev)), "sentences/s", 64)
del bert

# ResNet-50, batch 32 of 224x224.
resnet = torchvision.models.resnet50().eval()
os.makedirs(f"{out}/resnet50", exist_ok=True)
st.save_file({k: v.contiguous() for k, v in resnet.state_dict().items()}, f"{out}/resnet50/model.safetensors")
images = torch.randn(32, 3, 224, 224, generator=g)
resnet = resnet.to(dev)
with torch.no_grad():
    logits = resnet(images.to(dev)).float().cpu()
st.save_file({"images": images, "logits": logits.contiguous()}, f"{out}/resnet50/reference.safetensors")
variants("resnet50 [32,3,224,224]", resnet, lambda m: (images.to(dev, next(m.parameters()).dtype),), "images/s", 32)

print(f"\nPyTorch {torch.__version__}, transformers {transformers.__version__}, torchvision {torchvision.__version__}")
