#!/usr/bin/env python3
"""The model zoo: training steps of models nobody tuned graft for, against eager PyTorch.

    .venv/bin/python bench/zoo.py [--only NAME[,NAME...]] [--blocks N] [--warm] [--list] [--same-process]

Each model trains with a real loop's habits: AdamW (weight decay), zero_grad(set_to_none=True),
gradient clipping (clip_grad_norm_), a learning-rate schedule, masks where the model family has
them. graft and eager start from the same weights; eager runs at PyTorch's defaults (both
cores; graft gives the thread that makes its tensors one OpenMP thread, so the eager blocks,
run on that thread, set its count back to PyTorch's for their duration). Per model:

    BENCH zoo_<model>_train_step graft_ms= eager_ms= speedup= compile_s= fallbacks=

Each model runs in a fresh process (--same-process: all in this one). graft_ms / eager_ms: the
median step after warm-up (graft after graft.wait_compiles(), i.e.
native code; a step ends with loss.item()), timed in alternating blocks so both see the same
machine. speedup = eager_ms / graft_ms. compile_s: wall time from graft's first step until its
compiles are done (graft.wait_compiles() returns after two steps) from an empty disk cache
(--warm: the user's cache): what a user waits before the steady speed. fallbacks: aten ops that ran on PyTorch's CPU kernels during the timed steps (each
cuts the step into graphs). The last line is the geometric mean of the speedups.
"""
import os

# No OMP_WAIT_POLICY here: eager runs at PyTorch's defaults. PASSIVE (set before torch loads
# libgomp) made its small steps 4x slower on torch 2 (the LSTM LM 2.3 -> 9.7 ms a step): every
# parallel op then woke sleeping threads.

import argparse
import atexit
import copy
import math
import shutil
import statistics
import sys
import tempfile
import time


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "torch"))

import ctypes

import torch
import torch.nn as nn
import torch.nn.functional as F

import graft

# graft runs the PyTorch CPU ops of the thread that makes graft tensors on one OpenMP thread
# (GRAFT_TORCH_THREADS; their spinning workers took a core from graft's steps). Eager's blocks
# run on this same thread at PyTorch's defaults: OpenMP's count and MKL's local one are set per
# thread around them, through the runtimes libtorch_cpu links (as graft finds them).
EAGER_THREADS = torch.get_num_threads()
try:
    _TORCH_CPU = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"),
                             mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    _omp_set_num_threads = _TORCH_CPU.omp_set_num_threads
    _mkl_local = getattr(_TORCH_CPU, "MKL_Set_Num_Threads_Local", None)  # MKL's C API
except (OSError, AttributeError):  # not found: the process-wide setting (also this thread's)
    _omp_set_num_threads, _mkl_local = torch.set_num_threads, None

DEV = graft.device()


def _tv(name, **kw):
    import torchvision
    return lambda: getattr(torchvision.models, name)(num_classes=10, **kw)


def _video(name):
    import torchvision
    return lambda: getattr(torchvision.models.video, name)(num_classes=10)


def _images(n=2, c=3, s=32, classes=10):
    return lambda: (torch.randn(n, c, s, s), torch.randint(0, classes, (n,)))


def _ce(out, y):
    return F.cross_entropy(out, y)


def _seq_ce(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


class TinyViT(nn.Module):
    def __init__(self):
        super().__init__()
        import torchvision
        self.m = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
                                                      hidden_dim=64, mlp_dim=128, num_classes=10)

    def forward(self, x):
        return self.m(x)


class EncoderClassifier(nn.Module):
    """Token classifier: embedding, positional table, a 2-layer pre-norm encoder, padding mask."""

    def __init__(self, vocab=500, d=64):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(32, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 128, dropout=0.1, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 5)

    def forward(self, tok, pad):
        h = self.enc(self.emb(tok) + self.pos[: tok.shape[1]], src_key_padding_mask=pad)
        h = h.masked_fill(pad.unsqueeze(-1), 0).sum(1) / (~pad).sum(1, keepdim=True)
        return self.head(h)


