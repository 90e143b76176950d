"""Running the Rust benchmark driver `cuda_kernels` (sdpa-cuda/benches/cuda_kernels.rs) on a list of points and
reading its records back: shared by bench/gpu/bench_cuda.py and the study scripts of sdpa-cuda/dev (through
sdpa_dev.py). No torch here; `cargo xtask gpu-bundle` carries this file beside bench_cuda.py.

A point is a dict: tag, b, hq, hkv, sq, sk, d, [dv,] dtype, mask, kernel, f32_math (the driver's `--points`
format; dv defaults to d).
"""
import json
import os
import subprocess
import sys
import tempfile


def point(tag, b, hq, hkv, sq, sk, d, dtype, causal, kernel, f32_math="exact", dv=None):
    """One point of the driver's `--points` file (causal: top-left causal mask, else none; dv: V's head dim
    when it is not d)."""
    p = dict(tag=tag, b=b, hq=hq, hkv=hkv, sq=sq, sk=sk, d=d, dtype=dtype, mask="causal" if causal else "none",
             kernel=kernel, f32_math=f32_math)
    if dv is not None and dv != d:
        p["dv"] = dv
    return p


def write_points(points):
    """Writes `points` to a temporary JSON file and returns its path."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(points, f)
        return f.name


def run_points(binary, points, out, warmup, reps, flush=None, env=None, extra=(), on_error="exit"):
    """Runs `binary --points FILE --out OUT --warmup W --reps R [--flush F] EXTRA...` and returns its records.

    `points`: a list of points or the path of a points file; `out`: the records file (a bare name goes to the
    temporary directory); `env`: variables added to this process's environment. When the driver fails, prints
    the tail of its stderr and, per `on_error`, exits ("exit") or returns None ("none")."""
    pfile = points if isinstance(points, str) else write_points(points)
    if not os.path.dirname(out):
        out = os.path.join(tempfile.gettempdir(), out)
    cmd = [binary, "--points", pfile, "--out", out, "--warmup", str(warmup), "--reps", str(reps)]
    if flush:
        cmd += ["--flush", flush]
    r = subprocess.run(cmd + list(extra), stderr=subprocess.PIPE, text=True,
                       env=dict(os.environ, **env) if env else None)
    if r.returncode != 0:
        print(r.stderr[-4000:], flush=True)
        if on_error == "none":
            return None
        sys.exit(f"{binary} failed with {r.returncode}")
    with open(out) as f:
        return json.load(f)


def key(rec):
    """The shape, dtype and mask of a record or point: what PyTorch's side is timed on once."""
    return (rec["b"], rec["hq"], rec["hkv"], rec["sq"], rec["sk"], rec["d"], rec["dtype"], rec["mask"],
            rec.get("dv", rec["d"]))


def unique_keys(records):
    """The distinct `key`s of `records`, in order of first appearance."""
    seen = {}
    for rec in records:
        seen.setdefault(key(rec), None)
    return list(seen)
