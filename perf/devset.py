"""Dev-set prompts (Spec-Bench subset): find, load and chat-format them."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Prompt:
    qid: int
    category: str
    text: str  # the first user turn


def default_devset() -> Path:
    """$SPECEDGE_DEVSET, else ../shared/data/specbench-dev.jsonl next to the checkout."""
    env = os.environ.get("SPECEDGE_DEVSET")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for base in (Path.cwd(), *here.parents):
        cand = base.parent / "shared" / "data" / "specbench-dev.jsonl"
        if cand.exists():
            return cand
    raise FileNotFoundError("dev set not found: set SPECEDGE_DEVSET to specbench-dev.jsonl")


def load_prompts(path: Path | None = None, *, limit: int | None = None, spread: bool = True) -> list[Prompt]:
    """First-turn prompts; with spread=True, `limit` prompts are taken round-robin across categories."""
    rows = [json.loads(line) for line in Path(path or default_devset()).read_text().splitlines() if line.strip()]
    prompts = [Prompt(r["question_id"], r["category"], r["turns"][0]) for r in rows]
    if limit is None or not spread:
        return prompts[:limit]
    by_cat: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    out, i = [], 0
    while len(out) < min(limit, len(prompts)):
        for ps in by_cat.values():
            if i < len(ps) and len(out) < limit:
                out.append(ps[i])
        i += 1
    return out
