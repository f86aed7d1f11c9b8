"""Every ISA of the native engine against its portable C, bit for bit, through a C harness (tests/native_c/isa_check.c)
linked with csrc/native: packed matmuls of every format at widths 1..16, the float primitives, and a small model's
logits at 1 and 2 threads. Built natively (portable vs AVX2 vs AVX-512 on x86) and for AArch64, run under
qemu-user (portable vs NEON; and on a CPU without the dot product, where NEON's matmul falls back to the portable
C). The AArch64 leg fails rather than skips without its tools: CI installs them (.ci/run). `slow`: two C builds."""
import shutil
import subprocess
from pathlib import Path

import pytest

import cbuild  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for p in sorted((ROOT / "csrc" / "native").glob("*.c")) if p.name != "module.c"]  # module.c: Python's
HARNESS = ROOT / "tests" / "native_c" / "isa_check.c"
FLAGS = ["-O2", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-pthread"]  # setup.py's
CROSS, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
APT = "apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"


def build(cc: str, out: Path) -> None:
    failed = cbuild.build(cc, [*FLAGS, f"-I{ROOT / 'csrc' / 'native'}"], [*SOURCES, HARNESS], out, link=["-lm"])
    assert not failed, f"{cc} could not build the ISA harness:\n{failed}"


def run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)} found differences (or crashed):\n{r.stdout[-3000:]}{r.stderr[-2000:]}"
    assert "0 mismatch(es)" in r.stdout, r.stdout
    return r.stdout


@pytest.mark.slow
def test_every_isa_of_this_cpu_is_the_portable_c_bit_for_bit(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc or gcc) on PATH")
    build(cc, tmp_path / "isa_check")
    out = run([str(tmp_path / "isa_check")])
    checked = int(out.split(" isa(s) checked")[0].rsplit("\n", 1)[-1])
    assert checked >= 2 or "cpu isa: portable" in out, out  # the CPU's SIMD path was compared, not only portable


@pytest.mark.slow
def test_neon_is_the_portable_c_bit_for_bit_under_qemu(tmp_path):
    missing = [tool for tool in (CROSS, QEMU) if shutil.which(tool) is None]
    if not Path(SYSROOT, "lib").is_dir():
        missing.append(f"{SYSROOT} (the arm64 C library)")
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: the AArch64 leg needs them ({APT}; .ci/run installs them)")
    exe = tmp_path / "isa_check_arm64"
    build(CROSS, exe)
    out = run([QEMU, "-L", SYSROOT, str(exe)])  # qemu's default CPU has every extension, the dot product included
    assert "cpu isa: neon\n" in out and "neon: bitwise equal to portable" in out, out
    out = run([QEMU, "-cpu", "cortex-a72", "-L", SYSROOT, str(exe)])  # ARMv8.0: NEON without sdot
    assert "cpu isa: neon (no dotprod)" in out and "neon: bitwise equal to portable" in out, out
