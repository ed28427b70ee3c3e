#!/usr/bin/env bash
# The GPT job is the same in C++ and Python: examples/gpt.cpp and python/examples/gpt.py write
# byte-identical checkpoints for the same flags, each resumes the other's checkpoint to the
# checkpoint of an uninterrupted run, and both sample the same text from it; with a BPE
# tokenizer (trained by each, resumed by the other), with --dtype bf16, and with --data-parallel
# on 2 processes under the given mpirun, they write the same checkpoints too; under
# --zero 1, 2 and 3 and --tensor-parallel (with dropout, on both 2-process meshes) the same
# sharded checkpoints, which each resumes from the other, on 2 processes or on one.
#   tests/gpt_languages.sh build/examples/gpt python3 python/examples/gpt.py [mpirun]
# (PYTHONPATH must reach the kiln module.)
set -euo pipefail
gpt="$1"
python="$2"
script="$3"
mpirun=("${4:-mpirun}" --allow-run-as-root --oversubscribe -np 2)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
text="$(dirname "$0")/../README.md"
common=(--text "$text" --layers 1 --heads 2 --d-model 16 --block-size 16 --batch-size 4
        --accum 2 --steps 12 --warmup 2 --eval-every 4 --eval-batches 2 --dropout 0.1 --seed 4
        --sample 0)
run() { "$@" > "$out/log" 2>&1 || { cat "$out/log"; exit 1; }; }
run "$gpt" "${common[@]}" --out "$out/cpp"
run "$python" "$script" "${common[@]}" --out "$out/py"
cmp "$out/cpp/checkpoint.safetensors" "$out/py/checkpoint.safetensors"
run "$gpt" "${common[@]}" --stop-after 8 --out "$out/cpp-then-py"
run "$python" "$script" --resume "$out/cpp-then-py" --sample 0
cmp "$out/cpp/checkpoint.safetensors" "$out/cpp-then-py/checkpoint.safetensors"
run "$python" "$script" "${common[@]}" --stop-after 4 --out "$out/py-then-cpp"
run "$gpt" --resume "$out/py-then-cpp" --sample 0
cmp "$out/cpp/checkpoint.safetensors" "$out/py-then-cpp/checkpoint.safetensors"
# The sample: what lies between the "---- sample" line and the closing "----".
sample() { "$@" 2> /dev/null | sed -n '/^---- sample/,/^----$/p' | sed '1d;$d'; }
flags=(--resume "$out/cpp" --sample 40 --prompt "The " --temperature 0.8 --top-k 5)
sample "$gpt" "${flags[@]}" > "$out/cpp.txt"
sample "$python" "$script" "${flags[@]}" > "$out/py.txt"
test -s "$out/cpp.txt"
cmp "$out/cpp.txt" "$out/py.txt"

run "$gpt" "${common[@]}" --tokenizer bpe --vocab 300 --out "$out/cpp-bpe"
run "$python" "$script" "${common[@]}" --tokenizer bpe --vocab 300 --out "$out/py-bpe"
cmp "$out/cpp-bpe/checkpoint.safetensors" "$out/py-bpe/checkpoint.safetensors"
run "$python" "$script" --resume "$out/cpp-bpe" --steps 16 --sample 0
run "$gpt" --resume "$out/py-bpe" --steps 16 --sample 0
cmp "$out/cpp-bpe/checkpoint.safetensors" "$out/py-bpe/checkpoint.safetensors"
run "$gpt" "${common[@]}" --dtype bf16 --out "$out/cpp-bf16"
run "$python" "$script" "${common[@]}" --dtype bf16 --out "$out/py-bf16"
cmp "$out/cpp-bf16/checkpoint.safetensors" "$out/py-bf16/checkpoint.safetensors"
if ! command -v "${mpirun[0]}" > /dev/null; then
  echo "languages: C++ and Python write, resume and sample from the same checkpoints (f32, BPE," \
    "bf16; no mpirun for 2 processes)"
  exit 0
