"""Each lowered op against PyTorch's CPU result; and error cases."""
import pytest
import torch
import torch.nn.functional as F

import graft

DEV = graft.device()


def r(*s):
    return torch.randn(*s)


def pos(*s):
    return torch.rand(*s) + 0.1


def idx(n, *s):
    return torch.randint(0, n, s)


def sym(lim, *s):
    return (torch.rand(*s) * 2 - 1) * lim


# name, function, input factory (returns CPU tensors), whether to check gradients
CASES = [
    ("add", lambda a, b: a + b, lambda: (r(3, 4), r(4)), True),
    ("add_alpha", lambda a, b: torch.add(a, b, alpha=-0.5), lambda: (r(3, 4), r(3, 1)), True),
    ("add_scalar", lambda a: a + 2.5, lambda: (r(3, 4),), True),
    ("radd_int", lambda a: 3 + a, lambda: (idx(5, 3, 4),), False),
    ("sub", lambda a, b: a - b, lambda: (r(2, 3, 4), r(3, 4)), True),
    ("rsub", lambda a: 1 - a, lambda: (r(3, 4),), True),
    ("mul", lambda a, b: a * b, lambda: (r(3, 4), r(3, 4)), True),
    ("mul_promote", lambda a, b: a * b, lambda: (r(3, 4), idx(5, 3, 4)), False),
    ("div", lambda a, b: a / b, lambda: (r(3, 4), pos(3, 4)), True),
    ("div_int", lambda a, b: a / b, lambda: (idx(9, 3, 4), idx(4, 3, 4) + 1), False),
    ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), lambda: (idx(9, 3, 4) - 4, idx(4, 3, 4) + 1), False),
    ("div_trunc_f", lambda a, b: torch.div(a, b, rounding_mode="trunc"), lambda: (r(3, 4) * 5, pos(3, 4)), False),
    ("maximum", torch.maximum, lambda: (r(3, 4), r(3, 4)), False),
    ("minimum", torch.minimum, lambda: (r(3, 4), r(3, 4)), False),
    ("pow_scalar", lambda a: a ** 3, lambda: (pos(3, 4),), True),
    ("pow_sq", lambda a: a ** 2, lambda: (r(3, 4),), True),
    ("pow_tt", torch.pow, lambda: (pos(3, 4), r(3, 4)), True),
    ("eq", lambda a, b: a == b, lambda: (idx(3, 3, 4), idx(3, 3, 4)), False),
    ("lt_scalar", lambda a: a < 0.2, lambda: (r(3, 4),), False),
    ("ge", lambda a, b: a >= b, lambda: (r(3, 4), r(4)), False),
    ("where", lambda c, a, b: torch.where(c > 0, a, b), lambda: (r(3, 4), r(3, 4), r(3, 4)), True),
    ("masked_fill", lambda a, m: a.masked_fill(m > 0, -1.0), lambda: (r(3, 4), r(3, 4)), True),
    ("clamp", lambda a: a.clamp(-0.5, 0.5), lambda: (r(3, 4),), True),
    ("clamp_min", lambda a: a.clamp(min=0.1), lambda: (r(3, 4),), True),
    ("neg", torch.neg, lambda: (r(3, 4),), True),
    ("abs", torch.abs, lambda: (r(3, 4),), True),
    ("exp", torch.exp, lambda: (r(3, 4),), True),
    ("log", torch.log, lambda: (pos(3, 4),), True),
    ("sqrt", torch.sqrt, lambda: (pos(3, 4),), True),
    ("rsqrt", torch.rsqrt, lambda: (pos(3, 4),), True),
    ("tanh", torch.tanh, lambda: (r(3, 4),), True),
    ("sigmoid", torch.sigmoid, lambda: (r(3, 4),), True),
    ("sin", torch.sin, lambda: (r(3, 4),), True),
    ("cos", torch.cos, lambda: (r(3, 4),), True),
    ("erf", torch.erf, lambda: (r(3, 4),), True),
    ("floor", torch.floor, lambda: (r(3, 4) * 3,), False),
    ("reciprocal", torch.reciprocal, lambda: (pos(3, 4),), True),
    ("log1p", torch.log1p, lambda: (pos(3, 4),), True),
    ("expm1", torch.expm1, lambda: (r(3, 4),), True),
    ("atan", torch.atan, lambda: (r(3, 4) * 3,), True),
    ("atan_int", torch.atan, lambda: (idx(5, 3, 4),), False),
    ("tan", torch.tan, lambda: (sym(1.3, 3, 4),), True),
    ("asin", torch.asin, lambda: (sym(0.9, 3, 4),), True),
    ("acos", torch.acos, lambda: (sym(0.9, 3, 4),), True),
    ("sinh", torch.sinh, lambda: (r(3, 4),), True),
    ("cosh", torch.cosh, lambda: (r(3, 4),), True),
    ("asinh", torch.asinh, lambda: (r(3, 4) * 3,), True),
    ("acosh", torch.acosh, lambda: (pos(3, 4) * 2 + 1.1,), True),
    ("atanh", torch.atanh, lambda: (sym(0.9, 3, 4),), True),
    ("log2", torch.log2, lambda: (pos(3, 4),), True),
    ("log10", torch.log10, lambda: (pos(3, 4),), True),
    ("exp2", torch.exp2, lambda: (r(3, 4),), True),
    ("erfc", torch.erfc, lambda: (r(3, 4),), True),
    ("log2_int", torch.log2, lambda: (idx(5, 3, 4) + 1,), False),
    ("trunc", torch.trunc, lambda: (r(3, 4) * 3,), False),
    ("trunc_int", torch.trunc, lambda: (idx(9, 3, 4) - 4,), False),
    ("floor_int", torch.floor, lambda: (idx(9, 3, 4) - 4,), False),
    ("exp_int", torch.exp, lambda: (idx(3, 3, 4),), False),
    ("relu", torch.relu, lambda: (r(3, 4),), True),
    ("gelu", F.gelu, lambda: (r(3, 4),), True),
    ("hardtanh", lambda a: F.hardtanh(a, -0.5, 0.75), lambda: (r(3, 4),), True),
    ("relu6", F.relu6, lambda: (r(3, 4) * 5,), True),
    ("relu6_inplace", lambda a: F.relu6(a * 4, inplace=True), lambda: (r(3, 4),), True),
    ("silu", F.silu, lambda: (r(3, 4) * 3,), True),
    ("hardswish", F.hardswish, lambda: (r(4, 5) * 4,), True),
    ("hardsigmoid", F.hardsigmoid, lambda: (r(4, 5) * 4,), True),
    ("triu", lambda a: torch.triu(a, 1), lambda: (r(2, 4, 5),), True),
    ("tril", lambda a: torch.tril(a), lambda: (r(5, 4),), True),
    ("tril_neg", lambda a: torch.tril(a, -2), lambda: (r(5, 6),), True),
    ("triu_int", lambda a: torch.triu(a, -1), lambda: (idx(9, 4, 4),), False),
    ("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"), lambda: (r(3, 4),), True),
    ("logical_not", torch.logical_not, lambda: (idx(2, 3, 4).bool(),), False),
    ("logical_and", torch.logical_and, lambda: (idx(2, 3, 4).bool(), idx(2, 3, 4).bool()), False),
    ("addcmul", lambda a, b, c: torch.addcmul(a, b, c, value=0.3), lambda: (r(3, 4), r(3, 4), r(3, 4)), True),
    ("addcdiv", lambda a, b, c: torch.addcdiv(a, b, c, value=0.3), lambda: (r(3, 4), r(3, 4), pos(3, 4)), True),
    ("lerp", lambda a, b: torch.lerp(a, b, 0.25), lambda: (r(3, 4), r(3, 4)), True),
    ("sum", torch.sum, lambda: (r(3, 4),), True),
    ("sum_dim", lambda a: a.sum(-1, keepdim=True), lambda: (r(3, 4, 5),), True),
    ("sum_dims", lambda a: a.sum((0, 2)), lambda: (r(3, 4, 5),), True),
    ("sum_int", torch.sum, lambda: (idx(5, 3, 4),), False),
    ("sum_bool", lambda a: (a > 0).sum(), lambda: (r(3, 4),), False),
    ("mean", torch.mean, lambda: (r(3, 4),), True),
    ("mean_dim", lambda a: a.mean(1), lambda: (r(3, 4, 5),), True),
    ("max", torch.max, lambda: (r(3, 4),), False),
    ("max_dim", lambda a: torch.max(a, 1), lambda: (r(3, 4),), False),
    ("min_dim", lambda a: torch.min(a, 0, keepdim=True), lambda: (r(3, 4),), False),
    ("amax", lambda a: a.amax(-1), lambda: (r(3, 4),), True),
    ("argmax", lambda a: a.argmax(1), lambda: (r(3, 4),), False),
    ("argmax_all", lambda a: a.argmax(), lambda: (r(3, 4),), False),
    ("var", lambda a: a.var(1), lambda: (r(3, 4),), True),
    ("std", lambda a: a.std(), lambda: (r(3, 4),), True),
    ("mm", torch.mm, lambda: (r(3, 4), r(4, 5)), True),
    ("matmul_batched", torch.matmul, lambda: (r(2, 3, 4), r(4, 5)), True),
    ("bmm", torch.bmm, lambda: (r(2, 3, 4), r(2, 4, 5)), True),
    ("mv", torch.mv, lambda: (r(3, 4), r(4)), True),
    ("addmm", lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2), lambda: (r(5), r(3, 4), r(4, 5)), True),
    ("linear", F.linear, lambda: (r(3, 4), r(5, 4), r(5)), True),
    ("softmax", lambda a: F.softmax(a, -1), lambda: (r(3, 4),), True),
    ("log_softmax", lambda a: F.log_softmax(a, 0), lambda: (r(3, 4),), True),
    ("cross_entropy", F.cross_entropy, lambda: (r(5, 4), idx(4, 5)), True),
    ("cross_entropy_sum_w", lambda a, t, w: F.cross_entropy(a, t, weight=w, reduction="sum"),
     lambda: (r(5, 4), idx(4, 5), pos(4)), 1),
    ("nll_ignore", lambda a, t: F.nll_loss(a, t, ignore_index=1), lambda: (r(6, 4), idx(4, 6)), True),
    ("nll_none", lambda a, t: F.nll_loss(a, t, reduction="none"), lambda: (r(6, 4), idx(4, 6)), True),
    ("mse", F.mse_loss, lambda: (r(3, 4), r(3, 4)), True),
    ("cat", lambda a, b: torch.cat([a, b], 1), lambda: (r(3, 4), r(3, 2)), True),
    ("stack", lambda a, b: torch.stack([a, b]), lambda: (r(3, 4), r(3, 4)), True),
    ("gather", lambda a, i: torch.gather(a, 1, i), lambda: (r(3, 4), idx(4, 3, 2)), True),
    ("index_select", lambda a, i: a.index_select(0, i), lambda: (r(5, 4), idx(5, 3)), True),
    ("embedding", lambda w, i: F.embedding(i, w), lambda: (r(10, 4), idx(10, 2, 3)), True),
    ("layer_norm", lambda a, w, b: F.layer_norm(a, (4,), w, b), lambda: (r(3, 4), r(4), r(4)), True),
    ("transpose", lambda a: a.transpose(0, 2) * 1, lambda: (r(2, 3, 4),), True),
    ("permute", lambda a: a.permute(2, 0, 1) + 0, lambda: (r(2, 3, 4),), True),
    ("select", lambda a: a[:, 1] * 2, lambda: (r(3, 4),), True),
    ("slice", lambda a: a[1:3, ::2] * 2, lambda: (r(4, 5),), True),
    ("expand", lambda a: a.expand(3, 4) * 1, lambda: (r(1, 4),), True),
    ("unsqueeze", lambda a: a.unsqueeze(1) * 1, lambda: (r(3, 4),), True),
    ("squeeze", lambda a: a.squeeze() * 1, lambda: (r(3, 1, 4),), True),
    ("view", lambda a: a.view(2, -1) * 1, lambda: (r(3, 4),), True),
    ("flatten", lambda a: a.flatten(1) * 1, lambda: (r(2, 3, 4),), True),
    ("to_double", lambda a: a.to(torch.float64), lambda: (r(3, 4),), False),
    ("to_int", lambda a: (a * 3).to(torch.int32), lambda: (r(3, 4),), False),
    ("zeros_like", lambda a: torch.zeros_like(a) + torch.ones_like(a), lambda: (r(3, 4),), False),
    ("full_like", lambda a: torch.full_like(a, 7.0), lambda: (r(3, 4),), False),
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1), lambda: (r(2, 3, 6, 6), r(4, 3, 3, 3), r(4)), False),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 2), lambda: (r(2, 3, 6, 6),), False),
    ("batch_norm_train", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
     lambda: (r(4, 3, 2, 2), r(3), r(3)), True),
]


