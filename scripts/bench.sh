#!/usr/bin/env bash
# Speed side by side: KV Lab's CLI against llama.cpp's llama-bench on the same GGUF, same
# threads, alternating the two programs in one run, and a table of ratios. A benchmark, not
# a test: nothing here fails on a figure.
#
#   scripts/bench.sh                   the three models below, depths 512 4096 16384, 2 threads
#   BENCH_DEPTHS="512 4096 16384 32000" BENCH_THREADS=2 BENCH_ROUNDS=2 \
#   BENCH_MODELS="e2b-q4_k_m /path/model.gguf" scripts/bench.sh
#
# BENCH_MODELS (default "gemma3-270m e2b-q4_k_m e2b-q8_0") names GGUF files or these:
#   gemma3-270m   the offline Gemma 3 270M Q4_K_M (an asset)
#   e2b-q4_k_m    a shape-true Gemma 4 E2B (35 layers, hidden 1536, per-layer embeddings,
#   e2b-q8_0      random weights) converted and quantized by llama.cpp's own tools, built
#                 once into the cache dir by scripts/bench/e2b_gguf.sh (~15 min, 30 GB
#                 while building): the shapes users run, where the layer matmuls dominate
#                 (the 270M's 262k-row vocabulary projection hides them)
#
# For each depth D it measures
#   decode   tok/s of 32 generated tokens after D tokens of context (llama-bench -p 0 -n 32
#            -d D -fa on; kvlab bench decode --ctx D --decode 32 on the first D tokens of
#            Paradise Lost, so TurboQuant codes real keys and values), f16 KV on both sides,
#            and KV Lab's TurboQuant 4-bit cache (tq4@all) against llama.cpp's f16;
#   prefill  tok/s over a D-token prompt (llama-bench -p D -n 0; kvlab's prefill of --ctx D).
# and each decode's weight traffic as a share of the machine's stream copy rate (`kvlab bench
# stream`, measured each round: weight bytes a step reads times tok/s over bytes copied/s);
# then, per model and depth, where KV Lab's decode time goes (`kvlab bench decode --profile`,
# a separate run: profiling costs time), and then the app against the CLI: the built app driven over WebDriver under Xvfb (as the
# end-to-end tests drive it, tests/e2e/bench-app.mjs), greedy answers of 128 tokens whose
# stats line gives the decode rate, against `kvlab bench decode --ctx 32 --decode 128` from the
# same release build, at BENCH_THREADS and at the app's own default (physical cores - 1).
# Each figure is the best of BENCH_ROUNDS alternating rounds (the machine is shared: the best
# is the least disturbed). llama.cpp is built once from the llama-cpp-python 0.3.36 sdist on
# PyPI (its vendored llama.cpp; llama-bench and llama-quantize), into $KVLAB_CACHE/llama.cpp;
# never committed.
# BENCH_APP=0 skips the app rows (no display server or tauri-driver needed then).
# llama.cpp's cache types (BENCH_BLOCK_TYPES, default "q8_0 q4_0") get their own table:
# our decode with --kv TYPE against llama-bench -ctk TYPE -ctv TYPE, and against our f16.
# Every ratio to our f16 (TQ-4's and the block types') is taken in one process, the caches
# alternating (`bench decode --prefill-each`); our f16 against llama.cpp in its own.
# Then every cache of the app's menu against our f16, prefill and decode (BENCH_PRESETS=0
# skips it), and the time to first token through `kvlab serve` by conversation length (1 KB, 32 KB,
# 112 KB; scripts/bench/ttft.py, BENCH_TTFT=0 skips it). Last,
# scripts/bench/kld_llama_cpp.sh prints llama.cpp's own KL divergence of its cache types
# beside ours on the 270M (BENCH_KLD=0 skips it). Before it, scripts/bench/parallel.sh runs
# 1, 2, 4 and 8 clients at once through `kvlab serve --parallel 8` and llama-server -np 8
# (BENCH_PARALLEL=0 skips it), and `kvlab bench constrained` what a JSON schema costs a token
# (BENCH_CONSTRAINED=0 skips it).
# Above BENCH_FULL_DEPTH (default 4096) only the f16 decode rows and no profile are measured:
# the targets ask no more there, and on the E2B each extra 16k-token prefill costs ~8 minutes.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$ROOT"

