#!/bin/sh
# Collectives across 2 processes under mpirun (make check-dist, part of make test):
#   parity   data-parallel MLP and CNN == one process on the whole batch (tests/test_dist.c)
#   dtypes   every dtype (f16/bf16 through graft's MPI ops), broadcast and all_gather; traced,
#            each rank's collectives are spans with its rank
#   mismatch a rank reducing another shape gets a clear error on every rank
#   stall    a rank that stops answering is named by the other within GRAFT_DIST_TIMEOUT
#   kill     a rank killed mid-training ends the whole job in bounded time, naming it
#   flood    a rank stopped (SIGSTOP) at a random point of back-to-back collectives: whether
#            it stops before the signatures or inside the data transfer (the watchdog), the
#            job ends in bounded time
# Usage: tests/check_dist.sh BIN (a build of tests/test_dist.c). Exits 1 naming each failure.
set -u
BIN=${1:?usage: check_dist.sh BIN}
if ! command -v mpirun > /dev/null; then
  echo "check_dist: mpirun not found (scripts/install-deps.sh installs openmpi-bin)" >&2
  exit 1
fi
# We run as root in CI; Open MPI refuses that unless told. MPI's own allocations are not
# freed at exit, so the leak check (on in check-asan for graft's own world-of-one run) is off.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
MPIRUN="mpirun --oversubscribe -np 2"
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
fail=0

# run NAME LIMIT_S ARGS...: runs the job under a hard limit; sets rc, secs, and $tmp/NAME.
run() {
  name=$1 limit=$2
  shift 2
  t0=$(date +%s)
  timeout -k 5 "$limit" $MPIRUN "$@" > "$tmp/$name" 2>&1
  rc=$?
  secs=$(($(date +%s) - t0))
}

bad() {
  echo "check_dist: $1" >&2
  sed 's/^/    /' "$tmp/$2" >&2
  fail=1
}

for model in mlp cnn; do
  run "parity_$model" 300 "$BIN" parity "$model"
  if [ $rc -ne 0 ] || [ "$(grep -c "parity $model" "$tmp/parity_$model")" -ne 2 ]; then
    bad "parity $model failed (exit $rc)" "parity_$model"
  else
    grep "rank 0/2" "$tmp/parity_$model"
  fi
done

# traced per rank (GRAFT_TRACE): each rank's collectives are spans naming their rank
run dtypes 120 sh -c 'GRAFT_TRACE="$0.$OMPI_COMM_WORLD_RANK.json" exec "$1" dtypes' "$tmp/trace" "$BIN"
if [ $rc -ne 0 ] || [ "$(grep -c "dtypes ok" "$tmp/dtypes")" -ne 2 ]; then
  bad "every dtype, broadcast and all_gather on 2 ranks (exit $rc)" dtypes
else
  grep -m1 "dtypes ok" "$tmp/dtypes"
fi
for r in 0 1; do
  if ! python3 -c 'import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("cat") == "collective"]
names = {e["name"].split("(")[0] for e in ev}
assert {"all_reduce", "broadcast", "all_gather"} <= names, names
assert all(e["args"]["rank"] == int(sys.argv[2]) and e["args"]["world"] == 2 and e["args"]["bytes"] >= 0 for e in ev)
print("trace of rank %s: %d collectives, each a span with its rank" % (sys.argv[2], len(ev)))' "$tmp/trace.$r.json" $r > "$tmp/trace_check" 2>&1; then
    bad "rank $r's trace lacks its collectives" trace_check
  else
    cat "$tmp/trace_check"
  fi
done

run mismatch 120 "$BIN" mismatch
if [ $rc -ne 0 ] || [ "$(grep -c "expected error: ranks disagree" "$tmp/mismatch")" -ne 2 ]; then
  bad "mismatched shapes: want the disagreement error on both ranks (exit $rc)" mismatch
else
  echo "mismatch: both ranks got: $(grep -m1 -o 'ranks disagree.*' "$tmp/mismatch" | cut -c1-100)..."
fi

# A stalled rank: the survivor must name it within the timeout (2 s here) and end the job.
export GRAFT_DIST_TIMEOUT=2
run stall 120 "$BIN" stall
unset GRAFT_DIST_TIMEOUT
if [ $rc -eq 0 ] || [ $secs -gt 60 ] || ! grep -q "rank(s) 1 did not reach" "$tmp/stall"; then
  bad "stalled rank: want a non-zero exit within 60 s naming rank 1 (exit $rc after $secs s)" stall
else
  echo "stall: job ended in ${secs} s: $(grep -m1 -o 'rank(s) 1 did not reach.*' "$tmp/stall" | cut -c1-80)..."
fi

# A killed rank: mpirun ends the job; the output names the rank.
run kill 120 "$BIN" kill
if [ $rc -eq 0 ] || [ $secs -gt 60 ] || ! grep -q "rank 1 .*exited on signal 9" "$tmp/kill"; then
  bad "killed rank: want a non-zero exit within 60 s naming rank 1 (exit $rc after $secs s)" kill
else
  echo "kill: job ended in ${secs} s: $(grep -m1 -o 'process rank 1.*' "$tmp/kill")"
fi

# A rank stopped at a random point: run in the background, stop rank 1 after a while.
export GRAFT_DIST_TIMEOUT=2
t0=$(date +%s)
timeout -k 5 120 $MPIRUN "$BIN" flood > "$tmp/flood" 2>&1 &
job=$!
pid=""
for _ in $(seq 1 300); do
  pid=$(sed -n 's/^rank 1 pid \([0-9]*\)$/\1/p' "$tmp/flood")
  [ -n "$pid" ] && break
  sleep 0.1
done
sleep 1.3
[ -n "$pid" ] && kill -STOP "$pid" 2> /dev/null
wait $job
rc=$?
secs=$(($(date +%s) - t0))
unset GRAFT_DIST_TIMEOUT
if [ -z "$pid" ] || [ $rc -eq 0 ] || [ $secs -gt 60 ] ||
   ! grep -qE "rank\(s\) 1 did not reach|did not complete within 2 s" "$tmp/flood"; then
  bad "stopped rank: want the job to end within 60 s with a timeout error (exit $rc after $secs s)" flood
else
  echo "flood: job ended in ${secs} s: $(grep -m1 -oE 'rank\(s\) 1 did not reach.*|collective #.*did not complete within 2 s' "$tmp/flood" | cut -c1-90)..."
fi

[ $fail -eq 0 ] && echo "check_dist: collectives across 2 processes passed"
exit $fail
