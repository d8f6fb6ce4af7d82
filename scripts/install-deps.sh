#!/bin/sh
# Installs what graft needs; idempotent (does nothing when all is present).
#  1. Debian packages (the same names on Debian 12 and 13): the C toolchain and checkers;
#     zlib (CRC-32 of saved functions); OpenBLAS for matmul, and oneDNN (libdnnl) whose f32
#     GEMM is the library kernel beside graft's own where installed; Open MPI for the collectives of
#     data-parallel training (src/dist,
#     graft.distributed); pocl (OpenCL on the CPU), found through the ICD loader (ocl-icd: graft
#     opens libOpenCL.so.1 at run time and builds against the CL headers), clinfo to list the
#     devices, CLBlast for the OpenCL backend's contractions; Graphviz (GRAFT_DUMP_DIR's
#     pictures of compiled graphs are rendered with its dot); Chromium (headless: the test that
#     graft.report's page loads with no console error, and its screenshot); python3-venv for
#     step 2.
#  2. A virtual environment at .venv/ in the checkout (the C library's build needs no Python):
#     PyTorch 2 and torchvision (the whole-model parity tests' models), numpy, pytest,
#     scikit-learn (its bundled digits data set for the demo), and graft's Python package as a
#     path entry to torch/ (graft.pth), so `.venv/bin/python -c "import graft"` works from any
#     folder once `make torch` has built the bridge.
#     torch 2.14.1 with torchvision 0.29.1: on these machines pip takes both from the local disk
#     (the wheel folder's torch 2.13.0 is a CPU build, but the only torchvision 0.28.0 here is
#     built against CUDA torch and fails to import beside it: 'operator torchvision::nms does not
#     exist'). TORCH_SPEC overrides the pair (e.g. "torch==2.13.0" for a bridge-only check).
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PKGS="gcc g++ make valgrind pkg-config zlib1g-dev libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin"
PKGS="$PKGS pocl-opencl-icd ocl-icd-opencl-dev opencl-c-headers clinfo libclblast-dev graphviz chromium python3 python3-venv"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $missing
fi

# The Python that makes the venv: $PYTHON, else the python3 on PATH (3.9 or newer).
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.1 torchvision==0.29.1"}
REQS="$TORCH_SPEC numpy pytest scikit-learn"
VENV=$ROOT/.venv
STAMP=$VENV/.graft-requirements
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REQS" ] \
   && [ -f "$VENV/graft-pth-ok" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo "installing into $VENV: $REQS"
# pip's log goes to a file (this machine's index settings make it print a warning per missing
# folder), shown when the install fails.
if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check $REQS > "$VENV/pip.log" 2>&1; then
  cat "$VENV/pip.log"
  echo "install-deps.sh: pip install $REQS into $VENV failed" >&2
  exit 1
fi
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$ROOT/torch" > "$SITE/graft.pth"
touch "$VENV/graft-pth-ok"
echo "$REQS" > "$STAMP"