def _to(x):
    return x.to(DEV) if isinstance(x, torch.Tensor) else x


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [o for o in out if isinstance(o, torch.Tensor)]


@pytest.mark.parametrize("name,fn,make,grad", CASES, ids=[c[0] for c in CASES])
def test_op_matches_cpu(name, fn, make, grad):
    torch.manual_seed(0)
    ins = make()
    ng = len(ins) if grad is True else int(grad)  # grad: True (all float inputs) or how many
    cins = [x.clone().requires_grad_(i < ng and x.is_floating_point()) for i, x in enumerate(ins)]
    gins = [x.to(DEV).requires_grad_(i < ng and x.is_floating_point()) for i, x in enumerate(ins)]
    graft.reset_metrics()
    outc, outg = _flat(fn(*cins)), _flat(fn(*gins))
    for a, b in zip(outc, outg):
        assert b.device.type == "graft"
        assert b.dtype == a.dtype, (b.dtype, a.dtype)
        assert b.shape == a.shape
        torch.testing.assert_close(b.cpu(), a.detach(), rtol=1e-4, atol=1e-5)
    if grad:
        torch.manual_seed(1)
        go = [torch.randn(o.shape) for o in outc]
        torch.autograd.backward([o for o in outc], go)
        torch.autograd.backward([o for o in outg], [g.to(DEV) for g in go])
        for a, b in zip(cins, gins):
            if a.requires_grad and a.grad is None:
                assert b.grad is None
            elif a.requires_grad:
                torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-4, atol=1e-5)
    fb = {k: v for k, v in graft.metrics().items() if k.startswith("aten::")}
    assert fb == {}, fb


