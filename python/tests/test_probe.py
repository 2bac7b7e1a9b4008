"""Activation capture and linear probes, against `silica activations`
and `silica probe run`."""

import json
import subprocess

import numpy as np
import pytest

import silica

POSITIVE = [
    "I loved this film, it was wonderful.",
    "What a delightful and happy day.",
    "The food was excellent and the staff were kind.",
    "This is the best book I have read all year.",
    "A beautiful, moving and joyful story.",
    "I am thrilled with how well it works.",
    "Great music and a fantastic crowd.",
    "She was delighted by the lovely gift.",
]
NEGATIVE = [
    "I hated this film, it was awful.",
    "What a miserable and sad day.",
    "The food was terrible and the staff were rude.",
    "This is the worst book I have read all year.",
    "An ugly, boring and painful story.",
    "I am furious with how badly it works.",
    "Dreadful music and a hostile crowd.",
    "She was disgusted by the horrible gift.",
]
TEXTS = POSITIVE + NEGATIVE
LABELS = ["positive"] * len(POSITIVE) + ["negative"] * len(NEGATIVE)


def run(cli, *args):
    out = subprocess.run([cli, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_capture_matches_silica_activations(generator, cli, tmp_path):
    texts = TEXTS[:3]
    acts = silica.capture_activations(generator, texts, layers=[6, -1])
    assert sorted(acts) == [6, 30]
    assert acts[6].shape == (3, 576) and acts[6].dtype == np.float32
    out = tmp_path / "acts.npy"
    run(cli, "activations", *texts, "-o", str(out), "--layers", "6,-1", "--device", "cpu")
    want = np.load(out)
    np.testing.assert_allclose(acts[6], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(acts[30], want[1], rtol=1e-4, atol=1e-4)


def test_capture_pools_and_sites(generator, embedder):
    texts = TEXTS[:2]
    ids = [generator.tokenize(t) for t in texts]
    every = generator.capture(texts, layers=[3], pool="all")
    assert [a.shape for a in every[3]] == [(len(i), 576) for i in ids]
    mean = generator.capture(texts, layers=[3], pool="mean")
    np.testing.assert_allclose(mean[3], [a.mean(0) for a in every[3]], rtol=1e-4, atol=1e-4)
    last = silica.capture_activations(generator, texts, layers=3)
    np.testing.assert_allclose(last[3], [a[-1] for a in every[3]], rtol=1e-4, atol=1e-4)
    mlp = generator.capture(texts, layers=[2], site="mlp")
    assert mlp[2].shape == (2, 576)
    enc = embedder.capture(texts, layers=[0, -1], pool="mean")
    assert sorted(enc) == [0, 6] and enc[6].shape == (2, 384)
    with pytest.raises(ValueError, match="out of range"):
        generator.capture(texts, layers=[31])
    with pytest.raises(ValueError, match="pooling"):
        generator.capture(texts, pool="max")


def test_train_probe_predict_save_load(generator, cli, tmp_path):
    acts = silica.capture_activations(generator, TEXTS, layers=[12, -1])
    probe = silica.train_probe(acts, LABELS, model=generator, epochs=60, device="cpu", seed=1)
    assert probe.layers == [12, 30] and probe.best_layer in (12, 30)
    assert probe.classes == ["positive", "negative"] and probe.kind == "one-vs-rest"
    m = probe.metrics
    assert m["n_test"] == 4 and m["n_train"] == 12 and 0 <= m["accuracy"] <= 1
    assert set(probe.metrics_by_layer) == {12, 30}
    p = probe.predict_proba(acts)
    assert p.shape == (16, 2) and p.dtype == np.float32
    # the training rows are learnt
    train = [i for i in range(16) if i not in probe.holdout]
    predicted = probe.predict(acts)
    assert np.mean([predicted[i] == LABELS[i] for i in train]) >= 0.9
    assert probe.predict_proba(acts[probe.best_layer][0]).shape == (2,)
    params = probe.parameters()
    assert params["weight"].shape == (2, 576) and params["std"].shape == (576,)

    path = tmp_path / "probe.safetensors"
    probe.save(str(path))
    loaded = silica.Probe.load(str(path), device="cpu")
    assert loaded.layers == probe.layers and loaded.best_layer == probe.best_layer
    np.testing.assert_allclose(loaded.predict_proba(acts), p, rtol=1e-6)
    # texts read through the model, here and by `silica probe run`
    new = ["An absolutely wonderful evening.", "A truly awful evening."]
    here = loaded.predict_proba(new, model=generator)
    out = tmp_path / "run.jsonl"
    run(cli, "probe", "run", "--probe", str(path), "--best-layer", *new, "-o", str(out), "--device", "cpu")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    there = np.array([[r["probabilities"][c] for c in loaded.classes] for r in rows])
    np.testing.assert_allclose(here, there, rtol=1e-4, atol=1e-5)


def test_train_probe_on_an_array(embedder):
    x = embedder.encode(TEXTS)
    probe = silica.train_probe(x, LABELS, multiclass=True, holdout=0.0, epochs=40, device="cpu")
    assert probe.kind == "multiclass" and probe.metrics is None
    p = probe.predict_proba(x)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
    assert probe.predict(x) == LABELS
    with pytest.raises(ValueError, match="labels"):
        silica.train_probe(x, LABELS[:-1], device="cpu")
    with pytest.raises(ValueError, match="at least 2 classes"):
        silica.train_probe(x, ["a"] * 16, device="cpu")


def test_train_probe_on_gpu(embedder, gpu):
    x = embedder.encode(TEXTS)
    probe = silica.train_probe(x, LABELS, holdout=0.0, epochs=30, device=gpu)
    assert probe.device == gpu
    cpu = silica.train_probe(x, LABELS, holdout=0.0, epochs=30, device="cpu")
    np.testing.assert_allclose(probe.predict_proba(x), cpu.predict_proba(x), atol=1e-3)
