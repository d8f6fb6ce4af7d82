#!/usr/bin/env python3
"""PyTorch-on-graft benchmarks: BENCH lines in the compiler issue's format.

    cd /work/main && PYTHONPATH=torch /usr/bin/python3 bench/torch_bench.py [--quick] [--only NAME]

Each benchmark runs the same PyTorch code on graft's device (graft.step() per step) and on eager
CPU at its best settings (OMP_WAIT_POLICY=PASSIVE, set before torch is imported; the faster of 1
and 2 intra-op threads; OpenBLAS uses both cores), from the same initial weights. Times are
medians over repeated steps after warm-up, graft and eager timed in alternating blocks so that
both see the same machine (it is shared; its speed drifts); each block starts with a pause and
a few untimed steps, the same for both. For graft, graft.wait_compiles()
after the warm-up makes the steady state run natively compiled code.

Roofline: FLOPs of the step's matrix products / convolutions (counted analytically) divided by
the sgemm rate measured here (torch.mm 2048x2048 = OpenBLAS sgemm on 2 threads). The steps are
compute-bound at these sizes; elementwise work is not counted, so of_roofline >= 1 always.

torch_trace_per_op: the bridge's cost per aten op recorded (Python dispatch + lowering + IR
node), measured by tracing many small elementwise ops (tensor*tensor, tensor+scalar, relu) on a
16-element device tensor without syncing, divided by the number of ops.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import copy
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "torch"))
sys.path.insert(0, os.path.join(_ROOT, "examples"))

import torch
import torch.nn as nn
import torch.nn.functional as F

import graft

DEV = graft.device()


_BASE = {"fallback_ops": 0}


def ref_ops(m):
    """Instructions of the timed steps' compiled graphs that ran on reference kernels."""
    return m.get("fallback_ops", 0) - _BASE["fallback_ops"]


def timed(fn, sync):
    t0 = time.perf_counter()
    sync(fn())
    return (time.perf_counter() - t0) * 1000


def graft_warm(fn, warmup):
    """Warm-up on graft: the first steps trace, compile (in the background) and cache; after
    graft.wait_compiles() the steady state runs natively compiled code. Metrics are reset so
    that they describe the timed steps."""
    for _ in range(warmup):
        graft_sync(fn())
    graft.wait_compiles()
    graft_sync(fn())    # first run after the compile lands
    graft.reset_metrics()
    _BASE["fallback_ops"] = graft.metrics().get("fallback_ops", 0)  # not reset by graft


def graft_sync(out=None):
    """Cuts the step: one graph computing every live tensor (parameters, optimizer state and
    the step's output, kept alive by the argument so that it is not dead code)."""
    graft.step()
    del out


def cpu_sync(out=None):
    pass


def sgemm_gflops():
    torch.set_num_threads(2)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        torch.mm(a, b)
        ts.append(time.perf_counter() - t0)
    return 2 * 2048 ** 3 / min(ts) / 1e9


