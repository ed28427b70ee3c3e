# Shared by the jobs' tests (tests/demo_data_parallel.sh, tests/gpt_*.sh), which source it.

# run LOG COMMAND...: the command's output goes to LOG, shown when it fails.
run() {
  local log="$1"
  shift
  if ! "$@" > "$log" 2>&1; then
    cat "$log"
    echo "failed: $*"
    exit 1
  fi
}

# same_losses A B WHAT: two GPT runs' metrics.csv (step,train_loss,val_loss,lr,tokens_per_second,
# mfu) hold 4 evaluations whose training and validation losses agree to 1e-4 relative.
same_losses() {
  paste -d, "$1" "$2" | awk -F, -v what="$3" 'NR > 1 {
      for (c = 2; c <= 3; ++c) {
        d = ($c - $(c + 6)) / $c; if (d < 0) d = -d
        if (d > worst) worst = d
      }
      rows++ }
    END { printf "%s: %d evaluations, losses within %.1e relative\n", what, rows, worst
          exit !(rows == 4 && worst < 1e-4) }'
}

# usage WANT COMMAND...: the command fails with a message containing WANT (in $out/usage.log).
usage() {
  local want="$1"
  shift
  if "$@" > "$out/usage.log" 2>&1; then
    echo "$* should fail"
    exit 1
  fi
  grep -q "$want" "$out/usage.log"
}
