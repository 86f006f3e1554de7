#!/bin/bash
# The whole GPU verification of the project in named segments, each under its own time
# limit, logs under $OUT (kept when a limit cuts a segment). Run with carry [".whl"]:
#   bash benchmarks/device_all.sh tests            # ~5 min: every test file, CUDA ones included
#   bash benchmarks/device_all.sh bench_cuda       # ~5 min: the kernel benchmark (issue 3)
#   bash benchmarks/device_all.sh bench_compile bench_rewrite   # issues 4 and 5
#   bash benchmarks/device_all.sh grid gather     # unmeasured kernel variants (NOTES.md)
#   bash benchmarks/device_all.sh aoti_sys        # AOTI on CUDA with CXX=/usr/bin/g++ (issue 4)
#   bash benchmarks/device_all.sh cuda_tests step  # ~4 min: kernels/gated/layer CUDA tests, step
#                                                  # walks against column walks + a profile
#   bash benchmarks/device_all.sh step_variants    # ~1.5 min: step-walk launch parameters
#   bash benchmarks/device_all.sh cuda_marked      # > 5.5 min: lowerings/examples/AOTI on CUDA
#   bash benchmarks/device_all.sh windows          # ~8 min: token windows, Phase 1 ahead, gathers
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Nsight Compute (the ncu* segments): on PATH or in the image's install folder
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
run() {  # run NAME LIMIT command...
  local name=$1 limit=$2; shift 2
  echo "== $name"; local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "rc $? in $((SECONDS - t0)) s"
  grep -E "^(FAILED|ERROR|XFAIL)|passed|failed|^\| |^config|ms|goal" "$OUT/$name.log" | grep -v -i warn | tail -25
}
full_cuda() {  # full_cuda LIMIT: every CUDA-marked test in two concurrent pytest processes,
  # AOTI with the system compiler (the image's CXX wrapper builds .so files that crash at load)
  export CXX=/usr/bin/g++
  run full_cuda_kernels "$1" python3 -m pytest -q -rA -p no:cacheprovider -m cuda \
    tests/test_cuda.py tests/test_gated.py tests/test_nn.py &
  run full_cuda_compile "$1" python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests \
    --ignore tests/test_cuda.py --ignore tests/test_gated.py --ignore tests/test_nn.py &
  wait
}
for seg in "$@"; do
  case $seg in
    tests)
      run test_cuda 150 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py
      run test_cuda_marked 300 python3 -m pytest -q -rA -p no:cacheprovider -m cuda \
        tests/test_lowerings.py tests/test_nn.py tests/test_examples.py tests/test_export_aoti.py
      run test_interpret_grid 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_interpret.py -k grid ;;
    grid)
      run walk_smoke 120 python3 benchmarks/walk_smoke.py
      SDM_INDUCTOR_WALK=grid run test_cuda_grid 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py
      for st in 1 2; do
        run bench_grid_stages$st 200 python3 benchmarks/bench_cuda.py --configs A,B --chunks 64 \
          --walks grid,column --no-extras --quick --set STAGES_WALK=$st
      done ;;
    gather)   # the column walk's gather loop: hand-pipelined (0) vs Triton's pipeliner
      for gs in 0 2 3; do
        run bench_gather$gs 150 python3 benchmarks/bench_cuda.py --configs A --chunks 64 \
          --walks column --no-extras --quick --set GATHER_STAGES=$gs
      done ;;
    aoti)
      run aoti_alt 170 python3 benchmarks/aoti_alt.py ;;
    aoti_gxx)   # the image's /opt/gcc/bin/g++ wrapper vs the system compiler (NOTES.md)
      run aoti_gxx 90 python3 benchmarks/aoti_alt.py /usr/bin/g++ cpu cuda ;;
    aoti_sys)   # AOTInductor packages built by the system compiler: the image's CXX wrapper
      # builds .so files without libstdc++ that crash at load; /usr/bin/g++'s load (NOTES.md)
      run aoti_sys 300 env CXX=/usr/bin/g++ python3 -m pytest -q -rA -p no:cacheprovider \
        tests/test_export_aoti.py tests/test_examples.py -k aoti ;;
    variants)
      run bench_variants 170 python3 benchmarks/bench_variants.py --config A --chunk 64 --only 1
      run bench_variants_B 120 python3 benchmarks/bench_variants.py --config B --chunk 64 --only 1 ;;
    full)   # every CUDA-marked test (~8 min, full_cuda). The CPU suite is CI's; beside
      # these two it did not finish in one call (session 11): `full_cpu` runs it on the
      # image's torch
      full_cuda 560 ;;
    full_cpu)   # the CPU suite on the image's torch (2.11), two processes
      run full_cpu_kernels 560 python3 -m pytest -q -p no:cacheprovider -m "not cuda" \
        tests/test_kernels_interpret.py tests/test_fuzz.py tests/test_ops.py tests/test_host_tracing.py &
      run full_cpu_rest 560 python3 -m pytest -q -p no:cacheprovider -m "not cuda" tests \
        --ignore tests/test_kernels_interpret.py \
        --ignore tests/test_fuzz.py --ignore tests/test_ops.py --ignore tests/test_host_tracing.py &
      wait ;;
    cuda_marked)   # the CUDA tests outside test_cuda.py: lowerings, layer, examples, AOTI
      export CXX=/usr/bin/g++
      run cuda_marked 330 python3 -m pytest -q -rA -p no:cacheprovider -m cuda \
        tests/test_lowerings.py tests/test_nn.py tests/test_examples.py tests/test_export_aoti.py ;;
    cuda_tests)   # the kernels, the gated op and the layer on CUDA
      run cuda_tests 330 python3 -m pytest -v -p no:cacheprovider tests/test_cuda.py tests/test_gated.py \
        tests/test_nn.py -m cuda ;;
    bench_cuda)
      run bench_cuda 420 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" ;;
    bench_compile)
      run bench_compile 300 python3 benchmarks/bench_compile.py --reps 5 --json "$OUT/bench_compile.json" ;;
    bench_model)   # bench_compile part 2 alone: the 4-layer model, eager vs compiled
      run bench_model 400 python3 benchmarks/bench_compile.py --configs "" --reps 5 --json "$OUT/bench_model.json" ;;
    bench_rewrite_inproc)   # one process: the sdm kernels' binaries are built once (warm-up)
      run bench_rewrite_inproc 300 python3 benchmarks/bench_rewrite.py --device cuda --T 64 256 1024 \
        --modes dynamo rewrite explicit scan --inprocess --reps 10 --json "$OUT/bench_rewrite.json" ;;
    bench_rewrite)
      run bench_rewrite 420 python3 benchmarks/bench_rewrite.py --device cuda --T 64 256 1024 \
        --plain-max-T 64 --plain-timeout 150 --reps 10 --json "$OUT/bench_rewrite.json" ;;
    step)   # the step walks (kernels/step.py, step_backward.py) against the column walks
      run bench_step 300 python3 benchmarks/bench_cuda.py --configs A,B --chunks 64,128,256 \
        --walks auto,column --no-extras --quick
      (cd benchmarks && run profile_step 120 python3 profile_cuda.py 64 --tables-only) ;;
    step_variants)
      run variants_step_A64 200 python3 benchmarks/bench_variants.py --config A --chunk 64 --only 1,11,12,13,14,15,16,17,18
      run variants_step_B128 120 python3 benchmarks/bench_variants.py --config B --chunk 128 --only 1,11,14,16 ;;
    windows)   # session 7: token windows with Phase 1 ahead on a side stream, one-load gathers
      run variants_win_A64 200 python3 benchmarks/bench_variants.py --config A --chunk 64 --only 19,20,21,22,23,24,25,26,27
      run variants_win_A128 150 python3 benchmarks/bench_variants.py --config A --chunk 128 --only 19,20,22,23,24,25
      run variants_win_B128 150 python3 benchmarks/bench_variants.py --config B --chunk 128 --only 19,20,23,24,25 ;;
    phase1_mix)   # session 8: Phase 1 (flat sort, pairs lane accumulators, prep warps), the
      # product launches' shapes, and a per-kernel table without PDL's overlapped waits
      cd benchmarks
      run prof_nopdl 120 python3 profile_phase1.py 128 --whole PDL=0
      run ab_phase1 150 python3 ab_cuda.py --plan --rounds 3 --chunks 64,128 \
        --b phase1.FLAT_SORT=0 phase1.PAIR_ACC=0
      run ab_prep 100 python3 ab_cuda.py --plan --rounds 3 --chunks 128 --b phase1.PREP_WARPS=8
      run ab_mix_mb 100 python3 ab_cuda.py --rounds 3 --chunks 128 --b MB_MIX=16 MB_MIX_B=16
      run ab_mix_tb 100 python3 ab_cuda.py --rounds 3 --chunks 128 --b TB_MIX=32 TB_MIX_B=32
      run ab_mix_w 100 python3 ab_cuda.py --rounds 3 --chunks 128 --b WARPS_MIX=8 WARPS_MIX_B=8
      cd .. ;;
    quant9)   # session 9: the log packing kernel (fp8 / int4 modes)
      run test_cuda_q 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py tests/test_gated.py -m cuda
      run bench_q 200 python3 benchmarks/bench_cuda.py --configs A --chunks 64 --quick ;;
    final9)   # session 9: the final benchmark, the kernel tests, the autograd profile
      run bench_cuda 420 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json"
      run test_cuda 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py tests/test_gated.py -m cuda
      cd benchmarks
      run prof_autograd 150 python3 profile_autograd.py 128
      cd .. ;;
    prof_autograd)   # session 9: the autograd step against the ops called directly
      run test_cuda 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py
      cd benchmarks
      run prof_autograd 150 python3 profile_autograd.py 128
      cd .. ;;
    keep)   # session 9: the forward's Phase 1 and v - r0 kept for the backward (autograd rows)
      run test_cuda 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py
      cd benchmarks
      run ab_keep_A 150 python3 ab_cuda.py --rows ag,fb --rounds 3 --chunks 64,128 --b KEEP=0
      run ab_keep_B 100 python3 ab_cuda.py --config B --rows ag --rounds 3 --chunks 128 --b KEEP=0
      cd .. ;;
    l2hints)   # session 9: L2 eviction policies of the step walks' row loads, the Dw launch's tile
      cd benchmarks
      run ab_l2_fwd 150 python3 ab_cuda.py --rows fwd --rounds 3 --chunks 64,128 --b EV_GW=2 EV_GR=1
      run ab_l2_fwd_wo 100 python3 ab_cuda.py --rows fwd --rounds 3 --chunks 128 \
        --b EV_GW=2 EV_GR=1 EV_WO=1
      run ab_l2_fwd_B 100 python3 ab_cuda.py --config B --rows fwd --rounds 3 --chunks 128 \
        --b EV_GW=2 EV_GR=1
      run ab_l2_bwd 100 python3 ab_cuda.py --rows fb --rounds 3 --chunks 128 --b EV_BW=2 EV_DB=2
      run ab_dw_w8 100 python3 ab_cuda.py --rows fb --rounds 3 --chunks 128 --b WARPS_DW=8
      run ab_dw_bd64 100 python3 ab_cuda.py --rows fb --rounds 3 --chunks 128 --b BD_DW=64
      cd .. ;;
    tiles8)   # session 8: the no-grad forward's windows, the dB / write / gather tiles
      cd benchmarks
      run ab_nograd_ahead 100 python3 ab_cuda.py --rows fwd --rounds 5 --chunks 64,128 --b PLAN_AHEAD=0
      run ab_nograd_win 100 python3 ab_cuda.py --rows fwd --rounds 5 --chunks 64,128 --b WINDOW_TOKENS=16384
      run ab_group1 100 python3 ab_cuda.py --rows fb --rounds 3 --chunks 64,128 \
        --b BD_GROUP=128 NG_GROUP=16 KW_GROUP=1
      run ab_group2 100 python3 ab_cuda.py --rows fb --rounds 3 --chunks 64,128 --b KW_GROUP=1
      run ab_group3 100 python3 ab_cuda.py --rows fb --rounds 3 --chunks 128 --b WARPS_GROUP=4 NG_GROUP=16
      run ab_write 100 python3 ab_cuda.py --rounds 3 --chunks 64,128 --b BD_STEP_W=128 NG_STEP=16
      run ab_gather 100 python3 ab_cuda.py --rounds 3 --chunks 64,128 --b BD_STEP=256 WARPS_STEP=8 MAXNREG_STEP=0
      cd .. ;;
    groups8)   # session 8: the groups kernel's blocks and warps, the pairs kernel's member tile
      cd benchmarks
      run ab_groups1 100 python3 ab_cuda.py --plan --rows fb --rounds 3 --chunks 64,128 \
        --b phase1.GROUPS_BLK=4096 phase1.GROUPS_WARPS=16
      run ab_groups2 100 python3 ab_cuda.py --plan --rows fb --rounds 3 --chunks 64,128 \
        --b phase1.GROUPS_BLK=2048 phase1.GROUPS_WARPS=8
      run ab_km2 100 python3 ab_cuda.py --plan --rows fb --rounds 3 --chunks 64,128 \
        --b phase1.PAIR_MEMBERS=2
      cd .. ;;
    compile10)   # session 10: compiled calls (static and symbolic lengths) against eager
      export CXX=/usr/bin/g++
      run bench_compile_A 330 python3 benchmarks/bench_compile.py \
        --configs A --cases op --dynamic static,dynamic --no-model --reps 5
      run test_lowerings_cuda 240 python3 -m pytest -q -rA -p no:cacheprovider -m cuda \
        tests/test_lowerings.py ;;
    calls10)   # session 10: the user-level call (index checks, synced), Phase 1's fixed cost
      cd benchmarks
      run bench_user_call 150 python3 bench_user_call.py --configs A,B --chunk 128
      run profile_phase1 90 python3 profile_phase1.py 128 PDL=0
      cd .. ;;
    compile10c)   # session 10: torch.compile calls the eager op (EMIT_KERNELS=aot), A, B, the model
      export CXX=/usr/bin/g++
      run bench_compile_aot 400 python3 benchmarks/bench_compile.py --configs A,B --cases op,gatedop \
        --reps 5 --json "$OUT/bench_compile.json" ;;
    tests10)   # session 10: the CUDA tests touched by EMIT_KERNELS, the checks and the kernels
      export CXX=/usr/bin/g++
      run tests10 420 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/test_lowerings.py \
        tests/test_gated.py tests/test_export_aoti.py tests/test_cuda.py ;;
    final10)   # session 10: the CUDA-graph / EMIT_KERNELS tests again, then the compile benchmark
      export CXX=/usr/bin/g++
      run tests_fix 150 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/test_lowerings.py \
        tests/test_gated.py -k "reduce_overhead or output_code or compiled_layer"
      run bench_compile_aot 330 python3 benchmarks/bench_compile.py --configs A,B --cases op \
        --reps 5 --json "$OUT/bench_compile.json" ;;
    model10)   # session 10: the 4-layer model with the emitted column walks; the other CUDA tests
      export CXX=/usr/bin/g++
      run bench_model_always 150 python3 benchmarks/bench_compile.py --configs "" --emit always \
        --reps 5
      run tests_rest 220 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/test_nn.py \
        tests/test_examples.py ;;
    pdl3_13)   # session 13: PDL=3 (backward launches that need nothing of the one before
      # run before their wait): bitwise race check against PDL=1, A/B against PDL=2, then
      # the kernel / gated / layer CUDA tests under PDL=3
      cd benchmarks
      run pdl_check 150 python3 pdl_check.py --reps 2 --chunks 64,128
      run ab_pdl3_A 150 python3 ab_cuda.py --config A --chunks 64,128 --rows fwd,ag --rounds 3 \
        --a PDL=2 --b PDL=3
      run ab_pdl3_B 90 python3 ab_cuda.py --config B --chunks 128 --rows ag --rounds 3 \
        --a PDL=2 --b PDL=3
      cd ..
      run tests_pdl3 300 env SDM_INDUCTOR_PDL=3 python3 -m pytest -q -x -p no:cacheprovider -m cuda \
        tests/test_cuda.py tests/test_gated.py tests/test_nn.py ;;
    pdl13)   # session 13: early loads before the programmatic-launch wait (PDL=2, the
      # default now) against the wait first (PDL=1): the kernel tests, then A/B
      run test_cuda 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py
      cd benchmarks
      run ab_pdl_A 200 python3 ab_cuda.py --config A --chunks 64,128 --rows fwd,ag --rounds 3 \
        --a PDL=1 --b PDL=2
      run ab_pdl_B 120 python3 ab_cuda.py --config B --chunks 128 --rows fwd,ag --rounds 3 \
        --a PDL=1 --b PDL=2
      cd .. ;;
    phase1_13)   # session 13: the pairs kernel in two programs per token (PAIR_SPLIT) and
      # the prep kernel's repeat branch: interleaved A/B (A side: both off), then each alone
      run test_cuda 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py
      OFF="phase1.PAIR_SPLIT=0 phase1.PREP_REPEAT_BRANCH=0"
      cd benchmarks
      run ab_A 200 python3 ab_cuda.py --config A --chunks 64,128 --plan --rows fwd,ag \
        --rounds 3 --a $OFF --b
      run ab_B 120 python3 ab_cuda.py --config B --chunks 128 --plan --rows fwd,ag \
        --rounds 3 --a $OFF --b
      run ab_split 80 python3 ab_cuda.py --config A --chunks 128 --plan --rows fwd --rounds 3 \
        --a phase1.PAIR_SPLIT=0 --b
      run ab_branch 80 python3 ab_cuda.py --config A --chunks 128 --plan --rows fwd \
        --rounds 3 --a phase1.PREP_REPEAT_BRANCH=0 --b
      cd .. ;;
    dist13)   # session 13 (kind nvidia-h200-x2): the distributed tests on 2 GPUs with NCCL,
      # bench_distributed at 1 and 2 GPUs (eager); then Phase 1's host time on GPU 0
      run dist_tests 280 env SDM_DIST_DEVICE=cuda python3 -m pytest -q -rA -p no:cacheprovider \
        tests/test_distributed.py
      for n in 1 2; do
        run bench_dist_$n 100 python3 -m torch.distributed.run --nproc-per-node $n \
          benchmarks/bench_distributed.py --json /tmp/bench_dist_$n.json
      done
      python3 benchmarks/bench_distributed.py --table /tmp/bench_dist_[12].json
      (cd benchmarks && CUDA_VISIBLE_DEVICES=0 run profile_phase1 100 python3 profile_phase1.py \
        128 --whole PDL=0; cat "$OUT/profile_phase1.log") ;;
    dist13c)   # session 13 (nvidia-h200-x2): bench_distributed compiled at 1 and 2 GPUs
      for n in 1 2; do
        run bench_dist_compiled_$n 240 python3 -m torch.distributed.run --nproc-per-node $n \
          benchmarks/bench_distributed.py --compile --json /tmp/bench_dist_compiled_$n.json
      done
      python3 benchmarks/bench_distributed.py --table /tmp/bench_dist_compiled_*.json ;;
    ncu12)   # session 12: Nsight Compute sections of one launch of each main kernel, A C=128
      echo "ncu: $NCU"
      cd benchmarks
      python3 ncu_step.py A 128 PDL=0 > "$OUT/ncu_warm.log" 2>&1   # compiles the kernels once
      for k in _step_gather_kernel _step_write_kernel _step_mix_kernel _step_bwd_group_kernel \
               _step_bwd_dw_kernel _step_restore_kernel _step_bwd_dev_kernel _step_bwd_gather_kernel \
               _pairs_kernel _prep_kernel _groups_kernel; do
        skip=5; case $k in _step*) ;; *) skip=0 ;; esac   # Phase 1 kernels: one launch per plan
        run ncu_$k 90 "$NCU" --profile-from-start off --clock-control none -k regex:"^$k" \
          --launch-skip $skip --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
          python3 ncu_step.py A 128 PDL=0
      done
      cd .. ;;
    cl12)   # session 12: write / dB programs over several column blocks (CL_*), A/B + ncu
      cd benchmarks
      run ab_clg3 150 python3 ab_cuda.py --rows ag --rounds 3 --chunks 128 --b CL_GROUP=3
      run ab_clg6 150 python3 ab_cuda.py --rows ag --rounds 3 --chunks 128 --b CL_GROUP=6
      run ab_clw3 150 python3 ab_cuda.py --rows fwd,ag --rounds 3 --chunks 128 --b CL_WRITE=3
      run ab_clg3_B 100 python3 ab_cuda.py --config B --rows ag --rounds 3 --chunks 128 --b CL_GROUP=3
      for v in 3 6; do
        run ncu_group_cl$v 90 "$NCU" --profile-from-start off --clock-control none \
          -k regex:"^_step_bwd_group" --launch-skip 5 --launch-count 1 --section SpeedOfLight \
          --section Occupancy --section LaunchStats --section SchedulerStats \
          python3 ncu_step.py A 128 PDL=0 CL_GROUP=$v
      done
      run ncu_write 90 "$NCU" --profile-from-start off --clock-control none \
        -k regex:"^_step_write" --launch-skip 5 --launch-count 1 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section SchedulerStats \
        --section MemoryWorkloadAnalysis python3 ncu_step.py A 128 PDL=0
      cd .. ;;
    regs12)   # session 12: the forward gather's register cap (80 -> 64 registers, 1.45 waves);
      # then the walk grid (the prep kernel's int32 comparison, measured here, was removed)
      cd benchmarks
      run ab_nreg0 120 python3 ab_cuda.py --rows fwd,ag --rounds 3 --chunks 64,128 --b MAXNREG_STEP=0
      run ab_nreg32 120 python3 ab_cuda.py --rows fwd,ag --rounds 3 --chunks 64,128 --b MAXNREG_STEP=32
      run ab_nreg0_B 100 python3 ab_cuda.py --config B --rows fwd --rounds 3 --chunks 128 --b MAXNREG_STEP=0
      run walks_grid 330 python3 bench_walks.py --grid --rounds 2
      cd .. ;;
    groups12)   # session 12: the CUDA tests of the kernels, gated op and layer (the run also
      # measured GROUPS_PAR, Phase 1's groups scans over parallel blocks, since removed:
      # commit 11936e8 has both)
      run cuda_tests 400 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/test_cuda.py \
        tests/test_gated.py tests/test_nn.py ;;
    s15a)   # session 15: Phase 1's groups over blocks of sorted positions (GROUPS_SPLIT) and
      # the split pairs kernel in one warp (PAIR_WARPS=1): per-kernel times, then whole calls
      cd benchmarks
      run p1prof_old 100 python3 profile_phase1.py 64 128 --whole --plan-only PDL=0 \
        phase1.GROUPS_SPLIT=0 phase1.PAIR_WARPS=4
      run p1prof_new 100 python3 profile_phase1.py 64 128 --whole --plan-only PDL=0 \
        phase1.GROUPS_SPLIT=1 phase1.PAIR_WARPS=1
      run ab_p1_A 230 python3 ab_cuda.py --config A --chunks 64,128 --plan --rows fwd,ag --rounds 3 \
        --a phase1.GROUPS_SPLIT=0 phase1.PAIR_WARPS=4 --b phase1.GROUPS_SPLIT=1 phase1.PAIR_WARPS=4 \
        --c phase1.GROUPS_SPLIT=1 phase1.PAIR_WARPS=1
      run ab_p1_B 100 python3 ab_cuda.py --config B --chunks 128 --plan --rows fwd --rounds 3 \
        --a phase1.GROUPS_SPLIT=0 phase1.PAIR_WARPS=4 --b phase1.GROUPS_SPLIT=1 phase1.PAIR_WARPS=1
      cd .. ;;
    s15b)   # session 15: the split groups kernels with a segment's blocks adjacent in the grid
      # (its scattered stores in a small region of L2), per kernel at C=64 / 128
      cd benchmarks
      run p1prof_b 100 python3 profile_phase1.py 64 128 --whole --plan-only PDL=0
      run p1prof_b_old 100 python3 profile_phase1.py 64 128 --whole --plan-only PDL=0 \
        phase1.GROUPS_SPLIT=0
      cd .. ;;
    s15c)   # session 15: no-grad windows whose Phase 1 replays from CUDA graphs (PLAN_GRAPH)
      # ahead of the walk: the new test, the host / stream timeline, then A/B against one window
      run test_plan_graph 120 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py -k "plan_graph or windows"
      cd benchmarks
      run timeline_pg 120 python3 timeline.py A 128 fwd "" "WINDOW_TOKENS=2048 PLAN_GRAPH=1" \
        "WINDOW_TOKENS=4096 PLAN_GRAPH=1"
      run ab_pg_A 220 python3 ab_cuda.py --config A --chunks 64,128 --rows fwd --rounds 3 \
        --a plan_graph.MAX_KEYS=64 --b PLAN_GRAPH=1 WINDOW_TOKENS=4096 plan_graph.MAX_KEYS=64 \
        --c PLAN_GRAPH=1 WINDOW_TOKENS=2048 plan_graph.MAX_KEYS=64 \
        --d PLAN_GRAPH=1 WINDOW_TOKENS=1024 plan_graph.MAX_KEYS=64
      run ab_pg_B 120 python3 ab_cuda.py --config B --chunks 128 --rows fwd --rounds 3 \
        --a plan_graph.MAX_KEYS=64 --b PLAN_GRAPH=1 WINDOW_TOKENS=4096 plan_graph.MAX_KEYS=64 \
        --c PLAN_GRAPH=1 WINDOW_TOKENS=2048 plan_graph.MAX_KEYS=64
      cd .. ;;
    s15d)   # session 15: the pairs kernel's one-hot sums up to the members with Gram terms
      # (PAIR_HOT) and the blocked solve at 64 < C <= 128, per kernel and in whole calls
      # (PAIR_HOT was removed after this run, NOTES.md run 16: its A/B rows now stop)
      run test_cuda_d 150 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py
      cd benchmarks
      run p1prof_d 100 python3 profile_phase1.py 64 128 --whole --plan-only PDL=0
      run ab_hot_A 230 python3 ab_cuda.py --config A --chunks 64,128 --plan --rows fwd,ag --rounds 3 \
        --a phase1.PAIR_HOT=0 solve.BLOCKED_MAX_C=0 --b phase1.PAIR_HOT=1 solve.BLOCKED_MAX_C=0 \
        --c phase1.PAIR_HOT=1 solve.BLOCKED_MAX_C=128
      run ab_hot_B 100 python3 ab_cuda.py --config B --chunks 128 --plan --rows fwd --rounds 3 \
        --a phase1.PAIR_HOT=0 solve.BLOCKED_MAX_C=0 --b phase1.PAIR_HOT=1 solve.BLOCKED_MAX_C=128
      cd .. ;;
    s15e)   # session 15: the split pairs kernel over blocks of 16 entries (one or two warps:
      # no shared-memory conversions in one warp), per kernel at C=64 / 128
      cd benchmarks
      run p1prof_e0 100 python3 profile_phase1.py 64 128 --whole --plan-only PDL=0
      run p1prof_e1 100 python3 profile_phase1.py 64 128 --whole --plan-only PDL=0 \
        phase1.PAIR_ENTRIES=16 phase1.PAIR_WARPS_128=1
      run p1prof_e2 100 python3 profile_phase1.py 128 --whole --plan-only PDL=0 \
        phase1.PAIR_ENTRIES=16 phase1.PAIR_WARPS_128=2
      grep -h "_pairs_kernel\|^## " "$OUT"/p1prof_e*.log
      cd .. ;;
    final15)   # session 15: every CUDA-marked test (the `full` segment), then the benchmark
      bash "$0" full
      run bench_cuda 200 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" ;;
    s15f)   # session 15: the split pairs kernel at 64 < C <= 128 over blocks of 16 entries in one
      # warp (s15e: 0.351 -> 0.326 ms), in whole calls; A again at C = 64 / 128 (final15's
      # first row, A C=64 no-grad, read 4.26 ms where the same call in its last rows read 3.64)
      cd benchmarks
      run ab_eb_A 120 python3 ab_cuda.py --config A --chunks 128 --plan --rows fwd,ag --rounds 3 \
        --b phase1.PAIR_ENTRIES_128=16 phase1.PAIR_WARPS_128=1
      run ab_eb_B 80 python3 ab_cuda.py --config B --chunks 128 --plan --rows fwd --rounds 3 \
        --b phase1.PAIR_ENTRIES_128=16 phase1.PAIR_WARPS_128=1
      cd ..
      run bench_A 120 python3 benchmarks/bench_cuda.py --configs A --chunks 64,128 --no-extras ;;
    s16a)   # session 16: where a step's time goes now (per-kernel tables, A C=128 / 64)
      cd benchmarks
      SDM_INDUCTOR_WALK=step run prof128 120 python3 profile_cuda.py 128 --tables-only
      SDM_INDUCTOR_WALK=step run prof64 120 python3 profile_cuda.py 64 --tables-only
      run tl128 90 python3 timeline.py A 128 fwd "WINDOW_TOKENS=8192"
      cd .. ;;
    s16b)   # session 16: is the eager call host-bound? eager vs host enqueue vs CUDA-graph replay
      cd benchmarks
      run hostb 240 python3 host_bound.py A:64 A:128 A:256 B:128
      cat "$OUT/hostb.log" | tail -20
      cd .. ;;
    s16c)   # session 16: the forward walk's kernels alone (PDL=0) and in Nsight Compute, A C=128
      cd benchmarks
      run prof128p0 120 python3 profile_cuda.py 128 --tables-only PDL=0
      grep -h "_step_\|_pairs\|Self CUDA" "$OUT/prof128p0.log"
      run ncu_fwd 150 "$NCU" --profile-from-start off --clock-control none \
        -k regex:"^_step_(gather|mix|write)_kernel" --launch-skip 12 --launch-count 3 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section Occupancy \
        --section LaunchStats python3 ncu_step.py A 128 PDL=0
      grep -E "^  _step|Duration|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Grid Size" "$OUT/ncu_fwd.log"
      cd .. ;;
    s16d)   # session 16: launch shapes of the small product launches (forward mix: 96 programs,
      # 7 us in ncu, 6 % occupancy; the backward's two) and of the write launch, timed from
      # CUDA graphs (the GPU's own time; eager calls can be host-bound, run 17)
      cd benchmarks
      run ab_mix_A 150 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fwd --rounds 3 \
        --b TB_MIX=32 --c MB_MIX=16 --d TB_MIX=32 MB_MIX=16
      run ab_mix_B 100 python3 ab_cuda.py --graph --config B --chunks 128 --rows fwd --rounds 3 \
        --b TB_MIX=32 --c MB_MIX=16 --d TB_MIX=32 MB_MIX=16
      run ab_wr_A 150 python3 ab_cuda.py --graph --config A --chunks 128 --rows fwd --rounds 3 \
        --b BD_STEP_W=128 --c NG_STEP=64 --d WARPS_STEP_W=4
      run ab_mixb_A 200 python3 ab_cuda.py --graph --config A --chunks 128 --rows fb --rounds 3 \
        --b TB_MIX_B=32 --c MB_MIX_B=16 --d TB_MIX_B=32 MB_MIX_B=16
      cd .. ;;
    s16e)   # session 16: s16d's winners (TB_MIX=32: A C=64 0.878, C=128 0.980, B 0.977; write
      # WARPS_STEP_W=4 0.974, BD_STEP_W=128 0.983; TB_MIX_B=32 0.985) combined and pushed further
      cd benchmarks
      run ab_mix2_A 150 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fwd --rounds 3 \
        --a TB_MIX=32 --b TB_MIX=16 --c TB_MIX=32 WARPS_MIX=2 --d TB_MIX=16 WARPS_MIX=2
      run ab_wr2_A 150 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fwd,fb --rounds 3 \
        --a TB_MIX=32 --b TB_MIX=32 WARPS_STEP_W=4 --c TB_MIX=32 WARPS_STEP_W=4 BD_STEP_W=128 \
        --d TB_MIX=32 BD_STEP_W=128
      run ab_mixb2_A 200 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fb --rounds 3 \
        --a TB_MIX=32 --b TB_MIX=32 TB_MIX_B=32 --c TB_MIX=32 TB_MIX_B=16 \
        --d TB_MIX=32 TB_MIX_B=32 WARPS_MIX_B=2
      run ab_wr2_B 150 python3 ab_cuda.py --graph --config B --chunks 128 --rows fwd,fb --rounds 3 \
        --a TB_MIX=32 --b TB_MIX=32 WARPS_STEP_W=4 --c TB_MIX=32 WARPS_STEP_W=4 BD_STEP_W=128 \
        --d TB_MIX=32 TB_MIX_B=32
      cd .. ;;
    s16f)   # session 16: the pairs kernel reading members at sorted positions (PAIR_SORTED, the
      # default now: A; B = through perm), graph-timed; the kernel tests on the new defaults
      cd benchmarks
      run ab_srt_A 150 python3 ab_cuda.py --graph --config A --chunks 64,128 --plan --rows fwd \
        --rounds 3 --b phase1.PAIR_SORTED=0
      run ab_srt_B 100 python3 ab_cuda.py --graph --config B --chunks 128 --plan --rows fwd \
        --rounds 3 --b phase1.PAIR_SORTED=0
      run p1prof_srt 100 python3 profile_phase1.py 128 --whole --plan-only PDL=0
      grep -h "_pairs_kernel\|_block_writes\|^## " "$OUT"/p1prof_srt.log
      cd ..
      run test_cuda_s16 280 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py ;;
    s16g)   # session 16: the sorted copies for write positions only (s16f: _block_writes 6 ->
      # 34 us for all positions), against PAIR_SORTED=0; then the benchmark on the final defaults
      cd benchmarks
      run ab_srtw_A 120 python3 ab_cuda.py --graph --config A --chunks 128 --plan --rows fwd \
        --rounds 3 --b phase1.PAIR_SORTED=0
      run p1prof_srtw 100 python3 profile_phase1.py 128 --whole --plan-only PDL=0
      grep -h "_pairs_kernel\|_block_writes\|^## \|kernel time" "$OUT"/p1prof_srtw.log
      cd ..
      run bench_cuda 200 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" ;;
    s17a)   # session 17: walk graphs (graphs.py) and the bf16 delta scratch: their tests,
      # the oracle tests with DELTA_BF16=1, eager time with and without walk graphs, and a
      # graph-timed A/B of DELTA_BF16
      run t17 250 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "walk_graph or deterministic or overlap or kept or capture or oracle"
      run t17_dbf 150 python3 -c "import sys, pytest; from sdm_inductor.kernels import host; \
host.CONFIG['DELTA_BF16'] = 1; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', \
'tests/test_cuda.py', '-k', 'oracle or snapshot or long_sequence or deterministic']))"
      cd benchmarks
      run host_wg1 100 python3 host_bound.py A:64 A:128 B:128
      run host_wg0 100 python3 host_bound.py A:64 A:128 B:128 WALK_GRAPHS=0
      grep -h "fwd\|fb" "$OUT"/host_wg1.log "$OUT"/host_wg0.log
      run ab_dbf_A 120 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fwd,fb \
        --rounds 3 --b DELTA_BF16=1
      run ab_dbf_B 80 python3 ab_cuda.py --graph --config B --chunks 128 --rows fwd,fb \
        --rounds 3 --b DELTA_BF16=1
      cd .. ;;
    s17b)   # session 17: the product launches' whole rows before the wait (MIX_ROWS forward,
      # MIX_ROWS_B backward): oracle and PDL-mode tests with both on, the walk-graph test,
      # graph-timed A/Bs
      run t17r 250 python3 -c "import sys, pytest; from sdm_inductor.kernels import host; \
host.CONFIG.update(MIX_ROWS=1, MIX_ROWS_B=1); sys.exit(pytest.main(['-q', '-p', \
'no:cacheprovider', 'tests/test_cuda.py', '-k', 'oracle or overlap or walk_graph or kept']))"
      cd benchmarks
      run ab_rows_A 150 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fwd,fb \
        --rounds 3 --b MIX_ROWS=1 --c MIX_ROWS_B=1 --d MIX_ROWS=1 MIX_ROWS_B=1
      run ab_rows_B 100 python3 ab_cuda.py --graph --config B --chunks 128 --rows fwd,fb \
        --rounds 3 --b MIX_ROWS=1 --c MIX_ROWS_B=1 --d MIX_ROWS=1 MIX_ROWS_B=1
      cd .. ;;
    s17c)   # session 17: the benchmark on the final defaults, then eager / host / graph times
      run bench_cuda 300 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json"
      cd benchmarks
      run host17 120 python3 host_bound.py A:64 A:128 B:128
      cd .. ;;
    s26a)   # session 26: the backward's prelude beside the forward's walk (PRELUDE), the
      # entry grads of all but the last window beside the next window's walk (GRADS_BESIDE);
      # their CUDA tests; in-process A/B of each against off, and three backward windows
      run t26a 240 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "kept or oracle or walk_graph or sources or launch_overlap or group_layouts"
      cd benchmarks
      for cfg in A B; do
        run ab26a_$cfg 150 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 --rows fwd,ag \
          --b PRELUDE=0 --c GRADS_BESIDE=0 --d BWD_WINDOWS=3
      done
      cd .. ;;
    s26d)   # session 26: the walks on a stream of higher priority than the side stream's
      # work beside them (WALK_PRIORITY); against it off, and the side work off
      run t26d 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "kept or walk_graph or launch_overlap or bitwise"
      cd benchmarks
      for cfg in A B; do
        run ab26d_$cfg 150 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 --rows fwd,ag \
          --b WALK_PRIORITY=0 --c GRADS_BESIDE=0 --d PRELUDE=0 GRADS_BESIDE=0
      done
      cd .. ;;
    s26e)   # session 26: the backward's first product of a window's chunks in one launch
      # before its walk (MIX1_AHEAD 1 / 2) against one per chunk step (0); its CUDA tests.
      # (MIX1_AHEAD, GRADS_BESIDE and WALK_PRIORITY measured slower and were removed after
      # run 26: commits 9a5b7ab, ae33f55, f1a378c hold them; s26a / s26d / s26e need those)
      run t26e 240 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "first_product or kept or launch_overlap or walk_graph or oracle"
      cd benchmarks
      for cfg in A B; do
        run ab26e_$cfg 150 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 --rows fwd,ag \
          --b MIX1_AHEAD=0 --c MIX1_AHEAD=2
      done
      cd .. ;;
    s26f)   # session 26: the lowerings / examples / export / AOTI CUDA tests (the traced
      # backward's Phase 1 grads changed), beside the rest of test_cuda.py
      export CXX=/usr/bin/g++
      run t26f_compile 560 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests \
        --ignore tests/test_cuda.py --ignore tests/test_gated.py --ignore tests/test_nn.py &
      run t26f_kernels 560 python3 -m pytest -q -rA -p no:cacheprovider -m cuda \
        tests/test_cuda.py tests/test_gated.py tests/test_nn.py \
        -k "not (first_product or kept or launch_overlap or walk_graph or oracle)" &
      wait ;;
    s26g)   # session 26, final: the benchmark, then one backward window and the prelude
      # inline against the defaults
      cd benchmarks
      run bench26g 300 python3 bench_cuda.py --no-extras
      for cfg in A B; do
        run ab26g_$cfg 120 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 --rows fwd,ag \
          --b BWD_WINDOWS=1 --c PRELUDE=1
      done
      cd .. ;;
    s31t)   # session 31: every CUDA-marked test on the final tree, three processes at once
      export CXX=/usr/bin/g++
      run s31t_kernels 540 python3 -m pytest -v -p no:cacheprovider -m cuda \
        tests/test_cuda.py tests/test_gated.py tests/test_nn.py &
      run s31t_lowerings 540 python3 -m pytest -v -p no:cacheprovider -m cuda tests/test_lowerings.py &
      run s31t_rest 540 python3 -m pytest -v -p no:cacheprovider -m cuda --durations=5 tests \
        --ignore tests/test_cuda.py --ignore tests/test_gated.py --ignore tests/test_nn.py \
        --ignore tests/test_lowerings.py &
      wait ;;
    s31a)   # session 31: the no-grad forward's necessary row traffic moved by the simplest
      # kernels (floor_cuda.py), beside the op's own call: how near any walk can come
      cd benchmarks
      run floor31 300 python3 floor_cuda.py --configs B,A
      run floor31_256 150 python3 floor_cuda.py --configs B --chunk 256
      cd .. ;;
    s30e)   # session 30: column slabs (SLABS): each chunk step's gather, product and write
      # over one slab of the columns, then the next, so the write launch finds in L2 the
      # rows its slab's gather read (NOTES.md run 30, lead 1); checked, then A/Bs
      cd benchmarks
      run vc30e 120 python3 variant_check.py SLABS=2
      run ab30e_B 120 python3 ab_cuda.py --config B --chunks 128 --rounds 3 --rows fwd,ag \
        --b SLABS=2 --c SLABS=3 --d SLABS=4
      run ab30e_A 100 python3 ab_cuda.py --config A --chunks 128 --rounds 3 --rows fwd,ag \
        --b SLABS=2 --c SLABS=3
      cd .. ;;
    s30d)   # session 30: 512-byte row segments in the forward's row launches (NOTES.md run
      # 7's lead 3, never tried on the step walk): the gather over 256 columns in two warps,
      # the write over 256 in eight; checked against the defaults, then no-grad A/Bs
      cd benchmarks
      run vc30d_g 120 python3 variant_check.py BD_STEP=256 WARPS_STEP=2
      run vc30d_w 90 python3 variant_check.py BD_STEP_W=256 WARPS_STEP_W=8
      for cfg in B A; do
        run ab30d_$cfg 120 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 --rows fwd \
          --b BD_STEP=256 WARPS_STEP=2 --c BD_STEP_W=256 WARPS_STEP_W=8 \
          --d BD_STEP=256 WARPS_STEP=2 BD_STEP_W=256 WARPS_STEP_W=8
      done
      cd .. ;;
    s30c)   # session 30: Phase 1 per kernel at A and B (C = 128; bench30b's "Phase 1 alone":
      # 0.65 ms at A, 0.96 at B, whose entries are half A's), and one no-grad call's timeline
      cd benchmarks
      for cfg in A B; do
        run p1_$cfg 90 python3 profile_phase1.py 128 --whole --plan-only --config=$cfg PDL=0
        run tl_$cfg 90 python3 timeline.py $cfg 128 fwd ""
      done
      cd .. ;;
    s30b)   # session 30: the benchmark on the final defaults (all C, no extras; the C = 256
      # rows with the blocks form's 32 x 32 slices) and the decode step
      cd benchmarks
      run bench30b 400 python3 bench_cuda.py --no-extras
      run decode30b 60 python3 -c "import bench_cuda
