"""Benchmark core shared by `specedge bench` (apps/bench_cmd.py) and perf/greedy_table.py.

Every configuration (target backend x drafter x k x adaptive, plus the llama.cpp baselines in perf/bench_llama.py)
runs in one process; each prompt goes through every configuration in turn, so slow drift of the machine hits them
alike. Warm-up prompts run first and are discarded; trials repeat the whole prompt set. Metrics follow
docs/algorithms.md section 5 (tau, speedup vs plain decoding on the same backend, MBSU).
"""
from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..runtime.backends import Kernels
from ..runtime.stats import DecodeStats, mbsu
from ..assembly.profile import PLAIN, k_label
from ..assembly.spec import parse_target
from ..assembly.devset import Prompt, load_prompts

# (prompt) -> (generated token ids, without EOS; the prompt's decoding statistics)
Runner = Callable[[Prompt], "tuple[list[int], DecodeStats]"]


@dataclass
class Config:
    """One benchmarked configuration. target: the backend label (backend[:artifact]); plain configurations have
    drafter 'none'. instrumented=False for the llama.cpp baselines (no draft / verify split, no acceptance)."""

    target: str
    drafter: str
    k: int
    adaptive: bool
    run: Runner
    target_bytes: int  # weight bytes one target forward reads
    draft_bytes: Callable[[], int] = lambda: 0  # weight bytes per drafted token (read after running: bind sets it)
    load_mb: float = 0.0  # RSS growth while loading this configuration's drafter (or the baseline's model)
    instrumented: bool = True
    family: str = "specedge"  # specedge | llama.cpp | llama-server
    name: str | None = None  # the label, where target / drafter / k do not say it ("llama-server --spec-default")
    extra: Callable[[], dict] | None = None  # fields this configuration adds to its results row (after running)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.drafter == PLAIN:
            return f"{self.target} plain"
        return f"{self.target} {self.drafter} {k_label(self.k, self.adaptive)}"


@dataclass
class Measured:
    """What one configuration produced: stats[trial][category] and the trial-0 outputs by prompt index."""

    config: Config
    stats: list[dict[str, DecodeStats]] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)


def read_prompts(path: Path | None = None, *, limit: int | None = None, categories: Sequence[str] = (),
                 by: str = "task") -> list[Prompt]:
    """The dev set (default) or `path`: a .jsonl in the dev-set format (question_id, category, turns), or a text
    file with one prompt per line (category 'text'). categories: keep prompts whose category or Spec-Bench task is
    listed; limit: at most that many, spread round-robin over categories (tasks with by='task')."""
    if path is not None and Path(path).suffix != ".jsonl":
        lines = [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]
        prompts = [Prompt(i, "text", ln) for i, ln in enumerate(lines)]
    else:
        prompts = load_prompts(path, limit=10 ** 9, by=by)  # every prompt, in round-robin order
    if categories:
        prompts = [p for p in prompts if p.category in categories or p.task in categories]
        if not prompts:
            raise ValueError(f"no prompt has a category or task in {list(categories)}; the file has "
                             f"{sorted({p.category for p in read_prompts(path, by=by)})}")
    return prompts[:limit]


def group_of(by: str) -> Callable[[Prompt], str]:
    return (lambda p: p.task) if by == "task" else (lambda p: p.category)


# Between two configurations on different targets, untimed: the engine that ran last may still spin its threads
# (ONNX Runtime's intra-op pool does, some milliseconds after a run), and the next one's prompt would share the cores
# with it. Without it the plan's row, run right after the ONNX artifacts', read SmolLM2's prompts 24% slower than the
# same engine's plain row (prefill 2.31 s against 1.86 s over 3,185 tokens).
SETTLE_S = 0.05


