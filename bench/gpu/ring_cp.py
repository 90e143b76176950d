"""PyTorch's context parallelism (`torch.distributed.tensor.experimental.context_parallel`) timed on the
shapes `sdpa bench --gpus N` times, writing records in sdpa's result format (`sdpa-bench-v1`, each record
with `gpus`), so the ring's speed is a ratio against PyTorch measured in the same run.

One process per GPU (torch.multiprocessing), NCCL, NCCL_NVLS_ENABLE=0. Q, K, V `[B, H, S, D]` are made on
every rank from one seed, handed to `context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2])`
(which keeps each rank's shard: for causal calls with load balancing, chunks r and 2N-1-r as our ring
does; PyTorch refuses load balancing without a causal mask, where contiguous halves are balanced anyway), and
`F.scaled_dot_product_attention` is timed inside the context with CUDA events: warm-up calls, then timed
calls; each call's time is the slowest rank's (all-reduce max). Backends: flash and cuDNN (whichever the CP
dispatcher takes; a failure is recorded under `skipped`), K/V rotation all-to-all and all-gather.
`--pass fwd+bwd` times the forward and the backward of a random dO.

    torchrun-free:  python3 ring_cp.py --gpus 2 --seqs 32768,65536 --masks causal,none --out cp.json
"""

import argparse
import datetime
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def cp_api():
    from torch.distributed.tensor.experimental import context_parallel

    try:
        from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method
    except ImportError:
        from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options, set_rotate_method
    return context_parallel, _cp_options, set_rotate_method


BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def flops(b, h, s, d, causal, pass_):
    pairs = s * (s + 1) / 2 if causal else s * s
    f = 4.0 * b * h * pairs * d
    return f * {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[pass_]


def time_case(args, rank, world, mesh, seq, mask, backend, rotate):
    context_parallel, opts, set_rotate_method = cp_api()
    set_rotate_method(rotate)
    causal = mask == "causal"
    # PyTorch refuses load balancing without is_causal (non-causal work is even anyway).
    opts.enable_load_balance = causal
    b, h, d = args.batch, args.heads, args.head_dim
    g = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, seq, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    do = torch.randn(b, h, seq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    times = []
    with sdpa_kernel([BACKENDS[backend]]), context_parallel(mesh, buffers=[q, k, v, do], buffer_seq_dims=[2, 2, 2, 2]):
        # Leaves of their own: the context resizes its buffers back on exit, which PyTorch refuses for
        # tensors that require grad.
        qg, kg, vg = (t.detach().requires_grad_(args.pass_ == "fwd+bwd") for t in (q, k, v))
        for i in range(args.warmup + args.reps):
            dist.barrier()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if args.pass_ == "fwd+bwd":
                o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                qg.grad = kg.grad = vg.grad = None
                o.backward(do)
            else:
                with torch.no_grad():
                    F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            end.record()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(start.elapsed_time(end))
    t = torch.tensor(times, device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return sorted(t.tolist())


def worker(rank, world, args, port, out_q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (world,))
    records, skipped = [], []
    for seq in args.seqs:
        for mask in args.masks:
            for backend in args.backends:
                for rotate in args.rotates:
                    label = f"cp-{backend}-{rotate}"
                    try:
                        ts = time_case(args, rank, world, mesh, seq, mask, backend, rotate)
                    except Exception as e:  # noqa: BLE001 - every failure is recorded with its reason
                        torch.cuda.synchronize()
                        shape = {"b": args.batch, "hq": args.heads, "hkv": args.heads, "sq": seq, "sk": seq,
                                 "d": args.head_dim, "dv": args.head_dim}
                        skipped.append({"backend": "pytorch", "kernel": label, "dtype": "bf16", "shape": shape,
                                        "mask": mask, "layout": "bhsd", "failed": True,
                                        "reason": f"{type(e).__name__}: {str(e)[:300]}"})
                        if rank == 0:
                            print(f"{label} S={seq} {mask}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                        continue
                    med = ts[len(ts) // 2]
                    f = flops(args.batch, args.heads, seq, args.head_dim, mask == "causal", args.pass_)
                    shape = {"b": args.batch, "hq": args.heads, "hkv": args.heads, "sq": seq, "sk": seq,
                             "d": args.head_dim, "dv": args.head_dim}
                    rec = {"backend": "pytorch", "kernel": label, "device": torch.cuda.get_device_name(),
                           "dtype": "bf16", "shape": shape, "mask": mask, "layout": "bhsd",
                           "time_ms": {"median": med, "min": ts[0], "max": ts[-1], "reps": len(ts)},
                           "tflops": f / (med * 1e-3) / 1e12, "gbps": 0.0, "gpus": world}
                    if args.pass_ != "fwd":
                        rec["pass"] = args.pass_
                    records.append(rec)
                    if rank == 0:
                        print(f"{label} S={seq} {mask} {args.pass_}: {med:.3f} ms (min {ts[0]:.3f}, {len(ts)} reps) "
                              f"{rec['tflops']:.1f} TFLOP/s", flush=True)
    if rank == 0:
        out_q.put((records, skipped))
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--seqs", default="32768,65536,131072")
    p.add_argument("--masks", default="causal,none")
    p.add_argument("--backends", default="flash,cudnn")
    p.add_argument("--rotates", default="alltoall,allgather")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--pass", dest="pass_", default="fwd", choices=["fwd", "fwd+bwd"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default="cp.json")
    args = p.parse_args()
    args.seqs = [int(s) for s in args.seqs.split(",")]
    args.masks = args.masks.split(",")
    args.backends = args.backends.split(",")
    args.rotates = args.rotates.split(",")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(worker, args=(args.gpus, args, port, q), nprocs=args.gpus, join=True, start_method="spawn")
    records, skipped = q.get()
    out = {"format": "sdpa-bench-v1", "command": " ".join(["python3"] + sys.argv),
           "machine": socket.gethostname(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "torch": torch.__version__, "records": records, "skipped": skipped}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {len(records)} records, {len(skipped)} skipped to {args.out}")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"ring_cp.py: {time.time() - t0:.1f} s")
