"""The state of a `specedge chat` session (apps/chat_cmd.py): the conversation /save writes and --load reads, the
per-call options /set changes, the session totals, and the answer room kept free when trimming to the context."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import get_type_hints

from ..assembly.decoder import CALL_OPTIONS, CallSettings, parse_logit_bias
from ..assembly.sampling_defaults import SamplingDefaults
from ..runtime.stats import CallStats
from ..runtime.types import FinishReason
from .api import Engine

SAVE_FORMAT = "specedge-chat/1"


def bias_option(text: str) -> dict[int, float]:
    """/set logit_bias: llama.cpp items separated by spaces (15043+1 1234-inf); `none` clears it."""
    if text.strip().lower() == "none":
        return {}
    try:
        return parse_logit_bias(text.split())
    except ValueError as e:
        raise ValueError(f"{e} (several: /set logit_bias 15043+1 1234-inf; /set logit_bias none clears)") from None


OPTION_NAMES = CALL_OPTIONS  # the /set keys: CallSettings' per-call options (assembly/decoder.py)
PENALTIES = ("repeat_penalty", "dry_multiplier")  # specedge's defaults for sampled answers, off when greedy


def unset_value(name: str, value, greedy: bool, defaults: SamplingDefaults) -> str:
    """What /set shows for an option left unset: the value used and where it comes from, true for each field (the
    model's own value, the chat default the model did not override, or a penalty that greedy answers turn off)."""
    if name in PENALTIES:
        if greedy:
            return f"{value} (off: a greedy answer stays exactly greedy; {getattr(defaults, name)} when sampling)"
        return f"{value} (specedge's default for sampled answers)"
    if name in defaults.stated:
        return f"{value} (the model's own: {defaults.source})"
    return f"{value} (the chat default: the model states no {name})"


def switch(text: str) -> bool:
    """/set repetition_stop on|off (true/false, yes/no, 1/0)."""
    value = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False,
             "0": False}.get(text.strip().lower())
    if value is None:
        raise ValueError(f"takes on or off, got {text!r}")
    return value


def _parser(name: str):
    """How /set reads a value of CallSettings field `name`: its declared type (bool, int or float), logit_bias's
    own."""
    if name == "logit_bias":
        return bias_option
    hint = get_type_hints(CallSettings)[name]
    return switch if hint is bool else int if "int" in str(hint) else float


OPTION_TYPES = {name: _parser(name) for name in OPTION_NAMES}


def set_keys() -> str:
    """The /set keys as /help lists them: each option, with how its value is written where it is not a number."""
    how = {switch: " on|off", bias_option: " ID+BIAS ..."}
    return ", ".join(name + how.get(OPTION_TYPES[name], "") for name in OPTION_NAMES)

# /set K none: the fields that take None (max_tokens: no limit; the sampling values: the model's default)
OPTIONAL = tuple(name for name in OPTION_NAMES if "None" in str(get_type_hints(CallSettings)[name]))
RESERVE_CAP = 512  # answer room the chat keeps free when trimming: min(RESERVE_CAP, ctx // 4), or max_tokens
SHORT_ANSWER = 8  # trimming shortens an answer longer than ctx // SHORT_ANSWER tokens to that many, longest first


@dataclass
class Totals:
    """Session totals over answers (shown by /stats)."""
    answers: int = 0
    interrupted: int = 0
    tokens: int = 0
    decode_s: float = 0.0
    prefilled: int = 0
    reused: int = 0

    def add(self, stats: CallStats) -> None:
        self.answers += 1
        self.interrupted += stats.finish_reason is FinishReason.CANCELLED
        self.tokens += stats.decode.n_generated
        self.decode_s += stats.decode.decode_s
        self.prefilled += stats.decode.n_prefilled
        self.reused += stats.reused_prompt_tokens


