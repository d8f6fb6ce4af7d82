"""graft's PyTorch device: unmodified PyTorch code runs on graft's lazy-tensor compiler.

    import torch, graft
    dev = graft.device()
    model = Net().to(dev)
    ... train ...
    graft.step()              # cut the pending graph, compile once, run
    print(graft.metrics_report())
"""
import atexit
import collections
import json
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_SO_CANDIDATES = [
    os.path.join(_HERE, "_graft_C.so"),
    os.path.join(os.path.dirname(_HERE), "build", "_graft_C.so"),
]


def _load():
    for p in _SO_CANDIDATES:
        if os.path.exists(p):
            try:
                torch.ops.load_library(p)
            except OSError as e:
                raise ImportError("graft: %s does not load with this PyTorch (%s): rebuild it "
                                  "against torch %s with `make torch` (%s)"
                                  % (p, torch.__file__, torch.__version__, e.__cause__ or e)) from e
            return p
    raise ImportError("graft: the bridge is not built (run `make -C torch`); looked for "
                      + ", ".join(_SO_CANDIDATES))


def _name_backend():
    """graft is PyTorch's PrivateUse1 backend under the name "graft" (before the bridge loads:
    its registrations then print and parse as graft). A process where another extension already
    took PrivateUse1 cannot have both: say which."""
    name = torch._C._get_privateuse1_backend_name()
    if name == "graft":
        return
    if name != "privateuseone":
        raise ImportError("graft: PyTorch's PrivateUse1 backend is already named %r by another "
                          "extension; graft needs it (one PrivateUse1 backend per process)" % name)
    torch.utils.rename_privateuse1_backend("graft")


_name_backend()
_LIB = _load()
_ops = torch.ops.graft


def _record_locations():
    """Each traced op records the user's Python line (the innermost frame outside torch and
    graft), so a recompile reason names it; GRAFT_LOCATIONS=0 turns it off."""
    dirs = {os.path.dirname(os.path.abspath(torch.__file__)), _HERE}
    dirs |= {os.path.realpath(d) for d in dirs}
    _ops.locations(sorted(d + os.sep for d in dirs), os.environ.get("GRAFT_LOCATIONS", "1") != "0")


_record_locations()

DEVICE_TYPE = "graft"  # graft device N is torch.device("graft", N)
CPU_DEVICES = 4  # graft devices 0..3 are virtual CPU devices; accelerators (OpenCL, CUDA) follow


class Device(collections.namedtuple("Device", "index kind ordinal name memory device")):
    """One graft device: index (graft's device id), kind ("cpu", "opencl", "cuda"), ordinal (among
    its kind), name, memory (bytes of its own memory; 0 for the CPUs) and its torch.device."""


ACCELERATOR_KINDS = ("opencl", "cuda")


class Devices(list):
    """graft.devices()'s answer: the devices, and in .absent why each accelerator kind that lists
    no device has none ({"cuda": "no CUDA driver: libcuda.so.1 could not be opened ..."})."""

    def __init__(self, items, absent):
        super().__init__(items)
        self.absent = absent

    def __repr__(self):
        notes = "".join("\n  no %s device: %s" % kv for kv in self.absent.items())
        return list.__repr__(self) + notes


def devices():
    """Every graft device (asking looks for accelerators once: it loads the OpenCL and CUDA
    drivers where present); .absent says why a kind has none."""
    out, seen = [], {}
    for i in range(_ops.device_count()):
        kind, name, memory = _ops.device_info(i)
        out.append(Device(i, kind, seen.get(kind, 0), name, memory, torch.device(DEVICE_TYPE, i)))
        seen[kind] = seen.get(kind, 0) + 1
    absent = {k: _ops.device_absent(k) for k in ACCELERATOR_KINDS}
    return Devices(out, {k: v for k, v in absent.items() if v})


def device(kind=0, ordinal=None):
    """The torch.device of a graft device. device() / device(i): graft device i (0..3: the CPU
    devices). device("opencl"), device("cuda"), device("opencl", 1), device("cpu", 2), device("opencl:1"): the
    ordinal-th device of that kind. A missing device raises RuntimeError saying what is missing."""
    if isinstance(kind, int) and ordinal is None:
        if not 0 <= kind < CPU_DEVICES and not _ops.device_info(kind)[0]:
            raise RuntimeError("graft: no device %d (devices: %s)" % (
                kind, ", ".join("%d %s:%d" % (d.index, d.kind, d.ordinal) for d in devices())))
        return torch.device(DEVICE_TYPE, kind)
    if not isinstance(kind, str):
        raise TypeError("graft.device: kind is a string ('cpu', 'opencl', 'cuda') or a device id, got %r" % (kind,))
    if ":" in kind:
        if ordinal is not None:
            raise ValueError("graft.device(%r, %r): the ordinal is given twice" % (kind, ordinal))
        kind, ordinal = kind.split(":", 1)
        ordinal = int(ordinal)
    ordinal = 0 if ordinal is None else int(ordinal)
    if kind == "cpu" and 0 <= ordinal < CPU_DEVICES:
        return torch.device(DEVICE_TYPE, ordinal)  # cpu:i is device i (no accelerator lookup)
    return torch.device(DEVICE_TYPE, _ops.device_find(kind, ordinal))


