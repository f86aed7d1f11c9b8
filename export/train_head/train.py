"""Training a draft head: EAGLE-3's training-time test on the self-distillation data, on the CPU.

    TrainSettings   steps and/or a time budget (minutes, over every run of a resumed training), batch, LR, threads
    train_head      initialise (lm_head from the target's output rows, norms at 1) or resume from the checkpoint,
                    AdamW + warm-up + cosine LR over max(step / steps, seconds / budget), cross-entropy of every
                    unrolled step against x[p + 2] in the draft vocabulary (answer positions only); checkpoints
                    every `checkpoint_s` seconds and at the end; tau on the held-out sequences
    expected_tau    teacher-forced acceptance: 1 + the mean accepted length of a greedy chain of up to 4 drafts
                    from every held-out answer position (an accepted draft equals the teacher's token, so the
                    unrolled chain is exactly what the drafter would run)
    write_head      head.npz (float16 weights, d2t int64; no pickle) + head.json (docs/train_drafter.md)

The trainer's own checkpoint (<dir>/train/checkpoint.pt) is torch.save of state dicts: it never ships.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .data import Sequences
from .model import HeadConfig, build_head, require_torch

EVAL_DRAFTS = 4
CHECKPOINT = "train/checkpoint.pt"


@dataclass(frozen=True)
class TrainSettings:
    steps: int | None = None  # most optimizer steps in all (None: the time budget alone)
    minutes: float | None = 60.0  # most training minutes in all, over resumed runs (None: the steps alone)
    batch: int = 4  # sequences per step
    lr: float = 2e-3  # high for a short CPU run: the loss falls fastest here (5e-3 diverged on SmolLM2)
    warmup: int = 20
    ttt_steps: int = 3  # S: the unrolled draft steps of the training-time test
    threads: int = 1
    seed: int = 0
    eval_fraction: float = 0.05  # the last sequences held out for tau (at least one, at most eval_max)
    eval_max: int = 48
    checkpoint_s: float = 120.0

    def __post_init__(self) -> None:
        if self.steps is None and self.minutes is None:
            raise ValueError("give a number of steps or a time budget in minutes (or both)")
        if (self.steps is not None and self.steps < 1) or (self.minutes is not None and self.minutes <= 0):
            raise ValueError(f"steps must be >= 1 and minutes > 0: {self.steps}, {self.minutes}")
        if self.batch < 1 or self.ttt_steps < 1 or self.threads < 1 or not 0 < self.eval_fraction < 1:
            raise ValueError(f"batch, ttt_steps and threads must be >= 1, eval_fraction in (0, 1): {self}")


@dataclass(frozen=True)
class Target:
    """What head.json says of the target, and the arrays the head starts from."""
    model: str  # catalogue name or file stem
    gguf_sha256: str
    config: object  # models/config.py ModelConfig: arch, layers, shapes, vocabulary, rope_theta, rms_eps
    embed: np.ndarray = field(repr=False)  # float32 [V, D], times the family's embedding scale
    out_rows: Callable[[np.ndarray], np.ndarray] = field(repr=False)  # ids -> float32 [n, D], the output head's
    #                                                                   rows times the final norm's scale


@dataclass(frozen=True)
class Progress:
    step: int
    seconds: float
    loss: float
    done: float  # the fraction of the steps or the time budget done, whichever is larger


def split(seqs: Sequences, settings: TrainSettings) -> tuple[np.ndarray, np.ndarray]:
    """(training sequence ids, held-out ids): the last eval_fraction, at least one, at most eval_max."""
    n = len(seqs)
    if n < 2:
        raise ValueError(f"training needs at least 2 sequences (one held out), not {n}: give more --prompts")
    held = min(max(1, round(n * settings.eval_fraction)), settings.eval_max, n - 1)
    return np.arange(n - held), np.arange(n - held, n)


def epoch_batches(ids: np.ndarray, lengths: np.ndarray, batch: int, seed: int, pool: int = 32) -> list[np.ndarray]:
    """One epoch's batches: the ids shuffled, each run of `pool` batches' worth sorted by length and cut into
    batches, the batches shuffled. A batch is padded to its longest sequence, so a long prompt (an article to
    summarise) no longer pads seven short ones: on SmolLM2's recipe plus the dev set's 210 prompts a step of 8 took
    6.4 s in a plain shuffle and 3.6 s so. Every id once an epoch (the last partial batch left out), the same for
    the same seed."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(ids)
    n = len(order) // batch * batch
    out = []
    for a in range(0, n, pool * batch):
        run = order[a:min(n, a + pool * batch)]
        run = run[np.argsort(lengths[run], kind="stable")]
        out += [run[i:i + batch] for i in range(0, len(run), batch)]
    return [out[i] for i in rng.permutation(len(out))] if out else [order[:batch]]


