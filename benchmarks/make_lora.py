#!/usr/bin/env python3
"""A random PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors)
for a silica `--synthetic` shape, on every attention and MLP projection of
every layer, for measuring what an adapter costs (`silica generate --lora`).

    python3 benchmarks/make_lora.py --shape llama-1b --rank 16 -o /tmp/lora-1b

With `--gguf FILE` it also writes the same weights as a llama.cpp GGUF
adapter (`general.type = adapter`, `blk.N.attn_q.weight.lora_a`, ...) for
`llama-server --lora`, through llama.cpp's `gguf` package (its source tree's
`gguf-py` on PYTHONPATH). Q/K rows are not permuted: a random adapter's cost
does not depend on it.
"""

import argparse
import json
import os

import numpy as np
from safetensors.numpy import save_file

SHAPES = {  # d_model, layers, heads, kv heads, ffn (as benchmarks/probe_bench.py)
    "smollm2-135m": (576, 30, 9, 3, 1536),
    "llama-1b": (2048, 16, 32, 8, 8192),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=SHAPES, default="smollm2-135m")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--gguf", help="also write a llama.cpp GGUF adapter here")
    a = p.parse_args()
    d, layers, h, kvh, ffn = SHAPES[a.shape]
    hd = d // h
    dims = {"q_proj": (d, h * hd), "k_proj": (d, kvh * hd), "v_proj": (d, kvh * hd), "o_proj": (h * hd, d),
            "gate_proj": (d, ffn), "up_proj": (d, ffn), "down_proj": (ffn, d)}
    rng = np.random.default_rng(a.seed)
    tensors = {}
    for layer in range(layers):
        for name, (fan_in, fan_out) in dims.items():
            part = "self_attn" if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            base = f"base_model.model.model.layers.{layer}.{part}.{name}"
            tensors[f"{base}.lora_A.weight"] = (rng.standard_normal((a.rank, fan_in)) * 0.01).astype(np.float16)
            tensors[f"{base}.lora_B.weight"] = (rng.standard_normal((fan_out, a.rank)) * 0.01).astype(np.float16)
    os.makedirs(a.output, exist_ok=True)
    save_file(tensors, os.path.join(a.output, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": a.rank, "lora_alpha": 2 * a.rank, "target_modules": list(dims),
              "use_rslora": False, "task_type": "CAUSAL_LM"}
    with open(os.path.join(a.output, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    if a.gguf:
        write_gguf(a.gguf, tensors, 2 * a.rank)


GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def write_gguf(path, tensors, alpha):
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(alpha))
    for key, value in tensors.items():
        parts = key.split(".")  # base_model.model.model.layers.N.part.name.lora_X.weight
        layer, name, which = parts[4], parts[6], parts[7]
        suffix = "lora_a" if which == "lora_A" else "lora_b"
        w.add_tensor(f"blk.{layer}.{GGUF_NAMES[name]}.weight.{suffix}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
