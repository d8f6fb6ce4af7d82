#!/bin/sh
# Collectives across 2 hosts (make check-dist): two network namespaces on this machine, each
# with its own host name, joined by a veth pair (eth0 on both, 10.77.1.1 and 10.77.1.2), stand
# for two machines. mpirun starts on hostA and starts its daemon on hostB through its rsh agent
# (a script that enters hostB's namespaces where ssh would log in); all MPI traffic is TCP over
# the link, as between machines.
#   parity   data-parallel MLP and CNN across the hosts == one process on the whole batch
#   speed    all_reduce latency and bandwidth over the link (printed for the README)
#   kill     a rank is killed on hostB mid-training: the job ends, naming rank 1 and hostB
#   cut      the link goes down mid-training: each rank ends within GRAFT_DIST_TIMEOUT naming
#            the rank and host it lost, mpirun ends, and nothing is left running on hostB
# Needs root for the namespaces: otherwise it says why and skips.
# Usage: tests/check_dist_hosts.sh BIN (a build of tests/test_dist.c). Exits 1 naming each failure.
set -u
BIN=${1:?usage: check_dist_hosts.sh BIN}
skip() {
  echo "check_dist_hosts: skipped: $1"
  exit 0
}
if ! command -v mpirun > /dev/null; then
  echo "check_dist_hosts: mpirun not found (scripts/install-deps.sh installs openmpi-bin)" >&2
  exit 1
fi
[ "$(id -u)" -eq 0 ] || skip "not root: making network namespaces needs root"
for tool in ip unshare hostname timeout; do
  command -v $tool > /dev/null || skip "$tool not found (iproute2, util-linux)"
done
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN") # the same path on both hosts
tmp=$(mktemp -d) || exit 2
nsA=graft-hostA-$$ nsB=graft-hostB-$$
cleanup() {
  for ns in $nsA $nsB; do # processes left in a namespace keep it alive
    for pid in $(ip netns pids $ns 2> /dev/null); do kill -9 $pid 2> /dev/null; done
    ip netns del $ns 2> /dev/null
    rm -rf /etc/netns/$ns
  done
  rmdir /etc/netns 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 2' INT TERM
ip netns add $nsA 2> "$tmp/err" || skip "ip netns add failed: $(cat "$tmp/err")"
ip netns add $nsB 2> "$tmp/err" || skip "ip netns add failed: $(cat "$tmp/err")"
# The names are inside the namespaces: parallel runs do not collide.
ip link add name eth0 netns $nsA type veth peer name eth0 netns $nsB 2> "$tmp/err" ||
  skip "cannot make a veth pair: $(cat "$tmp/err")"
addr_A=10.77.1.1 addr_B=10.77.1.2
for h in A B; do
  eval "ns=\$ns$h addr=\$addr_$h"
  ip -n $ns addr add $addr/24 dev eth0 && ip -n $ns link set eth0 up && ip -n $ns link set lo up
  # A host cut off must notice within seconds: TCP gives up on unanswered data after about
  # 6 s (tcp_retries2=4) instead of 15 minutes; a cluster sets this on every machine.
  ip netns exec $ns sysctl -q -w net.ipv4.tcp_retries2=4
  # ip netns exec puts /etc/netns/NS/hosts over /etc/hosts: the two names resolve on both.
  mkdir -p /etc/netns/$ns
  printf '127.0.0.1 localhost\n%s hostA\n%s hostB\n' $addr_A $addr_B > /etc/netns/$ns/hosts
done

# What ssh would do: log in to host $1 (only hostB here) and run the rest, in a clean
# environment, so mpirun's -x list is what reaches the remote ranks, as between machines.
cat > "$tmp/agent" << EOF
#!/bin/sh
[ "\$1" = hostB ] || { echo "agent: no host \$1" >&2; exit 255; }
shift
exec env -i PATH="\$PATH" HOME="\$HOME" ip netns exec $nsB unshare --uts sh -c "hostname hostB; \$*"
EOF
chmod +x "$tmp/agent"
printf 'hostA slots=1\nhostB slots=1\n' > "$tmp/hostfile"

# We run as root; Open MPI refuses that unless told. The leak check is off (MPI's own
# allocations). Both hosts are this machine's 2 cores: Open MPI would pin each host's rank to
# its host's core 0 (--bind-to none), and a rank busy-polling on the core its peer needs makes
# a 4-byte all_reduce take a scheduler tick (8 ms, not 0.05) unless idle ranks yield and each
# rank runs one thread. Keepalives on mpirun's own connections find a silent link.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} GRAFT_DIST_TIMEOUT=30
export GRAFT_THREADS=1 OPENBLAS_NUM_THREADS=1
MPIRUN="mpirun -np 2 --hostfile $tmp/hostfile --mca plm_rsh_agent $tmp/agent
  --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0
  --mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 2
  --bind-to none --mca mpi_yield_when_idle 1
  -x ASAN_OPTIONS -x GRAFT_DIST_TIMEOUT -x GRAFT_THREADS -x OPENBLAS_NUM_THREADS
  ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH}"
