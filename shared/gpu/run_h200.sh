#!/usr/bin/env bash
# One device call on the H200: versions, GPU tests, cross-process repeat, benchmark,
# and the main job. Everything lands in $OUT. Usage (repo root): bash shared/gpu/run_h200.sh [parts]
# parts: any of env tests det bench tinylm profile dense lmhead tests3 gdntests gdnbench (default: the first five). Seen 2026-11-29: the GPU test
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
if has gdntests; then  # test files in parallel processes (compiling dominates; 16 cores)
  i=0
  for f in packages/cake-gdn-det-train/tests/test_*.py; do
    i=$((i+1))
    timeout ${GDN_TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -rf "$f" \
      > "$OUT/pytest_gdn_$i.txt" 2>&1 &
  done
  wait
  for f in "$OUT"/pytest_gdn_*.txt; do echo "== $f"; grep -E "passed|failed|FAILED|Error" "$f" | tail -12; done
fi
if has gdnbench; then
  timeout ${GDN_BENCH_TIMEOUT:-400} python3 \
    packages/cake-gdn-det-train/benchmarks/bench_cake_gdn_det_train.py \
    ${GDN_ARGS-} --out "$OUT/gdn_bench.json" 2>&1 | tee "$OUT/gdn_bench.txt"
fi
if has tinylm; then
  timeout 300 python3 -m cake_tinylm train --out "$OUT/tinylm" 2>&1 | tail -30 | tee "$OUT/tinylm.txt"
fi
