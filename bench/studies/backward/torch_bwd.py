"""PyTorch's SDPA backward on the fa2bench grid (issue 24): bf16, batch x seqlen = 16k, hidden 2048 (H = 16 at
D = 128, H = 32 at D = 64), S = 512 .. 16k, causal and not, under the FLASH_ATTENTION and CUDNN_ATTENTION
backends. Q, K, V are (B, S, H, D) tensors viewed as (B, H, S, D), as sdpa's BSHD layout. The backward alone
is timed (torch.autograd.grad of the forward's output with a random dO, the graph kept), with CUDA events,
256 MB written before each call to empty L2 (as do_bench and sdpa's time_pass do), median of `reps`.
One JSON line per point on stdout.

    python3 torch_bwd.py [reps]
"""
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

TOKENS, HIDDEN = 16384, 2048


def time_backward(backend, d, s, causal, reps):
    h, b = HIDDEN // d, TOKENS // s
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    q, k, v = mk(), mk(), mk()
    d_o = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
        times = []
        for i in range(3 + reps):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True)
            end.record()
            if i >= 3:
                times.append((start, end))
        torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in times)[len(times) // 2]
    pairs = b * h * (s * (s + 1) / 2 if causal else s * s)
    flops = pairs * 2 * (3 * d + 2 * d)
    return ms, flops / (ms * 1e-3) / 1e12


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
        for d in (64, 128):
            for s in (512, 1024, 2048, 4096, 8192, 16384):
                for causal in (False, True):
                    try:
                        ms, tflops = time_backward(backend, d, s, causal, reps)
                        rec = {"impl": name, "d": d, "h": HIDDEN // d, "s": s, "causal": causal, "ms": ms, "tflops": tflops}
                    except Exception as e:  # a backend that refuses a point is reported, not fatal
                        rec = {"impl": name, "d": d, "s": s, "causal": causal, "error": str(e)[:200]}
                    print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
