#!/usr/bin/env bash
# Reproduces docs/accelerators.md on the GPU machine: carried parts in /tmp/x (onnxruntime-gpu 1.31.1 wheel as an
# xz tar split in 52 MiB parts, the SmolLM2 Q4_1 GGUF in 2 parts, gguf/platformdirs wheels), the worktree as
# out/issue21/pkg/specedge; the OpenVINO plugin wheel installed into /tmp/site for the openvino tests/bench.
# Device-side: assemble onnxruntime-gpu + the SmolLM2 GGUF from the carried parts (in /tmp/x), then tests + bench.
# usage: bash gpu_run.sh STEP  (STEP: setup | test | bench | all)
set -u
R=$(pwd)/out/issue21/pkg           # holds specedge/ (the issue21 worktree)
X=/tmp/x; A=/tmp/a; mkdir -p $A
if [ ! -d $X/w/onnxruntime ]; then
  cat $X/ort.part.* > $X/ortgpu.tar.xz && mkdir -p $X/w && tar -xJf $X/ortgpu.tar.xz -C $X/w && rm $X/ortgpu.tar.xz
  cat $X/gguf.part.* > $A/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $X/*.whl
fi
LIBS=$(find / -xdev \( -name 'libcublas.so.13*' -o -name 'libcudart.so.13*' -o -name 'libcudnn.so.9*' -o -name 'libcufft.so.12*' -o -name 'libcurand.so.10*' -o -name 'libnvrtc.so.13*' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd:)
export LD_LIBRARY_PATH=$LIBS:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$X/w:/tmp/site:$R PYTHONUNBUFFERED=1
echo "LIBS=$LIBS"
python3 -c "import onnxruntime as o, specedge; print(o.__version__, o.__file__, o.get_available_providers(), specedge.__file__)"
step=${1:-all}
if [ $step = test ] || [ $step = all ]; then
  (cd $R/specedge && timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_openvino.py 2>&1 | tee $OUT/pytest_cuda.log | tail -25)
fi
if [ $step = export ] || [ $step = all ]; then
  timeout 400 python3 - <<'PY' 2>&1 | tee $OUT/export.log | tail -8
import time
from specedge.models.gguf_in import open_gguf
from specedge.export.onnx_export import DYNAMIC, GPU, ExportProfile, StaticShape, export_gguf_to_onnx
from specedge.export.onnx_linear import WeightFormat
g = open_gguf("/tmp/a/SmolLM2-135M-Instruct.Q4_1.gguf")
for out, prof in (("/tmp/a/smol-gpu", GPU), ("/tmp/a/smol-fp16", DYNAMIC), ("/tmp/a/smol-static", ExportProfile.static(StaticShape(5, 512)))):
    t = time.time(); export_gguf_to_onnx(g, out, WeightFormat.FP16, threads=16, profile=prof)
    print(out, "exported + gated in", round(time.time() - t, 1), "s")
PY
fi
if [ $step = bench ] || [ $step = all ]; then
  timeout 500 python3 -m specedge.perf.accel_bench --targets cuda-fp16=/tmp/a/smol-gpu@cuda cpu16-fp16=/tmp/a/smol-fp16@cpu \
    --threads 16 --widths 1 2 3 4 5 6 8 12 16 24 32 --reps 10 --rounds 3 --decode 128 --prompts 8 --k 8 --max-tokens 128 \
    --out $OUT/bench_smol.json 2>&1 | tee $OUT/bench.log | tail -30
fi
if [ $step = ovbench ]; then
  timeout 400 python3 -m specedge.perf.accel_bench --targets ov-static=/tmp/a/smol-static@openvino:CPU cpu-static=/tmp/a/smol-static@cpu \
    ov-dyn=/tmp/a/smol-fp16@openvino:CPU cpu-dyn=/tmp/a/smol-fp16@cpu --threads 16 --widths 1 2 3 4 5 6 8 --reps 10 --rounds 3 \
    --decode 64 --out $OUT/bench_ov_xeon.json 2>&1 | tee $OUT/bench_ov.log | grep -v -E "^\s*$" | tail -12
fi