DEPTHS=(${BENCH_DEPTHS:-512 4096 16384})
THREADS="${BENCH_THREADS:-2}"
ROUNDS="${BENCH_ROUNDS:-2}"
FULL_DEPTH="${BENCH_FULL_DEPTH:-4096}"
GEN=32
# llama.cpp's KV types measured beside f16 (decode against llama-bench -ctk/-ctv, prefill
# against our f16) up to BENCH_FULL_DEPTH.
BLOCK_TYPES=(${BENCH_BLOCK_TYPES:-q8_0 q4_0})
source "$ROOT/scripts/bench/llama_cpp.sh"
LLAMA_BENCH="$LLAMA_BIN/llama-bench"

APP_BENCH="${BENCH_APP:-1}"
# A fresh machine works too: system packages, the UI's npm packages and the offline assets
# (and, for the app rows, tauri-driver), then the UI the app embeds (its frontendDist).
"$ROOT/scripts/setup.sh" "$([ "$APP_BENCH" = 0 ] && echo run || echo test)"
lint_while_building
build_llama_cpp
if [ "$APP_BENCH" = 0 ]; then
  # No app rows: the CLI alone, with the test run's engine and codec features (the app's
  # release build, GTK and WebKit included, took ~15 minutes on a cold target).
  say "building kvlab (release)"
  cargo build --release --quiet -p kvlab-cli --features kvlab-engine/hub,kvlab-turboquant/bench
else
  say "building the UI"
  npm --prefix "$ROOT/ui" run --silent build >/dev/null
  # The app and the CLI from one release build with the test run's packages and features,
  # so the two share every compiled crate and differ only in their thin front ends.
  say "building kvlab and kvlab-app (release)"
  cargo build --release --quiet "${TEST_PACKAGES[@]}"
fi
KVLAB="$CARGO_TARGET_DIR/release/kvlab"
MODELS=(${BENCH_MODELS:-${BENCH_MODEL:-gemma3-270m e2b-q4_k_m e2b-q8_0}})
KVLAB_BIN="$KVLAB"
source "$ROOT/scripts/bench/models.sh"
declare -A PATHS
for m in "${MODELS[@]}"; do PATHS[$m]="$(model_path "$m")"; done
say "models ${MODELS[*]}, $THREADS threads, depths ${DEPTHS[*]}, best of $ROUNDS rounds"
# Which machine: ratios from an AVX2 CPU and an AVX-512 one are not the same figures.
if [ -r /proc/cpuinfo ]; then
  cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
else
  cpu="$(sysctl -n machdep.cpu.brand_string 2>/dev/null || true)"
fi
say "CPU: ${cpu:-unknown}, $(nproc 2>/dev/null || sysctl -n hw.ncpu) cores; KV Lab's kernels: $(
  "$KVLAB" --threads "$THREADS" bench stream --mib 64 --passes 1 --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["kernels"])')"

RESULTS="$(mktemp)"
trap 'rm -f "$RESULTS"' EXIT

# One line per measurement: "<model> <who> <what> <depth> <tok/s>".
llama() { # model depth kind [cache type]
  local d="$2" kind="$3" ty="${4:-f16}" args
  if [ "$kind" = decode ]; then args=(-p 0 -n "$GEN" -d "$d"); else args=(-p "$d" -n 0); fi
  "$LLAMA_BENCH" -m "${PATHS[$1]}" -t "$THREADS" -fa on -r 1 -o json -ctk "$ty" -ctv "$ty" \
    "${args[@]}" 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
}
kvlab() { # model depth kv -> "prefill decode weight-bytes-per-token"
  "$KVLAB" --threads "$THREADS" bench decode --model "${PATHS[$1]}" --ctx "$2" --decode "$GEN" \
    --text paradise-lost --kv "$3" --json 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["prefill_tokens"]/r["prefill_secs"], r["decode_tokens"]/r["decode_secs"], r["weights_bytes_per_token"])'
}
# Our f16, tq4@all and the block types in one process (`--prefill-each`: each prefills its own
# cache, then decodes from one shared prefill), alternating, so their ratios to our f16 are
# taken side by side: one "<kv> <prefill tok/s> <decode tok/s>" line per cache, f16 first.
kvlab_caches() { # model depth
  local kvs="f16,tq4@all" ty
  for ty in "${BLOCK_TYPES[@]}"; do kvs="$kvs,$ty"; done
  "$KVLAB" --threads "$THREADS" bench decode --model "${PATHS[$1]}" --ctx "$2" --decode "$GEN" \
    --text paradise-lost --kv "$kvs" --prefill-each --rounds 1 --json 2>/dev/null |
    python3 -c '
import json, sys
r = json.load(sys.stdin)
for kv, secs, row in zip(r["kv"], r["prefill_each_secs"], r["rows"]):
    print(kv, r["prefill_tokens"] / min(secs), r["decode_tokens"] / min(row["decode_secs"]))'
}
# The machine's stream copy rate (bytes read + written per second) on the same threads.
stream() {
  "$KVLAB" --threads "$THREADS" bench stream --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["copy_bytes_per_sec"])'
}

