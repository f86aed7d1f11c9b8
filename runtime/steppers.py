"""Steppers: what one round of decoding does. The decode loop (runtime/decode.py) owns everything else (prompt and
length checks, the cache, prefill timing, stopping, statistics, sessions) and drives one Stepper per call:

    stepper.start(seq, start)            once: prefill (through hidden(taps) + observe_prompt for a drafter that
                                         reads taps) / bind / begin; returns the prompt tokens it prefilled
    stepper.step(seq, room, rng)         each round: commits >= 1 token into seq and returns (emitted, StepStats)
    stepper.finish(tokens)               once, however the call ends: the prompt and every emitted token

  ChainStepper   draft a chain (or nothing: plain decoding), verify it in one forward (docs/algorithms.md 1.1-1.3)
  TreeStepper    draft a token tree, verify it under the tree mask (1.4)
  lossy steppers (runtime/lossy.py): one token per round by a policy whose output is NOT the model's own.

Invariant (the only KV cursor): the target cache holds every committed token except the last one, which is fed as
the first input of the next round: forward([last, *draft]) verifies k draft tokens and yields k+1 rows of p.
"""
from __future__ import annotations

import abc
import time
from typing import Sequence

import numpy as np

from .backends.base import Backend, Cache, LayeredBackend, feed
from .constraint import Constraint, mask_logits, mask_q
from .draft_length import AdaptiveDraftLength
from .drafters.base import Drafter, TreeDrafter
from .request import Request
from .sampling import ProbRows, greedy_ids, logits_to_probs, top_ids
from .tree import TreeDraft
from .types import EMPTY_DRAFT, Draft, SamplingParams, StepStats, TokenLogprob, Tokens
from .verify import GreedyVerifier, verify_tree
from .verify.base import Verifier


class SeqState:
    """Committed tokens of one sequence in a preallocated buffer, plus its target KV cache."""

    def __init__(self, prompt: Tokens, cache: Cache) -> None:
        self.buf = np.zeros(cache.capacity + 1, dtype=np.int32)
        self.n = len(prompt)
        self.buf[:self.n] = prompt
        self.cache = cache

    @property
    def tokens(self) -> Tokens:
        return self.buf[:self.n]

    def extend(self, toks: Sequence[int]) -> None:
        self.buf[self.n:self.n + len(toks)] = toks
        self.n += len(toks)


class Stepper(abc.ABC):
    """One decoding policy. `reserve`: cache positions a round may write past the committed tokens (k + 1 for a
    chain of k); `context_limit`: a bound on the context besides the target's (None: none); `label`: set, and
    containing "lossy", for a policy whose output is not the target's own."""

    reserve: int = 1
    context_limit: int | None = None
    label: str | None = None
    # set by `step` when the call asked for logprobs: one TokenLogprob per emitted token of the last round
    step_logprobs: list[TokenLogprob] | None = None

    def __init__(self, target: Backend) -> None:
        self.target = target

    def start(self, seq: SeqState, start: int) -> int:
        """Prefill seq.tokens[start:-1] (those before `start` are cached already: a Session); returns how many."""
        return prefill(self.target, seq, start)

    @abc.abstractmethod
    def step(self, seq: SeqState, room: int, rng: np.random.Generator) -> tuple[list[int], StepStats]:
        """requires: seq.cache.length == seq.n - 1, `room` free positions past it (>= 1). Commits the emitted tokens
        (>= 1) into seq and returns them with the round's stats."""

    def finish(self, tokens: Tokens) -> None:
        """The call ended (finished, stopped or interrupted); tokens [T] = the prompt and every emitted token."""


def prefill(target: Backend, seq: SeqState, start: int = 0, drafter: Drafter | None = None) -> int:
    """Feed the prompt tokens from `start` up to all but the last (the first round feeds it); a drafter that
    observes logits sees them. Returns the number of tokens fed."""
    n = seq.n - 1 - start
    if n > 0 and drafter is not None:  # token recycling learns the prompt's successors before the first round
        drafter.observe(seq.tokens[start:-1], target.forward(seq.tokens[start:-1], seq.cache))
    elif n > 0:
        feed(target, seq.tokens[start:-1], seq.cache)
    return max(n, 0)


