#!/usr/bin/env bash
# run-ring.sh: issue 26's runs on the two-H100 machine, from a GPU bundle (`cargo xtask gpu-bundle`) with
# this script and bench/gpu/ring_cp.py copied beside `sdpa`:
#   run-ring.sh [tests] [sanitize] [fwd] [fwd128] [cpnone] [long] [bwdnone] [bwd]   (in that order; default: tests sanitize fwd)
# tests:    the ring test binary (reference, single-GPU kernel, backward), SDPA_REQUIRE_RING=1
# sanitize: compute-sanitizer memcheck on a small ring call (forward + backward, 2 GPUs)
# fwd:      sdpa bench --gpus 2 and --gpus 1 (our single-GPU kernel) and PyTorch's context_parallel, bf16, D=128,
#           B=1, H=32, causal and none, S = $SEQS (default 32k,64k,128k)
# bwd:      the same for --pass fwd+bwd, S = $BWD_SEQS (default 32k,64k)
# fwd128:   ours (2 GPUs and 1) at S = 128k alone, with a longer timeout
# cpnone:   PyTorch's context_parallel without a mask at 32k..128k
# bwdnone:  fwd+bwd without a mask at 32k (ours 2 GPUs and 1), PyTorch's fwd+bwd both masks
# long:     fwd at S = 256k
# Everything lands in $OUT/ring (default ./ring-out) and is tarred into $OUT/ring.tgz; the last lines are a table.
set -uo pipefail
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$PWD/ring-out}"
R="$OUT/ring"; mkdir -p "$R"
export NCCL_NVLS_ENABLE=0 CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" SDPA_CUDA_CACHE=/tmp/sdpa-cuda-cache PYTHONUNBUFFERED=1
NCCL_LIB="$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null)/lib"
export LD_LIBRARY_PATH="$NCCL_LIB:${LD_LIBRARY_PATH:-}"
SAN="$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")"
stages="${*:-tests sanitize fwd}"
want() { [[ " $stages " == *" $1 "* ]]; }
SEQS="${SEQS:-32768,65536,131072}"; BWD_SEQS="${BWD_SEQS:-32768,65536}"
shapes() { local s out=(); for s in ${1//,/ }; do out+=(--shape "1,32,32,$s,$s,128"); done; echo "${out[@]}"; }

{ date -u; nvidia-smi -L; nvidia-smi topo -m; ls -l "$NCCL_LIB" 2>&1 | head -5
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > "$R/env.txt" 2>&1

if want tests; then
  SDPA_REQUIRE_RING=1 timeout 100 "$B/tests/ring" --test-threads=1 > "$R/tests.log" 2>&1
  echo "tests rc=$?" >> "$R/rc.txt"
fi
if want sanitize; then
  timeout "${SAN_TIMEOUT:-40}" "$SAN" --tool memcheck --report-api-errors no --error-exitcode 9 "$B/sdpa" run --backend cuda --gpus 2 \
    --shape 1,4,2,203,203,64 --dtype bf16 --mask causal --pass fwd+bwd --check --warmup 0 --reps 1 > "$R/sanitizer.log" 2>&1
  echo "sanitize rc=$?" >> "$R/rc.txt"
fi
bench() { # name pass seqs gpus timeout [masks]
  timeout "$5" "$B/sdpa" bench --backend cuda --kernel auto --dtype bf16 --layout bhsd --mask "${6:-causal,none}" --pass "$2" \
    $(shapes "$3") --gpus "$4" --no-pytorch --max-time 1 --reps 5 --warmup 1 --out "$R/$1.json" > "$R/$1.log" 2>&1
  echo "$1 rc=$?" >> "$R/rc.txt"
}
cp_bench() { # name pass seqs timeout [masks]
  timeout "$4" python3 "$B/ring_cp.py" --gpus 2 --seqs "$3" --pass "$2" --masks "${5:-causal,none}" --rotates alltoall --backends flash,cudnn \
    --reps 3 --warmup 1 --out "$R/$1.json" > "$R/$1.log" 2>&1
  echo "$1 rc=$?" >> "$R/rc.txt"
}
if want fwd; then
  bench ring2-fwd fwd "$SEQS" 2 75; bench single-fwd fwd "$SEQS" 1 75; cp_bench cp-fwd fwd "$SEQS" 100
fi
if want fwd128; then # the longest of the fwd lengths, with room (each timed call uploads the shards again)
  bench ring2-fwd128 fwd 131072 2 110; bench single-fwd128 fwd 131072 1 60
fi
if want cpnone; then # PyTorch without a mask (load balancing off: it refuses it without is_causal)
  cp_bench cp-none fwd 32768,65536,131072 45 none
fi
if want long; then
  bench ring2-long fwd 262144 2 70; bench single-long fwd 262144 1 70; cp_bench cp-long fwd 262144 90
fi
if want bwdnone; then # the backward without a mask at 32k, with room; PyTorch's backward both ways
  bench ring2-bwdnone fwd+bwd 32768 2 80 none; bench single-bwdnone fwd+bwd 32768 1 35 none; cp_bench cp-bwd fwd+bwd 32768 50
fi
if want bwd; then
  bench ring2-bwd fwd+bwd "$BWD_SEQS" 2 60; bench single-bwd fwd+bwd "$BWD_SEQS" 1 35; cp_bench cp-bwd fwd+bwd "$BWD_SEQS" 40
fi
tar czf "$OUT/ring.tgz" -C "$OUT" ring
cat "$R/rc.txt"
grep -E "test result|FAILED|panicked" "$R/tests.log" 2>/dev/null | head -8
grep -E "ERROR SUMMARY|check" "$R/sanitizer.log" 2>/dev/null | head -4
python3 - "$R" <<'EOF'
import json, os, sys
r = sys.argv[1]
rows = {}
for f in sorted(os.listdir(r)):
    if not f.endswith(".json"):
        continue
    try:
        d = json.load(open(os.path.join(r, f)))
    except Exception as e:
        print(f, "unreadable", e); continue
    for x in d.get("records", []):
        key = (x.get("pass", "fwd"), x["mask"], x["shape"]["sq"])
        name = f"{x['backend']}:{x['kernel']}x{x.get('gpus') or 1}"
        rows.setdefault(key, {})[name] = x["time_ms"]["median"]
    for s in d.get("skipped", [])[:4]:
        print("skipped", f, s.get("kernel"), s.get("reason", "")[:120])
for key in sorted(rows):
    v = rows[key]
    one = next((t for n, t in v.items() if n.startswith("cuda:") and n.endswith("x1")), None)
    two = next((t for n, t in v.items() if n.startswith("cuda:") and n.endswith("x2")), None)
    cps = [t for n, t in v.items() if n.startswith("pytorch:")]
    ratio = f"speedup {one / two:.2f}x" if one and two else ""
    vs = f"vs best cp {min(cps) / two:.2f}x" if cps and two else ""
    print(key, " ".join(f"{n}={t:.2f}" for n, t in sorted(v.items())), ratio, vs)
EOF
for f in "$R"/ring2-*.log; do [ -f "$f" ] && grep -m4 "ring .* step" "$f"; done
