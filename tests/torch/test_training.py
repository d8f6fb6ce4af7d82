"""Training parity: graft vs CPU eager from the same initial weights and data."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import graft
from parity import step_both

DEV = graft.device()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))


# torch 2's implementations: foreach=True (the _foreach_* ops, decomposed per tensor) and
# fused=True (aten::_fused_adam_/_fused_adamw_/_fused_sgd_, lowered by torch/csrc/lower_optim.cpp).
IMPLS = {
    "sgd_foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
    "sgd_fused": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, fused=True),
    "sgd_fused_nesterov_wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                       weight_decay=0.01, fused=True),
    "sgd_fused_plain": lambda p: torch.optim.SGD(p, lr=0.05, fused=True),
    "adam_fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adam_fused_amsgrad_wd": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, weight_decay=0.01,
                                                         fused=True),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01, fused=True),
    "adamw_fused_maximize": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01, maximize=True,
                                                         fused=True),
}


def make_opt(name, params):
    if name in IMPLS:
        return IMPLS[name](params)
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-2)
    raise ValueError(name)


def run_parity(model, opt_name, X, Y, loss_fn, steps=20):
    mc = copy.deepcopy(model)
    mg = copy.deepcopy(model).to(DEV)
    oc, og = make_opt(opt_name, mc.parameters()), make_opt(opt_name, mg.parameters())
    xg, yg = X.to(DEV), Y.to(DEV)
    graft.step()
    graft.reset_metrics()
    compiled_after_first = None
    for i in range(steps):
        step_both(mc, oc, mg, og, X, Y, xg, yg, loss_fn, i)
        if i == 0:
            compiled_after_first = graft.metrics()["graphs_compiled"]
    m = graft.metrics()
    for p_c, p_g in zip(mc.parameters(), mg.parameters()):
        torch.testing.assert_close(p_g.cpu(), p_c, rtol=1e-4, atol=1e-5)
    return m, compiled_after_first


@pytest.mark.parametrize("opt_name", ["sgd", "adamw", "adam"])
def test_mlp_parity_no_fallback(opt_name):
    torch.manual_seed(1)
    X = torch.randn(32, 20)
    Y = torch.randint(0, 10, (32,))
    m, first = run_parity(mlp(), opt_name, X, Y, F.cross_entropy)
    fb = {k: v for k, v in m.items() if k.startswith("aten::")}
    assert fb == {}, fb
    assert m["graphs_compiled"] - first <= 2, m


@pytest.mark.parametrize("opt_name", sorted(IMPLS))
def test_torch2_optimizer_impls_parity_no_fallback(opt_name):
    """foreach and fused optimizer steps lower to graft ops (no fallback, one graph a step) and
    match the same implementation on the CPU step by step."""
    torch.manual_seed(1)
    X = torch.randn(32, 20)
    Y = torch.randint(0, 10, (32,))
    m, first = run_parity(mlp(), opt_name, X, Y, F.cross_entropy, steps=8)
    fb = {k: v for k, v in m.items() if k.startswith("aten::")}
    assert fb == {}, fb
    assert m["graphs_compiled"] - first <= 2, m


def test_mlp_mse_parity():
    torch.manual_seed(2)
    X = torch.randn(16, 20)
    Y = torch.randn(16, 10)
    m, _ = run_parity(mlp(), "sgd", X, Y, F.mse_loss, steps=10)
    assert {k: v for k, v in m.items() if k.startswith("aten::")} == {}


def test_steady_loop_compiles_at_most_two():
    model = mlp().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    X = torch.randn(32, 20).to(DEV)
    Y = torch.randint(0, 10, (32,)).to(DEV)
    graft.step()
    graft.reset_metrics()
    for i in range(100):  # the steady loop: 100 steps
        opt.zero_grad()
        F.cross_entropy(model(X), Y).backward()
        opt.step()
        graft.step()
        if i == 0:
            first = graft.metrics()["graphs_compiled"]
    assert graft.metrics()["graphs_compiled"] - first <= 2


def test_unmarked_loop_reading_its_loss_keeps_one_graph_a_step():
    """Unmodified PyTorch code: no graft.step(), the loss read every step. The read syncs the
    parameters' and momentum's updates with the loss (they read the forward's values), so the
    graphs stop growing (each had recomputed every earlier step) and the losses are eager's."""
    cpu = mlp()
    model = copy.deepcopy(cpu).to(DEV)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (cpu, model)]
    torch.manual_seed(1)
    X, Y = torch.randn(32, 20), torch.randint(0, 10, (32,))
    Xg, Yg = X.to(DEV), Y.to(DEV)
    graft.step()
    graft.reset_metrics()
    nodes = []
    for i in range(6):
        losses = []
        for m, opt, x, y in ((cpu, opts[0], X, Y), (model, opts[1], Xg, Yg)):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-5)
        nodes.append(graft.metrics()["last_graph_nodes"])
    assert nodes[5] == nodes[2] and graft.metrics()["graphs_compiled"] <= 3


