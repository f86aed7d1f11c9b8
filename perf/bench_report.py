"""`specedge bench` reports: results.json (RESULTS_SCHEMA), report.md, PNG plots (matplotlib when installed), and
the environment every report records (package versions, threads, CPU model and flags, git commit, command line)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..assembly.environment import SIMD, environment  # noqa: F401  (environment: re-exported for the bench command)
from ..assembly.profile import k_label
from ..assembly.schema import check_schema as _check_schema

SCHEMA_VERSION = 4  # 2: predicted_tokens_per_s on every configuration; 'auto' and 'profiles' from --auto;
#                    3: prompt_tokens_per_s, first_token_s and end_to_end_tokens_per_s on every configuration;
#                    4: family 'llama-server' (--baseline llama-server), end_to_end_vs_llama_server on every
#                       configuration, server_timings on llama-server's rows, the top-level 'llama_server'

_NUM = {"type": "number"}
_NUM_OR_NULL = {"type": ["number", "null"]}
_SUMMARY = {"type": "object", "required": ["mean", "median", "min", "max", "n"],
            "properties": {"mean": _NUM, "median": _NUM, "min": _NUM, "max": _NUM, "n": {"type": "integer"}}}
_CATEGORY = {"type": "object", "required": ["tokens_per_s", "speedup_vs_plain", "speedup_vs_llamacpp",
                                            "mean_accepted_length", "mbsu"],
             "properties": {"tokens_per_s": _SUMMARY, "speedup_vs_plain": _NUM_OR_NULL,
                            "speedup_vs_llamacpp": _NUM_OR_NULL, "mean_accepted_length": _NUM_OR_NULL,
                            "mbsu": _NUM_OR_NULL}}
_SERVER_TIMINGS = {"type": "object",
                   "required": ["requests", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms",
                                "prompt_tokens_per_s", "decode_tokens_per_s"],
                   "properties": {"requests": {"type": "integer"}, "prompt_n": {"type": "integer"},
                                  "prompt_ms": _NUM, "predicted_n": {"type": "integer"}, "predicted_ms": _NUM,
                                  "prompt_tokens_per_s": _NUM_OR_NULL, "decode_tokens_per_s": _NUM_OR_NULL}}
_CONFIG = {
    "type": "object",
    "required": ["label", "family", "target", "drafter", "k", "adaptive", "tokens_per_s", "speedup_vs_plain",
                 "speedup_vs_llamacpp", "mean_accepted_length", "accepted_hist", "acceptance_by_position",
                 "time_split", "weight_bytes_per_token", "mbsu", "identical_to_plain", "n_prompts", "by_category",
                 "predicted_tokens_per_s", "prompt_tokens_per_s", "first_token_s", "end_to_end_tokens_per_s",
                 "end_to_end_vs_llama_server"],
    "properties": {
        "label": {"type": "string"},
        "family": {"type": "string", "enum": ["specedge", "llama.cpp", "llama-server"]},
        "target": {"type": "string"}, "drafter": {"type": "string"}, "k": {"type": "integer"},
        "adaptive": {"type": "boolean"},
        "tokens_per_s": _SUMMARY,  # decode: answer tokens / seconds after the prompt's processing, over trials
        "prompt_tokens_per_s": _SUMMARY,  # prompt tokens prefilled / prefill seconds
        "first_token_s": _SUMMARY,  # mean seconds from a call's start to its first token (the prompt included)
        "end_to_end_tokens_per_s": _SUMMARY,  # answer tokens / whole-call seconds: what a user waits for
        "speedup_vs_plain": _NUM_OR_NULL,  # mean tok/s / mean tok/s of plain decoding on the same backend
        "speedup_vs_llamacpp": _NUM_OR_NULL,  # ... / llama.cpp plain (null without the baselines)
        "geomean_speedup_over_categories": _NUM_OR_NULL,
        "mean_accepted_length": _NUM_OR_NULL,  # tau; null for the uninstrumented llama.cpp baselines
        "acceptance_rate": _NUM_OR_NULL,
        "accepted_hist": {"type": ["array", "null"], "items": {"type": "integer"}},  # rounds by accepted count
        "acceptance_by_position": {"type": ["array", "null"], "items": _NUM},
        "time_split": {"type": ["object", "null"], "required": ["draft_s", "verify_s", "overhead_s"],
                       "properties": {"draft_s": _NUM, "verify_s": _NUM, "overhead_s": _NUM}},
        "weight_bytes_per_token": _NUM_OR_NULL, "mbsu": _NUM_OR_NULL,
        "identical_to_plain": {"type": ["integer", "null"]},  # trial-0 outputs equal to plain greedy's
        "n_prompts": {"type": "integer"}, "tokens": {"type": "integer"}, "load_mb": _NUM,
        "by_category": {"type": "object", "additionalProperties": _CATEGORY},
        "predicted_tokens_per_s": _NUM_OR_NULL,  # from the device profile (--auto); null otherwise
        # end-to-end tok/s / llama-server's best row's (plain or --spec-default); null without --baseline llama-server
        "end_to_end_vs_llama_server": _NUM_OR_NULL,
        "server_timings": _SERVER_TIMINGS,  # llama-server's rows: its own `timings`, summed over the timed requests
    },
}
_LLAMA_SERVER = {  # --baseline llama-server: the binary, the servers' command lines, the headline ratio
    "type": "object", "required": ["binary", "version", "source", "commands", "versus"],
    "properties": {"binary": {"type": "string"}, "version": {"type": "string"},
                   "source": {"type": "string", "enum": ["PATH", "cache"]},
                   "commands": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
                   "versus": {"type": ["object", "null"],
                              "required": ["specedge", "llama_server", "ratio", "plan"],
                              "properties": {"specedge": {"type": "string"}, "llama_server": {"type": "string"},
                                             "specedge_end_to_end_tokens_per_s": _NUM,
                                             "llama_server_end_to_end_tokens_per_s": _NUM, "ratio": _NUM_OR_NULL,
                                             "plan": {"type": "boolean"}}}}}
_AUTO = {"type": "object",  # one per target under --auto: the chosen configuration, predicted vs measured
         "required": ["target", "drafter", "k", "predicted_tok_s", "measured_tok_s", "plain_predicted_tok_s",
                      "plain_measured_tok_s", "profile"],
         "properties": {"target": {"type": "string"}, "drafter": {"type": "string"}, "k": {"type": "integer"},
                        "adaptive": {"type": "boolean"}, "predicted_tok_s": _NUM, "measured_tok_s": _NUM_OR_NULL,
                        "plain_predicted_tok_s": _NUM,
                        "plain_measured_tok_s": _NUM_OR_NULL, "profile": {"type": "string"},
                        "predicted_speedup": _NUM, "measured_speedup": _NUM_OR_NULL}}
_PROFILE = {"type": "object",  # the device profile each --auto / --profile-device target used (apps/auto.py)
            "required": ["target", "key", "path", "verify_s", "overhead_s", "choice"],
            "properties": {"target": {"type": "string"}, "key": {"type": "string"}, "path": {"type": "string"},
                           "verify_s": {"type": "array", "items": _NUM}, "overhead_s": {"type": "array", "items": _NUM},
                           "choice": {"type": "object"}}}
RESULTS_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "specedge bench results",
    "type": "object",
    "required": ["schema_version", "command", "environment", "settings", "categories", "prompts", "configs"],
    "properties": {
        "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
        "command": {"type": "string"},
        "time": {"type": "string"},
        "environment": {"type": "object", "required": ["packages", "threads", "cpu_model", "cpu_flags", "git_commit"],
                        "properties": {"packages": {"type": "object"}, "threads": {"type": ["integer", "null"]},
                                       "cpu_model": {"type": "string"},
                                       "cpu_flags": {"type": "array", "items": {"type": "string"}},
                                       "git_commit": {"type": ["string", "null"]},
                                       "peak_rss_mb": _NUM,
                                       "core_round_trip_ns": {"type": ["number", "null"]}}},
        "settings": {"type": "object"},
        "categories": {"type": "array", "items": {"type": "string"}},
        "prompts": {"type": "array", "items": {"type": "object", "required": ["qid", "category"]}},
        "configs": {"type": "array", "items": _CONFIG},
        "auto": {"type": "array", "items": _AUTO},
        "profiles": {"type": "array", "items": _PROFILE},
        "llama_server": _LLAMA_SERVER,
    },
}

def _f(x, fmt="{:.2f}", none="-"):
    return none if x is None else fmt.format(x)


def check_schema(obj, schema: dict = RESULTS_SCHEMA, where: str = "$") -> list[str]:
    """Violations of RESULTS_SCHEMA (or another schema) in obj; empty when valid."""
    return _check_schema(obj, schema, where)


def _placement(env: dict) -> str:
    """'cores N ns apart; ' from the environment's core round trip (VMs move their vCPUs between dies: docs/native.md
    "What the two roofs are"), '' where the run did not read one."""
    trip = env.get("core_round_trip_ns")
    return "" if trip is None else f"cores {trip:.0f} ns apart (a cache line's round trip); "


def markdown(results: dict) -> str:
    """Summary tables: every configuration overall, speedup (tau) by category, time split and bytes."""
    env, rows, cats = results["environment"], results["configs"], results["categories"]
    server = results.get("llama_server")
    simd = [f for f in env["cpu_flags"] if f in SIMD]
    lines = ["# specedge bench", "", f"`{results['command']}`", "",
             f"{results.get('time', '')}; CPU {env['cpu_model']} (SIMD: {' '.join(simd) or 'n/a'}); threads "
             f"{env['threads']}; " + _placement(env) + f"commit {env['git_commit'] or 'unknown'}; peak RSS "
             f"{env.get('peak_rss_mb', 0):.0f} MB; packages "
             + ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v), "",
             f"{len(results['prompts'])} prompts, settings: " + ", ".join(f"{k}={v}" for k, v in
                                                                         results["settings"].items()), "",
             "| configuration | end-to-end tok/s | " + ("vs llama-server best | " if server else "")
             + "prompt tok/s | first token ms | decode tok/s mean | median | min | max | speedup vs plain | "
             "vs llama.cpp | geomean over categories | tau | MBSU | identical to plain | MB/token |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if server else "")]
    for r in rows:
        t = r["tokens_per_s"]
        ident = "-" if r["identical_to_plain"] is None else f"{r['identical_to_plain']}/{r['n_prompts']}"
        versus = f"{_f(r.get('end_to_end_vs_llama_server'), '{:.2f}x')} | " if server else ""
        lines.append(f"| {r['label']} | {r['end_to_end_tokens_per_s']['mean']:.1f} | {versus}"
                     f"{r['prompt_tokens_per_s']['mean']:.0f} | {1e3 * r['first_token_s']['mean']:.0f} | "
                     f"{t['mean']:.1f} | {t['median']:.1f} | {t['min']:.1f} | {t['max']:.1f} | "
                     f"{_f(r['speedup_vs_plain'], '{:.2f}x')} | {_f(r['speedup_vs_llamacpp'], '{:.2f}x')} | "
                     f"{_f(r['geomean_speedup_over_categories'], '{:.2f}x')} | {_f(r['mean_accepted_length'])} | "
                     f"{_f(r['mbsu'])} | {ident} | {_f(r['weight_bytes_per_token'] and r['weight_bytes_per_token'] / 1e6)} |")
    if server:
        lines += ["", *llama_server_lines(server, rows)]
    lines += ["", "## Speedup vs plain (tau) by category", "", "| configuration | " + " | ".join(cats) + " |",
              "|---|" + "---|" * len(cats)]
    for r in rows:
        cells = [f"{_f(v['speedup_vs_plain'], '{:.2f}x')} ({_f(v['mean_accepted_length'])})"
                 for v in r["by_category"].values()]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    lines += ["", "## Acceptance and time split", "",
              "| configuration | acceptance by position | accepted histogram | draft | verify (target forward) | "
              "overhead |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["time_split"] is None:
            continue
        ts = r["time_split"]
        pos = " ".join(f"{x:.2f}" for x in r["acceptance_by_position"]) or "-"
        lines.append(f"| {r['label']} | {pos} | {' '.join(map(str, r['accepted_hist']))} | "
                     f"{100 * ts['draft_frac']:.0f}% | {100 * ts['verify_frac']:.0f}% | {100 * ts['overhead_frac']:.0f}% |")
    if results.get("auto"):
        lines += ["", "## Auto-tuning: predicted vs measured", "",
                  "| target | chosen | predicted tok/s | measured | plain predicted | plain measured | speedup "
                  "predicted | measured | profile |", "|---|---|---|---|---|---|---|---|---|"]
        for a in results["auto"]:
            k = k_label(a["k"], a.get("adaptive", False))
            chosen = "plain" if a["drafter"] == "none" else f"{a['drafter']} {k}"
            lines.append(f"| {a['target']} | {chosen} | {a['predicted_tok_s']:.1f} | "
                         f"{_f(a['measured_tok_s'], '{:.1f}')} | {a['plain_predicted_tok_s']:.1f} | "
                         f"{_f(a['plain_measured_tok_s'], '{:.1f}')} | {_f(a.get('predicted_speedup'), '{:.2f}x')} | "
                         f"{_f(a.get('measured_speedup'), '{:.2f}x')} | `{a['profile']}` |")
    if results.get("plots_note"):
        lines += ["", results["plots_note"]]
    return "\n".join(lines) + "\n"


def llama_server_lines(server: dict, rows: list[dict]) -> list[str]:
    """--baseline llama-server: the headline ratio (end to end), the binary, and llama-server's own timings."""
    v, lines = server["versus"], []
    if v:
        who = "the plan's configuration" if v["plan"] else "the fastest specedge configuration"
        lines += [f"**{who} ({v['specedge']}) end to end: {v['specedge_end_to_end_tokens_per_s']:.1f} tok/s, "
                  f"{_f(v['ratio'], '{:.2f}x')} llama-server's best ({v['llama_server']}, "
                  f"{v['llama_server_end_to_end_tokens_per_s']:.1f} tok/s)**", ""]
    lines += [f"llama-server: `{server['binary']}` ({server['version']}; from {server['source']}), started as "
              + " and ".join(f"`{' '.join(c)}`" for c in server["commands"]) + "; requests streamed over loopback "
              "with `cache_prompt: false`; its times are the client's wall clock (first token: the first streamed "
              "content), its --spec-default row's identity counts answers equal to its own plain greedy text.", "",
              "| configuration | requests | prompt tok/s (its timings) | decode tok/s (its timings) |",
              "|---|---|---|---|"]
    for r in rows:
        st = r.get("server_timings")
        if st:
            lines.append(f"| {r['label']} | {st['requests']} | {_f(st['prompt_tokens_per_s'], '{:.0f}')} | "
                         f"{_f(st['decode_tokens_per_s'], '{:.1f}')} |")
    return lines