class Seq2Seq(nn.Module):
    """nn.Transformer with a causal target mask (teacher forcing)."""

    def __init__(self, vocab=300, d=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.t = nn.Transformer(d, 4, 1, 1, 128, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.out(self.t(self.emb(src), self.emb(tgt), tgt_mask=mask.to(src.device)))


class GPTish(nn.Module):
    """A decoder-only LM: causal scaled_dot_product_attention, GELU MLP, tied embeddings."""

    def __init__(self, vocab=400, d=64, heads=4, layers=2):
        super().__init__()
        self.emb, self.pos, self.heads = nn.Embedding(vocab, d), nn.Embedding(64, d), heads
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({"ln1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d), "proj": nn.Linear(d, d),
                                              "ln2": nn.LayerNorm(d), "fc": nn.Linear(d, 4 * d), "fc2": nn.Linear(4 * d, d)}))
        self.lnf = nn.LayerNorm(d)

    def forward(self, tok):
        B, T = tok.shape
        h = self.emb(tok) + self.pos(torch.arange(T, device=tok.device))
        for b in self.blocks:
            q, k, v = b["qkv"](b["ln1"](h)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + b["proj"](a.transpose(1, 2).reshape(B, T, -1))
            h = h + b["fc2"](F.gelu(b["fc"](b["ln2"](h))))
        return self.lnf(h) @ self.emb.weight.t()


class GRUTagger(nn.Module):
    def __init__(self, vocab=300, d=48):
        super().__init__()
        self.emb, self.rnn, self.out = nn.Embedding(vocab, d), nn.GRU(d, d, 2, batch_first=True, bidirectional=True), nn.Linear(2 * d, 7)

    def forward(self, tok):
        return self.out(self.rnn(self.emb(tok))[0])


class LSTMLM(nn.Module):
    def __init__(self, vocab=300, d=64):
        super().__init__()
        self.emb, self.rnn, self.out = nn.Embedding(vocab, d), nn.LSTM(d, d, 1, batch_first=True), nn.Linear(d, vocab)

    def forward(self, tok):
        return self.out(self.rnn(self.emb(tok))[0])


class Conv1dNet(nn.Module):
    """Audio-style 1-D convolutions: strided, dilated, batch norm, global pooling."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(1, 16, 9, stride=2, padding=4), nn.BatchNorm1d(16), nn.ReLU(),
                                 nn.Conv1d(16, 32, 5, dilation=2, padding=4), nn.BatchNorm1d(32), nn.ReLU(),
                                 nn.MaxPool1d(2), nn.Conv1d(32, 32, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


class UNetish(nn.Module):
    """Segmentation: down with strides, up with ConvTranspose2d and bilinear upsampling, skips."""

    def __init__(self):
        super().__init__()
        self.d1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU())
        self.d2 = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GroupNorm(4, 32), nn.SiLU())
        self.d3 = nn.Sequential(nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.GroupNorm(8, 64), nn.SiLU())
        self.u2 = nn.ConvTranspose2d(64, 32, 2, stride=2)
        self.u1 = nn.Conv2d(64, 16, 3, padding=1)
        self.head = nn.Conv2d(32, 4, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(a)
        c = self.d3(b)
        b2 = F.silu(self.u2(c))
        a2 = F.interpolate(F.silu(self.u1(torch.cat([b, b2], 1))), scale_factor=2, mode="bilinear", align_corners=False)
        return self.head(torch.cat([a, a2], 1))


class EmbBagRec(nn.Module):
    """A recommender: EmbeddingBag (mean) over bags of ids, dense features, an MLP with dropout."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(1000, 32, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(32 + 8, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))

    def forward(self, ids, offsets, dense):
        return self.mlp(torch.cat([self.bag(ids, offsets), dense], 1)).squeeze(1)


def _tokens(B, T, vocab):
    return torch.randint(0, vocab, (B, T))


def _encoder_batch():
    tok = _tokens(8, 32, 500)
    pad = torch.zeros(8, 32, dtype=torch.bool)
    pad[::2, 24:] = True
    return tok, pad, torch.randint(0, 5, (8,))


def _lm_batch(B, T, vocab):
    def make():
        t = _tokens(B, T + 1, vocab)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()
    return make


def _seq2seq_batch():
    src, tgt = _tokens(8, 20, 300), _tokens(8, 17, 300)
    return src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous()


def _bag_batch():
    ids = torch.randint(0, 1000, (64 * 6,))
    offsets = torch.arange(0, 64 * 6, 6)
    return ids, offsets, torch.randn(64, 8), torch.rand(64)


# name: (model factory, batch factory: CPU tensors, the model's inputs then the target,
#        loss(output, target))
MODELS = {
    "resnet18": (_tv("resnet18"), _images(4), _ce),
    "resnext50_32x4d": (_tv("resnext50_32x4d"), _images(2), _ce),
    "wide_resnet50_2": (_tv("wide_resnet50_2"), _images(2), _ce),
    "mobilenet_v2": (_tv("mobilenet_v2"), _images(4), _ce),
    "mobilenet_v3_small": (_tv("mobilenet_v3_small"), _images(4), _ce),
    "efficientnet_b0": (_tv("efficientnet_b0"), _images(2), _ce),
    "convnext_tiny": (_tv("convnext_tiny"), _images(2), _ce),
    "regnet_y_400mf": (_tv("regnet_y_400mf"), _images(4), _ce),
    "shufflenet_v2_x0_5": (_tv("shufflenet_v2_x0_5"), _images(4), _ce),
    "squeezenet1_0": (_tv("squeezenet1_0"), _images(4, s=64), _ce),
    "densenet121": (_tv("densenet121"), _images(2), _ce),
    "mnasnet0_5": (_tv("mnasnet0_5"), _images(4), _ce),
    "googlenet": (_tv("googlenet", aux_logits=False, init_weights=True), _images(2), _ce),
    "vgg11_bn": (_tv("vgg11_bn"), _images(2), _ce),
    "alexnet": (_tv("alexnet"), _images(2, s=64), _ce),
    "r3d_18": (_video("r3d_18"), lambda: (torch.randn(2, 3, 4, 32, 32), torch.randint(0, 10, (2,))), _ce),
    "vit_tiny": (TinyViT, _images(8), _ce),
    "encoder_classifier": (EncoderClassifier, _encoder_batch, _ce),
    "seq2seq_transformer": (Seq2Seq, _seq2seq_batch, _seq_ce),
    "gpt_decoder": (GPTish, _lm_batch(8, 32, 400), _seq_ce),
    "gru_tagger": (GRUTagger, lambda: (_tokens(8, 24, 300), torch.randint(0, 7, (8, 24))), _seq_ce),
    "lstm_lm": (LSTMLM, _lm_batch(8, 32, 300), _seq_ce),
    "conv1d_audio": (Conv1dNet, lambda: (torch.randn(8, 1, 1024), torch.randint(0, 10, (8,))), _ce),
    "unet_seg": (UNetish, lambda: (torch.randn(2, 3, 32, 32), torch.randint(0, 4, (2, 32, 32))), _ce),
    "embbag_recommender": (EmbBagRec, _bag_batch, F.binary_cross_entropy_with_logits),
}


class Trainer:
    """One model's training loop on one device: AdamW, clipping, a cosine schedule."""

    def __init__(self, model, batch, loss_fn, dev):
        self.dev, self.loss_fn = dev, loss_fn
        self.model = copy.deepcopy(model).to(dev)
        self.batch = [b.to(dev) for b in batch]
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, T_max=1000)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(*self.batch[:-1]), self.batch[-1])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.sched.step()
        if self.dev != "cpu":
            graft.step()
        return loss.item()


