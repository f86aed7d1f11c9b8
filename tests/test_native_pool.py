"""The native engine's thread pool (csrc/native/pool.c) under ThreadSanitizer: tests/native_c/pool_check.c runs
12,000 phases of every size and piece length on 1-4 threads, one worker sometimes slow so the others steal its
share, and checks that every item ran exactly once before its phase returned. TSan reports any data race in the
hand-out (the shares' tagged claims, the phase's fields, the done count)."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "csrc" / "native"


def test_every_item_runs_once_per_phase_with_stealing_and_no_data_race(tmp_path):
    exe = tmp_path / "pool_check"
    cmd = ["cc", "-O1", "-g", "-fsanitize=thread", "-std=gnu11", "-pthread", f"-I{NATIVE}", str(NATIVE / "pool.c"),
           str(ROOT / "tests" / "native_c" / "pool_check.c"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"could not build the pool check with -fsanitize=thread:\n{r.stderr[-3000:]}"
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                       env={"TSAN_OPTIONS": "halt_on_error=1"})
    assert r.returncode == 0 and "ThreadSanitizer" not in r.stderr, (r.stdout[-2000:], r.stderr[-4000:])
    assert "12000 phases, 0 bad items" in r.stdout, r.stdout
