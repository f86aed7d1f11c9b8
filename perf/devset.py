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


DEVSET = Path(__file__).resolve().parent / "data" / "specbench-dev.jsonl"  # shipped copy (Apache-2.0, see README)


def default_devset() -> Path:
    """$SPECEDGE_DEVSET, else the copy shipped with the package."""
    env = os.environ.get("SPECEDGE_DEVSET")
    path = Path(env) if env else DEVSET
    if not path.is_file():
        raise FileNotFoundError(f"dev set not found at {path}: set SPECEDGE_DEVSET to a specbench-dev.jsonl")
    return path


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
