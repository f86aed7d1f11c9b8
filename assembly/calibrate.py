"""VocabTrim calibration from a model file: load the target with its fastest engine here and count the tokens of its
greedy completions of the dev-set prompts (export/vocab_trim.py `calibrate` does the counting)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..export.vocab_trim import Calibration, calibrate


def calibrate_model(target: str, *, limit: int | None = 10, max_tokens: int = 64, cache_dir: Path | None = None,
                    threads: int | None = None) -> tuple[np.ndarray, Calibration]:
    """Counts from the target model (catalogue name, .gguf or Hugging Face directory) on the dev-set prompts
    (assembly/devset.py, `limit` spread across categories), with its fastest engine here: llama.cpp on a GGUF when
    llama-cpp-python is installed, else the NumPy reference. returns: (counts [V], provenance)."""
    from ..models.catalog import resolve_model
    from ..assembly.devset import default_devset, load_prompts
    from ..runtime.backends import OpenSettings, gguf_engines, open_backend
    from ..runtime.tokenizer import Tokenizer
    from ..models.gguf_in import open_gguf
    from ..models.hf_in import is_hf_dir, open_hf
    prompts = [p.text for p in load_prompts(limit=limit)]
    if is_hf_dir(target):
        from ..runtime.backends.numpy_ref import NumpyBackend
        hf = open_hf(target)
        tokenizer, engine, backend = Tokenizer(hf.tokenizer_spec()), "numpy", NumpyBackend(hf.load_weights())
    else:
        gguf = open_gguf(resolve_model(target, cache_dir), cache_dir)
        tokenizer = Tokenizer(gguf.tokenizer_spec())
        kind = gguf_engines()[0].kind  # the preferred installed GGUF engine (llama.cpp, else the NumPy reference)
        longest = max(len(tokenizer.chat_ids(t))
                      for t in prompts)
        n_ctx = min(gguf.config.context_length, longest + max_tokens + 8)  # llama.cpp keeps [n_ctx, V] scores
        engine, backend = kind.value, open_backend(kind, gguf, OpenSettings(n_ctx, threads))
    counts, n = calibrate(backend, tokenizer, prompts, max_tokens=max_tokens)
    return counts, Calibration(Path(target).name, engine, len(prompts), max_tokens, n, str(default_devset().name))
