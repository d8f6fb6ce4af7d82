"""torch.compile(model, backend="graft"): dynamo's graphs run on graft.

Dynamo captures the model's Python into FX graphs; AOTAutograd splits each into a forward and a
backward graph of aten ops. graft runs each such graph as a *function* (graft_function_capture /
graft_function_call in graft.h): the first call with a given signature (shapes, dtypes, devices of
its tensors) traces the graph through graft's bridge once and records it; every later call makes
the recorded graph again over the new inputs, with no per-op Python, dispatcher or bridge work, and
the compile cache finds its compiled code. Calls stay asynchronous like the lazy device's ops: a
result is read when the caller reads it.

Tensors on a graft device are used as they are. CPU tensors are read in place by graft's cpu:0
device where their layout allows (contiguous and 64-byte aligned, as PyTorch allocates them; else
copied), and the results are handed back without a copy, so each such call waits for its results:
a model on graft's device also runs its optimizer in graft and never waits. Guards, recompiles and graph breaks stay dynamo's; graft's metrics count its compiles.
"""
import torch

_ops = torch.ops.graft


def _device():
    from . import device
    return device()


# The graph was traced with CPU kernels' strides (the CPU flash attention returns its output
# permuted, so a transpose of it is contiguous and viewed); graft's results may lay out
# otherwise. The graphs are functional, so a view there is a reshape: it copies only where a
# view cannot be taken.
_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _on_graft(gm):
    """gm with its CPU constants and CPU factory calls (arange, full, empty with device=cpu)
    on graft's device (the graph's tensors all live there), and views as reshapes."""
    dev = _device()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            owner, _, name = node.target.rpartition(".")
            mod = gm.get_submodule(owner) if owner else gm
            t = getattr(mod, name, None)
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                setattr(mod, name, t.to(dev))
        elif node.op == "call_function":
            if node.target in _VIEWS:  # strides are CPU kernels' (see _VIEWS)
                node.target = torch.ops.aten.reshape.default
            d = node.kwargs.get("device")
            if d is not None and torch.device(d).type == "cpu":
                node.kwargs = {**node.kwargs, "device": dev}
    gm.recompile()
    return gm


