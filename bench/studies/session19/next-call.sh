#!/usr/bin/env bash
# The device call session 19 could not make (no device time), for the next session, from the repository root
# with gpu-bundle carried. Build the bundle from a tree where kernels/fa3.cu's variant entries take the lazy row
# maximum too (`constexpr bool EAGER = (XO & FA3_XO_EAGER_MAX) != 0;`, without `|| VAR != 0`), then:
#   1. tests/fa3_variants whole (its reference test needed more than session 18's 115 s) and tests/fa3 whole (the
#      difference form of the slack test, d86afea, compiled but never run);
#   2. the fa2bench grid with the 8k column, bf16, the product against `SDPA_FA3_AB=eager-max`, our fa2, cuDNN
#      and FLASH_ATTENTION in the same run;
#   3. (CPU=1) the K/V staging of sdpa-cpu (fa2/staged) on the host's Xeon: the AVX2 grid against PyTorch on AVX2,
#      staged and unstaged, two pinned threads, GPU idle (needs target-cpu19/cpu_bench: `cargo build --release -p
#      sdpa-cpu --example cpu_bench` copied there and named in carry).
# If step 1 passes, commit the one-line change as the product; if not, keep the tree's eager rule for variants.
#   [T=260] [BT=150] [CPU=0] bash bench/studies/session19/next-call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache19
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
RUNS="fa3_variants fa3" DEADLINE=${T:-260} SAN_S=0 bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
sed -n '/== tests/,$p' /tmp/tests.txt | head -8
timeout ${BT:-150} python3 sdpa-cuda/dev/fa3_bench.py --bench gpu-bundle/cuda_kernels --seqs 512 1024 2048 4096 8192 \
  --variants eager:SDPA_FA3_AB=eager-max --out "$O" > "$O/bench.log" 2>&1
echo "fa3_bench rc=$?"
grep -vE "^(ENV|CEILINGS)" "$O/bench.log" | tail -24 | cut -c1-120
if [ "${CPU:-0}" = 1 ]; then
  taskset -c 0,1 timeout 200 python3 bench/cpu/pytorch_cpu_sdpa.py --ours target-cpu19/cpu_bench --simd avx2 \
    --preset prefill --rounds 2 --reps 3 --threads 2 --torch-kernels fused --no-read-bw \
    --ours-variant unstaged:SDPA_CPU_STAGE=0 --out "$O/avx2-prefill-staged-xeon.json" > "$O/cpu.log" 2>&1
  echo "cpu rc=$?"; grep "^|" "$O/cpu.log" | cut -c1-160
fi
cp /tmp/tests.txt "$O/"
cd "$O" && tar czf raw.tgz --remove-files fa3_*_raw.json tests.txt 2>/dev/null; ls "$O"
