#!/usr/bin/env bash
# Session 13's second device call, from the repository root with `gpu-bundle` (of f4fbf09) and
# `target-cpu13/cpu_bench` (release build of 3a09fc7) carried:
#   0. the GPU tests of the splitkv paths whose launch parameter struct f4fbf09 merged (MLA, paged, ragged);
#   1. the wide-head points whose committed slab rule was never timed (D = 512 at 1k and 4k, 1024 at 4k,
#      4096 at 2k, causal and not) and MLA decoding (c07b335's hoisting, never timed), against PyTorch;
#   2. the CPU on the GPU machine's host (AMX where it has it; GPU idle by then): the AMX points against PyTorch at 2 threads
#      pinned and at 16, then the head-dim sweep at 2 threads pinned in the dtypes of $DTYPES (default f16) as
#      far as the deadline allows.
#   DEADLINE=540 bash bench/studies/session13/call2.sh
set -uo pipefail
T0=$SECONDS; DEADLINE=${DEADLINE:-540}
left() { echo $((DEADLINE - (SECONDS - T0))); }
O=${OUT:-/tmp/out}; mkdir -p "$O/cpu" "$O/wide"
export SDPA_BENCH_COMMIT=3a09fc7 PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache13
CB=target-cpu13/cpu_bench
{ date -u; nvidia-smi -L; lscpu | grep -E 'Model name|^CPU\(s\)'; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$O/env.txt" 2>&1
cat "$O/env.txt"

RUNS="splitkv_mla paged_decode ragged_prefill" DEADLINE=140 SAN_S=0 bash bench/studies/session10/tests10.sh \
  > "$O/tests.txt" 2>&1
echo "tests ($(left) s left)"

timeout 170 python3 sdpa-cuda/dev/wide_bench.py --bench gpu-bundle/cuda_kernels \
  --only 512:1024,512:4096,1024:4096,4096:2048 --out "$O/wide" > "$O/wide/bench.log" 2>&1
echo "wide rc=$? ($(left) s left)"

pt() { python3 bench/cpu/pytorch_cpu_sdpa.py --ours "$CB" --torch-kernels fused --no-read-bw "$@"; }
timeout 100 taskset -c 0,1 bash -c "$(declare -f pt); CB=$CB; pt --simd amx --preset amx --rounds 3 --threads 2 \
  --reps 3 --out $O/cpu/amx-2t.json" > "$O/cpu/amx-2t.log" 2>&1
echo "amx 2t rc=$? ($(left) s left)"
timeout 60 bash -c "$(declare -f pt); CB=$CB; pt --simd amx --preset amx --rounds 3 --threads 16 --reps 5 \
  --out $O/cpu/amx-16t.json" > "$O/cpu/amx-16t.log" 2>&1
echo "amx 16t rc=$? ($(left) s left)"
for dt in ${DTYPES:-f16}; do  # one record per dtype, so a cut run keeps the dtypes before it
  [ "$(left)" -lt 40 ] && { echo "headdims $dt: skipped (deadline)"; continue; }
  timeout $(( $(left) - 15 )) taskset -c 0,1 bash -c "$(declare -f pt); CB=$CB; pt --preset headdims \
    --dtypes $dt --rounds 2 --threads 2 --reps 3 --out $O/cpu/headdims-2t-$dt.json" > "$O/cpu/headdims-2t-$dt.log" 2>&1
  echo "headdims $dt rc=$? ($(left) s left)"
done

echo "== wide"; tail -25 "$O/wide/bench.log"
echo "== amx 2t"; tail -12 "$O/cpu/amx-2t.log"
echo "== amx 16t"; tail -12 "$O/cpu/amx-16t.log"
echo "== tests"; grep -A12 "== tests" "$O/tests.txt"
for dt in ${DTYPES:-f16}; do echo "== headdims $dt"; tail -14 "$O/cpu/headdims-2t-$dt.log" 2>/dev/null; done
