"""The models against the `silica` tool: embeddings (all-MiniLM-L6-v2)
and greedy generation (SmolLM2-135M-Instruct)."""

import subprocess

import numpy as np
import pytest

import silica

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A monkey is playing drums.",
    "Two men pushed carts through the woods.",
]


def run(cli, *args):
    out = subprocess.run([cli, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def cosines(a, b):
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return (a * b).sum(-1)


# ----- Embedder --------------------------------------------------------------


def test_encode_shape_and_meaning(embedder):
    v = embedder.encode(SENTENCES)
    assert v.shape == (5, 384) and v.dtype == np.float32 and embedder.dim == 384
    np.testing.assert_allclose(np.linalg.norm(v, axis=-1), 1.0, rtol=1e-5)
    sim = embedder.similarity(v, v)
    assert sim.shape == (5, 5)
    # the two sentences about eating are the closest pair
    assert sim[0, 1] > 0.7 and sim[0, 1] > sim[0, 2:].max() + 0.3
    one = embedder.encode(SENTENCES[3])
    assert one.shape == (384,)
    np.testing.assert_allclose(one, v[3], atol=1e-5)
    # batches of one give the same vectors as one padded batch
    np.testing.assert_allclose(embedder.encode(SENTENCES, batch_size=1), v, atol=1e-5)
    assert embedder.tokenize("hello world")[0] == 101  # [CLS]


def test_encode_matches_silica_embed(embedder, cli, tmp_path):
    out = tmp_path / "e.npy"
    run(cli, "embed", *SENTENCES, "--output", str(out), "--device", "cpu")
    want = np.load(out)
    got = embedder.encode(SENTENCES)
    assert got.shape == want.shape
    assert cosines(got, want).min() > 0.99999


def test_encode_on_gpu_matches_cpu(embedder, gpu):
    got = silica.Embedder(device=gpu).encode(SENTENCES[:3])
    assert cosines(got, embedder.encode(SENTENCES[:3])).min() > 0.9999


# ----- Generator ---------------------------------------------------------------


PROMPT = "The three primary colors are"


def test_greedy_generate_matches_silica_generate(generator, cli):
    text = generator.generate(PROMPT, max_tokens=24, temperature=0)
    want = run(cli, "generate", PROMPT, "--temperature", "0", "--max-tokens", "24", "--device", "cpu")
    # the tool prints the prompt, the continuation and a line end
    assert PROMPT + text + "\n" == want
    stats = generator.last_stats
    assert stats["prompt_tokens"] > 0 and stats["generated_tokens"] <= 24
    assert stats["stop_reason"] in ("eos", "max tokens")


def test_openai_penalties_match_silica_generate(generator, cli):
    text = generator.generate(PROMPT, max_tokens=24, temperature=0, repetition_penalty=1.0,
                              frequency_penalty=1.5, presence_penalty=0.5)
    want = run(cli, "generate", PROMPT, "--temperature", "0", "--max-tokens", "24", "--device", "cpu",
               "--repeat-penalty", "1", "--frequency-penalty", "1.5", "--presence-penalty", "0.5")
    assert PROMPT + text + "\n" == want
    # the penalties change the text: the plain greedy continuation differs
    plain = generator.generate(PROMPT, max_tokens=24, temperature=0, repetition_penalty=1.0)
    assert text != plain
    for bad in ({"frequency_penalty": 2.5}, {"presence_penalty": -3.0}, {"frequency_penalty": float("nan")}):
        with pytest.raises(ValueError):
            generator.generate(PROMPT, **bad)


def test_greedy_generate_on_gpu_matches_silica_generate(gpu, cli):
    g = silica.Generator(device=gpu)
    text = g.generate(PROMPT, max_tokens=6, temperature=0)
    want = run(cli, "generate", PROMPT, "--temperature", "0", "--max-tokens", "6", "--device", "gpu:0")
    assert PROMPT + text + "\n" == want


def test_greedy_chat_matches_silica_generate_chat(generator, cli):
    reply = generator.chat([{"role": "user", "content": "Name a fruit."}], max_tokens=16, temperature=0)
    want = run(cli, "generate", "Name a fruit.", "--chat", "--temperature", "0", "--max-tokens", "16", "--device", "cpu")
    assert reply + "\n" == want
    assert generator.chat("Name a fruit.", max_tokens=16, temperature=0) == reply
    assert generator.chat([("user", "Name a fruit.")], max_tokens=16, temperature=0) == reply
    prompt = generator.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert "<|im_start|>user\nHi<|im_end|>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert generator.template_name == "gguf"


def test_stream_yields_the_same_text(generator):
    text = generator.generate(PROMPT, max_tokens=12, temperature=0)
    stream = generator.generate(PROMPT, max_tokens=12, temperature=0, stream=True)
    assert stream.stats is None
    pieces = list(stream)
    assert len(pieces) > 1 and "".join(pieces) == text
    assert stream.stats["generated_tokens"] == 12


def test_stream_close_stops_early(generator):
    stream = generator.generate(PROMPT, max_tokens=100, temperature=0, stream=True)
    first = next(stream)
    stream.close()
    assert first and list(stream) == []
    with generator.generate(PROMPT, max_tokens=100, stream=True) as s:
        next(s)


def test_sampling_and_stop(generator):
    a = generator.generate(PROMPT, max_tokens=10, temperature=0.8, seed=1)
    assert a == generator.generate(PROMPT, max_tokens=10, temperature=0.8, seed=1)
    text = generator.generate(PROMPT, max_tokens=40, temperature=0, stop=[","])
    assert "," not in text and generator.last_stats["stop_reason"] == "stop string"
    with pytest.raises(ValueError, match="empty"):
        generator.generate("   ")
    with pytest.raises(ValueError, match="temperature"):
        generator.generate(PROMPT, temperature=-1)
    # a prompt past the context is refused before anything is generated
    with pytest.raises(ValueError, match="context holds 8192"):
        generator.generate("word " * 9000, stream=True)


def test_tokens_round_trip(generator):
    ids = generator.tokenize("Hello there", add_special=False)
    assert generator.detokenize(ids) == "Hello there"
    assert generator.config["n_layers"] == generator.n_layers == 30
