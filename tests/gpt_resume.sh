#!/usr/bin/env bash
# `gpt --resume` reaches the same weights as an uninterrupted run: train 40 steps straight, and
# again stopping after 20 and resuming; the checkpoints (weights, optimiser state, step,
# settings) must be byte-identical, and the metrics must hold one row per evaluation.
#   tests/gpt_resume.sh build/examples/gpt
set -euo pipefail
gpt="$1"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--layers 2 --heads 2 --d-model 32 --block-size 32 --batch-size 4 --accum 2
        --steps 40 --warmup 5 --eval-every 10 --eval-batches 2 --dropout 0.1 --seed 3 --sample 0)
"$gpt" "${common[@]}" --out "$out/straight" > "$out/straight.log" 2>&1
"$gpt" "${common[@]}" --stop-after 20 --out "$out/resumed" > "$out/first.log" 2>&1
"$gpt" --resume "$out/resumed" --sample 0 > "$out/second.log" 2>&1
grep -q "resumed from .* after step 20" "$out/second.log"
cmp "$out/straight/checkpoint.safetensors" "$out/resumed/checkpoint.safetensors"
test "$(wc -l < "$out/resumed/metrics.csv")" -eq 5  # header + 4 evaluations
# step, train loss, validation loss, learning rate (the rest are speeds)
cmp <(cut -d, -f1-4 "$out/straight/metrics.csv") <(cut -d, -f1-4 "$out/resumed/metrics.csv")
echo "resume: identical checkpoints after 20 + 20 steps and 40 steps straight"

# With a BPE tokenizer: trained once, saved with the checkpoint, read back on resume.
bpe=(--tokenizer bpe --vocab 400)
"$gpt" "${common[@]}" "${bpe[@]}" --out "$out/bpe-straight" > "$out/straight.log" 2>&1
"$gpt" "${common[@]}" "${bpe[@]}" --stop-after 20 --out "$out/bpe-resumed" > "$out/first.log" 2>&1
"$gpt" --resume "$out/bpe-resumed" --sample 0 > "$out/second.log" 2>&1
grep -q "BPE of 400 tokens" "$out/second.log"
if grep -q "BPE tokenizer:" "$out/second.log"; then  # trained again instead of loaded
  echo "the resumed run trained its tokenizer again"
  exit 1
fi
cmp "$out/bpe-straight/checkpoint.safetensors" "$out/bpe-resumed/checkpoint.safetensors"
echo "resume: the same with a BPE tokenizer of 400 tokens"
