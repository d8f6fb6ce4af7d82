#!/bin/sh
# Installs the Debian packages graft needs; idempotent (does nothing when all are present).
set -e
# C toolchain and checkers; OpenBLAS for matmul; Debian's PyTorch, pytest and scikit-learn
# (its bundled digits data set) for the PyTorch device, its tests and the demo; torchvision for
# the whole-model parity tests (tests/torch/test_model_parity.py); Open MPI for the collectives
# of data-parallel training (src/dist, graft.distributed). OpenCL: pocl (OpenCL on the CPU) is
# the OpenCL device make check-opencl tests on, found through the ICD loader (ocl-icd; graft
# opens libOpenCL.so.1 at run time and builds against the CL headers); clinfo lists the devices
# (clinfo -l); CLBlast is the OpenCL BLAS for the OpenCL backend's contractions.
PKGS="gcc g++ make valgrind pkg-config libopenblas-dev python3 python3-torch python3-torchvision python3-pytest python3-numpy python3-sklearn libopenmpi-dev openmpi-bin"
PKGS="$PKGS pocl-opencl-icd ocl-icd-opencl-dev opencl-c-headers clinfo libclblast-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $missing
