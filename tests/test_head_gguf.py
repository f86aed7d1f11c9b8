"""A draft head as llama.cpp's eagle3 GGUF (export/head_gguf.py, `specedge export HEAD_DIR --format gguf`): the file
read back with gguf-py (keys, every tensor's name, shape, type and values, Q/K rows in llama.cpp's RoPE order, d2t),
the permutation's meaning under both RoPE conventions, the command line and what it refuses. Upstream llama-server
running it (the same answer as plain greedy, the draft candidates it logs equal to our head's) is checked by
`python -m specedge.perf.eagle3_check` where that binary is built (CI does not build it: ~10 minutes)."""
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType, GGUFReader

from specedge.apps.cli import cli
from specedge.export.head_gguf import write_head_gguf
from specedge.models.gguf_in import open_gguf
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.drafters.head_model import random_head, save_head

TAPS = (1, 2, 3)
SHAPE = dict(n_heads=4, n_kv_heads=2, head_dim=16, ffn=96, vocab_draft=60, seed=5)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A 4-layer tiny llama GGUF (float32) and a head for it, saved."""
    root = tmp_path_factory.mktemp("eagle3")
    gguf = write_tiny_gguf(root / "tiny.gguf", n_layers=4, seed=0)
    cfg, arrays = random_head(open_gguf(gguf).config, TAPS, **SHAPE)
    return gguf, save_head(root / "head", cfg, arrays)


def stored(head_dir) -> dict:
    with np.load(head_dir / "head.npz") as z:
        return {n: z[n] for n in z.files}


def interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Written out index by index: within a head, our row j*hd/2 + i (rotate-half) is llama.cpp's row 2i + j."""
    out = np.empty_like(w)
    hd = w.shape[0] // n_heads
    for h in range(n_heads):
        for i in range(hd // 2):
            for j in range(2):
                out[h * hd + 2 * i + j] = w[h * hd + j * hd // 2 + i]
    return out


def field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_the_gguf_holds_the_head_under_llama_cpp_s_names_and_keys(tmp_path, target, dtype):
    gguf, head_dir = target
    path = write_head_gguf(tmp_path / "head.gguf", head_dir, open_gguf(gguf), dtype=dtype)
    r, a, src = GGUFReader(path), stored(head_dir), GGUFReader(gguf)
    keys = {"general.architecture": "eagle3", "eagle3.block_count": 1, "eagle3.embedding_length": 64,
            "eagle3.feed_forward_length": 96, "eagle3.attention.head_count": 4, "eagle3.attention.head_count_kv": 2,
            "eagle3.attention.key_length": 16, "eagle3.attention.value_length": 16, "eagle3.rope.dimension_count": 16,
            "eagle3.rope.freq_base": 10000.0, "eagle3.vocab_size": 301, "eagle3.context_length": 256,
            "eagle3.target_layers": [1, 2, 3], "eagle3.target_hidden_size": 64, "eagle3.norm_before_residual": False}
    assert {k: field(r, k) for k in keys} == keys
    assert field(r, "eagle3.attention.layer_norm_rms_epsilon") == pytest.approx(open_gguf(gguf).config.rms_eps)
    tokenizer = sorted(k for k in src.fields if k.startswith("tokenizer."))
    assert tokenizer and all(field(r, k) == field(src, k) for k in tokenizer)
    want = {"fc.weight": a["fc"], "blk.0.attn_norm.weight": a["input_norm"],
            "blk.0.attn_norm_2.weight": a["hidden_norm"], "blk.0.attn_q.weight": interleaved(a["wq"], 4),
            "blk.0.attn_k.weight": interleaved(a["wk"], 2), "blk.0.attn_v.weight": a["wv"],
            "blk.0.attn_output.weight": a["wo"], "blk.0.ffn_norm.weight": a["post_norm"],
            "blk.0.ffn_gate.weight": a["w_gate"], "blk.0.ffn_up.weight": a["w_up"],
            "blk.0.ffn_down.weight": a["w_down"], "output_norm.weight": a["norm"], "output.weight": a["lm_head"],
            "d2t": a["d2t"]}
    assert sorted(t.name for t in r.tensors) == sorted(want)
    matrix = GGMLQuantizationType.F16 if dtype == "f16" else GGMLQuantizationType.F32
    for t in r.tensors:
        w = want[t.name]
        kind = (GGMLQuantizationType.I64 if t.name == "d2t" else GGMLQuantizationType.F32 if w.ndim == 1
                else matrix)
        assert t.tensor_type == kind, t.name
        assert [int(n) for n in t.shape] == list(w.shape[::-1]), t.name  # GGUF ne: innermost first
        np.testing.assert_array_equal(t.data, w, err_msg=t.name)  # float16 on disk: exact in F16 and F32
    d2t = next(t for t in r.tensors if t.name == "d2t").data
    assert d2t.dtype == np.int64 and len(set(d2t.tolist())) == 60 and d2t.max() < 301  # absolute target ids


def test_interleaved_rope_on_the_permuted_rows_gives_our_attention_scores_at_positions_one_earlier(target):
    """llama.cpp's eagle3 ropes pairs (2i, 2i+1) (LLAMA_ROPE_TYPE_NORM) at position t; our head rotates halves at
    t + 1. Every q.k score, so the attention, is the same."""
    a = {n: v.astype(np.float64) for n, v in stored(target[1]).items()}
    hd, theta = 16, 10000.0
    inv = theta ** (-np.arange(0, hd, 2) / hd)

    def half(x, p):
        c, s = np.cos(p * inv), np.sin(p * inv)
        return np.concatenate([x[:hd // 2] * c - x[hd // 2:] * s, x[hd // 2:] * c + x[:hd // 2] * s])

    def pairs(x, p):
        c, s = np.cos(p * inv), np.sin(p * inv)
        out = np.empty_like(x)
        out[0::2], out[1::2] = x[0::2] * c - x[1::2] * s, x[0::2] * s + x[1::2] * c
        return out

    rng = np.random.default_rng(0)
    u, v = rng.standard_normal(128), rng.standard_normal(128)
    q, k = a["wq"] @ u, a["wk"] @ v
    qp, kp = interleaved(a["wq"], 4) @ u, interleaved(a["wk"], 2) @ v
    for pq, pk in ((5, 3), (9, 9), (40, 0)):
        for h in range(4):
            ours = half(q[h * hd:(h + 1) * hd], pq + 1) @ half(k[h // 2 * hd:(h // 2 + 1) * hd], pk + 1)
            theirs = pairs(qp[h * hd:(h + 1) * hd], pq) @ pairs(kp[h // 2 * hd:(h // 2 + 1) * hd], pk)
            assert theirs == pytest.approx(ours, rel=1e-9, abs=1e-9)


# -- the command line ------------------------------------------------------------------------------------------
def export(*args):
    return CliRunner().invoke(cli, ["export", *map(str, args)])


def test_export_writes_beside_the_head_and_says_how_to_run_it(tmp_path, target):
    gguf, head_dir = target
    r = export(head_dir, "--format", "gguf", "--target", gguf)
    out = head_dir.parent / f"{head_dir.name}-eagle3.f16.gguf"
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(out) and GGUFReader(out).fields["general.file_type"].contents() == 1
    assert f"llama-server -m {gguf} -md {out} --spec-type draft-eagle3" in r.stderr
    r = export(head_dir, "--weights", "fp32", "--target", gguf, "--out", tmp_path / "h.gguf")
    assert r.exit_code == 0, r.output
    assert {t.tensor_type for t in GGUFReader(tmp_path / "h.gguf").tensors} == {GGMLQuantizationType.F32,
                                                                                GGMLQuantizationType.I64}


@pytest.mark.parametrize("args, words", [
    (["--layers", "0-1", "--profile", "static"], "--layers, --profile do not apply to a draft head"),
    (["--drafter-vocab", "8"], "--drafter-vocab does not apply to a draft head"),
    (["--format", "onnx"], "a draft head exports to --format gguf"),
    (["--weights", "int8"], "a draft head is written as fp16 or fp32, not int8"),
])
def test_options_that_do_not_apply_to_a_head_are_refused(target, args, words):
    r = export(target[1], "--target", target[0], *args)
    assert r.exit_code == 2 and words in " ".join(r.output.split())


def test_a_target_is_needed_and_must_be_the_head_s(tmp_path, target):
    gguf, head_dir = target
    r = export(head_dir)  # head.json names "tiny": no such catalogue model or file
    assert r.exit_code == 1 and "give its GGUF with --target" in r.output
    other = write_tiny_gguf(tmp_path / "wide.gguf", n_layers=4, d_model=32)
    r = export(head_dir, "--target", other)
    assert r.exit_code == 1 and "hidden size 64 (the target's: 32)" in r.output
    r = export(gguf, "--target", gguf)
    assert r.exit_code == 2 and "is not a draft head directory" in r.output


@pytest.mark.parametrize("arch, taps, words", [
    ("llama", (1, 2, 4), "taps [1, 2, 4] reach 4"),
    ("llama", (1, 3), "it reads 2 taps; eagle3 takes exactly 3"),
    ("qwen2", (1, 2, 3), "the target is qwen2, whose llama.cpp graph exposes no layer inputs"),
])
def test_heads_llama_cpp_cannot_run_are_refused(tmp_path, arch, taps, words):
    gguf = write_tiny_gguf(tmp_path / "t.gguf", arch=arch, n_layers=4)
    head_dir = save_head(tmp_path / "head", *random_head(open_gguf(gguf).config, taps, **SHAPE))
    r = export(head_dir, "--target", gguf)
    assert r.exit_code == 1 and words in r.output and "--drafter head:<dir>" in r.output
    assert not list(tmp_path.glob("*eagle3*"))
