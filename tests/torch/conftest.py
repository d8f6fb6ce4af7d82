# Tests for graft's PyTorch device. Run: .venv/bin/python -m pytest -q tests/torch
# (the venv's graft.pth puts torch/ on the path; this file does too, for any other Python).
#
# known_failures.txt lists the tests that do not pass yet on the PyTorch the venv carries, one
# per line: `<node id> | <reason>`. Each is marked xfail(strict=True): it still runs, and
# passing makes it fail (XPASS), so the list only ever shrinks to what really fails.
import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_PKG = os.path.abspath(os.path.join(_HERE, "..", "..", "torch"))
if _PKG not in sys.path:
    sys.path.insert(0, _PKG)  # the directory holding the `graft` package (never the repo root)


def _known_failures():
    out = {}
    with open(os.path.join(_HERE, "known_failures.txt")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            node, _, reason = line.partition("|")
            node, reason = node.strip(), reason.strip()
            if not reason:
                raise ValueError("known_failures.txt: %r has no reason" % node)
            out[node] = reason
    return out


KNOWN_FAILURES = _known_failures()


def pytest_collection_modifyitems(config, items):
    seen = set()
    for item in items:
        nid = item.nodeid.split("tests/torch/", 1)[-1]
        reason = KNOWN_FAILURES.get(nid)
        if reason is not None:
            seen.add(nid)
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
