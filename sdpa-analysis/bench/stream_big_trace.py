#!/usr/bin/env python3
"""usage: stream_big_trace.py SRC.json.gz DST.json N_COPIES -- like ../shared/tools/make_big_trace.py (same id and
time offsets) but writes plain JSON one event at a time, so a 1 GB trace needs little memory to build."""
import gzip, json, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = json.load(gzip.open(src)); ev = d.pop("traceEvents")
def mx(vals):
    vals = [v for v in vals if isinstance(v, (int, float))]
    return int(max(vals)) + 1 if vals else 0
ts_all = [e["ts"] for e in ev if "ts" in e]
t0, t1 = min(ts_all), max(e["ts"] + e.get("dur", 0) for e in ev if "ts" in e)
tstr = (t1 - t0) + 1000.0
ext = mx(e.get("args", {}).get("External id") for e in ev)
corr = max(mx(e.get("args", {}).get("correlation") for e in ev), mx(e.get("id") for e in ev if e.get("cat") == "ac2g"))
py = mx(e.get("args", {}).get("Python id") for e in ev)
with open(dst, "w") as f:
    head = json.dumps(d)[:-1]
    f.write(head + ', "traceEvents": [')
    first = True
    for k in range(n):
        for e in ev:
            if k and (e.get("ph") in ("M", "i") or e.get("cat") == "Trace"):
                continue
            e2 = dict(e)
            if k:
                if "ts" in e2: e2["ts"] = e2["ts"] + k * tstr
                a = e2.get("args")
                if a:
                    a = dict(a); e2["args"] = a
                    if a.get("External id") is not None: a["External id"] += k * ext
                    if a.get("correlation") is not None: a["correlation"] += k * corr
                    if a.get("Python id") is not None: a["Python id"] += k * py
                    if a.get("Python parent id") is not None: a["Python parent id"] += k * py
                if e2.get("cat") == "ac2g" and "id" in e2: e2["id"] += k * corr
            f.write(("" if first else ", ") + json.dumps(e2)); first = False
    f.write("]}")
