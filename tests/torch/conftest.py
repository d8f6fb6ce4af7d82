# Tests for graft's PyTorch device. Run: cd /work/main && PYTHONPATH=torch /usr/bin/python3 -m pytest -q tests/torch
import os
import sys

_PKG = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "torch"))
if _PKG not in sys.path:
    sys.path.insert(0, _PKG)  # the directory holding the `graft` package (never the repo root)
