#!/usr/bin/env bash
# run-ring.sh: issue 26's runs on the two-H100 machine (session 7: fa3 steps, resident shards), from a GPU
# bundle (`cargo xtask gpu-bundle`) with this script and bench/gpu/ring_cp.py beside `sdpa`:
#   run-ring.sh [tests] [fwd] [long] [bwd1] [sanitize] [bwd]  (in that order; default: tests fwd long bwd1 sanitize)
# tests:    the ring test binary (reference with the steps on auto/fa2/fa3, single-GPU kernel, backward,
#           resident shards), SDPA_REQUIRE_RING=1
# sanitize: compute-sanitizer on a tiny ring call, each with a time guard: memcheck over both GPUs with API
#           reports off and NCCL's kernels not instrumented; memcheck of the ring of one GPU (the ring test
#           binary with CUDA_VISIBLE_DEVICES=0: every step kernel, no transfer); racecheck of ring.cu's kernels
# fwd:      S = $SEQS (default 32k,64k,128k), bf16, D=128, B=1, H=32, causal and none: the ring with its steps
#           on fa3 and on fa2 (sdpa bench --gpus 2 --kernel fa3,fa2), our one-GPU fa3, PyTorch's
#           context_parallel (flash and cuDNN rings, all-to-all rotation)
# long:     the same at S = $LONG_SEQS (default 256k)
# bwd1:     the ring's fwd+bwd at 32k (forward steps on fa3), for the backward's per-step hidden fractions
# bwd:      fwd+bwd at S = $BWD_SEQS (default 32k): the ring (forward steps fa3 and fa2), one GPU, PyTorch
# Every stage's timeout is cut to what is left before $DEADLINE_S seconds from the start (default 400), so
# the tarball and the table always come back. Everything lands in $OUT/ring (default ./ring-out), tarred into
# $TGZ after every stage; the last lines are a table (bench/studies/ring/ring_table.py, also table.md).
set -uo pipefail
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$PWD/ring-out}"
R="$OUT/ring"; mkdir -p "$R"
T0=$SECONDS; DEADLINE_S="${DEADLINE_S:-400}"
export NCCL_NVLS_ENABLE=0 CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" SDPA_CUDA_CACHE=/tmp/sdpa-cuda-cache PYTHONUNBUFFERED=1
NCCL_LIB="$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null)/lib"
export LD_LIBRARY_PATH="$NCCL_LIB:${LD_LIBRARY_PATH:-}"
SAN="$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")"
stages="${*:-tests fwd long bwd1 sanitize}"
want() { [[ " $stages " == *" $1 "* ]]; }
SEQS="${SEQS:-32768,65536,131072}"; LONG_SEQS="${LONG_SEQS:-262144}"; BWD_SEQS="${BWD_SEQS:-32768}"
shapes() { local s out=(); for s in ${1//,/ }; do out+=(--shape "1,32,32,$s,$s,128"); done; echo "${out[@]}"; }
# left CAP: CAP, or the seconds left before the deadline less 8 for the tarball, whichever is smaller (>= 1).
left() { local l=$((DEADLINE_S - (SECONDS - T0) - 8)); ((l > $1)) && l=$1; ((l < 1)) && l=1; echo $l; }
# After every stage the folder is tarred again into $TGZ (default $OUT/ring.tgz): a call cut short still
# brings back what ran.
TGZ="${TGZ:-$OUT/ring.tgz}"
log_rc() { echo "$1 rc=$2 at $((SECONDS - T0)) s" >> "$R/rc.txt"; tar czf "$TGZ" -C "$OUT" ring 2>/dev/null; }

{ date -u; nvidia-smi -L; nvidia-smi topo -m; echo "NCCL_LIB=$NCCL_LIB"; "$SAN" --version 2>&1 | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > "$R/env.txt" 2>&1

if want tests; then
  SDPA_REQUIRE_RING=1 timeout "$(left 130)" "$B/tests/ring" --test-threads=1 > "$R/tests.log" 2>&1
  log_rc tests $?
fi
bench() { # name pass seqs gpus kernels cap [masks] [warmup]
  timeout "$(left "$6")" "$B/sdpa" bench --backend cuda --kernel "$5" --dtype bf16 --layout bhsd --mask "${7:-causal,none}" \
    --pass "$2" $(shapes "$3") --gpus "$4" --no-pytorch --max-time 1 --reps 3 --warmup "${8:-1}" --out "$R/$1.json" > "$R/$1.log" 2>&1
  log_rc "$1" $?
}
cp_bench() { # name pass seqs cap [masks]
  timeout "$(left "$4")" python3 "$B/ring_cp.py" --gpus 2 --seqs "$3" --pass "$2" --masks "${5:-causal,none}" \
    --rotates alltoall --backends flash,cudnn --reps 3 --warmup 1 --out "$R/$1.json" > "$R/$1.log" 2>&1
  log_rc "$1" $?
}
if want fwd; then
  bench ring2-fwd fwd "$SEQS" 2 fa3,fa2 90; bench single-fwd fwd "$SEQS" 1 fa3 50; cp_bench cp-fwd fwd "$SEQS" 70
fi
if want long; then # no extra warm-up: the bench's untimed call before the timed ones is one already
  bench ring2-long fwd "$LONG_SEQS" 2 fa3,fa2 100 causal,none 0; bench single-long fwd "$LONG_SEQS" 1 fa3 70 causal,none 0
  cp_bench cp-long fwd "$LONG_SEQS" 60
fi
if want bwd1; then # the ring's forward + backward at 32k, fa3 forward steps (the dK/dV hop's hidden fraction)
  bench ring2-bwd1 fwd+bwd 32768 2 fa3 30
fi
if want sanitize; then
  tiny=(--shape 1,4,2,203,203,64 --dtype bf16 --mask causal --pass fwd+bwd --check --warmup 0 --reps 1)
  exclude=(); "$SAN" --help 2>&1 | grep -q -- --kernel-name-exclude && exclude=(--kernel-name-exclude kns=nccl)
  echo "memcheck over 2 GPUs, NCCL kernels excluded: ${exclude[*]:-(option missing)}" > "$R/sanitizer.log"
  timeout "$(left 40)" "$SAN" --tool memcheck --report-api-errors no "${exclude[@]}" --error-exitcode 9 \
    "$B/sdpa" run --backend cuda --gpus 2 --kernel auto "${tiny[@]}" >> "$R/sanitizer.log" 2>&1
  log_rc sanitize-2gpu $?
  # One rank: the ring of one GPU runs every step kernel (fa3 and fa2 forward, the backward, the adds and
  # conversions) with no NCCL transfer; the f64 checks of the test fail if anything is wrong.
  CUDA_VISIBLE_DEVICES=0 timeout "$(left 60)" "$SAN" --tool memcheck --report-api-errors no "${exclude[@]}" \
    --error-exitcode 9 "$B/tests/ring" --test-threads=1 ring_forward_matches_the_reference \
    ring_backward_matches_the_reference > "$R/sanitizer-1gpu.log" 2>&1
  log_rc sanitize-1gpu $?
  # ring.cu's own kernels (merge, add, convert, rows) for shared-memory hazards, over both GPUs.
  timeout "$(left 30)" "$SAN" --tool racecheck --kernel-name kns=ring_ --error-exitcode 9 \
    "$B/sdpa" run --backend cuda --gpus 2 --kernel auto "${tiny[@]}" > "$R/racecheck.log" 2>&1
  log_rc racecheck-ring-kernels $?
fi
if want bwd; then
  bench ring2-bwd fwd+bwd "$BWD_SEQS" 2 fa3,fa2 60; bench single-bwd fwd+bwd "$BWD_SEQS" 1 fa2 30
  cp_bench cp-bwd fwd+bwd "$BWD_SEQS" 40
fi
python3 "$B/ring_table.py" "$R" > "$R/table.md" 2>&1
tar czf "$TGZ" -C "$OUT" ring
cat "$R/rc.txt"
grep -E "test result|FAILED|panicked" "$R/tests.log" 2>/dev/null | head -8
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|check |test result" "$R"/sanitizer*.log "$R/racecheck.log" 2>/dev/null | head -8
cat "$R/table.md"
