import json, math, sys
best = None
for arg in sys.argv[1:]:
    tiles, path = arg.split("=", 1)
    try:
        recs = [r for r in json.load(open(path))["records"] if r["backend"] == "cpu"]
    except Exception as e:
        print(f"{tiles}: unreadable ({e})", file=sys.stderr); continue
    if len(recs) < 4:
        print(f"{tiles}: {len(recs)} records", file=sys.stderr); continue
    gm = math.exp(sum(math.log(r["time_ms"]["median"]) for r in recs) / len(recs))
    print(f"{tiles}: geomean {gm:.2f} ms " + " ".join(f"{r['time_ms']['median']:.1f}" for r in recs), file=sys.stderr)
    if best is None or gm < best[1]:
        best = (tiles, gm)
print(best[0] if best else "default")