def _block(tr, n):
    """ms a step over n steps; a graft block ends when everything it queued has run (a step's
    loss is readable before its backward pass and optimizer have run: early outputs). Each block
    starts on a quiet machine: the other side's threads stop spinning first (PyTorch's OpenMP
    workers spin ~10 ms after a parallel op, graft's executor up to GRAFT_POLL_US; either took a
    core from the block after it, as no user's process running only one of them sees)."""
    threads = torch.get_num_threads()  # this thread's count, as graft set it
    eager = tr.dev == "cpu"
    if eager:
        _omp_set_num_threads(EAGER_THREADS)
        mkl = _mkl_local(0) if _mkl_local else 0  # 0: MKL's process-wide count
    try:
        time.sleep(0.05)
        for _ in range(2):  # and warm again: what a loop that runs on sees
            tr.step()
        if tr.dev != "cpu":
            graft.wait()
        t0 = time.perf_counter()
        for _ in range(n):
            tr.step()
        if tr.dev != "cpu":
            graft.wait()
        return (time.perf_counter() - t0) / n * 1000
    finally:
        if eager:
            _omp_set_num_threads(threads)
            if _mkl_local:
                _mkl_local(mkl)


def run_model(name, blocks):
    make_model, make_batch, loss_fn = MODELS[name]
    torch.manual_seed(0)
    model = make_model()
    model.train()
    batch = make_batch()
    eager = Trainer(model, batch, loss_fn, "cpu")
    g = Trainer(model, batch, loss_fn, DEV)
    graft.reset_metrics()
    t0 = time.perf_counter()
    g.step()
    g.step()
    graft.wait_compiles()
    compile_s = time.perf_counter() - t0
    g.step()
    eager.step()
    eager.step()
    first = _block(eager, 1)
    per = max(1, min(100, int(300 / max(first, 1e-3))))  # ~0.3 s of eager per block
    graft.reset_metrics()
    gt, et = [], []
    for _ in range(blocks):
        et.append(_block(eager, per))
        gt.append(_block(g, per))
    fb = sum(graft.fallbacks().values())
    return statistics.median(gt), statistics.median(et), compile_s, fb


