"""Device profile (measured costs and acceptance of one target on one machine) and the auto-tuner that picks the
drafter and draft length k with the most expected tokens/s from it.

A profile holds, for one backend + model artifact + threads + device (its `key`):
- the verify-cost curve T(n), n = 1..N: one chain forward of n tokens at a fixed cache length (median of repeats,
  after warm-up; perf/profile_measure.py);
- the runtime's own per-round cost outside the forward (verification arithmetic, sampling, KV bookkeeping),
  fitted as overhead(n) = a + b n over the measured rounds;
- per drafter: conditional acceptance alpha_i of draft position i (given positions < i were accepted; a position
  the drafter did not propose counts as rejected, so an n-gram miss lowers alpha_1), the distribution of proposed
  draft lengths at k = k_max, and the drafting cost fitted as fixed + per_token * (tokens drafted);
- per drafter: tokens/s and tokens per round of a second run with the adaptive draft length (k <= k_max).

`choose` maximises expected tokens/s (docs/algorithms.md 1.1, 3 "adaptive K by measured throughput", 5):

    rate(d, k) = E[tokens | k, alpha] / E[time of a round]
    E[tokens]  = 1 + sum_{i<=k} prod_{l<=i} alpha_l            (runtime/draft_length.expected_tokens)
    E[time]    = sum_j P(L = j) (T(j+1) + overhead(j+1)) + fixed + per_token E[L],   L = min(drafted length, k)
    plain      = 1 / (T(1) + overhead(1))

The adaptive draft length (runtime/draft_length.py) chooses k per round and per draft kind online, which this fixed-k
model cannot express (the lookup hybrid's gain is that choice), so it is a measured candidate: its run's tokens/s,
scaled by the model's own ratio predicted/measured for the same drafter at fixed k = k_max on the same prompts (the
two runs differ only in the length policy, so the scale carries the model's bias and the machine's load over):

    rate(d, adaptive) = tok_s_adaptive(d) * rate(d, k_max) / tok_s_measured(d)

Example (overhead 0, free n-gram drafts of full length): T(n)/T(1) = 1, 1.15, 1.30, 1.50 with T(1) = 10 ms and
alpha = 0.8 at every position: k = 1: 1.8 / 11.5 ms = 157 tok/s, k = 2: 2.44 / 13 ms = 188, k = 3: 2.952 / 15 ms =
197 -> k = 3 (plain: 100 tok/s). With alpha = 0.3 and T(n) = n T(1) plain wins: k = 1 gives 1.3 / 20 ms = 65 tok/s.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..runtime.draft_length import expected_tokens
from .measured import Store
from .schema import check_schema
from ..runtime.drafters.spec import DrafterKind

PROFILE_SCHEMA_VERSION = 6  # 2: a draft model's cost measured at one k is per token (profile_measure.draft_cost);
# 3: each drafter also measured with the adaptive draft length; 4: prompts fed without their logits (a llama.cpp
# engine's per-token cost after a prompt changed); 5: the prompt's processing rate (plain, and a draft model's);
# 6: a drafter that reads the committed tokens alone (n-gram, suffix) replayed over the plain run's answers
PLAIN = DrafterKind.NONE.value
PROFILES = Store("profiles", "device profile", PROFILE_SCHEMA_VERSION, version_field="schema_version",
                 covers="model, backend, engine version, threads and device")

_NUMS = {"type": "array", "items": {"type": "number"}}
_DRAFTER = {"type": "object",
            "required": ["spec", "k_max", "accept", "length_dist", "draft_fixed_s", "draft_per_token_s", "rounds",
                         "tok_s_adaptive", "tau_adaptive"],
            "properties": {"spec": {"type": "string"}, "k_max": {"type": "integer"}, "accept": _NUMS,
                           "length_dist": _NUMS, "draft_fixed_s": {"type": "number"},
                           "draft_per_token_s": {"type": "number"}, "rounds": {"type": "integer"},
                           "tok_s_measured": {"type": "number"}, "tok_s_adaptive": {"type": "number"},
                           "tau_adaptive": {"type": "number"}, "prompt_tok_s": {"type": "number"}}}
PROFILE_SCHEMA = {
    "type": "object",
    "required": ["schema_version", "key", "target", "backend", "model", "fingerprint", "threads", "device", "ctx",
                 "verify_s", "overhead_s", "drafters", "machine", "created"],
    "properties": {
        "schema_version": {"type": "integer", "enum": [PROFILE_SCHEMA_VERSION]},
        "key": {"type": "string"}, "target": {"type": "string"}, "backend": {"type": "string"},
        "model": {"type": "string"}, "fingerprint": {"type": "string"}, "threads": {"type": ["integer", "null"]},
        "device": {"type": "string"}, "ctx": {"type": "integer"},
        "verify_s": _NUMS,  # T(n) in seconds for n = 1..len
        "overhead_s": _NUMS,  # [a, b]: runtime cost per round outside the forward, a + b * width
        "plain_tok_s_measured": {"type": ["number", "null"]},
        "prompt_tok_s_measured": {"type": ["number", "null"]},
        "drafters": {"type": "object", "additionalProperties": _DRAFTER},
        "machine": {"type": "object"}, "created": {"type": "string"},
    },
}


def k_label(k: int, adaptive: bool) -> str:
    """k=5 for a fixed draft length, k<=8 for an adaptive one (its maximum)."""
    return f"k{'<=' if adaptive else '='}{k}"


@dataclass
class DrafterProfile:
    """One drafter's measured acceptance and cost on one target (k_max = the draft length it was measured at)."""

    spec: str  # DrafterSpec string, e.g. ngram, model:smollm2-135m
    k_max: int
    accept: list[float]  # [k_max] alpha_i, conditional on positions < i accepted; not proposed = rejected
    length_dist: list[float]  # [k_max + 1] fraction of rounds whose draft had j tokens, j = 0..k_max
    draft_fixed_s: float  # drafting cost per round ...
    draft_per_token_s: float  # ... plus this per drafted token
    rounds: int  # rounds the estimates rest on
    tok_s_measured: float = 0.0  # tokens/s of the measuring run (k = k_max, fixed)
    tok_s_adaptive: float = 0.0  # tokens/s of a run with the adaptive draft length, k <= k_max (0: not measured)
    tau_adaptive: float = 0.0  # its tokens per round
    prompt_tok_s: float = 0.0  # prompt tokens/s with this drafter's own prefill (a draft model's); 0: as plain


