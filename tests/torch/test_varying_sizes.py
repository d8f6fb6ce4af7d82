"""A training loop whose sequence length varies (text batched by length): graft compiles the
step's kernels once for the family of sizes (size-generic kernel bodies take the sizes that vary
at run time), every step's gradients match float64 as closely as PyTorch's float32 does, and the
recompile reason says the new size runs on size-generic kernels."""
import copy
import os
import sys

import pytest
import torch

import graft

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_parity import TinyLM, _seq_ce, grad_errors, reference_grads  # noqa: E402

DEV = graft.device()
RATIO = 8.0  # as test_model_parity: graft's error may be this many times float32's
TOTAL_FLOOR = 1e-7
LENGTHS = (8, 8, 13, 21, 13, 34, 5, 47, 21)


def _train_case():
    """The loop, in a process of its own (no disk cache: what a first run compiles)."""
    torch.manual_seed(0)
    model = TinyLM(seq=48).train()
    m32, m64 = copy.deepcopy(model), copy.deepcopy(model).double()
    names = [n for n, _ in model.named_parameters()]
    mg = model.to(DEV)
    opt = torch.optim.AdamW(mg.parameters(), lr=1e-3)
    graft.step()
    graft.reset_metrics()
    gen = torch.Generator().manual_seed(1)
    for i, s in enumerate(LENGTHS):
        tok = torch.randint(0, 32, (2, s + 1), generator=gen)
        x, y = tok[:, :-1], tok[:, 1:]
        params = [p.detach().cpu() for p in mg.parameters()]
        _, g32, _ = reference_grads(m32, params, [x], y, _seq_ce, torch.float32)
        _, g64, _ = reference_grads(m64, params, [x], y, _seq_ce, torch.float64)
        opt.zero_grad()
        _seq_ce(mg(x.to(DEV)), y.to(DEV)).backward()
        opt.step()
        graft.step()
        gg = [p.grad.cpu().to(torch.float64) for p in mg.parameters()]
        _, (eg, e32, n64) = grad_errors(names, gg, g32, g64)
        assert eg <= RATIO * max(e32, TOTAL_FLOOR * n64), (i, s, eg, e32, n64)
        if i == 3:  # the third size: the family's size-generic kernels are compiled by the
            # time the next size comes (a family of two keeps each size's own code)
            graft.wait_compiles()
    m, mode = graft.metrics(), os.environ.get("GRAFT_COMPILE", "async")
    assert graft.fallbacks() == {}
    if mode == "off":  # nothing compiles: the parity above is the whole check
        print("ok")
        return
    assert m["kernels_sized"] > 0, str(m)
    if mode == "async":  # a new size's first run is native
        assert m["library_builds"] > 0, str(m)
    reasons = [l for l in graft.metrics_report().splitlines() if "(size-generic)" in l]
    # each names the nearest cached graph and the shapes that differ from it
    assert reasons and all("cached graph" in r and "has " in r for r in reasons), reasons
    print("ok")


def _in_child(call, **env):
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    code = "import sys; sys.path.insert(0, %r); import test_varying_sizes as t; t.%s" % (here, call)
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_varying_sequence_length_trains_right_on_size_generic_kernels():
    assert _in_child("_train_case()", GRAFT_DISK_CACHE="0").split()[-1] == "ok"


@pytest.mark.skipif(os.environ.get("GRAFT_COMPILE") == "off", reason="nothing compiles")
def test_sizes_off_compiles_each_size():
    """Four sizes of a graph, each compiled: size-generic bodies compile fewer kernels than
    GRAFT_SIZED=0 (the A/B switch), where every size compiles kernels of its own."""
    import subprocess
    code = ("import torch, graft; d = graft.device(); w = torch.randn(6, 5).to(d)\n"
            "for n in (3, 7, 11, 7, 13):\n"
            "    (torch.randn(n, 6).to(d) @ w).tanh().sum().item()\n"
            "graft.wait_compiles(); m = graft.metrics()\n"
            "print(m['kernels_sized'], m['graphs_compiled'], m['kernels_compiled'])")
    out = {}
    for flag in ("0", "1"):
        env = dict(os.environ, GRAFT_SIZED=flag, GRAFT_DISK_CACHE="0")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out[flag] = [int(v) for v in r.stdout.split()]
    assert out["0"][0] == 0 and out["1"][0] > 0, out
    assert out["0"][1] == out["1"][1] == 4 and out["1"][2] < out["0"][2], out
