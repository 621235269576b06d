#!/usr/bin/env bash
# Prints the table of draind's performance figures (docs/performance.md):
# BenchmarkClusterScale at 100,000 and 150,000
# endpoints, the list fallback and JSON, several runs each in its own
# process (so that each run's RSS is its own), then, as root, several runs
# of BenchmarkConnect (the hooks' ns per invocation from the kernel's BPF
# run-time statistics, and the connect ratios), BenchmarkSendmsg and
# BenchmarkExpire. Every figure is a median with its range over the runs,
# never one run's.
#
#   sudo test/bench.sh             # 5 runs per scale, 3 of Connect, Sendmsg, Expire
#                                  # (~15 min on 2 cores)
#   sudo test/bench.sh -runs 7 -kruns 5
#   sudo test/bench.sh -ci         # the short form .ci/run runs: fails on
#                                  # gross regressions (thresholds below)
#   test/bench.sh                  # without root: BenchmarkClusterScale only
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

runs=5  # BenchmarkClusterScale runs per scale
kruns=3 # BenchmarkConnect, BenchmarkSendmsg and BenchmarkExpire runs
ci=0
while [ $# -gt 0 ]; do
  case "$1" in
    -runs) runs="$2"; shift 2 ;;
    -kruns) kruns="$2"; shift 2 ;;
    -ci) ci=1; shift ;;
    *) echo "usage: test/bench.sh [-runs N] [-kruns N] [-ci]" >&2; exit 2 ;;
  esac
done

# Gross-regression thresholds of the CI form (a loaded 2-core machine must
# pass them comfortably; see docs/performance.md for today's figures).
max_p99_ms=5            # BenchmarkClusterScale/endpoints=150k p99, median of runs, on a host as fast as this one:
api_cpu_us=140          # ... where the stand-in API server spends about this per update (150k): on a slower
                        # host (more) the p99 limit grows in proportion, never shrinks (the stalls it guards
                        # against took 95-270 ms)
max_rss_mb=150          # ... RSS as the process runs at the end of the churn
max_peak_rss_mb=200     # ... peak RSS, the initial lists included
max_sync_s=15           # ... start to Ready
max_hook_idle_ns=150    # connect4 idle path, ns per invocation above an empty program
max_observe_idle_ns=150 # SYN observer when nothing drains, same
max_expire_ratio=0.5    # draind's expiry time / conntrack -D

