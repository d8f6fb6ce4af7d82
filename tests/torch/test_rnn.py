"""nn.LSTM on graft's device: aten::lstm is lowered as one autograd node running graft's fused
LSTM (graft_lstm / graft_lstm_backward, torch/csrc/lower_rnn.cpp), or, for what graft does not
fuse, PyTorch's own decomposition. Outputs, h_n, c_n and the gradients of every parameter, the
input and h0/c0 are compared with PyTorch's CPU result from the same weights; the metrics say which
path ran ('lstm_fused' / 'lstm_decomposed' calls) and how many IR nodes it traced."""
import copy

import pytest
import torch
import torch.nn as nn

import graft

DEV = graft.device()
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def _err(a, b):
    """Largest absolute difference, relative to b's largest magnitude (at least 1)."""
    a, b = a.detach().cpu(), b.detach().cpu()
    return ((a - b).abs().max() / max(b.abs().max().item(), 1.0)).item()


def _run(model, x, hx, dtype):
    """Forward and backward of a loss touching y, h_n and c_n; returns (y, h, c, grads)."""
    x = x.clone().requires_grad_()
    hx = tuple(t.clone().requires_grad_() for t in hx) if hx is not None else None
    y, (h, c) = model(x, hx)
    w = torch.linspace(-1, 1, y.numel(), dtype=dtype).reshape(y.shape).to(y.device)
    loss = (y * w).sum() + (h * h).sum() + c.sum()
    loss.backward()
    grads = [x.grad] + ([t.grad for t in hx] if hx is not None else [])
    grads += [p.grad for p in model.parameters()]
    return y, h, c, grads


def _compare(make, x, hx=None, dtype=torch.float32, expect="lstm_fused"):
    torch.manual_seed(0)
    cpu = make().to(dtype)
    dev = copy.deepcopy(cpu).to(DEV)
    x = x.to(dtype)
    hx = tuple(t.to(dtype) for t in hx) if hx is not None else None
    ref = _run(cpu, x, hx, dtype)
    graft.reset_metrics()
    got = _run(dev, x.to(DEV), tuple(t.to(DEV) for t in hx) if hx is not None else None, dtype)
    m = graft.metrics()
    assert m.get(expect) == 1, m
    other = "lstm_decomposed" if expect == "lstm_fused" else "lstm_fused"
    assert other not in m, m
    for name, a, b in (("y", got[0], ref[0]), ("h_n", got[1], ref[1]), ("c_n", got[2], ref[2])):
        assert a.shape == b.shape and a.device == DEV and a.dtype == dtype, name
        assert _err(a, b) < TOL[dtype], (name, _err(a, b))
    names = ["x"] + (["h0", "c0"] if hx is not None else []) + [n for n, _ in cpu.named_parameters()]
    assert len(got[3]) == len(ref[3]) == len(names)
    for name, a, b in zip(names, got[3], ref[3]):
        assert a is not None and b is not None, name
        assert a.device == DEV, name
        assert _err(a, b) < TOL[dtype], (name, _err(a, b))
    return m


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("init", [False, True], ids=["no_hx", "hx"])
def test_lstm_fused_matches_cpu(layers, batch_first, bias, init):
    S, B, I, H = 6, 3, 5, 7
    torch.manual_seed(1)
    x = torch.randn(B, S, I) if batch_first else torch.randn(S, B, I)
    hx = (torch.randn(layers, B, H), torch.randn(layers, B, H)) if init else None
    _compare(lambda: nn.LSTM(I, H, num_layers=layers, bias=bias, batch_first=batch_first), x, hx)


def test_lstm_fused_float64():
    torch.manual_seed(2)
    x, hx = torch.randn(5, 2, 4), (torch.randn(2, 2, 3), torch.randn(2, 2, 3))
    _compare(lambda: nn.LSTM(4, 3, num_layers=2), x, hx, dtype=torch.float64)


def test_lstm_unbatched_input_is_fused():
    torch.manual_seed(3)
    _compare(lambda: nn.LSTM(4, 6), torch.randn(7, 4))  # nn.LSTM adds the batch dim itself


@pytest.mark.parametrize("case", ["bidirectional", "proj_size", "dropout_between_layers"])
def test_lstm_fallback_matches_cpu(case):
    """What graft does not fuse takes PyTorch's decomposition, with the same results as on CPU."""
    torch.manual_seed(4)
    x = torch.randn(5, 2, 4)
    if case == "bidirectional":
        _compare(lambda: nn.LSTM(4, 3, num_layers=2, bidirectional=True), x, expect="lstm_decomposed")
    elif case == "proj_size":
        _compare(lambda: nn.LSTM(4, 6, proj_size=3), x, expect="lstm_decomposed")
    else:
        # dropout between layers in training: random masks, so only the path is checked here;
        # in eval mode dropout is off and the layers are fused.
        m = nn.LSTM(4, 3, num_layers=2, dropout=0.5).to(DEV)
        graft.reset_metrics()
        m(x.to(DEV))[0].sum().backward()
        assert graft.metrics().get("lstm_decomposed") == 1
        _compare(lambda: nn.LSTM(4, 3, num_layers=2, dropout=0.5).eval(), x)


