"""Golden greedy outputs: every drafter each backend supports, decoded with the current code, recorded token for token
so that a refactor of decoder assembly can be checked against them (tests/test_golden.py).

    specedge pull smollm2-135m
    specedge export smollm2-135m --format onnx --weights int4                     # smollm2-135m-onnx-int4
    specedge export smollm2-135m --format onnx --weights int4 --profile layered   # smollm2-135m-onnx-layered-int4
    python -m specedge.perf.golden --out tests/golden --prompts 20 --tokens 64 [--backend numpy onnx llamacpp]
        [--only none ngram ...] [--threads N]

Prompts: the benchmark's selection (perf/bench.py read_prompts: the dev set round-robin over Spec-Bench's tasks),
first turn chat-formatted as `specedge generate` does by default. Decoding: greedy, seed 0, k = 4 with the adaptive
draft length (the CLI defaults), the tokenizer's EOS ids, the model's own context; `threads` pinned and recorded
(llama.cpp's and ONNX Runtime's reductions depend on the thread count). Each file is one backend:

    {"backend", "model", "model_file", "model_sha256", "targets": {name: {"artifact", "files": {name: sha256}}},
     "prompts", "tokens", "k", "adaptive_k", "threads", "prompt_qids", "prompt_ids_sha256",
     "configs": {key: [[ids...] per prompt]}, "equals_plain": {key: bool}, "seconds": {key: s}, "refused": {key: msg}}

A key is a `--drafter` string, `lossy:<mode>` for a `--lossy` mode, with `@<artifact>` on the ONNX backend (two
artifacts: monolithic and layered). `{golden}` in a key stands for the golden directory (committed LoRA-Drop
corrections). Written after every configuration; --only re-records some keys into an existing file with the same
inputs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..assembly.decoder import CallSettings, DecodeSettings, Decoder, ModelSettings
from ..assembly.load import artifact_name, load_model, parse_drafter
from ..assembly.open import open_decoder
from ..models.catalog import CATALOG
from ..runtime.backends import BackendKind, Opens, info, reference_engine
from ..runtime.lossy import parse_lossy
from ..models.manifest import Profile
from .bench import read_prompts

MODEL = "smollm2-135m"
K, ADAPTIVE_K, SEED = 4, True, 0  # the CLI's k, --adaptive-k and --seed defaults
# Threads pinned per backend (the CLI's default depends on the machine). llama.cpp: 1, since with 2 its CPU flash
# attention reduces a one-token query and a verify batch in different orders once the cache is long
# (tests/test_real_decode.py), and the adaptive draft length picks widths from timings: outputs would vary run to run.
THREADS = {"numpy": None, "onnx": 2, "llamacpp": 1}  # numpy: the BLAS library's own threads
CORRECTIONS = "loradrop-r8-c4"  # `specedge export smollm2-135m --lora-drop rank=8,cycle=4 --out <golden>/<this>`


@dataclass(frozen=True)
class Target:
    name: str  # catalogue name (GGUF backends) or artifact cache name (onnx)
    configs: tuple[str, ...]  # --drafter strings, or lossy:<mode>
    weights: str | None = None  # onnx: the export's --weights
    layered: bool = False  # onnx: --profile layered


_LORADROP = ("loradrop", "loradrop:{golden}/" + CORRECTIONS)
PLAN: dict[str, tuple[Target, ...]] = {
    "numpy": (Target(MODEL, ("none", "ngram", "recycle:16", f"model:{MODEL}", f"model:{MODEL}+conf",
                             f"model:{MODEL}+tree:8", f"model:{MODEL}+lookup", "skip:1.5", "swift", "exit:20",
                             "exit:20+logistic", "del", *_LORADROP, "lossy:loradrop")),),
    "onnx": (Target(artifact_name(MODEL, "int4"),
                    ("none", "ngram", f"model:{artifact_name(MODEL, 'int4')}",
                     f"model:{artifact_name(MODEL, 'int4')}+lookup"), weights="int4"),
             Target(artifact_name(MODEL, "int4", profile=Profile.LAYERED),
                    ("none", "recycle:16", "skip:1.5", "swift", "exit:20", "del", *_LORADROP), weights="int4", layered=True)),
    "llamacpp": (Target(MODEL, ("none", "ngram", f"model:{MODEL}", f"model:{MODEL}+lookup")),),
}


def _artifacts(backend: str) -> bool:
    """Whether the engine opens exported artifacts (its golden keys name the artifact: config@target)."""
    return info(kind_of(backend)).opens is Opens.ARTIFACT


def _device(backend: str) -> str:
    """The device golden outputs are made on: the CPU for an engine that takes --device, else its default."""
    return "cpu" if info(kind_of(backend)).devices else "auto"


def config_key(backend: str, target: Target, config: str) -> str:
    return f"{config}@{target.name}" if _artifacts(backend) else config


def split_key(backend: str, key: str) -> tuple[Target, str]:
    """The plan's target and the config string of a golden key."""
    config, _, name = key.rpartition("@") if _artifacts(backend) else (key, "", MODEL)
    for t in PLAN[backend]:
        if t.name == name:
            return t, config
    raise KeyError(f"{key!r}: no {backend} target {name!r} in the plan")


