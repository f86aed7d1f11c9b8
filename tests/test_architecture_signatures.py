"""docs/ARCHITECTURE.md quotes call signatures (`decode(target, prompt, spec, req, *, session, stats)`); each must
match a definition in the package: its parameters in order, the keyword-only ones after `*`, the return type after
`->`. tests/test_layers.py checks that the quoted names exist; this checks what the doc says about them."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("models", "runtime", "export", "assembly", "perf", "apps")
IDENT = re.compile(r"[A-Za-z_]\w*")


def _definitions() -> dict[str, list[ast.AST]]:
    """Every function and class of the package by name (methods too: `forward` has one per backend), and every
    field declared as a Callable (BackendInfo.check: its signature is the caller's word, not checked here)."""
    out: dict[str, list[ast.AST]] = {}
    for d in PACKAGES:
        for path in (ROOT / d).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    out.setdefault(node.name, []).append(node)
                elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                      and "Callable" in ast.unparse(node.annotation)):
                    out.setdefault(node.target.id, []).append(node)
    return out


def _split(args: str) -> list[str]:
    """Top-level comma-separated parts of an argument list."""
    parts, depth, cur = [], 0, ""
    for ch in args:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()] if cur.strip() else parts


def _params(node: ast.AST) -> tuple[list[tuple[str, str, bool]], list[str], str | None, bool, str]:
    """(positional (name, annotation, has default), keyword-only names, **name, *args?, return annotation); a class:
    its __init__'s, else its annotated fields (a dataclass)."""
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            fields = [(n.target.id, ast.unparse(n.annotation), n.value is not None) for n in node.body
                      if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
            return fields, [], None, False, node.name
        node = init
    a = node.args
    pos = a.posonlyargs + a.args
    defaults = [False] * (len(pos) - len(a.defaults)) + [True] * len(a.defaults)
    positional = [(p.arg, ast.unparse(p.annotation) if p.annotation else "", d) for p, d in zip(pos, defaults)
                  if p.arg not in ("self", "cls")]
    ret = ast.unparse(node.returns) if getattr(node, "returns", None) else ""
    return (positional, [p.arg for p in a.kwonlyargs], a.kwarg.arg if a.kwarg else None, a.vararg is not None,
            ret if not isinstance(node, ast.ClassDef) else "")


def _matches(tokens: list[str], ret: str | None, node: ast.AST) -> bool:
    if isinstance(node, ast.AnnAssign):  # a Callable field
        return True
    positional, kwonly, kwarg, varargs, returns = _params(node)
    names = [p[0] for p in positional]
    i, star = 0, False
    for t in tokens:
        if t == "...":
            return ret is None or ret in returns
        if t == "*":
            star = True
            continue
        if t.startswith("**"):
            if kwarg is None:
                return False
            continue
        if t.endswith("=") or "=" in t:
            if t.split("=")[0] not in names + kwonly:
                return False
            continue
        head = IDENT.match(t)[0]  # `DrafterInputs(target, ...)`: its type
        if star:
            if head not in kwonly:
                return False
            continue
        if i >= len(positional):
            return False
        name, annotation, _ = positional[i]
        if head != name and not (head[0].isupper() and re.search(rf"\b{head}\b", annotation)):
            return False
        i += 1
    if any(not has_default for _, _, has_default in positional[i:]) and not varargs:
        return False  # the doc leaves out a required parameter
    if ret is not None and ret.startswith("("):  # `-> (masks, n, forced)`: a tuple of that many
        inner = re.fullmatch(r"(?:tuple|Tuple)\[(.*)\]", returns)
        return inner is not None and len(_split(inner[1])) == len(_split(ret[1:-1]))
    return ret is None or re.search(rf"\b{ret}\b", returns) is not None


def _quoted_calls(text: str):
    """(span, name, argument tokens, return type or None) of each backticked `name(args) [-> Ret]` whose arguments
    are names (an expression such as `cache.rollback(base + 1)` is an example, not a signature)."""
    for span in sorted(set(re.findall(r"`([^`\n]+)`", text))):
        head = re.match(r"(?:[\w.]+\.)?([A-Za-z_]\w*)\(", span.strip())
        if not head:
            continue
        rest, depth = span.strip()[head.end():], 1
        close = next((i for i, ch in enumerate(rest) if (depth := depth + (ch == "(") - (ch == ")")) == 0), None)
        tail = re.fullmatch(r"\s*(?:->\s*(.+))?", rest[close + 1:]) if close is not None else None
        if tail is None:
            continue
        m = (None, head[1], rest[:close], tail[1])
        if not m[2].strip() or m[2].strip() == "...":
            continue
        tokens = _split(m[2])
        if not all(re.fullmatch(r"\*|\.\.\.|\*\*\w+|\w+=\S*|[A-Za-z_]\w*(\(.*\))?", t) for t in tokens):
            continue
        ret = m[3].strip() if m[3] else None
        if ret and not IDENT.fullmatch(ret) and not (ret.startswith("(") and ret.endswith(")")):
            ret = None  # `-> [T, V]`: a shape, not a type
        yield span, m[1], tokens, ret


def _signature_problems(text: str, defs: dict[str, list[ast.AST]]) -> list[str]:
    bad = []
    for span, name, tokens, ret in _quoted_calls(text):
        candidates = defs.get(name, [])
        if candidates and not any(_matches(tokens, ret, node) for node in candidates):
            bad.append(f"`{span}` matches none of the {len(candidates)} definitions of {name}")
    return bad


def test_signatures_quoted_in_the_architecture_doc_match_the_code():
    defs = _definitions()
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert len(list(_quoted_calls(text))) >= 15  # the doc quotes signatures, and they are all checked
    assert _signature_problems(text, defs) == []


def test_the_signature_check_catches_a_wrong_order_a_missing_parameter_and_a_wrong_return_type():
    defs = _definitions()
    wrong = ("`decode(prompt, target, spec, req, *, session, stats)` `decode(target, *, session)` "
             "`decode(target, prompt, spec, req, *, sessions, stats)` `model_ref(text) -> ModelSettings` "
             "`open_decoder(ModelSettings, DecodeSettings, plans=)` `allowed(draft) -> (masks [n+1, V], n)`")
    assert len(_signature_problems(wrong, defs)) == 6, _signature_problems(wrong, defs)
    right = "`decode(target, prompt, spec, req, *, session, stats)` `model_ref(text) -> ModelRef`"
    assert _signature_problems(right, defs) == []


def _engine_tests(path: Path, engines: set[str]) -> list[str]:
    """Comparisons of a value with a BackendKind member or an engine's name: `kind is BackendKind.ONNX`,
    `backend == "onnx"`, `engine in ("llamacpp", "ik")`."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        names = " ".join(ast.unparse(x) for x in [node.left, *node.comparators])
        if not re.search(r"backend|engine|kind|name|BackendKind", names, re.I):
            continue  # `fmt != "onnx"`: an export format, not an engine
        for side in [node.left, *node.comparators]:
            parts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            for p in parts:
                member = (isinstance(p, ast.Attribute) and isinstance(p.value, ast.Name)
                          and p.value.id == "BackendKind")
                if member or (isinstance(p, ast.Constant) and p.value in engines):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    return bad


def test_the_apps_assembly_and_perf_test_no_engine_by_name():
    """ARCHITECTURE.md: the apps, the assembly layer and perf/ test no BackendKind member; they ask the registry."""
    from specedge.runtime.backends import BackendKind
    engines = {k.value for k in BackendKind}
    bad = [b for d in ("apps", "assembly", "perf") for p in sorted((ROOT / d).rglob("*.py"))
           for b in _engine_tests(p, engines)]
    assert bad == []
    probe = ROOT / ".pytest_cache" / "engine_probe.py"
    probe.parent.mkdir(exist_ok=True)
    probe.write_text("x = kind is BackendKind.ONNX or backend == 'onnx' or engine in ('ik', 'x')\n")
    assert len(_engine_tests(probe, engines)) == 3  # the check can fail
