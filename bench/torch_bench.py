#!/usr/bin/env python3
"""PyTorch-on-graft benchmarks: BENCH lines in the compiler issue's format.

    .venv/bin/python bench/torch_bench.py [--quick] [--only NAME]

Each benchmark runs the same PyTorch code on graft's device (graft.step() per step) and on eager
CPU at its best settings (PyTorch's OpenMP defaults; the faster of 1 and 2 intra-op threads),
from the same initial weights. OMP_WAIT_POLICY=PASSIVE, which this script set until 2026-12-06,
made torch 2's small eager steps up to 4x slower (its threads slept between parallel ops). Times are
medians over blocks of steps after warm-up, each block at least 3 steps and ~30 ms of eager's
time (a graft block ends with graft.wait(): steps run asynchronously; see block_steps), graft
and eager timed in alternating blocks so that both see the same machine (it is shared; its
speed drifts); each block starts with a pause and a few untimed steps, the same for both. For
graft, graft.wait_compiles() after the warm-up makes the steady state run natively compiled code.

inductor_ms: the same step with the model under torch.compile (default backend, Inductor, which
generates C++/OpenMP for the CPU; the optimizer stays eager, as in a typical loop), at eager's
best thread count, timed in the same alternating blocks after two untimed calls that compile it
(its compile time is not in inductor_ms; the first_30_steps lines count it, as a user pays it).
vs_inductor = inductor_ms / graft_ms (above 1: graft is faster). nan where Inductor did not run
(the reason is on a comment line).

dynamo_ms: the same step with the model under torch.compile(backend="graft") on CPU tensors
(each call's inputs copied to graft, its results CPU tensors over graft's buffers), timed in the
same blocks; dynamo_vs_eager = eager_ms / dynamo_ms, dynamo_vs_inductor = inductor_ms /
dynamo_ms. dynamo_graft_ms: that backend with the model and batch on graft's device (lazy, as
graft_ms). dynamo_first_ms / inductor_first_ms: each backend's first call of the latest line
(dynamo, AOTAutograd and the compile: what a user waits for; Inductor's includes hits in its own
disk cache from earlier runs).

Roofline: FLOPs of the step's matrix products / convolutions (counted analytically) divided by
the machine's sgemm rate measured here: the faster of torch.mm 2048x2048 (OpenBLAS sgemm on 2
threads) and the same product on graft's device (its own AVX-512 GEMM where the CPU has it,
which here runs ~1.8x OpenBLAS's AVX2 kernels). The steps are compute-bound at these sizes;
elementwise work is not counted, so of_roofline >= 1 unless a step's products outrun 2048x2048.

torch_trace_per_op: the bridge's cost per aten op recorded (Python dispatch + lowering + IR
node), measured by tracing many small elementwise ops (tensor*tensor, tensor+scalar, relu) on a
16-element device tensor without syncing, divided by the number of ops.
"""
import os
import argparse
import copy
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "torch"))
sys.path.insert(0, os.path.join(_ROOT, "examples"))

import torch
import torch.nn as nn
import torch.nn.functional as F

import graft

DEV = graft.device()


_BASE = {"fallback_ops": 0}


def ref_ops(m):
    """Instructions of the timed steps' compiled graphs that ran on reference kernels."""
    return m.get("fallback_ops", 0) - _BASE["fallback_ops"]


def graft_warm(fn, warmup):
    """Warm-up on graft: the first steps trace, compile (in the background) and cache; after
    graft.wait_compiles() the steady state runs natively compiled code. Metrics are reset so
    that they describe the timed steps."""
    for _ in range(warmup):
        graft_sync(fn())
    graft.wait_compiles()
    graft_sync(fn())    # first run after the compile lands
    graft.wait()
    graft.reset_metrics()
    _BASE["fallback_ops"] = graft.metrics().get("fallback_ops", 0)  # not reset by graft


def graft_sync(out=None):
    """Cuts the step: one graph computing every live tensor (parameters, optimizer state and
    the step's output, kept alive by the argument so that it is not dead code)."""
    graft.step()
    del out


