#!/usr/bin/env bash
# `demo --resume` reaches the same weights as an uninterrupted run: train 2 epochs on a subset
# straight through, and again stopping after epoch 1 and resuming; the checkpoints (weights,
# optimiser state, data position, settings) must be byte-identical.
#   tests/demo_resume.sh build/examples/demo
set -euo pipefail
demo="$1"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--limit 512 --epochs 2 --batch-size 32 --seed 7)
"$demo" "${common[@]}" --out "$out/straight" > "$out/straight.log" 2>&1
"$demo" "${common[@]}" --stop-after 1 --out "$out/resumed" > "$out/first.log" 2>&1
"$demo" --resume "$out/resumed" > "$out/second.log" 2>&1
grep -q "resumed from .* after epoch 1" "$out/second.log"
cmp "$out/straight/checkpoint.safetensors" "$out/resumed/checkpoint.safetensors"
test "$(wc -l < "$out/resumed/metrics.csv")" -eq 3  # header + 2 epochs
echo "resume: identical checkpoints after 1 + 1 epochs and 2 epochs straight"
