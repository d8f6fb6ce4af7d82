"""Whole-model parity: real torchvision networks, a transformer LM and an LSTM LM train on graft's
devices (its cpu device, and its OpenCL device when graft.devices() lists one: OPENCL_MODELS)
with SGD+momentum and AdamW under GRAFT_COMPILE=off, sync and async; at every step graft's
loss, output and gradients are measured against float64 on the CPU from graft's own current
parameters, with PyTorch float32's error from the same parameters as the yardstick
(model_parity.py).

Run with -s for the whole table; a failing case prints its own rows. Columns: "ran" is the tier
that ran the step (ref: off's reference kernels, tier1: the first tier, compiled); "loss err",
"out err" (logits) and "grad err" (all parameters) are graft's relative errors against float64,
each followed by PyTorch float32's; "ratio" is graft's gradient error over float32's; "param" the
worst single parameter's ratio (against the floored yardstick below), named last.
GRAFT_PARITY_DUMP=dir saves each mode's raw per-step records.

Tolerance. graft and PyTorch both compute in float32 with different summation orders and
algorithms (im2col + OpenBLAS GEMM or generated loops against mkldnn, fused elementwise code,
blocked reductions), so their errors against float64 are independent roundings of the same
computation: the same order of magnitude, ratios spread around 1 (at most 2.7 over all parameters
and 2.9 for one parameter in the runs this was tuned on; 0.2-0.5 under off, whose reference
kernels are more exact than PyTorch's float32). RATIO = 8 leaves room for that spread; a
systematic precision loss (a one-pass variance, a half-precision or badly ordered accumulation)
or a wrong op shows as 10-1e30x. Per parameter the yardstick has a floor: where float32 itself is
exact to a few ulps (a last bias) graft may differ by ~1e-6 relative without that meaning
anything.

Near-ties. A ReLU or max-pool input within float32 rounding of its threshold can round to the
other side in graft than in PyTorch: one element's gradient path switches, and the step's
gradients move by 1e-3..5e-2 (PyTorch float32 shows such steps itself, /work/shared/notes/
pytorch-backend.md). Measured: mnasnet0_5 (model_parity.EXTRA_MODELS; sgd, sync, step 3) was
750x float32's error, and the float64 gradient with its one ReLU input at 3.8e-10 of the layer's
range flipped matches graft's to 3.8e-6. So a case may have up to FLIP_STEPS such steps, each
within FLIP_REL of float64; a broken op is wrong at every step or by far more.

The forward pass is judged by the model's output (logits, kept alive so graft materializes them),
by the same norm ratio: it is continuous at near-ties, so every step must pass. The loss is one
number, and float32's error on it is one draw that cancellation can make tiny (1e-9 at one step,
3e-5 at the next, same model; efficientnet's loss is off by 6e-6 in float32 at some steps and by
8.6e-7 at most over another run's five): a case's largest relative loss error must be within RATIO
of the larger of float32's largest over the same steps and LOSS_FLOOR.
"""
import json
import os
import subprocess
import sys
import time

import pytest

from devices import NO_OPENCL, OPENCL
from model_parity import MODELS, OPTS, STEPS, ZOO_STEPS, zoo_models

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("off", "sync", "async")
RATIO = 8.0            # graft's error may be this many times float32's (both against float64)
LOSS_FLOOR = 2e-6      # relative floor of the loss yardstick
GRAD_FLOOR = 1e-6      # floor of a parameter's yardstick, relative to its gradient's norm
TOTAL_FLOOR = 1e-7     # ... and relative to the norm of all gradients (parameters with ~0 grad)
FLIP_STEPS = 2         # steps of a case whose gradients may exceed RATIO (near-ties) ...
FLIP_REL = 5e-2        # ... if within this relative error of float64
WORKER_TIMEOUT = 1500  # seconds per mode and device
DEVICES = ("cpu", "opencl")
# The models that also train on the OpenCL device: a CNN with residuals, batch norm and pooling,
# one with depthwise convolutions and ReLU6, and a transformer (attention, layer norm,
# embeddings). With the OpenCL compiler every graph's kernels are built by pocl (~0.5 s a
# program cold; cached on disk after): all 8 models took longer than a worker's time limit on
# this 2-core machine from a cold cache, so the others train on the cpu device only.
OPENCL_MODELS = ("resnet18", "mobilenet_v2", "transformer_lm")

# Cases that fail on a graft bug outside this test: {(model, opt, mode): reason}.
KNOWN = {}
# Models with ops graft does not lower yet (PyTorch's CPU kernel runs them mid-graph).
KNOWN_FALLBACKS = {}

_results = {}   # (mode, device) -> {(model, opt): {"rows": [...], "error": str|None, "fallbacks": {}}}
_timing = {}    # (mode, device) -> seconds


