"""CNN layers on graft: forward and backward against CPU, with no fallback to CPU kernels."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import graft

DEV = graft.device()


def check(fn, *ins, grad=True, rtol=1e-4, atol=1e-5):
    """fn on CPU and on graft: outputs and input gradients match; returns the fallback counts."""
    graft.reset_metrics()
    ci = [t.clone().requires_grad_(grad and t.is_floating_point()) for t in ins]
    gi = [t.clone().to(DEV).requires_grad_(grad and t.is_floating_point()) for t in ins]
    oc, og = fn(*ci), fn(*gi)
    if not isinstance(oc, tuple):
        oc, og = (oc,), (og,)
    for a, b in zip(oc, og):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=rtol, atol=atol)
    if grad:
        fl = [(a, b) for a, b in zip(oc, og) if a.is_floating_point()]
        ws = [torch.randn_like(a) for a, _ in fl]
        sum((a * w).sum() for (a, _), w in zip(fl, ws)).backward()
        sum((b * w.to(DEV)).sum() for (_, b), w in zip(fl, ws)).backward()
        for a, b in zip(ci, gi):
            if a.grad is not None:
                torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=rtol, atol=1e-4)
    return graft.fallbacks()


torch.manual_seed(0)
X = torch.randn(2, 3, 9, 11)
CASES = {
    "conv2d_stride_pad_bias": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
                               X, torch.randn(4, 3, 3, 3), torch.randn(4)),
    "conv2d_dilation": (lambda x, w: F.conv2d(x, w, stride=(1, 2), padding=2, dilation=2),
                        X, torch.randn(4, 3, 3, 3)),
    "conv2d_groups": (lambda x, w: F.conv2d(x, w, groups=3, padding=1),
                      torch.randn(2, 6, 7, 7), torch.randn(6, 2, 3, 3)),
    "conv2d_1x1_padded": (lambda x, w: F.conv2d(x, w, padding=1), X, torch.randn(4, 3, 1, 1)),
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1),
               torch.randn(2, 3, 10), torch.randn(4, 3, 3), torch.randn(4)),
    "conv_transpose2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
                         torch.randn(2, 3, 5, 6), torch.randn(3, 4, 3, 3), torch.randn(4)),
    "conv_transpose2d_groups": (lambda x, w: F.conv_transpose2d(x, w, stride=2, groups=3),
                                torch.randn(2, 6, 5, 6), torch.randn(6, 2, 3, 3)),
    "conv2d_stride3_uneven": (lambda x, w: F.conv2d(x, w, stride=(3, 2), padding=(2, 1)),
                              torch.randn(2, 3, 10, 9), torch.randn(4, 3, 4, 3)),
    "conv3d_stride_pad_bias": (lambda x, w, b: F.conv3d(x, w, b, stride=2, padding=1),
                               torch.randn(2, 3, 5, 6, 7), torch.randn(4, 3, 3, 3, 3), torch.randn(4)),
    "conv3d_groups_dilation": (lambda x, w: F.conv3d(x, w, stride=(1, 2, 1), padding=(0, 1, 2), dilation=(1, 1, 2),
                                                     groups=2), torch.randn(2, 4, 4, 6, 7), torch.randn(6, 2, 2, 3, 3)),
    "conv_transpose3d": (lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=(1, 0, 1)),
                         torch.randn(2, 3, 3, 4, 3), torch.randn(3, 2, 3, 3, 2), torch.randn(2)),
    "conv_transpose3d_groups": (lambda x, w: F.conv_transpose3d(x, w, stride=(2, 1, 3), groups=2),
                                torch.randn(1, 4, 3, 3, 2), torch.randn(4, 3, 2, 2, 3)),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), X),
    "max_pool2d_indices_pad": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), X),
    "max_pool2d_ceil_same_size": (lambda x: F.max_pool2d(x, 3, 2, 0, ceil_mode=True), X),
    "max_pool2d_3d_rect": (lambda x: F.max_pool2d(x, (2, 3), (1, 2), return_indices=True), torch.randn(3, 7, 8)),
    "avg_pool2d_pad": (lambda x: F.avg_pool2d(x, 3, 2, 1), X),
    "avg_pool2d_exclude_pad": (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), X),
    "avg_pool2d_divisor": (lambda x: F.avg_pool2d(x, 2, divisor_override=3), X),
    "avg_pool2d_tiling": (lambda x: F.avg_pool2d(x, 2), torch.randn(2, 3, 8, 8)),
    "adaptive_avg_pool2d_divisible": (lambda x: F.adaptive_avg_pool2d(x, (3, 2)), torch.randn(2, 3, 9, 8)),
    "adaptive_avg_pool2d_general": (lambda x: F.adaptive_avg_pool2d(x, (4, 3)), X),
    "adaptive_avg_pool2d_3d": (lambda x: F.adaptive_avg_pool2d(x, (4, 5)), torch.randn(3, 7, 9)),
    "max_pool2d_ceil_mode": (lambda x: F.max_pool2d(x, 2, 2, 0, ceil_mode=True, return_indices=True), X),
    "max_pool2d_ceil_mode_pad": (lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
                                 torch.randn(2, 3, 10, 10)),
    "avg_pool2d_ceil_mode": (lambda x: F.avg_pool2d(x, 2, 2, 0, ceil_mode=True), X),
    "avg_pool2d_ceil_mode_pad": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), torch.randn(2, 3, 10, 10)),
    "avg_pool2d_ceil_mode_exclude_pad": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                                         torch.randn(2, 3, 10, 10)),
    "avg_pool2d_ceil_mode_divisor": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, divisor_override=2),
                                     torch.randn(2, 3, 10, 10)),
    "cross_entropy_2d": (lambda x, t: F.cross_entropy(x, t, reduction="none"), torch.randn(2, 3, 4, 5),
                         torch.randint(0, 3, (2, 4, 5))),
    "cross_entropy_2d_weighted_mean": (lambda x, t, w: F.cross_entropy(x, t, weight=w.detach()), torch.randn(2, 3, 4, 5),
                                       torch.randint(0, 3, (2, 4, 5)), torch.rand(3)),
    "max_pool2d_dilation": (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, return_indices=True),
                            torch.randn(2, 3, 10, 11)),
    "max_pool2d_dilation_ceil_pad": (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=(1, 2), ceil_mode=True,
                                                            return_indices=True), torch.randn(1, 2, 3, 6)),
    "relu": (lambda x: F.relu(x), X),
    "dropout_p0": (lambda x: F.dropout(x, 0.0, training=True), X),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_matches_cpu_without_fallback(name):
    fn, *ins = CASES[name]
    assert check(fn, *ins) == {}


def test_argmin_argmax():
    x = torch.randn(4, 5, 6)
    assert check(lambda t: (t.argmin(1), t.argmin(), t.argmin(-1, keepdim=True), t.argmax(2)), x, grad=False) == {}


def test_max_pool_ties_pick_first():
    x = torch.zeros(1, 1, 4, 4)
    x[0, 0, 1, 1] = x[0, 0, 0, 1] = 1.0
    assert check(lambda t: F.max_pool2d(t, 2, return_indices=True), x) == {}


def test_unsupported_config_falls_back_correctly():
    # 3-D max pooling is not lowered: it runs on PyTorch's CPU kernel, inside the graph (a host
    # call for each of its two outputs), and is counted; its backward too.
    fb = check(lambda t: F.max_pool3d(t, 2), torch.randn(1, 2, 4, 4, 4))
    assert fb == {}, fb
    m = graft.metrics()
    assert m.get("hostcall::aten::max_pool3d_with_indices", 0) == 1, m
    assert any(k.startswith("hostcall::aten::max_pool3d_with_indices_backward") for k in m), m


@pytest.mark.parametrize("layer", ["conv2d", "batch_norm_train", "batch_norm_eval", "max_pool2d",
                                   "avg_pool2d", "adaptive_avg_pool2d", "dropout", "relu"])
def test_cnn_layer_training_no_fallback(layer):
    """Forward, backward and an SGD step of a small net around one layer: zero fallbacks."""
    torch.manual_seed(0)
    body = {
        "conv2d": nn.Conv2d(2, 2, 3, padding=1),
        "batch_norm_train": nn.BatchNorm2d(2),
        "batch_norm_eval": nn.BatchNorm2d(2).eval(),
        "max_pool2d": nn.MaxPool2d(2),
        "avg_pool2d": nn.AvgPool2d(2),
        "adaptive_avg_pool2d": nn.AdaptiveAvgPool2d(3),
        "dropout": nn.Dropout(0.3),
        "relu": nn.ReLU(),
    }[layer]
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), body, nn.Flatten())
    x = torch.randn(4, 1, 6, 6)
    with torch.no_grad():
        n_out = net(x).shape[1]
    model = nn.Sequential(net, nn.Linear(n_out, 3))
    mg = copy.deepcopy(model).to(DEV)
    opt = torch.optim.SGD(mg.parameters(), lr=0.1, momentum=0.9)
    xg, yg = x.to(DEV), torch.tensor([0, 1, 2, 0]).to(DEV)
    graft.step()
    graft.reset_metrics()
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(mg(xg), yg)
        loss.backward()
        opt.step()
        graft.step()
    assert torch.isfinite(loss.detach().cpu())
    assert graft.fallbacks() == {}, graft.fallbacks()
    if layer != "dropout":
        mc = copy.deepcopy(model)
        oc = torch.optim.SGD(mc.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            oc.zero_grad()
            lc = F.cross_entropy(mc(x), yg.cpu())
            lc.backward()
            oc.step()
        torch.testing.assert_close(loss.detach().cpu(), lc.detach(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("env", [{"GRAFT_TORCH_CONV": "native"}, {"GRAFT_TORCH_CONV": "placed"},
                                 {"GRAFT_TORCH_POOL": "slices"}])
def test_alternative_lowerings_match_cpu(env):
    """The conv/pool lowerings the knobs select (read once per process): a subprocess runs every
    layer case with them."""
    import os
    import subprocess
    import sys
    code = ("import sys; sys.argv = ['x']; import test_cnn_ops as t\n"
            "for n in sorted(t.CASES):\n"
            "    fn, *ins = t.CASES[n]\n"
            "    assert t.check(fn, *ins) == {}, n\n"
            "print('ok', len(t.CASES))\n")
    here = os.path.dirname(os.path.abspath(__file__))
    pkg = os.path.join(here, "..", "..", "torch")
    r = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=pkg + os.pathsep + here, GRAFT_COMPILE="off", **env),
                       timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 1, 2, 9), (1, 1, 3, 3, 1)])
def test_conv_kernel_larger_than_input_is_an_error(shape):
    """A kernel larger than the padded input: an error naming the sizes, as on CPU (not a crash
    or a slice's error); also when every spatial dim is too small (their product is positive)."""
    x = torch.randn(shape)
    w = torch.randn((1, 1) + (4,) * (len(shape) - 2))
    f = F.conv2d if len(shape) == 4 else F.conv3d
    with pytest.raises(RuntimeError):
        f(x, w)
    with pytest.raises(RuntimeError, match="convolution output would be empty"):
        f(x.to(DEV), w.to(DEV))
