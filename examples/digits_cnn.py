#!/usr/bin/env python3
"""graft's demo: an unmodified PyTorch training loop for a small CNN on the handwritten digits
that ship with scikit-learn (sklearn.datasets.load_digits: 1797 8x8 images, no download), run on
graft's device; then the same steps from the same initial weights timed on graft and on eager
CPU in alternating blocks; then graft's metrics. The training is traced: it writes a timeline
(trace.json, for https://ui.perfetto.dev), pictures of the compiled graphs (dumps/) and a report
a person reads (report.html: the slowest kernels and what they fused, the compiles and why)
into --out (build/demo).

    .venv/bin/python examples/digits_cnn.py [--epochs N] [--out DIR]
"""
import os
import argparse
import copy
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "torch"))  # the in-place build of the graft package

import torch
import torch.nn as nn
import torch.nn.functional as F

import graft


class DigitsCNN(nn.Module):
    """conv-bn-relu-maxpool, conv-relu-adaptive avgpool, dropout, linear: 8x8 -> 10 classes."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)   # [B,16,4,4]
        x = F.adaptive_avg_pool2d(F.relu(self.conv2(x)), 2)    # [B,32,2,2]
        return self.fc(self.drop(x.flatten(1)))


def load_data(seed=0):
    from sklearn.datasets import load_digits
    d = load_digits()
    X = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0   # [1797,1,8,8] in [0,1]
    X = (X - X.mean()) / X.std()
    Y = torch.tensor(d.target, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(X), generator=g)
    X, Y = X[perm], Y[perm]
    n_test = 357
    return X[n_test:], Y[n_test:], X[:n_test], Y[:n_test]


def batches(n, bs, epoch, seed=0):
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(n, generator=g)
    return [perm[i:i + bs] for i in range(0, n - bs + 1, bs)]  # full batches: one graph shape


def train_step(model, opt, xb, yb):
    opt.zero_grad()
    logits = model(xb)
    loss = F.cross_entropy(logits, yb)
    loss.backward()
    opt.step()
    return loss.detach(), (logits.detach().argmax(1) == yb).sum()


def graft_block(model, opt, X, Y, steps):
    """ms per step of the steps (indices on graft's device), queued and waited for."""
    t0 = time.perf_counter()
    for bi in steps:
        train_step(model, opt, X[bi], Y[bi])
        graft.step()
    graft.wait()
    return (time.perf_counter() - t0) * 1000 / len(steps)


def eager_block(model, opt, X, Y, steps):
    """ms per step of the same steps on eager CPU."""
    t0 = time.perf_counter()
    for bi in steps:
        l, _ = train_step(model, opt, X[bi], Y[bi])
    l.item()
    return (time.perf_counter() - t0) * 1000 / len(steps)


def evaluate(model, X, Y):
    model.eval()
    with torch.no_grad():
        acc = (model(X).argmax(1) == Y).float().mean().item()
    model.train()
    return acc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--block", type=int, default=10, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=7, help="timed blocks of each")
    ap.add_argument("--out", default=os.path.join(_ROOT, "build", "demo"),
                    help="where the trace, the pictures and the report go")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    trace_path = os.path.join(args.out, "trace.json")
    graft.set_dump_dir(os.path.join(args.out, "dumps"))  # each compiled graph, drawn

    Xtr, Ytr, Xte, Yte = load_data()
    torch.manual_seed(0)  # also seeds graft's generator (dropout masks on the device)
    init = DigitsCNN()
    dev = graft.device()
    print(f"digits: {len(Xtr)} train / {len(Xte)} test images of 8x8; CNN with "
          f"{sum(p.numel() for p in init.parameters())} parameters; batch {args.batch}; "
          f"SGD(momentum=0.9, lr={args.lr}); graft device {dev}")

    model = copy.deepcopy(init).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    xtr, ytr, xte, yte = Xtr.to(dev), Ytr.to(dev), Xte.to(dev), Yte.to(dev)
    graft.step()
    graft.reset_metrics()
    t_start = time.perf_counter()
    tracing = graft.trace(trace_path).start()
    for epoch in range(args.epochs):
        idx = batches(len(Xtr), args.batch, epoch)
        # Running sums start as zeros copied to the device (data, like the later sums; zeros
        # made on the device would be constants of a different graph), so that every step of
        # every epoch runs the same graph.
        loss_sum = torch.zeros(()).to(dev)
        correct = torch.zeros((), dtype=torch.long).to(dev)
        t0 = time.perf_counter()
        for bi in idx:
            bi = bi.to(dev)
            l, c = train_step(model, opt, xtr[bi], ytr[bi])
            loss_sum = loss_sum + l
            correct = correct + c
            graft.step()   # cut the step's graph: compiled once, then a cache hit per step
        loss = loss_sum.item() / len(idx)
        ms = (time.perf_counter() - t0) * 1000 / len(idx)
        train_acc = correct.item() / (len(idx) * args.batch)
        test_acc = evaluate(model, xte, yte)
        print(f"epoch {epoch + 1}: loss {loss:.4f}  train acc {train_acc:.3f}  "
              f"test acc {test_acc:.3f}  {ms:.2f} ms/step")
    graft_total = time.perf_counter() - t_start
    tracing.stop()
    graft.set_dump_dir(None)

    # Speed: the same steps from the same initial weights on graft and on eager CPU (at its best
    # thread setting), timed in alternating blocks so that both see the same machine (it may be
    # shared; its speed drifts). A graft block ends with graft.wait(): steps run asynchronously.
    steps = batches(len(Xtr), args.batch, 0)[:args.block]
    gm = copy.deepcopy(init).to(dev)
    go = torch.optim.SGD(gm.parameters(), lr=args.lr, momentum=0.9)
    gsteps = [bi.to(dev) for bi in steps]
    for bi in gsteps:  # the training's graph: a cache hit
        train_step(gm, go, xtr[bi], ytr[bi])
        graft.step()
    graft.wait_compiles()  # steady state: native code (a first run may still be compiling it)
    best = None
    for threads in (1, 2):
        torch.set_num_threads(threads)
        mc = copy.deepcopy(init)
        oc = torch.optim.SGD(mc.parameters(), lr=args.lr, momentum=0.9)
        ms = eager_block(mc, oc, Xtr, Ytr, steps)
        if best is None or ms < best[0]:
            best = (ms, threads, mc, oc)
    _, threads, mc, oc = best
    g_ms, e_ms = [], []
    for _ in range(args.rounds):
        torch.set_num_threads(1)
        time.sleep(0.1)
        g_ms.append(graft_block(gm, go, xtr, ytr, gsteps))
        torch.set_num_threads(threads)
        time.sleep(0.1)
        e_ms.append(eager_block(mc, oc, Xtr, Ytr, steps))
    g_med, e_med = statistics.median(g_ms), statistics.median(e_ms)
    print(f"speed, {args.rounds} alternating blocks of {len(steps)} steps (medians): graft "
          f"{g_med:.2f} ms/step, eager CPU (torch {torch.__version__}, {threads} thread(s)) "
          f"{e_med:.2f} ms/step; eager/graft = {e_med / g_med:.2f}x")
    print(f"graft trained {args.epochs} epochs in {graft_total:.1f} s including compiles "
          f"(traced, each graph drawn)")

    m = graft.metrics()
    fb = graft.fallbacks()
    print(f"graft metrics: graphs compiled {m['graphs_compiled']}, cache hits {m['cache_hits']}, "
          f"executions {m['executions']} ({m['compiled_executions']} ran native code, "
          f"{m['native_compiles']} native compiles), fallbacks {sum(fb.values())}"
          + (" " + str(fb) if fb else ""))
    print(f"  compile {m['compile_ms']:.1f} ms, execute {m['execute_ms']:.1f} ms, sync overhead "
          f"{m['sync_overhead_ms']:.1f} ms, peak device memory {m['bytes_peak'] / 1e6:.1f} MB")
    if os.environ.get("GRAFT_DEMO_REPORT"):
        print(graft.metrics_report())
    report = graft.report(os.path.join(args.out, "report.html"), trace=trace_path,
                          dump_dir=os.path.join(args.out, "dumps"), title="graft demo: digits CNN training")
    print(f"the training's timeline: {trace_path} (open it in https://ui.perfetto.dev)")
    print(f"what ran, for a person: {report}")


if __name__ == "__main__":
    main()
