#!/usr/bin/env python3
"""Training from C (examples/train_mlp.c) against the same model trained by PyTorch eager on the
CPU: the same initial weights and data (train_mlp --dump), Adam at lr 1e-2, batches of 100, the
same number of epochs; each epoch's steps timed (a C epoch ends with its last step's loss read,
an eager one with loss.item() per step, as the C loop does), in alternating runs.

    .venv/bin/python bench/train_mlp_peer.py [--epochs N] [--runs N]

    BENCH train_mlp_c epoch_ms= eager_epoch_ms= speedup= test_acc= eager_test_acc=
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

# eager at PyTorch's defaults: OMP_WAIT_POLICY=PASSIVE made torch 2's small steps several times
# slower (bench/zoo.py)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "torch"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import graft  # noqa: E402

EXE = os.path.join(_ROOT, "build", "examples", "train_mlp")
NAMES = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]


def c_run(epochs):
    """Per-epoch ms (after the first, which compiles) and test accuracy of the C program."""
    r = subprocess.run([EXE, "--epochs", str(epochs)], capture_output=True, text=True, check=True)
    ms = [float(v) for v in re.findall(r"  (\S+) ms$", r.stdout, re.M)]
    return statistics.median(ms[1:]), float(re.search(r"test accuracy (\S+)", r.stdout).group(1))


def eager_run(d, epochs):
    torch.set_num_threads(2)
    m = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    m.load_state_dict({k: d[n] for n, k in zip(NAMES, m.state_dict())})
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    x, y = d["x_train"], d["y_train"]
    g = torch.Generator().manual_seed(0)
    ms = []
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        t0 = time.perf_counter()
        for b in range(0, len(x) - 99, 100):
            idx = perm[b:b + 100]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(m(x[idx]), y[idx])
            loss.backward()
            opt.step()
            loss.item()
        ms.append((time.perf_counter() - t0) * 1e3)
    with torch.no_grad():
        acc = (m(d["x_test"]).argmax(1) == d["y_test"]).float().mean().item()
    return statistics.median(ms[1:]), acc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", _ROOT, "build/examples/train_mlp"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "d.graft")
        subprocess.run([EXE, "--dump", path], check=True, capture_output=True)
        d = graft.load_tensors(path)
    cs, es = [], []
    for _ in range(a.runs):
        cs.append(c_run(a.epochs))
        es.append(eager_run(d, a.epochs))
    c_ms, e_ms = statistics.median(c[0] for c in cs), statistics.median(e[0] for e in es)
    print("BENCH train_mlp_c epoch_ms=%.2f eager_epoch_ms=%.2f speedup=%.2f test_acc=%.3f eager_test_acc=%.3f"
          % (c_ms, e_ms, e_ms / c_ms, cs[-1][1], es[-1][1]), flush=True)


if __name__ == "__main__":
    main()
