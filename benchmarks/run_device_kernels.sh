#!/bin/bash
# One device call for issue 3: CUDA tests, then the benchmark. Logs under $OUT.
# run with carry [".whl"]; usage: bash benchmarks/run_device_kernels.sh [bench args]
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py ${TEST_K:+-k "$TEST_K"} 2>&1 | tee "$OUT/test_cuda.log" | tail -25
fi
timeout ${BENCH_TIMEOUT:-420} python3 benchmarks/bench_cuda.py --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