def _run_worker(mode, device, cases, zoo=False):
    """Runs the worker for `mode` on `device` over `cases`; a crash marks its case and the rest
    go on."""
    out = {c: {"rows": [], "error": None, "fallbacks": {}} for c in cases}
    env = dict(os.environ, GRAFT_COMPILE=mode, GRAFT_PARITY_DEVICE=device, GRAFT_PARITY_ZOO="1" if zoo else "0",
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "..", "torch"), HERE]))
    todo = list(cases)
    deadline = time.time() + WORKER_TIMEOUT
    while todo:
        args = [sys.executable, os.path.join(HERE, "model_parity.py")]
        args += ["%s:%s" % c for c in todo]
        try:
            p = subprocess.run(args, env=env, capture_output=True, text=True,
                               timeout=max(deadline - time.time(), 1))
            stdout, stderr, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr, rc = "timed out (%ds for the mode)" % WORKER_TIMEOUT, "timeout"
        current = None
        for line in stdout.splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "start" in d:
                current = tuple(d["start"].split(":"))
            elif "done" in d:
                todo.remove(current)
                current = None
            elif "error" in d:
                out[current]["error"] = d["trace"]
                todo.remove(current)
                current = None
            elif "fallbacks" in d:
                out[current]["fallbacks"] = d["fallbacks"]
            else:
                out[current]["rows"].append(d)
        if rc != 0:
            victim = current if current is not None else (todo[0] if todo else None)
            if victim is None:
                break
            out[victim]["error"] = "worker died (rc %s): %s" % (rc, stderr[-3000:])
            todo.remove(victim)
            if time.time() >= deadline:
                for c in todo:
                    out[c]["error"] = "not run: worker time limit"
                break
        elif todo:  # a clean exit leaves nothing to do
            for c in todo:
                out[c]["error"] = "the worker did not report this case"
            break
    return out


def _cases_for(session, mode, device):
    cases = []
    test = "test_zoo_parity" if mode == ZOO_MODE else "test_model_parity"
    for item in session.items:
        cs = getattr(item, "callspec", None)
        if cs is not None and item.originalname == test and cs.params["mode"] == mode and cs.params["device"] == device:
            cases.append((cs.params["model"], cs.params["opt"]))
    return cases


@pytest.fixture(scope="module")
def results(request):
    def get(mode, device):
        key = (mode, device)
        if key not in _results:
            t = time.time()
            _results[key] = _run_worker(mode.split("-")[-1], device, _cases_for(request.session, mode, device),
                                        zoo=mode == ZOO_MODE)
            _timing[key] = time.time() - t
            dump = os.environ.get("GRAFT_PARITY_DUMP")
            if dump:
                os.makedirs(dump, exist_ok=True)
                with open(os.path.join(dump, "parity-%s-%s.json" % key), "w") as f:
                    json.dump({"%s:%s" % k: v for k, v in _results[key].items()}, f)
        return _results[key]
    yield get
    if _results:
        print("\n" + table([r for d in DEVICES for m in MODES if (m, d) in _results
                            for c in _results[(m, d)].values() for r in c["rows"]]))
        print("worker seconds per mode and device: " + ", ".join(
            "%s %s %.0f" % (m, d, t) for (m, d), t in _timing.items()))


def _rel(a, b, scale):
    return abs(a - b) / max(abs(scale), 1e-30)


def loss_errors(row):
    lg, l32, l64 = row["loss"]
    return _rel(lg, l64, l64), _rel(l32, l64, l64)


def output_ok(row):
    og, o32, n64 = row["out"]
    return og <= RATIO * max(o32, TOTAL_FLOOR * n64)


def judge(row):
    """(grads ok, grads within FLIP_REL, worst parameter ratio, its name) of one step."""
    eg, e32, n64 = row["tot"]
    total_ok = eg <= RATIO * max(e32, TOTAL_FLOOR * n64)
    worst, worst_name = 0.0, ""
    for name, pg, p32, p64 in row["params"]:
        r = pg / max(p32, GRAD_FLOOR * p64, TOTAL_FLOOR * n64)
        if r > worst:
            worst, worst_name = r, name
    return total_ok and worst <= RATIO, eg <= FLIP_REL * n64, worst, worst_name