def plots(results: dict, out: Path) -> tuple[list[str], str | None]:
    """speedup_by_category.png, acceptance_by_position.png, mbsu_vs_speedup.png; ([], note) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "Plots skipped: matplotlib is not installed (pip install matplotlib, or 'specedge[dev]')."
    rows, cats = [r for r in results["configs"] if r["drafter"] != "none"], results["categories"]
    files = []
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) * max(len(rows), 1) / 3), 4))
    w = 0.8 / max(len(rows), 1)
    for i, r in enumerate(rows):
        ax.bar([j + i * w for j in range(len(cats))],
               [r["by_category"][c]["speedup_vs_plain"] or 0 for c in cats], w, label=r["label"])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([j + w * (len(rows) - 1) / 2 for j in range(len(cats))], cats, rotation=30, ha="right")
    ax.set_ylabel("speedup vs plain (same backend)")
    if rows:  # all-plain runs (an --auto choice of plain) have nothing to label
        ax.legend(fontsize=7)
    files.append(_save(fig, out / "speedup_by_category.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["acceptance_by_position"]:
            ax.plot(range(1, len(r["acceptance_by_position"]) + 1), r["acceptance_by_position"], "o-",
                    label=r["label"])
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted fraction")
    ax.set_ylim(0, 1)
    if rows:  # all-plain runs (an --auto choice of plain) have nothing to label
        ax.legend(fontsize=7)
    files.append(_save(fig, out / "acceptance_by_position.png"))
    fig, ax = plt.subplots(figsize=(5, 5))
    pts = [(r["mbsu"], r["speedup_vs_plain"], r["label"]) for r in rows if r["mbsu"] and r["speedup_vs_plain"]]
    for x, y, label in pts:
        ax.scatter([x], [y], label=label)
    top = max([2.0] + [max(x, y) for x, y, _ in pts])
    ax.plot([0, top], [0, top], "k--", lw=0.8)
    ax.set_xlabel("MBSU (memory-bound speedup)")
    ax.set_ylabel("measured speedup")
    if rows:  # all-plain runs (an --auto choice of plain) have nothing to label
        ax.legend(fontsize=7)
    files.append(_save(fig, out / "mbsu_vs_speedup.png"))
    if results.get("profiles"):
        files.append(verify_cost_plot(results["profiles"], out))
    return files, None


def verify_cost_plot(profiles: list[dict], out: Path) -> str | None:
    """verify_cost.png: T(n)/T(1) per profiled target (rows with 'target' and 'verify_s'); None without
    matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    top = 1
    for p in profiles:
        v = p["verify_s"]
        ax.plot(range(1, len(v) + 1), [x / v[0] for x in v], "o-", label=f"{p['target']} (T(1) {1e3 * v[0]:.1f} ms)")
        top = max(top, len(v))
    ax.plot([1, top], [1, top], "k:", lw=0.8, label="T(n) = n T(1) (compute-bound)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("tokens per verify forward n")
    ax.set_ylabel("T(n) / T(1)")
    ax.legend(fontsize=7)
    return _save(fig, Path(out) / "verify_cost.png")


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path.name


def write_reports(results: dict, out: Path) -> list[str]:
    """results.json, report.md and the plots into `out`; returns the file names written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files, note = plots(results, out)
    results["plots"], results["plots_note"] = files, note
    results.setdefault("time", time.strftime("%Y-%m-%d %H:%M:%S"))
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "report.md").write_text(markdown(results))
    return ["results.json", "report.md", *files]