print(f'decode step P=16 T=1 hd=768 W=R=64 (CUDA graph): {bench_cuda.decode_latency():.1f} us')"
      cd .. ;;
    s30t)   # session 30: the CUDA tests outside the kernel files (lowerings, examples,
      # export / AOTI, distributed) in two concurrent processes, -v so a cut keeps results
      export CXX=/usr/bin/g++
      run s30t_lowerings 570 python3 -m pytest -v -p no:cacheprovider -m cuda --durations=0 \
        tests/test_lowerings.py &
      run s30t_rest 570 python3 -m pytest -v -p no:cacheprovider -m cuda --durations=0 tests \
        --ignore tests/test_cuda.py --ignore tests/test_gated.py --ignore tests/test_nn.py \
        --ignore tests/test_lowerings.py &
      wait ;;
    s30a)   # for session 30 (NOTES.md run 29's leads): the ops rows (forward + backward
      # called directly, no kept Phase 1) with 32 x 32 backward product slices against the
      # 64 x 16 default, at A C = 64 / 128 and B C = 64 / 128; two no-grad token windows
      cd benchmarks
      for cfg in A B; do
        run ab30a_$cfg 150 python3 ab_cuda.py --config $cfg --chunks 64,128 --rounds 3 \
          --rows fb,ag --b MB_MIX_B=32 TB_MIX_B=32
      done
      # the no-grad forward in two token windows, the second's Phase 1 beside the first's
      # walk (measured 10-16 % slower in session 8, before Phase 1 and the walks changed)
      for cfg in A B; do
        run ab30a_win_$cfg 120 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 \
          --rows fwd --b WINDOW_TOKENS=4096 --c WINDOW_TOKENS=2048
      done
      cd .. ;;
    s29e)   # session 29: every CUDA-marked test (full_cuda) on the final defaults, then the
      # C = 256 rows (blocks form: *_WIDE slices) against 64-column / 16-token slices there
      full_cuda 450
      cd benchmarks
      for cfg in A B; do
        run ab29e_$cfg 60 python3 ab_cuda.py --config $cfg --chunks 256 --rounds 3 --rows ag \
          --b MB_MIX_B_WIDE=64 TB_MIX_B_WIDE=16
      done
      cd .. ;;
    s29d)   # session 29, final defaults (dense sources, one-warp Phase 1 grads, 64-column /
      # 16-token mix2 slices): the benchmark (all C, no extras) and the decode step
      cd benchmarks
      run bench29d 330 python3 bench_cuda.py --no-extras
      run decode29d 60 python3 -c "import bench_cuda
