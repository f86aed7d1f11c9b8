"""Verifiers: decide how much of a draft the target keeps and the one token it adds.

Glossary: p = target distributions, q = draft distributions, k = draft length;
accepted = draft tokens kept, recovered = token sampled from the residual after a rejection,
bonus = token sampled from the target after the last accepted draft token.
"""
from __future__ import annotations

from ..types import SamplingParams
from .base import Verifier
from .chain import ChainSpeculativeVerifier
from .greedy import GreedyVerifier


def make_verifier(params: SamplingParams) -> Verifier:
    """Greedy params (temperature 0) -> GreedyVerifier; otherwise chain speculative sampling."""
    return GreedyVerifier() if params.greedy else ChainSpeculativeVerifier()


__all__ = ["ChainSpeculativeVerifier", "GreedyVerifier", "Verifier", "make_verifier"]