@pytest.mark.parametrize("fn", [torch.tan, torch.asin, torch.acos, torch.sinh, torch.cosh,
                                torch.asinh, torch.acosh, torch.atanh, torch.log2, torch.log10,
                                torch.exp2, torch.erfc, torch.trunc], ids=lambda f: f.__name__)
def test_unary_math_is_native(fn):
    """ops.def rows, not PyTorch host calls inside the graph (which test_op_matches_cpu allows)."""
    x = torch.rand(8) + (1 if fn is torch.acosh else 0)
    graft.reset_metrics()
    torch.testing.assert_close(fn(x.to(DEV)).cpu(), fn(x))
    hc = [k for k in graft.metrics() if k.startswith(("hostcall::", "aten::"))]
    assert hc == [], hc


def test_fallback_runs_and_is_counted():
    x = torch.randn(4, 5)
    graft.reset_metrics()
    # no lowering, no decomposition, no meta kernel (so no host call): PyTorch's CPU kernel,
    # the graph cut there
    y = torch.logcumsumexp(x.to(DEV), 1)
    assert y.device.type == "graft"
    torch.testing.assert_close(y.cpu(), torch.logcumsumexp(x, 1))
    assert graft.metrics().get("aten::_logcumsumexp", 0) >= 1


def test_fallback_inplace_writes_back():
    x = torch.randn(4, 5)
    g = x.to(DEV)
    graft.reset_metrics()
    g.cumprod_(0)  # in-place op with no lowering: its functional form's host call, written back
    torch.testing.assert_close(g.cpu(), x.cumprod(0))
    m = graft.metrics()
    assert any("cumprod" in k and k.startswith(("aten::", "hostcall::")) for k in m), m


