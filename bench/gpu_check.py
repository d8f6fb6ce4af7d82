"""The Python half of scripts/gpu-check.sh, on a machine with an NVIDIA GPU and PyTorch with
CUDA: (1) parity: resnet18 and the GPT-style LM train 5 steps on graft's cuda device under
GRAFT_COMPILE=sync, judged per step against float64 by the parity rule of make test
(tests/torch/test_model_parity.py's judge); (2) BENCH cuda_* lines: memory-bound fused kernels
against the device-to-device copy bandwidth measured in the same run (of_hbm), an f32 matmul
against cuBLAS through PyTorch (of_cublas), and training steps against PyTorch eager on the same
GPU (vs_torch_cuda) and torch.compile there (vs_inductor). Usage: gpu_check.py parity|bench."""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests", "torch")
sys.path[:0] = [os.path.join(ROOT, "torch"), TESTS, HERE]

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import graft  # noqa: E402

PARITY_CASES = ("resnet18:sgd", "transformer_lm:adamw")
# GPU_CHECK_DRY=1: a dry run of this script's own logic without a GPU (graft's cpu device against
# PyTorch's CPU, sizes cut); the figures mean nothing then.
DRY = os.environ.get("GPU_CHECK_DRY") == "1"
KIND, REF = ("cpu", "cpu") if DRY else ("cuda", "cuda")
SCALE = 16 if DRY else 1


def ref_sync():
    if REF == "cuda":
        torch.cuda.synchronize()


def _worker_lines(args, env, budget):
    """The parity worker's stdout lines; on running past budget seconds, those it printed."""
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        err = "timed out after %ds; %s" % (budget, err or "")
    return out.splitlines(), p.returncode, err or ""


def parity():
    from test_model_parity import FLIP_STEPS, judge, output_ok, table
    env = dict(os.environ, GRAFT_COMPILE="sync", GRAFT_PARITY_DEVICE=KIND, GRAFT_PARITY_ZOO="0",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "torch"), TESTS]))
    budget = max(int(os.environ.get("GPU_CHECK_BUDGET", "400")) - 10, 20)  # the stage's, less a margin
    lines, rc, err = _worker_lines([sys.executable, os.path.join(TESTS, "model_parity.py"), *PARITY_CASES],
                                   env, budget)
    rows, bad = [], []
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "error" in d:
            bad.append("%s: %s" % (d["error"], d["trace"].strip().splitlines()[-1]))
        elif "step" in d:
            rows.append(d)
        elif "fallbacks" in d:
            print("# %s:%s fallbacks %s, graphs %s" % (d["model"], d["opt"], d["fallbacks"], d["graphs"]))
    print(table(rows))
    flips = {}  # near-ties: up to FLIP_STEPS steps a case may exceed RATIO within FLIP_REL
    for r in rows:
        ok, near, _, _ = judge(r)
        case = (r["model"], r["opt"])
        if not ok and near and flips.get(case, 0) < FLIP_STEPS:
            flips[case] = flips.get(case, 0) + 1
        elif not ok or not output_ok(r):
            bad.append("%s:%s step %d beyond the parity rule" % (r["model"], r["opt"], r["step"]))
    done = {(r["model"], r["opt"]) for r in rows}
    for c in PARITY_CASES:
        if tuple(c.split(":")) not in done:
            bad.append("%s: no step ran (rc %s): %s" % (c, rc, err.strip()[-800:]))
    print("PARITY %s" % ("ok" if not bad else "FAILED"))
    for b in bad:
        print("  " + b)
    return 0 if not bad else 1