@dataclass
class DeviceProfile:
    """Measured costs of one target (backend + artifact + threads + device) and its drafters; JSON-cached."""

    key: str
    target: str  # bench label, backend[:model]
    backend: str
    model: str  # the GGUF file or artifact directory
    fingerprint: str  # model_fingerprint(model)
    threads: int | None
    device: str
    ctx: int  # cache length the T(n) calls append at
    verify_s: list[float]  # T(n), n = 1..len(verify_s)
    overhead_s: list[float]  # [a, b]: per-round runtime cost outside the forward = a + b * width
    drafters: dict[str, DrafterProfile] = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    created: str = ""
    plain_tok_s_measured: float | None = None
    prompt_tok_s_measured: float | None = None  # prompt tokens prefilled per second (the plain runs' prompts)
    schema_version: int = PROFILE_SCHEMA_VERSION

    def round_time(self, width: int) -> float:
        """Seconds of one round that verifies `width` positions: T(width) + overhead(width)."""
        if not 1 <= width <= len(self.verify_s):
            raise ValueError(f"the profile has T(n) for n = 1..{len(self.verify_s)}, not {width}; re-measure with "
                             "a larger k_max")
        return self.verify_s[width - 1] + self.overhead_s[0] + self.overhead_s[1] * width

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: dict) -> "DeviceProfile":
        """Checked against PROFILE_SCHEMA; ValueError naming the problem (the caller re-measures)."""
        errors = check_schema(obj, PROFILE_SCHEMA)
        if errors:
            raise ValueError("; ".join(errors[:5]))
        fields = dict(obj)
        fields["drafters"] = {k: DrafterProfile(**v) for k, v in obj["drafters"].items()}
        return cls(**fields)


@dataclass(frozen=True)
class Candidate:
    drafter: str  # PLAIN for plain decoding
    k: int
    tokens_per_round: float
    round_s: float
    adaptive: bool = False  # the adaptive draft length with k as its maximum

    @property
    def tok_s(self) -> float:
        return self.tokens_per_round / self.round_s


@dataclass(frozen=True)
class Choice:
    """The chosen configuration, its predicted tokens/s, plain decoding's, and every candidate considered."""

    drafter: str
    k: int
    predicted_tok_s: float
    plain_tok_s: float
    candidates: tuple[Candidate, ...]
    adaptive: bool = False

    def describe(self) -> str:
        what = "plain decoding" if self.drafter == PLAIN else f"drafter {self.drafter} {k_label(self.k, self.adaptive)}"
        return (f"{what}: predicted {self.predicted_tok_s:.1f} tok/s (plain {self.plain_tok_s:.1f} tok/s, "
                f"{self.predicted_tok_s / self.plain_tok_s:.2f}x)")


