#!/usr/bin/env bash
# Issue 31 A on the lent GPU machine: the fixed-width GPU graph (lossless on CUDA), measured in one process.
# Carried (scripts/device/README in docs/accelerators.md): /tmp/x/part.* = a tar of ortgpu.tar.xz (onnxruntime-gpu
# 1.31.1's files, TensorRT provider dropped), SmolLM2-135M-Instruct.Q4_1.gguf and wheels/ (gguf, platformdirs,
# llguidance), split into 5 pieces that travel in 5 calls. Run from the repository root: bash scripts/device/cuda_fixed.sh
# [probe] (probe: the setup, the SmolLM2 export and the CUDA graph probe only)
set -u
step=${1:-all}
X=/tmp/x; A=/tmp/a; mkdir -p $A /tmp/pkg
if [ ! -d $X/w/onnxruntime ]; then
  cat $X/part.* | tar -xf - -C $X && mkdir -p $X/w && tar -xJf $X/ortgpu.tar.xz -C $X/w && rm -f $X/ortgpu.tar.xz $X/part.*
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $X/wheels/*.whl
fi
ln -sfn "$(pwd)" /tmp/pkg/specedge
LIBS=$(find / -xdev \( -name 'libcublas.so.13*' -o -name 'libcudart.so.13*' -o -name 'libcudnn.so.9*' -o -name 'libcufft.so.12*' -o -name 'libcurand.so.10*' -o -name 'libnvrtc.so.13*' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd:)
export LD_LIBRARY_PATH=$LIBS:${LD_LIBRARY_PATH:-} PYTHONPATH=$X/w:/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)"
python3 -c "import onnxruntime as o, specedge; print('onnxruntime', o.__version__, o.get_available_providers())"
[ $step = all ] && timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_onnx_gpu_graph.py 2>&1 | tee $OUT/pytest.log | tail -8
timeout 200 python3 - <<'PY' 2>&1 | tee $OUT/export.log | tail -4
import time
from specedge.models.gguf_in import open_gguf
from specedge.export.onnx_export import GPU, export_gguf_to_onnx
from specedge.export.onnx_linear import WeightFormat
t = time.time()
r = export_gguf_to_onnx(open_gguf("/tmp/x/SmolLM2-135M-Instruct.Q4_1.gguf"), "/tmp/a/smol-gpu", WeightFormat.FP16,
                        threads=16, profile=GPU)
print("exported + gated in", round(time.time() - t, 1), "s:", r)
PY
timeout 120 python3 scripts/device/cuda_graph_probe.py /tmp/a/smol-gpu 2>&1 | tee $OUT/cuda_graph.log | grep -v "^\s*$" | tail -6
[ $step = all ] || exit 0
timeout 300 python3 -m specedge.perf.accel_bench --targets graph16=/tmp/a/smol-gpu@cuda fixed16=/tmp/a/smol-gpu@cuda,graph=0 \
  own=/tmp/a/smol-gpu@cuda,width=0 --threads 16 --widths 1 2 4 8 9 16 32 --reps 10 --rounds 3 --decode 128 --prompts 8 \
  --k 8 --max-tokens 128 --invariance --out $OUT/bench_graph.json 2>&1 | tee $OUT/bench.log | grep -v -E "^\s*$|W:onnx" | tail -14
timeout 120 python3 -m specedge.perf.accel_bench --targets graph16-k15=/tmp/a/smol-gpu@cuda --threads 16 --widths 1 16 \
  --reps 10 --rounds 2 --decode 128 --prompts 8 --k 15 --max-tokens 128 --out $OUT/bench_k15.json 2>&1 | grep -v -E "^\s*$|W:onnx" | tail -2
timeout 120 python3 -m specedge.apps.cli generate /tmp/a/smol-gpu "Explain speculative decoding in two sentences." --backend onnx \
  --device cuda --no-plan --drafter ngram --k 8 --baseline --temperature 0 --max-tokens 128 --stats 2>&1 | grep -v "W:onnx" | tail -4
# Qwen2.5-Coder-0.5B-Instruct Q4_K_M, carried in 8 more pieces (/tmp/x/qpart.*), when they are there
if [ -f $X/qpart.0 ]; then
  cat $X/qpart.* > $A/qwen05.gguf && rm -f $X/qpart.*
  sha256sum $A/qwen05.gguf | cut -c1-16
  timeout 240 python3 - <<'PY' 2>&1 | tee $OUT/export_qwen.log | tail -3
import time
from specedge.models.gguf_in import open_gguf
from specedge.export.onnx_export import GPU, export_gguf_to_onnx
from specedge.export.onnx_linear import WeightFormat
t = time.time()
r = export_gguf_to_onnx(open_gguf("/tmp/a/qwen05.gguf"), "/tmp/a/qwen-gpu", WeightFormat.FP16, threads=16, profile=GPU)
print("exported + gated in", round(time.time() - t, 1), "s:", r)
PY
  timeout 300 python3 -m specedge.perf.accel_bench --targets qwen-graph16=/tmp/a/qwen-gpu@cuda qwen-fixed16=/tmp/a/qwen-gpu@cuda,graph=0 \
    qwen-own=/tmp/a/qwen-gpu@cuda,width=0 --threads 16 --widths 1 2 4 8 9 16 --reps 10 --rounds 3 --decode 128 --prompts 8 \
    --k 8 --max-tokens 128 --invariance --out $OUT/bench_qwen.json 2>&1 | tee $OUT/bench_qwen.log | grep -v -E "^\s*$|W:onnx" | tail -12
fi