def test_fallback_factory_on_device():
    a = torch.arange(6, device=DEV)
    assert a.device.type == "graft"
    assert a.cpu().tolist() == list(range(6))


def test_item_and_print():
    x = torch.ones(2, 3).to(DEV) + 1
    assert "graft" in repr(x)
    assert x.sum().item() == 12.0
    assert (x > 1).all().item() is True


def test_sync_and_step():
    x = torch.randn(3, 3).to(DEV) * 2
    assert graft.is_pending(x)
    graft.sync([x])
    assert not graft.is_pending(x)
    y = x + 1
    graft.step()
    assert not graft.is_pending(y)
    assert "graphs_compiled" in graft.metrics()
    assert isinstance(graft.metrics_report(), str)


# --------------------------------------------------------------------------------- errors
def test_cpu_graft_mix_raises():
    a = torch.randn(3).to(DEV)
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.randn(3)
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(torch.randn(3, 3).to(DEV), torch.randn(3, 3))


def test_cpu_scalar_tensor_allowed():
    a = torch.randn(3)
    torch.testing.assert_close((a.to(DEV) * torch.tensor(2.0)).cpu(), a * 2)


def test_unsupported_dtype_raises():
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        torch.zeros(3, dtype=torch.complex64).to(DEV)
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        torch.zeros(3, dtype=torch.int16).to(DEV)


def test_bad_shapes_raise():
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(torch.randn(3, 4).to(DEV), torch.randn(3, 4).to(DEV))
    with pytest.raises(RuntimeError):
        torch.randn(3, 4).to(DEV) + torch.randn(5).to(DEV)
    with pytest.raises(RuntimeError):
        torch.randn(3, 4).to(DEV).view(5, 3)


def test_bad_dim_raises():
    x = torch.randn(3, 4).to(DEV)
    with pytest.raises(IndexError):
        x.sum(5)
    with pytest.raises(IndexError):
        x.select(0, 7)


def test_composite_implicit_lowerings_keep_autograd():
    """where's Scalar overloads and isfinite are CompositeImplicitAutograd in PyTorch: graft
    lowers them but leaves their decomposition (and so their autograd) in place; a gradient flows
    through them as on the CPU (torch.logdet's where(sign == -1, nan, logabsdet) among them)."""
    x = torch.tensor([[1.5, -2.0], [0.5, 3.0]])
    grads = []
    for dev in ("cpu", graft.device()):
        xi = x.detach().clone().to(dev).requires_grad_()
        y = torch.where(xi > 0, 1.0, xi * 3) * torch.where(xi < 2, xi, 0.5)
        y = y.sum() + torch.where(torch.isfinite(xi), xi, 0.0).sum() + torch.logdet(xi[:1, :1])
        y.backward()
        grads.append(xi.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0])


