#!/usr/bin/env bash
# One device call for the family tables of issue 46 (repo root, the anchor pack in .anchors):
#   PARTS="kda gdn" bash shared/gpu/family_tables.sh
# kda: KDA beside FLA (kda_kernels.py $KK_CASES, default a,b,c; both calling forms);
# gdn: GDN beside FlashQLA (gdn_kernels.py $GQ_CASES, default b,a). FlashQLA compiles with
# TileLang per shape, for minutes: give the gdn part a call of its own with GQ_SECS near
# the call's limit (docs/benchmarks/gdn.md says what it took). Logs in $OUT: gpu.txt,
# kda_fla.txt, gdn_qla.txt.
set -u
OUT=${OUT:-/tmp/tables}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
SRC=$(ls -d "$PWD"/packages/*/src | paste -sd:)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  git rev-parse --short HEAD 2>/dev/null; date -u; } | tee "$OUT/gpu.txt"
tar -xJf .anchors/anchors_site.tar.xz -C /tmp
mkdir -p /tmp/tc
[ -f .anchors/fla_autotune.tar ] && tar -xf .anchors/fla_autotune.tar -C /tmp/tc
export PYTHONPATH=/tmp/anchors_site:$SRC CUDA_HOME=/usr/local/cuda FLA_FLASH_QLA=0 \
  FLA_TILELANG=0 LD_LIBRARY_PATH=/tmp/anchors_site/z3/lib:/tmp/anchors_site/tvm_ffi/lib
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', \
triton.__version__, 'fla', fla.__version__)" 2>&1 | tee -a "$OUT/gpu.txt"
PARTS=" ${PARTS:-kda gdn} "
if [[ $PARTS == *" kda "* ]]; then
  timeout "${KK_SECS:-300}" python3 shared/gpu/kda_kernels.py "${KK_CASES:-a,b,c}" \
    --forms gate,pre 2>&1 | grep -v -i warn > "$OUT/kda_fla.txt"
  (cd /tmp/tc && find . -name '*.autotune.json' | tar -cf "$OUT/fla_autotune.tar" -T -)
fi
if [[ $PARTS == *" gdn "* ]]; then
  timeout "${GQ_SECS:-240}" python3 shared/gpu/gdn_kernels.py "${GQ_CASES:-b,a}" 2>&1 \
    | grep -v -i warn > "$OUT/gdn_qla.txt"
fi
