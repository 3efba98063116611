# Sourced by the *_cand_lean.sh scripts (repo root, $OUT set): the run's environment, the
# GPU's name into $OUT/gpu.txt, and the candidate tree: a copy of packages/ under /tmp/cand
# with $CAND applied. Sets SRC (this tree's package sources) and CSRC (the candidate's).
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
SRC=$(ls -d "$PWD"/packages/*/src | paste -sd:)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rm -rf /tmp/cand && mkdir -p /tmp/cand && cp -r packages /tmp/cand/
(cd /tmp/cand && patch -s -p1 < "$OLDPWD/${CAND:?}")
CSRC=$(ls -d /tmp/cand/packages/*/src | paste -sd:)
