#!/usr/bin/env python3
"""PyTorch peer of `silica bench`: runs every case of a `silica bench --json`
output through PyTorch on the same machine and prints both side by side.

    silica bench --json --dtype f16 > silica.jsonl
    python3 benchmarks/torch_kernels.py silica.jsonl [--device cuda] [--threads 2]

Times are per call, averaged over about `--seconds` of calls after warm-up,
synchronized (CUDA events on a GPU). TF32 stays off, so f32 matmuls are
true f32 as silica's are. The ratio column is silica's speed over PyTorch's
(above 1: silica is faster).
"""

import argparse
import itertools
import json
import math
import time

import torch
import torch.nn.functional as F

# Bytes of weights a cold case cycles through (COLD_BYTES in bench.rs).
COLD_BYTES = 256 << 20

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def build(kind, dtype, dev):
    """The case as a callable, from the kind silica printed."""
    op = kind["op"]
    rnd = lambda *shape: torch.randn(*shape, dtype=dtype, device=dev)  # noqa: E731
    if op in ("Linear", "QLinear"):
        # PyTorch has no GGML block kernels: the peer of a quantized product
        # is the same product with a dense weight of the compute dtype. A
        # cold case cycles through copies of the weight, as silica's does
        # (COLD_BYTES in bench.rs), so that each call reads it from memory.
        n, k = kind["n"], kind["k"]
        a, w = rnd(kind["m"], k), rnd(n, k)
        size = n * k * w.element_size()
        ws = [w] + [w.clone() for _ in range(-(-COLD_BYTES // size) - 1)] if kind.get("cold") else [w]
        it = itertools.cycle(ws)
        return lambda: F.linear(a, next(it))
    if op == "Lora":
        # the dense product plus the low-rank update, the scale folded into B
        n, k, r = kind["n"], kind["k"], kind["rank"]
        x, w = rnd(kind["m"], k), rnd(n, k)
        a, b = rnd(r, k), rnd(n, r) * 0.5
        size = n * k * w.element_size()
        ws = [w] + [w.clone() for _ in range(-(-COLD_BYTES // size) - 1)] if kind.get("cold") else [w]
        it = itertools.cycle(ws)
        return lambda: F.linear(x, next(it)) + F.linear(F.linear(x, a), b)
    if op == "QChain":
        # a chain of products through distinct dense weights, per product
        n, layers = kind["n"], kind["layers"]
        x, ws = rnd(1, n), [rnd(n, n) * n**-0.5 for _ in range(layers)]

        def chain():
            y = x
            for w in ws:
                y = F.linear(y, w)
            return y

        return chain
    if op == "Matmul":
        a, b = rnd(kind["m"], kind["k"]), rnd(kind["k"], kind["n"])
        return lambda: a @ b
    if op in ("Softmax", "RmsNorm", "LayerNorm", "Add", "SwiGlu"):
        r, n = kind["rows"], kind["n"]
        x, y, w, b = rnd(r, n), rnd(r, n), rnd(n), rnd(n)
        return {
            "Softmax": lambda: torch.softmax(x, -1),
            "RmsNorm": lambda: F.rms_norm(x, (n,), w, 1e-6),
            "LayerNorm": lambda: F.layer_norm(x, (n,), w, b, 1e-5),
            "Add": lambda: x + y,
            "SwiGlu": lambda: F.silu(x) * y,
        }[op]
    if op == "Rope":
        t, h, d = kind["t"], kind["h"], kind["d"]
        x = rnd(t, h, d)
        ang = torch.rand(t, 1, d // 2, device=dev)
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)

        def rope():
            # rotate-half, as Hugging Face's Llama writes it in eager mode
            x0, x1 = x[..., : d // 2], x[..., d // 2 :]
            return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1)

        return rope
    if op == "Attention":
        q = rnd(1, kind["h"], kind["tq"], kind["d"])
        k = rnd(1, kind["kvh"], kind["tk"], kind["d"])
        v = rnd(1, kind["kvh"], kind["tk"], kind["d"])
        causal = kind["causal"] and kind["tq"] == kind["tk"]
        gqa = kind["h"] != kind["kvh"]
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    if op == "Copy":
        x = rnd(kind["n"])
        return lambda: x.clone()
    raise ValueError(f"unknown case {op}")


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


# Seconds of calls before a case is timed (at most its budget), as in
# `silica bench`: a GPU that idled runs at its idle clock for the first few
# hundred milliseconds of work.
WARM_UP_S = 0.4


def timed(f, dev, budget):
    t0 = time.perf_counter()
    calls = 0
    while calls < 2 or time.perf_counter() - t0 < min(budget, WARM_UP_S):
        f()
        sync(dev)
        calls += 1
    t0 = time.perf_counter()
    f()
    sync(dev)
    once = time.perf_counter() - t0
    iters = max(1, min(10_000, int(budget / max(once, 1e-7))))
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            f()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        f()
    return (time.perf_counter() - t0) / iters


def small_ops(dev, dtype):
    x = torch.randn(1024, dtype=dtype, device=dev)
    one = torch.ones(1024, dtype=dtype, device=dev)

    def chain():
        y = x
        for _ in range(1000):
            y = y + one
        return y

    chain()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(5):
        chain()
    sync(dev)
    ops = 5000 / (time.perf_counter() - t0)
    best = math.inf
    for _ in range(20):
        t0 = time.perf_counter()
        (x + one)[:1].float().cpu()
        best = min(best, time.perf_counter() - t0)
    return ops, best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("silica_json", help="output of `silica bench --json`")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    ap.add_argument("--seconds", type=float, default=0.5)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    rows = [json.loads(line) for line in open(args.silica_json) if line.strip().startswith("{")]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"PyTorch {torch.__version__} on {name}; silica on {rows[0]['device'] if rows else '?'}")
    print(f"{'case':<46} {'dtype':>5} {'silica us':>10} {'torch us':>10} {'silica GB/s':>11} {'silica GF/s':>11} {'ratio':>6}")
    for r in rows:
        dtype = DTYPES[r["dtype"]]
        if r["kind"]["op"] == "SmallOps":
            ops, lat = small_ops(dev, dtype)
            print(f"small ops: silica {r['ops_per_s']:.0f} adds/s vs torch {ops:.0f} adds/s "
                  f"(ratio {r['ops_per_s'] / ops:.2f}); one add + read-back: silica "
                  f"{r['latency_s'] * 1e6:.1f}us vs torch {lat * 1e6:.1f}us")
            continue
        f = build(r["kind"], dtype, dev)
        t = timed(f, dev, args.seconds) / r["kind"].get("layers", 1)
        del f
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        s = r["seconds"]
        print(f"{r['name']:<46} {r['dtype']:>5} {s * 1e6:>10.1f} {t * 1e6:>10.1f} "
              f"{r['gbs']:>11.1f} {r['gflops']:>11.1f} {t / s:>6.2f}")


if __name__ == "__main__":
    main()