@dataclass
class Conversation:
    """What /save writes and --load reads: the system prompt, the turns and the per-call options."""
    system: str | None = None
    messages: list[dict] = field(default_factory=list)  # {"role", "content"[, "interrupted": True][, "tokens": n]}
    options: dict = field(default_factory=dict)  # CallSettings fields (max_tokens, temperature, ...)
    start: int = 0  # messages[:start] were dropped to fit the context: kept for /save, not shown to the model

    def render(self) -> list[dict]:
        """The messages for the chat template (system first; only role and content; the dropped ones left out, a
        shortened answer as its `view`)."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": m["role"], "content": m.get("view", m["content"])} for m in self.messages[self.start:]]

    def clear(self) -> None:
        self.messages.clear()
        self.start = 0

    def save(self, path: Path, engine: Engine, totals: Totals) -> None:
        messages = [{**m, "dropped": True} if i < self.start else m for i, m in enumerate(self.messages)]
        doc = {"format": SAVE_FORMAT, "model": engine.name, "backend": engine.backend_kind,
               "drafter": engine.drafter_name, "k": engine.k, "ctx": engine.context_length, "system": self.system,
               "options": self.options, "messages": messages, "totals": asdict(totals)}
        write_private(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, path: Path) -> "Conversation":
        """requires: a file written by /save. Raises ValueError naming what is wrong."""
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read the saved chat {path}: {e}") from None
        if not isinstance(doc, dict) or doc.get("format") != SAVE_FORMAT:
            raise ValueError(f"{path} is not a chat saved by /save (expected format {SAVE_FORMAT!r})")
        msgs = doc.get("messages", [])
        if not all(isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
                   for m in msgs):
            raise ValueError(f"{path}: messages must be {{'role': 'user'|'assistant', 'content': str}}")
        opts = {k: v for k, v in doc.get("options", {}).items() if k in OPTION_NAMES}
        # messages dropped or shortened to fit the saved chat's context come back whole: the first turn trims again to this --ctx
        return cls(doc.get("system"), [{k: v for k, v in m.items() if k not in ("dropped", "view")} for m in msgs],
                   opts)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (0600: a transcript is private), atomically: a new file in
    the same folder renamed over it, so an older, wider-readable file is replaced, never left half-written. OSError
    as open() raises it (a missing folder, no permission)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # created 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stats_line(s: CallStats) -> str:
    """One line per answer: speed, tau, time to first token, prompt tokens new + reused (they sum to the prompt: the
    new ones include the last, which the first decoding step reads) and how fast the new ones were processed
    (prefilled tokens / prefill seconds; '-' when none were), finish reason, what decoded ("plain" for no
    drafter)."""
    d = s.decode
    ttft_txt = "-" if s.ttft_s is None else f"{s.ttft_s:.3f} s"
    prompt_rate = f"{d.prompt_tokens_per_s:.0f} tok/s" if d.prompt_tokens_per_s > 0 else "-"
    how = "plain" if s.drafter == "none" else s.drafter
    return (f"[{d.tokens_per_s:.1f} tok/s | tau {d.mean_accepted_length:.2f} | TTFT {ttft_txt} | prompt "
            f"{s.prompt_tokens} tokens: {s.prompt_tokens - s.reused_prompt_tokens} new ({prompt_rate}), "
            f"{s.reused_prompt_tokens} reused | {d.n_generated} tokens, {s.finish_reason} | {how}]")


def parse_option(key: str, value: str, current: dict) -> dict:
    """The options with KEY set to VALUE (typed as CallSettings declares it; `default` for its default; `none` for
    no limit (max_tokens) or the model's default (the sampling values)), validated. Raises ValueError."""
    if key not in OPTION_TYPES:
        raise ValueError(f"unknown option {key!r}; use one of {', '.join(OPTION_NAMES)}")
    kind = OPTION_TYPES[key]
    if value.lower() == "default":
        return {**current, key: CallSettings.__dataclass_fields__[key].default}
    if value.lower() == "none" and key in OPTIONAL:
        return {**current, key: None}
    try:
        new = {**current, key: kind(value)}
    except ValueError as e:
        if kind is switch:
            raise ValueError(f"{key} {e}") from None
        if kind not in (int, float):
            raise  # a parser of its own (logit_bias) says what it takes
        also = " or none" if key in OPTIONAL else ""
        raise ValueError(f"{key} takes a {kind.__name__}{also}, got {value!r}") from None
    CallSettings(**new)  # raises ValueError naming a bad value
    return new


def answer_reserve(ctx: int, max_tokens: int | None) -> int:
    """Tokens kept free for the answer when trimming the conversation: min(512, ctx // 4), or max_tokens if
    smaller (an answer that long stops there anyway)."""
    reserve = max(1, min(RESERVE_CAP, ctx // 4))
    return reserve if max_tokens is None else max(1, min(reserve, max_tokens))
