"""One rank of the data-parallel tests (tests/torch/test_distributed.py starts it with mpirun).

    dist_worker.py parity     per model (MLP, digits CNN): the whole batch trained in this
                              process without collectives, then the same steps data-parallel
                              (this rank's half of each batch, gd.optimizer_step); prints one
                              JSON line per model with losses, parameter errors and metrics;
                              then torch.distributed with the "graft" backend (JSON line "api")
    dist_worker.py kill       rank 1 kills itself (SIGKILL) at step 5 of training
    dist_worker.py raise      rank 1 raises at step 5
    dist_worker.py mismatch   rank 1's model is wider: its gradients have other shapes
"""
import json
import os
import signal
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "torch"))
sys.path.insert(0, os.path.join(_ROOT, "examples"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import graft  # noqa: E402
import graft.distributed as gd  # noqa: E402
from digits_cnn import DigitsCNN, load_data  # noqa: E402

STEPS = 20
BATCH = 64
DEV = graft.device()


def mlp(hidden=64):
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def cnn():
    # Batch norm normalizes with per-process statistics and dropout draws per-process masks in
    # data-parallel training (as in PyTorch's DDP without SyncBatchNorm), so neither can match
    # one process on the whole batch: the parity model leaves them out.
    torch.manual_seed(0)
    m = DigitsCNN()
    m.bn1, m.drop = nn.Identity(), nn.Identity()
    return m


def train(make, dp, X, Y, kill_at=-1, raise_at=-1):
    """STEPS SGD steps; dp: this rank's share of each batch and gradients averaged."""
    w, r = (gd.world_size(), gd.rank()) if dp else (1, 0)
    n = BATCH // w
    model = make().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    graft.step()
    graft.reset_metrics()
    out = {"loss": [], "params": [], "graphs": [], "collectives": []}
    for s in range(STEPS):
        if s == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if s == raise_at:
            raise RuntimeError(f"rank {r} fails on purpose at step {s}")
        lo = (s * BATCH) % (len(X) - BATCH) + r * n
        x, y = X[lo:lo + n].to(DEV), Y[lo:lo + n].to(DEV)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if dp:
            gd.optimizer_step(opt)
        else:
            opt.step()
        graft.step()
        out["loss"].append(loss.item())
        out["params"].append([p.detach().cpu().clone() for p in model.parameters()])
        m = graft.metrics()
        out["graphs"].append(m["graphs_compiled"])
        out["collectives"].append(m["collectives"])
    return out


def emit(rec):
    """One JSON record, to $DIST_TEST_OUT/rank<r>.jsonl when set (the ranks' stdout interleave)."""
    d = os.environ.get("DIST_TEST_OUT")
    if not d:
        print(json.dumps(rec), flush=True)
        return
    with open(os.path.join(d, f"rank{gd.rank()}.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")


def rel_err(a, b):
    """max |a - b| / max |b|: relative to the tensor's scale (elements near 0 have none)."""
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def parity():
    X, Y, _, _ = load_data()
    for name, make in (("mlp", mlp), ("cnn", cnn)):
        ref = train(make, False, X, Y)
        dp = train(make, True, X, Y)
        perr = [max(rel_err(a, b) for a, b in zip(pa, pb))
                for pa, pb in zip(dp["params"], ref["params"])]
        emit({"model": name, "rank": gd.rank(), "world": gd.world_size(),
              "ref_loss": ref["loss"], "loss": dp["loss"], "param_err": perr,
              "graphs": dp["graphs"], "collectives": dp["collectives"]})
    api()


def api():
    """torch.distributed on graft tensors through the "graft" backend."""
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler
    dist.init_process_group("graft")
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.full((3,), float(r + 1)).to(DEV)
    dist.all_reduce(t)
    mx = torch.full((2,), float(r)).to(DEV)
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    b = torch.full((2,), float(r + 10)).to(DEV)
    dist.broadcast(b, src=1)
    outs = [torch.zeros(2).to(DEV) for _ in range(w)]
    dist.all_gather(outs, torch.full((2,), float(r)).to(DEV))
    dist.barrier()
    sampler = DistributedSampler(list(range(10)), shuffle=False)
    emit({"api": True, "rank": r, "world": w, "sum": t.cpu().tolist(),
          "max": mx.cpu().tolist(), "bcast": b.cpu().tolist(),
          "gather": [o.cpu().tolist() for o in outs], "sampler": list(sampler),
          "backend": dist.get_backend()})


def main():
    mode = sys.argv[1]
    gd.init()
    if mode == "parity":
        parity()
        return
    X, Y, _, _ = load_data()
    r = gd.rank()
    if mode == "kill":
        train(mlp, True, X, Y, kill_at=5 if r == 1 else -1)
    elif mode == "raise":
        train(mlp, True, X, Y, raise_at=5 if r == 1 else -1)
    elif mode == "mismatch":
        train(lambda: mlp(64 if r == 0 else 48), True, X, Y)
    print(f"rank {r}: finished training", flush=True)


if __name__ == "__main__":
    main()
