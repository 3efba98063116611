#!/usr/bin/env bash
# Device calls for KDA's speed and repeatability work (issue 46). Usage (repo root, the
# anchor pack carried in .anchors for "fla"):
#   PARTS="tests fla" bash shared/gpu/kda_session.sh
# parts (default "tests fla"):
#   tests  the package's CUDA test files in parallel processes while 3 repeat_diag.py
#          processes run 6 batches of 12 calls each at case a (the rule), and one runs GDN's
#          rule (its local kernel has 8 warps at K = V = 128 and no barrier), for $MS s
#   fla    cake beside FLA kernel by kernel (kda_kernels.py $KK_CASES, both calling forms,
#          $KK_SECS s; FLA's autotune results reused from .anchors/fla_autotune.tar)
#   sweep  kda_kernels.py --unfenced --err --repeat 2 --sweep over $SWEEP (';'-separated
#          items of plan overrides) at case b in Kimi Linear's form, cake alone
#   cand   a candidate patch ($CAND, required: a file in shared/candidates)
#          applied to a copy of packages/: kda_kernels.py b (both forms, cake alone) on main
#          and on the copy, --err on the copy, then (with $CAND_SWEEP, ';'-separated plan
#          overrides) a sweep on the copy, then the copy's backward test files
# Logs in $OUT: kda_tests.txt, kda_mixload.txt, kda_kernels.txt, kda_sweep.txt,
# kda_cand.txt.
set -u
OUT=${OUT:-/tmp/kda-session}; mkdir -p "$OUT"
PARTS=" ${PARTS:-tests fla} "
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
SRC=$(ls -d "$PWD"/packages/*/src | paste -sd:)
export PYTHONPATH=$SRC
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [[ $PARTS == *" tests "* ]]; then
  MS=${MS:-200}; T=packages/cake-kda-det-train/tests; i=0; BG=$(mktemp -d)
  for f in $T/test_*.py; do i=$((i+1))
    TRITON_CACHE_DIR=$BG timeout $MS python3 -m pytest -q -p no:cacheprovider -rfEx "$f" \
      > /tmp/kt_$i.txt 2>&1 &
  done
  for j in 1 2 3; do
    timeout $MS python3 shared/gpu/repeat_diag.py kda 12 a "" "" "" "" "" "" \
      > /tmp/kr_$j.txt 2>&1 &
  done
  timeout $MS python3 shared/gpu/repeat_diag.py gdn 12 a "" "" "" "" "" "" \
    > /tmp/kr_gdn.txt 2>&1 &
  wait
  for f in /tmp/kr_*.txt; do echo "== $f"; grep -v -i warn "$f" | tail -7; done \
    > "$OUT/kda_mixload.txt"
  i=0; for f in $T/test_*.py; do i=$((i+1)); echo "== $f"
    grep -E "passed|failed|FAILED|ERROR|Error|skipped" /tmp/kt_$i.txt | tail -8
  done > "$OUT/kda_tests.txt"
fi
if [[ $PARTS == *" sweep "* ]]; then
  SW_DEFAULT="block_k_bwd=128;block_k_bwd=128 block_v_bwd=32;block_k_inner=64"
  IFS=';' read -ra SW <<< "${SWEEP:-$SW_DEFAULT}"
  timeout ${SW_SECS:-240} python3 shared/gpu/kda_kernels.py b --forms gate --no-fla --unfenced \
    --err --repeat 2 --sweep "${SW[@]}" 2>&1 | grep -v -i warn > "$OUT/kda_sweep.txt"
fi
if [[ $PARTS == *" cand "* ]]; then
  CAND=${CAND:?PARTS=cand needs CAND=shared/candidates/<patch>}
  rm -rf /tmp/cand && mkdir -p /tmp/cand && cp -r packages /tmp/cand/
  (cd /tmp/cand && git apply "$OLDPWD/$CAND" 2>/dev/null || patch -p1 < "$OLDPWD/$CAND")
  CSRC=$(ls -d /tmp/cand/packages/*/src | paste -sd:)
  {
    echo "== main"
    timeout 120 python3 shared/gpu/kda_kernels.py b --forms gate,pre --no-fla 2>&1 | grep -v -i warn
    echo "== candidate $CAND"
    PYTHONPATH=$CSRC timeout 150 python3 shared/gpu/kda_kernels.py b --forms gate,pre --no-fla \
      --err 2>&1 | grep -v -i warn
    if [ -n "${CAND_SWEEP:-}" ]; then  # plan overrides on the candidate tree (';'-separated)
      IFS=';' read -ra CSW <<< "$CAND_SWEEP"
      echo "== candidate sweep"
      PYTHONPATH=$CSRC timeout ${SW_SECS:-200} python3 shared/gpu/kda_kernels.py b --forms gate \
        --no-fla --err --repeat 1 --sweep "${CSW[@]}" 2>&1 | grep -v -i warn
    fi
    for f in test_kda_bwd_intra test_kda_parity test_kda_determinism test_kda_gate; do
      PYTHONPATH=$CSRC timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEx \
        /tmp/cand/packages/cake-kda-det-train/tests/$f.py > /tmp/ct_$f.txt 2>&1 &
    done
    wait
    for f in /tmp/ct_*.txt; do echo "== $f"; grep -E "passed|failed|FAILED|Error" "$f" | tail -5
    done
  } > "$OUT/kda_cand.txt"
fi
if [[ $PARTS == *" fla "* ]]; then
  tar -xJf .anchors/anchors_site.tar.xz -C /tmp
  mkdir -p /tmp/tc
  [ -f .anchors/fla_autotune.tar ] && tar -xf .anchors/fla_autotune.tar -C /tmp/tc
  (export PYTHONPATH=/tmp/anchors_site:$SRC CUDA_HOME=/usr/local/cuda FLA_FLASH_QLA=0 \
     FLA_TILELANG=0 LD_LIBRARY_PATH=/tmp/anchors_site/z3/lib:/tmp/anchors_site/tvm_ffi/lib
   python3 -c "import fla; print('fla', fla.__version__)"
   timeout ${KK_SECS:-300} python3 shared/gpu/kda_kernels.py ${KK_CASES:-b} --forms gate,pre 2>&1 \
     | grep -v -i warn) > "$OUT/kda_kernels.txt"
  (cd /tmp/tc && find . -name '*.autotune.json' | tar -cf "$OUT/fla_autotune.tar" -T -)
fi