def table(rows):
    head = ("%-15s %-5s %-5s %-6s %4s %-8s %8s %8s %8s %8s %8s %8s %6s %7s  %s"
            % ("model", "opt", "mode", "device", "step", "ran", "loss err", "f32 loss", "out err", "f32 out",
               "grad err", "f32 grad", "ratio", "param", "worst parameter"))
    lines = [head, "-" * len(head)]
    for r in rows:
        eg, e32, n64 = r["tot"]
        og, o32, o64 = r["out"]
        ok, _, worst, worst_name = judge(r)
        ran = "compiled" if r["compiled"] else ("ref" if r["mode"] == "off" else "tier1")
        flag = ("" if output_ok(r) else " out") + ("" if ok else " grad")
        lines.append("%-15s %-5s %-5s %-6s %4d %-8s" % (r["model"], r["opt"], r["mode"],
                                                        r.get("device", "cpu"), r["step"], ran)
                     + " %8.1e %8.1e %8.1e %8.1e %8.1e %8.1e %6.2f %7.2f  %s%s"
                     % (loss_errors(r) +
                        (og / max(o64, 1e-300), o32 / max(o64, 1e-300), eg / max(n64, 1e-300),
                         e32 / max(n64, 1e-300), eg / max(e32, 1e-300), worst,
                         worst_name, "  <-- beyond %gx:%s" % (RATIO, flag) if flag else "")))
    return "\n".join(lines)


def _xfail(reason):
    return pytest.mark.xfail(reason=reason, strict=True)


def _marks(model, opt, mode, device):
    if device == "opencl" and not OPENCL:
        return [pytest.mark.skip(reason=NO_OPENCL)]
    key = (model, opt, mode)
    return [_xfail(KNOWN[key])] if key in KNOWN else []


@pytest.mark.parametrize("model,opt,mode,device", [
    pytest.param(m, o, md, d, marks=_marks(m, o, md, d))
    for d in DEVICES for m in (MODELS if d == "cpu" else OPENCL_MODELS) for o in OPTS for md in MODES])
def test_model_parity(model, opt, mode, device, results):
    res = results(mode, device)[(model, opt)]
    rows = res["rows"]
    assert res["error"] is None, "%s %s %s on %s failed on graft:\n%s\n%s" % (
        model, opt, mode, device, res["error"], table(rows))
    assert len(rows) == STEPS
    report = "\n" + table(rows)
    lg = max(loss_errors(r)[0] for r in rows)
    l32 = max(loss_errors(r)[1] for r in rows)
    assert lg <= RATIO * max(l32, LOSS_FLOOR), (
        "loss error %.2e beyond %gx float32's %.2e" % (lg, RATIO, l32) + report)
    assert all(output_ok(r) for r in rows), "output beyond %gx float32's error" % RATIO + report
    verdicts = [judge(r) for r in rows]
    bad = [i for i, v in enumerate(verdicts) if not v[0]]
    assert len(bad) <= FLIP_STEPS and all(verdicts[i][1] for i in bad), (
        "gradients beyond %gx float32's error at steps %s" % (RATIO, bad) + report)
    if mode == "sync":
        assert all(r["compiled"] for r in rows), "sync: a step ran no compiled code" + report
    if mode == "async":
        assert rows[-1]["compiled"], "async mode: the steady graph never ran compiled" + report


@pytest.mark.parametrize("model", [
    pytest.param(m, marks=[_xfail(KNOWN_FALLBACKS[m])] if m in KNOWN_FALLBACKS else [])
    for m in MODELS])
def test_model_runs_without_fallback(model, results):
    """Every op of the model lowers to graft (a fallback runs PyTorch's CPU kernel mid-graph);
    read from the parity runs above (on any device)."""
    have = [k for k in _results if (model, OPTS[0]) in _results[k]]
    if not have:
        pytest.skip("no parity run of %s selected" % model)
    fb = _results[have[0]][(model, OPTS[0])]["fallbacks"]
    assert fb == {}, fb


# The short form for make bench's zoo (bench/zoo.py; the models above are left out): each model
# two AdamW steps under one compile mode (async: the first tier runs them; the second run queues
# the native compile, which the worker does not wait for), judged as above.
ZOO_MODE = "zoo-async"
ZOO = sorted(zoo_models())


@pytest.mark.parametrize("model,opt,mode,device", [(m, "adamw", ZOO_MODE, "cpu") for m in ZOO])
def test_zoo_parity(model, opt, mode, device, results):
    res = results(mode, device)[(model, opt)]
    rows = res["rows"]
    assert res["error"] is None, "%s failed on graft:\n%s\n%s" % (model, res["error"], table(rows))
    assert len(rows) == ZOO_STEPS
    report = "\n" + table(rows)
    for r in rows:
        assert output_ok(r), "output beyond %gx float32's error:%s" % (RATIO, report)
        ok, near, worst, name = judge(r)
        assert ok or near, "gradients beyond %gx float32's error (worst %s, %.1f):%s" % (RATIO, name, worst, report)
    lerr = max(loss_errors(r)[0] for r in rows)
    l32 = max(loss_errors(r)[1] for r in rows)
    assert lerr <= RATIO * max(l32, LOSS_FLOOR), "loss beyond %gx float32's error:%s" % (RATIO, report)
    assert res["fallbacks"] == {}, "fallbacks: %s" % res["fallbacks"]