def run_bench(configs: list[Config], prompts: list[Prompt], *, trials: int = 1, warmup: int = 0, by: str = "task",
              progress: Callable[[str], None] | None = None) -> list[Measured]:
    """Warm-up: the first `warmup` prompts through every configuration, discarded. Then `trials` passes over the
    prompts, each prompt through every configuration in turn (SETTLE_S apart where the target changes).
    progress(label) is called after each decode."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    group = group_of(by)
    cats = sorted({group(p) for p in prompts})
    out = [Measured(c) for c in configs]
    for p in prompts[:warmup]:
        for c in configs:
            c.run(p)
            if progress:
                progress(f"warm-up {c.label}")
    for trial in range(trials):
        for m in out:
            m.stats.append({c: DecodeStats() for c in cats})
        for p in prompts:
            for i, m in enumerate(out):
                if m.config.target != out[i - 1].config.target:
                    time.sleep(SETTLE_S)
                tokens, s = m.config.run(p)
                m.stats[trial][group(p)].merge(s)
                if trial == 0:
                    m.outputs.append(list(tokens))
                if progress:
                    progress(f"trial {trial + 1}/{trials} {m.config.label}")
    return out


# -- metrics on known inputs (tests/test_bench.py) --------------------------------------------------------------

def trials_summary(xs: Sequence[float]) -> dict:
    """{mean, median, min, max, n} over trials. Example: [1, 2, 6] -> mean 3, median 2, min 1, max 6, n 3."""
    xs = [float(x) for x in xs]
    if not xs:
        raise ValueError("trials_summary needs at least one trial")
    return {"mean": statistics.fmean(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "n": len(xs)}


def total(stats: dict[str, DecodeStats]) -> DecodeStats:
    """One trial's per-category stats merged."""
    s = DecodeStats()
    for v in stats.values():
        s.merge(v)
    return s


def bytes_per_token(s: DecodeStats, target_bytes: int, draft_bytes_per_token: int) -> float:
    """Weight bytes read per generated token: (target forwards x B_target + drafted tokens x B_draft/token) / tokens.
    Example: 10 forwards of 100 B, 30 drafted tokens of 10 B, 25 tokens -> (1000 + 300) / 25 = 52."""
    n = s.n_generated or s.n_emitted
    return (s.n_target_forwards * target_bytes + s.n_drafted * draft_bytes_per_token) / n if n else 0.0


def mbsu_of(s: DecodeStats, target_bytes: int, draft_bytes_per_token: int) -> float:
    """MBSU (docs/algorithms.md 5) from measured counts: B_draft per round = drafted tokens / rounds x bytes/token."""
    if not s.n_target_forwards:
        return 0.0
    per_round = draft_bytes_per_token * s.n_drafted / s.n_target_forwards
    return mbsu(s.mean_accepted_length, per_round, target_bytes)


def time_split(s: DecodeStats) -> dict:
    """Seconds of decoding spent drafting, inside target (verify) forwards, and in the rest of the runtime
    (verification arithmetic, sampling, KV bookkeeping, detokenizing), with their fractions of decode time."""
    overhead = max(s.decode_s - s.draft_s - s.forward_s, 0.0)
    d = max(s.decode_s, 1e-12)
    return {"draft_s": s.draft_s, "verify_s": s.forward_s, "overhead_s": overhead, "draft_frac": s.draft_s / d,
            "verify_frac": s.forward_s / d, "overhead_frac": overhead / d}


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (getrusage; KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)


