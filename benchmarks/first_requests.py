#!/usr/bin/env python3
"""Time to first token of a server's first requests, one by one: the
figures of docs/tuning.md's "Server warm-up step". Standard library only.

The client first makes a request of its own (GET /v1/models), so that the
times do not include its own first connection; then it sends N streaming
/v1/completions requests in turn (a 12-word prompt, 4 tokens, temperature
0) and prints, for each, the time from sending it to its first content
chunk.

    silica serve --model s135.gguf --port 8095 &
    python3 benchmarks/first_requests.py http://127.0.0.1:8095 6
"""
import argparse
import json
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("requests", type=int, nargs="?", default=6)
    args = ap.parse_args()
    urllib.request.urlopen(args.url + "/v1/models").read()
    body = json.dumps(
        {
            "prompt": "The quick brown fox jumps over the lazy dog and the cat sat on",
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    times = []
    for _ in range(args.requests):
        req = urllib.request.Request(
            args.url + "/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        t = time.perf_counter()
        with urllib.request.urlopen(req) as r:
            for line in r:
                if line.startswith(b"data: ") and b'"text"' in line:
                    times.append((time.perf_counter() - t) * 1e3)
                    break
            r.read()
    print("time to first token, request by request (ms):", " ".join(f"{v:.1f}" for v in times))


if __name__ == "__main__":
    main()