def test_changing_lr_does_not_recompile():
    model = mlp().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X = torch.randn(8, 20).to(DEV)
    Y = torch.randint(0, 10, (8,)).to(DEV)
    for i in range(4):
        opt.zero_grad()
        F.cross_entropy(model(X), Y).backward()
        opt.step()
        graft.step()
    c0 = graft.metrics()["graphs_compiled"]
    for i in range(4):
        for g in opt.param_groups:
            g["lr"] = 0.01 * (i + 2)
        opt.zero_grad()
        F.cross_entropy(model(X), Y).backward()
        opt.step()
        graft.step()
    assert graft.metrics()["graphs_compiled"] == c0


def test_state_dict_roundtrip_and_save(tmp_path):
    model = mlp().to(DEV)
    sd = {k: v.cpu() for k, v in model.state_dict().items()}
    path = tmp_path / "m.pt"
    torch.save(sd, path)
    m2 = mlp()
    with torch.no_grad():
        for p in m2.parameters():
            p.add_(1)
    m2 = m2.to(DEV)
    m2.load_state_dict(torch.load(path))
    for (k, a), (_, b) in zip(model.state_dict().items(), m2.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b.cpu())


def test_grad_accumulation_and_no_grad():
    torch.manual_seed(3)
    w = torch.randn(4, 3)
    x = torch.randn(5, 4)
    wc = w.clone().requires_grad_()
    wg = w.to(DEV).requires_grad_()
    for _ in range(2):
        (x @ wc).sum().backward()
        (x.to(DEV) @ wg).sum().backward()
    torch.testing.assert_close(wg.grad.cpu(), wc.grad)
    with torch.no_grad():
        wc -= 0.1 * wc.grad
        wg -= 0.1 * wg.grad
    torch.testing.assert_close(wg.cpu(), wc)
    assert wg.requires_grad


class _GraftMadeSamples(torch.utils.data.Dataset):
    """Each sample is computed on graft's device inside the DataLoader worker: a forked child of
    a process whose graft threads (executor, compile thread, pool) are running."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        v = (self.x[i].to(DEV) * 2).tanh().cpu()
        built = 0
        if i % 16 == 15:  # the worker's own graph gets native code: it waits for its build
            graft.reset_metrics()
            graft.wait_compiles()
            built = graft.metrics()["native_compiles"]
        return v, self.y[i], built


def test_dataloader_forked_workers_use_graft():
    """DataLoader workers (fork) while the parent trains on graft: each worker runs and compiles
    graft graphs of its own, the parent's training goes on across epochs (new workers each
    epoch), nothing hangs (the loader's timeout fails a stuck worker), the samples are right."""
    torch.manual_seed(0)
    model = nn.Linear(8, 3).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = _GraftMadeSamples(96)
    for k in range(30):  # graphs (of 30 shapes) the parent ran once: a worker must not compile them
        (torch.randn(8 + k).to(DEV) * 2).sin().sum().item()
    losses = []
    for _ in range(3):
        dl = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2, timeout=120,
                                         multiprocessing_context="fork")
        seen = 0
        for xb, yb, built in dl:
            assert int(built.max()) <= 2, built  # its own graphs only
            torch.testing.assert_close(xb, (ds.x[seen:seen + len(xb)] * 2).tanh())
            seen += len(xb)
            loss = F.cross_entropy(model(xb.to(DEV)), yb.to(DEV))
            opt.zero_grad()
            loss.backward()
            opt.step()
            graft.step()
            losses.append(loss.item())
        assert seen == len(ds)
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("fused", [False, True])
def test_grad_scaler_steps_match_cpu(fused):
    """torch.amp.GradScaler on graft's device: the unscale and the scaled (fused) Adam step mutate
    lists of tensors; what runs on PyTorch's kernels (a fallback) is written back element by
    element, so the parameters match the CPU's step by step."""
    torch.manual_seed(0)
    m = nn.Linear(6, 3)
    X, Y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    res = []
    for dev in ("cpu", DEV):
        mm = copy.deepcopy(m).to(dev)
        opt = torch.optim.Adam(mm.parameters(), lr=0.01, fused=fused)
        sc = torch.amp.GradScaler(dev.type if isinstance(dev, torch.device) else dev, init_scale=1024.0)
        for _ in range(3):
            opt.zero_grad()
            sc.scale(F.cross_entropy(mm(X.to(dev)), Y.to(dev))).backward()
            sc.step(opt)
            sc.update()
            graft.step()
        res.append([p.detach().cpu() for p in mm.parameters()])
    for a, b in zip(res[1], res[0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
