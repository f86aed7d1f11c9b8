"""The only place a decoder is opened: typed settings -> the plan (when nothing says what to run) -> load -> the
engine the model names -> the auto-tuner (--auto) -> Decoder.

    open_decoder(ModelSettings, DecodeSettings, plan=, auto=, log=, interactive=) -> Decoder
    load(ModelSettings) -> LoadedModel                  (one target, no decoder: the benchmark, the planner)
    settings_from(model, **fields) -> (ModelSettings, DecodeSettings)   keyword values named as the fields

`specedge generate`, `chat`, `serve` and `bench --plan` (apps/), `specedge.Engine.open` and the server's model pool
all come here; so a new way of choosing what runs (a plan, a tuner, a backend) has one home.
"""
from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Callable

from ..runtime.backends import Kernels, info, parse_gpu_layers
from ..runtime.lossy import parse_lossy
from ..runtime.verify import VerifierKind
from ..runtime.drafters import NoneSpec
from .decoder import DecodeSettings, Decoder, ModelSettings
from .load import LoadedModel, batch_variance, load_model, parse_drafter

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def load(settings: ModelSettings, log: Log | None = None) -> LoadedModel:
    """The target the settings name, on their engine (None: the engine the model names)."""
    return load_model(settings.model, settings.backend, ctx=settings.ctx, threads=settings.threads,
                      cache_dir=settings.cache_dir, device=settings.device, log=log,
                      kernels=settings.kernels, gpu_layers=settings.gpu_layers)


def wants_plan(model: ModelSettings, decode: DecodeSettings) -> bool:
    """Whether nothing says what runs: no backend, no device or GPU layers (the plan measures the engines as they
    run by default), no drafter, k or lossy mode. Then the plan for this model and machine chooses them."""
    return model.backend is None and model.device == "auto" and model.gpu_layers is None and not decode.given


def open_decoder(model: ModelSettings, decode: DecodeSettings = DecodeSettings(), *, plan: bool = True,
                 auto: bool = False, log: Log | None = None, interactive: bool = False) -> Decoder:
    """Open the decoder the settings describe.

    plan=True and nothing given (wants_plan): the plan's engine, artifact, drafter and k (assembly/plan_run.py;
    measured on first use, then cached), said in one line to `log`; the caller's ctx, threads, cache and verifier
    are kept. auto=True: the target's device profile picks the drafter and k within its one engine
    (assembly/auto.py). interactive=True (the CLI): a progress bar while a plan is measured, and Ctrl-C then skips
    planning for this run. Without a plan (plan=False, or skipped) and nothing given: the engine the model names,
    with ngram k<=4 where its verify batches are exact at these threads, else plain decoding (exact_default: what
    runs by default is always lossless).
    Raises ValueError / FileNotFoundError / ImportError / RuntimeError naming what is wrong."""
    log = log or _quiet
    chosen, name, given = None, model.model, decode.given
    if plan and not auto and wants_plan(model, decode):
        from .plan_run import planned
        try:
            chosen, model, decode = planned(model, decode, progress=interactive, log=log)
        except KeyboardInterrupt:
            if not interactive:
                raise
            log(f"plan: skipped (Ctrl-C); running the model's engine, exactly (`specedge plan {name}` plans later, "
                "`--no-plan` never plans)")
        else:
            hint = f"  [`specedge plan {name}` shows the table; --no-plan opts out]" if interactive else ""
            log(f"plan: {chosen.summary()}{hint}")
    target = load(model, log)
    model = replace(model, backend=target.kind)  # --backend left out: the engine the model named
    if auto:
        from .auto import auto_settings
        decode = auto_settings(model, decode.resolved(), target, log=log)
    elif not given:
        decode = exact_default(decode, target, log)
    return Decoder(target, model, decode, chosen)


def exact_default(decode: DecodeSettings, target: LoadedModel, log: Log) -> DecodeSettings:
    """The decode settings where the user named none (no plan, a skipped plan, or a plan's choice): they must stay
    lossless. Where the target's verify batches are exact here (batch_variance None: greedy speculation
    is token-identical to plain greedy), the plan's drafter, else ngram k<=4; where they are not (llama.cpp at more
    than one thread, a plan measured at another thread count), plain decoding, said in one line."""
    resolved = decode.resolved()
    if isinstance(resolved.drafter, NoneSpec):
        return resolved
    variance = batch_variance(target)
    if variance is None:
        return resolved
    log(f"plain decoding: {resolved.drafter} k<={resolved.k} would not be lossless here ({target.path.name} "
        f"{variance.why}); --drafter NAME runs it anyway")
    return replace(resolved, drafter=NoneSpec())


_PARSE = {"backend": lambda v: info(v).kind, "drafter": parse_drafter, "verifier": VerifierKind,
          "lossy": parse_lossy, "cache_dir": Path, "gpu_layers": parse_gpu_layers, "kernels": Kernels}


def settings_from(model: str, **values) -> tuple[ModelSettings, DecodeSettings]:
    """ModelSettings and DecodeSettings from keyword values named as their fields (backend, ctx, threads, device,
    gpu_layers, cache_dir, kernels; drafter, k, adaptive_k, verifier, lossy); text is parsed for the typed ones
    (backend "onnx", gpu_layers "all", kernels "fast-plain-only", drafter "ngram", verifier "block", lossy
    "loradrop"); None is the field's default. TypeError names an unknown keyword."""
    model_names = {f.name for f in fields(ModelSettings)} - {"model"}
    decode_names = {f.name for f in fields(DecodeSettings)}
    unknown = sorted(set(values) - model_names - decode_names)
    if unknown:
        raise TypeError(f"unknown setting {unknown[0]!r}; engine settings are {', '.join(sorted(model_names))} and "
                        f"{', '.join(sorted(decode_names))}")
    typed = {k: _PARSE[k](v) if isinstance(v, str) and k in _PARSE else v for k, v in values.items()
             if v is not None}  # None: the field's default
    return (ModelSettings(model, **{k: v for k, v in typed.items() if k in model_names}),
            DecodeSettings(**{k: v for k, v in typed.items() if k in decode_names}))
