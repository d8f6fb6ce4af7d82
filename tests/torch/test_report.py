"""What a user reads after a run (graft.report, the trace, the pictures): from the trace alone of
a resnet18 training, the five slowest kernels with what each fused and the source line, how long
the compiles took and on which thread, and how long the step waited; the dumped pictures render
with Graphviz's dot without a warning; the HTML page loads in headless Chromium with no console
error and shows the kernel table (its text read back from the rendered page, and a screenshot
that is not blank)."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import graft
from graft import _report

@pytest.fixture(scope="module")
def resnet_run(tmp_path_factory):
    torchvision = pytest.importorskip("torchvision")
    d = tmp_path_factory.mktemp("report")
    dumps = d / "dumps"
    torch.manual_seed(0)
    dev = graft.device()
    model = torchvision.models.resnet18(num_classes=10).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(4, 3, 32, 32).to(dev), torch.randint(0, 10, (4,)).to(dev)
    graft.step()
    native0 = graft.metrics()["compiled_executions"]  # the process's counter: earlier tests ran
    graft.set_dump_dir(dumps)
    try:
        with graft.trace(d / "trace.json"):
            for i in range(60):
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(model(x), y)  # the line the kernels name
                loss.backward()
                opt.step()
                graft.step()
                if i == 2:
                    graft.wait_compiles()  # then the steady graph runs natively
                if i >= 6 and graft.metrics()["compiled_executions"] >= native0 + 4:
                    break
            graft.step()
            graft.wait()  # the user's wait for the queued steps: a span of its own
            loss.item()
    finally:
        graft.set_dump_dir(None)
    page = graft.report(d / "report.html", dump_dir=dumps, title="resnet18 report")
    return d, dumps, page


def test_the_trace_alone_answers_a_users_questions(resnet_run):
    d, _, _ = resnet_run
    spans, threads = _report._load(d / "trace.json")
    a = _report.analyse(spans, threads)
    # the five slowest kernels of the steady graph, what each fused, where they came from
    steady = a["graphs"][0]
    assert steady["native_ms"] is not None and steady["kernel_us"] > 0
    gen = [k for k in a["kernels"] if k["graph"] == steady["graph"] and k["cat"] == "kernel"]
    assert len(gen) >= 5
    for k in gen[:5]:
        assert re.fullmatch(r"kernel k\d+", k["name"])
        assert k["fused"] and all(re.fullmatch(r"[a-z_0-9]+|\(\+\d+|more\)", w) for w in k["fused"].split()), k
        assert k["bytes"] > 0 and k["mean_us"] > 0 and k["calls"] >= 1
    assert any(os.path.basename(__file__) in k["at"] for k in gen[:5]), [k["at"] for k in gen[:5]]
    assert all(k["from"] and all(w.startswith("aten::") for w in k["from"].split()) for k in gen[:5]), \
        [k["from"] for k in gen[:5]]  # the aten ops the kernel's values came from
    assert [k["us"] for k in a["kernels"]] == sorted((k["us"] for k in a["kernels"]), reverse=True)
    # each kernel span lies inside a native step of its graph, on the executor's track
    steps = [e for e in spans if e["cat"] == "step" and "native" in e["name"]]
    for e in (e for e in spans if e["cat"] in ("kernel", "gemm")):
        assert any(s["tid"] == e["tid"] and s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 0.002
                   for s in steps), e
    assert threads[next(e for e in spans if e["cat"] == "kernel")["tid"]] == "executor (steps)"
    gemm = [k for k in a["kernels"] if k["cat"] == "gemm"]
    assert gemm and all(k["flops"] > 0 for k in gemm)
    # compiles: how long, on which thread, why
    builds = [c for c in a["compiles"] if c["what"].startswith("native build")]
    # built by the compiler thread, or from kernels compiled before (earlier tests' kernels, in
    # this process or the disk cache) on the thread that traced the graph
    assert builds and all(c["ms"] > 0 and c["thread"] == ("tracing (syncs)" if "library" in c["what"]
                                                          else "compiler (native builds)") for c in builds)
    assert all(c["kernels_compiled"] + c["kernels_reused"] > 0 and c["from_disk"] >= 0 for c in builds)
    plans = [c for c in a["compiles"] if c["what"] == "lower and plan (first tier)"]
    assert plans and all(c["thread"] == "tracing (syncs)" and "new graph" in c["reason"] for c in plans)
    # waits: the reads that waited for their step, and the executor's waits for native code
    assert any(w["what"] == "graft_wait" and w["thread"] == "tracing (syncs)" for w in a["waits"])
    assert sum(w["us"] for w in a["waits"]) > 0
    # the thread pool's workers have their own track, with this run's work on it
    pool = [e for e in spans if e["cat"] == "pool"]
    if os.cpu_count() > 1:
        assert pool and all(threads[e["tid"]] == "thread pool worker" for e in pool)


def test_the_pictures_render_without_warnings(resnet_run):
    _, dumps, _ = resnet_run
    dots = sorted(dumps.glob("graph_*.kernels.dot"), key=lambda p: p.stat().st_size)
    assert dots, os.listdir(dumps)
    text = dots[-1].read_text()  # the largest: the training step's graph
    assert "subgraph cluster_k0" in text and "library GEMM" in text and "from aten::convolution" in text
    assert "donatable: if donated, freed after" in text  # the weights the optimizer step replaces
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed (scripts/install-deps.sh installs it)")
    for p in dots:
        r = subprocess.run(["dot", "-Tsvg", "-o", os.devnull, str(p)], capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr == "", (p, r.stderr)
        assert p.with_suffix(".svg").exists()


def _png_colours(path):
    """Distinct colours of a screenshot (Pillow comes with torchvision)."""
    from PIL import Image
    with Image.open(path) as im:
        return im.convert("RGB").getcolors(maxcolors=1 << 20) or []


def test_the_report_loads_in_headless_chromium(resnet_run, tmp_path):
    d, _, page = resnet_run
    text = open(page).read()
    assert "<script" not in text and "http://" not in text.replace("http://www.w3.org", "")
    assert "Top kernels by time" in text and "<svg" in text  # the pictures are embedded
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Debian's chromium is not installed (scripts/install-deps.sh installs it)")
    args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=%s" % (tmp_path / "profile"),
            "--enable-logging=stderr", "--v=0", "--window-size=1400,1600"]
    url = "file://" + os.path.abspath(page)
    dom = subprocess.run(args + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [l for l in dom.stderr.splitlines() if "CONSOLE" in l]
    assert not console, console
    # the rendered page's text holds the kernel table, with the five slowest kernels by name
    spans, threads = _report._load(d / "trace.json")
    top = [k["name"] for k in _report.analyse(spans, threads)["kernels"][:5]]
    body = re.sub(r"<[^>]+>", " ", dom.stdout)
    assert "Top kernels by time" in body and "Compiles" in body and "Waits" in body
    assert all(n in body for n in top), top
    shot = tmp_path / "report.png"
    r = subprocess.run(args + ["--screenshot=%s" % shot, url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    assert len(_png_colours(shot)) > 20  # text, bars and tables: not a blank page
    keep = os.environ.get("GRAFT_REPORT_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_report_errors_and_the_command_line(tmp_path):
    with pytest.raises(RuntimeError, match="does not exist"):
        graft.report(tmp_path / "r.html", trace=tmp_path / "missing.json")
    # a C program's trace makes a report from the command line too (no torch in that process)
    subprocess.run(["make", "-s", "-C", _ROOT, "build/examples/train_mlp"], check=True, capture_output=True)
    tr = tmp_path / "c.json"
    r = subprocess.run([os.path.join(_ROOT, "build", "examples", "train_mlp"), "--epochs", "2"],
                       env=dict(os.environ, GRAFT_TRACE=str(tr)), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "c.html"
    r = subprocess.run([sys.executable, "-S", os.path.join(_ROOT, "torch", "graft", "_report.py"), str(tr), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "Top kernels by time" in html and "kernel k" in html and "native build" in html


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_opencl_builds_are_drawn_too(tmp_path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from devices import NO_OPENCL, OPENCL
    if not OPENCL:
        pytest.skip(NO_OPENCL)
    dev = graft.device("opencl")
    graft.set_dump_dir(tmp_path)
    try:
        x = torch.randn(64, 32).to(dev)
        w = torch.randn(32, 16).to(dev)
        for _ in range(3):  # a graph seen again is built for the device
            y = torch.relu(x @ w + 1).sum(1).tanh()
            y.cpu()
            graft.wait_compiles()
    finally:
        graft.set_dump_dir(None)
    dots = list(tmp_path.glob("graph_*.kernels.dot"))
    assert dots, os.listdir(tmp_path)
    text = "\n".join(p.read_text() for p in dots)
    assert ".cl)" in text and "subgraph cluster_k0" in text  # titled after the OpenCL source
    assert "library GEMM" in text or "fallback kernel" in text  # the matmul: CLBlast's, or the host's
    if shutil.which("dot"):
        assert all(p.with_suffix(".svg").exists() for p in dots)
