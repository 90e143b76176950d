#!/usr/bin/env bash
# run-gpu.sh: everything the GPU machine runs, from the bundle `cargo xtask gpu-bundle` built.
#   gpu-bundle/run-gpu.sh [firstcall] [tests] [sanitize] [bench] [quick]     (no stage named: tests sanitize bench)
# Results under $OUT (default ./gpu-out): summary.json (per test binary and sanitizer run: exit code and
# result line), tests.log, sanitizer.log, cuda_bench.json + bench.log (ours vs PyTorch, same run), env.txt,
# firstcall/ (first-call latency on empty and filled kernel caches, the quick bench from an empty cache;
# run it first on a fresh machine, from the repository root).
# The last lines printed are a short table.
set -uo pipefail
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export SDPA_REQUIRE_GPU=1
export SDPA_CUDA_CACHE="${SDPA_CUDA_CACHE:-/tmp/sdpa-cuda-cache}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export PYTHONUNBUFFERED=1
stages="${*:-tests sanitize bench}"
want() { [[ " $stages " == *" $1 "* ]]; }
quick=""; want quick && quick="--quick"
summary="$OUT/summary.jsonl"; : > "$summary"
table=()

{ date -u; uname -a; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
  ls "$CUDA_HOME"/lib64/libnvrtc* 2>/dev/null | head -3; python3 -c 'import torch; print("torch", torch.__version__)'; } \
  > "$OUT/env.txt" 2>&1

