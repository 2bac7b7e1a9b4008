#!/usr/bin/env python3
"""Golden logits of the tiny architecture models, from llama.cpp.

For each `silica quantize --synthetic tiny-*` shape (Llama 3.1 frequency
factors, YaRN scaling, Qwen3, Gemma 3, Gemma 2, Phi-3 with LongRoPE's long
factors, Phi-4-mini's partial rotation with the short factors), writes the
model as F32 with the silica binary, runs llama.cpp on it through
llama-cpp-python (CPU, f32 weights and KV cache, every position's logits, the
48 tokens in one batch), and stores under crates/silica-cli/tests/golden/ a
text file `arch_<shape>.txt`:

    shape <name>
    tokens <ids>
    argmax <llama.cpp's top token at each position>
    logits <position> <the vocabulary's logits at that position>   (a few positions)

The test `crates/silica-cli/tests/arch_golden.rs` writes the same model
with the same command and compares silica's logits with these on every
device, so CI needs no llama.cpp.

Needs: llama-cpp-python built from source, e.g.
    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36
Usage: python3 scripts/arch_golden.py [path/to/silica [SHAPE...]]
    (default target/release/silica and every shape; naming shapes rewrites
    only their files)

The context is 256 positions: more than tiny-phi3's original context of 32
(llama.cpp picks the long LongRoPE factors, as silica does for a model whose
context exceeds the original one) and no more than tiny-phi4's of 256 (the
short factors).
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import llama_cpp

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "crates" / "silica-cli" / "tests" / "golden"
SHAPES = ["tiny-llama3", "tiny-yarn", "tiny-qwen3", "tiny-gemma3", "tiny-gemma2",
          "tiny-phi3", "tiny-phi4"]
# BOS, then 47 ordinary tokens of the made-up vocabulary
TOKENS = [1] + [259 + (7 * i) % 250 for i in range(47)]
POSITIONS = [0, 5, 17, 31, 47]
GGML_TYPE_F32 = 0


def main():
    silica = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "target" / "release" / "silica"
    shapes = sys.argv[2:] or SHAPES
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        sys.exit(f"unknown shapes {unknown} (known: {' '.join(SHAPES)})")
    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            path = Path(tmp) / f"{shape}.gguf"
            subprocess.run(
                [str(silica), "quantize", "--synthetic", shape, str(path), "--type", "f32"],
                check=True,
                capture_output=True,
            )
            llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=256,
                n_batch=256,
                n_threads=2,
                n_gpu_layers=0,
                logits_all=True,
                # an f32 cache (llama.cpp's default is f16) and no flash
                # attention: the exact computation silica's f32 path does
                type_k=GGML_TYPE_F32,
                type_v=GGML_TYPE_F32,
                flash_attn=False,
                verbose=False,
            )
            llm.eval(TOKENS)
            scores = np.array(llm.scores[: len(TOKENS)], dtype=np.float32)
            lines = [
                f"# llama.cpp through llama-cpp-python {llama_cpp.__version__}, CPU, f32, f32 KV cache",
                f"shape {shape}",
                "tokens " + " ".join(map(str, TOKENS)),
                "argmax " + " ".join(str(int(i)) for i in scores.argmax(axis=1)),
            ]
            for p in POSITIONS:
                lines.append(f"logits {p} " + " ".join(f"{v:.6g}" for v in scores[p]))
            out = GOLDEN / f"arch_{shape}.txt"
            out.write_text("\n".join(lines) + "\n")
            print(f"{out}: {len(TOKENS)} positions, logits spread {scores.std():.3f}")
            del llm


if __name__ == "__main__":
    main()
