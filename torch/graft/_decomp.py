"""PyTorch's own decompositions before the CPU fallback.

An aten op graft has no lowering for would run on PyTorch's CPU kernel: the pending graph is cut
there (synced, copied to the CPU and back). When PyTorch has a decomposition of the op into core
aten ops (torch._decomp.core_aten_decompositions, the table torch.compile's backends use), graft
registers it as the op's kernel on its device instead: the op becomes the graft ops it
decomposes into, inside the graph. Counted in graft.metrics() as 'decomposed::aten::<op>'.

Only functional ops that reach the backend are taken: not the lowered ones, not in-place or out=
forms (their decompositions assume functionalization), not views (a decomposition copies), not
CompositeImplicitAutograd ones (they decompose above autograd already), and not ops without a
tensor argument. CompositeExplicitAutograd ones are taken: their kernels mostly call an out=
variant that only the CPU implements (nan_to_num -> nan_to_num.out), i.e. the fallback; those
in KERNEL_FIRST are not (their kernels run on graft as they are, faster). GRAFT_DECOMP=0 leaves every unlowered op to the fallback (the A/B switch).
"""
import os

import torch

# Decompositions that differ from PyTorch's CPU kernel on graft (found by tests/torch/test_opinfo.py):
# these stay on the fallback.
EXCLUDED = {
    "aten::index_fill.int_Scalar": "repeated indices: the decomposition's index_put differs",
    "aten::index_fill.int_Tensor": "repeated indices: the decomposition's index_put differs",
    "aten::max_unpool2d": "repeated indices: which write wins is the CPU kernel's order",
    "aten::max_unpool3d": "repeated indices: which write wins is the CPU kernel's order",
    "aten::linspace.Scalar_Tensor": "the decomposition makes its steps on the CPU",
    "aten::linspace.Tensor_Scalar": "the decomposition makes its steps on the CPU",
    "aten::linspace.Tensor_Tensor": "the decomposition makes its steps on the CPU",
    "aten::logspace.Scalar_Tensor": "the decomposition makes its steps on the CPU",
    "aten::logspace.Tensor_Scalar": "the decomposition makes its steps on the CPU",
    "aten::logspace.Tensor_Tensor": "the decomposition makes its steps on the CPU",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "the CPU's own kernel (graft lowers SDPA's math path)",
}
# CompositeExplicitAutograd ops whose own C++ kernel calls only ops graft lowers: that kernel runs
# them through the dispatcher in a few microseconds, where the Python decomposition costs ~40 us a
# call (every training step calls ones_like for the loss's gradient, stack in clip_grad_norm_).
# tests/torch/test_ops.py checks each runs on graft with no fallback and matches the CPU.
KERNEL_FIRST = {
    "aten::empty_like", "aten::ones_like", "aten::zeros_like", "aten::full_like",
    "aten::new_zeros", "aten::new_ones", "aten::new_full", "aten::new_empty",
    "aten::stack", "aten::_safe_softmax", "aten::binary_cross_entropy_with_logits",
}
_LIB = None
TAKEN = []  # the ops registered, "aten::name[.overload]"


def _eligible(op, lowered):
    key = op.name()
    s = op._schema
    if key in lowered or key in EXCLUDED or key in KERNEL_FIRST:
        return False
    if s.is_mutable or any(r.alias_info for r in s.returns):
        return False
    if op.overloadpacket.__name__.endswith("_"):
        return False
    if torch._C._dispatch_has_kernel_for_dispatch_key(key, "CompositeImplicitAutograd"):
        return False  # decomposed above autograd already
    return any("Tensor" in str(a.type) for a in s.arguments)


def _kernel(key, fn, count):
    def run(*args, **kwargs):
        count(key)
        return fn(*args, **kwargs)
    return run


def install(lowered, count):
    """Registers the decompositions on graft's device key; lowered: the ops graft lowers;
    count(name): counts one decomposed call in graft's metrics."""
    global _LIB
    if _LIB is not None or os.environ.get("GRAFT_DECOMP") == "0":
        return
    from torch._decomp import core_aten_decompositions
    lowered = set(lowered)
    _LIB = torch.library.Library("aten", "IMPL")
    for op, fn in core_aten_decompositions().items():
        if isinstance(op, torch._ops.OpOverload) and _eligible(op, lowered):
            _LIB.impl(op, _kernel("decomposed::" + op.name(), fn, count), "PrivateUse1")
            TAKEN.append(op.name())
