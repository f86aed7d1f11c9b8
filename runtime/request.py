"""What one decode call is asked to do, as two frozen values that cross the runtime from the assembly layer to the
steppers (no keyword relays):

    Request       the call: sampling parameters, how long, when to stop, its seed, its output constraint, logprobs
    Speculation   how it is decoded: the drafter (or a labelled lossy mode), k, the draft-length policy, the verifier

    decode(target, prompt, spec, req, *, session, stats)       runtime/decode.py: token events
    stream(target, tokenizer, prompt, spec, req, *, session, stats)   runtime/generate.py: text Responses

Both are validated at construction (ValueError naming the field). A Request's constraint is the call's own compiled
Constraint (it holds the matcher's state for this call): build a new Request per call. PLAIN is plain decoding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .types import SamplingParams
from .verify import VerifierKind

if TYPE_CHECKING:  # the steppers import this module; these only annotate
    from .constraint import Constraint
    from .drafters.base import Drafter
    from .lossy import LossyMode
    from .repetition import RepetitionStop

MAX_TOP_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs


@dataclass(frozen=True)
class Request:
    """One call: what to sample with and when to stop.

    max_tokens None: to EOS (eos_ids) or the room left in the context. max_context: the positions this call may use,
    prompt and answer (None: the target's context length; a Session's capacity wins). eos_ids None: the
    tokenizer's end-of-turn ids where a tokenizer decodes the text (runtime/generate.py), none in bare `decode`.
    repetition: the answer ends (finish REPETITION) at its first token that completes a loop by this rule; the
    output is then a prefix of the output without it (runtime/repetition.py).
    The call's random draws come from np.random.default_rng(seed): the same seed, the same output."""
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int = 0
    eos_ids: tuple[int, ...] | None = None
    constraint: Constraint | None = None  # the output must match it (runtime/constraint.py); None: free text
    logprobs: int | None = None  # None: off; n: each token's TokenLogprob with its n most likely alternatives
    max_context: int | None = None
    repetition: RepetitionStop | None = None  # stop an answer repeating itself (runtime/repetition.py); None: off

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be None (off) or in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max_context must be >= 2 (a prompt token and an answer), got {self.max_context}")
        object.__setattr__(self, "stop", tuple(s for s in self.stop if s))
        if self.eos_ids is not None:
            object.__setattr__(self, "eos_ids", tuple(int(e) for e in self.eos_ids))


@dataclass(frozen=True)
class Speculation:
    """How a call decodes: `drafter` (None: plain decoding) with at most `k` draft tokens a round, verified by
    `verifier`; adaptive_k verifies only the prefix of each draft that pays (runtime/draft_length.py; lossless
    either way). A tree drafter (caps.tree) bounds its trees itself (k unused). `lossy`: an opt-in, labelled lossy
    mode (runtime/lossy.py) decodes instead, without a drafter."""
    drafter: Drafter | None = None
    k: int = 4
    adaptive_k: bool = False
    verifier: VerifierKind = VerifierKind.CHAIN
    lossy: LossyMode | None = None

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"k (the draft length) must be >= 0, got {self.k}")
        if self.lossy is not None and self.drafter is not None:
            raise ValueError(f"{self.lossy.label}: a lossy mode decodes without a drafter; drop the drafter")


PLAIN = Speculation()
