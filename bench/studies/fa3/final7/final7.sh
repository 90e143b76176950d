#!/usr/bin/env bash
# Session 7's verification call on one H100 (run from the repository root): the merged fa3 (persistent
# scheduler + head-dim classes) against the f64 reference and under the sanitizers, the whole GPU suite with
# `auto` picking fa3 (SDPA_AUTO_FA3=1), sdpa-cpu's suites on the AMX path of the host CPU (in parallel, on
# cores 8-15), then fa3 against cuDNN/FLASH/fa2 on the fa2bench grid and a head-dim check. Deadline-guarded.
set -uo pipefail
B=gpu-bundle
O="$OUT/final7"; mkdir -p "$O"
T0=$SECONDS; DEADLINE=${DEADLINE:-520}
left() { echo $((DEADLINE - (SECONDS - T0))); }
pack() { tar czf "$OUT/final7.tgz" -C "$OUT" final7; }
trap pack EXIT
export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
# 1. AMX in the background on cores 8-15.
( for t in sdpa_cpu amx correctness nonfinite semantics; do
    SDPA_REQUIRE_AMX=1 SDPA_CPU_SIMD=amx timeout 60 taskset -c 8-15 "$B/cpu-tests/$t" --test-threads 8 > "$O/amx-$t.log" 2>&1
    echo "$t rc=$? $(grep -E 'test result' "$O/amx-$t.log" | tail -1)"
  done > "$O/amx-summary.txt" 2>&1 ) &
AMX=$!
# 2. fa3 tests and the sanitizers on a small call of every class (fa3_run.sh).
# The bench stage of fa3_run.sh gets what is left of its 190 s: the head-dim grid at S = 4096.
OUT="$O" B=$B BUDGET=190 TEST_TIMEOUT=110 timeout 195 bash sdpa-cuda/dev/fa3_run.sh --headdims --seqs 4096 --variants > "$O/fa3-run.log" 2>&1
echo "== fa3_run (tests + sanitizers + head dims at 4k)"; grep -E "rc=|test result|SUMMARY" "$O/fa3-run.log" | head -30
tail -30 "$O/fa3-run.log"
# 3. The whole GPU suite with auto picking fa3.
echo "== GPU suite with SDPA_AUTO_FA3=1 ($(left) s left)"
SDPA_AUTO_FA3=1 OUT="$O/suite" timeout $(( $(left) - 80 )) bash $B/run-gpu.sh tests > "$O/suite.log" 2>&1
echo "suite rc=$?"; tail -25 "$O/suite.log"
while kill -0 $AMX 2>/dev/null && [ "$(left)" -gt 60 ]; do sleep 2; done; kill $AMX 2>/dev/null; echo "== AMX (cores 8-15)"; cat "$O/amx-summary.txt"
# 4. fa3 vs cuDNN / FLASH / fa2: the fa2bench grid (bf16), then the head-dim check, in what is left.
l=$(left); echo "== bench ($l s left)"
if [ "$l" -gt 40 ]; then
  PYTHONPATH="$B:sdpa-cuda/dev" timeout $(( l - 5 )) python3 $B/fa3_bench.py --bench $B/cuda_kernels --out "$O/grid" --variants --seqs 1024 4096 16384 > "$O/grid.log" 2>&1
  grep -vE "^(timing|ENV|CEILINGS)" "$O/grid.log" | tail -40
fi
