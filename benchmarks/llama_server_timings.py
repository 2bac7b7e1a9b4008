#!/usr/bin/env python3
"""Decode and prompt speed of a running llama-server, from the timings it
reports with each completion (so that HTTP and the client cost nothing):
one warm-up, then three 128-token decodes from "Once" and three prompts of
FILE with the prompt cache off.

    python3 benchmarks/llama_server_timings.py http://127.0.0.1:8096 LABEL FILE
"""

import json
import sys
import urllib.request


def post(url, body):
    req = urllib.request.Request(
        url + "/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req) as r:
        return json.load(r)["timings"]


def main():
    url, label, prompt_file = sys.argv[1], sys.argv[2], sys.argv[3]
    post(url, {"prompt": "Once", "n_predict": 16, "temperature": 0})
    decode = [
        post(url, {"prompt": "Once", "n_predict": 128, "temperature": 0, "ignore_eos": True, "cache_prompt": False})
        for _ in range(3)
    ]
    text = open(prompt_file, encoding="utf-8").read()
    prompt = [post(url, {"prompt": text, "n_predict": 1, "temperature": 0, "cache_prompt": False}) for _ in range(3)]
    rates = ", ".join(f"{t['predicted_per_second']:.1f}" for t in decode)
    times = ", ".join(f"{t['prompt_ms']:.1f}" for t in prompt)
    print(f"{label}: decode {rates} tok/s; prompt {prompt[0]['prompt_n']} tokens {times} ms")


if __name__ == "__main__":
    main()
