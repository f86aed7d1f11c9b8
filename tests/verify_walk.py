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
