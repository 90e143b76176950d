#!/usr/bin/env python3
"""Prints the AMX study's table from `sdpa bench` outputs (records of sdpa and, when run with
--with-pytorch, PyTorch's CPU SDPA from the same invocation): per file and case, each implementation's
median time and TFLOPS, and sdpa's speed-up over PyTorch in that same file (PyTorch time / sdpa time).

    python3 amx_table.py amx-16t.json amx-2t.json ...
"""
import json
import os
import sys


def label(rec):
    s = rec["shape"]
    dv = f"/{s['dv']}" if s["dv"] != s["d"] else ""
    return f"B={s['b']} H={s['hq']} S={s['sq']} D={s['d']}{dv} {rec['mask']}"


def main(paths):
    print("| file | case | sdpa path | sdpa ms | sdpa TFLOPS | check | PyTorch ms | PyTorch TFLOPS | sdpa vs PyTorch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            print(f"| {os.path.basename(path)} | unreadable: {e} |")
            continue
        ours, torch = {}, {}
        for rec in data.get("records", []):
            key = (rec["dtype"], label(rec))
            (ours if rec["backend"] == "cpu" else torch)[key] = rec
        for key, rec in ours.items():
            dev = rec.get("device", "")
            path_name = dev[dev.rfind("(") + 1:].split(",")[0] if "(" in dev else "?"
            ms = rec["time_ms"]["median"]
            chk = rec.get("check") or {}
            ok = "pass" if chk.get("pass") else ("fail" if chk else "-")
            t = torch.get(key)
            tms = t["time_ms"]["median"] if t else None
            ratio = f"**{tms / ms:.2f}x**" if tms else "-"
            tt = f"{t['tflops']:.3f}" if t else "-"
            tm = f"{tms:.1f}" if tms else "-"
            print(f"| {os.path.basename(path)} | {key[0]} {key[1]} | {path_name} | {ms:.1f} | {rec['tflops']:.3f} | {ok} "
                  f"| {tm} | {tt} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1:])
