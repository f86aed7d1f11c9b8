"""Verifiers: decide how much of a draft the target keeps and the one token it adds.

Glossary: p = target distributions, q = draft distributions, k = draft length;
accepted = draft tokens kept, recovered = token sampled from the residual after a rejection,
bonus = token sampled from the target after the last accepted draft token.
Chains: chain speculative sampling (1.1) or block verification (1.3); trees: runtime/verify/tree.py (1.2, 1.4).
"""
from __future__ import annotations

import enum

from ..types import SamplingParams
from .base import Verifier
from .block import BlockVerifier
from .chain import ChainSpeculativeVerifier
from .greedy import GreedyVerifier
from .tree import TreeVerdict, verify_tree


class VerifierKind(enum.Enum):
    CHAIN = "chain"  # token by token (1.1)
    BLOCK = "block"  # the block as a whole (1.3); never accepts less in expectation


def make_verifier(params: SamplingParams, kind: VerifierKind = VerifierKind.CHAIN) -> Verifier:
    """Greedy params (temperature 0) -> GreedyVerifier (both rules reduce to prefix match); otherwise the kind."""
    if params.greedy:
        return GreedyVerifier()
    return BlockVerifier() if kind is VerifierKind.BLOCK else ChainSpeculativeVerifier()


__all__ = ["BlockVerifier", "ChainSpeculativeVerifier", "GreedyVerifier", "TreeVerdict", "Verifier",
           "VerifierKind", "make_verifier", "verify_tree"]
