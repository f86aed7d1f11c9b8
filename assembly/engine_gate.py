"""The per-file gate of a GGUF engine that needs one (registry trait `gated`: ik_llama.cpp), like the ONNX export's
parity gate: before the engine runs a file, measure whether it computes that file faithfully, at which call size,
and whether its verify batches equal one-token calls; cache the answer per file, engine version and threads.

    faithful   teacher-forced top-1 agreement with a reference over GATE_PROMPTS dev prompts (up to GATE_TOKENS
               positions each), for each call size in GATE_CALLS (the engine's ubatch: llama_decode splits every
               call into ubatches of that many rows). Reference: the NumPy reference (fp32) for files our families
               read, else mainline llama.cpp, else the engine's own one-token calls. A call size passes when its
               agreement is within GATE_MARGIN of mainline llama.cpp's (else at least GATE_FLOOR); the engine then
               runs the largest that passes (`max_call`), and none passing refuses the file with the figures.
    invariant  a w-token call gives the logits of w one-token calls, bit for bit, for every verify width the plan
               may use (PROBE_WIDTHS, up to k + 1 = 9), after a short prefix and after one longer than the model's
               sliding window: greedy speculation on the engine is then token-identical to its plain decoding.
    plain      where the engine has plain-decoding kernels (registry fast_kernels: ik's repacked weights) and they
               differ for this file: their agreement in one-token calls and in max_call-token calls (a prompt's
               prefill), the lower of the two; below the same floor, plain decoding keeps the exact kernels.

Example (SmolLM2-135M Q4_1 on ik_llama.cpp 0.1.5, docs/ik.md): calls of 256 rows agree 39% with the reference
(a Q4_1 GEMM fault at 32+ rows), calls of 16 agree 98% (mainline: 97.5%): max_call 16, invariant at widths 2..9.
Gates live at <model cache>/gates/<key>.json; the key covers the file's fingerprint, the engine and its version,
the threads and GATE_VERSION.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..models.catalog import model_cache_dir
from ..models.errors import UnsupportedModelError
from ..models.gguf_any import open_any_gguf
from ..runtime.backends import BackendInfo, GateTuning, Kernels, OpenSettings, reference_engine
from ..runtime.cores import default_threads
from ..runtime.tokenizer import TextTokenizer, Tokenizer
from .devset import load_prompts
from .measured import Store
from .notice import Measuring
from .profile import model_fingerprint

Log = Callable[[str], None]
GATE_VERSION = 3  # 2: large files checked on fewer positions; 3: plain kernels checked
GATE_CALLS = (256, 16)  # ubatch sizes tried, largest first (16: below the Q4_1/Q5_1 fault at 32 rows)
GATE_PROMPTS, GATE_TOKENS = 3, 128
LARGE_FILE = 400e6  # bytes: a larger model is checked on 2 prompts of 64 tokens and one probe prefix (about 30 s for
#                     a 1.1 GB file on 2 cores instead of 70)
GATE_MARGIN, GATE_FLOOR = 0.02, 0.90
PROBE_WIDTHS = tuple(range(2, 10))
GATE_TIMEOUT_S = 900
NUMPY_REFERENCE_BYTES = 2.5e9  # fp32 weights beyond this (a 1.5B model: 6 GB) are judged against mainline llama.cpp
# top-1 agreement, which a busy machine does not change: stored as measured (no load watched)
GATES = Store("gates", "gate", GATE_VERSION, version_field="version_gate", covers="file, engine version and threads")


@dataclass(frozen=True)
class Gate:
    key: str
    engine: str
    version: str | None
    file: str
    threads: int
    reference: str  # numpy | llamacpp | self
    positions: int
    agreement: dict[str, float]  # call size (as text: JSON keys) -> top-1 agreement with the reference
    baseline: float | None  # mainline llama.cpp's agreement with the same reference (None: not measured)
    max_call: int | None  # the largest faithful call size; None: none is, the file is refused
    invariant: bool
    widths: list[int] = field(default_factory=list)
    prefixes: list[int] = field(default_factory=list)
    seconds: float = 0.0
    created: str = ""
    crashed: str | None = None  # the engine failed on the file while measuring (how, its last message)
    plain: float | None = None  # its plain kernels' agreement (None: the engine has none that differ for this file)
    version_gate: int = GATE_VERSION

    @property
    def passed(self) -> bool:
        return self.max_call is not None

    @property
    def floor(self) -> float:
        return GATE_FLOOR if self.baseline is None else self.baseline - GATE_MARGIN

    @property
    def plain_faithful(self) -> bool:
        """Whether plain decoding may run the engine's plain kernels on this file."""
        return self.plain is not None and self.plain >= self.floor

    def figures(self) -> str:
        calls = ", ".join(f"{a:.1%} at {c}-token calls" for c, a in self.agreement.items())
        if self.plain is not None:
            calls += f", {self.plain:.1%} on its plain-decoding kernels"
        base = "" if self.baseline is None else f" (mainline llama.cpp: {self.baseline:.1%})"
        return f"top-1 agreement with the {self.reference} reference over {self.positions} positions: {calls}{base}"

    def summary(self) -> str:
        if self.crashed:
            return (f"{self.engine} refuses {Path(self.file).name}: it failed on this file ({self.crashed}). Use "
                    "--backend llamacpp for this file")
        if not self.passed:
            return (f"{self.engine} refuses {Path(self.file).name}: no call size is faithful; {self.figures()}. "
                    "Use --backend llamacpp for this file")
        inv = "batch-invariant" if self.invariant else "NOT batch-invariant (plain decoding only)"
        return (f"{self.engine} gate for {Path(self.file).name}: calls of up to {self.max_call} tokens are faithful, "
                f"{inv} at widths {self.widths[0]}..{self.widths[-1]} ({self.threads} threads); {self.figures()}")


