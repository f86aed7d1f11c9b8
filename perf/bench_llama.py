"""llama.cpp baselines for `specedge bench`: llama-cpp-python's own greedy decoding, plain and with
LlamaPromptLookupDecoding, on the same GGUF and the same chat-formatted prompt ids.

Timed per decode step like runtime/decode.py: the first token arrives with the prefill (prefill_s); decode time
runs from the first to the last generated token (EOS counted, as ours counts it) over len - 1 steps, so tokens/s
compare one to one. Outputs can differ from ours on near-ties: llama.cpp's batched prompt evaluation rounds
differently from token-at-a-time (SmolLM2, dev prompt 1: logits 26.49 vs 26.46 batched, 26.41 vs 26.59 with
n_batch=1; our plain greedy picks the latter's argmax), so identity is reported, not required. llama.cpp reports no draft / accept counts, so these configurations carry no
acceptance statistics or time split (Config.instrumented=False).
"""
from __future__ import annotations

import time
from pathlib import Path

from ..runtime.stats import DecodeStats
from .bench import Config, Prompt, rss_mb


def llama_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def llama_configs(gguf: Path, tokenizer, *, ks, max_tokens: int, threads: int, ctx: int = 2048) -> list[Config]:
    """'llama.cpp plain' and one 'llama.cpp prompt-lookup k=K' per k. tokenizer: ours for the same GGUF (its chat
    template and EOS ids; the ids equal llama.cpp's, tests/test_models_llamacpp.py)."""
    try:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        raise ImportError("the llama.cpp baselines need llama-cpp-python: pip install 'specedge[llama]', or pass "
                          "--no-baselines") from None
    size = Path(gguf).stat().st_size
    eos = set(int(e) for e in tokenizer.eos_ids)
    ids_of: dict[str, list[int]] = {}

    def prompt_ids(p: Prompt) -> list[int]:
        if p.text not in ids_of:
            text = tokenizer.apply_chat_template([{"role": "user", "content": p.text}])
            ids_of[p.text] = [int(i) for i in tokenizer.encode(text)]
        return ids_of[p.text]

    def make(draft_k: int | None) -> Config:
        before = rss_mb()
        draft = None if draft_k is None else LlamaPromptLookupDecoding(num_pred_tokens=draft_k)
        # Prompt lookup turns on logits_all, whose score buffer llama-cpp-python 0.3.36 sizes by n_batch: a prompt
        # longer than n_batch then fails ("could not broadcast ... into shape (0,)"), so one batch holds the context.
        batch = {} if draft is None else {"n_batch": ctx}
        llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=ctx, n_threads=threads, n_threads_batch=threads,
                              draft_model=draft, verbose=False, **batch)

        def run(p: Prompt) -> tuple[list[int], DecodeStats]:
            ids = prompt_ids(p)
            llm.reset()
            out: list[int] = []
            t0 = t_first = time.perf_counter()
            for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
                out.append(int(tok))
                if len(out) == 1:
                    t_first = time.perf_counter()
                if tok in eos or len(out) >= max_tokens:
                    break
            # the first token comes with the prefill; the rest are one decode step each (ours: one forward each)
            s = DecodeStats(prefill_s=t_first - t0, decode_s=time.perf_counter() - t_first,
                            n_generated=max(len(out) - 1, 0), n_prefilled=len(ids), n_calls=1,
                            first_token_s=t_first - t0, first_in_prefill=min(len(out), 1))
            if draft_k is None:  # one forward per token; prompt lookup's forwards are not reported
                s.n_target_forwards = s.n_emitted = s.n_generated
            return (out[:-1] if out and out[-1] in eos else out), s

        name = "none" if draft_k is None else "prompt-lookup"
        return Config("llama.cpp", name, draft_k or 0, False, run, size, load_mb=rss_mb() - before,
                      instrumented=False, family="llama.cpp")

    return [make(None)] + [make(k) for k in ks]