def rss_mb() -> float:
    """Current resident set size (Linux /proc; 0 where unavailable)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def geomean(xs) -> float:
    xs = [x for x in xs if x and x > 0]
    return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")


def _ratio(a: float, b: float | None) -> float | None:
    return a / b if b else None


PLAN_PREFIX = "plan: "  # apps/bench_cmd.py labels the plan's chosen configuration "plan: <engine>:<path>"
SERVER = "llama-server"  # the family of perf/bench_server.py's rows (upstream llama-server over HTTP)


def summarize(measured: list[Measured]) -> list[dict]:
    """One JSON-ready row per configuration (schema: perf/bench_report.py RESULTS_SCHEMA)."""
    rows = []
    plain = {m.config.target: m for m in measured if m.config.drafter == PLAIN and m.config.family == "specedge"}
    llama = next((m for m in measured if m.config.family == "llama.cpp" and m.config.drafter == PLAIN), None)
    server = next((m for m in measured if m.config.family == SERVER and m.config.drafter == PLAIN), None)
    cats = list(measured[0].stats[0]) if measured else []
    for m in measured:
        c = m.config
        if c.family == SERVER:  # llama-server against its own plain decoding (identity: text equal to its answers)
            rows.append(_row(m, server, None if m is server else server, llama, cats))
            continue
        base = plain.get(c.target) or plain.get(c.target.removeprefix(PLAN_PREFIX))  # the plan row: its engine's plain
        if base is None and c.family == "llama.cpp":
            base = plain.get("llamacpp") or next(iter(plain.values()), None)
        rows.append(_row(m, base if c.family == "specedge" else llama, base, llama, cats))
    best = max((r["end_to_end_tokens_per_s"]["mean"] for r in rows if r["family"] == SERVER), default=None)
    for r in rows:
        r["end_to_end_vs_llama_server"] = _ratio(r["end_to_end_tokens_per_s"]["mean"], best)
    return rows


def versus_llama_server(rows: list[dict]) -> dict | None:
    """The plan's configuration (else the fastest specedge row) end to end against llama-server's best row (plain or
    --spec-default): {'specedge', 'llama_server', their end-to-end tok/s, 'ratio', 'plan'}; None without
    llama-server rows."""
    server = [r for r in rows if r["family"] == SERVER]
    ours = [r for r in rows if r["family"] == "specedge"]
    if not server or not ours:
        return None

    def e2e(r: dict) -> float:
        return r["end_to_end_tokens_per_s"]["mean"]
    best = max(server, key=e2e)
    mine = next((r for r in ours if r["target"].startswith(PLAN_PREFIX)), None) or max(ours, key=e2e)
    return {"specedge": mine["label"], "specedge_end_to_end_tokens_per_s": e2e(mine), "llama_server": best["label"],
            "llama_server_end_to_end_tokens_per_s": e2e(best), "ratio": _ratio(e2e(mine), e2e(best)),
            "plan": mine["target"].startswith(PLAN_PREFIX)}


def _row(m: Measured, same: Measured | None, ident: Measured | None, llama: Measured | None, cats) -> dict:
    c = m.config
    trials = [total(t) for t in m.stats]
    agg = DecodeStats()
    for t in trials:
        agg.merge(t)
    tps = trials_summary([t.tokens_per_s for t in trials])
    ends = {"prompt_tokens_per_s": trials_summary([t.prompt_tokens_per_s for t in trials]),
            "first_token_s": trials_summary([t.mean_first_token_s for t in trials]),
            "end_to_end_tokens_per_s": trials_summary([t.end_to_end_tokens_per_s for t in trials])}

    def mean_tps(x: Measured | None, cat: str | None = None) -> float | None:
        if x is None:
            return None
        return statistics.fmean((t[cat] if cat else total(t)).tokens_per_s for t in x.stats)

    draft_bpt = int(c.draft_bytes())
    by_cat = {}
    for cat in cats:
        s = DecodeStats()
        for t in m.stats:
            s.merge(t[cat])
        by_cat[cat] = {"tokens_per_s": trials_summary([t[cat].tokens_per_s for t in m.stats]),
                       "speedup_vs_plain": _ratio(mean_tps(m, cat), mean_tps(same, cat)),
                       "speedup_vs_llamacpp": _ratio(mean_tps(m, cat), mean_tps(llama, cat)),
                       "mean_accepted_length": s.mean_accepted_length if c.instrumented else None,
                       "mbsu": mbsu_of(s, c.target_bytes, draft_bpt) if c.instrumented else None}
    identical = None
    if ident is not None and ident.outputs:
        identical = sum(a == b for a, b in zip(m.outputs, ident.outputs))
    return {
        "label": c.label, "family": c.family, "target": c.target, "drafter": c.drafter, "k": c.k,
        "adaptive": c.adaptive, "tokens_per_s": tps, **ends,
        "speedup_vs_plain": _ratio(tps["mean"], mean_tps(same)),
        "speedup_vs_llamacpp": _ratio(tps["mean"], mean_tps(llama)),
        "geomean_speedup_over_categories": geomean(v["speedup_vs_plain"] for v in by_cat.values()),
        "mean_accepted_length": agg.mean_accepted_length if c.instrumented else None,
        "acceptance_rate": agg.acceptance_rate if c.instrumented else None,
        "accepted_hist": [int(v) for v in agg.accepted_hist] if c.instrumented else None,
        "acceptance_by_position": [float(v) for v in agg.acceptance_by_position] if c.instrumented else None,
        "time_split": time_split(agg) if c.instrumented else None,
        "weight_bytes_per_token": bytes_per_token(agg, c.target_bytes, draft_bpt) if c.instrumented else None,
        "target_bytes": int(c.target_bytes), "draft_bytes_per_token": draft_bpt,
        "mbsu": mbsu_of(agg, c.target_bytes, draft_bpt) if c.instrumented else None,
        "identical_to_plain": identical, "n_prompts": len(m.outputs), "tokens": int(agg.n_generated),
        "load_mb": float(c.load_mb), "by_category": by_cat, "stats": agg.to_dict(),
        "predicted_tokens_per_s": None,  # set by `bench --auto` from the device profile
        **(c.extra() if c.extra else {}),
    }


def write_json(path: Path, obj: dict) -> None:
    Path(path).write_text(json.dumps(obj, indent=2, default=float))


# -- configurations ---------------------------------------------------------------------------------------------

def drafter_for(text: str, kind, target: str | None = None) -> str | None:
    """'spec' applies to every target; 'spec@backend' only to targets on that backend (a model drafter names a GGUF
    for llamacpp and an exported artifact for onnx), 'spec@backend:artifact' only to that target (a self-speculative
    drafter on the layered artifact): the spec for this target, or None when it does not apply."""
    from ..runtime.backends import BackendKind
    spec, at, qualifier = text.rpartition("@")
    if not at:
        return text
    if ":" in qualifier:
        return spec if qualifier == target else None
    try:
        return spec if BackendKind(qualifier) is kind else None
    except ValueError:
        raise ValueError(f"drafter {text!r}: {qualifier!r} is not a backend; qualify with one of "
                         f"{', '.join('@' + k.value for k in BackendKind)} or @<target> as given to --targets"
                         ) from None


def specedge_configs(targets: Sequence[str], drafters: Sequence[str], ks: Sequence[int], adaptive: Sequence[bool],
                     *, model: str, max_tokens: int, threads: int | None, ctx: int = 2048,
                     cache_dir: Path | None = None, kernels: Kernels = Kernels.EXACT, temperature: float = 0.0,
                     seed: int = 0) -> list[Config]:
    """Configurations: each target plain first, then each drafter x k x adaptive mode on it. Chat template applied
    as in chat use. Greedy by default; temperature > 0 samples with the model's other defaults (as a server request
    that sets only its temperature) and `seed` for every prompt, so a deterministic drafter's output still equals
    plain's seed for seed (docs/algorithms.md 1.2). kernels FAST_PLAIN_ONLY opens the targets with their fast
    plain-decoding kernels (ModelSettings)."""
    from ..assembly.decoder import CallSettings, DecodeSettings, ModelSettings
    from ..assembly.load import parse_drafter
    from ..assembly.open import open_decoder

    call = CallSettings(max_tokens=max_tokens, temperature=temperature, seed=seed)  # 0: greedy
    drafters = [PLAIN] + [d for d in drafters if d != PLAIN]
    for d in drafters:
        drafter_for(d, None)  # a bad qualifier fails before any model loads
    configs = []
    for t in targets:
        kind, name = parse_target(t, model)
        settings = ModelSettings(name, kind, ctx=ctx, threads=threads, device="cpu", cache_dir=cache_dir,
                                 kernels=kernels)
        plain = open_decoder(settings, DecodeSettings(parse_drafter(PLAIN)), plan=False)  # loads the target once
        target, tok = plain.model, plain.model.tokenizer
        ids_of = {}

        def prompt_ids(p: Prompt, tok=tok, ids_of=ids_of):
            if p.text not in ids_of:
                ids_of[p.text] = tok.chat_ids(p.text)
            return ids_of[p.text]

        for d in (x for x in (drafter_for(d, kind, t) for d in drafters) if x is not None):
            for k, adapt in ([(0, False)] if d == PLAIN else [(k, a) for k in ks for a in adaptive]):
                before = rss_mb()
                decoder = plain.with_decode(DecodeSettings(parse_drafter(d), max(k, 1), adapt))

                def run(p: Prompt, decoder=decoder, prompt_ids=prompt_ids):
                    result = decoder.run(prompt_ids(p), call)
                    return result.tokens, result.stats.decode

                configs.append(Config(t, d, k, adapt, run, int(target.backend.weight_bytes()),
                                      decoder.draft_bytes_per_token, rss_mb() - before))
    return configs