def cuda_time(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    ref_sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    ref_sync()
    return (time.perf_counter() - t) / reps


def graft_time(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    graft.step()
    graft.wait_compiles()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def bench_kernels(dev):
    n = (1 << 26) // SCALE  # 256 MiB of f32
    a = torch.randn(n, device=REF)
    b = torch.empty_like(a)
    copy_s = cuda_time(lambda: b.copy_(a))
    hbm = 2 * a.numel() * 4 / copy_s  # bytes read and written per second
    print("# device-to-device copy: %.0f GB/s (read + written)" % (hbm / 1e9))
    x = a.cpu().to(dev)
    rows = torch.randn((1 << 14) // SCALE, 4096)
    xr = rows.to(dev)
    w, bias = torch.randn(4096).to(dev), torch.randn(4096).to(dev)
    def done(y):  # the kernel's graph, then one element read (not a sum: that is a kernel too)
        graft.step()
        return y.reshape(-1)[:1].cpu()

    cases = {  # bytes moved: the input read and the output written
        "gelu_chain": (lambda: done(F.gelu(x * 1.5 + 0.5) * 0.5), 2 * 4 * n),
        "softmax": (lambda: done(torch.softmax(xr, -1)), 2 * 4 * xr.numel()),
        "layer_norm": (lambda: done(F.layer_norm(xr, (4096,), w, bias)), 2 * 4 * xr.numel()),
    }
    for name, (fn, moved) in cases.items():
        s = graft_time(fn, reps=10)
        print("BENCH cuda_%s graft_ms=%.3f of_hbm=%.3f" % (name, s * 1e3, moved / s / hbm), flush=True)
    m = 8192 // SCALE
    A, B = torch.randn(m, m), torch.randn(m, m)
    Ac, Bc = A.to(REF), B.to(REF)
    cublas_s = cuda_time(lambda: Ac @ Bc, reps=10)
    Ag, Bg = A.to(dev), B.to(dev)
    g_s = graft_time(lambda: done(Ag @ Bg), reps=10)
    print("BENCH cuda_matmul_%d graft_ms=%.3f cublas_ms=%.3f of_cublas=%.3f tflops=%.1f" % (
        m, g_s * 1e3, cublas_s * 1e3, cublas_s / g_s, 2 * m ** 3 / g_s / 1e12), flush=True)


def bench_training(dev):
    import torchvision
    from torch_bench import GPTBlock
    cases = {
        "resnet18": (lambda: torchvision.models.resnet18(num_classes=10),
                     lambda: (torch.randn(32, 3, 64, 64), torch.randint(0, 10, (32,))), F.cross_entropy),
        "gpt_block": (GPTBlock, lambda: (torch.randint(0, 256, (16, 64)), torch.randint(0, 256, (16, 64))),
                      lambda o, y: F.cross_entropy(o.reshape(-1, o.shape[-1]), y.reshape(-1))),
    }
    times = {}
    # graft and eager first, Inductor (whose cold compiles can take minutes) after every model
    for where in ("graft", "eager", "inductor"):
        for name, (build, batch, loss_fn) in cases.items():
            torch.manual_seed(0)
            x, y = batch()
            d = dev if where == "graft" else torch.device(REF)
            model = build().to(d).train()
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            xd, yd = x.to(d), y.to(d)
            fwd = torch.compile(model) if where == "inductor" else model

            def step():
                opt.zero_grad()
                loss = loss_fn(fwd(xd), yd)
                loss.backward()
                opt.step()
                return loss

            if where == "graft":  # a training loop's sync: the step's graph, then its loss read
                times[name, where] = graft_time(lambda: (step(), graft.step())[0].item(), reps=10)
            else:
                times[name, where] = cuda_time(step, reps=10)
            if where != "graft":
                print("BENCH cuda_%s_train graft_ms=%.3f torch_cuda_ms=%.3f %s" % (
                    name, times[name, "graft"] * 1e3, times[name, "eager"] * 1e3,
                    "vs_torch_cuda=%.3f" % (times[name, "eager"] / times[name, "graft"]) if where == "eager" else
                    "inductor_ms=%.3f vs_inductor=%.3f" % (times[name, where] * 1e3,
                                                           times[name, where] / times[name, "graft"])),
                    flush=True)


def bench():
    dev = graft.device(KIND)
    print("# %s; torch %s" % ([d for d in graft.devices() if d.kind == KIND][0].name, torch.__version__))
    rc = 0
    for part in (bench_kernels, bench_training):
        try:
            part(dev)
        except Exception as e:  # one part's failure leaves the others' figures
            print("# %s failed: %s: %s" % (part.__name__, type(e).__name__, str(e)[:600]), flush=True)
            rc = 1
    print("# metrics: fallbacks %s" % graft.fallbacks())
    return rc


if __name__ == "__main__":
    sys.exit({"parity": parity, "bench": bench}[sys.argv[1]]())