def is_graft(t):
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE_TYPE


def step():
    """Marks a step: materializes every pending graft tensor (one compiled graph)."""
    _ops.step()


def sync(tensors):
    """Materializes the given graft tensors."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    _ops.sync([t for t in tensors if is_graft(t)])


def metrics():
    """A dict of graft's counters; fallbacks to PyTorch's CPU kernels are keyed 'aten::<op>';
    the bridge's composite lowerings count calls fused ('lstm_fused') or decomposed by PyTorch
    ('lstm_decomposed')."""
    m = json.loads(_ops.metrics_json())
    m.update(m.pop("lowerings", {}))
    fb = m.pop("fallbacks", {})
    m.update(fb)
    m["fallbacks"] = sum(fb.values())
    return m


def fallbacks():
    """Fallback counts per aten op ({'aten::<op>': n})."""
    return json.loads(_ops.metrics_json())["fallbacks"]


def reset_metrics():
    _ops.reset_metrics()


def metrics_report():
    """A text report: graft's counters and compile reasons, then the fallbacks per aten op."""
    lines = [_ops.metrics_report().rstrip("\n")]
    fb = fallbacks()
    lines.append("fallbacks to PyTorch CPU kernels: %d" % sum(fb.values()))
    for k, v in sorted(fb.items(), key=lambda kv: -kv[1]):
        lines.append("  %-40s %d" % (k, v))
    low = json.loads(_ops.metrics_json())["lowerings"]
    if low:
        lines.append("composite lowerings (calls): " + ", ".join("%s %d" % kv for kv in sorted(low.items())))
    return "\n".join(lines) + "\n"


def last_compile_reason():
    return _ops.last_compile_reason()


def set_dump_dir(path):
    """Dumps each compiled graph (IR text, Graphviz, generated source, the picture of its
    kernels) into path (None: off). Waits for the builds in flight first: graft's compiler
    thread reads GRAFT_DUMP_DIR, and the environment must not change under it."""
    _ops.wait_compiles()
    if path is None:
        os.environ.pop("GRAFT_DUMP_DIR", None)
    else:
        os.makedirs(path, exist_ok=True)
        os.environ["GRAFT_DUMP_DIR"] = str(path)


def _seed64(seed):
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    return s - (1 << 64) if s >= (1 << 63) else s  # passed as int64, read back as uint64


def manual_seed(seed):
    """Seeds graft's random generator (dropout, rand, randn on the device)."""
    _ops.manual_seed(_seed64(seed))


def wait_compiles():
    """Blocks until graft's background native compiles are done (benchmarks, tests): after it,
    a graph seen before runs compiled code."""
    _ops.wait_compiles()


def wait():
    """Blocks until every queued step has run (graft.step() returns once its graph is queued;
    reads wait on their own). Raises the first failure of a queued step not yet reported."""
    _ops.wait()


def _drain_at_exit():
    """Queued steps run before the interpreter and libtorch tear down: a host call inside one
    calls PyTorch's kernels from graft's executor thread. A failure nobody read is dropped."""
    try:
        _ops.wait()
    except RuntimeError:
        pass


atexit.register(_drain_at_exit)


def _hook_serialization():
    """Pickling a graft tensor (torch.save of it, of a state_dict, of an optimizer's state, of a
    Parameter; pickle) stores a plain CPU tensor: torch's _rebuild_tensor_v2 form with a CPU
    storage. The file then loads in any process, without graft, honours map_location and
    weights_only=True, and `.to(graft.device())` or load_state_dict brings it back. (Left alone,
    torch pickles a storage-less PrivateUse1 tensor through numpy and rebuilds it on its
    device, which only a process with graft can load.) The copy is a read: a pending value is synced. Each tensor is
    its own copy: two graft tensors that alias load as two tensors. copy.copy, which reduces
    the same way, gives a CPU copy too (clone() and copy.deepcopy stay on the device)."""
    orig = torch.Tensor._reduce_ex_internal
    if getattr(orig, "_graft_hooked", False):
        return

    def _reduce_ex_internal(self, proto):
        if self.device.type != DEVICE_TYPE:
            return orig(self, proto)
        torch.utils.hooks.warn_if_has_hooks(self)
        with torch.no_grad():
            cpu = self.detach().cpu()
        cpu.requires_grad_(self.requires_grad)
        return orig(cpu, proto)

    _reduce_ex_internal.__doc__ = orig.__doc__
    _reduce_ex_internal._graft_hooked = True
    torch.Tensor._reduce_ex_internal = _reduce_ex_internal


