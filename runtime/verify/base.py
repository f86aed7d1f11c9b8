"""The Verifier seam: decide how much of a draft the target keeps, and the one token it adds."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..types import Draft, Probs, Verdict


@runtime_checkable
class Verifier(Protocol):
    def verify(self, draft: Draft, p: Probs, rng: np.random.Generator) -> Verdict:
        """p: [k+1, V] target distributions at [last, *draft.tokens]; returns >= 1 emitted token."""
        ...
