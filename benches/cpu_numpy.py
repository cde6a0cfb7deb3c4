"""numpy's side of `benches/benches/cpu_first.rs`: the same workloads on the same machine.

Run right after the Rust bench: `python3 benches/cpu_numpy.py [--runs N]`. numpy runs each op
of the chain as its own pass over memory (no fusion), single-threaded except matmul (BLAS).
"""
import sys
import time

import numpy as np

RUNS = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 5


def median_ms(f):
    f()
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        f()
        samples.append((time.perf_counter() - start) * 1e3)
    return sorted(samples)[len(samples) // 2]


def chain(x):
    a = 1.0 / (1.0 + np.exp(-(x * np.float32(1.5) + np.float32(0.25))))
    b = np.tanh(a * x - np.float32(0.5))
    return np.abs(b + x)


rng = np.random.default_rng(0)
x = rng.standard_normal(1 << 24, dtype=np.float32)
m = rng.standard_normal((4096, 4096), dtype=np.float32)
a = rng.standard_normal((2048, 2048), dtype=np.float32)
b = rng.standard_normal((2048, 2048), dtype=np.float32)
print("| workload | numpy |")
print("|---|---|")
print(f"| chain8 sigmoid/tanh f32 [16M] | {median_ms(lambda: chain(x)):.2f} ms |")
print(f"| row sum f32 [4096, 4096] | {median_ms(lambda: m.sum(axis=-1)):.2f} ms |")
print(f"| matmul f32 2048³ | {median_ms(lambda: a @ b):.2f} ms |")
print(f"| copy f32 [16M] | {median_ms(lambda: x.copy()):.2f} ms |")
