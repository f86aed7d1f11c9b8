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
# turns on AMX where the CPU advertises it, and AMX tiles fault in these VMs: target AVX-512/VNNI explicitly.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF}"
"$VENV/bin/python" -m pip install ".[$EXTRAS]"
