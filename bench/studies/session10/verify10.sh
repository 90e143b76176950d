#!/usr/bin/env bash
# Session 10's correctness call for what its engineers wrote without a GPU, all side by side on one H100
# (timings are left to timing10.sh, a call of its own):
#   - fa3's ragged batches, packed and paged (bench/studies/fa3/ragged10/run.sh, TIMING=0);
#   - the backward's pad-copy path at odd head dims (bench/studies/backward/odd10/run.sh, TIMING=0);
#   - tests/fa3_fp8 and tests/fa3_variants whole with their sanitizers (tests10.sh): the FP8 and variant
#     entries after the two changes that touch them (the 4-byte O stores, the dense path's per-sequence
#     accessors).
# From the repository root with gpu-bundle carried:
#   DEADLINE=400 bash bench/studies/session10/verify10.sh
set -uo pipefail
DEADLINE=${DEADLINE:-400}
mkdir -p /tmp/w
( TIMING=0 TEST_S=$(( DEADLINE - 180 )) DEADLINE=$DEADLINE bash bench/studies/fa3/ragged10/run.sh > /tmp/w/ragged10.txt 2>&1 ) &
( TIMING=0 DEADLINE=$(( DEADLINE - 60 )) bash bench/studies/backward/odd10/run.sh > /tmp/w/odd10.txt 2>&1 ) &
( DEADLINE=$(( DEADLINE - 20 )) SAN_S=120 RUNS="fa3_fp8 fa3_variants" \
    SAN="fa3_fp8:small_calls_for_the_sanitizer fa3_variants:small_variant_calls_for_the_sanitizer" \
    bash bench/studies/session10/tests10.sh > /tmp/w/tests10.txt 2>&1 ) &
wait
for f in ragged10 odd10 tests10; do echo "######## $f"; sed -n '/^== /,$p' /tmp/w/$f.txt | cut -c1-260; done
