"""A shared test walk: prefill, then verify calls of varying width, each followed by a rollback to a random accepted
prefix (sometimes into older positions), comparing a backend with the NumPy reference at every call."""
import numpy as np


def walk_verify_steps(backend, ref, capacity: int, prefill: int, steps: int, max_width: int, tol: float) -> None:
    rng = np.random.default_rng(0)
    toks = rng.integers(0, backend.config.vocab_size, 200).astype(np.int32)
    cb, cr = backend.new_cache(capacity), ref.new_cache(capacity)
    np.testing.assert_allclose(backend.forward(toks[:prefill], cb), ref.forward(toks[:prefill], cr), atol=tol)
    pos = prefill
    for step in range(steps):
        width = 1 + step % max_width
        got, want = backend.forward(toks[pos:pos + width], cb), ref.forward(toks[pos:pos + width], cr)
        assert got.shape == (width, backend.config.vocab_size) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=tol)
        keep = int(rng.integers(0, width + 1))  # accept a prefix of the verified positions
        if step % 6 == 5:
            keep = -int(rng.integers(1, 5))  # sometimes roll back into older positions too
        cb.rollback(pos + keep)
        cr.rollback(pos + keep)
        pos += keep
        assert cb.length == cr.length == pos
        toks[pos:pos + 8] = rng.integers(0, backend.config.vocab_size, 8)  # what follows a rejection is new


def one_token_and_verify_rows(be, toks, prefill: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits of toks[prefill:] computed one token per call, and `width` tokens per call, after the same prefill."""
    a, b = be.new_cache(len(toks) + 8), be.new_cache(len(toks) + 8)
    be.forward(toks[:prefill], a)
    be.forward(toks[:prefill], b)
    one = np.stack([be.forward(toks[i:i + 1], a)[0] for i in range(prefill, len(toks))])
    many = np.concatenate([be.forward(toks[i:i + width], b) for i in range(prefill, len(toks), width)])
    assert a.length == b.length == len(toks)
    return one, many