def prefill_taps(target: LayeredBackend, seq: SeqState, start: int, taps: tuple[int, ...],
                 observer: Drafter | None = None) -> tuple[int, dict[int, np.ndarray]]:
    """prefill for a drafter that reads taps (caps.reads_taps): the same tokens through hidden(..., taps), so the
    drafter sees the target's hidden states at every prompt position it fed. Returns (tokens fed, {n: [T, D]})."""
    n = seq.n - 1 - start
    if n <= 0:
        return 0, {}
    h, tapped = target.hidden(seq.tokens[start:-1], seq.cache, taps=taps)
    if observer is not None:
        observer.observe(seq.tokens[start:-1], target.logits_from_hidden(h))
    return n, tapped


class _Speculative(Stepper):
    """What chain and tree rounds share: prefill with the drafter watching, then bind and begin; the call's
    Request (runtime/request.py): its sampling params, constraint and logprobs (n alternatives per token, None: off)."""

    def __init__(self, target: Backend, drafter: Drafter | None, req: Request) -> None:
        super().__init__(target)
        self.drafter, self.params = drafter, req.params
        self.constraint, self.logprobs = req.constraint, req.logprobs
        caps = drafter.caps if drafter is not None else None  # read once per decode, never in the step
        self.observer = drafter if (caps is not None and caps.observes_logits) else None
        self.binds = caps is not None and caps.binds_target
        self.reads_taps = caps is not None and caps.reads_taps

    def start(self, seq: SeqState, start: int) -> int:
        if self.reads_taps:  # a trained head fills its own cache from the prompt's hidden states
            n, tapped = prefill_taps(self.target, seq, start, tuple(self.drafter.verify_taps), self.observer)
        else:
            n = prefill(self.target, seq, start, self.observer)
        if self.drafter is not None:
            if self.binds:  # self-speculative drafters share the target's weights and KV cache
                self.drafter.bind(self.target, seq.cache)
            self.drafter.begin(seq.tokens.copy())
            if self.reads_taps:
                self.drafter.observe_prompt(tapped, seq.tokens.copy(), start)
        return n

    def finish(self, tokens: Tokens) -> None:
        if self.drafter is not None:  # a memory of past answers keeps them (runtime/drafters/suffix.py)
            self.drafter.finish(tokens)


