"""Advanced indexing (x[idx], x[idx] = v, index_put_) on graft: lowered for integer indices."""
import pytest
import torch

import graft

DEV = graft.device()
X = torch.randn(4, 5, 6, 3)
I = torch.tensor([0, 2, -1])
J = torch.tensor([[1], [2]])

READS = {
    "first": lambda t: t[I],
    "second": lambda t: t[:, I],
    "two_adjacent_broadcast": lambda t: t[I, J],
    "two_separated": lambda t: t[:, :, I, J.flatten()[:1]],
    "adjacent_middle": lambda t: t[:, J, I],
    "after_slice": lambda t: t[:, I, :3][:, :, J],
    "ellipsis": lambda t: t[..., torch.tensor([2, 0])],
}


@pytest.mark.parametrize("name", sorted(READS))
@pytest.mark.parametrize("index_on_device", [False, True])
def test_index_read_and_grad(name, index_on_device):
    f = READS[name]
    graft.reset_metrics()
    xc = X.clone().requires_grad_()
    xg = X.clone().to(DEV).requires_grad_()
    out_c = f(xc)
    out_g = f(xg)
    torch.testing.assert_close(out_g.detach().cpu(), out_c.detach())
    w = torch.randn(out_c.shape)
    (out_c * w).sum().backward()
    (out_g * w.to(DEV)).sum().backward()
    torch.testing.assert_close(xg.grad.cpu(), xc.grad)
    assert graft.fallbacks() == {}


def test_index_with_device_index_tensor():
    graft.reset_metrics()
    torch.testing.assert_close(X.to(DEV)[I.to(DEV), J.to(DEV)].cpu(), X[I, J])
    assert graft.fallbacks() == {}


def test_index_put_variants():
    graft.reset_metrics()
    y, yg = X.clone(), X.clone().to(DEV)
    y[:, I] = 7.0
    yg[:, I] = 7.0
    y[I, J] = torch.ones(3)
    yg[I, J] = torch.ones(3).to(DEV)
    y.index_put_((I,), torch.ones(5, 6, 3), accumulate=True)
    yg.index_put_((I,), torch.ones(5, 6, 3).to(DEV), accumulate=True)
    torch.testing.assert_close(yg.cpu(), y)
    assert graft.fallbacks() == {}


def test_bool_mask_falls_back_and_is_correct():
    graft.reset_metrics()
    m = X > 0
    torch.testing.assert_close(X.to(DEV)[m].cpu(), X[m])
    torch.testing.assert_close(X.to(DEV)[m.to(DEV)].cpu(), X[m])
    assert graft.fallbacks() == {"aten::index": 2}
