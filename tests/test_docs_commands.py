"""Every `specedge ...` command in README.md and docs/*.md still parses: its subcommand exists and each option and
value is one the command takes (click parses it without running it), so a moved or renamed flag is caught; the
cheap ones run for real on the default model. README.md stays a five-minute read (<= 200 lines)."""
import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```(?:bash|sh|console)?\n(.*?)```", re.S)


def commands(path: Path) -> list[str]:
    """The specedge command lines in a file's code blocks (continuations joined, comments dropped)."""
    out = []
    for block in FENCE.findall(path.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            if line.startswith("specedge "):
                out.append(line)
    return out


def split(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars="|;&")
    lex.whitespace_split, lex.commenters = True, "#"
    args = []
    for tok in lex:
        if tok in ("|", ";", "&", "&&", "||", ">", "2>&1", "->"):  # a pipe, or the docs' "-> what it makes"
            break
        args.append(tok)
    return args[1:]


ALL = [(p.relative_to(ROOT).as_posix(), line) for p in DOCS for line in commands(p)]


def test_the_docs_show_commands():
    assert len(ALL) > 40 and {p for p, _ in ALL} >= {"README.md", "docs/cli.md", "docs/server.md"}


@pytest.mark.parametrize("where, line", ALL, ids=[f"{p}:{i}" for i, (p, _) in enumerate(ALL)])
def test_every_documented_command_parses(where, line):
    name, *rest = split(line)
    ctx = click.Context(cli, info_name="specedge")
    cmd = cli.get_command(ctx, name)
    assert cmd is not None, f"{where}: no command {name!r} in {line!r}"
    try:
        cmd.make_context(name, rest, parent=ctx)
    except click.BadParameter as e:  # a path the docs name but this checkout lacks is not a wrong command
        if "does not exist" not in str(e):
            raise AssertionError(f"{where}: {line!r}: {e.format_message()}") from None
    except click.UsageError as e:
        raise AssertionError(f"{where}: {line!r}: {e.format_message()}") from None


def test_the_readme_is_a_five_minute_read():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for heading in ("## Install", "## Run the main job (one command)", "## Run the tests (one command)"):
        assert heading in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link


@pytest.mark.real
@pytest.mark.parametrize("line", ['specedge tokenize smollm2-135m "Hello world"', "specedge models",
                                  'specedge embed all-minilm-l6-v2 "The cat sat." "A cat was sitting."'])
def test_the_readmes_cheap_commands_run(line):
    assert any(c.split("#")[0].strip() == line for _, c in ALL), f"{line!r} is no longer in the docs"
    r = CliRunner().invoke(cli, split(line))
    assert r.exit_code == 0, r.output
