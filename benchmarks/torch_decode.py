#!/usr/bin/env python3
"""Decode speed of PyTorch + transformers on a Llama-family model, the peer
of `silica generate` in BENCHMARKS.md.

With --gguf the weights are SmolLM2's, dequantized by transformers (the
same values silica dequantizes at load); without it a randomly initialised
model of SmolLM2-135M's shape is used (speed does not depend on values).

    python3 benchmarks/torch_decode.py --device cpu --dtype float32 --threads 2 --gguf PATH
    python3 benchmarks/torch_decode.py --device cuda --dtype float16
    python3 benchmarks/torch_decode.py --device cuda --dtype float16 --shape llama-1b --compile
"""

import argparse
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
    rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
)
# Llama 3.2 1B, the shape of `silica quantize --synthetic llama-1b`
LLAMA_1B = dict(
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
)
SHAPES = {"smollm2-135m": SMOLLM2_135M, "llama-1b": LLAMA_1B}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--gguf", help="a GGUF file to load instead of random weights")
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES),
                    help="the shape of the random-weight model")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.gguf:
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(args.gguf)), gguf_file=os.path.basename(args.gguf), dtype=dtype)
    else:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**SHAPES[args.shape])).to(dtype)
    model = model.to(args.device).eval()
    if args.compile:
        model.forward = torch.compile(model.forward)
    ids = torch.randint(100, 40000, (1, args.prompt_tokens), device=args.device)
    rates = []
    for r in range(args.rounds + 1):  # the first round warms up
        with torch.no_grad():
            if args.device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(ids, do_sample=False, max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, pad_token_id=0)
            if args.device == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t
        n = out.shape[1] - ids.shape[1]
        if r > 0:
            rates.append(n / dt)
    print(f"torch {torch.__version__} {args.device} {args.dtype} threads={torch.get_num_threads()} "
          f"{'gguf' if args.gguf else 'random ' + args.shape} weights: decode {statistics.median(rates):.1f} tok/s "
          f"(median of {args.rounds}, {args.new_tokens} new tokens after {args.prompt_tokens}, prefill included)")


if __name__ == "__main__":
    main()
