"""`specedge train-drafter` from an opened target to a written head: data -> draft vocabulary -> training -> head.

    <out>/data/        the self-distillation shards (data.py), resumed prompt by prompt-shard
    <out>/train/       the trainer's checkpoint (resumed with resume=True)
    <out>/head.npz, <out>/head.json   the head (docs/train_drafter.md)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .artifact import head_arrays, manifest, output_rows, target_embedding, write_head
from .data import DataSettings, extra_digest, make_data
from .model import HeadConfig, require_torch
from .prompts import RECIPE_LICENCE, RECIPE_VERSION
from .train import CHECKPOINT, Progress, Target, TrainSettings, Trained, checkpoint_d2t, train_head
from .vocab import DEFAULT_VD, draft_vocab


@dataclass(frozen=True)
class Job:
    model: str  # head.json's target.model: the catalogue name or the file's stem
    gguf_sha256: str
    out: Path
    data: DataSettings
    train: TrainSettings
    vocab_draft: int = DEFAULT_VD
    resume: bool = False
    command: str = ""  # the command line, recorded in head.json
    extra_source: str = ""  # where data.extra came from (the file as given), recorded in head.json


@dataclass(frozen=True)
class Bars:
    """Progress callbacks (the command's tqdm bars; tests pass none)."""
    data: Callable[[int, int], object] | None = None  # (prompts done, total)
    train: Callable[[Progress], object] | None = None


def check_resume(job: Job) -> None:
    """A checkpoint left in `out` is continued only when asked (resume), never overwritten silently."""
    if (job.out / CHECKPOINT).exists() and not job.resume:
        raise ValueError(f"{job.out / CHECKPOINT} holds a training in progress: --resume continues it, or delete "
                         f"{job.out / 'train'} (or give another --out) to start over")


def run(job: Job, backend, tokenizer, gguf, bars: Bars = Bars()) -> tuple[Path, dict]:
    """Make (or complete) the data, choose the draft vocabulary (a resumed training keeps its own), train, write
    the head; returns (its directory, head.json)."""
    require_torch()  # before minutes of data generation
    check_resume(job)
    seqs = make_data(backend, tokenizer, job.out / "data", job.data, target_sha256=job.gguf_sha256,
                     progress=bars.data)
    d2t = checkpoint_d2t(job.out) if job.resume else None
    wanted = min(job.vocab_draft, gguf.config.vocab_size)
    if d2t is not None and len(d2t) != wanted:
        raise ValueError(f"the checkpoint in {job.out} drafts over {len(d2t)} tokens, not {wanted}: resume with "
                         f"--vocab-draft {len(d2t)}, or start over without --resume")
    if d2t is None:
        d2t = draft_vocab(seqs.answer_tokens(), gguf.config.vocab_size, job.vocab_draft,
                          always=tuple(tokenizer.eos_ids))
    embed = target_embedding(gguf)
    target = Target(job.model, job.gguf_sha256, gguf.config, embed, output_rows(gguf, embed))
    trained = train_head(seqs, target, d2t, job.out, job.train, resume=job.resume, on_step=bars.train)
    meta = manifest(HeadConfig.for_target(gguf.config, len(d2t)), model=job.model, gguf_sha256=job.gguf_sha256,
                    config=gguf.config, taps=job.data.taps,
                    training=_training(job, trained, seqs))
    write_head(job.out, head_arrays(trained.head, d2t), meta)
    return job.out, meta


def _training(job: Job, trained: Trained, seqs) -> dict:
    tau = None if trained.tau_eval is None or np.isnan(trained.tau_eval) else round(trained.tau_eval, 4)
    data_s = None if seqs.seconds is None else round(seqs.seconds, 1)  # the target's time making the shards
    return {"command": job.command, "data_sha256": seqs.sha256, "prompts": len(seqs), "tokens": int(len(seqs.tokens)),
            "steps": trained.steps, "seconds": round(trained.seconds, 1), "tau_eval": tau,
            "licence": RECIPE_LICENCE, "recipe_version": RECIPE_VERSION, "data_seconds": data_s,
            "max_tokens": job.data.max_tokens, "ttt_steps": job.train.ttt_steps,
            "extra_prompts": None if not job.data.extra else {"source": job.extra_source,
                                                              **extra_digest(job.data.extra)},
            "settings": {k: v for k, v in asdict(job.train).items() if k not in ("eval_max", "checkpoint_s")}}
