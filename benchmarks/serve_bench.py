#!/usr/bin/env python3
"""Aggregate decode throughput and time to first token of an OpenAI-style
server (`silica serve`, or llama.cpp's `llama-server`), the figures of
BENCHMARKS.md's server table. Standard library only.

For each concurrency C: C client threads each send streaming
/v1/completions requests back to back (a fixed prompt, --max-tokens tokens,
--temperature, 0 by default) for --seconds; the aggregate rate is the number of content
chunks (one per token on both servers) that arrived inside the window, over
the window. The time to first token is the median, over --ttft-rounds
sequential requests with a 16-token prompt on the idle server, of the time
from sending the request to the first content chunk: "new" prompts each
start with another word, so that neither server can reuse an earlier
request's KV cache; "repeated" sends the same prompt each time, which both
servers answer from the cache of the one before (all but its last token).

    python3 benchmarks/serve_bench.py --url http://127.0.0.1:8080 --concurrency 1,8,32,64
"""

import argparse
import http.client
import json
import statistics
import threading
import time
from urllib.parse import urlparse

PROMPT = "The history of the river begins in the mountains, where"
PROMPT16 = "Write one sentence about the sea and the ships that sail on it today:"
# first words for the "new" prompts: one token each in the models measured
FIRST_WORDS = ["Write", "Tell", "Give", "Say", "Name", "List", "Show", "Find",
               "Make", "Take", "Keep", "Call", "Read", "Send", "Pick", "Draw"]


def stream(url, prompt, max_tokens, extra=None, until=None, temperature=0.0):
    """Sends one streaming completion; returns (tokens, seconds to first
    content, total seconds). With `until` (a perf_counter time), only tokens
    before it count and the stream is left there."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    body.update(extra or {})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]}")
    first, chunks = None, 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        v = json.loads(data)
        for ch in v.get("choices", []):
            if ch.get("text") or ch.get("content"):
                if until is not None and time.perf_counter() > until:
                    conn.close()
                    return chunks, first, time.perf_counter() - t0
                chunks += 1
                if first is None:
                    first = time.perf_counter() - t0
        if v.get("stop") is True:  # llama-server's final chunk
            break
    conn.close()
    return chunks, first, time.perf_counter() - t0


def load(url, c, seconds, max_tokens, extra, temperature):
    done = []
    lock = threading.Lock()
    end = time.perf_counter() + seconds
    start = time.perf_counter()

    def client():
        while time.perf_counter() < end:
            n, _, _ = stream(url, PROMPT, max_tokens, extra, until=end, temperature=temperature)
            with lock:
                done.append(n)

    threads = [threading.Thread(target=client) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    window = min(time.perf_counter(), end) - start
    return sum(done) / window, len(done)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--ttft-rounds", type=int, default=10)
    p.add_argument("--label", default="server")
    p.add_argument("--temperature", type=float, default=0.0, help="of the streams (not of the TTFT prompts); 0 is greedy")
    p.add_argument("--top-p", type=float, default=None, help="of the streams, as --temperature")
    p.add_argument("--top-k", type=int, default=None, help="of the streams (an extension both servers take)")
    p.add_argument("--llama-server", action="store_true", help="ask llama-server to ignore EOS as silica's random models rarely end")
    a = p.parse_args()
    extra = {"ignore_eos": True} if a.llama_server else {}
    stream(a.url, PROMPT, 8, extra)  # warm-up
    rest = PROMPT16.split(" ", 1)[1]
    new = [f"{FIRST_WORDS[i % len(FIRST_WORDS)]} {rest}" for i in range(a.ttft_rounds)]
    for kind, prompts in (("new", new), ("repeated", [PROMPT16] * a.ttft_rounds)):
        ttft = [stream(a.url, q, 1, extra)[1] for q in prompts]
        ttft = [t for t in ttft if t is not None]
        print(f"{a.label}: time to first token (16-token prompt, {kind}, idle): median {1e3 * statistics.median(ttft):.1f} ms")
    cuts = {k: v for k, v in (("top_p", a.top_p), ("top_k", a.top_k)) if v is not None}
    base = None
    for c in [int(x) for x in a.concurrency.split(",")]:
        rate, n = load(a.url, c, a.seconds, a.max_tokens, {**extra, **cuts}, a.temperature)
        base = base or rate
        print(f"{a.label}: {c:>3} streams: {rate:8.1f} tok/s aggregate ({n} requests, {rate / base:.2f}x one stream)")


if __name__ == "__main__":
    main()