for round in $(seq "$ROUNDS"); do
  echo "stream copy rate 0 $(stream)" >>"$RESULTS"
  for m in "${MODELS[@]}"; do
    for d in "${DEPTHS[@]}"; do
      say "round $round, $m, depth $d"
      echo "$m llama decode $d $(llama "$m" "$d" decode)" >>"$RESULTS"
      read -r p t b < <(kvlab "$m" "$d" f16)
      echo "$m kvlab prefill $d $p" >>"$RESULTS"
      echo "$m kvlab decode $d $t" >>"$RESULTS"
      echo "$m weights bytes 0 $b" >>"$RESULTS"
      [ "$d" -gt "$FULL_DEPTH" ] && continue
      echo "$m llama prefill $d $(llama "$m" "$d" prefill)" >>"$RESULTS"
      # llama.cpp's own cache types on both sides, each program storing them its way.
      for ty in "${BLOCK_TYPES[@]}"; do
        echo "$m llama-$ty decode $d $(llama "$m" "$d" decode "$ty")" >>"$RESULTS"
      done
      # "kvlab-f16cmp": our f16 in the same process as the caches it is the ratio's base of.
      while read -r kv p t; do
        case "$kv" in f16) who=kvlab-f16cmp ;; tq4@all) who=kvlab-tq4 ;; *) who="kvlab-$kv" ;; esac
        echo "$m $who prefill $d $p" >>"$RESULTS"
        echo "$m $who decode $d $t" >>"$RESULTS"
      done < <(kvlab_caches "$m" "$d")
    done
  done
done

# Where the decode time goes, per model and depth (a separate, profiled run).
PROFILES="$(mktemp)"
trap 'rm -f "$RESULTS" "$PROFILES"' EXIT
for m in "${MODELS[@]}"; do
  for d in "${DEPTHS[@]}"; do
    [ "$d" -gt "$FULL_DEPTH" ] && continue
    {
      echo "$m, depth $d, f16 KV (ms per token, top rows):"
      "$KVLAB" --threads "$THREADS" bench decode --model "${PATHS[$m]}" --ctx "$d" \
        --decode "$GEN" --text paradise-lost --profile 2>/dev/null |
        sed -n '/decode profile/,$p' | sed -n '3,9p'
    } >>"$PROFILES"
  done
done

# Every cache of the app's menu against our f16, prefill and decode, in one process per
# model and depth (`kvlab bench decode --kv f16,presets --prefill-each`: each cache prefills
# the context into its own fresh cache, then decodes from one shared prefill, alternating
# rounds). BENCH_PRESET_MODELS (default: the 270M and E2B Q4_K_M), BENCH_PRESET_DEPTHS
# (default 4096 16384 on the 270M, 4096 on the E2B, whose 4k prefill takes ~1 min per cache
# and round); BENCH_PRESETS=0 skips it.
PRESETS_OUT="$(mktemp)"
trap 'rm -f "$RESULTS" "$PROFILES" "$PRESETS_OUT"' EXIT
if [ "${BENCH_PRESETS:-1}" != 0 ]; then
  for m in ${BENCH_PRESET_MODELS:-gemma3-270m e2b-q4_k_m}; do
    [ -n "${PATHS[$m]:-}" ] || PATHS[$m]="$(model_path "$m")"
    case "$m" in gemma3-270m) depths="${BENCH_PRESET_DEPTHS:-4096 16384}" ;;
      *) depths="${BENCH_PRESET_DEPTHS:-4096}" ;; esac
    for d in $depths; do
      say "menu caches against f16: $m, depth $d"
      {
        echo "$m, depth $d: every menu cache against our f16"
        "$KVLAB" --threads "$THREADS" bench decode --model "${PATHS[$m]}" --ctx "$d" \
          --decode "$GEN" --text paradise-lost --kv f16,presets --prefill-each \
          --rounds "$ROUNDS" 2>/dev/null | sed -n '2,$p'
      } >>"$PRESETS_OUT"
    done
  done