class ChainStepper(_Speculative):
    """Draft <= k tokens, keep the prefix worth verifying (policy; all without one), one target forward over
    [last, *draft], verify, commit. With no drafter: plain decoding (one token per forward)."""

    def __init__(self, target: Backend, drafter: Drafter | None, req: Request, verifier: Verifier, k: int,
                 policy: AdaptiveDraftLength | None = None) -> None:
        super().__init__(target, drafter, req)
        self.verifier, self.k, self.policy = verifier, k, policy
        self.greedy = isinstance(verifier, GreedyVerifier)  # the argmax decides: no [k+1, V] one-hot rows to build
        self.reserve = k + 1
        pays = drafter is not None and drafter.caps.pays_per_token
        self.budget = policy is not None and pays  # a drafter that pays per token drafts only what would be verified
        self.budget_kind = drafter.caps.budget_kind if drafter is not None else None
        self.taps: tuple[int, ...] = ()

    def start(self, seq: SeqState, start: int) -> int:
        n = super().start(seq, start)
        # known after bind (DEL's candidate layers depend on the target): the verify forward then taps them
        self.taps = tuple(self.drafter.verify_taps) if self.drafter is not None else ()
        return n

    def step(self, seq: SeqState, room: int, rng: np.random.Generator) -> tuple[list[int], StepStats]:
        t0 = time.perf_counter()
        drafter, policy, params, k = self.drafter, self.policy, self.params, min(self.k, room)
        context = seq.tokens
        if self.budget and k > 0:  # only what the policy would verify of the paid kind of draft
            k = min(k, policy.budget(k, self.budget_kind))
        draft = drafter.propose(context, k, params, rng) if (drafter is not None and k > 0) else EMPTY_DRAFT
        if policy is not None and draft.k:
            draft = draft.prefix(policy.choose(draft.kind, draft.k))
        masks, own = None, draft.k
        if self.constraint is not None:  # the draft ends at its first forbidden token; q rows are masked too
            draft, masks, own = self._constrain(draft, k)
        t1 = time.perf_counter()
        base = seq.cache.length
        step_tokens = np.concatenate([context[-1:], draft.tokens]).astype(np.int32)
        tf = time.perf_counter()
        if self.taps:
            h, tapped = self.target.hidden(step_tokens, seq.cache, taps=self.taps)
            logits = self.target.logits_from_hidden(h)
        else:
            logits = self.target.forward(step_tokens, seq.cache)
        forward_s = time.perf_counter() - tf
        if self.observer is not None:  # drafters that learn from the target's logits (token recycling)
            self.observer.observe(step_tokens, logits)
        masked = logits if masks is None else mask_logits(logits, masks)
        history = np.concatenate([context, draft.tokens])
        if self.greedy:
            verdict = self.verifier.verify_ids(draft, greedy_ids(masked, params, history=history))
        else:
            verdict = self.verifier.verify(draft, ProbRows(masked, params, history=history), rng)
        if policy is not None:
            policy.observe(draft.kind, own, min(verdict.n_accepted, own), len(step_tokens), forward_s)
        seq.cache.rollback(base + 1 + verdict.n_accepted)  # [last, accepted...] are now committed in the cache
        emitted = [int(x) for x in draft.tokens[:verdict.n_accepted]] + [int(verdict.next_token)]
        seq.extend(emitted)
        if self.constraint is not None:
            self.constraint.commit(emitted)
        if self.logprobs is not None:
            self.step_logprobs = token_logprobs(logits[:len(emitted)], emitted, self.logprobs)
        if drafter is not None:
            if self.taps:
                drafter.observe_verify(tapped, np.asarray(emitted, dtype=np.int32))
            drafter.accept(min(verdict.n_accepted, own), verdict.next_token)
        t2 = time.perf_counter()
        return emitted, StepStats(k=draft.k, n_accepted=verdict.n_accepted, draft_s=t1 - t0, verify_s=t2 - t1,
                                  forward_s=forward_s)


    def _constrain(self, draft: Draft, k: int) -> tuple[Draft, np.ndarray, int]:
        """The draft cut at its first forbidden token, then extended (speculative steps only) by the tokens the
        grammar forces next, up to k: they are verified like any draft token (one-hot q rows, the 1.2 rule for a
        model drafter's draft), so the output is unchanged. Returns (draft, masks, own): own = the drafter's own
        tokens kept, what its `accept` and the draft-length policy learn from."""
        extend = self.drafter is not None and not self.binds and not self.taps  # not into a shared target cache
        masks, n_ok, forced = self.constraint.allowed(draft.tokens, k if extend else 0)
        own = n_ok
        q = None if draft.q is None else mask_q(draft.q[:own], masks[:own])
        if len(forced):
            if q is not None:
                onehot = np.zeros((len(forced), q.shape[1]))
                onehot[np.arange(len(forced)), forced] = 1.0
                q = np.concatenate([q, onehot])
            return Draft(np.concatenate([draft.tokens[:own], forced]).astype(np.int32), q, draft.kind), masks, own
        return Draft(draft.tokens[:own], q, draft.kind), masks, own