def predict(profile: DeviceProfile, drafter: str, k: int) -> Candidate:
    """Expected tokens and seconds per round for `drafter` at draft length k (module docstring formula).
    requires: drafter measured in the profile (or PLAIN), 1 <= k <= its k_max, T(k+1) measured."""
    if drafter == PLAIN:
        return Candidate(PLAIN, 0, 1.0, profile.round_time(1))
    d = profile.drafters[drafter]
    if not 1 <= k <= d.k_max:
        raise ValueError(f"drafter {drafter} was measured up to k={d.k_max}, not k={k}")
    dist = np.asarray(d.length_dist, dtype=float)
    p_len = np.concatenate([dist[:k], [dist[k:].sum()]])  # L = min(drafted, k): [k + 1]
    verify = sum(p * profile.round_time(j + 1) for j, p in enumerate(p_len))
    mean_len = float(np.dot(np.arange(k + 1), p_len))
    draft = d.draft_fixed_s + d.draft_per_token_s * mean_len
    return Candidate(drafter, k, float(expected_tokens(d.accept[:k])[k]), float(verify + draft))


def predict_adaptive(profile: DeviceProfile, drafter: str) -> Candidate | None:
    """The adaptive draft length (k <= the drafter's k_max) as a candidate: measured tokens/s on the predicted scale
    (module docstring); None when the profile has no adaptive run for it.
    Example: measured 60 tok/s adaptive and 50 tok/s at fixed k = 8, predicted 55 tok/s at k = 8 -> 66 tok/s."""
    d = profile.drafters[drafter]
    if d.tok_s_adaptive <= 0 or d.tok_s_measured <= 0 or d.tau_adaptive <= 0 or d.k_max + 1 > len(profile.verify_s):
        return None
    rate = d.tok_s_adaptive * predict(profile, drafter, d.k_max).tok_s / d.tok_s_measured
    return Candidate(drafter, d.k_max, d.tau_adaptive, d.tau_adaptive / rate, adaptive=True)


def choose(profile: DeviceProfile, drafters: list[str] | None = None, k_max: int = 8) -> Choice:
    """The (drafter, k, fixed or adaptive) with the most expected tokens/s among plain decoding and the profile's
    drafters (or the listed ones), fixed k = 1..min(k_max, measured) and the adaptive length where measured (with
    the drafter's k_max as its maximum, when that is <= k_max); ties go to plain, then to the smaller fixed k,
    then to fixed over adaptive."""
    names = list(profile.drafters) if drafters is None else [d for d in drafters if d != PLAIN]
    missing = [d for d in names if d not in profile.drafters]
    if missing:
        raise ValueError(f"the profile has no measurements for {missing}; measure them (specedge bench MODEL "
                         "--profile-device --drafters ...)")
    plain = predict(profile, PLAIN, 0)
    cands = [plain]
    for name in names:
        top = min(k_max, profile.drafters[name].k_max, len(profile.verify_s) - 1)
        cands += [predict(profile, name, k) for k in range(1, top + 1)]
        adaptive = predict_adaptive(profile, name) if profile.drafters[name].k_max <= k_max else None
        cands += [adaptive] if adaptive is not None else []
    best = plain
    for c in cands[1:]:
        if c.tok_s > best.tok_s * (1 + 1e-9):
            best = c
    return Choice(best.drafter, best.k, best.tok_s, plain.tok_s, tuple(cands), best.adaptive)


# -- key and cache ------------------------------------------------------------------------------------------------

def model_fingerprint(path: str | Path) -> str:
    """sha256 of an artifact's manifest.json (which lists its files' hashes); for a model file, of its size, first
    and last 8 MiB (a new quantization or model changes them; hashing a 1 GB file at every start would not pay)."""
    p = Path(path)
    h = hashlib.sha256()
    if p.is_dir():
        h.update((p / "manifest.json").read_bytes())
    else:
        size, chunk = p.stat().st_size, 8 << 20
        h.update(str(size).encode())
        with open(p, "rb") as f:
            h.update(f.read(chunk))
            f.seek(max(size - chunk, 0))
            h.update(f.read(chunk))
    return h.hexdigest()


def profile_key(fingerprint: str, backend: str, threads: int | None, device: str, engine: str | None) -> str:
    """16 hex digits over what changes the costs: the model, backend, its engine version, threads, device."""
    return PROFILES.key(fingerprint, backend, engine, threads, device)


def profile_path(cache_root: Path, key: str) -> Path:
    """<model cache>/profiles/<key>.json"""
    return PROFILES.path(cache_root, key)


def save_profile(profile: DeviceProfile, path: Path) -> Path:
    return PROFILES.save(profile.to_dict(), path)


def load_profile(path: Path, key: str) -> tuple[DeviceProfile | None, str]:
    """(profile, "") when `path` holds a valid profile with this key; else (None, why it must be re-measured)."""
    return PROFILES.load(path, key, DeviceProfile.from_dict)
