"""Dev-set loading: round-robin spreading over categories or Spec-Bench's six tasks."""
import json

from specedge.assembly.devset import load_prompts


def _write(tmp_path, cats):
    path = tmp_path / "dev.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"q{i}"]}) + "\n"
                            for i, c in enumerate(cats)))
    return path


def test_task_spread_groups_mt_bench_and_interleaves_its_subcategories(tmp_path):
    path = _write(tmp_path, ["writing", "writing", "coding", "coding", "qa", "qa", "rag", "rag"])
    ps = load_prompts(path, limit=6, by="task")
    assert [p.task for p in ps] == ["mt_bench", "qa", "rag"] * 2
    assert [p.category for p in ps if p.task == "mt_bench"] == ["writing", "coding"]


def test_category_spread_is_round_robin(tmp_path):
    path = _write(tmp_path, ["writing", "writing", "coding", "qa"])
    assert [p.qid for p in load_prompts(path, limit=4)] == [0, 2, 3, 1]
    assert [p.qid for p in load_prompts(path, limit=2, spread=False)] == [0, 1]
