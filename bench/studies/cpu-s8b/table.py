#!/usr/bin/env python3
"""The AMX call's table: per thread count, head dim and mask, PyTorch's fused CPU SDPA against ours (by the
tile rule) and ours with the other tile shape (`KERNEL@LABEL` records of pytorch_cpu_sdpa.py
--ours-variant), all interleaved per round. Medians of the per-round medians, the spread (lowest-highest
round median), and the per-round ratios PyTorch / ours (rounds are paired: each ran the three back to back).

    python3 table.py amx-2t.json amx-16t.json
"""
import json
import statistics
import sys


def main():
    print("| threads | D | mask | PyTorch ms (rounds) | ours ms (rounds) | x PyTorch (per round) | "
          "other tiles ms (rounds) | x PyTorch | ours / other tiles |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in sys.argv[1:]:
        try:
            with open(path) as f:
                recs = json.load(f)
        except (OSError, ValueError) as e:
            print(f"| {path}: {e} |")
            continue
        by = {}
        for r in recs:
            key = (r["threads"], r["shape"]["d"], r["mask"])
            by.setdefault(key, {})[(r["backend"], r["kernel"])] = r
        for key, rs in by.items():
            pt = rs.get(("pytorch", "fused"))
            ours = rs.get(("cpu", "fa2"))
            other = next((r for (b, k), r in rs.items() if b == "cpu" and "@" in k), None)
            if not pt or not ours:
                continue

            def cell(r):
                rm = r.get("round_medians_ms", [])
                return f"{r['time_ms']['median']:.1f} ({min(rm):.1f}-{max(rm):.1f})" if rm else \
                    f"{r['time_ms']['median']:.1f}"

            def ratio(r):
                a, b = pt.get("round_medians_ms", []), r.get("round_medians_ms", [])
                per = ", ".join(f"{x / y:.2f}" for x, y in zip(a, b))
                return f"**{pt['time_ms']['median'] / r['time_ms']['median']:.2f}x** ({per})"

            row = [str(key[0]), str(key[1]), key[2], cell(pt), cell(ours), ratio(ours)]
            if other:
                a, b = ours.get("round_medians_ms", []), other.get("round_medians_ms", [])
                per = statistics.median(x / y for x, y in zip(a, b)) if a and b else float("nan")
                row += [f"{other['kernel'].split('@')[1]}: {cell(other)}", ratio(other),
                        f"{ours['time_ms']['median'] / other['time_ms']['median']:.2f} (paired median {per:.2f})"]
            else:
                row += ["-", "-", "-"]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