def test_bitwise_not_lowers():
    """~ on bool and integer tensors runs on graft (no fallback); a float tensor is refused as on
    the CPU."""
    for t in (torch.tensor([True, False, True]), torch.tensor([0, 5, -3], dtype=torch.int64),
              torch.tensor([0, 7, 255], dtype=torch.uint8), torch.tensor([1, -2], dtype=torch.int32)):
        graft.reset_metrics()
        assert torch.equal((~t.to(DEV)).cpu(), ~t), t
        assert graft.fallbacks() == {}
    with pytest.raises(RuntimeError, match="bitwise_not"):
        torch.bitwise_not(torch.ones(2).to(DEV)).cpu()


@pytest.mark.parametrize("shape,dim", [((3, 1000), 1), ((20000,), 0), ((5, 300, 2), 1), ((4, 7), 0), ((2, 100000), 1)])
def test_cumsum_long_dims_match_cpu(shape, dim):
    """cumsum is triangular products on graft (blocks of 16..256 along a longer dim, their running
    totals added back): float sums match the CPU's to float32 rounding, integer sums exactly, and
    its backward (a flipped cumsum) runs without fallback."""
    torch.manual_seed(0)
    x = torch.randn(*shape)
    xg = x.to(DEV).requires_grad_()
    graft.reset_metrics()
    y = torch.cumsum(xg, dim)
    (y * y).sum().backward()
    xc = x.clone().requires_grad_()
    yc = torch.cumsum(xc, dim)
    (yc * yc).sum().backward()
    torch.testing.assert_close(y.detach().cpu(), yc.detach(), rtol=1e-5, atol=1e-5 * shape[dim] ** 0.5)
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-3)
    xi = torch.randint(-5, 5, shape)
    assert torch.equal(torch.cumsum(xi.to(DEV), dim).cpu(), torch.cumsum(xi, dim))
    assert graft.fallbacks() == {}


def test_arange_overloads_match_cpu():
    for args in [(5,), (2, 9), (1.0, 2.0, 0.25), (10, 0, -3), (0, 1, 0.1), (3, 4.5)]:
        graft.reset_metrics()
        a, b = torch.arange(*args, device=DEV).cpu(), torch.arange(*args)
        assert a.dtype == b.dtype and torch.equal(a, b), (args, a, b)
        assert graft.fallbacks() == {}
    assert torch.arange(4, dtype=torch.float64, device=DEV).cpu().dtype == torch.float64


def test_cumsum_nonfinite_and_dtype_and_half_norm():
    """Infinities and NaNs propagate through cumsum as on the CPU (a triangular product alone
    would give inf * 0 = NaN before an inf); dtype= converts before summing; a float16 norm
    accumulates in float32 (no overflow of x * x)."""
    for v in ([1., float("inf"), 2., float("nan"), 3.], [1., -float("inf"), 2., float("inf"), 3.],
              [float("-inf"), 1., 2.]):
        x = torch.tensor(v)
        torch.testing.assert_close(torch.cumsum(x.to(DEV), 0).cpu(), torch.cumsum(x, 0), equal_nan=True)
    x = torch.tensor([0.6, 0.6, 1.7])
    assert torch.equal(torch.cumsum(x.to(DEV), 0, dtype=torch.long).cpu(), torch.cumsum(x, 0, dtype=torch.long))
    h = torch.tensor([300., 400.], dtype=torch.half)
    n = h.to(DEV).norm().cpu()
    assert n.dtype == torch.half and float(n) == float(h.norm())


