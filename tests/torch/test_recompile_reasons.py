"""A recompile names the user's line whose op differs from the nearest cached graph (the
innermost Python frame outside torch and graft), and the report lists the lines that cause
the most recompiles."""
import os
import subprocess
import sys

import torch

import graft

DEV = graft.device()
HERE = os.path.abspath(__file__)


def _train(model, batch, width):
    here = {}
    x = batch.to(DEV); here["upload"] = sys._getframe().f_lineno
    h = model(x)[:, :width]; here["slice"] = sys._getframe().f_lineno
    h.relu().sum().backward()
    graft.step()
    return here


def _warm():
    """A model trained three steps on one batch: its graphs are cached."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 6).to(DEV)
    batch = torch.randn(16, 8)
    for _ in range(3):
        _train(model, batch, 4)
    return model, batch


def test_a_new_batch_size_names_the_line_that_made_the_batch():
    graft.reset_metrics()
    model, _ = _warm()
    before = graft.metrics()["graphs_compiled"]
    here = _train(model, torch.randn(11, 8), 4)  # the last, partial batch of an epoch
    assert graft.metrics()["graphs_compiled"] == before + 1
    why = graft.last_compile_reason()
    assert "%s:%d" % (HERE, here["upload"]) in why, why
    assert "[11,8]" in why and "[16,8]" in why, why
    report = graft.metrics_report()
    top = [l for l in report.splitlines() if "top recompile sites:" in l]
    assert top and "%s:%d" % (HERE, here["upload"]) in top[0], report


def test_an_intermediate_shape_names_the_line_that_made_it():
    model, batch = _warm()
    here = _train(model, batch, 5)  # the same inputs, a wider slice
    why = graft.last_compile_reason()
    assert "%s:%d" % (HERE, here["slice"]) in why, why
    assert "[16,5]" in why and "[16,4]" in why, why


def test_the_same_graph_from_other_lines_is_a_cache_hit():
    model, batch = _warm()
    before = graft.metrics()["graphs_compiled"]

    def same_ops_other_lines(model, batch):
        x = batch.to(DEV)
        h = model(x)[:, :4]  # live at the step, as in _train: an output
        h.relu().sum().backward()
        graft.step()

    same_ops_other_lines(model, batch)
    assert graft.metrics()["graphs_compiled"] == before


def test_locations_switch_off():
    code = ("import sys, torch, graft; d = graft.device(); "
            "[(torch.ones(n, 3).to(d) * 2).sum().item() for n in (4, 5)]; "
            "print(graft.last_compile_reason())")
    env = dict(os.environ, GRAFT_LOCATIONS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[5,3]" in out.stdout and "<string>" not in out.stdout and " at " not in out.stdout, out.stdout
