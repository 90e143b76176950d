#!/usr/bin/env bash
# What session 14 left for the device (it had none): one call, from the repository root with `gpu-bundle`
# (of this tree or later) and `target-cpu14/cpu_bench` (a release build of the same tree) carried:
#   0. the GPU tests of the two kernels whose tensor-map operands now come from one builder
#      (`tensor_map::kv_operands`, 8f0c03b): fa3 dense, packed and paged (fa3, fa3_ragged, fa3_fp8) and
#      splitkv's MLA path (splitkv_mla, paged_decode);
#   1. the AMX bar again after session 13's fix of the fused softmax's exponent (subtract first; one multiply
#      and one subtract more per 16 scores, never timed on AMX): `--simd amx --preset amx` at 2 threads
#      pinned and at 16, against PyTorch in the same rounds (records as `bench/results/cpu/amx-*-xeon-*.json`).
#   DEADLINE=540 bash bench/studies/session14/next-call.sh
set -uo pipefail
T0=$SECONDS; DEADLINE=${DEADLINE:-540}
left() { echo $((DEADLINE - (SECONDS - T0))); }
O=${OUT:-/tmp/out}; mkdir -p "$O/cpu"
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache14
CB=target-cpu14/cpu_bench
{ date -u; nvidia-smi -L; lscpu | grep -E 'Model name|^CPU\(s\)'; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$O/env.txt" 2>&1
cat "$O/env.txt"

RUNS="fa3 fa3_ragged fa3_fp8 splitkv_mla paged_decode" DEADLINE=$((DEADLINE - 200)) SAN_S=0 \
  bash bench/studies/session10/tests10.sh > "$O/tests.txt" 2>&1
echo "tests ($(left) s left)"

pt() { python3 bench/cpu/pytorch_cpu_sdpa.py --ours "$CB" --torch-kernels fused --no-read-bw "$@"; }
timeout 100 taskset -c 0,1 bash -c "$(declare -f pt); CB=$CB; pt --simd amx --preset amx --rounds 3 --threads 2 \
  --reps 3 --out $O/cpu/amx-2t.json" > "$O/cpu/amx-2t.log" 2>&1
echo "amx 2t rc=$? ($(left) s left)"
timeout 60 bash -c "$(declare -f pt); CB=$CB; pt --simd amx --preset amx --rounds 3 --threads 16 --reps 5 \
  --out $O/cpu/amx-16t.json" > "$O/cpu/amx-16t.log" 2>&1
echo "amx 16t rc=$? ($(left) s left)"

echo "== tests"; grep -A12 "== tests" "$O/tests.txt"
echo "== amx 2t"; tail -12 "$O/cpu/amx-2t.log"
echo "== amx 16t"; tail -12 "$O/cpu/amx-16t.log"
