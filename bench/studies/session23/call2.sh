#!/usr/bin/env bash
# Session 23's second call: the one-consumer tile (`SDPA_FA3_TILE=128,2,1`: two blocks of one consumer warpgroup
# per SM, each walking its own 64-row work tiles, so that one block's tile start and epilogue run under the
# other's products) against the product at D = 64 causal, where issue 25's short points fall below 0.9x cuDNN.
# From the repository root with gpu-bundle carried (tests: fa3):
#   1. tests/fa3 whole under the tile (the reference test, the long and the odd shapes, LSE, streams), and
#      compute-sanitizer memcheck, racecheck and synccheck on fa3's small calls under it;
#   2. fa3_bench.py at S = 512, 1k, 2k (bf16, D = 64 and 128, causal and not): the product, fa2, cuDNN and
#      FLASH_ATTENTION, and the tile forced at D = 64, every output checked on sampled rows.
#   [T=200] [BT=200] [SEQS="512 1024 2048"] [TILES="128,2,1@64"] bash bench/studies/session23/call2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O/w1"
RUNS=${RUNS:-"fa3@SDPA_FA3_TILE=128,2,1"} \
  SAN=${SAN:-"fa3:small_calls_for_the_sanitizer@SDPA_FA3_TILE=128,2,1"} \
  SAN_S=${SAN_S:-110} DEADLINE=${T:-200} \
  bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
tail -8 /tmp/tests.txt
for f in /tmp/w/tests10/*.rc; do echo "$(basename $f) $(cat $f)"; done
grep -h "test result\|panicked" /tmp/w/tests10/*.log | head -12 | cut -c1-200
timeout ${BT:-200} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --seqs ${SEQS:-512 1024 2048} \
  --tiles ${TILES:-128,2,1@64} --tile-seqs ${SEQS:-512 1024 2048} --variants --out "$O/w1" > "$O/w1/bench.log" 2>&1
echo "bench rc=$?"; tail -40 "$O/w1/bench.log" | cut -c1-160
cp /tmp/tests.txt "$O/w1/"; ls "$O/w1"