out=$(mktemp -d /tmp/draind-bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
root=0
[ "$(id -u)" -eq 0 ] && [ "${PRIVILEGED_TESTS:-1}" = 1 ] && root=1
export PRIVILEGED_TESTS=$root

machine() {
  echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GB," \
    "Linux $(uname -r), $(go version | awk '{print $3}'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
}
# above reports whether $1 > $2 (floating point).
above() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }

echo "=== building the benchmark binaries"
# Static and -trimpath, as the kernel matrix builds the same test binaries
# and the image builds draind: after the tests, every package is in the
# build cache already.
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath"
go build -o "$out/benchtable" ./test/benchtable
get() { "$out/benchtable" -get "$@"; } # get <benchmark> <metric> <median|min|max> <files>
go test -c -o "$out/daemon.test" ./daemon
if [ $root = 1 ]; then
  go test -c -o "$out/bpf.test" ./bpf
  go test -c -o "$out/conntrack.test" ./conntrack
fi
machine

# scale <name> <runs> <churn>: BenchmarkClusterScale/endpoints=<name>, one
# process per run, appended to $out/scale-<name>.txt.
scale() {
  local i
  for i in $(seq "$2"); do
    (cd daemon && "$out/daemon.test" -test.run '^$' -test.bench "BenchmarkClusterScale/endpoints=$1\$" \
      -test.benchtime 1x -clusterscale.churn "$3") >>"$out/scale-$1.txt" 2>&1 || {
      cat "$out/scale-$1.txt" >&2
      echo "BenchmarkClusterScale/endpoints=$1 failed" >&2
      return 1
    }
  done
}

connect() {
  (cd bpf && "$out/bpf.test" -test.run '^$' -test.bench 'BenchmarkConnect$' "$@") >>"$out/connect.txt" 2>&1 || {
    cat "$out/connect.txt" >&2
    return 1
  }
}

sendmsg() {
  (cd bpf && "$out/bpf.test" -test.run '^$' -test.bench 'BenchmarkSendmsg$') >>"$out/sendmsg.txt" 2>&1 || {
    cat "$out/sendmsg.txt" >&2
    return 1
  }
}

expire() {
  (cd conntrack && "$out/conntrack.test" -test.run '^$' -test.bench 'BenchmarkExpire$' -test.benchtime 1x -expire.flows "$1") >>"$out/expire.txt" 2>&1 || {
    cat "$out/expire.txt" >&2
    return 1
  }
}

# kernel_figures prints the hooks' cost above the floor of the measurement
# (an empty program at the same hook), from the Connect runs.
kernel_figures() {
  local f="$out/connect.txt" idle empty oidle oempty
  idle=$(get BenchmarkConnect/hook_idle idle-ns/invocation median "$f")
  empty=$(get BenchmarkConnect/empty_prog empty-ns/invocation median "$f")
  oidle=$(get BenchmarkConnect/hook_idle observe-idle-ns/invocation median "$f")
  oempty=$(get BenchmarkConnect/empty_prog observe-empty-ns/invocation median "$f")
  hook_idle_above=$(awk -v a="$idle" -v b="$empty" 'BEGIN { printf "%.0f", a - b }')
  observe_idle_above=$(awk -v a="$oidle" -v b="$oempty" 'BEGIN { printf "%.0f", a - b }')
  echo "connect4 idle path: $idle ns/invocation, $hook_idle_above above an empty program ($empty)"
  echo "SYN observer, nothing draining: $oidle ns/invocation, $observe_idle_above above an empty program ($oempty)"
}

if [ $ci = 0 ]; then
  for s in 100k 150k 150k-spread 150k-rollout 150k-list 150k-json; do
    echo "=== BenchmarkClusterScale/endpoints=$s: $runs runs"
    scale "$s" "$runs" 10s
  done
  if [ $root = 1 ]; then
    echo "=== BenchmarkConnect, BenchmarkSendmsg, BenchmarkExpire: $kruns runs each"
    for i in $(seq "$kruns"); do
      connect
      sendmsg
      expire 1000000
    done
  fi
  machine
  echo
  "$out/benchtable" "$out"/scale-*.txt
  if [ $root = 1 ]; then
    "$out/benchtable" "$out/connect.txt" "$out/sendmsg.txt" "$out/expire.txt"
    kernel_figures
  else
    echo "(BenchmarkConnect, BenchmarkSendmsg and BenchmarkExpire need root)"
  fi
  exit 0
fi

# The CI form: one short run of each; a guard that fails is judged again on
# the median of three runs (the machine may be loaded: a gross regression
# persists, a scheduling hiccup does not).
failed=0
# check <what> <value> <max>
check() {
  if above "$2" "$3"; then
    echo "FAIL $1: $2 > $3"
    return 1
  fi
  echo "ok   $1: $2 <= $3"
}

scale_checks() {
  local f="$out/scale-150k.txt" ok=0 api limit
  # The host's speed, measured in the same runs: the stand-in's CPU per
  # update, which draind's code does not change.
  api=$(get BenchmarkClusterScale/endpoints=150k api-cpu-µs/update median "$f")
  limit=$(awk -v m="$max_p99_ms" -v a="$api" -v b="$api_cpu_us" 'BEGIN { r = a / b; if (r < 1) r = 1; printf "%.2f", m * r }')
  echo "     (the stand-in's CPU per update: $api µs against $api_cpu_us here; p99 limit $limit ms)"
  check "ClusterScale 150k p99-ms (median of runs)" "$(get BenchmarkClusterScale/endpoints=150k p99-ms median "$f")" "$limit" || ok=1
  check "ClusterScale 150k rss-MB" "$(get BenchmarkClusterScale/endpoints=150k rss-MB median "$f")" $max_rss_mb || ok=1
  check "ClusterScale 150k peak-rss-MB" "$(get BenchmarkClusterScale/endpoints=150k peak-rss-MB median "$f")" $max_peak_rss_mb || ok=1
  check "ClusterScale 150k sync-s" "$(get BenchmarkClusterScale/endpoints=150k sync-s median "$f")" $max_sync_s || ok=1
  return $ok
}
connect_checks() {
  local ok=0
  kernel_figures >/dev/null
  check "connect4 idle ns/invocation above empty" "$hook_idle_above" $max_hook_idle_ns || ok=1
  check "observer idle ns/invocation above empty" "$observe_idle_above" $max_observe_idle_ns || ok=1
  return $ok
}
expire_checks() {
  check "Expire ratio draind/conntrack-tools" "$(get BenchmarkExpire ratio median "$out/expire.txt")" $max_expire_ratio
}

t0=$SECONDS
echo "=== BenchmarkClusterScale/endpoints=150k, 3 s of churn"
scale 150k 1 3s
if ! scale_checks; then
  echo "--- judged again on the median of three runs"
  scale 150k 2 3s
  scale_checks || failed=1
fi
"$out/benchtable" "$out/scale-150k.txt"
echo "(BenchmarkClusterScale: $((SECONDS - t0)) s)"

if [ $root = 1 ]; then
  t0=$SECONDS
  echo "=== BenchmarkConnect, 3 rounds per path (kernel figures), ratios over at least a second"
  connect -bench.rounds 3 -bench.connect.blocks 4
  if ! connect_checks; then
    echo "--- judged again on the median of three runs"
    connect -bench.rounds 3 -bench.connect.blocks 4
    connect -bench.rounds 3 -bench.connect.blocks 4
    connect_checks || failed=1
  fi
  "$out/benchtable" "$out/connect.txt"
  kernel_figures
  echo "(BenchmarkConnect: $((SECONDS - t0)) s)"

  t0=$SECONDS
  echo "=== BenchmarkExpire, 200,000 flows"
  expire 200000
  if ! expire_checks; then
    echo "--- judged again on the median of three runs"
    expire 200000
    expire 200000
    expire_checks || failed=1
  fi
  "$out/benchtable" "$out/expire.txt"
  echo "(BenchmarkExpire: $((SECONDS - t0)) s)"
else
  echo "BenchmarkConnect and BenchmarkExpire need root (PRIVILEGED_TESTS=1): not run" >&2
  failed=1
fi
machine
exit $failed
