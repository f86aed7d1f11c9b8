# Where n-gram speculative greedy leaves plain greedy on CUDA (SmolLM2 GPU graph), per dev prompt and k.
import numpy as np
from specedge.assembly.load import load_onnx
from specedge.perf.accel_bench import dev_prompts
from specedge.runtime.decode import decode
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.types import SamplingParams
m = load_onnx("/tmp/a/smol-gpu", device="cuda")
ps = dev_prompts(m.tokenizer, 8)
P = SamplingParams()
for k in (1, 2, 4, 8):
    firsts = []
    for p in ps:
        a = [e.token for e in decode(m.backend, p, PLAIN, Request(P, max_tokens=128, eos_ids=()))]
        b = [e.token for e in decode(m.backend, p, Speculation(NgramDrafter(), k=k),
                                     Request(P, max_tokens=128, eos_ids=()))]
        firsts.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None))
    print(f"k={k}: first divergence per prompt (None = identical over 128 tokens): {firsts}", flush=True)
be = m.backend
rng = np.random.default_rng(0)
toks = rng.integers(0, be.config.vocab_size, 40).astype(np.int32)
c1, c2 = be.new_cache(64), be.new_cache(64)
be.forward(toks[:30], c1); be.forward(toks[:30], c2)
batched = be.forward(toks[30:38], c1)
single = np.concatenate([be.forward(toks[j:j + 1], c2) for j in range(30, 38)])
print("CUDA: 8-token verify logits vs 8 one-token calls: max |d|", float(np.abs(batched - single).max()),
      "argmax equal:", bool((batched.argmax(1) == single.argmax(1)).all()))
