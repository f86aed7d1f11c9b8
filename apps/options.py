"""The click options that several commands share, each declared once, and the typed settings they build.

    model_options    --backend --ctx --threads --device --gpu-layers --cache-dir -> ModelSettings (generate chat serve)
    decode_options   --drafter --k --adaptive-k/--fixed-k --verifier --lossy -> DecodeSettings  (generate chat serve)
    plan_options     --auto --no-plan                                         -> open_decoder's plan / auto
    call_options     one flag per CallSettings option (CALL_OPTIONS, assembly/decoder.py): --max-tokens
                     --[no-]repetition-stop --temperature ... --seed                    -> CallSettings (generate chat)
    STOP                                                                      (generate chat)
    THREADS, CTX, MAX_TOKENS, CACHE_DIR(...)   single options `specedge bench` takes with its own defaults

The call options are not declared here: each is its CallSettings field (name, type, default, help), as are the
chat's /set keys and the Engine's keywords, so a new per-call field is that field, the SamplingParams field and the
runtime rule it feeds.
"""
from __future__ import annotations

from copy import copy
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Callable, get_type_hints

import click

from ..assembly.decoder import CALL_OPTIONS, CallSettings, DecodeSettings, ModelSettings, parse_logit_bias
from ..assembly.open import open_decoder, settings_from
from ..runtime.backends import backend_names, parse_gpu_layers
from ..runtime.backends.onnx_providers import DEVICE_CHOICES
from ..runtime.verify import VerifierKind


def THREADS(default: int | None = None):  # noqa: N802 - option factories, named like the options
    return click.option("--threads", type=click.IntRange(1, None), default=default, show_default=default is not None,
                        help="CPU threads (llama.cpp, ONNX Runtime intra-op)"
                             + ("." if default is not None else "; default: the plan's, else min(cores, 8)."))


def CTX(default: int | None = None, low: int = 16):  # noqa: N802
    return click.option("--ctx", type=click.IntRange(low, None), default=default, show_default=default is not None,
                        help="KV positions (prompt + answer) per call"
                             + ("." if default is not None else "; default: min(model context, 4096)."))


def MAX_TOKENS(default: int):  # noqa: N802 - bench's (generate's and chat's come from CallSettings.max_tokens)
    return click.option("--max-tokens", type=click.IntRange(1, None), default=default, show_default=True,
                        help="Most tokens to generate.")


STOP = click.option("--stop", multiple=True, help="Stop string (repeatable).")


def CACHE_DIR():  # noqa: N802
    return click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
                        help="Model cache (default: $SPECEDGE_CACHE or the platform cache dir).")


