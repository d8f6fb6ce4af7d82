"""Eager PyTorch peer for bench_compiler.c: prints `EAGER <name> <ms>` (median, best over
intra-op thread settings), at PyTorch's OpenMP defaults."""
import time, sys
import torch
import torch.nn.functional as F

def med(fn, reps=7):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]

def best(fn):
    r = []
    for nt in (1, 2):
        torch.set_num_threads(nt)
        r.append(med(fn))
    return min(r)

torch.manual_seed(0)
x = torch.rand(16 * 1024 * 1024) * 4 - 2
def gelu():
    return 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
print("EAGER gelu_chain_16M %.3f" % best(gelu), flush=True)
s = torch.randn(4096, 4096)
print("EAGER softmax_4096x4096 %.3f" % best(lambda: torch.softmax(s, -1)), flush=True)
l = torch.randn(8192, 1024); w = torch.randn(1024); b = torch.randn(1024)
print("EAGER layernorm_8192x1024 %.3f" % best(lambda: F.layer_norm(l, (1024,), w, b)), flush=True)
A = torch.randn(2048, 2048); B = torch.randn(2048, 2048); bias = torch.randn(2048)
print("EAGER matmul_2048 %.3f" % best(lambda: torch.mm(A, B)), flush=True)
print("EAGER matmul_bias_relu_2048 %.3f" % best(lambda: torch.relu(torch.mm(A, B) + bias)), flush=True)
y = torch.rand(512, 512)
def chain():
    t = y
    for i in range(21):
        t = torch.tanh(t * 0.9 + 0.1) if i % 3 == 0 else (t * 1.01 - 0.02 if i % 3 == 1 else torch.abs(t))
    return t
print("EAGER first_run_100_nodes %.3f" % best(chain), flush=True)