def batch_arrays(seqs: Sequences, ids: np.ndarray, t2d: np.ndarray):
    """Padded batch: taps float32 [B, T, 3, D], tokens int64 [B, T], target draft ids int64 [B, T] (x[p + 2]'s,
    -1 where not trained: past the end, in the prompt, outside the draft vocabulary)."""
    lens = [int(seqs.offsets[i + 1] - seqs.offsets[i]) for i in ids]
    t = max(lens)
    d = seqs.taps.shape[-1]
    taps = np.zeros((len(ids), t, 3, d), np.float32)
    tokens = np.zeros((len(ids), t), np.int64)
    target = np.full((len(ids), t), -1, np.int64)
    for b, (i, n) in enumerate(zip(ids, lens)):
        s = int(seqs.offsets[i])
        taps[b, :n] = seqs.taps[s:s + n]
        tokens[b, :n] = seqs.tokens[s:s + n]
        p = np.arange(max(0, int(seqs.prompt_lens[i]) - 2), n - 2)  # x[p + 2] in the answer
        target[b, p] = t2d[seqs.tokens[s + p + 2]]
    return taps, tokens, target


def _masked_targets(target, j: int):
    """Step j's targets: rows p < j have no root (p - j < 0)."""
    out = target.clone()
    out[:, :j] = -1
    return out


def _loss(torch, head, taps, tokens, target, steps: int):
    outs = head(torch.as_tensor(taps), torch.as_tensor(tokens), steps)
    target = torch.as_tensor(target)
    losses = []
    for j, o in enumerate(outs):
        tj = _masked_targets(target, j)
        keep = tj >= 0
        if keep.any():  # logits of the scored rows only
            losses.append(torch.nn.functional.cross_entropy(head.logits(o[keep]), tj[keep]))
    return sum(losses) / max(len(losses), 1)


def accepted_runs(head, seqs: Sequences, i: int, t2d: np.ndarray, drafts: int) -> np.ndarray:
    """Drafts accepted (greedy, chains of up to `drafts`) from each answer root r of sequence i (r + 1 the first
    answer token or later, x[r + 1 + drafts] inside the sequence); the caller holds torch.no_grad()."""
    torch = require_torch()
    taps, tokens, target = batch_arrays(seqs, np.array([i]), t2d)
    outs = head(torch.as_tensor(taps), torch.as_tensor(tokens), drafts)
    roots = np.arange(max(0, int(seqs.prompt_lens[i]) - 1), tokens.shape[1] - 1 - drafts)
    ok, run = np.ones(len(roots), bool), np.zeros(len(roots), np.int64)
    for j, o in enumerate(outs):  # step j of root r is row r + j, drafting x[r + j + 2]
        ok &= head.logits(o[0, roots + j]).argmax(-1).numpy() == target[0, roots + j]
        run += ok
    return run


def expected_tau(head, seqs: Sequences, ids: np.ndarray, t2d: np.ndarray, drafts: int = EVAL_DRAFTS) -> float:
    """1 + the mean number of drafts accepted from every answer root of the sequences `ids` (accepted_runs)."""
    torch = require_torch()
    with torch.no_grad():
        accepted = [run for i in ids if len(run := accepted_runs(head, seqs, i, t2d, drafts))]
    return 1.0 + float(np.concatenate(accepted).mean()) if accepted else float("nan")


def new_head(target: Target, d2t: np.ndarray, seed: int = 0):
    """A freshly initialised head for `target` over the draft vocabulary d2t (the same for the same seed)."""
    torch = require_torch()
    torch.manual_seed(seed)
    head = build_head(HeadConfig.for_target(target.config, len(d2t)), target.embed)
    init_weights(head, target, d2t)
    return head


def init_weights(head, target: Target, d2t: np.ndarray) -> None:
    """lm_head = the target's output rows of the draft vocabulary (its final norm folded in), fc = the high tap
    (g starts as the target's own late hidden state) plus a little of the others, norms at 1."""
    torch = require_torch()
    d = head.cfg.d_model
    with torch.no_grad():
        head.lm_head.copy_(torch.as_tensor(target.out_rows(d2t), dtype=torch.float32))
        head.fc.mul_(0.1)
        head.fc[:, 2 * d:] += torch.eye(d)


