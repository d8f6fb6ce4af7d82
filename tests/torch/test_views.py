"""Views and in-place ops: writes through a view update the base and every other view."""
import pytest
import torch

import graft

DEV = graft.device()


def both(fn, *shapes):
    torch.manual_seed(0)
    base = [torch.randn(*s) for s in shapes]
    rc = fn(*[b.clone() for b in base])
    rg = fn(*[b.to(DEV) for b in base])
    if not isinstance(rc, (tuple, list)):
        rc, rg = [rc], [rg]
    for a, b in zip(rc, rg):
        assert b.device.type == "graft"
        torch.testing.assert_close(b.cpu(), a)


def test_setitem_column():
    def f(x):
        x[:, 0] = 1
        return x
    both(f, (3, 4))


def test_setitem_row_slice_step():
    def f(x):
        x[1:, ::2] = 5.0
        return x
    both(f, (4, 6))


def test_transpose_add_():
    def f(x):
        x.t().add_(1)
        return x
    both(f, (3, 4))


def test_view_mul_():
    def f(x):
        y = x.view(12)
        y.mul_(2)
        return x, y
    both(f, (3, 4))


def test_other_views_see_write():
    def f(x):
        a = x[0]
        b = x.t()
        c = x.view(-1)
        x[0, 1] = 7.0
        return a, b, c, x
    both(f, (3, 4))


def test_chain_of_views():
    def f(x):
        v = x.view(2, 3, 4).transpose(0, 2)[1:3].select(1, 2)
        v.mul_(-1)
        w = x.view(6, 4)[::2]
        return v, w, x
    both(f, (6, 4))


def test_write_view_then_base_inplace():
    def f(x):
        s = x[1]
        s.fill_(3)
        x.add_(1)
        return s, x
    both(f, (3, 4))


def test_unsqueeze_squeeze_expand_permute():
    def f(x):
        a = x.unsqueeze(0).expand(2, 3, 4)
        b = x.permute(1, 0).unsqueeze(-1).squeeze(-1)
        return a + 0, b * 1, a.sum(0)
    both(f, (3, 4))


def test_copy_into_view():
    def f(x, y):
        x[:, 1:3].copy_(y)
        return x
    both(f, (4, 5), (4, 2))


def test_detach_aliases():
    def f(x):
        d = x.detach()
        d.zero_()
        return x
    both(f, (2, 3))


def test_inplace_ops():
    def f(x, y):
        x.add_(y, alpha=2).mul_(0.5).sub_(y).div_(2.0)
        x.addcmul_(y, y, value=0.1).addcdiv_(y, y.abs() + 1, value=-0.2)
        x.clamp_(-1, 1)
        x.lerp_(y, 0.3)
        return x
    both(f, (3, 4), (3, 4))


def test_sqrt_inplace_on_slice():
    def f(x):
        x = x.abs()
        x[1:].sqrt_()
        return x
    both(f, (3, 4))


def test_reshape_noncontiguous():
    def f(x):
        return x.t().reshape(12), x.t().contiguous().view(2, 6)
    both(f, (3, 4))


def test_fallback_view_op_keeps_aliasing():
    """A view op with no lowering (unfold) runs on the CPU but its result stays a view of the
    graft tensor: writes through it reach the base, as on CPU."""
    import graft as _g
    dev = _g.device()
    c = torch.zeros(3, 6)
    g = torch.zeros(3, 6, device=dev)
    _g.reset_metrics()
    c.unfold(1, 2, 2)[:, 1].fill_(1.0)
    g.unfold(1, 2, 2)[:, 1].fill_(1.0)
    torch.testing.assert_close(g.cpu(), c)
    assert "aten::unfold" in _g.fallbacks()


def test_inplace_view_ops_change_geometry():
    import graft as _g
    dev = _g.device()
    for f in [lambda t: t.unsqueeze_(0), lambda t: t.t_(), lambda t: t.transpose_(0, 1),
              lambda t: t.unsqueeze_(1).squeeze_(1), lambda t: t[:1].squeeze_(0)]:
        c = torch.arange(6.0).reshape(2, 3)
        g = c.clone().to(dev)
        rc, rg = f(c), f(g)
        assert rg.shape == rc.shape
        torch.testing.assert_close(rg.cpu(), rc)
        torch.testing.assert_close(g.cpu(), c)
