#!/usr/bin/env bash
# Session 11's serving call for the MLA path: the GPU tests ($RUNS) and the sanitizers on small dense, paged
# and packed MLA calls, then `sdpa run` timings (CUDA events after the default L2 flush; calls 6 and 7 ran
# without `--check`, so their records carry no check: it is in the command now, f64 check on 32 rows)
# of MLA decoding, bf16, 16 heads on one kv head, dense against the same lengths paged (64- and 16-slot pages)
# and packed, and a batch of mixed lengths; 128 heads dense and paged. Logs in $OUT/serving.
#   DEADLINE=300 bash bench/studies/session11/serving.sh
set -uo pipefail
T0=$SECONDS; DEADLINE=${DEADLINE:-300}
left() { echo $((DEADLINE - (SECONDS - T0))); }
RUNS=${RUNS:-"splitkv_mla paged_decode"}
RUNS="$RUNS" SAN="splitkv_mla:small_mla_calls_for_the_sanitizer" SAN_S=60 DEADLINE=${TESTS_S:-170} \
  bash bench/studies/session10/tests10.sh
echo "tests done ($(left) s left)"
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 SDPA_CUDA_CACHE=/tmp/sdpa-cache10
mkdir -p "$OUT/serving"
mixed="512,32768,1024,4096,2048,16384,700,8192"
while read -r name args; do
  [ -z "$name" ] && continue
  [ "$(left)" -lt 10 ] && { echo "$name: skipped (deadline)"; continue; }
  timeout 60 gpu-bundle/sdpa run --backend cuda --kernel auto --dtype bf16 --check --check-rows 32 --reps 30 $args \
    --json > "$OUT/serving/$name.json" 2> "$OUT/serving/$name.err"
  rc=$?
  python3 - "$OUT/serving/$name.json" "$name" "$rc" <<'PY'
import json, sys
path, name, rc = sys.argv[1:]
try:
    r = json.load(open(path))
    c = r.get("check") or {}
    print(f"{name:24} rc={rc} ran={r.get('auto_chose') or r.get('kernel')} median={r['time_ms']['median'] * 1000:8.1f} us "
          f"{r['gbps']:7.0f} GB/s check={c.get('pass')}")
except Exception as e:
    print(f"{name:24} rc={rc} no record ({e}): {open(path.replace('.json', '.err')).read()[-300:]}")
PY
done <<LIST
dense16 --shape 8,16,1,1,4096,576,512
paged64_16 --shape 8,16,1,1,4096,576,512 --page-size 64
paged16_16 --shape 8,16,1,1,4096,576,512 --page-size 16
packed16 --shape 8,16,1,1,4096,576,512 --seqlens-k 4096,4096,4096,4096,4096,4096,4096,4096
mixed_dense_equal_work --shape 8,16,1,1,8216,576,512
mixed_paged64 --shape 8,16,1,1,32768,576,512 --seqlens-k $mixed --page-size 64
dense128 --shape 8,128,1,1,4096,576,512
paged64_128 --shape 8,128,1,1,4096,576,512 --page-size 64
LIST
