"""A prompt's prefill from Python: `Generator.generate` of the prompt and
one token, timed RUNS times in one process; prints the median and minimum
of the runs after the first, to set beside `examples/prefill_profile` on
the same prompt (P3's loop in the Rust tool):

    python python/benchmarks/prefill_time.py MODEL.gguf PROMPT.txt [--device cpu] [--runs 5]
"""

import argparse
import statistics
import time

import silica


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("prompt")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    g = silica.Generator(model=args.model, device=args.device)
    text = open(args.prompt, encoding="utf-8").read()
    times = []
    for _ in range(max(args.runs, 2)):
        t0 = time.perf_counter()
        g.generate(text, max_tokens=1, temperature=0.0)
        times.append(time.perf_counter() - t0)
    late = times[1:]
    print(
        f"prompt and one token: median {statistics.median(late) * 1e3:.1f} ms, "
        f"min {min(late) * 1e3:.1f} ms (runs 2-{len(times)})"
    )


if __name__ == "__main__":
    main()