# Zero-size dims: every tier must take an empty operand (an empty batch, an empty reduced axis).
ZERO_CASES = [
    ("layer_norm", lambda x: F.layer_norm(x, (1,)), lambda: (r(0, 1),), True),
    ("group_norm", lambda x: F.group_norm(x, 1), lambda: (r(0, 1),), True),
    ("batch_norm_rows", lambda x: F.layer_norm(x, (4,)), lambda: (r(0, 3, 4),), True),
    ("max_pool2d", lambda x: F.max_pool2d(x, 2), lambda: (r(0, 3, 8, 8),), True),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 2), lambda: (r(0, 3, 8, 8),), True),
    ("conv2d", lambda x, w: F.conv2d(x, w, padding=1), lambda: (r(0, 3, 8, 8), r(4, 3, 3, 3)), True),
    ("linear", lambda x, w: F.linear(x, w), lambda: (r(0, 5), r(3, 5)), True),
    ("mm_empty_k", torch.mm, lambda: (r(3, 0), r(0, 4)), True),
    ("sum_empty_axis", lambda x: x.sum(1), lambda: (r(4, 0),), True),
    ("mean_empty_rows", lambda x: x.mean(1), lambda: (r(0, 5),), True),
    ("prod_empty_axis", lambda x: x.prod(1), lambda: (r(4, 0),), False),
    ("amax_rows", lambda x: x.amax(1), lambda: (r(0, 5),), False),
    ("softmax", lambda x: F.softmax(x, 1), lambda: (r(0, 5),), True),
    ("log_softmax", lambda x: F.log_softmax(x, 1), lambda: (r(0, 5),), True),
    ("cross_entropy", lambda x, t: F.cross_entropy(x, t, reduction="sum"), lambda: (r(0, 5), idx(5, 0)), 1),
    ("embedding", lambda i, w: F.embedding(i, w), lambda: (idx(6, 0), r(6, 3)), False),
    ("gelu", F.gelu, lambda: (r(2, 0, 3),), True),
    ("add_bcast", lambda a, b: a + b, lambda: (r(0, 4), r(4)), True),
    ("cat", lambda a, b: torch.cat([a, b]), lambda: (r(0, 4), r(2, 4)), True),
    ("index_select", lambda a, i: a.index_select(0, i), lambda: (r(5, 3), idx(5, 0)), 1),
    ("cumsum", lambda a: a.cumsum(1), lambda: (r(0, 4),), True),
    ("transpose_reshape", lambda a: a.t().reshape(-1), lambda: (r(0, 4),), True),
    ("pad", lambda a: F.pad(a, (1, 2)), lambda: (r(0, 4),), True),
    ("where", lambda c, a: torch.where(c > 0, a, 0.0), lambda: (r(0, 3), r(0, 3)), 0),
]


@pytest.mark.parametrize("name,fn,make,grad", ZERO_CASES, ids=[c[0] for c in ZERO_CASES])
def test_zero_size_matches_cpu(name, fn, make, grad):
    test_op_matches_cpu(name, fn, make, grad)


# In-place and out= writes that alias their inputs: graft raises where PyTorch's CPU raises (the
# partial and the internal overlap errors), allows what it allows, and a refused write changes
# nothing. UNDEFINED: allowed, but CPU's value depends on its loop order (graft's does not).
UNDEFINED = "undefined"
OVERLAP_CASES = [
    ("mul_shifted", lambda x: x[1:].mul_(x[:-1]), "some elements of the input tensor"),
    ("add_transposed", lambda x: x.view(2, 3)[:, :2].add_(x.view(3, 2)[:2].t()), UNDEFINED),
    ("add_t_square", lambda x: x[:4].view(2, 2).add_(x[:4].view(2, 2).t()), "some elements"),
    ("lerp_shifted", lambda x: x[1:].lerp_(x[:-1], 0.5), "some elements"),
    ("copy_shifted", lambda x: x[1:].copy_(x[:-1]), "some elements"),
    ("add_out_shifted", lambda x: torch.add(x[:-1], 1, out=x[1:]), "some elements"),
    ("index_add_shifted", lambda x: x[:3].index_add_(0, torch.tensor([0, 1], device=x.device), x[1:3]), "some elements"),
    ("expand_copy", lambda x: x[:1].expand(3).copy_(x[3:]), "more than one element"),
    ("expand_add", lambda x: x[:1].expand(3).add_(x[3:]), "more than one element"),
    ("expand_fill", lambda x: x[:1].expand(3).fill_(2), None),
    ("same_tensor", lambda x: x.mul_(x), None),
    ("same_view", lambda x: x.view(2, 3).add_(x.view(2, 3)), None),
    ("strided_disjoint", lambda x: x[::2].add_(x[1::2]), None),
    ("mm_out_aliased", lambda x: torch.mm(x[:4].view(2, 2), x[:4].view(2, 2), out=x[:4].view(2, 2)), UNDEFINED),
]


@pytest.mark.parametrize("name,fn,err", OVERLAP_CASES, ids=[c[0] for c in OVERLAP_CASES])
def test_overlapping_writes_follow_cpu(name, fn, err):
    base = torch.arange(1.0, 7.0)
    c, g = base.clone(), base.to(DEV)
    if err and err != UNDEFINED:
        with pytest.raises(RuntimeError, match=err):
            fn(c)
        with pytest.raises(RuntimeError, match=err):
            fn(g)
    else:
        fn(c)
        fn(g)
    if err != UNDEFINED:
        torch.testing.assert_close(g.cpu(), c)


