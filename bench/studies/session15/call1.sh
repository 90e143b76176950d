#!/usr/bin/env bash
# Session 15's device call, from the repository root with `gpu-bundle` (of this tree) and `target-cpu14`
# (`cpu_bench`, a release build of the CPU code unchanged since f825e49, stripped) carried:
#   1. GPU tests side by side (tests10.sh): the kernels whose tensor-map operands come from one builder since
#      8f0c03b (fa3 dense, packed, paged, FP8; splitkv's MLA path), and splitkv's decoding at every head-dim
#      class with the TMA ring in 32-column boxes at D = 96 (D = 80 runs there; SDPA_SPLITKV_TMA_NARROW=1,
#      the verification switch) and without;
#   2. compute-sanitizer memcheck, racecheck and synccheck on splitkv's TMA path at D = 80 (padded), D = 96
#      causal bottom-right (exact), D = 64 / Dv = 96 (a K box never loaded) and D = 80 under a tuning tile
#      (8 stages of 16 keys);
#   3. issue 21's decoding points against PyTorch and the copy probe (decode_classes_bench.py): the product
#      (64-column boxes), 32-column boxes four and three stages deep, and 16-key steps on deeper rings
#      (TILES) in the same run; the class test also runs under TILES;
#   4. the AMX bar after session 13's softmax fix (next-call.sh of session 14, stage 1).
#   DEADLINE=560 [TESTS_S=250] [AMX_S=190] [RUNS=...] [SHORT=1] bash bench/studies/session15/call1.sh
# (TESTS_S: seconds for stages 1 and 2; AMX_S: seconds kept after stage 3 for stage 4 and the table; RUNS
# replaces stage 1's list; SHORT=1 times the product and 32-column boxes at D = 80 and 96 only.)
set -uo pipefail
T0=$SECONDS; DEADLINE=${DEADLINE:-560}
left() { echo $((DEADLINE - (SECONDS - T0))); }
R=${OUT:-/tmp/out}; O=/tmp/w15; mkdir -p "$R" "$O/cpu" "$O/san"
# $OUT brings back 8 files at most: the logs travel packed, the records beside them.
pack() { tar czf "$R/call1.tgz" -C /tmp w15; cp "$O"/decode_classes.json "$O"/cpu/amx-*.json "$O"/cpu/skip-*.json "$R"/ 2>/dev/null; }
trap pack EXIT
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda SDPA_CUDA_CACHE=/tmp/sdpa-cache15 SDPA_REQUIRE_GPU=1
command -v compute-sanitizer > /dev/null || export PATH="$PATH:$CUDA_HOME/bin"
B=gpu-bundle
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  lscpu | grep -E 'Model name|^CPU\(s\)'; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$O/env.txt" 2>&1
cat "$O/env.txt"