def gate_key(path: Path, engine: BackendInfo, threads: int) -> str:
    return GATES.key(model_fingerprint(path), engine.value, engine.version(), threads, GATE_CALLS, PROBE_WIDTHS)


def gate_path(cache_dir: Path | None, key: str) -> Path:
    return GATES.path(model_cache_dir(cache_dir), key)


def save_gate(gate: Gate, cache_dir: Path | None) -> Path:
    return GATES.save(asdict(gate), gate_path(cache_dir, gate.key))


def engine_gate(path: Path, engine: BackendInfo, *, threads: int | None = None, cache_dir: Path | None = None,
                log: Log = lambda m: None) -> Gate:
    """The cached gate of `path` on `engine` at `threads`, or a new one (measured now, about 10-30 s for a model of a
    few hundred MB on 2 cores, said in one line). The measurement runs in a child process: an engine that aborts on
    a file (a C assertion) fails that file's gate instead of taking the caller down."""
    threads = default_threads(threads)
    key = gate_key(Path(path), engine, threads)
    where = gate_path(cache_dir, key)
    cached, _ = GATES.load(where, key, lambda obj: Gate(**obj))  # another version's file: measured again
    if cached is not None:
        return cached
    log(Measuring(f"{engine.name}: no gate for {Path(path).name} at {threads} thread{'s' if threads > 1 else ''} "
                  "yet: checking it once (faithfulness by call size, batch invariance; about 10-30 s for a few "
                  "hundred MB on 2 cores, then cached; --backend llamacpp skips it)"))
    gate = _measure_in_child(Path(path), engine, threads, key, where, cache_dir)
    save_gate(gate, cache_dir)
    log(gate.summary())
    return gate


