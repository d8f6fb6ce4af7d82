"""Checkpoints: what torch.save stores from graft's device loads anywhere as CPU tensors.

Saved from graft: tensors (pending ones included: saving syncs them), a model's state_dict with
batch-norm buffers, an optimizer's state_dict with momentum buffers. Loaded in a subprocess that
never imports graft (plain load, map_location='cpu', weights_only=True), and back in this
process onto graft's device.
"""
import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import graft

DEV = graft.device()


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def trained(steps=3, step_last=False):
    """A graft model and SGD-with-momentum optimizer after a few steps; the last step's values
    stay pending unless step_last."""
    model = small_net().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    x, y = torch.randn(8, 1, 6, 6).to(DEV), torch.randint(0, 5, (8,)).to(DEV)
    for i in range(steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i < steps - 1 or step_last:
            graft.step()
    return model, opt


def cpu_values(obj):
    """The same structure with every tensor read to the CPU (the expected values)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return type(obj)((k, cpu_values(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_values(v) for v in obj)
    return obj


def has_float(obj):
    """torch 1.13's weights_only unpickler refuses Python floats (pickle's BINFLOAT opcode), so
    an optimizer's state_dict (lr, momentum) cannot load that way even when saved from the CPU:
    its tensors are checked through 'opt_state'."""
    if isinstance(obj, float):
        return True
    if isinstance(obj, dict):
        return any(has_float(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(has_float(v) for v in obj)
    return False


def load_modes(want):
    return ({}, {"map_location": "cpu"}) + (() if has_float(want) else ({"weights_only": True},))


def assert_same(got, want, where="obj", device="cpu"):
    """Exact equality of nested containers of tensors; tensors on `device`."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert got.device.type == device, (where, got.device)
        assert got.dtype == want.dtype and got.shape == want.shape, (where, got.dtype, got.shape)
        assert torch.equal(got.cpu(), want), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), (where, list(got))
        for k in want:
            assert_same(got[k], want[k], "%s[%r]" % (where, k), device)
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, "%s[%d]" % (where, i), device)
    else:
        assert got == want, (where, got, want)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Saves graft objects with torch.save (and graft.save); returns (dir, {name: expected})."""
    d = tmp_path_factory.mktemp("ckpt")
    model, opt = trained()
    assert any(graft.is_pending(p) for p in model.parameters())  # saving must sync these
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(DEV)
    objs = {
        "tensor": src * 1.5 - 2,                          # pending
        "view": (src + 1).t(),                            # a transposed view
        "dtypes": {"i64": torch.arange(5).to(DEV) * 3, "bool": (src > 4).to(DEV),
                   "f16": src.half(), "bf16": src.bfloat16(), "f64": src.double() / 3},
        "param": nn.Parameter(torch.randn(2, 3).to(DEV)),
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "opt_state": opt.state_dict()["state"],           # the momentum buffers alone
    }
    saved_objs = dict(objs)
    for name, obj in objs.items():
        torch.save(obj, str(d / (name + ".pt")))
    # graft.save: the same, syncing everything first; legacy (non-zip) format too
    m2, o2 = trained(steps=2)
    both = {"model": m2.state_dict(), "opt": o2.state_dict()}
    graft.save(both, str(d / "both.pt"))
    saved_objs["both"] = both
    torch.save(objs["model"], str(d / "legacy.pt"), _use_new_zipfile_serialization=False)
    saved_objs["legacy"] = objs["model"]
    want = {name: cpu_values(obj) for name, obj in saved_objs.items()}
    assert want["opt"]["state"][0]["momentum_buffer"].abs().sum() > 0
    assert "1.running_mean" in want["model"] and want["model"]["1.num_batches_tracked"] == 3
    torch.save(want, str(d / "expected.pt"))  # plain CPU tensors
    return d, want, saved_objs


NO_GRAFT = textwrap.dedent("""
    import sys, torch
    d = sys.argv[1]
    want = torch.load(d + "/expected.pt")
    from test_checkpoint_helpers import assert_same, load_modes
    n = 0
    for name in want:
        for kw in load_modes(want[name]):
            n += "weights_only" in kw
            got = torch.load("%s/%s.pt" % (d, name), **kw)
            assert_same(got, want[name], "%s %s" % (name, kw))
        if name == "param":
            assert isinstance(got, torch.nn.Parameter) and got.requires_grad
    assert "graft" not in sys.modules, "graft was imported"
    assert not any(m.startswith("graft") for m in sys.modules)
    assert n == len(want) - 2  # all but 'opt' and 'both' (Python floats)
    print("loaded", len(want), "objects without graft")
