#!/usr/bin/env bash
# One device call on the H200: versions, GPU tests, cross-process repeat, benchmark,
# and the main job. Everything lands in $OUT. Usage (repo root): bash shared/gpu/run_h200.sh [parts]
# parts: any of env tests det bench tinylm profile dense lmhead tests3 partests parconfigs kcp2 kcp1 kcptests moelayer
# kdahash kdatime burn mixload ndbench ndtests graphs, and <fam>tests
# <fam>bench <fam>configs for fam in gdn kda conv gate, moetests moebench, mhctests mhcbench, tftests tfbench (cake-transformers; tfbench wants the anchor pack on PYTHONPATH for its hf / liger runs) (default: the first five). Seen 2026-11-29: the GPU test
# suite needs over 5 minutes (Triton compiles each plan configuration), det ~30 s, bench
# ~2.5 min, tinylm ~70 s: run "env tests" in one call and "det bench tinylm" in another.
set -uo pipefail
OUT=${OUT:-/tmp/cake-gpu-out}; mkdir -p "$OUT"
PARTS=${*:-env tests det bench tinylm}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$(ls -d packages/*/src | paste -sd:)
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
has() { [[ " $PARTS " == *" $1 "* ]]; }
if has env; then
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())"
    date -u; } 2>&1 | tee "$OUT/env.txt"
fi
if has tests; then
  timeout 560 python3 -m pytest -q -p no:cacheprovider packages/cake-core/tests \
    packages/cake-rmsnorm-det-train/tests 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -15
fi
if has det; then
  for i in 1 2; do python3 shared/gpu/det_hash.py 32768 4096 bfloat16; done 2>&1 | tee "$OUT/det_hash.txt"
  python3 shared/gpu/det_hash.py 16384 8192 float32 2>&1 | tee -a "$OUT/det_hash.txt"
  python3 shared/gpu/det_hash.py 16384 8192 float32 2>&1 | tee -a "$OUT/det_hash.txt"
fi
if has bench; then
  timeout 420 python3 packages/cake-rmsnorm-det-train/benchmarks/bench_cake_rmsnorm_det_train.py \
    --graph --out "$OUT/rmsnorm_bench.json" 2>&1 | tee "$OUT/bench.txt"
fi
if has profile; then
  timeout 150 python3 shared/gpu/profile_rmsnorm.py 2>&1 | tee "$OUT/profile_rmsnorm.txt"
fi
if has lmhead; then
  timeout ${LMHEAD_TIMEOUT:-240} python3 \
    packages/cake-lm-head-loss-det-train/benchmarks/bench_cake_lm_head_loss_det_train.py \
    --out "$OUT/lmhead_bench.json" 2>&1 | tee "$OUT/lmhead_bench.txt"
fi
if has dense; then
  timeout ${DENSE_TIMEOUT:-280} python3 \
    packages/cake-dense-projection-det-gemm/benchmarks/bench_cake_dense_projection_det_gemm.py \
    ${DENSE_ARGS---sweep} --out "$OUT/dense_bench.json" 2>&1 | tee "$OUT/dense_bench.txt"
fi
if has tests3; then
  timeout 560 python3 -m pytest -q -p no:cacheprovider packages/cake-dense-projection-det-gemm/tests \
    packages/cake-lm-head-loss-det-train/tests 2>&1 | tee "$OUT/pytest_gpu3.txt" | tail -25
fi
# <fam>tests: a family's test files in parallel processes (compiling dominates; 16 cores);
# <fam>bench: its benchmark with $<FAM>_ARGS; <fam>configs: every plan configuration of
# shared/gpu/plan_configs.py against float64. fam: gdn, kda, conv, gate (gated norm).
famtests() {  # $1 id, $2 package folder
  local i=0
  for f in packages/$2/tests/test_*.py; do
    i=$((i+1))
    timeout ${FAM_TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -rf "$f" \
      > "$OUT/pytest_$1_$i.txt" 2>&1 &
  done
  wait
  for f in "$OUT"/pytest_$1_*.txt; do echo "== $f"; grep -E "passed|failed|FAILED|Error" "$f" | tail -12; done
}
fambench() {  # $1 id, $2 package folder, $3 extra args
  local mod=${2//-/_}
  timeout ${FAM_BENCH_TIMEOUT:-400} python3 packages/$2/benchmarks/bench_$mod.py $3 \
    --out "$OUT/$1_bench.json" 2>&1 | tee "$OUT/$1_bench.txt"
}
declare -A FAMPKG=([gdn]=cake-gdn-det-train [kda]=cake-kda-det-train
                   [conv]=cake-causal-conv1d-det-train [gate]=cake-rmsnorm-silu-gate-det-train)
FAMPKG[moe]=cake-moe-grouped-det-gemm  # moetests, moebench (no moeconfigs)
FAMPKG[mhc]=cake-mhc-det-train  # mhctests, mhcbench
FAMPKG[tf]=cake-transformers  # tftests; tfbench (benchmarks/bench_cake_transformers.py, $TF_ARGS)
# KCP packages: <fam>tests run their gloo/NCCL process-group tests on as many GPUs as each
# test's world size needs (skipped when fewer are visible): nvidia-h200-x2 runs W = 2 under
# NCCL, nvidia-h200-x4 also W = 3 and 4. "kcptests" = all three.
FAMPKG[gdn_kcp]=cake-gdn-det-train-kcp
FAMPKG[kda_kcp]=cake-kda-det-train-kcp
FAMPKG[conv_kcp]=cake-causal-conv1d-det-train-kcp
if has kcptests; then
  for fam in gdn_kcp kda_kcp conv_kcp; do famtests $fam ${FAMPKG[$fam]} & done
  wait
fi
# partests: the test files of every family in $PAR_FAMS (default: all four) at once.
if has partests; then
  for fam in ${PAR_FAMS:-gdn kda conv gate}; do famtests $fam ${FAMPKG[$fam]} & done
  wait
fi
# parconfigs: plan_configs.py of gdn and kda side by side.
if has parconfigs; then
  for fam in gdn kda; do
    timeout ${FAM_CONFIGS_TIMEOUT:-400} python3 shared/gpu/plan_configs.py $fam \
      > "$OUT/${fam}_configs.txt" 2>&1 &
  done
  wait; tail -n 40 "$OUT"/*_configs.txt
fi
for fam in "${!FAMPKG[@]}"; do
  has ${fam}tests && famtests $fam ${FAMPKG[$fam]}
  argvar=${fam^^}_ARGS
  has ${fam}bench && fambench $fam ${FAMPKG[$fam]} "${!argvar-}"
  has ${fam}configs && timeout ${FAM_CONFIGS_TIMEOUT:-400} python3 shared/gpu/plan_configs.py \
    $fam 2>&1 | tee "$OUT/${fam}_configs.txt"
done
# ndbench: every nondet package's benchmark against its det sibling (issue 44: nondet / det),
# one after another, each log in $OUT/nd_<pkg>.txt and its summary lines here; ndtests: the
# nondet packages' suites, in parallel processes.
if has ndbench; then
  for b in packages/cake-*-nondet-*/benchmarks/bench_*.py; do
    pkg=$(basename "$(dirname "$(dirname "$b")")")
    args="--out $OUT/nd_$pkg.json"
    case $pkg in
      *kcp) args="$args --world-size 1 --seqlen 65536 --docs 8 --boundary random --check";;
      *gdn*|*kda*) args="$args --impls nondet,det --reps 20 --hash";;
      *conv*|*lm-head*) args="$args --check";;
    esac
    timeout ${ND_TIMEOUT:-150} python3 "$b" $args > "$OUT/nd_$pkg.txt" 2>&1
    echo "== $pkg rc $?"; grep -iE "ratio|nondet|error|[0-9]x[0-9]" "$OUT/nd_$pkg.txt" | tail -10
  done
