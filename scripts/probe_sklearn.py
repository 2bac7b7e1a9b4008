#!/usr/bin/env python3
"""Linear probes of silica against scikit-learn's LogisticRegression.

For each labelled set in data/probes/ (topics: 4 classes, sentiment: 2),
captures SmolLM2-135M-Instruct's mean-pooled residual stream at a few layers
with `silica activations` (CPU), trains silica's probes (`silica probe train`,
one-vs-rest and multiclass), then trains scikit-learn on the same activations
with the same held-out split (read from the probe file), the same
standardization (the training rows' mean and standard deviation) and the same
L2 penalty (C = 1 / (l2 * training rows)). Prints both held-out accuracies and
writes them, with the split, to crates/silica-cli/tests/golden/probe_sklearn.json,
which the test crates/silica-cli/tests/probe.rs checks silica against (within
1 point) without scikit-learn.

Usage (needs: pip install numpy scikit-learn safetensors):

    python3 scripts/probe_sklearn.py [path/to/silica]   (default target/release/silica)
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import sklearn
from safetensors import safe_open
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "crates" / "silica-cli" / "tests" / "golden" / "probe_sklearn.json"
SETS = ["topics", "sentiment"]
LAYERS = "6,15,-1"
L2 = 1e-3
SEED = 0


def load(path):
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return meta, tensors


def sklearn_accuracy(x, labels, holdout, multiclass):
    n = len(labels)
    test = np.array(sorted(holdout))
    train = np.array(sorted(set(range(n)) - set(holdout)))
    mean = x[train].mean(axis=0)
    std = np.maximum(x[train].std(axis=0), 1e-6)
    z = (x - mean) / std
    y = np.array(labels)
    lr = LogisticRegression(C=1.0 / (L2 * len(train)), max_iter=20000, tol=1e-8)
    model = lr if multiclass else OneVsRestClassifier(lr)
    model.fit(z[train], y[train])
    return float((model.predict(z[test]) == y[test]).mean())


def main():
    silica = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "target" / "release" / "silica"
    out = {"generator": "scripts/probe_sklearn.py", "sklearn": sklearn.__version__, "l2": L2, "seed": SEED, "sets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SETS:
            acts = Path(tmp) / f"{name}.safetensors"
            subprocess.run(
                [str(silica), "activations", "--device", "cpu", "-f", str(ROOT / "data" / "probes" / f"{name}.jsonl"),
                 "--layers", LAYERS, "--pool", "mean", "-o", str(acts)],
                check=True, stderr=subprocess.DEVNULL,
            )
            meta, tensors = load(acts)
            labels = json.loads(meta["labels"])
            record = {"layers": {}}
            for kind in ["one-vs-rest", "multiclass"]:
                probe = Path(tmp) / f"{name}-{kind}.safetensors"
                cmd = [str(silica), "probe", "train", "--device", "cpu", "--activations", str(acts), "--all-layers",
                       "--l2", str(L2), "--seed", str(SEED), "-o", str(probe)]
                if kind == "multiclass":
                    cmd.append("--multiclass")
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                pmeta, _ = load(probe)
                holdout = json.loads(pmeta["holdout"])
                metrics = json.loads(pmeta["metrics"])
                record["holdout"] = holdout
                for layer in json.loads(pmeta["layers"]):
                    x = tensors[f"layer.{layer}"].astype(np.float64)
                    acc = sklearn_accuracy(x, labels, holdout, kind == "multiclass")
                    ours = metrics[str(layer)]["accuracy"]
                    record["layers"].setdefault(str(layer), {})[kind] = {"sklearn": acc, "silica_at_generation": ours}
                    print(f"{name:9} layer {layer:>2} {kind:11}: sklearn {100 * acc:6.2f}%  silica {100 * ours:6.2f}%")
            out["sets"][name] = record
    GOLDEN.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