fi

# The app against the CLI: decode rates of 128-token answers at ~32 tokens of context.
app_decode() { # threads|"" -> best decode tok/s of BENCH_ROUNDS answers
  BENCH_APP_THREADS="$1" BENCH_APP_TOKENS=128 \
    KVLAB_APP_BIN="$CARGO_TARGET_DIR/release/kvlab-app" KVLAB_DEFAULT_MODEL="$APP_MODEL" \
    xvfb-run -a -s "-screen 0 1440x900x24" node tests/e2e/bench-app.mjs 2>/dev/null | tail -1 |
    python3 -c 'import json,sys; print(max(json.load(sys.stdin)["decode"]))'
}
cli_decode() { # threads -> decode tok/s
  "$KVLAB" --threads "$1" bench decode --model "$APP_MODEL" --ctx 32 --decode 128 --json 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["decode_tokens"]/r["decode_secs"])'
}
# The app on the model it opens by default (the offline 270M).
APP_MODEL="$("$KVLAB" assets path gemma3-270m)"
if [ "$APP_BENCH" != 0 ]; then
  npm_ci "$ROOT/tests/e2e"
  for round in $(seq "$ROUNDS"); do
    say "round $round, the app against the CLI"
    for t in "$THREADS" default; do
      # The app's own count: the app unset (it picks it), the CLI told `desktop`.
      if [ "$t" = default ]; then ct=desktop arg=""; else ct="$t" arg="$t"; fi
      echo "app app decode $t $(BENCH_ROUNDS=1 app_decode "$arg")" >>"$RESULTS"
      echo "app cli decode $t $(cli_decode "$ct")" >>"$RESULTS"
    done
  done
fi

python3 - "$RESULTS" "${MODELS[@]}" <<'EOF'
import sys
from collections import defaultdict
best = defaultdict(float)
for line in open(sys.argv[1]):
    model, who, what, depth, ts = line.split()
    key = (model, who, what, int(depth) if depth.isdigit() else depth)
    best[key] = max(best[key], float(ts))