class _Function:
    """One aten FX graph run on graft: traced once per input signature, then called."""

    def __init__(self, gm):
        self._boxed_call = True
        self.gm = _on_graft(gm)
        self.dev = _device()
        self.last = self.last_sig = self.last_shapes = self.last_consts = None  # the last call's record
        self.warned_sizes = False
        self.calls = {}  # signature -> (function id, output layout)
        # a forward's outputs saved for the backward stay on graft even when the caller's
        # tensors are on the CPU: the backward takes them back as they are
        out = [n for n in gm.graph.nodes if n.op == "output"]
        desc = out[0].meta.get("desc") if out else None
        self.saved = [type(d).__name__.startswith("SavedForBackwards") for d in desc or []]

    def __del__(self):
        for fid, _ in getattr(self, "calls", {}).values():
            try:
                _ops.function_free(fid)
            except Exception:  # interpreter shutdown: the library may be gone
                pass

    _boxed_call = True  # AOTAutograd's convention: one list, which the callee empties

    def __call__(self, *args):
        if len(args) == 1 and type(args[0]) is list:  # boxed: the callee empties the list
            boxed = args[0]
            args = list(boxed)
            boxed.clear()
        dev = self.dev
        Tensor = torch.Tensor
        on_cpu = False
        gargs = []
        for a in args:
            if isinstance(a, Tensor) and a.device.type != "graft":
                on_cpu = True  # read in place where graft can (no copy): the call waits below
                a = _ops.host_borrow(a, dev.index or 0) if a.device.type == "cpu" else a.to(dev)
            gargs.append(a)
        tens = [a for a in gargs if isinstance(a, Tensor)]
        hit = self.last  # dynamo guards the graph's shapes: the last signature, as a rule
        consts = [a for a in gargs if not isinstance(a, Tensor)]  # a dynamic size is an int
        if (hit is None or len(self.calls) > 1 or consts != self.last_consts or
                any((a.shape, a.dtype, a.device) != s for a, s in zip(tens, self.last_shapes))):
            # graft's values have no strides (a view is its own value): shapes, dtypes, devices
            sig = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, Tensor)
                        else ("const", a) for a in gargs)
            hit = self.calls.get(sig)
        else:
            sig = self.last_sig
        if hit is None or hit[0] is None:  # new, or not recordable: traced (again)
            outs, layout = self._record(gargs, tens, sig if hit is None else None)
        else:
            fid, layout = hit
            try:
                got = _ops.function_call(fid, tens)
            except RuntimeError as e:  # inputs that were one tensor when recorded, two now
                if "were the same tensor" not in str(e):
                    raise
                outs, _ = self._record(gargs, tens, None)
            else:
                outs = [got[i] if isinstance(i, int) else i[1] for i in layout]
                self.last, self.last_sig, self.last_consts = hit, sig, consts
                self.last_shapes = [(a.shape, a.dtype, a.device) for a in tens]
        if on_cpu:  # the results the caller sees are read back, all outputs in one graph
            on_graft = [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor)
                        and o.device.type == "graft"]
            back = [i for i in on_graft if not (i < len(self.saved) and self.saved[i])]
            _ops.sync([outs[i] for i in on_graft])
            # every output, saved ones too: until the graph has run it may read the inputs lent
            # to it (a small output is filled early, before the rest of the graph runs)
            _ops.wait()
            for i in back:  # graft's buffers, no copy (host_view copies bytes others read)
                outs[i] = _ops.host_view(outs[i])
        return tuple(outs)

    def _record(self, gargs, tens, sig):
        # the function's parameters are data leaves (graft.h): synced first. Each its own copy:
        # an input that is a view of another tensor (a slice of a parameter, saved by the
        # forward on graft's device) would be read through that tensor's value, which the
        # record would keep as a constant (a stale parameter at later calls)
        fresh = [t.clone(memory_format=torch.contiguous_format) for t in tens]
        _ops.sync(fresh)
        it = iter(fresh)
        gargs = [next(it) if isinstance(a, torch.Tensor) else a for a in gargs]
        with torch.no_grad():
            outs = self.gm(*gargs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        # each tensor output by position in the function's outputs; anything else as it is
        layout, out_t = [], []
        for o in outs:
            if isinstance(o, torch.Tensor):
                layout.append(len(out_t))
                out_t.append(o)
            else:
                layout.append(("const", o))
        if sig is not None and out_t and all(t.device.type == "graft" for t in out_t):
            if self.calls and not self.warned_sizes:  # dynamic dims: a graph per size, said once
                self.warned_sizes = True
                old = next(iter(self.calls))
                diff = ["input %d: %s -> %s" % (k, tuple(a[0]), tuple(b[0])) for k, (a, b)
                        in enumerate(zip(old, sig)) if a[0] != "const" and a[0] != b[0]]
                import warnings
                warnings.warn("graft: a torch.compile graph is recorded again for new sizes (%s): "
                              "graft records a graph per size; from a third size on it builds "
                              "them from size-generic kernels, the sizes that vary passed at run "
                              "time (compiled once, not per size)" % ", ".join(diff[:4]),
                              stacklevel=3)
            # later calls pass the inputs as they come (a view's value has the copy's shape)
            try:
                self.calls[sig] = (_ops.function_capture(fresh, out_t), layout)
            except RuntimeError as e:  # a sync inside the graph: traced at every call
                if "cannot be recorded" not in str(e):
                    raise
                self.calls[sig] = (None, layout)
                _note_unrecorded(str(e))
        return outs, layout


_UNRECORDED = []  # why graphs could not be recorded (each is traced at every call)


def _note_unrecorded(why):
    import warnings
    if len(_UNRECORDED) < 16:
        _UNRECORDED.append(why)
    warnings.warn("graft: a compiled graph is traced at every call: " + why, stacklevel=3)


def _compile_fx(gm, example_inputs):
    return _Function(gm)


def compiler(gm, example_inputs):
    """The dynamo backend: torch.compile(model, backend="graft") or backend=graft.compiler."""
    from torch._dynamo.backends.common import aot_autograd
    from torch.nn.attention import SDPBackend, sdpa_kernel
    # AOTAutograd traces here with CPU kernels' choices: scaled_dot_product_attention would
    # become the CPU flash kernel and its backward, which graft does not lower (and torch's
    # decomposition of that kernel, made for export, gives wrong gradients in training: a GPT
    # block's qkv weight off by 6x its norm). The math form is matmuls and a softmax that graft
    # fuses, and AOTAutograd derives its backward from them.
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    with sdpa_kernel([SDPBackend.MATH]):
        return aot_autograd(fw_compiler=_compile_fx, bw_compiler=_compile_fx,
                            partition_fn=min_cut_rematerialization_partition)(gm, example_inputs)


def register():
    """Registers the backend under the name "graft" (once; import graft does it)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "graft" not in _BACKENDS:
        register_backend(compiler, name="graft")
