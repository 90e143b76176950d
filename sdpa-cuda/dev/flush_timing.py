"""Event timing of PyTorch calls after either L2 flush of the Rust backend (sdpa-cuda/src/backend.rs, L2Flush),
shared by the decoding study scripts (decode_flush_study.py, splitkv_timeline.py)."""
import statistics

import torch

FLUSHES = ["dirty", "clean"]
# 256 MB written (as do_bench), or 256 MB read from a buffer nothing else touches (L2 left holding clean lines).
_flush_w = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
_flush_r = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")
FLUSH = {"dirty": lambda: _flush_w.zero_(), "clean": lambda: _flush_r.sum()}


def time_events(fn, flush, reps=100, warmup=10):
    """Median ms of `reps` event-timed calls, each after `flush`, after `warmup` untimed ones (as do_bench).
    A ~50 us spin kernel before each flush keeps the GPU's queue ahead of the host, so that a call whose host
    side takes longer than the flush is not timed with the GPU waiting for it."""
    for _ in range(warmup):
        flush()
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        torch.cuda._sleep(100_000)
        flush()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev)