fail=0

# onA LIMIT CMD...: runs CMD on hostA under a hard limit.
onA() {
  limit=$1
  shift
  timeout -k 5 "$limit" ip netns exec $nsA unshare --uts sh -c 'hostname hostA; exec "$@"' sh "$@"
}

now_ms() { date +%s%3N; }

# run NAME LIMIT_S ARGS...: runs the job under a hard limit; sets rc, ms, and $tmp/NAME.
run() {
  name=$1 limit=$2
  shift 2
  t0=$(now_ms)
  onA "$limit" $MPIRUN "$@" > "$tmp/$name" 2>&1 &
  wait $! # in the background: an interrupt runs the cleanup now, not after the job
  rc=$?
  ms=$(($(now_ms) - t0))
}

# secs MS: MS milliseconds in seconds, one decimal ("never" stays).
secs() { echo "$1" | awk '/^-?[0-9]+$/ { printf "%.1f", $1 / 1000; next } { printf "%s", $1 }'; }

bad() {
  echo "check_dist_hosts: $1" >&2
  sed 's/^/    /' "$tmp/$2" >&2
  fail=1
}

for model in mlp cnn; do
  run "parity_$model" 300 "$BIN" parity "$model"
  if [ $rc -ne 0 ] || ! grep -q "rank 0/2 on hostA parity $model" "$tmp/parity_$model" ||
     ! grep -q "rank 1/2 on hostB parity $model" "$tmp/parity_$model"; then
    bad "parity $model across hostA and hostB failed (exit $rc)" "parity_$model"
  else
    grep "parity $model" "$tmp/parity_$model" | sort
    echo "parity $model: the job took $(secs $ms) s (mpirun to exit, both hosts)"
  fi
done

run speed 120 "$BIN" speed
if [ $rc -ne 0 ] || [ "$(grep -c "^speed: " "$tmp/speed")" -ne 2 ]; then
  bad "all_reduce timings over the link (exit $rc)" speed
else
  grep "^speed: " "$tmp/speed"
fi

# train NAME: starts the training job in the background (job: its pid; pid_A, pid_B: the
# ranks' pids on hostA and hostB; t0: the start in ms). Each rank writes its stderr to a file
# on its own host ($tmp/NAME.RANK): once the link is gone, hostB cannot reach mpirun.
train() {
  t0=$(now_ms)
  onA 200 $MPIRUN sh -c 'exec "$0" train 2> "$1.$OMPI_COMM_WORLD_RANK"' "$BIN" "$tmp/$1" \
    > "$tmp/$1" 2>&1 &
  job=$!
  pid_A="" pid_B=""
  # mpirun forwards the ranks' first lines after 2-60 s on this machine (seen with the code of
  # several sessions): waited for up to ~90 s, the ranks train for 150 s unless stopped
  for _ in $(seq 1 900); do
    pid_A=$(sed -n 's/^rank 0 pid \([0-9]*\) on hostA$/\1/p' "$tmp/$1")
    pid_B=$(sed -n 's/^rank 1 pid \([0-9]*\) on hostB$/\1/p' "$tmp/$1")
    [ -n "$pid_A" ] && [ -n "$pid_B" ] && break
    sleep 0.1
  done
  sleep 2 # training, well past the first steps
}

alive() {
  case $(ps -o stat= -p "$1" 2> /dev/null) in
  "" | Z*) return 1 ;;
  esac
}

