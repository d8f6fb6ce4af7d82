"""Whole-model parity worker: trains real models on graft's device and, at every step, measures
graft's loss, output and gradients against float64 on the CPU from the same parameters and batch,
with PyTorch's own float32 error as the yardstick (see /work/shared/notes/pytorch-backend.md: loss
trajectories diverge from float32 rounding alone, so parity is judged per step).

The compile mode is read by graft from GRAFT_COMPILE when it loads, so each mode runs in its own
process: `python3 model_parity.py CASE...` (CASE = model:opt) prints one JSON line per step and
one per finished case; test_model_parity.py starts it once per mode and device and judges the
lines. GRAFT_PARITY_DEVICE names the graft device the models train on: "cpu" (graft's cpu:0, the
default) or "opencl".
"""
import copy
import json
import os
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 5
OPTS = ("sgd", "adamw")


# ---------------------------------------------------------------------------------------------
# Models and data. Every dropout is p=0 and stochastic depth off: the step is deterministic, so
# the CPU references see exactly the computation graft ran. Batch norm stays in train mode.

class TinyLM(nn.Module):
    """Embedding + learned positions + causal TransformerEncoder + linear head."""

    def __init__(self, vocab=32, d=32, heads=2, ff=64, layers=2, seq=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.1)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        s = x.shape[1]
        h = self.emb(x) + self.pos[:s]
        # the causal mask is made on the CPU in the model's dtype and moved like an input
        mask = torch.triu(torch.full((s, s), float("-inf"), dtype=h.dtype), 1).to(x.device)
        return self.head(self.enc(h, mask=mask))


class LSTMLM(nn.Module):
    """Embedding + 2-layer LSTM + linear head."""

    def __init__(self, vocab=32, d=24, hidden=32, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.head(out)


def _no_dropout(m):
    from torchvision.ops import StochasticDepth
    for mod in m.modules():
        if isinstance(mod, (nn.Dropout, StochasticDepth)):
            mod.p = 0.0
    return m


def _tv(ctor, **kw):
    """A torchvision constructor (a function or a model class), 10 classes, dropout off."""
    def build():
        import torchvision.models as tvm
        return _no_dropout(getattr(tvm, ctor)(num_classes=10, **kw))
    return build


def _efficientnet_b0_small():
    # efficientnet_b0's block table (MBConv, squeeze-excitation, SiLU) at half width and depth
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.5, depth_mult=0.5)
    return _no_dropout(EfficientNet(setting, dropout=0.0, stochastic_depth_prob=0.0,
                                    num_classes=10, last_channel=last))


# mobilenet_v2's table (expansion, channels, repeats, stride) with fewer repeats: 9 blocks,
# depthwise convolutions, ReLU6, 3 residual additions
_MOBILENET_SETTING = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 2, 2], [6, 64, 1, 2], [6, 96, 2, 1],
                      [6, 160, 1, 2], [6, 320, 1, 1]]


def _image_batch(n=4, size=48):
    # 48 px: the last stage of the stride-32 networks is 2x2, so batch norm there normalizes 16
    # values per channel (at 32 px and batch 2 it is 2 values: float32 itself then loses every
    # digit of some gradients and even goes NaN, and nothing can be judged)
    return torch.randn(n, 3, size, size), torch.randint(0, 10, (n,))


def _densenet_batch():
    # DenseNet's transitions pool by 2 with floor: 48 px ends at 1x1 (batch norm over 4 values,
    # float32 off by 7e-5 at some steps); 64 px ends at 2x2
    return _image_batch(4, 64)


def _small_image_batch():
    # resnet18 (11M parameters) costs ~18 s a step on GRAFT_COMPILE=off's reference kernels at
    # 4x48: 2x40 is a third of that and still 8 values per channel in layer4's batch norm
    return _image_batch(2, 40)


