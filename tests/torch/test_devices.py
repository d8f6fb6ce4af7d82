"""graft's devices from PyTorch: graft.devices(), graft.device(kind, ordinal), tensors on the
CPU devices and on an OpenCL device (torch.device("graft", N) is graft device N), moving them,
mixing them (an error), training on the OpenCL device, and what crosses its memory boundary."""
import copy
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import graft
from devices import OPENCL, device_params, needs_opencl


def test_devices_lists_the_cpu_devices_then_accelerators():
    ds = graft.devices()
    assert [d.index for d in ds] == list(range(len(ds)))
    assert [(d.kind, d.ordinal) for d in ds[:4]] == [("cpu", i) for i in range(4)]
    assert all(d.memory == 0 and d.name for d in ds[:4])
    assert all(d.kind != "cpu" for d in ds[4:])
    assert [d.device for d in ds] == [torch.device("graft", i) for i in range(len(ds))]
    for d in ds:
        assert graft.device(d.kind, d.ordinal) == d.device


def test_devices_say_why_an_accelerator_kind_has_none():
    ds = graft.devices()
    kinds = {d.kind for d in ds}
    for kind in ("opencl", "cuda"):
        assert (kind in ds.absent) == (kind not in kinds)
    if "cuda" not in kinds:  # no GPU here: the driver's absence is named, in the list and in the error
        why = ds.absent["cuda"]
        assert "CUDA driver" in why and "no cuda device" in repr(ds)
        with pytest.raises(RuntimeError, match="no cuda device 0 \\(%s" % re.escape(why)):
            graft.device("cuda")
    else:
        assert graft.device("cuda") == [d for d in ds if d.kind == "cuda"][0].device


FAKE_CUDA = os.path.join(os.path.dirname(__file__), "..", "..", "build", "asan", "tests", "libfakecuda.so")


@pytest.mark.skipif(not os.path.exists(FAKE_CUDA), reason="build/asan/tests/libfakecuda.so not built (make check-asan)")
def test_cuda_device_through_a_stand_in_driver():
    """The CUDA runtime under PyTorch with tests/fake_cuda.c as the driver (host memory, kernels
    refused): the device is listed, tensors move there and back, the reference tier computes on
    its memory, and a training step's gradients come back equal to the CPU's."""
    code = """
import torch, graft
d = graft.device("cuda")
ds = graft.devices()
assert "cuda" not in ds.absent and ds[d.index].kind == "cuda" and "fake" in ds[d.index].name
torch.manual_seed(0)
m = torch.nn.Linear(8, 4)
x, y = torch.randn(16, 8), torch.randn(16, 4)
torch.nn.functional.mse_loss(m(x), y).backward()
g = m.weight.grad.clone()
m.weight.grad = None
mg = m.to(d)
torch.nn.functional.mse_loss(mg(x.to(d)), y.to(d)).backward()
assert torch.allclose(mg.weight.grad.cpu(), g, atol=1e-6), (mg.weight.grad.cpu(), g)
assert torch.equal((x.to(d) * 2).cpu(), x * 2)
print("ok")
"""
    env = dict(os.environ, GRAFT_CUDA_DRIVER=os.path.abspath(FAKE_CUDA), GRAFT_COMPILE="off")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]


def test_device_forms():
    assert graft.device() == graft.device(0) == torch.device("graft", 0)
    assert graft.device("cpu") == torch.device("graft", 0)
    assert graft.device("cpu", 2) == graft.device("cpu:2") == torch.device("graft", 2)


@needs_opencl
def test_opencl_device_name_and_memory():
    d = OPENCL[0]
    assert graft.device("opencl") == graft.device("opencl", 0) == graft.device("opencl:0") == d.device
    assert d.index >= 4 and d.name and d.memory > 0


def test_missing_devices_raise_with_what_is_missing():
    with pytest.raises(RuntimeError, match="no nope device 0.*kinds are cpu, opencl, cuda"):
        graft.device("nope")
    with pytest.raises(RuntimeError, match="no cpu device 4.*cpu devices are 0..3"):
        graft.device("cpu", 4)
    n = len([d for d in graft.devices() if d.kind == "opencl"])
    with pytest.raises(RuntimeError, match="no opencl device %d.*(OpenCL runtime|%d opencl device)" % (n, n)):
        graft.device("opencl", n)
    with pytest.raises(RuntimeError, match="no device 15"):
        graft.device(15)