""")


def test_loads_in_a_process_without_graft(saved, tmp_path):
    d, want, _ = saved
    # the helper module: assert_same, copied so the subprocess imports nothing from the tests
    import inspect
    (tmp_path / "test_checkpoint_helpers.py").write_text(
        "import torch\n\n" + "\n\n".join(inspect.getsource(f)
                                           for f in (has_float, load_modes, assert_same)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path)  # the helper only: not the folder holding graft
    r = subprocess.run([sys.executable, "-c", NO_GRAFT, str(d)], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "without graft" in r.stdout


def test_map_location_cpu_and_weights_only_here(saved):
    d, want, _ = saved
    for name in want:
        for kw in load_modes(want[name]):
            assert_same(torch.load(str(d / (name + ".pt")), **kw), want[name], name)


def test_round_trip_back_to_graft(saved):
    d, want, _ = saved
    t = torch.load(str(d / "tensor.pt")).to(DEV)
    assert graft.is_graft(t) and torch.equal(t.cpu(), want["tensor"])
    # a fresh graft model and optimizer take the loaded state
    sd = torch.load(str(d / "model.pt"), weights_only=True)
    model = small_net().to(DEV)
    model.load_state_dict(sd)
    assert_same(cpu_values(model.state_dict()), want["model"])
    assert all(graft.is_graft(v) for v in model.state_dict().values())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.load_state_dict(torch.load(str(d / "opt.pt")))
    buf = opt.state_dict()["state"][0]["momentum_buffer"]
    assert graft.is_graft(buf)
    assert_same(cpu_values(opt.state_dict()), want["opt"])
    # and training continues from it on the device exactly as from the original objects
    x = torch.ones(2, 1, 6, 6).to(DEV)
    out = model(x).cpu()
    ref = small_net()
    ref.load_state_dict(sd)
    torch.testing.assert_close(out, ref(torch.ones(2, 1, 6, 6)), rtol=1e-5, atol=1e-5)


def test_saving_leaves_graft_objects_intact(saved):
    _, want, saved_objs = saved
    # the saved originals are still graft tensors with their values (saving copies to the CPU)
    assert graft.is_graft(saved_objs["tensor"])
    assert_same(cpu_values(saved_objs["model"]), want["model"])
    p = saved_objs["param"]
    assert isinstance(p, nn.Parameter) and graft.is_graft(p) and p.requires_grad


def test_pickle_of_a_pending_tensor_reads_its_value():
    import pickle
    a = torch.arange(6, dtype=torch.float32).to(DEV)
    b = a * 2 + 1
    assert graft.is_pending(b)
    c = pickle.loads(pickle.dumps(b))
    assert c.device.type == "cpu" and torch.equal(c, torch.arange(6.) * 2 + 1)


def test_deepcopy_stays_on_graft_and_is_its_own_value():
    # graft tensors carry a storage with no data (for dynamo); deepcopy must clone on the device
    # (its storage path allocated on the device and crashed), for a tensor, a module's buffers
    # and an optimizer's state
    t = torch.randn(3, 4).to(DEV)
    c = copy.deepcopy(t)
    assert c.device == t.device and torch.equal(c.cpu(), t.cpu())
    c.add_(1)
    assert not torch.equal(c.cpu(), t.cpu())
    bn = nn.BatchNorm2d(3).to(DEV)
    opt = torch.optim.Adam(bn.parameters())
    bn(torch.randn(2, 3, 4, 4).to(DEV)).sum().backward()
    opt.step()
    b2, s2 = copy.deepcopy(bn), copy.deepcopy(opt.state_dict())
    assert b2.running_mean.device == DEV and torch.equal(b2.running_var.cpu(), bn.running_var.cpu())
    assert all(v.device == DEV for st in s2["state"].values() for v in st.values() if v.dim())