print(f'decode step P=16 T=1 hd=768 W=R=64 (CUDA graph): {bench_cuda.decode_latency():.1f} us')"
      cd .. ;;
    s29c)   # session 29: the dense sources' scan tiles; A/Bs (5 rounds) of the Phase 1
      # grads kernels in one / two warps and the 64-column / 16-token mix2 slices, alone
      # and together, at A (C = 64, 128) and B (C = 128); a profile with both
      cd benchmarks
      run t29c 60 python3 -m pytest -q -rA -p no:cacheprovider ../tests/test_cuda.py -k dense_sources
      run scan29c 100 python3 sources_cost.py --scan
      run ab29c_A 200 python3 ab_cuda.py --config A --chunks 64,128 --rounds 5 --rows ag \
        --b backward.PAIR_GRADS_WARPS=1 backward.GATE_GRADS_WARPS=1 \
        --c backward.PAIR_GRADS_WARPS=2 backward.GATE_GRADS_WARPS=2 \
        --d MB_MIX_B=64 TB_MIX_B=16 backward.PAIR_GRADS_WARPS=1 backward.GATE_GRADS_WARPS=1
      run ab29c_B 150 python3 ab_cuda.py --config B --chunks 128 --rounds 5 --rows ag \
        --b backward.PAIR_GRADS_WARPS=1 backward.GATE_GRADS_WARPS=1 \
        --c backward.PAIR_GRADS_WARPS=2 backward.GATE_GRADS_WARPS=2 \
        --d MB_MIX_B=64 TB_MIX_B=16 backward.PAIR_GRADS_WARPS=1 backward.GATE_GRADS_WARPS=1
      run prof29c 100 python3 -c "from sdm_inductor.kernels import host, backward