def _measure_in_child(path: Path, engine: BackendInfo, threads: int, key: str, where: Path,
                      cache_dir: Path | None) -> Gate:
    out = where.with_suffix(".child.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(_child_command(path, engine, threads, key, out, cache_dir), capture_output=True, text=True,
                       timeout=GATE_TIMEOUT_S)
    try:
        if r.returncode == 0:
            return Gate(**json.loads(out.read_text()))
    finally:
        out.unlink(missing_ok=True)
    last = next((ln for ln in reversed(r.stderr.splitlines()) if ln.strip()), "no message").strip()
    if r.returncode > 0:  # a Python error (ours, or a file it cannot read): said, not cached as the file's verdict
        raise RuntimeError(f"{engine.name}: checking {path.name} failed: {last}")
    how = f"signal {-r.returncode}"  # the engine itself died on this file (an assertion, a fault): refused for good
    return Gate(key, engine.name, engine.version(), str(path), threads, "none", 0, {}, None, None, False,
                crashed=f"{how}: {last[:300]}", created=time.strftime("%Y-%m-%d %H:%M:%S"))


def measure_gate(path: Path, engine: BackendInfo, threads: int, key: str, cache_dir: Path | None = None) -> Gate:
    t0 = time.perf_counter()
    gguf = open_any_gguf(path, cache_dir)  # its tokenizer cached in the model cache
    sequences = _sequences(gguf, engine, threads)
    reference, ref_name = _reference(path, gguf, sequences, engine, threads)
    positions = sum(len(s) for s in sequences)
    baseline = None
    if ref_name == reference_engine().value and _mainline() is not None:
        baseline = _agreement(_argmax(_mainline()(path, gguf.config, threads), sequences), reference)
    floor = GATE_FLOOR if baseline is None else baseline - GATE_MARGIN
    agreement, max_call = {}, None
    for call in GATE_CALLS:
        backend = engine.open_gguf(gguf, OpenSettings(_ctx(sequences), threads, tuning=GateTuning(max_call=call)))
        agreement[str(call)] = _agreement(_argmax(backend, sequences), reference)
        if max_call is None and agreement[str(call)] >= floor:
            max_call, probe_backend = call, backend
        else:
            del backend
    invariant, prefixes = False, []
    if max_call is not None:
        window = max(gguf.config.block.windows(), default=0)  # a description without a block: none (LLAMA)
        large = Path(path).stat().st_size > LARGE_FILE
        prefixes = [40] + ([window + 24] if window else [] if large else [200])
        probe = engine.probe
        room = max(prefixes) + max(PROBE_WIDTHS)
        if _ctx(sequences) < room:
            probe_backend = engine.open_gguf(gguf, OpenSettings(room, threads, tuning=GateTuning(max_call=max_call)))
        invariant = bool(probe(probe_backend, PROBE_WIDTHS, prefixes))
        del probe_backend
    plain = _plain_agreement(gguf, engine, sequences, reference, threads, max_call) if max_call else None
    return Gate(key, engine.name, engine.version(), str(path), threads, ref_name, positions, agreement, baseline,
                max_call, invariant, list(PROBE_WIDTHS), prefixes, time.perf_counter() - t0,
                time.strftime("%Y-%m-%d %H:%M:%S"), plain=plain)


def _plain_agreement(gguf, engine: BackendInfo, sequences, reference, threads: int, max_call: int) -> float | None:
    """The engine's plain kernels on this file (None: it has none, or they are its exact ones here: ik with nothing
    to repack): the lower agreement of one-token calls (decoding) and max_call-token calls (a prefill)."""
    if engine.fast_kernels is None:
        return None
    backend = engine.open_gguf(gguf, OpenSettings(_ctx(sequences), threads, Kernels.FAST_PLAIN_ONLY,
                                                  tuning=GateTuning(max_call=max_call)))
    if backend.caps.batch_invariant:
        return None
    return min(_agreement(_argmax(backend, sequences, call=1), reference),
               _agreement(_argmax(backend, sequences), reference))


def _child_command(path: Path, engine: BackendInfo, threads: int, key: str, out: Path,
                   cache_dir: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "specedge.assembly.engine_gate", str(path), engine.value, str(threads), key,
            str(out), "" if cache_dir is None else str(cache_dir)]


