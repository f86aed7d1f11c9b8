"""`specedge train-drafter MODEL`: train an EAGLE-3-style draft head for MODEL on the CPU (extra `train`: torch).

    specedge train-drafter smollm2-135m --prompts 600 --minutes 30 --threads 1
        -> ~/.cache/specedge/heads/smollm2-135m/{head.npz, head.json}  (docs/train_drafter.md)

The data step runs the target on the native engine (else --backend numpy); torch is imported only when the
command runs (export/train_head/model.py require_torch names the extra).
"""
from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import click

from ..models.catalog import heads_dir
from .options import CACHE_DIR

BACKENDS = ("native", "numpy")


def default_out(model: str, cache_dir: Path | None) -> Path:
    """Where a head goes by default: <cache>/heads/<model> beside the model cache (~/.cache/specedge/heads/NAME), or
    inside --cache-dir / $SPECEDGE_CACHE when one is given."""
    return heads_dir(cache_dir) / head_name(model)


def command_line(ctx: click.Context) -> str:
    """The command as given (head.json's training.command): the options set on the command line, in order."""
    parts = ["specedge", ctx.info_name or "train-drafter"]
    for p in ctx.command.params:
        if ctx.get_parameter_source(p.name) is not click.core.ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[p.name]
        if isinstance(p, click.Argument):
            parts.append(str(value))
        elif getattr(p, "is_flag", False):
            parts.append(p.opts[0])
        else:
            parts += [p.opts[0], f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(parts)


def head_name(model: str) -> str:
    """head.json's target.model: a catalogue name as given, a GGUF file by its stem."""
    return Path(model).stem if model.endswith(".gguf") else model


@click.command("train-drafter")
@click.argument("model")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Head directory (default: <cache>/heads/MODEL): data/, train/ and the head itself.")
@click.option("--prompts", type=click.IntRange(2, None), default=512, show_default=True,
              help="Prompts of the recipe the target answers (export/train_head/prompts.py; one in 20 is held "
                   "out for tau).")
@click.option("--extra-prompts", default=None, metavar="FILE|dev",
              help="Your own prompts too, answered before the recipe's: a .jsonl in the dev-set format (the first "
                   "user turn of each line) or a text file of one prompt per line; `dev` for the shipped Spec-Bench "
                   "dev set. Recorded in head.json with its hash.")
@click.option("--extra-skip", type=click.IntRange(0, None), default=0, show_default=True,
              help="Leave out the file's first N prompts in the benchmarks' order (round-robin over tasks): "
                   "`--extra-prompts dev --extra-skip 30` never trains on the prompts `specedge bench --skip 12 "
                   "--limit 18` and the plan measure on.")
@click.option("--max-tokens", type=click.IntRange(1, None), default=128, show_default=True,
              help="Longest answer per prompt.")
@click.option("--steps", type=click.IntRange(1, None), default=None, help="Most optimizer steps in all.")
@click.option("--minutes", type=click.FloatRange(0, None, min_open=True), default=None,
              help="Training time budget in minutes, over every resumed run (default 60 without --steps).")
@click.option("--threads", type=click.IntRange(1, None), default=1, show_default=True,
              help="CPU threads for the target's answers and for torch.")
@click.option("--vocab-draft", type=click.IntRange(1, None), default=8192, show_default=True,
              help="Draft vocabulary: the most frequent answer tokens (at most the target's vocabulary).")
@click.option("--batch", type=click.IntRange(1, None), default=4, show_default=True, help="Sequences per step.")
@click.option("--lr", type=click.FloatRange(0, None, min_open=True), default=2e-3, show_default=True,
              help="Peak learning rate (AdamW; warm-up, then cosine to a tenth).")
@click.option("--ttt-steps", type=click.IntRange(1, 8), default=3, show_default=True,
              help="Draft steps unrolled per position (EAGLE-3's training-time test).")
@click.option("--backend", type=click.Choice(BACKENDS), default="native", show_default=True,
              help="Engine that answers the prompts and gives the taps.")
@click.option("--resume", is_flag=True, help="Continue the training checkpoint in --out (same data).")
@CACHE_DIR()
def train_cmd(model: str, out: Path | None, prompts: int, extra_prompts: str | None, extra_skip: int,
              max_tokens: int, steps: int | None,
              minutes: float | None, threads: int, vocab_draft: int, batch: int, lr: float, ttt_steps: int,
              backend: str, resume: bool, cache_dir: Path | None) -> None:
    """Train an EAGLE-3-style draft head for MODEL: the target answers a built-in prompt recipe greedily, its
    hidden states at three layers are recorded, and a one-layer head learns to draft its next tokens
    (docs/train_drafter.md).
    Resumable: the data step skips prompts already answered, --resume continues training."""
    from ..export.train_head.data import choose_taps
    from ..export.train_head.model import require_torch
    try:
        require_torch()
    except ImportError as e:
        raise click.ClickException(str(e)) from None
    from ..export.train_head.artifact import file_sha256
    from ..export.train_head.pipeline import check_resume, run
    try:
        job = _job(model, out, cache_dir, prompts, max_tokens, steps, minutes, threads, vocab_draft, batch, lr,
                   ttt_steps, resume)
        job = replace(job, data=replace(job.data, extra=_extra(extra_prompts, extra_skip)),
                      extra_source=extra_prompts or "")
        check_resume(job)  # before the model loads
        loaded = _load(model, backend, threads, cache_dir)
        job = replace(job, gguf_sha256=file_sha256(loaded.path),
                      data=replace(job.data, taps=choose_taps(loaded.gguf.config.n_layers)))
        with _Bars() as bars:
            path, meta = run(job, loaded.backend, loaded.tokenizer, loaded.gguf, bars.bars())
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    t = meta["training"]
    size = sum(p.stat().st_size for p in (path / "head.npz", path / "head.json")) / 1e6
    click.echo(f"{path}: head of {meta['vocab_draft']} draft tokens, {size:.1f} MB; {t['steps']} steps in "
               f"{t['seconds'] / 60:.1f} min on {t['prompts']} prompts ({t['tokens']} tokens); tau_eval "
               f"{t['tau_eval']} (chains of up to 4 drafts, held-out answers)")


def _extra(source: str | None, skip: int) -> tuple[str, ...]:
    """--extra-prompts' texts after --extra-skip, in the benchmarks' order."""
    if source is None:
        if skip:
            raise ValueError("--extra-skip leaves out prompts of --extra-prompts: give the file too")
        return ()
    from ..perf.bench import read_prompts
    path = None if source == "dev" else Path(source)
    if path is not None and not path.is_file():
        raise ValueError(f"--extra-prompts {source}: no such file (a .jsonl in the dev-set format, a text file of "
                         "one prompt per line, or `dev`)")
    try:
        texts = tuple(p.text for p in read_prompts(path)[skip:])
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise ValueError(f"--extra-prompts {source}: not a dev-set .jsonl ({type(e).__name__}: {e}); each line "
                         "needs question_id, category and turns (a list of user turns)") from None
    if not texts:
        raise ValueError(f"--extra-skip {skip} leaves no prompt of {source}")
    return texts


def _job(model, out, cache_dir, prompts, max_tokens, steps, minutes, threads, vocab_draft, batch, lr, ttt_steps,
         resume):
    """The job the options describe (taps and the file's hash are the loaded target's, set after it loads)."""
    from ..export.train_head.data import DataSettings
    from ..export.train_head.pipeline import Job
    from ..export.train_head.train import TrainSettings
    train = TrainSettings(steps=steps, minutes=minutes if minutes is not None or steps is not None else 60.0,
                          batch=batch, lr=lr, ttt_steps=ttt_steps, threads=threads)
    return Job(head_name(model), "", out or default_out(model, cache_dir),
               DataSettings(prompts=prompts, max_tokens=max_tokens), train,
               vocab_draft=vocab_draft, resume=resume, command=command_line(click.get_current_context()))


def _load(model: str, backend: str, threads: int, cache_dir: Path | None):
    from ..assembly.load import load_model
    from ..models.errors import ModelFileError
    from ..runtime.backends import BackendKind
    try:
        return load_model(model, BackendKind(backend), threads=threads, cache_dir=cache_dir,
                          log=lambda m: click.echo(m, err=True))
    except (ValueError, FileNotFoundError, ImportError, ModelFileError) as e:
        raise click.ClickException(f"{e} (the data step also runs on --backend numpy, the reference, which runs "
                                   "any file our reader opens)") from None


class _Bars:
    """Two tqdm bars with ETAs: prompts answered, then training steps (or seconds of a time budget)."""

    def __enter__(self):
        self._open = []
        return self

    def __exit__(self, *exc):
        for bar in self._open:
            bar.close()

    def bars(self):
        from tqdm import tqdm
        from ..export.train_head.pipeline import Bars
        state = {}

        def data(done, total):
            if "data" not in state:
                state["data"] = tqdm(total=total, initial=done, unit="prompt", desc="answers + taps")
                self._open.append(state["data"])
            bar = state["data"]
            bar.update(done - bar.n)

        def train(p):  # in per mille of the steps or the time budget, so its ETA holds for either
            if "train" not in state:
                if "data" in state:
                    state["data"].close()
                state["train"] = tqdm(total=1000, initial=min(1000, int(p.done * 1000)), unit="‰",
                                      desc="training")
                self._open.append(state["train"])
            bar = state["train"]
            bar.update(min(1000, int(p.done * 1000)) - bar.n)
            bar.set_postfix(step=p.step, loss=f"{p.loss:.3f}", refresh=False)
        return Bars(data, train)