host.CONFIG.update(MB_MIX_B=64, TB_MIX_B=16)
backward.PAIR_GRADS_WARPS = backward.GATE_GRADS_WARPS = 1
import profile_autograd
profile_autograd.main(128, 45)"
      cd .. ;;
    s29a)   # session 29: the dense chunk-start sources (sources.DENSE): their CUDA tests,
      # their cost against the sorted form (asserted equal at A and B), A/Bs at A
      # (autograd, C=128) against the sorted form and against 64-column / 16-token mix2 slices
      run t29a 120 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py -k "sources"
      cd benchmarks
      run sources29a 120 python3 sources_cost.py
      run ab29a_A 200 python3 ab_cuda.py --config A --chunks 128 --rounds 3 --rows ag \
        --b sources.DENSE=0 --c MB_MIX_B=64 TB_MIX_B=16 \
        --d backward.PAIR_GRADS_WARPS=1 backward.GATE_GRADS_WARPS=1
      cd .. ;;
    s29b)   # session 29: the A/B at B, then a profile of the autograd step at A
      cd benchmarks
      run ab29b_B 200 python3 ab_cuda.py --config B --chunks 128 --rounds 3 --rows ag \
        --b sources.DENSE=0 --c MB_MIX_B=64 TB_MIX_B=16 \
        --d backward.PAIR_GRADS_WARPS=1 backward.GATE_GRADS_WARPS=1
      run prof29b 120 python3 profile_autograd.py 128 45
      cd .. ;;
    s28c)   # session 28, final tree: the CUDA tests of the pairs kernel's term lists, the
      # oracle and kept cases, then the benchmark (all C, no extras) and the decode step
      run t28c 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "pairs_term or oracle or kept or dev_and_groups"
      cd benchmarks
      run bench28c 330 python3 bench_cuda.py --no-extras
      run decode28c 60 python3 -c "import bench_cuda
