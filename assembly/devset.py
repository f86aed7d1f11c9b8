"""Dev-set prompts (Spec-Bench subset): find, load and chat-format them."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


# Spec-Bench's six tasks: its MT-Bench subcategories form the "multi-turn conversation" task.
MT_BENCH = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"})


@dataclass(frozen=True)
class Prompt:
    qid: int
    category: str
    text: str  # the first user turn

    @property
    def task(self) -> str:
        """Spec-Bench task: mt_bench for the MT-Bench subcategories, else the category itself."""
        return "mt_bench" if self.category in MT_BENCH else self.category


DEVSET = Path(__file__).resolve().parent / "data" / "specbench-dev.jsonl"  # shipped copy (Apache-2.0, see data/README.md beside it)


def default_devset() -> Path:
    """$SPECEDGE_DEVSET, else the copy shipped with the package."""
    env = os.environ.get("SPECEDGE_DEVSET")
    path = Path(env) if env else DEVSET
    if not path.is_file():
        raise FileNotFoundError(f"dev set not found at {path}: set SPECEDGE_DEVSET to a specbench-dev.jsonl")
    return path


def load_prompts(path: Path | None = None, *, limit: int | None = None, spread: bool = True,
                 by: str = "category") -> list[Prompt]:
    """First-turn prompts; with spread=True, `limit` prompts are taken round-robin across categories (by="category")
    or across Spec-Bench's six tasks (by="task"; MT-Bench's subcategories interleaved within their task)."""
    rows = [json.loads(line) for line in Path(path or default_devset()).read_text().splitlines() if line.strip()]
    prompts = [Prompt(r["question_id"], r["category"], r["turns"][0]) for r in rows]
    if limit is None or not spread:
        return prompts[:limit]
    if by == "task":
        return _round_robin(_round_robin(prompts, len(prompts), lambda p: p.category), limit, lambda p: p.task)
    return _round_robin(prompts, limit, lambda p: p.category)


def _round_robin(prompts: list[Prompt], limit: int, key) -> list[Prompt]:
    by_cat: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_cat.setdefault(key(p), []).append(p)
    out, i = [], 0
    while len(out) < min(limit, len(prompts)):
        for ps in by_cat.values():
            if i < len(ps) and len(out) < limit:
                out.append(ps[i])
        i += 1
    return out
