#!/usr/bin/env bash
# Builds the fuzz corpora from the project's real fixtures.
#
#   fuzz/seed.sh          -> fuzz/corpus/<target>/  (full corpus, not committed: a few MB)
#   fuzz/seed.sh --small  -> fuzz/seeds/<target>/   (the small committed seeds; the bounded tests read them)
#
# Traces are cut to valid JSON: the first 40 events, and a window of events around the first attention op
# with the runtime calls, kernels and flows tied to it (so the cut still has attention in it). Result files
# and specs are copied (--small: records cut to the first three). TraceLens inputs are the CSV and the
# metadata JSON joined by `\n%%META%%\n`, the split the `tracelens` target uses.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode="${1:-full}"
if [[ "$mode" == "--small" ]]; then out="$root/fuzz/seeds"; else out="$root/fuzz/corpus"; fi
traces=("$root"/sdpa-analysis/tests/data/*.json.gz)
if [[ -d "$root/../shared/fixtures/traces" ]]; then traces+=("$root"/../shared/fixtures/traces/*.json.gz); fi
mkdir -p "$out"/{trace_parse,tracelens,result_file,bench_spec,attention_spec}

python3 - "$mode" "$out" "$root" "${traces[@]}" <<'PY'
import glob, gzip, hashlib, json, os, re, sys

mode, out, root, traces = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
small = mode == "--small"
ATTN = re.compile(r"scaled_dot_product|softmax|flash|fmha|cudnn|attention|bmm", re.I)

def put(target, name, data):
    if isinstance(data, str):
        data = data.encode()
    os.makedirs(os.path.join(out, target), exist_ok=True)
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(data)

def window(doc, events, radius):
    ops = [i for i, e in enumerate(events) if e.get("cat") == "cpu_op" and ATTN.search(e.get("name", ""))]
    if not ops:
        return None
    i = ops[0]
    picked = set(range(max(0, i - radius), min(len(events), i + radius)))
    ids = set()
    for j in picked:
        a = events[j].get("args") or {}
        for k in ("External id", "correlation"):
            if k in a:
                ids.add(a[k])
    for j, e in enumerate(events):
        a = e.get("args") or {}
        if e.get("ph") == "M" or a.get("External id") in ids or a.get("correlation") in ids or (
            e.get("ph") in ("s", "f") and e.get("id") in ids
        ):
            picked.add(j)
    return dict(doc, traceEvents=[events[j] for j in sorted(picked)])

seen = set()
for path in traces:
    base = os.path.basename(path).replace(".json.gz", "")
    with gzip.open(path, "rb") as f:
        raw = f.read()
    digest = hashlib.sha1(raw).hexdigest()
    if digest in seen:
        continue
    seen.add(digest)
    doc = json.loads(raw)
    events = doc["traceEvents"]
    head = dict(doc, traceEvents=events[:40])
    put("trace_parse", f"{base}.head40.json", json.dumps(head, indent=1))
    for radius in ((60,) if small else (60, 250)):
        w = window(doc, events, radius)
        if w:
            put("trace_parse", f"{base}.attn{radius}.json", json.dumps(w, separators=(",", ":")))
    if not small:
        put("trace_parse", f"{base}.head400.json", json.dumps(dict(doc, traceEvents=events[:400])))
        w = window(doc, events, 120)
        if w:
            put("trace_parse", f"{base}.attn120.json.gz", gzip.compress(json.dumps(w).encode(), 6))
put("trace_parse", "tiny.json.gz", gzip.compress(b'{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":2}]}'))

for d in sorted(glob.glob(os.path.join(root, "sdpa-analysis/tests/data/tracelens/*"))):
    for cat in ("sdpa_fwd", "sdpa_bwd"):
        csv = os.path.join(d, "category_data", f"{cat}_ops.csv")
        meta = os.path.join(d, "metadata", f"{cat}_metadata.json")
        if os.path.exists(csv):
            data = open(csv, "rb").read()
            if os.path.exists(meta):
                data += b"\n%%META%%\n" + open(meta, "rb").read()
            put("tracelens", f"{os.path.basename(d)}.{cat}", data)

def cut(v):
    if isinstance(v, list):
        return v[:3]
    if isinstance(v, dict) and isinstance(v.get("records"), list):
        return dict(v, records=v["records"][:3], skipped=v.get("skipped", [])[:2])
    return v

for p in sorted(glob.glob(os.path.join(root, "bench/results/**/*.json"), recursive=True)):
    name = os.path.relpath(p, os.path.join(root, "bench/results")).replace("/", "_")
    text = open(p, "rb").read()
    if small:
        try:
            text = json.dumps(cut(json.loads(text)), indent=1).encode()
        except ValueError:
            pass
        if len(text) > 16384:
            continue
    # analyze.json is a findings report: a replay source for `sdpa bench --spec` too.
    put("bench_spec" if name.startswith("analyze") else "result_file", name, text)
for p in sorted(glob.glob(os.path.join(root, "bench/presets/*.json"))):
    put("bench_spec", "preset_" + os.path.basename(p), open(p, "rb").read())
put("bench_spec", "replay_singular.json",
    '{"command":"sdpa bench","spec":{"backend":"cuda","kernel":"fa2","dtype":"bf16","mask":"causal",'
    '"shape":{"b":2,"hq":14,"hkv":2,"sq":2048,"sk":2048,"d":64,"dv":64}}}')
PY

# attention_spec takes raw bytes that `arbitrary` turns into a spec: a few fixed byte strings.
printf '\x00\x01\x00\x08\x00\x08\x00\x02\x00\x10\x00\x10\x00\x40\x00\x40\x01\x00\x01\x00' >"$out/attention_spec/small-bf16"
printf '\x00\x01\x00\x04\x00\x02\x00\x03\x00\x05\x00\x08\x00\x06\x02\x01\x03\x01\x01\x02' >"$out/attention_spec/gqa-explicit"
printf '\x03\xff\xff\xff\xff\xff\xff\xff\xff\x00\x01\x00\x01\x00\x01\x00\x01\x00\x01\x00\x01' >"$out/attention_spec/huge-b"
echo "seeded $(find "$out" -type f | wc -l) files under $out ($(du -sh "$out" | cut -f1))"