if want firstcall; then
  # Issue 20's measurement. Each kernel: one `sdpa run` on an empty kernel cache of its own (cold: NVRTC
  # compiles what the call needs), then the same command again (warm: the images come from the disk cache).
  # The wall time around the process is taken here too (it includes process start and exit). NVRTC 13 also
  # keeps compiled images in the driver's compute cache (~/.nv/ComputeCache unless CUDA_CACHE_PATH says
  # otherwise): each cold run gets an empty one of its own, as on a fresh machine, or a second run of this
  # stage on the same machine would time cache hits as compiles.
  fc="$OUT/firstcall"; mkdir -p "$fc"; caches="$(mktemp -d)"
  calls=(
    "fa2 bf16 exact 4,16,16,4096,4096,128 causal"
    "splitkv bf16 exact 1,32,8,1,8192,128 causal-br"
    "fa2 bf16 exact 2,16,16,1000,1000,64 none"
    "fa1 bf16 exact 2,16,16,1000,1000,128 causal"
    "fa1 f32 exact 2,8,8,500,500,80 none"
    "unfused bf16 exact 2,16,16,1000,1000,128 causal"
    "fa2 f32 tf32 2,16,16,1000,1000,128 causal"
    "auto f16 exact 1,32,32,1,4096,96 none"
  )
  for c in "${calls[@]}"; do
    read -r kernel dtype math shape mask <<< "$c"
    tag="$kernel-$dtype-$math-${shape//,/x}-$mask"
    for state in cold warm; do
      t0=$(date +%s%N)
      SDPA_CUDA_CACHE="$caches/$tag" CUDA_CACHE_PATH="$caches/$tag-driver" "$B/sdpa" run --backend cuda --kernel "$kernel" --dtype "$dtype" --f32-math "$math" \
        --shape "$shape" --mask "$mask" --warmup 0 --reps 1 --json > "$fc/$tag-$state.json" 2> "$fc/$tag-$state.err"
      rc=$?; t1=$(date +%s%N)
      echo "{\"call\":\"$c\",\"state\":\"$state\",\"rc\":$rc,\"wall_s\":$(( (t1 - t0) / 1000000 ))e-3}" >> "$fc/walls.jsonl"
    done
  done
  # The quick bench as a new user runs it: empty kernel cache, PyTorch side by side.
  t0=$(date +%s%N)
  SDPA_CUDA_CACHE="$caches/quick" CUDA_CACHE_PATH="$caches/quick-driver" "$B/sdpa" bench --preset quick --with-pytorch --out "$fc/quick.json" > "$fc/quick.log" 2>&1
  rc=$?; t1=$(date +%s%N)
  echo "{\"call\":\"bench --preset quick --with-pytorch\",\"state\":\"cold\",\"rc\":$rc,\"wall_s\":$(( (t1 - t0) / 1000000 ))e-3}" >> "$fc/walls.jsonl"
  # Every program of every family from an empty cache, on all cores.
  t0=$(date +%s%N)
  SDPA_CUDA_CACHE="$caches/all" CUDA_CACHE_PATH="$caches/all-driver" "$B/sdpa" warmup --all --json > "$fc/warmup-all.json" 2> "$fc/warmup-all.err"
  rc=$?; t1=$(date +%s%N)
  echo "{\"call\":\"warmup --all\",\"state\":\"cold\",\"rc\":$rc,\"wall_s\":$(( (t1 - t0) / 1000000 ))e-3}" >> "$fc/walls.jsonl"
  du -sh "$caches"/* > "$fc/cache-sizes.txt" 2>&1
  cp "$OUT/env.txt" "$fc/" 2>/dev/null
  rm -rf "$caches"
  python3 - "$fc" <<'PY' > "$fc/table.txt"
import json, os, sys
fc = sys.argv[1]
print(f"{'call':<52} {'state':<5} {'rc':>2} {'wall s':>7} {'first s':>7} {'setup s':>7} {'start->1st':>10}  programs")
for w in (json.loads(l) for l in open(os.path.join(fc, "walls.jsonl"))):
    first = setup = since = "-"; progs = ""
    if w["call"].split()[0] not in ("bench", "warmup"):
        kernel, dtype, math, shape, mask = w["call"].split()
        tag = f"{kernel}-{dtype}-{math}-{shape.replace(',', 'x')}-{mask}-{w['state']}"
        try:
            f = json.load(open(os.path.join(fc, tag + ".json")))["first_call"]
            first, since = f"{f['seconds']:.3f}", f"{f.get('since_process_start_s', 0):.3f}"
            setup = f"{sum(p['image_s'] + p['load_s'] for p in f['programs']):.3f}"
            progs = " ".join(f"{p['program']}({p['origin'][0]}{p['image_s']:.2f})" for p in f["programs"])
        except Exception as e:
            progs = f"no record: {e}"
    elif w["call"].startswith("bench"):
        try:
            b = json.load(open(os.path.join(fc, "quick.json")))
            for wu in b.get("warm_ups", []):
                n = len(wu["programs"]); c = sum(p["origin"] == "compiled" for p in wu["programs"])
                progs += f"{wu['backend']} warm-up {wu['seconds']:.1f} s ({c}/{n} compiled, {sum(p['image_s'] for p in wu['programs']):.1f} s compile CPU); "
            progs += f"{len(b['records'])} records"
        except Exception as e:
            progs = f"no file: {e}"
    else:
        try:
            a = json.load(open(os.path.join(fc, "warmup-all.json")))
            progs = f"{a['programs']} programs, {a['compiled']} compiled on {a['compile_threads']} threads in {a['seconds']:.1f} s"
        except Exception as e:
            progs = f"no report: {e}"
    print(f"{w['call']:<52} {w['state']:<5} {w['rc']:>2} {w['wall_s']:>7.2f} {first:>7} {setup:>7} {since:>10}  {progs}")
PY
  table+=("$(cat "$fc/table.txt")")
  # One archive (a device call brings back a limited number of files); the table stays beside it.
  tar czf "$OUT/firstcall.tgz" -C "$OUT" firstcall && cp "$fc/table.txt" "$OUT/firstcall-table.txt" && rm -rf "$fc"
fi

if want tests; then
  # The test binaries run at the same time (each compiles the NVRTC programs it needs on a fresh machine,
  # which takes minutes one after another); their logs are joined in order afterwards.
  : > "$OUT/tests.log"
  mkdir -p "$OUT/tests"
  # tf32_kernels runs three times: on an sm_90 device plain TF32 at D = 65..128 takes the wgmma kernel;
  # SDPA_TF32_WGMMA=0 sends it to the mma.sync kernel that every other device runs; SDPA_CUDA_SMEM_OPTIN=101376
  # (the 99 KB of a compute-capability 8.6/8.9 part) makes it run the small tiles such devices get.
  # fa2_kernels runs four times: splitkv takes TMA tensor copies on sm_90 by default; SDPA_SPLITKV_LOAD
  # sends it through the 1-D bulk copies and through cp.async (what other devices run) as well, and
  # SDPA_CUDA_SMEM_OPTIN=101376 runs the tiles a 99 KB device gets (fa2's small tiles for 160..224,
  # splitkv refused above class 64, so fa2 runs those calls).
  runs=()
  for t in "$B"/tests/*; do runs+=("$(basename "$t")"); done
  [[ -x "$B/tests/tf32_kernels" ]] && runs+=("tf32_kernels-mma" "tf32_kernels-99k")
  [[ -x "$B/tests/fa2_kernels" ]] && runs+=("fa2_kernels-bulk" "fa2_kernels-cpasync" "fa2_kernels-99k")
  # variant_kernels' splitkv tests (windows, softcap, ALiBi) on the other two load paths as well.
  [[ -x "$B/tests/variant_kernels" ]] && runs+=("variant_kernels-bulk" "variant_kernels-cpasync")
  for name in "${runs[@]}"; do
    (
      start=$(date +%s)
      bin="$B/tests/${name%-*}"  # tf32_kernels-mma, -99k: the tf32_kernels binary
      # The machinery tests change a process-wide environment variable (the cache dir): one thread.
      extra=(); [[ "$name" == machinery ]] && extra=(--test-threads=1)
      [[ "$name" == variant_kernels-* ]] && extra=(splitkv nonfinite)
      case "$name" in
        *-mma) SDPA_TF32_WGMMA=0 "$bin" "${extra[@]}" > "$OUT/tests/$name.log" 2>&1 ;;
        *-99k) SDPA_CUDA_SMEM_OPTIN=101376 "$bin" "${extra[@]}" > "$OUT/tests/$name.log" 2>&1 ;;
        *-bulk) SDPA_SPLITKV_LOAD=bulk "$bin" "${extra[@]}" > "$OUT/tests/$name.log" 2>&1 ;;
        *-cpasync) SDPA_SPLITKV_LOAD=cp.async "$bin" "${extra[@]}" > "$OUT/tests/$name.log" 2>&1 ;;
        *) "$bin" "${extra[@]}" > "$OUT/tests/$name.log" 2>&1 ;;
      esac
      echo "$? $(( $(date +%s) - start ))" > "$OUT/tests/$name.rc"
    ) &
  done
  wait
  for name in "${runs[@]}"; do
    cat "$OUT/tests/$name.log" >> "$OUT/tests.log"
    read -r rc secs < "$OUT/tests/$name.rc"
    res="$(grep -E '^test result:' "$OUT/tests/$name.log" | tail -1)"
    printf '{"stage":"test","binary":"%s","rc":%d,"seconds":%d,"result":"%s"}\n' "$name" "$rc" "$secs" "$res" >> "$summary"
    table+=("test      $(printf '%-22s' "$name") rc=$rc  $res")
  done
  rm -rf "$OUT/tests"
fi

if want sanitize; then
  : > "$OUT/sanitizer.log"
  # Source lines in the sanitizer's reports (the programs are compiled with -lineinfo, cached apart).
  export SDPA_CUDA_LINEINFO=1
  # A small shape per kernel (lengths off the tiles, GQA, causal); explicit masks are covered by the tests.
  # An optional sixth field is environment for the run (splitkv's other load paths).
  runs=(
    "unfused bf16 exact 1,2,1,70,90,64 causal"
    "fa1 bf16 exact 1,2,1,70,90,64 causal-br"
    "fa1 f32 exact 1,2,1,70,90,40 causal"
    "fa2 f32 tf32 1,2,1,70,90,64 causal"
    "fa2 f32 split-tf32 1,2,1,70,90,96 none"
    "fa2 bf16 exact 1,2,1,70,90,64 causal"
    "splitkv bf16 exact 1,4,1,1,300,128 none"
    "fa1 f32 exact 1,2,1,70,90,64 causal"
    "fa1 bf16 exact 1,2,2,70,90,128 none"
    "fa2 f32 tf32 1,2,1,70,90,128 none"
    "fa2 f32 split-tf32 1,2,1,70,90,128 causal"
    "fa2 f32 tf32 1,2,1,300,300,128 causal"
    "splitkv bf16 exact 1,32,8,1,5000,128 none"
    "splitkv bf16 exact 1,32,8,1,5000,128 none SDPA_SPLITKV_LOAD=bulk"
    "splitkv bf16 exact 1,2,1,1,40000,64 causal-br"
    "splitkv f16 exact 2,8,2,3,777,64 causal-br SDPA_SPLITKV_LOAD=cp.async"
    "fa2 f16 exact 1,2,1,70,90,40 none"
    "fa2 bf16 exact 1,4,2,70,90,160 causal"
    "fa2 bf16 exact 1,4,2,65,77,192,128 causal-br"
    "fa2 bf16 exact 1,2,1,50,70,224 causal"
    "fa2 bf16 exact 1,2,1,64,64,32 none"
    "splitkv bf16 exact 1,32,8,1,5000,80 causal-br"
    "splitkv f16 exact 2,8,8,1,3000,192,128 none"
  )
  # The backward (issue 24): a ragged batch with empty sequences and GQA at both tiles, atomic and
  # deterministic, by the test binary's small test. Warmed outside first.
  if [[ -x "$B/tests/backward" ]]; then
    "$B/tests/backward" small_calls_for_the_sanitizer > /dev/null 2>&1
    for tool in memcheck racecheck; do
      log="$(compute-sanitizer --tool "$tool" --error-exitcode 3 "$B/tests/backward" small_calls_for_the_sanitizer 2>&1)"
      rc=$?
      echo "== $tool backward (rc=$rc)" >> "$OUT/sanitizer.log"; echo "$log" >> "$OUT/sanitizer.log"
      res="$(echo "$log" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' | tail -2 | tr -d '"' | tr '\n' ' ')"
      printf '{"stage":"%s","run":"backward","rc":%d,"result":"%s"}\n' "$tool" "$rc" "$res" >> "$summary"
      table+=("$(printf '%-9s %-40s rc=%d  %s' "$tool" "backward: small calls" "$rc" "$res")")
    done
  fi
  # Variants (issue 22): windows + softcap + ALiBi through fa2, splitkv (each load path), fa1 and unfused, by
  # the test binary's small-shape tests (the CLI's variant flags live in sdpa-cli). Warmed outside first; before the CLI runs.
  vruns=(
    "nonfinite_values_outside_the_window_stay_outside"
    "nonfinite_values_outside_the_window_stay_outside SDPA_SPLITKV_LOAD=bulk"
    "nonfinite_values_outside_the_window_stay_outside SDPA_SPLITKV_LOAD=cp.async"
    "forward_on_a_callers_stream_with_alibi"
  )
  if [[ -x "$B/tests/variant_kernels" ]]; then
    for r in "${vruns[@]}"; do
      read -r filter envs <<< "$r"
      env $envs "$B/tests/variant_kernels" "$filter" > /dev/null 2>&1
    done
    for tool in memcheck racecheck; do
      for r in "${vruns[@]}"; do
        read -r filter envs <<< "$r"
        log="$(env $envs compute-sanitizer --tool "$tool" --error-exitcode 3 "$B/tests/variant_kernels" "$filter" 2>&1)"
        rc=$?
        echo "== $tool variant_kernels $r (rc=$rc)" >> "$OUT/sanitizer.log"; echo "$log" >> "$OUT/sanitizer.log"
        res="$(echo "$log" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' | tail -2 | tr -d '"' | tr '\n' ' ')"
        printf '{"stage":"%s","run":"variant_kernels %s","rc":%d,"result":"%s"}\n' "$tool" "$r" "$rc" "$res" >> "$summary"
        table+=("$(printf '%-9s %-40s rc=%d  %s' "$tool" "variants: $r" "$rc" "$res")")
      done
    done
  fi
  # Ragged batches and paged caches (issue 23): the CLI's serving flags on small shapes, lengths of 0 and 1,
  # lengths off the tiles and mid-page, page size 1; fa2 (varlen, paged chunked prefill) and splitkv (paged
  # and packed decoding). Each line is the arguments after `sdpa run --backend cuda`.
  rruns=(
    "--kernel fa2 --dtype bf16 --shape 4,4,2,0,0,128 --mask causal-br --seqlens-q 70,0,1,33 --seqlens-k 90,5,1,200"
    "--kernel fa2 --dtype f16 --shape 3,4,2,0,0,64 --mask causal-br --seqlens-q 40,1,17 --seqlens-k 300,77,17 --page-size 16"
    "--kernel fa2 --dtype bf16 --shape 2,2,1,0,0,96 --mask none --seqlens-q 9,20 --seqlens-k 33,5 --page-size 1 --window 8,0 --diagonal br"
    "--kernel splitkv --dtype bf16 --shape 4,8,2,1,0,128 --mask causal-br --seqlens-k 1,3000,0,777 --page-size 16"
    "--kernel splitkv --dtype f16 --shape 3,8,2,2,0,64 --mask causal-br --seqlens-k 5000,3,1200 --softcap 30 --alibi"
  )
  for tool in memcheck racecheck; do
    for r in "${rruns[@]}"; do
      # shellcheck disable=SC2086 # the line is a list of flags
      "$B/sdpa" run --backend cuda $r --warmup 0 --reps 1 > /dev/null 2>&1
      # shellcheck disable=SC2086
      log="$(compute-sanitizer --tool "$tool" --error-exitcode 3 "$B/sdpa" run --backend cuda $r --warmup 0 --reps 1 --check 2>&1)"
      rc=$?
      echo "== $tool ragged $r (rc=$rc)" >> "$OUT/sanitizer.log"; echo "$log" >> "$OUT/sanitizer.log"
      res="$(echo "$log" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sdpa:' | tail -1 | tr -d '"')"
      printf '{"stage":"%s","run":"ragged %s","rc":%d,"result":"%s"}\n' "$tool" "$r" "$rc" "$res" >> "$summary"
      table+=("$(printf '%-9s %-40s rc=%d  %s' "$tool" "ragged: ${r:9:60}" "$rc" "$res")")
    done
  done
  for tool in memcheck racecheck; do
    for r in "${runs[@]}"; do
      read -r kernel dtype math shape mask envs <<< "$r"
      # Warm the kernel cache outside the sanitizer, so it instruments the launches, not NVRTC.
      env $envs "$B/sdpa" run --backend cuda --kernel "$kernel" --dtype "$dtype" --f32-math "$math" --shape "$shape" \
        --mask "$mask" --warmup 0 --reps 1 > /dev/null 2>&1
      log="$(env $envs compute-sanitizer --tool "$tool" --error-exitcode 3 "$B/sdpa" run --backend cuda --kernel "$kernel" \
        --dtype "$dtype" --f32-math "$math" --shape "$shape" --mask "$mask" --warmup 0 --reps 1 --check 2>&1)"
      rc=$?
      echo "== $tool $r (rc=$rc)" >> "$OUT/sanitizer.log"; echo "$log" >> "$OUT/sanitizer.log"
      res="$(echo "$log" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sdpa:' | tail -1 | tr -d '"')"
      printf '{"stage":"%s","run":"%s","rc":%d,"result":"%s"}\n' "$tool" "$r" "$rc" "$res" >> "$summary"
      table+=("$(printf '%-9s %-40s rc=%d  %s' "$tool" "$r" "$rc" "$res")")
    done
  done
fi

if want bench; then
  python3 "$B/bench_cuda.py" --bench "$B/cuda_kernels" --out "$OUT" $quick > "$OUT/bench.log" 2>&1
  rc=$?
  printf '{"stage":"bench","rc":%d}\n' "$rc" >> "$summary"
  table+=("bench     rc=$rc (cuda_bench.json, bench.log)")
fi

python3 - "$summary" "$OUT/summary.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump(rows, open(sys.argv[2], "w"), indent=1)
PY
rm -f "$summary"
[[ -f "$OUT/bench.log" ]] && sed -n '/^tag /,$p' "$OUT/bench.log"
echo "== run-gpu.sh summary"
printf '%s\n' "${table[@]}"
