#!/usr/bin/env bash
# Prints the path of a shape-true Gemma 4 E2B GGUF, building it once into the cache dir:
#
#   scripts/bench/e2b_gguf.sh q4_k_m|q8_0
#
# make_synthetic_e2b.py writes the checkpoint (the real E2B text config, random bf16
# weights, fixed seed, with the Gemma tokenizer beside it), llama.cpp's own converter turns
# it into a bf16 GGUF, and its llama-quantize into the type asked for — the same path a
# user's Q4_K_M or Q8_0 download took. The converter and its Python packages are the ones
# crates/engine/tests/fixtures/gguf/make_gguf.sh pins (the llama-cpp-python 0.3.36 sdist,
# requirements.txt); llama-quantize comes from scripts/bench.sh's llama.cpp build
# (scripts/bench/llama_cpp.sh). Needs about 30 GB of disk while it builds (the safetensors and the
# bf16 GGUF are removed once both quantized files exist) and about 15 minutes on 2 cores.
set -euo pipefail
source "$(dirname "$0")/../common.sh"

TYPE="${1:?usage: e2b_gguf.sh q4_k_m|q8_0}"
case "$TYPE" in
  q4_k_m) QTYPE=Q4_K_M ;;
  q8_0) QTYPE=Q8_0 ;;
  *) echo "unknown type $TYPE (q4_k_m, q8_0)" >&2; exit 2 ;;
esac
DIR="$KVLAB_CACHE/bench"
OUT="$DIR/e2b-$TYPE.gguf"
if [ -f "$OUT" ]; then
  echo "$OUT"
  exit 0
fi

source "$ROOT/scripts/bench/llama_cpp.sh"
SRC="$LLAMA_SRC/vendor/llama.cpp"
QUANTIZE="$LLAMA_BIN/llama-quantize"
VENV="$KVLAB_CACHE/convert-venv"
[ -x "$QUANTIZE" ] || { say "llama-quantize is missing: run scripts/bench.sh (it builds it)"; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q -r "$ROOT/crates/engine/tests/fixtures/gguf/requirements.txt" >&2

mkdir -p "$DIR"
BF16="$DIR/e2b-bf16.gguf"
if [ ! -f "$BF16" ]; then
  if [ ! -f "$DIR/e2b-st/config.json" ]; then
    say "writing the synthetic Gemma 4 E2B checkpoint (9.3 GB, once)"
    TOKENIZER="$(cargo run --quiet -p kvlab-assets -- path gemma-tokenizer)"
    "$VENV/bin/python" "$ROOT/scripts/bench/make_synthetic_e2b.py" "$DIR/e2b-st" \
      --tokenizer "$TOKENIZER" >&2
  fi
  say "converting it with llama.cpp's converter (bf16 GGUF)"
  "$VENV/bin/python" "$SRC/convert_hf_to_gguf.py" "$DIR/e2b-st" --outfile "$BF16.part" \
    --outtype bf16 >&2
  mv "$BF16.part" "$BF16"
fi
say "quantizing it to $QTYPE with llama-quantize"
"$QUANTIZE" "$BF16" "$OUT.part" "$QTYPE" 2 >"$DIR/quantize-$TYPE.log" 2>&1
mv "$OUT.part" "$OUT"
if [ -f "$DIR/e2b-q4_k_m.gguf" ] && [ -f "$DIR/e2b-q8_0.gguf" ]; then
  rm -rf "$DIR/e2b-st" "$BF16"
fi
echo "$OUT"
