#!/usr/bin/env bash
# One device call for the KDA backward chunk kernel's wide build (issue 46): the package's
# CUDA test files in parallel processes while 3 repeat_diag.py processes run 6 batches of 12
# calls each at case a (the rule's plan) beside them; then cake beside FLA at case b in both
# calling forms (kda_kernels.py, $KK_SECS seconds). Usage (repo root, anchor pack carried in .anchors):
#   bash shared/gpu/kda_session.sh   [env: MS (seconds for the tests and repeats, 240)]
# Logs in $OUT: kda_kernels.txt, kda_tests.txt (each file's summary), kda_mixload.txt.
set -u
OUT=${OUT:-/tmp/kda-session}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
tar -xJf .anchors/anchors_site.tar.xz -C /tmp
mkdir -p /tmp/tc && [ -f .anchors/fla_autotune.tar ] && tar -xf .anchors/fla_autotune.tar -C /tmp/tc
SRC=$(ls -d "$PWD"/packages/*/src | paste -sd:)
export PYTHONPATH=$SRC
MS=${MS:-240}; T=packages/cake-kda-det-train/tests; i=0; BG=$(mktemp -d)
for f in $T/test_*.py; do i=$((i+1))
  TRITON_CACHE_DIR=$BG timeout $MS python3 -m pytest -q -p no:cacheprovider -rfEx "$f" \
    > /tmp/kt_$i.txt 2>&1 &
done
for j in 1 2 3; do
  timeout $MS python3 shared/gpu/repeat_diag.py kda 12 a "" "" "" "" "" "" > /tmp/kr_$j.txt 2>&1 &
done
wait
for f in /tmp/kr_*.txt; do echo "== $f"; grep -v -i warn "$f" | tail -7; done > "$OUT/kda_mixload.txt"
i=0; for f in $T/test_*.py; do i=$((i+1)); echo "== $f"
  grep -E "passed|failed|FAILED|ERROR|Error|skipped" /tmp/kt_$i.txt | tail -8; done > "$OUT/kda_tests.txt"
(export PYTHONPATH=/tmp/anchors_site:$SRC CUDA_HOME=/usr/local/cuda FLA_FLASH_QLA=0 FLA_TILELANG=0 \
   LD_LIBRARY_PATH=/tmp/anchors_site/z3/lib:/tmp/anchors_site/tvm_ffi/lib
 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
 python3 -c "import fla; print('fla', fla.__version__)"
 timeout ${KK_SECS:-240} python3 shared/gpu/kda_kernels.py b --forms gate,pre 2>&1 \
   | grep -v -i warn) > "$OUT/kda_kernels.txt"
