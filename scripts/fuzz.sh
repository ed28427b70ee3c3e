#!/usr/bin/env bash
# Runs each libFuzzer target for a fixed time, up to JOBS at once (one core each), from a copy of
# its seeds fuzz/corpus/<name>/ (the repository is not modified) and fuzz/<name>.dict when there
# is one. Each target's output goes to <build>/artifacts/<name>.log and is printed when it ends;
# a crashing input is left in <build>/artifacts/<name>/. Fails if any target crashed.
# Usage: scripts/fuzz.sh BUILD_DIR SECONDS JOBS TARGET...
set -euo pipefail
build=$1 seconds=$2 jobs=$3
shift 3
rm -rf "$build/corpus" "$build/artifacts"

run_one() {
  local t=$1
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t"
  cp fuzz/corpus/"$t"/* "$build/corpus/$t/"
  local dict=()
  [ -f "fuzz/$t.dict" ] && dict=("-dict=fuzz/$t.dict")
  if "$build/fuzz/fuzz_$t" "$build/corpus/$t" "${dict[@]}" -max_total_time="$seconds" \
    -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -artifact_prefix="$build/artifacts/$t/" \
    -print_final_stats=1 >"$build/artifacts/$t.log" 2>&1; then
    echo "== fuzz_$t: $seconds s, no crash"
  else
    echo "== fuzz_$t: FAILED"
    touch "$build/artifacts/$t.failed"
  fi
  tail -n 12 "$build/artifacts/$t.log"
}

echo "fuzz: $# targets for $seconds s each, $jobs at a time"
running=0
for t in "$@"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=""
for t in "$@"; do
  if [ -e "$build/artifacts/$t.failed" ]; then failed="$failed$t "; fi
done
if [ -n "$failed" ]; then
  echo "fuzz: crashes in: $failed(inputs in $build/artifacts/, output in $build/artifacts/<name>.log)"
  exit 1
fi
echo "fuzz: all $# targets ran without a crash"
