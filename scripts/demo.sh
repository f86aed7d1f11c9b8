#!/usr/bin/env bash
# The main job on the default model: install, pull SmolLM2-135M-Instruct, then one command decodes with the fastest
# lossless configuration on this machine. On first use `specedge generate` plans: it exports the model to ONNX int4
# and int8 (parity-gated), measures llama.cpp, ik_llama.cpp and ONNX Runtime with each drafter (within a 90 s
# budget; cached when the machine was quiet), and says what it chose; `--temperature 0 --baseline` also decodes
# plainly on the same engine and reports whether the output is identical (a plan that chose plain decoding says
# there is nothing to compare). Then the plan's full table, and llama.cpp
# plain on the same prompt for comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh .venv llama,ik,onnx,dev
. .venv/bin/activate
specedge pull smollm2-135m
PROMPT=${1:-"Summarize the following in two sentences: Speculative decoding lets a cheap drafter propose several tokens that the target model verifies in one forward pass. Every accepted token saves a full forward pass, and the output is exactly what the target alone would have produced."}
specedge generate smollm2-135m "$PROMPT" --temperature 0 --baseline
specedge plan smollm2-135m
specedge generate smollm2-135m "$PROMPT" --temperature 0 --backend llamacpp --drafter none --stats
