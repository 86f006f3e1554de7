#!/bin/bash
# GPU verification in a few segments, each under its own time limit; logs under $OUT.
#
#   bash benchmarks/device.sh tests          # every CUDA-marked test (five pytest processes)
#   bash benchmarks/device.sh bench          # benchmarks/bench_cuda.py (configs A and B)
#   bash benchmarks/device.sh walks          # the same at C=128, step against queue walks
#                                            # (the traced path's walks, forward and backward)
#   bash benchmarks/device.sh floor          # benchmarks/floor_cuda.py (B and A at C=128, B at 256)
#   bash benchmarks/device.sh user [A|B]     # benchmarks/bench_user.py (what users call, A and B at C=128,
#                                            # AOTInductor packages included)
#   bash benchmarks/device.sh compile        # benchmarks/bench_compile.py
#   bash benchmarks/device.sh timeline [emitted]
#                                            # benchmarks/tools/call_timeline.py (a lone call's
#                                            # timeline, eager and compiled; emitted: also the
#                                            # eager queue walk and the kernels emitted; files
#                                            # under $OUT)
#   bash benchmarks/device.sh aoti [N [J]] [small]
#                                            # N fresh-process AOTInductor build + load +
#                                            # compare rounds, J at a time (default 3 and 1;
#                                            # ~2 min each), each with its own Inductor cache
#                                            # (a cold build) and seed (weights, inputs,
#                                            # lengths); all rounds log to $OUT/aoti.log (20
#                                            # rounds, 20 at a time: ~5 min on an H100);
#                                            # small: the CI size (--small, as the CUDA test)
#
# Segments run in the order given. The device image has torch 2.11 and no network: the
# test extras (expecttest, hypothesis, ...) travel as wheels in .whl/ (carry [".whl"]) and
# are installed into /tmp/site (make them with `pip download --no-deps --only-binary=:all:
# --python-version 3.12 -d .whl expecttest hypothesis sortedcontainers attrs`: the image's
# python3 is 3.12). Its default C++ compiler is a wrapper whose AOTInductor
# .so files do not link libstdc++ and crash at load, so AOTI builds use /usr/bin/g++.
set -u
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export CXX=/usr/bin/g++
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# an AOTInductor example build that mismatches keeps its package and inputs here
export SDM_AOTI_KEEP_FAILED=$OUT/aoti_failed

run() {  # run NAME LIMIT command...: the log goes to $OUT/NAME.log, a summary to stdout
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc in $((SECONDS - t0)) s"
  grep -E "^(FAILED|ERROR|XFAIL)|passed|failed|^\| |^config|ms|goal|MISMATCH|OK:|rel err|against the CPU" \
    "$OUT/$name.log" | grep -v -i warn | tail -40
  return $rc
}

while [ $# -gt 0 ]; do
  seg=$1; shift
  case $seg in
    tests)   # -v so that a cut run still lists what passed; TESTS_LIMIT: seconds per process
      tl=${TESTS_LIMIT:-560}
      # the kernels' tests in two processes, alternate test ids each (in one process they
      # take ~520 s of the 560 s default)
      ids=$(python3 -m pytest --collect-only -q -p no:cacheprovider -m cuda tests/kernels | grep '::')
      run tests_kernels_1 $tl python3 -m pytest -v -p no:cacheprovider $(echo "$ids" | awk 'NR % 2 == 1') &
      run tests_kernels_2 $tl python3 -m pytest -v -p no:cacheprovider $(echo "$ids" | awk 'NR % 2 == 0') &
      run tests_lowerings $tl python3 -m pytest -v -p no:cacheprovider -m cuda tests/lowerings \
        --ignore tests/lowerings/test_view_banks.py &
      run tests_views $tl python3 -m pytest -v -p no:cacheprovider -m cuda \
        tests/lowerings/test_view_banks.py &
      # (tests/test_fuzz.py has no CUDA tests and needs hypothesis, whose wheel is per Python)
      run tests_rest $tl python3 -m pytest -v -p no:cacheprovider -m cuda --durations=10 tests \
        --ignore tests/kernels --ignore tests/lowerings --ignore tests/test_fuzz.py &
      wait ;;
    bench)
      run bench_cuda 560 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" ;;
    walks)
      run bench_walks 400 python3 benchmarks/bench_cuda.py --chunks 128 --walks step,queue \
        --no-extras --json "$OUT/bench_walks.json" ;;
    floor)
      run floor_128 300 python3 benchmarks/floor_cuda.py --configs B,A
      run floor_256 200 python3 benchmarks/floor_cuda.py --configs B --chunk 256 ;;
    user)   # [CONFIGS]: A,B by default (one config a call: both may not fit in 10 minutes)
      cfgs=A,B
      case ${1:-} in A|B|A,B|B,A) cfgs=$1; shift ;; esac
      run bench_user_${cfgs/,/} 560 python3 benchmarks/bench_user.py --configs $cfgs \
        --chunks 128 --json "$OUT/bench_user_${cfgs/,/}.json" ;;
    compile)
      run bench_compile 560 python3 benchmarks/bench_compile.py --json "$OUT/bench_compile.json" ;;
    timeline)
      extra=""
      [ "${1:-}" = emitted ] && { extra=--emitted; shift; }
      run call_timeline 500 python3 benchmarks/tools/call_timeline.py --out "$OUT" $extra ;;
    aoti)   # a package must match eager in every build: count the rounds that do not
      n=3; j=1
      case ${1:-} in ''|*[!0-9]*) ;; *) n=$1; shift ;; esac
      case ${1:-} in ''|*[!0-9]*) ;; *) j=$1; shift ;; esac
      size=""
      [ "${1:-}" = small ] && { size=--small; shift; }
      # one log for all rounds, each appended as it ends (the device returns few files,
      # and a call cut at its limit keeps what was appended)
      rounds=$(mktemp -d); : > "$OUT/aoti.log"
      for i in $(seq 1 "$n"); do
        ( # rounds side by side compile in one thread each (no worker pool per round)
          [ "$j" -gt 1 ] && export TORCHINDUCTOR_COMPILE_THREADS=1
          export TORCHINDUCTOR_CACHE_DIR=/tmp/aoti_cache_$i TRITON_CACHE_DIR=/tmp/aoti_triton_$i
          seed=$i
          OUT=$rounds run aoti_$i 540 python3 examples/export_aoti.py --device cuda --seed $seed $size > /dev/null
          rc=$?
          echo $rc > "$rounds/aoti_$i.rc"
          flock "$OUT/aoti.log" -c "{ echo '===== round $i (seed $seed): rc $rc'; cat $rounds/aoti_$i.log 2>/dev/null; } >> $OUT/aoti.log" ) &
        [ $((i % j)) -eq 0 ] && wait
      done
      wait
      bad=$(cat "$rounds"/aoti_*.rc | grep -cv '^0$')
      rm -rf "$rounds"
      grep -E "^=====|OK:|MISMATCH|Error" "$OUT/aoti.log" | tail -80
      echo "== aoti: $bad of $n rounds failed (mismatch, crash or time limit)" ;;
    *)
      echo "unknown segment: $seg (tests, bench, walks, floor, user [A|B], compile, timeline [emitted], aoti [N [J]] [small])"
      exit 2 ;;
  esac
done
