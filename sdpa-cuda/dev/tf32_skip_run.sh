#!/usr/bin/env bash
# Device call for the per-warp causal skip (kernels/tf32.cu TC_WARP_SKIP) and the wgmma diagnostics
# (dev/tf32_wg.cuh), everything built here into $C beforehand (see bench/results/tf32.md):
#   tf32dev.so        dev/tf32_skip_configs.inc, skip on;  tf32dev_noskip.so  the same with -DTC_WARP_SKIP=0
#   wg_{novt,nokround,none}.so  dev/tf32_wg_diag.inc with WG_DIAG_* (timing only: wrong results by design)
#   tf32_kernels, gpu_kernels   cargo test --release -p sdpa-cuda --no-run (stripped)
C=${C:-target-tf32/carry4}
OUT=${OUT:-/tmp/tf32-out}
export PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
B=sdpa-cuda/dev/tf32_bench.py
# Skip and no-skip timed back to back (same shapes, same PyTorch anchor measured in each).
C=$C OUT=$OUT bash sdpa-cuda/dev/tf32_run.sh dev > "$OUT/run_dev.txt" 2>&1
python3 $B --lib "$C/tf32dev_noskip.so" --bench --no-ceilings --out "$OUT/noskip" > "$OUT/noskip.log" 2>&1
for v in novt nokround none; do
  python3 $B --lib "$C/wg_$v.so" --bench --no-ceilings --dims 128 --out "$OUT/wg_$v" > "$OUT/wg_$v.log" 2>&1
done
C=$C OUT=$OUT bash sdpa-cuda/dev/tf32_run.sh tests sanitize > "$OUT/run_tests.txt" 2>&1
"$C/gpu_kernels" --test-threads=1 tf32 > "$OUT/gpu_tf32.log" 2>&1; echo "gpu_kernels tf32 rc=$? $(grep '^test result' "$OUT/gpu_tf32.log")"
grep -E "CHECKS|check dp" "$OUT/dev.log"
echo "== skip (new) SUMMARY"; sed -n '/^SUMMARY/,$p' "$OUT/dev.log" | cut -c1-150
echo "== noskip SUMMARY"; sed -n '/^SUMMARY/,$p' "$OUT/noskip.log" | cut -c1-150
for v in novt nokround none; do echo "== wg $v"; grep -E "^ +tf32:wg" "$OUT/wg_$v.log" | cut -c1-80 | tr '\n' ';'; echo; done
tail -8 "$OUT/run_tests.txt"
