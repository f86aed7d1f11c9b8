"""Self-distillation data for a draft head: the target's own greedy answers and its taps at every position.

For each prompt, the user's own first (`DataSettings.extra`, e.g. a file of their chats), then the recipe's (prompts.py;
a passage prompt gets the target's own answer to its source prompt, decoded, in place of its PASSAGE): the chat
template applied, the target answers greedily (up to max_tokens, or
its end of turn), and its own forwards, `hidden(..., taps=taps)` over the prompt and then over each answer token (its
end-of-turn token included), give the three tapped hidden states at every position of prompt + answer: the taps the
head reads when it drafts (from the verify forwards), with no second pass over the sequence. On the native engine,
batch-invariant by construction, they are bit for bit a teacher-forced pass's (`sequence_taps`); on the NumPy
reference within float16 rounding.
Shards of `shard_size` prompts are written one by one:

    <dir>/index.json         {"format": "specedge-head-data", "taps", "max_tokens", "d_model", "target_sha256",
                              "recipe_version", "shard_size", "extra": null or {"count", "sha256"},
                              "shards": [{"file", "first", "count", "tokens",
                              "seconds", "sha256"}]}
    <dir>/shard-00000.npz    tokens int32 [N] (every sequence's prompt + answer, concatenated), taps float16
                             [N, 3, D] (taps[i, j] = h after the first taps[j] layers at that position), lengths
                             int32 [S], prompt_lens int32 [S]

A run that stops is resumed by running it again: shards already listed (same target, taps and settings) are kept.
The data hash (`data_sha256`) is the sha256 over the settings and the shards' own hashes, in order.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...runtime.backends.base import LayeredBackend
from ...runtime.types import as_tokens
from .prompts import PASSAGE, RECIPE_VERSION, RecipePrompt, recipe

FORMAT = "specedge-head-data"
INDEX = "index.json"


def choose_taps(n_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers: h after the first 2, N//2 and N-3 layers (SmolLM2's 30: 2, 15, 27);
    a model of under 6 layers taps 1, N//2 (at least 1) and N."""
    if n_layers >= 6:
        return 2, n_layers // 2, n_layers - 3
    return 1, max(1, n_layers // 2), n_layers


@dataclass(frozen=True)
class DataSettings:
    prompts: int  # the recipe's first `prompts` prompts
    max_tokens: int = 128  # the longest answer
    taps: tuple[int, int, int] = (2, 15, 27)
    shard_size: int = 32
    extra: tuple[str, ...] = ()  # the user's own prompts, answered before the recipe's (the held-out tail for
    #                              tau_eval stays the recipe's)

    def __post_init__(self) -> None:
        if self.prompts < 1 or self.max_tokens < 1 or self.shard_size < 1:
            raise ValueError(f"prompts, max_tokens and shard_size must be >= 1: {self}")
        if len(self.taps) != 3:
            raise ValueError(f"a head taps three layers, not {self.taps}")


@dataclass(frozen=True)
class Sequences:
    """All shards loaded: sequence i is tokens[offsets[i]:offsets[i + 1]], its first prompt_lens[i] the prompt."""
    tokens: np.ndarray  # int32 [N]
    taps: np.ndarray  # float16 [N, 3, D]
    offsets: np.ndarray  # int64 [S + 1]
    prompt_lens: np.ndarray  # int32 [S]
    sha256: str
    seconds: float | None = None  # the target's time making the shards (None: a shard without its time)

    def __len__(self) -> int:
        return len(self.prompt_lens)

    def answer_tokens(self) -> np.ndarray:
        """Every answer token (the prompts left out), concatenated: what the draft vocabulary counts."""
        return np.concatenate([self.tokens[self.offsets[i] + self.prompt_lens[i]:self.offsets[i + 1]]
                               for i in range(len(self))])


def answer_with_taps(backend: LayeredBackend, prompt_ids, max_tokens: int, eos_ids: Sequence[int],
                     taps: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(the target's greedy answer to prompt_ids, int32 [A], its end-of-turn token included when it ends there;
    float16 [P + A, 3, D]: the taps at every position of prompt + answer) from one pass: the prompt's forward, then
    each answer token's own (module docstring)."""
    prompt = as_tokens(prompt_ids)
    wanted = tuple(sorted(set(taps)))
    cache = backend.new_cache(len(prompt) + max_tokens + 1)
    eos = {int(e) for e in eos_ids}
    rows, tokens, step = [], [], prompt
    while True:
        h, tapped = backend.hidden(step, cache, taps=wanted)
        rows.append(np.stack([np.asarray(tapped[n], dtype=np.float32) for n in taps], axis=1).astype(np.float16))
        if len(tokens) == max_tokens or (tokens and tokens[-1] in eos):
            break
        tokens.append(int(np.argmax(backend.logits_from_hidden(h[-1:])[0])))  # greedy: ties to the lowest id
        step = as_tokens(tokens[-1:])
    return np.array(tokens, dtype=np.int32), np.concatenate(rows)


def sequence_taps(backend: LayeredBackend, tokens, taps: tuple[int, int, int]) -> np.ndarray:
    """One teacher-forced pass over `tokens` from an empty cache: float16 [T, 3, D], the taps at every position."""
    tokens = as_tokens(tokens)
    cache = backend.new_cache(len(tokens))
    _, tapped = backend.hidden(tokens, cache, taps=tuple(sorted(set(taps))))
    return np.stack([np.asarray(tapped[n], dtype=np.float32) for n in taps], axis=1).astype(np.float16)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def extra_digest(extra: Sequence[str]) -> dict | None:
    """The user's prompts as the data index records them: their count and the sha256 over their texts."""
    if not extra:
        return None
    return {"count": len(extra), "sha256": hashlib.sha256(json.dumps(list(extra)).encode()).hexdigest()}


def _header(settings: DataSettings, d_model: int, target_sha256: str) -> dict:
    return {"format": FORMAT, "version": 1, "recipe_version": RECIPE_VERSION, "taps": list(settings.taps),
            "max_tokens": settings.max_tokens, "shard_size": settings.shard_size, "d_model": d_model,
            "target_sha256": target_sha256, "extra": extra_digest(settings.extra)}


def all_prompts(settings: DataSettings) -> list[RecipePrompt]:
    """The user's prompts (kind "own"), then the recipe's first `settings.prompts`, each passage prompt's source
    moved past the user's."""
    shift = len(settings.extra)
    own = [RecipePrompt("own", text) for text in settings.extra]
    return own + [p if p.source is None else replace(p, source=p.source + shift) for p in recipe(settings.prompts)]


def _read_index(out: Path, header: dict) -> list[dict]:
    """The shards a previous run wrote with the same header (an index of other settings is refused)."""
    path = out / INDEX
    if not path.exists():
        return []
    index = json.loads(path.read_text())
    old = {k: index.get(k) for k in header}
    if old != header:
        changed = sorted(k for k in header if old[k] != header[k])
        raise ValueError(f"{out} holds head data made with other settings ({', '.join(changed)}): give another "
                         "--out, or delete its data/ folder to start over")
    return [s for s in index["shards"] if (out / s["file"]).exists()]


def _write_index(out: Path, header: dict, shards: list[dict]) -> None:
    tmp = out / (INDEX + ".tmp")
    tmp.write_text(json.dumps({**header, "shards": shards}, indent=1))
    os.replace(tmp, out / INDEX)


def make_data(backend: LayeredBackend, tokenizer, out: Path, settings: DataSettings, *, target_sha256: str,
              progress: Callable[[int, int], object] | None = None) -> Sequences:
    """Write (or complete) the data set in `out` and return it loaded. tokenizer: the target's (chat_ids,
    eos_ids, decode). progress(done, total) is called with the prompts done so far: once with those a previous run
    did, then after each prompt (the command moves a tqdm bar with it)."""
    out.mkdir(parents=True, exist_ok=True)
    header = _header(settings, backend.config.d_model, target_sha256)
    prompts = all_prompts(settings)
    n, size = len(prompts), settings.shard_size
    kept = {s["first"]: s for s in _read_index(out, header)}
    shards = []
    done = sum(s["count"] for first, s in kept.items() if s["count"] == min(size, n - first) and first < n)
    tick = None
    if progress:
        progress(done, n)
        counter = [done]

        def tick():
            counter[0] += 1
            progress(counter[0], n)
    passages = _Passages(out, size, tokenizer)
    for first in range(0, n, size):
        count = min(size, n - first)
        if first in kept and kept[first]["count"] == count:
            shards.append(kept[first])
            continue
        shards.append(_write_shard(backend, tokenizer, out, prompts[first:first + count], first, settings,
                                   passages, progress=tick))
        _write_index(out, header, shards + [s for f, s in sorted(kept.items()) if f > first])
    _write_index(out, header, shards)
    return load_data(out)


class _Passages:
    """The target's answers as text, by prompt index: those of this run kept as made, a shard a previous run
    wrote read back when a passage prompt needs one of its answers."""

    def __init__(self, out: Path, shard_size: int, tokenizer) -> None:
        self.out, self.size, self.tokenizer = out, shard_size, tokenizer
        self.answers: dict[int, np.ndarray] = {}

    def add(self, first: int, answers: list[np.ndarray]) -> None:
        self.answers.update((first + i, a) for i, a in enumerate(answers))

    def fill(self, prompt: RecipePrompt) -> str:
        if prompt.source is None:
            return prompt.text
        if prompt.source not in self.answers:
            first = prompt.source // self.size * self.size
            with np.load(self.out / f"shard-{first // self.size:05d}.npz", allow_pickle=False) as z:
                tokens, lengths, prompt_lens = z["tokens"], z["lengths"], z["prompt_lens"]
            ends = np.cumsum(lengths)
            self.add(first, [tokens[e - n + p:e] for e, n, p in zip(ends, lengths, prompt_lens)])
        ids = [int(t) for t in self.answers[prompt.source] if int(t) not in set(self.tokenizer.eos_ids)]
        return prompt.text.replace(PASSAGE, self.tokenizer.decode(ids).strip())


def _write_shard(backend, tokenizer, out: Path, prompts: list[RecipePrompt], first: int, settings: DataSettings,
                 passages: _Passages, progress: Callable[[], object] | None) -> dict:
    tokens, taps, lengths, prompt_lens = [], [], [], []
    t0 = time.perf_counter()
    for i, item in enumerate(prompts):
        prompt = as_tokens(tokenizer.chat_ids(passages.fill(item)))
        reply, tapped = answer_with_taps(backend, prompt, settings.max_tokens, tokenizer.eos_ids, settings.taps)
        passages.add(first + i, [reply])  # a passage prompt later in this shard may read it
        full = np.concatenate([prompt, reply])
        tokens.append(full)
        taps.append(tapped)
        lengths.append(len(full))
        prompt_lens.append(len(prompt))
        if progress:
            progress()
    name = f"shard-{first // settings.shard_size:05d}.npz"
    tmp = out / (name + ".tmp.npz")
    np.savez(tmp, tokens=np.concatenate(tokens).astype(np.int32), taps=np.concatenate(taps),
             lengths=np.array(lengths, np.int32), prompt_lens=np.array(prompt_lens, np.int32))
    os.replace(tmp, out / name)
    return {"file": name, "first": first, "count": len(prompts), "tokens": int(sum(lengths)),
            "seconds": round(time.perf_counter() - t0, 2), "sha256": file_sha256(out / name)}


def load_data(out: Path) -> Sequences:
    """Every shard the index lists, in order, checked against its recorded sha256."""
    index = json.loads((out / INDEX).read_text())
    if index.get("format") != FORMAT:
        raise ValueError(f"{out / INDEX} is not a head data index (format {index.get('format')!r})")
    tokens, taps, lengths, prompt_lens = [], [], [], []
    h = hashlib.sha256(json.dumps({k: v for k, v in index.items() if k != "shards"}, sort_keys=True).encode())
    for s in index["shards"]:
        path = out / s["file"]
        if file_sha256(path) != s["sha256"]:
            raise ValueError(f"{path} does not match its sha256 in {out / INDEX}: delete it and run the data step "
                             "again (it is remade)")
        h.update(s["sha256"].encode())
        with np.load(path, allow_pickle=False) as z:
            tokens.append(z["tokens"])
            taps.append(z["taps"])
            lengths.append(z["lengths"])
            prompt_lens.append(z["prompt_lens"])
    lengths_all = np.concatenate(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths_all, dtype=np.int64)])
    times = [s.get("seconds") for s in index["shards"]]
    return Sequences(np.concatenate(tokens), np.concatenate(taps), offsets, np.concatenate(prompt_lens),
                     h.hexdigest(), None if None in times else float(sum(times)))
