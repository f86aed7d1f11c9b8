"""`specedge plan MODEL`: the plan for MODEL on this machine (assembly/plan.py), measured on first use or with
--refresh, printed as a table of every candidate (predicted and measured tokens/s) with the chosen one marked."""
from __future__ import annotations

import json

import click

from ..assembly.plan_run import PlanSettings, plan_for
from ..runtime.backends.registry import engines_line
from .options import CACHE_DIR


@click.command("plan")
@click.argument("model")
@click.option("--refresh", is_flag=True, help="Re-measure every target now (the cached profiles are replaced).")
@click.option("--threads", type=click.IntRange(1, None), default=None,
              help="CPU threads the plan is for (default: as generate/chat/serve, min(cores, 8)).")
@click.option("--weights", default="int4,int8", show_default=True,
              help="ONNX weight formats to export (on first use) and measure, comma-separated; '' for none.")
@click.option("--no-export", is_flag=True, help="Plan over what is already in the cache; export nothing.")
@click.option("--full", is_flag=True,
              help="Measure without the time budget of a first-use plan (70 s): every export, full-length runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@CACHE_DIR()
def plan_cmd(model, refresh, threads, weights, no_export, full, as_json, cache_dir) -> None:
    """Measure (first use, --refresh) or show the fastest lossless configuration for MODEL on this machine: engine
    (llama.cpp, ONNX Runtime), weight format, drafter and draft length. generate/chat/serve and Engine.open(MODEL)
    run it by default."""
    formats = tuple(w for w in weights.replace(" ", "").split(",") if w)
    bad = [w for w in formats if w not in ("int4", "int8", "fp16", "fp32")]
    if bad:
        raise click.BadParameter(f"{bad}: use int4, int8, fp16 or fp32", param_hint="--weights")
    settings = PlanSettings(threads=threads, weights=formats, export=not no_export,
                            **({"budget_s": None} if full else {}))
    try:
        plan, made = plan_for(model, settings, cache_dir=cache_dir, refresh=refresh or full,
                              log=lambda m: click.echo(m, err=True))
    except KeyboardInterrupt:
        raise click.ClickException("planning stopped (Ctrl-C); the targets measured so far are cached") from None
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2))
        return
    cpu = plan.machine.get("cpu_model", "?")
    click.echo(f"plan for {model} on {cpu}, {plan.threads} threads ({'made now' if made else 'cached'}; "
               f"`--refresh` re-measures, `--full` without a time budget): {plan.measured()}\n")
    click.echo(plan.table())
    click.echo(f"chosen: {plan.summary()}")
    click.echo(engines_line())