def test_tensors_on_two_cpu_devices():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    a0, b1 = a.to(graft.device("cpu", 0)), b.to(graft.device("cpu", 1))
    assert (a0.device, b1.device) == (torch.device("graft", 0), torch.device("graft", 1))
    s = b1 * 2 + 1  # runs on cpu:1, results stay there
    assert s.device == torch.device("graft", 1)
    torch.testing.assert_close(s.cpu(), b * 2 + 1)
    with pytest.raises(RuntimeError, match=r"same device.*graft:0 \(cpu:0\) and graft:1 \(cpu:1\)"):
        a0 + b1
    torch.testing.assert_close((a0 + b1.to(a0.device)).cpu(), a + b)


@needs_opencl
def test_moving_tensors_to_and_from_opencl():
    cl = graft.device("opencl")
    x = torch.randn(5, 6)
    from_cpu = x.to(cl)
    from_graft = x.to(graft.device()).to(cl)
    assert from_cpu.device == from_graft.device == cl
    torch.testing.assert_close(from_cpu.cpu(), x)
    torch.testing.assert_close(from_graft.cpu(), x)
    back = (from_cpu * 3).to(graft.device("cpu", 2))  # opencl -> a graft cpu device
    assert back.device == graft.device("cpu", 2)
    torch.testing.assert_close(back.cpu(), x * 3)
    assert torch.zeros(2, 3, device=cl).device == cl
    assert torch.arange(4, device=cl).cpu().tolist() == [0, 1, 2, 3]
    assert (from_cpu.sum() * 2).item() == pytest.approx((x.sum() * 2).item(), rel=1e-5)


@needs_opencl
def test_mixing_opencl_and_cpu_tensors_raises():
    a = torch.randn(4, 4).to(graft.device("opencl"))
    b = torch.randn(4, 4).to(graft.device())
    with pytest.raises(RuntimeError, match=r"same device.*\(opencl:0\) and graft:0 \(cpu:0\)"):
        a + b
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(b, a)
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([a, b])
    with pytest.raises(RuntimeError, match=r"same device.*cpu"):
        a + torch.randn(4, 4)  # a PyTorch CPU tensor (0-dim ones are allowed, as on CUDA)
    torch.testing.assert_close((a + torch.tensor(2.0)).cpu(), a.cpu() + 2)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))


def _train(model, dev, X, Y, steps, opt="sgd"):
    """Trains a copy of model on dev; returns (losses, the trained copy)."""
    m = copy.deepcopy(model).to(dev)
    o = (torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) if opt == "sgd"
         else torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01))
    xd, yd = X.to(dev), Y.to(dev)
    losses = []
    for _ in range(steps):
        o.zero_grad()
        loss = F.cross_entropy(m(xd), yd)
        loss.backward()
        o.step()
        graft.step()
        losses.append(loss.item())
    return losses, m


