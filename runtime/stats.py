"""Decoding statistics (docs/algorithms.md 5): one accumulator every tool prints the same way, plus the
closed-form expectations used to sanity-check measurements.

Glossary: a round = one target forward over [last, *draft]; it emits the accepted draft tokens plus
one recovered or bonus token. tau (mean accepted length) = tokens emitted per target forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from .types import FinishReason, SamplingParams, StepStats


@dataclass(eq=False)  # arrays inside: compare to_dict() instead
class DecodeStats:
    """Mutable accumulator: `record` one StepStats per target forward; the decode loop adds the timings.

    Example: rounds (k=4, accepted 4), (k=4, accepted 1), (k=2, accepted 0)
        n_target_forwards 3, n_emitted 5 + 2 + 1 = 8, tau 8/3, acceptance_rate 5/10,
        accepted_hist [1, 1, 0, 0, 1], acceptance_by_position [2/3, 1/3, 1/2, 1/2].
    """

    n_target_forwards: int = 0
    n_emitted: int = 0  # accepted + recovered/bonus, as produced by the verifier
    n_drafted: int = 0
    n_accepted: int = 0
    n_generated: int = 0  # tokens handed to the caller (< n_emitted when a round is cut by eos / max_tokens)
    n_prefilled: int = 0  # prompt tokens run through the target (a Session skips the prefix it holds)
    n_calls: int = 0  # decode calls recorded (the mean first-token time's denominator)
    first_token_s: float = 0.0  # from each call's start (before its prefill) to its first token, summed
    first_in_prefill: int = 0  # tokens timed inside prefill_s (llama.cpp baselines time their first token with it)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    forward_s: float = 0.0  # inside target forwards (part of verify_s)
    accepted_hist: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))  # [kmax+1] rounds by n
    proposed_at: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [kmax] rounds with k > i
    accepted_at: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [kmax] pos i accepted

    def record(self, step: StepStats) -> None:
        if not 0 <= step.n_accepted <= step.k:
            raise ValueError(f"a round cannot accept {step.n_accepted} of {step.k} draft tokens")
        self._grow(step.k)
        self.n_target_forwards += 1
        self.n_emitted += step.n_accepted + 1
        self.n_drafted += step.k
        self.n_accepted += step.n_accepted
        self.accepted_hist[step.n_accepted] += 1
        self.proposed_at[:step.k] += 1
        self.accepted_at[:step.n_accepted] += 1
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s
        self.forward_s += step.forward_s

    def merge(self, other: "DecodeStats") -> None:
        """Add another accumulator's counts and times (per-prompt stats into per-category and overall totals)."""
        self._grow(len(other.accepted_hist) - 1)
        n = len(other.accepted_hist)
        for name in ("n_target_forwards", "n_emitted", "n_drafted", "n_accepted", "n_generated", "n_prefilled",
                     "n_calls", "first_token_s", "first_in_prefill", "prefill_s", "decode_s", "draft_s", "verify_s",
                     "forward_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.accepted_hist[:n] += other.accepted_hist
        self.proposed_at[:n - 1] += other.proposed_at
        self.accepted_at[:n - 1] += other.accepted_at

    def _grow(self, k: int) -> None:
        extra = k + 1 - len(self.accepted_hist)
        if extra > 0:
            pad = np.zeros(extra, dtype=np.int64)
            self.accepted_hist = np.concatenate([self.accepted_hist, pad])
            self.proposed_at = np.concatenate([self.proposed_at, pad])
            self.accepted_at = np.concatenate([self.accepted_at, pad])

    @property
    def mean_accepted_length(self) -> float:
        """tau: tokens emitted per target forward (1.0 for plain decoding; 0.0 before any round)."""
        return self.n_emitted / self.n_target_forwards if self.n_target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0.0 when nothing was drafted)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def acceptance_by_position(self) -> np.ndarray:
        """[kmax] float: for draft position i, accepted fraction among rounds that proposed >= i+1 tokens."""
        return self.accepted_at / np.maximum(self.proposed_at, 1)

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of decoding (prefill excluded); uses n_generated when the loop set it."""
        n = self.n_generated or self.n_emitted
        return n / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        """Prompt tokens prefilled per second of prefill (0.0 when nothing was prefilled)."""
        return self.n_prefilled / self.prefill_s if self.n_prefilled and self.prefill_s > 0 else 0.0

    @property
    def mean_first_token_s(self) -> float:
        """Seconds from a call's start to its first token, the prompt's processing included (mean over calls)."""
        return self.first_token_s / self.n_calls if self.n_calls else 0.0

    @property
    def end_to_end_tokens_per_s(self) -> float:
        """Answer tokens per second of the whole call, the prompt's processing included: what a user waits for.
        Example: prefill 0.5 s, 20 tokens decoded in 1.5 s -> 10 tok/s end to end (decode 13.3)."""
        wall = self.prefill_s + self.decode_s
        return ((self.n_generated or self.n_emitted) + self.first_in_prefill) / wall if wall > 0 else 0.0

    def to_dict(self) -> dict:
        """JSON-ready (plain ints, floats and lists)."""
        return {
            "n_target_forwards": self.n_target_forwards, "n_emitted": self.n_emitted,
            "n_generated": self.n_generated, "n_drafted": self.n_drafted, "n_accepted": self.n_accepted,
            "mean_accepted_length": float(self.mean_accepted_length), "acceptance_rate": float(self.acceptance_rate),
            "accepted_hist": [int(v) for v in self.accepted_hist],
            "acceptance_by_position": [float(v) for v in self.acceptance_by_position],
            "proposed_at": [int(v) for v in self.proposed_at], "accepted_at": [int(v) for v in self.accepted_at],
            "n_prefilled": self.n_prefilled, "prefill_s": float(self.prefill_s), "decode_s": float(self.decode_s),
            "draft_s": float(self.draft_s),
            "verify_s": float(self.verify_s), "forward_s": float(self.forward_s),
            "tokens_per_s": float(self.tokens_per_s), "prompt_tokens_per_s": float(self.prompt_tokens_per_s),
            "n_calls": self.n_calls, "first_token_s": float(self.first_token_s),
            "first_in_prefill": self.first_in_prefill,
            "end_to_end_tokens_per_s": float(self.end_to_end_tokens_per_s),
        }

    def summary(self) -> str:
        """One line, llama.cpp style."""
        n = self.n_generated or self.n_emitted
        line = (f"decoded {n} tokens in {self.decode_s:.2f} s ({self.tokens_per_s:.1f} t/s), "
                f"prefill {self.n_prefilled} tokens in {self.prefill_s:.2f} s ({self.prompt_tokens_per_s:.1f} t/s), "
                f"{self.n_target_forwards} target forwards, "
                f"tau {self.mean_accepted_length:.2f}")
        if self.n_drafted:
            line += (f", drafted {self.n_drafted}, accepted {self.n_accepted} ({100 * self.acceptance_rate:.1f}%), "
                     f"draft {self.draft_s:.2f} s, verify {self.verify_s:.2f} s")
        return line


@dataclass(frozen=True)
class CallStats:
    """One call's statistics, built once when its stream ends (assembly/decoder.py Decoder.stream); `to_dict()` only
    at the JSON edges (the CLI's --json, the server's `specedge` extension, chat /save).

    decode: the call's DecodeStats; drafter: what decoded ("none" for plain decoding, the drafter spec, or the
    lossy mode's label); sampling: the parameters the call sampled with, seed its seed, defaults where its unset
    values came from (assembly/sampling_defaults.py)."""

    decode: DecodeStats
    prompt_tokens: int
    finish_reason: FinishReason
    drafter: str
    sampling: SamplingParams
    seed: int = 0
    defaults: str = ""
    reused_prompt_tokens: int = 0  # of prompt_tokens, held by the session's cache (not prefilled)
    ttft_s: float | None = None  # from the call's start to its first token
    wall_s: float = 0.0

    def sampling_dict(self) -> dict:
        """temperature, top_p, top_k, min_p, repeat_penalty, then every other SamplingParams field that is not at
        its default (typical_p, the penalties, DRY, logit_bias as {id: bias}), seed, defaults."""
        p = self.sampling
        out = {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "min_p": p.min_p,
               "repeat_penalty": p.repeat_penalty}
        for f in fields(SamplingParams):
            value = getattr(p, f.name)
            if f.name in out or f.name == "dry_breakers":  # breakers: the model's, not the call's
                continue
            if value != f.default:
                out[f.name] = {t: b for t, b in value} if f.name == "logit_bias" else value
        return {**out, "seed": self.seed, "defaults": self.defaults}

    def to_dict(self) -> dict:
        """JSON-ready: the DecodeStats fields, then the call's facts."""
        return {**self.decode.to_dict(), "prompt_tokens": self.prompt_tokens,
                "reused_prompt_tokens": self.reused_prompt_tokens, "ttft_s": self.ttft_s, "wall_s": self.wall_s,
                "drafter": self.drafter, "finish_reason": self.finish_reason.value, "sampling": self.sampling_dict()}


def mbsu(tau: float, draft_bytes: float, target_bytes: float) -> float:
    """Memory-bound speedup (docs/algorithms.md 5): tau / (1 + B_draft / B_target).

    draft_bytes: weight bytes the drafter reads per round (sum over its forwards; 0 for n-gram);
    target_bytes: weight bytes one target verify forward reads.
    Example: tau 3.0, a drafter of 1/10 the target's bytes run 4 times per round -> 3 / 1.4 = 2.14.
    """
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be > 0, got {target_bytes}")
    if draft_bytes < 0:
        raise ValueError(f"draft_bytes must be >= 0, got {draft_bytes}")
    return tau / (1.0 + draft_bytes / target_bytes)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens per target call with i.i.d. acceptance alpha and draft length k (docs/algorithms.md 1.1).

    (1 - alpha^(k+1)) / (1 - alpha), and k + 1 at alpha = 1. Example: alpha 0.8, k 4 -> 3.36.
    """
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha}, k={k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Wall-time speedup (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)), c = T_draft / T_target (docs/algorithms.md 1.1)."""
    return expected_tokens_per_step(alpha, k) / (k * c + 1.0)