def _lr(settings: TrainSettings, step: int, seconds: float) -> float:
    """Linear warm-up, then cosine to 10% over the larger of the step and time fractions done."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(_done(settings, step, seconds), 1.0))))


def _done(settings: TrainSettings, step: int, seconds: float) -> float:
    """The fraction of the training done: of its steps or of its time budget, whichever is further."""
    return max(step / settings.steps if settings.steps else 0.0,
               seconds / (settings.minutes * 60) if settings.minutes else 0.0)


def _save(torch, path: Path, head, opt, step: int, seconds: float, d2t, data_sha256: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "seconds": seconds,
                "d2t": d2t, "data_sha256": data_sha256, "config": asdict(head.cfg)}, tmp)
    os.replace(tmp, path)


def _resume(torch, path: Path, head, opt, data_sha256: str) -> tuple[int, float]:
    state = torch.load(path, weights_only=False)
    if state["data_sha256"] != data_sha256:
        raise ValueError(f"{path} was trained on other data (sha256 {state['data_sha256'][:12]}..., this data "
                         f"{data_sha256[:12]}...): leave --resume out to start over")
    head.load_state_dict(state["head"])
    opt.load_state_dict(state["opt"])
    return int(state["step"]), float(state["seconds"])


def checkpoint_d2t(out: Path) -> np.ndarray | None:
    """The draft vocabulary a checkpoint in `out` was trained with (a resumed run keeps it), None without one."""
    path = out / CHECKPOINT
    if not path.exists():
        return None
    torch = require_torch()
    return np.asarray(torch.load(path, weights_only=False)["d2t"], np.int64)


@dataclass(frozen=True)
class Trained:
    head: object  # the DraftHead (torch module), trained
    d2t: np.ndarray
    steps: int
    seconds: float
    tau_eval: float | None
    loss_first: float | None  # this run's first and last batch loss (None: no step ran)
    loss_last: float | None


def train_head(seqs: Sequences, target: Target, d2t: np.ndarray, out: Path, settings: TrainSettings, *,
               resume: bool = False, on_step: Callable[[Progress], object] | None = None) -> Trained:
    """Train (or, resume=True, continue from <out>/train/checkpoint.pt, same data and d2t) and evaluate tau."""
    torch = require_torch()
    torch.set_num_threads(settings.threads)
    head = new_head(target, d2t, settings.seed)
    opt = torch.optim.AdamW(head.parameters(), lr=settings.lr, weight_decay=0.01, betas=(0.9, 0.95))
    path = out / CHECKPOINT
    step, seconds = _resume(torch, path, head, opt, seqs.sha256) if resume and path.exists() else (0, 0.0)
    t2d = np.full(target.config.vocab_size, -1, np.int64)
    t2d[d2t] = np.arange(len(d2t))
    train_ids, held = split(seqs, settings)
    per_epoch = max(1, len(train_ids) // settings.batch)
    lengths = np.diff(seqs.offsets)
    first = last = None
    epoch, batches = -1, []
    saved = time.perf_counter()
    while _done(settings, step, seconds) < 1.0:
        t0 = time.perf_counter()
        if step // per_epoch != epoch:
            epoch = step // per_epoch
            batches = epoch_batches(train_ids, lengths, settings.batch, settings.seed + epoch)
        taps, tokens, tgt = batch_arrays(seqs, batches[step % per_epoch], t2d)
        for group in opt.param_groups:
            group["lr"] = _lr(settings, step, seconds)
        loss = _loss(torch, head, taps, tokens, tgt, settings.ttt_steps)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        opt.step()
        step, seconds = step + 1, seconds + time.perf_counter() - t0
        last = float(loss.detach())
        first = last if first is None else first
        if on_step:
            on_step(Progress(step, seconds, last, _done(settings, step, seconds)))
        if time.perf_counter() - saved > settings.checkpoint_s:
            _save(torch, path, head, opt, step, seconds, d2t, seqs.sha256)
            saved = time.perf_counter()
    _save(torch, path, head, opt, step, seconds, d2t, seqs.sha256)
    head.eval()
    return Trained(head, d2t, step, seconds, expected_tau(head, seqs, held, t2d), first, last)


def loss_on(head, seqs: Sequences, ids: np.ndarray, d2t: np.ndarray, vocab: int, steps: int) -> float:
    """The training loss over the sequences `ids` without updating anything (tests, reports)."""
    torch = require_torch()
    t2d = np.full(vocab, -1, np.int64)
    t2d[d2t] = np.arange(len(d2t))
    with torch.no_grad():
        return float(_loss(torch, head, *batch_arrays(seqs, ids, t2d), steps))
