#!/usr/bin/env bash
# Speed side by side: KV Lab's CLI against llama.cpp's llama-bench on the same GGUF, same
# threads, alternating the two programs in one run, and a table of ratios. A benchmark, not
# a test: nothing here fails on a figure.
#
#   scripts/bench.sh                   Gemma 3 270M Q4_K_M, depths 512 4096 16384, 2 threads
#   BENCH_DEPTHS="512 4096 16384 32000" BENCH_THREADS=2 BENCH_ROUNDS=2 \
#   BENCH_MODEL=/path/model.gguf scripts/bench.sh
#
# For each depth D it measures
#   decode   tok/s of 32 generated tokens after D tokens of context (llama-bench -p 0 -n 32
#            -d D -fa on; kvlab bench decode --ctx D --decode 32 on the first D tokens of
#            Paradise Lost, so TurboQuant codes real keys and values), f16 KV on both sides,
#            and KV Lab's TurboQuant 4-bit cache (tq4@all) against llama.cpp's f16;
#   prefill  tok/s over a D-token prompt (llama-bench -p D -n 0; kvlab's prefill of --ctx D).
# and then the app against the CLI: the built app driven over WebDriver under Xvfb (as the
# end-to-end tests drive it, tests/e2e/bench-app.mjs), greedy answers of 128 tokens whose
# stats line gives the decode rate, against `kvlab bench decode --ctx 32 --decode 128` from the
# same release build, at BENCH_THREADS and at the app's own default (physical cores - 1).
# Each figure is the best of BENCH_ROUNDS alternating rounds (the machine is shared: the best
# is the least disturbed). llama.cpp is built once from the llama-cpp-python 0.3.36 sdist on
# PyPI (its vendored llama.cpp), tools only, into $KVLAB_CACHE/llama.cpp; never committed.
# BENCH_APP=0 skips the app rows (no display server or tauri-driver needed then).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"

DEPTHS=(${BENCH_DEPTHS:-512 4096 16384})
THREADS="${BENCH_THREADS:-2}"
ROUNDS="${BENCH_ROUNDS:-2}"
GEN=32
LLAMA_DIR="$KVLAB_CACHE/llama.cpp"
LLAMA_BENCH="$LLAMA_DIR/build/bin/llama-bench"
SDIST_VERSION=0.3.36

build_llama_cpp() {
  [ -x "$LLAMA_BENCH" ] && return 0
  command -v cmake >/dev/null || as_root apt-get install -y -qq --no-install-recommends cmake >/dev/null
  mkdir -p "$LLAMA_DIR"
  local src="$LLAMA_DIR/llama_cpp_python-$SDIST_VERSION"
  if [ ! -d "$src" ]; then
    say "downloading the llama-cpp-python $SDIST_VERSION sdist (llama.cpp's sources)"
    python3 -m pip download --quiet --no-binary :all: --no-deps \
      "llama-cpp-python==$SDIST_VERSION" -d "$LLAMA_DIR"
    tar -xzf "$LLAMA_DIR/llama_cpp_python-$SDIST_VERSION.tar.gz" -C "$LLAMA_DIR"
  fi
  say "building llama-bench (once, -j2)"
  cmake -S "$src/vendor/llama.cpp" -B "$LLAMA_DIR/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    >"$LLAMA_DIR/build.log"
  cmake --build "$LLAMA_DIR/build" --target llama-bench -j2 >>"$LLAMA_DIR/build.log"
}

build_llama_cpp
# The app and the CLI from one release build with the test run's packages and features, so
# the two share every compiled crate and differ only in their thin front ends.
say "building kvlab and kvlab-app (release)"
cargo build --release --quiet "${TEST_PACKAGES[@]}"
KVLAB="$CARGO_TARGET_DIR/release/kvlab"
APP_BENCH="${BENCH_APP:-1}"
MODEL="${BENCH_MODEL:-$("$KVLAB" assets path gemma3-270m)}"
say "model $MODEL, $THREADS threads, depths ${DEPTHS[*]}, best of $ROUNDS rounds"

RESULTS="$(mktemp)"
trap 'rm -f "$RESULTS"' EXIT

