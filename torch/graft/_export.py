"""graft.export: a PyTorch model's inference graph and weights as one file that a C program runs
with libgraft alone (graft_load and graft_function_call in graft.h; examples/infer.c).

torch.export captures the model as aten ops; graft traces that graph once on its device, records
it as a function (graft_function_capture: the ops, their attributes, dtypes and shapes, and the
weights as constants) and writes it (graft_save: a versioned format with checksums, described in
src/api/function_file.c). graft.load_exported reads one back into Python.
"""
import torch

from ._dynamo import _device, _on_graft

_ops = torch.ops.graft


def _tensors(out):
    import torch.utils._pytree as pytree
    leaves = pytree.tree_leaves(out)
    bad = [type(v).__name__ for v in leaves if not isinstance(v, torch.Tensor)]
    if bad or not leaves:
        raise TypeError("graft.export: the model must return tensors (in a tuple, list or dict); "
                        "got %s" % (", ".join(bad) if bad else "nothing"))
    return leaves


def export(model, example_inputs, path):
    """Writes model's inference graph for example_inputs' shapes and dtypes, with its weights,
    to path. model: an nn.Module (put it in eval mode first: the graph is what the model
    computes now, batch norm's running statistics included) or a torch.export.ExportedProgram.
    Returns the output shapes. Later inputs must have the example's shapes and dtypes."""
    import torch.export as te
    example_inputs = tuple(example_inputs)
    if not all(isinstance(t, torch.Tensor) for t in example_inputs):
        raise TypeError("graft.export: example_inputs must be tensors")
    ep = model if isinstance(model, te.ExportedProgram) else te.export(model, example_inputs)
    dev = _device()
    gm = _on_graft(ep.module().to(dev))
    inputs = [t.detach().to(dev).contiguous() for t in example_inputs]
    _ops.sync(inputs)
    with torch.no_grad():
        outs = _tensors(gm(*inputs))
    fid = _ops.function_capture(inputs, outs)
    try:
        _ops.function_save(fid, str(path))
    finally:
        _ops.function_free(fid)
    return [tuple(o.shape) for o in outs]


class Exported:
    """A function graft.export wrote, loaded: call it with tensors of the example's shapes and
    dtypes (CPU tensors come back as CPU tensors; graft tensors stay on graft)."""

    def __init__(self, path, device=None):
        dev = _device() if device is None else torch.device(device)
        self.device = dev
        self.fid = _ops.function_load(str(path), dev.index or 0)

    def __call__(self, *args):
        on_cpu = any(a.device.type == "cpu" for a in args)
        ins = [a.to(self.device).contiguous() for a in args]
        outs = _ops.function_call(self.fid, ins)
        if on_cpu:
            _ops.sync(outs)
            outs = [o.cpu() for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __del__(self):
        try:
            _ops.function_free(self.fid)
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def load_exported(path, device=None):
    """The function graft.export wrote to path, on graft device `device` (default: cpu:0)."""
    return Exported(path, device)


def save_tensors(tensors, path):
    """Writes a dict of named tensors (a model's state_dict, say) to path in the file format
    graft_load_tensors reads from C (examples/train_mlp.c): weights trained in PyTorch train on
    or run in C, and back with load_tensors."""
    if not isinstance(tensors, dict) or not tensors:
        raise TypeError("graft.save_tensors: give a non-empty dict of name -> tensor")
    dev = _device()
    names, ts = list(tensors), []
    for k in names:
        v = tensors[k]
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise TypeError("graft.save_tensors: %r is not a str -> tensor entry" % (k,))
        ts.append(v.detach().to(dev).contiguous())
    _ops.sync(ts)
    fid = _ops.function_capture([], ts)
    try:
        for i, k in enumerate(names):
            _ops.function_set_output_name(fid, i, k)
        _ops.function_save(fid, str(path))
    finally:
        _ops.function_free(fid)


def load_tensors(path, device="cpu"):
    """The named tensors of a file graft_save_tensors (C) or save_tensors wrote, as a dict of
    tensors on device (default: CPU tensors)."""
    fid = _ops.function_load(str(path), 0)
    try:
        names = _ops.function_output_names(fid)
        outs = _ops.function_call(fid, [])
    finally:
        _ops.function_free(fid)
    _ops.sync(outs)
    return {(n or "output%d" % k): o.to(device) for k, (n, o) in enumerate(zip(names, outs))}
