#!/usr/bin/env bash
# Create (or reuse) a virtualenv and install specedge with the given extras (default: llama,dev).
# Usage: scripts/install.sh [VENV_DIR] [EXTRAS]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
EXTRAS=${2:-llama,dev}
[ -x "$VENV/bin/python" ] || ${PYTHON:-python3} -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# llama-cpp-python compiles from source (~12 min on 2 cores; pip caches the wheel). A -march=native build
# turns on AMX where the CPU advertises it, and AMX tiles fault in these VMs: enable each x86 SIMD level this CPU
# reports in /proc/cpuinfo explicitly and leave AMX off. CMAKE_ARGS from the environment wins.
simd_args() {
  local flags="" args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  local cpuinfo=${SIMD_CPUINFO:-/proc/cpuinfo}   # another file: tests compare this with perf/llama_server_build.py
  [ -r "$cpuinfo" ] && flags=" $(grep -m1 '^flags' "$cpuinfo" | cut -d: -f2) "
  [[ "$flags" == *" avx "* ]] || { echo "-DGGML_NATIVE=ON"; return; }   # not x86 with AVX: let ggml decide
  local pair
  for pair in AVX:avx AVX2:avx2 FMA:fma F16C:f16c AVX512:avx512f AVX512_VBMI:avx512vbmi \
              AVX512_VNNI:avx512_vnni AVX512_BF16:avx512_bf16 AVX_VNNI:avx_vnni; do
    if [[ "$flags" == *" ${pair#*:} "* ]]; then args+=" -DGGML_${pair%%:*}=ON"; else args+=" -DGGML_${pair%%:*}=OFF"; fi
  done
  echo "$args"
}
export CMAKE_ARGS="${CMAKE_ARGS:-$(simd_args)}"
echo "llama-cpp-python CMAKE_ARGS: $CMAKE_ARGS"
# The hf and train extras need torch, but only on the CPU: install a CPU build first (a local CPU wheel where pip's find-links
# has one, e.g. torch 2.13.0+cpu on these machines) so the extra's range is already met and pip does not pull the
# newest CUDA build with several GB of nvidia packages. TORCH_SPEC overrides.
if [[ ",$EXTRAS," == *",hf,"* || ",$EXTRAS," == *",train,"* ]] && ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  "$VENV/bin/python" -m pip install "${TORCH_SPEC:-torch==2.13.0}"
fi
"$VENV/bin/python" -m pip install ".[$EXTRAS]"