def golden_prompts(tokenizer, n: int) -> tuple[list[int], list[list[int]]]:
    """The benchmark's first n dev prompts (qids) and their chat-formatted token ids."""
    prompts = read_prompts(limit=n)
    ids = [list(tokenizer.chat_ids(p.text))
           for p in prompts]
    return [p.qid for p in prompts], ids


def ids_sha256(seqs: list[list[int]]) -> list[str]:
    return [hashlib.sha256(np.asarray(s, np.int32).tobytes()).hexdigest() for s in seqs]


def kind_of(backend: str) -> BackendKind:
    return BackendKind(backend)


def load_target(backend: str, target: Target, *, threads: int | None = None, artifact_dir: Path | None = None
                ) -> Decoder:
    """The target as `specedge generate --backend <backend> --drafter none` opens it (assembly/open.py, no plan): a
    plain decoder whose loaded model every golden configuration on it shares (decode_config); onnx from
    artifact_dir when given."""
    name = str(artifact_dir) if artifact_dir is not None else target.name
    settings = ModelSettings(name, kind_of(backend), threads=threads, device=_device(backend))
    return open_decoder(settings, DecodeSettings(parse_drafter("none")), plan=False)


def artifact_files(root: Path) -> dict[str, str]:
    """An exported artifact's files (all but the manifest, whose provenance names local paths) -> sha256."""
    raw = json.loads((Path(root) / "manifest.json").read_text())
    return {f: meta["sha256"] for f, meta in sorted(raw["files"].items())}


def export_artifact(target: Target, out: Path) -> Path:
    """`specedge export smollm2-135m --format onnx --weights <w> [--profile layered]` into `out` (no parity gate: the
    recorded file hashes are the check)."""
    from ..export.onnx_export import DYNAMIC, LAYERED, export_gguf_to_onnx
    from ..models.gguf_in import open_gguf
    from ..export.onnx_linear import WeightFormat
    from ..models.catalog import resolve_model
    export_gguf_to_onnx(open_gguf(resolve_model(MODEL)), out, WeightFormat(target.weights), gate=False,
                        profile=LAYERED if target.layered else DYNAMIC)  # returns the manifest's path
    return Path(out)


def inputs_of(backend: str, loaded: dict[str, Decoder]) -> dict:
    """What the outputs depend on besides the code: the source GGUF and, on onnx, every artifact file's hash."""
    entry = CATALOG[MODEL]
    out = {"model": MODEL, "model_file": entry.filename, "model_sha256": entry.sha256, "targets": {}}
    for name, m in loaded.items():
        path = m.model.path
        out["targets"][name] = {"artifact": path.name, "files": artifact_files(path) if _artifacts(backend) else None}
    return out


def decode_config(backend: str, plain: Decoder, config: str, prompts: list[list[int]], tokens: int, *,
                  golden_dir: Path, threads: int | None = None, artifacts: dict[str, Path] | None = None
                  ) -> list[list[int]]:
    """Greedy token ids per prompt for one configuration over the target `plain` decodes (load_target), as
    `specedge generate` decodes them (EOS not included). artifacts: ONNX artifact name -> directory, for a draft
    model not in the model cache. `threads`: the target's, set when it was loaded."""
    config = config.replace("{golden}", str(golden_dir))
    for name, path in (artifacts or {}).items():
        config = config.replace(f"model:{name}", f"model:{path}")
    lossy = parse_lossy(config[len("lossy:"):]) if config.startswith("lossy:") else None
    decoder = plain.with_decode(DecodeSettings(parse_drafter("none" if lossy else config), K, ADAPTIVE_K,
                                               lossy=lossy))
    call = CallSettings(max_tokens=tokens, temperature=0.0, seed=SEED)  # greedy: the golden outputs
    return [[int(t) for t in decoder.run(np.asarray(ids, np.int32), call).tokens] for ids in prompts]


def ensure_corrections(golden_dir: Path) -> Path:
    """The committed LoRA-Drop corrections, fitted with the documented command when absent."""
    out = golden_dir / CORRECTIONS
    if not (out / "lora_drop.json").is_file():
        from ..assembly.loradrop import export_lora_drop
        from ..runtime.loradrop import LoRADropFit
        export_lora_drop(load_model(MODEL, reference_engine().kind), LoRADropFit.parse("rank=8,cycle=4"), out)
    return out


