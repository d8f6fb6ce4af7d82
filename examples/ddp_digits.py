#!/usr/bin/env python3
"""The digits CNN (examples/digits_cnn.py) trained data-parallel on graft across processes:
each process takes its shard of every batch (DistributedSampler), the gradients are averaged
across processes inside the step's one compiled graph (graft.distributed.optimizer_step), and
every process ends with the same weights.

    mpirun -np 2 python3 examples/ddp_digits.py        # or: make demo-ddp (as root too)

Without mpirun it runs as a world of one. Batch norm uses each process's own batch statistics
(as PyTorch's DDP without SyncBatchNorm).
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "torch"))  # the in-place build of the graft package
sys.path.insert(0, os.path.join(_ROOT, "examples"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

import graft  # noqa: E402
import graft.distributed as gd  # noqa: E402
from digits_cnn import DigitsCNN, evaluate, load_data  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64, help="global batch, split over the ranks")
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    world = gd.init()
    rank = gd.rank()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} must divide by the {world} processes")
    local = args.batch // world
    dev = graft.device()
    Xtr, Ytr, Xte, Yte = load_data()

    torch.manual_seed(0)                       # the same initial weights everywhere ...
    model = DigitsCNN().to(dev)
    gd.broadcast(list(model.parameters()) + list(model.buffers()), root=0)  # ... made sure
    torch.manual_seed(1 + rank)                # but each rank its own dropout masks
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    xtr, ytr = Xtr.to(dev), Ytr.to(dev)
    graft.step()
    sampler = DistributedSampler(range(len(Xtr)), num_replicas=world, rank=rank, shuffle=True)
    if rank == 0:
        print(f"digits CNN data-parallel on {world} process(es): global batch {args.batch} "
              f"({local} per process), {len(sampler)} images per process per epoch")
    graft.reset_metrics()
    step_ms = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(sampler))
        loss_sum = torch.zeros(()).to(dev)
        steps = len(idx) // local
        t0 = time.perf_counter()
        for s in range(steps):
            bi = idx[s * local:(s + 1) * local].to(dev)
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr[bi]), ytr[bi])
            loss.backward()
            gd.optimizer_step(opt)              # average gradients over the ranks, then step
            loss_sum = loss_sum + loss.detach()
            graft.step()                        # forward, backward, all_reduce, update: one graph
        gd.all_reduce([loss_sum], "mean")
        loss = loss_sum.item() / steps
        ms = (time.perf_counter() - t0) * 1000 / steps
        step_ms.append(ms)
        if rank == 0:
            acc = evaluate(model, Xte.to(dev), Yte.to(dev))
            print(f"epoch {epoch + 1}: loss {loss:.4f}  test acc {acc:.3f}  {ms:.2f} ms/step")

    # Every rank must hold the same weights: compare a checksum across ranks.
    check = torch.stack([p.detach().double().sum() for p in model.parameters()]).float()
    lo, hi = check.clone(), check.clone()
    gd.all_reduce([lo], "min")
    gd.all_reduce([hi], "max")
    spread = (hi - lo).abs().max().item()
    m = graft.metrics()
    if rank == 0:
        print(f"weights agree across ranks: max checksum spread {spread:.3g}")
        print(f"steady step {min(step_ms[1:] or step_ms):.2f} ms; graphs compiled "
              f"{m['graphs_compiled']}, executions {m['executions']}, MPI collectives "
              f"{m['collectives']} ({m['collective_bytes'] / 1e6:.1f} MB, "
              f"{m['collective_ms']:.0f} ms including waiting for the other ranks)")
    if spread > 1e-3:
        raise SystemExit(f"rank {rank}: weights differ across ranks (spread {spread})")


if __name__ == "__main__":
    main()