print(f'decode step P=16 T=1 hd=768 W=R=64 (CUDA graph): {bench_cuda.decode_latency():.1f} us')"
      cd .. ;;
    s28b)   # session 28 (GRAM_AFTER measured slower and removed; commit 2aec06a holds it,
      # with this segment's test): the dQK / dL launch pipelined over constexpr columns; its CUDA test,
      # A/Bs against GRAM_AFTER=0, 16-token blocks, one backward window; profiles of the
      # autograd step with GRAM_AFTER off and on
      run t28b 120 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py -k "gram_grads"
      cd benchmarks
      for cfg in A B; do
        run ab28b_$cfg 170 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 \
          --rows ag --b GRAM_AFTER=0 --c step_backward.GRAM_TB=16 --d BWD_WINDOWS=1
      done
      for g in 0 1; do
        run prof28b_g$g 100 python3 -c "from sdm_inductor.kernels import host
host.CONFIG['GRAM_AFTER'] = $g
import profile_autograd
profile_autograd.main(128, 30)"
      done
      cd .. ;;
    s28a)   # session 28 (GRAM_AFTER measured slower and removed; commit 2aec06a holds it,
      # with its test): GRAM_AFTER (dQK / dL by one launch per window) and the pairs
      # kernel's term lists (phase1.PAIR_LIST): their CUDA tests and the oracle cases, A/Bs
      # at A and B C=128 (no-grad and autograd) against each off and against one backward
      # window, the PDL race check, then a profile of the autograd step
      run t28a 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "gram_grads or pairs_term or dev_and_groups or oracle or kept"
      cd benchmarks
      for cfg in A B; do
        run ab28a_$cfg 170 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 \
          --rows fwd,ag --b GRAM_AFTER=0 --c BWD_WINDOWS=1 --d phase1.PAIR_LIST=0
      done
      run pdl28a 100 python3 pdl_check.py --reps 2 --chunks 128
      run prof28a 100 python3 profile_autograd.py 128 45
      cd .. ;;
    s27a)   # session 27: DEV_DB (the backward's d ev and dB launches as one grid): its CUDA
      # test and the oracle cases on it, A/Bs at A and B C=128 (autograd), then the
      # benchmark's C=128 rows with it
      SDM_INDUCTOR_DEV_DB=1 run t27a 110 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "dev_and_groups or oracle or kept"
      cd benchmarks
      for cfg in A B; do
        run ab27a_$cfg 130 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 --rows ag \
          --b DEV_DB=1 --c DEV_DB=1 MAXNREG_DEV_DB=0
      done
      run bench27a 200 python3 bench_cuda.py --no-extras --chunks 128 --set DEV_DB=1
      cd .. ;;
    s27c)   # session 27: DEV_DB on (the default now): the arrangements' CUDA test, then A/Bs
      # of the backward's prelude split (sources beside groups; PRELUDE_SPLIT, measured
      # slower and removed, and the arrangements test with it), the forward's prelude
      # (PRELUDE=2) and DEV_DB off again, then the autograd step's kernel table
      run t27c 120 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py -k "arrangements"
      cd benchmarks
      for cfg in A B; do
        run ab27c_$cfg 140 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 --rows ag \
          --b PRELUDE_SPLIT=1 --c PRELUDE=2 --d DEV_DB=0
      done
      run prof27c 120 python3 profile_autograd.py 128 40
      cd .. ;;
    s27d)   # session 27: a PDL launch after a cross-stream join (pdl_event_check.py), DEV_DB's
      # CUDA test, the PDL race check at A and B C=128 (DEV_DB on), then the benchmark
      # (C = 64 and 128)
      run pdlev27d 40 python3 benchmarks/pdl_event_check.py
      run t27d 110 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py -k "dev_and_groups"
      cd benchmarks
      run pdl27d 100 python3 pdl_check.py --reps 2 --chunks 128
      run bench27d 260 python3 bench_cuda.py --no-extras --chunks 64,128
      cd .. ;;
    s27e)   # session 27: MIX1_BESIDE (the first backward product inside the d ev / dB launch;
      # measured slower and removed, commit 978ec4f holds it): A/Bs at A and B C=128, its
      # CUDA test, the PDL race check and the kernel tests with it on
      cd benchmarks
      for cfg in A B; do
        run ab27e_$cfg 70 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 --rows ag \
          --b MIX1_BESIDE=1 --c MIX1_BESIDE=1 MAXNREG_DEV_DB=0 --d NG_GROUP=64
      done
      SDM_INDUCTOR_MIX1_BESIDE=1 run pdl27e 60 python3 pdl_check.py --reps 1 --chunks 128
      cd ..
      SDM_INDUCTOR_MIX1_BESIDE=1 run t27e 200 python3 -m pytest -q -rA -p no:cacheprovider \
        tests/test_cuda.py -k "beside or oracle or kept or walk_graph or overlap or deterministic" ;;
    s27b)   # session 27, final: every CUDA-marked test (as `full`)
      full_cuda 560 ;;
    s26h)   # session 26, final tree (PRELUDE only): against session 25's tree (.old26,
      # carried: git archive 241e766 sdm_inductor), then every CUDA-marked test (as `full`,
      # under a shorter limit)
      run ab26h 200 python3 benchmarks/ab_trees.py --a .old26 --b . --configs A,B --chunks 128 --rounds 3
      full_cuda 370 ;;
    s26b)   # session 26, final: every CUDA-marked test (as `full`)
      full_cuda 540 ;;
    s26c)   # session 26: against session 25's tree (.old26, carried: git archive 241e766
      # sdm_inductor), then the benchmark
      run ab26c 240 python3 benchmarks/ab_trees.py --a .old26 --b . --configs A,B --chunks 128 --rounds 3
      cd benchmarks
      run bench26c 330 python3 bench_cuda.py
      cd .. ;;
    s25d)   # session 25: the sources' search over each slot's range of run starts, against
      # the tree before it (.old25, carried: git archive 48a69e6 sdm_inductor); its CUDA
      # tests; the profile of an autograd step
      run t25d 150 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py -k "sources or kept"
      run ab25d 240 python3 benchmarks/ab_trees.py --a .old25 --b . --configs A,B --chunks 128 --rounds 3
      cd benchmarks
      run prof25d 90 python3 profile_autograd.py 128 40
      cd .. ;;
    s25a)   # session 25: the dB groups in two launches over blocks of every segment, the
      # window sums by one kernel that skips the zero upper triangles of dQK / dL; their
      # CUDA tests; against session 24's tree (.old25, carried: git archive e4c3e09
      # sdm_inductor); where the autograd step spends GPU time now
      run t25a 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "walk_graph or oracle or kept or sources or launch_overlap or entry_groups or group_layouts or one_member or blocked_solve"
      run ab25a 300 python3 benchmarks/ab_trees.py --a .old25 --b . --configs A,B --chunks 128 --rounds 3
      cd benchmarks
      run prof25a 90 python3 profile_autograd.py 128 60
      cat "$OUT/prof25a.log" | tail -75
      cd .. ;;
    s25b)   # session 25: knobs on the new tree (the solve in one launch, two backward windows,
      # smaller group blocks), then the benchmark
      cd benchmarks
      for cfg in A B; do
        run ab25b_$cfg 130 python3 ab_cuda.py --config $cfg --chunks 128 --rounds 3 --plan --rows fwd,ag \
          --b solve.BLOCKED_SPLIT=0 --c BWD_WINDOWS=2 --d phase1.GROUPS_BLOCK=512
      done
      run bench25b 310 python3 bench_cuda.py --no-extras
      cd .. ;;
    s25c)   # session 25, final: every CUDA-marked test (as `full`)
      full_cuda 540 ;;
    s24b)   # session 24: the backward's dv stored in the bank's dtype, the window sums
      # straight into their slices, dA / the decay term formed in _pair_grads_kernel;
      # against session 23's tree (.old24, carried: git archive f3a8ac7 sdm_inductor)
      run t24b 240 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "walk_graph or oracle or kept or sources or launch_overlap"
      run ab24b 300 python3 benchmarks/ab_trees.py --a .old24 --b . --configs A,B --chunks 128 --rounds 3 ;;
    s24a)   # session 24: how soon the fp32 training loop's walks replay (replay_loop.py),
      # per-kernel times and Nsight Compute of Dw / d ev at A C=128, the dB launch's shape
      # re-tried beside its one-member path
      run replay24 150 python3 benchmarks/replay_loop.py --steps 16
      cat "$OUT/replay24.log" | head -80
      cd benchmarks
      run prof24_A 150 python3 profile_cuda.py 128 --tables-only PDL=0 WALK_GRAPHS=0
      python3 ncu_step.py A 128 PDL=0 > "$OUT/ncu_warm.log" 2>&1
      for k in _step_bwd_dw_kernel _step_bwd_dev_kernel; do
        run ncu24_$k 90 "$NCU" --profile-from-start off --clock-control none -k regex:"^$k" \
          --launch-skip 5 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
          python3 ncu_step.py A 128 PDL=0
        grep -E "Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|No Eligible|Registers|Achieved Occ|Stall|L2 Hit|L1/TEX Hit|Mem Busy|Max Bandwidth" "$OUT/ncu24_$k.log"
      done
      run ab24a 200 python3 ab_cuda.py --config A --chunks 128 --rows ag --rounds 3 \
        --b WARPS_GROUP=4 --c NG_GROUP=64 --d KW_GROUP=1
      cd .. ;;
    s23d)   # session 23, final: the benchmark, then every CUDA-marked test (as `full`)
      cd benchmarks
      run bench23d 300 python3 bench_cuda.py --no-extras
      cd ..
      full_cuda 470 ;;
    s23c)   # session 23: the write launch over split run headers (RUN_ONE) against headers
      # by position; the split groups' order (phase1.SPLIT_LONG_FIRST); their CUDA tests.
      # Ran at commit f181464; RUN_ONE (slower) and SPLIT_LONG_FIRST were removed after it
      # (NOTES.md run 23), so its A/B rows now stop
      run t23c 300 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "one_member or group_layouts or entry_groups or oracle"
      cd benchmarks
      ab="--rounds 3 --a RUN_ONE=0 --b RUN_ONE=1 --c RUN_ONE=1 phase1.SPLIT_LONG_FIRST=0"
      run ab23c_A 200 python3 ab_cuda.py --config A --chunks 128 --rows fwd,ag $ab
      run ab23c_B 150 python3 ab_cuda.py --config B --chunks 128 --rows fwd,ag $ab
      python3 ncu_step.py A 128 PDL=0 > "$OUT/ncu_warm.log" 2>&1
      for v in 0 1; do
        run ncu_write_$v 90 "$NCU" --profile-from-start off --clock-control none \
          -k regex:"^_step_write_kernel" --launch-skip 5 --launch-count 1 \
          --section SpeedOfLight --section LaunchStats --section SchedulerStats \
          --section Occupancy python3 ncu_step.py A 128 PDL=0 RUN_ONE=$v
        grep -E "Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|No Eligible|Registers|Achieved Occ" "$OUT/ncu_write_$v.log"
      done
      run bench23 300 python3 bench_cuda.py --no-extras
      cd .. ;;
    s23b)   # session 23: the one-member dB path with all column blocks' loads first and
      # the first member in the group header (GROUP_ONE=2) against the path of s23a (1)
      # and session 22's default (packed, no path)
      run t23b 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "group_layouts or entry_groups"
      cd benchmarks
      ab="--rows ag --rounds 3 --a GROUP_PACK=1 GROUP_ONE=0 --b GROUP_PACK=2 GROUP_ONE=2 --c GROUP_PACK=2 GROUP_ONE=1"
      run ab23b_A 150 python3 ab_cuda.py --config A --chunks 128 $ab
      run ab23b_B 120 python3 ab_cuda.py --config B --chunks 128 $ab
      python3 ncu_step.py A 128 PDL=0 > "$OUT/ncu_warm.log" 2>&1
      run ncu_group_22 90 "$NCU" --profile-from-start off --clock-control none \
        -k regex:"^_step_bwd_group_kernel" --launch-skip 5 --launch-count 1 \
        --section SpeedOfLight --section LaunchStats --section SchedulerStats \
        --section Occupancy --section WarpStateStats \
        python3 ncu_step.py A 128 PDL=0 GROUP_PACK=2 GROUP_ONE=2
      grep -E "Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|No Eligible|Registers|Achieved Occ|Stall" "$OUT/ncu_group_22.log"
      cd .. ;;
    s23a)   # session 23: the dB groups split by length (GROUP_PACK=2) and the dB launch's
      # one-member path (GROUP_ONE); side A is session 22's default (packed, no path)
      run t23a 240 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "group_layouts or entry_groups or oracle"
      cd benchmarks
      ab="--rows ag --rounds 3 --a GROUP_PACK=1 GROUP_ONE=0 --b GROUP_PACK=2 GROUP_ONE=1"
      run ab23a_A 150 python3 ab_cuda.py --config A --chunks 128 $ab --c GROUP_PACK=2 GROUP_ONE=0
      run ab23a_B 120 python3 ab_cuda.py --config B --chunks 128 $ab --c GROUP_PACK=2 GROUP_ONE=0
      run ab23a_A2 150 python3 ab_cuda.py --config A --chunks 64,256 $ab
      python3 ncu_step.py A 128 PDL=0 > "$OUT/ncu_warm.log" 2>&1
      for v in "1 0" "2 1" "2 0"; do
        set -- $v
        run ncu_group_$1$2 90 "$NCU" --profile-from-start off --clock-control none \
          -k regex:"^_step_bwd_group_kernel" --launch-skip 5 --launch-count 1 \
          --section SpeedOfLight --section LaunchStats --section SchedulerStats \
          python3 ncu_step.py A 128 PDL=0 GROUP_PACK=$1 GROUP_ONE=$2
        grep -E "Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|No Eligible" "$OUT/ncu_group_$1$2.log"
      done
      cd .. ;;
    s22c)   # session 22: the groups by one kernel (phase1.entry_groups; GROUPS_KERNEL=0: the
      # torch form, as in session 21), packed or not; the AOTI check with the system compiler
      run t22c 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "group_layouts or entry_groups or kept or sources or launch_overlap or oracle"
      cd benchmarks
      ab="--rows ag --rounds 3 --a phase1.GROUPS_KERNEL=0 GROUP_PACK=0 --b GROUP_PACK=1 --c GROUP_PACK=0"
      run ab22c_A 150 python3 ab_cuda.py --config A --chunks 64,128 $ab
      run ab22c_B 80 python3 ab_cuda.py --config B --chunks 128 $ab
      run ab22c_A256 80 python3 ab_cuda.py --config A --chunks 256 $ab
      cd ..
      export CXX=/usr/bin/g++
      run aoti_poison 300 python3 benchmarks/aoti_poison.py 2 ;;
    s22b)   # session 22: the intermittent AOTI CUDA failure (reads of unwritten memory?);
      # GROUP_PACK alone at A C=64 / 256; the dB launch in Nsight Compute, both layouts
      run aoti_poison 300 python3 benchmarks/aoti_poison.py 3
      cd benchmarks
      run ab22b 150 python3 ab_cuda.py --config A --chunks 64,256 --rows ag --rounds 3 \
        --a GROUP_PACK=0 --b GROUP_PACK=1
      python3 ncu_step.py A 128 PDL=0 > "$OUT/ncu_warm.log" 2>&1
      for v in 0 1; do
        run ncu_group_pack$v 90 "$NCU" --profile-from-start off --clock-control none \
          -k regex:"^_step_bwd_group_kernel" --launch-skip 5 --launch-count 1 \
          --section SpeedOfLight --section LaunchStats --section SchedulerStats \
          python3 ncu_step.py A 128 PDL=0 GROUP_PACK=$v
        grep -E "Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|No Eligible" "$OUT/ncu_group_pack$v.log"
      done
      cd .. ;;
    s22a)   # session 22: the dB launch over packed group headers (GROUP_PACK) and the
      # backward's groups and sources made beside the training forward's walk (KEEP_GROUPS);
      # their CUDA tests first; A/Bs with the old behaviour (both 0) as side A. Ran at
      # commit 0688485; KEEP_GROUPS was removed after it (NOTES.md run 22)
      run t22 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "group_layouts or kept or sources or launch_overlap"
      cd benchmarks
      run ab22_A 200 python3 ab_cuda.py --config A --chunks 128 --rows ag --rounds 3 \
        --a GROUP_PACK=0 KEEP_GROUPS=0 --b GROUP_PACK=1 KEEP_GROUPS=0 \
        --c GROUP_PACK=0 KEEP_GROUPS=1 --d GROUP_PACK=1 KEEP_GROUPS=1
      run ab22_B 120 python3 ab_cuda.py --config B --chunks 128 --rows ag --rounds 3 \
        --a GROUP_PACK=0 KEEP_GROUPS=0 --b GROUP_PACK=1 KEEP_GROUPS=0 \
        --c GROUP_PACK=0 KEEP_GROUPS=1 --d GROUP_PACK=1 KEEP_GROUPS=1
      run ab22_A256 100 python3 ab_cuda.py --config A --chunks 256 --rows ag --rounds 3 \
        --a GROUP_PACK=0 KEEP_GROUPS=0 --b GROUP_PACK=1 KEEP_GROUPS=1
      cd .. ;;
    s21a)   # session 21: the backward's chunk-start rows from the final bank and the log
      # (SOURCES=1, no restore launch) against the restoring walk; its CUDA tests first
      run t21 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "sources or bitwise or oracle or snapshot or kept"
      cd benchmarks
      run ab21_A 150 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fb \
        --rounds 3 --a SOURCES=0 --b SOURCES=1
      run ab21_B 80 python3 ab_cuda.py --graph --config B --chunks 128 --rows fb \
        --rounds 3 --a SOURCES=0 --b SOURCES=1
      run ab21_ag 150 python3 ab_cuda.py --config A --chunks 128,256 --rows ag \
        --rounds 3 --a SOURCES=0 --b SOURCES=1
      run ab21_agB 80 python3 ab_cuda.py --config B --chunks 128 --rows ag \
        --rounds 3 --a SOURCES=0 --b SOURCES=1
      cd .. ;;
    s21b)   # session 21, final: what the sources cost, then the benchmark
      cd benchmarks
      run sources_cost 100 python3 sources_cost.py
      cd ..
      run bench_cuda 250 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" ;;
    s21c)   # session 21: the sources by two launches and torch's sort; their tests, their
      # cost, the A/B again; the AOTI CUDA test that failed in `full` (forward only), again
      run t21c 150 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py \
        -k "sources or launch_overlap or kept"
      cd benchmarks
      run sources_cost 100 python3 sources_cost.py
      run ab21c_ag 100 python3 ab_cuda.py --config A --chunks 128 --rows ag --rounds 3 \
        --a SOURCES=0 --b SOURCES=1
      run ab21c_agB 60 python3 ab_cuda.py --config B --chunks 128 --rows ag --rounds 3 \
        --a SOURCES=0 --b SOURCES=1
      cd ..
      export CXX=/usr/bin/g++
      run aoti21 200 python3 -m pytest -q -rA -p no:cacheprovider tests/test_export_aoti.py \
        -k aoti_cuda_dynamic ;;
    s20a)   # session 20: the walk-graph cache in a training loop of 6 layers; the d ev
      # partials in the dB launch (DEV_GROUP=1) against their own launch: measured on
      # commit 593c113, slower, removed (NOTES.md run 20; DEV_GROUP is no setting now)
      run walk_cache 120 python3 benchmarks/walk_cache_check.py
      cd benchmarks
      run ab20_A 150 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fb \
        --rounds 3 --a DEV_GROUP=0 --b DEV_GROUP=1
      run ab20_B 80 python3 ab_cuda.py --graph --config B --chunks 128 --rows fb \
        --rounds 3 --a DEV_GROUP=0 --b DEV_GROUP=1
      run ab20_ag 150 python3 ab_cuda.py --config A --chunks 128,256 --rows ag \
        --rounds 3 --a DEV_GROUP=0 --b DEV_GROUP=1
      cd .. ;;
    s20b)   # session 20: chunk c - 1's restore between chunk c's d ev and dB launches
      # (RESTORE_AHEAD=1) against at the start of chunk c - 1: measured on commit fccc27f,
      # slower, removed (no setting now); PDL=2 against 3 at C=256 (session 18's open
      # question); then the CUDA kernel tests
      cd benchmarks
      run ab20_ra 150 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fb \
        --rounds 3 --a RESTORE_AHEAD=0 --b RESTORE_AHEAD=1
      run ab20_raB 80 python3 ab_cuda.py --graph --config B --chunks 128 --rows fb \
        --rounds 3 --a RESTORE_AHEAD=0 --b RESTORE_AHEAD=1
      run ab20_raag 150 python3 ab_cuda.py --config A --chunks 128,256 --rows ag \
        --rounds 3 --a RESTORE_AHEAD=0 --b RESTORE_AHEAD=1 --c PDL=2 RESTORE_AHEAD=0 \
        --d PDL=2 RESTORE_AHEAD=1
      run ab20_raagB 80 python3 ab_cuda.py --config B --chunks 128 --rows ag \
        --rounds 3 --a RESTORE_AHEAD=0 --b RESTORE_AHEAD=1
      cd ..
      run t20 280 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/test_cuda.py ;;
    s20c)   # session 20, final: the benchmark, PDL3_MAX_C (the backward's PDL=3 up to C=128)
      # against PDL=3 at every C, the walk-graph cache check
      run bench_cuda 200 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json"
      cd benchmarks
      run ab20_p3 100 python3 ab_cuda.py --config A --chunks 256 --rows ag --rounds 3 \
        --a PDL3_MAX_C=256 --b PDL3_MAX_C=128
      run ab20_p3B 60 python3 ab_cuda.py --config B --chunks 256 --rows ag --rounds 3 \
        --a PDL3_MAX_C=256 --b PDL3_MAX_C=128
      cd ..
      run walk_cache 120 python3 benchmarks/walk_cache_check.py ;;
    s20d)   # session 20: the walk-graph cache check, then every CUDA-marked test
      run walk_cache 100 python3 benchmarks/walk_cache_check.py
      bash "$0" full ;;
    s18a)   # session 18: per-kernel tables (own times, PDL=0) of A and B at C=128, then knobs
      cd benchmarks
      export SDM_INDUCTOR_WALK=step
      run prof18_A 150 python3 profile_cuda.py 128 --tables-only PDL=0 WALK_GRAPHS=0
      run prof18_B 150 python3 profile_cuda.py 128 --tables-only --config=B PDL=0 WALK_GRAPHS=0
      unset SDM_INDUCTOR_WALK
      run ab18_A 200 python3 ab_cuda.py --graph --config A --chunks 128 --rows fb \
        --rounds 3 --b PDL=3 --c BWD_WINDOWS=2 --d CL_GROUP=2
      cd .. ;;
    s18b)   # session 18: PDL=3 again (run 18 measured 0.981 once), the backward's shapes
      cd benchmarks
      run ab18_pdl 120 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fwd,fb \
        --rounds 3 --b PDL=3
      run ab18_pdlB 90 python3 ab_cuda.py --graph --config B --chunks 128 --rows fwd,fb \
        --rounds 3 --b PDL=3
      run ab18_grp 90 python3 ab_cuda.py --graph --config A --chunks 128 --rows fb \
        --rounds 3 --b NG_GROUP=64 --c WARPS_GROUP=4 --d BD_GROUP=128 CL_GROUP=2
      run ab18_grp2 90 python3 ab_cuda.py --graph --config A --chunks 128 --rows fb \
        --rounds 3 --b KW_GROUP=1 --c KW_GROUP=4 --d NG_GROUP=16
      run ab18_rows 90 python3 ab_cuda.py --graph --config A --chunks 128 --rows fb \
        --rounds 3 --b WARPS_STEP_B=2 --c WARPS_STEP_B=8 --d BD_STEP_B=64
      run ab18_dw 90 python3 ab_cuda.py --graph --config A --chunks 128 --rows fb \
        --rounds 3 --b BD_DW=64 --c WARPS_DW=8 --d NG_STEP=64
      run ab18_fw 90 python3 ab_cuda.py --graph --config A --chunks 128 --rows fwd \
        --rounds 3 --b NG_STEP=64 --c KW_STEP=4 --d WARPS_STEP_W=8
      cd .. ;;
    s18d)   # session 18: PDL=3 (the new default) against 2 in eager autograd calls (the
      # forward's v - r0 kept: the first product launch runs before its wait), then the
      # benchmark and the host / eager / graph times on the final defaults
      cd benchmarks
      run ab18_ag 150 python3 ab_cuda.py --config A --chunks 64,128 --rows ag --rounds 3 \
        --a PDL=2 --b PDL=3
      run ab18_agB 90 python3 ab_cuda.py --config B --chunks 128 --rows ag --rounds 3 \
        --a PDL=2 --b PDL=3
      cd ..
      run bench_cuda 300 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json"
      cd benchmarks
      run host18 120 python3 host_bound.py A:64 A:128 B:128
      cd .. ;;
    s18e)   # session 18: PDL=3 without the first product's early run (MIX1_EARLY=0), autograd
      cd benchmarks
      run ab18_ag2 150 python3 ab_cuda.py --config A --chunks 64,128 --rows ag --rounds 3 \
        --a PDL=2 --b PDL=3 --c PDL=3 MIX1_EARLY=0
      run ab18_ag2B 90 python3 ab_cuda.py --config B --chunks 128 --rows ag --rounds 3 \
        --a PDL=2 --b PDL=3 --c PDL=3 MIX1_EARLY=0
      cd .. ;;
    s18f)   # session 18, final: the kernel tests and the benchmark on the final defaults (PDL=3,
      # the first backward product waiting as with 2)
      run t18 260 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/test_cuda.py
      run bench_cuda 150 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" ;;
    s18g)   # session 18: PDL=3 against 2 at C=256 in autograd calls (the final benchmark's
      # C=256 autograd rows read 3-4 % slower than session 17's)
      cd benchmarks
      run ab18_ag256 100 python3 ab_cuda.py --config A --chunks 256 --rows ag --rounds 3 \
        --a PDL=2 --b PDL=3
      cd .. ;;
    s17d)   # session 17: the product launches' token blocks and column slices with MIX_ROWS on
      cd benchmarks
      run ab_tb_A 150 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fwd \
        --rounds 3 --b TB_MIX=16 --c TB_MIX=64 --d MB_MIX=16
      run ab_tbb_A 150 python3 ab_cuda.py --graph --config A --chunks 64,128 --rows fb \
        --rounds 3 --b TB_MIX_B=16 --c MB_MIX_B=16 --d TB_MIX_B=64
      run ab_tb_B 100 python3 ab_cuda.py --graph --config B --chunks 128 --rows fwd,fb \
        --rounds 3 --b TB_MIX=16 TB_MIX_B=16 --c MB_MIX=16 MB_MIX_B=16
      cd .. ;;
    s16h)   # session 16: Relaunch through the launcher's C entry point (launch.DIRECT) against
      # its Python wrapper: the eager call's host time; then every CUDA-marked test
      cd benchmarks
      run hostd1 100 python3 host_bound.py A:128
      run hostd0 100 python3 host_bound.py A:128 launch.DIRECT=0
      grep -h "fwd\|fb" "$OUT"/hostd1.log "$OUT"/hostd0.log
      cd ..
      bash "$0" full ;;
    final15b)   # session 15: the kernel tests with the pairs kernel's final defaults, then the
      # benchmark (with its new unrecorded warm-up rows)
      run test_cuda_f 260 python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py
      run bench_cuda 170 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" ;;
    aoti14)   # session 14: the AOTI CUDA test that failed in session 13 (first, alone)
      CXX=/usr/bin/g++ run aoti_dyn 250 python3 -m pytest -q -rA -p no:cacheprovider \
        tests/test_export_aoti.py -k cuda_dynamic ;;
    win14)   # session 14: no-grad windows with a short first window and the walk on a
      # high-priority stream beside the plans ahead (pipeline.priority)
      cd benchmarks
      for cfg in A B; do
        run ab_win_$cfg 200 python3 ab_cuda.py --config $cfg --chunks 128 --rows fwd --rounds 3 \
          --b WINDOW_TOKENS=4096 --c WINDOW_TOKENS=2048 FIRST_WINDOW_TOKENS=1024 WALK_PRIORITY=1 \
          --d WINDOW_TOKENS=4096 FIRST_WINDOW_TOKENS=2048 WALK_PRIORITY=1
      done
      cd .. ;;
    tl14)   # session 14: the windowed no-grad call's timeline by stream; the L1 / L2 limiters
      # of the forward gather and write launches (Nsight Compute breakdowns)
      cd benchmarks
      run timeline_A 150 python3 timeline.py A 128 fwd "" "WINDOW_TOKENS=4096" \
        "WINDOW_TOKENS=4096 PLAN_AHEAD=0" "WINDOW_TOKENS=4096 WALK_PRIORITY=1"
      run ncu_gw 150 "$NCU" --profile-from-start off --clock-control none \
        -k regex:"^_step_(gather|write)_kernel" --launch-skip 10 --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables \
        --metrics breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active,breakdown:lts__throughput.avg.pct_of_peak_sustained_active \
        python3 ncu_step.py A 128 PDL=0
      cd .. ;;
    gw14)   # session 14: the forward gather in one or two warps per program (its four warps'
      # cross-warp sums went through shared memory with 10-way bank conflicts: ncu)
      cd benchmarks
      run ab_gw_A 200 python3 ab_cuda.py --config A --chunks 64,128 --rows fwd,ag --rounds 3 \
        --b WARPS_STEP=1 MAXNREG_STEP=0 --c WARPS_STEP=2 MAXNREG_STEP=0 --d WARPS_STEP=1 MAXNREG_STEP=128
      run ab_gw_B 150 python3 ab_cuda.py --config B --chunks 128 --rows fwd,ag --rounds 3 \
        --b WARPS_STEP=1 MAXNREG_STEP=0 --c WARPS_STEP=2 MAXNREG_STEP=0
      run prof_host_win 100 python3 profile_host.py 128 4096
      cd .. ;;
    bw14)   # session 14: the backward row passes' shared-memory traffic (ncu), and their warps
      cd benchmarks
      run ncu_bw 150 "$NCU" --profile-from-start off --clock-control none \
        -k regex:"^_step_(restore|bwd_dw|bwd_dev|bwd_group)_kernel" --launch-skip 8 --launch-count 4 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section Occupancy \
        --metrics breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active \
        python3 ncu_step.py A 128 PDL=0
      run ab_bw_A 200 python3 ab_cuda.py --config A --chunks 128 --rows ag --rounds 3 \
        --b WARPS_DW=2 --c WARPS_STEP_B=2 --d WARPS_STEP_B=2 WARPS_DW=4
      cd .. ;;
    dw14)   # session 14: the backward's Dw launch in fewer warps (its cross-warp sum had ~9-way
      # bank conflicts too), then the benchmark
      cd benchmarks
      run ab_dw_A 200 python3 ab_cuda.py --config A --chunks 64,128 --rows ag --rounds 3 \
        --b WARPS_DW=1 BD_DW=64 --c WARPS_DW=2 BD_DW=64 --d WARPS_DW=2
      cd ..
      run bench_cuda 200 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" ;;
    p1ncu14)   # session 14: Phase 1's kernels' shared-memory traffic (ncu)
      cd benchmarks
      run ncu_p1 150 "$NCU" --profile-from-start off --clock-control none \
        -k regex:"^_(pairs|prep|groups)_kernel" --launch-count 4 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section Occupancy \
        --section LaunchStats --metrics breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active \
        python3 ncu_step.py A 128 PDL=0
      cd .. ;;
    prep14)   # session 14: Phase 1's prep kernel in fewer warps (4 warps: 5.8 k warp
      # instructions per token, issue-bound; 1 warp: 2.4 k)
      cd benchmarks
      run ab_prep_A 200 python3 ab_cuda.py --config A --chunks 64,128 --plan --rows fwd,ag --rounds 3 \
        --b phase1.PREP_WARPS=1 --c phase1.PREP_WARPS=2
      run ab_prep_B 120 python3 ab_cuda.py --config B --chunks 128 --plan --rows fwd --rounds 3 \
        --b phase1.PREP_WARPS=1 --c phase1.PREP_WARPS=2
      cd .. ;;
    bd14)   # session 14: the one-warp forward gather over 64 columns (96 registers)
      cd benchmarks
      run ab_bd_A 150 python3 ab_cuda.py --config A --chunks 64,128 --rows fwd --rounds 3 --b BD_STEP=64
      run ab_bd_B 100 python3 ab_cuda.py --config B --chunks 128 --rows fwd --rounds 3 --b BD_STEP=64
      cd .. ;;
    final14)   # session 14: the kernels' CUDA tests, then the benchmark
      run cuda_tests 300 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/test_cuda.py \
        tests/test_gated.py tests/test_nn.py
      run bench_cuda 200 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json" ;;
    walloc14)   # session 14: the allocator's work in windowed no-grad calls
      cd benchmarks
      run window_alloc 150 python3 window_alloc.py A 128 8192 4096 2048
      cd .. ;;
    final12)   # session 12: the benchmark, then every other CUDA-marked test (lowerings,
      # examples, export, AOTI with the system compiler)
      export CXX=/usr/bin/g++
      run bench_cuda 200 python3 benchmarks/bench_cuda.py --json "$OUT/bench_cuda.json"
      run cuda_rest 360 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests \
        --ignore tests/test_cuda.py --ignore tests/test_gated.py --ignore tests/test_nn.py ;;
    walks12)   # session 12: step against column walks over GRID, then HELD_OUT
      cd benchmarks
      run walks_grid 420 python3 bench_walks.py --grid --rounds 2
      cd .. ;;
    compile11)   # session 11: compiled calls with the kept backward; per-kernel profile
      export CXX=/usr/bin/g++
      run bench_compile_aot 300 python3 benchmarks/bench_compile.py --configs A,B --cases op \
        --reps 5 --no-model
      cd benchmarks
      run profile_phase1 120 python3 profile_phase1.py 128 --whole PDL=0
      cd .. ;;
    *) echo "unknown segment $seg" ;;
  esac
done
