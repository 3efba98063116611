#!/usr/bin/env bash
# A/B device calls (issue 46): this tree's packages against older trees', cake alone, one
# process per run, rounds in rotating order (the sides in $SIDES, then again). Usage (repo
# root; each older side a folder under $OLD holding packages/ of a commit, carried as an
# ignored folder; "new" is this tree):
#   git archive <commit> packages | (mkdir -p .oldpk/<side> && tar -x -C .oldpk/<side>)
#   OLD=.oldpk SIDES="<side> new" PARTS="kda" bash shared/gpu/ab_session.sh
# parts:
#   kda    kda_kernels.py $KDA_CASES (default b) --forms $KDA_FORMS (default gate) --no-fla
#   gdn    gdn_kernels.py $GDN_CASES (default a,b) --no-qla
#   tests  the new tree's test files $TESTS (paths from the repo root), in parallel, after
#          the timings
# $ROUNDS rounds (default 2). Logs in $OUT: ab_<part>.txt, ab_tests.txt.
set -u
OUT=${OUT:-/tmp/ab-session}; mkdir -p "$OUT"
OLD=${OLD:?OLD=<folder with the older packages/>}
PARTS=" ${PARTS:-kda} "
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
NEW_SRC=$(ls -d "$PWD"/packages/*/src | paste -sd:)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
run_ab() {  # name, command...
  local name=$1; shift
  for r in $(seq "${ROUNDS:-2}"); do
    for side in ${SIDES:-old new}; do
      local src=$NEW_SRC
      [ "$side" != new ] && src=$(ls -d "$PWD/$OLD/$side"/packages/*/src | paste -sd:)
      echo "== round $r $side"
      PYTHONPATH=$src timeout "${AB_SECS:-150}" python3 "$@" 2>&1 | grep -v -i warn
    done
  done > "$OUT/ab_$name.txt"
}
if [[ $PARTS == *" kda "* ]]; then
  run_ab kda shared/gpu/kda_kernels.py "${KDA_CASES:-b}" --forms "${KDA_FORMS:-gate}" --no-fla
fi
if [[ $PARTS == *" gdn "* ]]; then
  run_ab gdn shared/gpu/gdn_kernels.py "${GDN_CASES:-a,b}" --no-qla
fi
if [[ $PARTS == *" tests "* ]]; then
  i=0
  for f in ${TESTS:?PARTS=tests needs TESTS}; do i=$((i+1))
    PYTHONPATH=$NEW_SRC timeout "${TEST_SECS:-200}" python3 -m pytest -q -p no:cacheprovider \
      -rfEx "$f" > /tmp/abt_$i.txt 2>&1 &
  done
  wait
  i=0; for f in $TESTS; do i=$((i+1)); echo "== $f"
    grep -E "passed|failed|FAILED|ERROR|Error|skipped" /tmp/abt_$i.txt | tail -8
  done > "$OUT/ab_tests.txt"
fi