def _ctx(sequences: list[np.ndarray]) -> int:
    return max(len(s) for s in sequences) + 16


def _sequences(gguf, engine: BackendInfo, threads: int) -> list[np.ndarray]:
    """GATE_PROMPTS dev prompts (one per Spec-Bench task) in the chat template, their last GATE_TOKENS tokens (2 x 64
    for a file over LARGE_FILE)."""
    tok: TextTokenizer
    try:
        tok = Tokenizer(gguf.tokenizer_spec())
    except UnsupportedModelError:  # the engine's own tokenizer
        tok = engine.open_gguf(gguf, OpenSettings(64, threads)).tokenizer(gguf.chat_template)
    large = Path(gguf.path).stat().st_size > LARGE_FILE
    n, tokens = (2, 64) if large else (GATE_PROMPTS, GATE_TOKENS)
    return [np.asarray(tok.chat_ids(p.text)[-tokens:], dtype=np.int32) for p in load_prompts(limit=n, by="task")]


def _reference(path: Path, gguf, sequences, engine: BackendInfo, threads: int) -> tuple[list[np.ndarray], str]:
    """Argmax per position from the NumPy reference (fp32) for files our families read whose float weights fit
    NUMPY_REFERENCE_BYTES, else mainline llama.cpp (faithful in batches), else the engine's one-token calls."""
    try:
        from ..models.gguf_in import open_gguf
        from ..runtime.backends.numpy_ref import NumpyBackend
        model = open_gguf(path)
        if 4 * sum(int(np.prod(s)) for s in model.config.tensor_names().values()) <= NUMPY_REFERENCE_BYTES:
            return _argmax(NumpyBackend(model.load_weights()), sequences), reference_engine().value
    except UnsupportedModelError:
        pass
    if _mainline() is not None:
        return _argmax(_mainline()(path, gguf.config, threads), sequences), "llamacpp"
    one = engine.open_gguf(gguf, OpenSettings(_ctx(sequences), threads, tuning=GateTuning(max_call=1)))
    return _argmax(one, sequences, call=1), "self"


def _mainline():
    """A constructor of mainline llama.cpp at flash attention (its faithful setting), or None when not installed."""
    from ..runtime.backends import REGISTRY, BackendKind
    main = REGISTRY.get(BackendKind.LLAMACPP)
    if main is None or not main.installed():
        return None

    def build(path, config, threads):
        from ..runtime.backends.llamacpp import LlamaCppBackend
        return LlamaCppBackend(path, config, n_ctx=512, n_threads=threads)
    return build


def _argmax(backend, sequences: list[np.ndarray], call: int | None = None) -> list[np.ndarray]:
    """Teacher-forced argmax at every position: one forward per sequence (or `call` tokens at a time)."""
    out = []
    for seq in sequences:
        cache = backend.new_cache(len(seq))
        step = call or len(seq)
        rows = [backend.forward(seq[s:s + step], cache) for s in range(0, len(seq), step)]
        out.append(np.argmax(np.concatenate(rows), axis=1))
    return out


def _agreement(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Share of positions (each predicting the next token, so the last of a sequence is left out) that agree."""
    same = sum(int((g[:-1] == w[:-1]).sum()) for g, w in zip(got, want))
    total = sum(len(w) - 1 for w in want)
    return same / max(total, 1)


def main(argv=None) -> None:
    """The child process of engine_gate: PATH ENGINE THREADS KEY OUT [CACHE_DIR] -> the measured Gate as JSON in OUT
    (CACHE_DIR: the model cache, "" for the default)."""
    from ..runtime.backends import info
    path, engine, threads, key, out, *rest = (argv or sys.argv[1:])[:6]
    gate = measure_gate(Path(path), info(engine), int(threads), key, Path(rest[0]) if rest and rest[0] else None)
    Path(out).write_text(json.dumps(asdict(gate)))


if __name__ == "__main__":
    main()
