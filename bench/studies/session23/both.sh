#!/usr/bin/env bash
# Session 22's call (FP8's V transposed in the kernel, `SDPA_FA3_AB=vt-kernel`) and session 23's (the one-consumer
# tile, `SDPA_FA3_TILE=128,2,1`) in one device call, for when machines start rarely. From the repository root with
# gpu-bundle carried (tests: fa3_fp8, fa3, fa2_kernels, machinery, wide_heads):
#   1. side by side: tests/fa3_fp8 whole under vt-kernel and as the product, fa3's reference test and small calls
#      under the tile (the reference test with 64-key tiles too), fa3's reference test as the product, wide_heads
#      and machinery; compute-sanitizer memcheck, racecheck and synccheck on
#      fa3_fp8's small calls under vt-kernel and on fa3's under the tile;
#   2. fa3_bench.py at S = 512, 1k, 2k with the tile forced at D = 64 (128 keys) and at D = 128 (64 keys, so that
#      two blocks fit an SM), cuDNN in the same run;
#   3. the FP8 grid (D = 64, 128, 256) under vt-kernel against the product's pre-pass and our bf16 (no PyTorch).
#   [T=220] [SAN_S=110] [WT=140] [BT=110] [DIMS="64 128 256"] [SEQS=...] [WSEQS=...] [RUNS=...] [SAN=...] bash bench/studies/session23/both.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O/fp8" "$O/w1"
W1=SDPA_FA3_TILE=128,2,1
RUNS=${RUNS:-"fa3_fp8@SDPA_FA3_AB=vt-kernel fa3_fp8 fa3:fa3_matches_the_reference@$W1 fa3:small_calls_for_the_sanitizer@$W1 \
  fa3:fa3_matches_the_reference@SDPA_FA3_TILE=64,2,1 fa3:fa3_matches_the_reference wide_heads machinery"} \
  SAN=${SAN:-"fa3_fp8:small_calls_for_the_sanitizer@SDPA_FA3_AB=vt-kernel fa3:small_calls_for_the_sanitizer@$W1"} \
  SAN_S=${SAN_S:-110} DEADLINE=${T:-220} \
  bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
cp /tmp/tests.txt "$O/"; tail -12 /tmp/tests.txt
grep -h "test result\|panicked\|fa3 fp8:" /tmp/w/tests10/*.log | head -12 | cut -c1-200
timeout ${WT:-140} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --seqs ${WSEQS:-512 1024 2048} \
  --tiles 128,2,1@64 64,2,1@128 --tile-seqs ${WSEQS:-512 1024 2048} --variants --out "$O/w1" > "$O/w1/bench.log" 2>&1
echo "w1 bench rc=$?"; tail -30 "$O/w1/bench.log" | cut -c1-160
timeout ${BT:-110} python3 sdpa-cuda/dev/fa3_fp8_bench.py --bench gpu-bundle/cuda_kernels --no-torch \
  --dims ${DIMS:-64 128 256} --seqs ${SEQS:-512 2048 16384} --variants vt-kernel:SDPA_FA3_AB=vt-kernel --out "$O/fp8" > "$O/fp8/fp8.log" 2>&1
echo "fp8 bench rc=$?"; tail -24 "$O/fp8/fp8.log" | cut -c1-150
cd "$O" && tar czf raw.tgz --remove-files fp8/fa3_*_raw.json 2>/dev/null; ls "$O" "$O/w1"