def dump(data: dict, path: Path) -> None:
    """JSON with one line per prompt's ids (readable diffs, small files)."""
    body = json.dumps({k: v for k, v in data.items() if k != "configs"}, indent=1)[:-2]
    rows = ",\n".join(f'  {json.dumps(key)}: [\n' + ",\n".join("   " + json.dumps(s) for s in seqs) + "\n  ]"
                      for key, seqs in data["configs"].items())
    path.write_text(f'{body},\n "configs": {{\n{rows}\n }}\n}}\n')


def mark_equals_plain(backend: str, data: dict) -> None:
    """equals_plain[key]: every prompt's output equals its target's plain output (None before plain is recorded)."""
    for key, seqs in data["configs"].items():
        target, _ = split_key(backend, key)
        plain = data["configs"].get(config_key(backend, target, "none"))
        data["equals_plain"][key] = None if plain is None else seqs == plain


# CPU features that select different quantised kernels in ONNX Runtime's MLAS and in llama.cpp (built for this CPU's
# SIMD by scripts/install.sh): their greedy outputs differ by them, so their recordings are kept per signature:
# <backend>.json (avx2: AMD EPYC, where they were first recorded) and <backend>@<signature>.json for the others.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
CPU_DEPENDENT = ("onnx", "llamacpp")


def kernel_signature(flags=None) -> str:
    """"avx2" | "avx2-avx512f-avx512_vnni-avx_vnni-amx_int8" (this CPU's, or the given flags')."""
    from ..assembly.environment import cpu_info
    flags = set(cpu_info()[1] if flags is None else flags)
    return "-".join(f for f in KERNEL_FLAGS if f in flags)


def golden_file(backend: str, out_dir: Path, signature: str | None = None) -> Path:
    """Where a backend's recording lives; CPU-dependent backends have one per kernel signature."""
    sig = kernel_signature() if signature is None else signature
    if backend not in CPU_DEPENDENT or sig == "avx2":
        return out_dir / f"{backend}.json"
    return out_dir / f"{backend}@{sig}.json"


def record(backend: str, out_dir: Path, n_prompts: int, tokens: int, only: set[str] | None = None,
           threads: int | None = None, log=print) -> dict:
    threads = threads or THREADS[backend]
    path = golden_file(backend, out_dir)
    loaded = {t.name: load_target(backend, t, threads=threads) for t in PLAN[backend]}
    first = next(iter(loaded.values()))
    qids, prompts = golden_prompts(first.model.tokenizer, n_prompts)
    head = {"backend": backend, **inputs_of(backend, loaded), "prompts": n_prompts, "tokens": tokens, "k": K,
            "adaptive_k": ADAPTIVE_K, "threads": threads, "prompt_qids": qids, "prompt_ids_sha256": ids_sha256(prompts),
            "kernels": kernel_signature()}
    data = {**head, "configs": {}, "equals_plain": {}, "seconds": {}, "refused": {}}
    if only is not None and path.is_file():
        old = json.loads(path.read_text())
        if any(old.get(k) != v for k, v in head.items()):
            raise SystemExit(f"{path}: recorded with other inputs; re-record it whole (without --only)")
        data = {**old, **head}
    plain_key = {t.name: config_key(backend, t, "none") for t in PLAN[backend]}
    for t in PLAN[backend]:
        for config in t.configs:
            key = config_key(backend, t, config)
            if only is not None and key not in only and config not in only:
                continue
            t0 = time.perf_counter()
            try:
                seqs = decode_config(backend, loaded[t.name], config, prompts, tokens, golden_dir=out_dir,
                                     threads=threads)
            except (ValueError, FileNotFoundError) as e:  # refused at start-up by the current code
                data["refused"][key] = str(e)
                for part in ("configs", "equals_plain", "seconds"):
                    data[part].pop(key, None)
                log(f"{backend} {key}: refused: {e}")
                dump(data, path)
                continue
            data["refused"].pop(key, None)
            data["configs"][key] = seqs
            data["seconds"][key] = round(time.perf_counter() - t0, 1)
            plain = data["configs"].get(plain_key[t.name])
            mark_equals_plain(backend, data)
            n_same = None if plain is None else sum(a == b for a, b in zip(seqs, plain))
            log(f"{backend} {key}: {data['seconds'][key]:.1f} s, identical to plain {n_same}/{len(seqs)}")
            dump(data, path)
    return data


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for <backend>.json (tests/golden)")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--backend", nargs="+", choices=list(PLAN), default=list(PLAN))
    ap.add_argument("--only", nargs="+", default=None, help="re-record these keys (or config strings) only")
    ap.add_argument("--threads", type=int, default=None, help=f"default per backend: {THREADS}")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if any("loradrop" in c for b in a.backend for t in PLAN[b] for c in t.configs):
        ensure_corrections(a.out)
    for backend in a.backend:
        t0 = time.perf_counter()
        record(backend, a.out, a.prompts, a.tokens, None if a.only is None else set(a.only), a.threads,
               log=lambda m: print(m, flush=True))
        print(f"{backend}: {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
