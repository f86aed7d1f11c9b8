"""Array aliases and the small frozen dataclasses that cross the runtime's seams.

Glossary (docs/algorithms.md): p = target distribution, q = draft distribution, k = draft length.
accepted = draft tokens kept; recovered = token sampled from the residual after a rejection;
bonus = token sampled from the target after the last accepted draft token.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from .stats import CallStats

Tokens = NDArray[np.int32]  # [T] token ids
Positions = NDArray[np.int32]  # [T] absolute positions
Logits = NDArray[np.float32]  # [T, V]
Probs = NDArray[np.float64]  # [T, V], rows sum to 1
Mask = NDArray[np.bool_]  # [T, T] tree mask among new tokens: mask[i, j] = j is i or an ancestor of i


def as_tokens(x) -> Tokens:
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32).reshape(-1))


@dataclass(frozen=True)
class SamplingParams:
    """Logits processing shared by the target and every model drafter (one `logits_to_probs`).

    temperature == 0 means greedy (p is one-hot at the argmax).
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    typical_p: float = 1.0  # 1 = off; locally typical sampling (llama.cpp's typical_p, HF's typical_p)
    repeat_penalty: float = 1.0  # 1 = off (llama.cpp / CTRL style: divide positive logits, multiply negative)
    repeat_last_n: int = 64  # window of recent tokens the penalties look at
    presence_penalty: float = 0.0  # 0 = off; subtracted once from a token seen in the window (llama.cpp / OpenAI)
    frequency_penalty: float = 0.0  # 0 = off; subtracted per occurrence in the window
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit); -inf bans it
    # DRY ("don't repeat yourself", llama.cpp's --dry-*): a token that would extend a repeat of an earlier span of n
    # >= dry_allowed_length tokens loses dry_multiplier * dry_base ** (n - dry_allowed_length) from its logit
    dry_multiplier: float = 0.0  # 0 = off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_last_n: int = 0  # tokens of history it looks at; 0 = all of it (llama.cpp's -1)
    dry_breakers: frozenset[int] = field(default=frozenset(), repr=False)  # ids no repeat spans; never penalised

    def __post_init__(self) -> None:
        bias = tuple((int(t), float(b)) for t, b in dict(self.logit_bias).items())
        object.__setattr__(self, "logit_bias", bias)
        object.__setattr__(self, "dry_breakers", frozenset(int(t) for t in self.dry_breakers))
        bad_bias = [(t, b) for t, b in bias if not (t >= 0 and (np.isfinite(b) or b == -np.inf))]
        checks = [  # (holds, the field, its rule)
            (np.isfinite(self.temperature) and self.temperature >= 0, "temperature", "must be >= 0 (0 = greedy)"),
            (int(self.top_k) == self.top_k and self.top_k >= 0, "top_k", "must be an integer >= 0 (0 = off)"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1] (1 = off)"),
            (0.0 <= self.min_p < 1.0, "min_p", "must be in [0, 1) (0 = off)"),
            (0.0 < self.typical_p <= 1.0, "typical_p", "must be in (0, 1] (1 = off)"),
            (np.isfinite(self.repeat_penalty) and self.repeat_penalty > 0, "repeat_penalty",
             "must be > 0 (1 = off)"),
            (self.repeat_last_n >= 0, "repeat_last_n", "must be >= 0"),
            (np.isfinite(self.presence_penalty), "presence_penalty", "must be a finite number (0 = off)"),
            (np.isfinite(self.frequency_penalty), "frequency_penalty", "must be a finite number (0 = off)"),
            (not bad_bias, "logit_bias", "maps token ids >= 0 to finite biases (or -inf to ban a token)"),
            (np.isfinite(self.dry_multiplier) and self.dry_multiplier >= 0, "dry_multiplier", "must be >= 0 (0 = off)"),
            (np.isfinite(self.dry_base) and self.dry_base > 1.0, "dry_base", "must be > 1"),
            (int(self.dry_allowed_length) == self.dry_allowed_length and self.dry_allowed_length >= 1,
             "dry_allowed_length", "must be an integer >= 1"),
            (self.dry_last_n >= 0, "dry_last_n", "must be >= 0 (0 = the whole history)"),
        ]
        for ok, name, rule in checks:
            if not ok:  # the field and its value, not the whole repr: the user set one of them, not all 16
                got = ", ".join(f"{t}: {b}" for t, b in bad_bias[:3]) if name == "logit_bias" else \
                    repr(getattr(self, name))
                raise ValueError(f"invalid sampling parameter: {name} {rule}; got {name} = {got}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        """Whether p depends on the history (a repetition, presence, frequency or DRY penalty is on)."""
        return (self.repeat_last_n > 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                            or self.frequency_penalty != 0.0)) or self.dry_multiplier > 0


@dataclass(frozen=True)
class Draft:
    """A chain draft: k proposed tokens and, for model drafters, the q rows they were sampled from.

    q is None for deterministic drafters (n-gram, prompt lookup): verification then uses the
    deterministic-drafter rule (docs/algorithms.md 1.2).
    """

    tokens: Tokens  # [k]
    q: Probs | None = None  # [k, V] draft distributions after the SAME logits processing as p
    kind: int = 0  # the drafter's label for how it made this draft (n-gram: the matched length); runtime/draft_length

    def prefix(self, j: int) -> "Draft":
        """The first j tokens (what verification sees when the rest is not worth its cost)."""
        return Draft(self.tokens[:j], None if self.q is None else self.q[:j], self.kind)

    @property
    def k(self) -> int:
        return int(self.tokens.shape[0])


EMPTY_DRAFT = Draft(tokens=np.zeros(0, dtype=np.int32))


class NextKind(enum.Enum):
    BONUS = "bonus"  # every draft token accepted; sampled from p_{k+1}
    RECOVERED = "recovered"  # sampled from the residual at the first rejection


@dataclass(frozen=True)
class Verdict:
    n_accepted: int  # draft tokens kept, 0..k
    next_token: int  # the bonus or recovered token; every verify emits >= 1 token
    kind: NextKind


class FinishReason(str, enum.Enum):  # a str: "eos" == FinishReason.EOS for API users and JSON
    EOS = "eos"
    LENGTH = "length"
    STOP = "stop"
    CANCELLED = "cancelled"
    REPETITION = "repetition"  # the answer was repeating itself (runtime/repetition.py)

    def __str__(self) -> str:  # "eos", as in f-strings, JSON and the OpenAI finish_reason
        return self.value

    __format__ = str.__format__


@dataclass(frozen=True)
class StepStats:
    """What one speculative step did: one target forward, k proposed, n accepted."""

    k: int
    n_accepted: int
    draft_s: float = 0.0
    verify_s: float = 0.0  # the target forward, verification and commit
    forward_s: float = 0.0  # of verify_s, the time inside the target's forward (the rest is runtime overhead)


@dataclass(frozen=True)
class TokenLogprob:
    """The model's log-probability of one emitted token and its `top` most likely alternatives.

    Of the target's own distribution at that position: log-softmax of its logits (float64), before temperature,
    truncation (top-k/top-p/min-p), penalties and a constraint's mask, as OpenAI and vLLM report them. Under
    speculation the row is the verify forward's row for that position: the same logits plain decoding computes.
    `top`: (token id, logprob) pairs, most likely first (ties: lowest id first); empty unless asked for.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Response:
    """One streamed piece of output (mlx-lm style)."""

    text: str  # newly printable text (may be "" while a multi-byte character or stop string is pending)
    token: int
    from_draft: bool  # the token was an accepted draft token
    tokens_per_s: float
    finish_reason: FinishReason | None = None
    logprob: TokenLogprob | None = None  # set when the call asked for logprobs


@dataclass(frozen=True)
class GenerationResult:
    """A whole answer: the Response stream collected (EOS token stripped from `tokens`, never part of `text`)."""

    text: str
    tokens: list[int]
    finish_reason: FinishReason
    prompt_tokens: int = 0
    stats: "CallStats | None" = None  # runtime/stats.py: the call's statistics (None: collected without them)
    logprobs: list[TokenLogprob] | None = None  # one per token of `tokens` when the call asked for logprobs
