#!/bin/bash
# One device call: the CUDA-marked tests outside test_cuda.py, each file under its own
# time limit, verbose logs under $OUT (kept even when a limit cuts a segment).
# run with carry [".whl"]: bash benchmarks/device_check.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
seg() {  # seg NAME LIMIT pytest-args...
  local name=$1 limit=$2; shift 2
  echo "== $name"; local t0=$SECONDS
  timeout "$limit" python3 -m pytest -v -rA --tb=short -p no:cacheprovider "$@" > "$OUT/$name.log" 2>&1
  echo "rc $? in $((SECONDS - t0)) s"; grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$OUT/$name.log" | grep -v "^tests.*::.*PASSED \[" | tail -8
}
seg lowerings_nn 200 -m cuda tests/test_lowerings.py tests/test_nn.py --durations=10
seg examples_cuda 150 -k "export_aoti or (on_cuda and train_recall)" tests/test_examples.py --durations=10
seg aoti_cuda 200 -m cuda tests/test_export_aoti.py --durations=10
