"""Can onnxruntime's CUDA graphs run the GPU graph at its fixed width? (issue 31 A; a probe, not product code)

    python scripts/device/cuda_graph_probe.py ARTIFACT [--width 16] [--ctx 128] [--calls 200]

Opens the artifact's model twice on CUDA, once plainly and once with enable_cuda_graph, binds every input and output
to device OrtValues of fixed shape (input_ids [1, W], seqlens_k, total_sequence_length, the KV buffers shared as
past/present, logits [W, V]), updates them in place between runs, and compares the logits and the time per call.
Variants: total_sequence_length = cache length + W (as the backend passes it) or the buffer's capacity (a constant:
GroupQueryAttention reads it on the host, so a captured graph keeps the value it was captured with).
"""
import argparse
import json
import sys
import time

import numpy as np
import onnxruntime as ort


# size-exception: a one-off GPU probe (issue 31), not product code: one linear script read top to bottom
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    man = json.load(open(f"{a.artifact}/manifest.json"))
    cfg, io = man["config"], man["io"]
    n_layers, n_kv, hd, vocab = cfg["n_layers"], cfg["n_kv_heads"], cfg["head_dim"], cfg["vocab_size"]
    cap = a.ctx + 64 + a.width
    rng = np.random.default_rng(0)
    toks = rng.integers(0, vocab, a.ctx + 64).astype(np.int64)
    results = {}
    for graph, total_is_cap in ((False, False), (False, True), (True, False), (True, True)):
        key = f"graph={graph} total={'capacity' if total_is_cap else 'length+W'}"
        opts = ort.SessionOptions()
        prov = [("CUDAExecutionProvider", {"device_id": 0, "enable_cuda_graph": "1" if graph else "0"})]
        try:
            sess = ort.InferenceSession(f"{a.artifact}/model.onnx", sess_options=opts,
                                        providers=[p for p, _ in prov], provider_options=[o for _, o in prov])
        except Exception as e:  # noqa: BLE001 - a probe reports what failed
            print(f"{key}: session failed: {e}", flush=True)
            continue
        b = sess.io_binding()
        kv = []
        for i in range(n_layers):
            for past, present in (("past_key", "present_key"), ("past_value", "present_value")):
                buf = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, n_kv, cap, hd), np.float16), "cuda", 0)
                b.bind_ortvalue_input(io[past].format(i=i), buf)
                b.bind_ortvalue_output(io[present].format(i=i), buf)
                kv.append(buf)
        ids = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, a.width), np.int64), "cuda", 0)
        seq = ort.OrtValue.ortvalue_from_numpy(np.zeros(1, np.int32), "cuda", 0)
        total = ort.OrtValue.ortvalue_from_numpy(np.array(0, np.int32))  # GroupQueryAttention reads it on the host
        logits = ort.OrtValue.ortvalue_from_numpy(np.zeros((a.width, vocab), np.float32), "cuda", 0)
        b.bind_ortvalue_input(io["input_ids"], ids)
        b.bind_ortvalue_input(io["seqlens_k"], seq)
        b.bind_ortvalue_input(io["total_length"], total)
        b.bind_ortvalue_output(io["logits"], logits)
        ro = ort.RunOptions()
        if graph:
            ro.add_run_config_entry("gpu_graph_id", "1")
        rows, times, copies, length = [], [], [], 0
        try:
            for step in range(a.ctx // a.width + 64):  # prefill in chunks of W, then one token per call
                n = a.width if length + a.width <= a.ctx else 1
                chunk = toks[length:length + n]
                ids.update_inplace(np.concatenate([chunk, np.full(a.width - n, chunk[-1])]).reshape(1, a.width))
                seq.update_inplace(np.array([length + a.width - 1], np.int32))
                total.update_inplace(np.array(cap if total_is_cap else length + a.width, np.int32))
                t0 = time.perf_counter()
                sess.run_with_iobinding(b, ro)
                t1 = time.perf_counter()
                out = logits.numpy()
                times.append(time.perf_counter() - t0)
                copies.append(time.perf_counter() - t1)
                if n == 1:
                    rows.append(out[0].copy())
                length += n
        except Exception as e:  # noqa: BLE001
            print(f"{key}: run failed at step {len(times)}: {type(e).__name__}: {e}", flush=True)
            continue
        decode = times[-48:]
        results[key] = np.stack(rows)
        print(f"{key}: one-token calls at width {a.width}: median {1e3 * np.median(decode):.3f} ms, "
              f"min {1e3 * min(decode):.3f} ms ({len(rows)} rows); of it the logits' copy to the host "
              f"[{a.width}, {vocab}] float32: median {1e3 * np.median(copies[-48:]):.3f} ms", flush=True)
    base = results.get("graph=False total=length+W")
    for key, rows in results.items():
        if base is not None:
            print(f"{key} vs graph=False total=length+W: max |d| {np.abs(rows - base).max():.3g}, top-1 equal "
                  f"{(rows.argmax(-1) == base.argmax(-1)).mean():.2%}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
