#!/bin/bash
# One device call for the grid walk: smoke check (falls back to the column walk on a
# failure), CUDA tests, the A/B benchmark of both walks at C=64, the AOTI control.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
echo "== smoke"; timeout 120 python3 benchmarks/walk_smoke.py 2>&1 | tee "$OUT/smoke.log" | grep -v Warn | tail -8
if ! grep -q "SMOKE OK" "$OUT/smoke.log"; then export SDM_INDUCTOR_WALK=column; echo "grid walk failed: column walk"; fi
echo "== bench"; timeout 220 python3 benchmarks/bench_cuda.py --configs A,B --chunks 64 --walks ${SDM_INDUCTOR_WALK:-grid},column --no-extras --quick --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | grep -v "^{" | tail -12
echo "== test_cuda"; timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log" | tail -4
echo "== aoti control"; [ -f dyn.pt2 ] && timeout 150 python3 benchmarks/aoti_debug.py control dyn.pt2 2>&1 | grep -v -i warn | tail -6
