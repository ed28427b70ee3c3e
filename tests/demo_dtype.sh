#!/usr/bin/env bash
# Mixed precision trains: `demo --dtype D` (float32 master weights, 16-bit forward and backward
# passes, loss scaling for f16) on a subset with the MLP must lower the training loss from the
# first epoch to the last and reach a test accuracy far above chance (10 classes).
#   tests/demo_dtype.sh build/examples/demo bf16
set -euo pipefail
demo="$1"
dtype="$2"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if ! "$demo" --dtype "$dtype" --model mlp --limit 512 --epochs 2 --batch-size 32 \
    --out "$out" > "$out/log" 2>&1; then
  cat "$out/log"
  exit 1
fi
grep -q "mlp on Fashion-MNIST ($dtype)" "$out/log"
# metrics.csv: epoch,train_loss,train_accuracy,test_loss,test_accuracy,seconds,images_per_second
awk -F, -v dtype="$dtype" '
  NR == 2 { first = $2 }
  NR > 1 { last = $2; acc = $5 }
  END {
    printf "%s: train loss %.4f -> %.4f over 2 epochs, test accuracy %.1f%%\n", dtype, first, last,
           100 * acc
    exit !(last < first && acc > 0.5)
  }' "$out/metrics.csv"
