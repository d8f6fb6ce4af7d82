"""torch.graft: the device module PyTorch looks up by the backend's name, as torch.cuda is for
"cuda". torch.manual_seed seeds graft's generator through manual_seed_all; the generated methods
(Tensor.is_graft, Tensor.graft(), Module.graft()) come with it."""
import sys
import types

import torch

from . import _ops, _seed64

_mod = types.ModuleType("torch.graft", __doc__)


def device_count():
    """Every graft device: the 4 CPU devices, then accelerators (asking loads the OpenCL runtime)."""
    return _ops.device_count()


def is_available():
    return True


def current_device():
    """The calling thread's current graft device (torch.graft.set_device, or a device guard)."""
    return _ops.current_device()


def set_device(device):
    idx = device.index if isinstance(device, torch.device) else device
    if isinstance(device, str):
        idx = torch.device(device).index
    if idx is not None:
        _ops.set_device(int(idx))


def manual_seed(seed):
    _ops.manual_seed(_seed64(seed))


def manual_seed_all(seed):
    """One generator serves every graft device."""
    _ops.manual_seed(_seed64(seed))


def _is_in_bad_fork():
    return False


def synchronize(device=None):
    """Waits for every queued step (graft.wait())."""
    _ops.wait()


for _f in (device_count, is_available, current_device, set_device, manual_seed, manual_seed_all,
           _is_in_bad_fork, synchronize):
    setattr(_mod, _f.__name__, _f)

if not hasattr(torch, "graft"):
    torch._register_device_module("graft", _mod)
if not hasattr(torch.Tensor, "is_graft"):
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                          for_packed_sequence=True, for_storage=False)
sys.modules.setdefault("torch.graft", getattr(torch, "graft"))
