"""CNN, encoder layer and embedding models on graft vs CPU eager."""
import copy

import pytest

import torch
import torch.nn as nn
import torch.nn.functional as F

import graft
from parity import step_both

DEV = graft.device()



class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 8, 3)
        self.drop = nn.Dropout(0.0)
        self.fc = nn.Linear(8 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        x = F.relu(self.c2(x))
        x = F.adaptive_avg_pool2d(x, 3)
        return self.fc(self.drop(x.flatten(1)))


def parity(model, X, Y, loss_fn, steps, opt=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)):
    mc, mg = copy.deepcopy(model), copy.deepcopy(model).to(DEV)
    oc, og = opt(mc.parameters()), opt(mg.parameters())
    xg, yg = X.to(DEV), Y.to(DEV)
    graft.reset_metrics()
    for i in range(steps):
        step_both(mc, oc, mg, og, X, Y, xg, yg, loss_fn, i)
    return mc, mg


def test_cnn_parity_batchnorm_train_eval():
    torch.manual_seed(0)
    X, Y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    mc, mg = parity(CNN(), X, Y, F.cross_entropy, 20)
    assert graft.fallbacks() == {}
    torch.testing.assert_close(mg.bn.running_mean.cpu(), mc.bn.running_mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mg.bn.running_var.cpu(), mc.bn.running_var, rtol=1e-4, atol=1e-5)
    mc.eval()
    mg.eval()
    torch.testing.assert_close(mg(X.to(DEV)).cpu(), mc(X), rtol=1e-4, atol=1e-5)
    assert graft.fallbacks() == {}


def test_encoder_layer_parity_no_fallback():
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    X, Y = torch.randn(4, 5, 16), torch.randn(4, 5, 16)
    parity(enc, X, Y, F.mse_loss, 20, opt=lambda p: torch.optim.AdamW(p, lr=1e-3))
    assert graft.fallbacks() == {}


def test_encoder_eval_no_grad_forward():
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    eg = copy.deepcopy(enc).to(DEV)
    x = torch.randn(2, 5, 16)
    graft.reset_metrics()
    with torch.no_grad():
        torch.testing.assert_close(eg(x.to(DEV)).cpu(), enc(x), rtol=1e-4, atol=1e-5)
    assert graft.fallbacks() == {}


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "both"])
def test_encoder_fast_path_matches_cpu(norm_first, mask):
    """torch 2's inference fast path (aten::_transformer_encoder_layer_fwd, which graft composes
    from lowered ops): same outputs as the CPU's native kernel, masks included, no fallback."""
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, norm_first=norm_first,
                                     activation="gelu").eval()
    eg = copy.deepcopy(enc).to(DEV)
    x = torch.randn(3, 6, 16)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 5 + [True]])
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    kw = {"none": {}, "padding": {"src_key_padding_mask": pad}, "causal": {"src_mask": causal},
          "both": {"src_key_padding_mask": pad, "src_mask": causal}}[mask]
    graft.reset_metrics()
    with torch.no_grad():
        ref = enc(x, **kw)
        got = eg(x.to(DEV), **{k: v.to(DEV) for k, v in kw.items()}).cpu()
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    assert graft.fallbacks() == {}


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_multihead_attention_fast_path_matches_cpu(need_weights, average):
    """nn.MultiheadAttention at inference (aten::_native_multi_head_attention): output and
    weights match the CPU's, self- and cross-attention, with a key padding mask."""
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    mg = copy.deepcopy(mha).to(DEV)
    q, kv = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    graft.reset_metrics()
    with torch.no_grad():
        for args, kw in (((q, q, q), {}), ((q, kv, kv), {"key_padding_mask": pad})):
            ref = mha(*args, need_weights=need_weights, average_attn_weights=average, **kw)
            got = mg(*(t.to(DEV) for t in args), need_weights=need_weights,
                     average_attn_weights=average, **{k: v.to(DEV) for k, v in kw.items()})
            torch.testing.assert_close(got[0].cpu(), ref[0], rtol=1e-4, atol=1e-5)
            if need_weights:
                torch.testing.assert_close(got[1].cpu(), ref[1], rtol=1e-4, atol=1e-5)
    assert graft.fallbacks() == {}


def test_embedding_model_parity_no_fallback():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 8, padding_idx=0), nn.Flatten(), nn.Linear(8 * 6, 5))
    X, Y = torch.randint(0, 20, (10, 6)), torch.randint(0, 5, (10,))
    parity(model, X, Y, F.cross_entropy, 20, opt=lambda p: torch.optim.Adam(p, lr=1e-2))
    assert graft.fallbacks() == {}


def test_dropout_train_and_eval():
    x = torch.ones(64, 64).to(DEV)
    graft.reset_metrics()
    y = F.dropout(x, 0.5, training=True).cpu()
    vals = set(y.unique().tolist())
    assert vals <= {0.0, 2.0}
    frac = (y == 0).float().mean().item()
    assert 0.4 < frac < 0.6
    torch.testing.assert_close(F.dropout(x, 0.5, training=False).cpu(), torch.ones(64, 64))
    assert graft.fallbacks() == {}


@pytest.mark.parametrize("mode,psw,pad,last", [("sum", False, None, False), ("mean", False, 2, False),
                                               ("sum", True, None, True), ("mean", False, None, True)])
def test_embedding_bag_matches_cpu_without_fallback(mode, psw, pad, last):
    """nn.EmbeddingBag in sum and mean modes (per-sample weights, padding_idx, include_last_offset,
    an empty bag): output and the weight's (and per-sample weights') gradients match the CPU's,
    no fallback."""
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(10, 3, mode=mode, padding_idx=pad, include_last_offset=last)
    bg = copy.deepcopy(bag).to(DEV)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offs = torch.tensor([0, 3, 3, 5] + ([8] if last else []))
    w = torch.rand(8) if psw else None
    outs = []
    graft.reset_metrics()
    for m, dev in ((bag, "cpu"), (bg, DEV)):
        wi = w.clone().to(dev).requires_grad_() if psw else None
        y = m(idx.to(dev), offs.to(dev), per_sample_weights=wi)
        (y * y).sum().backward()
        outs.append([y.detach().cpu(), m.weight.grad.cpu()] + ([wi.grad.cpu()] if psw else []))
    for got, ref in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert graft.fallbacks() == {}