# 1. Tests (tests10.sh packs its logs into $OUT/tests10.tgz).
TILES=96:8x16,128:6x16,192:4x16
N=SDPA_SPLITKV_TMA_NARROW=1
RUNS=${RUNS:-"fa3 fa3_ragged fa3_fp8 splitkv_mla paged_decode fa2_kernels:splitkv@$N fa2_kernels:splitkv
  fa2_kernels:splitkv_decodes_every_head_dim_class@$N+SDPA_SPLITKV_TMA_TILE=$TILES"}
RUNS=$RUNS DEADLINE=${TESTS_S:-250} SAN_S=0 \
  bash bench/studies/session10/tests10.sh > "$O/tests.txt" 2>&1 &
# 2. Sanitizers on splitkv's TMA path (the kernel cache warmed by a plain run first).
san() {  # tool shape mask [VAR=value]; skipped once stage 1's time is spent
  local log="$O/san/$1-${2//,/x}-$3${4:+-${4%%=*}}.log" t=$(( ${TESTS_S:-250} - (SECONDS - T0) ))
  [ $t -lt 10 ] && { echo "$1 $2 $3 ${4:-}: skipped (stage time spent)"; return; }
  env SDPA_SPLITKV_LOAD=tma ${4:-} timeout $(( t < 60 ? t : 60 )) compute-sanitizer --tool "$1" --error-exitcode 3 $B/sdpa run \
    --backend cuda --kernel splitkv --dtype bf16 --shape "$2" --mask "$3" --warmup 0 --reps 1 --check > "$log" 2>&1
  echo "$1 $2 $3 ${4:-} rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
}
(
  export $N
  cases=("1,32,8,1,5000,80 none" "1,16,16,2,3001,96 causal-br" "1,8,2,1,3003,64,96 causal"
         "1,32,8,1,5000,80 none SDPA_SPLITKV_TMA_TILE=8x16")
  for c in "${cases[@]}"; do set -- $c
    env SDPA_SPLITKV_LOAD=tma ${3:-} $B/sdpa run --backend cuda --kernel splitkv --dtype bf16 --shape "$1" --mask "$2" \
      --warmup 1 --reps 2 --check > "$O/san/warm-${1//,/x}.log" 2>&1; echo "warm $1 $2 ${3:-} rc=$?"
  done
  for tool in memcheck racecheck synccheck; do
    for c in "${cases[@]}"; do set -- $c; san $tool "$1" "$2" "${3:-}"; done
  done
) > "$O/san.txt" 2>&1
wait
echo "checks done ($(left) s left)"

# 5. Beside stage 3 (on four cores of their own; the GPU timings need little of the host): the CPU causal
# skip against whole edge tiles (SDPA_CPU_CAUSAL_SKIP=0, session 16), cache-resident causal calls, one thread,
# AVX2 and AVX512_BF16 (f32: the AVX-512 kernel; bf16: fa2/bf16dot) forced on both sides.
CB=${CB:-target-cpu14/cpu_bench}
pt() { python3 bench/cpu/pytorch_cpu_sdpa.py --ours "$CB" --torch-kernels fused --no-read-bw "$@"; }
if [ "${SKIP_AB:-1}" = 1 ]; then
  ( for isa in avx2 avx512-bf16; do
      timeout 100 taskset -c 4-7 bash -c "$(declare -f pt); CB=$CB; pt --simd $isa --preset small --threads 1 --rounds 5 \
        --reps 9 --ours-variant whole:SDPA_CPU_CAUSAL_SKIP=0 --out $O/cpu/skip-$isa-1t.json" > "$O/cpu/skip-$isa.log" 2>&1
      echo "skip A/B $isa rc=$?"
    done ) > "$O/skip.txt" 2>&1 &
fi

# 3. Decoding timings (alone on the GPU).
EXTRA="--variant s3=$N+SDPA_SPLITKV_TMA_TILE=96:3x32 --only s3:80 --only s3:96 --variant k16=$N+SDPA_SPLITKV_TMA_TILE=$TILES"
[ -n "${SHORT:-}" ] && EXTRA="--only default:80 --only default:96"
timeout $(( $(left) - ${AMX_S:-190} )) python3 sdpa-cuda/dev/decode_classes_bench.py --bench $B/cuda_kernels --out "$O" \
  --variant narrow=$N --only narrow:80 --only narrow:96 $EXTRA > "$O/decode.log" 2>&1
echo "decode rc=$? ($(left) s left)"

wait  # stage 5
# 4. The AMX bar (CPU only; AMX_S=0 leaves it out).
if [ "${AMX_S:-190}" -gt 0 ]; then
  timeout $(( $(left) - 75 )) taskset -c 0,1 bash -c "$(declare -f pt); CB=$CB; pt --simd amx --preset amx --rounds 3 \
    --threads 2 --reps 3 --out $O/cpu/amx-2t.json" > "$O/cpu/amx-2t.log" 2>&1
  echo "amx 2t rc=$? ($(left) s left)"
  timeout $(( $(left) - 10 )) bash -c "$(declare -f pt); CB=$CB; pt --simd amx --preset amx --rounds 3 --threads 16 \
    --reps 5 --out $O/cpu/amx-16t.json" > "$O/cpu/amx-16t.log" 2>&1
  echo "amx 16t rc=$? ($(left) s left)"
fi

echo "== tests"; sed -n '/== tests/,$p' "$O/tests.txt" | head -20
echo "== sanitizers"; cat "$O/san.txt"
echo "== decode"; sed -n '/^copy /,$p' "$O/decode.log"; grep -iE "error|Traceback" "$O/decode.log" | head -5
echo "== amx 2t"; tail -10 "$O/cpu/amx-2t.log" 2>/dev/null
echo "== amx 16t"; tail -10 "$O/cpu/amx-16t.log" 2>/dev/null
echo "== causal skip A/B"; cat "$O/skip.txt" 2>/dev/null; grep -h "causal | fa2" "$O"/cpu/skip-*.log 2>/dev/null
