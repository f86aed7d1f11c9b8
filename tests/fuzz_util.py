"""Shared pieces of the fuzz harnesses (tests/test_fuzz_*.py): example counts, a per-case time limit, messages.

CI runs each harness with its `ci` example count (derandomized: the same cases every run). A long run:
    SPECEDGE_FUZZ_EXAMPLES=20000 pytest -q tests/test_fuzz_gguf.py
runs that many cases per harness (still derandomized; add SPECEDGE_FUZZ_RANDOM=1 to draw fresh cases each run).
"""
from __future__ import annotations

import contextlib
import os
import signal

from hypothesis import HealthCheck, settings

CASE_SECONDS = 10  # one case (open + parse a tiny file) takes milliseconds; longer means a loop on a bad count


def fuzz_settings(ci: int):
    """hypothesis settings: `ci` examples, or SPECEDGE_FUZZ_EXAMPLES; no deadline (the 2-core CI box is noisy)."""
    n = int(os.environ.get("SPECEDGE_FUZZ_EXAMPLES", ci))
    return settings(max_examples=n, deadline=None, derandomize="SPECEDGE_FUZZ_RANDOM" not in os.environ, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


class CaseTimeout(Exception):
    """A fuzz case ran past CASE_SECONDS: a loop driven by an unchecked count."""


@contextlib.contextmanager
def time_limit(seconds: int = CASE_SECONDS):
    """Fail a case that hangs (SIGALRM; the main thread on POSIX, which is where pytest runs tests)."""
    def on_alarm(signum, frame):
        raise CaseTimeout(f"fuzz case took more than {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# Integers that break parsers: zero and one, around powers of two, the signed/unsigned edges of 32 and 64 bits.
EDGE_INTS = (0, 1, 2, 3, 4, 7, 8, 12, 13, 31, 32, 33, 255, 256, 4095, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1,
             2**32, 2**48, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
