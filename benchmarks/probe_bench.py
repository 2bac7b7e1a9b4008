#!/usr/bin/env python3
"""The peers of `silica activations` and `silica probe train` in BENCHMARKS.md.

Subcommands:

  prompts      random token-id prompts (a .jsonl of {"ids": [...]}) that both
               sides run, so that neither tokenizer is timed
  torch-capture
               PyTorch + transformers: a random-weight LlamaForCausalLM of a
               silica synthetic shape, the prompts right-padded in batches of
               the same size as silica's (sorted by length the same way),
               `output_hidden_states=True`, last-token pooling of the chosen
               layers copied to the host; prints prompts/s
  make-acts    a silica activation file of N random states [N, d] whose labels
               come from a planted linear rule (with noise), for training speed
  torch-train  the same probe training as `silica probe train` in PyTorch:
               standardization, x W^T + b, softmax cross-entropy or one-vs-rest
               BCE, L2 in the loss, AdamW (no weight decay) with the same
               half-cosine schedule, same epochs and batch size; prints seconds
               and held-out accuracy
  sklearn-train
               scikit-learn's LogisticRegression (lbfgs) on the same
               standardized states and L2 (C = 1 / (l2 * n_train)); prints seconds

    python3 benchmarks/probe_bench.py prompts --n 2048 --min 16 --max 128 -o /tmp/prompts.jsonl
    silica activations -f /tmp/prompts.jsonl --model m.gguf --layers 6,15,-1 -o /tmp/a.safetensors
    python3 benchmarks/probe_bench.py torch-capture --shape smollm2-135m --prompts /tmp/prompts.jsonl --layers 6,15,-1
"""

import argparse
import json
import math
import time

import numpy as np

SHAPES = {
    # d_model, layers, heads, kv heads, ffn, vocab, rope theta (as `silica quantize --synthetic`)
    "smollm2-135m": (576, 30, 9, 3, 1536, 49152, 1e5),
    "llama-1b": (2048, 16, 32, 8, 8192, 128256, 5e5),
}
TOKENS_PER_BATCH = 8192  # crates/silica-cli/src/activations.rs


def cmd_prompts(a):
    rng = np.random.default_rng(a.seed)
    with open(a.output, "w") as f:
        for _ in range(a.n):
            n = int(rng.integers(a.min, a.max + 1))
            f.write(json.dumps({"ids": rng.integers(0, a.vocab, n).tolist()}) + "\n")


def batches(lens, batch_size):
    """silica's batching: longest first within windows of 64 batches, at most
    batch_size prompts and about TOKENS_PER_BATCH tokens per batch."""
    out = []
    window = batch_size * 64
    for s in range(0, len(lens), window):
        chunk = sorted(range(s, min(s + window, len(lens))), key=lambda i: -lens[i])
        cur = []
        for i in chunk:
            longest = lens[cur[0]] if cur else lens[i]
            if cur and (len(cur) == batch_size or (len(cur) + 1) * longest > TOKENS_PER_BATCH):
                out.append(cur)
                cur = []
            cur.append(i)
        if cur:
            out.append(cur)
    return out


def cmd_torch_capture(a):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d, n_layers, heads, kv, ffn, vocab, theta = SHAPES[a.shape]
    cfg = LlamaConfig(hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=ffn, vocab_size=vocab,
                      rope_theta=theta, tie_word_embeddings=True, max_position_embeddings=8192)
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(a.device, dtype).eval()
    prompts = [json.loads(l)["ids"] for l in open(a.prompts)]
    lens = [len(p) for p in prompts]
    layers = [n_layers + int(x) + 1 if int(x) < 0 else int(x) for x in a.layers.split(",")]
    plan = batches(lens, a.batch_size)

    def run():
        out = {}
        with torch.inference_mode():
            for b in plan:
                t = max(lens[i] for i in b)
                ids = torch.zeros((len(b), t), dtype=torch.long)
                mask = torch.zeros((len(b), t), dtype=torch.long)
                for r, i in enumerate(b):
                    ids[r, : lens[i]] = torch.tensor(prompts[i])
                    mask[r, : lens[i]] = 1
                ids, mask = ids.to(a.device), mask.to(a.device)
                # the model body only: silica runs no output head for a capture
                hs = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
                last = mask.sum(1) - 1
                rows = torch.arange(len(b), device=a.device)
                for layer in layers:
                    out.setdefault(layer, []).append(hs[layer][rows, last].float().cpu())
        return out

    run()  # warm-up
    if a.device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    best = min(times)
    dev = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    print(f"torch {torch.__version__} {dev} {a.shape} {a.dtype}: {len(prompts)} prompts ({sum(lens)} tokens) "
          f"in {best:.3f} s = {len(prompts) / best:.1f} prompts/s (best of {a.rounds})")


def cmd_make_acts(a):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(a.seed)
    x = rng.standard_normal((a.rows, a.dim), dtype=np.float32)
    w = rng.standard_normal((a.dim, a.classes)).astype(np.float32) / math.sqrt(a.dim)
    scores = x @ w + 0.5 * rng.standard_normal((a.rows, a.classes)).astype(np.float32)
    labels = [f"c{int(i)}" for i in scores.argmax(1)]
    meta = {"format": "silica-activations/1", "model": "synthetic", "architecture": "llama",
            "n_layers": "1", "d_model": str(a.dim), "points": "1:residual", "pool": "last",
            "dtype": "f32", "count": str(a.rows), "labels": json.dumps(labels)}
    save_file({"layer.1": x}, a.output, metadata=meta)