_hook_serialization()


def _hook_has_storage():
    """graft tensors carry a storage with no data (dynamo's fake tensors and AOTAutograd read its
    identity and size). PyTorch's Python paths that would copy a storage's bytes ask
    torch._C._has_storage first (copy.deepcopy: the storage path allocates on the device and
    crashed; pickling): for a graft tensor it answers no, so they take the branch meant for
    storage-less devices (deepcopy clones on the device)."""
    orig = torch._C._has_storage
    if getattr(orig, "_graft_hooked", False):
        return

    def _has_storage(t):
        return orig(t) and t.device.type != DEVICE_TYPE

    _has_storage._graft_hooked = True
    torch._C._has_storage = _has_storage


_hook_has_storage()

class trace:
    """Records graft's timeline while the block runs and writes it to path as Chrome trace-event
    JSON (open it in https://ui.perfetto.dev or chrome://tracing): each thread's syncs, native
    builds, steps with their kernels, GEMMs and fallbacks, and waits. Also a decorator-free
    pair: t = graft.trace(path); t.start(); ...; t.stop()."""

    def __init__(self, path):
        self.path = str(path)

    def start(self):
        _ops.trace_begin(self.path)
        return self

    def stop(self):
        global _last_trace
        _ops.trace_end()
        _last_trace = self.path

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


_last_trace = None


def report(path, trace=None, dump_dir=None, title="graft report"):
    """Writes one self-contained HTML page to path (no scripts, nothing fetched) and returns its
    path: graft's counters, and from a timeline trace (trace=, by default the last graft.trace
    recorded in this process) the steps, the slowest kernels with the ops each fused and their
    source lines, the compiles with their reasons and threads, the fallbacks with their time and
    bytes, and the waits; with the pictures of the graphs that took the time when they were
    dumped (dump_dir=, by default GRAFT_DUMP_DIR as it is now: pass the folder when dumping was
    turned off before the report). Also: python3 torch/graft/_report.py."""
    from . import _report
    trace = trace if trace is not None else _last_trace
    if trace is None:
        raise RuntimeError("graft.report: no trace to read: record one with graft.trace(path) first, or pass trace=")
    if not os.path.exists(str(trace)):
        raise RuntimeError("graft.report: the trace %s does not exist" % trace)
    dump_dir = dump_dir if dump_dir is not None else os.environ.get("GRAFT_DUMP_DIR")
    return _report.write(str(path), str(trace), metrics(), metrics_report(), dump_dir, title)


from . import _decomp  # noqa: E402  (after the library: it registers kernels on graft's key)

_decomp.install(_ops.lowered_ops(), _ops.count_lowering)


def _graft_tensors(obj, out, seen):
    """Appends the graft tensors in obj (nested dicts, lists, tuples, sets; a Module's
    parameters and buffers) to out."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if is_graft(obj):
            out.append(obj)
    elif isinstance(obj, torch.nn.Module):
        for v in obj.state_dict(keep_vars=True).values():
            _graft_tensors(v, out, seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _graft_tensors(k, out, seen)
            _graft_tensors(v, out, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _graft_tensors(v, out, seen)


def save(obj, f, **kwargs):
    """torch.save(obj, f, **kwargs) after materializing every graft tensor in obj as one graph.
    Graft tensors are stored as CPU tensors, so the file loads anywhere, without graft."""
    ts = []
    _graft_tensors(obj, ts, set())
    sync(ts)
    torch.save(obj, f, **kwargs)


def is_pending(t):
    """True while t holds IR not yet materialized."""
    return _ops.is_pending(t)


from . import _device_module  # noqa: E402  (torch.graft: needs _ops)
from . import _dynamo  # noqa: E402  (torch.compile(backend="graft"): needs _ops)

compiler = _dynamo.compiler
_dynamo.register()
from ._export import export, load_exported, load_tensors, save_tensors  # noqa: E402  (graft.export: needs _dynamo)

__all__ = ["device", "devices", "Device", "step", "sync", "metrics", "fallbacks", "reset_metrics", "metrics_report",
           "set_dump_dir", "manual_seed", "save", "wait_compiles", "wait", "is_pending", "last_compile_reason", "is_graft",
           "compiler", "export", "load_exported", "save_tensors", "load_tensors", "trace"]
