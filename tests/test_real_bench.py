"""Issue 5's acceptance run: `specedge bench smollm2-135m --limit 20` from the installed CLI on the real model
writes report.md, a schema-valid results.json and the PNG plots (about 3 minutes on 2 cores)."""
import json
import os
import subprocess
import sys

import pytest

from specedge.perf.bench_report import check_schema

pytestmark = [pytest.mark.real, pytest.mark.slow]


def test_bench_default_run_on_smollm2(tmp_path):
    pytest.importorskip("llama_cpp")  # the default target and the baselines are llama.cpp
    out = tmp_path / "bench"
    # 6 prompts (one per Spec-Bench task, the round-robin order) x 32 tokens: the default configurations, report,
    # schema and plots; measurement-sized runs are perf/ commands (docs/benchmarks.md)
    cmd = [sys.executable, "-m", "specedge.apps.cli", "bench", "smollm2-135m", "--limit", "6", "--max-tokens", "32",
           "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert check_schema(results) == []
    assert [c["label"] for c in results["configs"]] == ["llamacpp plain", "llamacpp ngram k=4", "llama.cpp plain",
                                                        "llama.cpp prompt-lookup k=4"]
    assert all(c["n_prompts"] == 6 and c["tokens_per_s"]["min"] > 0 for c in results["configs"])
    assert len(results["prompts"]) == 6 and len(results["categories"]) >= 6
    assert {p.name for p in out.glob("*.png")} >= {"speedup_by_category.png", "acceptance_by_position.png",
                                                    "mbsu_vs_speedup.png"}
    report = (out / "report.md").read_text()
    assert "llamacpp ngram k=4" in report and results["command"].startswith("specedge bench smollm2-135m")