def load_acts(path):
    from safetensors import safe_open

    with safe_open(path, "np") as f:
        meta = f.metadata()
        x = f.get_tensor("layer.1")
    labels = json.loads(meta["labels"])
    classes = sorted(set(labels), key=labels.index)
    y = np.array([classes.index(l) for l in labels])
    return x, y, len(classes)


def split(n, holdout, seed):
    order = np.random.default_rng(seed).permutation(n)
    k = int(round(n * holdout))
    return order[k:], order[:k]


def cmd_torch_train(a):
    import torch

    x, y, c = load_acts(a.activations)
    train, test = split(len(y), a.holdout, a.seed)
    dev = a.device
    t0 = time.perf_counter()
    X = torch.from_numpy(x).to(dev)
    Y = torch.from_numpy(y).to(dev)
    tr = torch.from_numpy(train).to(dev)
    mean = X[tr].mean(0, keepdim=True)
    std = X[tr].std(0, unbiased=False, keepdim=True).clamp_min(1e-6)
    Z = (X - mean) / std
    W = torch.zeros(x.shape[1], c, device=dev, requires_grad=True)
    b = torch.zeros(c, device=dev, requires_grad=True)
    opt = torch.optim.AdamW([W, b], lr=a.lr, weight_decay=0.0)
    steps = a.epochs * math.ceil(len(train) / a.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    onehot = torch.nn.functional.one_hot(Y, c).float()
    for _ in range(a.epochs):
        perm = tr[torch.randperm(len(train), generator=g).to(dev)]
        for s in range(0, len(train), a.batch_size):
            idx = perm[s : s + a.batch_size]
            logits = Z[idx] @ W + b
            if a.multiclass:
                loss = torch.nn.functional.cross_entropy(logits, Y[idx])
            else:
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, onehot[idx]) * c
            loss = loss + a.l2 / 2 * (W * W).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    te = torch.from_numpy(test).to(dev)
    acc = ((Z[te] @ W + b).argmax(1) == Y[te]).float().mean().item()
    if dev == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    print(f"torch {torch.__version__} {dev}: {len(train)} x {x.shape[1]}, {c} classes, {a.epochs} epochs of "
          f"batches of {a.batch_size}: {secs:.2f} s, held-out accuracy {100 * acc:.2f}%")


def cmd_sklearn_train(a):
    import sklearn
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    x, y, c = load_acts(a.activations)
    train, test = split(len(y), a.holdout, a.seed)
    t0 = time.perf_counter()
    mean = x[train].mean(0)
    std = np.maximum(x[train].std(0), 1e-6)
    z = (x - mean) / std
    lr = LogisticRegression(C=1.0 / (a.l2 * len(train)), max_iter=a.max_iter)
    model = lr if a.multiclass else OneVsRestClassifier(lr, n_jobs=None)
    model.fit(z[train], y[train])
    acc = (model.predict(z[test]) == y[test]).mean()
    secs = time.perf_counter() - t0
    print(f"scikit-learn {sklearn.__version__}: {len(train)} x {x.shape[1]}, {c} classes: {secs:.2f} s, "
          f"held-out accuracy {100 * acc:.2f}%")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("prompts")
    q.add_argument("--n", type=int, default=2048)
    q.add_argument("--min", type=int, default=16)
    q.add_argument("--max", type=int, default=128)
    q.add_argument("--vocab", type=int, default=49152)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("-o", "--output", required=True)
    q = sub.add_parser("torch-capture")
    q.add_argument("--shape", choices=SHAPES, default="smollm2-135m")
    q.add_argument("--prompts", required=True)
    q.add_argument("--layers", default="-1")
    q.add_argument("--batch-size", type=int, default=16)
    q.add_argument("--dtype", default="float32")
    q.add_argument("--device", default="cuda")
    q.add_argument("--rounds", type=int, default=3)
    q = sub.add_parser("make-acts")
    q.add_argument("--rows", type=int, default=100_000)
    q.add_argument("--dim", type=int, default=2048)
    q.add_argument("--classes", type=int, default=4)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("-o", "--output", required=True)
    for name in ["torch-train", "sklearn-train"]:
        q = sub.add_parser(name)
        q.add_argument("--activations", required=True)
        q.add_argument("--multiclass", action="store_true")
        q.add_argument("--l2", type=float, default=1e-3)
        q.add_argument("--holdout", type=float, default=0.25)
        q.add_argument("--seed", type=int, default=0)
        if name == "torch-train":
            q.add_argument("--epochs", type=int, default=10)
            q.add_argument("--batch-size", type=int, default=1024)
            q.add_argument("--lr", type=float, default=3e-3)
            q.add_argument("--device", default="cuda")
        else:
            q.add_argument("--max-iter", type=int, default=1000)
    a = p.parse_args()
    {"prompts": cmd_prompts, "torch-capture": cmd_torch_capture, "make-acts": cmd_make_acts,
     "torch-train": cmd_torch_train, "sklearn-train": cmd_sklearn_train}[a.cmd.replace("_", "-")](a)


if __name__ == "__main__":
    main()
