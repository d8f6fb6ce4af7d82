#!/bin/sh
# The GPU check (issue 35): one command, on a machine with an NVIDIA GPU, that builds graft and
# its PyTorch bridge there and checks graft's cuda device against the reference and PyTorch:
#   scripts/gpu-check.sh prepare   here, with Debian's package index: fetches what graft's build
#                                  needs and a GPU machine may lack (zlib's headers) into
#                                  .gpu-deps/ (ignored by git; carry it to the GPU machine)
#   scripts/gpu-check.sh           there: writes under $OUT (default ./gpu-check-out) at most 8
#                                  files: summary.txt (every stage's verdict and time), build.log,
#                                  suites.log, parity.log, bench.txt (BENCH cuda_* lines), env.txt
# Stages (each bounded by a timeout; the whole fits in 8 minutes on 16 cores): env; build
# (libgraft, then the bridge in the background while the C suites run); suites (the op,
# composite and gradient suites and the fuzz seeds with every input on cuda:0, GRAFT_COMPILE=sync:
# each graph compiled by NVRTC and compared with the reference kernels); parity (resnet18 and the
# GPT-style LM, 5 steps against float64, bench/gpu_check.py parity); bench (bench/gpu_check.py
# bench). Exit 0 when every stage passed.
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
DEPS=$ROOT/.gpu-deps

if [ "${1:-}" = prepare ]; then
  mkdir -p "$DEPS/debs" && cd "$DEPS/debs" && apt-get download zlib1g-dev || exit 1
  for f in *.deb; do dpkg-deb -x "$f" "$DEPS/root"; done
  echo "gpu-check: $DEPS ready: carry .gpu-deps to the GPU machine"
  exit 0
fi

OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
JOBS=$(nproc 2>/dev/null || echo 4)
PY=${PY:-$(command -v python3)}
START=$(date +%s)
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }
DEADLINE=$((START + 470)) # the whole check ends within 8 minutes, whatever hangs
# stage NAME SECONDS LOG CMD...: runs CMD with a timeout (at most what is left before the
# deadline), appending to LOG; notes the verdict.
stage() {
  name=$1 secs=$2 log=$3
  shift 3
  t0=$(date +%s)
  left=$((DEADLINE - t0))
  [ "$secs" -gt "$left" ] && secs=$left
  if [ "$secs" -lt 5 ]; then note "$name: skipped (the 8 minutes are spent)"; FAILED=1; return 1; fi
  echo "== $name: $*" >>"$log"
  timeout "$secs" "$@" >>"$log" 2>&1
  rc=$?
  verdict=ok
  [ $rc = 0 ] || { verdict="FAILED (rc $rc$([ $rc = 124 ] && echo ", timed out after ${secs}s"))"; FAILED=1; }
  note "$name: $verdict in $(($(date +%s) - t0)) s"
  return $rc
}

# ---- env: the GPU, the driver, CUDA's libraries (the toolkit's, else the wheels' beside torch)
{
  nvidia-smi -L 2>&1; nvcc --version 2>&1 | tail -n1; "$PY" --version 2>&1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" 2>&1
  cat /etc/os-release 2>/dev/null | head -n2; gcc --version | head -n1
} >"$OUT/env.txt"
CUDA_LIBS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $("$PY" -c "import nvidia, os; print(' '.join(os.path.join(p, s, 'lib') for p in nvidia.__path__ for s in ('cu13', 'cublas', 'cuda_nvrtc')))" 2>/dev/null); do
  [ -d "$d" ] && CUDA_LIBS="$CUDA_LIBS${CUDA_LIBS:+:}$d"
done
export LD_LIBRARY_PATH="$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in $(echo "$CUDA_LIBS" | tr : ' '); do
  [ -z "${GRAFT_NVRTC:-}" ] && for f in "$d"/libnvrtc.so.13 "$d"/libnvrtc.so.12; do
    [ -e "$f" ] && export GRAFT_NVRTC="$f" && break; done
done
echo "CUDA libraries: $CUDA_LIBS; GRAFT_NVRTC=${GRAFT_NVRTC:-}" >>"$OUT/env.txt"
note "gpu-check on $(nvidia-smi -L 2>/dev/null | head -n1)"

# zlib's headers and link name where the machine lacks them (prepare carried them)
if [ ! -e /usr/include/zlib.h ] && [ -d "$DEPS/root/usr/include" ]; then
  mkdir -p "$DEPS/lib"
  z=$(ldconfig -p | sed -n 's/.*libz.so.1 (libc6,x86-64) => //p' | head -n1)
  [ -n "$z" ] && ln -sf "$z" "$DEPS/lib/libz.so"
  export CPATH="$DEPS/root/usr/include${CPATH:+:$CPATH}" LIBRARY_PATH="$DEPS/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi

# ---- build: the library, then the bridge in the background while the C suites build and run
SUITES="test_ops_elementwise test_ops_shape test_ops_nn test_composite test_grad test_op_coverage"
stage build 150 "$OUT/build.log" make -j"$JOBS" lib MPI=0 || { note "gpu-check: the build failed"; exit 1; }
(timeout 240 make -C torch PY="$PY" -j"$JOBS" >"$OUT/bridge.log" 2>&1; echo $? >"$OUT/bridge.rc") &
BRIDGE=$!
stage build-tests 120 "$OUT/build.log" make -j"$JOBS" MPI=0 $(for t in $SUITES test_device; do echo build/tests/$t; done) build/fuzz_graphs

# ---- suites on cuda:0, each graph compiled (NVRTC) and checked against the reference kernels
# (test_op_coverage: every op x dtype through the CUDA compiler)
stage device 20 "$OUT/suites.log" ./build/tests/test_device --probe cuda || { note "gpu-check: no CUDA device (suites.log says why)"; }
for t in $SUITES; do
  stage "suite $t" $([ $t = test_op_coverage ] && echo 120 || echo 60) "$OUT/suites.log" \
    env GRAFT_TEST_DEVICE=cuda GRAFT_COMPILE=sync ./build/tests/$t
done
stage "fuzz seeds" 90 "$OUT/suites.log" env GRAFT_TEST_DEVICE=cuda GRAFT_COMPILE=sync ./build/fuzz_graphs --test-seeds

# ---- through PyTorch: parity against float64, then the benchmarks
wait $BRIDGE
cat "$OUT/bridge.log" >>"$OUT/build.log" && rm -f "$OUT/bridge.log"
if [ "$(cat "$OUT/bridge.rc" 2>/dev/null)" = 0 ]; then
  note "bridge: ok"
  export PYTHONPATH="$ROOT/torch${PYTHONPATH:+:$PYTHONPATH}"
  # what is left of the 8 minutes goes to parity (half of it at most), then the benchmarks
  left=$((DEADLINE - $(date +%s)))
  half=$((left / 2)); [ $half -gt 150 ] && half=150
  stage parity $half "$OUT/parity.log" env GPU_CHECK_BUDGET=$half "$PY" bench/gpu_check.py parity
  stage bench 300 "$OUT/bench.txt" "$PY" bench/gpu_check.py bench
else
  note "bridge: FAILED (build.log); parity and bench skipped"
  FAILED=1
fi
rm -f "$OUT/bridge.rc"
grep -h "^BENCH\|PARITY\|passed, \|fuzz --test-seeds" "$OUT/suites.log" "$OUT/parity.log" "$OUT/bench.txt" 2>/dev/null >>"$SUMMARY"
note "gpu-check: $([ $FAILED = 0 ] && echo passed || echo FAILED) in $(($(date +%s) - START)) s"
exit $FAILED
