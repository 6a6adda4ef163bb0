#!/usr/bin/env python3
"""Concurrent streaming clients against an OpenAI-compatible server (scripts/bench.sh runs it
on `kvlab serve --parallel N` and on llama-server -np N, same GGUF, threads and clients).

For each client count N, N clients stream /v1/completions at once: greedy, MAX_TOKENS tokens
each, a prompt of its own (a passage of the text). Printed per N, as `kvlab bench parallel`
prints them: the aggregate decode rate over the time all N stream together (from the last
client's first token to the first client's last token, tokens arriving inside it over its
length), the inter-token gaps inside it (median, p95), and the time to first token (median,
max). The standard library only.
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def stream(base, prompt, max_tokens, out):
    url = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=3600)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    submitted = time.perf_counter()
    conn.request("POST", url.path.rstrip("/") + "/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    times = []
    if resp.status != 200:
        out.append({"status": resp.status, "submitted": submitted, "times": times})
        resp.read()
        conn.close()
        return
    for raw in resp:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices", []):
            if choice.get("text"):
                times.append(time.perf_counter())
    conn.close()
    out.append({"status": 200, "submitted": submitted, "times": times})


def pct(v, p):
    if not v:
        return 0.0
    v = sorted(v)
    return v[round((len(v) - 1) * p)]


def run(base, n, prompts, max_tokens):
    results = []
    threads = [threading.Thread(target=stream, args=(base, prompts[i % len(prompts)], max_tokens, results))
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if r["status"] == 200 and r["times"]]
    if len(ok) < n:
        return {"clients": n, "failed": n - len(ok)}
    start = max(r["times"][0] for r in ok)
    end = min(r["times"][-1] for r in ok)
    inside = sum(1 for r in ok for t in r["times"] if start < t <= end)
    gaps = [(b - a) * 1e3 for r in ok for a, b in zip(r["times"], r["times"][1:]) if start <= b <= end]
    ttft = [r["times"][0] - r["submitted"] for r in ok]
    return {
        "clients": n,
        "aggregate_tok_per_s": inside / (end - start) if end > start else 0.0,
        "itl_median_ms": pct(gaps, 0.5),
        "itl_p95_ms": pct(gaps, 0.95),
        "ttft_median_s": statistics.median(ttft),
        "ttft_max_s": max(ttft),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--text", required=True, help="a text file the prompts are cut from")
    ap.add_argument("--prompt-bytes", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--label", default="server")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    text = open(a.text, encoding="utf-8").read()
    prompts = [text[(i * 7919 * 64) % len(text):][: a.prompt_bytes] for i in range(64)]
    # One short request first: the model warm, the server's first-request costs paid.
    run(a.base, 1, prompts[:1], 8)
    rows = []
    for n in [int(x) for x in a.clients.split(",")]:
        best = None
        for _ in range(a.rounds):
            r = run(a.base, n, prompts, a.tokens)
            if best is None or r.get("aggregate_tok_per_s", 0) > best.get("aggregate_tok_per_s", 0):
                best = r
        rows.append(best)
        print(f"{a.label}: {n} clients {best.get('aggregate_tok_per_s', 0):.1f} tok/s", file=sys.stderr)
    if a.json:
        print(json.dumps({"label": a.label, "rows": rows}))
        return
    one = next((r["aggregate_tok_per_s"] for r in rows if r["clients"] == 1), None)
    print(f"| {a.label} clients | aggregate tok/s | × one stream | ITL median ms | ITL p95 ms | TTFT median s | TTFT max s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            print(f"| {r['clients']} | {r['failed']} failed | | | | | |")
            continue
        x = f"{r['aggregate_tok_per_s'] / one:.2f}" if one else "–"
        print(f"| {r['clients']} | {r['aggregate_tok_per_s']:.1f} | {x} | {r['itl_median_ms']:.1f} | "
              f"{r['itl_p95_ms']:.1f} | {r['ttft_median_s']:.3f} | {r['ttft_max_s']:.3f} |")


if __name__ == "__main__":
    main()