class GpuLayers(click.ParamType):
    """--gpu-layers N|all (runtime/backends/registry.py parse_gpu_layers)."""
    name = "N|all"

    def convert(self, value, param, ctx):
        try:
            return parse_gpu_layers(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


_MODEL = [
    click.option("--backend", type=click.Choice(backend_names()), default=None,
                 help="Inference engine (default: the plan's; without a plan the engine the model names: "
                      "llama.cpp for a GGUF, ONNX Runtime for an exported artifact)."),
    CTX(), THREADS(),
    click.option("--device", type=click.Choice(DEVICE_CHOICES), default="auto", show_default=True,
                 help="ONNX Runtime execution provider (--backend onnx); auto says what it picked; openvino takes "
                      "a target (openvino:CPU|GPU|NPU, CPU when none)."),
    click.option("--gpu-layers", "gpu_layers", type=GpuLayers(), default=None, metavar="N|all",
                 help="llama.cpp engines: layers offloaded to the GPU, a number or 'all' (default: all where the "
                      "installed llama-cpp-python build offloads, Metal/CUDA/Vulkan; else 0, the CPU)."),
    CACHE_DIR(),
]
_DECODE = [
    click.option("--drafter", default=None,
                 help="Default: the plan's (else ngram). "
                      "none | ngram | recycle[:nodes] (token-recycling trees; tree backends) | "
                      "model:<catalogue-name-or-gguf-path> (with --backend onnx: model:<exported-dir-or-name>), "
                      "optionally +tree[:<nodes>] (dynamic draft trees) or +lookup[:<n>] (prompt lookup first, the "
                      "model when no n-token match) | "
                      "skip:<R> | swift | exit:<layer> | del (self-speculative: the target's own layers; numpy or "
                      "a layered ONNX artifact), optionally +conf[:<t>] or +logistic[:<h>] to stop drafting early | "
                      "suffix[:<budget>] (a memory of the earlier calls' prompts and answers, at most <budget> "
                      "tokens, default 65536; +tree[:<nodes>]: as trees, tree backends); ngram or a chain model "
                      "drafter may end in +suffix[:<budget>] (the longer draft of the two) | "
                      "head:<dir> (a trained draft head over the target's hidden states; --backend native or numpy; "
                      "may end in +suffix[:<budget>])"),
    click.option("--k", "k", type=click.IntRange(0, 64), default=None,
                 help="Draft length, the maximum with --adaptive-k (default: the plan's, else 4)."),
    click.option("--adaptive-k", "adaptive_flag", is_flag=True,
                 help="Verify only the part of each draft that pays for its verification, learned online from "
                      "the target's call times and the drafter's acceptance (lossless either way). The default."),
    click.option("--fixed-k", "fixed_flag", is_flag=True, help="Verify every draft at its full length k."),
    click.option("--verifier", type=click.Choice([v.value for v in VerifierKind]), default="chain",
                 show_default=True, help="Sampled chain drafts: token-by-token (chain) or block verification "
                 "(block; accepts at least as much, exactly as lossless). Greedy is prefix match either way."),
    click.option("--lossy", default=None,
                 help="LOSSY opt-in (output is not the model's own): loradrop[:DIR] decodes with the LoRA-Drop "
                      "cycle; entropy-switch:<small-model>,<threshold>[,<dwell>] switches models by entropy. "
                      "Ignores --drafter."),
]
_PLAN = [
    click.option("--auto", is_flag=True,
                 help="Pick the drafter and k with the most expected tokens/s within one engine (--backend) from "
                      "its device profile (measured and cached on first use); the choice goes to stderr."),
    click.option("--no-plan", "no_plan", is_flag=True,
                 help="Do not plan: run --backend/--drafter/--k as given, else the model's engine + ngram k<=4 "
                      "where that is lossless at these threads, else plain decoding. "
                      "(Without this, and without --backend/--drafter/--k/--lossy/--auto/--device, the command "
                      "runs the plan for this model and machine: `specedge plan MODEL`, measured on first use.)"),
]
def _call_option(f: Field, hint, default=MISSING, help_text: str = "") -> Callable:
    """The CLI flag of a CallSettings field declared with `option(...)` (assembly/decoder.py): --name-with-dashes,
    its type from the annotation (int or float; text for a repeatable one), its default and help (or a command's own
    default, with that command's help), and click extras."""
    if default is not MISSING:
        f = copy(f)
        f.default, f.metadata = default, {**f.metadata, "help": help_text}
    extra = dict(f.metadata["click"])
    low = extra.pop("min", None)
    flag = "--" + f.name.replace("_", "-")
    if hint is bool:  # --name/--no-name
        return click.option(f"{flag}/--no-{flag[2:]}", f.name, default=f.default, show_default=True,
                            help=f.metadata["help"], **extra)
    kind = int if "int" in str(hint).split("|")[0] else float
    if extra.get("multiple"):
        kind, default = str, ()
    else:
        default = f.default
    if low is not None:
        kind = click.IntRange(low, None) if kind is int else click.FloatRange(low, None)
    return click.option(flag, f.name, type=kind, default=default,
                        show_default=default is not None and default != (), help=f.metadata["help"], **extra)


_HINTS = get_type_hints(CallSettings)


def call_option(name: str, default, help_text: str) -> Callable:
    """One CallSettings option as a command that is not a chat takes it: its flag and type from the declaration, that
    command's default and help (bench: greedy, the outputs compared token for token)."""
    return _call_option(next(f for f in fields(CallSettings) if f.name == name), _HINTS[name], default, help_text)


CALL_FIELDS = CALL_OPTIONS  # the CallSettings fields call_options sets (stop, grammar, logprobs: each command's own)
_CALL = [_call_option(f, _HINTS[f.name]) for f in fields(CallSettings) if f.name in CALL_FIELDS]
MODEL_FIELDS = ("backend", "ctx", "threads", "device", "gpu_layers", "cache_dir")
DECODE_FIELDS = ("drafter", "k", "adaptive_k", "verifier", "lossy")


def _apply(opts):
    def decorate(f):
        for o in reversed(opts):
            f = o(f)
        return f
    return decorate


model_options, decode_options, plan_options, call_options = _apply(_MODEL), _apply(_DECODE), _apply(_PLAN), \
    _apply(_CALL)


def engine_options(f):
    """model, decode and plan options: what opens a decoder (generate, chat, serve)."""
    return model_options(decode_options(plan_options(f)))


def call_settings(o: dict, **extra) -> CallSettings:
    """The per-call settings from the parsed options (and `extra` CallSettings fields: stop, grammar, logprobs); a
    bad value is a clean CLI error naming it."""
    try:
        values = {name: o[name] for name in CALL_FIELDS if name in o}
        if "logit_bias" in values:
            values["logit_bias"] = parse_logit_bias(values["logit_bias"])
        return CallSettings(**values, **extra)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


CONFLICTS = (  # (option, option, why): both given is refused with one line naming both
    ("adaptive_flag", "fixed_flag", "the draft length policy is one or the other"),
    ("no_plan", "auto", "--auto measures this machine to choose (a device profile); --no-plan runs without measuring"),
)
FLAGS = {"adaptive_flag": "--adaptive-k", "fixed_flag": "--fixed-k", "no_plan": "--no-plan", "auto": "--auto"}


def refuse_conflicts(o: dict) -> None:
    """Flags that contradict each other are refused (click keeps the last of a pair silently)."""
    for a, b, why in CONFLICTS:
        if o.get(a) and o.get(b):
            raise click.UsageError(f"{FLAGS[a]} and {FLAGS[b]} contradict each other ({why}): give one of them")


def engine_settings(o: dict) -> tuple[ModelSettings, DecodeSettings]:
    """ModelSettings and DecodeSettings from the parsed options (a bad --drafter or --lossy, or flags that
    contradict each other, fail here, before any load)."""
    refuse_conflicts(o)
    try:
        return settings_from(o["model"], adaptive_k=not o.get("fixed_flag"),
                             **{name: o[name] for name in (*MODEL_FIELDS, *DECODE_FIELDS) if name != "adaptive_k"})
    except ValueError as e:
        raise click.ClickException(str(e)) from None


def open_from(o: dict):
    """The Decoder the parsed options describe (assembly/open.py: the plan unless they say what runs; --auto),
    interactively: a progress bar while a plan is measured (Ctrl-C skips it), what was chosen on stderr. Load and
    start-up errors become clean CLI errors."""
    model_s, decode_s = engine_settings(o)
    try:
        return open_decoder(model_s, decode_s, plan=not o["no_plan"], auto=o["auto"],
                            log=lambda m: click.echo(m, err=True), interactive=True)
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
