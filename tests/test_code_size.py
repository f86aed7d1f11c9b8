"""The product's modules stay small enough to read (STYLE.md): none over 400 lines and no function over 60, unless a
`# size-exception: <reason>` line says why it is kept whole."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("models", "runtime", "export", "assembly", "perf", "apps", "scripts")
MAX_MODULE, MAX_FUNCTION = 400, 60


def _too_big(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    bad = []
    if len(lines) > MAX_MODULE and "# size-exception:" not in text:
        bad.append(f"{path.relative_to(root)}: {len(lines)} lines")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            marked = any("# size-exception:" in lines[i] for i in range(max(first - 3, 0), first))
            if n > MAX_FUNCTION and not marked:
                bad.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {n} lines")
    return bad


def test_no_module_over_400_lines_and_no_function_over_60():
    files = [p for d in PRODUCT for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 100
    assert [b for p in files for b in _too_big(p)] == []


def test_the_size_check_can_fail(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("def f():\n" + "    x = 1\n" * 70 + "\n" * 340)
    assert len(_too_big(long, tmp_path)) == 2
    long.write_text("# size-exception: kept whole on purpose\n# size-exception: here too\ndef f():\n"
                    + "    x = 1\n" * 70)
    assert _too_big(long, tmp_path) == []

