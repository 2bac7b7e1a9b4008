"""Several Python threads calling into one device at once (the
interpreter is released while silica works)."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

import silica


def test_threads_share_a_device(device):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((32, 32)).astype(np.float32) for _ in range(8)]

    def work(x):
        t = silica.tensor(x, device=device)
        out = None
        for _ in range(10):
            out = (t @ t.T).softmax(-1).sum(-1)
        return out.numpy()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, xs))
    for r in results:
        np.testing.assert_allclose(r, np.ones(32), rtol=1e-5)


def test_threads_generate_at_once(generator):
    want = generator.generate("The sea is", max_tokens=6, temperature=0)
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda _: generator.generate("The sea is", max_tokens=6, temperature=0), range(3)))
    assert got == [want] * 3
