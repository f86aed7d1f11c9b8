"""perf/chat_ttft.py end to end on a tiny model: with reuse a turn prefills only what is new, with the reset
baseline it prefills the whole conversation (the timings are meaningless here; README has the real run)."""
import json

from specedge.models.tiny import write_tiny_gguf
from specedge.perf import chat_ttft


def test_chat_ttft_reports_prefill_with_and_without_reuse(tmp_path, capsys):
    path = write_tiny_gguf(tmp_path / "t.gguf", seed=0, n_layers=1, context=1024)
    out = tmp_path / "ttft.json"
    chat_ttft.main(["--targets", f"numpy:{path}", "--turns", "3", "--max-tokens", "4", "--reps", "1",
                    "--ctx", "1024", "--out", str(out)])
    r = json.loads(out.read_text())["results"][f"numpy:{path}"]
    reuse, reset = r["reuse"], r["reset"]
    assert [a["prompt_tokens"] for a in reuse] == [b["prompt_tokens"] for b in reset]  # greedy: same conversation
    assert all(b["n_prefilled"] == b["prompt_tokens"] - 1 and b["reused"] == 0 for b in reset)
    assert reuse[0]["reused"] == 0
    for a in reuse[1:]:
        assert a["reused"] > 0 and a["n_prefilled"] + a["reused"] == a["prompt_tokens"] - 1
        assert a["n_prefilled"] < a["prompt_tokens"] // 2
    assert all(x["ttft_s"] > 0 for x in reuse + reset)
    assert "| 3 |" in capsys.readouterr().out