_OOM_SCRIPT = r"""
import resource, torch, graft
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
y = torch.empty(10**10, device="graft")
try:
    y[3:].fill_(1)                      # the view write's host tables do not fit
except RuntimeError as e:
    print("VIEW:", e)
del y                                   # (else the step below would fail on it first)
big = torch.randn(10, device="graft").expand(10**9, 10) * 2
graft.step()
try:
    big[0].cpu()                        # the step failed: the read raises it...
except RuntimeError as e:
    print("READ:", e)
graft.wait()                            # ...once: a caught failure does not stop the program again
graft.step()
print("AFTER:", (torch.ones(3, device="graft") * 3).cpu().tolist())
"""


def test_out_of_memory_names_op_size_dtype_device_and_is_raised_once():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _OOM_SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = dict(l.split(": ", 1) for l in r.stdout.splitlines() if ": " in l)
    view = lines["VIEW"]
    assert "out of host memory" in view and "aten::fill_" in view, view
    assert "[9999999997]" in view and "Float" in view and "graft:0" in view, view
    read = lines["READ"]
    assert "out of memory: mul [1000000000,10] f32 on cpu:0 needs 40000000000 bytes" in read, read
    assert lines["AFTER"] == "[3.0, 3.0, 3.0]"


# Ops graft has no lowering for but PyTorch decomposes (torch._decomp's core table): they run as
# the graft ops they decompose into, inside the graph (no fallback), counted as decomposed.
DECOMPOSED = [
    ("roll", lambda a: torch.roll(a, (1, -2), (0, 1)), lambda: (r(3, 5),), True),
    ("mish", F.mish, lambda: (r(3, 5),), True),
    ("glu", lambda a: F.glu(a, 1), lambda: (r(3, 6),), True),
    ("logaddexp", torch.logaddexp, lambda: (r(3, 5), r(3, 5)), True),
    ("nan_to_num", lambda a: torch.nan_to_num(a.log(), posinf=7.0), lambda: (r(3, 5),), False),
    ("pixel_shuffle", lambda a: F.pixel_shuffle(a, 2), lambda: (r(1, 8, 3, 3),), True),
    ("reflection_pad2d", lambda a: F.pad(a, (2, 1, 1, 2), mode="reflect"), lambda: (r(1, 2, 4, 5),), True),
    ("logit", lambda a: torch.logit(a, 1e-3), lambda: (torch.rand(3, 5),), True),
]


@pytest.mark.parametrize("name,fn,make,grad", DECOMPOSED, ids=[c[0] for c in DECOMPOSED])
def test_decomposed_ops_match_cpu_without_fallback(name, fn, make, grad):
    test_op_matches_cpu(name, fn, make, grad)
    graft.reset_metrics()
    fn(*[x.to(DEV) for x in make()])
    assert any(k.startswith("decomposed::") for k in graft.metrics()), graft.metrics().keys()


# CompositeExplicitAutograd ops that _decomp.KERNEL_FIRST leaves to their own C++ kernel: it runs on
# graft (no fallback, no Python decomposition) and matches the CPU.
KERNEL_FIRST = [
    ("empty_like", lambda a: torch.empty_like(a).fill_(2.0) * a, lambda: (r(3, 5),), True),
    ("ones_like", lambda a: torch.ones_like(a) + a, lambda: (r(3, 5),), True),
    ("zeros_like", lambda a: torch.zeros_like(a, dtype=torch.float64) + a, lambda: (r(3, 5),), True),
    ("full_like", lambda a: torch.full_like(a, -1.5) * a, lambda: (r(3, 5),), True),
    ("new_zeros", lambda a: a.new_zeros(5) + a, lambda: (r(3, 5),), True),
    ("new_ones", lambda a: a.new_ones((3, 1)) * a, lambda: (r(3, 5),), True),
    ("new_full", lambda a: a.new_full((5,), 4.0) - a, lambda: (r(3, 5),), True),
    ("new_empty", lambda a: a.new_empty((3, 5)).fill_(1.0) - a, lambda: (r(3, 5),), True),
    ("stack", lambda a, b: torch.stack([a, b, a], 1), lambda: (r(3, 5), r(3, 5)), True),
    ("_safe_softmax", lambda a: torch.ops.aten._safe_softmax(a.masked_fill(a > 0.5, float("-inf")), 1),
     lambda: (torch.cat([r(2, 5), torch.ones(1, 5)]),), False),
    ("bce_with_logits", lambda a, t: F.binary_cross_entropy_with_logits(a, t, pos_weight=torch.full_like(a[0], 2.0)),
     lambda: (r(3, 5), torch.rand(3, 5)), True),
]


@pytest.mark.parametrize("name,fn,make,grad", KERNEL_FIRST, ids=[c[0] for c in KERNEL_FIRST])
def test_kernel_first_ops_run_without_fallback_or_decomposition(name, fn, make, grad):
    test_op_matches_cpu(name, fn, make, grad)
    graft.reset_metrics()
    graft.sync([fn(*[x.to(DEV) for x in make()])])
    m = graft.metrics()
    assert m["fallbacks"] == 0, graft.fallbacks()
    assert not [k for k in m if k.startswith("decomposed::")], m


