#!/bin/sh
# make install / make uninstall into a temporary prefix (run by `make check-install`, part of
# `make test`; needs `make lib torch` first):
#  - the Python package imports from another folder with only PYTHONPATH=<its dist-packages>
#    (the installed copy, not torch/graft) and runs an op on graft.device();
#  - examples/mlp.c compiles against the installed header and library through pkg-config, and runs;
#  - the folder make install picks for the Python's own prefix is on its sys.path;
#  - make uninstall leaves no graft file in the prefix.
set -eu
MAKE=${MAKE:-make}
PY=${PY:-$(pwd)/.venv/bin/python}
ROOT=$(pwd)
TMP=$(mktemp -d /tmp/graft-install-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
P=$TMP/prefix
fail() { echo "check_install: $*" >&2; exit 1; }

$MAKE --no-print-directory -s install PREFIX="$P" PY="$PY" > "$TMP/install.log" 2>&1 \
  || { cat "$TMP/install.log"; fail "make install PREFIX=$P failed"; }
PYDIR=$($MAKE --no-print-directory -s print-pythondir PREFIX="$P" PY="$PY")
for f in lib/libgraft.so lib/libgraft.a include/graft.h lib/pkgconfig/graft.pc; do
  [ -f "$P/$f" ] || fail "make install did not install $f"
done
[ -f "$PYDIR/graft/__init__.py" ] && [ -f "$PYDIR/graft/_graft_C.so" ] \
  || fail "make install did not install the Python package into $PYDIR/graft"

# The Python package, from a folder that is not the repository.
(cd /tmp && PYTHONPATH="$PYDIR" "$PY" -c "
import os, sys, torch, graft
want = os.path.realpath(sys.argv[1])
assert os.path.realpath(graft.__file__).startswith(want + os.sep), (graft.__file__, want)
assert os.path.realpath(graft._LIB).startswith(want + os.sep), (graft._LIB, want)
x = torch.arange(4.0).to(graft.device())
y = (x * 2 + 1).sum()
graft.step()
assert y.device.type == graft.DEVICE_TYPE and float(y.cpu()) == 16.0, y.cpu()
print('check_install: import graft from', os.path.dirname(graft.__file__), '-> (2x+1).sum() =', float(y.cpu()))
" "$PYDIR") || fail "the installed Python package did not import or run"

# The C example, built only from what was installed.
CFLAGS_LIBS=$(PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --cflags --libs graft) \
  || fail "pkg-config graft failed with PKG_CONFIG_PATH=$P/lib/pkgconfig"
case "$CFLAGS_LIBS" in *"$P"*) ;; *) fail "pkg-config graft does not point into $P: $CFLAGS_LIBS";; esac
mkdir "$TMP/c" && cp examples/mlp.c "$TMP/c/"
(cd "$TMP/c" && ${CC:-cc} -std=c11 mlp.c $CFLAGS_LIBS -lm -o mlp) || fail "examples/mlp.c did not build against $P"
LD_LIBRARY_PATH="$P/lib" ldd "$TMP/c/mlp" | grep -q "$P/lib/libgraft.so" || fail "mlp is not linked to $P/lib/libgraft.so"
(cd "$TMP/c" && LD_LIBRARY_PATH="$P/lib" GRAFT_COMPILE=off ./mlp > out.txt) || fail "mlp built from the install failed"
echo "check_install: examples/mlp.c built with pkg-config against $P and ran"

# Where an install into the Python's own prefix goes is where that Python looks.
pre=$("$PY" -c 'import sys; print(sys.prefix)')
d=$($MAKE --no-print-directory -s print-pythondir PREFIX="$pre" PY="$PY")
"$PY" -c "import sys; sys.exit(sys.argv[1] not in sys.path)" "$d" \
  || fail "make install PREFIX=$pre would put the package in $d, not on $PY's sys.path"

$MAKE --no-print-directory -s uninstall PREFIX="$P" PY="$PY" > "$TMP/uninstall.log" 2>&1 \
  || { cat "$TMP/uninstall.log"; fail "make uninstall PREFIX=$P failed"; }
left=$(find "$P" ! -type d)
[ -z "$left" ] || fail "make uninstall left files in $P: $left"
echo "check_install: make uninstall removed everything it installed"
