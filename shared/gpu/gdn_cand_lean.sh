#!/usr/bin/env bash
# One short device call for a GDN candidate patch: main and the candidate tree (a copy of
# packages/ with $CAND applied), each in its own processes: the hash of every output's bits
# at case b (gdn_repeat.py, cake only: equal hashes = the same bits), then fwd+bwd and one
# profiled step at $GDN_CASES (gdn_kernels.py --no-qla, default b,a); then the candidate's
# CUDA test files $CAND_TESTS in parallel.
#   CAND=shared/candidates/<patch> bash shared/gpu/gdn_cand_lean.sh
set -u
OUT=${OUT:-/tmp/gdn-lean}
. shared/gpu/cand_tree.sh  # SRC, CSRC (the copy of packages/ with $CAND applied)
for side in main candidate; do
  src=$SRC; [ $side = candidate ] && src=$CSRC
  echo "== $side"
  PYTHONPATH=$src timeout 100 python3 shared/gpu/gdn_repeat.py b --calls 2 --impls cake 2>&1 \
    | grep -E "^case|Error"
  PYTHONPATH=$src timeout "${GK_SECS:-150}" python3 shared/gpu/gdn_kernels.py "${GDN_CASES:-b,a}" \
    --no-qla 2>&1 | grep -v -i warn
done > "$OUT/gdn_cand.txt"
T=/tmp/cand/packages/cake-gdn-det-train/tests
for f in ${CAND_TESTS:-test_gdn_parity test_gdn_grads test_gdn_determinism test_gdn_speed_paths}; do
  PYTHONPATH=$CSRC timeout "${TEST_SECS:-150}" python3 -m pytest -q -p no:cacheprovider -rfEx \
    "$T/$f.py" > "/tmp/gt_$f.txt" 2>&1 &
done
wait
for f in /tmp/gt_*.txt; do echo "== $f"; grep -E "passed|failed|FAILED|Error" "$f" | tail -5
done >> "$OUT/gdn_cand.txt"
