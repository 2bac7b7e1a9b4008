#!/usr/bin/env python3
"""Talks to a running `silica serve` with the official `openai` client (run by
crates/silica-cli/tests/serve.rs): chat and text completions, streamed and
not, embeddings as floats and base64, the model list. Exits non-zero (an
AssertionError or the client's exception) on anything unexpected.

    python3 serve_openai.py BASE_URL
"""

import base64
import struct
import sys

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)

models = [m.id for m in client.models.list().data]
assert len(models) == 2, models
decoder, encoder = models

# chat, not streamed: greedy, so the answer is the same on every run
chat = client.chat.completions.create(
    model=decoder,
    messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}],
    max_tokens=12,
    temperature=0,
)
c = chat.choices[0]
assert c.message.role == "assistant" and c.message.content, chat
assert c.finish_reason in ("stop", "length"), c.finish_reason
assert chat.usage.completion_tokens <= 12 and chat.usage.prompt_tokens > 5, chat.usage
assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens

# the same, streamed, with usage: the same text
stream = client.chat.completions.create(
    model=decoder,
    messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}],
    max_tokens=12,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, finish, usage, roles = [], None, None, []
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for ch in chunk.choices:
        if ch.delta.role:
            roles.append(ch.delta.role)
        if ch.delta.content:
            pieces.append(ch.delta.content)
        if ch.finish_reason:
            finish = ch.finish_reason
assert "".join(pieces) == c.message.content, ("".join(pieces), c.message.content)
assert roles == ["assistant"], roles
assert finish == c.finish_reason, finish
assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens, usage

# text completion with a stop string, and a seeded sampled one
done = client.completions.create(model=decoder, prompt="One, two, three, four,", max_tokens=16, temperature=0, stop=[" six"])
t = done.choices[0]
assert " six" not in t.text, t.text
assert t.finish_reason in ("stop", "length")
a = client.completions.create(model=decoder, prompt="The weather", max_tokens=8, temperature=0.8, top_p=0.9, seed=7)
b = client.completions.create(model=decoder, prompt="The weather", max_tokens=8, temperature=0.8, top_p=0.9, seed=7)
assert a.choices[0].text == b.choices[0].text, (a.choices[0].text, b.choices[0].text)
s = client.completions.create(model=decoder, prompt="The weather", max_tokens=8, temperature=0.8, top_p=0.9, seed=7, stream=True)
assert "".join(ch.choices[0].text for ch in s if ch.choices) == a.choices[0].text
# a temperature alone: the tokens are drawn on the device, from the seed
a = client.completions.create(model=decoder, prompt="The weather", max_tokens=8, temperature=0.9, seed=11)
b = client.completions.create(model=decoder, prompt="The weather", max_tokens=8, temperature=0.9, seed=11)
assert a.choices[0].text == b.choices[0].text, (a.choices[0].text, b.choices[0].text)
s = client.completions.create(model=decoder, prompt="The weather", max_tokens=8, temperature=0.9, seed=11, stream=True)
assert "".join(ch.choices[0].text for ch in s if ch.choices) == a.choices[0].text

# embeddings: floats, and base64 of the same little-endian f32 values
e = client.embeddings.create(model=encoder, input=["A cat sat on the mat.", "A dog lay on the rug."])
assert len(e.data) == 2 and len(e.data[0].embedding) == 384, len(e.data)
norm = sum(x * x for x in e.data[0].embedding) ** 0.5
assert abs(norm - 1.0) < 1e-3, norm
raw = client.embeddings.with_raw_response.create(model=encoder, input="A cat sat on the mat.", encoding_format="base64")
b64 = raw.http_response.json()["data"][0]["embedding"]
vals = struct.unpack("<384f", base64.b64decode(b64))
assert max(abs(x - y) for x, y in zip(vals, e.data[0].embedding)) < 1e-6

# errors surface as the client's exceptions
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("an unknown model was accepted")
except openai.BadRequestError as err:
    assert "no-such-model" in str(err), err

print("openai client: ok")