for model in sys.argv[2:]:
    depths = sorted({k[3] for k in best if k[0] == model and k[1] == "llama"})
    if not depths:
        continue
    print()
    print(f"{model}:")
    print()
    print("| depth | llama.cpp decode | KV Lab f16 decode | ratio | KV Lab TQ-4 decode | TQ-4 / llama.cpp f16 | TQ-4 / KV Lab f16 | llama.cpp prefill | KV Lab prefill | ratio | TQ-4 / f16 prefill |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d in depths:
        g = lambda who, what: best[(model, who, what, d)]
        ld, kd, td = g("llama", "decode"), g("kvlab", "decode"), g("kvlab-tq4", "decode")
        lp, kp, tp = g("llama", "prefill"), g("kvlab", "prefill"), g("kvlab-tq4", "prefill")
        # TurboQuant against our f16 measured beside it in one process (alternating).
        cd, cp = g("kvlab-f16cmp", "decode"), g("kvlab-f16cmp", "prefill")
        # A figure not measured at this depth (above BENCH_FULL_DEPTH) prints as a dash.
        f = lambda x, fmt: format(x, fmt) if x else "–"
        r = lambda a, b: f"{a/b:.2f}" if a and b else "–"
        print(f"| {d} | {f(ld, '.1f')} | {f(kd, '.1f')} | {r(kd, ld)} | {f(td, '.1f')} | {r(td, ld)} | {r(td, cd)} | {f(lp, '.0f')} | {f(kp, '.0f')} | {r(kp, lp)} | {r(tp, cp)} |")
    # Decode as a share of the machine's bandwidth: the weight bytes a step reads times the
    # rate, over the stream copy rate measured in this run (KV bytes not counted).
    wb, copy = best[(model, "weights", "bytes", 0)], best[("stream", "copy", "rate", 0)]
    if wb and copy:
        print()
        print(f"Weights read per decode step {wb / 1e6:.0f} MB; stream copy {copy / 1e9:.1f} GB/s. "
              "Decode's weight traffic as a share of it:")
        print("| depth | llama.cpp | KV Lab f16 | KV Lab TQ-4 |")
        print("|---|---|---|---|")
        for d in depths:
            g = lambda who: best[(model, who, "decode", d)]
            sh = lambda x: f"{x * wb / copy:.0%}" if x else "–"
            print(f"| {d} | {sh(g('llama'))} | {sh(g('kvlab'))} | {sh(g('kvlab-tq4'))} |")
    types = sorted({k[1][len("llama-"):] for k in best if k[0] == model and k[1].startswith("llama-")})
    if types:
        print()
        print("| depth | cache | llama.cpp decode | KV Lab decode | ratio | / KV Lab f16 decode | / KV Lab f16 prefill |")
        print("|---|---|---|---|---|---|---|")
        for d in depths:
            for ty in types:
                g = lambda who, what: best[(model, who, what, d)]
                ld, kd = g(f"llama-{ty}", "decode"), g(f"kvlab-{ty}", "decode")
                if not (ld or kd):
                    continue
                kf, kpf = g("kvlab-f16cmp", "decode"), g("kvlab-f16cmp", "prefill")
                kp = g(f"kvlab-{ty}", "prefill")
                r = lambda a, b: f"{a/b:.2f}" if a and b else "–"
                print(f"| {d} | {ty} | {ld:.1f} | {kd:.1f} | {r(kd, ld)} | {r(kd, kf)} | {r(kp, kpf)} |")
app_rows = sorted({k[3] for k in best if k[0] == "app" and k[1] == "app"}, key=str)
if app_rows:
    print()
    print("| threads | app decode | CLI decode (same build) | app / CLI |")
    print("|---|---|---|---|")
    for t in app_rows:
        a, c = best[("app", "app", "decode", t)], best[("app", "cli", "decode", t)]
        print(f"| {t} | {a:.1f} | {c:.1f} | {a/c:.2f} |")
EOF
echo
cat "$PROFILES"
if [ -s "$PRESETS_OUT" ]; then
  echo
  cat "$PRESETS_OUT"
fi

# Time to first token by conversation length, through `kvlab serve` on the 270M with its
# chat template (scripts/bench/ttft.py: 1 KB, 32 KB and 112 KB conversations, each adding a
# ~20-token turn; then a 260 KB message over the context, refused). 112 KB, not 128: 128 KB
# of these texts is ~35k tokens, past the 270M's 32,768. BENCH_TTFT=0 skips it.
if [ "${BENCH_TTFT:-1}" != 0 ]; then
  say "time to first token through kvlab serve"
  port="${BENCH_TTFT_PORT:-18431}"
  "$KVLAB" --threads "$THREADS" serve --model "$APP_MODEL" --port "$port" --ctx 32768 \
    >/dev/null 2>&1 &
  serve_pid=$!
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break
    sleep 1
  done
  python3 "$ROOT/scripts/bench/ttft.py" --base "http://127.0.0.1:$port/v1" \
    --text "$("$KVLAB" assets path alice)" "$("$KVLAB" assets path paradise-lost)" \
    --sizes 1,32,112 --rounds "$ROUNDS" || true
  kill "$serve_pid" 2>/dev/null || true
  wait "$serve_pid" 2>/dev/null || true
fi

# Concurrent clients: `kvlab serve --parallel N` against llama-server -np N on the same GGUFs,
# threads and clients, then the compare view's panes and a long prefill beside the streams
# (scripts/bench/parallel.sh; BENCH_PARALLEL=0 skips it).
if [ "${BENCH_PARALLEL:-1}" != 0 ]; then
  say "concurrent clients against llama-server"
  KVLAB_BIN="$KVLAB" BENCH_THREADS="$THREADS" PARALLEL_ROUNDS="$ROUNDS" \
    "$ROOT/scripts/bench/parallel.sh" || true
fi

# What constrained decoding (JSON schemas) costs a token on the 270M and the E2B
# (BENCH_CONSTRAINED=0 skips it).
if [ "${BENCH_CONSTRAINED:-1}" != 0 ]; then
  for m in gemma3-270m e2b-q4_k_m; do
    say "constrained decoding, $m"
    "$KVLAB" --threads "$THREADS" bench constrained --model "$(model_path "$m")" \
      --tokens 64 --rounds "$((ROUNDS * 2 + 1))" || true
  done
fi

# llama.cpp's KL divergence beside ours, on the same GGUF and texts (BENCH_KLD=0 skips it).
if [ "${BENCH_KLD:-1}" != 0 ]; then
  KVLAB_BIN="$KVLAB" "$ROOT/scripts/bench/kld_llama_cpp.sh"
fi
