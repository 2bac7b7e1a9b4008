#!/usr/bin/env python3
"""Sentence-embedding speed of sentence-transformers (PyTorch), the peer of
`silica embed` in BENCHMARKS.md: throughput on batches of 32 mixed-length
sentences and the median latency of one sentence.

    python3 benchmarks/torch_embed.py --model DIR --device cpu --threads 2
"""

import argparse
import statistics
import time

import torch
from sentence_transformers import SentenceTransformer

from embed_sentences import SENTENCES


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="the all-MiniLM-L6-v2 folder")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # f32 as silica computes, whatever dtype the folder's weights are stored in
    model = SentenceTransformer(args.model, device=args.device).float()
    model.encode(SENTENCES, batch_size=32)  # warm-up
    rates = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        model.encode(SENTENCES, batch_size=32)
        rates.append(len(SENTENCES) / (time.perf_counter() - t))
    lat = []
    for s in SENTENCES[:32]:
        t = time.perf_counter()
        model.encode([s], batch_size=1)
        lat.append(time.perf_counter() - t)
    print(f"sentence-transformers (torch {torch.__version__}) {args.device} threads={torch.get_num_threads()}: "
          f"{statistics.median(rates):.1f} sentences/s in batches of 32 ({len(SENTENCES)} sentences), "
          f"batch-1 latency p50 {statistics.median(lat) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