def _run_child(name, blocks):
    """One model in a fresh process (the disk cache folder inherited: later models reuse kernels
    earlier ones compiled, as a user's next run does). A process that trained other models
    first runs a small model's graft steps ~10-20% slower, eager's ~5% (its heap after the
    large models' tensors), which no user running one model sees. Its lines are passed on;
    returns its speedup."""
    import subprocess
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--only", name,
                          "--blocks", str(blocks)], capture_output=True, text=True)
    got = []
    for line in out.stdout.splitlines():
        print(line, flush=True)
        if line.startswith("BENCH zoo_") and " speedup=" in line:
            got.append(float(line.split(" speedup=")[1].split()[0]))
    if out.returncode:
        print("# zoo_%s: its process failed: %s" % (name, out.stderr.strip().splitlines()[-1:]), flush=True)
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--warm", action="store_true", help="keep graft's disk cache (compile_s then counts loads)")
    ap.add_argument("--same-process", action="store_true",
                    help="every model in this process (default: each in a fresh one, as a user runs it)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    if not args.warm and not args.child:  # compile_s is a cold compile: graft's disk cache (read per compile) starts empty
        cache = tempfile.mkdtemp(prefix="graft-zoo-cache-")
        os.environ["XDG_CACHE_HOME"] = cache
        atexit.register(shutil.rmtree, cache, True)
    if args.list:
        print("\n".join(MODELS))
        return
    speedups = []
    for name in names:
        if not args.same_process and not args.child:
            speedups += _run_child(name, args.blocks)
            continue
        try:
            gms, ems, cs, fb = run_model(name, args.blocks)
        except Exception as e:  # a model that fails is reported, and the zoo goes on
            print("# zoo_%s failed: %s" % (name, str(e).splitlines()[0][:300]), flush=True)
            continue
        speedups.append(ems / gms)
        print("BENCH zoo_%s_train_step graft_ms=%.2f eager_ms=%.2f speedup=%.2f compile_s=%.1f fallbacks=%d"
              % (name, gms, ems, ems / gms, cs, fb), flush=True)
    if speedups and not args.child:
        geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        print("BENCH zoo_geomean speedup=%.2f models=%d below_1x=%d" % (geo, len(speedups), sum(s < 1 for s in speedups)))


if __name__ == "__main__":
    main()
