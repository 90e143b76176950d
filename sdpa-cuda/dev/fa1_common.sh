# Shared by the fa1 study scripts (sourced, not run): building "binary sets" (fa1_build_sets.sh,
# fa1_mma_sets.sh) and running them on the device (fa1_run.sh, fa1_mma_run.sh). A binary set is
# target-fa1/carry/<SET>/{gpu_kernels,cuda_kernels}: the GPU test and bench binaries of one tile choice.

# sets_prepare FILE...: the committed tree (git archive HEAD) in $W with this checkout's FILEs on top, so other
# helpers' unfinished files stay out; sets ROOT, W and CARGO_TARGET_DIR (target-fa1).
sets_prepare() {
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  export CARGO_TARGET_DIR="$ROOT/target-fa1"
  W=/tmp/fa1-sets-src
  rm -rf "$W" && mkdir -p "$W"
  git -C "$ROOT" archive HEAD | tar -x -C "$W"
  for f in "$@"; do cp "$ROOT/$f" "$W/$f"; done
}

# sets_build SET MARKER LINES: builds gpu_kernels and cuda_kernels in $W, copies them stripped to
# target-fa1/carry/SET and prints how many MARKER lines the test binary embeds (the first LINES of them).
sets_build() {
  local set_name="$1" marker="$2" lines="$3"
  (cd "$W" && cargo test --release -p sdpa-cuda --test gpu_kernels --no-run 2>&1 | grep -E "^error|Executable")
  (cd "$W" && cargo bench -p sdpa-cuda --bench cuda_kernels --no-run 2>&1 | grep -E "^error|Executable")
  local out="$ROOT/target-fa1/carry/$set_name" gk ck
  mkdir -p "$out"
  gk=$(ls -t "$CARGO_TARGET_DIR"/release/deps/gpu_kernels-* | grep -v '\.d$' | head -1)
  ck=$(ls -t "$CARGO_TARGET_DIR"/release/deps/cuda_kernels-* | grep -v '\.d$' | head -1)
  cp "$gk" "$out/gpu_kernels"; cp "$ck" "$out/cuda_kernels"; strip "$out/gpu_kernels" "$out/cuda_kernels"
  echo "$set_name: $(strings "$out/gpu_kernels" | grep -c "$marker") choice lines embedded"
  strings "$out/gpu_kernels" | grep "$marker" | head -"$lines"
}

# run_setup: the device side's common start: C (the sets), OUT, SETS (default: every set), LOG ($OUT/run.log),
# the environment, an empty `summary` array.
run_setup() {
  C=target-fa1/carry
  OUT="${OUT:-/tmp/fa1-out}"
  SETS="${SETS:-$(ls "$C")}"
  mkdir -p "$OUT"
  export CUDA_HOME=/usr/local/cuda SDPA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
  LOG="$OUT/run.log"
  summary=()
}

# sanitize_set SET LIMIT: compute-sanitizer memcheck and racecheck on the small fa1 test of SET's gpu_kernels,
# LIMIT seconds each; appends to $LOG and `summary`.
sanitize_set() {
  local set="$1" limit="$2" tool s rc
  export SDPA_CUDA_CACHE=/tmp/sdpa-cache-$set
  for tool in memcheck racecheck; do
    s=$(date +%s); echo "== $tool $set" >> "$LOG"
    timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 3 "$C/$set/gpu_kernels" \
      fa1_small_shapes_for_the_sanitizer --exact --test-threads 1 > /tmp/san.log 2>&1; rc=$?
    cat /tmp/san.log >> "$LOG"
    summary+=("$tool $set rc=$rc $(($(date +%s) - s))s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' /tmp/san.log | tr '\n' ' ')")
  done
}