fi
export OMP_NUM_THREADS=1 KILN_NUM_THREADS=1  # one thread per process
run "${mpirun[@]}" "$gpt" "${common[@]}" --data-parallel --out "$out/cpp-dp"
run "${mpirun[@]}" "$python" "$script" "${common[@]}" --data-parallel --out "$out/py-dp"
cmp "$out/cpp-dp/checkpoint.safetensors" "$out/py-dp/checkpoint.safetensors"
for stage in 1 2 3; do
  run "${mpirun[@]}" "$gpt" "${common[@]}" --data-parallel --zero $stage --out "$out/cpp-z$stage"
  run "${mpirun[@]}" "$python" "$script" "${common[@]}" --data-parallel --zero $stage \
    --out "$out/py-z$stage"
  diff -r "$out/cpp-z$stage/checkpoint" "$out/py-z$stage/checkpoint"
done
run "${mpirun[@]}" "$python" "$script" "${common[@]}" --data-parallel --zero 3 --stop-after 4 \
  --out "$out/z3-py-then-cpp"
run "${mpirun[@]}" "$gpt" --data-parallel --zero 3 --resume "$out/z3-py-then-cpp" --sample 0
diff -r "$out/cpp-z3/checkpoint" "$out/z3-py-then-cpp/checkpoint"
run "${mpirun[@]}" "$gpt" "${common[@]}" --data-parallel --zero 2 --stop-after 8 \
  --out "$out/z2-cpp-then-py"
run "${mpirun[@]}" "$python" "$script" --data-parallel --zero 2 --resume "$out/z2-cpp-then-py" \
  --sample 0
diff -r "$out/cpp-z2/checkpoint" "$out/z2-cpp-then-py/checkpoint"
for mesh in data=1,model=2 data=2,model=1; do
  run "${mpirun[@]}" "$gpt" "${common[@]}" --tensor-parallel --mesh $mesh --out "$out/cpp-$mesh"
  run "${mpirun[@]}" "$python" "$script" "${common[@]}" --tensor-parallel --mesh $mesh \
    --out "$out/py-$mesh"
  diff -r "$out/cpp-$mesh/checkpoint" "$out/py-$mesh/checkpoint"
done
run "${mpirun[@]}" "$python" "$script" "${common[@]}" --tensor-parallel --stop-after 4 \
  --out "$out/tp-py-then-cpp"
run "${mpirun[@]}" "$gpt" --tensor-parallel --resume "$out/tp-py-then-cpp" --sample 0
diff -r "$out/cpp-data=1,model=2/checkpoint" "$out/tp-py-then-cpp/checkpoint"
run "${mpirun[@]}" "$gpt" "${common[@]}" --tensor-parallel --stop-after 8 --out "$out/tp-cpp-then-py"
run "${mpirun[@]}" "$python" "$script" --tensor-parallel --resume "$out/tp-cpp-then-py" --sample 0
diff -r "$out/cpp-data=1,model=2/checkpoint" "$out/tp-cpp-then-py/checkpoint"
# ZeRO-3's pieces continued on one process, by each language: the same whole checkpoint, and
# the pieces' directory gone (one format per directory).
run "${mpirun[@]}" "$gpt" "${common[@]}" --data-parallel --zero 3 --stop-after 8 --out "$out/z3-one"
cp -r "$out/z3-one" "$out/z3-one-py"
run "$gpt" --resume "$out/z3-one" --sample 0
run "$python" "$script" --resume "$out/z3-one-py" --sample 0
cmp "$out/z3-one/checkpoint.safetensors" "$out/z3-one-py/checkpoint.safetensors"
test ! -e "$out/z3-one-py/checkpoint"
echo "languages: C++ and Python write, resume and sample from the same checkpoints (f32, BPE," \
  "bf16, 2 processes, ZeRO 1-3, tensor parallelism and their resumes)"
