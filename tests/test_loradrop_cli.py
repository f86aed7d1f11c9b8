"""`specedge export --lora-drop`, `--drafter loradrop[:DIR]` (lossless) and `generate --lossy` (labelled) on the
tiny model."""
import json

import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli
from specedge.models.tiny import write_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("loradrop_cli")
    write_tiny_gguf(d / "small.gguf", seed=1, n_layers=1)
    return d, write_tiny_gguf(d / "tiny.gguf", seed=0, n_layers=6)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.slow
def test_export_then_lossless_drafter(tiny):
    d, path = tiny
    r = run("export", path, "--lora-drop", "rank=4,cycle=3", "--out", d / "ld")
    assert r.exit_code == 0, r.output
    section = json.loads((d / "ld" / "lora_drop.json").read_text())["lora_drop"]
    assert section["rank"] == 4 and section["cycle"] == 3 and section["layers"] == [1, 2, 3, 5]
    assert section["calibration"]["source"] == "prompts" and len(section["sha256"]) == 64
    for spec in (f"loradrop:{d / 'ld'}", "loradrop"):
        r = run("generate", path, "the cat sat", "--backend", "numpy", "--drafter", spec, "--k", 4,
                "--max-tokens", 16, "--temperature", 0, "--json", "--baseline")
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
        assert stats["identical_to_baseline"] is True and "lossy" not in stats


@pytest.mark.parametrize("mode", ["loradrop", "entropy-switch:{small},0.5"])
def test_lossy_modes_are_labelled(tiny, mode):
    d, path = tiny
    r = run("generate", path, "the cat sat", "--backend", "numpy", "--lossy", mode.format(small=d / "small.gguf"),
            "--max-tokens", 12, "--json")
    assert r.exit_code == 0, r.output
    assert "warning: lossy" in r.stderr
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["lossy"].startswith("lossy ") and stats["drafter"] == "none"


def test_lossy_errors_are_actionable(tiny):
    d, path = tiny
    r = run("generate", path, "x", "--backend", "numpy", "--lossy", "entropy-switch:nothing")
    assert r.exit_code != 0 and "entropy-switch:<small-model>,<threshold>" in r.output
    r = run("generate", path, "x", "--backend", "numpy", "--drafter", f"loradrop:{d}")
    assert r.exit_code != 0 and "--lora-drop" in r.output