@needs_opencl
@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_mlp_trains_on_opencl_as_on_cpu(opt):
    torch.manual_seed(1)
    X, Y = torch.randn(32, 20), torch.randint(0, 10, (32,))
    model = _mlp()
    ref, mc = _train(model, torch.device("cpu"), X, Y, 3, opt)
    graft.reset_metrics()
    got, mg = _train(model, graft.device("opencl"), X, Y, 3, opt)
    assert all(p.device == graft.device("opencl") for p in mg.parameters())
    assert got == pytest.approx(ref, rel=1e-5)
    for pc, pg in zip(mc.parameters(), mg.parameters()):
        torch.testing.assert_close(pg.cpu(), pc, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(pg.grad.cpu(), pc.grad, rtol=1e-4, atol=1e-5)
    assert graft.fallbacks() == {}


def test_metrics_have_the_device_traffic_fields():
    m = graft.metrics()
    for k in ("device_uploads", "device_upload_bytes", "device_downloads", "device_download_bytes"):
        assert isinstance(m[k], int), k


def test_cpu_devices_move_nothing_across_a_device_boundary():
    graft.step()
    graft.reset_metrics()
    x = torch.randn(8, 8).to(graft.device("cpu", 1))
    (x @ x).sum().item()
    m = graft.metrics()
    assert m["device_uploads"] == m["device_downloads"] == 0, m


@needs_opencl
def test_opencl_counts_uploads_and_reads():
    graft.step()
    graft.reset_metrics()
    x = torch.randn(8, 8).to(graft.device("opencl"))
    m = graft.metrics()
    assert m["device_uploads"] >= 1 and m["device_upload_bytes"] >= 8 * 8 * 4, m
    x.cpu()
    m = graft.metrics()
    assert m["device_downloads"] >= 1 and m["device_download_bytes"] >= 8 * 8 * 4, m


SCALAR_BYTES = 8  # a scalar operand (learning rate, alpha, ...) uploaded: at most a float64
# What crosses the device's memory boundary, per device kind: (uploads, bytes), (reads, bytes).
TRAFFIC = {"cpu": (("transfers_to_device", "bytes_to_device"), ("transfers_to_host", "bytes_to_host")),
           "opencl": (("device_uploads", "device_upload_bytes"), ("device_downloads", "device_download_bytes"))}

class _LSTM(nn.Module):
    """PyTorch's LSTM cell updates chunks of its gates in place (sigmoid_ on views): graft writes
    views into their root with index constants, which must not be uploaded again every step."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


class _CNN(nn.Module):
    """A convolution, batch norm and max pooling: their gradients (conv2d's, max_pool_grad) run
    as the device's own kernels, not on the host."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        return self.head(F.max_pool2d(F.relu(self.bn(self.conv(x))), 2).flatten(1))


def _steady_case(name):
    torch.manual_seed(1)
    if name == "mlp":
        return _mlp(), torch.randn(32, 20), torch.randint(0, 10, (32,))
    if name == "cnn":
        return _CNN(), torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
    return _LSTM(), torch.randn(4, 5, 8), torch.randint(0, 10, (4,))


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
@pytest.mark.parametrize("model", ["mlp", "lstm", "cnn"])
@pytest.mark.parametrize("kind", [pytest.param("cpu", id="cpu"),
                                  pytest.param("opencl", id="opencl", marks=[needs_opencl])])
def test_steady_training_moves_only_scalars_and_the_loss(kind, model, opt):
    """After warm-up, a training step keeps parameters, gradients, optimizer state and
    activations in the device's memory: per step only scalar operands whose values are new
    (AdamW's bias corrections; none for SGD) go up and only the loss read by .item() (4 bytes)
    comes down."""
    m, X, Y = _steady_case(model)
    dev = graft.device(kind)
    m = m.to(dev)
    o = (torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) if opt == "sgd"
         else torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01))
    xd, yd = X.to(dev), Y.to(dev)
    keys = [k for pair in TRAFFIC[kind] for k in pair]
    per_step = []
    for i in range(6):
        if i == 3:  # the steady graphs' native code (the device's kernels) has landed
            graft.wait_compiles()
        graft.wait()
        before = graft.metrics()
        o.zero_grad()
        loss = F.cross_entropy(m(xd), yd)
        loss.backward()
        o.step()
        graft.step()
        loss.item()
        graft.wait()
        after = graft.metrics()
        per_step.append(dict((k, after[k] - before[k]) for k in keys))
    (ups, up_bytes), (downs, down_bytes) = TRAFFIC[kind]
    for d in per_step[3:]:  # steady state
        assert d[downs] == 1 and d[down_bytes] == 4, per_step
        assert d[up_bytes] <= SCALAR_BYTES * d[ups], per_step
        # SGD's scalars are the same every step: uploaded once, then shared (the bridge keeps one
        # device scalar per value); AdamW's bias corrections change with the step count (new
        # values go up, unless an earlier test made them).
        if opt == "sgd":
            assert d[ups] == 0, per_step


def test_scalar_operands_are_reused_and_keep_their_own_parameters():
    """Scalar operands (an optimizer's factor and alpha) are made once and reused at later steps,
    not uploaded again; each use stays its own graph parameter, so two uses whose values are
    equal in one step and differ in another run the same graph (no new compile)."""
    graft.step()
    xc = torch.randn(8)
    x = xc.to(graft.device())
    graft.step()

    def step(a, b):
        y = x.mul(a).add(x, alpha=b)
        graft.step()
        return y

    for _ in range(2):
        step(0.5, 0.25)
    graft.wait()
    before = graft.metrics()
    y_same = step(0.5, 0.25)
    y_equal = step(0.5, 0.5)  # the two scalars are equal in this step only
    graft.wait()
    after = graft.metrics()
    assert after["transfers_to_device"] - before["transfers_to_device"] == 1, (before, after)
    assert after["graphs_compiled"] == before["graphs_compiled"], (before, after)
    assert torch.allclose(y_same.cpu(), xc * 0.5 + xc * 0.25)
    assert torch.allclose(y_equal.cpu(), xc * 0.5 + xc * 0.5)
