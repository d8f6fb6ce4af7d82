"""Training from C (examples/train_mlp.c: graft_grad, graft_adam / graft_sgd) against PyTorch
eager: the same 3-layer MLP, the same initial weights and batch (written by graft.save_tensors,
read in C by graft_load_tensors), 20 steps; the loss of every step within 1e-4 relative of
PyTorch's, on every graft device (cpu:0, cpu:1, OpenCL where listed) with the losses within
float32 rounding of each other. The step compiles once; the weights C saves load in PyTorch."""
import os
import re
import subprocess

import pytest
import torch
import torch.nn as nn

import graft
from devices import OPENCL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXE = os.path.join(ROOT, "build", "examples", "train_mlp")
NAMES = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
STEPS = 20


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    subprocess.run(["make", "-s", "-C", ROOT, "build/examples/train_mlp"], check=True,
                   capture_output=True, timeout=600)
    d = tmp_path_factory.mktemp("train_c")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    x = torch.randn(100, 2)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # learnable: quadrant classes
    sd = model.state_dict()
    graft.save_tensors({n: sd[k] for n, k in zip(NAMES, sd)}, d / "init.graft")
    graft.save_tensors({"x": x, "y": y}, d / "data.graft")
    return d, model, x, y


def _torch_losses(model, x, y, sgd):
    m = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    m.load_state_dict(model.state_dict())
    opt = (torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9) if sgd
           else torch.optim.Adam(m.parameters(), lr=1e-2))
    out = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out, m


def _c_losses(d, sgd, device=0, steps=STEPS, env=None):
    cmd = [EXE, "--init", str(d / "init.graft"), "--data", str(d / "data.graft"), "--steps",
           str(steps), "--lr", "1e-2", "--device", str(device)] + (["--sgd"] if sgd else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, **(env or {})))
    assert r.returncode == 0, r.stderr
    losses = [float(v) for v in re.findall(r"^step \d+ loss (\S+)$", r.stdout, re.M)]
    graphs = int(re.search(r"graphs compiled (\d+)", r.stdout).group(1))
    return losses, graphs


@pytest.mark.parametrize("sgd", [False, True], ids=["adam", "sgd_momentum"])
def test_c_training_matches_pytorch_per_step(case, sgd):
    d, model, x, y = case
    want, _ = _torch_losses(model, x, y, sgd)
    got, _ = _c_losses(d, sgd)
    assert len(got) == STEPS
    for s, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= 1e-4 * abs(w), "step %d: C %.9g, PyTorch %.9g" % (s, g, w)
    assert want[-1] < 0.8 * want[0]  # it trained


def test_every_device_gives_the_same_losses(case):
    d = case[0]
    base, _ = _c_losses(d, False, 0)
    others = [1] + [dev.index for dev in OPENCL[:1]]
    for dev in others:
        got, _ = _c_losses(d, False, dev)
        for s, (g, b) in enumerate(zip(got, base)):
            assert abs(g - b) <= 2e-5 * abs(b), "device %d step %d: %.9g vs cpu:0 %.9g" % (dev, s, g, b)


def test_one_graph_for_every_step(case):
    """Every step (forward, gradients, Adam) is one graph: 100 steps, natively compiled before
    the first runs, compile one graph in all."""
    losses, graphs = _c_losses(case[0], False, steps=100, env={"GRAFT_COMPILE": "sync"})
    assert len(losses) == 100 and graphs == 1


def test_weights_trained_in_c_load_in_pytorch(case, tmp_path):
    """examples/train_mlp trains and saves; PyTorch loads the file into nn.Linear layers and
    agrees with C's evaluation of it."""
    r = subprocess.run([EXE, "--epochs", "3", "--save", str(tmp_path / "w.graft")], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    sd = graft.load_tensors(tmp_path / "w.graft")
    assert sorted(sd) == sorted(NAMES) and sd["fc1.weight"].shape == (64, 2)
    r2 = subprocess.run([EXE, "--eval", str(tmp_path / "w.graft")], capture_output=True, text=True, timeout=600)
    assert r2.returncode == 0, r2.stderr
    c_acc = float(re.search(r"test accuracy (\S+)", r2.stdout).group(1))
    assert c_acc == float(re.search(r"test accuracy (\S+)", r.stdout).group(1)) and c_acc > 0.8
    m = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    m.load_state_dict({k: sd[n] for n, k in zip(NAMES, m.state_dict())})
    # a file another program wrote is refused by name, and a missing name lists what is there
    bad = tmp_path / "bad.graft"
    bad.write_bytes((tmp_path / "w.graft").read_bytes()[:100])
    r3 = subprocess.run([EXE, "--eval", str(bad)], capture_output=True, text=True, timeout=600)
    assert r3.returncode != 0 and "truncated" in r3.stderr
    graft.save_tensors({"other": torch.zeros(2)}, tmp_path / "other.graft")
    r4 = subprocess.run([EXE, "--eval", str(tmp_path / "other.graft")], capture_output=True, text=True, timeout=600)
    assert r4.returncode != 0 and "no tensor named 'fc1.weight' (it has: other)" in r4.stderr
