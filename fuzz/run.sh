#!/usr/bin/env bash
# Runs cargo-fuzz targets one after the other, each for SECONDS, one process each (the machine has two
# cores), and prints one summary line per target for fuzz/README.md's "Runs".
#
#   fuzz/run.sh SECONDS [TARGET...]      (default: every target; logs in fuzz/logs/)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`); stable Rust works with RUSTC_BOOTSTRAP=1 (cargo-fuzz
# passes -Zsanitizer=address). LeakSanitizer is off: std's thread handles, freed by thread-local
# destructors, show up as leaks when the trace reader's or the reference's threads exit, and a trace
# reader thread still winding down when the process exits holds its 1 MiB chunk.
set -uo pipefail
cd "$(dirname "$0")"
secs="${1:?usage: fuzz/run.sh SECONDS [TARGET...]}"
shift
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(trace_parse tracelens result_file bench_spec attention_spec)
[[ -d corpus ]] || ./seed.sh
mkdir -p logs
export RUSTC_BOOTSTRAP=1
# libFuzzer's -detect_leaks=0 covers its per-input checks; the exit-time check is ASan's own.
export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
cargo fuzz build -O || exit 1
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- .. || echo +dirty)"
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    dict=()
    [[ -f "dicts/$t.dict" ]] && dict=("-dict=dicts/$t.dict")
    log="logs/$t.log"
    start=$(date +%s)
    cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 \
        -detect_leaks=0 -print_final_stats=1 "${dict[@]}" >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    crash=$(grep -o 'Test unit written to [^ ]*' "$log" | sed 's/Test unit written to //' || true)
    echo "$t | $commit | ${execs:-?} execs | $(( $(date +%s) - start )) s | rc $rc | ${crash:-no crash}"
    [[ $rc -eq 0 ]] || status=1
done
exit $status
