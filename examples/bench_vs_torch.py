#!/usr/bin/env python3
"""Times PyTorch SDPA decode attention (cuDNN and flash backends, BF16) on the oscar-bench shapes, so the
two tables can be read side by side. Usage: python3 examples/bench_vs_torch.py [--batch 1,8,32,64]
[--context 8192,32768,102400,131072] [--q-heads 32 --kv-heads 8 --head-dim 128] [--flush read|write|none]
[--settle-ms 500] [--iterations 30]. Markdown on stdout."""
import argparse
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


FLUSH = "read"
SETTLE_MS = 500
ITERATIONS = 30


def median_us(fn, warmup=5):
    flush = torch.randint(0, 255, (256 << 20,), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    time.sleep(SETTLE_MS / 1000.0)  # idle GPU first: every case starts at the same clock (oscar-bench --settle-ms)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(ITERATIONS):
        if FLUSH == "read":  # cold, clean L2, as oscar-bench --flush read does
            flush.max()
        elif FLUSH == "write":  # memset: dirty lines whose write-back lands in the timed call
            flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", default="1,8,32,64")
    ap.add_argument("--context", default="8192,32768,102400,131072")
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--flush", choices=["read", "write", "none"], default="read",
                    help="L2 state before each sample (as oscar-bench --flush)")
    ap.add_argument("--settle-ms", type=int, default=500,
                    help="idle milliseconds before each case (as oscar-bench --settle-ms; 0: none)")
    ap.add_argument("--iterations", type=int, default=30, help="timed calls per case (median reported)")
    a = ap.parse_args()
    if a.iterations < 1:
        ap.error(f"--iterations {a.iterations}: need at least one timed call")
    if a.settle_ms < 0:
        ap.error(f"--settle-ms {a.settle_ms}: must be >= 0")
    global FLUSH, SETTLE_MS, ITERATIONS
    FLUSH, SETTLE_MS, ITERATIONS = a.flush, a.settle_ms, a.iterations
    hq, hkv, d = a.q_heads, a.kv_heads, a.head_dim
    print(f"# PyTorch {torch.__version__} SDPA BF16 decode on {torch.cuda.get_device_name()}", file=sys.stderr)
    print("| backend | batch | context | time_us | tbps | gpu |")
    print("|---|---|---|---|---|---|")
    for ctx in [int(x) for x in a.context.split(",")]:
        for b in [int(x) for x in a.batch.split(",")]:
            need = 2 * b * hkv * ctx * d * 2
            if need > 0.8 * torch.cuda.mem_get_info()[0]:
                print(f"skip batch {b} context {ctx}: {need / 1e9:.1f} GB", file=sys.stderr)
                continue
            q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.bfloat16)
            for name, backend in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]:
                try:
                    with sdpa_kernel(backend):
                        fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        fn()
                        us = median_us(fn)
                except Exception as e:  # backend refuses the shape
                    print(f"{name} batch {b} context {ctx}: {str(e).splitlines()[0]}", file=sys.stderr)
                    continue
                print(f"| sdpa_{name} | {b} | {ctx} | {us:.1f} | {need / us / 1e6:.2f} | {torch.cuda.get_device_name()} |",
                      flush=True)
            del q, k, v
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