def best_eager(make_fn, warmup, reps):
    """Eager at its best thread setting: (step fn, threads), from a short probe of each."""
    best = None
    for th in (1, 2):
        torch.set_num_threads(th)
        fn = make_fn()
        for _ in range(warmup):
            fn()
        ms = statistics.median(timed(fn, cpu_sync) for _ in range(max(3, reps // 4)))
        if best is None or ms < best[0]:
            best = (ms, th, fn)
    torch.set_num_threads(1)
    return best[2], best[1]


def interleaved(gfn, efn, eth, reps, rounds=5, warm=3):
    """Median ms of graft and of eager, timed in alternating blocks: this machine is shared and
    its speed drifts, so both see the same conditions. Every block starts the same way: a pause
    (OpenBLAS's threads spin for a while after eager's last product) and a few untimed steps
    (caches, sleeping threads, clock speed after the pause)."""
    gts, ets = [], []
    per = max(1, reps // rounds)
    for _ in range(rounds):
        for fn, sync, th, ts in ((gfn, graft_sync, 1, gts), (efn, cpu_sync, eth, ets)):
            torch.set_num_threads(th)
            time.sleep(0.2)
            for _ in range(warm):
                sync(fn())
            ts += [timed(fn, sync) for _ in range(per)]
    torch.set_num_threads(1)
    return statistics.median(gts), statistics.median(ets)


def bench_line(name, g_ms, e_ms, flops, gflops):
    roof = flops / (gflops * 1e9) * 1000
    print(f"BENCH {name} graft_ms={g_ms:.3f} eager_ms={e_ms:.3f} speedup={e_ms / g_ms:.3f} "
          f"roofline_ms={roof:.3f} of_roofline={g_ms / roof:.3f}", flush=True)


def train_step_fn(model, x, y, loss_fn, opt_fn):
    opt = opt_fn(model.parameters())

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def run_train(name, model, X, Y, loss_fn, opt_fn, flops, gflops, warmup, reps):
    gm = copy.deepcopy(model).to(DEV)
    xg, yg = X.to(DEV), Y.to(DEV)
    gstep = train_step_fn(gm, xg, yg, loss_fn, opt_fn)
    graft.step()
    graft_warm(gstep, warmup)
    estep, th = best_eager(lambda: train_step_fn(copy.deepcopy(model), X, Y, loss_fn, opt_fn), warmup, reps)
    g_ms, e_ms = interleaved(gstep, estep, th, reps)
    m = graft.metrics()
    print(f"# {name}: eager best at {th} thread(s); graft in the timed steps: graphs compiled "
          f"{m['graphs_compiled']}, compiled executions {m['compiled_executions']}/{m['executions']}, "
          f"instructions on reference kernels {ref_ops(m)}, fallbacks {m['fallbacks']}", flush=True)
    bench_line(name, g_ms, e_ms, flops, gflops)


def bench_mlp(gflops, quick):
    torch.manual_seed(0)
    B, dims = 256, [784, 1024, 1024, 10]
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    X, Y = torch.randn(B, 784), torch.randint(0, 10, (B,))
    fwd = sum(2 * B * a * b for a, b in zip(dims, dims[1:]))
    flops = 3 * fwd - 2 * B * 784 * 1024  # forward, dW and dX (no dX for the input layer)
    run_train("torch_mlp_train_step", model, X, Y, F.cross_entropy,
              lambda p: torch.optim.SGD(p, lr=0.01), flops, gflops, 3, 5 if quick else 20)


def bench_cnn(gflops, quick):
    from digits_cnn import DigitsCNN
    torch.manual_seed(0)
    B = 64
    model = DigitsCNN()
    X, Y = torch.randn(B, 1, 8, 8), torch.randint(0, 10, (B,))
    conv1 = 2 * B * 16 * 8 * 8 * 1 * 9
    conv2 = 2 * B * 32 * 4 * 4 * 16 * 9
    fc = 2 * B * 128 * 10
    flops = 3 * (conv1 + conv2 + fc) - conv1  # no input gradient for the first conv
    run_train("torch_cnn_train_step", model, X, Y, F.cross_entropy,
              lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), flops, gflops, 3, 5 if quick else 20)


def bench_encoder(gflops, quick):
    torch.manual_seed(0)
    d, h, S, B, ff = 512, 8, 256, 8, 2048
    enc = nn.TransformerEncoderLayer(d, h, ff, batch_first=True).eval()
    x = torch.randn(B, S, d)
    T = B * S
    flops = 2 * T * d * 3 * d + 2 * 2 * B * S * S * d + 2 * T * d * d + 2 * 2 * T * d * ff
    eg, xg = copy.deepcopy(enc).to(DEV), x.to(DEV)
    reps = 5 if quick else 10

    def gfn():
        with torch.no_grad():
            return eg(xg)
    graft.step()
    graft_warm(gfn, 2)

    def make():
        e = copy.deepcopy(enc)

        def f():
            with torch.no_grad():
                return e(x)
        return f
    efn, th = best_eager(make, 2, reps)
    g_ms, e_ms = interleaved(gfn, efn, th, reps)
    m = graft.metrics()
    print(f"# torch_encoder_fwd: eager best at {th} thread(s); graft in the timed steps: graphs "
          f"compiled {m['graphs_compiled']}, compiled executions {m['compiled_executions']}/"
          f"{m['executions']}, instructions on reference kernels {ref_ops(m)}, fallbacks "
          f"{m['fallbacks']}", flush=True)
    bench_line("torch_encoder_fwd", g_ms, e_ms, flops, gflops)


def bench_trace(quick):
    x = torch.ones(16, device=DEV)
    graft.step()
    n = 3000 if quick else 10000

    def run():
        y = x
        t0 = time.perf_counter()
        for _ in range(n // 3):
            y = y * x
            y = y + 1.0
            y = torch.relu(y)
        t = time.perf_counter() - t0
        graft.step()
        return t / (3 * (n // 3)) * 1e6
    run()
    us = statistics.median(run() for _ in range(5))
    print(f"BENCH torch_trace_per_op us={us:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", default="", help="comma-separated subset: mlp,encoder,cnn,trace")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else {"mlp", "encoder", "cnn", "trace"}
    gflops = sgemm_gflops()
    print(f"# sgemm rate (roofline reference): {gflops:.1f} GFLOP/s; torch {torch.__version__}; "
          f"GRAFT_COMPILE={os.environ.get('GRAFT_COMPILE', 'async')}", flush=True)
    torch.set_num_threads(1)
    if "trace" in only:
        bench_trace(args.quick)
    if "mlp" in only:
        bench_mlp(gflops, args.quick)
    if "cnn" in only:
        bench_cnn(gflops, args.quick)
    if "encoder" in only:
        bench_encoder(gflops, args.quick)


if __name__ == "__main__":
    main()
