"""graft.export: a PyTorch model's inference graph and weights written as a file that C runs
with libgraft alone (graft_load, graft_function_call; examples/infer.c), matching PyTorch's
outputs; bad files are errors that name the file and the problem."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

import graft

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
REL = 1e-4  # the bound: logits within 1e-4 relative (to the largest) of PyTorch's


def _rel(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    """examples/export_resnet18.py at 64 px (under valgrind a 224 px image takes minutes)."""
    out = tmp_path_factory.mktemp("resnet18")
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "export_resnet18.py"), "--out", str(out),
                    "--size", "64"], check=True, capture_output=True, timeout=600)
    subprocess.run(["make", "-s", "-C", ROOT, "build/examples/infer"], check=True, capture_output=True, timeout=600)
    return out


def _infer(out, *pre, env=None):
    cmd = [*pre, os.path.join(ROOT, "build", "examples", "infer"), str(out / "resnet18.graft"),
           str(out / "image.f32"), "--labels", str(out / "labels.txt"), "--logits", str(out / "c_logits.f32")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)


def test_resnet18_runs_from_c_and_matches_pytorch(resnet18):
    r = _infer(resnet18)
    assert r.returncode == 0, r.stderr
    got = torch.from_numpy(np.fromfile(resnet18 / "c_logits.f32", dtype=np.float32))
    want = torch.from_numpy(np.fromfile(resnet18 / "torch_logits.f32", dtype=np.float32))
    assert got.shape == want.shape == (1000,)
    assert _rel(got, want) <= REL, _rel(got, want)
    names = (resnet18 / "labels.txt").read_text().splitlines()
    top = torch.topk(want, 5).indices.tolist()
    lines = r.stdout.splitlines()
    assert len(lines) == 5 and all(names[i] in line and "class %4d" % i in line for i, line in zip(top, lines)), r.stdout


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_infer_leaks_nothing_under_valgrind(resnet18):
    # compiled code for x86-64-v3 (valgrind has no AVX-512); the compiler runs outside valgrind
    env = dict(os.environ, GRAFT_COMPILE="sync", GRAFT_MARCH="x86-64-v3")
    r = _infer(resnet18, "valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect",
               "--error-exitcode=99", "-q", env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    got = torch.from_numpy(np.fromfile(resnet18 / "c_logits.f32", dtype=np.float32))
    want = torch.from_numpy(np.fromfile(resnet18 / "torch_logits.f32", dtype=np.float32))
    assert _rel(got, want) <= REL


def test_infer_names_bad_inputs(resnet18, tmp_path):
    exe = os.path.join(ROOT, "build", "examples", "infer")
    short = tmp_path / "short.f32"
    np.zeros(10, dtype=np.float32).tofile(short)
    r = subprocess.run([exe, str(resnet18 / "resnet18.graft"), str(short)], capture_output=True, text=True)
    assert r.returncode == 1 and "holds 10 floats; the model takes 12288" in r.stderr, r.stderr
    r = subprocess.run([exe, str(resnet18 / "image.f32"), str(short)], capture_output=True, text=True)
    assert r.returncode == 1 and "not a graft function file" in r.stderr and "image.f32" in r.stderr, r.stderr


class TwoHeads(nn.Module):
    """Attention, layer norm, a dict of two outputs: not a CNN."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(6, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = nn.LayerNorm(16)
        self.a, self.b = nn.Linear(16, 3), nn.Linear(16, 1)

    def forward(self, x):
        h = self.emb(x)
        h = self.norm(h + self.attn(h, h, h, need_weights=False)[0])
        return {"cls": self.a(h.mean(1)), "score": torch.sigmoid(self.b(h)).squeeze(-1)}


def test_export_and_load_in_python(tmp_path):
    torch.manual_seed(0)
    m = TwoHeads().eval()
    x = torch.randn(2, 5, 6)
    path = tmp_path / "two.graft"
    assert graft.export(m, (x,), path) == [(2, 3), (2, 5)]
    f = graft.load_exported(path)
    for _ in range(2):  # new inputs of the example's shape
        x = torch.randn(2, 5, 6)
        with torch.no_grad():
            want = m(x)
        cls, score = f(x)
        assert cls.device.type == "cpu"
        assert _rel(cls, want["cls"]) <= REL and _rel(score, want["score"]) <= REL
    with pytest.raises(RuntimeError, match="input 0 is f32 \\[3,5,6\\]"):
        f(torch.randn(3, 5, 6))


def test_bad_files_are_named(tmp_path):
    with pytest.raises(RuntimeError, match="cannot open .*missing.graft"):
        graft.load_exported(tmp_path / "missing.graft")
    p = tmp_path / "foreign.graft"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    with pytest.raises(RuntimeError, match="foreign.graft: not a graft function file"):
        graft.load_exported(p)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    good = tmp_path / "mlp.graft"
    graft.export(m, (torch.randn(3, 4),), good)
    data = good.read_bytes()
    cut = tmp_path / "cut.graft"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(RuntimeError, match="cut.graft: truncated"):
        graft.load_exported(cut)
    flip = bytearray(data)
    flip[-5] ^= 0x10
    bad = tmp_path / "flip.graft"
    bad.write_bytes(bytes(flip))
    with pytest.raises(RuntimeError, match="flip.graft: corrupted: constant .* fails its checksum"):
        graft.load_exported(bad)


def test_export_of_a_model_on_graft_and_bad_outputs(tmp_path):
    # a model already on graft's device exports the same way (torch.export's fake tensors on
    # graft); a model that returns something other than tensors is refused by name
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = m(x)
    dev = graft.device()
    assert graft.export(m.to(dev), (x.to(dev),), tmp_path / "g.graft") == [(3, 2)]
    got = graft.load_exported(tmp_path / "g.graft")(x)
    assert _rel(got, want) <= REL

    class Counts(nn.Module):
        def forward(self, x):
            return x.sum(), 3

    with pytest.raises(TypeError, match="must return tensors.*int"):
        graft.export(Counts(), (torch.randn(2),), tmp_path / "c.graft")
