"""The table at the end of run-ring.sh: per pass, mask and length, the ring (forward steps on fa3 and on
fa2), our one-GPU kernel and PyTorch's context_parallel (flash and cuDNN rings) from the same run's records,
the ratios, and the per-step hidden fraction of the ring's transfers from the bench logs' step lines.

    python3 ring_table.py RUN_DIR       # the folder with the run's *.json records and *.log files
"""

import json
import os
import re
import sys

CONFIG = re.compile(r"^cuda (\w+) (\w+) (\w+) bhsd .*?Sq=(\d+) .*?(?: (fwd\+bwd|bwd))?: ([\d.]+) ms")
STEP = re.compile(r"^\s+ring (\S+) over (\d+) GPUs(?: \(forward steps on (\w+)\))?, step (\d+): .*hidden ([\d.]+) %")


def records(run):
    """(pass, mask, S) -> {series name: median ms}."""
    rows = {}
    for f in sorted(os.listdir(run)):
        if not f.endswith(".json"):
            continue
        try:
            with open(os.path.join(run, f)) as fh:
                d = json.load(fh)
        except (OSError, ValueError) as e:
            print(f"{f}: unreadable ({e})")
            continue
        for x in d.get("records", []):
            key = (x.get("pass", "fwd"), x["mask"], x["shape"]["sq"])
            if x["backend"] == "pytorch":
                name = x["kernel"].split("-")[1]  # cp-flash-alltoall -> flash
                name = f"cp {name}"
            else:
                name = f"{x['kernel']} x{x.get('gpus') or 1}"
            rows.setdefault(key, {})[name] = x["time_ms"]["median"]
        for s in d.get("skipped", [])[:6]:
            print(f"skipped in {f}: {s.get('kernel')} {s.get('mask')} S={s.get('shape', {}).get('sq')}: "
                  f"{str(s.get('reason', ''))[:160]}")
    return rows


def hidden(run):
    """(pass, mask, S, kernel) -> [hidden % per step] from the ring logs' profile lines."""
    out = {}
    for f in sorted(os.listdir(run)):
        if not (f.startswith("ring2") and f.endswith(".log")):
            continue
        key = None
        with open(os.path.join(run, f), errors="replace") as fh:
            for line in fh:
                m = CONFIG.match(line)
                if m:
                    kernel, _dtype, mask, sq, pass_, _ms = m.groups()
                    key = (pass_ or "fwd", mask, int(sq), kernel)
                    continue
                m = STEP.match(line)
                if m and key:
                    out.setdefault(key, []).append(float(m.group(5)))
    return out


def main():
    run = sys.argv[1] if len(sys.argv) > 1 else "."
    rows, hid = records(run), hidden(run)
    print("| pass | mask | S | ring fa3 | ring fa2 | 1 GPU fa3 | 1 GPU fa2 | CP flash | CP cuDNN | speedup fa3 "
          "| vs CP cuDNN | vs CP flash | hidden per step (fa3 ring) |")
    print("|" + " --- |" * 13)
    fmt = lambda t: f"{t:.2f}" if t else "-"  # noqa: E731
    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2])):
        v = rows[key]
        r3, r2 = v.get("fa3 x2"), v.get("fa2 x2")
        o3, o2 = v.get("fa3 x1"), v.get("fa2 x1")
        flash, cudnn = v.get("cp flash"), v.get("cp cudnn")
        ring = r3 or r2
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"  # noqa: E731
        steps = hid.get((key[0], key[1], key[2], "fa3" if r3 else "fa2"), [])
        steps_txt = " / ".join(f"{h:.1f} %" for h in steps) or "-"
        print(f"| {key[0]} | {key[1]} | {key[2] // 1024}k | {fmt(r3)} | {fmt(r2)} | {fmt(o3)} | {fmt(o2)} "
              f"| {fmt(flash)} | {fmt(cudnn)} | {ratio(o3 or o2, ring)} | {ratio(cudnn, ring)} "
              f"| {ratio(flash, ring)} | {steps_txt} |")


if __name__ == "__main__":
    main()