# Ops with neither a lowering nor a decomposition: PyTorch's CPU kernel runs as a host call
# inside the graph (torch/csrc/hostcall.cpp), out= forms of structured ops included.
HOST_CALLED = [
    ("special_i0e", torch.special.i0e, lambda: (r(3, 5),), True),
    ("erfinv", lambda a: torch.erfinv(a.clamp(-0.9, 0.9)), lambda: (r(3, 5),), True),
    ("polygamma", lambda a: torch.polygamma(1, a.abs() + 1), lambda: (r(3, 5),), True),
    ("kthvalue", lambda a: torch.kthvalue(a, 2, 1)[0], lambda: (r(3, 5),), True),
    ("cdist", lambda a, b: torch.cdist(a, b), lambda: (r(3, 4), r(5, 4)), True),
    ("histc", lambda a: torch.histc(a, 4, -1, 1), lambda: (r(3, 5),), False),
]


@pytest.mark.parametrize("name,fn,make,grad", HOST_CALLED, ids=[c[0] for c in HOST_CALLED])
def test_host_called_ops_run_inside_the_graph(name, fn, make, grad):
    test_op_matches_cpu(name, fn, make, grad)  # no fallback, values and gradients as the CPU's
    ins = [x.to(DEV) for x in make()]
    graft.step()
    graft.reset_metrics()
    out = _flat(fn(*[x * 1.5 for x in ins]))  # work before and after the op: one graph
    graft.sync([o * 2 for o in out])
    m = graft.metrics()
    assert m["fallbacks"] == 0 and any(k.startswith("hostcall::") for k in m), m
    assert m["executions"] == 1, m["executions"]


def test_a_host_called_out_form_checks_overlap_as_cpu_does():
    for dev in ("cpu", DEV):
        x = (torch.rand(6) * 0.5).to(dev)
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            torch.erfinv(x[:-1], out=x[1:])
        o = torch.empty(6).to(dev)
        torch.erfinv(x, out=o)
        torch.testing.assert_close(o.cpu(), torch.erfinv(x.cpu()))


def test_a_host_call_failing_at_run_time_fails_its_sync():
    x = torch.tensor([1.0, float("inf"), 2.0]).to(DEV)
    h = torch.histc(x * 2, 5)  # the range comes from the values: known only when it runs
    with pytest.raises(RuntimeError, match="not finite"):
        h.cpu()
    assert torch.equal((x + 1).cpu(), torch.tensor([2.0, float("inf"), 3.0]))  # graft goes on
    # run asynchronously, the step's other outputs say why their values were lost
    w = torch.ones(4096).to(DEV)
    graft.step()
    h = torch.histc(x * 3, 5)
    w.add_(1)
    graft.step()
    with pytest.raises(RuntimeError, match="lost.*histc.*not finite"):
        w.cpu()


_HOST_FAIL_SYNC = """
import torch, graft
d = graft.device()
x = torch.tensor([1.0, float("inf"), 2.0]).to(d)
w = torch.ones(4096).to(d)
graft.step()
h = torch.histc(x * 3, 5)
w.add_(1)
try:
    graft.step()
except RuntimeError as e:
    print("STEP", "not finite" in str(e))
del h
print("W", bool((w.cpu() == 2).all()))
"""


def test_a_failed_host_call_donates_no_input():
    # run in the syncing thread, a failed step leaves its tensors pending: as it donated none
    # of its inputs' buffers (a host call may fail), the other work can be read alone after
    import subprocess
    import sys
    env = dict(__import__("os").environ, GRAFT_ASYNC="0")
    out = subprocess.run([sys.executable, "-c", _HOST_FAIL_SYNC], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "STEP True" in out.stdout and "W True" in out.stdout, out.stdout


def test_host_calls_switch_off():
    import subprocess
    import sys
    code = ("import torch, graft; x = torch.randn(3, 5).to('graft'); graft.reset_metrics(); "
            "y = torch.special.i0e(x).cpu(); print(sorted(graft.fallbacks()))")
    env = dict(__import__("os").environ, GRAFT_HOST_CALLS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "aten::special_i0e" in out.stdout, out.stdout


def test_decompositions_switch_off():
    import subprocess
    import sys
    code = ("import torch, graft; x = torch.randn(3, 5).to('graft'); graft.reset_metrics(); "
            "y = torch.roll(x, 1, 1); print(sorted(graft.fallbacks()))")
    env = dict(__import__("os").environ, GRAFT_DECOMP="0", GRAFT_HOST_CALLS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "aten::roll" in out.stdout, out.stdout