fi
if has ndtests; then
  for d in packages/cake-*-nondet-*/; do
    id=$(basename "$d"); i=0
    for f in "$d"tests/test_*.py; do
      i=$((i+1))
      timeout ${FAM_TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -rf "$f" \
        > "$OUT/pytest_${id}_$i.txt" 2>&1 &
    done
  done
  wait
  grep -hE "passed|failed|FAILED|Error" "$OUT"/pytest_cake-*nondet*_*.txt | tail -40
fi
# kcp2 (on nvidia-h200-x2): every KCP benchmark with --check --base local at T = 65536 over
# 2 GPUs (NCCL), both layouts; then the main job with --cp 2 (GDN block; $CP_STEPS steps).
if has kcp2; then
  for fam in ${KCP_FAMS:-gdn kda causal-conv1d}; do
    mod=cake_${fam//-/_}_det_train_kcp
    for L in contiguous zigzag; do
      timeout ${KCP_TIMEOUT:-150} torchrun --nproc-per-node 2 \
        packages/cake-$fam-det-train-kcp/benchmarks/bench_${mod}.py --seqlen 65536 --docs 8 \
        --boundary random --layout $L --base local --check --out "$OUT/kcp_${fam}_$L.json" \
        2>&1 | tee "$OUT/kcp_${fam}_$L.txt" | grep -E '"(kcp_fwd_bwd_ms_slowest_rank|local_fwd_bwd_ms|speedup_vs_local|repeat_bitwise_all_ranks|max_rel_err)"' \
        | sed "s/^/$fam $L /"
    done
  done
  timeout ${CP_TIMEOUT:-300} python3 -m cake_tinylm train --mixer ${CP_MIXER:-gdn} --cp 2 \
    --steps ${CP_STEPS:-60} --out "$OUT/tinylm_cp" --no-progress 2>&1 | tail -8
fi
# kcp1 (one GPU): each KCP benchmark in $KCP1_FAMS at world size 1 against its local arm
# (the overhead of the KCP path), T = 65536.
if has kcp1; then
  for fam in ${KCP1_FAMS:-gdn}; do
    mod=cake_${fam//-/_}_det_train_kcp
    timeout ${KCP_TIMEOUT:-150} torchrun --nproc-per-node 1 \
      packages/cake-$fam-det-train-kcp/benchmarks/bench_${mod}.py --seqlen 65536 --docs 8 \
      --boundary random --base local --check --out "$OUT/kcp1_${fam}.json" \
      2>&1 | tee "$OUT/kcp1_${fam}.txt" | tail -30
  done
fi
# kdahash: bitwise repeat (5 runs) at case a for the default plan and each plan of
# $KDA_PLANS (";"-separated), in parallel processes (this also fills Triton's cache for
# kdatime); kdatime: cake's fwd+bwd time at cases $KDA_CASES for the same plans, one after
# another (docs/benchmarks/kda.md).
KDA_PLANS=${KDA_PLANS:-"num_warps_bwd=4;block_v_bwd=16"}
KB=packages/cake-kda-det-train/benchmarks/bench_cake_kda_det_train.py
if has kdahash; then
  IFS=';' read -ra KP <<< "$KDA_PLANS"; KP=("" "${KP[@]}"); i=0
  for P in "${KP[@]}"; do
    i=$((i+1))
    { echo "plan: [$P]"; timeout ${KDA_HASH_TIMEOUT:-400} python3 $KB --impls cake --cases a \
        --no-time --hash --plan $P 2>&1 | tail -12; } > "$OUT/kdahash_$i.txt" 2>&1 &
  done
  wait; cat "$OUT"/kdahash_*.txt
fi
if has kdatime; then
  IFS=';' read -ra KP <<< "$KDA_PLANS"; KP=("" "${KP[@]}")
  for P in "${KP[@]}"; do
    echo "plan: [$P]"
    timeout ${KDA_TIME_TIMEOUT:-120} python3 $KB --impls cake --cases ${KDA_CASES:-a,b} \
      --reps ${KDA_REPS:-10} --plan $P 2>&1 | tail -8
  done 2>&1 | tee "$OUT/kdatime.txt"
fi
# burn: repeat checks while 2 other processes time-share the GPU (repeat_diag.py --burn 2
# --trace: per-output distinct hashes over 20 calls, and the first launch that wrote other
# bits), the rule's plan, for each family in $BURN_FAMS at its case ($BURN_CASE_<fam>);
# for KDA also the rule's plan built without wgmma (DISABLE_MMA_V3), and num_warps_bwd=2
# (the rule's since 2026-12-03, so that run repeats the first: kept for older checkouts).
if has burn; then
  for fam in ${BURN_FAMS:-kda gdn}; do
    cv=BURN_CASE_${fam}; [ $fam = kda ] && dc=a || dc=d
    timeout ${BURN_TIMEOUT:-200} python3 shared/gpu/repeat_diag.py $fam ${BURN_RUNS:-20} \
      ${!cv:-$dc} "" --burn 2 --trace 2>&1 | grep -v Warn | tee -a "$OUT/burn.txt"
    if [ $fam = kda ]; then
      timeout ${BURN_TIMEOUT:-200} python3 shared/gpu/repeat_diag.py kda ${BURN_RUNS:-20} \
        ${!cv:-$dc} "" --burn 2 --no-wgmma 2>&1 | grep -v Warn | tee -a "$OUT/burn.txt"
      timeout ${BURN_TIMEOUT:-200} python3 shared/gpu/repeat_diag.py kda ${BURN_RUNS:-20} \
        ${!cv:-$dc} "num_warps_bwd=2" --burn 2 2>&1 | grep -v Warn | tee -a "$OUT/burn.txt"
    fi
  done
fi
# mixload: repeat checks under the load that showed the KDA repeat fault (session 17: dk,
# dg, dbeta took 2 values in 1 of 15 batches of 12 calls): KDA test files and plan_configs
# compiling and launching in the background ($MIX_SECS seconds) while, for each plan of
# $MIX_PLANS (';'-separated, default ";": the rule, whose local kernel has 8 warps with
# barriers in its loops over V since 2026-12-07 (2 warps from 2026-12-03, when the 8-warp
# build without barriers failed 9 of 12 batches); an empty item is the rule, so write the
# rule first: bash drops a trailing empty item), $MIX_PROCS repeat_diag.py processes run 6
# batches of 12 calls at case a,
# and one runs GDN's rule. Per batch: the outputs that took more than one value.
if has mixload; then
  MS=${MIX_SECS:-300}; T=packages/cake-kda-det-train/tests
  # the background compiles into a cache of its own, empty each time: a warm cache left
  # little compiling and no fault in session 18's second call
  BG_CACHE=$(mktemp -d)
  for f in test_kda_split_edges.py test_kda_api.py test_kda_parity.py test_kda_modes.py; do
    TRITON_CACHE_DIR=$BG_CACHE timeout $MS python3 -m pytest -q -p no:cacheprovider $T/$f \
      > /dev/null 2>&1 &
  done
  TRITON_CACHE_DIR=$BG_CACHE timeout $MS python3 shared/gpu/plan_configs.py kda "128 128 float16" "64 64 bfloat16" \
    "100 100 bfloat16 lens=1,70,0,65" "48 32 float32 lens=1,70,0,65" > /dev/null 2>&1 &
  IFS=';' read -ra MP <<< "${MIX_PLANS-;}"; W=(); i=0
  for P in "${MP[@]}"; do
    for j in $(seq ${MIX_PROCS:-4}); do
      i=$((i+1))
      { timeout $MS python3 shared/gpu/repeat_diag.py kda 12 a "$P" "$P" "$P" "$P" "$P" "$P" \
          2>&1 | grep -v -i warn; } > "$OUT/mix_$i.txt" 2>&1 & W+=($!)
    done
  done
  { timeout $MS python3 shared/gpu/repeat_diag.py gdn 12 a "" "" "" "" 2>&1 \
      | grep -v -i warn; } > "$OUT/mix_gdn.txt" 2>&1 & W+=($!)
  wait "${W[@]}"; wait
  tail -n 8 "$OUT"/mix_*.txt | tee "$OUT/mixload.txt"; rm -f "$OUT"/mix_*.txt
fi
# graphs: every det package's tests/test_*_cuda_graph.py (a forward and backward captured in
# a CUDA graph, replayed bitwise equal to eager; docs/architecture.md "CUDA graphs"), one
# process per file, all at once; a summary of each file's pytest line (xfails listed).
if has graphs; then
  for f in packages/*/tests/test_*_cuda_graph.py; do
    pkg=${f#packages/}; pkg=${pkg%%/*}
    timeout ${GRAPH_TEST_TIMEOUT:-500} python3 -m pytest -q -p no:cacheprovider -rfxX "$f" \
      > "$OUT/graphs_$pkg.txt" 2>&1 &
  done
  wait
  for f in "$OUT"/graphs_*.txt; do echo "== $f"; grep -E "passed|failed|skipped|xfail|XPASS|FAILED|Error" "$f" | tail -12; done \
    | tee "$OUT/graph_summary.txt"
fi
# moelayer: the MoEFeedForward layer vs eager torch (bf16, 8192 tokens), then the main job
# with --moe 8,2 ($MOE_STEPS steps).
if has moelayer; then
  timeout ${MOE_LAYER_TIMEOUT:-400} python3 \
    packages/cake-moe-grouped-det-gemm/benchmarks/bench_moe_layer.py ${MOE_LAYER_ARGS-} \
    --out "$OUT/moe_layer_bench.json" 2>&1 | tee "$OUT/moe_layer_bench.txt"
  timeout ${MOE_TINYLM_TIMEOUT:-300} python3 -m cake_tinylm train --moe 8,2 \
    --steps ${MOE_STEPS:-300} --out "$OUT/tinylm_moe" --no-progress 2>&1 | tail -12 \
    | tee "$OUT/tinylm_moe.txt"
fi
if has tinylm; then
  timeout 300 python3 -m cake_tinylm train --out "$OUT/tinylm" 2>&1 | tail -30 | tee "$OUT/tinylm.txt"
fi
