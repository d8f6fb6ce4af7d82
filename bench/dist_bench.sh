#!/bin/sh
# Collective benchmarks (make bench): graft's all_reduce against bare MPI, and the data-parallel
# efficiency of an MLP training step: (1 process x 1 thread, whole batch) / (2 processes x 1
# thread, half the batch each); ideal 2.0.
#   sh bench/dist_bench.sh [build/bench/bench_dist] [BATCH]
set -eu
BIN=${1:-build/bench/bench_dist}
BATCH=${2:-512}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One thread per process: graft's pool and OpenBLAS.
export GRAFT_THREADS=1 OPENBLAS_NUM_THREADS=1
MPIRUN="mpirun --oversubscribe"
# Open MPI's allreduce allocates a message-sized temporary per call; above glibc's 32 MB mmap
# ceiling every call maps it afresh and page-faults it in (~250 ms for 64 MB on this VM), which
# would swamp both figures: keep freed memory in the heap for this comparison.
$MPIRUN -np 2 -x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=4294967295 "$BIN" allreduce
# best of 3 runs (by step time): other load on the machine only ever adds time
best() {
  for _ in 1 2 3; do $MPIRUN -np "$1" "$BIN" mlp "$BATCH"; done |
    sort -t= -k3 -n | head -1
}
one=$(best 1)
two=$(best 2)
echo "$one"
echo "$two"
t1=$(echo "$one" | sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p')
t2=$(echo "$two" | sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p')
ar=$(echo "$two" | sed -n 's/.*allreduce_ms=\([0-9.]*\).*/\1/p')
awk -v a="$t1" -v b="$t2" -v r="$ar" -v n="$BATCH" 'BEGIN {
  printf "BENCH dist_mlp_train_step efficiency=%.2f one_ms=%.2f two_ms=%.2f allreduce_ms=%.2f batch=%d\n", a / b, a, b, r, n }'
