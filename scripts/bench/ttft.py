#!/usr/bin/env python3
"""Time to first token through `kvlab serve`, by conversation length (scripts/bench.sh).

For each size S (KB) one conversation is opened: a user turn holding the first S KB of the
text (Alice, then Paradise Lost), answered with one token so the server's cache holds it.
Then the measured turn: the same conversation, the answer, and a new question of about 20
tokens, streamed; its time to first token is the time to the first content chunk, as a
client sees it. Each size is measured ROUNDS times (a fresh question each time, so every
round adds 20 new tokens to the same held history) and the best is kept. Last, a single
message of 260 KB (past the context) is sent and the time to its refusal printed.

Prints a table and, with --json, one JSON object. The standard library only.
"""

import argparse
import http.client
import json
import sys
import time
import urllib.parse


def post(base, path, body, stream=False):
    url = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=3600)
    data = json.dumps(body).encode()
    conn.request("POST", url.path.rstrip("/") + path, body=data,
                 headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def first_token(base, messages, max_tokens=8):
    """Streams one chat turn: (seconds to the first content chunk, usage, status)."""
    start = time.perf_counter()
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    conn, resp = post(base, "/chat/completions", body, stream=True)
    if resp.status != 200:
        resp.read()
        conn.close()
        return time.perf_counter() - start, None, resp.status
    ttft, usage = None, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            if ttft is None and choice.get("delta", {}).get("content"):
                ttft = time.perf_counter() - start
    conn.close()
    return ttft, usage, 200


def answer(base, messages):
    body = {"messages": messages, "max_tokens": 1, "temperature": 0}
    conn, resp = post(base, "/chat/completions", body)
    out = json.loads(resp.read())
    conn.close()
    if resp.status != 200:
        raise SystemExit(f"opening turn failed: {out}")
    return out["choices"][0]["message"]["content"], out["usage"]


QUESTIONS = [
    "In one sentence, who is the main character of this story?",
    "In one sentence, where does the story take place at the start?",
    "In one sentence, what happens first in the story, briefly?",
    "In one sentence, what is the mood of the opening lines?",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="http://127.0.0.1:PORT/v1")
    ap.add_argument("--text", nargs="+", required=True, help="text files, read in order")
    ap.add_argument("--sizes", default="1,32,128", help="conversation sizes in KB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    text = "".join(open(p, encoding="utf-8", errors="replace").read() for p in args.text)
    rows = []
    for kb in [int(s) for s in args.sizes.split(",")]:
        doc = text[: kb * 1024]
        history = [{"role": "user", "content": doc + "\n\nRead this."}]
        t = time.perf_counter()
        reply, usage = answer(args.base, history)
        opened = time.perf_counter() - t
        history.append({"role": "assistant", "content": reply})
        best = None
        for r in range(args.rounds):
            q = QUESTIONS[r % len(QUESTIONS)] + f" ({r})"
            ttft, use, status = first_token(args.base, history + [{"role": "user", "content": q}])
            if status != 200 or ttft is None:
                raise SystemExit(f"{kb} KB: turn failed with HTTP {status}")
            cached = (use or {}).get("reused_tokens", (use or {}).get("prompt_tokens_details", {}).get("cached_tokens"))
            row = {"kb": kb, "bytes": len(doc.encode()), "prompt_tokens": use["prompt_tokens"],
                   "cached_tokens": cached, "ttft_s": ttft, "open_s": opened}
            if best is None or ttft < best["ttft_s"]:
                best = row
        rows.append(best)
    # A message past the context: refused, and how fast.
    big = (text * 4)[: 260 * 1024]
    t = time.perf_counter()
    _, _, status = first_token(args.base, [{"role": "user", "content": big}])
    refused = {"bytes": len(big.encode()), "status": status, "seconds": time.perf_counter() - t}
    base_ttft = rows[0]["ttft_s"]
    if args.json:
        print(json.dumps({"rows": rows, "refused": refused}))
        return
    print(f"{'conversation':>12} {'prompt tok':>10} {'cached':>8} {'TTFT s':>8} {'/ 1st row':>9} {'µs/byte':>8}")
    for r in rows:
        print(f"{r['kb']:>9} KB {r['prompt_tokens']:>10} {r['cached_tokens']!s:>8} "
              f"{r['ttft_s']:>8.3f} {r['ttft_s'] / base_ttft:>9.2f} {r['ttft_s'] / r['bytes'] * 1e6:>8.2f}")
    print(f"260 KB message past the context: HTTP {refused['status']} in {refused['seconds']:.3f} s")


if __name__ == "__main__":
    sys.exit(main())
