"""CNN, encoder layer and embedding models on graft vs CPU eager."""
import copy

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
