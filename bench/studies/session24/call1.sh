#!/usr/bin/env bash
# Session 24's call 1: session 23's FP8 layout rule as the product, verified and timed where it decides; and
# the wide path's slabs of whole heads (`SDPA_WIDE_SLAB_HEADS`), which may keep a short call's scores in L2.
# From the repository root with gpu-bundle carried (tests: fa3_fp8, fa3, machinery, wide_heads):
#   1. tests/fa3_fp8 whole as the product (each call's V layout chosen by `fa3::fp8_transposes_in_kernel`),
#      machinery (the compile lock of 66a620c), fa3's reference test, wide_heads under SDPA_WIDE_SLAB_HEADS=2;
#      compute-sanitizer on fa3_fp8's small calls;
#   2. fa3_fp8_bench.py at D = 128 and 256, S = 2k, 4k, 8k and the serving shapes (GQA 4 and 8, decoding), the
#      product against both layouts forced (vt-kernel, vt-prepass) and our bf16 in the same run (no PyTorch);
#   3. wide_bench.py: D = 512 at 1k (both masks, PyTorch in the same run) and the causal sweep of
#      SDPA_WIDE_SLAB_HEADS at D = 512 1k / 4k and D = 1024 1k.
#   [T=200] [SAN_S=70] [BT=190] [WT=150] [DIMS="128 256"] [SEQS="2048 4096 8192"] bash bench/studies/session24/call1.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O/fp8"
rm -rf /tmp/w/tests10  # another call's logs, when one ran on this machine before
RUNS=${RUNS:-"fa3_fp8 machinery fa3:fa3_matches_the_reference wide_heads@SDPA_WIDE_SLAB_HEADS=2"} SAN=${SAN:-"fa3_fp8:small_calls_for_the_sanitizer"} \
  SAN_S=${SAN_S:-70} DEADLINE=${T:-200} bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
cp /tmp/tests.txt "$O/"; tail -12 /tmp/tests.txt
grep -h "test result\|panicked\|FAILED\|fa3 fp8:" /tmp/w/tests10/*.log | head -16 | cut -c1-200
# The tests' NVRTC cache holds most of the bench's programs.
SDPA_CUDA_CACHE=/tmp/sdpa-cache10 timeout ${BT:-190} python3 sdpa-cuda/dev/fa3_fp8_bench.py --bench gpu-bundle/cuda_kernels \
  --no-torch --serving --dims ${DIMS:-128 256} --seqs ${SEQS:-2048 4096 8192} \
  --variants kernel:SDPA_FA3_AB=vt-kernel prepass:SDPA_FA3_AB=vt-prepass --out "$O/fp8" > "$O/fp8/fp8.log" 2>&1
echo "fp8 bench rc=$?"; tail -32 "$O/fp8/fp8.log" | cut -c1-240
mkdir -p "$O/wide"; timeout ${WT:-150} python3 sdpa-cuda/dev/wide_bench.py --bench gpu-bundle/cuda_kernels --only 512:1024 \
  --sweep-at 512:1024,512:4096,1024:1024 --sweep "SDPA_WIDE_SLAB_HEADS=1,2,4,8" --out "$O/wide" > "$O/wide/wide.log" 2>&1
echo "wide bench rc=$?"; grep -h "sweep SDPA" "$O/wide/wide.log" | cut -c1-160; tail -14 "$O/wide/wide.log" | cut -c1-200
cd "$O" && tar czf raw.tgz --remove-files fp8/fa3_*_raw.json 2>/dev/null; ls "$O"
