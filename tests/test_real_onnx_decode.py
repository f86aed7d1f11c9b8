"""Lossless speculative decoding on the ONNX backend with the real default model (SmolLM2-135M-Instruct Q4_1),
exported once per format (parity-gated) into a temporary directory.

Greedy speculative output must equal plain greedy output for 6 dev prompts x 64 tokens (test_real_decode.PROMPTS:
short, medium and 400-token prompts), with the n-gram drafter and with a model drafter (the same artifact in a second
session), alone and behind prompt lookup (+lookup); each run must see drafts accepted, and rejected unless the
artifact drafts for itself alone. Every divergence
is reported with the target's top-2 margin on the plain path.

The quantized formats are the hard case: int8 activation rounding inside every MatMulNBits turns any rounding
difference between a verify batch and one-token decoding into logit differences up to ~1. Before the attention pad
row (export/onnx_graph.attention, docs/onnx.md "Batch invariance") 16 of the first 20 dev prompts diverged on int8;
the bit-exact property itself is tested on tiny models in every format (test_onnx_backend.py).
"""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specedge.assembly.load import DrafterSpec, load_onnx, make_drafter  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.export.onnx_export import export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.models.catalog import resolve_model  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.request import Request, Speculation
from specedge.runtime.stats import DecodeStats  # noqa: E402
from specedge.runtime.types import SamplingParams  # noqa: E402

from test_real_decode import (  # noqa: E402  (tests/ is on sys.path)
    N_TOKENS, assert_accepted_and_rejected, plain_path_margin, prompts_for)

pytestmark = [pytest.mark.real, pytest.mark.slow]
GREEDY = SamplingParams()
CTX = 512


@pytest.fixture(scope="module", params=["int8", "int4"])
def artifact(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2-onnx") / f"smollm2-135m-onnx-{request.param}"
    export_gguf_to_onnx(open_gguf(resolve_model("smollm2-135m")), out, WeightFormat(request.param), threads=2)
    return out


_PLAIN: dict = {}  # (artifact, prompt) -> plain greedy output, shared by the drafter parametrizations


def greedy(model, prompt, drafter=None, stats=None):
    key = (str(model.path), tuple(int(t) for t in prompt))
    if drafter is None and key in _PLAIN:
        return _PLAIN[key]
    out = [e.token for e in decode(model.backend, prompt, Speculation(drafter, k=4),
                                   Request(GREEDY, max_tokens=N_TOKENS, eos_ids=(), max_context=CTX), stats=stats)]
    if drafter is None:
        _PLAIN[key] = out
    return out


@pytest.mark.parametrize("drafter", ["ngram", "model", "model+lookup"])
def test_onnx_speculative_equals_plain(artifact, drafter):
    model = load_onnx(str(artifact), device="cpu", threads=2)
    spec = DrafterSpec.parse("ngram" if drafter == "ngram" else f"model:{artifact}" + drafter[len("model"):])
    stats = DecodeStats()
    diverged = []
    for i, prompt in enumerate(prompts_for(model)):
        prompt = prompt[:CTX - N_TOKENS - 8]
        plain = greedy(model, prompt)
        fast = greedy(model, prompt, make_drafter(spec, model, ctx=CTX, threads=2, device="cpu"), stats)
        if fast != plain:
            at = next(j for j, (a, b) in enumerate(zip(fast, plain)) if a != b)
            diverged.append((i, at, plain_path_margin(model, np.asarray(prompt), plain, at)))
    print(f"onnx {artifact.name} {drafter}: {stats.summary()}; divergences (prompt, position, top-2 margin): "
          f"{diverged}")
    assert_accepted_and_rejected(stats, drafter)
    assert not diverged, f"speculative output differs from plain greedy: {diverged}"
