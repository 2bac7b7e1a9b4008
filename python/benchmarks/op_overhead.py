"""The cost of calling an op from Python, next to the same loop in Rust.

Runs `silica bench --filter "small ops"`'s loop from Python (1,000 chained
adds of 1,024 elements; the best of 5 rounds, per add) and prints it beside
the tool's own figure for the same device:

    python python/benchmarks/op_overhead.py [--device cpu] [--cli target/release/silica]
"""

import argparse
import re
import subprocess
import time

import silica


def python_per_add(device, dtype="f32"):
    x = silica.randn(1024, seed=1, dtype=dtype, device=device)
    one = silica.ones(1024, dtype=dtype, device=device)

    def chain():
        y = x
        for _ in range(1000):
            y = y + one
        return y

    chain()
    device.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        chain()
        best = min(best, (time.perf_counter() - t) / 1000)
    device.synchronize()
    return best


def rust_per_add(cli, device):
    out = subprocess.run(
        [cli, "bench", "--device", device, "--filter", "small ops"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"([0-9.]+)us of host time to record each", out)
    return float(m.group(1)) * 1e-6 if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cli", default="target/release/silica")
    args = ap.parse_args()
    dev = silica.Device(args.device)
    py = python_per_add(dev)
    rust = rust_per_add(args.cli, args.device)
    print(f"{dev}: one add of 1,024 f32 from Python {py * 1e6:.2f} us", end="")
    if rust is not None:
        print(f", from Rust {rust * 1e6:.2f} us: {(py - rust) * 1e6:+.2f} us per call")
    else:
        print()


if __name__ == "__main__":
    main()
