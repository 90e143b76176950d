#!/usr/bin/env bash
# Session 24's call 2: fa3's windows, softcap and ALiBi on FP8 inputs (the variant entries over E4M3 scores),
# verified and timed. From the repository root with gpu-bundle carried (tests: fa3_fp8, fa3_variants):
#   (FP8 variants are behind SDPA_FA3_FP8_VARIANTS=1 until this call verifies them; every run here sets it.)
#   1. tests/fa3_fp8 whole (the plain FP8 tests under session 23's layout rule, the variant test with each
#      call's layout by the rule) and its variant test under each layout forced; fa3_variants (bf16/f16:
#      FA3_ENTRY_VAR gained an argument); machinery (session 23's compile lock); compute-sanitizer memcheck,
#      racecheck and synccheck on fa3_fp8's small calls (two of them variant calls), two persistent blocks
#      walking several tiles;
#   2. `sdpa bench --spec bench/studies/session24/fp8-variants.json --no-pytorch`: each variant on FP8 against
#      the same on bf16, same run.
#   [T=240] [SAN_S=100] [BT=200] bash bench/studies/session24/call2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda
export OUT=${OUT:-/tmp/out}; O=$OUT; mkdir -p "$O"
rm -rf /tmp/w/tests10  # call 1's logs, when it ran on this machine before
V=SDPA_FA3_FP8_VARIANTS=1  # the verification switch (fa3::FP8_VARIANTS_SWITCH)
RUNS=${RUNS:-"fa3_fp8@$V fa3_fp8:fp8_variants@SDPA_FA3_AB=vt-kernel+$V fa3_fp8:fp8_variants@SDPA_FA3_AB=vt-prepass+$V fa3_variants machinery"} \
  SAN=${SAN:-"fa3_fp8:small_calls_for_the_sanitizer@SDPA_FA3_GRID=2,1+$V"} \
  SAN_S=${SAN_S:-100} DEADLINE=${T:-240} bash bench/studies/session10/tests10.sh > /tmp/tests.txt 2>&1
cp /tmp/tests.txt "$O/tests2.txt"; tail -12 /tmp/tests.txt
grep -h "test result\|panicked\|FAILED\|fa3 fp8" /tmp/w/tests10/*.log | head -20 | cut -c1-220
SDPA_FA3_FP8_VARIANTS=1 SDPA_CUDA_CACHE=/tmp/sdpa-cache10 timeout ${BT:-200} gpu-bundle/sdpa bench --spec bench/studies/session24/fp8-variants.json \
  --no-pytorch --out "$O/fp8-variants.json" > "$O/fp8-variants.log" 2>&1
echo "variants bench rc=$?"; grep -v "^$" "$O/fp8-variants.log" | tail -34 | cut -c1-200
ls "$O"
