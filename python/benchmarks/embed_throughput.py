"""`Embedder.encode` against `silica embed` on the same sentences.

The tool embeds once per process, so its time includes the first use of
each kernel; the first `encode` of a fresh `Embedder` is its counterpart
(printed as "first call"), later calls are warm:

    python python/benchmarks/embed_throughput.py [--device gpu] [--runs 3]
        [--file benchmarks/sentences.txt] [--cli target/release/silica]
        [--model DIR] [--dtype f32|f16]
"""

import argparse
import re
import statistics
import subprocess
import time

import silica


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--file", default="benchmarks/sentences.txt")
    ap.add_argument("--cli", default="target/release/silica")
    ap.add_argument("--model", default=None, help="a sentence-transformers folder (default: the built-in one)")
    ap.add_argument("--dtype", default="f32")
    args = ap.parse_args()
    sentences = [line for line in open(args.file, encoding="utf-8").read().splitlines() if line.strip()]
    dev = silica.Device(args.device) if args.device else silica.default_device()
    n = len(sentences)

    tool = []
    for _ in range(args.runs):
        out = subprocess.run(
            [args.cli, "embed", "--file", args.file, "--output", "/tmp/silica_embed_bench.npy",
             "--batch-size", str(args.batch_size), "--device", args.device or "gpu", "--dtype", args.dtype]
            + (["--model", args.model] if args.model else []),
            capture_output=True, text=True, check=True,
        ).stdout
        tool.append(float(re.search(r"embedded in ([0-9.]+) s", out).group(1)))

    first, warm = [], []
    for _ in range(args.runs):
        model = silica.Embedder(args.model, device=dev, dtype=args.dtype)
        t = time.perf_counter()
        model.encode(sentences, batch_size=args.batch_size)
        first.append(time.perf_counter() - t)
        for _ in range(2):
            t = time.perf_counter()
            model.encode(sentences, batch_size=args.batch_size)
            warm.append(time.perf_counter() - t)
        del model

    def rate(times):
        return n / statistics.median(times)

    print(f"{dev}: {n} sentences, batches of {args.batch_size}, {args.dtype}, median of {args.runs} runs")
    print(f"  silica embed              {rate(tool):8.1f} sentences/s  ({', '.join(f'{t:.3f}' for t in tool)} s)")
    print(f"  Embedder.encode, first    {rate(first):8.1f} sentences/s  ({', '.join(f'{t:.3f}' for t in first)} s)"
          f"  ratio {rate(first) / rate(tool):.3f}")
    print(f"  Embedder.encode, warm     {rate(warm):8.1f} sentences/s")


if __name__ == "__main__":
    main()