def _token_batch(n=2, s=8, vocab=32):
    x = torch.randint(0, vocab, (n, s + 1))
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def _seq_ce(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


# name -> (builder, batch maker, loss)
MODELS = {
    "resnet18": (_tv("resnet18"), _small_image_batch, F.cross_entropy),
    "mobilenet_v2": (_tv("mobilenet_v2", width_mult=0.5,
                         inverted_residual_setting=_MOBILENET_SETTING), _image_batch,
                     F.cross_entropy),
    "squeezenet1_1": (_tv("squeezenet1_1"), _image_batch, F.cross_entropy),
    "shufflenet_v2": (_tv("ShuffleNetV2", stages_repeats=[2, 2, 2],
                          stages_out_channels=[24, 48, 96, 192, 256]), _image_batch,
                      F.cross_entropy),
    "efficientnet_b0": (_efficientnet_b0_small, _image_batch, F.cross_entropy),
    "densenet": (_tv("DenseNet", growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16,
                     bn_size=2), _densenet_batch, F.cross_entropy),
    "transformer_lm": (TinyLM, _token_batch, _seq_ce),
    "lstm_lm": (LSTMLM, _token_batch, _seq_ce),
}
# Runnable by the worker, not by the test: mnasnet0_5 adds ~150 s of cold compiles (its depth is
# fixed) and no op the others lack.
EXTRA_MODELS = {
    "mnasnet0_5": (_tv("mnasnet0_5"), _image_batch, F.cross_entropy),
}


def zoo_models():
    """make bench's zoo (bench/zoo.py) for the short parity form (ZOO_STEPS steps): the zoo's
    models with dropout off, on batches where batch norm normalizes enough values per channel
    (_image_batch's reason); models the full form above trains already are left out."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
    import zoo
    out = {}
    for name, (build, batch, loss) in zoo.MODELS.items():
        if name in MODELS or name in ("mobilenet_v2", "efficientnet_b0", "densenet121", "shufflenet_v2_x0_5"):
            continue  # trained above (the zoo's sizes of the same blocks)
        *inputs, target = batch()
        classify_images = len(inputs) == 1 and inputs[0].dim() == 4 and target.dim() == 1
        if classify_images and name != "vit_tiny":  # ViT: fixed 32 px, no batch norm
            size = 64 if name in ("alexnet", "squeezenet1_0", "googlenet", "vgg11_bn") else 48
            batch = (lambda s: lambda: _image_batch(4, s))(size)
        out[name] = ((lambda b: lambda: _no_dropout(b()))(build), batch, loss)
    return out


ZOO_STEPS = 2


def make_opt(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    raise ValueError(name)


# ---------------------------------------------------------------------------------------------
# The per-step measure.

def reference_grads(model, params, x, y, loss_fn, dtype):
    """Loss, gradients and output (float64) of `model` (a CPU copy, cast to dtype) at `params` on
    batch (x, y)."""
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v.to(dtype))
    for p in model.parameters():
        p.grad = None
    xx = [t.to(dtype) if t.is_floating_point() else t for t in x]
    out = model(*xx)
    loss = loss_fn(out, y)
    loss.backward()
    return loss.item(), [p.grad.detach().to(torch.float64) if p.grad is not None
                         else torch.zeros(p.shape, dtype=torch.float64) for p in model.parameters()
                         ], out.detach().to(torch.float64)


def grad_errors(names, g_graft, g32, g64):
    """Per parameter: (name, ||graft - f64||, ||f32 - f64||, ||f64||); and the same over all."""
    rows = []
    for n, a, b, c in zip(names, g_graft, g32, g64):
        rows.append((n, (a - c).norm().item(), (b - c).norm().item(), c.norm().item()))
    tot = tuple(sum(r[i] ** 2 for r in rows) ** 0.5 for i in (1, 2, 3))
    return rows, tot


def init_state(opt):
    """Creates the gradients and the optimizer state (zeros) that torch 1.13's SGD and AdamW
    create lazily in the first step, so that the first step runs the steady graph (its update is
    the same: 0.9 * 0 + g = g). The zeros are copied from the CPU: data, no graph to compile.
    Under GRAFT_COMPILE=sync the lazy first step's own graph would be a second cc compile per
    case, run once (half of the file's cold time); under async, graft.wait_compiles() would
    compile it too. GRAFT_COMPILE=off keeps PyTorch's lazy first step."""
    for group in opt.param_groups:
        for p in group["params"]:
            def zeros():
                return torch.zeros(p.shape, dtype=p.dtype).to(p.device)
            p.grad = zeros()
            st = opt.state[p]
            if isinstance(opt, torch.optim.SGD):
                st["momentum_buffer"] = zeros()
            else:
                st["step"] = torch.tensor(0.0)
                st["exp_avg"] = zeros()
                st["exp_avg_sq"] = zeros()


def run_case(model_name, opt_name, steps=STEPS):
    import graft
    kind = os.environ.get("GRAFT_PARITY_DEVICE", "cpu")
    dev = graft.device(kind)
    every = dict(MODELS, **EXTRA_MODELS)
    if os.environ.get("GRAFT_PARITY_ZOO") == "1":  # the zoo's short form
        every, steps = zoo_models(), ZOO_STEPS
    build, batch, loss_fn = every[model_name]
    torch.manual_seed(0)
    model = build().train()
    *x, y = batch()  # the model's inputs, then the target
    m32 = copy.deepcopy(model)
    m64 = copy.deepcopy(model).double()
    names = [n for n, _ in model.named_parameters()]
    mg = model.to(dev)
    og = make_opt(opt_name, mg.parameters())  # after .to(): .to() makes new Parameters
    xg, yg = [t.to(dev) for t in x], y.to(dev)
    mode = os.environ.get("GRAFT_COMPILE", "async")
    if mode != "off":
        init_state(og)
    graft.step()
    graft.reset_metrics()
    for i in range(steps):
        t0 = time.time()
        params = [p.detach().cpu() for p in mg.parameters()]  # graft's current values
        l32, g32, o32 = reference_grads(m32, params, x, y, loss_fn, torch.float32)
        l64, g64, o64 = reference_grads(m64, params, x, y, loss_fn, torch.float64)
        compiled = graft.metrics()["compiled_executions"]
        t1 = time.time()
        og.zero_grad()
        out = mg(*xg)
        loss = loss_fn(out, yg)
        loss.backward()
        og.step()
        graft.step()  # one graph: forward, backward and the optimizer update
        lg = loss.item()
        og64 = out.detach().cpu().to(torch.float64)
        gg = [p.grad.cpu().to(torch.float64) for p in mg.parameters()]
        t2 = time.time()
        rows, tot = grad_errors(names, gg, g32, g64)
        print(json.dumps({
            "model": model_name, "opt": opt_name, "mode": mode, "device": kind, "step": i,
            "secs": [round(t1 - t0, 3), round(t2 - t1, 3)],  # the CPU references, graft
            "compiled": graft.metrics()["compiled_executions"] > compiled,
            "loss": [lg, l32, l64], "tot": tot, "params": rows,
            "out": [(og64 - o64).norm().item(), (o32 - o64).norm().item(), o64.norm().item()]}),
            flush=True)
        if mode == "async" and i == 1 and steps > 2:
            graft.wait_compiles()  # the steady graph ran twice: the later steps run it compiled
    m = graft.metrics()
    print(json.dumps({"model": model_name, "opt": opt_name, "fallbacks": graft.fallbacks(),
                      "graphs": m["graphs_compiled"], "native_compiles": m["native_compiles"]}),
          flush=True)
    del mg, og, loss, out, xg, yg
    graft.step()


def main(cases):
    for case in cases:
        model_name, opt_name = case.split(":")
        print(json.dumps({"start": case}), flush=True)
        try:
            run_case(model_name, opt_name)
            print(json.dumps({"done": case}), flush=True)
        except Exception:
            print(json.dumps({"error": case, "trace": traceback.format_exc()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
