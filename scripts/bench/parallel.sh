#!/usr/bin/env bash
# Concurrent clients, KV Lab against llama.cpp on the same GGUF, threads and clients: KV Lab
# steps every running stream in one forward pass (`kvlab serve --parallel N`), llama-server
# batches its slots (`-np N`, continuous batching on by default upstream). Each server is
# driven by the same client (scripts/bench/parallel.py: N streaming /v1/completions at once,
# greedy), rounds alternating the two, and a table of ratios. Then `kvlab bench parallel` in
# process: the compare view's panes against a lone chat, and the streams' inter-token latency
# while another client prefills ~4k tokens. A benchmark: it prints, it fails on nothing but
# a broken run.
#
#   scripts/bench/parallel.sh                       the 270M and the synthetic E2B Q4_K_M
#   PARALLEL_MODELS="gemma3-270m" PARALLEL_CLIENTS=1,2,4,8 PARALLEL_TOKENS=96 \
#   PARALLEL_ROUNDS=2 BENCH_THREADS=2 scripts/bench/parallel.sh
#
# KVLAB_BIN names a built `kvlab` (release); otherwise it is built here.
set -euo pipefail
source "$(dirname "$0")/../common.sh"
cd "$ROOT"
source "$ROOT/scripts/bench/llama_cpp.sh"
source "$ROOT/scripts/bench/models.sh"

THREADS="${BENCH_THREADS:-2}"
CLIENTS="${PARALLEL_CLIENTS:-1,2,4,8}"
TOKENS="${PARALLEL_TOKENS:-96}"
ROUNDS="${PARALLEL_ROUNDS:-2}"
MODELS=(${PARALLEL_MODELS:-gemma3-270m e2b-q4_k_m})
MOST="$(tr ',' '\n' <<<"$CLIENTS" | sort -n | tail -1)"
build_llama_cpp
kvlab_release
TEXT="$("$KVLAB_BIN" assets path paradise-lost)"
OUT="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$OUT"
}
trap cleanup EXIT
wait_up() { # port
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "the server on port $1 never came up" >&2
  return 1
}
serve() { # who model port -> pid
  case "$1" in
    kvlab) "$KVLAB_BIN" --threads "$THREADS" serve --model "$2" --port "$3" --parallel "$MOST" \
      --ctx 4096 >"$OUT/$1.log" 2>&1 & ;;
    llama) "$LLAMA_BIN/llama-server" -m "$2" --port "$3" -t "$THREADS" -np "$MOST" \
      -c $((4096 * MOST)) -fa on >"$OUT/$1.log" 2>&1 & ;;
  esac
  echo $!
}
for m in "${MODELS[@]}"; do
  path="$(model_path "$m")"
  say "$m: $CLIENTS clients, $TOKENS tokens each, $THREADS threads, best of $ROUNDS alternating rounds"
  for round in $(seq "$ROUNDS"); do
    for who in kvlab llama; do
      port=$((18500 + RANDOM % 1000))
      pid="$(serve "$who" "$path" "$port")"
      PIDS+=("$pid")
      wait_up "$port"
      python3 "$ROOT/scripts/bench/parallel.py" --base "http://127.0.0.1:$port/v1" \
        --clients "$CLIENTS" --tokens "$TOKENS" --text "$TEXT" --label "$who" --json \
        >>"$OUT/$m.$who.jsonl"
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    done
  done
  python3 - "$m" "$OUT/$m.kvlab.jsonl" "$OUT/$m.llama.jsonl" <<'PY'
import json, sys
name, ours, theirs = sys.argv[1:4]
def best(path):
    rows = {}
    for line in open(path):
        for r in json.loads(line)["rows"]:
            if "failed" in r:
                continue
            b = rows.get(r["clients"])
            if b is None:
                rows[r["clients"]] = dict(r)
            else:
                b["aggregate_tok_per_s"] = max(b["aggregate_tok_per_s"], r["aggregate_tok_per_s"])
                for k in ("itl_median_ms", "itl_p95_ms", "ttft_median_s", "ttft_max_s"):
                    b[k] = min(b[k], r[k])
    return rows
a, b = best(ours), best(theirs)
print()
print(f"{name}:")
print()
print("| clients | KV Lab tok/s | × its one stream | ITL p95 ms | llama-server tok/s | × its one stream | ITL p95 ms | KV Lab / llama-server |")
print("|---|---|---|---|---|---|---|---|")
for n in sorted(set(a) | set(b)):
    x, y = a.get(n), b.get(n)
    f = lambda r, k, fmt: format(r[k], fmt) if r else "–"
    s = lambda rows, r: f"{r['aggregate_tok_per_s'] / rows[1]['aggregate_tok_per_s']:.2f}" if r and 1 in rows else "–"
    ratio = f"{x['aggregate_tok_per_s'] / y['aggregate_tok_per_s']:.2f}" if x and y else "–"
    print(f"| {n} | {f(x, 'aggregate_tok_per_s', '.1f')} | {s(a, x)} | {f(x, 'itl_p95_ms', '.1f')} | "
          f"{f(y, 'aggregate_tok_per_s', '.1f')} | {s(b, y)} | {f(y, 'itl_p95_ms', '.1f')} | {ratio} |")
PY
  say "$m: the compare view and a 4k prefill beside the streams (kvlab bench parallel)"
  "$KVLAB_BIN" --threads "$THREADS" bench parallel --model "$path" --clients 1,3 \
    --tokens "$TOKENS" --prefill-load 16000 --rounds "$ROUNDS" 2>/dev/null | sed -n '2,$p'
done
