#!/usr/bin/env bash
# One short device call for a KDA candidate patch (when device time is short): main's
# rule at case b in Kimi Linear's form (with the hash of its outputs' bits), then the
# candidate tree's rule and $CAND_SWEEP items (';'-separated; upper-case NAME=value items
# set environment variables) with --err and --repeat 1 (their hashes: equal to main's =
# the same bits), then two CUDA test files on the candidate with $CAND_TEST_ENV.
#   CAND=shared/candidates/<patch> CAND_SWEEP="..." bash shared/gpu/kda_cand_lean.sh
set -u
OUT=${OUT:-/tmp/kda-lean}
. shared/gpu/cand_tree.sh  # SRC, CSRC (the copy of packages/ with $CAND applied)
IFS=';' read -ra CSW <<< "${CAND_SWEEP:-}"
{ echo "== main"
  PYTHONPATH=$SRC timeout 100 python3 shared/gpu/kda_kernels.py b --forms gate --no-fla --sweep 2>&1 \
    | grep -v -i warn
  echo "== candidate $CAND"
  PYTHONPATH=$CSRC timeout ${SW_SECS:-280} python3 shared/gpu/kda_kernels.py b --forms gate \
    --no-fla --err --repeat 1 --sweep "${CSW[@]}" 2>&1 | grep -v -i warn
} > "$OUT/kda_cand.txt"
for f in test_kda_bwd_intra test_kda_determinism; do
  env ${CAND_TEST_ENV:-} PYTHONPATH=$CSRC timeout ${TEST_SECS:-100} python3 -m pytest -q -p no:cacheprovider \
    -rfEx /tmp/cand/packages/cake-kda-det-train/tests/$f.py > /tmp/ct_$f.txt 2>&1 &
done
wait
for f in /tmp/ct_*.txt; do echo "== $f"; grep -E "passed|failed|FAILED|Error" "$f" | tail -5
done >> "$OUT/kda_cand.txt"