# One line per measurement: "<who> <what> <depth> <tok/s>".
llama() { # depth kind
  local d="$1" kind="$2" args
  if [ "$kind" = decode ]; then args=(-p 0 -n "$GEN" -d "$d"); else args=(-p "$d" -n 0); fi
  "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -fa on -r 1 -o json "${args[@]}" 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
}
kvlab() { # depth kv -> "prefill decode"
  "$KVLAB" --threads "$THREADS" bench decode --model "$MODEL" --ctx "$1" --decode "$GEN" \
    --text paradise-lost --kv "$2" --json 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["prefill_tokens"]/r["prefill_secs"], r["decode_tokens"]/r["decode_secs"])'
}

for round in $(seq "$ROUNDS"); do
  for d in "${DEPTHS[@]}"; do
    say "round $round, depth $d"
    echo "llama decode $d $(llama "$d" decode)" >>"$RESULTS"
    read -r p t < <(kvlab "$d" f16)
    echo "kvlab prefill $d $p" >>"$RESULTS"
    echo "kvlab decode $d $t" >>"$RESULTS"
    echo "llama prefill $d $(llama "$d" prefill)" >>"$RESULTS"
    read -r p t < <(kvlab "$d" tq4@all)
    echo "kvlab-tq4 prefill $d $p" >>"$RESULTS"
    echo "kvlab-tq4 decode $d $t" >>"$RESULTS"
  done
done

# The app against the CLI: decode rates of 128-token answers at ~32 tokens of context.
app_decode() { # threads|"" -> best decode tok/s of BENCH_ROUNDS answers
  BENCH_APP_THREADS="$1" BENCH_APP_TOKENS=128 \
    KVLAB_APP_BIN="$CARGO_TARGET_DIR/release/kvlab-app" KVLAB_DEFAULT_MODEL="$MODEL" \
    xvfb-run -a -s "-screen 0 1440x900x24" node tests/e2e/bench-app.mjs 2>/dev/null | tail -1 |
    python3 -c 'import json,sys; print(max(json.load(sys.stdin)["decode"]))'
}
cli_decode() { # threads -> decode tok/s
  "$KVLAB" --threads "$1" bench decode --model "$MODEL" --ctx 32 --decode 128 --json 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["decode_tokens"]/r["decode_secs"])'
}
if [ "$APP_BENCH" != 0 ]; then
  npm_ci "$ROOT/tests/e2e"
  for round in $(seq "$ROUNDS"); do
    say "round $round, the app against the CLI"
    for t in "$THREADS" default; do
      # The app's own count: the app unset (it picks it), the CLI told `desktop`.
      if [ "$t" = default ]; then ct=desktop arg=""; else ct="$t" arg="$t"; fi
      echo "app decode $t $(BENCH_ROUNDS=1 app_decode "$arg")" >>"$RESULTS"
      echo "cli decode $t $(cli_decode "$ct")" >>"$RESULTS"
    done
  done
fi

python3 - "$RESULTS" <<'EOF'
import sys
from collections import defaultdict
best = defaultdict(float)
for line in open(sys.argv[1]):
    who, what, depth, ts = line.split()
    key = (who, what, int(depth) if depth.isdigit() else depth)
    best[key] = max(best[key], float(ts))
depths = sorted({k[2] for k in best if k[0] in ("llama", "kvlab", "kvlab-tq4")})
print()
print("| depth | llama.cpp decode | KV Lab f16 decode | ratio | KV Lab TQ-4 decode | TQ-4 / llama.cpp f16 | llama.cpp prefill | KV Lab prefill | ratio | TQ-4 / f16 prefill |")
print("|---|---|---|---|---|---|---|---|---|---|")
for d in depths:
    ld, kd, td = best[("llama", "decode", d)], best[("kvlab", "decode", d)], best[("kvlab-tq4", "decode", d)]
    lp, kp, tp = best[("llama", "prefill", d)], best[("kvlab", "prefill", d)], best[("kvlab-tq4", "prefill", d)]
    print(f"| {d} | {ld:.1f} | {kd:.1f} | {kd/ld:.2f} | {td:.1f} | {td/ld:.2f} | {lp:.0f} | {kp:.0f} | {kp/lp:.2f} | {tp/kp:.2f} |")
app_rows = sorted({k[2] for k in best if k[0] == "app"}, key=str)
if app_rows:
    print()
    print("| threads | app decode | CLI decode (same build) | app / CLI |")
    print("|---|---|---|---|")
    for t in app_rows:
        a, c = best[("app", "decode", t)], best[("cli", "decode", t)]
        print(f"| {t} | {a:.1f} | {c:.1f} | {a/c:.2f} |")
EOF
