#!/usr/bin/env python3
"""Time `sdpa analyze --diff BEFORE AFTER` against analysing BEFORE and AFTER one after the other, same run.

usage: diff_vs_two_analyses.py SDPA_BIN BEFORE.json.gz AFTER.json.gz OUT_PREFIX [RUNS]

Each round runs, under /usr/bin/time -v (the `timed` of analyze_vs_tracelens.py): `sdpa analyze BEFORE --json`,
`sdpa analyze AFTER --json`, then `sdpa analyze --diff BEFORE AFTER --json`, so the three share the machine's
load. The issue's bar: the diff's wall time within 2x the sum of the two analyses' (the ratio printed is
diff / (before + after), median over rounds; below 1 the two threads of --diff overlap the analyses). Writes
OUT_PREFIX.json (every run) and prints the summary.
"""
import json, os, statistics, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from analyze_vs_tracelens import timed  # noqa: E402  (the one copy of the /usr/bin/time reader)


def main():
    sdpa, before, after, out = sys.argv[1:5]
    runs = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    rounds = []
    for _ in range(runs):
        b = timed([sdpa, "analyze", before, "--json"])
        a = timed([sdpa, "analyze", after, "--json"])
        d = timed([sdpa, "analyze", "--diff", before, after, "--json"])
        assert b["exit"] == 0 and a["exit"] == 0 and d["exit"] == 0, (b, a, d)
        cpu = lambda r: r["user_s"] + r["sys_s"]
        rounds.append({
            "before": b, "after": a, "diff": d,
            "wall_ratio": d["wall_s"] / (b["wall_s"] + a["wall_s"]),
            "cpu_ratio": cpu(d) / (cpu(b) + cpu(a)),
        })
    med = lambda f: statistics.median(f(r) for r in rounds)
    res = {
        "before": before, "after": after,
        "before_bytes": os.path.getsize(before), "after_bytes": os.path.getsize(after),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ncpu": os.cpu_count(), "rounds": rounds,
        "median": {
            "before_wall_s": med(lambda r: r["before"]["wall_s"]), "after_wall_s": med(lambda r: r["after"]["wall_s"]),
            "diff_wall_s": med(lambda r: r["diff"]["wall_s"]), "wall_ratio": med(lambda r: r["wall_ratio"]),
            "cpu_ratio": med(lambda r: r["cpu_ratio"]),
            "diff_peak_rss_mb": med(lambda r: r["diff"]["peak_rss_mb"]),
            "sum_peak_rss_mb": med(lambda r: r["before"]["peak_rss_mb"] + r["after"]["peak_rss_mb"]),
            "load_avg_1m": med(lambda r: r["diff"]["load_avg_1m"]),
        },
    }
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res["median"], indent=2))


if __name__ == "__main__":
    main()