def test_lstm_traces_fewer_nodes():
    """The fused path traces the recurrence only: a handful of IR nodes per timestep forward and
    backward, where PyTorch's decomposition (taken by the bidirectional fallback, per direction)
    traces ~70 per timestep (torch 2's decomposition calls _thnn_fused_lstm_cell, lowered as one
    cell; torch 1.13's traced ~110)."""
    S, B = 16, 2
    x = torch.randn(B, S, 8, device=DEV)
    counts = {}
    for bidir in (False, True):
        m = nn.LSTM(8, 16, batch_first=True, bidirectional=bidir).to(DEV)
        graft.step()
        graft.reset_metrics()
        y, _ = m(x)
        y.sum().backward()
        mm = graft.metrics()
        assert mm.get("lstm_decomposed" if bidir else "lstm_fused") == 1
        counts[bidir] = mm["nodes_traced"] / (2 if bidir else 1)
        graft.step()
    assert counts[False] < 30 * S + 100, counts  # forward 17 + backward 12 per step, and the rest
    assert counts[True] > 1.5 * counts[False], counts


def test_lstm_double_backward():
    """create_graph=True: the gradients come from the decomposition, so they are differentiable."""
    torch.manual_seed(5)
    x = torch.randn(4, 2, 3)

    def run(dev):
        torch.manual_seed(6)
        m = nn.LSTM(3, 4).to(dev)
        xx = x.detach().clone().to(dev).requires_grad_()
        y, _ = m(xx)
        g, = torch.autograd.grad(y.pow(2).sum(), xx, create_graph=True)
        g.pow(2).sum().backward()
        return xx.grad, [p.grad for p in m.parameters()]

    gx, gp = run("cpu")
    graft.reset_metrics()
    dx, dp = run(DEV)
    assert graft.metrics().get("lstm_fused") == 1
    assert _err(dx, gx) < 1e-4
    for a, b in zip(dp, gp):
        assert _err(a, b) < 1e-4


def test_lstm_trains_like_cpu():
    """model.to(device), an optimizer built after, SGD with momentum: the same weights as on CPU
    after a few steps, and every step takes the fused path."""
    torch.manual_seed(7)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20, 8)
            self.rnn = nn.LSTM(8, 12, num_layers=2, batch_first=True)
            self.head = nn.Linear(12, 20)

        def forward(self, t):
            return self.head(self.rnn(self.emb(t))[0])

    cpu = LM()
    dev = copy.deepcopy(cpu).to(DEV)
    dev.rnn.flatten_parameters()  # a no-op off CUDA; must not detach the weights
    oc = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    og = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9)
    tok = torch.randint(0, 20, (3, 9))
    X, Y = tok[:, :-1], tok[:, 1:]
    lossf = nn.CrossEntropyLoss()
    graft.reset_metrics()
    for _ in range(4):
        for model, opt, xx, yy in ((cpu, oc, X, Y), (dev, og, X.to(DEV), Y.to(DEV))):
            opt.zero_grad()
            lossf(model(xx).reshape(-1, 20), yy.reshape(-1)).backward()
            opt.step()
        graft.step()
    assert graft.metrics().get("lstm_fused") == 4
    for (n, a), b in zip(dev.named_parameters(), cpu.parameters()):
        assert _err(a, b) < 1e-4, n


def test_lstm_no_grad_forward():
    torch.manual_seed(8)
    m = nn.LSTM(4, 5, num_layers=2)
    x = torch.randn(6, 3, 4)
    md = copy.deepcopy(m).to(DEV)
    with torch.no_grad():
        y, (h, c) = m(x)
        yd, (hd, cd) = md(x.to(DEV))
    assert not yd.requires_grad
    assert _err(yd, y) < 2e-5 and _err(hd, h) < 2e-5 and _err(cd, c) < 2e-5


def test_lstm_backward_twice():
    """retain_graph=True keeps what the fused node saved (a second backward accumulates the same
    gradients again); without it the saved values are released, and a second backward raises
    PyTorch's usual error."""
    torch.manual_seed(9)
    m = nn.LSTM(3, 4).to(DEV)
    y, _ = m(torch.randn(5, 2, 3, device=DEV))
    loss = y.sum()
    loss.backward(retain_graph=True)
    first = m.weight_hh_l0.grad.cpu().clone()
    loss.backward()
    assert _err(m.weight_hh_l0.grad, 2 * first) < 1e-6
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_gru_matches_cpu_without_fallback(bias, bidirectional):
    """nn.GRU takes PyTorch's decomposition, whose per-timestep _thnn_fused_gru_cell and its
    backward lower to graft: outputs and every gradient match the CPU, with no fallback."""
    torch.manual_seed(5)
    x = torch.randn(6, 3, 4)
    cpu = nn.GRU(4, 5, num_layers=2, bias=bias, bidirectional=bidirectional)
    dev = copy.deepcopy(cpu).to(DEV)
    xc, xg = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    graft.reset_metrics()
    outs = []
    for m, xi in ((cpu, xc), (dev, xg)):
        y, h = m(xi)
        (y.square().sum() + h.sum()).backward()
        outs.append([y, h, xi.grad] + [p.grad for p in m.parameters()])
    assert graft.fallbacks() == {}, graft.fallbacks()
    for a, b in zip(outs[1], outs[0]):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5)
