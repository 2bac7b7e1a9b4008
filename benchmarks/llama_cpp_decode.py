#!/usr/bin/env python3
"""Prefill and decode speed of llama.cpp (through llama-cpp-python) on a GGUF
model, the peer of `silica generate` in BENCHMARKS.md.

What is measured, round by round, the way `silica generate` measures it
(crates/silica-models/src/generate.rs):

- prefill: the context is reset, then a prompt of exactly --prompt-tokens
  tokens (a fixed English text, tokenized, repeated and cut to the count) is
  evaluated in one call (`llm.eval`, one batch since n_batch=512), ending
  when the logits of the last prompt token are ready. silica's prefill time
  is the same thing: one forward pass over the whole prompt plus reading
  back the last logits. Reported as prompt tokens / prefill seconds (silica
  prints the prefill time in ms; tok/s = prompt tokens / that time).
- decode: from that state, --tokens tokens are generated greedily, one at a
  time: the first is sampled from the prefill's logits, each further one
  needs one single-token forward pass (`llm.eval([token])`) and a greedy
  sample (`llm.sample(temp=0)`, argmax inside llama.cpp's sampler). Only
  this loop is timed. As in silica (`decode_tokens_per_second`), the rate
  counts the generated tokens after the first, i.e. the tokens that each
  cost one forward pass: decode tok/s = (--tokens - 1) / loop seconds.
  Unlike silica, an end-of-generation token does not stop the loop (so every
  round does the same work); the count of such tokens is reported.

One untimed warm-up round (--warmup) comes first; the final line gives the
medians over --rounds rounds. Threads: n_threads (decode) and
n_threads_batch (prefill) are both --threads; compare with silica's CPU
backend at the same thread count.

    python3 benchmarks/llama_cpp_decode.py --model PATH.gguf [--threads 2] [--rounds 3] \
        [--tokens 128] [--prompt-tokens 128] [--json]

Needs `pip install llama-cpp-python` (built from source, e.g.
CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python).
"""

import argparse
import json
import os
import statistics
import sys
import time

import llama_cpp

TEXT = (
    "The history of the printing press begins in the fifteenth century, when "
    "Johannes Gutenberg combined movable metal type, oil-based ink and a screw "
    "press adapted from those used to make wine. Books, which had been copied "
    "by hand for centuries, could now be produced in hundreds of identical "
    "copies, and within a few decades printing shops had opened in most of the "
    "large cities of Europe. Ideas travelled faster than ever before, scholars "
    "could compare the same text in different places, and reading slowly "
    "became a common skill rather than a rare privilege. "
)


def prompt_tokens(llm, n):
    pieces = llm.tokenize(TEXT.encode(), add_bos=False)
    bos = llm.tokenize(b"", add_bos=True)  # [] when the model adds no BOS
    tokens = list(bos)
    while len(tokens) < n:
        tokens += pieces
    return tokens[:n]


def is_eog(llm, token):
    try:
        return bool(llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm.model), token))
    except (AttributeError, TypeError):
        return token == llm.token_eos()


def one_round(llm, prompt, n_new):
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    llama_cpp.llama_synchronize(llm.ctx)
    prefill_s = time.perf_counter() - t

    eog = 0
    t = time.perf_counter()
    token = llm.sample(temp=0.0)
    generated = 1
    while generated < n_new:
        eog += is_eog(llm, token)
        llm.eval([token])
        token = llm.sample(temp=0.0)
        generated += 1
    eog += is_eog(llm, token)
    decode_s = time.perf_counter() - t
    return dict(
        prefill_s=prefill_s,
        prefill_tok_s=len(prompt) / prefill_s,
        decode_s=decode_s,
        decode_tok_s=(n_new - 1) / decode_s if n_new > 1 else 0.0,
        eog_tokens=eog,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file")
    ap.add_argument("--threads", type=int, default=2, help="n_threads and n_threads_batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per round")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds before the timed ones")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args()
    n_ctx = 1024
    if args.prompt_tokens < 1 or args.tokens < 1 or args.rounds < 1:
        ap.error("--prompt-tokens, --tokens and --rounds must be at least 1")
    if args.prompt_tokens + args.tokens > n_ctx:
        ap.error(f"--prompt-tokens + --tokens must fit the context of {n_ctx}")

    llm = llama_cpp.Llama(model_path=args.model, n_threads=args.threads,
                          n_threads_batch=args.threads, n_ctx=n_ctx, verbose=False, n_batch=512)
    prompt = prompt_tokens(llm, args.prompt_tokens)
    version = llama_cpp.__version__

    for _ in range(args.warmup):
        one_round(llm, prompt, args.tokens)
    rounds = []
    for r in range(args.rounds):
        res = one_round(llm, prompt, args.tokens)
        rounds.append(res)
        if not args.json:
            print(f"round {r + 1}: prefill {res['prefill_s'] * 1e3:.1f} ms ({res['prefill_tok_s']:.1f} tok/s, "
                  f"{len(prompt)} tokens), decode {res['decode_tok_s']:.1f} tok/s "
                  f"({args.tokens} tokens in {res['decode_s']:.3f} s"
                  + (f", {res['eog_tokens']} end-of-generation tokens" if res["eog_tokens"] else "") + ")",
                  flush=True)
    prefill = statistics.median(r["prefill_tok_s"] for r in rounds)
    decode = statistics.median(r["decode_tok_s"] for r in rounds)
    if args.json:
        print(json.dumps(dict(
            engine="llama.cpp", llama_cpp_python=version, model=os.path.abspath(args.model),
            n_threads=args.threads, n_threads_batch=args.threads, n_ctx=n_ctx, n_batch=512,
            prompt_tokens=len(prompt), new_tokens=args.tokens, rounds=args.rounds, warmup=args.warmup,
            prefill_tok_s=prefill, decode_tok_s=decode,
            prefill_ms=statistics.median(r["prefill_s"] for r in rounds) * 1e3,
            per_round=rounds,
            system_info=llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        )))
    else:
        print(f"llama.cpp {version} n_threads={args.threads}: prefill {prefill:.1f} tok/s "
              f"({len(prompt)}-token prompt), decode {decode:.1f} tok/s "
              f"(median of {args.rounds} rounds)")
    llm.close()


if __name__ == "__main__":
    sys.exit(main())
