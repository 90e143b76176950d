#!/usr/bin/env python3
"""Time `sdpa analyze` against AMD TraceLens on the same big trace, in the same run.

usage: analyze_vs_tracelens.py SDPA_BIN TRACE.json.gz OUT_PREFIX [TRACELENS_BIN] [RUNS]

Each tool runs under /usr/bin/time -v; we record wall time, user+sys CPU time and peak RSS. `sdpa analyze`
runs RUNS times (median reported), TraceLens once (it takes minutes). The 1-minute load average is recorded
before each run: the development machine is shared, so wall times are noisy and CPU times are the steadier
figure. Writes OUT_PREFIX.json (all runs) and prints a summary.
"""
import gzip, json, os, re, statistics, subprocess, sys, time

def timed(cmd):
    load = os.getloadavg()[0]
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = p.stderr
    def grab(pat, conv=float):
        m = re.search(pat, err)
        return conv(m.group(1)) if m else None
    wall = grab(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", str)
    parts = [float(x) for x in wall.split(":")]
    secs = sum(v * 60 ** i for i, v in enumerate(reversed(parts)))
    return {
        "cmd": " ".join(cmd), "exit": p.returncode, "load_avg_1m": load, "wall_s": secs,
        "user_s": grab(r"User time \(seconds\): ([\d.]+)"), "sys_s": grab(r"System time \(seconds\): ([\d.]+)"),
        "peak_rss_mb": grab(r"Maximum resident set size \(kbytes\): (\d+)") / 1024.0,
    }

def main():
    sdpa, trace, out = sys.argv[1], sys.argv[2], sys.argv[3]
    tl = sys.argv[4] if len(sys.argv) > 4 else None
    runs = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    raw = gzip.open(trace).read()
    events = len(json.loads(raw)["traceEvents"])
    size = len(raw)
    del raw
    ours = [timed([sdpa, "analyze", trace, "--json"]) for _ in range(runs)]
    theirs = None
    if tl:
        odir = out + "_tracelens_out"
        theirs = timed([tl, "--profile_json_path", trace, "--output_xlsx_path", odir + ".xlsx",
                        "--output_csvs_dir", odir])
    med = lambda k: statistics.median(r[k] for r in ours)
    res = {
        "trace": trace, "events": events, "uncompressed_bytes": size, "compressed_bytes": os.path.getsize(trace),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ncpu": os.cpu_count(),
        "sdpa_runs": ours, "tracelens_run": theirs,
        "sdpa_median": {"wall_s": med("wall_s"), "cpu_s": statistics.median(r["user_s"] + r["sys_s"] for r in ours),
                        "peak_rss_mb": med("peak_rss_mb"), "throughput_mb_s_wall": size / 1e6 / med("wall_s")},
    }
    if theirs:
        res["ratios"] = {
            "wall": theirs["wall_s"] / med("wall_s"),
            "cpu": (theirs["user_s"] + theirs["sys_s"]) / res["sdpa_median"]["cpu_s"],
            "peak_rss": theirs["peak_rss_mb"] / med("peak_rss_mb"),
        }
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps({k: res[k] for k in ("events", "uncompressed_bytes", "sdpa_median", "tracelens_run", "ratios") if k in res}, indent=2))

if __name__ == "__main__":
    main()
