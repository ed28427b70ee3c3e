#!/usr/bin/env bash
# Faults under mpirun: while process 0 waits in a psum (or in a gather started ahead), process 1
# throws, returns from main, is killed, or comes late (with a 1 s KILN_COLLECTIVE_TIMEOUT).
# Process 0 must fail with a kiln::Error naming process 1 and the collective within bounded
# time, never hang.
#   tests/distributed/faults.sh build/tests/fault_probe
set -uo pipefail
probe="$1"
mpirun=(mpirun --allow-run-as-root --oversubscribe -np 2)
failed=0
check() {  # mode, expected text in process 0's output (an extended regex)
  local mode="$1" want="$2" start end out
  start=$(date +%s)
  out=$(KILN_COLLECTIVE_TIMEOUT="${TIMEOUT:-60}" timeout 120 "${mpirun[@]}" "$probe" "$mode" 2>&1)
  end=$(date +%s)
  if ! grep -qE "process 0 caught: \[(pmap|psum|all_gather)\] .*$want" <<< "$out"; then
    echo "FAIL $mode: process 0 did not report '$want' ($((end - start)) s):"
    echo "$out" | head -30
    failed=1
  elif ((end - start > 60)); then
    echo "FAIL $mode: took $((end - start)) s"
    failed=1
  else
    echo "ok   $mode ($((end - start)) s): $(grep -m1 'process 0 caught' <<< "$out" | cut -c1-160)"
  fi
}
check throw "process 1 failed: \[model\] process 1 hit a bad batch"
check inside "process 1 failed: .* while process 0 waits in psum"
check ahead "process 1 failed: .* while process 0 waits in all_gather"
check exit "process 1 has finished"
check kill "process 1 \(pid [0-9]+\) has exited|launcher is ending the job"
TIMEOUT=1 check late "within 1 s"
exit $failed
