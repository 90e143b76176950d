#!/usr/bin/env bash
# Session 22's call, never made (no machine could be started in fifteen tries): FP8's V transposed inside the kernel
# (SDPA_FA3_AB=vt-kernel, kernels/fa3_fp8.cuh fa3_fp8_transpose_v) against the product's pre-pass it is written
# to replace, and the GPU tests session 21 changed without running. From the repository root with gpu-bundle
# carried (tests: fa3_fp8, fa3, fa2_kernels, machinery, wide_heads):
#   1. side by side: tests/fa3_fp8 whole under vt-kernel (with the 140,000-head call it takes) and whole as the
#      product is (which refuses that call),
#      fa3's reference test (bf16: the layout's template change), wide_heads, machinery and fa2_kernels' auto
#      reference test; compute-sanitizer memcheck, racecheck and synccheck on fa3_fp8's small calls, with and
#      without vt-kernel;
#   2. fa3_fp8_bench.py on the fa2bench grid (D = 64, 128 and 256, causal and not, S = 512..16k), our bf16 fa3,
#      the FP8 product (pre-pass) and FP8 under vt-kernel in the same run, every output checked (no PyTorch: the
#      bar is FP8 over our bf16).
#   [T=300] [BT=170] [SEQS="512 2048 16384"] [RUNS="..."] [SAN="..."] [SAN_S=150] bash bench/studies/session22/call1.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O/fp8"
RUNS=${RUNS:-"fa3_fp8@SDPA_FA3_AB=vt-kernel fa3_fp8 fa3:fa3_matches_the_reference wide_heads machinery fa2_kernels:auto_matches"} \
  SAN=${SAN:-"fa3_fp8:small_calls_for_the_sanitizer@SDPA_FA3_AB=vt-kernel fa3_fp8:small_calls_for_the_sanitizer"} \
  SAN_S=${SAN_S:-150} DEADLINE=${T:-300} \
  bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
tail -8 /tmp/tests.txt
for f in /tmp/w/tests10/*.rc; do echo "$(basename $f) $(cat $f)"; done
grep -h "test result\|panicked\|fa3 fp8:" /tmp/w/tests10/*.log | head -12 | cut -c1-200
timeout ${BT:-170} python3 sdpa-cuda/dev/fa3_fp8_bench.py --bench gpu-bundle/cuda_kernels --no-torch \
  --dims 64 128 256 --seqs ${SEQS:-512 1024 2048 4096 16384} --variants vt-kernel:SDPA_FA3_AB=vt-kernel --out "$O/fp8" > "$O/fp8/fp8.log" 2>&1
echo "bench rc=$?"; tail -32 "$O/fp8/fp8.log" | cut -c1-150
cp /tmp/tests.txt "$O/"; cd "$O" && tar czf raw.tgz --remove-files fp8/fa3_*_raw.json tests.txt 2>/dev/null; ls "$O"