def cpu_sync(out=None):
    pass


def sgemm_gflops():
    torch.set_num_threads(2)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        torch.mm(a, b)
        ts.append(time.perf_counter() - t0)
    return 2 * 2048 ** 3 / min(ts) / 1e9


def graft_gemm_gflops():
    """The 2048x2048 product on graft's device, best of 10 (each executed and waited for)."""
    a, b = torch.randn(2048, 2048).to(DEV), torch.randn(2048, 2048).to(DEV)

    def once():
        c = a @ b
        graft.step()
        graft.wait()
        return c
    for _ in range(2):
        once()
    graft.wait_compiles()
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        once()
        ts.append(time.perf_counter() - t0)
    return 2 * 2048 ** 3 / min(ts) / 1e9


def best_eager(make_fn, warmup, reps):
    """Eager at its best thread setting: (step fn, threads, ms a step), from a short probe of
    each."""
    best = None
    for th in (1, 2):
        torch.set_num_threads(th)
        fn = make_fn()
        for _ in range(warmup):
            fn()
        ms = statistics.median(timed_block(fn, cpu_sync, lambda: None, 1) for _ in range(max(3, reps // 4)))
        if best is None or ms < best[0]:
            best = (ms, th, fn)
    torch.set_num_threads(1)
    return best[2], best[1], best[0]


def timed_block(fn, sync, finish, n):
    """Mean ms of n steps: with asynchronous execution graft.step() returns once the step is
    queued, so a block ends by waiting for what is queued (graft.wait()); eager has none."""
    t0 = time.perf_counter()
    for _ in range(n):
        sync(fn())
    finish()
    return (time.perf_counter() - t0) * 1000 / n


BLOCK_MS = 30  # a timed sample: at least MIN_BLOCK steps and about this long (in eager's time)
MIN_BLOCK = 3


def block_steps(eager_ms):
    """Steps per timed sample. A sample ends by waiting for graft's queue, so it pays the
    asynchronous pipeline's fill and drain once (the first step's trace is not overlapped): a
    training loop that reads a value every ~30 ms pays it as often. 3 steps of the demo's 1.6 ms
    CNN would charge a 5 ms sample with a whole trace, as a loop syncing every third step does."""
    return max(MIN_BLOCK, round(BLOCK_MS / max(eager_ms, 1e-3)))


def interleaved(gfn, efn, eth, reps, block, rounds=5, warm=3, ifn=None, dfn=None, dgfn=None):
    """Median ms per step of graft, of eager and (ifn given) of torch.compile's Inductor, timed in
    alternating blocks: this machine is shared and its speed drifts, so all see the same
    conditions. Every block starts the same way: a pause (OpenBLAS's threads spin for a while
    after eager's last product) and a few untimed steps (caches, sleeping threads, clock speed
    after the pause). Inductor runs at eager's best thread count. dfn: the model under
    torch.compile(backend="graft") (CPU tensors in and out: each call returns its results).
    dgfn: the same with the model and its inputs on graft's device (lazy, as gfn). Returns
    (graft, eager, inductor, dynamo on CPU tensors, dynamo on graft's device), None where not run."""
    gts, ets, its, dts, dgts = [], [], [], [], []
    per = max(2, reps // rounds // MIN_BLOCK)
    sides = [(gfn, graft_sync, graft.wait, 1, gts), (efn, cpu_sync, lambda: None, eth, ets)]
    if ifn is not None:
        sides.append((ifn, cpu_sync, lambda: None, eth, its))
    if dfn is not None:
        sides.append((dfn, cpu_sync, lambda: None, 1, dts))
    if dgfn is not None:
        sides.append((dgfn, graft_sync, graft.wait, 1, dgts))
    for _ in range(rounds):
        for fn, sync, fin, th, ts in sides:
            torch.set_num_threads(th)
            time.sleep(0.2)
            for _ in range(warm):
                sync(fn())
            fin()
            ts += [timed_block(fn, sync, fin, block) for _ in range(per)]
    torch.set_num_threads(1)
    med = (lambda ts: statistics.median(ts) if ts else None)
    return med(gts), med(ets), med(its), med(dts), med(dgts)


FIRST_MS = {}  # backend -> ms of its first call (dynamo, AOTAutograd and the backend's compile)


def inductor(make_fn, th, backend="inductor"):
    """make_fn(backend) with torch.compile(backend=...) (Inductor: C++/OpenMP on the CPU; or
    "graft"), compiled by two untimed calls at th threads; None (and why, on a comment line) when
    it cannot run. The first call's time, as a user waits for it, goes to FIRST_MS[backend]. For
    graft, its native code is waited for (graft.wait_compiles) as in graft_warm."""
    torch.set_num_threads(th)
    try:
        fn = make_fn(backend)
        t0 = time.perf_counter()
        cpu_sync(fn())
        FIRST_MS[backend] = (time.perf_counter() - t0) * 1000
        cpu_sync(fn())
        if backend == "graft":
            graft.wait_compiles()
            cpu_sync(fn())
        print(f"# {backend} compile and first steps: {time.perf_counter() - t0:.1f} s", flush=True)
        return fn
    except Exception as e:  # a missing compiler or an op the backend cannot take
        print(f"# {backend} did not run: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        FIRST_MS[backend] = float("nan")
        return None
    finally:
        torch.set_num_threads(1)


def bench_line(name, g_ms, e_ms, flops, gflops, i_ms=None, d_ms=None, dg_ms=None):
    """d_ms: torch.compile(backend="graft")'s ms a step: dynamo_vs_eager = eager_ms / d_ms,
    dynamo_vs_inductor = inductor_ms / d_ms; dynamo_first_ms and inductor_first_ms: each
    backend's first call (what a user waits for before the first step). dg_ms: the same backend
    with the model on graft's device (dynamo_graft_vs_eager = eager_ms / dg_ms)."""
    roof = flops / (gflops * 1e9) * 1000
    nan = float("nan")
    i_ms = nan if i_ms is None else i_ms
    d_ms = nan if d_ms is None else d_ms
    dg = "" if dg_ms is None else f"dynamo_graft_ms={dg_ms:.3f} dynamo_graft_vs_eager={e_ms / dg_ms:.3f} "
    print(f"BENCH {name} graft_ms={g_ms:.3f} eager_ms={e_ms:.3f} speedup={e_ms / g_ms:.3f} "
          f"inductor_ms={i_ms:.3f} vs_inductor={i_ms / g_ms:.3f} "
          f"dynamo_ms={d_ms:.3f} dynamo_vs_eager={e_ms / d_ms:.3f} dynamo_vs_inductor={i_ms / d_ms:.3f} "
          f"{dg}dynamo_first_ms={FIRST_MS.get('graft', nan):.0f} inductor_first_ms={FIRST_MS.get('inductor', nan):.0f} "
          f"roofline_ms={roof:.3f} of_roofline={g_ms / roof:.3f}", flush=True)


def train_step_fn(model, x, y, loss_fn, opt_fn):
    opt = opt_fn(model.parameters())

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def run_train(name, model, X, Y, loss_fn, opt_fn, flops, gflops, warmup, reps):
    gm = copy.deepcopy(model).to(DEV)
    xg, yg = X.to(DEV), Y.to(DEV)
    gstep = train_step_fn(gm, xg, yg, loss_fn, opt_fn)
    graft.step()
    graft_warm(gstep, warmup)
    estep, th, probe_ms = best_eager(lambda: train_step_fn(copy.deepcopy(model), X, Y, loss_fn, opt_fn),
                                     warmup, reps)
    def make(backend):
        return train_step_fn(torch.compile(copy.deepcopy(model), backend=backend), X, Y, loss_fn, opt_fn)
    istep, dstep = inductor(make, th), inductor(make, 1, "graft")
    dgstep = train_step_fn(torch.compile(copy.deepcopy(model).to(DEV), backend="graft"), xg, yg, loss_fn, opt_fn)
    graft_warm(dgstep, warmup)
    g_ms, e_ms, i_ms, d_ms, dg_ms = interleaved(gstep, estep, th, reps, block_steps(probe_ms),
                                                ifn=istep, dfn=dstep, dgfn=dgstep)
    m = graft.metrics()
    print(f"# {name}: eager best at {th} thread(s); graft in the timed steps: graphs compiled "
          f"{m['graphs_compiled']}, compiled executions {m['compiled_executions']}/{m['executions']}, "
          f"instructions on reference kernels {ref_ops(m)}, fallbacks {m['fallbacks']}", flush=True)
    bench_line(name, g_ms, e_ms, flops, gflops, i_ms, d_ms, dg_ms)


def bench_mlp(gflops, quick):
    torch.manual_seed(0)
    B, dims = 256, [784, 1024, 1024, 10]
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    X, Y = torch.randn(B, 784), torch.randint(0, 10, (B,))
    fwd = sum(2 * B * a * b for a, b in zip(dims, dims[1:]))
    flops = 3 * fwd - 2 * B * 784 * 1024  # forward, dW and dX (no dX for the input layer)
    run_train("torch_mlp_train_step", model, X, Y, F.cross_entropy,
              lambda p: torch.optim.SGD(p, lr=0.01), flops, gflops, 3, 5 if quick else 20)


def bench_cnn(gflops, quick):
    from digits_cnn import DigitsCNN
    torch.manual_seed(0)
    B = 64
    model = DigitsCNN()
    X, Y = torch.randn(B, 1, 8, 8), torch.randint(0, 10, (B,))
    conv1 = 2 * B * 16 * 8 * 8 * 1 * 9
    conv2 = 2 * B * 32 * 4 * 4 * 16 * 9
    fc = 2 * B * 128 * 10
    flops = 3 * (conv1 + conv2 + fc) - conv1  # no input gradient for the first conv
    run_train("torch_cnn_train_step", model, X, Y, F.cross_entropy,
              lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), flops, gflops, 3, 5 if quick else 20)


def bench_encoder(gflops, quick):
    torch.manual_seed(0)
    d, h, S, B, ff = 512, 8, 256, 8, 2048
    enc = nn.TransformerEncoderLayer(d, h, ff, batch_first=True).eval()
    x = torch.randn(B, S, d)
    T = B * S
    flops = 2 * T * d * 3 * d + 2 * 2 * B * S * S * d + 2 * T * d * d + 2 * 2 * T * d * ff
    eg, xg = copy.deepcopy(enc).to(DEV), x.to(DEV)
    reps = 5 if quick else 10

    def gfn():
        with torch.no_grad():
            return eg(xg)
    graft.step()
    graft_warm(gfn, 2)

    def make():
        e = copy.deepcopy(enc)

        def f():
            with torch.no_grad():
                return e(x)
        return f
    efn, th, probe_ms = best_eager(make, 2, reps)

    def make_compiled(backend):
        e = torch.compile(copy.deepcopy(enc), backend=backend)

        def f():
            with torch.no_grad():
                return e(x)
        return f
    ifn, dfn = inductor(make_compiled, th), inductor(make_compiled, 1, "graft")
    g_ms, e_ms, i_ms, d_ms, _ = interleaved(gfn, efn, th, reps, block_steps(probe_ms), ifn=ifn, dfn=dfn)
    m = graft.metrics()
    print(f"# torch_encoder_fwd: eager best at {th} thread(s); graft in the timed steps: graphs "
          f"compiled {m['graphs_compiled']}, compiled executions {m['compiled_executions']}/"
          f"{m['executions']}, instructions on reference kernels {ref_ops(m)}, fallbacks "
          f"{m['fallbacks']}", flush=True)
    bench_line("torch_encoder_fwd", g_ms, e_ms, flops, gflops, i_ms, d_ms)


class LSTMLM(nn.Module):
    """Embedding + nn.LSTM + linear head: the issue's recurrent language model."""

    def __init__(self, vocab=64, d=64, hidden=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.head(self.rnn(self.emb(x))[0])


class GPTBlock(nn.Module):
    """A GPT-style pre-norm block with a causal mask, embedding and head."""

    def __init__(self, vocab=256, d=256, heads=4, seq=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.block = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                                norm_first=True, activation="gelu")
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        s = x.shape[1]
        mask = torch.triu(torch.full((s, s), float("-inf"), device=x.device), 1)
        return self.head(self.norm(self.block(self.emb(x) + self.pos[:s], src_mask=mask)))


def _seq_ce(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _model_case(name):
    """(model, X, Y, loss, optimizer maker, flops) for the issue's real-model lines."""
    torch.manual_seed(0)
    sgd = lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)
    if name in ("resnet18", "mobilenet_v2"):
        import torchvision.models as tvm
        model = getattr(tvm, name)(num_classes=10)
        X, Y = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
        return model, X, Y, F.cross_entropy, sgd, conv_flops(model, X)
    if name == "lstm_lm":
        model, B, S = LSTMLM(), 4, 32
        tok = torch.randint(0, 64, (B, S + 1))
        X, Y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
        fwd = 2 * B * S * (4 * 128 * (64 + 128) + 128 * 64)
        return model, X, Y, _seq_ce, sgd, 3 * fwd
    if name == "gpt_block":
        model, B, S, d = GPTBlock(), 4, 64, 256
        tok = torch.randint(0, 256, (B, S + 1))
        X, Y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
        T = B * S
        fwd = 2 * T * d * (3 * d + d + 8 * d + 256) + 2 * 2 * B * S * S * d
        return model, X, Y, _seq_ce, lambda p: torch.optim.AdamW(p, lr=1e-3), 3 * fwd
    raise ValueError(name)


def conv_flops(model, X):
    """FLOPs of one training step's convolutions and linear layers (forward x 3), by hooks."""
    total = [0]

    def hook(mod, inp, out):
        if isinstance(mod, nn.Conv2d):
            k = mod.kernel_size[0] * mod.kernel_size[1] * mod.in_channels // mod.groups
            total[0] += 2 * out.numel() * k
        elif isinstance(mod, nn.Linear):
            total[0] += 2 * out.numel() * mod.in_features
    hs = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        model.eval()(X)
    model.train()
    for h in hs:
        h.remove()
    return 3 * total[0]


MODELS = ("resnet18", "mobilenet_v2", "lstm_lm", "gpt_block")


def bench_model(name, gflops, quick):
    model, X, Y, loss, opt, flops = _model_case(name)
    run_train(f"torch_{name}_train_step", model, X, Y, loss, opt, flops, gflops, 3,
              5 if quick else 15)


def _in_fresh_process(call, cache_dir=None):
    """The last line `b.<call>` prints, run in a fresh process (b: this module): graft's disk
    cache in cache_dir (None: no disk cache), Inductor's own cache off."""
    import subprocess
    env = dict(os.environ, GRAFT_DISK_CACHE="0", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    if cache_dir:
        env.update(GRAFT_DISK_CACHE="1", XDG_CACHE_HOME=cache_dir)
    code = f"import sys; sys.argv=['x']; import torch_bench as b; print(b.{call})"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)), timeout=900)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return out.stdout.strip().splitlines()[-1]


def first_steps(name, mode, steps=30, cache_dir=None):
    """One fresh process: build the model, move it, and run `steps` training steps; seconds from
    the first move to the last step's loss read. mode = graft (its disk cache in cache_dir: a
    fresh folder is a cold start, a second process on the same folder a warm one; None: no
    disk cache), eager, or inductor (torch.compile of the model, its compile time counted: a
    user pays it)."""
    return float(_in_fresh_process(f"_first_steps_child({name!r}, {mode!r}, {steps})", cache_dir))


def _first_steps_child(name, mode, steps):
    model, X, Y, loss_fn, opt_fn, _ = _model_case(name)
    if mode in ("eager", "inductor"):
        torch.set_num_threads(2)
    return _train_steps(model, lambda dev: [(X.to(dev), Y.to(dev))] * steps, loss_fn, opt_fn, mode)


def bench_first_steps(name):
    """Cold: a fresh disk cache; warm: a second process on the cache the first one left (what
    its compiles stored, the bodies of its quick and full builds that landed)."""
    import tempfile
    e = first_steps(name, "eager")
    with tempfile.TemporaryDirectory(prefix="graft-bench-cache-") as d:
        g = first_steps(name, "graft", cache_dir=d)
        w = first_steps(name, "graft", cache_dir=d)
    try:
        i = first_steps(name, "inductor")
        ind = f"inductor_s={i:.3f} vs_inductor={i / g:.3f}"
    except Exception as ex:  # noqa: BLE001  (reported, the line still prints)
        print(f"# inductor did not run: {str(ex).splitlines()[-1][:200]}", flush=True)
        ind = "inductor_s=nan vs_inductor=nan"
    print(f"BENCH torch_{name}_first_30_steps graft_s={g:.3f} eager_s={e:.3f} speedup={e / g:.3f} "
          f"warm_graft_s={w:.3f} warm_speedup={e / w:.3f} {ind}", flush=True)


def _compile_counts(s, mode, **extra):
    """A child's result as JSON: seconds, and graft's compile counts (zeros for eager)."""
    import json
    m = graft.metrics() if mode == "graft" else {}
    keys = {"graphs": "graphs_compiled", "native": "native_compiles", "quick": "quick_compiles",
            "kernels": "kernels_compiled", "reused": "kernels_reused", "sized": "kernels_sized",
            "compiler_runs": "compiler_runs", "library": "library_builds",
            "native_steps": "compiled_executions"}
    return json.dumps({"s": s, **extra, **{k: m.get(v, 0) for k, v in keys.items()}})


def _train_steps(model, batches, loss_fn, opt, mode):
    """Trains on each (input, target) that batches(device) yields, on mode's device (graft,
    eager, or inductor: a torch.compile of the model, its compile time counted: a user pays
    it); the seconds from the model's move to the last loss read."""
    t0 = time.perf_counter()
    dev = DEV if mode == "graft" else torch.device("cpu")
    model = model.to(dev)
    if mode == "inductor":
        model = torch.compile(model)
    opt = opt(model.parameters())
    for x, y in batches(dev):
        opt.zero_grad()
        l = loss_fn(model(x), y)
        l.backward()
        opt.step()
        if mode == "graft":
            graft.step()
    l.item()
    if mode == "graft":
        graft.wait()  # the last step's loss is readable before the step has finished
    return time.perf_counter() - t0


def _varlen_child(mode, batches):
    """A GPT block LM trained on batches of 4 sequences whose length is drawn from 16..128 (text
    batched by length): seconds for all of them, and graft's compile counts, as JSON."""
    import random
    torch.manual_seed(0)
    model = GPTBlock(seq=128)
    rng = random.Random(0)
    data = [torch.randint(0, 256, (4, rng.randint(16, 128) + 1)) for _ in range(batches)]
    if mode == "eager":
        torch.set_num_threads(2)
    s = _train_steps(model, lambda dev: ((t[:, :-1].to(dev), t[:, 1:].to(dev)) for t in data),
                     _seq_ce, lambda p: torch.optim.AdamW(p, lr=1e-3), mode)
    return _compile_counts(s, mode, lengths=len({t.shape[1] for t in data}))


def bench_varlen(quick):
    """BENCH torch_varlen_lm: the compile-less issue's varying-shape case, cold (no disk cache):
    graphs = graft's graphs (one per distinct shape), native/quick = its full and quick builds
    (a library build, whose kernels were all compiled before, among them: library_builds),
    compiler_runs the compiler's invocations, kernels_sized the kernel bodies builds ran as
    size-generic templates (the sizes that vary passed at run time)."""
    import json
    n = 60 if quick else 200
    e = json.loads(_in_fresh_process(f"_varlen_child('eager', {n})"))
    g = json.loads(_in_fresh_process(f"_varlen_child('graft', {n})"))
    print(f"BENCH torch_varlen_lm graft_s={g['s']:.3f} eager_s={e['s']:.3f} "
          f"speedup={e['s'] / g['s']:.3f} batches={n} lengths={g['lengths']} graphs={g['graphs']} "
          f"native_builds={g['native']} quick_builds={g['quick']} compiler_runs={g['compiler_runs']} "
          f"library_builds={g['library']} kernels_compiled={g['kernels']} "
          f"kernels_reused={g['reused']} kernels_sized={g['sized']} native_steps={g['native_steps']}",
          flush=True)


def _partial_child(mode, epochs):
    """torchvision's resnet18 (10 classes) trained on 1000 3x32x32 samples in batches of 32 for
    `epochs` epochs: each epoch ends with a partial batch of 8. Seconds, and graft's compile
    counts, as JSON."""
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    X, Y = torch.randn(1000, 3, 32, 32), torch.randint(0, 10, (1000,))
    if mode == "eager":
        torch.set_num_threads(2)
    batches = [(X[i:i + 32], Y[i:i + 32]) for _ in range(epochs) for i in range(0, 1000, 32)]
    s = _train_steps(model, lambda dev: ((x.to(dev), y.to(dev)) for x, y in batches),
                     F.cross_entropy, lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), mode)
    return _compile_counts(s, mode)


def bench_partial(quick):
    """BENCH torch_partial_batch_cnn: the compile-less issue's partial last batch, cold (no disk
    cache), counted as bench_varlen counts."""
    import json
    n = 2 if quick else 3
    e = json.loads(_in_fresh_process(f"_partial_child('eager', {n})"))
    g = json.loads(_in_fresh_process(f"_partial_child('graft', {n})"))
    print(f"BENCH torch_partial_batch_cnn graft_s={g['s']:.3f} eager_s={e['s']:.3f} "
          f"speedup={e['s'] / g['s']:.3f} epochs={n} steps={n * 32} graphs={g['graphs']} "
          f"native_builds={g['native']} quick_builds={g['quick']} compiler_runs={g['compiler_runs']} "
          f"library_builds={g['library']} kernels_sized={g['sized']} native_steps={g['native_steps']}",
          flush=True)


def bench_trace(quick):
    x = torch.ones(16, device=DEV)
    graft.step()
    n = 3000 if quick else 10000

    def run():
        y = x
        t0 = time.perf_counter()
        for _ in range(n // 3):
            y = y * x
            y = y + 1.0
            y = torch.relu(y)
        t = time.perf_counter() - t0
        graft.step()
        return t / (3 * (n // 3)) * 1e6
    run()
    us = statistics.median(run() for _ in range(5))
    print(f"BENCH torch_trace_per_op us={us:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", default="", help="comma-separated subset: mlp,encoder,cnn,trace, "
                    "a model (resnet18,mobilenet_v2,lstm_lm,gpt_block), first_<model>, varlen or "
                    "partial")
    args = ap.parse_args()
    everything = {"mlp", "encoder", "cnn", "trace", *MODELS, "first_resnet18",
                  "first_mobilenet_v2", "varlen", "partial"}
    only = set(args.only.split(",")) if args.only else everything
    torch_gflops, graft_gflops = sgemm_gflops(), graft_gemm_gflops()
    gflops = max(torch_gflops, graft_gflops)
    print(f"# sgemm rate (roofline reference): {gflops:.1f} GFLOP/s (2048x2048: torch.mm "
          f"{torch_gflops:.1f}, graft {graft_gflops:.1f}); torch {torch.__version__}; "
          f"GRAFT_COMPILE={os.environ.get('GRAFT_COMPILE', 'async')}", flush=True)
    torch.set_num_threads(1)
    if "trace" in only:
        bench_trace(args.quick)
    if "mlp" in only:
        bench_mlp(gflops, args.quick)
    if "cnn" in only:
        bench_cnn(gflops, args.quick)
    if "encoder" in only:
        bench_encoder(gflops, args.quick)
    for name in MODELS:
        if name in only:
            bench_model(name, gflops, args.quick)
    for name in ("resnet18", "mobilenet_v2"):
        if "first_" + name in only:
            bench_first_steps(name)
    if "varlen" in only:
        bench_varlen(args.quick)
    if "partial" in only:
        bench_partial(args.quick)


if __name__ == "__main__":
    main()
