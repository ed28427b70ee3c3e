#!/usr/bin/env bash
# Bad input to `gpt` ends in a clear error that names the file and the value, never a crash:
# an empty file, a binary file, a block larger than the text, a checkpoint of another model or
# tokenizer, a vocabulary too small, and flags out of range.
#   tests/gpt_errors.sh build/examples/gpt
set -uo pipefail
gpt="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
small=(--layers 1 --heads 1 --d-model 16 --block-size 16 --batch-size 2 --steps 4
       --eval-every 2 --eval-batches 1 --sample 0)
# expect_error <exit code> <pattern> <args...>: the run fails with that code and says pattern.
expect_error() {
  local code="$1" pattern="$2"
  shift 2
  "$gpt" "$@" > "$dir/log" 2>&1
  local got=$?
  if [[ $got -ne $code ]] || ! grep -q -- "$pattern" "$dir/log"; then
    echo "gpt $*: exit $got, expected $code and '$pattern'; it printed:"
    cat "$dir/log"
    exit 1
  fi
}
: > "$dir/empty.txt"
printf 'text\0with a NUL' > "$dir/binary.txt"
printf 'caf\xc3' > "$dir/truncated.txt"
head -c 300 /dev/zero | tr '\0' 'a' > "$dir/short.txt"
expect_error 1 "$dir/empty.txt is empty" "${small[@]}" --text "$dir/empty.txt"
expect_error 1 "$dir/binary.txt is not UTF-8 text: byte 4 is 0x00" "${small[@]}" --text "$dir/binary.txt"
expect_error 1 "$dir/truncated.txt is not UTF-8 text: byte 3 is 0xc3" "${small[@]}" --text "$dir/truncated.txt"
expect_error 1 "cannot read $dir/missing.txt" "${small[@]}" --text "$dir/missing.txt"
expect_error 1 "block-size 64 is larger than the validation text (30 tokens" \
  "${small[@]}" --block-size 64 --text "$dir/short.txt"
expect_error 2 "bad value for --lr: fast" --lr fast
expect_error 2 "--d-model must be a multiple of --heads, got 30 and 4" --d-model 30 --heads 4
expect_error 2 "--dropout must be in \[0, 1)" --dropout 1
expect_error 2 "unknown flag --epochs" --epochs 3
expect_error 2 "--block-size must be at least 2" --block-size 1
expect_error 2 "bad value for --seed: -1" --seed -1
expect_error 2 "--tokenizer must be bytes or bpe, got words" --tokenizer words
expect_error 2 "--vocab must be from 257 (the 256 bytes and a merge) to 1048576 for --tokenizer bpe, got 100" \
  --tokenizer bpe --vocab 100
expect_error 2 "--vocab 512 needs --tokenizer bpe" --vocab 512
expect_error 1 "cannot open '$dir/nowhere/checkpoint.safetensors'" --resume "$dir/nowhere"
# A checkpoint of a 1-layer model does not load into a 2-layer one: the error names the file.
"$gpt" "${small[@]}" --text "$dir/short.txt" --out "$dir/run" > "$dir/log" 2>&1 ||
  { cat "$dir/log"; exit 1; }
expect_error 1 "$dir/run/checkpoint.safetensors" --resume "$dir/run" --layers 2
# A resumed run keeps its tokenizer: a byte-level run does not continue as a BPE one.
expect_error 2 "--tokenizer bpe differs from $dir/run/checkpoint.safetensors's bytes" \
  --resume "$dir/run" --tokenizer bpe
echo "errors: each bad input named its file or value"