# after_event EVENT_MS: watches for up to 60 s after the event; sets rc and, in ms after the
# event (or "never"): rank_A_ms, rank_B_ms (each rank ended), job_ms (mpirun ended) and
# empty_B_ms (nothing left running on hostB).
after_event() {
  rank_A_ms=never rank_B_ms=never job_ms=never empty_B_ms=never
  for _ in $(seq 1 600); do
    t=$(($(now_ms) - $1))
    [ $rank_A_ms = never ] && ! alive "$pid_A" && rank_A_ms=$t
    [ $rank_B_ms = never ] && ! alive "$pid_B" && rank_B_ms=$t
    [ $job_ms = never ] && ! kill -0 $job 2> /dev/null && job_ms=$t
    [ $empty_B_ms = never ] && [ -z "$(ip netns pids $nsB)" ] && empty_B_ms=$t
    [ $job_ms != never ] && [ $empty_B_ms != never ] && break
    sleep 0.1
  done
  wait $job
  rc=$?
}

# ended_within LIMIT_S MS...: every MS is a number of ms up to LIMIT_S seconds.
ended_within() {
  limit=$1
  shift
  for t in "$@"; do
    [ "$t" != never ] && [ "$t" -le $((limit * 1000)) ] || return 1
  done
}

# timings: the figures after_event measured, for messages.
timings() {
  echo "rank 0 ended after $(secs $rank_A_ms) s, rank 1 $(secs $rank_B_ms) s, mpirun" \
       "$(secs $job_ms) s (exit $rc), nothing left on hostB $(secs $empty_B_ms) s"
}

# The ranks must end within GRAFT_DIST_TIMEOUT (3 s) and a margin for a loaded machine; mpirun
# and hostB's daemon, which learn of a lost link from TCP, within 30 s.
export GRAFT_DIST_TIMEOUT=3

# A rank killed on hostB: its daemon tells mpirun, which ends the job and names it.
train kill
[ -n "$pid_B" ] && ip netns exec $nsB kill -9 "$pid_B"
t_kill=$(now_ms)
after_event $t_kill
if [ -z "$pid_B" ] || [ $rc -eq 0 ] || ! ended_within 10 $rank_A_ms ||
   ! ended_within 30 $job_ms $empty_B_ms ||
   ! grep -q "rank 1 with PID $pid_B on node hostB exited on signal 9" "$tmp/kill"; then
  for r in 0 1; do sed "s/^/rank $r stderr: /" "$tmp/kill.$r" >> "$tmp/kill"; done
  bad "rank killed on hostB: want the job to end in bounded time naming rank 1 on hostB; \
after the kill: $(timings)" kill
else
  echo "kill: rank 1 killed on hostB $(secs $((t_kill - t0))) s into training; after it $(timings):"
  echo "  $(grep -m1 -o 'process rank 1.*' "$tmp/kill")"
fi

# The link goes down mid-training: each rank times out naming the other and its host, either
# before the data (the other's signature did not arrive) or in it (the watchdog).
train cut
ip -n $nsA link set eth0 down
t_cut=$(now_ms)
after_event $t_cut
lost="rank\(s\) 1 did not reach .*\(rank 1 on hostB\)|.* did not complete within 3 s .*\(the other ranks: 1 on hostB\)"
lost_B="rank\(s\) 0 did not reach .*\(rank 0 on hostA\)|.* did not complete within 3 s .*\(the other ranks: 0 on hostA\)"
if [ -z "$pid_B" ] || [ $rc -eq 0 ] || ! ended_within 10 $rank_A_ms $rank_B_ms ||
   ! ended_within 30 $job_ms $empty_B_ms ||
   ! grep -qE "rank 0 on hostA: ($lost)" "$tmp/cut.0" ||
   ! grep -qE "rank 1 on hostB: ($lost_B)" "$tmp/cut.1"; then
  for r in 0 1; do sed "s/^/rank $r stderr: /" "$tmp/cut.$r" >> "$tmp/cut"; done
  bad "link cut: want each rank to name the other and its host, and everything to end in \
bounded time; after the cut: $(timings)" cut
else
  echo "cut: link down $(secs $((t_cut - t0))) s into training; after it $(timings)"
  echo "  hostA: $(grep -m1 -oE "graft: rank 0 on hostA: ($lost).*" "$tmp/cut.0" | cut -c1-160)..."
  echo "  hostB: $(grep -m1 -oE "graft: rank 1 on hostB: ($lost_B).*" "$tmp/cut.1" | cut -c1-160)..."
fi
unset GRAFT_DIST_TIMEOUT

[ $fail -eq 0 ] && echo "check_dist_hosts: collectives across 2 hosts (network namespaces) passed"
exit $fail
