#!/usr/bin/env bash
# One device call: GDN and KDA at a base commit against the working tree, beside FLA (the
# anchor pack). Bits of every hash case and benchmark case (base vs tree; the tree in a second
# process), fwd+bwd ms interleaved base / tree / base / tree, host ms per eager call.
# Prepare here:  bash ../shared/anchors/make_anchor_pack.sh;  mkdir .before && git archive BASE | tar -x -C .before
#   (.before and .anchors in .git/info/exclude); run with carry [".anchors", ".before"]:
#   bash shared/gpu/chunk_engine_session.sh [.before]      ($OUT/log.txt holds the log)
# Env: HASH=0 skips the hash cases (bits already compared), FAMS="gdn" or "kda" one family,
#   BENCH_UNTIL / REST_UNTIL seconds after which the bench / the rest are skipped.
set -uo pipefail
BEFORE=${1:-.before}
OUT=${OUT:-/tmp/cake-gpu-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
tar -xJf .anchors/anchors_site.tar.xz -C /tmp && export PYTHONPATH=/tmp/anchors_site
export LD_LIBRARY_PATH=/tmp/anchors_site/z3/lib:/tmp/anchors_site/tvm_ffi/lib:${LD_LIBRARY_PATH:-} CUDA_HOME=/usr/local/cuda
export PYTHONUNBUFFERED=1
# FLA >= 0.6 hands bf16 K = V = 128 GDN calls to FlashQLA on Hopper; compare with FLA itself
export FLA_FLASH_QLA=0
# FLA's autotuned configs persist across this call's processes (each bench process re-tunes else)
export TRITON_CACHE_AUTOTUNING=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, fla, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, 'transformers', transformers.__version__)"
git log -1 --format='HEAD %h %s' 2>/dev/null | cut -c1-80
T0=$SECONDS
if [ "${HASH:-1}" = 1 ]; then
# compile both sides in parallel (hash cases only), then time one after the other
timeout 250 python3 shared/gpu/chunk_engine_check.py "$BEFORE" --no-time --save /tmp/b0.pt > /tmp/b0.txt 2>&1 &
P1=$!
timeout 250 python3 shared/gpu/chunk_engine_check.py . --no-time --save /tmp/a0.pt > /tmp/a0.txt 2>&1 &
# a bare wait would also wait for the tee above
wait $P1 $!; echo "compile phase $((SECONDS-T0)) s"; tail -n 2 /tmp/b0.txt /tmp/a0.txt
echo "== after vs before (hash cases)"; timeout 60 python3 - <<'PY'
import torch
a, b = torch.load("/tmp/a0.pt"), torch.load("/tmp/b0.pt")
diff = [k for k in sorted(set(a) | set(b)) if k not in a or k not in b or (a[k] is None) != (b[k] is None) or (a[k] is not None and not torch.equal(a[k].view(torch.uint8) if a[k].is_floating_point() else a[k], b[k].view(torch.uint8) if b[k].is_floating_point() else b[k]))]
print("hash cases: outputs", len(a), "differ", len(diff), diff[:20])
PY
fi
# host ms per eager call, before and after in one call (first: the benches may run out of time)
echo "== host"; timeout 90 python3 shared/gpu/host_time.py "$BEFORE"; timeout 90 python3 shared/gpu/host_time.py .
# one process per (side, family), before / after alternating; FLA beside cake in each
i=0
for fam in ${FAMS:-gdn kda}; do
  for side in "$BEFORE" . "$BEFORE" .; do
    i=$((i+1)); [ $((SECONDS-T0)) -gt ${BENCH_UNTIL:-380} ] && { echo "== bench $i $fam skipped (time)"; continue; }
    echo "== bench $i $fam $side $((SECONDS-T0)) s"
    timeout ${BENCH_TIMEOUT:-170} python3 shared/gpu/chunk_engine_check.py $side --only $fam --cases NONE --reps ${REPS:-200} --save /tmp/bench_$i.pt 2>&1 | grep -E "fwd\+bwd|Error|error|fla:"
  done
done
timeout 60 python3 - <<'PY'
import os, torch
r = {i: torch.load(f"/tmp/bench_{i}.pt") for i in range(1, 9) if os.path.exists(f"/tmp/bench_{i}.pt")}
for o in (0, 4):
    for x, y, what in ((1, 2, "before vs after"), (1, 3, "before repeat"), (2, 4, "after repeat")):
        if x + o in r and y + o in r:
            d = [k for k in r[x + o] if r[x + o][k] != r[y + o].get(k)]
            print(f"bench hashes {what} ({x + o}, {y + o}): {len(r[x + o])} outputs, differ {len(d)}", d[:12])
PY
[ $((SECONDS-T0)) -gt ${REST_UNTIL:-470} ] && { echo "rest skipped (time) $((SECONDS-T0)) s"; exit 0; }
if [ "${HASH:-1}" = 1 ]; then
  echo "== 2nd process, after, hash cases"
  timeout 120 python3 shared/gpu/chunk_engine_check.py . --no-time --compare /tmp/a0.pt 2>&1 | tail -3
fi
echo "total $((SECONDS-T0)) s"
