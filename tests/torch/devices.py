"""The graft devices that device-parametrized tests run on: graft's cpu:0 always, and the first
OpenCL device when graft.devices() lists one (otherwise that parameter is skipped, saying why)."""
import pytest

import graft

OPENCL = [d for d in graft.devices() if d.kind == "opencl"]
NO_OPENCL = ("no OpenCL device: graft.devices() lists none (it needs an OpenCL runtime, "
             "libOpenCL.so.1, and a driver listing a device, e.g. Debian's pocl-opencl-icd)")
needs_opencl = pytest.mark.skipif(not OPENCL, reason=NO_OPENCL)


def device_params():
    """pytest params "cpu" and "opencl" (graft.device(kind) of each), opencl skipped without one."""
    return [pytest.param("cpu", id="cpu"), pytest.param("opencl", id="opencl", marks=needs_opencl)]