class TreeStepper(_Speculative):
    """One tree round (docs/algorithms.md 1.4): propose a tree of <= max_nodes nodes, one target forward over
    [last, *nodes] with the tree mask, verify (1.2 / 1.4 / greedy), move the accepted path's K/V into place
    (`cache.compact`), commit. requires: a target with caps.tree_mask and a cache with `compact`."""

    def __init__(self, target: Backend, drafter: TreeDrafter, req: Request) -> None:
        super().__init__(target, drafter, req)
        self.max_nodes = int(drafter.max_nodes)
        self.reserve = self.max_nodes + 1

    def step(self, seq: SeqState, room: int, rng: np.random.Generator) -> tuple[list[int], StepStats]:
        t0 = time.perf_counter()
        context = seq.tokens
        tree: TreeDraft = self.drafter.propose_tree(context, min(self.max_nodes, room), self.params, rng)
        t1 = time.perf_counter()
        base = seq.cache.length
        fed = np.concatenate([context[-1:], tree.tokens]).astype(np.int32)
        tf = time.perf_counter()
        logits = self.target.forward(fed, seq.cache, tree_mask=tree.mask())  # [n+1, V]
        forward_s = time.perf_counter() - tf
        if self.observer is not None:
            self.observer.observe(fed, logits)
        masked = logits if self.constraint is None else mask_logits(logits, tree_masks(tree, self.constraint))
        p = tree_probs(tree, masked, self.params, context)
        verdict = verify_tree(tree, p, rng, greedy=self.params.greedy)
        # slots base + node: the root (in place already) and the accepted path, ascending because BFS orders them
        seq.cache.compact(base + np.array((0, *verdict.path), dtype=np.int64), base)
        emitted = [int(tree.tokens[j - 1]) for j in verdict.path] + [int(verdict.next_token)]
        seq.extend(emitted)
        if self.constraint is not None:
            self.constraint.commit(emitted)
        if self.logprobs is not None:
            self.step_logprobs = token_logprobs(logits[np.array((0, *verdict.path), dtype=np.int64)], emitted,
                                                self.logprobs)
        self.drafter.accept(verdict.n_accepted, verdict.next_token)
        t2 = time.perf_counter()
        return emitted, StepStats(k=tree.n, n_accepted=verdict.n_accepted, draft_s=t1 - t0, verify_s=t2 - t1,
                                  forward_s=forward_s)


def tree_probs(tree: TreeDraft, logits: np.ndarray, params: SamplingParams, context: Tokens) -> np.ndarray:
    """p [n+1, V]; with a penalty each node's row is penalised by its own root path's history."""
    if not params.penalised:
        return logits_to_probs(logits, params)
    rows = [logits_to_probs(logits[j], params, history=np.concatenate(
        [context, tree.tokens[np.array(tree.path_to(j), dtype=np.int64) - 1]])) for j in range(tree.n + 1)]
    return np.concatenate(rows, axis=0)


def tree_masks(tree: TreeDraft, constraint: Constraint) -> np.ndarray:
    """bool [n+1, V]: row j the tokens the constraint allows after node j's root path. A node the constraint
    forbids is masked out by its parent's row, so neither it nor its subtree can be accepted (p = 0 there under
    every tree rule); the rows of such unreachable nodes allow everything (they are never read on an accepted path).
    One `allowed` call per leaf gives the rows of its whole path."""
    rows, done = None, np.zeros(tree.n + 1, dtype=bool)
    has_kids = np.zeros(tree.n + 1, dtype=bool)
    has_kids[tree.parents] = True
    for leaf in np.flatnonzero(~has_kids):
        nodes = (0, *tree.path_to(int(leaf)))
        m, n_ok, _ = constraint.allowed(tree.tokens[np.array(nodes[1:], dtype=np.int64) - 1])
        if rows is None:
            rows = np.ones((tree.n + 1, m.shape[1]), dtype=bool)
        for i in range(n_ok + 1):  # nodes[i] is reachable: its row is the mask after its path
            if not done[nodes[i]]:
                rows[nodes[i]], done[nodes[i]] = m[i], True
    return rows


def token_logprobs(rows: np.ndarray, tokens: Sequence[int], n_top: int) -> list[TokenLogprob]:
    """One TokenLogprob per token: log-softmax of its logits row (float64; the model's own distribution before any
    sampling transform) at the token, and the n_top most likely ids (ties: lowest id first)."""
    x = np.asarray(rows)  # its values cast to float64 exactly, one at a time, below
    e = x.astype(np.float64)  # the one array of the rows' size, worked in place (sampling._warp_row says why)
    m = e.max(axis=1, keepdims=True)
    e -= m
    logz = (m + np.log(np.exp(e, out=e).sum(axis=1, keepdims=True)))[:, 0]
    out = []
    for i, t in enumerate(tokens):  # a log-probability is x - logz: only the few asked for are formed
        top = tuple((int(j), float(np.float64(x[i, j]) - logz[i])) for j in top_ids(x[i], n_top))
        out.append(TokenLogprob(int(t), float(np.float64(x[i, int(t)]) - logz[i]), top))
    return out
